//! Loading Hugging Face model directories: configuration, weights, tokenizer, chat template,
//! generation defaults and the model digest. `docs/model-loading.md` describes the formats.
#![warn(missing_docs)]

pub mod buffer;
pub mod chat_template;
pub mod config;
pub mod digest;
mod embedded;
pub mod error;
pub mod files;
pub mod generation;
mod json;
mod source;
pub mod tensors;
pub mod tokenizer_config;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

pub use chat_template::{ChatTemplate, TemplateError};
pub use config::{Architecture, ModelConfig, RopeConfig, RopeScaling};
pub use digest::{FileDigest, ModelDigest};
pub use embedded::EMBEDDED_MODEL_NAME;
pub use error::ModelError;
pub use files::{BlockSink, FileBytes, ModelFiles};
pub use generation::GenerationDefaults;
pub use tensors::{LayerTensors, TensorLayout, TensorSpec, layout};
pub use tokenizer_config::SpecialTokens;
pub use weights::{DType, ModelWeights, TensorView};

use source::ModelSource;
use tokenizer_config::{DEFAULT_TEMPLATE, TokenizerConfig};

/// `config.json`.
pub const CONFIG_FILE: &str = "config.json";
/// `tokenizer.json`.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// `tokenizer_config.json` (optional).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// `generation_config.json` (optional).
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// A stand-alone chat template, which takes precedence over `tokenizer_config.json`'s.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// A loaded model: everything needed to tokenize, template and run it.
pub struct Model {
    /// The architecture and shapes.
    pub config: ModelConfig,
    /// The weights, validated against the architecture's tensor layout.
    pub weights: ModelWeights,
    /// The tokenizer.
    pub tokenizer: Arc<tokenizers::Tokenizer>,
    /// The chat template, when the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// Defaults from `generation_config.json` (empty when the file is absent).
    pub generation: GenerationDefaults,
    /// Special-token strings from `tokenizer_config.json`.
    pub special: SpecialTokens,
    /// The digest of the model's files.
    pub digest: ModelDigest,
    /// The served model id (the directory name by default).
    pub name: String,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("weights", &self.weights)
            .field("digest", &self.digest.hex)
            .finish_non_exhaustive()
    }
}

/// What a backend is built from: a model's configuration and its weights.
#[derive(Debug, Clone, Copy)]
pub struct ModelTensors<'a> {
    /// The architecture and shapes.
    pub config: &'a ModelConfig,
    /// The weights, validated against the architecture's tensor layout.
    pub weights: &'a ModelWeights,
}

/// The parts of a model that turn text into tokens and back, parsed apart from the tensors.
struct ModelText {
    tokenizer: tokenizers::Tokenizer,
    chat_template: Option<ChatTemplate>,
    generation: GenerationDefaults,
    special: SpecialTokens,
}

impl ModelText {
    /// Parses the tokenizer, its configuration, the chat template and the generation defaults
    /// from `source`, checking token ids against `vocab_size`.
    fn load(source: &ModelSource<'_>, vocab_size: usize) -> Result<Self, ModelError> {
        let tokenizer = load_tokenizer(source, vocab_size)?;
        let tokenizer_config = match source.read_optional(TOKENIZER_CONFIG_FILE)? {
            Some(bytes) => TokenizerConfig::from_json(&source.path(TOKENIZER_CONFIG_FILE), &bytes)?,
            None => TokenizerConfig::default(),
        };
        let chat_template = Model::chat_template(source, &tokenizer_config)?;
        let generation = load_generation(source, vocab_size)?;
        Ok(Self {
            tokenizer,
            chat_template,
            generation,
            special: tokenizer_config.special,
        })
    }
}

