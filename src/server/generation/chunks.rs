//! The server-sent events of a streamed chat or completion response.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::ApiKind;
use super::choice::{ToolCalls, assistant_message, chat_logprobs, new_call_id, tool_calls_finish};
use crate::engine::{FinishReason, TokenLogprob};
use crate::server::error::ApiError;
use crate::server::openai::echo::completion_logprobs;
use crate::server::openai::response::{
    ChatChunk, ChatChunkChoice, Completion, CompletionChoice, Delta, FunctionDelta, ToolCallDelta,
    Usage,
};
use crate::server::openai::tools::ToolCallUpdate;
use crate::server::service::ModelService;

/// Builds the SSE chunks of one job.
pub(super) struct ChunkWriter {
    pub(super) service: Arc<ModelService>,
    pub(super) id: String,
    pub(super) kind: ApiKind,
    pub(super) created: u64,
    pub(super) logprobs: bool,
    pub(super) tool_calls: Option<ToolCalls>,
    /// Each choice's text-only chunk, serialized once (`None`: could not be split).
    pub(super) text_templates: HashMap<usize, Option<TextTemplate>>,
}

/// The text placeholder a template is serialized with, as JSON writes it (quotes included).
const PLACEHOLDER_JSON: &str = "\"\\u0000\"";

/// A serialized server-sent event whose only varying part is one string field, split around
/// it: the chunk of each new token is the part before, the token's text as a JSON string, and
/// the part after (byte for byte what serializing the whole chunk gives, without building it).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TextTemplate {
    before: String,
    after: String,
}

impl TextTemplate {
    /// Splits `event` (serialized with the text `"\u{0}"`) around the placeholder; `None` unless
    /// it occurs exactly once.
    fn split(event: &str) -> Option<Self> {
        let mut found = event.match_indices(PLACEHOLDER_JSON);
        let (at, _) = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(Self {
            before: event[..at].to_owned(),
            after: event[at + PLACEHOLDER_JSON.len()..].to_owned(),
        })
    }

    /// The event carrying `text`.
    fn render(&self, text: &str) -> Bytes {
        let mut out = Vec::with_capacity(self.before.len() + self.after.len() + text.len() + 8);
        out.extend_from_slice(self.before.as_bytes());
        // Writing a string into a vector cannot fail.
        let _ = serde_json::to_writer(&mut out, text);
        out.extend_from_slice(self.after.as_bytes());
        Bytes::from(out)
    }
}

impl ChunkWriter {
    fn event<T: serde::Serialize>(value: &T) -> Bytes {
        match serde_json::to_string(value) {
            Ok(json) => Bytes::from(format!("data: {json}\n\n")),
            Err(err) => error_event(&ApiError::internal(format!("encoding failed: {err}"))),
        }
    }

    /// The chunk carrying only new text for choice `index`, from its template.
    pub(super) fn text_only(&mut self, index: usize, text: &str) -> Bytes {
        if !self.text_templates.contains_key(&index) {
            let event = self.content(index, "\u{0}".to_owned(), &[], 0, None);
            let template = event
                .as_deref()
                .and_then(|bytes| std::str::from_utf8(bytes).ok())
                .and_then(TextTemplate::split);
            self.text_templates.insert(index, template);
        }
        match self.text_templates.get(&index) {
            Some(Some(template)) => template.render(text),
            _ => self
                .content(index, text.to_owned(), &[], 0, None)
                .unwrap_or_default(),
        }
    }

    /// The chat logprobs of `tokens`, when the request asked for them and there are some.
    pub(super) fn token_logprobs(
        &self,
        tokens: &[(u32, TokenLogprob)],
    ) -> Option<crate::server::openai::response::ChatLogprobs> {
        (self.logprobs && !tokens.is_empty()).then(|| chat_logprobs(&self.service, tokens))
    }

