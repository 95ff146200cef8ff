//! Grammar masks on the engine thread: computing them on rayon's pool between steps, handing
//! them to the step (late, to a backend that starts steps), and advancing each constrained row's
//! grammar past its sampled token (see `docs/engine.md`, "Constrained decoding").

use std::collections::HashSet;
use std::sync::mpsc;

use super::{Worker, batch_row, planned, thread_cpu_time};
use crate::constrain::{TokenConstraint, TokenMask};
use crate::engine::backend::{BackendError, BatchRow, SampledToken};
use crate::engine::scheduler::Scheduled;
use crate::engine::sequence::Sequence;

/// Constrained rows from which a step advances their grammars on rayon's pool rather than on
/// the engine thread (below it, waking the pool costs more than it saves).
const PARALLEL_ADVANCE_ROWS: usize = 8;

/// How long steps waited for their grammar masks (published in [`EngineStats`]).
#[derive(Debug, Default)]
pub(super) struct MaskWait {
    pub steps: u64,
    pub overlapped_steps: u64,
    pub micros: u64,
}

/// A grammar mask computed on rayon's pool, with the grammar state it came from.
struct MaskJob {
    seq_id: u64,
    constraint: TokenConstraint,
    mask: Result<TokenMask, String>,
}

/// The masks being computed between two steps.
pub(super) struct MaskJobs {
    /// Each job sends all its masks at once: the engine thread wakes once for them, not once
    /// per row.
    sender: mpsc::Sender<Vec<MaskJob>>,
    receiver: mpsc::Receiver<Vec<MaskJob>>,
    /// The sequences whose masks are being computed.
    pub in_flight: HashSet<u64>,
    /// The masks the last step sampled with, dropped on the pool by the next job (a mask of a
    /// large vocabulary is 19 KB, allocated on the pool: freeing 64 of them on the engine
    /// thread, between two steps, costs it tens of microseconds).
    spent: Vec<TokenMask>,
}

impl MaskJobs {
    pub(super) fn new() -> Self {
        let (sender, receiver) = mpsc::channel();
        Self {
            sender,
            receiver,
            in_flight: HashSet::new(),
            spent: Vec::new(),
        }
    }
}

/// The next mask of `constraint`; a panic in the grammar engine becomes an error of the row.
fn compute_mask(constraint: &mut TokenConstraint) -> Result<TokenMask, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| constraint.mask()))
        .unwrap_or_else(|_| Err("the grammar mask computation panicked".to_owned()))
}

