//! Tool calls: the output formats of the supported model families, the grammar that enforces a
//! `required` or named `tool_choice`, and the parser that turns the model's output into OpenAI
//! `tool_calls`.

use serde_json::{Value, json};

use super::request::ToolChoice;
use crate::constrain::{ConstraintKind, ConstraintSource, ConstraintSpec, compact_json};

/// How a model family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// Llama 3.x (`llama3_json`): a JSON object `{"name": …, "parameters": {…}}` (several joined by `; `),
    /// optionally after `<|python_tag|>`.
    Llama3Json,
    /// Hermes style (Qwen2.5, Qwen3): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Hermes,
    /// Mistral: `[TOOL_CALLS]` and a JSON array of `{"name": …, "arguments": {…}}`.
    Mistral,
    /// gpt-oss's harmony format: a `commentary` message to `functions.NAME` whose body is the
    /// JSON arguments (`super::harmony` parses it, with the reasoning and the answer).
    Harmony,
}

impl ToolCallFormat {
    /// The format a chat template writes its tool calls in, recognised by its markers.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains("to=functions.") {
            Some(Self::Harmony)
        } else if template_source.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template_source.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if template_source.contains("<|python_tag|>")
            || template_source.contains("ipython")
            || template_source.contains("\"parameters\"")
        {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }

    /// The key that holds a call's arguments in this format.
    fn arguments_key(self) -> &'static str {
        match self {
            Self::Llama3Json => "parameters",
            Self::Hermes | Self::Mistral | Self::Harmony => "arguments",
        }
    }
}

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedToolCall {
    /// The function name.
    pub name: String,
    /// The arguments as a JSON document (OpenAI sends them as a string).
    pub arguments: String,
}

/// The JSON schema of one call of `tool` in `format`.
fn call_schema(format: ToolCallFormat, tool: &Value) -> Value {
    let function = &tool["function"];
    let parameters = match &function["parameters"] {
        Value::Object(schema) => Value::Object(schema.clone()),
        _ => json!({"type": "object"}),
    };
    let mut properties = serde_json::Map::new();
    properties.insert("name".into(), json!({"const": function["name"]}));
    properties.insert(format.arguments_key().into(), parameters);
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", format.arguments_key()],
        "additionalProperties": false,
    })
}

/// The grammar that a `required` or named `tool_choice` imposes, or `None` when the choice
/// leaves the model free.
pub fn tool_constraint(
    format: ToolCallFormat,
    tools: &[Value],
    choice: &ToolChoice,
    parallel: bool,
) -> Option<ConstraintSpec> {
    let allowed: Vec<&Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Function(name) => tools
            .iter()
            .filter(|tool| tool["function"]["name"] == name.as_str())
            .collect(),
    };
    let one_call = || {
        compact_json(json!({
            "anyOf": allowed.iter().map(|tool| call_schema(format, tool)).collect::<Vec<_>>()
        }))
    };
    let several = parallel && !matches!(choice, ToolChoice::Function(_));
    let grammar = match format {
        ToolCallFormat::Hermes => {
            let repeat = if several { "+" } else { "" };
            format!(
                "start: call{repeat}\ncall: \"<tool_call>\\n\" %json {} \"\\n</tool_call>\"\n",
                one_call()
            )
        }
        ToolCallFormat::Llama3Json => {
            let more = if several { " (\"; \" call)*" } else { "" };
            format!("start: call{more}\ncall: %json {}\n", one_call())
        }
        ToolCallFormat::Mistral => {
            let mut array = json!({"type": "array", "items": one_call(), "minItems": 1});
            if !several {
                array["maxItems"] = json!(1);
            }
            format!("start: \"[TOOL_CALLS]\" %json {array}\n")
        }
        // One call per message, and the model stops at its `<|call|>`.
        ToolCallFormat::Harmony => super::harmony::call_grammar(&allowed),
    };
    Some(ConstraintSpec {
        kind: ConstraintKind::ToolCall,
        source: ConstraintSource::Lark(grammar),
    })
}

