//! Response bodies of the OpenAI API, for whole responses and streamed chunks.

use serde::Serialize;

use crate::engine::StopReason;

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens (counted once per prompt, not per choice).
    pub prompt_tokens: usize,
    /// Tokens generated across all choices.
    pub completion_tokens: usize,
    /// The sum of both.
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The cached share of the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    /// Adds one choice's counts; `first_of_prompt` counts its prompt once.
    pub fn add(&mut self, prompt: usize, completion: usize, cached: usize, first_of_prompt: bool) {
        if first_of_prompt {
            self.prompt_tokens += prompt;
            self.prompt_tokens_details.cached_tokens += cached;
        }
        self.completion_tokens += completion;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

/// One alternative token with its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The UTF-8 bytes of the token's text.
    pub bytes: Vec<u8>,
}

/// A generated token's log-probability in the chat format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The UTF-8 bytes of the token's text.
    pub bytes: Vec<u8>,
    /// The most likely alternatives at this position.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `logprobs` of a chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// `logprobs` of a completion choice (the legacy format).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities (`null` for the first token of an echoed prompt).
    pub token_logprobs: Vec<Option<f32>>,
    /// Per position, the alternatives by text (`null` for the first token of an echoed prompt).
    pub top_logprobs: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    /// Character offset of each token in the completion.
    pub text_offset: Vec<usize>,
}

/// The assistant's message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (`null` when the message is only tool calls).
    pub content: Option<String>,
    /// The model's reasoning (a reasoning model's `<think>` block), when it wrote one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls parsed out of the output.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A function call the model made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// `call_…`, unique in the response.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    /// The function name.
    pub name: String,
    /// The arguments, a JSON document as a string.
    pub arguments: String,
}

/// A piece of a tool call in a streamed chunk: a call's first delta carries its id, type and
/// name, later ones more of its arguments (the fragments concatenate to the arguments).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    /// Position of the call in the message's `tool_calls`.
    pub index: usize,
    /// `call_…`, on the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on the call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The function's name (first delta) and the next piece of its arguments.
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    /// The function name, on the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments (possibly empty).
    pub arguments: String,
}

impl ToolCallDelta {
    /// The whole `call` as one delta at `index`.
    pub fn whole(index: usize, call: ToolCall) -> Self {
        Self {
            index,
            id: Some(call.id),
            kind: Some(call.kind),
            function: FunctionDelta {
                name: Some(call.function.name),
                arguments: call.function.arguments,
            },
        }
    }
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The generated message.
    pub message: AssistantMessage,
    /// Log-probabilities, when requested.
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation ended.
    pub finish_reason: &'static str,
    /// The stop string or stop token id that ended the choice (vLLM's `stop_reason`); `null`
    /// at EOS, at the length limit and for a complete grammar.
    pub stop_reason: Option<StopReason>,
}

/// A whole chat completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-...`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix time of creation.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// The incremental message of a chat chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Delta {
    /// `assistant` on a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunkChoice {
    /// Choice index.
    pub index: usize,
    /// New content.
    pub delta: Delta,
    /// Log-probabilities of the tokens in this chunk.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<&'static str>,
    /// The stop string or stop token id that ended the choice, on its last chunk; else `null`.
    pub stop_reason: Option<StopReason>,
}

/// A streamed chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunk {
    /// Same id on every chunk of a response.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix time of creation.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// Zero or one choice.
    pub choices: Vec<ChatChunkChoice>,
    /// Only on the final usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a completion, whole or streamed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChoice {
    /// Choice index.
    pub index: usize,
    /// The generated (or, in a chunk, new) text.
    pub text: String,
    /// Log-probabilities, when requested.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation ended (`null` until the last chunk).
    pub finish_reason: Option<&'static str>,
    /// The stop string or stop token id that ended the choice (`null` until the last chunk,
    /// and at EOS or the length limit).
    pub stop_reason: Option<StopReason>,
    /// vLLM's `prompt_logprobs`, when requested: per prompt token (the first `null`), its
    /// logprob, rank and decoded text, and those of the most likely alternatives, by token id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, serde_json::Value>>>>,
}

/// A whole completion or a streamed completion chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// `cmpl-...`.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix time of creation.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (absent on chunks but the final usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCard {
    /// The served model id.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix time the server loaded the model.
    pub created: u64,
    /// Always `inferno`.
    pub owned_by: &'static str,
    /// Context length in tokens.
    pub max_model_len: usize,
    /// SHA-256 model digest (identifies the exact weights).
    pub digest: String,
    /// The format the weights are served in: `unquantized`, or the FP8 scheme (quantized at
    /// load, or as the checkpoint stores it).
    pub weight_format: String,
}

/// The `/v1/models` body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served models.
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_each_prompt_once() {
        let mut usage = Usage::default();
        usage.add(10, 3, 4, true);
        usage.add(10, 5, 4, false);
        assert_eq!(usage.prompt_tokens, 10);
        assert_eq!(usage.completion_tokens, 8);
        assert_eq!(usage.total_tokens, 18);
        assert_eq!(usage.prompt_tokens_details.cached_tokens, 4);
    }

    #[test]
    fn chunk_omits_absent_fields() {
        let chunk = ChatChunk {
            id: "c".into(),
            object: "chat.completion.chunk",
            created: 1,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: Some("hi".into()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            usage: None,
        };
        let value = serde_json::to_value(&chunk).unwrap();
        assert!(value.get("usage").is_none());
        assert!(value["choices"][0]["delta"].get("role").is_none());
        assert_eq!(value["choices"][0]["delta"]["content"], "hi");
        assert!(value["choices"][0]["finish_reason"].is_null());
        assert!(value["choices"][0]["stop_reason"].is_null());
    }

    #[test]
    fn stop_reason_is_the_string_or_the_token_id() {
        let string = serde_json::to_value(Some(StopReason::String("END".into()))).unwrap();
        assert_eq!(string, serde_json::json!("END"));
        let token = serde_json::to_value(Some(StopReason::TokenId(7))).unwrap();
        assert_eq!(token, serde_json::json!(7));
    }
}
