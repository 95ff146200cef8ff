//! The model definition: what each layer of a supported architecture computes, declared once.
//!
//! Every backend executes this declaration rather than a layer of its own: the CPU backend
//! interprets it operation by operation, the CUDA backend chooses its kernels from it. Adding an
//! architecture means declaring its layer in [`ModelDefinition::of`], naming its tensors in
//! `tensors.rs`, and adding kernels only where an operation is new (`docs/engine.md`, "Adding an
//! architecture").

use super::config::{Architecture, ModelConfig, RopeConfig};

/// A normalisation of the residual stream or of a head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Norm {
    /// RMSNorm with a learned per-channel weight: `x / sqrt(mean(x²) + eps) * weight`.
    Rms {
        /// The epsilon added to the mean square.
        eps: f32,
    },
}

/// What a layer's attention computes.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionDefinition {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether the q, k and v projections add a bias.
    pub qkv_bias: bool,
    /// Whether the output projection adds a bias (gpt-oss).
    pub o_bias: bool,
    /// Whether each query head has a learned sink (`self_attn.sinks`, gpt-oss): a logit that
    /// joins the softmax's denominator and attends to nothing.
    pub sinks: bool,
    /// The per-head norm applied to q and k before the rotary embedding, if any.
    pub qk_norm: Option<Norm>,
    /// How far back a query attends (in tokens, itself included), if limited.
    pub sliding_window: Option<usize>,
    /// The rotary position embedding.
    pub rope: RopeConfig,
}

impl AttentionDefinition {
    /// Width of the concatenated query heads.
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The softmax scale, 1/√head_dim.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// What a layer's MLP computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MlpDefinition {
    /// `down(silu(gate(x)) * up(x))`, no biases.
    SwiGlu {
        /// Width of the gate and up projections.
        intermediate: usize,
    },
    /// A mixture of SwiGLU experts: a router scores every expert per token, and the token's
    /// output is the routing-weighted sum of its chosen experts' outputs.
    Moe(MoeDefinition),
}

/// A mixture-of-experts MLP: the router, the experts and the routing rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeDefinition {
    /// Experts in the layer; the router is a `[num_experts, hidden]` projection without bias.
    pub num_experts: usize,
    /// Width of each expert's gate and up projections (every expert is a SwiGLU MLP of this
    /// width, without biases).
    pub expert_intermediate: usize,
    /// How router logits become the chosen experts and their weights.
    pub routing: Routing,
    /// The width of a shared expert every token uses besides its routed ones, if any
    /// (Qwen2-MoE): a SwiGLU whose output is scaled by `sigmoid(shared_expert_gate · x)` (a
    /// `[1, hidden]` projection) and added to the routed experts' sum.
    pub shared_expert: Option<usize>,
    /// What each expert computes.
    pub experts: ExpertKind,
}

/// What one expert of a mixture computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertKind {
    /// `down(silu(gate(x)) · up(x))`, no biases; a router without bias.
    SwiGlu,
    /// gpt-oss's expert: router and projections with biases, gate and up interleaved in one
    /// projection (`gate_up`: feature `2j` gate, `2j + 1` up), then
    /// `down((clamp(up, ±limit) + 1) · g · sigmoid(alpha · g))` with `g = min(gate, limit)`.
    ClampedSwiGlu {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (`swiglu_limit`, 7.0).
        limit: f32,
        /// Whether the checkpoint stores the experts in MXFP4 (else the dequantized layout).
        mxfp4: bool,
    },
}

/// How a token's router logits choose its experts and weigh their outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts' logits (in f32), then the `top_k` largest probabilities, ties
    /// decided as `torch.topk` decides them on the CPU (`docs/engine.md`, "The MoE path"); with
    /// `renormalize`, the k weights divided by their sum.
    SoftmaxTopK {
        /// Experts per token.
        top_k: usize,
        /// Whether the chosen weights are renormalised to sum to one.
        renormalize: bool,
    },
    /// The `top_k` largest logits (ties as `torch.topk` decides them), then a softmax over those
    /// k logits alone (gpt-oss).
    TopKSoftmax {
        /// Experts per token.
        top_k: usize,
    },
}

