//! gpt-oss (`GptOssForCausalLM`): the settings of its `config.json` that no other architecture
//! has, and the tensors of its experts, which it stores per layer for all experts at once, in
//! MXFP4 (`*_blocks` and `*_scales`, `quantization_config.quant_method` `mxfp4`) or in the
//! dequantized layout transformers saves (`gate_up_proj` `[E, hidden, 2·I]`, `down_proj`
//! `[E, I, hidden]`), each with a bias. The gate and up projections are interleaved: output
//! feature `2j` of `gate_up_proj` is gate feature `j`, `2j + 1` up feature `j`.

use serde_json::Value;

use super::config::Architecture;
use super::error::ModelError;
use super::json::JsonObject;
use super::mxfp4;
use super::tensors::{LinearTensors, Packed, TensorSpec};
use super::weights::ModelWeights;

/// The default `alpha` of gpt-oss's SwiGLU, `gate · sigmoid(alpha · gate)` (`swiglu_alpha`).
pub const SWIGLU_ALPHA: f64 = 1.702;

/// gpt-oss's own `config.json` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssConfig {
    /// Per layer, whether it attends within the sliding window (`layer_types`:
    /// `sliding_attention`) or over the whole context (`full_attention`).
    pub sliding_layers: Vec<bool>,
    /// The clamp of the experts' SwiGLU (`swiglu_limit`): gate at most `limit`, up within
    /// `±limit`.
    pub swiglu_limit: f32,
    /// The sigmoid's slope in the experts' SwiGLU (`swiglu_alpha`, 1.702).
    pub swiglu_alpha: f32,
    /// Whether the experts are stored in MXFP4 (`quantization_config.quant_method` `mxfp4`);
    /// otherwise in the dequantized 16- or 32-bit layout.
    pub mxfp4: bool,
}

impl GptOssConfig {
    /// gpt-oss's settings of `config`, or `None` for another architecture.
    pub(crate) fn from_config(
        architecture: Architecture,
        config: &JsonObject<'_>,
    ) -> Result<Option<Self>, ModelError> {
        if architecture != Architecture::GptOss {
            return Ok(None);
        }
        let layers = config.positive("num_hidden_layers")?;
        let sliding_layers = match config.get("layer_types") {
            // transformers' default: sliding and full alternating, layer 0 sliding.
            None | Some(Value::Null) => (0..layers).map(|i| i % 2 == 0).collect(),
            Some(Value::Array(types)) => {
                let kinds = types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(config.invalid(
                            "layer_types",
                            "expected `sliding_attention` or `full_attention` for every layer",
                        )),
                    })
                    .collect::<Result<Vec<bool>, ModelError>>()?;
                if kinds.len() != layers {
                    return Err(config.invalid(
                        "layer_types",
                        format!("{} entries for {layers} layers", kinds.len()),
                    ));
                }
                kinds
            }
            Some(_) => return Err(config.invalid("layer_types", "expected a list")),
        };
        if sliding_layers.iter().any(|&s| s) && config.opt_usize("sliding_window")?.is_none() {
            return Err(config.invalid(
                "sliding_window",
                "missing, and layer_types has sliding layers",
            ));
        }
        let swiglu_limit = config.opt_f64("swiglu_limit")?.unwrap_or(7.0);
        if !(swiglu_limit.is_finite() && swiglu_limit > 0.0) {
            return Err(config.invalid("swiglu_limit", "must be a positive number"));
        }
        let swiglu_alpha = config.opt_f64("swiglu_alpha")?.unwrap_or(SWIGLU_ALPHA);
        if !swiglu_alpha.is_finite() {
            return Err(config.invalid("swiglu_alpha", "must be a number"));
        }
        let mxfp4 = match config.object("quantization_config")? {
            None => false,
            Some(q) => match q.opt_str("quant_method")? {
                Some("mxfp4") => true,
                other => {
                    return Err(q.invalid(
                        "quant_method",
                        format!(
                            "gpt-oss experts are read in mxfp4 or unquantized, not `{}`",
                            other.unwrap_or("(missing)")
                        ),
                    ));
                }
            },
        };
        Ok(Some(Self {
            sliding_layers,
            swiglu_limit: swiglu_limit as f32,
            swiglu_alpha: swiglu_alpha as f32,
            mxfp4,
        }))
    }
}

