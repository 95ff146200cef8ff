//! The weight-name mapping: the tensors a model definition needs, with their Hugging Face names
//! and the shapes the definition implies. Every backend fetches weights through this layout, and
//! loading validates the weights files against it.

use super::config::Architecture;
use super::definition::{ExpertKind, LmHead, MlpDefinition, ModelDefinition, MoeDefinition};
use super::error::ModelError;
use super::fp8::{ActivationScale, WeightScale};
use super::gpt_oss::GptOssMoeTensors;
use super::quantization::Quantization;
use super::weights::ModelWeights;

/// The name and expected shape of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name in the safetensors files.
    pub name: String,
    /// Its dimensions, outermost first (`[out, in]` for projections).
    pub shape: Vec<usize>,
    /// Whether it is stored in FP8 E4M3 (an FP8 projection's values); otherwise in bf16, f16 or
    /// f32.
    pub fp8: bool,
    /// The packed format of a tensor stored as bytes (`U8`), kept as stored for a backend that
    /// reads it directly; `None` for a tensor of floats.
    pub packed: Option<Packed>,
}

/// A format stored as bytes (`U8` in safetensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    /// MXFP4 values: two E2M1 elements per byte, low nibble first (`model/mxfp4.rs`).
    Mxfp4Blocks,
    /// E8M0 scales, one per 32 MXFP4 elements.
    E8m0Scales,
}

impl TensorSpec {
    /// A spec for the 16- or 32-bit tensor `name` with `shape`.
    pub(crate) fn new(name: String, shape: &[usize]) -> Self {
        Self {
            name,
            shape: shape.to_vec(),
            fp8: false,
            packed: None,
        }
    }

    /// A spec for the byte tensor `name` of `shape` in the packed format `packed`.
    pub(crate) fn packed(name: String, shape: &[usize], packed: Packed) -> Self {
        Self {
            packed: Some(packed),
            ..Self::new(name, shape)
        }
    }

    /// The values the tensor holds: its elements, two per byte of MXFP4 blocks, none for
    /// scales.
    pub fn values(&self) -> usize {
        let elements = self.shape.iter().product::<usize>();
        match self.packed {
            None => elements,
            Some(Packed::Mxfp4Blocks) => 2 * elements,
            Some(Packed::E8m0Scales) => 0,
        }
    }
}

/// The scales of an FP8 projection, and how its input is quantized.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensors {
    /// The weight scales: in the checkpoint (`weight_scale`, `weight_scale_inv`), or `None` when
    /// the projection is quantized at load.
    pub scale: Option<TensorSpec>,
    /// The layout of the weight scales.
    pub weights: WeightScale,
    /// The static input scale (`input_scale`), when the scheme has one.
    pub input_scale: Option<TensorSpec>,
    /// How the product's input is quantized.
    pub activations: ActivationScale,
}

/// A linear projection `y = x · Wᵀ`: its `[out, in]` weight and, in FP8, its scales.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearTensors {
    /// The weight matrix.
    pub weight: TensorSpec,
    /// How it is quantized, when in FP8.
    pub fp8: Option<Fp8Tensors>,
}

impl LinearTensors {
    /// The projection `module` (e.g. `model.layers.0.self_attn.q_proj`) of shape `[out, in]`,
    /// stored as `quantization` says.
    fn new(module: &str, out: usize, inp: usize, quantization: Option<&Quantization>) -> Self {
        let mut weight = TensorSpec::new(format!("{module}.weight"), &[out, inp]);
        let fp8 = quantization.filter(|q| q.quantizes(module)).map(|q| {
            let in_checkpoint = q.in_checkpoint();
            weight.fp8 = in_checkpoint;
            Fp8Tensors {
                scale: in_checkpoint.then(|| {
                    TensorSpec::new(q.scale_tensor(module), &q.weights.scale_shape(out, inp))
                }),
                weights: q.weights,
                input_scale: q
                    .input_scale_tensor(module)
                    .filter(|_| in_checkpoint)
                    .map(|name| TensorSpec::new(name, &[1])),
                activations: q.activations,
            }
        });
        Self { weight, fp8 }
    }

