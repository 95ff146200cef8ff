//! Reading a `/v1/responses` body and rewriting it as the chat completion body that the chat
//! path (template, tool parsing, constraints) then validates and runs.
//!
//! The server keeps no state: `previous_response_id`, `conversation`, `store: true` and
//! `background: true` are refused. Every field is listed in `docs/server.md`.

use serde_json::{Map, Value, json};

use crate::server::error::ApiError;
use crate::server::openai::request::effort::effort_kwargs;
use crate::server::openai::request::{parse_object, refuse_fields};

/// Fields `/v1/responses` reads.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "include",
    "truncation",
    "previous_response_id",
    "conversation",
    "background",
    // Passed to the chat body, which accepts and ignores them (named in the header).
    "store",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// Chat fields that carry over unchanged.
const PASSED: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "store",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// A `/v1/responses` request rewritten for the chat path.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The equivalent chat completion body.
    pub chat: Value,
    /// Whether the response is streamed.
    pub stream: bool,
    /// The request's settings as the response object echoes them (`instructions`, `tools`,
    /// `tool_choice`, `text`, `reasoning`, ...).
    pub echo: Map<String, Value>,
}

/// Parses a `/v1/responses` body into the chat body it stands for.
pub fn parse_responses(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let value = parse_object(body)?;
    refuse_fields(&value, FIELDS)?;
    let object = value.as_object().cloned().unwrap_or_default();
    let get = |key: &str| object.get(key).filter(|value| !value.is_null());
    for (field, what) in [
        (
            "previous_response_id",
            "previous_response_id is not supported: this server keeps no responses; send the whole conversation in input",
        ),
        (
            "conversation",
            "conversation is not supported: this server keeps no conversations; send the whole conversation in input",
        ),
    ] {
        if get(field).is_some() {
            return Err(ApiError::invalid_param(field, what));
        }
    }
    if get("background") == Some(&Value::Bool(true)) {
        return Err(ApiError::invalid_param(
            "background",
            "background: true is not supported: this server keeps no responses",
        ));
    }
    if let Some(store) = get("store")
        && store != &Value::Bool(false)
    {
        return Err(ApiError::invalid_param(
            "store",
            "store: true is not supported: this server keeps no responses (send store: false)",
        ));
    }
    if let Some(truncation) = get("truncation")
        && truncation != "disabled"
    {
        return Err(ApiError::invalid_param(
            "truncation",
            "truncation is supported only as \"disabled\": a prompt over the context is refused",
        ));
    }
    match get("include") {
        None => {}
        Some(Value::Array(items)) if items.is_empty() => {}
        Some(_) => {
            return Err(ApiError::invalid_param(
                "include",
                "include is not supported (only an empty list)",
            ));
        }
    }
    if let Some(options) = get("stream_options") {
        // Only `include_obfuscation` exists; the stream carries no obfuscation padding.
        refuse_fields(options, &["include_obfuscation"])
            .map_err(|err| ApiError::invalid_param("stream_options", err.message))?;
    }
    let stream = match get("stream") {
        None => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stream",
                "stream must be a boolean",
            ));
        }
    };

    let mut chat = Map::new();
    for key in PASSED {
        if let Some(value) = object.get(*key) {
            chat.insert((*key).to_owned(), value.clone());
        }
    }
    let mut messages = Vec::new();
    match get("instructions") {
        None => {}
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "instructions",
                "instructions must be a string",
            ));
        }
    }
    match get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                input_item(index, item, &mut messages)?;
            }
        }
        None => return Err(ApiError::invalid_param("input", "input is required")),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input",
                "input must be a string or a list of items",
            ));
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    let tools = match get("tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools
            .iter()
            .enumerate()
            .map(|(index, tool)| chat_tool(index, tool))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid_param("tools", "tools must be a list")),
    };
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = get("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(text) = get("text") {
        refuse_fields(text, &["format", "verbosity"]).map_err(|err| err.with_param("text"))?;
        if let Some(verbosity) = text.get("verbosity").filter(|v| !v.is_null())
            && verbosity != "medium"
        {
            return Err(ApiError::invalid_param(
                "text.verbosity",
                "text.verbosity is supported only as \"medium\"",
            ));
        }
        if let Some(format) = text.get("format").filter(|v| !v.is_null()) {
            chat.insert("response_format".into(), chat_format(format)?);
        }
    }
    if let Some(reasoning) = get("reasoning") {
        refuse_fields(reasoning, &["effort", "summary", "generate_summary"])
            .map_err(|err| err.with_param("reasoning"))?;
        for field in ["summary", "generate_summary"] {
            if reasoning.get(field).is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid_param(
                    format!("reasoning.{field}"),
                    "reasoning summaries are not supported: the reasoning text itself is returned",
                ));
            }
        }
        if let Some(effort) = reasoning.get("effort").filter(|v| !v.is_null()) {
            // Checked here so that an error names the Responses field; the chat path turns it
            // into template arguments, or names it ignored where the template reads no effort.
            effort_kwargs(effort, "reasoning.effort", &mut Map::new())?;
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    if let Some(max) = get("max_output_tokens") {
        chat.insert("max_completion_tokens".into(), max.clone());
    }
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }

    let mut echo = Map::new();
    for (key, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("metadata", json!({})),
        ("parallel_tool_calls", Value::Bool(true)),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("temperature", Value::Null),
        ("text", json!({"format": {"type": "text"}})),
        ("tool_choice", Value::String("auto".into())),
        ("tools", json!([])),
        ("top_p", Value::Null),
        ("user", Value::Null),
    ] {
        echo.insert(key.to_owned(), get(key).cloned().unwrap_or(default));
    }
    if get("text").is_some_and(|text| text.get("format").is_none()) {
        echo.insert("text".into(), json!({"format": {"type": "text"}}));
    }
    Ok(ResponsesRequest {
        chat: Value::Object(chat),
        stream,
        echo,
    })
}

