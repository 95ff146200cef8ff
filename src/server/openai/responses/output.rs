//! The Responses API's response object and output items, built from what the chat path
//! produced.

use serde_json::{Map, Value, json};

use crate::server::error::ApiError;

/// The parts of a response object that do not depend on the output: its id, creation time,
/// model and the request's settings it echoes.
#[derive(Debug, Clone)]
pub struct ResponseShell {
    /// `resp_…`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The served model's id.
    pub model: String,
    /// The request's settings (`instructions`, `tools`, `text`, ...).
    pub echo: Map<String, Value>,
}

impl ResponseShell {
    /// A shell with a new id.
    pub fn new(model: String, echo: Map<String, Value>) -> Self {
        Self {
            id: format!("resp_{}", uuid::Uuid::new_v4().simple()),
            created_at: crate::server::unix_now(),
            model,
            echo,
        }
    }

    /// The response object in `status` with `output` and `usage`.
    pub fn object(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        let mut object = Map::new();
        object.insert("id".into(), Value::String(self.id.clone()));
        object.insert("object".into(), json!("response"));
        object.insert("created_at".into(), json!(self.created_at));
        object.insert("status".into(), json!(status));
        object.insert("error".into(), Value::Null);
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        object.insert(
            "incomplete_details".into(),
            incomplete.unwrap_or(Value::Null),
        );
        object.insert("model".into(), Value::String(self.model.clone()));
        object.insert("output".into(), Value::Array(output));
        object.insert("previous_response_id".into(), Value::Null);
        object.insert("store".into(), Value::Bool(false));
        object.insert("truncation".into(), json!("disabled"));
        object.insert("usage".into(), usage.unwrap_or(Value::Null));
        for (key, value) in &self.echo {
            object.insert(key.clone(), value.clone());
        }
        Value::Object(object)
    }

    /// The response object of a request that failed with `err` after it started.
    pub fn failed(&self, output: Vec<Value>, err: &ApiError) -> Value {
        let mut object = self.object("failed", output, None);
        object["error"] = json!({
            "code": if err.status.is_server_error() { "server_error" } else { "invalid_prompt" },
            "message": err.message,
        });
        object
    }
}

/// A new output item id with `prefix` (`msg`, `fc`, `rs`).
pub fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// An assistant message item holding `text` (`None`: no content part yet).
pub fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(output_text).into_iter().collect();
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// An `output_text` content part.
pub fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A `reasoning_text` content part.
pub fn reasoning_text(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// A reasoning item holding the model's reasoning `text` (`None`: no content part yet).
pub fn reasoning_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(reasoning_text).into_iter().collect();
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": content})
}

/// A function call item.
pub fn function_call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// A chat `usage` object in the Responses API's terms.
pub fn usage(chat: &Value) -> Value {
    let count = |key: &str| chat[key].as_u64().unwrap_or(0);
    let reasoning = chat["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
    json!({
        "input_tokens": count("prompt_tokens"),
        "input_tokens_details": {
            "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        },
        "output_tokens": count("completion_tokens"),
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": count("total_tokens"),
    })
}

/// The status a chat finish reason gives a response.
pub fn status_of(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "incomplete",
        _ => "completed",
    }
}

/// The whole response object of a chat completion document (one choice).
pub fn from_chat(shell: &ResponseShell, chat_json: &str) -> Result<String, ApiError> {
    let chat: Value = serde_json::from_str(chat_json)
        .map_err(|err| ApiError::internal(format!("failed to read the chat completion: {err}")))?;
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let finish = choice["finish_reason"].as_str();
    let status = status_of(finish);
    let item_status = if status == "incomplete" {
        "incomplete"
    } else {
        "completed"
    };
    let mut output = Vec::new();
    if let Some(reasoning) = message["reasoning_content"]
        .as_str()
        .filter(|text| !text.is_empty())
    {
        output.push(reasoning_item(&item_id("rs"), Some(reasoning), item_status));
    }
    if let Some(text) = message["content"].as_str().filter(|text| !text.is_empty()) {
        output.push(message_item(&item_id("msg"), Some(text), item_status));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        output.push(function_call_item(
            &item_id("fc"),
            call["id"].as_str().unwrap_or_default(),
            call["function"]["name"].as_str().unwrap_or_default(),
            call["function"]["arguments"].as_str().unwrap_or_default(),
            item_status,
        ));
    }
    let object = shell.object(status, output, Some(usage(&chat["usage"])));
    serde_json::to_string(&object)
        .map_err(|err| ApiError::internal(format!("failed to encode the response: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell() -> ResponseShell {
        let mut echo = Map::new();
        echo.insert("instructions".into(), json!("Be brief."));
        ResponseShell::new("m".into(), echo)
    }

    #[test]
    fn a_chat_completion_becomes_output_items() {
        let chat = json!({
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "The user wants weather.",
                "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}}],
            }}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                "prompt_tokens_details": {"cached_tokens": 2}},
        });
        let text = from_chat(&shell(), &chat.to_string()).expect("converts");
        let response: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(response["object"], "response");
        assert_eq!(response["status"], "completed");
        assert_eq!(response["instructions"], "Be brief.");
        let output = response["output"].as_array().expect("output");
        let kinds: Vec<&str> = output
            .iter()
            .filter_map(|item| item["type"].as_str())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(output[0]["content"][0]["text"], "The user wants weather.");
        assert_eq!(output[1]["content"][0]["text"], "Let me look.");
        assert_eq!(output[2]["call_id"], "call_1");
        assert_eq!(output[2]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(response["usage"]["input_tokens"], 7);
        assert_eq!(
            response["usage"]["input_tokens_details"]["cached_tokens"],
            2
        );
        assert_eq!(response["usage"]["total_tokens"], 12);
    }

    #[test]
    fn a_length_cut_is_incomplete() {
        let chat = json!({
            "choices": [{"index": 0, "finish_reason": "length",
                "message": {"role": "assistant", "content": "abc"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        });
        let response: Value =
            serde_json::from_str(&from_chat(&shell(), &chat.to_string()).expect("converts"))
                .expect("JSON");
        assert_eq!(response["status"], "incomplete");
        assert_eq!(
            response["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(response["output"][0]["status"], "incomplete");
    }
}
