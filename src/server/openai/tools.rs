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
}

impl ToolCallFormat {
    /// The format a chat template writes its tool calls in, recognised by its markers.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains("<tool_call>") {
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
            Self::Hermes | Self::Mistral => "arguments",
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
    let one_call = compact_json(json!({
        "anyOf": allowed.iter().map(|tool| call_schema(format, tool)).collect::<Vec<_>>()
    }));
    let several = parallel && !matches!(choice, ToolChoice::Function(_));
    let grammar = match format {
        ToolCallFormat::Hermes => {
            let repeat = if several { "+" } else { "" };
            format!(
                "start: call{repeat}\ncall: \"<tool_call>\\n\" %json {one_call} \"\\n</tool_call>\"\n"
            )
        }
        ToolCallFormat::Llama3Json => {
            let more = if several { " (\"; \" call)*" } else { "" };
            format!("start: call{more}\ncall: %json {one_call}\n")
        }
        ToolCallFormat::Mistral => {
            let mut array = json!({"type": "array", "items": one_call, "minItems": 1});
            if !several {
                array["maxItems"] = json!(1);
            }
            format!("start: \"[TOOL_CALLS]\" %json {array}\n")
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
