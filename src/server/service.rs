//! The loaded model as the API sees it: its engine, tokenizer, chat template and identity.

use std::sync::{Arc, OnceLock};

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::{Map, Value};

use super::error::ApiError;
use super::openai::tools::ToolCallFormat;
use crate::config::ServerConfig;
use crate::constrain::{CompiledConstraint, ConstraintSpec, GrammarCompiler};
use crate::engine::{
    EngineHandle, GenerationRequest, GenerationStream, SamplingParams, SubmitError,
};
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

/// The tokenizer's special tokens, and a copy of the tokenizer that reads their text as plain
/// text: what keeps special-token text inside chat messages from becoming control tokens.
struct SpecialTokenText {
    /// Finds any special token's text (leftmost-longest).
    finder: AhoCorasick,
    /// The id of each pattern of `finder`.
    ids: Vec<u32>,
    /// The tokenizer with special-token matching off.
    plain: tokenizers::Tokenizer,
}

impl SpecialTokenText {
    /// Starts building the special-token text of `tokenizer` on another thread (if no thread
    /// can be started, the first use builds it).
    fn prepare(tokenizer: &Arc<tokenizers::Tokenizer>) -> Arc<OnceLock<Option<Self>>> {
        let cell = Arc::new(OnceLock::new());
        let (filled, tokenizer) = (cell.clone(), tokenizer.clone());
        let _ = std::thread::Builder::new()
            .name("special-tokens".into())
            .spawn(move || {
                filled.get_or_init(|| Self::new(&tokenizer));
            });
        cell
    }

    fn new(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        let mut specials: Vec<(String, u32)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special && !token.content.is_empty())
            .map(|(id, token)| (token.content, id))
            .collect();
        if specials.is_empty() {
            return None;
        }
        specials.sort();
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(specials.iter().map(|(text, _)| text))
            .ok()?;
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        Some(Self {
            finder,
            ids: specials.into_iter().map(|(_, id)| id).collect(),
            plain,
        })
    }

    /// Replaces special-token text in every string of `value` by as many `x` bytes; whether
    /// there was any.
    fn neutralize(&self, value: &mut Value) -> bool {
        match value {
            Value::String(text) if self.finder.is_match(text.as_str()) => {
                let mut out = String::with_capacity(text.len());
                let mut at = 0;
                for found in self.finder.find_iter(text.as_str()) {
                    out.push_str(&text[at..found.start()]);
                    out.extend(std::iter::repeat_n('x', found.len()));
                    at = found.end();
                }
                out.push_str(&text[at..]);
                *text = out;
                true
            }
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |any, item| self.neutralize(item) | any),
            Value::Object(map) => map
                .values_mut()
                .fold(false, |any, item| self.neutralize(item) | any),
            _ => false,
        }
    }

    /// Tokenizes `text` rendered by the template, where `reference` is the same rendering with
    /// the request's special-token text neutralized (same length): special tokens found in
    /// `reference` are the template's own and become control tokens; everything else,
    /// special-token text of the request included, is tokenized as plain text.
    fn encode(&self, text: &str, reference: &str) -> Result<Vec<u32>, ApiError> {
        let entangled = || {
            ApiError::invalid_param(
                "messages",
                "special-token text in the messages cannot be told apart from the chat \
                 template's own special tokens; remove it",
            )
        };
        if text.len() != reference.len() {
            return Err(entangled());
        }
        let plain = |segment: &str| {
            self.plain
                .encode(segment, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|err| ApiError::internal(format!("tokenization failed: {err}")))
        };
        let mut ids = Vec::new();
        let mut at = 0;
        for found in self.finder.find_iter(reference) {
            let range = found.start()..found.end();
            if text.as_bytes().get(range.clone()) != reference.as_bytes().get(range.clone()) {
                return Err(entangled());
            }
            ids.extend(plain(text.get(at..found.start()).ok_or_else(entangled)?)?);
            ids.push(self.ids[found.pattern().as_usize()]);
            at = found.end();
        }
        ids.extend(plain(text.get(at..).ok_or_else(entangled)?)?);
        Ok(ids)
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
    tool_call_format: Option<ToolCallFormat>,
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
        let tool_call_format = model.chat_template.as_ref().and_then(|template| {
            template
                .sources()
                .iter()
                .find_map(|source| ToolCallFormat::detect(source))
        });
        Self {
            eos_token_ids: model.eos_token_ids(),
            vocab_size: model.config.vocab_size,
            grammars: OnceLock::new(),
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

    /// Overrides the detected tool-call format (the `server.tool_call_parser` setting).
    pub fn set_tool_call_format(&mut self, format: Option<ToolCallFormat>) {
        if format.is_some() {
            self.tool_call_format = format;
        }
    }

    /// Compiles a request's constraint against the model's tokenizer (a 400 when the schema,
    /// regular expression or grammar is invalid). Blocking: call it off the async threads.
    pub fn compile_constraint(
        &self,
        spec: &ConstraintSpec,
        param: &str,
    ) -> Result<CompiledConstraint, ApiError> {
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

    /// Renders a conversation with the chat template and tokenizes it (the template supplies the
    /// special tokens). Under the default `policy`, roles are limited to those the template
    /// knows, and special-token text inside the request (message content, tools, arguments)
    /// is tokenized as plain text: only the template's own special tokens are control tokens.
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
        let template_error = |err: crate::model::chat_template::TemplateError| match &err {
            crate::model::chat_template::TemplateError::UnknownRole { index, .. } => {
                ApiError::invalid_param(format!("messages[{index}].role"), err.to_string())
            }
            _ => ApiError::invalid_param("messages", err.to_string()),
        };
        if !policy.any_role {
            template.check_roles(messages).map_err(template_error)?;
        }
        let text = template
            .render(messages, tools, add_generation_prompt, extra)
            .map_err(template_error)?;
        let Some(special_text) = self
            .special_text
            .get_or_init(|| SpecialTokenText::new(&self.tokenizer))
            .as_ref()
            .filter(|_| !policy.special_tokens_in_content)
        else {
            return self.encode(&text, false);
        };
        let mut neutral_messages = Value::Array(messages.to_vec());
        let mut neutral_tools = tools.cloned().unwrap_or(Value::Null);
        let mut neutral_extra = Value::Object(extra.clone());
        let found = special_text.neutralize(&mut neutral_messages)
            | special_text.neutralize(&mut neutral_tools)
            | special_text.neutralize(&mut neutral_extra);
        if !found {
            return self.encode(&text, false);
        }
        let (Value::Array(neutral_messages), Value::Object(neutral_extra)) =
            (neutral_messages, neutral_extra)
        else {
            return Err(ApiError::internal(
                "neutralizing the request changed its shape",
            ));
        };
        let reference = template
            .render(
                &neutral_messages,
                tools.map(|_| &neutral_tools),
                add_generation_prompt,
                &neutral_extra,
            )
            .map_err(template_error)?;
        special_text.encode(&text, &reference)
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
        SubmitError::Stopped => ApiError::unavailable("the engine has stopped"),
    }
}
