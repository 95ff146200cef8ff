//! Causal grouped-query attention over the paged KV cache.

use rayon::prelude::*;

use super::kv_cache::{LayerCache, slot};
use crate::model::AttentionDefinition;

/// Where one token of the batch sits: its position and its sequence's block table.
#[derive(Debug, Clone, Copy)]
pub struct TokenContext<'a> {
    pub position: usize,
    pub block_table: &'a [u32],
}

/// Attention as `definition` declares it, of every token's query heads over the cached keys and
/// values of positions `0..=position` of its sequence (only the last `sliding_window` of them
/// where the definition limits it). `queries` is `[tokens, heads * head_dim]`; the result has the
/// same shape. Query head `h` reads KV head `h / (heads / kv_heads)`. With `sinks`, head `h`'s
/// sink logit joins its softmax (in the max and the denominator) and weighs no value.
pub fn attend(
    queries: &[f32],
    cache: &LayerCache,
    contexts: &[TokenContext<'_>],
    definition: &AttentionDefinition,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let (heads, kv_heads, head_dim) = (
        definition.num_heads,
        definition.num_kv_heads,
        definition.head_dim,
    );
    let group = heads / kv_heads;
    let slot_width = kv_heads * head_dim;
    let scale = definition.scale();
    let window = definition.sliding_window.unwrap_or(usize::MAX);
    let mut out = vec![0.0f32; queries.len()];
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each(|(i, out_head)| {
            let (t, h) = (i / heads, i % heads);
            let ctx = contexts[t];
            let q = &queries[i * head_dim..(i + 1) * head_dim];
            let kv_offset = (h / group) * head_dim;
            let first = (ctx.position + 1).saturating_sub(window);
            let slots: Vec<usize> = (first..=ctx.position)
                .map(|p| slot(ctx.block_table, p))
                .collect();
            let scores: Vec<f32> = slots
                .iter()
                .map(|&s| {
                    let k = &cache.keys[s * slot_width + kv_offset..][..head_dim];
                    super::math::dot(q, k) * scale
                })
                .collect();
            let sink = sinks.map(|s| s[h]);
            let max = scores
                .iter()
                .copied()
                .chain(sink)
                .fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = weights.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - max).exp());
            for (&s, w) in slots.iter().zip(&weights) {
                let v = &cache.values[s * slot_width + kv_offset..][..head_dim];
                let w = w / total;
                for (o, x) in out_head.iter_mut().zip(v) {
                    *o += w * x;
                }
            }
        });
    out
}
