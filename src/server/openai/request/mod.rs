//! Parsing and validating `/v1/chat/completions` and `/v1/completions` request bodies.
//!
//! Bodies are parsed into a JSON value first (malformed JSON is a 400), then each known field is
//! read with its path so that a field of the wrong type names itself in the error's `param`.
//! Every field the server does not implement, known to OpenAI or not, is refused with a 400 that
//! names it; the fields that change nothing about the output ([`IGNORED_FIELDS`]) are accepted
//! and named in a response header.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::echo::PromptReturn;
use crate::config::LimitsConfig;
use crate::constrain::{ConstraintKind, ConstraintSource, ConstraintSpec, limits};
use crate::engine::{MAX_LOGIT_BIAS_TOKENS, MAX_STOP_BYTES, SamplingParams, StopParams};
use crate::server::error::ApiError;

/// Fields both endpoints implement.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "stream",
    "stream_options",
    "logit_bias",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];
/// Fields both endpoints accept and ignore: labels and service hints that change nothing about
/// the output (`store` only as `false`). They are named in the `inferno-ignored-fields` header.
pub const IGNORED_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "store",
];
/// The response header naming the request's ignored fields.
pub const IGNORED_FIELDS_HEADER: &str = "inferno-ignored-fields";
/// Fields only `/v1/chat/completions` implements.
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "add_generation_prompt",
    "reasoning_effort",
];
/// Fields only `/v1/completions` implements.
const COMPLETION_FIELDS: &[&str] = &[
    "prompt",
    "logprobs",
    "echo",
    "prompt_logprobs",
    "suffix",
    "best_of",
];
/// Largest magnitude of a `logit_bias` entry.
const MAX_LOGIT_BIAS: f32 = 100.0;

/// Most stop strings per request.
const MAX_STOP_STRINGS: usize = 16;
/// Most `top_logprobs` per token.
const MAX_TOP_LOGPROBS: u32 = 20;

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Fields shared by both endpoints.
#[derive(Debug, Clone, Deserialize)]
struct CommonFields {
    model: String,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    repetition_penalty: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logit_bias: Option<Map<String, Value>>,
    #[serde(default)]
    response_format: Option<Map<String, Value>>,
    #[serde(default)]
    guided_json: Option<Value>,
    #[serde(default)]
    guided_regex: Option<String>,
    #[serde(default)]
    guided_choice: Option<Vec<String>>,
    #[serde(default)]
    guided_grammar: Option<String>,
}

/// Fields only `/v1/chat/completions` has.
#[derive(Debug, Clone, Deserialize)]
struct ChatFields {
    messages: Vec<Map<String, Value>>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    reasoning_effort: Value,
}

/// Fields only `/v1/completions` has.
#[derive(Debug, Clone, Deserialize)]
struct CompletionFields {
    prompt: Value,
    #[serde(default)]
    logprobs: Option<u32>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    prompt_logprobs: Option<u32>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<u64>,
}

/// The generation settings common to both endpoints, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOptions {
    /// The requested model id.
    pub model: String,
    /// Choices per prompt.
    pub n: usize,
    /// Sampling parameters (the seed is the base seed; choice `i` uses `seed + i`).
    pub sampling: SamplingParams,
    /// Stop strings, stop tokens and `ignore_eos`; `max_tokens` is settled by [`Self::stop_for`].
    pub stop: StopParams,
    /// The requested completion length, if any.
    pub max_tokens: Option<usize>,
    /// `Some(k)`: return logprobs with `k` alternatives.
    pub logprobs: Option<u32>,
    /// `echo` and `prompt_logprobs` (completions only).
    pub prompt_return: PromptReturn,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of the stream.
    pub include_usage: bool,
    /// The grammar the output must follow (`response_format`, `guided_*`).
    pub constraint: Option<ConstraintSpec>,
    /// The request field `constraint` came from (`response_format`, `guided_json`, ...), which
    /// its errors name.
    pub constraint_param: &'static str,
    /// The request's fields from [`IGNORED_FIELDS`], in that order.
    pub ignored: Vec<&'static str>,
}

