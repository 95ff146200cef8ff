//! What a completion request asks about its prompt: `echo` (the prompt returned before the
//! completion, with its tokens' logprobs when `logprobs` is set, the first one null, as OpenAI's
//! legacy API and vLLM return it) and vLLM's `prompt_logprobs` (per prompt token, its logprob,
//! rank and the most likely alternatives).

use serde_json::{Map, Value};

use super::request::GenerationOptions;
use super::response::{CompletionChoice, CompletionLogprobs};
use crate::engine::{FinishReason, PromptLogprob, TokenLogprob};
use crate::server::error::ApiError;
use crate::server::service::ModelService;

/// Most alternatives `prompt_logprobs` may ask for (as `logprobs`).
const MAX_PROMPT_LOGPROBS: u32 = 20;

/// A completion request's prompt-related fields, validated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptReturn {
    /// Return the prompt before the completion (`echo`).
    pub echo: bool,
    /// vLLM's `prompt_logprobs`: this many alternatives per prompt token.
    pub prompt_logprobs: Option<u32>,
}

impl PromptReturn {
    /// Checks `echo` and `prompt_logprobs` of a request that streams or not.
    pub fn parse(
        echo: Option<bool>,
        prompt_logprobs: Option<u32>,
        stream: bool,
    ) -> Result<Self, ApiError> {
        let value = Self {
            echo: echo.unwrap_or(false),
            prompt_logprobs,
        };
        if prompt_logprobs.is_some_and(|k| k > MAX_PROMPT_LOGPROBS) {
            return Err(ApiError::invalid_param(
                "prompt_logprobs",
                format!("prompt_logprobs must be at most {MAX_PROMPT_LOGPROBS}"),
            ));
        }
        if stream && value.echo {
            return Err(ApiError::invalid_param(
                "echo",
                "echo is not supported with stream: true",
            ));
        }
        if stream && prompt_logprobs.is_some() {
            return Err(ApiError::invalid_param(
                "prompt_logprobs",
                "prompt_logprobs is not supported with stream: true",
            ));
        }
        Ok(value)
    }

