//! `quantization_config`: how a checkpoint's projections are stored, as its publisher wrote it.
//!
//! Three FP8 forms are read, each as published:
//! - `compressed-tensors` float quantization (RedHatAI's `*-FP8` and `*-FP8-dynamic`): per-tensor,
//!   per-channel or block weight scales (`weight_scale`), and static per-tensor (`input_scale`),
//!   dynamic per-token or no activation quantization; modules in `ignore` stay 16-bit;
//! - `fbgemm_fp8` (Meta's FP8 Llama): per-channel weight scales, dynamic per-token activations
//!   capped at `activation_scale_ub`; `modules_to_not_convert` stay 16-bit;
//! - `fp8` with `weight_block_size` (Qwen3's and DeepSeek's `*-FP8`): block-wise scales
//!   (`weight_scale_inv`), dynamic activations per token and group of a block's width.
//!
//! Any other method is refused at load with one line naming it. `--quantization fp8` turns a
//! 16-bit checkpoint into FP8 at load ([`Quantization::fp8_at_load`]).

use serde_json::Value;

use super::error::ModelError;
use super::fp8::{ActivationScale, WeightScale};
use super::json::JsonObject;

/// The quantization methods read.
pub const SUPPORTED_METHODS: &str = "compressed-tensors (FP8 float), fbgemm_fp8, fp8";

/// A format to quantize a 16-bit checkpoint to when it is loaded (`--quantization`,
/// `[model] quantization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantizeAtLoad {
    /// FP8 E4M3 with per-channel weight scales and dynamic per-token activation scales.
    Fp8,
}

impl QuantizeAtLoad {
    /// Its name in the configuration and in the evidence.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp8 => "fp8",
        }
    }

    /// The scheme the projections are served in: a checkpoint already in FP8 keeps its own.
    pub fn apply(self, config: &mut super::ModelConfig) {
        match self {
            Self::Fp8 => {
                if config.quantization.is_none() {
                    config.quantization = Some(Quantization::fp8_at_load());
                }
            }
        }
    }
}

/// Where a scheme came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizationMethod {
    /// `compressed-tensors`, float quantization of 8 bits.
    CompressedTensors,
    /// `fbgemm_fp8`.
    FbgemmFp8,
    /// `fp8` (block-wise or per-tensor scales, `weight_scale_inv`).
    Fp8,
    /// A 16-bit checkpoint quantized when loaded (`--quantization fp8`).
    AtLoad,
}

impl QuantizationMethod {
    /// The `quant_method` name (or `at-load`).
    pub fn name(self) -> &'static str {
        match self {
            Self::CompressedTensors => "compressed-tensors",
            Self::FbgemmFp8 => "fbgemm_fp8",
            Self::Fp8 => "fp8",
            Self::AtLoad => "at-load",
        }
    }
}

/// Which modules stay 16-bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// compressed-tensors' `ignore`: exact module names, or `re:`-prefixed regular expressions
    /// matched against the whole name.
    NamesOrPatterns(Vec<String>),
    /// `modules_to_not_convert`: a module stays 16-bit when its name contains any entry (as
    /// transformers matches them).
    Substrings(Vec<String>),
}

impl Ignored {
    /// Whether the module `name` (e.g. `model.layers.0.self_attn.q_proj`, `lm_head`) stays
    /// 16-bit.
    pub fn covers(&self, name: &str) -> bool {
        match self {
            Self::NamesOrPatterns(entries) => {
                entries.iter().any(|entry| match entry.strip_prefix("re:") {
                    Some(pattern) => regex::Regex::new(&format!("^(?:{pattern})$"))
                        .is_ok_and(|re| re.is_match(name)),
                    None => entry == name,
                })
            }
            Self::Substrings(entries) => entries.iter().any(|entry| name.contains(entry.as_str())),
        }
    }
}

/// An FP8 scheme for the model's linear projections.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantization {
    /// The published method.
    pub method: QuantizationMethod,
    /// The layout of each weight matrix's scales.
    pub weights: WeightScale,
    /// How a product's input is quantized.
    pub activations: ActivationScale,
    /// Modules that stay 16-bit.
    pub ignored: Ignored,
}

impl Quantization {
    /// `--quantization fp8`: per-channel weight scales computed at load, dynamic per-token
    /// activations; the LM head stays 16-bit (as the published FP8 checkpoints keep it).
    pub fn fp8_at_load() -> Self {
        Self {
            method: QuantizationMethod::AtLoad,
            weights: WeightScale::Channel,
            activations: ActivationScale::DynamicPerToken { upper_bound: None },
            ignored: Ignored::NamesOrPatterns(vec!["lm_head".into()]),
        }
    }