impl GenerationOptions {
    /// The sampling parameters of choice `index`: the seed is offset by the index so choices
    /// differ yet stay reproducible.
    pub fn sampling_for(&self, index: usize) -> SamplingParams {
        let mut sampling = self.sampling.clone();
        sampling.seed = sampling.seed.map(|seed| seed.wrapping_add(index as u64));
        sampling
    }

    /// The stop parameters for a prompt of `prompt_len` tokens in a context of `max_context`:
    /// refuses prompts that leave no room, and requested lengths that overflow the context.
    pub fn stop_for(
        &self,
        prompt_len: usize,
        max_context: usize,
        limits: &LimitsConfig,
    ) -> Result<StopParams, ApiError> {
        if prompt_len == 0 {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        if prompt_len >= max_context {
            let mut err = ApiError::invalid_param(
                "messages",
                format!(
                    "the prompt has {prompt_len} tokens, but the model's context length is {max_context} tokens"
                ),
            );
            err.code = Some("context_length_exceeded");
            return Err(err);
        }
        let room = max_context - prompt_len;
        let max_tokens = match self.max_tokens {
            Some(requested) if requested > room => {
                let mut err = ApiError::invalid_param(
                    "max_tokens",
                    format!(
                        "the prompt has {prompt_len} tokens and max_tokens is {requested}, over the model's context length of {max_context} tokens"
                    ),
                );
                err.code = Some("context_length_exceeded");
                return Err(err);
            }
            Some(requested) => requested,
            None => room.min(limits.max_completion_tokens),
        };
        Ok(StopParams {
            max_tokens,
            ..self.stop.clone()
        })
    }
}

/// A validated chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// Generation settings.
    pub options: GenerationOptions,
    /// Messages with text content flattened to strings, ready for the chat template.
    pub messages: Vec<Value>,
    /// Tool definitions passed to the template.
    pub tools: Option<Value>,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
    /// End the prompt with the assistant turn's header.
    pub add_generation_prompt: bool,
    /// How the model may call the tools.
    pub tool_choice: ToolChoice,
    /// Whether one response may carry several tool calls.
    pub parallel_tool_calls: bool,
    /// Whether the request set `reasoning_effort` (ignored, and named so, where the chat
    /// template reads no effort).
    pub reasoning_effort_set: bool,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool call: the output is text (the tools still reach the template).
    None,
    /// The model decides; a tool call in its output is parsed into `tool_calls`.
    Auto,
    /// The output is one or more tool calls, enforced by the grammar.
    Required,
    /// The output is a call of this function, enforced by the grammar.
    Function(String),
}

/// Refuses every field that neither both endpoints nor this one (`endpoint`) implement.
fn refuse_unknown(value: &Value, endpoint: &[&str]) -> Result<(), ApiError> {
    let known: Vec<&str> = COMMON_FIELDS
        .iter()
        .chain(endpoint)
        .chain(IGNORED_FIELDS)
        .copied()
        .collect();
    refuse_fields(value, &known)
}

/// The fields of `value` that [`IGNORED_FIELDS`] lists; `store: true` is refused, since the
/// server keeps nothing a later request could use.
fn ignored_fields(value: &Value) -> Result<Vec<&'static str>, ApiError> {
    match value.get("store") {
        None | Some(Value::Null | Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(ApiError::invalid_param(
                "store",
                "store: true is not supported: this server keeps no responses",
            ));
        }
        Some(_) => return Err(ApiError::invalid_param("store", "store must be a boolean")),
    }
    Ok(IGNORED_FIELDS
        .iter()
        .copied()
        .filter(|field| value.get(*field).is_some())
        .collect())
}

