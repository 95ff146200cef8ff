//! gpt-oss's experts on the device: each layer's router with its bias and every expert's biased
//! projections, kept in MXFP4 as an MXFP4 checkpoint stores them (the products widen the codes in
//! registers) or in bf16 for the dequantized layout and for rows that are not whole MXFP4 blocks
//! (`kernels/gpt_oss.cu`).

use crate::model::ModelWeights;
use crate::model::gpt_oss::{ExpertProjection, ExpertStorage, GptOssMoeTensors};
use crate::model::mxfp4;

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
    pub gate_up: ExpertMatrix,
    /// Their biases, `[experts, 2 · width]`.
    pub gate_up_bias: DeviceBuffer,
    /// Every expert's down projection, `[experts, hidden, width]`.
    pub down: ExpertMatrix,
    /// Their biases, `[experts, hidden]`.
    pub down_bias: DeviceBuffer,
}

/// Every expert's matrix of one projection on the device.
pub enum ExpertMatrix {
    /// bf16 values, `[experts, out, in]`.
    Bf16(DeviceBuffer),
    /// MXFP4 as stored: `blocks` `[experts, out, in / 2]` bytes (two E2M1 codes each, the low
    /// nibble the even element), `scales` `[experts, out, in / 32]` E8M0 bytes.
    Mxfp4 {
        /// The packed codes.
        blocks: DeviceBuffer,
        /// One scale per 32 codes.
        scales: DeviceBuffer,
    },
}

impl GptOssLayerWeights {
    /// Allocates the layer's buffers with `up`: the router and the biases are uploaded with the
    /// other tensors; the experts' matrices are copied from `weights` now (MXFP4 as stored; the
    /// dequantized layout transposed to bf16), so they cannot be allocated ahead of the weights.
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
            gate_up: expert_matrix(up, &t.gate_up, weights)?,
            gate_up_bias: up.stacked(&[&t.gate_up.bias])?,
            down: expert_matrix(up, &t.down, weights)?,
            down_bias: up.stacked(&[&t.down.bias])?,
        })
    }
}

/// Every expert's matrix of `projection` on the device: MXFP4 blocks and scales as stored where
/// every row is whole blocks (no padding) and no scale is NaN, else bf16 `[experts, out, in]`.
fn expert_matrix(
    up: &mut Allocator,
    projection: &ExpertProjection,
    weights: &ModelWeights,
) -> Result<ExpertMatrix, CudaInitError> {
    let err = |e: crate::model::ModelError| CudaInitError::Weights(e.to_string());
    if let ExpertStorage::Mxfp4 { blocks, scales } = &projection.storage {
        let inp = projection.shape[2];
        let (blocks, scales) = (
            weights.packed(blocks).map_err(err)?,
            weights.packed(scales).map_err(err)?,
        );
        let whole = inp.is_multiple_of(mxfp4::BLOCK_ELEMENTS)
            && blocks.len() == scales.len() * mxfp4::BLOCK_BYTES
            && !scales.contains(&mxfp4::NAN_SCALE);
        if whole {
            up.add_bytes(blocks.len() + scales.len());
            return Ok(ExpertMatrix::Mxfp4 {
                blocks: DeviceBuffer::from_bytes(blocks)?,
                scales: DeviceBuffer::from_bytes(scales)?,
            });
        }
    }
    let values = projection
        .to_f32(weights)
        .map_err(|e| CudaInitError::Weights(e.to_string()))?;
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|v| f32_to_bf16(*v).to_le_bytes())
        .collect();
    up.add_bytes(bytes.len());
    Ok(ExpertMatrix::Bf16(DeviceBuffer::from_bytes(&bytes)?))
}
