//! The engine thread's share of speculative decoding and of prompt logprobs: proposing tokens
//! before a step is scheduled, asking the backend for the logits at several positions of a
//! row, verifying proposals, and appending what was accepted with its KV slots rolled back.

use super::{Accepted, Worker, planned, planned_mut};
use crate::engine::backend::{BackendError, BatchRow, SampleSpec, SampledToken};
use crate::engine::request::PromptLogprob;
use crate::engine::sampling::{self, log_softmax, top_k_entries};
use crate::engine::scheduler::{Scheduled, Scheduler};
use crate::engine::speculative::token_cost;
use crate::engine::speculative::verify::{Verified, verify_row, verify_sampled};

/// What a step with per-position logits gave besides the plain sampled tokens.
#[derive(Debug, Default)]
pub(super) struct Positional {
    /// Verification rows: the sequence, what verification produced, and how many proposals it
    /// judged.
    pub verified: Vec<(u64, Verified, usize)>,
    /// Prompt logprobs: the sequence and `(prompt index, logprob)` pairs.
    pub prompt: Vec<(u64, Vec<(usize, PromptLogprob)>)>,
}

/// The logits each row of `plan` needs, or `None` when each needs at most its last position's
/// (the plain [`crate::engine::Backend::step`]): a verification row needs one per verified
/// token, a row computing prompt tokens of a request asking for prompt logprobs one per token.
pub(super) fn positions(scheduler: &Scheduler, plan: &[Scheduled]) -> Option<Vec<usize>> {
    let mut extra = false;
    let positions = plan
        .iter()
        .map(|s| {
            let seq = planned(scheduler, s);
            let samples = seq.num_computed + s.num_tokens >= seq.tokens.len();
            let prompt =
                seq.prompt_logprobs.is_some() && seq.num_computed < seq.request.prompt.len();
            if seq.verifies(s.num_tokens) || prompt {
                extra = true;
                s.num_tokens
            } else {
                usize::from(samples)
            }
        })
        .collect();
    extra.then_some(positions)
}

/// Whether a row of `plan` computes prompt tokens of a request asking for prompt logprobs
/// (whose logits the engine needs, not only tokens).
pub(super) fn needs_logits(scheduler: &Scheduler, plan: &[Scheduled]) -> bool {
    plan.iter().any(|s| {
        let seq = planned(scheduler, s);
        seq.prompt_logprobs.is_some() && seq.num_computed < seq.request.prompt.len()
    })
}

