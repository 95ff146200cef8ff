//! Uploading a model's weights to the GPU, with the q/k/v and gate/up projections fused into one
//! matrix each (so a layer runs four GEMMs): bf16 (f16/f32 converted), or, for a model whose
//! projections are FP8 (in the checkpoint, or quantized at load), E4M3 values with their scales
//! (`fp8.rs`).

use std::sync::Arc;

use cudarc::driver::CudaContext;
use indicatif::ProgressBar;

use crate::model::weights::ModelWeights;
use crate::model::{
    LinearTensors, LmHead, MlpTensors, ModelConfig, ModelDefinition, ModelTensors, TensorSpec,
    layout,
};

use super::error::CudaInitError;
use super::fp8::{DeviceScales, InputQuantization, quantize_per_channel};
use super::gpt_oss::GptOssLayerWeights;
use super::launch::{Bf16, DevicePtr, E4m3};
use super::memory::DeviceBuffer;
use super::moe::MoeLayerWeights;
use super::upload::{self, Piece, UploadStats};

/// An FP8 projection on the device: E4M3 values, their scales, and how its input is quantized.
pub struct Fp8Projection {
    /// The `[out, in]` E4M3 values.
    pub values: DeviceBuffer,
    /// The `[out, groups]` f32 scales.
    pub scales: DeviceBuffer,
    /// Scales per row.
    pub groups: usize,
    /// Input columns per scale.
    pub group: usize,
    /// How the product's input is quantized; `None`: it stays bf16 (weight-only FP8).
    pub input: Option<InputQuantization>,
}

/// What a product needs of an FP8 projection: its addresses and layout.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Operand {
    /// The `[out, in]` E4M3 values.
    pub values: DevicePtr<E4m3>,
    /// The `[out, groups]` f32 scales.
    pub scales: DevicePtr<f32>,
    /// Scales per row.
    pub groups: usize,
    /// Input columns per scale.
    pub group: usize,
    /// How the product's input is quantized; `None`: it stays bf16.
    pub input: Option<InputQuantization>,
}

impl Fp8Operand {
    /// Whether the RMSNorm before the product quantizes its input (`fp8_add_rmsnorm`): an input
    /// quantized with one scale per token, dynamic or static.
    pub fn norm_quantizes(&self) -> bool {
        self.input.is_some_and(|i| i.per_token())
    }

    /// Whether cuBLASLt's FP8 product of the codes, scaled after, can compute it: one scale per
    /// weight row and one per token, and rows in multiples of 4 (`fp8_scale_output`).
    pub fn takes_scaled_gemm(&self, n: usize) -> bool {
        self.groups == 1 && self.input.is_some_and(|i| i.per_token()) && n.is_multiple_of(4)
    }
}

impl Fp8Projection {
    /// What a product needs of it.
    pub fn operand(&self) -> Fp8Operand {
        Fp8Operand {
            values: self.values.device_ptr(),
            scales: self.scales.device_ptr(),
            groups: self.groups,
            group: self.group,
            input: self.input,
        }
    }
}

/// A projection's weights as a product takes them.
#[derive(Debug, Clone, Copy)]
pub enum Operand {
    /// bf16 weights.
    Bf16(DevicePtr<Bf16>),
    /// FP8 weights and their scales.
    Fp8(Fp8Operand),
}

/// A projection's weights on the device.
pub enum Projection {
    /// bf16 values.
    Bf16(DeviceBuffer),
    /// E4M3 values and scales.
    Fp8(Fp8Projection),
}

impl Projection {
    /// The bf16 weights' address, when the projection is in bf16.
    pub fn bf16(&self) -> Option<DevicePtr<Bf16>> {
        match self {
            Self::Bf16(buffer) => Some(buffer.device_ptr()),
            Self::Fp8(_) => None,
        }
    }

    /// The projection as a product takes it.
    pub fn operand(&self) -> Operand {
        match self {
            Self::Bf16(buffer) => Operand::Bf16(buffer.device_ptr()),
            Self::Fp8(fp8) => Operand::Fp8(fp8.operand()),
        }
    }
}

