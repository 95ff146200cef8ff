//! The loaded model as the API sees it: its engine, tokenizer, chat template and identity.

use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use super::content_tokens::SpecialTokenText;
use super::error::ApiError;
use super::openai::reasoning::ReasoningFormat;
use super::openai::tools::ToolCallFormat;
use crate::config::ServerConfig;
use crate::constrain::{CompiledConstraint, ConstraintSpec, GrammarCompiler};
use crate::engine::{
    EngineHandle, GenerationRequest, GenerationStream, SamplingParams, SubmitError,
};
use crate::model::pooling::Pooling;
use crate::model::{ChatTemplate, Model};

/// How chat messages may use the template's vocabulary (the `[server]` table's `chat_*` keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatPolicy {
    /// Special-token text in message content becomes the control token it spells.
    pub special_tokens_in_content: bool,
    /// Any role is accepted, not only those the template knows.
    pub any_role: bool,
}

impl From<&ServerConfig> for ChatPolicy {
    fn from(server: &ServerConfig) -> Self {
        Self {
            special_tokens_in_content: server.chat_special_tokens_in_content,
            any_role: server.chat_any_role,
        }
    }
}

/// Everything the handlers need from the model once it is loaded.
pub struct ModelService {
    engine: EngineHandle,
    tokenizer: Arc<tokenizers::Tokenizer>,
    /// Built on a thread of its own when the service is created (copying a 128k-token tokenizer
    /// took 90 ms of the 8B-shaped model's start-up); a chat request that needs it first waits.
    special_text: Arc<OnceLock<Option<SpecialTokenText>>>,
    chat_template: Option<ChatTemplate>,
    name: String,
    digest: String,
    weight_format: String,
    max_context: usize,
    defaults: SamplingParams,
    created: u64,
    eos_token_ids: Vec<u32>,
    vocab_size: usize,
    /// The tokenizer prepared for llguidance, built on the first constrained request.
    grammars: OnceLock<Result<GrammarCompiler, String>>,
    /// The constraint compilations allowed at once ([`compile_slots`]).
    compiling: Slots,
    tool_call_format: Option<ToolCallFormat>,
    reasoning_format: Option<ReasoningFormat>,
    /// The tokenizer writes gpt-oss's harmony messages ([`crate::model::harmony`]).
    harmony: bool,
    /// How embeddings are pooled (sentence-transformers embedding models only).
    pooling: Option<Pooling>,
    /// The width of the model's hidden state (an embedding's full size).
    hidden_size: usize,
    /// The model has no LM head ([`crate::model::ModelConfig::headless`]): embeddings only.
    headless: bool,
}

impl ModelService {
    /// Takes what the API needs from `model` (the weights are dropped: the backend holds its own
    /// copy) and the engine that serves it. `served_name` overrides the model's name.
    pub fn new(model: Model, engine: EngineHandle, served_name: Option<String>) -> Self {
        let generation = &model.generation;
        let greedy = generation.do_sample == Some(false);
        let defaults = SamplingParams {
            temperature: if greedy {
                0.0
            } else {
                generation.temperature.unwrap_or(1.0)
            },
            top_k: generation.top_k.unwrap_or(0),
            top_p: generation.top_p.unwrap_or(1.0),
            min_p: generation.min_p.unwrap_or(0.0),
            repetition_penalty: generation.repetition_penalty.unwrap_or(1.0),
            ..SamplingParams::default()
        };
        let harmony = crate::model::harmony::is_harmony(&model.tokenizer);
        let tool_call_format = model.chat_template.as_ref().and_then(|template| {
            template
                .sources()
                .iter()
                .find_map(|source| ToolCallFormat::detect(source))
        });
        let tool_call_format = if harmony {
            Some(ToolCallFormat::Harmony)
        } else {
            tool_call_format
        };
        let reasoning_format = model.chat_template.as_ref().and_then(|template| {
            template
                .sources()
                .iter()
                .find_map(|source| ReasoningFormat::detect(source))
        });
        Self {
            reasoning_format,
            harmony,
            pooling: model.pooling.clone(),
            hidden_size: model.config.hidden_size,
            headless: model.config.headless,
            eos_token_ids: model.eos_token_ids(),
            vocab_size: model.config.vocab_size,
            grammars: OnceLock::new(),
            compiling: Slots::new(compile_slots()),
            tool_call_format,
            max_context: engine.max_context(),
            name: served_name.unwrap_or_else(|| model.name.clone()),
            digest: model.digest.to_string(),
            weight_format: model.config.served_format(),
            special_text: SpecialTokenText::prepare(&model.tokenizer),
            tokenizer: model.tokenizer,
            chat_template: model.chat_template,
            defaults,
            engine,
            created: super::unix_now(),
        }
    }

    /// The served model id.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model digest (hex SHA-256).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The format the weights are served in (`ModelConfig::served_format`).
    pub fn weight_format(&self) -> &str {
        &self.weight_format
    }

