//! gpt-oss's experts on the device: each layer's router with its bias and every expert's biased
//! projections in bf16, MXFP4 checkpoints dequantized at load (`kernels/gpt_oss.cu`).

use crate::model::ModelWeights;
use crate::model::gpt_oss::{ExpertProjection, GptOssMoeTensors};

use super::error::CudaInitError;
use super::memory::DeviceBuffer;
use super::weights::{Allocator, f32_to_bf16};

/// One gpt-oss layer's expert weights, bf16.
pub struct GptOssLayerWeights {
    /// The router, `[experts, hidden]`.
    pub router: DeviceBuffer,
    /// Its bias, `[experts]`.
    pub router_bias: DeviceBuffer,
    /// Every expert's gate and up projections, interleaved as stored (row `2i` gate, `2i + 1`
    /// up): `[experts, 2 · width, hidden]`.
    pub gate_up: DeviceBuffer,
    /// Their biases, `[experts, 2 · width]`.
    pub gate_up_bias: DeviceBuffer,
    /// Every expert's down projection, `[experts, hidden, width]`.
    pub down: DeviceBuffer,
    /// Their biases, `[experts, hidden]`.
    pub down_bias: DeviceBuffer,
}

impl GptOssLayerWeights {
    /// Allocates the layer's buffers with `up`: the router and the biases are uploaded with the
    /// other tensors; the experts' matrices are built from `weights` now (MXFP4 dequantized, the
    /// input-major layout transposed), so they cannot be allocated ahead of the weights.
    pub(super) fn allocate(
        up: &mut Allocator,
        t: &GptOssMoeTensors,
        weights: Option<&ModelWeights>,
    ) -> Result<Self, CudaInitError> {
        let Some(weights) = weights else {
            return Err(CudaInitError::Unsupported(
                "gpt-oss's experts are built from the weights, not ahead of them".into(),
            ));
        };
        Ok(Self {
            router: up.stacked(&[&t.router.weight])?,
            router_bias: up.stacked(&[&t.router_bias])?,
            gate_up: experts_bf16(up, &t.gate_up, weights)?,
            gate_up_bias: up.stacked(&[&t.gate_up.bias])?,
            down: experts_bf16(up, &t.down, weights)?,
            down_bias: up.stacked(&[&t.down.bias])?,
        })
    }
}

/// Every expert's matrix of `projection` in bf16, `[experts, out, in]`, copied to the device.
fn experts_bf16(
    up: &mut Allocator,
    projection: &ExpertProjection,
    weights: &ModelWeights,
) -> Result<DeviceBuffer, CudaInitError> {
    let values = projection
        .to_f32(weights)
        .map_err(|e| CudaInitError::Weights(e.to_string()))?;
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|v| f32_to_bf16(*v).to_le_bytes())
        .collect();
    up.add_bytes(bytes.len());
    Ok(DeviceBuffer::from_bytes(&bytes)?)
}
