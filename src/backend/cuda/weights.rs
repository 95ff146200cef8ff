//! Uploading a model's weights to the GPU in bf16, with the q/k/v and gate/up projections fused
//! into one matrix each (so a layer runs four GEMMs).

use std::sync::Arc;

use cudarc::driver::CudaContext;
use indicatif::ProgressBar;

use crate::model::weights::ModelWeights;
use crate::model::{LmHead, ModelConfig, ModelDefinition, ModelTensors, TensorSpec, layout};

use super::error::CudaInitError;
use super::launch::{Bf16, DevicePtr};
use super::memory::DeviceBuffer;
use super::upload::{self, Piece, UploadStats};

/// One transformer block's weights on the device.
pub struct LayerWeights {
    /// RMSNorm before attention, `[hidden]`.
    pub input_norm: DeviceBuffer,
    /// q, k and v projections stacked, `[(q_heads + 2 kv_heads) * head_dim, hidden]`.
    pub qkv: DeviceBuffer,
    /// Their biases stacked (Qwen2).
    pub qkv_bias: Option<DeviceBuffer>,
    /// Per-head RMSNorm weights of q (Qwen3), `[head_dim]`.
    pub q_norm: Option<DeviceBuffer>,
    /// Per-head RMSNorm weights of k (Qwen3), `[head_dim]`.
    pub k_norm: Option<DeviceBuffer>,
    /// Output projection, `[hidden, q_heads * head_dim]`.
    pub o_proj: DeviceBuffer,
    /// RMSNorm before the MLP, `[hidden]`.
    pub post_norm: DeviceBuffer,
    /// Gate and up projections stacked, `[2 * intermediate, hidden]`.
    pub gate_up: DeviceBuffer,
    /// Down projection, `[hidden, intermediate]`.
    pub down: DeviceBuffer,
}

/// Every weight of a model on the device.
pub struct ModelWeightsOnDevice {
    /// Token embeddings, `[vocab, hidden]`.
    pub embed: DeviceBuffer,
    /// The blocks.
    pub layers: Vec<LayerWeights>,
    /// The final RMSNorm, `[hidden]`.
    pub final_norm: DeviceBuffer,
    /// The LM head, absent when tied to the embeddings.
    pub lm_head: Option<DeviceBuffer>,
    /// Rotary inverse frequencies (scaling applied), `[head_dim / 2]` fp32.
    pub inv_freq: DeviceBuffer,
    bytes: usize,
}

/// Rounds to bf16, nearest even (the kernels' rounding).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    (rounded >> 16) as u16
}

/// Where one of the model's tensors goes on the device.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightTarget {
    /// The tensor's name in the shards.
    pub name: String,
    /// The shape the architecture expects.
    pub shape: Vec<usize>,
    /// Device address of its bf16 copy.
    pub dst: u64,
}

/// Every tensor's place in the weights' device buffers, in the order they were allocated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightTargets {
    tensors: Vec<WeightTarget>,
}

impl WeightTargets {
    /// Each tensor's place.
    pub fn iter(&self) -> impl Iterator<Item = &WeightTarget> {
        self.tensors.iter()
    }

    /// The pieces of `weights`' bytes to copy to these places, each tensor checked against its
    /// expected shape.
    pub fn pieces<'m>(&self, weights: &'m ModelWeights) -> Result<Vec<Piece<'m>>, CudaInitError> {
        self.tensors
            .iter()
            .map(|target| {
                let view = weights
                    .tensor(&target.name)
                    .map_err(|e| CudaInitError::Weights(e.to_string()))?;
                if view.shape != target.shape {
                    return Err(CudaInitError::Weights(format!(
                        "tensor {} has shape {:?}, expected {:?}",
                        target.name, view.shape, target.shape
                    )));
                }
                Ok(Piece {
                    dst: target.dst,
                    dtype: view.dtype,
                    data: view.data,
                })
            })
            .collect()
    }
}

/// Allocates each weight's device buffer and records where each tensor goes in it.
#[derive(Default)]
struct Allocator {
    targets: Vec<WeightTarget>,
    bytes: usize,
}

impl Allocator {
    /// Allocates one bf16 buffer for the tensors `parts`, one after another.
    fn stacked(&mut self, parts: &[&TensorSpec]) -> Result<DeviceBuffer, CudaInitError> {
        let total: usize = parts
            .iter()
            .map(|spec| spec.shape.iter().product::<usize>() * 2)
            .sum();
        let buffer = DeviceBuffer::new(total)?;
        let mut offset = 0;
        for spec in parts {
            self.targets.push(WeightTarget {
                name: spec.name.clone(),
                shape: spec.shape.clone(),
                dst: buffer.at(offset),
            });
            offset += spec.shape.iter().product::<usize>() * 2;
        }
        self.bytes += total;
        Ok(buffer)
    }

    /// Allocates one bf16 buffer for the tensor `spec`.
    fn one(&mut self, spec: &TensorSpec) -> Result<DeviceBuffer, CudaInitError> {
        self.stacked(&[spec])
    }
}

impl ModelWeightsOnDevice {
    /// Allocates a device buffer for every weight the architecture needs and returns them
    /// with the pieces of the model's bytes to copy into them ([`upload::upload`]), so the copy
    /// can run while other start-up work uses the device.
    pub fn allocate(model: ModelTensors<'_>) -> Result<(Self, Vec<Piece<'_>>), CudaInitError> {
        let (weights, targets) = Self::allocate_for(model.config)?;
        let pieces = targets.pieces(model.weights)?;
        Ok((weights, pieces))
    }

