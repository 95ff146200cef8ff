//! The contract between the engine and a forward-pass implementation.
//!
//! A backend runs one forward step over a batch of sequences. Each row names the new tokens whose
//! keys and values it must compute and write into the paged KV cache, their positions, and the
//! block table that maps the row's logical KV blocks to physical ones. Rows that need a next
//! token carry a [`SampleSpec`]; the backend returns either their raw logits (the engine then
//! samples on the CPU) or tokens it sampled itself with the same semantics
//! (`crate::engine::sampling` is the reference).

use super::kv_groups::KvGroups;
use super::request::{SamplingParams, TokenLogprob};

/// Geometry of the paged KV cache that a backend allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    /// Number of physical blocks (shared by the groups).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// The groups of layers that share a block table (`kv_groups.rs`).
    pub groups: KvGroups,
}

impl KvCacheShape {
    /// The longest sequence the cache holds on its own, in tokens: every block with one group
    /// of full-attention layers; with a sliding group beside it, the blocks its window may hold
    /// left out; with sliding layers only, no bound (`usize::MAX`) once the window fits.
    pub fn capacity_tokens(&self) -> usize {
        let blocks = self.num_blocks;
        match (self.groups.full, self.groups.sliding_reserve()) {
            (_, 0) => blocks * self.block_size,
            (true, reserve) => blocks.saturating_sub(reserve) * self.block_size,
            (false, reserve) if blocks >= reserve => usize::MAX,
            (false, _) => 0,
        }
    }

    /// [`Self::capacity_tokens`] for a person to read: "N tokens", or, where every layer slides,
    /// that no sequence length is bounded by the cache.
    pub fn capacity_label(&self) -> String {
        match self.capacity_tokens() {
            usize::MAX => match self.groups.sliding_window {
                Some(window) => format!("any length (every layer keeps a window of {window})"),
                None => "any length".to_owned(),
            },
            tokens => format!("{tokens} tokens"),
        }
    }
}

/// Everything a backend needs to draw the next token of a row exactly as the engine would.
#[derive(Debug, Clone, Copy)]
pub struct SampleSpec<'a> {
    /// Temperature, filters and penalties.
    pub params: &'a SamplingParams,
    /// Seed of the request's generator.
    pub seed: u64,
    /// Position of the generator: how many tokens the request has drawn so far. The draw for this
    /// step is a pure function of `(seed, draw_index)`, so batch composition never changes it.
    pub draw_index: u64,
    /// The prompt tokens (for the repetition penalty).
    pub prompt: &'a [u32],
    /// The tokens generated so far (for all penalties).
    pub output: &'a [u32],
    /// `Some(k)`: also return the chosen token's logprob and the top `k` alternatives.
    pub logprobs: Option<u32>,
    /// The allowed-token mask of a constrained row for this step (bit `t % 32` of word `t / 32`
    /// allows token `t`; tokens beyond the mask are disallowed). The engine computes it before the
    /// step (see `docs/engine.md`, "Constrained decoding"), so a device sampler applies it on
    /// the device like the reference sampler does.
    pub mask: Option<&'a [u32]>,
}

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Copy)]
pub struct BatchRow<'a> {
    /// Stable identifier of the sequence for its whole life (backends may key state on it).
    pub seq_id: u64,
    /// Tokens processed in this step: a prefill chunk, or the single last token when decoding.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence.
    pub start_pos: usize,
    /// Physical KV blocks covering positions `0..start_pos + tokens.len()`, in order: one table
    /// per KV group of the cache ([`KvCacheShape::groups`]), one after the other, all of the
    /// same length. A sliding group's entries for blocks that its window no longer reaches are
    /// [`crate::engine::kv_groups::FREED_BLOCK`] and are never read.
    pub block_table: &'a [u32],
    /// Present when the row needs the next token after its last token.
    pub sample: Option<SampleSpec<'a>>,
}

/// A generated token as a backend or the engine's sampler produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub token: u32,
    /// Present when the row asked for logprobs.
    pub logprob: Option<TokenLogprob>,
}

/// The result of a step, one entry per row that carried a [`SampleSpec`], in row order.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// Raw logits over the vocabulary; the engine samples.
    Logits(Vec<Vec<f32>>),
    /// Tokens the backend sampled itself.
    Sampled(Vec<SampledToken>),
}

/// A forward step failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The device reported an error.
    #[error("device error: {0}")]
    Device(String),
    /// The batch violated the backend's limits or the cache geometry.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The backend does not implement what the step asked for.
    #[error("the {backend} backend does not support {what}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// What it lacks.
        what: &'static str,
    },
}

/// What [`Backend::step_logits`] returns: the logits at the asked positions (row by row, each
/// row's positions in order), and the final hidden states of the asked rows.
pub type PositionOutput = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// A forward-pass implementation.
pub trait Backend: Send {
    /// Short name for logs and the startup banner (`cpu`, `cuda`).
    fn name(&self) -> &str;