/// Reads one call object (`name` and the format's arguments key, or `arguments`).
fn call_of(value: &Value, format: ToolCallFormat) -> Option<ParsedToolCall> {
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = value
        .get(format.arguments_key())
        .or_else(|| value.get("arguments"))
        .or_else(|| value.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match arguments {
        // Some models write the arguments as a JSON string already.
        Value::String(text) => text,
        other => other.to_string(),
    };
    Some(ParsedToolCall { name, arguments })
}

/// Parses the model's `text` in `format`: the content before the calls (if any) and the calls.
/// `None` when the text holds no well-formed tool call (it is then plain content).
pub fn parse_tool_calls(
    format: ToolCallFormat,
    text: &str,
) -> Option<(Option<String>, Vec<ParsedToolCall>)> {
    let content = |before: &str| {
        let before = before.trim();
        (!before.is_empty()).then(|| before.to_owned())
    };
    match format {
        ToolCallFormat::Harmony => {
            let message = super::harmony::parse(text, true);
            (!message.tool_calls.is_empty())
                .then(|| (content(&message.content), message.tool_calls))
        }
        ToolCallFormat::Hermes => {
            let start = text.find("<tool_call>")?;
            let mut calls = Vec::new();
            let mut rest = &text[start..];
            while let Some(open) = rest.find("<tool_call>") {
                let body = &rest[open + "<tool_call>".len()..];
                let close = body.find("</tool_call>")?;
                let value: Value = serde_json::from_str(body[..close].trim()).ok()?;
                calls.push(call_of(&value, format)?);
                rest = &body[close + "</tool_call>".len()..];
            }
            (!calls.is_empty()).then(|| (content(&text[..start]), calls))
        }
        ToolCallFormat::Mistral => {
            let start = text.find("[TOOL_CALLS]");
            let body = match start {
                Some(at) => &text[at + "[TOOL_CALLS]".len()..],
                None => text.trim_start(),
            };
            let value: Value = serde_json::from_str(body.trim()).ok()?;
            let calls = match &value {
                Value::Array(items) => items
                    .iter()
                    .map(|item| call_of(item, format))
                    .collect::<Option<Vec<_>>>()?,
                object => vec![call_of(object, format)?],
            };
            let before = start.map_or("", |at| &text[..at]);
            (!calls.is_empty()).then(|| (content(before), calls))
        }
        ToolCallFormat::Llama3Json => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            if !body.starts_with('{') {
                return None;
            }
            let mut calls = Vec::new();
            let mut rest = body;
            loop {
                let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                let value = stream.next()?.ok()?;
                calls.push(call_of(&value, format)?);
                rest = rest[stream.byte_offset()..].trim_start();
                if rest.is_empty() {
                    break;
                }
                rest = rest.strip_prefix(';')?.trim_start();
            }
            Some((None, calls))
        }
    }
}

/// How far a grammar-enforced call has been generated: its name once complete, and where its
/// arguments value starts and (once complete) ends in the output.
#[derive(Debug, Clone, Default, PartialEq)]
struct CallProgress {
    name: Option<String>,
    arguments_start: Option<usize>,
    arguments_end: Option<usize>,
}

/// Where the scanner stands inside a call object's top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Key,
    Colon,
    Value,
    Comma,
}

