//! Packing every input of a forward step into one host buffer, so a step makes exactly one
//! host-to-device copy (see `docs/cuda-backend.md`: in confidential-computing mode every copy
//! goes through an encrypted bounce buffer and costs a fixed overhead).
//!
//! The packed buffer is an array of `i32` holding, in order: the block-table stride (one word),
//! token ids `[T]`, positions `[T]`, KV-cache slots `[T]`, the row of each token `[T]`, the token
//! index of each sampled row `[S]`, the number of logprob alternatives of each sampled row `[S]`
//! and last the block tables `[R * max_blocks]` (zero-padded). Every offset therefore depends on
//! T and S alone, and the kernels read the stride from the buffer: a decode step padded to a
//! fixed T = S can replay a CUDA graph captured once for that size.
//!
//! Padding tokens (for decode graphs) have token 0, position 0, slot -1 (the QKV kernel writes no
//! cache entry), row -1 (attention outputs zero) and are sampled with no alternatives; their
//! results are never copied back.

use crate::engine::{BLOCK_SIZE, BackendError, BatchRow};

use super::kernels::MAX_TOP_LOGPROBS;

/// Offsets (in `i32` words) of each array in a packed step buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLayout {
    /// Tokens in the step, padding included (T).
    pub num_tokens: usize,
    /// Rows with a block table (R, the batch's own rows).
    pub num_rows: usize,
    /// Rows that need a next token, padding included (S).
    pub num_samples: usize,
    /// Padding tokens at the end of the step (each also a sampled row).
    pub padding: usize,
    /// Stride of the block-table array: the longest block table of the step.
    pub max_blocks: usize,
    /// Longest context any token attends to (for the split-K decision).
    pub max_context: usize,
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
    /// Offset of the block tables.
    pub fn block_tables(&self) -> usize {
        self.top_n() + self.num_samples
    }
    /// Total words.
    pub fn len(&self) -> usize {
        self.block_tables() + self.num_rows * self.max_blocks
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
}

/// Words of the device input buffer for these step limits and block tables of at most
/// `max_blocks_per_seq` entries.
pub fn max_words(max_tokens: usize, max_rows: usize, max_blocks_per_seq: usize) -> usize {
    1 + 4 * max_tokens + 2 * max_rows + max_rows * max_blocks_per_seq
}

/// Packs a batch into `out`, followed by `padding` padding tokens (each a sampled row), and
/// returns its layout. Every index that a kernel will follow is checked here, so a malformed
/// batch is refused before anything reaches the device.
pub fn pack_step(
    rows: &[BatchRow<'_>],
    padding: usize,
    limits: &StepLimits,
    out: &mut Vec<i32>,
) -> Result<StepLayout, BackendError> {
    let num_tokens: usize = rows.iter().map(|r| r.tokens.len()).sum::<usize>() + padding;
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
    let mut max_context = 0;
    let layout_probe = StepLayout {
        num_tokens,
        num_rows: rows.len(),
        num_samples,
        padding,
        max_blocks,
        max_context,
    };
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
            s += 1;
        }
    }
    for _ in 0..padding {
        out[layout_probe.slots() + t] = -1;
        out[layout_probe.token_rows() + t] = -1;
        out[layout_probe.sample_tokens() + s] = t as i32;
        t += 1;
        s += 1;
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
        }
    }

    #[test]
    fn packs_a_mixed_batch() {
        let params = SamplingParams::default();
        let spec = SampleSpec {
            params: &params,
            seed: 1,
            draw_index: 0,
            prompt: &[],
            output: &[],
            logprobs: Some(3),
        };
        let rows = [
            // A decode at position 17 (second block).
            BatchRow {
                seq_id: 1,
                tokens: &[5],
                start_pos: 17,
                block_table: &[3, 7],
                sample: Some(spec),
            },
            // A prefill chunk that needs no token yet.
            BatchRow {
                seq_id: 2,
                tokens: &[1, 2, 3],
                start_pos: 0,
                block_table: &[4],
                sample: None,
            },
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, 0, &limits(), &mut out).expect("packs");
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
        assert!(pack_step(&short, 0, &limits(), &mut out).is_err());
        let far = [BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 0,
            block_table: &[10],
            sample: None,
        }];
        assert!(pack_step(&far, 0, &limits(), &mut out).is_err());
        let bad_token = [BatchRow {
            seq_id: 1,
            tokens: &[100],
            start_pos: 0,
            block_table: &[1],
            sample: None,
        }];
        assert!(pack_step(&bad_token, 0, &limits(), &mut out).is_err());
        let tokens = [0u32; 65];
        let table = [0u32; 5];
        let long = [BatchRow {
            seq_id: 1,
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            sample: None,
        }];
        assert!(pack_step(&long, 0, &limits(), &mut out).is_err());
    }

    #[test]
    fn pads_a_decode_batch_to_its_bucket() {
        let params = SamplingParams::default();
        let spec = SampleSpec {
            params: &params,
            seed: 1,
            draw_index: 0,
            prompt: &[],
            output: &[],
            logprobs: Some(2),
        };
        let rows = [
            BatchRow {
                seq_id: 1,
                tokens: &[5],
                start_pos: 17,
                block_table: &[3, 7],
                sample: Some(spec),
            },
            BatchRow {
                seq_id: 2,
                tokens: &[9],
                start_pos: 4,
                block_table: &[2],
                sample: Some(spec),
            },
        ];
        let mut out = Vec::new();
        let layout = pack_step(&rows, 2, &limits(), &mut out).expect("packs");
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
        let short = pack_step(&short_rows, 2, &limits(), &mut other).expect("packs");
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
        assert!(pack_step(&rows, 7, &limits(), &mut out).is_err());
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
