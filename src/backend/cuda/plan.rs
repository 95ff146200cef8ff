//! Host-side decisions that size device buffers and launches: KV-cache capacity, the split-K
//! bound of the attention kernel and the batch-size buckets of the decode graphs. Pure
//! functions, tested without a GPU.

use crate::engine::BLOCK_SIZE;

/// Bytes one KV block takes across its storage slots (one per layer for a model of one KV
/// group, the larger group's layers for one with full and sliding groups; keys and values of
/// `element_bytes` each: 2 for bf16, 1 for an FP8 cache, which so holds twice the tokens in the
/// same memory).
pub fn kv_block_bytes(
    slots: usize,
    kv_heads: usize,
    head_dim: usize,
    element_bytes: usize,
) -> usize {
    slots * 2 * BLOCK_SIZE * kv_heads * head_dim * element_bytes
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

/// Positions a partition should hold at least, so short contexts use one partition. Passed to
/// `kernels/attention.cu` as `ATTN_MIN_PARTITION` (see `kernels::KernelParams::defines`), where
/// each token derives its own partition.
pub const MIN_PARTITION: usize = 32;

/// Warps per block of the decode attention kernel, passed to `kernels/attention.cu` as
/// `ATTN_WARPS`; the launch uses `ATTN_WARPS * 32` threads.
pub const ATTN_WARPS: usize = 4;

/// 16-key tiles of keys and values each warp of the decode attention kernel's tensor-core path
/// keeps in flight, passed to `kernels/attention.cu` as `ATTN_DEPTH`. Two fill the 255 registers
/// of a thread without spilling at head_dim 128 and read K and V 2–4 points of copy bandwidth
/// faster than one at batches 64 and 256, up to 2 at batch 16 and none at 1–8 (three spill;
/// `docs/cuda-backend.md`, "Measured design choices").
pub const ATTN_DEPTH: usize = 2;

/// The same for an FP8 KV cache (`ATTN_DEPTH_FP8`), whose tiles stay E4M3 bytes in registers
/// until used: half a bf16 tile's registers (182 a thread at head_dim 128 for two tiles), so a
/// warp may keep more of them in flight.
pub const ATTN_DEPTH_FP8: usize = 2;

/// Threads per block of the residual-add + RMSNorm kernel (one block per row), passed to
/// `kernels/rmsnorm.cu` as `RMS_THREADS`: a batch-1 row is latency-bound with fewer.
pub const RMS_THREADS: usize = 1024;

/// Rows of x the small-M product kernels (`kernels/gemv.cu`) serve; larger products go to
/// cuBLASLt.
pub const GEMV_MAX_M: usize = 8;

/// Weight rows one block of the small-M product kernels owns, passed as `GEMV_ROWS`.
pub const GEMV_ROWS: usize = 4;

/// Warps per block of the small-M product kernels (they split K), passed as `GEMV_WARPS`.
pub const GEMV_WARPS: usize = 4;

/// Whether the small-M product kernels can compute `[m, k] x [n, k]^T`: at most `GEMV_MAX_M`
/// rows, and K a whole number of their 16-byte (8-value) loads.
pub fn small_m_fits(m: usize, n: usize, k: usize) -> bool {
    (1..=GEMV_MAX_M).contains(&m) && n > 0 && k > 0 && k.is_multiple_of(8)
}

/// Rows of x from which the small-M products run on tensor cores (`mma.sync` m16n8k16, on sm_80
/// or newer), passed as `GEMV_MMA_FROM` (one past `GEMV_MAX_M` where the device has none): every
/// M. With x's fragments in registers and the weights alone in the shared-memory rings, a decode
/// step's products in a graph read the weights at 100% of copy bandwidth for one row (the
/// CUDA-core loop: 97%) and 95% for eight (`docs/cuda-backend.md`, "Measured design choices").
pub const GEMV_MMA_FROM: usize = 1;

/// Warps per block of the tensor-core small-M products (they split K), passed as `GEMV_MMA_WARPS`.
pub const GEMV_MMA_WARPS: usize = 8;

/// Values of K per chunk a warp of the tensor-core small-M products copies into shared memory at a
/// time: 128 bytes of each row (`GEMV_MMA_CHUNK` in `kernels/gemv.cu`, fixed by its layout).
const GEMV_MMA_CHUNK: usize = 64;

/// Chunks in each warp's shared-memory ring of the tensor-core small-M products (all but one in
/// flight), passed as `GEMV_MMA_STAGES`: 5 beat 4 and 6 at batches 1 to 8 (`docs/cuda-backend.md`,
/// "Measured design choices").
pub const GEMV_MMA_STAGES: usize = 5;

/// Weight rows a block of the tensor-core small-M products owns (the m16n8k16 product's 16 rows).
const GEMV_MMA_ROWS: usize = 16;

/// The rows of x from which the small-M products run on tensor cores, on a device that has them
/// or not: `GEMV_MMA_FROM`, or one past `GEMV_MAX_M` (never).
pub fn gemv_mma_from(tensor_cores: bool) -> usize {
    if tensor_cores {
        GEMV_MMA_FROM
    } else {
        GEMV_MAX_M + 1
    }
}

/// Dynamic shared memory per block of the tensor-core small-M products: each warp's
/// `GEMV_MMA_STAGES` ring slots of 16 weight rows, `GEMV_MMA_CHUNK` values each
/// (`GemvShape::ring_bytes` in the kernel).
pub const GEMV_MMA_SHARED_BYTES: usize =
    GEMV_MMA_WARPS * GEMV_MMA_STAGES * GEMV_MMA_ROWS * GEMV_MMA_CHUNK * 2;

/// Whether the small-M products can take their tensor-core path on a device whose kernels are
/// compiled for `arch` (`sm_80`, `sm_90a`, ...) and whose blocks may opt into
/// `shared_per_block` bytes of shared memory: `mma.sync` needs sm_80 or newer, and the rings
/// must fit (80 KiB: sm_80 and Hopper allow 163 and 227 KiB, sm_86, sm_89 and sm_120 99).
pub fn gemv_tensor_cores(arch: &str, shared_per_block: usize) -> bool {
    let sm = arch
        .strip_prefix("sm_")
        .map(|digits| digits.trim_end_matches('a'))
        .and_then(|digits| digits.parse::<u32>().ok());
    sm.is_some_and(|number| number >= 80) && GEMV_MMA_SHARED_BYTES <= shared_per_block
}

/// How the small-M entries of `kernels/gemv.cu` for M rows of x are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvGeometry {
    /// Weight rows a block owns (half of them paired with the other half in the fused entries).
    pub rows: usize,
    /// Threads per block.
    pub threads: usize,
    /// Dynamic shared memory per block (`GEMV_MMA_SHARED_BYTES` on the tensor-core path).
    pub shared_bytes: usize,
}

