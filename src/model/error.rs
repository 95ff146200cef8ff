//! Errors raised while loading a model directory. Every message is one line and names the file,
//! field or tensor at fault.

use std::path::PathBuf;

/// A model directory (or embedded model) could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A required file is absent.
    #[error("{}: file not found", path.display())]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON or does not have the expected structure.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file being parsed.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A field of a JSON file is missing or has an unusable value.
    #[error("{}: field `{field}`: {reason}", path.display())]
    InvalidField {
        /// The file holding the field.
        path: PathBuf,
        /// The field's name (dotted for nested fields).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `config.json` names an architecture this engine does not run.
    #[error(
        "{}: unsupported architecture `{architecture}` (supported: LlamaForCausalLM, \
         MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, \
         Qwen2MoeForCausalLM, MixtralForCausalLM)",
        path.display()
    )]
    UnknownArchitecture {
        /// The `config.json` file.
        path: PathBuf,
        /// The architecture it names.
        architecture: String,
    },
    /// A safetensors file has a corrupt or inconsistent header.
    #[error("{}: corrupt safetensors header: {reason}", path.display())]
    CorruptSafetensors {
        /// The safetensors file.
        path: PathBuf,
        /// What the safetensors parser reported.
        reason: String,
    },
    /// A tensor the architecture needs is not in any weights file.
    #[error("tensor `{name}`: not found in the model's safetensors files")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// `model.safetensors.index.json` assigns a tensor to a shard that does not hold it.
    #[error("tensor `{name}`: the weights index assigns it to {}, which does not contain it", path.display())]
    TensorNotInShard {
        /// The tensor's name.
        name: String,
        /// The shard the index names.
        path: PathBuf,
    },
    /// The same tensor name appears in two weights files.
    #[error("tensor `{name}`: present in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor's name.
        name: String,
        /// The first file holding it.
        first: PathBuf,
        /// The second file holding it.
        second: PathBuf,
    },
    /// A tensor has a different shape than the configuration implies.
    #[error("tensor `{name}` in {}: shape {actual:?}, expected {expected:?}", path.display())]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The file holding it.
        path: PathBuf,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape stored in the file.
        actual: Vec<usize>,
    },
    /// A tensor's values cannot be decoded (an MXFP4 scale that is NaN).
    #[error("tensor `{name}` in {}: {reason}", path.display())]
    InvalidTensor {
        /// The tensor's name.
        name: String,
        /// The file holding it.
        path: PathBuf,
        /// What is wrong with its values.
        reason: String,
    },
    /// A tensor is stored in a dtype the engine does not read, or not in the one the model's
    /// `quantization_config` implies for it.
    #[error("tensor `{name}` in {}: dtype {dtype} (expected {expected})", path.display())]
    TensorDtype {
        /// The tensor's name.
        name: String,
        /// The file holding it.
        path: PathBuf,
        /// The dtype stored in the file.
        dtype: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A tensor holds a value the engine cannot use (a KV-cache scale that is not a finite
    /// positive number).
    #[error("tensor `{name}`: {reason}")]
    TensorValue {
        /// The tensor's name.
        name: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// `tokenizer.json` could not be loaded by the tokenizers crate.
    #[error("{}: cannot load tokenizer: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizers crate's message.
        reason: String,
    },
    /// The chat template does not compile.
    #[error("{}: {source}", path.display())]
    ChatTemplate {
        /// The file the template came from.
        path: PathBuf,
        /// The template engine's complaint.
        #[source]
        source: super::chat_template::TemplateError,
    },
    /// A file name in the model directory cannot be represented in the model digest.
    #[error("{}: file name is not UTF-8 or contains a tab or newline", path.display())]
    UnusableFileName {
        /// The offending file.
        path: PathBuf,
    },
}
