//! Packing every input of a forward step into one host buffer, so a step makes exactly one
//! host-to-device copy (see `docs/cuda-backend.md`: in confidential-computing mode every copy
//! goes through an encrypted bounce buffer and costs a fixed overhead).
//!
//! The packed buffer is an array of `i32` holding, in order: the block-table stride (one word),
//! token ids `[T]`, positions `[T]`, KV-cache slots `[T]`, the row of each token `[T]`, the token
//! index of each sampled row `[S]`, the number of logprob alternatives of each sampled row `[S]`,
//! the sampling parameters of each sampled row `[S * SAMPLE_PARAMS]` (temperature, top-k, top-p,
//! min-p, presence, frequency and repetition penalties as float bits or ints, the seed and the
//! draw index as 32-bit halves, where its penalty list and its bias list start and how long they
//! are, and where its grammar mask starts or -1), the block tables `[R * max_blocks]`
//! (zero-padded), then the sampled rows' lists, row after row: the penalty list (distinct
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
//! Padding tokens have token 0, position 0, slot -1 (the QKV kernel writes no cache entry) and row
//! -1 (attention outputs zero). Those that pad a decode step to its graph's batch size are sampled
//! with no alternatives, as padding rows; those that pad a mixed step to its graph's token count
//! are not sampled. Their results are never copied back.

use std::collections::HashMap;

use crate::engine::{BLOCK_SIZE, BackendError, BatchRow, MAX_LOGIT_BIAS_TOKENS, SampleSpec};

use super::kernels::{MAX_TOP_LOGPROBS, SAMPLE_PARAMS};