/// Reads `logit_bias`: distinct token ids (as strings) to biases within ±100, at most
/// [`MAX_LOGIT_BIAS_TOKENS`] of them, sorted by token.
fn parse_logit_bias(bias: Option<Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bias = bias.unwrap_or_default();
    if bias.len() > MAX_LOGIT_BIAS_TOKENS {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!(
                "logit_bias has {} entries, at most {MAX_LOGIT_BIAS_TOKENS} are supported",
                bias.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for (key, value) in bias {
        let token: u32 = key.parse().map_err(|_| {
            ApiError::invalid_param(
                "logit_bias",
                format!("logit_bias keys must be token ids, got {key:?}"),
            )
        })?;
        let bias = value
            .as_f64()
            .filter(|b| b.abs() <= f64::from(MAX_LOGIT_BIAS))
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias[{key}] must be a number between -100 and 100"),
                )
            })?;
        out.push((token, bias as f32));
    }
    out.sort_by_key(|(token, _)| *token);
    if let Some(pair) = out.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!("logit_bias names token {} more than once", pair[0].0),
        ));
    }
    Ok(out)
}

/// Reads `response_format` and the vLLM `guided_*` fields into at most one constraint, with the
/// field it came from; the size limits of `crate::constrain::limits` are checked here, before
/// anything is compiled.
fn parse_constraint(
    common: &mut CommonFields,
) -> Result<Option<(&'static str, ConstraintSpec)>, ApiError> {
    let mut found: Vec<(&'static str, ConstraintSpec)> = Vec::new();
    if let Some(format) = common.response_format.take() {
        let bad = |message: String| ApiError::invalid_param("response_format", message);
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push(("response_format", ConstraintSpec::json_object())),
            Some("json_schema") => {
                let spec = format
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("response_format.json_schema must be an object".into()))?;
                let schema = match spec.get("schema") {
                    Some(Value::Object(schema)) => Value::Object(schema.clone()),
                    Some(Value::Bool(true)) | None => serde_json::json!({}),
                    Some(_) => {
                        return Err(bad(
                            "response_format.json_schema.schema must be a JSON schema object"
                                .into(),
                        ));
                    }
                };
                found.push((
                    "response_format",
                    ConstraintSpec {
                        kind: ConstraintKind::JsonSchema,
                        source: ConstraintSource::JsonSchema(schema),
                    },
                ));
            }
            Some(other) => {
                return Err(bad(format!(
                    "response_format type {other:?} is not supported (text, json_object, json_schema)"
                )));
            }
            None => return Err(bad("response_format needs a type".into())),
        }
    }
    if let Some(schema) = common.guided_json.take() {
        let schema = match schema {
            Value::String(text) => serde_json::from_str(&text).map_err(|err| {
                ApiError::invalid_param("guided_json", format!("guided_json is not JSON: {err}"))
            })?,
            other => other,
        };
        found.push((
            "guided_json",
            ConstraintSpec {
                kind: ConstraintKind::JsonSchema,
                source: ConstraintSource::JsonSchema(schema),
            },
        ));
    }
    if let Some(regex) = common.guided_regex.take() {
        found.push((
            "guided_regex",
            ConstraintSpec {
                kind: ConstraintKind::Regex,
                source: ConstraintSource::Regex(regex),
            },
        ));
    }
    if let Some(choices) = common.guided_choice.take() {
        if choices.is_empty() {
            return Err(ApiError::invalid_param(
                "guided_choice",
                "guided_choice needs at least one choice",
            ));
        }
        limits::check_choices(&choices)
            .map_err(|reason| ApiError::invalid_param("guided_choice", reason))?;
        found.push(("guided_choice", ConstraintSpec::choice(&choices)));
    }
    if let Some(grammar) = common.guided_grammar.take() {
        found.push((
            "guided_grammar",
            ConstraintSpec {
                kind: ConstraintKind::Grammar,
                source: ConstraintSource::Lark(grammar),
            },
        ));
    }
    for (param, spec) in &found {
        let checked = match &spec.source {
            ConstraintSource::Regex(regex) => limits::check_regex(regex),
            ConstraintSource::Lark(grammar) => limits::check_size(param, grammar.len()),
            ConstraintSource::JsonSchema(schema) => {
                limits::check_size(param, schema.to_string().len())
            }
        };
        checked.map_err(|reason| ApiError::invalid_param(*param, reason))?;
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid_param(
            found[1].0,
            format!(
                "{} and {} cannot be combined: a request takes one constraint",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// Reads `tool_choice` (`none`, `auto`, `required` or `{"type":"function","function":{"name":…}}`).
fn parse_tool_choice(value: Option<&Value>, has_tools: bool) -> Result<ToolChoice, ApiError> {
    let bad = |message: &str| ApiError::invalid_param("tool_choice", message);
    let choice = match value {
        None | Some(Value::Null) => {
            if has_tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            }
        }
        Some(Value::String(mode)) => match mode.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad(
                    "tool_choice must be none, auto, required or a function",
                ));
            }
        },
        Some(Value::Object(object)) => {
            match (
                object.get("type").and_then(Value::as_str),
                object
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str),
            ) {
                (Some("function"), Some(name)) => ToolChoice::Function(name.to_owned()),
                _ => {
                    return Err(bad(
                        "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": …}}",
                    ));
                }
            }
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object")),
    };
    if !has_tools && choice != ToolChoice::None {
        return Err(bad("tool_choice needs tools"));
    }
    Ok(choice)
}

