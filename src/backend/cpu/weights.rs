//! The model's weights converted to f32 for the CPU backend.

use crate::model::{ModelError, ModelTensors, TensorSpec, layout};

/// One transformer block's weights, `[out, in]` matrices as in the checkpoint.
#[derive(Debug)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub q_proj: Vec<f32>,
    pub k_proj: Vec<f32>,
    pub v_proj: Vec<f32>,
    /// Biases of q, k and v, when the architecture has them.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head RMSNorm weights of q and k, when the architecture has them.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub o_proj: Vec<f32>,
    pub post_attention_norm: Vec<f32>,
    pub gate_proj: Vec<f32>,
    pub up_proj: Vec<f32>,
    pub down_proj: Vec<f32>,
}

/// Every weight of the model in f32.
#[derive(Debug)]
pub struct CpuWeights {
    pub embed_tokens: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// The LM head; `None` when tied to the embeddings.
    pub lm_head: Option<Vec<f32>>,
}

impl CpuWeights {
    /// Converts the model's weights, following the architecture's tensor layout.
    pub fn load(model: ModelTensors<'_>) -> Result<Self, ModelError> {
        let tensors = layout(model.config);
        let load = |spec: &TensorSpec| model.weights.to_f32(&spec.name, &spec.shape);
        let layers = tensors
            .layers
            .iter()
            .map(|l| {
                Ok(LayerWeights {
                    input_norm: load(&l.input_norm)?,
                    q_proj: load(&l.q_proj)?,
                    k_proj: load(&l.k_proj)?,
                    v_proj: load(&l.v_proj)?,
                    qkv_bias: match &l.qkv_bias {
                        Some([q, k, v]) => Some([load(q)?, load(k)?, load(v)?]),
                        None => None,
                    },
                    qk_norm: match &l.qk_norm {
                        Some([q, k]) => Some([load(q)?, load(k)?]),
                        None => None,
                    },
                    o_proj: load(&l.o_proj)?,
                    post_attention_norm: load(&l.post_attention_norm)?,
                    gate_proj: load(&l.gate_proj)?,
                    up_proj: load(&l.up_proj)?,
                    down_proj: load(&l.down_proj)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let tied = tensors.lm_head.name == tensors.embed_tokens.name;
        Ok(Self {
            embed_tokens: load(&tensors.embed_tokens)?,
            layers,
            final_norm: load(&tensors.final_norm)?,
            lm_head: if tied {
                None
            } else {
                Some(load(&tensors.lm_head)?)
            },
        })
    }

    /// The LM head matrix, `[vocab, hidden]`.
    pub fn lm_head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed_tokens)
    }
}
