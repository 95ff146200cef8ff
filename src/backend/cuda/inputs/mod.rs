//! Packing every input of a forward step into one host buffer, so a step makes exactly one
//! host-to-device copy (see `docs/cuda-backend.md`: in confidential-computing mode every copy
//! goes through an encrypted bounce buffer and costs a fixed overhead).
//!
//! The packed buffer is an array of `i32` holding, in order: the block-table stride (one word),
//! token ids `[T]`, positions `[T]`, KV-cache slots `[G * T]` (those of KV group `g` at `g * T`),
//! the block-table row of each token `[G * T]` (`g * R + r` for a token of row `r` in group `g`,
//! so group 0's is the token's row), the token
//! index of each sampled row `[S]`, the number of logprob alternatives of each sampled row `[S]`,
//! the sampling parameters of each sampled row `[S * SAMPLE_PARAMS]` (temperature, top-k, top-p,
//! min-p, presence, frequency and repetition penalties as float bits or ints, the seed and the
//! draw index as 32-bit halves, where its penalty list and its bias list start and how long they
//! are, and where its grammar mask starts or -1), the block tables `[G * R * max_blocks]` (group
//! 0's rows, then group 1's; zero-padded, and zero where a sliding group gave a block back), then the sampled rows' lists, row after row: the penalty list (distinct
//! `(token, times generated)` pairs), the `logit_bias` list (`(token, bias as float bits)` pairs)
//! and the grammar mask (`ceil(vocab / 32)` words, bit `t % 32` of word `t / 32` allowing token
//! `t`), then, for steps with a prefill row, the prefill-attention tiles (`(first token,
//! count)` pairs: every row's tokens cut into runs of at most `tile_tokens`, those of at most
//! `small_tile_tokens` last, or all into runs of `small_tile_tokens` when the step has a
//! one-token row or fewer than `min_big_tiles` runs would be full), and last the *late*
//! grammar masks: those of rows whose masks the engine was still computing when the step started
//! (see `docs/cuda-backend.md`, "Started steps and late grammar masks"), one
//! `ceil(vocab / 32)`-word slot per such row, filled and copied after the forward pass was
//! queued. Biases and the masks known up front travel in the step's one host-to-device copy;
//! late masks in a second, small one, made only by steps that have them. The forward pass reads only what precedes the block tables at offsets
//! that depend on T and S alone, and it reads the table stride from the buffer: a decode step
//! padded to a fixed T = S can replay a CUDA graph captured once for that size.
//!
//! The segments of a mixed step between its attention launches read only the token-indexed
//! arrays, at offsets that depend on T alone: a step padded with unsampled tokens to a fixed T can
//! replay the segment graphs captured for that size (see `graphs.rs`).
//!
//! G is the number of KV groups (`engine::kv_groups`): 1 for a model without sliding layers
//! beside full ones, whose layout is the same as before groups existed. The attention kernels of
//! a group's layers take that group's slots and rows; nothing else reads them.
//!
//! Padding tokens have token 0, position 0, slot -1 (the QKV kernel writes no cache entry) and row
//! -1 (attention outputs zero), in every group. Those that pad a decode step to its graph's batch size are sampled
//! with no alternatives, as padding rows; those that pad a mixed step to its graph's token count
//! are not sampled. Their results are never copied back.

use std::collections::HashMap;

use crate::engine::{
    BLOCK_SIZE, BackendError, BatchRow, FREED_BLOCK, KvGroups, MAX_LOGIT_BIAS_TOKENS, SampleSpec,
};

use super::kernels::{MAX_TOP_LOGPROBS, SAMPLE_PARAMS};