/// One transformer block's weights on the device.
pub struct LayerWeights {
    /// RMSNorm before attention, `[hidden]`.
    pub input_norm: DeviceBuffer,
    /// q, k and v projections stacked, `[(q_heads + 2 kv_heads) * head_dim, hidden]`.
    pub qkv: Projection,
    /// Their biases stacked (Qwen2).
    pub qkv_bias: Option<DeviceBuffer>,
    /// Per-head RMSNorm weights of q (Qwen3), `[head_dim]`.
    pub q_norm: Option<DeviceBuffer>,
    /// Per-head RMSNorm weights of k (Qwen3), `[head_dim]`.
    pub k_norm: Option<DeviceBuffer>,
    /// Output projection, `[hidden, q_heads * head_dim]`.
    pub o_proj: Projection,
    /// The output projection's bias (gpt-oss), `[hidden]`.
    pub o_bias: Option<DeviceBuffer>,
    /// Per-head attention sinks (gpt-oss), `[q_heads]` fp32.
    pub sinks: Option<DeviceBuffer>,
    /// RMSNorm before the MLP, `[hidden]`.
    pub post_norm: DeviceBuffer,
    /// The MLP's weights.
    pub mlp: LayerMlp,
}

/// A layer's MLP weights on the device, as its definition declares the MLP.
pub enum LayerMlp {
    /// A dense SwiGLU.
    Dense {
        /// Gate and up projections stacked, `[2 * intermediate, hidden]`.
        gate_up: Projection,
        /// Down projection, `[hidden, intermediate]`.
        down: Projection,
    },
    /// A mixture of experts.
    Moe(MoeLayerWeights),
    /// gpt-oss's experts.
    GptOss(GptOssLayerWeights),
}

impl LayerWeights {
    /// The dense MLP's gate/up and down projections, or `None` in a sparse layer.
    pub fn dense(&self) -> Option<(&Projection, &Projection)> {
        match &self.mlp {
            LayerMlp::Dense { gate_up, down } => Some((gate_up, down)),
            LayerMlp::Moe(_) | LayerMlp::GptOss(_) => None,
        }
    }

    /// The experts' weights, or `None` in a dense layer.
    pub fn moe(&self) -> Option<&MoeLayerWeights> {
        match &self.mlp {
            LayerMlp::Moe(moe) => Some(moe),
            LayerMlp::Dense { .. } | LayerMlp::GptOss(_) => None,
        }
    }