/// How one projection of every expert is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpertStorage {
    /// MXFP4: `{name}_blocks` `[E, out, in/32, 16]` and `{name}_scales` `[E, out, in/32]`.
    Mxfp4 {
        /// The packed E2M1 values.
        blocks: TensorSpec,
        /// The E8M0 scales.
        scales: TensorSpec,
    },
    /// transformers' dequantized layout: `{name}` `[E, in, out]` (input-major, as its experts
    /// multiply `x · W`).
    InputMajor(TensorSpec),
}

/// One projection of every expert: its stored values and its bias `[E, out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertProjection {
    /// The projection as loaded, `[num_experts, out, in]`.
    pub shape: [usize; 3],
    /// How it is stored.
    pub storage: ExpertStorage,
    /// The bias, `{name}_bias` `[E, out]`.
    pub bias: TensorSpec,
}

impl ExpertProjection {
    /// The projection `{experts}.{name}` of `shape` `[E, out, in]`, in MXFP4 or not.
    fn new(experts: &str, name: &str, shape: [usize; 3], mxfp4: bool) -> Self {
        let [count, out, inp] = shape;
        let storage = if mxfp4 {
            let groups = inp.div_ceil(mxfp4::BLOCK_ELEMENTS);
            ExpertStorage::Mxfp4 {
                blocks: TensorSpec::packed(
                    format!("{experts}.{name}_blocks"),
                    &[count, out, groups, mxfp4::BLOCK_BYTES],
                    Packed::Mxfp4Blocks,
                ),
                scales: TensorSpec::packed(
                    format!("{experts}.{name}_scales"),
                    &[count, out, groups],
                    Packed::E8m0Scales,
                ),
            }
        } else {
            ExpertStorage::InputMajor(TensorSpec::new(
                format!("{experts}.{name}"),
                &[count, inp, out],
            ))
        };
        Self {
            shape,
            storage,
            bias: TensorSpec::new(format!("{experts}.{name}_bias"), &[count, out]),
        }
    }

    /// The stored tensors: values (and scales), then the bias.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = match &self.storage {
            ExpertStorage::Mxfp4 { blocks, scales } => vec![blocks, scales],
            ExpertStorage::InputMajor(weight) => vec![weight],
        };
        specs.push(&self.bias);
        specs
    }

    /// Every expert's matrix in f32, `[E, out, in]` row-major: MXFP4 dequantized (a NaN scale
    /// refused), the input-major layout transposed.
    pub fn to_f32(&self, weights: &ModelWeights) -> Result<Vec<f32>, ModelError> {
        let [count, out, inp] = self.shape;
        match &self.storage {
            ExpertStorage::Mxfp4 { blocks, scales } => {
                let values = mxfp4::dequantize(weights.packed(blocks)?, weights.packed(scales)?)
                    .map_err(|e| ModelError::InvalidTensor {
                        name: scales.name.clone(),
                        path: weights.file_of(&scales.name),
                        reason: e.to_string(),
                    })?;
                // Each row holds `groups · 32` values; a width not a multiple of 32 is padded.
                let padded = values.len() / (count * out);
                Ok(values
                    .chunks_exact(padded)
                    .flat_map(|row| row[..inp].iter().copied())
                    .collect())
            }
            ExpertStorage::InputMajor(weight) => {
                let stored = weights.check_spec(weight)?.to_f32();
                let mut values = vec![0.0f32; count * out * inp];
                for (e, (dst, src)) in values
                    .chunks_exact_mut(out * inp)
                    .zip(stored.chunks_exact(out * inp))
                    .enumerate()
                {
                    debug_assert!(e < count);
                    for i in 0..inp {
                        for o in 0..out {
                            dst[o * inp + i] = src[i * out + o];
                        }
                    }
                }
                Ok(values)
            }
        }
    }
}

/// A gpt-oss MLP's tensors, under `model.layers.{i}.mlp`.
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssMoeTensors {
    /// The router, `router.weight` `[E, hidden]`, 16-bit.
    pub router: LinearTensors,
    /// The router's bias, `router.bias` `[E]`.
    pub router_bias: TensorSpec,
    /// Gate and up, interleaved: `experts.gate_up_proj`, `[E, 2·I, hidden]` once loaded.
    pub gate_up: ExpertProjection,
    /// Down: `experts.down_proj`, `[E, hidden, I]` once loaded.
    pub down: ExpertProjection,
}

