//! YaRN rotary scaling (`rope_type` `yarn`, gpt-oss's): the rotary dimensions that turn fewer
//! than `beta_slow` times over the original context are interpolated (frequency divided by
//! `factor`), those that turn more than `beta_fast` times are kept, and a linear ramp blends the
//! band between; cos and sin are then multiplied by the attention factor, `0.1·ln(factor) + 1`
//! unless the configuration gives it. The arithmetic follows transformers'
//! `_compute_yarn_parameters`: Python floats in f64, tensors in f32.

use super::error::ModelError;
use super::json::JsonObject;

/// YaRN's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    /// The context extension factor.
    pub factor: f64,
    /// The context length the model was trained with before scaling.
    pub original_max_position_embeddings: usize,
    /// Rotations above which a dimension is kept (extrapolated), 32 by default.
    pub beta_fast: f64,
    /// Rotations below which a dimension is fully interpolated, 1 by default.
    pub beta_slow: f64,
    /// Whether the band's bounds are rounded outwards to whole dimensions (`truncate`, default
    /// true; gpt-oss says false).
    pub truncate: bool,
    /// The factor cos and sin are multiplied by.
    pub attention_factor: f64,
}

/// YaRN's `mscale`: `0.1 · mscale · ln(scale) + 1`, or 1 for a scale of at most 1.
fn get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl Yarn {
    /// Reads a `rope_scaling` or `rope_parameters` object of type `yarn`.
    pub(crate) fn from_object(obj: &JsonObject<'_>) -> Result<Self, ModelError> {
        let positive = |field: &str, default: Option<f64>| -> Result<f64, ModelError> {
            let value = match (obj.opt_f64(field)?, default) {
                // transformers reads `beta_fast or 32`: a zero takes the default too.
                (Some(0.0), Some(d)) => d,
                (Some(v), _) => v,
                (None, Some(d)) => d,
                (None, None) => return Err(obj.invalid(field, "missing")),
            };
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(obj.invalid(field, format!("must be a positive number, got {value}")))
            }
        };
        let factor = positive("factor", None)?;
        let attention_factor = match obj.opt_f64("attention_factor")? {
            Some(a) if a.is_finite() && a > 0.0 => a,
            Some(a) => {
                return Err(obj.invalid(
                    "attention_factor",
                    format!("must be a positive number, got {a}"),
                ));
            }
            None => match (obj.opt_f64("mscale")?, obj.opt_f64("mscale_all_dim")?) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    get_mscale(factor, m) / get_mscale(factor, all)
                }
                _ => get_mscale(factor, 1.0),
            },
        };
        Ok(Self {
            factor,
            original_max_position_embeddings: obj.positive("original_max_position_embeddings")?,
            beta_fast: positive("beta_fast", Some(32.0))?,
            beta_slow: positive("beta_slow", Some(1.0))?,
            truncate: obj.opt_bool("truncate")?.unwrap_or(true),
            attention_factor,
        })
    }

    /// The inverse frequencies of a `head_dim`-wide head with base `theta`.
    pub fn inv_freqs(&self, theta: f64, head_dim: usize) -> Vec<f32> {
        let dim = head_dim as f64;
        let original = self.original_max_position_embeddings as f64;
        let correction_dim = |rotations: f64| {
            (dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        if self.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let mut high = high.min(dim - 1.0);
        if low == high {
            high += 0.001;
        }
        let (low32, span32) = (low as f32, (high - low) as f32);
        let factor = self.factor as f32;
        (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                let pos_freq = theta.powf(f64::from(exponent)) as f32;
                let extrapolation = 1.0 / pos_freq;
                let interpolation = 1.0 / (factor * pos_freq);
                let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interpolation * (1.0 - keep) + extrapolation * keep
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::model::{ModelConfig, RopeScaling};

    /// gpt-oss's settings (theta 150000, head_dim 64; factor 32 over 4096 positions, betas 32
    /// and 1, no truncation): `inv_freq` and `attention_scaling` as transformers 5.25 computes
    /// them (`_compute_yarn_parameters` on CPU, printed as f32).
    #[test]
    fn gpt_oss_yarn_matches_transformers() {
        let json = r#"{"architectures": ["GptOssForCausalLM"], "hidden_size": 64,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "head_dim": 64, "vocab_size": 10, "max_position_embeddings": 131072,
            "sliding_window": 128, "num_local_experts": 4, "rope_theta": 150000.0,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
              "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false}}"#;
        let config = ModelConfig::from_json(Path::new("config.json"), json.as_bytes()).unwrap();
        let RopeScaling::Yarn(yarn) = &config.rope.scaling else {
            panic!("{:?}", config.rope.scaling)
        };
        assert!(!yarn.truncate);
        assert_eq!(config.rope.attention_factor(), GPT_OSS_ATTENTION_FACTOR);
        let ours = config.rope.inv_freqs(64);
        assert_eq!(ours.len(), GPT_OSS_INV_FREQ.len());
        for (i, (a, b)) in ours.iter().zip(GPT_OSS_INV_FREQ).enumerate() {
            assert!(a.to_bits().abs_diff(b.to_bits()) <= 1, "{i}: {a} vs {b}");
        }
    }

    const GPT_OSS_ATTENTION_FACTOR: f32 = 1.346_573_6;
    #[allow(clippy::excessive_precision)]
    const GPT_OSS_INV_FREQ: [f32; 32] = [
        1.0,
        0.6890442967414856,
        0.4747820496559143,
        0.32714587450027466,
        0.22541800141334534,
        0.15532298386096954,
        0.1070244237780571,
        0.07374456524848938,
        0.05081327259540558,
        0.031705696135759354,
        0.019334999844431877,
        0.011592049151659012,
        0.006794959306716919,
        0.0038603590801358223,
        0.002093792660161853,
        0.00105260219424963,
        0.0004564839182421565,
        0.00012931869423482567,
        3.830881178146228e-05,
        2.6396468456368893e-05,
        1.818833698052913e-05,
        1.253256959898863e-05,
        8.635495760245249e-06,
        5.95023948335438e-06,
        4.099978468730114e-06,
        2.8250667583051836e-06,
        1.9465962850517826e-06,
        1.3412909538601525e-06,
        9.242089618055616e-07,
        6.368209142237902e-07,
        4.38797854940276e-07,
        3.023511396804679e-07,
    ];
}