/// The launch geometry of the small-M entries for `m` rows of x (`gemv_mma_from` from the
/// device).
pub fn gemv_geometry(m: usize, mma_from: usize) -> GemvGeometry {
    if m >= mma_from {
        GemvGeometry {
            rows: GEMV_MMA_ROWS,
            threads: GEMV_MMA_WARPS * 32,
            shared_bytes: GEMV_MMA_SHARED_BYTES,
        }
    } else {
        GemvGeometry {
            rows: GEMV_ROWS,
            threads: GEMV_WARPS * 32,
            shared_bytes: 0,
        }
    }
}

/// Whether the small-M gate/up product can apply SwiGLU itself (`gemv_swiglu_mM`): its blocks
/// own half their rows' worth of gate rows and the matching up rows (2 or 8, by path), so the
/// MLP width must be a whole number of the larger count.
pub fn swiglu_fuses(intermediate: usize) -> bool {
    intermediate.is_multiple_of(GEMV_MMA_ROWS / 2)
}

/// Whether the small-M q/k/v product can do the rope write itself (`gemv_qkv_rope_mM`): its
/// blocks own rotary pairs of one head (2 or 8, by path), so half a head must be a whole number
/// of the larger count, and a per-head norm (which needs the whole head first) rules it out.
pub fn rope_write_fuses(head_dim: usize, qk_norm: bool) -> bool {
    !qk_norm && head_dim.is_multiple_of(GEMV_MMA_ROWS)
}

/// The most splits per token a decode attention launch merges itself (the last block of a token to
/// finish reads the others' partials), passed as `ATTN_MERGE_SPLITS`; a launch of more splits
/// leaves the merge to `attention_reduce`, whose blocks spread a long merge over more threads.
pub const ATTN_MERGE_SPLITS: usize = 8;

