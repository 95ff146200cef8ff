//! The engine thread: takes commands, runs scheduled steps on the backend, turns sampled tokens
//! into events and finishes sequences.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokenizers::Tokenizer;

use super::backend::{Backend, BackendError, BatchRow, SampleSpec, SampledToken, StepOutput};
use super::config::EngineConfig;
use super::detokenize::IncrementalDecoder;
use super::handle::{Command, EngineHandle, EngineStats, Shared};
use super::request::{FinishReason, GenerationEvent, StopReason};
use super::sampling;
use super::scheduler::{Scheduled, Scheduler};
use super::sequence::Sequence;
use super::step_cost::StepCosts;
use super::stop::StopOutcome;

/// What the engine needs to know about the model besides its backend.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The tokenizer, for detokenization.
    pub tokenizer: Arc<Tokenizer>,
    /// Tokens that end generation (unless a request ignores EOS).
    pub eos_token_ids: Vec<u32>,
    /// The longest sequence, prompt plus completion.
    pub max_context: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// The model digest, which roots the prefix-cache hash chain.
    pub digest: [u8; 32],
}

impl ModelInfo {
    /// The engine's view of a loaded model.
    pub fn of(model: &crate::model::Model) -> Self {
        Self {
            tokenizer: model.tokenizer.clone(),
            eos_token_ids: model.eos_token_ids(),
            max_context: model.config.max_position_embeddings,
            vocab_size: model.config.vocab_size,
            digest: model.digest.bytes,
        }
    }
}

/// The engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine thread could not be spawned.
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts engines.
#[derive(Debug)]
pub struct Engine;

impl Engine {
    /// Starts the engine thread that owns `backend` and returns a handle to it.
    pub fn spawn(
        backend: Box<dyn Backend>,
        model: ModelInfo,
        config: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        let kv_cache = backend.kv_cache();
        let shared = Arc::new(Shared {
            stats: Mutex::new(EngineStats {
                kv_blocks_total: kv_cache.num_blocks,
                ..Default::default()
            }),
            queued: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            kv_cache,
            max_context: model.max_context,
            vocab_size: model.vocab_size,
            max_waiting: config.max_waiting,
            thread: Mutex::new(None),
        });
        let (commands, receiver) = mpsc::channel();
        let mut worker = Worker {
            step_costs: StepCosts::new(config.itl_stall_limit, config.max_batched_tokens),
            scheduler: Scheduler::new(config, kv_cache.num_blocks, model.digest),
            eos: model.eos_token_ids.iter().copied().collect(),
            model,
            backend,
            receiver,
            shared: shared.clone(),
            steps: 0,
        };
        let thread = std::thread::Builder::new()
            .name("inferno-engine".into())
            .spawn(move || worker.run())?;
        if let Ok(mut slot) = shared.thread.lock() {
            *slot = Some(thread);
        }
        Ok(EngineHandle { commands, shared })
    }
}

struct Worker {
    backend: Box<dyn Backend>,
    scheduler: Scheduler,
    model: ModelInfo,
    eos: HashSet<u32>,
    receiver: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    steps: u64,
    /// Measured step costs, which size the prefill share of each step.
    step_costs: StepCosts,
}

/// A constrained row's grammar state while its step runs, and the mask computed for it.
struct Masking {
    /// Index of the sequence in the running list.
    running: usize,
    /// Index of the row among the step's sampling rows.
    sample: usize,
    constraint: crate::constrain::TokenConstraint,
    mask: Option<Result<crate::constrain::TokenMask, String>>,
}

/// How a sampled token changed its sequence.
enum Progress {
    Continue,
    Finished(FinishReason),
    Gone,
}

