//! Loading Hugging Face model directories: configuration, weights, tokenizer, chat template,
//! generation defaults and the model digest. `docs/model-loading.md` describes the formats.
#![warn(missing_docs)]

pub mod buffer;
pub mod chat_template;
pub mod config;
pub mod definition;
pub mod digest;
mod embedded;
pub mod error;
pub mod files;
pub mod fp8;
pub mod generation;
pub mod gpt_oss;
pub mod harmony;
mod json;
pub mod kv_scales;
pub mod moe;
pub mod mxfp4;
pub mod pooling;
pub mod quantization;
mod source;
pub mod tensors;
pub mod tokenizer_config;
pub mod weights;
pub mod yarn;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use chat_template::{ChatTemplate, TemplateError};
pub use config::{Architecture, ModelConfig, RopeConfig, RopeScaling};
pub use definition::{
    AttentionDefinition, ExpertKind, LayerDefinition, LmHead, MlpDefinition, ModelDefinition,
    MoeDefinition, Norm, Routing,
};
pub use digest::{FileDigest, ModelDigest};
pub use embedded::EMBEDDED_MODEL_NAME;
pub use error::ModelError;
pub use files::{BlockSink, FileBytes, ModelFiles};
pub use generation::GenerationDefaults;
pub use quantization::{Quantization, QuantizationMethod, QuantizeAtLoad};
pub use tensors::{
    ExpertNames, Fp8Tensors, FusedExperts, LayerTensors, LinearTensors, MlpTensors, MoeTensors,
    Packed, SwiGluTensors, TensorLayout, TensorSpec, expert_names, layout,
};
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
    /// How embeddings are pooled, for a sentence-transformers embedding model.
    pub pooling: Option<pooling::Pooling>,
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

impl ModelTensors<'_> {
    /// What the model's layers compute, as its architecture declares it.
    pub fn definition(&self) -> ModelDefinition {
        ModelDefinition::of(self.config)
    }
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
    fn load(source: &TextFiles<'_>, vocab_size: usize) -> Result<Self, ModelError> {
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

/// Where the text parts' files are read from: the model's files, or a model directory on disk
/// (read apart from the hashed files, each file's bytes kept to be compared with them).
enum TextFiles<'a> {
    Source(&'a ModelSource<'a>),
    Disk {
        dir: &'a Path,
        read: Mutex<Vec<(String, Option<Vec<u8>>)>>,
    },
}

impl TextFiles<'_> {
    fn path(&self, file: &str) -> PathBuf {
        match self {
            Self::Source(source) => source.path(file),
            Self::Disk { dir, .. } => dir.join(file),
        }
    }

    fn read_optional(&self, file: &str) -> Result<Option<Vec<u8>>, ModelError> {
        match self {
            Self::Source(source) => source.read_optional(file),
            Self::Disk { dir, read } => {
                let path = dir.join(file);
                let bytes = match files::read_regular(&path) {
                    Ok(bytes) => Some(bytes),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(source) => return Err(ModelError::Io { path, source }),
                };
                read.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((file.to_owned(), bytes.clone()));
                Ok(bytes)
            }
        }
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, ModelError> {
        self.read_optional(file)?
            .ok_or_else(|| ModelError::MissingFile {
                path: self.path(file),
            })
    }
}

/// The tokenizer, its configuration, the chat template and the generation defaults of a model
/// directory, parsed from its files read apart from the hashed ones (while those are read), with
/// the bytes they were parsed from. [`Model::from_files_building_ahead`] uses them only when the
/// model's own files hold exactly those bytes (and it has the same vocabulary size): the parse
/// is a function of them, so the model is the same as if they had been parsed after the read.
pub struct TextAhead {
    vocab_size: usize,
    read: Vec<(String, Option<Vec<u8>>)>,
    text: Result<ModelText, ModelError>,
}

impl std::fmt::Debug for TextAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextAhead")
            .field("vocab_size", &self.vocab_size)
            .field("files", &self.read.len())
            .field("parsed", &self.text.is_ok())
            .finish()
    }
}

impl TextAhead {
    /// Reads and parses the text parts of the model directory `dir` (and its `config.json`, for
    /// the vocabulary size); `None` when the configuration cannot be read.
    pub fn parse(dir: &Path) -> Option<Self> {
        let path = dir.join(CONFIG_FILE);
        let config = files::read_regular(&path).ok()?;
        let vocab_size = ModelConfig::from_json(&path, &config).ok()?.vocab_size;
        let files = TextFiles::Disk {
            dir,
            read: Mutex::new(Vec::new()),
        };
        let text = ModelText::load(&files, vocab_size);
        let TextFiles::Disk { read, .. } = files else {
            unreachable!("built as a directory on disk")
        };
        Some(Self {
            vocab_size,
            read: read.into_inner().unwrap_or_else(|e| e.into_inner()),
            text,
        })
    }

    /// The parse, when `source` holds exactly the bytes it was parsed from and the model has
    /// this vocabulary size.
    fn matching(
        self,
        source: &ModelSource<'_>,
        vocab_size: usize,
    ) -> Option<Result<ModelText, ModelError>> {
        let same = self.vocab_size == vocab_size
            && self.read.iter().all(|(name, bytes)| {
                source
                    .read_optional(name)
                    .is_ok_and(|found| found == *bytes)
            });
        same.then_some(self.text)
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
        Self::load_building(ModelSource::Files(files), name, || None, build)
    }

