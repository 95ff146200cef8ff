//! Loading Hugging Face model directories: configuration, weights, tokenizer, chat template,
//! generation defaults and the model digest.

pub mod config;

pub use config::{Architecture, ModelConfig, RopeConfig, RopeScaling};
