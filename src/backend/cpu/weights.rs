//! The model's weights converted to f32 for the CPU backend, following the tensor layout of the
//! model definition. FP8 projections are dequantized here (their scales applied), and their
//! inputs are rounded to FP8 at every product as the checkpoint's scheme says, so the CPU
//! computes what an FP8 product multiplies.

use crate::model::fp8::ActivationScale;
use crate::model::{
    FusedExperts, LinearTensors, MlpTensors, ModelDefinition, ModelError, ModelTensors,
    Quantization, TensorSpec, layout,
};

use super::gpt_oss::GptOssMoeWeights;
use super::math;

/// A projection `y = x · Wᵀ`: the `[out, in]` matrix as in the checkpoint, in f32 (dequantized
/// when stored in FP8).
#[derive(Debug)]
pub struct Linear {
    /// The matrix, row-major `[out, in]`.
    pub weight: Vec<f32>,
    /// Input features.
    pub inp: usize,
    /// Output features.
    pub out: usize,
    /// How the input is rounded to FP8 before the product (`None` for a 16-bit projection).
    pub activations: ActivationScale,
    /// The static input scale, when the scheme has one.
    pub input_scale: Option<f32>,
}

impl Linear {
    /// `x · Wᵀ` for `tokens` rows of `x`, its input first rounded as an FP8 product would.
    pub fn apply(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        product(
            x,
            &self.weight,
            [tokens, self.inp, self.out],
            self.activations,
            self.input_scale,
        )
    }
}

/// `x · Wᵀ` for `tokens` rows of `x` and the `[out, in]` matrix `weight`, the input first
/// rounded to FP8 as `activations` says (at `input_scale` when static).
pub fn product(
    x: &[f32],
    weight: &[f32],
    [tokens, inp, out]: [usize; 3],
    activations: ActivationScale,
    input_scale: Option<f32>,
) -> Vec<f32> {
    if activations == ActivationScale::None {
        return math::matmul(x, weight, tokens, inp, out);
    }
    let mut rounded = x.to_vec();
    activations.apply(&mut rounded, tokens, input_scale);
    math::matmul(&rounded, weight, tokens, inp, out)
}

/// One projection of every expert, fused: `[num_experts, out, in]` in f32 (dequantized when
/// stored in FP8), expert `e`'s matrix at `e · out · in`.
#[derive(Debug)]
pub struct ExpertLinear {
    /// The fused matrices, row-major `[num_experts, out, in]`.
    pub weight: Vec<f32>,
    /// Input features.
    pub inp: usize,
    /// Output features.
    pub out: usize,
    /// How the input is rounded to FP8 before the product (`None` for 16-bit experts).
    pub activations: ActivationScale,
    /// Each expert's static input scale, when the scheme has them.
    pub input_scales: Vec<Option<f32>>,
}

impl ExpertLinear {
    /// `x · W_eᵀ` for `tokens` rows of `x` and expert `e`.
    pub fn apply(&self, e: usize, x: &[f32], tokens: usize) -> Vec<f32> {
        let size = self.out * self.inp;
        product(
            x,
            &self.weight[e * size..(e + 1) * size],
            [tokens, self.inp, self.out],
            self.activations,
            self.input_scales[e],
        )
    }
}

/// A mixture of experts' weights: the router and the experts' fused projections.
#[derive(Debug)]
pub struct MoeWeights {
    /// The router, `[num_experts, hidden]`.
    pub router: Linear,
    /// Every expert's gate projection.
    pub gate_proj: ExpertLinear,
    /// Every expert's up projection.
    pub up_proj: ExpertLinear,
    /// Every expert's down projection.
    pub down_proj: ExpertLinear,
    /// The shared expert (gate, up, down) and its `[1, hidden]` gate, if any.
    pub shared_expert: Option<([Linear; 3], Linear)>,
}

/// A layer's MLP weights.
#[derive(Debug)]
pub enum MlpWeights {
    /// A dense SwiGLU MLP: gate, up and down.
    Dense {
        /// Gate projection.
        gate_proj: Linear,
        /// Up projection.
        up_proj: Linear,
        /// Down projection.
        down_proj: Linear,
    },
    /// A mixture of experts.
    Moe(Box<MoeWeights>),
    /// gpt-oss's mixture of biased experts.
    GptOss(Box<GptOssMoeWeights>),
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    /// Biases of q, k and v, when the definition declares them.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head norm weights of q and k, when the definition declares them.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub o_proj: Linear,
    /// The output projection's bias, when the definition declares it.
    pub o_bias: Option<Vec<f32>>,
    /// Per-head attention sinks, when the definition declares them.
    pub sinks: Option<Vec<f32>>,
    pub post_attention_norm: Vec<f32>,
    /// The MLP's weights, as the definition declares it.
    pub mlp: MlpWeights,
}