impl GptOssMoeTensors {
    /// The tensors of the MLP `module` with `num_experts` experts of width `inter`.
    pub(crate) fn new(
        module: &str,
        hidden: usize,
        num_experts: usize,
        inter: usize,
        mxfp4: bool,
    ) -> Self {
        let experts = format!("{module}.experts");
        Self {
            router: LinearTensors::unquantized(&format!("{module}.router"), num_experts, hidden),
            router_bias: TensorSpec::new(format!("{module}.router.bias"), &[num_experts]),
            gate_up: ExpertProjection::new(
                &experts,
                "gate_up_proj",
                [num_experts, 2 * inter, hidden],
                mxfp4,
            ),
            down: ExpertProjection::new(&experts, "down_proj", [num_experts, hidden, inter], mxfp4),
        }
    }

    /// Every tensor of the MLP.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = self.router.all();
        specs.push(&self.router_bias);
        specs.extend(self.gate_up.all());
        specs.extend(self.down.all());
        specs
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::ModelConfig;

    fn parse(extra: &str) -> Result<ModelConfig, ModelError> {
        let json = format!(
            r#"{{"architectures": ["GptOssForCausalLM"], "hidden_size": 64,
                "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
                "max_position_embeddings": 512, "num_local_experts": 8,
                "num_experts_per_tok": 2, "sliding_window": 8{extra}}}"#
        );
        ModelConfig::from_json(Path::new("m/config.json"), json.as_bytes())
    }

    #[test]
    fn reads_layer_types_limit_and_storage() {
        let c = parse(
            r#", "layer_types": ["full_attention", "sliding_attention", "full_attention",
                 "sliding_attention"], "swiglu_limit": 5.0,
                 "quantization_config": {"quant_method": "mxfp4",
                   "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}"#,
        )
        .unwrap();
        let g = c.gpt_oss.clone().unwrap();
        assert_eq!(g.sliding_layers, vec![false, true, false, true]);
        assert_eq!(g.swiglu_limit, 5.0);
        assert!(g.mxfp4);
        assert_eq!(c.quantization, None);
        assert!(c.served_format().starts_with("mxfp4 experts"));
        let moe = c.moe.unwrap();
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.expert_intermediate),
            (8, 2, 32)
        );
        assert_eq!(c.sliding_window, Some(8));

        let g = parse("").unwrap().gpt_oss.unwrap();
        assert_eq!(g.sliding_layers, vec![true, false, true, false]);
        assert_eq!(g.swiglu_limit, 7.0);
        assert_eq!(g.swiglu_alpha, 1.702);
        assert!(!g.mxfp4);
        assert_eq!(parse("").unwrap().served_format(), "unquantized");
    }

    #[test]
    fn bad_settings_are_named() {
        for (extra, field) in [
            (r#", "layer_types": ["full_attention"]"#, "layer_types"),
            (
                r#", "layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]"#,
                "layer_types",
            ),
            (r#", "swiglu_limit": -1.0"#, "swiglu_limit"),
            (
                r#", "quantization_config": {"quant_method": "fp8"}"#,
                "quant_method",
            ),
        ] {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(field), "{extra}: {err}");
        }
    }

    #[test]
    fn expert_tensors_are_named_as_published() {
        let t = GptOssMoeTensors::new("model.layers.3.mlp", 64, 8, 32, true);
        let names: Vec<(&str, &[usize])> = t
            .all()
            .iter()
            .map(|s| (s.name.as_str(), s.shape.as_slice()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("model.layers.3.mlp.router.weight", &[8, 64][..]),
                ("model.layers.3.mlp.router.bias", &[8][..]),
                (
                    "model.layers.3.mlp.experts.gate_up_proj_blocks",
                    &[8, 64, 2, 16][..]
                ),
                (
                    "model.layers.3.mlp.experts.gate_up_proj_scales",
                    &[8, 64, 2][..]
                ),
                ("model.layers.3.mlp.experts.gate_up_proj_bias", &[8, 64][..]),
                (
                    "model.layers.3.mlp.experts.down_proj_blocks",
                    &[8, 64, 1, 16][..]
                ),
                (
                    "model.layers.3.mlp.experts.down_proj_scales",
                    &[8, 64, 1][..]
                ),
                ("model.layers.3.mlp.experts.down_proj_bias", &[8, 64][..]),
            ]
        );
        let t = GptOssMoeTensors::new("model.layers.0.mlp", 64, 8, 32, false);
        assert_eq!(
            t.gate_up.storage,
            ExpertStorage::InputMajor(TensorSpec::new(
                "model.layers.0.mlp.experts.gate_up_proj".into(),
                &[8, 64, 64]
            ))
        );
        assert_eq!(t.down.all()[0].shape, vec![8, 32, 64]);
    }
}