    /// The alternatives per prompt token the engine computes, when it computes prompt logprobs
    /// at all: for `echo` with `logprobs = k`, `k`; for `prompt_logprobs`, its own.
    pub fn engine_prompt_logprobs(&self, logprobs: Option<u32>) -> Option<u32> {
        let echoed = if self.echo { logprobs } else { None };
        match (echoed, self.prompt_logprobs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// What one completion choice produced, with its prompt.
pub struct Output<'a> {
    /// The prompt's tokens.
    pub prompt: &'a [u32],
    /// The prompt's logprobs, when the engine computed them.
    pub prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
    /// The completion's text.
    pub text: String,
    /// The completion's tokens with their logprobs (when asked for).
    pub tokens: &'a [(u32, TokenLogprob)],
}

/// The legacy completions' `logprobs` of `tokens`, their text offsets starting at
/// `start_offset`.
pub fn completion_logprobs(
    service: &ModelService,
    tokens: &[(u32, TokenLogprob)],
    start_offset: usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut offset = start_offset;
    for (token, logprob) in tokens {
        let text = service.token_text(*token);
        out.text_offset.push(offset);
        offset += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(Some(logprob.logprob));
        out.top_logprobs
            .push(Some(top_by_text(service, &logprob.top)));
    }
    out
}

/// Alternatives keyed by their text.
fn top_by_text(service: &ModelService, top: &[(u32, f32)]) -> Map<String, Value> {
    top.iter()
        .map(|(id, lp)| (service.token_text(*id), Value::from(*lp)))
        .collect()
}

/// A whole (not streamed) completion choice: the prompt first with `echo` (and its tokens'
/// logprobs first, the first null, when `logprobs` is set), vLLM's `prompt_logprobs` when asked
/// for.
pub fn completion_choice(
    service: &ModelService,
    options: &GenerationOptions,
    index: usize,
    output: Output<'_>,
    reason: &FinishReason,
) -> CompletionChoice {
    let echo = options.prompt_return.echo;
    // The prompt as decoded text shows it (special tokens, such as a BOS the tokenizer added,
    // are not text); the offsets of its tokens count in it.
    let visible: Vec<String> = if echo {
        output
            .prompt
            .iter()
            .map(|&t| service.visible_text(t))
            .collect()
    } else {
        Vec::new()
    };
    let prompt_text = visible.concat();
    let logprobs = options.logprobs.map(|k| {
        let completion = completion_logprobs(service, output.tokens, prompt_text.len());
        if !echo {
            return completion;
        }
        let mut out = CompletionLogprobs::default();
        let mut offset = 0;
        let scored = output.prompt_logprobs.as_deref().unwrap_or_default();
        for (i, (&token, shown)) in output.prompt.iter().zip(&visible).enumerate() {
            out.text_offset.push(offset);
            offset += shown.len();
            out.tokens.push(service.token_text(token));
            let entry = scored.get(i).and_then(Option::as_ref);
            out.token_logprobs.push(entry.map(|e| e.logprob));
            out.top_logprobs.push(entry.map(|e| {
                let top = &e.top[..e.top.len().min(k as usize)];
                top_by_text(service, top)
            }));
        }
        out.tokens.extend(completion.tokens);
        out.token_logprobs.extend(completion.token_logprobs);
        out.top_logprobs.extend(completion.top_logprobs);
        out.text_offset.extend(completion.text_offset);
        out
    });
    let prompt_logprobs = options.prompt_return.prompt_logprobs.map(|k| {
        let scored = output.prompt_logprobs.unwrap_or_default();
        output
            .prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| {
                let entry = scored.get(i)?.as_ref()?;
                Some(vllm_prompt_logprob(service, token, entry, k as usize))
            })
            .collect()
    });
    CompletionChoice {
        index,
        text: prompt_text + &output.text,
        logprobs,
        finish_reason: Some(reason.as_openai_str()),
        stop_reason: reason.stop_reason().cloned(),
        prompt_logprobs,
    }
}

/// vLLM's entry for one prompt token: by token id, the token's and the `k` most likely
/// alternatives' `{logprob, rank, decoded_token}`.
fn vllm_prompt_logprob(
    service: &ModelService,
    token: u32,
    entry: &PromptLogprob,
    k: usize,
) -> Map<String, Value> {
    let item = |id: u32, logprob: f32, rank: usize| {
        serde_json::json!({
            "logprob": logprob,
            "rank": rank,
            "decoded_token": service.token_text(id),
        })
    };
    let mut out = Map::new();
    out.insert(
        token.to_string(),
        item(token, entry.logprob, entry.rank as usize),
    );
    for (i, &(id, logprob)) in entry.top.iter().take(k).enumerate() {
        out.entry(id.to_string())
            .or_insert_with(|| item(id, logprob, i + 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_and_prompt_logprobs_are_checked_and_combined() {
        let both = PromptReturn::parse(Some(true), Some(3), false).expect("valid");
        assert_eq!(both.engine_prompt_logprobs(Some(1)), Some(3));
        assert_eq!(both.engine_prompt_logprobs(None), Some(3));
        let echo = PromptReturn::parse(Some(true), None, false).expect("valid");
        assert_eq!(echo.engine_prompt_logprobs(Some(2)), Some(2));
        assert_eq!(echo.engine_prompt_logprobs(None), None);
        let neither = PromptReturn::parse(Some(false), None, true).expect("valid");
        assert_eq!(neither.engine_prompt_logprobs(Some(2)), None);
        for (echo, k, stream, param) in [
            (Some(true), None, true, "echo"),
            (None, Some(1), true, "prompt_logprobs"),
            (None, Some(21), false, "prompt_logprobs"),
        ] {
            let err = PromptReturn::parse(echo, k, stream).expect_err("refused");
            assert_eq!(err.param.as_deref(), Some(param));
        }
    }
}