/// One prompt of a completion request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// A validated completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    /// Generation settings.
    pub options: GenerationOptions,
    /// The prompts; each gets `n` choices.
    pub prompts: Vec<Prompt>,
}

/// Parses a body into a JSON object.
pub(super) fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::invalid_request(format!("the body is not valid JSON: {err}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid_request("the body must be a JSON object"));
    }
    Ok(value)
}

/// Reads typed fields out of a JSON object, naming the offending field on a type error.
pub(super) fn fields<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        if path == "." {
            // A missing required field: serde names it in the message.
            let field = message.split('`').nth(1).unwrap_or_default().to_owned();
            ApiError::invalid_request(message).with_param(field)
        } else {
            let field = path.split(['.', '[']).next().unwrap_or_default().to_owned();
            ApiError::invalid_param(field, format!("{path}: {message}"))
        }
    })
}

fn check_range(name: &str, value: Option<f32>, min: f32, max: f32) -> Result<(), ApiError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ApiError::invalid_param(
            name,
            format!("{name} must be between {min} and {max}, got {v}"),
        )),
        _ => Ok(()),
    }
}

/// Validates the shared fields. `defaults` are the model's sampling defaults
/// (`generation_config.json`), used for fields the request leaves out.
fn common_options(
    mut common: CommonFields,
    max_tokens: Option<u64>,
    logprobs: Option<u32>,
    defaults: &SamplingParams,
    limits: &LimitsConfig,
) -> Result<GenerationOptions, ApiError> {
    let (constraint_param, constraint) = match parse_constraint(&mut common)? {
        Some((param, spec)) => (param, Some(spec)),
        None => ("response_format", None),
    };
    let logit_bias = parse_logit_bias(common.logit_bias.take())?;
    let n = common.n.unwrap_or(1);
    if n == 0 || n > limits.max_n as u64 {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be between 1 and {}, got {n}", limits.max_n),
        ));
    }
    check_range("temperature", common.temperature, 0.0, 2.0)?;
    check_range("top_p", common.top_p, 0.0, 1.0)?;
    if common.top_p == Some(0.0) {
        return Err(ApiError::invalid_param(
            "top_p",
            "top_p must be greater than 0",
        ));
    }
    check_range("min_p", common.min_p, 0.0, 1.0)?;
    check_range("presence_penalty", common.presence_penalty, -2.0, 2.0)?;
    check_range("frequency_penalty", common.frequency_penalty, -2.0, 2.0)?;
    check_range("repetition_penalty", common.repetition_penalty, 0.01, 10.0)?;
    let top_k = match common.top_k {
        None => defaults.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) => u32::try_from(k).map_err(|_| {
            ApiError::invalid_param("top_k", format!("top_k must be -1, 0 or positive, got {k}"))
        })?,
    };
    let max_tokens = match max_tokens {
        None => None,
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        Some(m) if m > limits.max_completion_tokens as u64 => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "max_tokens is {m}, over this server's limit of {}",
                    limits.max_completion_tokens
                ),
            ));
        }
        Some(m) => usize::try_from(m).ok(),
    };
    let stop_strings = match common.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(list)) => list,
    };
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings are accepted"),
        ));
    }
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
            "stop",
            "stop strings must not be empty",
        ));
    }
    let stop_bytes: usize = stop_strings.iter().map(String::len).sum();
    if stop_bytes > MAX_STOP_BYTES {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "the stop strings hold {stop_bytes} bytes together, over the limit of {MAX_STOP_BYTES}"
            ),
        ));
    }
    if let Some(k) = logprobs
        && k > MAX_TOP_LOGPROBS
    {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            format!("at most {MAX_TOP_LOGPROBS} alternatives per token, got {k}"),
        ));
    }
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .as_ref()
        .and_then(|options| options.include_usage)
        .unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    Ok(GenerationOptions {
        model: common.model,
        n: n as usize,
        sampling: SamplingParams {
            temperature: common.temperature.unwrap_or(defaults.temperature),
            top_k,
            top_p: common.top_p.unwrap_or(defaults.top_p),
            min_p: common.min_p.unwrap_or(defaults.min_p),
            presence_penalty: common.presence_penalty.unwrap_or(0.0),
            frequency_penalty: common.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: common
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            seed: common.seed.map(|seed| seed as u64),
            logit_bias,
        },
        stop: StopParams {
            max_tokens: 0,
            stop_strings,
            stop_token_ids: common.stop_token_ids.unwrap_or_default(),
            ignore_eos: common.ignore_eos.unwrap_or(false),
        },
        max_tokens,
        logprobs,
        prompt_return: PromptReturn::default(),
        stream,
        include_usage,
        constraint,
        constraint_param,
        ignored: Vec::new(),
    })
}