impl Routing {
    /// Experts each token uses.
    pub fn top_k(&self) -> usize {
        match *self {
            Self::SoftmaxTopK { top_k, .. } | Self::TopKSoftmax { top_k } => top_k,
        }
    }

    /// Whether the chosen weights are divided by their sum (a softmax over the chosen logits
    /// sums to one by itself).
    pub fn renormalizes(&self) -> bool {
        match *self {
            Self::SoftmaxTopK { renormalize, .. } => renormalize,
            Self::TopKSoftmax { .. } => true,
        }
    }
}

/// One transformer block: `h += attention(norm(h)); h += mlp(norm(h))`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDefinition {
    /// The norm before attention.
    pub input_norm: Norm,
    /// The attention.
    pub attention: AttentionDefinition,
    /// The norm before the MLP.
    pub post_attention_norm: Norm,
    /// The MLP.
    pub mlp: MlpDefinition,
}

/// Where the logits come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmHead {
    /// The embedding matrix, reused.
    TiedToEmbeddings,
    /// A matrix of its own.
    Separate,
    /// None: an embedding model published without one ([`ModelConfig::headless`]). The backends
    /// still compute a step's logits, against the embedding matrix as if tied, but none is ever
    /// sampled or served: generation is refused before it reaches the engine.
    Absent,
}

/// A whole decoder-only model: token embeddings, the blocks, a final norm and the LM head.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDefinition {
    /// The architecture declared.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Rows of the embedding and LM-head matrices.
    pub vocab: usize,
    /// The blocks, in order.
    pub layers: Vec<LayerDefinition>,
    /// The norm after the last block.
    pub final_norm: Norm,
    /// The LM head.
    pub lm_head: LmHead,
}

