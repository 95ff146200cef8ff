//! Streaming `/v1/responses`: the chat path's server-sent events (one choice) rewritten as the
//! Responses API's typed events, each with its `sequence_number`:
//!
//! `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, `response.content_part.added` (messages and reasoning),
//! `response.output_text.delta` / `response.reasoning_text.delta` /
//! `response.function_call_arguments.delta`, their `.done`, `response.content_part.done`,
//! `response.output_item.done`; last `response.completed` (or `response.incomplete` at the
//! length limit, `error` and `response.failed` when generation failed).

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};

use super::output::{
    ResponseShell, function_call_item, item_id, message_item, output_text, reasoning_item,
    reasoning_text, status_of, usage,
};
use crate::server::body::Body;
use crate::server::error::ApiError;

/// What an output item holds.
#[derive(Debug)]
enum Content {
    Message(String),
    Reasoning(String),
    Call {
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// One output item of the response being streamed.
#[derive(Debug)]
struct Item {
    id: String,
    content: Content,
    done: bool,
}

impl Item {
    fn json(&self, status: &str) -> Value {
        match &self.content {
            Content::Message(text) => message_item(&self.id, Some(text), status),
            Content::Reasoning(text) => reasoning_item(&self.id, Some(text), status),
            Content::Call {
                call_id,
                name,
                arguments,
            } => function_call_item(&self.id, call_id, name, arguments, status),
        }
    }
}

/// The rewriting state of one streamed response.
#[derive(Debug)]
pub struct ResponsesEvents {
    shell: ResponseShell,
    sequence: u64,
    started: bool,
    ended: bool,
    /// Bytes of a chat event not complete yet.
    partial: Vec<u8>,
    items: Vec<Item>,
    /// Output index of each chat tool-call index.
    calls: Vec<usize>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

impl ResponsesEvents {
    /// A stream about to start for `shell`.
    pub fn new(shell: ResponseShell) -> Self {
        Self {
            shell,
            sequence: 0,
            started: false,
            ended: false,
            partial: Vec::new(),
            items: Vec::new(),
            calls: Vec::new(),
            finish_reason: None,
            usage: None,
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut event: Value) {
        event["type"] = json!(kind);
        event["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.extend_from_slice(format!("event: {kind}\ndata: {event}\n\n").as_bytes());
    }

    fn output(&self, status: &str) -> Vec<Value> {
        self.items.iter().map(|item| item.json(status)).collect()
    }

    /// Rewrites the chat events in `chunk` (which may end inside an event).
    pub fn on_chat_bytes(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let created = self.shell.object("in_progress", Vec::new(), None);
            self.emit(&mut out, "response.created", json!({"response": created}));
            let progress = self.shell.object("in_progress", Vec::new(), None);
            self.emit(
                &mut out,
                "response.in_progress",
                json!({"response": progress}),
            );
        }
        self.partial.extend_from_slice(chunk);
        while let Some(end) = self.partial.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.partial.drain(..end + 2).collect();
            let Some(data) = event.strip_prefix(b"data: ") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                self.end(&mut out);
            } else if let Ok(value) = serde_json::from_slice::<Value>(data) {
                self.on_chat_event(&mut out, &value);
            }
        }
        Bytes::from(out)
    }

    fn on_chat_event(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if self.ended {
            return;
        }
        if let Some(error) = chunk.get("error") {
            let err = ApiError {
                message: error["message"]
                    .as_str()
                    .unwrap_or("generation failed")
                    .into(),
                ..ApiError::internal("")
            };
            self.emit(
                out,
                "error",
                json!({"code": error["code"], "message": err.message, "param": error["param"]}),
            );
            let failed = self.shell.failed(self.output("incomplete"), &err);
            self.emit(out, "response.failed", json!({"response": failed}));
            self.ended = true;
            return;
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| !usage.is_null()) {
            self.usage = Some(super::output::usage(usage));
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["reasoning_content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            self.reasoning_delta(out, text);
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text_delta(out, text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.call_delta(out, call);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
            let status = if reason == "length" {
                "incomplete"
            } else {
                "completed"
            };
            for index in 0..self.items.len() {
                self.close(out, index, status);
            }
        }
    }

    /// The open item of `kind` (message or reasoning) at the end of the output, opened if
    /// needed after closing what came before.
    fn open_text_item(&mut self, out: &mut Vec<u8>, reasoning: bool) -> usize {
        if let Some(last) = self.items.last()
            && !last.done
            && matches!(
                (&last.content, reasoning),
                (Content::Message(_), false) | (Content::Reasoning(_), true)
            )
        {
            return self.items.len() - 1;
        }
        for index in 0..self.items.len() {
            self.close(out, index, "completed");
        }
        let index = self.items.len();
        let (id, item, part) = if reasoning {
            let id = item_id("rs");
            let item = reasoning_item(&id, None, "in_progress");
            (id, item, reasoning_text(""))
        } else {
            let id = item_id("msg");
            let item = message_item(&id, None, "in_progress");
            (id, item, output_text(""))
        };
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        let content = if reasoning {
            Content::Reasoning(String::new())
        } else {
            Content::Message(String::new())
        };
        self.items.push(Item {
            id,
            content,
            done: false,
        });
        index
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        let index = self.open_text_item(out, false);
        if let Content::Message(all) = &mut self.items[index].content {
            all.push_str(text);
        }
        let id = self.items[index].id.clone();
        self.emit(
            out,
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
        );
    }

    fn reasoning_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        let index = self.open_text_item(out, true);
        if let Content::Reasoning(all) = &mut self.items[index].content {
            all.push_str(text);
        }
        let id = self.items[index].id.clone();
        self.emit(
            out,
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
        );
    }

    fn call_delta(&mut self, out: &mut Vec<u8>, call: &Value) {
        let tool_index = call["index"].as_u64().unwrap_or(0) as usize;
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        if tool_index >= self.calls.len() {
            for index in 0..self.items.len() {
                self.close(out, index, "completed");
            }
            let index = self.items.len();
            let item = Item {
                id: item_id("fc"),
                content: Content::Call {
                    call_id: call["id"].as_str().unwrap_or_default().to_owned(),
                    name: call["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: String::new(),
                },
                done: false,
            };
            let added = item.json("in_progress");
            self.items.push(item);
            self.calls.push(index);
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
        }
        let index = self.calls[tool_index.min(self.calls.len() - 1)];
        if arguments.is_empty() {
            return;
        }
        if let Content::Call { arguments: all, .. } = &mut self.items[index].content {
            all.push_str(arguments);
        }
        let id = self.items[index].id.clone();
        self.emit(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        );
    }

    /// Sends the `.done` events of item `index` if it is still open.
    fn close(&mut self, out: &mut Vec<u8>, index: usize, status: &str) {
        if self.items[index].done {
            return;
        }
        self.items[index].done = true;
        let id = self.items[index].id.clone();
        let base = json!({"item_id": id, "output_index": index});
        match &self.items[index].content {
            Content::Message(text) => {
                let text = text.clone();
                let mut done = base.clone();
                done["content_index"] = json!(0);
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                self.emit(out, "response.output_text.done", done);
                let mut part = base;
                part["content_index"] = json!(0);
                part["part"] = output_text(&text);
                self.emit(out, "response.content_part.done", part);
            }
            Content::Reasoning(text) => {
                let text = text.clone();
                let mut done = base.clone();
                done["content_index"] = json!(0);
                done["text"] = json!(text);
                self.emit(out, "response.reasoning_text.done", done);
                let mut part = base;
                part["content_index"] = json!(0);
                part["part"] = reasoning_text(&text);
                self.emit(out, "response.content_part.done", part);
            }
            Content::Call {
                name, arguments, ..
            } => {
                let mut done = base;
                done["name"] = json!(name);
                done["arguments"] = json!(arguments);
                self.emit(out, "response.function_call_arguments.done", done);
            }
        }
        let item = self.items[index].json(status);
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    /// The last event: the whole response.
    fn end(&mut self, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.ended = true;
        let status = status_of(self.finish_reason.as_deref());
        for index in 0..self.items.len() {
            self.close(out, index, status);
        }
        let item_status = if status == "incomplete" {
            "incomplete"
        } else {
            "completed"
        };
        let usage = self.usage.take().unwrap_or_else(|| usage(&Value::Null));
        let response = self
            .shell
            .object(status, self.output(item_status), Some(usage));
        let kind = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.emit(out, kind, json!({"response": response}));
    }
}

/// Rewrites a streamed chat body (server-sent events of one choice, usage included) as a
/// streamed Responses body. Dropping the result drops `chat`, which cancels the generation.
pub fn responses_stream(shell: ResponseShell, chat: Body) -> Body {
    let events = stream::unfold(
        Some((chat, ResponsesEvents::new(shell))),
        |state| async move {
            let (mut chat, mut events) = state?;
            loop {
                match chat.frame().await {
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else {
                            continue;
                        };
                        let out = events.on_chat_bytes(&data);
                        if !out.is_empty() {
                            return Some((
                                Ok::<_, std::convert::Infallible>(Frame::data(out)),
                                Some((chat, events)),
                            ));
                        }
                    }
                    Some(Err(never)) => match never {},
                    None => return None,
                }
            }
        },
    );
    StreamBody::new(events).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn chunk(delta: Value, finish: Option<&str>) -> String {
        let event = json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {event}\n\n")
    }

    fn events(chat: &[String]) -> Vec<Value> {
        let mut state = ResponsesEvents::new(ResponseShell::new("m".into(), Map::new()));
        let mut bytes = Vec::new();
        // Split arbitrarily: events may straddle chunks.
        let all = chat.concat();
        for piece in all.as_bytes().chunks(7) {
            bytes.extend_from_slice(&state.on_chat_bytes(piece));
        }
        let text = String::from_utf8(bytes).expect("UTF-8");
        text.split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let (head, data) = event.split_once('\n').expect("two lines");
                let value: Value =
                    serde_json::from_str(data.strip_prefix("data: ").expect("data")).expect("JSON");
                assert_eq!(head.strip_prefix("event: "), value["type"].as_str());
                value
            })
            .collect()
    }

    #[test]
    fn text_then_a_call_stream_as_typed_events_in_sequence() {
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
        let out = events(&[
            chunk(json!({"role": "assistant", "content": ""}), None),
            chunk(json!({"reasoning_content": "hmm"}), None),
            chunk(json!({"content": "Hel"}), None),
            chunk(json!({"content": "lo"}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
                Some("tool_calls"),
            ),
            format!("data: {usage}\n\n"),
            "data: [DONE]\n\n".into(),
        ]);
        let kinds: Vec<&str> = out.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (index, event) in out.iter().enumerate() {
            assert_eq!(event["sequence_number"], index);
        }
        assert_eq!(out[12]["text"], "Hello");
        assert_eq!(out[18]["arguments"], "{\"a\":1}");
        let response = &out[20]["response"];
        assert_eq!(response["status"], "completed");
        assert_eq!(response["output"][2]["call_id"], "call_1");
        assert_eq!(response["output"][1]["content"][0]["text"], "Hello");
        assert_eq!(response["usage"]["output_tokens"], 4);
    }

    #[test]
    fn an_error_fails_the_response() {
        let out = events(&[
            chunk(json!({"content": "a"}), None),
            format!(
                "data: {}\n\n",
                json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": null}})
            ),
            "data: [DONE]\n\n".into(),
        ]);
        let kinds: Vec<&str> = out.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(kinds.last(), Some(&"response.failed"));
        assert!(kinds.contains(&"error"));
        assert_eq!(
            out.last().expect("event")["response"]["error"]["message"],
            "boom"
        );
    }

    #[test]
    fn a_length_cut_ends_incomplete() {
        let out = events(&[
            chunk(json!({"content": "abc"}), Some("length")),
            "data: [DONE]\n\n".into(),
        ]);
        let last = out.last().expect("event");
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    }
}