    /// Whether the linear module `name` is stored in FP8.
    pub fn quantizes(&self, name: &str) -> bool {
        !self.ignored.covers(name)
    }

    /// Whether the checkpoint holds the FP8 values and their scales (not quantized at load).
    pub fn in_checkpoint(&self) -> bool {
        self.method != QuantizationMethod::AtLoad
    }

    /// The name of the weight-scale tensor of module `name` in the checkpoint.
    pub fn scale_tensor(&self, module: &str) -> String {
        match self.method {
            QuantizationMethod::Fp8 => format!("{module}.weight_scale_inv"),
            _ => format!("{module}.weight_scale"),
        }
    }

    /// The name of the static input-scale tensor of module `name`, when the scheme has one.
    pub fn input_scale_tensor(&self, module: &str) -> Option<String> {
        (self.activations == ActivationScale::StaticPerTensor)
            .then(|| format!("{module}.input_scale"))
    }

    /// The served format in words, for the banner, `/v1/models` and the evidence: e.g.
    /// `fp8-e4m3 (compressed-tensors; weights per channel; activations dynamic per token)`.
    pub fn describe(&self) -> String {
        let weights = match self.weights {
            WeightScale::Tensor => "per tensor".to_owned(),
            WeightScale::Channel => "per channel".to_owned(),
            WeightScale::Block { rows, cols } => format!("per {rows}x{cols} block"),
        };
        let activations = match self.activations {
            ActivationScale::None => "16-bit (weight-only)".to_owned(),
            ActivationScale::DynamicPerToken { upper_bound: None } => {
                "dynamic per token".to_owned()
            }
            ActivationScale::DynamicPerToken {
                upper_bound: Some(ub),
            } => format!("dynamic per token, capped at {ub}"),
            ActivationScale::DynamicPerTokenGroup { group } => {
                format!("dynamic per token and {group} features")
            }
            ActivationScale::StaticPerTensor => "static per tensor".to_owned(),
        };
        format!(
            "fp8-e4m3 ({}; weights {weights}; activations {activations})",
            self.method.name()
        )
    }

    /// Reads `config.json`'s `quantization_config` (absent or null: a 16-bit checkpoint).
    pub(crate) fn from_config(config: &JsonObject<'_>) -> Result<Option<Self>, ModelError> {
        let Some(q) = config.object("quantization_config")? else {
            return Ok(None);
        };
        let method = q
            .opt_str("quant_method")?
            .ok_or_else(|| q.invalid("quant_method", "missing"))?;
        let scheme = match method {
            "compressed-tensors" => compressed_tensors(&q)?,
            "fbgemm_fp8" => Self {
                method: QuantizationMethod::FbgemmFp8,
                weights: WeightScale::Channel,
                activations: ActivationScale::DynamicPerToken {
                    upper_bound: q
                        .opt_f64("activation_scale_ub")?
                        .map(|ub| ub as f32)
                        .filter(|ub| ub.is_finite() && *ub > 0.0),
                },
                ignored: Ignored::Substrings(strings(&q, "modules_to_not_convert")?),
            },
            "fp8" => block_fp8(&q)?,
            other => {
                return Err(q.invalid(
                    "quant_method",
                    format!("unsupported quantization `{other}` (supported: {SUPPORTED_METHODS})"),
                ));
            }
        };
        Ok(Some(scheme))
    }
}