impl Model {
    /// Loads the Hugging Face model directory `dir`, validating every file, and names the model
    /// after the directory.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let name = Self::name_of_dir(dir);
        let files = ModelFiles::read_dir(dir)?;
        Self::from_files(&files, name)
    }

    /// Loads a model from files already in memory (a directory read by
    /// [`ModelFiles::read_dir`], or a sealed model decrypted by `crate::seal`); the model
    /// digest is the one computed from those bytes.
    pub fn from_files(files: &ModelFiles, name: String) -> Result<Self, ModelError> {
        Self::load_from(ModelSource::Files(files), name)
    }

    /// The name a model directory is served under: its last path component.
    pub fn name_of_dir(dir: &Path) -> String {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .or_else(|| {
                let absolute = dir.canonicalize().ok()?;
                absolute
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| dir.display().to_string())
    }

    /// Loads a model whose files are compiled into the binary (e.g. with `include_bytes!`),
    /// given as `(file name, contents)` pairs named as in a model directory.
    pub fn from_memory(name: &str, files: &[(&str, &'static [u8])]) -> Result<Self, ModelError> {
        Self::load_from(ModelSource::Memory(files), name.to_owned())
    }

    /// [`Model::from_files`], running `build` on the model's configuration and weights (a
    /// backend, for instance) while the tokenizer, the chat template and the generation defaults
    /// are parsed on another thread. `build` runs only once the configuration and the weights
    /// are valid; its result is returned beside the model, or dropped when the text parts fail
    /// to parse (that error is returned).
    pub fn from_files_building<T>(
        files: &ModelFiles,
        name: String,
        build: impl FnOnce(ModelTensors<'_>) -> T,
    ) -> Result<(Self, T), ModelError> {
        Self::load_building(ModelSource::Files(files), name, build)
    }

    /// The configuration and the weights, which is what a backend is built from.
    pub fn tensors(&self) -> ModelTensors<'_> {
        ModelTensors {
            config: &self.config,
            weights: &self.weights,
        }
    }

    /// Loads every part of the model from `source`.
    fn load_from(source: ModelSource<'_>, name: String) -> Result<Self, ModelError> {
        Self::load_building(source, name, |_| ()).map(|(model, ())| model)
    }

    /// Loads every part of the model from `source`, running `build` on the tensors while the
    /// text parts are parsed on another thread.
    fn load_building<T>(
        source: ModelSource<'_>,
        name: String,
        build: impl FnOnce(ModelTensors<'_>) -> T,
    ) -> Result<(Self, T), ModelError> {
        let config = ModelConfig::from_json(&source.path(CONFIG_FILE), &source.read(CONFIG_FILE)?)?;
        let weights = ModelWeights::open(&source)?;
        layout(&config).validate(&weights)?;
        let digest = ModelDigest::of_source(&source)?;

        let (text, built) = std::thread::scope(|scope| {
            let text = scope.spawn(|| ModelText::load(&source, config.vocab_size));
            let built = build(ModelTensors {
                config: &config,
                weights: &weights,
            });
            let text = text
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (text, built)
        });
        let ModelText {
            tokenizer,
            chat_template,
            generation,
            special,
        } = text?;
        tracing::info!(
            model = %name,
            source = %source.path("").display(),
            digest = %digest,
            architecture = config.architecture.hf_name(),
            layers = config.num_hidden_layers,
            "model loaded"
        );
        let model = Self {
            config,
            weights,
            tokenizer: Arc::new(tokenizer),
            chat_template,
            generation,
            special,
            digest,
            name,
        };
        Ok((model, built))
    }

    /// Compiles the chat template: `chat_template.jinja` when present, otherwise the one(s) in
    /// `tokenizer_config.json`.
    fn chat_template(
        source: &ModelSource<'_>,
        config: &TokenizerConfig,
    ) -> Result<Option<ChatTemplate>, ModelError> {
        let (path, templates) = match source.read_optional(CHAT_TEMPLATE_FILE)? {
            Some(bytes) => {
                let path = source.path(CHAT_TEMPLATE_FILE);
                let text = String::from_utf8(bytes).map_err(|_| ModelError::InvalidField {
                    path: path.clone(),
                    field: "(contents)".into(),
                    reason: "not UTF-8".into(),
                })?;
                (path, vec![(DEFAULT_TEMPLATE.to_owned(), text)])
            }
            None if config.templates.is_empty() => return Ok(None),
            None => (source.path(TOKENIZER_CONFIG_FILE), config.templates.clone()),
        };
        ChatTemplate::new(&templates, config.special.clone())
            .map(Some)
            .map_err(|source| ModelError::ChatTemplate { path, source })
    }

    /// The tokens that end generation: those of `generation_config.json` (or, without any,
    /// `config.json`), plus the tokenizer's EOS token, without duplicates.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let mut ids = if self.generation.eos_token_ids.is_empty() {
            self.config.eos_token_ids.clone()
        } else {
            self.generation.eos_token_ids.clone()
        };
        if let Some(id) = self
            .special
            .eos_token
            .as_deref()
            .and_then(|t| self.tokenizer.token_to_id(t))
        {
            ids.push(id);
        }
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(*id));
        ids
    }
}