/// The text of a content list or string (`input_text` / `output_text` / `text` parts).
fn content_text(param: &str, content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (index, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(part_text)) => {
                        text.push_str(part_text);
                    }
                    _ => {
                        let part_param = format!("{param}[{index}]");
                        return Err(ApiError::invalid_param(
                            part_param.clone(),
                            format!("{part_param}: only text content parts are supported"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid_param(
            param,
            format!("{param} must be a string or a list of text parts"),
        )),
    }
}

/// Appends the chat message(s) of one input item.
fn input_item(index: usize, item: &Value, messages: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("input[{index}]");
    let field = |name: &str| -> Result<&str, ApiError> {
        item.get(name).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_param(
                format!("{param}.{name}"),
                format!("{param}.{name} must be a string"),
            )
        })
    };
    let kind = match item.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                format!("{param}.type"),
                format!("{param}.type must be a string"),
            ));
        }
    };
    match kind {
        "message" => {
            let role = match field("role")? {
                // The chat templates know system; OpenAI's developer messages are its successor.
                "developer" => "system",
                role @ ("system" | "user" | "assistant") => role,
                other => {
                    return Err(ApiError::invalid_param(
                        format!("{param}.role"),
                        format!(
                            "{param}.role {other:?} is not supported (system, developer, user, assistant)"
                        ),
                    ));
                }
            };
            let content = item.get("content").unwrap_or(&Value::Null);
            let text = content_text(&format!("{param}.content"), content)?;
            messages.push(json!({"role": role, "content": text}));
        }
        "function_call" => {
            let call = json!({
                "id": field("call_id")?,
                "type": "function",
                "function": {"name": field("name")?, "arguments": field("arguments")?},
            });
            // Consecutive calls belong to one assistant turn, as the chat API sends them.
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" && last["tool_calls"].is_array() => {
                    if let Some(calls) = last["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                _ => messages.push(json!({
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [call],
                })),
            }
        }
        "function_call_output" => {
            let output = item.get("output").unwrap_or(&Value::Null);
            let text = content_text(&format!("{param}.output"), output)?;
            messages.push(json!({
                "role": "tool",
                "tool_call_id": field("call_id")?,
                "content": text,
            }));
        }
        // Earlier reasoning is not part of the next prompt (the reasoning templates drop it).
        "reasoning" => {}
        "item_reference" => {
            return Err(ApiError::invalid_param(
                param,
                "item_reference is not supported: this server keeps no items; send the item itself",
            ));
        }
        other => {
            return Err(ApiError::invalid_param(
                format!("{param}.type"),
                format!(
                    "input item type {other:?} is not supported (message, function_call, function_call_output, reasoning)"
                ),
            ));
        }
    }
    Ok(())
}

/// A Responses function tool (`{"type":"function","name",…}`) as a chat tool.
fn chat_tool(index: usize, tool: &Value) -> Result<Value, ApiError> {
    let param = format!("tools[{index}]");
    if tool["type"] != "function" {
        return Err(ApiError::invalid_param(
            param.clone(),
            format!("{param}: only function tools are supported"),
        ));
    }
    refuse_fields(
        tool,
        &["type", "name", "description", "parameters", "strict"],
    )
    .map_err(|err| {
        let field = err.param.clone().unwrap_or_default();
        ApiError::invalid_param(
            format!("{param}.{field}"),
            format!("{param}.{field} is not supported"),
        )
    })?;
    let Some(name) = tool.get("name").and_then(Value::as_str) else {
        return Err(ApiError::invalid_param(
            format!("{param}.name"),
            format!("{param}.name must be a string"),
        ));
    };
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name.to_owned()));
    for key in ["description", "parameters"] {
        if let Some(value) = tool.get(key).filter(|value| !value.is_null()) {
            function.insert(key.into(), value.clone());
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

/// A Responses `tool_choice` as the chat one.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(object) if object.get("type") == Some(&json!("function")) => {
            match object.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(ApiError::invalid_param(
                    "tool_choice",
                    "a named tool_choice is {\"type\": \"function\", \"name\": …}",
                )),
            }
        }
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// A `text.format` as the chat `response_format`.
fn chat_format(format: &Value) -> Result<Value, ApiError> {
    let bad = |message: &str| ApiError::invalid_param("text.format", message);
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => {
            let mut spec = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(value) = format.get(key).filter(|value| !value.is_null()) {
                    spec.insert(key.into(), value.clone());
                }
            }
            if !spec.contains_key("schema") {
                return Err(bad("text.format json_schema needs a schema"));
            }
            Ok(json!({"type": "json_schema", "json_schema": spec}))
        }
        _ => Err(bad(
            "text.format type must be text, json_object or json_schema",
        )),
    }
}

