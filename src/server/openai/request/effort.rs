//! The reasoning effort of a request (chat's `reasoning_effort`, Responses' `reasoning.effort`)
//! as chat-template arguments: `reasoning_effort` for templates that place it (gpt-oss's harmony
//! system message: low, medium or high; other values are the template's to refuse) and
//! `enable_thinking` for those that switch thinking on or off (Qwen3: off for `none` and
//! `minimal`). Arguments the request's `chat_template_kwargs` set are kept.

use serde_json::{Map, Value};

use crate::server::error::ApiError;

/// The efforts OpenAI's API names.
const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// Adds the template arguments of `effort` (the request field `param`) to `kwargs`.
pub fn effort_kwargs(
    effort: &Value,
    param: &str,
    kwargs: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let effort = match effort {
        Value::Null => return Ok(()),
        Value::String(effort) if EFFORTS.contains(&effort.as_str()) => effort,
        _ => {
            return Err(ApiError::invalid_param(
                param,
                format!("{param} must be none, minimal, low, medium, high or xhigh"),
            ));
        }
    };
    let off = matches!(effort.as_str(), "none" | "minimal");
    kwargs.entry("enable_thinking").or_insert(Value::Bool(!off));
    kwargs
        .entry("reasoning_effort")
        .or_insert_with(|| Value::String(effort.clone()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn efforts_become_template_arguments_and_others_are_refused() {
        let mut kwargs = Map::new();
        effort_kwargs(&json!("high"), "reasoning_effort", &mut kwargs).unwrap();
        assert_eq!(
            Value::Object(kwargs),
            json!({"enable_thinking": true, "reasoning_effort": "high"})
        );
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), json!(true));
        effort_kwargs(&json!("minimal"), "reasoning.effort", &mut kwargs).unwrap();
        assert_eq!(
            Value::Object(kwargs),
            json!({"enable_thinking": true, "reasoning_effort": "minimal"})
        );
        let err = effort_kwargs(&json!("max"), "reasoning_effort", &mut Map::new()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("reasoning_effort"));
        let mut kwargs = Map::new();
        effort_kwargs(&Value::Null, "reasoning_effort", &mut kwargs).unwrap();
        assert!(kwargs.is_empty());
    }
}
