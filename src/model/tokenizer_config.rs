//! `tokenizer_config.json`: the special-token strings and the chat template(s).

use std::path::Path;

use serde_json::Value;

use super::error::ModelError;
use super::json::{JsonObject, parse_object};

/// Special-token strings named by `tokenizer_config.json` (given there as plain strings or as
/// `AddedToken` objects with a `content` field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token, e.g. `<|begin_of_text|>`.
    pub bos_token: Option<String>,
    /// End-of-sequence token, e.g. `<|eot_id|>`.
    pub eos_token: Option<String>,
    /// Padding token.
    pub pad_token: Option<String>,
    /// Unknown-token placeholder.
    pub unk_token: Option<String>,
}

/// The name of the template used when a request does not select another.
pub const DEFAULT_TEMPLATE: &str = "default";

/// What `tokenizer_config.json` holds that the loader uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TokenizerConfig {
    /// Special-token strings.
    pub special: SpecialTokens,
    /// Named chat templates (`default` for the single-string form).
    pub templates: Vec<(String, String)>,
}

impl TokenizerConfig {
    /// Parses the `tokenizer_config.json` at `path`.
    pub(crate) fn from_json(path: &Path, bytes: &[u8]) -> Result<Self, ModelError> {
        let map = parse_object(path, bytes)?;
        let config = JsonObject::new(path, &map);
        let special = SpecialTokens {
            bos_token: token_string(&config, "bos_token")?,
            eos_token: token_string(&config, "eos_token")?,
            pad_token: token_string(&config, "pad_token")?,
            unk_token: token_string(&config, "unk_token")?,
        };
        Ok(Self {
            special,
            templates: templates(&config)?,
        })
    }
}

/// A special token given as a string or as an `AddedToken` object.
fn token_string(config: &JsonObject<'_>, field: &str) -> Result<Option<String>, ModelError> {
    match config.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(token)) => match token.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(config.invalid(field, "token object without a string `content`")),
        },
        Some(other) => Err(config.invalid(
            field,
            format!("expected a string or a token object, got {other}"),
        )),
    }
}

/// `chat_template` as one string, or as a list of `{"name", "template"}` objects.
fn templates(config: &JsonObject<'_>) -> Result<Vec<(String, String)>, ModelError> {
    match config.get("chat_template") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![(DEFAULT_TEMPLATE.to_owned(), s.clone())]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(name), Some(template)) => Ok((name.to_owned(), template.to_owned())),
                    _ => Err(config.invalid(
                        "chat_template",
                        "list entries must be objects with string `name` and `template`",
                    )),
                }
            })
            .collect(),
        Some(_) => Err(config.invalid(
            "chat_template",
            "expected a string or a list of named templates",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<TokenizerConfig, ModelError> {
        TokenizerConfig::from_json(Path::new("tokenizer_config.json"), json.as_bytes())
    }

    #[test]
    fn reads_string_and_added_token_forms() {
        let config = parse(
            r#"{"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false},
                "pad_token": null, "chat_template": "{{ bos_token }}"}"#,
        )
        .unwrap();
        assert_eq!(config.special.bos_token.as_deref(), Some("<s>"));
        assert_eq!(config.special.eos_token.as_deref(), Some("</s>"));
        assert_eq!(config.special.pad_token, None);
        assert_eq!(
            config.templates,
            vec![("default".to_owned(), "{{ bos_token }}".to_owned())]
        );
    }

    #[test]
    fn reads_named_templates() {
        let config = parse(
            r#"{"chat_template": [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]}"#,
        )
        .unwrap();
        assert_eq!(config.templates.len(), 2);
        assert_eq!(config.templates[1], ("tool_use".to_owned(), "b".to_owned()));
    }

    #[test]
    fn rejects_malformed_fields_by_name() {
        let err = parse(r#"{"eos_token": 7}"#).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json") && err.contains("eos_token"),
            "{err}"
        );
        let err = parse(r#"{"chat_template": [{"name": "x"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chat_template"), "{err}");
    }
}
