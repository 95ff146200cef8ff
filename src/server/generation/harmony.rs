//! A harmony model's chat choices (gpt-oss): the output, its framing tokens kept by the
//! detokenizer, is read by the harmony parser into reasoning (`reasoning_content`), the answer
//! (`content`) and tool calls, whole or streamed. A truncated or malformed output ends the
//! choice with what was parsed (the parser logs one warning); it is never an error.

use bytes::Bytes;

use super::ToolCalls;
use super::choice::{new_call_id, tool_calls_finish};
use super::chunks::{ChunkWriter, tool_call_delta};
use crate::engine::{FinishReason, TokenLogprob};
use crate::server::openai::harmony::{self, HarmonyDelta, HarmonyParser};
use crate::server::openai::response::{
    AssistantMessage, ChatChunkChoice, Delta, FunctionCall, ToolCall, ToolCallDelta,
};
use crate::server::openai::tools::ToolCallUpdate;

/// Whether the output ended at a stop: a stop token (`<|return|>`, `<|call|>`: not written),
/// the grammar's end or a stop string, all of which end the message being written. An output
/// cut off by the length limit did not.
fn stopped(reason: &FinishReason) -> bool {
    matches!(reason, FinishReason::Stop(_))
}

/// Which tool calls a choice returns: none unless the request offered tools, and only the
/// first without `parallel_tool_calls`.
fn calls_allowed(tools: Option<&ToolCalls>) -> usize {
    match tools {
        None => 0,
        Some(tools) if tools.parallel => usize::MAX,
        Some(_) => 1,
    }
}

/// The assistant message of a finished harmony choice and its finish reason (`tool_calls` when
/// it called a tool the request offered).
pub(super) fn assistant_message(
    text: &str,
    reason: &FinishReason,
    tools: Option<&ToolCalls>,
) -> (AssistantMessage, &'static str) {
    let parsed = harmony::parse(text, stopped(reason));
    let calls: Vec<ToolCall> = parsed
        .tool_calls
        .into_iter()
        .take(calls_allowed(tools))
        .map(|call| ToolCall {
            id: new_call_id(),
            kind: "function",
            function: FunctionCall {
                name: call.name,
                arguments: call.arguments,
            },
        })
        .collect();
    let finish = if calls.is_empty() {
        reason.as_openai_str()
    } else {
        tool_calls_finish(reason)
    };
    let content = (calls.is_empty() || !parsed.content.is_empty()).then_some(parsed.content);
    let message = AssistantMessage {
        role: "assistant",
        content,
        reasoning_content: parsed.reasoning,
        tool_calls: calls,
    };
    (message, finish)
}

/// What a piece of a streamed harmony choice adds.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Pieces {
    reasoning: String,
    content: String,
    calls: Vec<ToolCallUpdate>,
}

/// A streamed harmony choice: its parser, and the calls it may return and has started.
#[derive(Debug)]
pub(super) struct HarmonyStream {
    parser: HarmonyParser,
    allowed: usize,
    called: bool,
}

impl HarmonyStream {
    /// A stream at the start of a choice of a request that offered `tools`.
    pub(super) fn new(tools: Option<&ToolCalls>) -> Self {
        Self {
            parser: HarmonyParser::new(),
            allowed: calls_allowed(tools),
            called: false,
        }
    }

    /// The pieces the next `text` of the output completes.
    pub(super) fn push(&mut self, text: &str) -> Pieces {
        let deltas = self.parser.push(text);
        self.pieces(deltas)
    }

    /// The pieces of the output's last `text` and of its end (why it ended: `reason`).
    pub(super) fn finish(&mut self, text: &str, reason: &FinishReason) -> Pieces {
        let mut deltas = self.parser.push(text);
        deltas.extend(self.parser.finish(stopped(reason)));
        self.pieces(deltas)
    }

    /// Whether the choice called a tool the request offered.
    pub(super) fn called(&self) -> bool {
        self.called
    }

