//! The engine thread: takes commands, runs scheduled steps on the backend, turns sampled tokens
//! into events and finishes sequences.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tokenizers::Tokenizer;

use super::backend::{Backend, BackendError, BatchRow, SampleSpec, SampledToken, StepOutput};
use super::config::EngineConfig;
use super::detokenize::{Detokenizer, IncrementalDecoder};
use super::handle::{Command, EngineHandle, EngineStats, Shared};
use super::request::{FinishReason, GenerationEvent, StopReason};
use super::sampling;
use super::scheduler::{Scheduled, Scheduler};
use super::sequence::Sequence;
use super::speculative::{SpecCounters, SpeculativeConfig};
use super::step_cost::StepCosts;
use super::step_tokens::StepTokens;
use super::stop::StopOutcome;

mod masks;
mod speculation;

use masks::{MaskJobs, MaskWait};

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
    /// The `[speculative]` settings cannot be served.
    #[error(transparent)]
    Speculative(#[from] super::speculative::SpeculativeConfigError),
    /// Speculative decoding was asked of a backend that cannot verify proposals.
    #[error("speculative decoding is not supported by the {0} backend yet")]
    SpeculativeBackend(String),
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
        let config = config.resolved(kv_cache.num_blocks, backend.max_rows(), &kv_cache.groups);
        let speculative = config.speculative.clone();
        if speculative.enabled() {
            speculative.validate()?;
            if !backend.position_logits() {
                return Err(EngineError::SpeculativeBackend(backend.name().to_owned()));
            }
        }
        tracing::info!(
            max_num_seqs = config.max_num_seqs,
            kv_blocks = kv_cache.num_blocks,
            kv_groups = kv_cache.groups.count(),
            sliding_window = ?kv_cache.groups.sliding_window,
            "sequence limit"
        );
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
            backend: backend.name().to_owned(),
            position_logits: backend.position_logits(),
            thread: Mutex::new(None),
        });
        let (commands, receiver) = mpsc::channel();
        let worker_shared = shared.clone();
        let worker = move || Worker {
            // Built on the engine thread: the byte table of a large vocabulary takes milliseconds
            // that start-up need not wait for.
            detokenizer: Detokenizer::new(model.tokenizer.clone()),
            step_costs: StepCosts::new(config.itl_stall_limit, config.max_batched_tokens)
                .with_step_sizes(backend.step_sizes()),
            scheduler: Scheduler::new(config, kv_cache.num_blocks, model.digest)
                .with_groups(kv_cache.groups),
            eos: model.eos_token_ids.iter().copied().collect(),
            model,
            backend,
            receiver,
            shared: worker_shared,
            steps: 0,
            backend_cpu: Duration::ZERO,
            masks: MaskJobs::new(),
            mask_wait: MaskWait::default(),
            unstreamed: Unstreamed::default(),
            last_step_end: None,
            step_gaps: Duration::ZERO,
            speculative,
            spec: SpecCounters::default(),
            step_tokens: StepTokens::default(),
        };
        let thread = std::thread::Builder::new()
            .name("inferno-engine".into())
            .spawn(move || worker().run())?;
        if let Ok(mut slot) = shared.thread.lock() {
            *slot = Some(thread);
        }
        Ok(EngineHandle { commands, shared })
    }
}

struct Worker {
    /// Turns sampled tokens into text.
    detokenizer: Detokenizer,
    backend: Box<dyn Backend>,
    scheduler: Scheduler,
    model: ModelInfo,
    eos: HashSet<u32>,
    receiver: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    steps: u64,
    /// The engine thread's CPU time inside `Backend::step`, since start.
    backend_cpu: Duration,
    masks: MaskJobs,
    /// Time steps spent waiting for their grammar masks.
    mask_wait: MaskWait,
    /// Measured step costs, which size the prefill share of each step.
    step_costs: StepCosts,
    /// The last step's tokens whose text is still to be streamed.
    unstreamed: Unstreamed,
    /// When the last step's results came back, while the next one follows without a pause.
    last_step_end: Option<Instant>,
    /// Sum of the gaps between steps (`EngineStats::step_gap_seconds`).
    step_gaps: Duration,
    /// Speculative decoding settings (off without a method).
    speculative: SpeculativeConfig,
    /// Speculation counters since start.
    spec: SpecCounters,
    /// The tokens of each step, as a histogram.
    step_tokens: StepTokens,
}

