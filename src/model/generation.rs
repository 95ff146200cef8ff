//! `generation_config.json`: the model's default sampling parameters and EOS tokens.

use std::path::Path;

use super::error::ModelError;
use super::json::{JsonObject, parse_object};

/// Defaults from `generation_config.json`; every field is optional there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// Tokens that end generation (`eos_token_id`, one id or a list).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// Whether the model samples by default (`false`: greedy, whatever the temperature says).
    pub do_sample: Option<bool>,
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default nucleus-sampling mass.
    pub top_p: Option<f32>,
    /// Default top-k cut-off.
    pub top_k: Option<u32>,
    /// Default min-p threshold.
    pub min_p: Option<f32>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
}

impl GenerationDefaults {
    /// Parses the `generation_config.json` at `path`.
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Self, ModelError> {
        let map = parse_object(path, bytes)?;
        let config = JsonObject::new(path, &map);
        let top_k = match config.opt_usize("top_k")? {
            None => None,
            Some(k) => Some(u32::try_from(k).map_err(|_| config.invalid("top_k", "too large"))?),
        };
        Ok(Self {
            eos_token_ids: config.token_ids("eos_token_id")?,
            bos_token_id: config.opt_token_id("bos_token_id")?,
            do_sample: config.opt_bool("do_sample")?,
            temperature: non_negative(&config, "temperature")?,
            top_p: non_negative(&config, "top_p")?,
            top_k,
            min_p: non_negative(&config, "min_p")?,
            repetition_penalty: non_negative(&config, "repetition_penalty")?,
        })
    }
}

/// An optional finite, non-negative number.
fn non_negative(config: &JsonObject<'_>, field: &str) -> Result<Option<f32>, ModelError> {
    match config.opt_f64(field)? {
        None => Ok(None),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(Some(v as f32)),
        Some(v) => Err(config.invalid(field, format!("must be a non-negative number, got {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<GenerationDefaults, ModelError> {
        GenerationDefaults::from_json(Path::new("generation_config.json"), json.as_bytes())
    }

    #[test]
    fn reads_all_fields() {
        let g = parse(
            r#"{"eos_token_id": [1, 2], "bos_token_id": 0, "do_sample": true, "temperature": 0.6,
                "top_p": 0.9, "top_k": 20, "min_p": 0, "repetition_penalty": 1.05}"#,
        )
        .unwrap();
        assert_eq!(g.eos_token_ids, vec![1, 2]);
        assert_eq!(g.bos_token_id, Some(0));
        assert_eq!(g.do_sample, Some(true));
        assert_eq!(g.temperature, Some(0.6));
        assert_eq!(g.top_p, Some(0.9));
        assert_eq!(g.top_k, Some(20));
        assert_eq!(g.min_p, Some(0.0));
        assert_eq!(g.repetition_penalty, Some(1.05));
    }

    #[test]
    fn everything_is_optional_and_eos_may_be_an_int() {
        assert_eq!(parse("{}").unwrap(), GenerationDefaults::default());
        assert_eq!(
            parse(r#"{"eos_token_id": 7}"#).unwrap().eos_token_ids,
            vec![7]
        );
    }

    #[test]
    fn rejects_bad_values_by_name() {
        let err = parse(r#"{"temperature": -1}"#).unwrap_err().to_string();
        assert!(
            err.contains("generation_config.json") && err.contains("temperature"),
            "{err}"
        );
        let err = parse(r#"{"eos_token_id": "x"}"#).unwrap_err().to_string();
        assert!(err.contains("eos_token_id"), "{err}");
    }
}
