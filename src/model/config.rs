//! `config.json`: the architecture and shapes of a model.

use std::path::Path;

use serde_json::Value;

use super::error::ModelError;
use super::gpt_oss::GptOssConfig;
use super::json::{JsonObject, parse_object};
use super::moe::MoeConfig;
use super::quantization::Quantization;

/// The model families the engine runs. All are decoder-only transformers with RMSNorm, rotary
/// position embeddings, grouped-query attention and SwiGLU MLPs (dense, or a mixture of SwiGLU
/// experts); they differ in the details named on each variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2 and 3.x, including llama3 rope scaling).
    Llama,
    /// `MistralForCausalLM` (Llama layout; sliding-window attention when configured).
    Mistral,
    /// `Qwen2ForCausalLM` (bias on the q, k and v projections).
    Qwen2,
    /// `Qwen3ForCausalLM` (per-head RMSNorm on q and k, explicit `head_dim`).
    Qwen3,
    /// `Qwen3MoeForCausalLM` (Qwen3's attention; a mixture of experts in the sparse layers).
    Qwen3Moe,
    /// `Qwen2MoeForCausalLM` (Qwen2's attention; a mixture of experts with a gated shared
    /// expert in the sparse layers).
    Qwen2Moe,
    /// `MixtralForCausalLM` (Mistral's attention; a mixture of experts in every layer).
    Mixtral,
    /// `GptOssForCausalLM` (biased attention with per-head sinks, sliding and full layers
    /// alternating, YaRN rope; a mixture of biased experts with a clamped SwiGLU, in MXFP4 or
    /// bf16: `gpt_oss.rs`).
    GptOss,
}

/// Rotary position embedding settings, normalised from either the legacy form (`rope_theta` and
/// `rope_scaling` at the top level) or the transformers 5 form (`rope_parameters`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// The base of the rotary frequencies.
    pub theta: f64,
    /// How the frequencies are rescaled for long contexts.
    pub scaling: RopeScaling,
}

/// Frequency rescaling schemes for rotary embeddings.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Linear position interpolation: every frequency is divided by `factor`.
    Linear {
        /// The interpolation factor.
        factor: f64,
    },
    /// The Llama 3.1 scheme: low frequencies are divided by `factor`, high ones kept, and the
    /// band between interpolated smoothly.
    Llama3 {
        /// The scaling factor for low frequencies.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was trained with before scaling.
        original_max_position_embeddings: usize,
    },
    /// YaRN: frequencies above the band set by `beta_fast`/`beta_slow` kept, below it divided by
    /// `factor`, a linear ramp between; cos and sin scaled by the attention factor (`yarn.rs`).
    Yarn(super::yarn::Yarn),
}

/// The parsed, validated `config.json` of a supported model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model family.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Number of rows in the embedding and LM-head matrices.
    pub vocab_size: usize,
    /// The longest context the model supports.
    pub max_position_embeddings: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Rotary embedding settings.
    pub rope: RopeConfig,
    /// Whether the LM head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// The weights have no LM head: a sentence-transformers embedding model published without
    /// one (Qwen3-Embedding). Not read from `config.json`: the loader sets it from the weights.
    /// Such a model serves embeddings only; generation is refused.
    pub headless: bool,
    /// `attention_bias`: whether the q, k and v projections carry a bias where the architecture
    /// does not imply one (the model definition decides, `definition.rs`).
    pub attention_bias: bool,
    /// Sliding-window attention span, when the model uses one.
    pub sliding_window: Option<usize>,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens named by the config.
    pub eos_token_ids: Vec<u32>,
    /// How the checkpoint stores its projections (`quantization_config`); `None`: 16-bit.
    pub quantization: Option<Quantization>,
    /// The experts of a mixture-of-experts architecture; `None` for a dense one.
    pub moe: Option<MoeConfig>,
    /// gpt-oss's own settings (layer types, SwiGLU limit, expert storage); `None` for every
    /// other architecture.
    pub gpt_oss: Option<GptOssConfig>,
}