/// What a sampled token did to its sequence, before its text is known.
enum Accepted {
    /// The sequence goes on; the token's text is still to be streamed.
    Continue,
    /// The token ends the sequence; with `streamed`, its text is streamed first.
    Finished {
        reason: FinishReason,
        streamed: bool,
    },
}

/// What streaming a token's text did to its sequence.
enum Streamed {
    /// The text (what the stop matcher released of it) went to the caller.
    Sent,
    /// The sequence ends here: its text completed a stop string (the output ends before it) or
    /// could not be decoded; no reason when the caller went away.
    Ended(Option<FinishReason>),
}

/// Tokens a step sampled whose text has not been streamed yet. A backend that starts steps
/// ([`Backend::start_step`]) streams them while the next step runs (see `docs/engine.md`,
/// "Streaming while the next step runs"); otherwise they are streamed as soon as the step ends.
#[derive(Default)]
struct Unstreamed {
    /// Tokens of sequences that go on (still scheduled, or preempted since).
    running: Vec<(u64, SampledToken)>,
    /// Sequences a token ended, out of the scheduler already (their blocks released).
    ended: Vec<Ending>,
}

impl Unstreamed {
    fn is_empty(&self) -> bool {
        self.running.is_empty() && self.ended.is_empty()
    }
}

/// What a step's forward pass returned.
enum Forward<'a> {
    /// The plain step's output.
    Whole(StepOutput),
    /// Logits at the positions asked of each row (`Backend::step_logits`).
    Positions(&'a [usize], Vec<Vec<f32>>),
    /// Tokens the backend sampled at every sampled position of each row
    /// (`Backend::step_sampled_positions`).
    Sampled(Vec<SampledToken>),
}

/// A sequence a token ended, with the tokens to stream before it ends.
struct Ending {
    seq: Sequence,
    /// The tokens whose text belongs to the output (several after a verification), streamed
    /// first.
    tokens: Vec<SampledToken>,
    /// Where the first of them is in the sequence's tokens (a stop string in one's text cuts
    /// the sequence after it).
    first: usize,
    reason: FinishReason,
}

/// A sequence a step's tokens ended: its id, why, the tokens to stream first and where the
/// first of them is in its tokens.
type Finished = (u64, FinishReason, Vec<SampledToken>, usize);

/// Sequences whose streamed text ended them while they were still scheduled: removed once the
/// step in flight has ended (its token for them is dropped); no reason when the caller went away.
type EndedByText = Vec<(u64, Option<FinishReason>)>;

