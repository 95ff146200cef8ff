//! `config.json`: the architecture and shapes of a model.

use std::path::Path;

use serde_json::Value;

use super::error::ModelError;
use super::json::{JsonObject, parse_object};

/// The model families the engine runs. All are decoder-only transformers with RMSNorm, rotary
/// position embeddings, grouped-query attention and a SwiGLU MLP; they differ in the details
/// named on each variant.
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
    /// Whether q, k and v projections carry a bias (Qwen2, or `attention_bias`).
    pub qkv_bias: bool,
    /// Whether q and k get a per-head RMSNorm before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Sliding-window attention span, when the model uses one.
    pub sliding_window: Option<usize>,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens named by the config.
    pub eos_token_ids: Vec<u32>,
}

impl Architecture {
    /// The architecture named by a `config.json` `architectures` entry, if supported.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "LlamaForCausalLM" => Some(Self::Llama),
            "MistralForCausalLM" => Some(Self::Mistral),
            "Qwen2ForCausalLM" => Some(Self::Qwen2),
            "Qwen3ForCausalLM" => Some(Self::Qwen3),
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

    /// The inverse frequencies `1 / theta^(2i / head_dim)` for `i` in `0..head_dim / 2`, rescaled
    /// as configured, exactly as transformers computes them (in f64, rounded to f32 at the end).
    pub fn inv_freqs(&self, head_dim: usize) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f64 / head_dim as f64;
                let base = 1.0 / self.theta.powf(exponent);
                self.scaling.rescale(base) as f32
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
            other => Err(obj.invalid(
                "rope_type",
                format!("unsupported RoPE scaling `{other}` (supported: default, linear, llama3)"),
            )),
        }
    }

    /// Applies the scheme to one unscaled inverse frequency.
    fn rescale(&self, inv_freq: f64) -> f64 {
        match *self {
            Self::None => inv_freq,
            Self::Linear { factor } => inv_freq / factor,
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let original = original_max_position_embeddings as f64;
                let low_freq_wavelen = original / low_freq_factor;
                let high_freq_wavelen = original / high_freq_factor;
                let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
                if wavelen < high_freq_wavelen {
                    inv_freq
                } else if wavelen > low_freq_wavelen {
                    inv_freq / factor
                } else {
                    let smooth = (original / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
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

        let attention_bias = config.opt_bool("attention_bias")?.unwrap_or(false);
        let sliding_window = match architecture {
            Architecture::Llama => None,
            Architecture::Mistral => config.opt_usize("sliding_window")?,
            Architecture::Qwen2 | Architecture::Qwen3 => {
                if config.opt_bool("use_sliding_window")?.unwrap_or(false) {
                    Some(config.positive("sliding_window")?)
                } else {
                    None
                }
            }
        };

        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: config.positive("intermediate_size")?,
            num_hidden_layers: config.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: config.positive("vocab_size")?,
            max_position_embeddings: config.positive("max_position_embeddings")?,
            rms_norm_eps: rms_norm_eps as f32,
            rope: RopeConfig::from_config(&config)?,
            tie_word_embeddings: config.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
            qk_norm: architecture == Architecture::Qwen3,
            sliding_window,
            bos_token_id: config.opt_token_id("bos_token_id")?,
            eos_token_ids: config.token_ids("eos_token_id")?,
        })
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