impl Architecture {
    /// The architecture named by a `config.json` `architectures` entry, if supported.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "LlamaForCausalLM" => Some(Self::Llama),
            "MistralForCausalLM" => Some(Self::Mistral),
            "Qwen2ForCausalLM" => Some(Self::Qwen2),
            "Qwen3ForCausalLM" => Some(Self::Qwen3),
            "Qwen3MoeForCausalLM" => Some(Self::Qwen3Moe),
            "Qwen2MoeForCausalLM" => Some(Self::Qwen2Moe),
            "MixtralForCausalLM" => Some(Self::Mixtral),
            "GptOssForCausalLM" => Some(Self::GptOss),
            _ => None,
        }
    }

    /// The architecture implied by a `config.json` `model_type`, for configs without
    /// `architectures`.
    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "mistral" => Some(Self::Mistral),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            "qwen3_moe" => Some(Self::Qwen3Moe),
            "qwen2_moe" => Some(Self::Qwen2Moe),
            "mixtral" => Some(Self::Mixtral),
            "gpt_oss" => Some(Self::GptOss),
            _ => None,
        }
    }

    /// The Hugging Face class name of the architecture.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
            Self::Mixtral => "MixtralForCausalLM",
            Self::GptOss => "GptOssForCausalLM",
        }
    }
}

/// The RoPE base transformers uses when a config names none.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

impl RopeConfig {
    /// Reads the rotary settings of `config`: the transformers 5 `rope_parameters` object when
    /// present, otherwise the legacy top-level `rope_theta` and `rope_scaling`.
    fn from_config(config: &JsonObject<'_>) -> Result<Self, ModelError> {
        if let Some(params) = config.object("rope_parameters")? {
            let theta = params.opt_f64("rope_theta")?;
            let theta = match theta {
                Some(theta) => theta,
                None => config.opt_f64("rope_theta")?.unwrap_or(DEFAULT_ROPE_THETA),
            };
            let scaling = RopeScaling::from_object(&params)?;
            return Self::checked(config, theta, scaling);
        }
        let theta = config.opt_f64("rope_theta")?.unwrap_or(DEFAULT_ROPE_THETA);
        let scaling = match config.object("rope_scaling")? {
            Some(scaling) => RopeScaling::from_object(&scaling)?,
            None => RopeScaling::None,
        };
        Self::checked(config, theta, scaling)
    }

    /// Rejects a non-positive base.
    fn checked(
        config: &JsonObject<'_>,
        theta: f64,
        scaling: RopeScaling,
    ) -> Result<Self, ModelError> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(config.invalid(
                "rope_theta",
                format!("must be a positive number, got {theta}"),
            ));
        }
        Ok(Self { theta, scaling })
    }

    /// The factor cos and sin are multiplied by: YaRN's attention factor, else 1.
    pub fn attention_factor(&self) -> f32 {
        match &self.scaling {
            RopeScaling::Yarn(yarn) => yarn.attention_factor as f32,
            _ => 1.0,
        }
    }

    /// The inverse frequencies `1 / theta^(2i / head_dim)` for `i` in `0..head_dim / 2`, rescaled
    /// as configured. The arithmetic follows transformers' f32 tensor code step by step (Python
    /// scalars rounded to f32 where torch rounds them), with the power computed in f64 and
    /// rounded once, so results equal transformers' bit for bit except where torch's own `pow`
    /// is not correctly rounded (then they differ by one ulp).
    pub fn inv_freqs(&self, head_dim: usize) -> Vec<f32> {
        if let RopeScaling::Yarn(yarn) = &self.scaling {
            return yarn.inv_freqs(self.theta, head_dim);
        }
        (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                let base = 1.0 / self.theta.powf(f64::from(exponent)) as f32;
                self.scaling.rescale(base)
            })
            .collect()
    }
}