/// Scans a (possibly partial) output that a grammar made of tool calls in `format` and reports
/// each call's progress. Only the JSON structure is followed (strings, nesting, the call
/// objects' top-level keys), so text between calls (`<tool_call>` tags, `; `) is skipped.
fn scan_calls(format: ToolCallFormat, text: &str) -> Vec<CallProgress> {
    // Mistral's calls are the elements of one array; the others' are top-level objects.
    let call_depth = usize::from(format == ToolCallFormat::Mistral);
    let mut calls: Vec<CallProgress> = Vec::new();
    let (mut depth, mut in_call) = (0usize, false);
    let (mut in_string, mut escaped, mut string_start) = (false, false, 0);
    let mut expect = Expect::Key;
    let mut key = String::new();
    let mut value_start: Option<usize> = None;
    let mut last_solid = 0;
    // Ends the value of `key` at `end` (exclusive).
    let finish_value = |call: &mut CallProgress, key: &str, start: usize, end: usize| {
        let raw = &text[start..end];
        if key == "name" {
            call.name = serde_json::from_str::<String>(raw).ok();
        } else if (key == format.arguments_key() || key == "arguments" || key == "parameters")
            && call.arguments_end.is_none()
        {
            call.arguments_start = Some(start);
            call.arguments_end = Some(end);
        }
    };
    for (i, c) in text.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                if in_call && depth == call_depth + 1 {
                    let raw = &text[string_start..=i];
                    match expect {
                        Expect::Key => {
                            key = serde_json::from_str::<String>(raw).unwrap_or_default();
                            expect = Expect::Colon;
                        }
                        Expect::Value if value_start == Some(string_start) => {
                            if let Some(call) = calls.last_mut() {
                                finish_value(call, &key, string_start, i + 1);
                            }
                            expect = Expect::Comma;
                        }
                        _ => {}
                    }
                }
            }
            last_solid = i + 1;
            continue;
        }
        let level = in_call && depth == call_depth + 1;
        match c {
            '"' => {
                in_string = true;
                string_start = i;
                if level && expect == Expect::Value && value_start.is_none() {
                    value_start = Some(i);
                }
            }
            '{' | '[' => {
                if !in_call && depth == call_depth && c == '{' {
                    in_call = true;
                    calls.push(CallProgress::default());
                    expect = Expect::Key;
                } else if level && expect == Expect::Value && value_start.is_none() {
                    value_start = Some(i);
                    // Arguments stream while they are generated: their start is known now.
                    if (key == format.arguments_key() || key == "arguments" || key == "parameters")
                        && let Some(call) = calls.last_mut()
                        && call.arguments_start.is_none()
                    {
                        call.arguments_start = Some(i);
                    }
                }
                depth += 1;
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if in_call && depth == call_depth + 1 && expect == Expect::Value {
                    // A nested value closed.
                    if let (Some(call), Some(start)) = (calls.last_mut(), value_start) {
                        finish_value(call, &key, start, i + 1);
                    }
                    expect = Expect::Comma;
                } else if in_call && depth == call_depth {
                    // The call object closed, after a scalar value perhaps.
                    if expect == Expect::Value
                        && let (Some(call), Some(start)) = (calls.last_mut(), value_start)
                    {
                        finish_value(call, &key, start, last_solid);
                    }
                    in_call = false;
                    value_start = None;
                }
            }
            ':' if level => {
                expect = Expect::Value;
                value_start = None;
            }
            ',' if level => {
                if expect == Expect::Value
                    && let (Some(call), Some(start)) = (calls.last_mut(), value_start)
                {
                    finish_value(call, &key, start, last_solid);
                }
                expect = Expect::Key;
                value_start = None;
            }
            c if level
                && expect == Expect::Value
                && value_start.is_none()
                && !c.is_whitespace() =>
            {
                value_start = Some(i);
            }
            _ => {}
        }
        if !c.is_whitespace() {
            last_solid = i + c.len_utf8();
        }
    }
    calls
}

/// One streamed piece of a tool call (OpenAI's `delta.tool_calls` entries).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallUpdate {
    /// A call begins: its position and function name (the first delta of a call carries its
    /// id, type and name).
    Start {
        /// Position of the call in the message's `tool_calls`.
        index: usize,
        /// The function name.
        name: String,
    },
    /// More of a call's arguments (the fragments concatenate to the whole arguments).
    Arguments {
        /// Position of the call.
        index: usize,
        /// The next fragment.
        fragment: String,
    },
}

/// Streams the tool calls of a choice whose grammar enforces them (`tool_choice` `required` or
/// a named function) as they are generated: each call's name once it is complete, then its
/// arguments as they grow. The arguments are the model's JSON text as generated, so the
/// fragments concatenate to exactly what [`enforced_tool_calls`] returns for the whole output.
#[derive(Debug, Clone)]
pub struct ToolCallStreamer {
    format: ToolCallFormat,
    parallel: bool,
    /// Per call: whether its start was sent, and how many bytes of its arguments.
    sent: Vec<(bool, usize)>,
}