/// Loads `tokenizer.json` and checks that every token id fits the model's vocabulary.
fn load_tokenizer(
    source: &ModelSource<'_>,
    vocab_size: usize,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let path = source.path(TOKENIZER_FILE);
    let tokenizer =
        tokenizers::Tokenizer::from_bytes(source.read(TOKENIZER_FILE)?).map_err(|e| {
            ModelError::Tokenizer {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?;
    if let Some(max_id) = tokenizer.get_vocab(true).into_values().max()
        && max_id as usize >= vocab_size
    {
        return Err(ModelError::InvalidField {
            path,
            field: "model.vocab".into(),
            reason: format!(
                "token id {max_id} is outside the model's vocabulary (vocab_size {vocab_size})"
            ),
        });
    }
    Ok(tokenizer)
}

/// Reads `generation_config.json` (all defaults when absent) and checks its EOS ids.
fn load_generation(
    source: &ModelSource<'_>,
    vocab_size: usize,
) -> Result<GenerationDefaults, ModelError> {
    let path = source.path(GENERATION_CONFIG_FILE);
    let generation = match source.read_optional(GENERATION_CONFIG_FILE)? {
        Some(bytes) => GenerationDefaults::from_json(&path, &bytes)?,
        None => return Ok(GenerationDefaults::default()),
    };
    if let Some(id) = generation
        .eos_token_ids
        .iter()
        .find(|id| **id as usize >= vocab_size)
    {
        return Err(ModelError::InvalidField {
            path,
            field: "eos_token_id".into(),
            reason: format!("{id} is outside the vocabulary (vocab_size {vocab_size})"),
        });
    }
    Ok(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine moves the model's parts across threads.
    #[test]
    fn model_parts_are_thread_safe() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Model>();
        assert_send_sync::<ModelWeights>();
        assert_send_sync::<ChatTemplate>();
    }

    fn tiny_dir() -> tempfile::TempDir {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inferno-tiny");
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&fixture).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        dir
    }

    #[test]
    fn building_beside_the_text_gives_the_tensors_and_the_same_model() {
        let dir = tiny_dir();
        let files = ModelFiles::read_dir(dir.path()).unwrap();
        let plain = Model::from_files(&files, "tiny".into()).unwrap();
        let (model, seen) = Model::from_files_building(&files, "tiny".into(), |tensors| {
            (tensors.config.clone(), tensors.weights.names().count())
        })
        .unwrap();
        assert_eq!(seen.0, plain.config);
        assert_eq!(seen.1, plain.weights.names().count());
        assert_eq!(model.digest, plain.digest);
        assert_eq!(model.eos_token_ids(), plain.eos_token_ids());
        assert_eq!(
            model
                .tokenizer
                .encode("hello world", false)
                .unwrap()
                .get_ids(),
            plain
                .tokenizer
                .encode("hello world", false)
                .unwrap()
                .get_ids()
        );
    }

    #[test]
    fn a_tokenizer_that_fails_fails_the_load_after_the_build_ran() {
        let dir = tiny_dir();
        std::fs::write(dir.path().join(TOKENIZER_FILE), b"{not json").unwrap();
        let files = ModelFiles::read_dir(dir.path()).unwrap();
        let mut built = false;
        let err = Model::from_files_building(&files, "tiny".into(), |_| built = true)
            .expect_err("a broken tokenizer.json fails the load");
        assert!(built, "the tensors were valid, so the build ran");
        assert!(err.to_string().contains(TOKENIZER_FILE), "{err}");
    }
}
