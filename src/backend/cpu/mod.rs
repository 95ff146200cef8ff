//! The CPU reference backend: a straightforward f32 forward pass over the paged KV cache,
//! multi-threaded with rayon.
//!
//! It is the oracle the CUDA backend is tested against and the default for small models on
//! machines without a GPU. Weights are converted to f32 once at load; every step computes in f32,
//! as the transformers reference does.

mod attention;
mod kv_cache;
mod math;
mod weights;

use crate::engine::{BLOCK_SIZE, Backend, BackendError, BatchRow, KvCacheShape, StepOutput};
use crate::model::{Model, ModelConfig, ModelError, ModelTensors};

use attention::TokenContext;
use kv_cache::{KvCache, slot};
use weights::{CpuWeights, LayerWeights};

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
    config: ModelConfig,
    weights: CpuWeights,
    inv_freqs: Vec<f32>,
    cache: KvCache,
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
        let config = model.config.clone();
        let slot_width = config.num_key_value_heads * config.head_dim;
        let block_bytes =
            KvCache::bytes_per_token(config.num_hidden_layers, slot_width) * BLOCK_SIZE;
        let num_blocks = (kv_cache_bytes / block_bytes as u64) as usize;
        if num_blocks == 0 {
            return Err(CpuBackendError::CacheTooSmall {
                budget: kv_cache_bytes,
                block: block_bytes,
            });
        }
        let weights = CpuWeights::load(model)?;
        let inv_freqs = config.rope.inv_freqs(config.head_dim);
        let cache = KvCache::new(config.num_hidden_layers, slot_width, num_blocks);
        Ok(Self {
            config,
            weights,
            inv_freqs,
            cache,
        })
    }

    /// Checks token ids, positions and block tables before touching memory.
    fn validate(&self, rows: &[BatchRow<'_>]) -> Result<(), BackendError> {
        for row in rows {
            let end = row.start_pos + row.tokens.len();
            if row.tokens.is_empty() || row.block_table.len() * BLOCK_SIZE < end {
                return Err(BackendError::InvalidBatch(format!(
                    "sequence {}: {} tokens at position {} with {} blocks",
                    row.seq_id,
                    row.tokens.len(),
                    row.start_pos,
                    row.block_table.len()
                )));
            }
            if let Some(&block) = row
                .block_table
                .iter()
                .find(|&&b| b as usize >= self.cache.num_blocks)
            {
                return Err(BackendError::InvalidBatch(format!(
                    "block {block} is outside the cache"
                )));
            }
            if let Some(&token) = row
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(BackendError::InvalidBatch(format!(
                    "token {token} is outside the vocabulary"
                )));
            }
        }
        Ok(())
    }

    /// One transformer block over the batch's hidden states, in place.
    fn layer(
        &mut self,
        index: usize,
        hidden: &mut [f32],
        contexts: &[TokenContext<'_>],
        slots: &[usize],
    ) {
        let cfg = &self.config;
        let w: &LayerWeights = &self.weights.layers[index];
        let (dim, tokens) = (cfg.hidden_size, contexts.len());
        let (heads, kv_heads, head_dim) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let (q_dim, kv_dim) = (heads * head_dim, kv_heads * head_dim);

        let x = math::rms_norm(hidden, &w.input_norm, cfg.rms_norm_eps);
        let mut q = math::matmul(&x, &w.q_proj, tokens, dim, q_dim);
        let mut k = math::matmul(&x, &w.k_proj, tokens, dim, kv_dim);
        let mut v = math::matmul(&x, &w.v_proj, tokens, dim, kv_dim);
        if let Some([qb, kb, vb]) = &w.qkv_bias {
            math::add_bias(&mut q, qb);
            math::add_bias(&mut k, kb);
            math::add_bias(&mut v, vb);
        }
        if let Some([qn, kn]) = &w.qk_norm {
            q = math::rms_norm(&q, qn, cfg.rms_norm_eps);
            k = math::rms_norm(&k, kn, cfg.rms_norm_eps);
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
        let cache = &mut self.cache.layers[index];
        for (t, &s) in slots.iter().enumerate() {
            cache.keys[s * kv_dim..(s + 1) * kv_dim]
                .copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
            cache.values[s * kv_dim..(s + 1) * kv_dim]
                .copy_from_slice(&v[t * kv_dim..(t + 1) * kv_dim]);
        }
        let attn = attention::attend(&q, cache, contexts, heads, kv_heads, head_dim);
        math::add_assign(hidden, &math::matmul(&attn, &w.o_proj, tokens, q_dim, dim));

        let x = math::rms_norm(hidden, &w.post_attention_norm, cfg.rms_norm_eps);
        let inter = cfg.intermediate_size;
        let mut gate = math::matmul(&x, &w.gate_proj, tokens, dim, inter);
        let up = math::matmul(&x, &w.up_proj, tokens, dim, inter);
        math::swiglu(&mut gate, &up);
        math::add_assign(
            hidden,
            &math::matmul(&gate, &w.down_proj, tokens, inter, dim),
        );
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
        }
    }

    fn step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        self.validate(rows)?;
        let dim = self.config.hidden_size;
        let mut contexts = Vec::new();
        let mut slots = Vec::new();
        let mut hidden = Vec::new();
        let mut last_of_sampling_rows = Vec::new();
        for row in rows {
            for (i, &token) in row.tokens.iter().enumerate() {
                let position = row.start_pos + i;
                contexts.push(TokenContext {
                    position,
                    block_table: row.block_table,
                });
                slots.push(slot(row.block_table, position));
                let t = token as usize;
                hidden.extend_from_slice(&self.weights.embed_tokens[t * dim..(t + 1) * dim]);
            }
            if row.sample.is_some() {
                last_of_sampling_rows.push(contexts.len() - 1);
            }
        }
        for index in 0..self.config.num_hidden_layers {
            self.layer(index, &mut hidden, &contexts, &slots);
        }
        let last: Vec<f32> = last_of_sampling_rows
            .iter()
            .flat_map(|&t| hidden[t * dim..(t + 1) * dim].iter().copied())
            .collect();
        let normed = math::rms_norm(&last, &self.weights.final_norm, self.config.rms_norm_eps);
        let vocab = self.config.vocab_size;
        let logits = math::matmul(
            &normed,
            self.weights.lm_head(),
            last_of_sampling_rows.len(),
            dim,
            vocab,
        );
        Ok(StepOutput::Logits(
            logits.chunks(vocab).map(<[f32]>::to_vec).collect(),
        ))
    }
}