/// Flattens a message's `content` to a string: text parts are joined, other parts refused.
pub(super) fn normalize_message(
    index: usize,
    mut message: Map<String, Value>,
) -> Result<Value, ApiError> {
    let param = format!("messages[{index}]");
    match message.get("role") {
        Some(Value::String(role)) if !role.is_empty() => {}
        Some(_) => {
            return Err(ApiError::invalid_param(
                format!("{param}.role"),
                format!("{param}.role must be a non-empty string"),
            ));
        }
        None => {
            return Err(ApiError::invalid_param(
                format!("{param}.role"),
                format!("{param} has no role"),
            ));
        }
    }
    let content = match message.remove("content") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(text)) => Value::String(text),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (part_index, part) in parts.iter().enumerate() {
                let part_param = format!("{param}.content[{part_index}]");
                match (part.get("type"), part.get("text")) {
                    (Some(Value::String(kind)), Some(Value::String(part_text)))
                        if kind == "text" =>
                    {
                        text.push_str(part_text);
                    }
                    _ => {
                        return Err(ApiError::invalid_param(
                            part_param.clone(),
                            format!("{part_param}: only text content parts are supported"),
                        ));
                    }
                }
            }
            Value::String(text)
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                format!("{param}.content"),
                format!("{param}.content must be a string or a list of text parts"),
            ));
        }
    };
    message.insert("content".to_owned(), content);
    Ok(Value::Object(message))
}

/// Parses and validates a chat completion body.
pub fn parse_chat(
    body: &[u8],
    defaults: &SamplingParams,
    limits: &LimitsConfig,
) -> Result<ChatRequest, ApiError> {
    let value = parse_object(body)?;
    refuse_unknown(&value, CHAT_FIELDS)?;
    let common: CommonFields = fields(&value)?;
    let chat: ChatFields = fields(&value)?;
    if chat.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
        (true, k) => Some(k.unwrap_or(0)),
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs requires logprobs to be true",
            ));
        }
        (false, _) => None,
    };
    let max_tokens = chat.max_completion_tokens.or(common.max_tokens);
    let mut options = common_options(common, max_tokens, logprobs, defaults, limits)?;
    options.ignored = ignored_fields(&value)?;
    let messages = chat
        .messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| normalize_message(index, message))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = chat.tools.filter(|tools| !tools.is_empty());
    let tool_choice = parse_tool_choice(chat.tool_choice.as_ref(), tools.is_some())?;
    if let (Some(tools), ToolChoice::Function(name)) = (&tools, &tool_choice)
        && !tools
            .iter()
            .any(|tool| tool["function"]["name"] == name.as_str())
    {
        return Err(ApiError::invalid_param(
            "tool_choice",
            format!("tool_choice names {name:?}, which is not among the tools"),
        ));
    }
    if let Some(tools) = &tools {
        for (index, tool) in tools.iter().enumerate() {
            if tool["type"] != "function" || !tool["function"]["name"].is_string() {
                return Err(ApiError::invalid_param(
                    format!("tools[{index}]"),
                    format!(
                        "tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                ));
            }
        }
    }
    if matches!(tool_choice, ToolChoice::Required | ToolChoice::Function(_))
        && options.constraint.is_some()
    {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "a required or named tool_choice cannot be combined with response_format or guided_*",
        ));
    }
    let mut template_kwargs = chat.chat_template_kwargs.unwrap_or_default();
    let reasoning_effort_set = !chat.reasoning_effort.is_null();
    effort::effort_kwargs(
        &chat.reasoning_effort,
        "reasoning_effort",
        &mut template_kwargs,
    )?;
    Ok(ChatRequest {
        options,
        messages,
        tools: tools.map(Value::Array),
        tool_choice,
        parallel_tool_calls: chat.parallel_tool_calls.unwrap_or(true),
        template_kwargs,
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(true),
        reasoning_effort_set,
    })
}

