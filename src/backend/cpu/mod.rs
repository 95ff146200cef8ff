//! The CPU reference backend: a straightforward f32 forward pass over the paged KV cache,
//! multi-threaded with rayon, executing the model definition (`model/definition.rs`) operation by
//! operation.
//!
//! It is the oracle the CUDA backend is tested against and the default for small models on
//! machines without a GPU. Weights are converted to f32 once at load; every step computes in f32,
//! as the transformers reference does.

mod attention;
mod gpt_oss;
mod kv_cache;
mod math;
mod moe;
mod topk;
mod weights;

use crate::engine::{
    BLOCK_SIZE, Backend, BackendError, BatchRow, KvCacheDtype, KvCacheShape, PositionOutput,
    StepOutput,
};
use crate::model::fp8::round_to_e4m3;
use crate::model::{
    ExpertKind, MlpDefinition, Model, ModelDefinition, ModelError, ModelTensors, Norm,
};

use attention::TokenContext;
use kv_cache::{KvCache, slot};
use weights::{CpuWeights, LayerWeights, MlpWeights};

/// The CPU backend could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CpuBackendError {
    /// A weight could not be read or converted.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The KV-cache budget does not hold a single block.
    #[error("the KV cache budget of {budget} bytes is below one block ({block} bytes)")]
    CacheTooSmall {
        /// The configured budget.
        budget: u64,
        /// Bytes per block.
        block: usize,
    },
}

/// The f32 reference forward pass.
#[derive(Debug)]
pub struct CpuBackend {
    definition: ModelDefinition,
    weights: CpuWeights,
    inv_freqs: Vec<f32>,
    /// The factor the rotary embedding scales q and k by (YaRN's attention scaling; else 1).
    rope_scale: f32,
    cache: KvCache,
    /// With an FP8 KV cache, each layer's key and value scales: what the cache holds is every
    /// key and value rounded to E4M3 at its scale.
    fp8_kv_scales: Option<Vec<[f32; 2]>>,
    /// Each token of the last step's smallest router gap over the sparse layers
    /// ([`CpuBackend::router_gaps`]).
    router_gaps: Vec<f32>,
}

impl CpuBackend {
    /// Converts `model`'s weights and allocates a KV cache of at most `kv_cache_bytes`.
    pub fn new(model: &Model, kv_cache_bytes: u64) -> Result<Self, CpuBackendError> {
        Self::from_tensors(model.tensors(), kv_cache_bytes)
    }

    /// [`CpuBackend::new`] from a model's configuration and weights alone.
    pub fn from_tensors(
        model: ModelTensors<'_>,
        kv_cache_bytes: u64,
    ) -> Result<Self, CpuBackendError> {
        let definition = model.definition();
        let attention = definition.attention();
        let slot_width = attention.kv_width();
        let windows: Vec<Option<usize>> = definition
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        let (_, _, slots) = crate::engine::kv_groups::layer_places(&windows);
        let block_bytes = KvCache::bytes_per_token(slots, slot_width) * BLOCK_SIZE;
        let num_blocks = (kv_cache_bytes / block_bytes as u64) as usize;
        if num_blocks == 0 {
            return Err(CpuBackendError::CacheTooSmall {
                budget: kv_cache_bytes,
                block: block_bytes,
            });
        }
        let weights = CpuWeights::load(model, &definition, model.config.quantization.as_ref())?;
        let inv_freqs = attention.rope.inv_freqs(attention.head_dim);
        let rope_scale = attention.rope.attention_factor();
        let cache = KvCache::new(&windows, slot_width, num_blocks);
        Ok(Self {
            definition,
            weights,
            inv_freqs,
            rope_scale,
            cache,
            fp8_kv_scales: None,
            router_gaps: Vec::new(),
        })
    }

    /// Each token of the last step, in the step's order: the smallest gap between the router
    /// logit of an expert it chose and that of one it left out, over the sparse layers
    /// (`moe::boundary_gap`: exact ties left out; infinity for a dense model or gpt-oss's
    /// experts). A backend that rounds the router's input differently may choose otherwise
    /// where this is small.
    pub fn router_gaps(&self) -> &[f32] {
        &self.router_gaps
    }

    /// The same backend with its KV cache of `dtype`: for `fp8`, keys and values are rounded to
    /// E4M3 as they are written, at the checkpoint's per-layer `self_attn.k_scale` and
    /// `v_scale` where it has them, else 1.0 (what an FP8 cache on the GPU stores).
    pub fn with_kv_cache_dtype(
        mut self,
        dtype: KvCacheDtype,
        model: ModelTensors<'_>,
    ) -> Result<Self, CpuBackendError> {
        self.fp8_kv_scales = match dtype {
            KvCacheDtype::Auto => None,
            KvCacheDtype::Fp8 => Some(crate::model::kv_scales::kv_cache_scales(
                model.weights,
                self.definition.layers.len(),
            )?),
        };
        Ok(self)
    }