/// Threads per block of the split reduction of the decode attention kernel, passed to
/// `kernels/attention.cu` as `ATTN_REDUCE_THREADS` (a multiple of 32, at least head_dim / 4).
pub const ATTN_REDUCE_THREADS: usize = 128;

/// Threads per block of the SwiGLU kernel (`kernels/swiglu.cu`).
pub const SWIGLU_THREADS: usize = 256;

/// Elements of a row each SwiGLU thread computes for an MLP of width `intermediate`: 4 (16-byte
/// loads) when the width is a multiple of 4, else 1. Passed to `kernels/swiglu.cu` as
/// `SWIGLU_VEC`.
pub fn swiglu_vector(intermediate: usize) -> usize {
    if intermediate.is_multiple_of(4) { 4 } else { 1 }
}

/// Prefill attention blocks (tiles × KV heads × splits) a launch aims for: enough to fill every
/// SM of a large GPU several times over, so a step of few tiles over a long context splits it.
pub const PREFILL_TARGET_BLOCKS: usize = 1024;

/// Longest context the decode graphs' split bound is sized for. Longer contexts still attend
/// correctly: their partitions grow instead of their number.
pub const GRAPH_SPLIT_CONTEXT: usize = 16_384;

/// The most split-K partitions per token of one attention launch (grid z and the stride of the
/// partial buffers) for `num_tokens` query tokens of `kv_heads` KV heads whose longest context is
/// `max_context`, given room for `budget` (token, split) partial results and a device that runs
/// `resident_blocks` attention blocks at once (SMs × the kernel's blocks per SM): the most splits
/// whose blocks still fit one wave, no more than the context needs. One wave of long partitions
/// beat four waves of short ones for batches up to 64 (batch 1 at 32k context: 77% of copy
/// bandwidth against 59%), and a launch a few blocks past one wave runs those blocks' whole
/// partitions in a second (batch 2 at 32k: 17 splits, 272 blocks on 264 slots, 59%;
/// `docs/cuda-backend.md`, "Kernels"). Each token then uses
/// `min(bound, ceil(context / MIN_PARTITION))` partitions (see `kernels/attention.cu`).
pub fn split_bound(
    num_tokens: usize,
    kv_heads: usize,
    max_context: usize,
    budget: usize,
    resident_blocks: usize,
) -> usize {
    let wanted = max_context.div_ceil(MIN_PARTITION).max(1);
    let room = (budget / num_tokens.max(1)).max(1);
    let per_split = num_tokens.max(1) * kv_heads.max(1);
    let fill = (resident_blocks / per_split).max(1);
    wanted.min(room).min(fill)
}

/// The launch geometry of the prefill attention kernel (`kernels/prefill_attention.cu`), passed
/// to it as defines, so no constant has to agree by hand between the kernel and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashGeometry {
    /// Whether the products are Hopper warpgroup products (`F_WGMMA`), else `mma.sync`.
    pub wgmma: bool,
    /// Query vectors (tokens × query heads of one KV head) one tile holds, 16 per warp
    /// (`F_ROWS`).
    pub rows: usize,
    /// Keys per shared-memory stage (`F_KEYS`).
    pub keys: usize,
    /// Dynamic shared memory per block in bytes (`F_SHARED`; 0: the kernel's static arrays).
    pub shared_bytes: usize,
}

impl FlashGeometry {
    /// Threads per block: one warp per 16 query vectors, and with warpgroup products a
    /// producer warpgroup that copies the keys and values into shared memory.
    pub fn threads(&self) -> usize {
        self.rows / 16 * 32 + if self.wgmma { 128 } else { 0 }
    }
}

/// The prefill attention kernel's geometry for heads of `head_dim` dimensions compiled for
/// `arch`: on `sm_90a`, head_dim 64 or 128 takes warpgroup products (two consumer warpgroups of
/// 64 query vectors and a producer warpgroup; three stages of 128 keys and values each and the
/// query vectors, in 128-byte-swizzled dynamic shared memory aligned in the kernel to 1024
/// bytes); elsewhere `mma.sync` with 64 vectors and 32-key stages.
pub fn flash_geometry(head_dim: usize, arch: &str) -> FlashGeometry {
    if arch == "sm_90a" && head_dim.is_multiple_of(64) && head_dim <= 128 {
        let (rows, keys) = (128, 128);
        FlashGeometry {
            wgmma: true,
            rows,
            keys,
            shared_bytes: 3 * 2 * keys * head_dim * 2 + rows * head_dim * 2 + 1024,
        }
    } else {
        SMALL_FLASH
    }
}

