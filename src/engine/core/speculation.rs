//! The engine thread's share of speculative decoding and of prompt logprobs: proposing tokens
//! before a step is scheduled, asking the backend for the logits at several positions of a
//! row, verifying proposals, and appending what was accepted with its KV slots rolled back.

use super::{Accepted, Worker, planned, planned_mut};
use crate::engine::backend::{BatchRow, SampleSpec, SampledToken};
use crate::engine::request::PromptLogprob;
use crate::engine::sampling::{self, log_softmax, top_k_entries};
use crate::engine::scheduler::{Scheduled, Scheduler};
use crate::engine::speculative::token_cost;
use crate::engine::speculative::verify::{Verified, verify_row};

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
                .min(max_context.saturating_sub(seq.tokens.len() + 1));
            if room == 0 {
                continue;
            }
            let mut draft = config.propose(&seq.tokens, room);
            if config.adaptive && config.forced_acceptance.is_none() && !draft.is_empty() {
                let k = seq.acceptance.choose(draft.len(), cost);
                draft.truncate(k);
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