impl ToolCallStreamer {
    /// A streamer for calls in `format`; without `parallel` only the first call is streamed.
    pub fn new(format: ToolCallFormat, parallel: bool) -> Self {
        Self {
            format,
            parallel,
            sent: Vec::new(),
        }
    }

    /// The updates that the output `text` (all of it so far) adds to those already returned.
    pub fn update(&mut self, text: &str) -> Vec<ToolCallUpdate> {
        let mut updates = Vec::new();
        let limit = if self.parallel { usize::MAX } else { 1 };
        for (index, call) in scan_calls(self.format, text)
            .into_iter()
            .take(limit)
            .enumerate()
        {
            if self.sent.len() <= index {
                self.sent.push((false, 0));
            }
            let (started, sent) = &mut self.sent[index];
            let Some(name) = call.name else { break };
            if !*started {
                updates.push(ToolCallUpdate::Start { index, name });
                *started = true;
            }
            let Some(start) = call.arguments_start else {
                continue;
            };
            let end = call.arguments_end.unwrap_or(text.len());
            let raw = &text[start..end];
            // Arguments written as a JSON string are sent decoded, once complete.
            let available = if raw.starts_with('"') {
                match call.arguments_end {
                    Some(_) => serde_json::from_str::<String>(raw).unwrap_or_default(),
                    None => continue,
                }
            } else {
                raw.to_owned()
            };
            if available.len() > *sent && available.is_char_boundary(*sent) {
                updates.push(ToolCallUpdate::Arguments {
                    index,
                    fragment: available[*sent..].to_owned(),
                });
                *sent = available.len();
            }
        }
        updates
    }
}