    /// The 16-bit projection `module` of shape `[out, in]`, whatever the checkpoint's
    /// quantization.
    pub(crate) fn unquantized(module: &str, out: usize, inp: usize) -> Self {
        Self::new(module, out, inp, None)
    }

    /// The projection's tensors in the checkpoint.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = vec![&self.weight];
        if let Some(fp8) = &self.fp8 {
            specs.extend(fp8.scale.iter().chain(&fp8.input_scale));
        }
        specs
    }
}

/// A dense SwiGLU MLP's projections (a dense layer's MLP, or one expert).
#[derive(Debug, Clone, PartialEq)]
pub struct SwiGluTensors {
    /// Gate projection, `[intermediate, hidden]`.
    pub gate_proj: LinearTensors,
    /// Up projection, `[intermediate, hidden]`.
    pub up_proj: LinearTensors,
    /// Down projection, `[hidden, intermediate]`.
    pub down_proj: LinearTensors,
}

impl SwiGluTensors {
    /// The three projections of the module `prefix` named `[gate, up, down]`, of width `inter`.
    fn new(
        prefix: &str,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inter: usize,
        quantization: Option<&Quantization>,
    ) -> Self {
        let linear = |name: &str, out, inp| {
            LinearTensors::new(&format!("{prefix}.{name}"), out, inp, quantization)
        };
        Self {
            gate_proj: linear(gate, inter, hidden),
            up_proj: linear(up, inter, hidden),
            down_proj: linear(down, hidden, inter),
        }
    }

    /// The three projections, gate, up and down.
    pub fn projections(&self) -> [&LinearTensors; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }
}

/// One projection of every expert, as the checkpoint names it (one tensor per expert) and as it
/// is held once loaded: fused in expert order into one contiguous `[num_experts, out, in]`
/// tensor, expert `e`'s matrix at element offset `e · out · in`.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedExperts {
    /// Each expert's projection in the checkpoint, in expert order.
    pub experts: Vec<LinearTensors>,
    /// The fused shape, `[num_experts, out, in]`.
    pub shape: [usize; 3],
}

impl FusedExperts {
    /// The projection `name` of each expert `e` of `experts` (`{experts}.{e}.{name}`), each
    /// `[out, in]`.
    fn new(
        experts: &str,
        name: &str,
        count: usize,
        [out, inp]: [usize; 2],
        quantization: Option<&Quantization>,
    ) -> Self {
        Self {
            experts: (0..count)
                .map(|e| {
                    LinearTensors::new(&format!("{experts}.{e}.{name}"), out, inp, quantization)
                })
                .collect(),
            shape: [count, out, inp],
        }
    }
}

/// A mixture-of-experts MLP's tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeTensors {
    /// The router, `[num_experts, hidden]`. Always 16-bit: FP8 checkpoints keep it unquantized
    /// (the FP8 schemes apply to the experts), and quantizing at load leaves it as stored.
    pub router: LinearTensors,
    /// Every expert's gate projection, fused `[num_experts, intermediate, hidden]`.
    pub gate_proj: FusedExperts,
    /// Every expert's up projection, fused `[num_experts, intermediate, hidden]`.
    pub up_proj: FusedExperts,
    /// Every expert's down projection, fused `[num_experts, hidden, intermediate]`.
    pub down_proj: FusedExperts,
    /// The shared expert's projections (`{module}.shared_expert.{gate,up,down}_proj`) and its
    /// gate (`{module}.shared_expert_gate`, `[1, hidden]`, 16-bit like the router), if any.
    pub shared_expert: Option<(SwiGluTensors, LinearTensors)>,
}

impl MoeTensors {
    /// The three fused projections, gate, up and down.
    pub fn projections(&self) -> [&FusedExperts; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }
}

/// The tensors of a layer's MLP, as its definition declares it.
#[derive(Debug, Clone, PartialEq)]
pub enum MlpTensors {
    /// A dense SwiGLU MLP.
    Dense(Box<SwiGluTensors>),
    /// A mixture of experts.
    Moe(Box<MoeTensors>),
    /// gpt-oss's mixture: all experts of a projection in one tensor, with biases.
    GptOss(Box<GptOssMoeTensors>),
}

