//! The thread-safe handle through which callers submit requests to the engine thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::mpsc::UnboundedReceiver;

use super::backend::KvCacheShape;
use super::request::{GenerationEvent, GenerationRequest};

/// Why the engine refused a request at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full; retry later (HTTP 429).
    #[error("the request queue is full")]
    QueueFull,
    /// The prompt is empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A prompt token id is outside the model's vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab_size} tokens")]
    UnknownToken {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// Prompt plus `max_tokens` cannot fit the context or the whole KV cache.
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}, over the limit of {limit} tokens"
    )]
    TooLong {
        /// Prompt length.
        prompt: usize,
        /// Requested completion length.
        max_tokens: usize,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The stop strings are refused (too long together).
    #[error(transparent)]
    StopStrings(#[from] super::stop::StopError),
    /// The backend cannot compute what the request asks for.
    #[error("{0} is not supported by the {1} backend")]
    Unsupported(&'static str, String),
    /// The engine has shut down.
    #[error("the engine has stopped")]
    Stopped,
}

/// A point-in-time view of the engine, for metrics and health.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Sequences scheduled in the running set.
    pub running: usize,
    /// Sequences waiting for admission (including preempted ones and those not yet seen).
    pub waiting: usize,
    /// Physical KV blocks in total.
    pub kv_blocks_total: usize,
    /// KV blocks held by live sequences.
    pub kv_blocks_used: usize,
    /// Prompt tokens looked up in the prefix cache, since start.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found, since start.
    pub prefix_cache_hits: u64,
    /// Sequences preempted (and later recomputed), since start.
    pub preemptions: u64,
    /// Forward steps run, since start.
    pub steps: u64,
    /// CPU time of the engine thread since start, in seconds.
    pub thread_cpu_seconds: f64,
    /// Of it, the time inside the backend's steps (launching and waiting for a device step,
    /// computing on the CPU backend); the rest is the engine's host work (scheduling, row
    /// building, detokenization, stop strings, events).
    pub backend_cpu_seconds: f64,
    /// Steps with a constrained sampled row, which waited for grammar masks, since start.
    pub grammar_mask_steps: u64,
    /// Of those, steps whose forward pass ran on the backend while the engine waited (a device
    /// sampler takes the masks late), since start.
    pub grammar_mask_overlapped_steps: u64,
    /// Microseconds the engine thread waited for grammar masks in those steps, since start.
    pub grammar_mask_wait_us: u64,
    /// Wall-clock seconds between a step's results and the next step's hand-over to the backend,
    /// over steps that followed one another without a pause for lack of work, since start: how
    /// long the device waited for the engine thread (scheduling and building the next rows; the
    /// backend's own packing and launch are not included). With a backend that starts steps, the
    /// previous tokens are streamed during the step, not in this gap.
    pub step_gap_seconds: f64,
    /// Speculative decoding: rows that verified proposals, since start.
    pub spec_verifications: u64,
    /// Tokens proposed in them, since start.
    pub spec_draft_tokens: u64,
    /// Of those, tokens accepted, since start.
    pub spec_accepted_tokens: u64,
    /// The tokens of each step (prompt and generated), as a histogram since start.
    pub step_tokens: super::step_tokens::StepTokens,
}

impl EngineStats {
    /// The engine thread's CPU seconds outside backend steps since start: its host work
    /// (scheduling, row building, detokenization, stop strings, events).
    pub fn host_work_seconds(&self) -> f64 {
        (self.thread_cpu_seconds - self.backend_cpu_seconds).max(0.0)
    }
}

/// Messages from handles to the engine thread.
#[derive(Debug)]
pub(super) enum Command {
    Submit(Box<super::sequence::Sequence>),
    Cancel(u64),
    Shutdown,
}

/// State shared between the engine thread and its handles.
#[derive(Debug)]
pub(super) struct Shared {
    pub stats: Mutex<EngineStats>,
    /// Requests submitted whose command the engine thread has not taken yet.
    pub queued: AtomicUsize,
    pub next_id: AtomicU64,
    pub kv_cache: KvCacheShape,
    pub max_context: usize,
    pub vocab_size: usize,
    pub max_waiting: usize,
    /// The backend's short name ([`super::Backend::name`]).
    pub backend: String,
    /// Whether the backend returns logits at several positions of a row (prompt logprobs).
    pub position_logits: bool,
    /// The engine thread, joined by the first `shutdown`.
    pub thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A cloneable handle to a running engine.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) shared: Arc<Shared>,
}