impl RopeScaling {
    /// Reads a `rope_scaling` or `rope_parameters` object (`rope_type`, or legacy `type`).
    fn from_object(obj: &JsonObject<'_>) -> Result<Self, ModelError> {
        let kind = match obj.opt_str("rope_type")? {
            Some(kind) => kind,
            None => obj.opt_str("type")?.unwrap_or("default"),
        };
        let positive = |field: &str| -> Result<f64, ModelError> {
            let value = obj.f64(field)?;
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(obj.invalid(field, format!("must be a positive number, got {value}")))
            }
        };
        match kind {
            "default" => Ok(Self::None),
            "linear" => Ok(Self::Linear {
                factor: positive("factor")?,
            }),
            "llama3" => {
                let low_freq_factor = positive("low_freq_factor")?;
                let high_freq_factor = positive("high_freq_factor")?;
                if high_freq_factor <= low_freq_factor {
                    return Err(obj.invalid(
                        "high_freq_factor",
                        format!("must exceed low_freq_factor ({low_freq_factor})"),
                    ));
                }
                Ok(Self::Llama3 {
                    factor: positive("factor")?,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: obj
                        .positive("original_max_position_embeddings")?,
                })
            }
            "yarn" => Ok(Self::Yarn(super::yarn::Yarn::from_object(obj)?)),
            other => Err(obj.invalid(
                "rope_type",
                format!(
                    "unsupported RoPE scaling `{other}` (supported: default, linear, llama3, yarn)"
                ),
            )),
        }
    }

    /// Applies the scheme to one unscaled inverse frequency, in transformers' f32 order of
    /// operations (quantities transformers derives from Python floats are formed in f64 and
    /// rounded to f32).
    fn rescale(&self, inv_freq: f32) -> f32 {
        match *self {
            Self::None | Self::Yarn(_) => inv_freq,
            Self::Linear { factor } => inv_freq / factor as f32,
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let original = original_max_position_embeddings as f64;
                let low_freq_wavelen = (original / low_freq_factor) as f32;
                let high_freq_wavelen = (original / high_freq_factor) as f32;
                let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv_freq;
                let factor = factor as f32;
                if wavelen < high_freq_wavelen {
                    inv_freq
                } else if wavelen > low_freq_wavelen {
                    inv_freq / factor
                } else {
                    let smooth = (original as f32 / wavelen - low_freq_factor as f32)
                        / (high_freq_factor - low_freq_factor) as f32;
                    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                }
            }
        }
    }
}