/// The `mma.sync` geometry: the prefill attention kernel off Hopper, and on Hopper its small-tile
/// variant (`prefill_attention_small`, `FS_ROWS` and `FS_KEYS`) for tiles of at most 64 query
/// vectors, whose 128-thread blocks in static shared memory run several to an SM where the
/// warpgroup kernel's 384 threads and 225 KiB run one.
pub const SMALL_FLASH: FlashGeometry = FlashGeometry {
    wgmma: false,
    rows: 64,
    keys: 32,
    shared_bytes: 0,
};

/// Keys a split of the prefill attention kernel should walk at least: below that, the merge of
/// the partial results costs more than the parallelism gains.
pub const FLASH_SPLIT_KEYS: usize = 1024;

/// Key splits per tile of one prefill attention launch over `tiles` tiles of `kv_heads` KV heads
/// whose longest context is `max_context`, with room for `room` partial results per token: one
/// when the tiles alone make `PREFILL_TARGET_BLOCKS` blocks, else enough to make them, no more than
/// `FLASH_SPLIT_KEYS`-key runs of the longest context and the room allow. A step whose few
/// tiles attend to a long context (a late chunk of a long prompt) then runs as several waves
/// instead of one partial wave.
pub fn prefill_splits(tiles: usize, kv_heads: usize, max_context: usize, room: usize) -> usize {
    let blocks = tiles.max(1) * kv_heads.max(1);
    if blocks >= PREFILL_TARGET_BLOCKS {
        return 1;
    }
    PREFILL_TARGET_BLOCKS
        .div_ceil(blocks)
        .min(max_context.div_ceil(FLASH_SPLIT_KEYS))
        .min(room)
        .max(1)
}

/// The keys one prefill-attention tile of at most `tile_rows` query vectors reaches in a step
/// whose longest context is `max_context`: all of them in a full-attention layer, and in a layer
/// that slides over `window` keys only the window behind the tile's tokens (at most `tile_rows`
/// of them). `prefill_splits` divides this span, so a sliding layer at a long context is not
/// cut into splits that find no key in the window.
pub fn tile_key_span(max_context: usize, window: Option<usize>, tile_rows: usize) -> usize {
    window.map_or(max_context, |window| max_context.min(window + tile_rows))
}

/// Tokens per prefill-attention tile of `rows` query vectors for `group` query heads per KV head
/// of `head_dim` dimensions on a device of compute capability `major`; 0 when the tensor-core
/// kernel cannot serve the shape (a group larger than a tile, a head_dim that is not a multiple
/// of 16 or above 128, or a device older than sm_80): the paged kernel then serves prefill too.
pub fn flash_tile_tokens(group: usize, head_dim: usize, major: i32, rows: usize) -> usize {
    let served = major >= 8 && head_dim.is_multiple_of(16) && head_dim <= 128;
    if !served || group == 0 || group > rows {
        0
    } else {
        rows / group
    }
}

/// The batch sizes a decode graph is captured for: powers of two up to `max_rows`, and
/// `max_rows` itself.
pub fn graph_buckets(max_rows: usize) -> Vec<usize> {
    let mut buckets: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
        .take_while(|&b| b < max_rows)
        .collect();
    if max_rows > 0 {
        buckets.push(max_rows);
    }
    buckets
}

/// The smallest bucket that holds `rows` decode rows, if any (`buckets` ascending).
pub fn bucket_for(buckets: &[usize], rows: usize) -> Option<usize> {
    if rows == 0 {
        return None;
    }
    buckets.iter().copied().find(|&b| b >= rows)
}

/// The most rows for which start-up times cuBLASLt's candidate algorithms per product shape.
pub const MAX_TUNED_ROWS: usize = 64;