impl Worker {
    fn run(&mut self) {
        tracing::info!(
            backend = self.backend.name(),
            kv_cache = %self.shared.kv_cache.capacity_label(),
            byte_level_detokenizer = self.detokenizer.is_byte_level(),
            "engine started"
        );
        loop {
            if self.scheduler.is_idle() {
                // The last step's tokens go out before the engine sleeps.
                self.stream_now();
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
            self.propose();
            let decoding = self.scheduler.decode_load();
            let plan = self
                .scheduler
                .schedule(self.step_costs.token_budget(decoding));
            if plan.is_empty() {
                self.stream_now();
            } else {
                let (decode, prefill_tokens) = self.scheduler.plan_load(&plan);
                let started = Instant::now();
                self.step(&plan);
                self.step_costs
                    .record(decode, prefill_tokens, started.elapsed());
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
                    finish(*seq, FinishReason::Length, &self.detokenizer);
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
            .running()
            .chain(&self.scheduler.waiting)
            .filter(|s| s.events.is_closed())
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.scheduler.remove(id);
        }
    }

    fn step(&mut self, plan: &[Scheduled]) {
        self.step_tokens
            .observe(plan.iter().map(|s| s.num_tokens).sum());
        if let Some(end) = self.last_step_end.take() {
            self.step_gaps += end.elapsed();
        }
        // The forward pass needs neither the masks nor the previous tokens' text: a backend that
        // samples on the device queues it now, takes the masks that are still being computed
        // once they are ready, and runs while the previous step's tokens are streamed.
        // Embedding rows that end their prompt here need the hidden states: the step runs
        // whole, through `Backend::step_with_hidden`.
        let hidden_rows: Vec<usize> = plan
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                let seq = planned(&self.scheduler, s);
                seq.embed && seq.num_computed + s.num_tokens == seq.tokens.len()
            })
            .map(|(index, _)| index)
            .collect();
        // A step that needs several positions of a row runs whole too.
        let positions = speculation::positions(&self.scheduler, plan);
        let whole = !hidden_rows.is_empty() || positions.is_some();
        let started = match self.start_step_unless(plan, whole) {
            Ok(started) => started,
            Err(err) => {
                self.steps += 1;
                self.stream_now();
                return self.fail_step(plan, &err);
            }
        };
        let ended_by_text = self.stream_unstreamed();
        let waiting = Instant::now();
        let constrained = self.prepare_masks(plan);
        if constrained {
            self.record_mask_wait(waiting.elapsed(), started);
        }
        let result = {
            let scheduler = &self.scheduler;
            let rows: Vec<BatchRow<'_>> = plan
                .iter()
                .map(|s| batch_row(planned(scheduler, s), *s))
                .collect();
            let specs = speculation::plain_specs(scheduler, plan, &rows);
            // Verification on a backend that samples on the device: the target's token at
            // every position comes back, not the logits (prompt logprobs need the logits).
            let on_device = positions.is_some()
                && hidden_rows.is_empty()
                && self.backend.sampled_positions()
                && !speculation::needs_logits(scheduler, plan)
                && speculation::sampled_positions(scheduler, plan, &rows)
                    <= self.backend.max_rows().unwrap_or(usize::MAX);
            let drafted = if on_device {
                speculation::draft_outputs(scheduler, plan)
            } else {
                Vec::new()
            };
            let cpu_before = thread_cpu_time();
            // Only a backend that runs steps whole computes logits at several positions.
            let output = match &positions {
                Some(_) if on_device => {
                    let position_specs =
                        speculation::position_specs(scheduler, plan, &rows, &drafted);
                    let slices: Vec<&[SampleSpec<'_>]> =
                        position_specs.iter().map(Vec::as_slice).collect();
                    self.backend
                        .step_sampled_positions(&rows, &slices)
                        .map(|tokens| (Forward::Sampled(tokens), Vec::new()))
                }
                Some(positions) if !started => self
                    .backend
                    .step_logits(&rows, positions, &hidden_rows)
                    .map(|(logits, states)| (Forward::Positions(positions, logits), states)),
                _ if started => self
                    .backend
                    .finish_step(&rows)
                    .map(|output| (Forward::Whole(output), Vec::new())),
                _ => self
                    .backend
                    .step_with_hidden(&rows, &hidden_rows)
                    .map(|(output, states)| (Forward::Whole(output), states)),
            };
            self.backend_cpu += thread_cpu_time().saturating_sub(cpu_before);
            self.last_step_end = Some(Instant::now());
            let forced = self.speculative.forced_acceptance;
            output.and_then(|(output, states)| {
                if states.len() != hidden_rows.len() {
                    return Err(BackendError::InvalidBatch(format!(
                        "the backend returned {} hidden states for {} rows",
                        states.len(),
                        hidden_rows.len()
                    )));
                }
                let (sampled, positional) = match output {
                    Forward::Whole(StepOutput::Sampled(tokens)) => (tokens, Default::default()),
                    Forward::Whole(StepOutput::Logits(rows)) => (
                        rows.into_iter()
                            .zip(&specs)
                            .map(|(logits, spec)| sampling::sample(logits, spec))
                            .collect(),
                        Default::default(),
                    ),
                    Forward::Positions(positions, logits) => {
                        speculation::resolve(scheduler, plan, &rows, positions, logits, forced)
                    }
                    Forward::Sampled(tokens) => {
                        speculation::resolve_sampled(scheduler, plan, &rows, tokens, forced)?
                    }
                };
                if sampled.len() != specs.len() {
                    return Err(BackendError::InvalidBatch(format!(
                        "the backend returned {} results for {} sampling rows",
                        sampled.len(),
                        specs.len()
                    )));
                }
                let outside = sampled.iter().zip(&specs).any(|(token, spec)| {
                    spec.mask
                        .is_some_and(|mask| !crate::constrain::is_allowed(mask, token.token))
                });
                if outside {
                    return Err(BackendError::InvalidBatch(
                        "the sampler chose a token outside the grammar mask".into(),
                    ));
                }
                Ok((sampled, positional, states))
            })
        };
        self.steps += 1;
        let (sampled, positional, states) = match result {
            Ok(result) => result,
            Err(err) => {
                self.end_by_text(ended_by_text);
                return self.fail_step(plan, &err);
            }
        };
        self.record_prompt_logprobs(positional.prompt);
        for scheduled in plan {
            // A verification row is completed once its accepted proposals are known.
            if !planned(&self.scheduler, scheduled).verifies(scheduled.num_tokens) {
                self.scheduler.complete(*scheduled);
            }
        }
        // An embedding request ends with its prompt: its state goes out, nothing is sampled.
        for (&row, state) in hidden_rows.iter().zip(states) {
            let seq_id = plan[row].seq_id;
            if let Some(seq) = self.scheduler.remove_running(seq_id) {
                let _ = seq.events.send(GenerationEvent::Hidden { state });
                self.unstreamed.ended.push(Ending {
                    seq,
                    tokens: Vec::new(),
                    first: 0,
                    reason: FinishReason::Stop(None),
                });
            }
        }
        let sampling_rows: Vec<Scheduled> = plan
            .iter()
            .filter(|s| {
                self.scheduler
                    .get(s.seq_id)
                    .is_some_and(|seq| !seq.embed && seq.pending() == 0)
            })
            .copied()
            .collect();
        let mut advanced = self.advance_grammars(&sampling_rows, &sampled);
        let mut finished = Vec::new();
        let mut continuing = Vec::new();
        for ((scheduled, token), advanced) in
            sampling_rows.into_iter().zip(sampled).zip(&mut advanced)
        {
            // The text of this sequence's previous token ended it while this step ran: the
            // token this step drew for it is dropped.
            if ended_by_text.iter().any(|(id, _)| *id == scheduled.seq_id) {
                continue;
            }
            let mask = planned_mut(&mut self.scheduler, &scheduled)
                .next_mask
                .take();
            let accepted = match mask {
                Some(Err(reason)) => Accepted::Finished {
                    reason: FinishReason::Error(format!(
                        "{}: {reason}",
                        crate::constrain::CONSTRAINT_FAILURE
                    )),
                    streamed: false,
                },
                _ => self.accept(&scheduled, token.token, advanced.take()),
            };
            match accepted {
                Accepted::Continue => {
                    continuing.push(scheduled.seq_id);
                    self.unstreamed.running.push((scheduled.seq_id, token));
                }
                Accepted::Finished { reason, streamed } => {
                    let at = planned(&self.scheduler, &scheduled).tokens.len() - 1;
                    let token = streamed.then_some(token);
                    finished.push((scheduled.seq_id, reason, token.into_iter().collect(), at));
                }
            }
        }
        for (seq_id, verified, proposed) in positional.verified {
            if ended_by_text.iter().all(|(id, _)| *id != seq_id)
                && self.accept_verified(seq_id, verified, proposed, &mut finished)
            {
                continuing.push(seq_id);
            }
        }
        self.end_by_text(ended_by_text);
        // Rows are in admission order: the latest admitted goes first, so that each removal moves
        // as few of the others as possible.
        for (seq_id, reason, tokens, first) in finished.into_iter().rev() {
            if let Some(seq) = self.scheduler.remove_running(seq_id) {
                self.unstreamed.ended.push(Ending {
                    seq,
                    tokens,
                    first,
                    reason,
                });
            }
        }
        // Without a started step there is nothing to stream beside: stream at once, before the
        // next step is scheduled (a stop string then ends its sequence before it runs again).
        if !started {
            let ended_now = self.stream_unstreamed();
            continuing.retain(|seq_id| ended_now.iter().all(|(id, _)| id != seq_id));
            self.end_by_text(ended_now);
        }
        // The next masks are computed on the pool while the next step is scheduled and (with a
        // backend that takes masks late) while its forward pass runs.
        self.start_masks(&continuing);
    }

    /// Streams the text of the tokens not streamed yet and ends the sequences it ends, now: no
    /// step is in flight, and none follows the last one at once (the wait until the next is not a
    /// gap between steps).
    fn stream_now(&mut self) {
        let ended = self.stream_unstreamed();
        self.end_by_text(ended);
        self.last_step_end = None;
    }

    /// Streams the text of the tokens not streamed yet, in the order they were sampled, and ends
    /// the sequences that a token had ended. Returns the still scheduled sequences the text
    /// ended (a stop string, a detokenization error, a caller gone), for
    /// [`Worker::end_by_text`] once no step that computes them is in flight.
    fn stream_unstreamed(&mut self) -> EndedByText {
        if self.unstreamed.is_empty() {
            return Vec::new();
        }
        let Unstreamed { running, ended } = std::mem::take(&mut self.unstreamed);
        let detokenizer = &self.detokenizer;
        let mut ended_by_text = Vec::new();
        for (seq_id, token) in running {
            // Cancelled meanwhile: nothing to stream; ended by an earlier token's text: nothing
            // more to stream.
            let Some(seq) = self.scheduler.find_mut(seq_id) else {
                continue;
            };
            if ended_by_text.iter().any(|(id, _)| *id == seq_id) {
                // A later token of the same verification: it never belonged to the output.
                seq.tokens.pop();
                continue;
            }
            if let Streamed::Ended(reason) = stream_token(seq, token, detokenizer) {
                ended_by_text.push((seq_id, reason));
            }
        }
        'ended: for ending in ended {
            let Ending {
                mut seq,
                tokens,
                first,
                mut reason,
            } = ending;
            // As the checks of a running sequence's token: a stop string in its text comes first,
            // and the tokens after it were never part of the output.
            for (i, token) in tokens.into_iter().enumerate() {
                match stream_token(&mut seq, token, detokenizer) {
                    Streamed::Sent => {}
                    Streamed::Ended(Some(by_text)) => {
                        seq.tokens.truncate(first + i + 1);
                        reason = by_text;
                        break;
                    }
                    Streamed::Ended(None) => continue 'ended,
                }
            }
            finish(seq, reason, detokenizer);
        }
        ended_by_text
    }