    fn pieces(&mut self, deltas: Vec<HarmonyDelta>) -> Pieces {
        let mut pieces = Pieces::default();
        for delta in deltas {
            match delta {
                HarmonyDelta::Reasoning(text) => pieces.reasoning.push_str(&text),
                HarmonyDelta::Content(text) => pieces.content.push_str(&text),
                HarmonyDelta::ToolCall(update) => {
                    let index = match &update {
                        ToolCallUpdate::Start { index, .. }
                        | ToolCallUpdate::Arguments { index, .. } => *index,
                    };
                    if index < self.allowed {
                        self.called = true;
                        pieces.calls.push(update);
                    }
                }
            }
        }
        pieces
    }
}

impl ChunkWriter {
    /// The chunk of a streamed harmony choice's `pieces` and its tokens' logprobs; with
    /// `finish`, the choice's last chunk (`called`: it called a tool). `None` when it carries
    /// nothing.
    pub(super) fn harmony_delta(
        &self,
        index: usize,
        pieces: Pieces,
        tokens: &[(u32, TokenLogprob)],
        finish: Option<(&FinishReason, bool)>,
    ) -> Option<Bytes> {
        let Pieces {
            reasoning,
            content,
            calls,
        } = pieces;
        if reasoning.is_empty() && content.is_empty() && calls.is_empty() && tokens.is_empty() {
            finish?;
        }
        let calls: Vec<ToolCallDelta> = calls.into_iter().map(tool_call_delta).collect();
        let finish_reason = finish.map(|(reason, called)| match called {
            true => tool_calls_finish(reason),
            false => reason.as_openai_str(),
        });
        Some(self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: (!content.is_empty()).then_some(content),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                },
                logprobs: self.token_logprobs(tokens),
                finish_reason,
                stop_reason: finish.and_then(|(reason, _)| reason.stop_reason().cloned()),
            }],
            None,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REASONING_AND_CALL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"city\": \"Oslo\"}";

    fn tools(parallel: bool) -> ToolCalls {
        ToolCalls {
            format: crate::server::openai::tools::ToolCallFormat::Harmony,
            parallel,
            enforced: false,
        }
    }

    #[test]
    fn a_call_is_returned_only_when_tools_were_offered() {
        let stop = FinishReason::Stop(None);
        let (message, finish) = assistant_message(REASONING_AND_CALL, &stop, Some(&tools(false)));
        assert_eq!(finish, "tool_calls");
        assert_eq!(message.content, None);
        assert_eq!(
            message.reasoning_content.as_deref(),
            Some("Need the weather.")
        );
        assert_eq!(message.tool_calls[0].function.name, "get_weather");
        assert_eq!(
            message.tool_calls[0].function.arguments,
            "{\"city\": \"Oslo\"}"
        );
        let (message, finish) = assistant_message(REASONING_AND_CALL, &stop, None);
        assert_eq!(finish, "stop");
        assert!(message.tool_calls.is_empty());
        assert_eq!(message.content.as_deref(), Some(""));
    }

    #[test]
    fn a_stream_ends_with_what_was_parsed_and_the_finish_reason() {
        let mut stream = HarmonyStream::new(Some(&tools(true)));
        let mut pieces = Vec::new();
        for piece in REASONING_AND_CALL.as_bytes().chunks(5) {
            pieces.push(stream.push(std::str::from_utf8(piece).unwrap()));
        }
        pieces.push(stream.finish("", &FinishReason::Length));
        assert!(stream.called());
        let reasoning: String = pieces.iter().map(|p| p.reasoning.as_str()).collect();
        assert_eq!(reasoning, "Need the weather.");
        let arguments: String = pieces
            .iter()
            .flat_map(|p| &p.calls)
            .filter_map(|call| match call {
                ToolCallUpdate::Arguments { fragment, .. } => Some(fragment.as_str()),
                ToolCallUpdate::Start { .. } => None,
            })
            .collect();
        assert_eq!(arguments, "{\"city\": \"Oslo\"}");
        // Cut off by the length limit, the call is kept with what it has, as `length`.
        assert_eq!(tool_calls_finish(&FinishReason::Length), "length");
    }
}

#[cfg(test)]
mod real_tokenizer;