/// The row counts above [`GEMV_MAX_M`] whose cuBLASLt algorithms start-up times per product
/// shape (instead of taking the heuristic's first): the decode-graph buckets of `max_rows` and
/// the mixed-step buckets of `max_tokens` (where verification steps land: batch 8 with four
/// proposals is 40 rows, bucket 48) up to [`MAX_TUNED_ROWS`], ascending.
pub fn tuned_rows(max_rows: usize, max_tokens: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = graph_buckets(max_rows)
        .into_iter()
        .chain(mixed_step_buckets(max_tokens))
        .filter(|&m| m > GEMV_MAX_M && m <= MAX_TUNED_ROWS)
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// The candidate to use given each candidate's timing (`None` where timing it failed), the
/// heuristic's first candidate at index 0: the fastest, unless it beats the first by less than
/// 3 % (timing noise), or the first could not be timed; 0 when nothing was timed.
pub fn fastest_candidate(times: &[Option<std::time::Duration>]) -> usize {
    let Some(Some(first)) = times.first() else {
        return 0;
    };
    let best = times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .min_by_key(|&(i, t)| (t, i));
    match best {
        Some((i, t)) if t.as_secs_f64() < first.as_secs_f64() * 0.97 => i,
        _ => 0,
    }
}

/// Token counts up to which products cost what reading their weights costs on the GPUs this
/// backend targets (a bf16 product of M rows is bound by its weight reads while M is below the
/// ratio of the tensor-core rate to the memory bandwidth, about 200 to 300 on Hopper): padding a
/// step of at most this many tokens costs its products nothing.
pub const FREE_PADDING_TOKENS: usize = 256;

/// The most tokens a mixed-step graph set is captured for. Capture costs start-up time (about
/// 15 ms per bucket for an 8B model), and a larger step's GPU time dwarfs its eager launches.
pub const MAX_MIXED_STEP_TOKENS: usize = 512;

/// The token counts a mixed-step graph set is captured for: every multiple of 16 up to 128, then
/// four per doubling (a quarter of the octave apart), up to `max_tokens` and
/// [`MAX_MIXED_STEP_TOKENS`]. The engine fills steps up to one of these counts where it can
/// ([`crate::engine::Backend::step_sizes`]).
pub fn mixed_step_buckets(max_tokens: usize) -> Vec<usize> {
    let max_tokens = max_tokens.min(MAX_MIXED_STEP_TOKENS);
    let mut buckets: Vec<usize> = (1..=8).map(|k| 16 * k).collect();
    let mut octave = 128usize;
    while octave < max_tokens {
        buckets.extend((1..=4).map(|k| octave + k * octave / 4));
        octave *= 2;
    }
    buckets.retain(|&b| b <= max_tokens);
    buckets
}

/// The mixed-step bucket whose graphs serve a step of `tokens` tokens: the smallest that holds
/// it, unless its padding would cost the products more than an eighth of the step (beyond
/// [`FREE_PADDING_TOKENS`]), in which case the step runs eagerly.
pub fn mixed_bucket_for(buckets: &[usize], tokens: usize) -> Option<usize> {
    let bucket = bucket_for(buckets, tokens)?;
    (bucket <= FREE_PADDING_TOKENS || bucket - tokens <= tokens / 8).then_some(bucket)
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
    fn swiglu_threads_take_four_elements_where_the_width_allows() {
        assert_eq!(swiglu_vector(14_336), 4);
        assert_eq!(swiglu_vector(160), 4);
        assert_eq!(swiglu_vector(162), 1);
    }

    #[test]
    fn kv_capacity_follows_the_fraction() {
        let block = kv_block_bytes(32, 8, 128, 2);
        assert_eq!(block, 32 * 2 * 16 * 8 * 128 * 2);
        assert_eq!(kv_blocks(10 * block, 0.5, block), 5);
        assert_eq!(kv_blocks(10 * block, 0.0, block), 0);
        assert_eq!(kv_blocks(10 * block, 1.5, block), 0);
    }

    /// An FP8 cache's block is half a bf16 one: the same memory holds twice the blocks.
    #[test]
    fn an_fp8_cache_holds_twice_the_blocks() {
        let bf16 = kv_block_bytes(32, 8, 128, 2);
        let fp8 = kv_block_bytes(32, 8, 128, 1);
        assert_eq!(2 * fp8, bf16);
        assert_eq!(
            kv_blocks(10 * bf16, 0.5, fp8),
            2 * kv_blocks(10 * bf16, 0.5, bf16)
        );
    }

    #[test]
    fn a_sliding_layer_splits_only_the_keys_its_window_reaches() {
        assert_eq!(tile_key_span(32_768, None, 128), 32_768);
        assert_eq!(tile_key_span(32_768, Some(128), 128), 256);
        assert_eq!(tile_key_span(100, Some(4096), 128), 100);
        // gpt-oss's 128-key window at 32k: one split, against 32 for the full context.
        assert_eq!(
            prefill_splits(4, 8, tile_key_span(32_768, Some(128), 128), 64),
            1
        );
        assert_eq!(prefill_splits(4, 8, 32_768, 64), 32);
    }

    #[test]
    fn prefill_splits_fill_the_device_only_for_long_contexts() {
        // An 8k prompt in one launch: enough tiles, no split.
        assert_eq!(prefill_splits(512, 8, 8192, 4), 1);
        // A short prompt: its context is too short to split.
        assert_eq!(prefill_splits(4, 8, 128, 64), 1);
        // A 256-token chunk at 8k: 16 tiles, split to 1k-key runs.
        assert_eq!(prefill_splits(16, 8, 8192, 16), 8);
        // The room for partial results bounds it.
        assert_eq!(prefill_splits(8, 8, 32_768, 4), 4);
        // Enough blocks to reach the target, no more.
        assert_eq!(prefill_splits(64, 8, 32_768, 64), 2);
        for tiles in [1, 3, 17, 200] {
            for ctx in [1, 900, 5000, 40_000] {
                for room in [1, 2, 9] {
                    let splits = prefill_splits(tiles, 8, ctx, room);
                    assert!((1..=room).contains(&splits));
                    assert!(splits <= ctx.div_ceil(FLASH_SPLIT_KEYS).max(1));
                }
            }
        }
    }

    #[test]
    fn split_bound_stays_within_the_budget() {
        // An H200's 132 SMs at two decode-attention blocks each.
        let resident = 264;
        for (tokens, ctx, budget) in [
            (1, 1, 4096),
            (1, 100_000, 4096),
            (64, 1100, 4096),
            (2048, 2048, 8192),
            (4096, 50_000, 4096),
        ] {
            let bound = split_bound(tokens, 8, ctx, budget, resident);
            assert!(bound >= 1);
            assert!(
                tokens * bound <= budget.max(tokens),
                "{bound} splits of {tokens} tokens overflow {budget}"
            );
            assert!(bound <= ctx.div_ceil(MIN_PARTITION).max(1));
        }
        // Decode over a long context splits into one wave of blocks; a short one does not split.
        assert_eq!(split_bound(1, 8, 32_768, 4096, resident), 33);
        assert_eq!(split_bound(8, 8, 20, 4096, resident), 1);
        // A small batch splits even a moderate context; from 33 rows of 8 KV heads the batch
        // alone fills a wave.
        assert_eq!(split_bound(1, 8, 200, 4096, resident), 7);
        assert_eq!(split_bound(16, 8, 4096, 4096, resident), 2);
        assert_eq!(split_bound(33, 8, 4096, 4096, resident), 1);
        // Never a few blocks past one wave: 2 rows take 16 splits (256 blocks), not 17 (272).
        for tokens in 1..=33 {
            let bound = split_bound(tokens, 8, 32_768, 8192, resident);
            assert!(
                tokens * 8 * bound <= resident,
                "{tokens} rows: {bound} splits"
            );
            assert!(
                tokens * 8 * (bound + 1) > resident,
                "{tokens} rows: {bound} splits"
            );
        }
        assert_eq!(split_bound(2, 8, 32_768, 8192, resident), 16);
        assert_eq!(split_bound(1024, 8, 8192, 8192, resident), 1);
        // A device that runs no block reported still splits as if it ran one.
        assert_eq!(split_bound(1, 8, 8192, 4096, 0), 1);
    }

    #[test]
    fn small_m_products_need_whole_loads() {
        assert!(small_m_fits(1, 4096, 4096));
        assert!(small_m_fits(8, 128_256, 4096));
        assert!(!small_m_fits(9, 4096, 4096));
        assert!(!small_m_fits(0, 4096, 4096));
        assert!(!small_m_fits(1, 4096, 4100));
    }

    #[test]
    fn fused_small_m_products_need_whole_pairs() {
        assert!(swiglu_fuses(14_336));
        assert!(swiglu_fuses(160));
        assert!(!swiglu_fuses(161));
        // Whole tensor-core blocks of 8 pairs, not only the CUDA-core blocks' 2.
        assert!(!swiglu_fuses(164));
        assert!(rope_write_fuses(128, false));
        assert!(rope_write_fuses(16, false));
        assert!(!rope_write_fuses(128, true));
        assert!(!rope_write_fuses(6, false));
        assert!(!rope_write_fuses(8, false));
    }

    #[test]
    fn small_m_geometry_follows_the_path() {
        const HOPPER: usize = 227 * 1024;
        assert!(gemv_tensor_cores("sm_90a", HOPPER));
        assert!(gemv_tensor_cores("sm_80", 163 * 1024));
        assert!(!gemv_tensor_cores("sm_75", HOPPER));
        assert!(!gemv_tensor_cores("", HOPPER));
        // sm_86 and sm_89 blocks may opt into 99 KiB: the rings fit; 64 KiB would not.
        assert!(gemv_tensor_cores("sm_89", 99 * 1024));
        assert!(!gemv_tensor_cores("sm_89", 64 * 1024));
        let from = gemv_mma_from(true);
        let single = gemv_geometry(1, from);
        let eight = gemv_geometry(8, from);
        assert_eq!(single, eight, "every M on tensor cores");
        assert_eq!((eight.rows, eight.threads), (16, GEMV_MMA_WARPS * 32));
        // 8 warps x 5 slots x 16 rows x 64 values x 2 bytes: above the default 48 KiB, so the
        // entries opt in at load.
        assert_eq!(eight.shared_bytes, 81_920);
        // Without tensor cores every M takes the CUDA-core geometry.
        let cuda_cores = gemv_geometry(8, gemv_mma_from(false));
        assert_eq!(
            (cuda_cores.rows, cuda_cores.threads, cuda_cores.shared_bytes),
            (GEMV_ROWS, GEMV_WARPS * 32, 0)
        );
        assert_eq!(gemv_geometry(1, gemv_mma_from(false)), cuda_cores);
    }

    #[test]
    fn prefill_tiles_fit_the_kernel() {
        assert_eq!(flash_tile_tokens(4, 128, 9, 64), 16);
        assert_eq!(flash_tile_tokens(4, 128, 9, 128), 32);
        assert_eq!(flash_tile_tokens(1, 64, 9, 64), 64);
        assert_eq!(flash_tile_tokens(3, 16, 8, 64), 21);
        assert_eq!(flash_tile_tokens(7, 128, 9, 64), 9);
        assert_eq!(flash_tile_tokens(65, 128, 9, 64), 0);
        assert_eq!(flash_tile_tokens(65, 128, 9, 128), 1);
        assert_eq!(flash_tile_tokens(4, 256, 9, 64), 0, "head_dim above 128");
        assert_eq!(
            flash_tile_tokens(4, 72, 9, 64),
            0,
            "head_dim not a multiple of 16"
        );
        assert_eq!(
            flash_tile_tokens(4, 128, 7, 64),
            0,
            "no bf16 mma before sm_80"
        );
    }

    /// Warpgroup products only where they are compiled (sm_90a) and the swizzled 128-byte rows
    /// hold whole head halves (head_dim 64 or 128); their three stages and the query vectors,
    /// with the kernel's 1 KiB of static shared memory (its barriers, aligned), fit the 227 KiB an
    /// SM gives a block.
    #[test]
    fn flash_geometry_takes_warpgroups_on_hopper_for_whole_head_halves() {
        let hopper = flash_geometry(128, "sm_90a");
        assert!(hopper.wgmma);
        assert_eq!(
            (hopper.rows, hopper.keys, hopper.threads()),
            (128, 128, 384)
        );
        assert_eq!(hopper.shared_bytes, 225 * 1024);
        assert!(hopper.shared_bytes + 1024 <= 227 * 1024);
        assert!(flash_geometry(64, "sm_90a").wgmma);
        for (head_dim, arch) in [
            (96, "sm_90a"),
            (32, "sm_90a"),
            (256, "sm_90a"),
            (128, "sm_89"),
            (128, "sm_100"),
        ] {
            let g = flash_geometry(head_dim, arch);
            assert!(!g.wgmma, "{head_dim} on {arch}");
            assert_eq!(
                (g.rows, g.keys, g.shared_bytes, g.threads()),
                (64, 32, 0, 128)
            );
        }
    }

    #[test]
    fn mixed_step_buckets_pad_little() {
        let buckets = mixed_step_buckets(2048);
        assert_eq!(buckets.len(), 16);
        assert_eq!(&buckets[..9], &[16, 32, 48, 64, 80, 96, 112, 128, 160]);
        assert_eq!(buckets.last(), Some(&MAX_MIXED_STEP_TOKENS));
        assert_eq!(mixed_step_buckets(384).last(), Some(&384));
        assert_eq!(mixed_step_buckets(100).last(), Some(&96));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
        // The padding rule, on the grid continued beyond the cap.
        let mut all = buckets.clone();
        all.extend([640, 768, 896, 1024, 1280, 1536, 1792, 2048]);
        for tokens in 1..=2048 {
            match mixed_bucket_for(&all, tokens) {
                Some(b) => assert!(
                    b >= tokens && (b <= FREE_PADDING_TOKENS || b - tokens <= tokens / 8),
                    "{tokens} tokens -> {b}"
                ),
                None => assert!(tokens > FREE_PADDING_TOKENS, "{tokens} tokens run eagerly"),
            }
        }
        assert_eq!(mixed_bucket_for(&buckets, 2), Some(16));
        assert_eq!(mixed_bucket_for(&all, 1000), Some(1024));
        assert_eq!(mixed_bucket_for(&all, 1100), None, "1,280 would pad 16%");
        assert_eq!(mixed_bucket_for(&all, 2049), None);
        assert_eq!(
            mixed_bucket_for(&buckets, 513),
            None,
            "beyond the largest bucket"
        );
    }

    #[test]
    fn buckets_cover_every_batch_size_up_to_the_limit() {
        assert_eq!(graph_buckets(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(graph_buckets(48), vec![1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(graph_buckets(1), vec![1]);
        assert!(graph_buckets(0).is_empty());
        let buckets = graph_buckets(48);
        for rows in 1..=48 {
            let b = bucket_for(&buckets, rows).expect("a bucket");
            assert!(b >= rows && b < 2 * rows.max(1) + 1, "{rows} rows -> {b}");
        }
        assert_eq!(bucket_for(&buckets, 3), Some(4));
        assert_eq!(bucket_for(&buckets, 33), Some(48));
        assert_eq!(bucket_for(&buckets, 49), None);
        assert_eq!(bucket_for(&buckets, 0), None);
    }

    #[test]
    fn tuned_rows_hold_the_verification_buckets() {
        // Batch 8 with four proposals: 40 rows, mixed bucket 48; the decode buckets to 64.
        let rows = tuned_rows(64, 512);
        assert_eq!(rows, vec![16, 32, 48, 64]);
        assert!(rows.contains(&bucket_for(&mixed_step_buckets(512), 40).unwrap()));
        // A small engine: nothing above its limits, nothing the small-M path serves.
        assert_eq!(tuned_rows(8, 8), Vec::<usize>::new());
        assert_eq!(tuned_rows(12, 40), vec![12, 16, 32]);
    }

    #[test]
    fn the_fastest_candidate_must_clearly_beat_the_first() {
        use std::time::Duration;
        let us = |n: u64| Some(Duration::from_micros(n));
        assert_eq!(fastest_candidate(&[]), 0);
        assert_eq!(fastest_candidate(&[us(100)]), 0);
        assert_eq!(fastest_candidate(&[us(100), us(80), us(70), us(90)]), 2);
        // Within noise of the first: the heuristic's own choice stays.
        assert_eq!(fastest_candidate(&[us(100), us(98)]), 0);
        // Failed timings never win; a failed first keeps the first.
        assert_eq!(fastest_candidate(&[us(100), None, us(50)]), 2);
        assert_eq!(fastest_candidate(&[None, us(50)]), 0);
        // Ties go to the earlier candidate.
        assert_eq!(fastest_candidate(&[us(100), us(60), us(60)]), 1);
    }
}