    /// Allocates a device buffer for every weight of a model with configuration `c`, contents
    /// undefined, and returns where each tensor goes: everything the device needs is known from
    /// the configuration alone, so this can run before the weights are read. The tensors are
    /// those of the model definition's layout; q/k/v and gate/up are stacked into one buffer
    /// each.
    pub fn allocate_for(c: &ModelConfig) -> Result<(Self, WeightTargets), CudaInitError> {
        if let Some(quantization) = &c.quantization {
            return Err(CudaInitError::Unsupported(format!(
                "its weights are {}, which the CUDA backend does not serve yet (the CPU backend does: --device cpu)",
                quantization.describe()
            )));
        }
        let definition = ModelDefinition::of(c);
        let tensors = layout(&definition, None);
        let mut up = Allocator::default();
        let embed = up.one(&tensors.embed_tokens)?;
        let mut layers = Vec::with_capacity(tensors.layers.len());
        for l in &tensors.layers {
            let mlp = l.mlp.dense().ok_or_else(|| {
                CudaInitError::Unsupported(super::kernels::MOE_UNSUPPORTED.into())
            })?;
            let qkv_bias = match &l.qkv_bias {
                Some([q, k, v]) => Some(up.stacked(&[q, k, v])?),
                None => None,
            };
            let (q_norm, k_norm) = match &l.qk_norm {
                Some([q, k]) => (Some(up.one(q)?), Some(up.one(k)?)),
                None => (None, None),
            };
            layers.push(LayerWeights {
                input_norm: up.one(&l.input_norm)?,
                qkv: up.stacked(&[&l.q_proj.weight, &l.k_proj.weight, &l.v_proj.weight])?,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: up.one(&l.o_proj.weight)?,
                post_norm: up.one(&l.post_attention_norm)?,
                gate_up: up.stacked(&[&mlp.gate_proj.weight, &mlp.up_proj.weight])?,
                down: up.one(&mlp.down_proj.weight)?,
            });
        }
        let final_norm = up.one(&tensors.final_norm)?;
        let lm_head = match definition.lm_head {
            LmHead::TiedToEmbeddings => None,
            LmHead::Separate => Some(up.one(&tensors.lm_head.weight)?),
        };
        let attention = definition.attention();
        let inv: Vec<u8> = attention
            .rope
            .inv_freqs(attention.head_dim)
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let inv_freq = DeviceBuffer::from_bytes(&inv)?;
        let weights = Self {
            embed,
            layers,
            final_norm,
            lm_head,
            inv_freq,
            bytes: up.bytes,
        };
        Ok((
            weights,
            WeightTargets {
                tensors: up.targets,
            },
        ))
    }

    /// Copies `pieces` (from [`ModelWeightsOnDevice::allocate`]) to the device (see `upload.rs`:
    /// parallel reads through pinned staging buffers on several streams) and logs how it went.
    /// `progress` counts the bf16 bytes copied.
    pub fn upload(
        ctx: &Arc<CudaContext>,
        pieces: &[Piece<'_>],
        progress: &ProgressBar,
    ) -> Result<UploadStats, CudaInitError> {
        let stats = upload::upload(ctx, pieces, progress)
            .map_err(|e| CudaInitError::Weights(e.to_string()))?;
        let secs = stats.wall.as_secs_f64().max(1e-9);
        tracing::info!(
            bytes = stats.bytes,
            chunks = stats.chunks,
            workers = stats.workers,
            staging_mib = upload::STAGING_BYTES >> 20,
            wall_ms = stats.wall.as_millis() as u64,
            read_ms_summed = stats.read.as_millis() as u64,
            wait_ms_summed = stats.wait.as_millis() as u64,
            gb_per_s = format!("{:.1}", stats.bytes as f64 / secs / 1e9),
            "weights uploaded (parallel reads, pinned staging, one stream per worker)"
        );
        Ok(stats)
    }

    /// The LM head's address (the embeddings when tied).
    pub fn lm_head_ptr(&self) -> DevicePtr<Bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed).device_ptr()
    }

    /// Bytes uploaded.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even mantissa.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert!(f32::from_bits(u32::from(f32_to_bf16(f32::NAN)) << 16).is_nan());
    }

    #[test]
    fn targets_take_each_tensors_bytes_and_refuse_another_shape() {
        let model = crate::model::Model::embedded().unwrap();
        let embed = model.weights.tensor("model.embed_tokens.weight").unwrap();
        let norm = model.weights.tensor("model.norm.weight").unwrap();
        let target = |name: &str, shape: &[usize], dst: u64| WeightTarget {
            name: name.into(),
            shape: shape.to_vec(),
            dst,
        };
        let targets = WeightTargets {
            tensors: vec![
                target("model.embed_tokens.weight", &embed.shape, 0x10000),
                target("model.norm.weight", &norm.shape, 0x20000),
            ],
        };
        let pieces = targets.pieces(&model.weights).unwrap();
        assert_eq!(pieces.len(), 2);
        assert_eq!((pieces[0].dst, pieces[0].data), (0x10000, embed.data));
        assert_eq!((pieces[1].dst, pieces[1].data), (0x20000, norm.data));

        let wrong = WeightTargets {
            tensors: vec![target("model.norm.weight", &[norm.shape[0] + 1], 0x20000)],
        };
        let err = wrong.pieces(&model.weights).unwrap_err().to_string();
        assert!(err.contains("model.norm.weight"), "{err}");
        let missing = WeightTargets {
            tensors: vec![target("model.nothing", &[1], 0x20000)],
        };
        assert!(missing.pieces(&model.weights).is_err());
    }
}
