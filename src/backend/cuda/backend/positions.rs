//! Steps that need more than each row's last token: logits at several positions of a row
//! (prompt logprobs, verification with host sampling) and tokens sampled on the device at
//! several positions (speculative verification), see `docs/cuda-backend.md`, "Several
//! positions of a row".

use crate::engine::{BackendError, BatchRow, PositionOutput, SampleSpec, SampledToken, StepOutput};

use super::step::Extra;
use super::{CudaBackend, to_u32};

/// The token indices (in the packed step) of the positions asked of each row, then of the last
/// token of each `hidden` row that is not among them, and where each hidden row's state is in
/// that list.
fn asked_tokens(
    rows: &[BatchRow<'_>],
    positions: &[usize],
    hidden: &[usize],
) -> Result<(Vec<i32>, Vec<usize>), BackendError> {
    if positions.len() != rows.len() {
        return Err(BackendError::InvalidBatch(format!(
            "positions for {} rows of a step of {}",
            positions.len(),
            rows.len()
        )));
    }
    let mut ends = Vec::with_capacity(rows.len());
    let mut indices = Vec::new();
    let mut end = 0;
    for (row, &count) in rows.iter().zip(positions) {
        if count > row.tokens.len() {
            return Err(BackendError::InvalidBatch(format!(
                "row {}: {count} positions asked of {} tokens",
                row.seq_id,
                row.tokens.len()
            )));
        }
        end += row.tokens.len();
        ends.push(end);
        for token in end - count..end {
            indices.push(to_u32(token, "token index")? as i32);
        }
    }
    let asked = indices.len();
    let mut states = Vec::with_capacity(hidden.len());
    for &row in hidden {
        let last = *ends.get(row).ok_or_else(|| {
            BackendError::InvalidBatch(format!(
                "hidden state asked of row {row} of a step of {} rows",
                rows.len()
            ))
        })? - 1;
        let last = to_u32(last, "token index")? as i32;
        let at = match indices[..asked].iter().position(|&t| t == last) {
            Some(at) => at,
            None => {
                indices.push(last);
                indices.len() - 1
            }
        };
        states.push(at);
    }
    Ok((indices, states))
}

impl CudaBackend {
    /// [`crate::engine::Backend::step_logits`]: queues the forward pass with no sampled row
    /// (its graphs as any step of its shape), then one final norm over every asked token (listed
    /// after the packed inputs, in the same copy) into `act.normed`, and the LM head over those
    /// rows in chunks of at most `max_rows` (the logits buffer's rows), each chunk's f32 logits
    /// downloaded; the hidden rows' states are the normed rows (bf16, as the LM head reads them).
    pub(super) fn position_logits_step(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden: &[usize],
    ) -> Result<PositionOutput, BackendError> {
        if self.started.is_some() {
            return Err(BackendError::InvalidBatch(
                "a started step was not finished".into(),
            ));
        }
        let (indices, states_at) = asked_tokens(rows, positions, hidden)?;
        let asked: usize = positions.iter().sum();
        let unsampled: Vec<BatchRow<'_>> = rows
            .iter()
            .map(|r| BatchRow { sample: None, ..*r })
            .collect();
        let extra = Extra {
            positions: None,
            words: &indices,
        };
        let Some(step) = self.queue_step(&unsampled, &[], extra)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        if indices.is_empty() {
            self.settle(step.bucket, step.queued)?;
            return Ok((Vec::new(), Vec::new()));
        }
        // Each listed token once: the residual gains the last layer's output here.
        self.add_rmsnorm(
            to_u32(indices.len(), "asked tokens")?,
            Some(self.act.delta.device_ptr()),
            self.weights.final_norm.device_ptr(),
            Some(self.input(step.layout.len())),
        )?;
        let (vocab, width) = (self.params.vocab, self.params.hidden);
        let mut logits = Vec::with_capacity(asked);
        let chunk = self.limits.max_rows.max(1);
        let mut first = 0;
        while first < asked {
            let n = chunk.min(asked - first);
            self.matmul(
                self.act.normed.device_ptr_at(first * width * 2),
                self.weights.lm_head_ptr(),
                self.act.logits.device_ptr(),
                (n, vocab, width),
            )?;
            let flat: Vec<f32> = self.download(self.act.logits.ptr(), n * vocab)?;
            logits.extend(flat.chunks_exact(vocab).map(<[f32]>::to_vec));
            first += n;
        }
        let states = match (states_at.iter().min(), states_at.iter().max()) {
            (Some(&lo), Some(&hi)) => {
                let normed: Vec<u16> =
                    self.download(self.act.normed.at(lo * width * 2), (hi + 1 - lo) * width)?;
                states_at
                    .iter()
                    .map(|&at| {
                        normed[(at - lo) * width..(at - lo + 1) * width]
                            .iter()
                            .map(|&bits| f32::from_bits(u32::from(bits) << 16))
                            .collect()
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        // The downloads synchronised the stream; this accounts the step.
        self.settle(step.bucket, step.queued)?;
        Ok((logits, states))
    }

    /// [`crate::engine::Backend::step_sampled_positions`]: every listed position packed as a
    /// sampled row of its own (`pack_positions`), so the forward pass's final norm, LM head and
    /// sampling kernel run over them as over a decode step's rows, and only the tokens (with
    /// their logprobs) come back.
    pub(super) fn sampled_positions_step(
        &mut self,
        rows: &[BatchRow<'_>],
        specs: &[&[SampleSpec<'_>]],
    ) -> Result<Vec<SampledToken>, BackendError> {
        if self.started.is_some() {
            return Err(BackendError::InvalidBatch(
                "a started step was not finished".into(),
            ));
        }
        let extra = Extra {
            positions: Some(specs),
            words: &[],
        };
        let Some(step) = self.queue_step(rows, &[], extra)? else {
            return Ok(Vec::new());
        };
        match self.finish_queued(step, rows, Some(specs))? {
            StepOutput::Sampled(tokens) => Ok(tokens),
            StepOutput::Logits(_) => Err(BackendError::InvalidBatch(
                "positions sampled on the device without device sampling".into(),
            )),
        }
    }
}