impl MlpTensors {
    /// The dense MLP's projections, or `None` for a mixture of experts.
    pub fn dense(&self) -> Option<&SwiGluTensors> {
        match self {
            Self::Dense(mlp) => Some(mlp),
            Self::Moe(_) | Self::GptOss(_) => None,
        }
    }
}

/// The tensors of one transformer block.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTensors {
    /// RMSNorm weight before attention, `[hidden]`.
    pub input_norm: TensorSpec,
    /// Query projection, `[heads * head_dim, hidden]`.
    pub q_proj: LinearTensors,
    /// Key projection, `[kv_heads * head_dim, hidden]`.
    pub k_proj: LinearTensors,
    /// Value projection, `[kv_heads * head_dim, hidden]`.
    pub v_proj: LinearTensors,
    /// Query, key and value biases (Qwen2, or `attention_bias`).
    pub qkv_bias: Option<[TensorSpec; 3]>,
    /// Per-head RMSNorm weights for queries and keys, `[head_dim]` each (Qwen3).
    pub qk_norm: Option<[TensorSpec; 2]>,
    /// Attention output projection, `[hidden, heads * head_dim]`.
    pub o_proj: LinearTensors,
    /// Its bias, `[hidden]` (gpt-oss).
    pub o_bias: Option<TensorSpec>,
    /// Per-head attention sinks, `self_attn.sinks` `[heads]` (gpt-oss).
    pub sinks: Option<TensorSpec>,
    /// RMSNorm weight before the MLP, `[hidden]`.
    pub post_attention_norm: TensorSpec,
    /// The MLP: dense, or a mixture of experts.
    pub mlp: MlpTensors,
}

impl LayerTensors {
    /// Every tensor of the block.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = vec![&self.input_norm];
        for projection in [&self.q_proj, &self.k_proj, &self.v_proj] {
            specs.extend(projection.all());
        }
        if let Some(biases) = &self.qkv_bias {
            specs.extend(biases);
        }
        if let Some(norms) = &self.qk_norm {
            specs.extend(norms);
        }
        specs.extend(self.o_proj.all());
        specs.extend(self.o_bias.iter().chain(&self.sinks));
        specs.push(&self.post_attention_norm);
        match &self.mlp {
            MlpTensors::Dense(mlp) => {
                for projection in mlp.projections() {
                    specs.extend(projection.all());
                }
            }
            MlpTensors::Moe(moe) => {
                specs.extend(moe.router.all());
                for fused in moe.projections() {
                    for expert in &fused.experts {
                        specs.extend(expert.all());
                    }
                }
                if let Some((shared, gate)) = &moe.shared_expert {
                    for projection in shared.projections() {
                        specs.extend(projection.all());
                    }
                    specs.extend(gate.all());
                }
            }
            MlpTensors::GptOss(moe) => specs.extend(moe.all()),
        }
        specs
    }
}

/// Every tensor a model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorLayout {
    /// Token embeddings, `[vocab, hidden]`.
    pub embed_tokens: TensorSpec,
    /// The transformer blocks, in order.
    pub layers: Vec<LayerTensors>,
    /// Final RMSNorm weight, `[hidden]`.
    pub final_norm: TensorSpec,
    /// The LM head, `[vocab, hidden]`: `lm_head.weight`, or the embedding matrix itself when the
    /// embeddings are tied (then its weight's name equals `embed_tokens.name`).
    pub lm_head: LinearTensors,
}

impl TensorLayout {
    /// Every distinct tensor, embeddings first.
    pub fn all(&self) -> Vec<&TensorSpec> {
        let mut specs = vec![&self.embed_tokens];
        for layer in &self.layers {
            specs.extend(layer.all());
        }
        specs.push(&self.final_norm);
        if !self.lm_head_tied() {
            specs.extend(self.lm_head.all());
        }
        specs
    }