/// Renames the chat fields the chat path named ignored to the Responses fields they came from
/// (the chat body carries `reasoning.effort` as `reasoning_effort`).
pub fn responses_ignored(ignored: &mut [&'static str]) {
    for field in ignored {
        if *field == "reasoning_effort" {
            *field = "reasoning.effort";
        }
    }
}

/// Renames the chat field an error from the chat path names to the Responses field it came
/// from.
pub fn responses_error(mut err: ApiError) -> ApiError {
    if let Some(param) = err.param.take() {
        let renamed = if param == "max_completion_tokens" || param == "max_tokens" {
            "max_output_tokens".to_owned()
        } else if param == "response_format" {
            "text.format".to_owned()
        } else if param.starts_with("messages") {
            "input".to_owned()
        } else if param == "chat_template_kwargs" {
            "reasoning".to_owned()
        } else if param == "reasoning_effort" {
            "reasoning.effort".to_owned()
        } else {
            param
        };
        err.param = Some(renamed);
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ResponsesRequest, ApiError> {
        parse_responses(body.to_string().as_bytes())
    }

    #[test]
    fn the_tool_loop_becomes_chat_messages() {
        let request = parse(json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
                {"type": "message", "role": "developer", "content": "Answer now."},
            ],
            "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "get"},
            "max_output_tokens": 20,
            "store": false,
        }))
        .expect("parses");
        let messages = request.chat["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 6);
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(messages[1], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[2]["tool_calls"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            messages[2]["tool_calls"][1]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
        );
        assert_eq!(messages[4]["content"], "rain");
        assert_eq!(messages[5]["role"], "system");
        assert_eq!(
            request.chat["tools"][0],
            json!({"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}})
        );
        assert_eq!(
            request.chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get"}})
        );
        assert_eq!(request.chat["max_completion_tokens"], 20);
        assert_eq!(request.chat["store"], false);
        assert!(!request.stream);
    }

    #[test]
    fn text_format_and_reasoning_map_to_chat_fields() {
        let request = parse(json!({
            "model": "m",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "A", "schema": {"type": "object"}, "strict": true}},
            "reasoning": {"effort": "minimal"},
            "stream": true,
        }))
        .expect("parses");
        assert_eq!(
            request.chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "A", "schema": {"type": "object"}, "strict": true}})
        );
        assert_eq!(request.chat["reasoning_effort"], "minimal");
        assert!(request.chat.get("chat_template_kwargs").is_none());
        assert_eq!(request.chat["stream_options"]["include_usage"], true);
        assert_eq!(request.echo["reasoning"]["effort"], "minimal");
        assert!(request.stream);
    }

    #[test]
    fn state_and_unknown_fields_are_refused_by_name() {
        for (body, param) in [
            (
                json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({"model": "m", "input": "x", "store": true}), "store"),
            (
                json!({"model": "m", "input": "x", "background": true}),
                "background",
            ),
            (
                json!({"model": "m", "input": "x", "conversation": "c"}),
                "conversation",
            ),
            (
                json!({"model": "m", "input": "x", "truncation": "auto"}),
                "truncation",
            ),
            (
                json!({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]}),
                "include",
            ),
            (json!({"model": "m", "input": "x", "seed": 1}), "seed"),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
                "input[0]",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0]",
            ),
            (
                json!({"model": "m", "input": "x", "reasoning": {"summary": "auto"}}),
                "reasoning.summary",
            ),
            (json!({"model": "m"}), "input"),
        ] {
            let err = parse(body).expect_err("refused");
            assert_eq!(err.param.as_deref(), Some(param), "{}", err.message);
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn chat_errors_name_the_responses_field() {
        let err = responses_error(ApiError::invalid_param("max_completion_tokens", "too many"));
        assert_eq!(err.param.as_deref(), Some("max_output_tokens"));
        let err = responses_error(ApiError::invalid_param("response_format", "bad schema"));
        assert_eq!(err.param.as_deref(), Some("text.format"));
    }
}
