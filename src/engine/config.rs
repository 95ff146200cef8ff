//! Engine settings (the `[engine]` table of the configuration file).

use serde::Deserialize;

/// Tokens per KV-cache block.
pub const BLOCK_SIZE: usize = 16;

/// Scheduling and cache settings. Every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// The most sequences in one step.
    pub max_num_seqs: usize,
    /// The most tokens (prefill chunks plus decodes) in one step.
    pub max_batched_tokens: usize,
    /// While sequences are decoding, a step that also carries prompt chunks may take at most this
    /// many times a decode-only step, as measured while serving (at least 64 prompt tokens still
    /// go into each step, so prompts progress). 1.0 or less: no limit, every step may carry up to
    /// `max_batched_tokens`.
    pub itl_stall_limit: f64,
    /// Requests waiting beyond this many are refused (HTTP 429).
    pub max_waiting: usize,
    /// Bytes of KV cache for backends that size it from a budget (the CPU backend).
    pub kv_cache_bytes: u64,
    /// Fraction of free device memory given to the KV cache (the CUDA backend).
    pub gpu_memory_fraction: f64,
    /// Reuse KV blocks of identical prompt prefixes.
    pub prefix_caching: bool,
    /// Share cached prefixes across API keys. Off by default: a shared cache lets one principal
    /// learn, by timing, which prefixes another has sent.
    pub share_prefix_cache: bool,
    /// Replay decode steps from CUDA graphs captured at start-up for batch-size buckets (the
    /// CUDA backend; `false` runs every step eagerly, for A/B comparisons).
    pub cuda_graphs: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_batched_tokens: 2048,
            itl_stall_limit: 1.5,
            max_waiting: 1024,
            kv_cache_bytes: 256 << 20,
            gpu_memory_fraction: 0.9,
            prefix_caching: true,
            share_prefix_cache: false,
            cuda_graphs: true,
        }
    }
}
