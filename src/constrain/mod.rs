//! Constrained decoding with llguidance: JSON schemas, regular expressions, choices and Lark
//! grammars compiled against the model's tokenizer into per-step token masks.
//!
//! A request's constraint is compiled once (in the request's blocking preparation, under
//! llguidance's fuel limits, which bound the compile time), then each choice gets its own
//! [`TokenConstraint`]. The engine advances it with each sampled token, then asks it for the next
//! allowed-token mask on a worker thread while it finishes the step's bookkeeping and schedules
//! the next one; the mask travels with that step to the sampler (on the device with the CUDA
//! backend; see `docs/engine.md`, "Constrained decoding").

pub mod limits;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What kind of constraint a request asked for (recorded in the audit log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintKind {
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `response_format: {"type": "json_schema"}`: JSON valid against a schema.
    JsonSchema,
    /// `guided_regex`.
    Regex,
    /// `guided_choice`: exactly one of the listed strings.
    Choice,
    /// `guided_grammar`: a Lark grammar.
    Grammar,
    /// Tool calls enforced by `tool_choice` (`required` or a named function).
    ToolCall,
}

impl ConstraintKind {
    /// The name used in the audit log and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::JsonSchema => "json_schema",
            Self::Regex => "regex",
            Self::Choice => "choice",
            Self::Grammar => "grammar",
            Self::ToolCall => "tool_call",
        }
    }
}

/// A request's constraint before compilation: its kind and the grammar source.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstraintSpec {
    /// The kind of constraint.
    pub kind: ConstraintKind,
    /// The grammar source: a JSON schema, a regular expression or a Lark grammar.
    pub source: ConstraintSource,
}

/// The grammar of a constraint, in the form llguidance compiles.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSource {
    /// A JSON schema.
    JsonSchema(Value),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A Lark grammar.
    Lark(String),
}

impl ConstraintSpec {
    /// Any JSON object.
    pub fn json_object() -> Self {
        Self {
            kind: ConstraintKind::JsonObject,
            source: ConstraintSource::JsonSchema(serde_json::json!({"type": "object"})),
        }
    }

    /// Exactly one of `choices`, as a Lark grammar of string literals.
    pub fn choice(choices: &[String]) -> Self {
        let alternatives: Vec<String> = choices
            .iter()
            .map(|choice| Value::String(choice.clone()).to_string())
            .collect();
        Self {
            kind: ConstraintKind::Choice,
            source: ConstraintSource::Lark(format!("start: {}", alternatives.join(" | "))),
        }
    }

    /// SHA-256 of the kind and the canonical grammar source, as hex: names the grammar in the
    /// audit log without recording its content.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.kind.as_str().as_bytes());
        hasher.update([0]);
        match &self.source {
            ConstraintSource::JsonSchema(schema) => {
                hasher.update(b"json_schema\0");
                hasher.update(schema.to_string().as_bytes());
            }
            ConstraintSource::Regex(regex) => {
                hasher.update(b"regex\0");
                hasher.update(regex.as_bytes());
            }
            ConstraintSource::Lark(grammar) => {
                hasher.update(b"lark\0");
                hasher.update(grammar.as_bytes());
            }
        }
        hex::encode(hasher.finalize())
    }

    fn grammar(&self) -> TopLevelGrammar {
        match &self.source {
            ConstraintSource::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact_json(schema.clone()))
            }
            ConstraintSource::Regex(regex) => TopLevelGrammar::from_regex(regex),
            ConstraintSource::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        }
    }
}

