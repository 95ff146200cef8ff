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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(arch: &str, extra: &str) -> ModelConfig {
        let json = format!(
            r#"{{"architectures": ["{arch}"], "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 11, "max_position_embeddings": 64{extra}}}"#
        );
        ModelConfig::from_json(Path::new("config.json"), json.as_bytes()).unwrap()
    }

    fn names(layout: &TensorLayout) -> Vec<&str> {
        layout.all().into_iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn llama_layout_names_and_shapes() {
        let l = layout(&config("LlamaForCausalLM", ""));
        assert_eq!(l.all().len(), 1 + 2 * 9 + 1 + 1);
        assert_eq!(l.embed_tokens.shape, vec![11, 32]);
        assert_eq!(l.lm_head.name, "lm_head.weight");
        let layer = &l.layers[1];
        assert_eq!(layer.q_proj.name, "model.layers.1.self_attn.q_proj.weight");
        assert_eq!(layer.q_proj.shape, vec![32, 32]);
        assert_eq!(layer.k_proj.shape, vec![16, 32]);
        assert_eq!(layer.v_proj.shape, vec![16, 32]);
        assert_eq!(layer.o_proj.shape, vec![32, 32]);
        assert_eq!(layer.gate_proj.shape, vec![48, 32]);
        assert_eq!(layer.down_proj.name, "model.layers.1.mlp.down_proj.weight");
        assert_eq!(layer.down_proj.shape, vec![32, 48]);
        assert_eq!(
            layer.post_attention_norm.name,
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert!(layer.qkv_bias.is_none() && layer.qk_norm.is_none());
    }

    #[test]
    fn tied_embeddings_share_the_matrix() {
        let l = layout(&config(
            "MistralForCausalLM",
            r#", "tie_word_embeddings": true"#,
        ));
        assert_eq!(l.lm_head, l.embed_tokens);
        assert!(!names(&l).contains(&"lm_head.weight"));
        assert_eq!(l.all().len(), 1 + 2 * 9 + 1);
    }

    #[test]
    fn qwen_variants_add_biases_and_norms() {
        let qwen2 = layout(&config("Qwen2ForCausalLM", ""));
        let biases = qwen2.layers[0].qkv_bias.as_ref().unwrap();
        assert_eq!(biases[0].name, "model.layers.0.self_attn.q_proj.bias");
        assert_eq!(
            (biases[0].shape.clone(), biases[2].shape.clone()),
            (vec![32], vec![16])
        );

        // Qwen3 with an explicit head_dim that differs from hidden / heads.
        let qwen3 = layout(&config("Qwen3ForCausalLM", r#", "head_dim": 16"#));
        let layer = &qwen3.layers[0];
        let norms = layer.qk_norm.as_ref().unwrap();
        assert_eq!(norms[1].name, "model.layers.0.self_attn.k_norm.weight");
        assert_eq!(norms[1].shape, vec![16]);
        assert_eq!(layer.q_proj.shape, vec![64, 32]);
        assert_eq!(layer.o_proj.shape, vec![32, 64]);
        assert!(layer.qkv_bias.is_none());
    }
}