    /// Context length in tokens.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Serves at most `tokens` of context (the `server.max_model_len` setting); a larger limit
    /// than the model's own changes nothing.
    pub fn limit_context(&mut self, tokens: Option<usize>) {
        if let Some(tokens) = tokens {
            self.max_context = self.max_context.min(tokens);
        }
    }

    /// Unix time the model was loaded.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Sampling defaults from `generation_config.json`.
    pub fn defaults(&self) -> &SamplingParams {
        &self.defaults
    }

    /// The format the model writes tool calls in: detected from its chat template, unless the
    /// configuration overrides it.
    pub fn tool_call_format(&self) -> Option<ToolCallFormat> {
        self.tool_call_format
    }

    /// Whether the chat template reads a reasoning effort (`reasoning_effort` or
    /// `enable_thinking`); false without a template.
    pub fn reads_reasoning_effort(&self) -> bool {
        self.chat_template
            .as_ref()
            .is_some_and(|template| template.reads_reasoning_effort())
    }

    /// Overrides the detected tool-call format (the `server.tool_call_parser` setting).
    pub fn set_tool_call_format(&mut self, format: Option<ToolCallFormat>) {
        if format.is_some() {
            self.tool_call_format = format;
        }
    }

    /// Whether the model writes harmony messages (gpt-oss): its output keeps the framing tokens
    /// and is read by the harmony parser (channels, reasoning and tool calls).
    pub fn harmony(&self) -> bool {
        self.harmony
    }

    /// How the model writes its reasoning: detected from its chat template, unless the
    /// configuration overrides it.
    pub fn reasoning_format(&self) -> Option<ReasoningFormat> {
        self.reasoning_format
    }

    /// Overrides the detected reasoning format (the `server.reasoning_parser` setting).
    pub fn set_reasoning_format(&mut self, format: Option<ReasoningFormat>) {
        if format.is_some() {
            self.reasoning_format = format;
        }
    }

    /// How embeddings are pooled; `None` for a model that is not an embedding model.
    pub fn pooling(&self) -> Option<&Pooling> {
        self.pooling.as_ref()
    }

    /// The width of the model's hidden state: the full size of its embeddings.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// Compiles a request's constraint against the model's tokenizer (a 400 when the schema,
    /// regular expression or grammar is invalid). At most [`compile_slots`] compile at once, so
    /// costly grammars cannot take every core from plain requests; one more waits for a slot up
    /// to [`COMPILE_WAIT`], then is refused (HTTP 429). Blocking: call it off the async threads.
    pub fn compile_constraint(
        &self,
        spec: &ConstraintSpec,
        param: &str,
    ) -> Result<CompiledConstraint, ApiError> {
        let _slot = self.compiling.acquire(COMPILE_WAIT).ok_or_else(|| {
            ApiError::rate_limited("too many constraints are being compiled; retry shortly", 1)
        })?;
        let compiler = self
            .grammars
            .get_or_init(|| {
                GrammarCompiler::new(&self.tokenizer, &self.eos_token_ids, self.vocab_size)
                    .map_err(|err| err.to_string())
            })
            .as_ref()
            .map_err(|err| ApiError::internal(err.clone()))?;
        compiler
            .compile(spec)
            .map_err(|err| ApiError::invalid_param(param, err.to_string()))
    }

    /// Decodes token ids to text (`/detokenize`).
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ApiError> {
        self.check_tokens(tokens)
            .map_err(|err| err.with_param("tokens"))?;
        self.tokenizer
            .decode(tokens, false)
            .map_err(|err| ApiError::internal(format!("detokenization failed: {err}")))
    }

    /// The engine.
    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    /// Refuses a request for another model (HTTP 404).
    pub fn check_model(&self, requested: &str) -> Result<(), ApiError> {
        if requested == self.name {
            Ok(())
        } else {
            Err(ApiError::model_not_found(requested))
        }
    }

    /// Refuses generation (HTTP 400) on an embedding model published without an LM head.
    pub fn check_generates(&self) -> Result<(), ApiError> {
        if self.headless {
            Err(ApiError::invalid_request(
                "this model is an embedding model without an LM head: it serves /v1/embeddings only",
            ))
        } else {
            Ok(())
        }
    }