/// Asks llguidance for compact JSON (no whitespace outside strings besides the separators
/// `, ` and `: `) unless the schema sets its own `x-guidance` options: with free whitespace a
/// model can pad its output until it runs out of tokens.
pub fn compact_json(mut schema: Value) -> Value {
    if let Value::Object(object) = &mut schema
        && !object.contains_key("x-guidance")
    {
        object.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// A constraint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The tokenizer could not be adapted for llguidance.
    #[error("cannot prepare the tokenizer for constrained decoding: {0}")]
    Tokenizer(String),
    /// The schema, regular expression or grammar is invalid or exceeds the compile limits.
    #[error("invalid {kind}: {reason}")]
    Invalid {
        /// The constraint's kind.
        kind: &'static str,
        /// llguidance's explanation.
        reason: String,
    },
}

/// The model's tokenizer prepared for llguidance, shared by every request.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Adapts `tokenizer` (through `toktrie_hf_tokenizers`) for a model whose logits have
    /// `vocab_size` entries and whose generation ends at any of `eos_token_ids`.
    ///
    /// Grammars are written in text, and the token table is made to agree with how the
    /// tokenizer turns text into tokens: an added token that is not special (Qwen's
    /// `<tool_call>`, `<think>`) is the only way the tokenizer writes its text, so the grammar
    /// sees it as that text; a special token (`<|im_end|>`, `<|eot_id|>`) stays outside every
    /// grammar, and text that spells one is tokenized as ordinary text.
    pub fn new(
        tokenizer: &tokenizers::Tokenizer,
        eos_token_ids: &[u32],
        vocab_size: usize,
    ) -> Result<Self, ConstraintError> {
        let json = tokenizer
            .to_string(false)
            .map_err(|err| ConstraintError::Tokenizer(err.to_string()))?;
        let mut bytes = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
            .map_err(|err| ConstraintError::Tokenizer(err.to_string()))?;
        if !eos_token_ids.is_empty() {
            bytes.set_eos_tokens(eos_token_ids);
        }
        // llguidance tokenizes forced text with the tokenizer itself: it must not produce a
        // special token the grammar cannot match.
        bytes.hf_tokenizer.set_encode_special_tokens(true);
        let plain_added: Vec<(u32, Vec<u8>)> = bytes
            .hf_tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, added)| !added.special)
            .map(|(id, added)| (id, added.content.into_bytes()))
            .collect();
        let mut env = toktrie_hf_tokenizers::ByteTokenizerEnv::new(bytes, Some(vocab_size))
            .map_err(|err| ConstraintError::Tokenizer(err.to_string()))?;
        if !plain_added.is_empty() {
            let trie = &env.tok_trie;
            let mut words: Vec<Vec<u8>> = (0..trie.vocab_size())
                .map(|id| trie.token(id as u32).to_vec())
                .collect();
            for (id, text) in plain_added {
                if let Some(word) = words.get_mut(id as usize) {
                    *word = text;
                }
            }
            let eos = trie.eos_tokens().to_vec();
            let mut rebuilt = TokTrie::from(trie.info(), &words);
            if eos.len() > 1 {
                rebuilt = rebuilt.with_eos_tokens(&eos);
            }
            env.tok_trie = rebuilt;
        }
        let env: TokEnv = env.to_env();
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|err| ConstraintError::Tokenizer(err.to_string()))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// Compiles `spec` once; the result is cloned for each choice of the request.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<CompiledConstraint, ConstraintError> {
        // The engine's first line says what is wrong; what follows can be its internal state.
        let invalid = |reason: String| ConstraintError::Invalid {
            kind: spec.kind.as_str(),
            reason: first_line(&reason),
        };
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|err| invalid(err.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask surfaces errors that only show when the lexer starts.
        matcher
            .compute_mask()
            .map_err(|err| invalid(err.to_string()))?;
        Ok(CompiledConstraint {
            matcher: Arc::new(matcher),
            kind: spec.kind,
            digest: spec.digest(),
        })
    }
}

/// The first line of `text`, at most 300 characters.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// A compiled constraint, ready to start any number of choices.
#[derive(Clone)]
pub struct CompiledConstraint {
    matcher: Arc<Matcher>,
    kind: ConstraintKind,
    digest: String,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint")
            .field("kind", &self.kind)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CompiledConstraint {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.digest == other.digest
    }
}

impl CompiledConstraint {
    /// The constraint's kind.
    pub fn kind(&self) -> ConstraintKind {
        self.kind
    }

    /// The grammar digest (see [`ConstraintSpec::digest`]).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// A fresh constraint state for one choice.
    pub fn start(&self) -> TokenConstraint {
        TokenConstraint {
            matcher: Box::new(self.matcher.deep_clone()),
        }
    }
}

/// The start of every error of a constraint while generating: the server answers it as a 400
/// naming the constraint's field.
pub const CONSTRAINT_FAILURE: &str = "constrained decoding failed";

/// What a client is told when the grammar engine fails while generating. Its own message holds
/// the parser's internal state, which is logged at debug level and never sent.
const ENGINE_LIMIT: &str = "the output could not follow the constraint: its grammar exceeded the \
     parser's limits; simplify the constraint";

/// Logs the grammar engine's own error (internal state included) and gives the client's version.
fn engine_failure(err: impl std::fmt::Display) -> String {
    tracing::debug!(error = %err, "constraint: the grammar engine failed");
    ENGINE_LIMIT.to_owned()
}

/// One choice's position in its grammar.
pub struct TokenConstraint {
    /// Boxed: the parser state is large, and the engine moves each constrained row's state to
    /// rayon's pool and back every step.
    matcher: Box<Matcher>,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint").finish_non_exhaustive()
    }
}

/// The tokens allowed at one step: bit `t % 32` of word `t / 32` is set when token `t` is.
pub type TokenMask = Vec<u32>;

/// Whether token `token` is allowed by `mask`.
pub fn is_allowed(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|word| word & (1 << (token % 32)) != 0)
}

impl TokenConstraint {
    /// The tokens allowed next (only the end-of-sequence tokens once the grammar is complete).
    pub fn mask(&mut self) -> Result<TokenMask, String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(engine_failure)?;
        if mask.is_zero() {
            return Err("the grammar allows no token here".to_owned());
        }
        // The mask's own words, not a copy.
        Ok(mask.into())
    }

    /// Advances past the sampled `token`.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(engine_failure)
    }

    /// True once the grammar is complete and only the end of the sequence may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