    /// Checks token ids, positions and block tables before touching memory: every block a row
    /// reads or writes (in each group, from the first its window reaches) is in the cache.
    fn validate(&self, rows: &[BatchRow<'_>]) -> Result<(), BackendError> {
        let groups = self.cache.groups;
        for row in rows {
            let end = row.start_pos + row.tokens.len();
            let per_group = row.block_table.len() / groups.count();
            if row.tokens.is_empty()
                || row.block_table.len() % groups.count() != 0
                || per_group * BLOCK_SIZE < end
            {
                return Err(BackendError::InvalidBatch(format!(
                    "sequence {}: {} tokens at position {} with {} block table entries for {} \
                     KV groups",
                    row.seq_id,
                    row.tokens.len(),
                    row.start_pos,
                    row.block_table.len(),
                    groups.count()
                )));
            }
            for (g, table) in row.block_table.chunks(per_group).enumerate() {
                let read = groups.first_needed_block(g, row.start_pos)..end.div_ceil(BLOCK_SIZE);
                if let Some(&block) = table[read]
                    .iter()
                    .find(|&&b| b as usize >= self.cache.num_blocks)
                {
                    return Err(BackendError::InvalidBatch(format!(
                        "block {block} is outside the cache"
                    )));
                }
            }
            if let Some(&token) = row
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.definition.vocab)
            {
                return Err(BackendError::InvalidBatch(format!(
                    "token {token} is outside the vocabulary"
                )));
            }
        }
        Ok(())
    }

