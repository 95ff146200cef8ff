//! Engine settings (the `[engine]` table of the configuration file).

use serde::Deserialize;

use super::kv_groups::KvGroups;

/// Tokens per KV-cache block.
pub const BLOCK_SIZE: usize = 16;

/// The most sequences per step when `max_num_seqs` is not set (vLLM's default).
pub const MAX_NUM_SEQS_CAP: usize = 256;

/// KV blocks each running sequence is expected to hold when `max_num_seqs` is derived
/// (16 blocks = 256 tokens): admitting more sequences than the cache holds at this size would only
/// make the scheduler preempt.
pub const DERIVE_BLOCKS_PER_SEQ: usize = 16;

/// An `itl_stall_limit` as the scheduler applies it: `None` (no limit) when it is 1.0 or less.
pub fn itl_stall_limit_in_force(limit: f64) -> Option<f64> {
    (limit > 1.0).then_some(limit)
}

/// The default `max_num_seqs` for a KV cache of `num_blocks` blocks in `groups` when the
/// backend's per-step buffers hold at most `backend_rows` rows (`None`: no such limit): the
/// blocks divided by what a sequence of [`DERIVE_BLOCKS_PER_SEQ`] blocks of positions holds in
/// all the groups (a model with sliding layers beside full ones holds blocks in both), at most
/// [`MAX_NUM_SEQS_CAP`] and `backend_rows`, at least 1.
pub fn derive_max_num_seqs(
    num_blocks: usize,
    backend_rows: Option<usize>,
    groups: &KvGroups,
) -> usize {
    (num_blocks / groups.blocks_per_sequence(DERIVE_BLOCKS_PER_SEQ).max(1))
        .min(MAX_NUM_SEQS_CAP)
        .min(backend_rows.unwrap_or(usize::MAX))
        .max(1)
}

/// The element type of the KV cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// The backend's own type.
    #[default]
    Auto,
    /// FP8 E4M3, scaled per layer and per tensor (keys, values).
    Fp8,
}

/// Scheduling and cache settings. Every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// The most sequences in one step. Unset (the default): derived at start-up from the KV cache
    /// the backend allocated and the rows its step buffers hold ([`derive_max_num_seqs`]). A value
    /// set in the configuration always wins.
    pub max_num_seqs: Option<usize>,
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
    /// With `cuda_graphs`, also replay the parts of a step that carries prompt tokens between
    /// its attention launches from graphs captured at start-up for token-count buckets (the
    /// CUDA backend; `false` runs such steps eagerly, for A/B comparisons).
    pub cuda_mixed_graphs: bool,
    /// The KV cache's element type: `auto` (the backend's own: f32 on the CPU, bf16 on the GPU)
    /// or `fp8` (E4M3 with per-tensor k and v scales from the checkpoint where present, else
    /// 1.0; `--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// Launch every CUDA kernel with programmatic dependent launch, so it is scheduled while the
    /// previous kernel finishes and waits on the device for its results (the CUDA backend on
    /// compute capability 9.0 and later; `false` launches in plain stream order, for A/B
    /// comparisons).
    pub programmatic_launch: bool,
    /// Speculative decoding: the `[speculative]` table of the configuration file (a table of its
    /// own there, not a key of `[engine]`).
    #[serde(skip)]
    pub speculative: super::speculative::SpeculativeConfig,
}

impl EngineConfig {
    /// The sequence limit in force: the configured value, or the one derived for a KV cache of
    /// `num_blocks` blocks in one full-attention group with no backend row limit.
    pub fn max_num_seqs_for(&self, num_blocks: usize) -> usize {
        self.max_num_seqs
            .unwrap_or_else(|| derive_max_num_seqs(num_blocks, None, &KvGroups::default()))
            .max(1)
    }