impl ModelDefinition {
    /// The definition `config` declares. This match is the one place where an architecture says
    /// what its layers compute; the shapes come from the configuration.
    pub fn of(config: &ModelConfig) -> Self {
        let norm = Norm::Rms {
            eps: config.rms_norm_eps,
        };
        let attention = AttentionDefinition {
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
            qkv_bias: config.attention_bias,
            o_bias: false,
            sinks: false,
            qk_norm: None,
            sliding_window: config.sliding_window,
            rope: config.rope.clone(),
        };
        let attention = match config.architecture {
            // Llama 2 and 3.x; Mistral is the same layer with its window (parsed per family), and
            // Mixtral is Mistral's attention with experts.
            Architecture::Llama | Architecture::Mistral | Architecture::Mixtral => attention,
            // Qwen2: q, k and v always carry a bias; Qwen2-MoE has the same attention.
            Architecture::Qwen2 | Architecture::Qwen2Moe => AttentionDefinition {
                qkv_bias: true,
                ..attention
            },
            // Qwen3: a per-head RMSNorm on q and k before the rotary embedding; Qwen3-MoE has
            // the same attention.
            Architecture::Qwen3 | Architecture::Qwen3Moe => AttentionDefinition {
                qk_norm: Some(norm),
                ..attention
            },
            // gpt-oss: q, k, v and o biased as `attention_bias` says, per-head sinks; the
            // window only in the sliding layers (below).
            Architecture::GptOss => AttentionDefinition {
                o_bias: config.attention_bias,
                sinks: true,
                ..attention
            },
        };
        let dense = MlpDefinition::SwiGlu {
            intermediate: config.intermediate_size,
        };
        // Qwen3-MoE and Mixtral: softmax then top-k, renormalised as configured
        // (`norm_topk_prob`; always for Mixtral); a layer is sparse as `decoder_sparse_step` and
        // `mlp_only_layers` say (every layer for Mixtral).
        // gpt-oss: top-k of the router's logits, softmax over those k; clamped biased experts.
        let mlp = |index: usize| match (&config.moe, &config.gpt_oss) {
            (Some(moe), Some(gpt_oss)) => MlpDefinition::Moe(MoeDefinition {
                num_experts: moe.num_experts,
                expert_intermediate: moe.expert_intermediate,
                routing: Routing::TopKSoftmax { top_k: moe.top_k },
                shared_expert: None,
                experts: ExpertKind::ClampedSwiGlu {
                    alpha: gpt_oss.swiglu_alpha,
                    limit: gpt_oss.swiglu_limit,
                    mxfp4: gpt_oss.mxfp4,
                },
            }),
            (Some(moe), None) if moe.is_sparse(index) => MlpDefinition::Moe(MoeDefinition {
                num_experts: moe.num_experts,
                expert_intermediate: moe.expert_intermediate,
                routing: Routing::SoftmaxTopK {
                    top_k: moe.top_k,
                    renormalize: moe.renormalize,
                },
                shared_expert: moe.shared_expert_intermediate,
                experts: ExpertKind::SwiGlu,
            }),
            _ => dense,
        };
        // gpt-oss: `layer_types` says which layers slide; the others attend to everything.
        let attention_of = |index: usize| match &config.gpt_oss {
            Some(gpt_oss) if !gpt_oss.sliding_layers[index] => AttentionDefinition {
                sliding_window: None,
                ..attention.clone()
            },
            _ => attention.clone(),
        };
        let layers = (0..config.num_hidden_layers)
            .map(|index| LayerDefinition {
                input_norm: norm,
                attention: attention_of(index),
                post_attention_norm: norm,
                mlp: mlp(index),
            })
            .collect();
        Self {
            architecture: config.architecture,
            hidden: config.hidden_size,
            vocab: config.vocab_size,
            layers,
            final_norm: norm,
            lm_head: if config.headless {
                LmHead::Absent
            } else if config.tie_word_embeddings {
                LmHead::TiedToEmbeddings
            } else {
                LmHead::Separate
            },
        }
    }

    /// The attention of the first layer: the one every layer shares in the architectures
    /// declared so far (the CUDA kernels are compiled for one attention geometry).
    pub fn attention(&self) -> &AttentionDefinition {
        &self.layers[0].attention
    }