/// `fp8`: `fmt` e4m3, block-wise scales when `weight_block_size` is given (dynamic activations
/// per token and block-width group), else one scale per tensor with `activation_scheme` dynamic
/// (per token) or static (`input_scale`).
fn block_fp8(q: &JsonObject<'_>) -> Result<Quantization, ModelError> {
    if let Some(fmt) = q.opt_str("fmt")?
        && fmt != "e4m3"
    {
        return Err(q.invalid("fmt", format!("unsupported FP8 format `{fmt}` (only e4m3)")));
    }
    let scheme = q.opt_str("activation_scheme")?.unwrap_or("dynamic");
    let block = match q.get("weight_block_size") {
        None => None,
        Some(Value::Array(dims)) => match dims.as_slice() {
            [rows, cols] => match (rows.as_u64(), cols.as_u64()) {
                (Some(rows), Some(cols)) if rows > 0 && cols > 0 => {
                    Some((rows as usize, cols as usize))
                }
                _ => return Err(q.invalid("weight_block_size", "expected two positive integers")),
            },
            _ => return Err(q.invalid("weight_block_size", "expected [rows, cols]")),
        },
        Some(_) => return Err(q.invalid("weight_block_size", "expected [rows, cols]")),
    };
    let (weights, activations) = match (block, scheme) {
        (Some((rows, cols)), "dynamic") => (
            WeightScale::Block { rows, cols },
            ActivationScale::DynamicPerTokenGroup { group: cols },
        ),
        (Some(_), other) => {
            return Err(q.invalid(
                "activation_scheme",
                format!("`{other}` with block-wise weights (only dynamic)"),
            ));
        }
        (None, "dynamic") => (
            WeightScale::Tensor,
            ActivationScale::DynamicPerToken { upper_bound: None },
        ),
        (None, "static") => (WeightScale::Tensor, ActivationScale::StaticPerTensor),
        (None, other) => {
            return Err(q.invalid(
                "activation_scheme",
                format!("unsupported `{other}` (dynamic or static)"),
            ));
        }
    };
    Ok(Quantization {
        method: QuantizationMethod::Fp8,
        weights,
        activations,
        ignored: Ignored::Substrings(strings(q, "modules_to_not_convert")?),
    })
}

/// compressed-tensors: one config group targeting `Linear`, 8-bit float weights.
fn compressed_tensors(q: &JsonObject<'_>) -> Result<Quantization, ModelError> {
    let groups = q
        .object("config_groups")?
        .ok_or_else(|| q.invalid("config_groups", "missing"))?;
    let Some(Value::Object(map)) = q.get("config_groups") else {
        return Err(q.invalid("config_groups", "expected an object"));
    };
    let [name] = map.keys().collect::<Vec<_>>()[..] else {
        return Err(q.invalid(
            "config_groups",
            format!(
                "{} groups (only one group, over every Linear, is supported)",
                map.len()
            ),
        ));
    };
    let group = groups
        .object(name)?
        .ok_or_else(|| groups.invalid(name, "expected an object"))?;
    let targets = strings(&group, "targets")?;
    if targets != ["Linear"] {
        return Err(group.invalid(
            "targets",
            format!("{targets:?} (only [\"Linear\"] is supported)"),
        ));
    }
    let w = group
        .object("weights")?
        .ok_or_else(|| group.invalid("weights", "missing"))?;
    float8(&w)?;
    if w.opt_bool("dynamic")? == Some(true) {
        return Err(w.invalid("dynamic", "dynamic weight scales are not supported"));
    }
    let weights = match w.opt_str("strategy")?.unwrap_or("tensor") {
        "tensor" => WeightScale::Tensor,
        "channel" => WeightScale::Channel,
        "block" => match w.get("block_structure") {
            Some(Value::Array(dims)) if dims.len() == 2 => {
                match (dims[0].as_u64(), dims[1].as_u64()) {
                    (Some(rows), Some(cols)) if rows > 0 && cols > 0 => WeightScale::Block {
                        rows: rows as usize,
                        cols: cols as usize,
                    },
                    _ => return Err(w.invalid("block_structure", "expected two positive integers")),
                }
            }
            _ => return Err(w.invalid("block_structure", "expected [rows, cols]")),
        },
        other => {
            return Err(w.invalid(
                "strategy",
                format!("unsupported weight strategy `{other}` (tensor, channel or block)"),
            ));
        }
    };
    let activations = match group.object("input_activations")? {
        None => ActivationScale::None,
        Some(a) => {
            float8(&a)?;
            let dynamic = a.opt_bool("dynamic")?.unwrap_or(false);
            match (a.opt_str("strategy")?.unwrap_or("tensor"), dynamic) {
                ("token", true) => ActivationScale::DynamicPerToken { upper_bound: None },
                ("tensor", false) => ActivationScale::StaticPerTensor,
                ("group", true) => ActivationScale::DynamicPerTokenGroup {
                    group: a.positive("group_size")?,
                },
                (strategy, dynamic) => {
                    return Err(a.invalid(
                        "strategy",
                        format!(
                            "unsupported activation strategy `{strategy}` with dynamic {dynamic} (token dynamic, tensor static or group dynamic)"
                        ),
                    ));
                }
            }
        }
    };
    Ok(Quantization {
        method: QuantizationMethod::CompressedTensors,
        weights,
        activations,
        ignored: Ignored::NamesOrPatterns(strings(q, "ignore")?),
    })
}