/// Offsets (in `i32` words) of each array in a packed step buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLayout {
    /// Tokens in the step, padding included (T).
    pub num_tokens: usize,
    /// Rows with a block table (R, the batch's own rows).
    pub num_rows: usize,
    /// Rows that need a next token, padding included (S).
    pub num_samples: usize,
    /// Padding decode rows at the end of the step (one token each, each a sampled row).
    pub padding: usize,
    /// Padding tokens at the end of the step that no row owns and nothing samples.
    pub token_padding: usize,
    /// Stride of the block-table array: the longest block table of the step.
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
    /// Offset of the KV-cache slots.
    pub fn slots(&self) -> usize {
        1 + 2 * self.num_tokens
    }
    /// Offset of the row index of each token.
    pub fn token_rows(&self) -> usize {
        1 + 3 * self.num_tokens
    }
    /// Offset of the token index of each sampled row.
    pub fn sample_tokens(&self) -> usize {
        1 + 4 * self.num_tokens
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
        self.block_tables() + self.num_rows * self.max_blocks
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

/// Words of the device input buffer for these step limits (tiles included), block tables of at most
/// `max_blocks_per_seq` entries, penalty lists of at most `max_penalty_tokens` tokens per row, and
/// per row a full `logit_bias` list and a grammar mask over `vocab` tokens.
pub fn max_words(
    max_tokens: usize,
    max_rows: usize,
    max_blocks_per_seq: usize,
    max_penalty_tokens: usize,
    vocab: usize,
) -> usize {
    1 + 6 * max_tokens
        + (2 + SAMPLE_PARAMS) * max_rows
        + max_rows * max_blocks_per_seq
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
    let (padding, token_padding) = match padding {
        Padding::None => (0, 0),
        Padding::DecodeRows(n) => (n, 0),
        Padding::Tokens(n) => (0, n),
    };
    let num_tokens: usize =
        rows.iter().map(|r| r.tokens.len()).sum::<usize>() + padding + token_padding;
    let num_samples = rows.iter().filter(|r| r.sample.is_some()).count() + padding;
    let max_blocks = rows
        .iter()
        .map(|r| r.block_table.len())
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
    for row in rows {
        if let Some(spec) = &row.sample {
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
        if row.block_table.len() * BLOCK_SIZE < end {
            return Err(BackendError::InvalidBatch(format!(
                "row {}: {} blocks cannot hold {end} positions",
                row.seq_id,
                row.block_table.len()
            )));
        }
        max_context = max_context.max(end);
        for (j, &block) in row.block_table.iter().enumerate() {
            if block as usize >= limits.num_blocks {
                return Err(BackendError::InvalidBatch(format!(
                    "row {}: block {block} is outside the cache of {} blocks",
                    row.seq_id, limits.num_blocks
                )));
            }
            out[layout_probe.block_tables() + r * max_blocks + j] = block as i32;
        }
        for (i, &token) in row.tokens.iter().enumerate() {
            if token as usize >= limits.vocab {
                return Err(BackendError::InvalidBatch(format!(
                    "row {}: token {token} is outside the vocabulary of {}",
                    row.seq_id, limits.vocab
                )));
            }
            let pos = row.start_pos + i;
            let block = row.block_table[pos / BLOCK_SIZE] as usize;
            out[layout_probe.tokens() + t] = token as i32;
            out[layout_probe.positions() + t] = to_i32(pos)?;
            out[layout_probe.slots() + t] = to_i32(block * BLOCK_SIZE + pos % BLOCK_SIZE)?;
            out[layout_probe.token_rows() + t] = r as i32;
            t += 1;
        }
        if let Some(spec) = &row.sample {
            out[layout_probe.sample_tokens() + s] = (t - 1) as i32;
            let top = spec.logprobs.unwrap_or(0) as usize;
            out[layout_probe.top_n() + s] = top.min(MAX_TOP_LOGPROBS) as i32;
            let words = layout_probe.sample_params() + s * SAMPLE_PARAMS;
            out[words..words + SAMPLE_PARAMS].copy_from_slice(&sample_params(spec, &row_lists[s])?);
            s += 1;
        }
    }
    for _ in 0..padding {
        out[layout_probe.slots() + t] = -1;
        out[layout_probe.token_rows() + t] = -1;
        out[layout_probe.sample_tokens() + s] = t as i32;
        let words = layout_probe.sample_params() + s * SAMPLE_PARAMS;
        out[words..words + SAMPLE_PARAMS].copy_from_slice(&padding_params());
        t += 1;
        s += 1;
    }
    for _ in 0..token_padding {
        out[layout_probe.slots() + t] = -1;
        out[layout_probe.token_rows() + t] = -1;
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
mod tests {
    use super::*;
    use crate::engine::{SampleSpec, SamplingParams};

    fn limits() -> StepLimits {
        StepLimits {
            max_tokens: 64,
            max_rows: 8,
            num_blocks: 10,
            vocab: 100,
            max_words: 1024,
            tile_tokens: 2,
            small_tile_tokens: 0,
            min_big_tiles: 0,
        }
    }

    /// A decode of token 5 at position 17 (in the second block of its table), sampled by `spec`.
    fn second_block_decode(spec: SampleSpec<'_>) -> BatchRow<'_> {
        BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 17,
            block_table: &[3, 7],
            sample: Some(spec),
        }
    }

    /// Sequence 2's first prefill chunk, three tokens in block 4, sampling nothing.
    fn prefill_chunk() -> BatchRow<'static> {
        BatchRow {
            seq_id: 2,
            tokens: &[1, 2, 3],
            start_pos: 0,
            block_table: &[4],
            sample: None,
        }
    }

    /// A row's sampling request with `params`, seed 1, no history and `logprobs` alternatives.
    fn plain_spec(params: &SamplingParams, logprobs: u32) -> SampleSpec<'_> {
        SampleSpec {
            params,
            seed: 1,
            draw_index: 0,
            prompt: &[],
            output: &[],
            logprobs: Some(logprobs),
            mask: None,
        }
    }

    /// With a small-tile kernel, the tiles of at most `small_tile_tokens` tokens (a chunk's
    /// one-token tail) follow the others, each group in step order; a step with fewer full tiles
    /// than `min_big_tiles`, or with a decode row, is cut into small tiles only.
    #[test]
    fn packs_small_tiles_last() {
        let second_chunk = BatchRow {
            seq_id: 3,
            tokens: &[6, 7],
            start_pos: 0,
            block_table: &[5],
            sample: None,
        };
        let rows = [prefill_chunk(), second_chunk];
        let limits = StepLimits {
            small_tile_tokens: 1,
            ..limits()
        };
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::None, &limits, &mut out).expect("packs");
        assert_eq!((layout.num_tiles, layout.num_small_tiles), (3, 1));
        assert_eq!(&out[layout.tiles()..], &[0, 2, 3, 2, 2, 1]);
        let without = pack_step(&rows, Padding::None, &self::limits(), &mut out).expect("packs");
        assert_eq!((without.num_tiles, without.num_small_tiles), (3, 0));
        assert_eq!(&out[without.tiles()..], &[0, 2, 2, 1, 3, 2]);
        // Two full tiles where three are wanted: every row in small tiles.
        let few = StepLimits {
            min_big_tiles: 3,
            ..limits
        };
        let layout = pack_step(&rows, Padding::None, &few, &mut out).expect("packs");
        assert_eq!((layout.num_tiles, layout.num_small_tiles), (5, 5));
        assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 1, 2, 1, 3, 1, 4, 1]);
        // Beside a decode row, too: the chunk's full tile goes to small tiles as well.
        let params = SamplingParams::default();
        let mixed = [second_block_decode(plain_spec(&params, 3)), prefill_chunk()];
        let layout = pack_step(&mixed, Padding::None, &limits, &mut out).expect("packs");
        assert_eq!((layout.num_tiles, layout.num_small_tiles), (4, 4));
        assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 1, 2, 1, 3, 1]);
        let without = pack_step(&mixed, Padding::None, &self::limits(), &mut out).expect("packs");
        assert_eq!((without.num_tiles, without.num_small_tiles), (3, 0));
    }

    #[test]
    fn packs_a_mixed_batch() {
        let params = SamplingParams::default();
        let spec = plain_spec(&params, 3);
        let rows = [
            second_block_decode(spec),
            // A prefill chunk that needs no token yet.
            prefill_chunk(),
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::None, &limits(), &mut out).expect("packs");
        assert_eq!(
            (
                layout.num_tokens,
                layout.num_rows,
                layout.num_samples,
                layout.max_blocks
            ),
            (4, 2, 1, 2)
        );
        assert_eq!(out[layout.max_blocks_word()], 2);
        assert_eq!(layout.max_context, 18);
        assert_eq!(out.len(), layout.len());
        assert_eq!(&out[layout.tokens()..layout.tokens() + 4], &[5, 1, 2, 3]);
        assert_eq!(
            &out[layout.positions()..layout.positions() + 4],
            &[17, 0, 1, 2]
        );
        assert_eq!(
            &out[layout.slots()..layout.slots() + 4],
            &[7 * 16 + 1, 64, 65, 66]
        );
        assert_eq!(
            &out[layout.token_rows()..layout.token_rows() + 4],
            &[0, 1, 1, 1]
        );
        assert_eq!(
            &out[layout.block_tables()..layout.block_tables() + 4],
            &[3, 7, 4, 0]
        );
        assert_eq!(out[layout.sample_tokens()], 0);
        assert_eq!(out[layout.top_n()], 3);
        // Prefill tiles of at most 2 tokens per row: the decode token, then the 3-token chunk.
        assert_eq!(layout.num_tiles, 3);
        assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 2, 3, 1]);
        assert_eq!(out.len(), layout.len());
    }

    #[test]
    fn refuses_what_a_kernel_would_read_out_of_bounds() {
        let mut out = Vec::new();
        let short = [BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 16,
            block_table: &[3],
            sample: None,
        }];
        assert!(pack_step(&short, Padding::None, &limits(), &mut out).is_err());
        let far = [BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 0,
            block_table: &[10],
            sample: None,
        }];
        assert!(pack_step(&far, Padding::None, &limits(), &mut out).is_err());
        let bad_token = [BatchRow {
            seq_id: 1,
            tokens: &[100],
            start_pos: 0,
            block_table: &[1],
            sample: None,
        }];
        assert!(pack_step(&bad_token, Padding::None, &limits(), &mut out).is_err());
        let tokens = [0u32; 65];
        let table = [0u32; 5];
        let long = [BatchRow {
            seq_id: 1,
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            sample: None,
        }];
        assert!(pack_step(&long, Padding::None, &limits(), &mut out).is_err());
    }

    #[test]
    fn pads_a_decode_batch_to_its_bucket() {
        let params = SamplingParams::default();
        let spec = plain_spec(&params, 2);
        let rows = [
            second_block_decode(spec),
            BatchRow {
                seq_id: 2,
                tokens: &[9],
                start_pos: 4,
                block_table: &[2],
                sample: Some(spec),
            },
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::DecodeRows(2), &limits(), &mut out).expect("packs");
        assert_eq!(
            (
                layout.num_tokens,
                layout.num_rows,
                layout.num_samples,
                layout.real_samples()
            ),
            (4, 2, 4, 2)
        );
        // The offsets of a padded step depend on the bucket alone, not on the table lengths.
        let mut other = Vec::new();
        let short_rows = [
            BatchRow {
                block_table: &[3],
                start_pos: 3,
                ..rows[0]
            },
            rows[1],
        ];
        let short =
            pack_step(&short_rows, Padding::DecodeRows(2), &limits(), &mut other).expect("packs");
        assert_eq!(short.sample_tokens(), layout.sample_tokens());
        assert_eq!(short.top_n(), layout.top_n());
        assert_eq!(short.block_tables(), layout.block_tables());
        assert_eq!((other[0], out[0]), (1, 2));
        assert_eq!(&out[layout.tokens()..layout.tokens() + 4], &[5, 9, 0, 0]);
        assert_eq!(
            &out[layout.slots()..layout.slots() + 4],
            &[7 * 16 + 1, 2 * 16 + 4, -1, -1]
        );
        assert_eq!(
            &out[layout.token_rows()..layout.token_rows() + 4],
            &[0, 1, -1, -1]
        );
        assert_eq!(
            &out[layout.sample_tokens()..layout.sample_tokens() + 4],
            &[0, 1, 2, 3]
        );
        assert_eq!(&out[layout.top_n()..layout.top_n() + 4], &[2, 2, 0, 0]);
        assert_eq!(&out[layout.block_tables()..], &[3, 7, 2, 0]);
        // Padding past the row limit is refused.
        assert!(pack_step(&rows, Padding::DecodeRows(7), &limits(), &mut out).is_err());
    }

    #[test]
    fn pads_a_mixed_step_with_unsampled_tokens() {
        let params = SamplingParams::default();
        let spec = plain_spec(&params, 1);
        let rows = [second_block_decode(spec), prefill_chunk()];
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::Tokens(4), &limits(), &mut out).expect("packs");
        assert_eq!(
            (
                layout.num_tokens,
                layout.num_rows,
                layout.num_samples,
                layout.real_samples(),
                layout.token_padding
            ),
            (8, 2, 1, 1, 4)
        );
        assert_eq!(
            &out[layout.tokens()..layout.tokens() + 8],
            &[5, 1, 2, 3, 0, 0, 0, 0]
        );
        assert_eq!(
            &out[layout.slots()..layout.slots() + 8],
            &[7 * 16 + 1, 4 * 16, 4 * 16 + 1, 4 * 16 + 2, -1, -1, -1, -1]
        );
        assert_eq!(
            &out[layout.token_rows()..layout.token_rows() + 8],
            &[0, 1, 1, 1, -1, -1, -1, -1]
        );
        // Only the decode row is sampled; the padding is in no prefill tile.
        assert_eq!(&out[layout.sample_tokens()..layout.top_n()], &[0]);
        let tiles = &out[layout.tiles()..layout.late_mask_slots()];
        assert_eq!(tiles, &[0, 1, 1, 2, 3, 1]);
        // The token-indexed arrays sit where any step of 8 tokens has them.
        let decode = [second_block_decode(spec)];
        let other =
            pack_step(&decode, Padding::Tokens(7), &limits(), &mut Vec::new()).expect("packs");
        assert_eq!(
            (other.positions(), other.slots(), other.sample_tokens()),
            (layout.positions(), layout.slots(), layout.sample_tokens())
        );
        // Padding past the token limit is refused.
        assert!(pack_step(&rows, Padding::Tokens(61), &limits(), &mut out).is_err());
    }

    #[test]
    fn packs_sampling_parameters_and_penalty_lists() {
        let params = SamplingParams {
            temperature: 0.5,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.3,
            frequency_penalty: 0.25,
            presence_penalty: 0.5,
            seed: None,
            logit_bias: Vec::new(),
        };
        let spec = SampleSpec {
            params: &params,
            seed: 0x1234_5678_9abc_def0,
            draw_index: 7,
            prompt: &[1, 2],
            output: &[2, 2, 3],
            logprobs: None,
            mask: None,
        };
        let plain = SamplingParams::default();
        let rows = [
            BatchRow {
                seq_id: 1,
                tokens: &[3],
                start_pos: 4,
                block_table: &[1],
                sample: Some(SampleSpec {
                    params: &plain,
                    ..spec
                }),
            },
            BatchRow {
                seq_id: 2,
                tokens: &[3],
                start_pos: 5,
                block_table: &[2],
                sample: Some(spec),
            },
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::DecodeRows(1), &limits(), &mut out).expect("packs");
        let words = |s: usize| {
            let at = layout.sample_params() + s * SAMPLE_PARAMS;
            out[at..at + SAMPLE_PARAMS].to_vec()
        };
        let f = |x: f32| x.to_bits() as i32;
        // No penalties: an empty list.
        assert_eq!(words(0)[12], 0);
        let w = words(1);
        assert_eq!(
            &w[..11],
            &[
                f(0.5),
                40,
                f(0.9),
                f(0.05),
                f(0.5),
                f(0.25),
                f(1.3),
                0x9abc_def0_u32 as i32,
                0x1234_5678,
                7,
                0
            ]
        );
        // Distinct (token, times generated) pairs over prompt and output.
        let list = &out[layout.lists() + w[11] as usize..][..2 * w[12] as usize];
        let mut pairs: Vec<(i32, i32)> = list.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        pairs.sort_unstable();
        assert_eq!(pairs, vec![(1, 0), (2, 2), (3, 1)]);
        assert_eq!(layout.len(), out.len());
        // The padding row is greedy with no penalties.
        assert_eq!(words(2), padding_params().to_vec());
        // A penalised token outside the vocabulary is refused.
        let bad = [BatchRow {
            sample: Some(SampleSpec {
                output: &[100],
                ..spec
            }),
            ..rows[1]
        }];
        assert!(pack_step(&bad, Padding::None, &limits(), &mut out).is_err());
    }

    #[test]
    fn packs_biases_and_grammar_masks_into_the_lists() {
        // vocab 100: masks of 4 words (tokens 96..99 in the last word's low bits).
        let biased = SamplingParams {
            temperature: 0.7,
            logit_bias: vec![(3, 100.0), (70, -2.5)],
            ..Default::default()
        };
        let plain = SamplingParams::default();
        // A grammar's mask may be shorter than the vocabulary (the rest is disallowed) or longer
        // (bits past the vocabulary are dropped).
        let short_mask = [1u32 << 5, 0x8000_0001];
        let long_mask = [0u32, 0, 0, 1 << 3, 0xffff_ffff];
        let spec = |params, mask| SampleSpec {
            mask,
            ..plain_spec(params, 0)
        };
        let rows = [
            BatchRow {
                seq_id: 1,
                tokens: &[5],
                start_pos: 4,
                block_table: &[1],
                sample: Some(spec(&biased, Some(&short_mask))),
            },
            BatchRow {
                seq_id: 2,
                tokens: &[6],
                start_pos: 4,
                block_table: &[2],
                sample: Some(spec(&plain, None)),
            },
            BatchRow {
                seq_id: 3,
                tokens: &[7],
                start_pos: 4,
                block_table: &[3],
                sample: Some(spec(&plain, Some(&long_mask))),
            },
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, Padding::DecodeRows(1), &limits(), &mut out).expect("packs");
        let words = |s: usize| {
            let at = layout.sample_params() + s * SAMPLE_PARAMS;
            out[at..at + SAMPLE_PARAMS].to_vec()
        };
        let lists = &out[layout.lists()..layout.tiles()];
        // Row 0: two (token, bias bits) pairs, then its mask widened to 4 words.
        let w = words(0);
        assert_eq!((w[13], w[14]), (0, 2));
        assert_eq!(
            &lists[w[13] as usize..][..4],
            &[3, 100.0f32.to_bits() as i32, 70, (-2.5f32).to_bits() as i32]
        );
        let mask = &lists[w[15] as usize..][..4];
        assert_eq!(mask, &[1 << 5, 0x8000_0001_u32 as i32, 0, 0]);
        // Bit t % 32 of word t / 32 is token t: 5, 32 and 63 allowed here.
        let allowed: Vec<usize> = (0..100)
            .filter(|t| (mask[t / 32] as u32 >> (t % 32)) & 1 == 1)
            .collect();
        assert_eq!(allowed, vec![5, 32, 63]);
        // Row 1: no biases, no mask.
        assert_eq!((words(1)[14], words(1)[15]), (0, -1));
        // Row 2: the long mask cut to the vocabulary's 4 words.
        let w = words(2);
        assert_eq!(w[14], 0);
        assert_eq!(&lists[w[15] as usize..][..4], &[0, 0, 0, 1 << 3]);
        // The lists hold exactly the biases and the two masks; the padding row has no mask.
        assert_eq!(layout.list_words, 4 + 2 * mask_words(100));
        assert_eq!(words(3)[15], -1);
        assert_eq!(layout.len(), out.len());
    }

    #[test]
    fn late_masks_take_slots_after_everything_the_first_copy_holds() {
        // vocab 100: masks of 4 words.
        let biased = SamplingParams {
            logit_bias: vec![(3, 100.0)],
            ..Default::default()
        };
        let plain = SamplingParams::default();
        static READY_MASK: [u32; 1] = [1 << 9];
        static LATE_MASK: [u32; 2] = [1 << 5, 0x8000_0001];
        let spec = |params, mask| SampleSpec {
            mask,
            ..plain_spec(params, 0)
        };
        let rows = |first: Option<&'static [u32]>| {
            [
                BatchRow {
                    seq_id: 1,
                    tokens: &[5],
                    start_pos: 4,
                    block_table: &[1],
                    sample: Some(spec(&biased, first)),
                },
                // A prefill chunk: the step has tiles, which the late slots follow.
                prefill_chunk(),
                BatchRow {
                    seq_id: 3,
                    tokens: &[6],
                    start_pos: 4,
                    block_table: &[2],
                    sample: Some(spec(&plain, Some(&READY_MASK))),
                },
                BatchRow {
                    seq_id: 4,
                    tokens: &[7],
                    start_pos: 4,
                    block_table: &[3],
                    sample: Some(spec(&plain, None)),
                },
            ]
        };
        let late = [true, false, true];
        let mut out = Vec::new();
        let layout =
            pack_step_with_late_masks(&rows(None), &late, Padding::None, &limits(), &mut out)
                .expect("packs");
        assert_eq!((layout.late_masks, layout.mask_words), (2, 4));
        assert!(layout.num_tiles > 0);
        assert_eq!(
            layout.late_mask_slots(),
            layout.tiles() + 2 * layout.num_tiles
        );
        assert_eq!(layout.len(), layout.late_mask_slots() + 2 * 4);
        assert_eq!(out.len(), layout.len());
        // The lists hold row 0's bias and row 2's ready mask only; the late rows point at their
        // slots (offsets count from the lists' start), zeros until they are filled.
        assert_eq!(layout.list_words, 2 + 4);
        let mask_at = |s: usize| out[layout.sample_params() + s * SAMPLE_PARAMS + 15] as usize;
        let slots = layout.late_mask_slots() - layout.lists();
        assert_eq!((mask_at(0), mask_at(2)), (slots, slots + 4));
        assert_eq!(&out[layout.lists() + mask_at(1)..][..4], &[1 << 9, 0, 0, 0]);
        assert!(out[layout.late_mask_slots()..].iter().all(|&w| w == 0));
        // Finishing: row 0's mask arrived; row 3's grammar failed (no mask: every token allowed).
        let first_copy = out[..layout.late_mask_slots()].to_vec();
        let range =
            fill_late_masks(&rows(Some(&LATE_MASK)), &late, &layout, &mut out).expect("fills");
        assert_eq!(range, layout.late_mask_slots()..layout.len());
        assert_eq!(
            &out[range.clone()][..4],
            &[1 << 5, 0x8000_0001_u32 as i32, 0, 0]
        );
        assert_eq!(&out[range][4..], &[-1; 4]);
        assert_eq!(&out[..layout.late_mask_slots()], &first_copy[..]);
        // A late row must not bring its mask up front, the flags must match the sampled rows,
        // and the step must be finished with the rows it was started with.
        let mut scratch = Vec::new();
        let early = rows(Some(&LATE_MASK));
        assert!(
            pack_step_with_late_masks(&early, &late, Padding::None, &limits(), &mut scratch)
                .is_err()
        );
        assert!(
            pack_step_with_late_masks(
                &rows(None),
                &late[..2],
                Padding::None,
                &limits(),
                &mut scratch
            )
            .is_err()
        );
        assert!(fill_late_masks(&rows(None)[..2], &late, &layout, &mut out).is_err());
        // Without late rows the layout is pack_step's.
        let mut plain_out = Vec::new();
        let plain_layout =
            pack_step(&rows(None), Padding::None, &limits(), &mut plain_out).expect("packs");
        assert_eq!(plain_layout.late_masks, 0);
        assert_eq!(plain_layout.len(), plain_layout.late_mask_slots());
    }

    #[test]
    fn refuses_biases_a_kernel_could_not_apply() {
        let mut out = Vec::new();
        let row = |params| BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 0,
            block_table: &[1],
            sample: Some(plain_spec(params, 0)),
        };
        let outside = SamplingParams {
            logit_bias: vec![(100, 1.0)],
            ..Default::default()
        };
        let repeated = SamplingParams {
            logit_bias: vec![(4, 1.0), (4, 2.0)],
            ..Default::default()
        };
        let unsorted = SamplingParams {
            logit_bias: vec![(9, 1.0), (4, 2.0)],
            ..Default::default()
        };
        let too_many = SamplingParams {
            logit_bias: (0..=MAX_LOGIT_BIAS_TOKENS as u32)
                .map(|t| (t, 1.0))
                .collect(),
            ..Default::default()
        };
        let big = StepLimits {
            vocab: 10_000,
            max_words: 1 << 20,
            ..limits()
        };
        for (params, limits) in [
            (&outside, limits()),
            (&repeated, limits()),
            (&unsorted, limits()),
            (&too_many, big),
        ] {
            assert!(pack_step(&[row(params)], Padding::None, &limits, &mut out).is_err());
        }
        // At the limit it packs, and the buffer sized by max_words holds every row at the limit
        // with a mask.
        let full = SamplingParams {
            logit_bias: (0..MAX_LOGIT_BIAS_TOKENS as u32)
                .map(|t| (t, 1.0))
                .collect(),
            ..Default::default()
        };
        let mask = vec![u32::MAX; mask_words(big.vocab)];
        let spec = SampleSpec {
            mask: Some(&mask),
            ..plain_spec(&full, 0)
        };
        let rows: Vec<BatchRow<'_>> = (0..big.max_rows)
            .map(|r| BatchRow {
                seq_id: r as u64,
                tokens: &[5],
                start_pos: 0,
                block_table: &[1],
                sample: Some(spec),
            })
            .collect();
        let sized = StepLimits {
            max_words: max_words(big.max_tokens, big.max_rows, 1, 0, big.vocab),
            ..big
        };
        let layout = pack_step(&rows, Padding::None, &sized, &mut out).expect("fits max_words");
        assert!(layout.len() <= sized.max_words);
        assert_eq!(
            layout.list_words,
            big.max_rows * (2 * MAX_LOGIT_BIAS_TOKENS + mask_words(big.vocab))
        );
    }

    #[test]
    fn copy_stats_count_per_interval() {
        let mut stats = CopyStats::default();
        stats.record_h2d(100);
        let mark = stats;
        stats.steps += 1;
        stats.record_h2d(40);
        stats.record_d2h(8);
        let delta = stats.since(&mark);
        assert_eq!(
            (
                delta.steps,
                delta.h2d,
                delta.d2h,
                delta.h2d_bytes,
                delta.d2h_bytes
            ),
            (1, 1, 1, 40, 8)
        );
    }
}