/// Offsets (in `i32` words) of each array in a packed step buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLayout {
    /// Tokens in the step, padding included (T).
    pub num_tokens: usize,
    /// Rows with a block table (R, the batch's own rows).
    pub num_rows: usize,
    /// KV groups (G): each row has a block table per group, each token a slot per group.
    pub kv_groups: usize,
    /// Rows that need a next token, padding included (S).
    pub num_samples: usize,
    /// Padding decode rows at the end of the step (one token each, each a sampled row).
    pub padding: usize,
    /// Padding tokens at the end of the step that no row owns and nothing samples.
    pub token_padding: usize,
    /// Stride of the block-table array: the longest block table of the step (of one group).
    pub max_blocks: usize,
    /// Words of the sampled rows' lists (penalties, biases, masks).
    pub list_words: usize,
    /// Prefill-attention tiles (0: attention runs in the paged split-K kernel).
    pub num_tiles: usize,
    /// How many of those tiles, the last ones, are small (at most `small_tile_tokens` tokens),
    /// for the small-tile kernel.
    pub num_small_tiles: usize,
    /// Longest context any token attends to (for the split-K decision).
    pub max_context: usize,
    /// Sampled rows whose grammar masks come after the forward pass was queued (their slots
    /// end the buffer).
    pub late_masks: usize,
    /// Words of each late mask slot (`ceil(vocab / 32)`).
    pub mask_words: usize,
}

impl StepLayout {
    /// Offset of the block-table stride word.
    pub fn max_blocks_word(&self) -> usize {
        0
    }
    /// Offset of the token ids.
    pub fn tokens(&self) -> usize {
        1
    }
    /// Offset of the positions.
    pub fn positions(&self) -> usize {
        1 + self.num_tokens
    }
    /// Offset of the KV-cache slots of group `group`.
    pub fn slots(&self, group: usize) -> usize {
        1 + (2 + group) * self.num_tokens
    }
    /// Offset of the block-table row of each token in group `group` (group 0's: the row index).
    pub fn token_rows(&self, group: usize) -> usize {
        1 + (2 + self.kv_groups + group) * self.num_tokens
    }
    /// Offset of the token index of each sampled row.
    pub fn sample_tokens(&self) -> usize {
        1 + (2 + 2 * self.kv_groups) * self.num_tokens
    }
    /// Offset of the logprob alternatives of each sampled row.
    pub fn top_n(&self) -> usize {
        self.sample_tokens() + self.num_samples
    }
    /// Offset of the sampling parameters (`SAMPLE_PARAMS` words per sampled row).
    pub fn sample_params(&self) -> usize {
        self.top_n() + self.num_samples
    }
    /// Offset of the block tables.
    pub fn block_tables(&self) -> usize {
        self.sample_params() + SAMPLE_PARAMS * self.num_samples
    }
    /// Offset of the sampled rows' lists (the list offsets in the parameters count from here).
    pub fn lists(&self) -> usize {
        self.block_tables() + self.kv_groups * self.num_rows * self.max_blocks
    }
    /// Offset of the prefill-attention tiles.
    pub fn tiles(&self) -> usize {
        self.lists() + self.list_words
    }
    /// Offset of the late grammar masks (one slot of `mask_words` words per late row); the
    /// first copy of a step ends here.
    pub fn late_mask_slots(&self) -> usize {
        self.tiles() + 2 * self.num_tiles
    }
    /// Total words.
    pub fn len(&self) -> usize {
        self.late_mask_slots() + self.late_masks * self.mask_words
    }
    /// Sampled rows that belong to the batch (padding excluded).
    pub fn real_samples(&self) -> usize {
        self.num_samples - self.padding
    }
    /// Whether the step carries no tokens.
    pub fn is_empty(&self) -> bool {
        self.num_tokens == 0
    }
}

/// Padding added to a step so that a captured graph can run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// No padding: the step runs eagerly.
    None,
    /// This many padding decode rows (one sampled token each), up to a decode graph's batch size.
    DecodeRows(usize),
    /// This many unsampled padding tokens, up to a mixed-step graph's token count.
    Tokens(usize),
}

/// Limits a packed step must respect (the sizes of the device buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Most tokens per step.
    pub max_tokens: usize,
    /// Most rows per step.
    pub max_rows: usize,
    /// Physical blocks in the KV cache.
    pub num_blocks: usize,
    /// The KV groups of the model's layers (each row's block table holds one table per group).
    pub kv_groups: KvGroups,
    /// Vocabulary size.
    pub vocab: usize,
    /// Words of the device input buffer.
    pub max_words: usize,
    /// Tokens per prefill-attention tile (0: no tiles, the paged kernel serves every step).
    pub tile_tokens: usize,
    /// Tiles of at most this many tokens go to the small-tile kernel (0: none does).
    pub small_tile_tokens: usize,
    /// Full tiles a step needs before they are kept: with fewer, or with a one-token row (a
    /// decode) in the step, every row is cut into small tiles instead (when `small_tile_tokens`
    /// is not 0).
    pub min_big_tiles: usize,
}