    /// Removes the sequences their text ended and sends their final events.
    fn end_by_text(&mut self, ended: EndedByText) {
        for (seq_id, reason) in ended {
            if let Some(seq) = self.scheduler.remove(seq_id)
                && let Some(reason) = reason
            {
                finish(seq, reason, &self.detokenizer);
            }
        }
    }

    /// [`Worker::start_step`] unless the step must run whole (`whole`: it returns hidden states,
    /// which only [`Backend::step_with_hidden`] gives): then false, having queued nothing.
    fn start_step_unless(&mut self, plan: &[Scheduled], whole: bool) -> Result<bool, BackendError> {
        if whole {
            return Ok(false);
        }
        self.start_step(plan)
    }

    /// Ends every sequence of a failed step with an error.
    fn fail_step(&mut self, plan: &[Scheduled], err: &BackendError) {
        tracing::error!(error = %err, "forward step failed");
        let reason = FinishReason::Error(err.to_string());
        // Latest admitted first, as in `step`.
        for scheduled in plan.iter().rev() {
            if let Some(seq) = self.scheduler.remove_running(scheduled.seq_id) {
                finish(seq, reason.clone(), &self.detokenizer);
            }
        }
    }

    /// Appends a sampled token to its sequence and checks the stop conditions that do not
    /// depend on its text (those that do are checked when it is streamed, [`stream_token`]).
    /// `advanced` is the outcome of advancing the row's grammar past the token
    /// ([`Worker::advance_grammars`]; None without a grammar).
    fn accept(
        &mut self,
        scheduled: &Scheduled,
        token: u32,
        advanced: Option<Result<bool, String>>,
    ) -> Accepted {
        let max_context = self.model.max_context;
        let seq = planned_mut(&mut self.scheduler, scheduled);
        seq.tokens.push(token);
        let ended = |reason| Accepted::Finished {
            reason,
            streamed: false,
        };
        let grammar_complete = match advanced {
            Some(Err(reason)) => {
                return ended(FinishReason::Error(format!(
                    "{}: {reason}",
                    crate::constrain::CONSTRAINT_FAILURE
                )));
            }
            Some(Ok(complete)) => complete,
            None => false,
        };
        let stop = &seq.request.stop;
        // As vLLM: EOS first (no stop reason), then the request's stop tokens; neither is text.
        if !stop.ignore_eos && self.eos.contains(&token) {
            return ended(FinishReason::Stop(None));
        }
        if stop.stop_token_ids.contains(&token) {
            return ended(FinishReason::Stop(Some(StopReason::TokenId(token))));
        }
        let reason = if grammar_complete {
            // Only the end of the sequence may follow a complete grammar.
            FinishReason::Stop(None)
        } else if seq.output().len() >= stop.max_tokens || seq.tokens.len() >= max_context {
            FinishReason::Length
        } else {
            return Accepted::Continue;
        };
        Accepted::Finished {
            reason,
            streamed: true,
        }
    }