    /// Renders a conversation with the chat template and tokenizes it (the template supplies the
    /// special tokens). Under the default `policy`, roles are limited to those the template
    /// knows, and added-token text inside the request (message content, tools, arguments;
    /// special tokens and the added tokens that are not special alike) is tokenized as plain
    /// text: only the template's own markup becomes those tokens.
    pub fn chat_prompt(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
        policy: ChatPolicy,
    ) -> Result<Vec<u32>, ApiError> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            ApiError::invalid_request(
                "this model has no chat template; use /v1/completions instead",
            )
        })?;
        if !policy.any_role {
            template
                .check_roles(messages)
                .map_err(super::content_tokens::template_error)?;
        }
        let special_text = self
            .special_text
            .get_or_init(|| SpecialTokenText::new(&self.tokenizer))
            .as_ref()
            .filter(|_| !policy.special_tokens_in_content);
        let conversation = super::content_tokens::Conversation {
            messages,
            tools,
            add_generation_prompt,
            extra,
        };
        super::content_tokens::encode_chat(template, &self.tokenizer, special_text, &conversation)
    }

    /// Tokenizes text; `add_special_tokens` adds the tokenizer's BOS (plain completions).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|err| ApiError::internal(format!("tokenization failed: {err}")))
    }

    /// Checks that token ids given by the client exist in the vocabulary.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<(), ApiError> {
        let vocab = self.tokenizer.get_vocab_size(true);
        match tokens.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(ApiError::invalid_param(
                "prompt",
                format!("token id {id} is outside the vocabulary of {vocab} tokens"),
            )),
            None => Ok(()),
        }
    }

    /// Checks that every `logit_bias` token exists in the model's vocabulary.
    pub fn check_logit_bias(&self, bias: &[(u32, f32)]) -> Result<(), ApiError> {
        match bias.iter().find(|(id, _)| *id as usize >= self.vocab_size) {
            Some((id, _)) => Err(ApiError::invalid_param(
                "logit_bias",
                format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.vocab_size
                ),
            )),
            None => Ok(()),
        }
    }

    /// The text of one token, as shown in logprobs.
    pub fn token_text(&self, token: u32) -> String {
        self.tokenizer.decode(&[token], false).unwrap_or_default()
    }

    /// A token's text as decoded output shows it: empty for a special token (an echoed
    /// prompt's BOS).
    pub fn visible_text(&self, token: u32) -> String {
        self.tokenizer.decode(&[token], true).unwrap_or_default()
    }

    /// Submits requests to the engine; if any is refused, the ones already queued are cancelled
    /// (their streams are dropped) and the refusal is mapped to an HTTP error.
    pub fn submit(
        &self,
        requests: Vec<GenerationRequest>,
        retry_after: u64,
    ) -> Result<Vec<GenerationStream>, ApiError> {
        requests
            .into_iter()
            .map(|request| {
                self.engine
                    .submit(request)
                    .map_err(|err| submit_error(err, retry_after))
            })
            .collect()
    }

    /// Queues embedding requests (their streams carry the final hidden state); a queue too full
    /// for all of them is a 429.
    pub fn submit_embeddings(
        &self,
        requests: Vec<GenerationRequest>,
        retry_after: u64,
    ) -> Result<Vec<GenerationStream>, ApiError> {
        requests
            .into_iter()
            .map(|request| {
                self.engine
                    .submit_embedding(request)
                    .map_err(|err| match err {
                        SubmitError::TooLong { .. } => {
                            let mut api = ApiError::invalid_param("input", err.to_string());
                            api.code = Some("context_length_exceeded");
                            api
                        }
                        err => submit_error(err, retry_after),
                    })
            })
            .collect()
    }
}

/// How many constraints compile at once: half the cores, at least one.
pub fn compile_slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// How long a constraint waits for a compile slot before it is refused.
pub const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A counting semaphore for blocking threads (the compilations run on Tokio's blocking pool).
struct Slots {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

/// A taken slot of [`Slots`], given back when dropped.
struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(count: usize) -> Self {
        Self {
            free: std::sync::Mutex::new(count),
            freed: std::sync::Condvar::new(),
        }
    }

    /// A slot, waiting at most `wait` for one; `None` when none freed in time.
    fn acquire(&self, wait: std::time::Duration) -> Option<Slot<'_>> {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (mut free, _) = self
            .freed
            .wait_timeout_while(free, wait, |free| *free == 0)
            .unwrap_or_else(|e| e.into_inner());
        if *free == 0 {
            return None;
        }
        *free -= 1;
        Some(Slot(self))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// Maps an engine refusal to its HTTP error.
fn submit_error(err: SubmitError, retry_after: u64) -> ApiError {
    match err {
        SubmitError::QueueFull => ApiError::queue_full(retry_after),
        SubmitError::TooLong { .. } => {
            let mut api = ApiError::invalid_param("max_tokens", err.to_string());
            api.code = Some("context_length_exceeded");
            api
        }
        SubmitError::EmptyPrompt | SubmitError::UnknownToken { .. } => {
            ApiError::invalid_param("prompt", err.to_string())
        }
        SubmitError::StopStrings(_) => ApiError::invalid_param("stop", err.to_string()),
        SubmitError::Unsupported(..) => ApiError::invalid_param("prompt_logprobs", err.to_string()),
        SubmitError::Stopped => ApiError::unavailable("the engine has stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_slots_are_bounded_and_given_back() {
        let slots = Slots::new(1);
        let first = slots
            .acquire(std::time::Duration::ZERO)
            .expect("a free slot");
        assert!(
            slots
                .acquire(std::time::Duration::from_millis(20))
                .is_none(),
            "only one slot"
        );
        drop(first);
        assert!(slots.acquire(std::time::Duration::ZERO).is_some());
        assert!(compile_slots() >= 1);
    }
}