impl Worker {
    /// Advances the grammar of every constrained row of `rows` past its sampled token: on
    /// rayon's pool when the step has at least [`PARALLEL_ADVANCE_ROWS`] of them (a wide
    /// constrained batch would otherwise advance them one after the other on this thread while
    /// the device idles), else here. Per row: None when it has no grammar, else whether the
    /// grammar is complete, or why it refused the token. A panic in the grammar engine becomes an
    /// error of its row.
    pub(super) fn advance_grammars(
        &mut self,
        rows: &[Scheduled],
        sampled: &[SampledToken],
    ) -> Vec<Option<Result<bool, String>>> {
        let mut outcomes: Vec<Option<Result<bool, String>>> = vec![None; rows.len()];
        // Most steps carry no constrained row: skip building the index for them.
        let constrained = rows.iter().any(|s| {
            self.scheduler
                .get(s.seq_id)
                .is_some_and(|seq| seq.constraint.is_some())
        });
        if !constrained {
            return outcomes;
        }
        let row_of: std::collections::HashMap<u64, usize> = rows
            .iter()
            .enumerate()
            .map(|(i, s)| (s.seq_id, i))
            .collect();
        let spent = &mut self.masks.spent;
        let mut work: Vec<(usize, u32, &mut TokenConstraint)> = self
            .scheduler
            .running_mut()
            .filter_map(|seq| {
                let at = *row_of.get(&seq.id)?;
                let token = sampled.get(at)?.token;
                let constraint = seq.constraint.as_mut()?;
                // The mask this step sampled with is spent; an error stays for the step to end
                // its sequence with.
                if let Some(Ok(mask)) = seq.next_mask.take_if(|mask| mask.is_ok()) {
                    spent.push(mask);
                }
                Some((at, token, constraint))
            })
            .collect();
        let advance = |(at, token, constraint): &mut (usize, u32, &mut TokenConstraint)| {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                constraint
                    .advance(*token)
                    .map(|()| constraint.is_finished())
            }))
            .unwrap_or_else(|_| Err("the grammar engine panicked".to_owned()));
            (*at, outcome)
        };
        let results: Vec<(usize, Result<bool, String>)> = if work.len() >= PARALLEL_ADVANCE_ROWS {
            use rayon::prelude::*;
            work.par_iter_mut().map(advance).collect()
        } else {
            work.iter_mut().map(advance).collect()
        };
        for (at, outcome) in results {
            outcomes[at] = Some(outcome);
        }
        outcomes
    }

    /// Offers the step to the backend before its grammar masks are ready and before the previous
    /// step's tokens are streamed: a sampled row's mask may still be being computed (or not
    /// started: a first token after the prompt), and a backend that takes masks late gets it in
    /// `finish_step` (see `docs/engine.md`, "Constrained decoding"). True when the backend queued
    /// the step and `finish_step` must end it; false when it declined (it runs whole in
    /// `Backend::step`).
    pub(super) fn start_step(&mut self, plan: &[Scheduled]) -> Result<bool, BackendError> {
        let scheduler = &self.scheduler;
        let in_flight = &self.masks.in_flight;
        let mut late = Vec::new();
        let rows: Vec<BatchRow<'_>> = plan
            .iter()
            .map(|s| {
                let seq = planned(scheduler, s);
                let row = batch_row(seq, *s);
                if row.sample.is_some() {
                    late.push(
                        in_flight.contains(&seq.id)
                            || (seq.constraint.is_some() && seq.next_mask.is_none()),
                    );
                }
                row
            })
            .collect();
        let cpu_before = thread_cpu_time();
        let started = self.backend.start_step(&rows, &late);
        self.backend_cpu += thread_cpu_time().saturating_sub(cpu_before);
        started
    }

    /// Counts a step's wait for its grammar masks (see `EngineStats`): in `overlapped` steps
    /// the backend's forward pass ran meanwhile.
    pub(super) fn record_mask_wait(&mut self, waited: std::time::Duration, overlapped: bool) {
        self.mask_wait.steps += 1;
        self.mask_wait.micros += waited.as_micros() as u64;
        if overlapped {
            self.mask_wait.overlapped_steps += 1;
        }
        tracing::trace!(
            wait_us = waited.as_micros() as u64,
            overlapped,
            "grammar masks ready"
        );
    }

    /// Starts computing the next grammar masks of the constrained running sequences `seq_ids`:
    /// one job on rayon's pool (one wake-up of the pool per step, not one per row) that computes
    /// them in parallel; each grammar state travels with the job and comes back, with its mask,
    /// in [`Worker::collect_masks`] (all of them in one message). The job also drops the spent
    /// masks.
    pub(super) fn start_masks(&mut self, seq_ids: &[u64]) {
        let spent = std::mem::take(&mut self.masks.spent);
        let jobs: Vec<(u64, TokenConstraint)> = seq_ids
            .iter()
            .filter_map(|&seq_id| {
                let seq = self.scheduler.get_mut(seq_id)?;
                Some((seq_id, seq.constraint.take()?))
            })
            .collect();
        if jobs.is_empty() {
            return;
        }
        self.masks.in_flight.extend(jobs.iter().map(|(id, _)| *id));
        let results = self.masks.sender.clone();
        rayon::spawn(move || {
            use rayon::prelude::*;
            let masks: Vec<MaskJob> = jobs
                .into_par_iter()
                .map(|(seq_id, mut constraint)| MaskJob {
                    seq_id,
                    mask: compute_mask(&mut constraint),
                    constraint,
                })
                .collect();
            // The receiver lives as long as the engine; after shutdown the result is moot.
            let _ = results.send(masks);
            // After the masks: the engine may be waiting for them.
            drop(spent);
        });
    }

    /// Waits for the masks computed since the last step and returns each grammar state (and its
    /// mask) to its sequence, wherever the scheduler has put it; a sequence that went away drops
    /// its own.
    pub(super) fn collect_masks(&mut self) {
        while !self.masks.in_flight.is_empty() {
            let Ok(jobs) = self.masks.receiver.recv() else {
                break;
            };
            for job in jobs {
                self.masks.in_flight.remove(&job.seq_id);
                if let Some(seq) = self.scheduler.find_mut(job.seq_id) {
                    seq.constraint = Some(job.constraint);
                    seq.next_mask = Some(job.mask);
                }
            }
        }
    }

    /// Makes sure that every constrained row sampling in this step has its mask before the step
    /// starts (a device sampler applies it on the device, so it travels in the step's inputs):
    /// the masks started when the previous tokens were accepted are collected, and those not
    /// computed yet (a first token after the prompt) are computed now, in parallel. Returns
    /// whether the step has a constrained row (one that waited or could have).
    pub(super) fn prepare_masks(&mut self, plan: &[Scheduled]) -> bool {
        let had_jobs = !self.masks.in_flight.is_empty();
        self.collect_masks();
        let sampling: HashSet<u64> = plan
            .iter()
            .filter(|s| {
                let seq = planned(&self.scheduler, s);
                seq.num_computed + s.num_tokens == seq.tokens.len()
            })
            .map(|s| s.seq_id)
            .collect();
        let mut missing: Vec<&mut Sequence> = self
            .scheduler
            .running_mut()
            .filter(|seq| {
                sampling.contains(&seq.id) && seq.constraint.is_some() && seq.next_mask.is_none()
            })
            .collect();
        let computed_now = !missing.is_empty();
        use rayon::prelude::*;
        missing.par_iter_mut().for_each(|seq| {
            if let Some(constraint) = seq.constraint.as_mut() {
                seq.next_mask = Some(compute_mask(constraint));
            }
        });
        had_jobs || computed_now
    }
}
