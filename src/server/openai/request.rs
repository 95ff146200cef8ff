//! Parsing and validating `/v1/chat/completions` and `/v1/completions` request bodies.
//!
//! Bodies are parsed into a JSON value first (malformed JSON is a 400), then each known field is
//! read with its path so that a field of the wrong type names itself in the error's `param`.
//! Unknown fields are ignored, as OpenAI-compatible servers do.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::config::LimitsConfig;
use crate::engine::{MAX_STOP_BYTES, SamplingParams, StopParams};
use crate::server::error::ApiError;

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
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
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
    suffix: Option<String>,
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
    /// Stream server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of the stream.
    pub include_usage: bool,
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
fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::invalid_request(format!("the body is not valid JSON: {err}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid_request("the body must be a JSON object"));
    }
    Ok(value)
}

/// Reads typed fields out of a JSON object, naming the offending field on a type error.
fn fields<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
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
    common: CommonFields,
    max_tokens: Option<u64>,
    logprobs: Option<u32>,
    defaults: &SamplingParams,
    limits: &LimitsConfig,
) -> Result<GenerationOptions, ApiError> {
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
        },
        stop: StopParams {
            max_tokens: 0,
            stop_strings,
            stop_token_ids: common.stop_token_ids.unwrap_or_default(),
            ignore_eos: common.ignore_eos.unwrap_or(false),
        },
        max_tokens,
        logprobs,
        stream,
        include_usage,
    })
}