    fn publish_stats(&self) {
        let s = &self.scheduler;
        if let Ok(mut stats) = self.shared.stats.lock() {
            *stats = EngineStats {
                running: s.num_running(),
                waiting: s.waiting.len(),
                kv_blocks_total: s.blocks.num_blocks(),
                kv_blocks_used: s.blocks.num_held(),
                prefix_cache_queries: s.counters.prefix_queries,
                prefix_cache_hits: s.counters.prefix_hits,
                preemptions: s.counters.preemptions,
                steps: self.steps,
                thread_cpu_seconds: thread_cpu_time().as_secs_f64(),
                backend_cpu_seconds: self.backend_cpu.as_secs_f64(),
                grammar_mask_steps: self.mask_wait.steps,
                grammar_mask_overlapped_steps: self.mask_wait.overlapped_steps,
                grammar_mask_wait_us: self.mask_wait.micros,
                step_gap_seconds: self.step_gaps.as_secs_f64(),
                spec_verifications: self.spec.verifications,
                spec_draft_tokens: self.spec.draft_tokens,
                spec_accepted_tokens: self.spec.accepted_tokens,
                step_tokens: self.step_tokens.clone(),
            };
        }
    }

    fn cancel_all(&mut self) {
        self.stream_now();
        let ids: Vec<u64> = self
            .scheduler
            .running()
            .chain(&self.scheduler.waiting)
            .map(|s| s.id)
            .collect();
        for id in ids {
            if let Some(seq) = self.scheduler.remove(id) {
                finish(seq, FinishReason::Cancelled, &self.detokenizer);
            }
        }
        while let Ok(command) = self.receiver.try_recv() {
            if let Command::Submit(seq) = command {
                finish(*seq, FinishReason::Cancelled, &self.detokenizer);
            }
        }
    }
}

