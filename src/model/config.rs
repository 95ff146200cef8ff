//! `config.json`: the architecture and shapes of a model.

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