    pub(super) fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Bytes {
        Self::event(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.service.name().to_owned(),
            choices,
            usage,
        })
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Bytes {
        Self::event(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.service.name().to_owned(),
            choices,
            usage,
        })
    }

    /// The opening chunk of a chat choice (announces the role).
    pub(super) fn role(&self, index: usize) -> Option<Bytes> {
        (self.kind == ApiKind::Chat).then(|| {
            self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: Delta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        reasoning_content: None,
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            )
        })
    }

    /// A chunk carrying new text (and its tokens' logprobs), or the choice's last chunk.
    pub(super) fn content(
        &self,
        index: usize,
        text: String,
        tokens: &[(u32, TokenLogprob)],
        text_offset: usize,
        finish: Option<&FinishReason>,
    ) -> Option<Bytes> {
        if text.is_empty() && tokens.is_empty() && finish.is_none() {
            return None;
        }
        let stop_reason = finish.and_then(FinishReason::stop_reason).cloned();
        let finish = finish.map(FinishReason::as_openai_str);
        Some(match self.kind {
            ApiKind::Chat => self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: Delta {
                        role: None,
                        content: (!text.is_empty()).then_some(text),
                        reasoning_content: None,
                        tool_calls: None,
                    },
                    logprobs: (self.logprobs && !tokens.is_empty())
                        .then(|| chat_logprobs(&self.service, tokens)),
                    finish_reason: finish,
                    stop_reason,
                }],
                None,
            ),
            ApiKind::Completion => self.completion_chunk(
                vec![CompletionChoice {
                    index,
                    logprobs: (self.logprobs && !tokens.is_empty())
                        .then(|| completion_logprobs(&self.service, tokens, text_offset)),
                    text,
                    finish_reason: finish,
                    stop_reason,
                    prompt_logprobs: None,
                }],
                None,
            ),
        })
    }

    /// The last chunk of a chat choice whose output was held back for tool-call parsing: its
    /// tool calls (or its whole text, when it called no tool) with the finish reason.
    pub(super) fn held_back(
        &self,
        parsing: &ToolCalls,
        index: usize,
        text: String,
        tokens: &[(u32, TokenLogprob)],
        reason: &FinishReason,
    ) -> Bytes {
        // A reasoning model's answer comes without its reasoning, already streamed.
        let (message, finish) = assistant_message(text, reason, Some(parsing), None);
        let tool_calls = (!message.tool_calls.is_empty()).then(|| {
            message
                .tool_calls
                .into_iter()
                .enumerate()
                .map(|(index, call)| ToolCallDelta::whole(index, call))
                .collect()
        });
        self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: message.content.filter(|text| !text.is_empty()),
                    reasoning_content: None,
                    tool_calls,
                },
                logprobs: (self.logprobs && !tokens.is_empty())
                    .then(|| chat_logprobs(&self.service, tokens)),
                finish_reason: Some(finish),
                stop_reason: reason.stop_reason().cloned(),
            }],
            None,
        )
    }

    /// A chunk with the tool-call pieces of an enforced choice generated since the last one;
    /// the choice's last chunk also carries its finish reason and every token's logprobs.
    pub(super) fn tool_call_deltas(
        &self,
        index: usize,
        updates: Vec<ToolCallUpdate>,
        tokens: &[(u32, TokenLogprob)],
        finish: Option<&FinishReason>,
    ) -> Option<Bytes> {
        if updates.is_empty() && finish.is_none() {
            return None;
        }
        let deltas: Vec<ToolCallDelta> = updates.into_iter().map(tool_call_delta).collect();
        Some(self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: None,
                    reasoning_content: None,
                    tool_calls: (!deltas.is_empty()).then_some(deltas),
                },
                logprobs: (finish.is_some() && self.logprobs && !tokens.is_empty())
                    .then(|| chat_logprobs(&self.service, tokens)),
                finish_reason: finish.map(tool_calls_finish),
                stop_reason: finish.and_then(FinishReason::stop_reason).cloned(),
            }],
            None,
        ))
    }

    /// A chat chunk with new reasoning and answer text of a reasoning model's choice (and its
    /// tokens' logprobs); `None` when it carries nothing.
    pub(super) fn split_delta(
        &self,
        index: usize,
        reasoning: String,
        answer: String,
        tokens: &[(u32, TokenLogprob)],
    ) -> Option<Bytes> {
        if reasoning.is_empty() && answer.is_empty() && tokens.is_empty() {
            return None;
        }
        Some(self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: (!answer.is_empty()).then_some(answer),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: None,
                },
                logprobs: (self.logprobs && !tokens.is_empty())
                    .then(|| chat_logprobs(&self.service, tokens)),
                finish_reason: None,
                stop_reason: None,
            }],
            None,
        ))
    }

    pub(super) fn usage(&self, usage: Usage) -> Bytes {
        match self.kind {
            ApiKind::Chat => self.chat_chunk(Vec::new(), Some(usage)),
            ApiKind::Completion => self.completion_chunk(Vec::new(), Some(usage)),
        }
    }
}

pub(super) fn error_event(err: &ApiError) -> Bytes {
    Bytes::from(format!("data: {}\n\n", err.to_json()))
}

/// The streamed delta of one tool-call update: a new call carries its id, kind and name, later
/// updates only their fragment of the arguments.
pub(super) fn tool_call_delta(update: ToolCallUpdate) -> ToolCallDelta {
    match update {
        ToolCallUpdate::Start { index, name } => ToolCallDelta {
            index,
            id: Some(new_call_id()),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(name),
                arguments: String::new(),
            },
        },
        ToolCallUpdate::Arguments { index, fragment } => ToolCallDelta {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: fragment,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn completion_chunk(model: &str, text: &str) -> Bytes {
        ChunkWriter::event(&Completion {
            id: "cmpl-1".into(),
            object: "text_completion",
            created: 7,
            model: model.into(),
            choices: vec![CompletionChoice {
                index: 3,
                text: text.into(),
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
                prompt_logprobs: None,
            }],
            usage: None,
        })
    }

    fn chat_chunk(text: &str) -> Bytes {
        ChunkWriter::event(&ChatChunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk",
            created: 7,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: Some(text.into()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            usage: None,
        })
    }

    fn template(event: &Bytes) -> Option<TextTemplate> {
        TextTemplate::split(std::str::from_utf8(event).expect("UTF-8"))
    }

    proptest! {
        /// A rendered template is byte for byte the chunk serialized whole, whatever the text
        /// (quotes, backslashes, control characters, non-ASCII, the placeholder itself).
        #[test]
        fn templated_chunks_equal_serialized_ones(text in "(\\PC|[\"\\\\\u{0}-\u{1f}\u{7f}]){0,24}") {
            let completion = template(&completion_chunk("m", "\u{0}")).expect("splits");
            prop_assert_eq!(completion.render(&text), completion_chunk("m", &text));
            let chat = template(&chat_chunk("\u{0}")).expect("splits");
            prop_assert_eq!(chat.render(&text), chat_chunk(&text));
        }
    }

    #[test]
    fn a_placeholder_found_twice_gives_no_template() {
        // A model name that contains the placeholder's characters makes the split ambiguous.
        assert!(template(&completion_chunk("\u{0}", "\u{0}")).is_none());
        assert!(template(&completion_chunk("m", "none")).is_none());
        let split = template(&completion_chunk("m", "\u{0}")).expect("splits");
        assert!(split.before.starts_with("data: {\"id\":\"cmpl-1\""));
        assert!(split.after.ends_with("}\n\n"));
    }
}