/// The calling thread's CPU time (user and system) since it started.
fn thread_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// The sequence a row of the current step's plan computes: it runs until the step ends.
fn planned<'a>(scheduler: &'a Scheduler, scheduled: &Scheduled) -> &'a Sequence {
    scheduler
        .get(scheduled.seq_id)
        .expect("a planned sequence runs until its step ends")
}

/// [`planned`], for changes that keep the sequence's id.
fn planned_mut<'a>(scheduler: &'a mut Scheduler, scheduled: &Scheduled) -> &'a mut Sequence {
    scheduler
        .get_mut(scheduled.seq_id)
        .expect("a planned sequence runs until its step ends")
}

/// The backend's view of one scheduled sequence.
fn batch_row(seq: &Sequence, scheduled: Scheduled) -> BatchRow<'_> {
    let start = seq.num_computed;
    let end = start + scheduled.num_tokens;
    let sample = (end >= seq.tokens.len() && !seq.embed).then(|| SampleSpec {
        params: &seq.request.sampling,
        seed: seq.seed,
        draw_index: seq.output().len() as u64,
        prompt: &seq.request.prompt,
        output: seq.output(),
        logprobs: seq.request.logprobs,
        mask: seq
            .next_mask
            .as_ref()
            .and_then(|mask| mask.as_ref().ok())
            .map(Vec::as_slice),
    });
    BatchRow {
        seq_id: seq.id,
        // A verification row: the last token, then the proposals.
        tokens: if seq.verifies(scheduled.num_tokens) {
            &seq.verify
        } else {
            &seq.tokens[start..end]
        },
        start_pos: start,
        block_table: seq.blocks.row(Sequence::blocks_for(end)),
        sample,
    }
}