    /// The paged KV cache the backend allocated.
    fn kv_cache(&self) -> KvCacheShape;

    /// The most rows one step may carry, when the backend sized fixed buffers for a limit (the
    /// CUDA backend); `None` when any batch the KV cache holds is accepted. A derived
    /// `max_num_seqs` never exceeds it.
    fn max_rows(&self) -> Option<usize> {
        None
    }

    /// Token counts the backend runs a step of most cheaply, ascending (the CUDA backend replays
    /// graphs captured for them and pads other counts up to the next); empty when every count
    /// costs in proportion. The engine fills a step that carries prompt tokens while sequences
    /// decode up to the largest that its budget allows.
    fn step_sizes(&self) -> &[usize] {
        &[]
    }

    /// Runs one forward step. Keys and values of every row's tokens are written into the cache
    /// before attention reads them.
    fn step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError>;

    /// Whether [`Backend::step_logits`] is implemented: speculative decoding (verification of
    /// proposed tokens) and prompt logprobs need the logits at several positions of a row.
    fn position_logits(&self) -> bool {
        false
    }

    /// Runs one forward step like [`Backend::step`] and returns raw logits at several positions
    /// of each row: `positions[i]` of them for the i-th row, those after its last
    /// `positions[i]` tokens (`0`: none; the row's `sample` is ignored, the engine samples).
    /// The result is flat: row by row, each row's positions in order. Like
    /// [`Backend::step_with_hidden`], it also returns the final hidden state of the last token of
    /// each row listed in `hidden`.
    fn step_logits(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden: &[usize],
    ) -> Result<PositionOutput, BackendError> {
        let _ = (rows, positions, hidden);
        Err(BackendError::Unsupported {
            backend: self.name().to_owned(),
            what: "logits at several positions of a row (speculative decoding, prompt logprobs)",
        })
    }

    /// Whether [`Backend::step_sampled_positions`] is implemented: the backend samples on the
    /// device, and a step that verifies proposals then downloads tokens instead of logits.
    fn sampled_positions(&self) -> bool {
        false
    }

    /// Runs one forward step like [`Backend::step`] and samples several positions of each row
    /// on the device: `specs[i]` are the sampling specs of the last `specs[i].len()` tokens of
    /// the i-th row, in order (the row's `sample` is ignored), each drawn exactly as
    /// [`Backend::step`] draws a row's next token with that spec. The result is flat: row by
    /// row, each row's positions in order. Speculative verification gives position `j` of a
    /// verification row the proposals before it as output and the draw index `draw_index + j`,
    /// so the target's own token at every position comes back and the engine compares.
    fn step_sampled_positions(
        &mut self,
        rows: &[BatchRow<'_>],
        specs: &[&[SampleSpec<'_>]],
    ) -> Result<Vec<SampledToken>, BackendError> {
        let _ = (rows, specs);
        Err(BackendError::Unsupported {
            backend: self.name().to_owned(),
            what: "sampling at several positions of a row on the device",
        })
    }

    /// Starts a step and returns before it ends, so that the engine works while its forward
    /// pass runs: it streams the previous step's tokens and waits for grammar masks still being
    /// computed. `late[i]` says that the i-th sampled row (in row order) gets its mask only in
    /// [`Backend::finish_step`] (it carries none here). Returns false, having done nothing, when
    /// the backend runs steps whole (the default: the engine then finishes its own work first
    /// and calls [`Backend::step`]); true when the step was queued and must be finished by
    /// `finish_step` before anything else is asked of the backend.
    fn start_step(&mut self, rows: &[BatchRow<'_>], late: &[bool]) -> Result<bool, BackendError> {
        let _ = (rows, late);
        Ok(false)
    }

    /// Runs one forward step as [`Backend::step`] does, and also returns the final hidden state
    /// (after the model's final norm) of the last token of each row listed in `hidden` (row
    /// indices, ascending), in that order: embedding requests pool it. Rows listed there carry
    /// no [`SampleSpec`]. The default refuses a non-empty list.
    fn step_with_hidden(
        &mut self,
        rows: &[BatchRow<'_>],
        hidden: &[usize],
    ) -> Result<(StepOutput, Vec<Vec<f32>>), BackendError> {
        if !hidden.is_empty() {
            return Err(BackendError::InvalidBatch(format!(
                "the {} backend cannot return hidden states",
                self.name()
            )));
        }
        Ok((self.step(rows)?, Vec::new()))
    }

    /// Finishes the step that [`Backend::start_step`] queued: `rows` are the same rows, now with
    /// the late rows' masks (a late row left without one, because its grammar failed, is sampled
    /// unmasked; the engine ends it after the step). Same result as [`Backend::step`].
    fn finish_step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        let _ = rows;
        Err(BackendError::InvalidBatch(
            "finish_step without a started step".into(),
        ))
    }
}
