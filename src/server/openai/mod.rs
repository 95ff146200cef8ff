//! The OpenAI wire format: request parsing and validation, and response bodies.

pub mod echo;
pub mod embeddings;
pub mod harmony;
pub mod reasoning;
pub mod request;
pub mod response;
pub mod responses;
pub mod tokenize;
pub mod tools;