impl ModelConfig {
    /// Parses and validates the `config.json` at `path` (already read into `bytes`).
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Self, ModelError> {
        let map = parse_object(path, bytes)?;
        let config = JsonObject::new(path, &map);
        let architecture = Self::architecture(&config)?;

        if let Some(act) = config.opt_str("hidden_act")?
            && act != "silu"
        {
            return Err(config.invalid(
                "hidden_act",
                format!("unsupported activation `{act}` (only silu)"),
            ));
        }
        if config.opt_bool("mlp_bias")? == Some(true) {
            return Err(config.invalid("mlp_bias", "MLP biases are not supported"));
        }

        let hidden_size = config.positive("hidden_size")?;
        let num_attention_heads = config.positive("num_attention_heads")?;
        let num_key_value_heads = match config.opt_usize("num_key_value_heads")? {
            Some(n) => n,
            None => num_attention_heads,
        };
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(config.invalid(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads ({num_attention_heads})"),
            ));
        }
        let head_dim = match config.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(config.invalid(
                    "head_dim",
                    "missing, and hidden_size is not a multiple of num_attention_heads",
                ));
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(config.invalid(
                "head_dim",
                format!("must be a positive even number, got {head_dim}"),
            ));
        }

        let rms_norm_eps = config.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return Err(config.invalid("rms_norm_eps", "must be a positive number"));
        }

        // transformers' GptOssConfig defaults to biased attention.
        let attention_bias = config
            .opt_bool("attention_bias")?
            .unwrap_or(architecture == Architecture::GptOss);
        let sliding_window = match architecture {
            Architecture::Llama => None,
            Architecture::Mistral | Architecture::Mixtral | Architecture::GptOss => {
                config.opt_usize("sliding_window")?
            }
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen2Moe
            | Architecture::Qwen3Moe => {
                if config.opt_bool("use_sliding_window")?.unwrap_or(false) {
                    Some(config.positive("sliding_window")?)
                } else {
                    None
                }
            }
        };

        let vocab_size = config.positive("vocab_size")?;
        let eos_token_ids = config.token_ids("eos_token_id")?;
        if let Some(id) = eos_token_ids.iter().find(|id| **id as usize >= vocab_size) {
            return Err(config.invalid(
                "eos_token_id",
                format!("{id} is outside the vocabulary (vocab_size {vocab_size})"),
            ));
        }
        let bos_token_id = config.opt_token_id("bos_token_id")?;
        if let Some(id) = bos_token_id.filter(|id| *id as usize >= vocab_size) {
            return Err(config.invalid(
                "bos_token_id",
                format!("{id} is outside the vocabulary (vocab_size {vocab_size})"),
            ));
        }

        let gpt_oss = GptOssConfig::from_config(architecture, &config)?;
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: config.positive("intermediate_size")?,
            num_hidden_layers: config.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            max_position_embeddings: config.positive("max_position_embeddings")?,
            rms_norm_eps: rms_norm_eps as f32,
            rope: RopeConfig::from_config(&config)?,
            tie_word_embeddings: config.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            headless: false,
            attention_bias,
            sliding_window,
            bos_token_id,
            eos_token_ids,
            // gpt-oss's MXFP4 applies to its experts only (`gpt_oss.rs` reads it).
            quantization: match &gpt_oss {
                Some(_) => None,
                None => Quantization::from_config(&config)?,
            },
            moe: MoeConfig::from_config(architecture, &config)?,
            gpt_oss,
        })
    }

    /// The format the projections are served in, in words: `unquantized` (their 16- or 32-bit
    /// values as stored), the FP8 scheme ([`Quantization::describe`]), or gpt-oss's MXFP4
    /// experts.
    pub fn served_format(&self) -> String {
        if self.gpt_oss.as_ref().is_some_and(|g| g.mxfp4) {
            return "mxfp4 experts (attention, router, embeddings and LM head unquantized)".into();
        }
        self.quantization
            .as_ref()
            .map_or_else(|| "unquantized".to_owned(), Quantization::describe)
    }

    /// The architecture named by `architectures[0]`, or implied by `model_type`.
    fn architecture(config: &JsonObject<'_>) -> Result<Architecture, ModelError> {
        let unknown = |architecture: &str| ModelError::UnknownArchitecture {
            path: config.path(),
            architecture: architecture.to_owned(),
        };
        match config.get("architectures") {
            Some(Value::Array(names)) => match names.as_slice() {
                [Value::String(name)] => {
                    Architecture::from_hf_name(name).ok_or_else(|| unknown(name))
                }
                _ => Err(config.invalid(
                    "architectures",
                    "expected a list with exactly one class name",
                )),
            },
            Some(_) => Err(config.invalid("architectures", "expected a list of class names")),
            None => match config.opt_str("model_type")? {
                Some(model_type) => {
                    Architecture::from_model_type(model_type).ok_or_else(|| unknown(model_type))
                }
                None => Err(config.invalid("architectures", "missing (and no model_type)")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json(Path::new("m/config.json"), json.as_bytes())
    }

    /// A minimal config of `arch` with `extra` fields appended.
    fn config(arch: &str, extra: &str) -> String {
        format!(
            r#"{{"architectures": ["{arch}"], "hidden_size": 64, "intermediate_size": 160,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
                "max_position_embeddings": 512{extra}}}"#
        )
    }

    #[test]
    fn reads_transformers5_rope_parameters() {
        let c = parse(&config(
            "LlamaForCausalLM",
            r#", "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": true,
               "eos_token_id": [1, 2, 3], "bos_token_id": 0, "rms_norm_eps": 1e-5,
               "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                 "original_max_position_embeddings": 32, "rope_theta": 500000.0, "rope_type": "llama3"}"#,
        ))
        .unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(
            c.rope.scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32
            }
        );
        assert_eq!((c.num_key_value_heads, c.head_dim), (2, 16));
        assert_eq!(c.eos_token_ids, vec![1, 2, 3]);
        assert_eq!(c.bos_token_id, Some(0));
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert!(c.tie_word_embeddings && !c.attention_bias);
    }

    #[test]
    fn reads_legacy_rope_fields() {
        let c = parse(&config(
            "LlamaForCausalLM",
            r#", "rope_theta": 250000.0, "rope_scaling": {"type": "linear", "factor": 2.0}, "eos_token_id": 5"#,
        ))
        .unwrap();
        assert_eq!(c.rope.theta, 250000.0);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(c.eos_token_ids, vec![5]);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_key_value_heads, 4);

        let c = parse(&config("MistralForCausalLM", r#", "rope_scaling": null"#)).unwrap();
        assert_eq!(
            c.rope,
            RopeConfig {
                theta: 10_000.0,
                scaling: RopeScaling::None
            }
        );
    }

    #[test]
    fn architecture_specific_fields() {
        let qwen2 = parse(&config(
            "Qwen2ForCausalLM",
            r#", "sliding_window": 4096, "use_sliding_window": false"#,
        ))
        .unwrap();
        assert_eq!(qwen2.sliding_window, None);

        let qwen3 = parse(&config(
            "Qwen3ForCausalLM",
            r#", "head_dim": 32, "attention_bias": false"#,
        ))
        .unwrap();
        assert_eq!(qwen3.head_dim, 32);

        let mistral = parse(&config("MistralForCausalLM", r#", "sliding_window": 4096"#)).unwrap();
        assert_eq!(mistral.sliding_window, Some(4096));
    }

    #[test]
    fn unknown_architecture_is_one_line_naming_file_and_class() {
        let err = parse(&config("GPT2LMHeadModel", ""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m/config.json") && err.contains("GPT2LMHeadModel"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }

    #[test]
    fn bad_fields_are_named() {
        let err = parse(r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("intermediate_size") || err.contains("num_attention_heads"),
            "{err}"
        );
        let err = parse(&config(
            "LlamaForCausalLM",
            r#", "rope_scaling": {"rope_type": "longrope", "factor": 4.0}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rope_scaling.rope_type") && err.contains("longrope"),
            "{err}"
        );
        let err = parse(&config("LlamaForCausalLM", r#", "num_key_value_heads": 3"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");
        let err = parse(&config("LlamaForCausalLM", r#", "eos_token_id": [1, 100]"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("eos_token_id") && err.contains("100"), "{err}");
        let err = parse("[1]").unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
        let err = parse("{not json").unwrap_err().to_string();
        assert!(
            err.contains("config.json") && err.contains("invalid JSON"),
            "{err}"
        );
    }

    #[test]
    fn default_and_linear_inv_freqs() {
        let rope = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        };
        assert_eq!(rope.inv_freqs(8), vec![1.0, 0.1, 0.01, 0.001]);
        let linear = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Linear { factor: 4.0 },
        };
        assert_eq!(linear.inv_freqs(4), vec![0.25, 0.0025]);
    }

    #[test]
    fn llama3_inv_freqs_keep_high_scale_low_and_smooth_the_band() {
        let rope = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 2048,
            },
        };
        // Wavelengths 2π/f: 6.3 and 62.8 (< 512: kept), 628 (in 512..2048: smoothed),
        // 6283 (> 2048: divided by 8).
        let f = rope.inv_freqs(8);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1], 0.1);
        let smooth = (2048.0 / (2.0 * std::f64::consts::PI / 0.01) - 1.0) / 3.0;
        let blended = (1.0 - smooth) * 0.01 / 8.0 + smooth * 0.01;
        assert!((f64::from(f[2]) - blended).abs() < 1e-9, "{}", f[2]);
        assert!(f[2] > 0.01 / 8.0 && f[2] < 0.01);
        assert_eq!(f[3], 0.001 / 8.0);

        let wide = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
        };
        // Precomputed with Python floats: the smoothed value for wavelength 6283.
        assert!((wide.inv_freqs(8)[3] - 0.000_213_607_54).abs() < 1e-10);
    }

    /// `inv_freq` as transformers 5.17 computes it (`ROPE_INIT_FUNCTIONS` /
    /// `compute_default_rope_parameters` on CPU, printed as f32).
    #[test]
    fn inv_freqs_match_transformers() {
        let llama3 = |original| RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: original,
        };
        // The tiny-llama3 fixture's settings.
        let tiny = RopeConfig {
            theta: 500_000.0,
            scaling: llama3(32),
        };
        let expected: [f32; 8] = [
            1.0,
            0.024240345,
            0.004700754,
            0.00091158313,
            0.00017677668,
            3.4281024e-05,
            6.6478697e-06,
            1.2891732e-06,
        ];
        assert_eq!(tiny.inv_freqs(16), expected);

        // Llama 3.1's settings, whose band 2048..8192 is smoothed.
        let llama31 = RopeConfig {
            theta: 500_000.0,
            scaling: llama3(8192),
        };
        let expected: [f32; 64] = [
            1.0,
            0.8146172,
            0.6636013,
            0.540581,
            0.44036663,
            0.35873023,
            0.29222783,
            0.23805381,
            0.19392276,
            0.15797281,
            0.12868738,
            0.10483095,
            0.0853971,
            0.06956595,
            0.05666962,
            0.04616405,
            0.03760603,
            0.03063452,
            0.024955409,
            0.020329105,
            0.01656044,
            0.01349042,
            0.010989529,
            0.008952259,
            0.007292665,
            0.0059407307,
            0.0048394212,
            0.003942276,
            0.003211446,
            0.0021665706,
            0.0013718937,
            0.00085675146,
            0.000524846,
            0.00031269365,
            0.00017850779,
            9.556212e-05,
            7.7846555e-05,
            6.3415144e-05,
            5.165907e-05,
            4.2082367e-05,
            3.4281024e-05,
            2.792591e-05,
            2.2748929e-05,
            1.853167e-05,
            1.5096218e-05,
            1.2297639e-05,
            1.0017869e-05,
            8.160728e-06,
            6.6478697e-06,
            5.4154693e-06,
            4.4115345e-06,
            3.5937119e-06,
            2.9274997e-06,
            2.3847917e-06,
            1.9426925e-06,
            1.5825508e-06,
            1.2891732e-06,
            1.0501826e-06,
            8.554969e-07,
            6.9690253e-07,
            5.677088e-07,
            4.6246538e-07,
            3.7673226e-07,
            3.068926e-07,
        ];
        assert_eq!(llama31.inv_freqs(128), expected);

        let linear = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Linear { factor: 4.0 },
        };
        let expected: [f32; 32] = [
            0.25,
            0.18747355,
            0.14058533,
            0.10542413,
            0.07905694,
            0.05928434,
            0.044456985,
            0.033338036,
            0.025,
            0.018747354,
            0.014058532,
            0.010542412,
            0.007905695,
            0.005928434,
            0.0044456986,
            0.0033338037,
            0.0025,
            0.0018747356,
            0.0014058533,
            0.0010542412,
            0.00079056947,
            0.00059284345,
            0.00044456986,
            0.00033338036,
            0.00025,
            0.00018747355,
            0.00014058533,
            0.00010542412,
            7.905695e-05,
            5.9284346e-05,
            4.4456985e-05,
            3.3338038e-05,
        ];
        assert_eq!(linear.inv_freqs(64), expected);

        // torch's f32 `pow` is not correctly rounded everywhere: one ulp apart at most.
        let plain = RopeConfig {
            theta: 1_000_000.0,
            scaling: RopeScaling::None,
        };
        let expected: [f32; 64] = [
            1.0,
            0.8058422,
            0.64938164,
            0.52329916,
            0.4216965,
            0.33982083,
            0.27384198,
            0.2206734,
            0.17782794,
            0.14330126,
            0.1154782,
            0.0930572,
            0.074989416,
            0.060429644,
            0.048696753,
            0.0392419,
            0.03162278,
            0.025482967,
            0.020535251,
            0.016548172,
            0.013335215,
            0.010746079,
            0.008659643,
            0.006978306,
            0.0056234132,
            0.0045315837,
            0.0036517414,
            0.0029427272,
            0.0023713738,
            0.0019109529,
            0.0015399265,
            0.0012409379,
            0.001,
            0.0008058422,
            0.00064938166,
            0.0005232991,
            0.0004216965,
            0.00033982084,
            0.00027384196,
            0.00022067342,
            0.00017782794,
            0.00014330127,
            0.00011547819,
            9.3057206e-05,
            7.4989424e-05,
            6.0429637e-05,
            4.8696755e-05,
            3.92419e-05,
            3.1622774e-05,
            2.5482967e-05,
            2.053525e-05,
            1.654817e-05,
            1.3335214e-05,
            1.0746078e-05,
            8.659644e-06,
            6.9783064e-06,
            5.6234135e-06,
            4.5315837e-06,
            3.6517413e-06,
            2.9427272e-06,
            2.3713737e-06,
            1.910953e-06,
            1.5399265e-06,
            1.2409378e-06,
        ];
        for (ours, theirs) in plain.inv_freqs(128).iter().zip(expected) {
            assert!(
                ours.to_bits().abs_diff(theirs.to_bits()) <= 1,
                "{ours} vs {theirs}"
            );
        }
    }
}
