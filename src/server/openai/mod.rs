//! The OpenAI wire format: request parsing and validation, and response bodies.

pub mod echo;
pub mod request;
pub mod response;
pub mod tokenize;
pub mod tools;