impl EngineHandle {
    /// Queues a request. Its events stream back on the returned stream; dropping the stream
    /// cancels the request and frees its KV blocks.
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SubmitError> {
        self.submit_sequence(request, false)
    }

    /// Queues an embedding request: the prompt is computed in the same steps as other
    /// requests, and the stream carries the final hidden state of its last token
    /// ([`GenerationEvent::Hidden`]) then `Finished` with no output. Sampling, stop and
    /// constraint settings are not used; `stop.max_tokens` must be at least 1.
    pub fn submit_embedding(
        &self,
        request: GenerationRequest,
    ) -> Result<GenerationStream, SubmitError> {
        self.submit_sequence(request, true)
    }

    fn submit_sequence(
        &self,
        request: GenerationRequest,
        embed: bool,
    ) -> Result<GenerationStream, SubmitError> {
        let shared = &self.shared;
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if request.prompt_logprobs.is_some() && !shared.position_logits {
            return Err(SubmitError::Unsupported(
                "prompt logprobs",
                shared.backend.clone(),
            ));
        }
        if let Some(&token) = request
            .prompt
            .iter()
            .find(|&&t| t as usize >= shared.vocab_size)
        {
            return Err(SubmitError::UnknownToken {
                token,
                vocab_size: shared.vocab_size,
            });
        }
        let total = request.prompt.len() + request.stop.max_tokens;
        let too_long = |limit| SubmitError::TooLong {
            prompt: request.prompt.len(),
            max_tokens: request.stop.max_tokens,
            limit,
        };
        if total > shared.max_context {
            return Err(too_long(shared.max_context));
        }
        if total > shared.kv_cache.capacity_tokens() {
            return Err(too_long(shared.kv_cache.capacity_tokens()));
        }
        // Compiled here, on the caller's thread, so the engine thread never waits for it.
        let stop = super::stop::StopMatcher::new(&request.stop.stop_strings)?;
        let waiting = shared.stats.lock().map(|s| s.waiting).unwrap_or(0);
        if waiting + shared.queued.fetch_add(1, Ordering::SeqCst) >= shared.max_waiting {
            shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let mut seq = super::sequence::Sequence::new(id, request, stop, events);
        seq.embed = embed;
        if self.commands.send(Command::Submit(Box::new(seq))).is_err() {
            shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        Ok(GenerationStream {
            id,
            receiver,
            commands: self.commands.clone(),
            finished: false,
        })
    }

    /// The latest statistics.
    pub fn stats(&self) -> EngineStats {
        let mut stats = self
            .shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        stats.waiting += self.shared.queued.load(Ordering::SeqCst);
        stats
    }

    /// The KV cache geometry.
    pub fn kv_cache(&self) -> KvCacheShape {
        self.shared.kv_cache
    }

    /// The short name of the backend the engine runs on (`cpu`, `cuda`).
    pub fn backend(&self) -> &str {
        &self.shared.backend
    }

    /// The longest sequence (prompt plus completion) the engine accepts.
    pub fn max_context(&self) -> usize {
        self.shared.max_context
    }

    /// Cancels everything, stops the engine thread and waits until it has released the backend.
    ///
    /// Waiting matters: a device backend must free its resources before the process exits, or
    /// the driver's exit handlers race with the engine thread's teardown.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
        let thread = self.shared.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread
            && thread.thread().id() != std::thread::current().id()
            && thread.join().is_err()
        {
            tracing::error!("the engine thread panicked");
        }
    }
}

/// The events of one request. Dropping it before `Finished` cancels the request.
#[derive(Debug)]
pub struct GenerationStream {
    id: u64,
    receiver: UnboundedReceiver<GenerationEvent>,
    commands: mpsc::Sender<Command>,
    finished: bool,
}

impl GenerationStream {
    /// The next event; `None` after the `Finished` event (or if the engine stopped).
    pub async fn next(&mut self) -> Option<GenerationEvent> {
        let event = self.receiver.recv().await;
        self.observe(event)
    }

    /// The next event, blocking the calling thread (not for use inside an async runtime).
    pub fn blocking_next(&mut self) -> Option<GenerationEvent> {
        let event = self.receiver.blocking_recv();
        self.observe(event)
    }

    fn observe(&mut self, event: Option<GenerationEvent>) -> Option<GenerationEvent> {
        match &event {
            Some(GenerationEvent::Finished { .. }) | None => self.finished = true,
            Some(GenerationEvent::Token { .. } | GenerationEvent::Hidden { .. }) => {}
        }
        event
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }
}