/// Checks a compressed-tensors quantization args object is 8-bit float.
fn float8(args: &JsonObject<'_>) -> Result<(), ModelError> {
    let bits = args.usize("num_bits")?;
    let kind = args.opt_str("type")?.unwrap_or("int");
    if bits != 8 || kind != "float" {
        return Err(args.invalid(
            "type",
            format!("{bits}-bit {kind} quantization is not supported (only 8-bit float)"),
        ));
    }
    Ok(())
}

/// An optional list of strings (absent: empty).
fn strings(object: &JsonObject<'_>, field: &str) -> Result<Vec<String>, ModelError> {
    match object.get(field) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| object.invalid(field, "expected a list of strings"))
            })
            .collect(),
        Some(_) => Err(object.invalid(field, "expected a list of strings")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::json::parse_object;

    fn parse(quantization: &str) -> Result<Option<Quantization>, ModelError> {
        let json = format!(r#"{{"quantization_config": {quantization}}}"#);
        let map = parse_object(Path::new("m/config.json"), json.as_bytes()).unwrap();
        Quantization::from_config(&JsonObject::new(Path::new("m/config.json"), &map))
    }

    /// RedHatAI's `*-FP8-dynamic` form.
    #[test]
    fn compressed_tensors_channel_dynamic() {
        let q = parse(
            r#"{"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"],
                  "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true, "dynamic": true}}},
                "ignore": ["lm_head", "re:.*mlp\\.gate$"]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.method, QuantizationMethod::CompressedTensors);
        assert_eq!(q.weights, WeightScale::Channel);
        assert_eq!(
            q.activations,
            ActivationScale::DynamicPerToken { upper_bound: None }
        );
        assert!(!q.quantizes("lm_head"));
        assert!(!q.quantizes("model.layers.3.mlp.gate"));
        assert!(q.quantizes("model.layers.3.mlp.gate_proj"));
        assert_eq!(
            q.scale_tensor("model.layers.0.self_attn.q_proj"),
            "model.layers.0.self_attn.q_proj.weight_scale"
        );
        assert_eq!(q.input_scale_tensor("x"), None);
    }

    /// RedHatAI's static `*-FP8` form, and the weight-only form.
    #[test]
    fn compressed_tensors_static_and_weight_only() {
        let q = parse(
            r#"{"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
                  "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false}}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (q.weights, q.activations),
            (WeightScale::Tensor, ActivationScale::StaticPerTensor)
        );
        assert_eq!(q.input_scale_tensor("m").as_deref(), Some("m.input_scale"));
        let q = parse(
            r#"{"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
                  "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                  "input_activations": null}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.activations, ActivationScale::None);
    }

    #[test]
    fn fbgemm_and_block_fp8() {
        let q = parse(
            r#"{"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (q.weights, q.activations),
            (
                WeightScale::Channel,
                ActivationScale::DynamicPerToken {
                    upper_bound: Some(1200.0)
                }
            )
        );
        assert!(!q.quantizes("lm_head") && q.quantizes("model.layers.0.mlp.up_proj"));

        let q = parse(
            r#"{"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            q.weights,
            WeightScale::Block {
                rows: 128,
                cols: 128
            }
        );
        assert_eq!(
            q.activations,
            ActivationScale::DynamicPerTokenGroup { group: 128 }
        );
        assert_eq!(q.scale_tensor("m"), "m.weight_scale_inv");
        assert!(
            q.describe().contains("per 128x128 block"),
            "{}",
            q.describe()
        );
    }

    #[test]
    fn other_methods_and_shapes_are_refused_in_one_line() {
        let refusals = [
            (
                r#"{"quant_method": "awq", "bits": 4}"#,
                "unsupported quantization `awq`",
            ),
            (r#"{"quant_method": "gptq"}"#, SUPPORTED_METHODS),
            (r#"{"bits": 4}"#, "quant_method"),
            (
                r#"{"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
                   "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}"#,
                "4-bit int quantization is not supported",
            ),
            (
                r#"{"quant_method": "fp8", "fmt": "e5m2"}"#,
                "unsupported FP8 format `e5m2`",
            ),
            (
                r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}"#,
                "only dynamic",
            ),
        ];
        for (config, expected) in refusals {
            let err = parse(config).unwrap_err().to_string();
            assert!(err.contains(expected), "{config}: {err}");
            assert!(
                err.contains("m/config.json") && !err.contains('\n'),
                "{err}"
            );
        }
        assert_eq!(parse("null").unwrap(), None);
    }
}
