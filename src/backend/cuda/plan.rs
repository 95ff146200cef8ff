//! Host-side decisions that size device buffers and launches: KV-cache capacity and the
//! split-K plan of the attention kernel. Pure functions, tested without a GPU.

use crate::engine::BLOCK_SIZE;

/// Bytes one KV block takes across all layers (keys and values, bf16).
pub fn kv_block_bytes(layers: usize, kv_heads: usize, head_dim: usize) -> usize {
    layers * 2 * BLOCK_SIZE * kv_heads * head_dim * 2
}

/// KV blocks that fit in `fraction` of `free_bytes` (the memory free after weights, activations
/// and workspaces are allocated).
pub fn kv_blocks(free_bytes: usize, fraction: f64, block_bytes: usize) -> usize {
    if block_bytes == 0 || !(0.0..=1.0).contains(&fraction) {
        return 0;
    }
    let budget = (free_bytes as f64 * fraction) as usize;
    budget / block_bytes
}

/// Split-K plan of one attention launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Partitions of the context (grid z).
    pub splits: usize,
    /// Positions per partition (a multiple of the block size).
    pub partition: usize,
}

/// Positions a partition should hold at least, so short contexts use one partition.
const MIN_PARTITION: usize = 256;

/// Plans the split-K launch for `num_tokens` query tokens whose longest context is
/// `max_context`, given room for `budget` (token, split) partial results.
pub fn split_plan(num_tokens: usize, max_context: usize, budget: usize) -> SplitPlan {
    let wanted = max_context.div_ceil(MIN_PARTITION).max(1);
    let room = (budget / num_tokens.max(1)).max(1);
    let splits = wanted.min(room);
    let partition = max_context.max(1).div_ceil(splits).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
    SplitPlan { splits, partition }
}

/// The (token, split) partial results the attention buffers hold for a step limit of
/// `max_tokens` tokens.
pub fn split_budget(max_tokens: usize) -> usize {
    (4 * max_tokens).max(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_capacity_follows_the_fraction() {
        let block = kv_block_bytes(32, 8, 128);
        assert_eq!(block, 32 * 2 * 16 * 8 * 128 * 2);
        assert_eq!(kv_blocks(10 * block, 0.5, block), 5);
        assert_eq!(kv_blocks(10 * block, 0.0, block), 0);
        assert_eq!(kv_blocks(10 * block, 1.5, block), 0);
    }

    #[test]
    fn split_plan_covers_the_context_within_the_budget() {
        for (tokens, ctx, budget) in [
            (1, 1, 4096),
            (1, 100_000, 4096),
            (64, 1100, 4096),
            (2048, 2048, 8192),
            (4096, 50_000, 4096),
        ] {
            let plan = split_plan(tokens, ctx, budget);
            assert!(
                plan.splits * plan.partition >= ctx,
                "{plan:?} misses context {ctx}"
            );
            assert!(
                tokens * plan.splits <= budget.max(tokens),
                "{plan:?} overflows the budget"
            );
            assert_eq!(plan.partition % BLOCK_SIZE, 0);
        }
        // Decode over a long context splits; a short one does not.
        assert!(split_plan(1, 8192, 4096).splits > 1);
        assert_eq!(split_plan(8, 200, 4096).splits, 1);
    }
}
