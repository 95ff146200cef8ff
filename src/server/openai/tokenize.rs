//! Parsing `/tokenize` and `/detokenize` request bodies (vLLM's shapes), with the same field
//! checks as the generation endpoints (`request/`).

use serde::Deserialize;
use serde_json::{Map, Value};

use super::request::{fields, normalize_message, parse_object, refuse_fields};
use crate::server::error::ApiError;

/// A `/tokenize` body (vLLM's shape): a prompt, or chat messages rendered by the template.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeRequest {
    /// `{"prompt": …, "add_special_tokens": …}`.
    Prompt {
        /// The text.
        prompt: String,
        /// Add the tokenizer's BOS (default true).
        add_special_tokens: bool,
    },
    /// `{"messages": …, "add_generation_prompt": …, "tools": …, "chat_template_kwargs": …}`.
    Chat {
        /// Messages with text content flattened, ready for the template.
        messages: Vec<Value>,
        /// Tool definitions passed to the template.
        tools: Option<Value>,
        /// End with the assistant turn's header (default true).
        add_generation_prompt: bool,
        /// Extra template variables.
        template_kwargs: Map<String, Value>,
    },
}

/// Fields of a `/tokenize` body.
#[derive(Debug, Deserialize)]
struct TokenizeFields {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    messages: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
}

/// Parses a `/tokenize` body; returns the requested model (if named) and the request.
pub fn parse_tokenize(body: &[u8]) -> Result<(Option<String>, TokenizeRequest), ApiError> {
    let value = parse_object(body)?;
    let allowed = [
        "model",
        "prompt",
        "add_special_tokens",
        "messages",
        "tools",
        "add_generation_prompt",
        "chat_template_kwargs",
    ];
    refuse_fields(&value, &allowed)?;
    let fields: TokenizeFields = fields(&value)?;
    let request = match (fields.prompt, fields.messages) {
        (Some(prompt), None) => TokenizeRequest::Prompt {
            prompt,
            add_special_tokens: fields.add_special_tokens.unwrap_or(true),
        },
        (None, Some(messages)) => TokenizeRequest::Chat {
            messages: messages
                .into_iter()
                .enumerate()
                .map(|(index, message)| normalize_message(index, message))
                .collect::<Result<_, _>>()?,
            tools: fields
                .tools
                .filter(|tools| !tools.is_empty())
                .map(Value::Array),
            add_generation_prompt: fields.add_generation_prompt.unwrap_or(true),
            template_kwargs: fields.chat_template_kwargs.unwrap_or_default(),
        },
        _ => {
            return Err(ApiError::invalid_param(
                "prompt",
                "a tokenize request has either prompt or messages",
            ));
        }
    };
    Ok((fields.model, request))
}

/// Parses a `/detokenize` body `{"model": …, "tokens": […]}`.
pub fn parse_detokenize(body: &[u8]) -> Result<(Option<String>, Vec<u32>), ApiError> {
    #[derive(Deserialize)]
    struct DetokenizeFields {
        #[serde(default)]
        model: Option<String>,
        tokens: Vec<u32>,
    }
    let value = parse_object(body)?;
    refuse_fields(&value, &["model", "tokens"])?;
    let fields: DetokenizeFields = fields(&value)?;
    Ok((fields.model, fields.tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenize_bodies() {
        let (model, request) = parse_tokenize(br#"{"model":"m","prompt":"hi"}"#).unwrap();
        assert_eq!(model.as_deref(), Some("m"));
        assert_eq!(
            request,
            TokenizeRequest::Prompt {
                prompt: "hi".into(),
                add_special_tokens: true
            }
        );
        assert!(matches!(
            parse_tokenize(br#"{"messages":[{"role":"user","content":"x"}]}"#)
                .unwrap()
                .1,
            TokenizeRequest::Chat { .. }
        ));
        let err = parse_tokenize(br#"{"prompt":"a","extra":1}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("extra"));
        assert_eq!(
            parse_detokenize(br#"{"tokens":[1,2]}"#).unwrap().1,
            vec![1, 2]
        );
    }
}
