//! The tensors each supported architecture needs: their Hugging Face names and the shapes the
//! configuration implies. Every backend fetches weights through this layout, and loading
//! validates the weights files against it.

use super::config::ModelConfig;
use super::error::ModelError;
use super::weights::ModelWeights;

/// The name and expected shape of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name in the safetensors files.
    pub name: String,
    /// Its dimensions, outermost first (`[out, in]` for projections).
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec for `name` with `shape`.
    fn new(name: String, shape: &[usize]) -> Self {
        Self {
            name,
            shape: shape.to_vec(),
        }
    }
}

/// The tensors of one transformer block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerTensors {
    /// RMSNorm weight before attention, `[hidden]`.
    pub input_norm: TensorSpec,
    /// Query projection, `[heads * head_dim, hidden]`.
    pub q_proj: TensorSpec,
    /// Key projection, `[kv_heads * head_dim, hidden]`.
    pub k_proj: TensorSpec,
    /// Value projection, `[kv_heads * head_dim, hidden]`.
    pub v_proj: TensorSpec,
    /// Query, key and value biases (Qwen2, or `attention_bias`).
    pub qkv_bias: Option<[TensorSpec; 3]>,
    /// Per-head RMSNorm weights for queries and keys, `[head_dim]` each (Qwen3).
    pub qk_norm: Option<[TensorSpec; 2]>,
    /// Attention output projection, `[hidden, heads * head_dim]`.
    pub o_proj: TensorSpec,
    /// RMSNorm weight before the MLP, `[hidden]`.
    pub post_attention_norm: TensorSpec,
    /// MLP gate projection, `[intermediate, hidden]`.
    pub gate_proj: TensorSpec,
    /// MLP up projection, `[intermediate, hidden]`.
    pub up_proj: TensorSpec,
    /// MLP down projection, `[hidden, intermediate]`.
    pub down_proj: TensorSpec,
}

impl LayerTensors {
    /// Every tensor of the block.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = vec![&self.input_norm, &self.q_proj, &self.k_proj, &self.v_proj];
        if let Some(biases) = &self.qkv_bias {
            specs.extend(biases);
        }
        if let Some(norms) = &self.qk_norm {
            specs.extend(norms);
        }
        specs.extend([
            &self.o_proj,
            &self.post_attention_norm,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]);
        specs
    }
}

/// Every tensor a model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// Token embeddings, `[vocab, hidden]`.
    pub embed_tokens: TensorSpec,
    /// The transformer blocks, in order.
    pub layers: Vec<LayerTensors>,
    /// Final RMSNorm weight, `[hidden]`.
    pub final_norm: TensorSpec,
    /// The LM head, `[vocab, hidden]`: `lm_head.weight`, or the embedding matrix itself when the
    /// embeddings are tied (then its name equals `embed_tokens.name`).
    pub lm_head: TensorSpec,
}

impl TensorLayout {
    /// Every distinct tensor, embeddings first.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = vec![&self.embed_tokens];
        for layer in &self.layers {
            specs.extend(layer.all());
        }
        specs.push(&self.final_norm);
        if self.lm_head.name != self.embed_tokens.name {
            specs.push(&self.lm_head);
        }
        specs
    }

    /// Checks that `weights` holds every tensor with the expected shape and an accepted dtype.
    pub fn validate(&self, weights: &ModelWeights) -> Result<(), ModelError> {
        for spec in self.all() {
            weights.check(&spec.name, &spec.shape)?;
        }
        Ok(())
    }
}

/// The tensor layout `config` implies. All four architectures share the Llama naming scheme;
/// they differ in the optional biases and q/k norms.
pub fn layout(config: &ModelConfig) -> TensorLayout {
    let hidden = config.hidden_size;
    let q_dim = config.num_attention_heads * config.head_dim;
    let kv_dim = config.num_key_value_heads * config.head_dim;
    let inter = config.intermediate_size;
    let layers = (0..config.num_hidden_layers)
        .map(|i| {
            let name = |suffix: &str| format!("model.layers.{i}.{suffix}");
            LayerTensors {
                input_norm: TensorSpec::new(name("input_layernorm.weight"), &[hidden]),
                q_proj: TensorSpec::new(name("self_attn.q_proj.weight"), &[q_dim, hidden]),
                k_proj: TensorSpec::new(name("self_attn.k_proj.weight"), &[kv_dim, hidden]),
                v_proj: TensorSpec::new(name("self_attn.v_proj.weight"), &[kv_dim, hidden]),
                qkv_bias: config.qkv_bias.then(|| {
                    [
                        TensorSpec::new(name("self_attn.q_proj.bias"), &[q_dim]),
                        TensorSpec::new(name("self_attn.k_proj.bias"), &[kv_dim]),
                        TensorSpec::new(name("self_attn.v_proj.bias"), &[kv_dim]),
                    ]
                }),
                qk_norm: config.qk_norm.then(|| {
                    [
                        TensorSpec::new(name("self_attn.q_norm.weight"), &[config.head_dim]),
                        TensorSpec::new(name("self_attn.k_norm.weight"), &[config.head_dim]),
                    ]
                }),
                o_proj: TensorSpec::new(name("self_attn.o_proj.weight"), &[hidden, q_dim]),
                post_attention_norm: TensorSpec::new(
                    name("post_attention_layernorm.weight"),
                    &[hidden],
                ),
                gate_proj: TensorSpec::new(name("mlp.gate_proj.weight"), &[inter, hidden]),
                up_proj: TensorSpec::new(name("mlp.up_proj.weight"), &[inter, hidden]),
                down_proj: TensorSpec::new(name("mlp.down_proj.weight"), &[hidden, inter]),
            }
        })
        .collect();
    let embed_tokens = TensorSpec::new(
        "model.embed_tokens.weight".into(),
        &[config.vocab_size, hidden],
    );
    let lm_head = if config.tie_word_embeddings {
        embed_tokens.clone()
    } else {
        TensorSpec::new("lm_head.weight".into(), &[config.vocab_size, hidden])
    };
    TensorLayout {
        embed_tokens,
        layers,
        final_norm: TensorSpec::new("model.norm.weight".into(), &[hidden]),
        lm_head,
    }
}