    /// Whether every layer has the same attention (what the CUDA backend's kernels assume).
    pub fn uniform_attention(&self) -> bool {
        self.layers
            .iter()
            .all(|l| l.attention == self.layers[0].attention)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn definition(arch: &str, extra: &str) -> ModelDefinition {
        let json = format!(
            r#"{{"architectures": ["{arch}"], "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 11, "max_position_embeddings": 64, "rms_norm_eps": 1e-5{extra}}}"#
        );
        let config = ModelConfig::from_json(Path::new("config.json"), json.as_bytes()).unwrap();
        ModelDefinition::of(&config)
    }

    /// The declaration table, one row per architecture: what each layer computes.
    #[test]
    fn every_architecture_declares_its_layer() {
        let norm = Norm::Rms { eps: 1e-5 };
        // (architecture, extra config, q/k/v bias, q/k norm, sliding window)
        let table: [(&str, &str, bool, bool, Option<usize>); 7] = [
            ("LlamaForCausalLM", "", false, false, None),
            (
                "LlamaForCausalLM",
                r#", "attention_bias": true"#,
                true,
                false,
                None,
            ),
            (
                "MistralForCausalLM",
                r#", "sliding_window": 16"#,
                false,
                false,
                Some(16),
            ),
            (
                "MistralForCausalLM",
                r#", "sliding_window": null"#,
                false,
                false,
                None,
            ),
            ("Qwen2ForCausalLM", "", true, false, None),
            (
                "Qwen2ForCausalLM",
                r#", "use_sliding_window": true, "sliding_window": 8"#,
                true,
                false,
                Some(8),
            ),
            ("Qwen3ForCausalLM", "", false, true, None),
        ];
        for (arch, extra, bias, qk_norm, window) in table {
            let d = definition(arch, extra);
            assert_eq!(d.layers.len(), 2, "{arch}{extra}");
            assert!(d.uniform_attention());
            for layer in &d.layers {
                assert_eq!(layer.input_norm, norm);
                assert_eq!(layer.post_attention_norm, norm);
                assert_eq!(layer.mlp, MlpDefinition::SwiGlu { intermediate: 48 });
                let a = &layer.attention;
                assert_eq!(a.qkv_bias, bias, "{arch}{extra}: bias");
                assert_eq!(a.qk_norm.is_some(), qk_norm, "{arch}{extra}: q/k norm");
                assert_eq!(a.sliding_window, window, "{arch}{extra}: window");
                assert_eq!((a.num_heads, a.num_kv_heads, a.head_dim), (4, 2, 8));
                assert_eq!((a.q_width(), a.kv_width()), (32, 16));
            }
            assert_eq!(d.final_norm, norm);
            assert_eq!(d.lm_head, LmHead::Separate);
        }
    }

    /// The mixture-of-experts architectures: the MLP each layer declares.
    #[test]
    fn mixtures_of_experts_declare_their_routing() {
        let routing = |renormalize| Routing::SoftmaxTopK {
            top_k: 2,
            renormalize,
        };
        let moe = |renormalize| {
            MlpDefinition::Moe(MoeDefinition {
                num_experts: 4,
                expert_intermediate: 16,
                routing: routing(renormalize),
                shared_expert: None,
                experts: ExpertKind::SwiGlu,
            })
        };
        let dense = MlpDefinition::SwiGlu { intermediate: 48 };
        let experts =
            r#", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16"#;
        let shared = MlpDefinition::Moe(MoeDefinition {
            num_experts: 4,
            expert_intermediate: 16,
            routing: routing(false),
            shared_expert: Some(24),
            experts: ExpertKind::SwiGlu,
        });
        // (architecture, extra config, the MLP of each of 4 layers)
        let table: [(&str, String, [MlpDefinition; 4]); 5] = [
            (
                "Qwen3MoeForCausalLM",
                experts.to_owned(),
                [moe(false), moe(false), moe(false), moe(false)],
            ),
            (
                "Qwen3MoeForCausalLM",
                format!(r#"{experts}, "norm_topk_prob": true, "decoder_sparse_step": 2"#),
                [dense, moe(true), dense, moe(true)],
            ),
            (
                "Qwen3MoeForCausalLM",
                format!(r#"{experts}, "mlp_only_layers": [0, 3]"#),
                [dense, moe(false), moe(false), dense],
            ),
            (
                "Qwen2MoeForCausalLM",
                format!(
                    r#"{experts}, "shared_expert_intermediate_size": 24, "mlp_only_layers": [2]"#
                ),
                [shared, shared, dense, shared],
            ),
            (
                "MixtralForCausalLM",
                r#", "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 16"#
                    .to_owned(),
                [moe(true), moe(true), moe(true), moe(true)],
            ),
        ];
        for (arch, extra, mlps) in table {
            let d = definition(arch, &format!(r#", "num_hidden_layers": 4{extra}"#));
            let got: Vec<MlpDefinition> = d.layers.iter().map(|l| l.mlp).collect();
            assert_eq!(got, mlps, "{arch}{extra}");
            assert_eq!(routing(true).top_k(), 2);
            assert_eq!(
                d.attention().qk_norm.is_some(),
                arch == "Qwen3MoeForCausalLM"
            );
            assert_eq!(d.attention().qkv_bias, arch == "Qwen2MoeForCausalLM");
        }
    }

    #[test]
    fn tied_embeddings_are_declared() {
        let d = definition("Qwen3ForCausalLM", r#", "tie_word_embeddings": true"#);
        assert_eq!(d.lm_head, LmHead::TiedToEmbeddings);
    }
}