/// Every weight of the model in f32.
#[derive(Debug)]
pub struct CpuWeights {
    /// The embedding matrix, `[vocab, hidden]` (also the LM head when tied).
    pub embed_tokens: Linear,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// The LM head; `None` when tied to the embeddings.
    pub lm_head: Option<Linear>,
}

impl CpuWeights {
    /// Converts the model's weights, following the tensor layout of `definition` with its
    /// projections stored as `quantization` says (the checkpoint's, or FP8 quantized here).
    pub fn load(
        model: ModelTensors<'_>,
        definition: &ModelDefinition,
        quantization: Option<&Quantization>,
    ) -> Result<Self, ModelError> {
        let tensors = layout(definition, quantization);
        tracing::debug!(
            parameters = tensors.parameters(),
            "converting the weights to f32 (every expert of a mixture is resident)"
        );
        let load = |spec: &TensorSpec| model.weights.to_f32(&spec.name, &spec.shape);
        let scheme = |spec: &LinearTensors| -> Result<(ActivationScale, Option<f32>), ModelError> {
            Ok(match &spec.fp8 {
                None => (ActivationScale::None, None),
                Some(fp8) => (
                    fp8.activations,
                    match &fp8.input_scale {
                        Some(spec) => Some(load(spec)?[0]),
                        None => None,
                    },
                ),
            })
        };
        let linear = |spec: &LinearTensors| -> Result<Linear, ModelError> {
            let (activations, input_scale) = scheme(spec)?;
            Ok(Linear {
                weight: model.weights.linear_f32(spec)?,
                inp: spec.weight.shape[1],
                out: spec.weight.shape[0],
                activations,
                input_scale,
            })
        };
        let experts = |fused: &FusedExperts| -> Result<ExpertLinear, ModelError> {
            let schemes = fused
                .experts
                .iter()
                .map(scheme)
                .collect::<Result<Vec<_>, ModelError>>()?;
            let [_, out, inp] = fused.shape;
            Ok(ExpertLinear {
                weight: model.weights.fused_experts_f32(fused)?,
                inp,
                out,
                activations: schemes
                    .first()
                    .map_or(ActivationScale::None, |&(activations, _)| activations),
                input_scales: schemes.into_iter().map(|(_, scale)| scale).collect(),
            })
        };
        let layers = tensors
            .layers
            .iter()
            .map(|l| {
                Ok(LayerWeights {
                    input_norm: load(&l.input_norm)?,
                    q_proj: linear(&l.q_proj)?,
                    k_proj: linear(&l.k_proj)?,
                    v_proj: linear(&l.v_proj)?,
                    qkv_bias: match &l.qkv_bias {
                        Some([q, k, v]) => Some([load(q)?, load(k)?, load(v)?]),
                        None => None,
                    },
                    qk_norm: match &l.qk_norm {
                        Some([q, k]) => Some([load(q)?, load(k)?]),
                        None => None,
                    },
                    o_proj: linear(&l.o_proj)?,
                    o_bias: l.o_bias.as_ref().map(load).transpose()?,
                    sinks: l.sinks.as_ref().map(load).transpose()?,
                    post_attention_norm: load(&l.post_attention_norm)?,
                    mlp: match &l.mlp {
                        MlpTensors::Dense(mlp) => MlpWeights::Dense {
                            gate_proj: linear(&mlp.gate_proj)?,
                            up_proj: linear(&mlp.up_proj)?,
                            down_proj: linear(&mlp.down_proj)?,
                        },
                        MlpTensors::Moe(moe) => MlpWeights::Moe(Box::new(MoeWeights {
                            router: linear(&moe.router)?,
                            gate_proj: experts(&moe.gate_proj)?,
                            up_proj: experts(&moe.up_proj)?,
                            down_proj: experts(&moe.down_proj)?,
                            shared_expert: match &moe.shared_expert {
                                Some((shared, gate)) => Some((
                                    [
                                        linear(&shared.gate_proj)?,
                                        linear(&shared.up_proj)?,
                                        linear(&shared.down_proj)?,
                                    ],
                                    linear(gate)?,
                                )),
                                None => None,
                            },
                        })),
                        MlpTensors::GptOss(moe) => MlpWeights::GptOss(Box::new(
                            GptOssMoeWeights::load(model.weights, moe, linear(&moe.router)?)?,
                        )),
                    },
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed_tokens = LinearTensors {
            weight: tensors.embed_tokens.clone(),
            fp8: None,
        };
        Ok(Self {
            embed_tokens: linear(&embed_tokens)?,
            layers,
            final_norm: load(&tensors.final_norm)?,
            lm_head: if tensors.lm_head_tied() {
                None
            } else {
                Some(linear(&tensors.lm_head)?)
            },
        })
    }

    /// The LM head, `[vocab, hidden]`.
    pub fn lm_head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
