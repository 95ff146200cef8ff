//! The per-layer scales of an FP8 KV cache (`--kv-cache-dtype fp8`): a checkpoint quantized with
//! a KV-cache scheme (compressed-tensors' `kv_cache_scheme`, as vLLM and llm-compressor write it)
//! stores one `self_attn.k_scale` and one `self_attn.v_scale` per layer; without them every scale
//! is 1.0. Both backends read them here, so the CPU reference and the GPU cache round alike.

use super::error::ModelError;
use super::weights::ModelWeights;

/// `[k_scale, v_scale]` of each of `layers` layers: the checkpoint's
/// `model.layers.{i}.self_attn.{k,v}_scale` (their first element) where present, else 1.0. A
/// scale that is not a finite positive number is refused: it would turn the cache into NaNs or
/// infinities.
pub fn kv_cache_scales(weights: &ModelWeights, layers: usize) -> Result<Vec<[f32; 2]>, ModelError> {
    (0..layers)
        .map(|i| Ok([scale(weights, i, "k_scale")?, scale(weights, i, "v_scale")?]))
        .collect()
}

/// One scale of layer `layer`, 1.0 when the checkpoint has none.
fn scale(weights: &ModelWeights, layer: usize, which: &str) -> Result<f32, ModelError> {
    let name = format!("model.layers.{layer}.self_attn.{which}");
    if weights.names().all(|n| n != name) {
        return Ok(1.0);
    }
    let value = weights
        .tensor(&name)?
        .to_f32()
        .first()
        .copied()
        .unwrap_or(1.0);
    if !value.is_finite() || value <= 0.0 {
        return Err(ModelError::TensorValue {
            name,
            reason: format!("{value} is not a usable KV-cache scale (a finite positive number)"),
        });
    }
    Ok(value)
}