/// Words of the grammar mask of a vocabulary of `vocab` tokens.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Words of the device input buffer for these step limits (tiles included), `kv_groups` block
/// tables per row of at most `max_blocks_per_seq` entries each, penalty lists of at most
/// `max_penalty_tokens` tokens per row, and per row a full `logit_bias` list and a grammar mask
/// over `vocab` tokens.
pub fn max_words(
    max_tokens: usize,
    max_rows: usize,
    (kv_groups, max_blocks_per_seq): (usize, usize),
    max_penalty_tokens: usize,
    vocab: usize,
) -> usize {
    1 + (4 + 2 * kv_groups) * max_tokens
        + (2 + SAMPLE_PARAMS) * max_rows
        + kv_groups * max_rows * max_blocks_per_seq
        + 2 * max_rows * max_penalty_tokens
        + max_rows * (2 * MAX_LOGIT_BIAS_TOKENS + mask_words(vocab))
}

/// Appends the penalty list of a sampled row to `pairs` as distinct `(token, times generated)`
/// pairs: every token of prompt and output when the repetition penalty is on, and the generated
/// tokens (with their counts) when the frequency or presence penalty is on. Returns the number of
/// pairs.
fn pack_penalties(
    spec: &SampleSpec<'_>,
    seq_id: u64,
    vocab: usize,
    pairs: &mut Vec<i32>,
) -> Result<usize, BackendError> {
    let params = spec.params;
    if !params.has_penalties() {
        return Ok(0);
    }
    let repetition = params.repetition_penalty != 1.0;
    let additive = params.frequency_penalty != 0.0 || params.presence_penalty != 0.0;
    let mut counts: HashMap<u32, i32> = HashMap::new();
    if repetition {
        for &token in spec.prompt.iter().chain(spec.output) {
            counts.entry(token).or_insert(0);
        }
    }
    if additive {
        for &token in spec.output {
            *counts.entry(token).or_insert(0) += 1;
        }
    }
    for (&token, &generated) in &counts {
        if token as usize >= vocab {
            return Err(BackendError::InvalidBatch(format!(
                "row {seq_id}: penalised token {token} is outside the vocabulary of {vocab}"
            )));
        }
        pairs.extend([token as i32, generated]);
    }
    Ok(counts.len())
}

/// Where a sampled row's lists lie in the lists region, in words from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowLists {
    penalty_at: usize,
    penalty_len: usize,
    bias_at: usize,
    bias_len: usize,
    mask_at: Option<usize>,
}

/// Appends a sampled row's lists to `lists` (penalty pairs, bias pairs, then its grammar mask
/// widened or cut to the vocabulary's words, unless the mask comes late: its place is then set
/// by the caller) and says where they are.
fn pack_lists(
    spec: &SampleSpec<'_>,
    seq_id: u64,
    vocab: usize,
    late: bool,
    lists: &mut Vec<i32>,
) -> Result<RowLists, BackendError> {
    let penalty_at = lists.len();
    let penalty_len = pack_penalties(spec, seq_id, vocab, lists)?;
    let bias = &spec.params.logit_bias;
    if bias.len() > MAX_LOGIT_BIAS_TOKENS {
        return Err(BackendError::InvalidBatch(format!(
            "row {seq_id}: {} logit biases exceed the limit of {MAX_LOGIT_BIAS_TOKENS}",
            bias.len()
        )));
    }
    let bias_at = lists.len();
    for (i, &(token, value)) in bias.iter().enumerate() {
        if token as usize >= vocab {
            return Err(BackendError::InvalidBatch(format!(
                "row {seq_id}: biased token {token} is outside the vocabulary of {vocab}"
            )));
        }
        // The kernel adds the biases in parallel, so every token may appear once.
        if i > 0 && bias[i - 1].0 >= token {
            return Err(BackendError::InvalidBatch(format!(
                "row {seq_id}: logit biases must be sorted by token without duplicates"
            )));
        }
        lists.extend([token as i32, value.to_bits() as i32]);
    }
    if late && spec.mask.is_some() {
        return Err(BackendError::InvalidBatch(format!(
            "row {seq_id}: a late grammar mask must not come with the step"
        )));
    }
    let mask_at = spec.mask.map(|mask| {
        let at = lists.len();
        lists.resize(at + mask_words(vocab), 0);
        write_mask(mask, &mut lists[at..]);
        at
    });
    Ok(RowLists {
        penalty_at,
        penalty_len,
        bias_at,
        bias_len: bias.len(),
        mask_at,
    })
}