/// How many positions of `plan` sample: one per plain sampling row, `1 + k` per verification
/// row.
pub(super) fn sampled_positions(
    scheduler: &Scheduler,
    plan: &[Scheduled],
    rows: &[BatchRow<'_>],
) -> usize {
    plan.iter()
        .zip(rows)
        .filter(|(_, row)| row.sample.is_some())
        .map(|(s, _)| {
            let seq = planned(scheduler, s);
            if seq.verifies(s.num_tokens) {
                1 + seq.draft.len()
            } else {
                1
            }
        })
        .sum()
}

/// For each row of `plan`, the output its verified positions see: the sequence's output, then
/// its proposals (empty for a row that does not verify).
pub(super) fn draft_outputs(scheduler: &Scheduler, plan: &[Scheduled]) -> Vec<Vec<u32>> {
    plan.iter()
        .map(|s| {
            let seq = planned(scheduler, s);
            if seq.verifies(s.num_tokens) {
                seq.output().iter().chain(&seq.draft).copied().collect()
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// The sampling specs of every sampled position of each row, for
/// [`crate::engine::Backend::step_sampled_positions`]: a verification row's `1 + k` positions
/// (position `j` sees the proposals before it as output, from `drafted`, and draws with index
/// `draw_index + j`, as [`verify_row`] does on the host), a plain sampling row's one, none for
/// the rest.
pub(super) fn position_specs<'a>(
    scheduler: &Scheduler,
    plan: &[Scheduled],
    rows: &[BatchRow<'a>],
    drafted: &'a [Vec<u32>],
) -> Vec<Vec<SampleSpec<'a>>> {
    plan.iter()
        .zip(rows)
        .zip(drafted)
        .map(|((s, row), outputs)| {
            let Some(spec) = row.sample else {
                return Vec::new();
            };
            let seq = planned(scheduler, s);
            if !seq.verifies(s.num_tokens) {
                return vec![spec];
            }
            let seen = spec.output.len();
            (0..=seq.draft.len())
                .map(|j| SampleSpec {
                    output: &outputs[..seen + j],
                    draw_index: spec.draw_index + j as u64,
                    ..spec
                })
                .collect()
        })
        .collect()
}

/// Splits the tokens a backend sampled at every sampled position
/// ([`crate::engine::Backend::step_sampled_positions`]) among the rows, as [`resolve`] does with
/// logits: verification rows are judged, the plain sampling rows' tokens come back in row
/// order.
pub(super) fn resolve_sampled(
    scheduler: &Scheduler,
    plan: &[Scheduled],
    rows: &[BatchRow<'_>],
    tokens: Vec<SampledToken>,
    forced: Option<f64>,
) -> Result<(Vec<SampledToken>, Positional), BackendError> {
    let mut sampled = Vec::new();
    let mut positional = Positional::default();
    let total = tokens.len();
    let mut tokens = tokens.into_iter();
    let mut used = 0;
    for (scheduled, row) in plan.iter().zip(rows) {
        let Some(spec) = row.sample else { continue };
        let seq = planned(scheduler, scheduled);
        if seq.verifies(scheduled.num_tokens) {
            let targets: Vec<SampledToken> = tokens.by_ref().take(seq.draft.len() + 1).collect();
            used += seq.draft.len() + 1;
            if targets.len() != seq.draft.len() + 1 {
                break;
            }
            let verified = verify_sampled(targets, &seq.draft, &spec, forced);
            positional
                .verified
                .push((seq.id, verified, seq.draft.len()));
        } else {
            used += 1;
            sampled.extend(tokens.next());
        }
    }
    if used != total {
        return Err(BackendError::InvalidBatch(format!(
            "the backend returned {total} sampled positions for {used}"
        )));
    }
    Ok((sampled, positional))
}

/// Splits a step's per-position logits among its rows: the plain sampling rows' tokens, in row
/// order (as [`crate::engine::StepOutput::Sampled`] would hold them), and the rest.
pub(super) fn resolve(
    scheduler: &Scheduler,
    plan: &[Scheduled],
    rows: &[BatchRow<'_>],
    positions: &[usize],
    logits: Vec<Vec<f32>>,
    forced: Option<f64>,
) -> (Vec<SampledToken>, Positional) {
    let mut sampled = Vec::new();
    let mut positional = Positional::default();
    let mut logits = logits.into_iter();
    for ((scheduled, row), &count) in plan.iter().zip(rows).zip(positions) {
        let seq = planned(scheduler, scheduled);
        let mut mine: Vec<Vec<f32>> = logits.by_ref().take(count).collect();
        if let (Some(k), Some(_)) = (seq.request.prompt_logprobs, &seq.prompt_logprobs) {
            let prompt = &seq.request.prompt;
            let entries = mine
                .iter()
                .enumerate()
                .filter_map(|(i, raw)| {
                    let next = row.start_pos + i + 1;
                    let token = *prompt.get(next)? as usize;
                    let table = log_softmax(raw);
                    let logprob = table[token];
                    let above = table.iter().filter(|&&l| l > logprob).count();
                    Some((
                        next,
                        PromptLogprob {
                            logprob,
                            rank: u32::try_from(above + 1).unwrap_or(u32::MAX),
                            top: top_k_entries(&table, k as usize),
                        },
                    ))
                })
                .collect();
            positional.prompt.push((seq.id, entries));
        }
        let Some(spec) = row.sample else { continue };
        if seq.verifies(scheduled.num_tokens) {
            let verified = verify_row(mine, &seq.draft, &spec, forced);
            positional
                .verified
                .push((seq.id, verified, seq.draft.len()));
        } else if let Some(last) = mine.pop() {
            sampled.push(sampling::sample(last, &spec));
        }
    }
    (sampled, positional)
}

/// The sampling specs of the plain sampling rows (verification rows excluded), in row order.
pub(super) fn plain_specs<'a>(
    scheduler: &Scheduler,
    plan: &[Scheduled],
    rows: &[BatchRow<'a>],
) -> Vec<SampleSpec<'a>> {
    plan.iter()
        .zip(rows)
        .filter(|(s, _)| !planned(scheduler, s).verifies(s.num_tokens))
        .filter_map(|(_, r)| r.sample)
        .collect()
}

impl Worker {
    /// Proposes tokens for every running sequence that decodes next (none for constrained
    /// ones), as many as its recent acceptance and the cost of a verified token at this batch
    /// size make worth it (see `docs/engine.md`, "Speculative decoding").
    pub(super) fn propose(&mut self) {
        let config = &self.speculative;
        if !config.enabled() {
            return;
        }
        let rows = self.scheduler.decoding_rows();
        let cost = token_cost(
            rows,
            self.step_costs.seconds_per_prefill_token(),
            self.step_costs.decode_estimate(rows),
        );
        let max_context = self.model.max_context;
        // A backend that samples every verified position on the device holds them as sampled
        // rows of the step: proposals stay within the rows its buffers hold beside one per
        // running sequence.
        let mut spare = self
            .backend
            .sampled_positions()
            .then(|| self.backend.max_rows())
            .flatten()
            .map(|rows| rows.saturating_sub(self.scheduler.num_running()));
        for seq in self.scheduler.running_mut() {
            seq.draft.clear();
            if seq.pending() != 1 || seq.request.constraint.is_some() {
                continue;
            }
            // Room for the proposals and the target's own token.
            let room = config
                .num_speculative_tokens
                .min(
                    seq.request
                        .stop
                        .max_tokens
                        .saturating_sub(seq.output().len() + 1),
                )
                .min(max_context.saturating_sub(seq.tokens.len() + 1))
                .min(spare.unwrap_or(usize::MAX));
            if room == 0 {
                continue;
            }
            let mut draft = config.propose(&seq.tokens, room);
            if config.adaptive && config.forced_acceptance.is_none() && !draft.is_empty() {
                let k = seq.acceptance.choose(draft.len(), cost);
                draft.truncate(k);
            }
            if let Some(spare) = spare.as_mut() {
                *spare -= draft.len();
            }
            seq.draft = draft;
        }
    }

    /// Records prompt logprobs in their sequences.
    pub(super) fn record_prompt_logprobs(
        &mut self,
        prompt: Vec<(u64, Vec<(usize, PromptLogprob)>)>,
    ) {
        for (seq_id, entries) in prompt {
            let Some(slots) = self
                .scheduler
                .get_mut(seq_id)
                .and_then(|seq| seq.prompt_logprobs.as_mut())
            else {
                continue;
            };
            for (index, logprob) in entries {
                if let Some(slot) = slots.get_mut(index) {
                    *slot = Some(logprob);
                }
            }
        }
    }

    /// Appends a verification row's accepted proposals and the target's own token, one by one
    /// through the stop checks; records the keys and values of the accepted ones as computed and
    /// rolls back the rest. Returns whether the sequence goes on; tokens to stream go to
    /// `self.unstreamed`, an ended sequence (with the tokens to stream before its end) to
    /// `finished`.
    pub(super) fn accept_verified(
        &mut self,
        seq_id: u64,
        verified: Verified,
        proposed: usize,
        finished: &mut Vec<super::Finished>,
    ) -> bool {
        let scheduled = Scheduled {
            seq_id,
            num_tokens: 1 + proposed,
        };
        planned_mut(&mut self.scheduler, &scheduled)
            .acceptance
            .record(proposed, verified.accepted);
        self.spec.record(proposed, verified.accepted);
        let first = planned(&self.scheduler, &scheduled).tokens.len();
        let mut pushed = 0;
        let mut ended = None;
        let mut streamed = Vec::new();
        for token in verified.tokens {
            pushed += 1;
            match self.accept(&scheduled, token.token, None) {
                Accepted::Continue => streamed.push(token),
                Accepted::Finished {
                    reason,
                    streamed: with_text,
                } => {
                    if with_text {
                        streamed.push(token);
                    }
                    ended = Some(reason);
                    break;
                }
            }
        }
        // The last token and the accepted proposals appended have their keys and values.
        self.scheduler.complete(Scheduled {
            seq_id,
            num_tokens: 1 + pushed.min(verified.accepted),
        });
        self.scheduler.end_verification(seq_id);
        match ended {
            Some(reason) => {
                finished.push((seq_id, reason, streamed, first));
                false
            }
            None => {
                self.unstreamed
                    .running
                    .extend(streamed.into_iter().map(|t| (seq_id, t)));
                true
            }
        }
    }
}
