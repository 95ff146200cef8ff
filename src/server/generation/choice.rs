//! A finished chat choice's message: reasoning split off, tool calls parsed; token logprobs
//! in the chat shape (the completion shape is `openai::echo`'s).

use super::super::openai::reasoning::ReasoningFormat;
use super::super::openai::response::{
    AssistantMessage, ChatLogprobs, ChatTokenLogprob, FunctionCall, ToolCall, TopLogprob,
};
use super::super::openai::tools::{ToolCallFormat, enforced_tool_calls, parse_tool_calls};
use super::super::service::ModelService;
use crate::engine::{FinishReason, TokenLogprob};

/// Tool-call parsing of a chat request.
#[derive(Debug, Clone, Copy)]
pub struct ToolCalls {
    /// The model's tool-call format.
    pub format: ToolCallFormat,
    /// Whether several calls may be returned (`parallel_tool_calls`); otherwise the first counts.
    pub parallel: bool,
    /// Whether the grammar enforces the calls (`tool_choice` `required` or a named function):
    /// the output is then calls only, and a stream sends them as they are generated.
    pub enforced: bool,
}

impl ToolCalls {
    /// Splits a choice's output into content and tool calls (`None` when it calls no tool).
    /// Enforced calls keep their arguments as generated (what a stream sent), a call cut off by
    /// the length limit included.
    pub(super) fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ToolCall>)> {
        let (content, mut calls) = if self.enforced {
            (None, enforced_tool_calls(self.format, text, self.parallel)?)
        } else {
            parse_tool_calls(self.format, text)?
        };
        if !self.parallel {
            calls.truncate(1);
        }
        let calls = calls
            .into_iter()
            .map(|call| ToolCall {
                id: new_call_id(),
                kind: "function",
                function: FunctionCall {
                    name: call.name,
                    arguments: call.arguments,
                },
            })
            .collect();
        Some((content, calls))
    }
}

/// A new tool-call id.
pub(super) fn new_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// The assistant message of a finished choice and its finish reason (`tool_calls` when the
/// output is parsed as tool calls, `length` when enforced calls were cut off). With a
/// `reasoning` format the reasoning block is split off first, so only the answer after it is
/// read for tool calls.
pub(super) fn assistant_message(
    text: String,
    reason: &FinishReason,
    tool_calls: Option<&ToolCalls>,
    reasoning: Option<ReasoningFormat>,
) -> (AssistantMessage, &'static str) {
    let (reasoning_content, text) = match reasoning {
        Some(format) => format.split(&text),
        None => (None, text),
    };
    match tool_calls.and_then(|parsing| parsing.parse(&text)) {
        Some((content, calls)) => (
            AssistantMessage {
                role: "assistant",
                content,
                reasoning_content,
                tool_calls: calls,
            },
            tool_calls_finish(reason),
        ),
        None => (
            AssistantMessage {
                role: "assistant",
                content: Some(text),
                reasoning_content,
                tool_calls: Vec::new(),
            },
            reason.as_openai_str(),
        ),
    }
}

/// The finish reason of a choice that called tools: `length` when the limit cut it off (only
/// enforced calls are returned then), else `tool_calls`.
pub(super) fn tool_calls_finish(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => reason.as_openai_str(),
        _ => "tool_calls",
    }
}

pub(super) fn chat_logprobs(
    service: &ModelService,
    tokens: &[(u32, TokenLogprob)],
) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|(token, logprob)| {
                let text = service.token_text(*token);
                ChatTokenLogprob {
                    bytes: text.as_bytes().to_vec(),
                    token: text,
                    logprob: logprob.logprob,
                    top_logprobs: logprob
                        .top
                        .iter()
                        .map(|(id, lp)| {
                            let text = service.token_text(*id);
                            TopLogprob {
                                bytes: text.as_bytes().to_vec(),
                                token: text,
                                logprob: *lp,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_after_reasoning_is_parsed_and_one_inside_it_is_not() {
        let parsing = ToolCalls {
            format: ToolCallFormat::Hermes,
            parallel: true,
            enforced: false,
        };
        let text = "<think>Maybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?</think>\n\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (message, finish) = assistant_message(
            text.into(),
            &FinishReason::Stop(None),
            Some(&parsing),
            Some(ReasoningFormat::Qwen3),
        );
        assert_eq!(finish, "tool_calls");
        assert_eq!(message.tool_calls.len(), 1);
        assert_eq!(message.tool_calls[0].function.name, "get");
        assert!(message.content.is_none());
        assert!(
            message
                .reasoning_content
                .as_deref()
                .is_some_and(|r| r.contains("\"no\""))
        );
        // Without a reasoning format, the call inside the block would be parsed too.
        let (plain, _) =
            assistant_message(text.into(), &FinishReason::Stop(None), Some(&parsing), None);
        assert_ne!(plain.tool_calls.len(), 1);
    }
}