    /// This configuration with `max_num_seqs` fixed: the configured value if set, otherwise the
    /// one derived from `num_blocks` KV blocks in `groups` and the backend's row limit
    /// `backend_rows`.
    pub fn resolved(
        mut self,
        num_blocks: usize,
        backend_rows: Option<usize>,
        groups: &KvGroups,
    ) -> Self {
        let derived = derive_max_num_seqs(num_blocks, backend_rows, groups);
        self.max_num_seqs = Some(self.max_num_seqs.unwrap_or(derived));
        self
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: None,
            max_batched_tokens: 2048,
            itl_stall_limit: 1.5,
            max_waiting: 1024,
            kv_cache_bytes: 256 << 20,
            gpu_memory_fraction: 0.9,
            prefix_caching: true,
            share_prefix_cache: false,
            cuda_graphs: true,
            cuda_mixed_graphs: true,
            kv_cache_dtype: KvCacheDtype::Auto,
            programmatic_launch: true,
            speculative: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_the_kv_cache_up_to_the_cap() {
        let full = KvGroups::default();
        // An 8B model on an 80 GB GPU: tens of thousands of blocks -> the cap, not 64.
        assert_eq!(derive_max_num_seqs(30_000, None, &full), MAX_NUM_SEQS_CAP);
        // A small cache: one sequence per 16 blocks.
        assert_eq!(derive_max_num_seqs(1_024, None, &full), 64);
        assert_eq!(derive_max_num_seqs(100, None, &full), 6);
        // Fewer blocks than one sequence's share still allows one sequence.
        assert_eq!(derive_max_num_seqs(3, None, &full), 1);
        assert_eq!(derive_max_num_seqs(0, None, &full), 1);
    }

    #[test]
    fn the_default_never_exceeds_the_rows_the_backend_sized_its_buffers_for() {
        let full = KvGroups::default();
        assert_eq!(derive_max_num_seqs(30_000, Some(128), &full), 128);
        assert_eq!(derive_max_num_seqs(1_024, Some(128), &full), 64);
        assert_eq!(derive_max_num_seqs(30_000, Some(0), &full), 1);
    }

    #[test]
    fn a_sequence_of_a_model_with_sliding_layers_holds_blocks_in_both_groups() {
        // gpt-oss: full layers beside layers sliding over 128 positions, which hold at most
        // 128 / 16 + 1 = 9 blocks: 16 + 9 blocks per sequence of 256 positions.
        let gpt_oss = KvGroups {
            full: true,
            sliding_window: Some(128),
        };
        assert_eq!(gpt_oss.blocks_per_sequence(DERIVE_BLOCKS_PER_SEQ), 25);
        assert_eq!(derive_max_num_seqs(1_000, None, &gpt_oss), 40);
        // Every layer sliding (Mistral's 4096 window): one group, capped by the positions.
        let all_sliding = KvGroups {
            full: false,
            sliding_window: Some(4096),
        };
        assert_eq!(derive_max_num_seqs(1_024, None, &all_sliding), 64);
        assert_eq!(
            EngineConfig::default()
                .resolved(1_000, Some(256), &gpt_oss)
                .max_num_seqs,
            Some(40)
        );
    }

    #[test]
    fn an_explicit_value_wins() {
        let config = EngineConfig {
            max_num_seqs: Some(7),
            ..EngineConfig::default()
        };
        assert_eq!(config.max_num_seqs_for(30_000), 7);
        assert_eq!(
            config
                .clone()
                .resolved(30_000, Some(256), &KvGroups::default())
                .max_num_seqs,
            Some(7)
        );
        assert_eq!(
            config
                .resolved(3, Some(2), &KvGroups::default())
                .max_num_seqs,
            Some(7)
        );
        let unset = EngineConfig::default();
        assert_eq!(unset.max_num_seqs, None);
        assert_eq!(unset.max_num_seqs_for(30_000), MAX_NUM_SEQS_CAP);
        assert_eq!(
            unset
                .resolved(30_000, Some(96), &KvGroups::default())
                .max_num_seqs,
            Some(96)
        );
    }

    #[test]
    fn the_config_file_sets_or_leaves_it_unset() {
        let set: EngineConfig = toml::from_str("max_num_seqs = 12").unwrap();
        assert_eq!(set.max_num_seqs, Some(12));
        let unset: EngineConfig = toml::from_str("max_batched_tokens = 512").unwrap();
        assert_eq!(unset.max_num_seqs, None);
    }
}