    /// The forward pass over `rows`, returning the logits after the last `positions[i]` tokens
    /// of the i-th row (row by row), and the final-norm hidden state of the last token of each
    /// row listed in `hidden_rows` (in that order).
    fn forward(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden_rows: &[usize],
    ) -> Result<PositionOutput, BackendError> {
        self.validate(rows)?;
        if positions.len() != rows.len()
            || rows.iter().zip(positions).any(|(r, &p)| p > r.tokens.len())
        {
            return Err(BackendError::InvalidBatch(
                "logits asked for more positions than a row has".into(),
            ));
        }
        if let Some(&row) = hidden_rows.iter().find(|&&row| row >= rows.len()) {
            return Err(BackendError::InvalidBatch(format!(
                "hidden state asked of row {row} of a step of {} rows",
                rows.len()
            )));
        }
        let dim = self.definition.hidden;
        let groups = self.cache.groups.count();
        let mut contexts: Vec<Vec<TokenContext<'_>>> = vec![Vec::new(); groups];
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); groups];
        let mut hidden = Vec::new();
        let mut outputs = Vec::new();
        let mut last_of_rows = Vec::with_capacity(rows.len());
        let mut tokens = 0;
        for (row, &wanted) in rows.iter().zip(positions) {
            let per_group = row.block_table.len() / groups;
            for (i, &token) in row.tokens.iter().enumerate() {
                let position = row.start_pos + i;
                for (g, table) in row.block_table.chunks(per_group).enumerate() {
                    contexts[g].push(TokenContext {
                        position,
                        block_table: table,
                    });
                    slots[g].push(slot(table, position));
                }
                let t = token as usize;
                hidden.extend_from_slice(&self.weights.embed_tokens.weight[t * dim..(t + 1) * dim]);
            }
            tokens += row.tokens.len();
            outputs.extend(tokens - wanted..tokens);
            last_of_rows.push(tokens.wrapping_sub(1));
        }
        self.router_gaps = vec![f32::INFINITY; tokens];
        for index in 0..self.definition.layers.len() {
            let group = self.cache.layers[index].group;
            self.layer(index, &mut hidden, &contexts[group], &slots[group]);
        }
        let final_norm = |tokens: &mut dyn Iterator<Item = usize>| {
            let last: Vec<f32> = tokens
                .flat_map(|t| hidden[t * dim..(t + 1) * dim].iter().copied())
                .collect();
            norm(self.definition.final_norm, &last, &self.weights.final_norm)
        };
        let normed = final_norm(&mut outputs.iter().copied());
        let states = final_norm(&mut hidden_rows.iter().map(|&row| last_of_rows[row]));
        let vocab = self.definition.vocab;
        let logits = self.weights.lm_head().apply(&normed, outputs.len());
        Ok((
            logits.chunks(vocab).map(<[f32]>::to_vec).collect(),
            states.chunks(dim).map(<[f32]>::to_vec).collect(),
        ))
    }

    /// One transformer block over the batch's hidden states, in place, as its definition
    /// declares it.
    fn layer(
        &mut self,
        index: usize,
        hidden: &mut [f32],
        contexts: &[TokenContext<'_>],
        slots: &[usize],
    ) {
        let layer = &self.definition.layers[index];
        let w: &LayerWeights = &self.weights.layers[index];
        let (dim, tokens) = (self.definition.hidden, contexts.len());
        let attention = &layer.attention;
        let head_dim = attention.head_dim;
        let (q_dim, kv_dim) = (attention.q_width(), attention.kv_width());

        let x = norm(layer.input_norm, hidden, &w.input_norm);
        let mut q = w.q_proj.apply(&x, tokens);
        let mut k = w.k_proj.apply(&x, tokens);
        let v = w.v_proj.apply(&x, tokens);
        let mut v = v;
        if let Some([qb, kb, vb]) = &w.qkv_bias {
            math::add_bias(&mut q, qb);
            math::add_bias(&mut k, kb);
            math::add_bias(&mut v, vb);
        }
        if let (Some(kind), Some([qn, kn])) = (attention.qk_norm, &w.qk_norm) {
            q = norm(kind, &q, qn);
            k = norm(kind, &k, kn);
        }
        for (t, ctx) in contexts.iter().enumerate() {
            math::rope(
                &mut q[t * q_dim..(t + 1) * q_dim],
                head_dim,
                ctx.position,
                &self.inv_freqs,
            );
            math::rope(
                &mut k[t * kv_dim..(t + 1) * kv_dim],
                head_dim,
                ctx.position,
                &self.inv_freqs,
            );
        }
        // YaRN scales cos and sin, so the rotated q and k, by its attention factor.
        if self.rope_scale != 1.0 {
            q.iter_mut().for_each(|x| *x *= self.rope_scale);
            k.iter_mut().for_each(|x| *x *= self.rope_scale);
        }
        if let Some(scales) = &self.fp8_kv_scales {
            let [k_scale, v_scale] = scales[index];
            k.iter_mut()
                .for_each(|x| *x = round_to_e4m3(*x / k_scale) * k_scale);
            v.iter_mut()
                .for_each(|x| *x = round_to_e4m3(*x / v_scale) * v_scale);
        }
        let cache = &mut self.cache.slots[self.cache.layers[index].slot];
        for (t, &s) in slots.iter().enumerate() {
            cache.keys[s * kv_dim..(s + 1) * kv_dim]
                .copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
            cache.values[s * kv_dim..(s + 1) * kv_dim]
                .copy_from_slice(&v[t * kv_dim..(t + 1) * kv_dim]);
        }
        let attn = attention::attend(&q, cache, contexts, attention, w.sinks.as_deref());
        let mut out = w.o_proj.apply(&attn, tokens);
        if let Some(bias) = &w.o_bias {
            math::add_bias(&mut out, bias);
        }
        math::add_assign(hidden, &out);

        let x = norm(layer.post_attention_norm, hidden, &w.post_attention_norm);
        match (&layer.mlp, &w.mlp) {
            (
                MlpDefinition::SwiGlu { .. },
                MlpWeights::Dense {
                    gate_proj,
                    up_proj,
                    down_proj,
                },
            ) => {
                let mut gate = gate_proj.apply(&x, tokens);
                let up = up_proj.apply(&x, tokens);
                math::swiglu(&mut gate, &up);
                math::add_assign(hidden, &down_proj.apply(&gate, tokens));
            }
            (MlpDefinition::Moe(definition), MlpWeights::Moe(experts)) => {
                let gaps = &mut self.router_gaps;
                let y = moe::apply(definition, experts, &x, tokens, dim, gaps);
                math::add_assign(hidden, &y);
            }
            (MlpDefinition::Moe(definition), MlpWeights::GptOss(experts)) => {
                let ExpertKind::ClampedSwiGlu { alpha, limit, .. } = definition.experts else {
                    unreachable!("gpt-oss weights are loaded for clamped experts only")
                };
                let gaps = &mut self.router_gaps;
                let shape = (tokens, dim);
                let y =
                    gpt_oss::apply(experts, definition.routing, [alpha, limit], &x, shape, gaps);
                math::add_assign(hidden, &y);
            }
            _ => unreachable!("the weights are loaded from the definition's layout"),
        }
        debug_assert_eq!(hidden.len(), tokens * dim);
    }
}

/// The norm `kind` of each row of `x` (rows as wide as `weight`).
fn norm(kind: Norm, x: &[f32], weight: &[f32]) -> Vec<f32> {
    match kind {
        Norm::Rms { eps } => math::rms_norm(x, weight, eps),
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn kv_cache(&self) -> KvCacheShape {
        KvCacheShape {
            num_blocks: self.cache.num_blocks,
            block_size: BLOCK_SIZE,
            groups: self.cache.groups,
        }
    }

    fn step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        self.step_with_hidden(rows, &[]).map(|(output, _)| output)
    }

    fn step_with_hidden(
        &mut self,
        rows: &[BatchRow<'_>],
        hidden_rows: &[usize],
    ) -> Result<(StepOutput, Vec<Vec<f32>>), BackendError> {
        let positions: Vec<usize> = rows
            .iter()
            .map(|r| usize::from(r.sample.is_some()))
            .collect();
        let (logits, states) = self.forward(rows, &positions, hidden_rows)?;
        Ok((StepOutput::Logits(logits), states))
    }

    fn position_logits(&self) -> bool {
        true
    }

    fn step_logits(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden: &[usize],
    ) -> Result<PositionOutput, BackendError> {
        self.forward(rows, positions, hidden)
    }
}
