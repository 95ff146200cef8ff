//! The model's weights converted to f32 for the CPU backend, following the tensor layout of the
//! model definition. FP8 projections are dequantized here (their scales applied), and their
//! inputs are rounded to FP8 at every product as the checkpoint's scheme says, so the CPU
//! computes what an FP8 product multiplies.

use crate::model::fp8::ActivationScale;
use crate::model::{
    LinearTensors, ModelDefinition, ModelError, ModelTensors, Quantization, TensorSpec, layout,
};

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
        if self.activations == ActivationScale::None {
            return math::matmul(x, &self.weight, tokens, self.inp, self.out);
        }
        let mut rounded = x.to_vec();
        self.activations
            .apply(&mut rounded, tokens, self.input_scale);
        math::matmul(&rounded, &self.weight, tokens, self.inp, self.out)
    }
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
    pub post_attention_norm: Vec<f32>,
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
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
        let load = |spec: &TensorSpec| model.weights.to_f32(&spec.name, &spec.shape);
        let linear = |spec: &LinearTensors| -> Result<Linear, ModelError> {
            let (activations, input_scale) = match &spec.fp8 {
                None => (ActivationScale::None, None),
                Some(fp8) => (
                    fp8.activations,
                    match &fp8.input_scale {
                        Some(spec) => Some(load(spec)?[0]),
                        None => None,
                    },
                ),
            };
            Ok(Linear {
                weight: model.weights.linear_f32(spec)?,
                inp: spec.weight.shape[1],
                out: spec.weight.shape[0],
                activations,
                input_scale,
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
                    post_attention_norm: load(&l.post_attention_norm)?,
                    gate_proj: linear(&l.gate_proj)?,
                    up_proj: linear(&l.up_proj)?,
                    down_proj: linear(&l.down_proj)?,
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