impl Worker {
    fn run(&mut self) {
        tracing::info!(
            backend = self.backend.name(),
            kv_tokens = self.shared.kv_cache.capacity_tokens(),
            "engine started"
        );
        loop {
            if self.scheduler.is_idle() {
                match self.receiver.recv() {
                    Ok(command) => {
                        if !self.handle(command) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            let mut keep_running = true;
            while let Ok(command) = self.receiver.try_recv() {
                keep_running &= self.handle(command);
            }
            if !keep_running {
                break;
            }
            self.drop_abandoned();
            self.publish_stats();
            let decoding = self.scheduler.decoding_rows();
            let plan = self
                .scheduler
                .schedule(self.step_costs.token_budget(decoding));
            if !plan.is_empty() {
                let (prefill_rows, prefill_tokens) = plan
                    .iter()
                    .filter(|s| self.scheduler.running[s.index].pending() > 1)
                    .fold((0, 0), |(rows, tokens), s| {
                        (rows + 1, tokens + s.num_tokens)
                    });
                let decode_rows = plan.len() - prefill_rows;
                let started = Instant::now();
                self.step(&plan);
                self.step_costs
                    .record(decode_rows, prefill_tokens, started.elapsed());
            }
            self.publish_stats();
        }
        self.cancel_all();
        tracing::info!("engine stopped");
    }

    /// Applies a command; false means shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Submit(seq) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                if seq.request.stop.max_tokens == 0 {
                    finish(*seq, FinishReason::Length, &self.model.tokenizer);
                } else {
                    self.scheduler.waiting.push_back(*seq);
                }
                true
            }
            Command::Cancel(id) => {
                if let Some(seq) = self.scheduler.remove(id) {
                    tracing::debug!(request = %seq.request.id, "cancelled by the caller");
                }
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Cancels sequences whose callers went away without a cancel message reaching us yet.
    fn drop_abandoned(&mut self) {
        let gone: Vec<u64> = self
            .scheduler
            .running
            .iter()
            .chain(&self.scheduler.waiting)
            .filter(|s| s.events.is_closed())
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.scheduler.remove(id);
        }
    }

    fn step(&mut self, plan: &[Scheduled]) {
        let mut masking = self.take_constraints(plan);
        let result = {
            let running = &self.scheduler.running;
            let backend = &mut self.backend;
            let rows: Vec<BatchRow<'_>> = plan
                .iter()
                .map(|s| batch_row(&running[s.index], *s))
                .collect();
            // The grammar masks of this step are computed on worker threads while the backend
            // runs the forward pass; the sampler needs them only afterwards.
            std::thread::scope(|scope| {
                let masker = (!masking.is_empty()).then(|| {
                    scope.spawn(|| {
                        use rayon::prelude::*;
                        masking
                            .par_iter_mut()
                            .for_each(|m| m.mask = Some(m.constraint.mask()));
                    })
                });
                let output = backend.step(&rows);
                if let Some(masker) = masker
                    && masker.join().is_err()
                {
                    return Err(BackendError::InvalidBatch(
                        "the grammar mask computation panicked".into(),
                    ));
                }
                output.map(|out| (out, sample_specs(&rows)))
            })
        };
        self.steps += 1;
        let masks: Vec<Option<&[u32]>> = {
            let mut masks = vec![None; result.as_ref().map_or(0, |(_, specs)| specs.len())];
            for m in &masking {
                if let (Some(slot), Some(Ok(mask))) = (masks.get_mut(m.sample), m.mask.as_ref()) {
                    *slot = Some(mask.as_slice());
                }
            }
            masks
        };
        let sampled = result.and_then(|(output, specs)| {
            let sampled: Vec<SampledToken> = match output {
                StepOutput::Sampled(tokens) => {
                    let outside = tokens.iter().zip(&masks).any(|(token, mask)| {
                        mask.is_some_and(|mask| !crate::constrain::is_allowed(mask, token.token))
                    });
                    if outside {
                        return Err(BackendError::InvalidBatch(
                            "the backend sampled a constrained row on its device".into(),
                        ));
                    }
                    tokens
                }
                StepOutput::Logits(rows) => rows
                    .into_iter()
                    .zip(&specs)
                    .zip(&masks)
                    .map(|((logits, spec), mask)| sampling::sample_masked(logits, spec, *mask))
                    .collect(),
            };
            if sampled.len() == specs.len() {
                Ok(sampled)
            } else {
                Err(BackendError::InvalidBatch(format!(
                    "the backend returned {} results for {} sampling rows",
                    sampled.len(),
                    specs.len()
                )))
            }
        });
        let mask_errors = self.return_constraints(masking);
        let sampled = match sampled {
            Ok(sampled) => sampled,
            Err(err) => return self.fail_step(plan, &err),
        };
        for scheduled in plan {
            self.scheduler.complete(*scheduled);
        }
        let sampling_rows = plan
            .iter()
            .filter(|s| self.scheduler.running[s.index].pending() == 0);
        let mut finished = Vec::new();
        for (scheduled, token) in sampling_rows
            .copied()
            .collect::<Vec<_>>()
            .into_iter()
            .zip(sampled)
        {
            let progress = match mask_errors
                .iter()
                .find(|(index, _)| *index == scheduled.index)
            {
                Some((_, reason)) => Progress::Finished(FinishReason::Error(format!(
                    "constrained decoding failed: {reason}"
                ))),
                None => self.accept(scheduled.index, token),
            };
            match progress {
                Progress::Continue => {}
                Progress::Finished(reason) => finished.push((scheduled.index, Some(reason))),
                Progress::Gone => finished.push((scheduled.index, None)),
            }
        }
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for (index, reason) in finished {
            let seq = self.scheduler.remove_running(index);
            if let Some(reason) = reason {
                finish(seq, reason, &self.model.tokenizer);
            }
        }
    }

    /// Takes the grammar states of the rows that sample in this step out of their sequences.
    fn take_constraints(&mut self, plan: &[Scheduled]) -> Vec<Masking> {
        let mut masking = Vec::new();
        let mut sample = 0;
        for scheduled in plan {
            let seq = &mut self.scheduler.running[scheduled.index];
            if seq.num_computed + scheduled.num_tokens != seq.tokens.len() {
                continue;
            }
            if let Some(constraint) = seq.constraint.take() {
                masking.push(Masking {
                    running: scheduled.index,
                    sample,
                    constraint,
                    mask: None,
                });
            }
            sample += 1;
        }
        masking
    }

    /// Puts the grammar states back; returns the rows whose mask could not be computed.
    fn return_constraints(&mut self, masking: Vec<Masking>) -> Vec<(usize, String)> {
        let mut errors = Vec::new();
        for m in masking {
            if let Some(Err(reason)) = m.mask {
                errors.push((m.running, reason));
            }
            self.scheduler.running[m.running].constraint = Some(m.constraint);
        }
        errors
    }

    /// Ends every sequence of a failed step with an error.
    fn fail_step(&mut self, plan: &[Scheduled], err: &BackendError) {
        tracing::error!(error = %err, "forward step failed");
        let reason = FinishReason::Error(err.to_string());
        let mut indices: Vec<usize> = plan.iter().map(|s| s.index).collect();
        indices.sort_unstable_by_key(|&i| std::cmp::Reverse(i));
        for index in indices {
            let seq = self.scheduler.remove_running(index);
            finish(seq, reason.clone(), &self.model.tokenizer);
        }
    }

    /// Appends a sampled token to its sequence, streams its text and checks the stop conditions.
    fn accept(&mut self, index: usize, sampled: SampledToken) -> Progress {
        let max_context = self.model.max_context;
        let seq = &mut self.scheduler.running[index];
        seq.tokens.push(sampled.token);
        let mut grammar_complete = false;
        if let Some(constraint) = seq.constraint.as_mut() {
            if let Err(reason) = constraint.advance(sampled.token) {
                return Progress::Finished(FinishReason::Error(format!(
                    "constrained decoding failed: {reason}"
                )));
            }
            grammar_complete = constraint.is_finished();
        }
        let stop = &seq.request.stop;
        // As vLLM: EOS first (no stop reason), then the request's stop tokens.
        if !stop.ignore_eos && self.eos.contains(&sampled.token) {
            return Progress::Finished(FinishReason::Stop(None));
        }
        if stop.stop_token_ids.contains(&sampled.token) {
            return Progress::Finished(FinishReason::Stop(Some(StopReason::TokenId(
                sampled.token,
            ))));
        }
        let delta = match seq.decoder.push(&self.model.tokenizer, sampled.token) {
            Ok(delta) => delta,
            Err(err) => {
                return Progress::Finished(FinishReason::Error(format!(
                    "detokenization failed: {err}"
                )));
            }
        };
        let (text, stopped) = match seq.stop.push(&delta) {
            StopOutcome::Continue(text) => (text, None),
            StopOutcome::Stopped { emitted, matched } => (emitted, Some(matched)),
        };
        let event = GenerationEvent::Token {
            token: sampled.token,
            text,
            logprob: sampled.logprob,
        };
        if seq.events.send(event).is_err() {
            return Progress::Gone;
        }
        if let Some(matched) = stopped {
            // Whatever follows the stop string is never emitted.
            seq.decoder = IncrementalDecoder::new();
            Progress::Finished(FinishReason::Stop(Some(StopReason::String(matched))))
        } else if grammar_complete {
            // Only the end of the sequence may follow a complete grammar.
            Progress::Finished(FinishReason::Stop(None))
        } else if seq.output().len() >= seq.request.stop.max_tokens
            || seq.tokens.len() >= max_context
        {
            Progress::Finished(FinishReason::Length)
        } else {
            Progress::Continue
        }
    }

    fn publish_stats(&self) {
        let s = &self.scheduler;
        if let Ok(mut stats) = self.shared.stats.lock() {
            *stats = EngineStats {
                running: s.running.len(),
                waiting: s.waiting.len(),
                kv_blocks_total: s.blocks.num_blocks(),
                kv_blocks_used: s.blocks.num_held(),
                prefix_cache_queries: s.counters.prefix_queries,
                prefix_cache_hits: s.counters.prefix_hits,
                preemptions: s.counters.preemptions,
                steps: self.steps,
            };
        }
    }

    fn cancel_all(&mut self) {
        let ids: Vec<u64> = self
            .scheduler
            .running
            .iter()
            .chain(&self.scheduler.waiting)
            .map(|s| s.id)
            .collect();
        for id in ids {
            if let Some(seq) = self.scheduler.remove(id) {
                finish(seq, FinishReason::Cancelled, &self.model.tokenizer);
            }
        }
        while let Ok(command) = self.receiver.try_recv() {
            if let Command::Submit(seq) = command {
                finish(*seq, FinishReason::Cancelled, &self.model.tokenizer);
            }
        }
    }
}

/// The backend's view of one scheduled sequence.
fn batch_row(seq: &Sequence, scheduled: Scheduled) -> BatchRow<'_> {
    let start = seq.num_computed;
    let end = start + scheduled.num_tokens;
    let sample = (end == seq.tokens.len()).then(|| SampleSpec {
        params: &seq.request.sampling,
        seed: seq.seed,
        draw_index: seq.output().len() as u64,
        prompt: &seq.request.prompt,
        output: seq.output(),
        logprobs: seq.request.logprobs,
        constrained: seq.request.constraint.is_some(),
    });
    BatchRow {
        seq_id: seq.id,
        tokens: &seq.tokens[start..end],
        start_pos: start,
        block_table: &seq.blocks[..Sequence::blocks_for(end)],
        sample,
    }
}

fn sample_specs<'a>(rows: &[BatchRow<'a>]) -> Vec<SampleSpec<'a>> {
    rows.iter().filter_map(|r| r.sample).collect()
}

/// Sends the final event of a sequence (its blocks are already released), with whatever text the
/// decoder and the stop matcher still held.
fn finish(mut seq: Sequence, reason: FinishReason, tokenizer: &Tokenizer) {
    let tail = seq.decoder.finish(tokenizer).unwrap_or_default();
    let (text, reason) = match seq.stop.push(&tail) {
        StopOutcome::Continue(text) => (text + &seq.stop.flush(), reason),
        // The decoder's last bytes completed a stop string: that string ended the output
        // (unless the generation failed or was cancelled).
        StopOutcome::Stopped { emitted, matched } => match reason {
            FinishReason::Stop(_) | FinishReason::Length => (
                emitted,
                FinishReason::Stop(Some(StopReason::String(matched))),
            ),
            other => (emitted, other),
        },
    };
    let event = GenerationEvent::Finished {
        reason,
        text,
        prompt_tokens: seq.request.prompt.len(),
        completion_tokens: seq.output().len(),
        cached_tokens: seq.cached_tokens,
    };
    let _ = seq.events.send(event);
}