/// Refuses every field of `value` outside `allowed`, naming it.
pub(super) fn refuse_fields(value: &Value, allowed: &[&str]) -> Result<(), ApiError> {
    if let Some(key) = value
        .as_object()
        .and_then(|object| object.keys().find(|key| !allowed.contains(&key.as_str())))
    {
        return Err(ApiError::invalid_param(
            key.clone(),
            format!("{key} is not supported by this server"),
        ));
    }
    Ok(())
}

/// Reads `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
fn parse_prompts(prompt: &Value) -> Result<Vec<Prompt>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    };
    let token = |value: &Value| {
        value
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(bad)
    };
    let prompts = match prompt {
        Value::String(text) => vec![Prompt::Text(text.clone())],
        Value::Array(items) if items.is_empty() => return Err(bad()),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            vec![Prompt::Tokens(
                items.iter().map(token).collect::<Result<_, _>>()?,
            )]
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(Prompt::Text(text.clone())),
                Value::Array(ids) => Ok(Prompt::Tokens(
                    ids.iter().map(token).collect::<Result<_, _>>()?,
                )),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(bad()),
    };
    Ok(prompts)
}

/// Parses and validates a completion body.
pub fn parse_completion(
    body: &[u8],
    defaults: &SamplingParams,
    limits: &LimitsConfig,
) -> Result<CompletionRequest, ApiError> {
    let value = parse_object(body)?;
    refuse_unknown(&value, COMPLETION_FIELDS)?;
    let common: CommonFields = fields(&value)?;
    let completion: CompletionFields = fields(&value)?;
    if let Some(best_of) = completion.best_of
        && best_of != common.n.unwrap_or(1)
    {
        return Err(ApiError::invalid_param(
            "best_of",
            "best_of is supported only equal to n (every generated choice is returned)",
        ));
    }
    if completion.suffix.is_some_and(|suffix| !suffix.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    let prompts = parse_prompts(&completion.prompt)?;
    let max_tokens = common.max_tokens;
    // The completions API names the number of alternatives `logprobs`.
    let mut options = common_options(common, max_tokens, completion.logprobs, defaults, limits)
        .map_err(|err| match err.param.as_deref() {
            Some("top_logprobs") => err.with_param("logprobs"),
            _ => err,
        })?;
    options.ignored = ignored_fields(&value)?;
    options.prompt_return =
        PromptReturn::parse(completion.echo, completion.prompt_logprobs, options.stream)?;
    if options.max_tokens.is_none() {
        // OpenAI's legacy completions endpoint defaults to 16 tokens.
        options.max_tokens = Some(16.min(limits.max_completion_tokens));
    }
    if prompts.len().saturating_mul(options.n) > limits.max_n {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "{} prompts times n = {} exceeds this server's limit of {} choices",
                prompts.len(),
                options.n,
                limits.max_n
            ),
        ));
    }
    Ok(CompletionRequest { options, prompts })
}

pub mod effort;
#[cfg(test)]
mod tests;