    /// The values of every tensor, each counted once (the tied LM head with the embeddings):
    /// what is resident once loaded, every expert of a mixture included, whichever experts a
    /// token uses.
    pub fn parameters(&self) -> usize {
        self.all().iter().map(|spec| spec.values()).sum()
    }

    /// Whether the LM head is the embedding matrix.
    pub fn lm_head_tied(&self) -> bool {
        self.lm_head.weight.name == self.embed_tokens.name
    }

    /// Checks that `weights` holds every tensor with the expected shape, FP8 exactly where the
    /// quantization says so and an accepted 16- or 32-bit float type elsewhere.
    pub fn validate(&self, weights: &ModelWeights) -> Result<(), ModelError> {
        for spec in self.all() {
            if spec.packed.is_some() {
                weights.packed(spec)?;
            } else {
                weights.check_spec(spec)?;
            }
        }
        Ok(())
    }
}

/// The tensor layout `definition` implies, with its projections stored as `quantization` says
/// (16-bit without one). Every architecture shares the Llama naming scheme; a layer's optional
/// tensors (biases, q/k norms) follow what its definition declares, and a mixture of experts is
/// named as its architecture names it ([`expert_names`]).
pub fn layout(definition: &ModelDefinition, quantization: Option<&Quantization>) -> TensorLayout {
    let hidden = definition.hidden;
    let layers = definition
        .layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let name = |suffix: &str| format!("model.layers.{i}.{suffix}");
            let linear = |module: &str, out: usize, inp: usize| {
                LinearTensors::new(
                    &format!("model.layers.{i}.{module}"),
                    out,
                    inp,
                    quantization,
                )
            };
            let attention = &layer.attention;
            let (q_dim, kv_dim) = (attention.q_width(), attention.kv_width());
            let mlp = match layer.mlp {
                MlpDefinition::SwiGlu { intermediate } => {
                    MlpTensors::Dense(Box::new(SwiGluTensors::new(
                        &format!("model.layers.{i}.mlp"),
                        ["gate_proj", "up_proj", "down_proj"],
                        hidden,
                        intermediate,
                        quantization,
                    )))
                }
                MlpDefinition::Moe(MoeDefinition {
                    num_experts,
                    expert_intermediate,
                    experts: ExpertKind::ClampedSwiGlu { mxfp4, .. },
                    ..
                }) => MlpTensors::GptOss(Box::new(GptOssMoeTensors::new(
                    &format!("model.layers.{i}.mlp"),
                    hidden,
                    num_experts,
                    expert_intermediate,
                    mxfp4,
                ))),
                MlpDefinition::Moe(moe) => {
                    let names = expert_names(definition.architecture);
                    let module = format!("model.layers.{i}.{}", names.module);
                    let experts = format!("{module}.experts");
                    let fused = |name: &str, shape: [usize; 2]| {
                        FusedExperts::new(&experts, name, moe.num_experts, shape, quantization)
                    };
                    let [gate, up, down] = names.projections;
                    let inter = moe.expert_intermediate;
                    MlpTensors::Moe(Box::new(MoeTensors {
                        router: LinearTensors::new(
                            &format!("{module}.gate"),
                            moe.num_experts,
                            hidden,
                            None,
                        ),
                        gate_proj: fused(gate, [inter, hidden]),
                        up_proj: fused(up, [inter, hidden]),
                        down_proj: fused(down, [hidden, inter]),
                        shared_expert: moe.shared_expert.map(|width| {
                            (
                                SwiGluTensors::new(
                                    &format!("{module}.shared_expert"),
                                    ["gate_proj", "up_proj", "down_proj"],
                                    hidden,
                                    width,
                                    quantization,
                                ),
                                LinearTensors::new(
                                    &format!("{module}.shared_expert_gate"),
                                    1,
                                    hidden,
                                    None,
                                ),
                            )
                        }),
                    }))
                }
            };
            LayerTensors {
                input_norm: TensorSpec::new(name("input_layernorm.weight"), &[hidden]),
                q_proj: linear("self_attn.q_proj", q_dim, hidden),
                k_proj: linear("self_attn.k_proj", kv_dim, hidden),
                v_proj: linear("self_attn.v_proj", kv_dim, hidden),
                qkv_bias: attention.qkv_bias.then(|| {
                    [
                        TensorSpec::new(name("self_attn.q_proj.bias"), &[q_dim]),
                        TensorSpec::new(name("self_attn.k_proj.bias"), &[kv_dim]),
                        TensorSpec::new(name("self_attn.v_proj.bias"), &[kv_dim]),
                    ]
                }),
                qk_norm: attention.qk_norm.map(|_| {
                    [
                        TensorSpec::new(name("self_attn.q_norm.weight"), &[attention.head_dim]),
                        TensorSpec::new(name("self_attn.k_norm.weight"), &[attention.head_dim]),
                    ]
                }),
                o_proj: linear("self_attn.o_proj", hidden, q_dim),
                o_bias: attention
                    .o_bias
                    .then(|| TensorSpec::new(name("self_attn.o_proj.bias"), &[hidden])),
                sinks: attention
                    .sinks
                    .then(|| TensorSpec::new(name("self_attn.sinks"), &[attention.num_heads])),
                post_attention_norm: TensorSpec::new(
                    name("post_attention_layernorm.weight"),
                    &[hidden],
                ),
                mlp,
            }
        })
        .collect();
    let embed_tokens = TensorSpec::new(
        "model.embed_tokens.weight".into(),
        &[definition.vocab, hidden],
    );
    let lm_head = match definition.lm_head {
        LmHead::TiedToEmbeddings | LmHead::Absent => LinearTensors {
            weight: embed_tokens.clone(),
            fp8: None,
        },
        LmHead::Separate => LinearTensors::new("lm_head", definition.vocab, hidden, quantization),
    };
    TensorLayout {
        embed_tokens,
        layers,
        final_norm: TensorSpec::new("model.norm.weight".into(), &[hidden]),
        lm_head,
    }
}