    /// gpt-oss's experts, or `None` in another layer.
    pub fn gpt_oss(&self) -> Option<&GptOssLayerWeights> {
        match &self.mlp {
            LayerMlp::GptOss(experts) => Some(experts),
            LayerMlp::Dense { .. } | LayerMlp::Moe(_) => None,
        }
    }
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
pub(super) struct Allocator {
    targets: Vec<WeightTarget>,
    bytes: usize,
}

impl Allocator {
    /// Allocates one bf16 buffer for the tensors `parts`, one after another.
    pub(super) fn stacked(&mut self, parts: &[&TensorSpec]) -> Result<DeviceBuffer, CudaInitError> {
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

    /// The small tensor `spec` in fp32 (the attention sinks, which the kernels read in fp32),
    /// copied from `weights` now.
    fn floats(
        &mut self,
        spec: &TensorSpec,
        weights: Option<&ModelWeights>,
    ) -> Result<DeviceBuffer, CudaInitError> {
        let Some(weights) = weights else {
            return Err(CudaInitError::Unsupported(format!(
                "{} is copied in fp32 from the weights, not ahead of them",
                spec.name
            )));
        };
        let values = weights
            .to_f32(&spec.name, &spec.shape)
            .map_err(|e| CudaInitError::Weights(e.to_string()))?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.bytes += bytes.len();
        Ok(DeviceBuffer::from_bytes(&bytes)?)
    }

    /// Counts `bytes` more of weights built on the host and copied to the device.
    pub(super) fn add_bytes(&mut self, bytes: usize) {
        self.bytes += bytes;
    }

    /// Allocates one bf16 buffer for the tensor `spec`.
    fn one(&mut self, spec: &TensorSpec) -> Result<DeviceBuffer, CudaInitError> {
        self.stacked(&[spec])
    }

    /// The projections `parts` stacked: in FP8, built from `weights` and copied now, when they
    /// are FP8 in the layout and `weights` are at hand; otherwise a bf16 buffer to upload into.
    fn projection(
        &mut self,
        parts: &[&LinearTensors],
        weights: Option<&ModelWeights>,
    ) -> Result<Projection, CudaInitError> {
        let fp8 = parts.iter().filter(|p| p.fp8.is_some()).count();
        if fp8 == 0 {
            let specs: Vec<&TensorSpec> = parts.iter().map(|p| &p.weight).collect();
            return Ok(Projection::Bf16(self.stacked(&specs)?));
        }
        let names = || {
            parts
                .iter()
                .map(|p| p.weight.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(weights) = weights else {
            return Err(CudaInitError::Unsupported(format!(
                "FP8 projections ({}) are built from the weights, not ahead of them",
                names()
            )));
        };
        if fp8 != parts.len() {
            return Err(CudaInitError::Unsupported(format!(
                "the stacked projections {} mix FP8 and 16-bit weights",
                names()
            )));
        }
        let projection = fp8_projection(parts, weights)?;
        self.bytes += parts
            .iter()
            .map(|p| p.weight.shape.iter().product::<usize>())
            .sum::<usize>()
            + projection.groups * 4 * parts.iter().map(|p| p.weight.shape[0]).sum::<usize>();
        Ok(Projection::Fp8(projection))
    }
}

/// One FP8 projection built on the host: its E4M3 bytes, its scales in the device layout, its
/// static input scale (when the scheme has one) and its input's scheme.
pub(super) struct HostFp8<'w> {
    /// The `[out, in]` E4M3 bytes (a checkpoint's borrowed as they are).
    pub values: std::borrow::Cow<'w, [u8]>,
    /// The scales in the device layout.
    pub scales: DeviceScales,
    /// The checkpoint's static input scale.
    pub input_scale: Option<f32>,
    /// How the product's input is quantized.
    pub activations: crate::model::fp8::ActivationScale,
}

/// The FP8 projection `part` on the host: a checkpoint's E4M3 values as they are with their
/// scales in the device layout, or a 16-bit checkpoint's weights quantized per channel here.
pub(super) fn host_fp8<'w>(
    part: &LinearTensors,
    weights: &'w ModelWeights,
) -> Result<HostFp8<'w>, CudaInitError> {
    let err = |e: crate::model::ModelError| CudaInitError::Weights(e.to_string());
    let fp8 = part.fp8.as_ref().ok_or_else(|| {
        CudaInitError::Weights(format!("{} is not an FP8 projection", part.weight.name))
    })?;
    let (out, inp) = (part.weight.shape[0], part.weight.shape[1]);
    if !inp.is_multiple_of(16) {
        return Err(CudaInitError::Unsupported(format!(
            "the FP8 projection {} is {inp} columns wide; the FP8 kernels need a multiple of 16",
            part.weight.name
        )));
    }
    let view = weights.check_spec(&part.weight).map_err(err)?;
    let (values, scales) = match &fp8.scale {
        Some(scale) => {
            let checkpoint = weights.check_spec(scale).map_err(err)?.to_f32();
            let layout = DeviceScales::from_checkpoint(fp8.weights, &checkpoint, out, inp);
            if layout.groups > 1 && !layout.group.is_multiple_of(16) {
                return Err(CudaInitError::Unsupported(format!(
                    "the FP8 projection {} has scale blocks {} columns wide; the FP8 kernels need a multiple of 16",
                    part.weight.name, layout.group
                )));
            }
            (std::borrow::Cow::Borrowed(view.data), layout)
        }
        None => {
            let (codes, row_scales) = quantize_per_channel(&view, out, inp);
            let scales = DeviceScales {
                scales: row_scales,
                groups: 1,
                group: inp,
            };
            (std::borrow::Cow::Owned(codes), scales)
        }
    };
    let input_scale = match &fp8.input_scale {
        Some(spec) => Some(weights.check_spec(spec).map_err(err)?.to_f32()[0]),
        None => None,
    };
    Ok(HostFp8 {
        values,
        scales,
        input_scale,
        activations: fp8.activations,
    })
}

/// The f32 values `floats` as little-endian bytes (the device's scales).
pub(super) fn f32_bytes(floats: &[f32]) -> Vec<u8> {
    floats.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// The FP8 projections `parts` (each FP8 in the layout) stacked row after row on the device
/// ([`host_fp8`] each); the static input scale is the largest of theirs.
fn fp8_projection(
    parts: &[&LinearTensors],
    weights: &ModelWeights,
) -> Result<Fp8Projection, CudaInitError> {
    let mut values = Vec::new();
    let mut scales = Vec::new();
    let mut input_scale: Option<f32> = None;
    let mut scheme = None;
    for part in parts {
        let host = host_fp8(part, weights)?;
        values.extend_from_slice(&host.values);
        scales.push(host.scales);
        if let Some(s) = host.input_scale {
            input_scale = Some(input_scale.map_or(s, |m: f32| m.max(s)));
        }
        scheme = Some(host.activations);
    }
    let stacked = DeviceScales::stack(&scales).ok_or_else(|| {
        CudaInitError::Unsupported("stacked FP8 projections with different scale layouts".into())
    })?;
    Ok(Fp8Projection {
        values: DeviceBuffer::from_bytes(&values)?,
        scales: DeviceBuffer::from_bytes(&f32_bytes(&stacked.scales))?,
        groups: stacked.groups,
        group: stacked.group,
        input: scheme.and_then(|s| InputQuantization::of(s, input_scale)),
    })
}

impl ModelWeightsOnDevice {
    /// Allocates a device buffer for every weight the architecture needs and returns them
    /// with the pieces of the model's bytes to copy into them ([`upload::upload`]), so the copy
    /// can run while other start-up work uses the device.
    pub fn allocate(model: ModelTensors<'_>) -> Result<(Self, Vec<Piece<'_>>), CudaInitError> {
        let (weights, targets) = Self::build(model.config, Some(model.weights))?;
        let pieces = targets.pieces(model.weights)?;
        Ok((weights, pieces))
    }

    /// Allocates a device buffer for every weight of a model with configuration `c`, contents
    /// undefined, and returns where each tensor goes: everything the device needs is known from
    /// the configuration alone, so this can run before the weights are read. The tensors are
    /// those of the model definition's layout; q/k/v and gate/up are stacked into one buffer
    /// each. A model with FP8 projections is refused: those are built from the weights
    /// ([`ModelWeightsOnDevice::allocate`]).
    pub fn allocate_for(c: &ModelConfig) -> Result<(Self, WeightTargets), CudaInitError> {
        Self::build(c, None)
    }

    /// The weights' buffers: FP8 projections built and copied from `weights` now (they must be
    /// given when the model has any), every other tensor allocated in bf16 with its place in
    /// the returned targets.
    fn build(
        c: &ModelConfig,
        weights: Option<&ModelWeights>,
    ) -> Result<(Self, WeightTargets), CudaInitError> {
        if let (None, Some(quantization)) = (weights, &c.quantization) {
            return Err(CudaInitError::Unsupported(format!(
                "its weights are {}: FP8 projections are built from the weights, not ahead of them",
                quantization.describe()
            )));
        }
        let definition = ModelDefinition::of(c);
        let tensors = layout(&definition, c.quantization.as_ref());
        let mut up = Allocator::default();
        let embed = up.one(&tensors.embed_tokens)?;
        let mut layers = Vec::with_capacity(tensors.layers.len());
        for l in &tensors.layers {
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
                qkv: up.projection(&[&l.q_proj, &l.k_proj, &l.v_proj], weights)?,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: up.projection(&[&l.o_proj], weights)?,
                o_bias: match &l.o_bias {
                    Some(spec) => Some(up.one(spec)?),
                    None => None,
                },
                sinks: match &l.sinks {
                    Some(spec) => Some(up.floats(spec, weights)?),
                    None => None,
                },
                post_norm: up.one(&l.post_attention_norm)?,
                mlp: match &l.mlp {
                    MlpTensors::Dense(mlp) => LayerMlp::Dense {
                        gate_up: up.projection(&[&mlp.gate_proj, &mlp.up_proj], weights)?,
                        down: up.projection(&[&mlp.down_proj], weights)?,
                    },
                    MlpTensors::Moe(moe) => {
                        LayerMlp::Moe(MoeLayerWeights::allocate(&mut up, moe, weights)?)
                    }
                    MlpTensors::GptOss(experts) => {
                        LayerMlp::GptOss(GptOssLayerWeights::allocate(&mut up, experts, weights)?)
                    }
                },
            });
        }
        let final_norm = up.one(&tensors.final_norm)?;
        let lm_head = match definition.lm_head {
            LmHead::TiedToEmbeddings | LmHead::Absent => None,
            LmHead::Separate if tensors.lm_head.fp8.is_some() => {
                // An FP8 LM head is widened to bf16 here (its scales applied): the head's
                // product runs in bf16.
                let Some(weights) = weights else {
                    return Err(CudaInitError::Unsupported(
                        "an FP8 LM head is built from the weights, not ahead of them".into(),
                    ));
                };
                let values = weights
                    .linear_f32(&tensors.lm_head)
                    .map_err(|e| CudaInitError::Weights(e.to_string()))?;
                let bytes: Vec<u8> = values
                    .iter()
                    .flat_map(|v| f32_to_bf16(*v).to_le_bytes())
                    .collect();
                up.bytes += bytes.len();
                Some(DeviceBuffer::from_bytes(&bytes)?)
            }
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

    /// A configuration with FP8 projections is not allocated ahead of its weights (before
    /// anything touches the device): its projections are built from the weights.
    #[test]
    fn fp8_configurations_are_not_allocated_ahead_of_the_weights() {
        let mut config = crate::model::Model::embedded().unwrap().config.clone();
        config.quantization = Some(crate::model::Quantization::fp8_at_load());
        let err = match ModelWeightsOnDevice::allocate_for(&config) {
            Ok(_) => panic!("FP8 weights allocated ahead of the weights"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("fp8") && !err.contains('\n'), "{err}");
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