/// Turns a sampled token into text and sends it: what the incremental decoder completes, less
/// what the stop matcher holds back.
fn stream_token(seq: &mut Sequence, token: SampledToken, detokenizer: &Detokenizer) -> Streamed {
    let delta = match seq.decoder.push(detokenizer, token.token) {
        Ok(delta) => delta,
        Err(err) => {
            return Streamed::Ended(Some(FinishReason::Error(format!(
                "detokenization failed: {err}"
            ))));
        }
    };
    let (text, stopped) = match seq.stop.push_owned(delta) {
        StopOutcome::Continue(text) => (text, None),
        StopOutcome::Stopped { emitted, matched } => (emitted, Some(matched)),
    };
    let event = GenerationEvent::Token {
        token: token.token,
        text,
        logprob: token.logprob,
    };
    if seq.events.send(event).is_err() {
        return Streamed::Ended(None);
    }
    match stopped {
        Some(matched) => {
            // Whatever follows the stop string is never emitted.
            seq.decoder = IncrementalDecoder::new();
            Streamed::Ended(Some(FinishReason::Stop(Some(StopReason::String(matched)))))
        }
        None => Streamed::Sent,
    }
}

/// Sends the final event of a sequence (its blocks are already released), with whatever text the
/// decoder and the stop matcher still held.
fn finish(mut seq: Sequence, reason: FinishReason, detokenizer: &Detokenizer) {
    let tail = seq.decoder.finish(detokenizer).unwrap_or_default();
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
        prompt_logprobs: seq.prompt_logprobs.take(),
        scheduled_at: seq.first_scheduled,
    };
    let _ = seq.events.send(event);
}