    /// [`Model::from_files_building`], taking the text parts from `ahead` (joined on the text
    /// parts' thread) when they were parsed from exactly the bytes of `files`.
    pub fn from_files_building_ahead<T>(
        files: &ModelFiles,
        name: String,
        ahead: impl FnOnce() -> Option<TextAhead> + Send,
        build: impl FnOnce(ModelTensors<'_>) -> T,
    ) -> Result<(Self, T), ModelError> {
        Self::load_building(ModelSource::Files(files), name, ahead, build)
    }

    /// What the model's layers compute, as its architecture declares it.
    pub fn definition(&self) -> ModelDefinition {
        ModelDefinition::of(&self.config)
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
        Self::load_building(source, name, || None, |_| ()).map(|(model, ())| model)
    }

    /// Loads every part of the model from `source`, running `build` on the tensors while the
    /// text parts are parsed on another thread (or taken from `ahead` when it parsed the same
    /// bytes).
    fn load_building<T>(
        source: ModelSource<'_>,
        name: String,
        ahead: impl FnOnce() -> Option<TextAhead> + Send,
        build: impl FnOnce(ModelTensors<'_>) -> T,
    ) -> Result<(Self, T), ModelError> {
        let config_bytes = source.read(CONFIG_FILE)?;
        let mut config = ModelConfig::from_json(&source.path(CONFIG_FILE), &config_bytes)?;
        let pooling = pooling::Pooling::load(&source, &config_bytes)?;
        let mut weights = ModelWeights::open(&source)?;
        adapt_embedding_export(&source, &mut config, &mut weights, pooling.is_some())?;
        layout(&ModelDefinition::of(&config), config.quantization.as_ref()).validate(&weights)?;
        let digest = ModelDigest::of_source(&source)?;

        let (text, built) = std::thread::scope(|scope| {
            let text = scope.spawn(|| {
                let vocab_size = config.vocab_size;
                match ahead().and_then(|ahead| ahead.matching(&source, vocab_size)) {
                    Some(text) => text,
                    None => ModelText::load(&TextFiles::Source(&source), vocab_size),
                }
            });
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
            pooling,
        };
        Ok((model, built))
    }

    /// Compiles the chat template: `chat_template.jinja` when present, otherwise the one(s) in
    /// `tokenizer_config.json`.
    fn chat_template(
        source: &TextFiles<'_>,
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
    source: &TextFiles<'_>,
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
    source: &TextFiles<'_>,
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

/// Accepts a sentence-transformers embedding model as it is published (Qwen3-Embedding): its
/// tensors named without the `model.` prefix, which are renamed to the usual names, and no LM
/// head, which makes the model [`ModelConfig::headless`]. Both are refused for a model that is not
/// an embedding model (`is_embedding`: it has a `modules.json`), which must generate.
fn adapt_embedding_export(
    source: &ModelSource<'_>,
    config: &mut ModelConfig,
    weights: &mut ModelWeights,
    is_embedding: bool,
) -> Result<(), ModelError> {
    if weights.bare_names() {
        if !is_embedding {
            return Err(ModelError::InvalidField {
                path: source.path(weights::SINGLE_FILE),
                field: "tensor names".into(),
                reason: "the tensors have no `model.` prefix (a sentence-transformers export), \
                         which loads only as an embedding model with a modules.json"
                    .into(),
            });
        }
        weights.add_model_prefix();
    }
    if is_embedding && !config.tie_word_embeddings && !weights.contains("lm_head.weight") {
        config.headless = true;
    }
    Ok(())
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

    #[test]
    fn text_parsed_ahead_is_used_only_for_the_same_bytes() {
        let dir = tiny_dir();
        let files = ModelFiles::read_dir(dir.path()).unwrap();
        let source = ModelSource::Files(&files);
        let vocab = Model::from_files(&files, "tiny".into())
            .unwrap()
            .config
            .vocab_size;
        let ahead = TextAhead::parse(dir.path()).expect("config.json readable");
        assert!(
            ahead
                .read
                .iter()
                .any(|(name, bytes)| name == TOKENIZER_FILE && bytes.is_some())
        );
        assert!(
            ahead.read.iter().any(|(_, bytes)| bytes.is_none()),
            "absent optional files are recorded as absent"
        );
        let used = TextAhead::parse(dir.path())
            .unwrap()
            .matching(&source, vocab);
        assert!(matches!(used, Some(Ok(_))), "the same bytes: used");
        assert!(
            ahead.matching(&source, vocab + 1).is_none(),
            "another vocabulary"
        );

        // A file that changed on disk after the hashed read: the parse is not used, and the
        // model's text comes from the hashed bytes.
        let config_path = dir.path().join(TOKENIZER_CONFIG_FILE);
        let mut changed = std::fs::read(&config_path).unwrap();
        changed.push(b'\n');
        std::fs::write(&config_path, changed).unwrap();
        let stale = TextAhead::parse(dir.path()).unwrap();
        assert!(stale.text.is_ok());
        assert!(stale.matching(&source, vocab).is_none());

        // A broken tokenizer parsed ahead is not used for good files either.
        std::fs::write(dir.path().join(TOKENIZER_FILE), b"{not json").unwrap();
        let broken = TextAhead::parse(dir.path()).unwrap();
        assert!(broken.text.is_err());
        let (model, ()) =
            Model::from_files_building_ahead(&files, "tiny".into(), || Some(broken), |_| ())
                .expect("the hashed files' text");
        assert!(model.tokenizer.encode("hello", false).is_ok());
    }
}
