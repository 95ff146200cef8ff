//! `POST /v1/responses`, stateless: the request is rewritten as a chat completion request
//! (`request.rs`), run by the chat path (template, tool parsing, constraints, engine), and its
//! result rewritten as a response object (`output.rs`) or as the Responses API's typed stream
//! events (`stream.rs`).

pub mod output;
pub mod request;
pub mod stream;