/// Flattens a message's `content` to a string: text parts are joined, other parts refused.
fn normalize_message(index: usize, mut message: Map<String, Value>) -> Result<Value, ApiError> {
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
    let options = common_options(common, max_tokens, logprobs, defaults, limits)?;
    let messages = chat
        .messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| normalize_message(index, message))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ChatRequest {
        options,
        messages,
        tools: chat
            .tools
            .filter(|tools| !tools.is_empty())
            .map(Value::Array),
        template_kwargs: chat.chat_template_kwargs.unwrap_or_default(),
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(true),
    })
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
    let common: CommonFields = fields(&value)?;
    let completion: CompletionFields = fields(&value)?;
    if completion.echo.unwrap_or(false) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LimitsConfig {
        LimitsConfig::default()
    }

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        parse_chat(body.as_bytes(), &SamplingParams::default(), &limits())
    }

    fn completion(body: &str) -> Result<CompletionRequest, ApiError> {
        parse_completion(body.as_bytes(), &SamplingParams::default(), &limits())
    }

    #[test]
    fn parses_a_full_chat_request() {
        let request = chat(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"!"}]}],
                "temperature":0.5,"top_p":0.9,"top_k":-1,"min_p":0.1,"seed":7,"n":2,"stop":"x",
                "max_completion_tokens":9,"logprobs":true,"top_logprobs":3,"stream":true,
                "stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false},
                "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1}"#,
        )
        .unwrap();
        let o = &request.options;
        assert_eq!(o.model, "m");
        assert_eq!(o.n, 2);
        assert_eq!(o.sampling.temperature, 0.5);
        assert_eq!(o.sampling.top_k, 0);
        assert_eq!(o.sampling.seed, Some(7));
        assert_eq!(o.sampling_for(1).seed, Some(8));
        assert_eq!(o.stop.stop_strings, vec!["x".to_owned()]);
        assert_eq!(o.max_tokens, Some(9));
        assert_eq!(o.logprobs, Some(3));
        assert!(o.stream && o.include_usage);
        assert_eq!(request.messages[0]["content"], "hi!");
        assert_eq!(request.template_kwargs["enable_thinking"], false);
        assert!(request.add_generation_prompt);
    }

    #[test]
    fn defaults_come_from_the_model() {
        let defaults = SamplingParams {
            temperature: 0.6,
            top_p: 0.9,
            top_k: 50,
            ..SamplingParams::default()
        };
        let request = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            &defaults,
            &limits(),
        )
        .unwrap();
        assert_eq!(request.options.sampling.temperature, 0.6);
        assert_eq!(request.options.sampling.top_k, 50);
        assert_eq!(request.options.n, 1);
        assert!(!request.options.stream);
    }

    #[test]
    fn malformed_json_is_a_400() {
        let err = chat("{\"model\":").unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        assert!(err.message.contains("not valid JSON"), "{}", err.message);
        assert_eq!(
            chat("[1]").unwrap_err().status,
            http::StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err =
            chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#)
                .unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("temperature"));
        let err = chat(r#"{"model":"m","messages":"hello"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        let err = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
    }

    #[test]
    fn empty_messages_are_refused() {
        let err = chat(r#"{"model":"m","messages":[]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
    }

    #[test]
    fn messages_need_a_role_and_text_content() {
        let err = chat(r#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].role"));
        let err = chat(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[0]"));
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for (field, value) in [
            ("temperature", "3"),
            ("top_p", "0"),
            ("min_p", "1.5"),
            ("presence_penalty", "-3"),
            ("n", "0"),
            ("n", "1000"),
            ("max_tokens", "0"),
            ("max_tokens", "100000000"),
            ("top_k", "-2"),
        ] {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"{field}":{value}}}"#
            );
            let err = chat(&body).unwrap_err();
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{field}={value}");
            assert_eq!(err.param.as_deref(), Some(field), "{field}={value}");
        }
    }

    #[test]
    fn stop_accepts_a_list() {
        let request = completion(r#"{"model":"m","prompt":"a","stop":["x","y"]}"#).unwrap();
        assert_eq!(request.options.stop.stop_strings, vec!["x", "y"]);
        let err = completion(r#"{"model":"m","prompt":"a","stop":[1]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("stop"));
    }

    #[test]
    fn completion_prompts_in_every_form() {
        let one = completion(r#"{"model":"m","prompt":"hello"}"#).unwrap();
        assert_eq!(one.prompts, vec![Prompt::Text("hello".into())]);
        assert_eq!(one.options.max_tokens, Some(16));
        let tokens = completion(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(tokens.prompts, vec![Prompt::Tokens(vec![1, 2, 3])]);
        let many = completion(r#"{"model":"m","prompt":["a",[4]],"logprobs":2}"#).unwrap();
        assert_eq!(
            many.prompts,
            vec![Prompt::Text("a".into()), Prompt::Tokens(vec![4])]
        );
        assert_eq!(many.options.logprobs, Some(2));
        for bad in [r#""prompt":[]"#, r#""prompt":{}"#, r#""prompt":[-1]"#] {
            let err = completion(&format!(r#"{{"model":"m",{bad}}}"#)).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("prompt"), "{bad}");
        }
    }

    #[test]
    fn context_checks() {
        let request = completion(r#"{"model":"m","prompt":"a","max_tokens":10}"#).unwrap();
        let stop = request.options.stop_for(5, 100, &limits()).unwrap();
        assert_eq!(stop.max_tokens, 10);
        let err = request.options.stop_for(95, 100, &limits()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
        let err = request.options.stop_for(100, 100, &limits()).unwrap_err();
        assert_eq!(err.code, Some("context_length_exceeded"));
        let open = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(
            open.options
                .stop_for(40, 100, &limits())
                .unwrap()
                .max_tokens,
            60
        );
    }

    #[test]
    fn completion_logprobs_errors_name_logprobs() {
        let err = completion(r#"{"model":"m","prompt":"a","logprobs":100}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("logprobs"));
    }

    #[test]
    fn stop_strings_are_bounded_in_total_size() {
        let long = "x".repeat(MAX_STOP_BYTES / 2 + 1);
        let body = serde_json::json!({"model":"m","prompt":"a","stop":[long, long]}).to_string();
        let err = completion(&body).unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("stop"));
        let fits = "x".repeat(MAX_STOP_BYTES);
        let body = serde_json::json!({"model":"m","prompt":"a","stop":fits}).to_string();
        assert!(completion(&body).is_ok());
    }

    #[test]
    fn top_logprobs_requires_logprobs() {
        let err =
            chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#)
                .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("top_logprobs"));
    }
}