/// The calls of a grammar-enforced output (see [`ToolCallStreamer`]), with the arguments as
/// generated: complete calls, and a call cut off by the length limit with what it has. `None`
/// when no call has a complete name.
pub fn enforced_tool_calls(
    format: ToolCallFormat,
    text: &str,
    parallel: bool,
) -> Option<Vec<ParsedToolCall>> {
    let mut streamer = ToolCallStreamer::new(format, parallel);
    let mut calls: Vec<ParsedToolCall> = Vec::new();
    for update in streamer.update(text) {
        match update {
            ToolCallUpdate::Start { name, .. } => calls.push(ParsedToolCall {
                name,
                arguments: String::new(),
            }),
            ToolCallUpdate::Arguments { index, fragment } => {
                if let Some(call) = calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` prefix by prefix (every char boundary) and reassembles the updates.
    fn streamed(format: ToolCallFormat, text: &str, parallel: bool) -> Vec<ParsedToolCall> {
        let mut streamer = ToolCallStreamer::new(format, parallel);
        let mut calls: Vec<ParsedToolCall> = Vec::new();
        let mut updates = 0;
        for end in (1..=text.len()).filter(|&end| text.is_char_boundary(end)) {
            for update in streamer.update(&text[..end]) {
                updates += 1;
                match update {
                    ToolCallUpdate::Start { index, name } => {
                        assert_eq!(index, calls.len(), "calls start in order");
                        calls.push(ParsedToolCall {
                            name,
                            arguments: String::new(),
                        });
                    }
                    ToolCallUpdate::Arguments { index, fragment } => {
                        calls[index].arguments.push_str(&fragment)
                    }
                }
            }
        }
        assert!(
            updates > calls.len(),
            "the arguments came in several pieces"
        );
        calls
    }

    #[test]
    fn enforced_calls_stream_incrementally_and_reassemble_to_the_whole() {
        let weather = r#"{"name": "get_weather", "arguments": {"city": "Paris, \"FR\" {x}", "days": [1, 2]}}"#;
        let time = r#"{"name": "get_time", "arguments": {"zone": "CET"}}"#;
        let cases = [
            (
                ToolCallFormat::Hermes,
                format!("<tool_call>\n{weather}\n</tool_call><tool_call>\n{time}\n</tool_call>"),
            ),
            (ToolCallFormat::Llama3Json, format!("{weather}; {time}")),
            (
                ToolCallFormat::Mistral,
                format!("[TOOL_CALLS][{weather}, {time}]"),
            ),
        ];
        for (format, text) in cases {
            let whole = enforced_tool_calls(format, &text, true).expect("calls");
            assert_eq!(streamed(format, &text, true), whole, "{format:?}");
            let names: Vec<&str> = whole.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["get_weather", "get_time"], "{format:?}");
            // The arguments are the generated JSON text, and agree with the whole-output parser.
            assert_eq!(
                whole[0].arguments,
                r#"{"city": "Paris, \"FR\" {x}", "days": [1, 2]}"#
            );
            let (_, parsed) = parse_tool_calls(format, &text).expect("parses");
            for (a, b) in whole.iter().zip(&parsed) {
                let a_args: Value = serde_json::from_str(&a.arguments).expect("json");
                let b_args: Value = serde_json::from_str(&b.arguments).expect("json");
                assert_eq!((&a.name, a_args), (&b.name, b_args), "{format:?}");
            }
            // Without parallel calls only the first is streamed.
            assert_eq!(streamed(format, &text, false), whole[..1].to_vec());
        }
        // Arguments before the name, and arguments written as a JSON string.
        let text = r#"{"arguments": "{\"a\": 1}", "name": "f"}"#;
        let whole = enforced_tool_calls(ToolCallFormat::Llama3Json, text, true).expect("call");
        assert_eq!(whole[0].name, "f");
        assert_eq!(whole[0].arguments, r#"{"a": 1}"#);
    }

    #[test]
    fn a_call_cut_off_keeps_what_was_generated() {
        let text = r#"<tool_call>
{"name": "get_weather", "arguments": {"city": "Par"#;
        let calls = enforced_tool_calls(ToolCallFormat::Hermes, text, true).expect("a call");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city": "Par"#);
        // No complete name yet: no call.
        assert!(
            enforced_tool_calls(
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"get_w",
                true
            )
            .is_none()
        );
    }

    #[test]
    fn formats_are_detected_from_templates() {
        assert_eq!(
            ToolCallFormat::detect("{{ '<tool_call>\\n' }}"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(
            ToolCallFormat::detect("[TOOL_CALLS] {{ x }}"),
            Some(ToolCallFormat::Mistral)
        );
        assert_eq!(
            ToolCallFormat::detect("<|python_tag|>"),
            Some(ToolCallFormat::Llama3Json)
        );
        assert_eq!(ToolCallFormat::detect("{{ messages }}"), None);
    }

    #[test]
    fn hermes_calls_parse_with_leading_content() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
        let (content, calls) = parse_tool_calls(ToolCallFormat::Hermes, text).unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, r#"{"a":1}"#);
        assert!(parse_tool_calls(ToolCallFormat::Hermes, "no calls").is_none());
        assert!(parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>{bad</tool_call>").is_none());
    }

    #[test]
    fn llama3_and_mistral_calls_parse() {
        let text = r#"<|python_tag|>{"name": "f", "parameters": {"x": "y"}}; {"name": "g", "parameters": {}}"#;
        let (_, calls) = parse_tool_calls(ToolCallFormat::Llama3Json, text).unwrap();
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["f", "g"]
        );
        assert_eq!(calls[0].arguments, r#"{"x":"y"}"#);
        assert!(parse_tool_calls(ToolCallFormat::Llama3Json, "Hello {}").is_none());
        let text = r#"[TOOL_CALLS][{"name": "f", "arguments": {"q": 2}}]"#;
        let (content, calls) = parse_tool_calls(ToolCallFormat::Mistral, text).unwrap();
        assert!(content.is_none());
        assert_eq!(calls[0].arguments, r#"{"q":2}"#);
    }

    #[test]
    fn only_required_and_named_choices_constrain() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        for format in [
            ToolCallFormat::Llama3Json,
            ToolCallFormat::Hermes,
            ToolCallFormat::Mistral,
        ] {
            assert!(tool_constraint(format, &tools, &ToolChoice::Auto, true).is_none());
            let spec = tool_constraint(format, &tools, &ToolChoice::Required, false).unwrap();
            assert_eq!(spec.kind, ConstraintKind::ToolCall);
            let named = ToolChoice::Function("f".into());
            assert!(tool_constraint(format, &tools, &named, true).is_some());
        }
    }
}