/// How an architecture names a mixture of experts' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertNames {
    /// The MLP module under `model.layers.{i}`; its router is `{module}.gate` and expert `e` is
    /// `{module}.experts.{e}`.
    pub module: &'static str,
    /// The expert's gate, up and down projections.
    pub projections: [&'static str; 3],
}

/// The expert tensor names of `architecture`: Qwen3-MoE's `mlp.experts.{e}.gate_proj` /
/// `up_proj` / `down_proj`, Mixtral's `block_sparse_moe.experts.{e}.w1` / `w3` / `w2`.
pub fn expert_names(architecture: Architecture) -> ExpertNames {
    match architecture {
        Architecture::Mixtral => ExpertNames {
            module: "block_sparse_moe",
            projections: ["w1", "w3", "w2"],
        },
        Architecture::Llama
        | Architecture::Mistral
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen2Moe
        | Architecture::Qwen3Moe
        | Architecture::GptOss => ExpertNames {
            module: "mlp",
            projections: ["gate_proj", "up_proj", "down_proj"],
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::ModelConfig;

    fn config(arch: &str, extra: &str) -> ModelConfig {
        let json = format!(
            r#"{{"architectures": ["{arch}"], "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 11, "max_position_embeddings": 64{extra}}}"#
        );
        ModelConfig::from_json(Path::new("config.json"), json.as_bytes()).unwrap()
    }

    fn layout_of(config: &ModelConfig) -> TensorLayout {
        layout(&ModelDefinition::of(config), config.quantization.as_ref())
    }

    fn names(layout: &TensorLayout) -> Vec<&str> {
        layout.all().into_iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn llama_layout_names_and_shapes() {
        let l = layout_of(&config("LlamaForCausalLM", ""));
        assert_eq!(l.all().len(), 1 + 2 * 9 + 1 + 1);
        assert_eq!(l.embed_tokens.shape, vec![11, 32]);
        assert_eq!(l.lm_head.weight.name, "lm_head.weight");
        let layer = &l.layers[1];
        assert_eq!(
            layer.q_proj.weight.name,
            "model.layers.1.self_attn.q_proj.weight"
        );
        assert_eq!(layer.q_proj.weight.shape, vec![32, 32]);
        assert_eq!(layer.k_proj.weight.shape, vec![16, 32]);
        assert_eq!(layer.v_proj.weight.shape, vec![16, 32]);
        assert_eq!(layer.o_proj.weight.shape, vec![32, 32]);
        let mlp = layer.mlp.dense().unwrap();
        assert_eq!(mlp.gate_proj.weight.shape, vec![48, 32]);
        assert_eq!(
            mlp.down_proj.weight.name,
            "model.layers.1.mlp.down_proj.weight"
        );
        assert_eq!(mlp.down_proj.weight.shape, vec![32, 48]);
        assert_eq!(
            layer.post_attention_norm.name,
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert!(layer.qkv_bias.is_none() && layer.qk_norm.is_none());
    }

    #[test]
    fn tied_embeddings_share_the_matrix() {
        let l = layout_of(&config(
            "MistralForCausalLM",
            r#", "tie_word_embeddings": true"#,
        ));
        assert_eq!(l.lm_head.weight, l.embed_tokens);
        assert!(l.lm_head_tied());
        assert!(!names(&l).contains(&"lm_head.weight"));
        assert_eq!(l.all().len(), 1 + 2 * 9 + 1);
    }

    #[test]
    fn qwen_variants_add_biases_and_norms() {
        let qwen2 = layout_of(&config("Qwen2ForCausalLM", ""));
        let biases = qwen2.layers[0].qkv_bias.as_ref().unwrap();
        assert_eq!(biases[0].name, "model.layers.0.self_attn.q_proj.bias");
        assert_eq!(
            (biases[0].shape.clone(), biases[2].shape.clone()),
            (vec![32], vec![16])
        );

        // Qwen3 with an explicit head_dim that differs from hidden / heads.
        let qwen3 = layout_of(&config("Qwen3ForCausalLM", r#", "head_dim": 16"#));
        let layer = &qwen3.layers[0];
        let norms = layer.qk_norm.as_ref().unwrap();
        assert_eq!(norms[1].name, "model.layers.0.self_attn.k_norm.weight");
        assert_eq!(norms[1].shape, vec![16]);
        assert_eq!(layer.q_proj.weight.shape, vec![64, 32]);
        assert_eq!(layer.o_proj.weight.shape, vec![32, 64]);
        assert!(layer.qkv_bias.is_none());
    }

    /// An FP8 checkpoint's layout: FP8 values and scales for every projection but the ignored
    /// LM head, 16-bit everything else.
    #[test]
    fn fp8_projections_carry_their_scales() {
        let config = config(
            "LlamaForCausalLM",
            r#", "quantization_config": {"quant_method": "compressed-tensors",
                "config_groups": {"g": {"targets": ["Linear"],
                  "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false}}},
                "ignore": ["lm_head"]}"#,
        );
        let l = layout_of(&config);
        let q = &l.layers[0].q_proj;
        assert!(q.weight.fp8);
        let fp8 = q.fp8.as_ref().unwrap();
        let scale = fp8.scale.as_ref().unwrap();
        assert_eq!(scale.name, "model.layers.0.self_attn.q_proj.weight_scale");
        assert_eq!(scale.shape, vec![32, 1]);
        assert!(!scale.fp8);
        assert_eq!(
            fp8.input_scale.as_ref().unwrap().name,
            "model.layers.0.self_attn.q_proj.input_scale"
        );
        assert!(l.lm_head.fp8.is_none() && !l.lm_head.weight.fp8);
        assert!(!l.layers[0].input_norm.fp8);
        // Each of the 7 projections adds a weight scale and an input scale.
        assert_eq!(l.all().len(), 1 + 2 * (9 + 14) + 1 + 1);

        // Quantized at load: the same projections, no scale tensors in the checkpoint.
        let mut plain = config.clone();
        plain.quantization = Some(Quantization::fp8_at_load());
        let l = layout_of(&plain);
        let q = &l.layers[1].mlp.dense().unwrap().down_proj;
        assert!(!q.weight.fp8 && q.fp8.as_ref().unwrap().scale.is_none());
        assert_eq!(l.all().len(), 1 + 2 * 9 + 1 + 1);
    }
}