/// Writes a grammar mask into its slot of `ceil(vocab / 32)` words, cut or widened to it: tokens
/// beyond the grammar's mask are disallowed, as in the reference sampler.
fn write_mask(mask: &[u32], slot: &mut [i32]) {
    let kept = mask.len().min(slot.len());
    for (word, &bits) in slot.iter_mut().zip(&mask[..kept]) {
        *word = bits as i32;
    }
    slot[kept..].fill(0);
}

/// Fills the late mask slots of a step packed with [`pack_step_with_late_masks`]: `rows` are the
/// step's rows again, now with the late rows' masks (a late row without a mask, whose grammar
/// failed, allows every token; the engine ends it after the step). Returns the range of words of
/// `out` to copy to the device.
pub fn fill_late_masks(
    rows: &[BatchRow<'_>],
    late: &[bool],
    layout: &StepLayout,
    out: &mut [i32],
) -> Result<std::ops::Range<usize>, BackendError> {
    let specs: Vec<&SampleSpec<'_>> = rows.iter().filter_map(|r| r.sample.as_ref()).collect();
    if specs.len() + layout.padding != layout.num_samples || late.len() != specs.len() {
        return Err(BackendError::InvalidBatch(format!(
            "the step was started with {} sampled rows, it is finished with {}",
            layout.real_samples(),
            specs.len()
        )));
    }
    let slots = layout.late_mask_slots()..layout.len();
    if out.len() < slots.end {
        return Err(BackendError::InvalidBatch(
            "the packed step is shorter than its layout".into(),
        ));
    }
    let mut slot = slots.start;
    for (spec, _) in specs.iter().zip(late).filter(|(_, late)| **late) {
        let words = &mut out[slot..slot + layout.mask_words];
        match spec.mask {
            Some(mask) => write_mask(mask, words),
            None => words.fill(-1),
        }
        slot += layout.mask_words;
    }
    Ok(slots)
}

/// The parameter words of one sampled row (see `kernels/sampling.cu`).
fn sample_params(
    spec: &SampleSpec<'_>,
    lists: &RowLists,
) -> Result<[i32; SAMPLE_PARAMS], BackendError> {
    let p = spec.params;
    let bits = |x: f32| x.to_bits() as i32;
    let lo = |x: u64| x as u32 as i32;
    let hi = |x: u64| (x >> 32) as u32 as i32;
    Ok([
        bits(p.temperature),
        i32::try_from(p.top_k).unwrap_or(i32::MAX),
        bits(p.top_p),
        bits(p.min_p),
        bits(p.presence_penalty),
        bits(p.frequency_penalty),
        bits(p.repetition_penalty),
        lo(spec.seed),
        hi(spec.seed),
        lo(spec.draw_index),
        hi(spec.draw_index),
        to_i32(lists.penalty_at)?,
        to_i32(lists.penalty_len)?,
        to_i32(lists.bias_at)?,
        to_i32(lists.bias_len)?,
        match lists.mask_at {
            Some(at) => to_i32(at)?,
            None => -1,
        },
    ])
}

/// The parameter words of a padding row: greedy, no penalties, no biases, no mask.
fn padding_params() -> [i32; SAMPLE_PARAMS] {
    let mut words = [0; SAMPLE_PARAMS];
    words[2] = 1.0f32.to_bits() as i32;
    words[6] = 1.0f32.to_bits() as i32;
    words[SAMPLE_PARAMS - 1] = -1;
    words
}

/// Packs a batch into `out`, followed by its `padding` (see [`Padding`]), and
/// returns its layout. Every index that a kernel will follow is checked here, so a malformed
/// batch is refused before anything reaches the device.
pub fn pack_step(
    rows: &[BatchRow<'_>],
    padding: Padding,
    limits: &StepLimits,
    out: &mut Vec<i32>,
) -> Result<StepLayout, BackendError> {
    pack_step_with_late_masks(rows, &[], padding, limits, out)
}

/// [`pack_step`] for a step some of whose grammar masks are not known yet: `late[i]` (one entry
/// per sampled row of the batch, or none at all) says that the i-th sampled row's mask comes
/// later; its row carries none now, its mask slot is reserved at the end of the buffer (zeros
/// until [`fill_late_masks`] writes it) and its parameters point there.
pub fn pack_step_with_late_masks(
    rows: &[BatchRow<'_>],
    late: &[bool],
    padding: Padding,
    limits: &StepLimits,
    out: &mut Vec<i32>,
) -> Result<StepLayout, BackendError> {
    pack(rows, None, late, padding, limits, out)
}

/// [`pack_step`] for a step that samples several positions of a row (speculative verification
/// on the device): `specs[i]` are the sampling specs of the last `specs[i].len()` tokens of the
/// i-th row, in order, each packed as a sampled row of its own whose token index is that
/// token's (the rows' own `sample` is ignored). No mask comes late.
pub fn pack_positions(
    rows: &[BatchRow<'_>],
    specs: &[&[SampleSpec<'_>]],
    padding: Padding,
    limits: &StepLimits,
    out: &mut Vec<i32>,
) -> Result<StepLayout, BackendError> {
    if specs.len() != rows.len() {
        return Err(BackendError::InvalidBatch(format!(
            "sampling specs for {} rows of a step of {}",
            specs.len(),
            rows.len()
        )));
    }
    if let Some((row, _)) = rows
        .iter()
        .zip(specs)
        .find(|(row, specs)| specs.len() > row.tokens.len())
    {
        return Err(BackendError::InvalidBatch(format!(
            "row {}: more sampled positions than tokens",
            row.seq_id
        )));
    }
    pack(rows, Some(specs), &[], padding, limits, out)
}

/// Packs a step whose sampled positions are `specs` (see [`pack_positions`]), or each row's
/// last token when it carries a `sample` (`None`).
fn pack(
    rows: &[BatchRow<'_>],
    specs: Option<&[&[SampleSpec<'_>]]>,
    late: &[bool],
    padding: Padding,
    limits: &StepLimits,
    out: &mut Vec<i32>,
) -> Result<StepLayout, BackendError> {
    let specs_of = |r: usize| -> &[SampleSpec<'_>] {
        match specs {
            Some(specs) => specs[r],
            None => rows[r].sample.as_slice(),
        }
    };
    let (padding, token_padding) = match padding {
        Padding::None => (0, 0),
        Padding::DecodeRows(n) => (n, 0),
        Padding::Tokens(n) => (0, n),
    };
    let num_tokens: usize =
        rows.iter().map(|r| r.tokens.len()).sum::<usize>() + padding + token_padding;
    let num_samples = (0..rows.len()).map(|r| specs_of(r).len()).sum::<usize>() + padding;
    let groups = limits.kv_groups.count();
    let max_blocks = rows
        .iter()
        .map(|r| r.block_table.len() / groups)
        .max()
        .unwrap_or(0)
        .max(1);
    if num_tokens > limits.max_tokens {
        return Err(BackendError::InvalidBatch(format!(
            "{num_tokens} tokens exceed the step limit of {}",
            limits.max_tokens
        )));
    }
    if rows.len().max(num_samples) > limits.max_rows {
        return Err(BackendError::InvalidBatch(format!(
            "{} rows exceed the step limit of {}",
            rows.len().max(num_samples),
            limits.max_rows
        )));
    }
    if !late.is_empty() && late.len() != num_samples - padding {
        return Err(BackendError::InvalidBatch(format!(
            "{} late-mask flags for {} sampled rows",
            late.len(),
            num_samples - padding
        )));
    }
    let is_late = |s: usize| late.get(s).copied().unwrap_or(false);
    let mut lists = Vec::new();
    let mut row_lists = Vec::with_capacity(num_samples);
    for (r, row) in rows.iter().enumerate() {
        for spec in specs_of(r) {
            let late = is_late(row_lists.len());
            row_lists.push(pack_lists(
                spec,
                row.seq_id,
                limits.vocab,
                late,
                &mut lists,
            )?);
        }
    }
    let prefill = rows.iter().any(|r| r.tokens.len() > 1);
    let (tiles, num_small_tiles) = if prefill && limits.tile_tokens > 0 {
        // Full tiles are those of more than `small_tile_tokens` tokens. With too few of them, or
        // beside decode rows (one-token rows), the rows are cut into small tiles only.
        let small = limits.small_tile_tokens;
        let decodes = rows.iter().any(|r| r.tokens.len() == 1);
        let is_full = |count: usize| count > small;
        let full_tiles: usize = rows
            .iter()
            .map(|row| {
                let n = row.tokens.len();
                n / limits.tile_tokens * usize::from(is_full(limits.tile_tokens))
                    + usize::from(is_full(n % limits.tile_tokens))
            })
            .sum();
        let run = if small > 0 && (decodes || full_tiles < limits.min_big_tiles) {
            small
        } else {
            limits.tile_tokens
        };
        let mut first = 0;
        let mut tiles = Vec::new();
        for row in rows {
            let n = row.tokens.len();
            let mut done = 0;
            while done < n {
                let count = run.min(n - done);
                tiles.push((first + done, count));
                done += count;
            }
            first += n;
        }
        // The small tiles last, each group in step order.
        let (full, small): (Vec<_>, Vec<_>) = tiles.into_iter().partition(|&(_, c)| is_full(c));
        let num_small = small.len();
        (full.into_iter().chain(small).collect::<Vec<_>>(), num_small)
    } else {
        (Vec::new(), 0)
    };
    let mut max_context = 0;
    let layout_probe = StepLayout {
        num_tokens,
        num_rows: rows.len(),
        kv_groups: groups,
        num_samples,
        padding,
        token_padding,
        max_blocks,
        list_words: lists.len(),
        num_tiles: tiles.len(),
        num_small_tiles,
        max_context,
        late_masks: late.iter().filter(|&&l| l).count(),
        mask_words: mask_words(limits.vocab),
    };
    // The late masks' slots follow the tiles; list offsets count from the lists' start.
    let mut slot = layout_probe.late_mask_slots() - layout_probe.lists();
    for (s, lists) in row_lists.iter_mut().enumerate() {
        if is_late(s) {
            lists.mask_at = Some(slot);
            slot += layout_probe.mask_words;
        }
    }
    if layout_probe.len() > limits.max_words {
        return Err(BackendError::InvalidBatch(format!(
            "step inputs need {} words, the buffer holds {}",
            layout_probe.len(),
            limits.max_words
        )));
    }
    out.clear();
    out.resize(layout_probe.len(), 0);
    out[layout_probe.max_blocks_word()] = to_i32(max_blocks)?;
    out[layout_probe.lists()..layout_probe.tiles()].copy_from_slice(&lists);
    for (i, &(first, count)) in tiles.iter().enumerate() {
        out[layout_probe.tiles() + 2 * i] = to_i32(first)?;
        out[layout_probe.tiles() + 2 * i + 1] = to_i32(count)?;
    }
    let mut t = 0;
    let mut s = 0;
    for (r, row) in rows.iter().enumerate() {
        if row.tokens.is_empty() {
            return Err(BackendError::InvalidBatch(format!(
                "row {} has no tokens",
                row.seq_id
            )));
        }
        let end = row.start_pos + row.tokens.len();
        let per_group = row.block_table.len() / groups;
        if row.block_table.len() % groups != 0 || per_group * BLOCK_SIZE < end {
            return Err(BackendError::InvalidBatch(format!(
                "row {}: {} block table entries for {groups} KV groups cannot hold {end} \
                 positions",
                row.seq_id,
                row.block_table.len()
            )));
        }
        max_context = max_context.max(end);
        for (g, table) in row.block_table.chunks(per_group).enumerate() {
            // The blocks the row's tokens read and write; a sliding group's earlier entries may
            // have been given back (written as 0: no kernel reads them).
            let first_read = limits.kv_groups.first_needed_block(g, row.start_pos);
            let at = layout_probe.block_tables() + (g * rows.len() + r) * max_blocks;
            for (j, &block) in table.iter().enumerate() {
                if block == FREED_BLOCK && j < first_read {
                    continue;
                }
                if block == FREED_BLOCK {
                    return Err(BackendError::InvalidBatch(format!(
                        "row {}: block {j} of KV group {g} was given back, but the window reads it",
                        row.seq_id
                    )));
                }
                if block as usize >= limits.num_blocks {
                    return Err(BackendError::InvalidBatch(format!(
                        "row {}: block {block} is outside the cache of {} blocks",
                        row.seq_id, limits.num_blocks
                    )));
                }
                out[at + j] = block as i32;
            }
        }
        for (i, &token) in row.tokens.iter().enumerate() {
            if token as usize >= limits.vocab {
                return Err(BackendError::InvalidBatch(format!(
                    "row {}: token {token} is outside the vocabulary of {}",
                    row.seq_id, limits.vocab
                )));
            }
            let pos = row.start_pos + i;
            out[layout_probe.tokens() + t] = token as i32;
            out[layout_probe.positions() + t] = to_i32(pos)?;
            for g in 0..groups {
                let block = row.block_table[g * per_group + pos / BLOCK_SIZE] as usize;
                out[layout_probe.slots(g) + t] = to_i32(block * BLOCK_SIZE + pos % BLOCK_SIZE)?;
                out[layout_probe.token_rows(g) + t] = to_i32(g * rows.len() + r)?;
            }
            t += 1;
        }
        let sampled = specs_of(r);
        for (i, spec) in sampled.iter().enumerate() {
            out[layout_probe.sample_tokens() + s] = (t - sampled.len() + i) as i32;
            let top = spec.logprobs.unwrap_or(0) as usize;
            out[layout_probe.top_n() + s] = top.min(MAX_TOP_LOGPROBS) as i32;
            let words = layout_probe.sample_params() + s * SAMPLE_PARAMS;
            out[words..words + SAMPLE_PARAMS].copy_from_slice(&sample_params(spec, &row_lists[s])?);
            s += 1;
        }
    }
    for _ in 0..padding {
        for g in 0..groups {
            out[layout_probe.slots(g) + t] = -1;
            out[layout_probe.token_rows(g) + t] = -1;
        }
        out[layout_probe.sample_tokens() + s] = t as i32;
        let words = layout_probe.sample_params() + s * SAMPLE_PARAMS;
        out[words..words + SAMPLE_PARAMS].copy_from_slice(&padding_params());
        t += 1;
        s += 1;
    }
    for _ in 0..token_padding {
        for g in 0..groups {
            out[layout_probe.slots(g) + t] = -1;
            out[layout_probe.token_rows(g) + t] = -1;
        }
        t += 1;
    }
    Ok(StepLayout {
        max_context,
        ..layout_probe
    })
}

fn to_i32(value: usize) -> Result<i32, BackendError> {
    i32::try_from(value)
        .map_err(|_| BackendError::InvalidBatch(format!("index {value} overflows i32")))
}

/// Host-device copies made by the backend, counted so a test can hold it to one copy each way
/// per decode step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Forward steps run.
    pub steps: u64,
    /// Host-to-device copies made by steps.
    pub h2d: u64,
    /// Device-to-host copies made by steps.
    pub d2h: u64,
    /// Bytes copied host-to-device by steps.
    pub h2d_bytes: u64,
    /// Bytes copied device-to-host by steps.
    pub d2h_bytes: u64,
}

impl CopyStats {
    /// Records a host-to-device copy.
    pub fn record_h2d(&mut self, bytes: usize) {
        self.h2d += 1;
        self.h2d_bytes += bytes as u64;
    }
    /// Records a device-to-host copy.
    pub fn record_d2h(&mut self, bytes: usize) {
        self.d2h += 1;
        self.d2h_bytes += bytes as u64;
    }
    /// The copies made since `earlier`.
    pub fn since(&self, earlier: &CopyStats) -> CopyStats {
        CopyStats {
            steps: self.steps - earlier.steps,
            h2d: self.h2d - earlier.h2d,
            d2h: self.d2h - earlier.d2h,
            h2d_bytes: self.h2d_bytes - earlier.h2d_bytes,
            d2h_bytes: self.d2h_bytes - earlier.d2h_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
