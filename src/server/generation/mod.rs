//! Running a validated request through the engine: submitting one engine request per choice,
//! then either collecting every choice (a whole response) or forwarding events as server-sent
//! events. Dropping a [`GenerationStream`] cancels its request, so a client that goes away
//! frees its KV blocks as soon as its response body is dropped.

mod choice;
mod chunks;
mod harmony;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::{mpsc, oneshot};

use super::body::Body;
use super::error::ApiError;
use super::metrics::{GenerationTiming, Metrics};
use super::openai::echo;
use super::openai::reasoning::{ReasoningFormat, ReasoningSplitter};
use super::openai::request::GenerationOptions;
use super::openai::response::{ChatChoice, ChatCompletion, Completion, Usage};
use super::openai::tools::ToolCallStreamer;
use super::service::ModelService;
use crate::constrain::CompiledConstraint;
use crate::engine::{
    FinishReason, GenerationEvent, GenerationRequest, GenerationStream, PromptLogprob, StopParams,
    TokenLogprob,
};
pub use choice::ToolCalls;
use choice::{assistant_message, chat_logprobs};
use chunks::{ChunkWriter, error_event};

/// Which API shape the response takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A request ready for the engine: tokenized prompts with their stop parameters.
pub struct Job {
    /// The response id (`chatcmpl-…` or `cmpl-…`).
    pub id: String,
    /// The API request id, prefix of the engine request ids.
    pub request_id: String,
    /// Response shape.
    pub kind: ApiKind,
    /// Validated options.
    pub options: GenerationOptions,
    /// Tokenized prompts, each with its stop parameters.
    pub prompts: Vec<(Vec<u32>, StopParams)>,
    /// Prefix-cache salt of the principal.
    pub cache_salt: u64,
    /// Arrival time, for latency metrics.
    pub arrived: Instant,
    /// The compiled grammar every choice follows, if any.
    pub constraint: Option<CompiledConstraint>,
    /// How to read tool calls out of the output, when the request offers tools.
    pub tool_calls: Option<ToolCalls>,
    /// How to split the model's reasoning off its answer (chat requests of a reasoning model
    /// whose output no grammar holds).
    pub reasoning: Option<ReasoningFormat>,
    /// The output is harmony messages (chat requests of gpt-oss, unless a response format's
    /// grammar holds the output): read into reasoning, answer and tool calls by the harmony
    /// parser.
    pub harmony: bool,
}

impl Job {
    /// The error a choice's generation ended with: a constraint the output could not follow is
    /// the request's (a 400 naming the constraint's field, with no parser state); anything else
    /// is the server's.
    pub fn failure(&self, message: &str) -> ApiError {
        if message.starts_with(crate::constrain::CONSTRAINT_FAILURE) {
            let param = if self.options.constraint.is_some() {
                self.options.constraint_param
            } else {
                "tool_choice"
            };
            ApiError::invalid_param(param, message)
        } else {
            ApiError::internal(message)
        }
    }
}

impl Job {
    /// One engine request per choice: choice `p * n + i` is choice `i` of prompt `p`.
    fn engine_requests(&self) -> Vec<GenerationRequest> {
        let n = self.options.n;
        self.prompts
            .iter()
            .enumerate()
            .flat_map(|(p, (prompt, stop))| {
                (0..n).map(move |i| {
                    let index = p * n + i;
                    GenerationRequest {
                        id: format!("{}-{index}", self.request_id),
                        prompt: prompt.clone(),
                        sampling: self.options.sampling_for(index),
                        stop: stop.clone(),
                        logprobs: self.options.logprobs,
                        cache_salt: self.cache_salt,
                        prompt_logprobs: self
                            .options
                            .prompt_return
                            .engine_prompt_logprobs(self.options.logprobs),
                        constraint: self.constraint.clone(),
                    }
                })
            })
            .collect()
    }
}

/// The most bytes of server-sent events one streamed response may hold for a client that does
/// not read them. Beyond it the client is taken to have stopped reading: its generation is
/// cancelled and the response ends, so a client that never reads cannot grow server memory.
pub const MAX_BUFFERED_STREAM_BYTES: usize = 1 << 20;

/// Events buffered between the forwarding task and the response body (each at most a few KB).
const STREAM_CHANNEL_EVENTS: usize = 32;

/// Token counts of one streamed response, shared by its forwarding task and its body, so that
/// a response whose client went away is still accounted for.
#[derive(Debug, Default)]
pub struct StreamAccounting {
    generated: AtomicU64,
    delivered: AtomicU64,
    overflowed: AtomicBool,
}

impl StreamAccounting {
    /// Tokens the engine generated for the response (every choice), so far.
    pub fn generated(&self) -> u64 {
        self.generated.load(Ordering::Acquire)
    }

    /// Tokens whose events the response body handed to the connection, so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    /// Whether the response was cut off because its client stopped reading (its buffered
    /// output reached [`MAX_BUFFERED_STREAM_BYTES`]).
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

/// Per-choice bookkeeping while events arrive.
#[derive(Default)]
struct ChoiceState {
    text: String,
    tokens: Vec<(u32, TokenLogprob)>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    timing: GenerationTiming,
    /// Token events seen.
    generated: usize,
    /// Whether the choice's `Finished` event arrived.
    finished: bool,
    /// Streams enforced tool calls as they are generated (streamed chat responses only).
    tool_stream: Option<ToolCallStreamer>,
    /// Whether a tool-call delta was sent.
    tool_call_sent: bool,
    /// Splits reasoning off the answer as tokens arrive (streamed reasoning models only).
    reasoning: Option<ReasoningSplitter>,
    /// The answer after the reasoning, so far (with `reasoning`).
    answer: String,
    /// Reads a harmony model's output as it arrives (streamed harmony choices only).
    harmony: Option<harmony::HarmonyStream>,
}

impl ChoiceState {
    fn on_token(&mut self, token: u32, text: &str, logprob: Option<TokenLogprob>) {
        let now = Instant::now();
        if let Some(last) = self.last_token {
            self.timing.inter_token.push(now - last);
        } else {
            self.first_token = Some(now);
        }
        self.last_token = Some(now);
        self.generated += 1;
        self.text.push_str(text);
        if let Some(logprob) = logprob {
            self.tokens.push((token, logprob));
        }
    }

    fn on_finish(
        &mut self,
        arrived: Instant,
        reason: &FinishReason,
        (prompt_tokens, completion_tokens): (usize, usize),
        scheduled_at: Option<Instant>,
    ) {
        self.timing.scheduled_after = scheduled_at.map(|t| t.saturating_duration_since(arrived));
        self.timing.prompt_tokens = prompt_tokens;
        self.timing.completion_tokens = completion_tokens;
        self.timing.time_to_first_token = self.first_token.map(|t| t - arrived);
        self.timing.end_to_end = arrived.elapsed();
        self.timing.finish_reason = reason.as_openai_str();
        self.finished = true;
    }

    /// The timing of a choice its client abandoned (finish reason `abort`).
    fn abandoned(&mut self, arrived: Instant, prompt_tokens: usize) -> &GenerationTiming {
        self.timing.prompt_tokens = prompt_tokens;
        self.timing.completion_tokens = self.generated;
        self.timing.time_to_first_token = self.first_token.map(|t| t - arrived);
        self.timing.end_to_end = arrived.elapsed();
        self.timing.finish_reason = "abort";
        &self.timing
    }
}

/// The result of one choice.
struct ChoiceResult {
    index: usize,
    state: ChoiceState,
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    /// With prompt logprobs asked for: one per prompt token, the first `None`.
    prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
}

/// Reads one choice's events to the end.
async fn collect_choice(
    index: usize,
    mut stream: GenerationStream,
    arrived: Instant,
) -> ChoiceResult {
    let mut state = ChoiceState::default();
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token {
                token,
                text,
                logprob,
            } => state.on_token(token, &text, logprob),
            GenerationEvent::Hidden { .. } => {}
            GenerationEvent::Finished {
                reason,
                text,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                prompt_logprobs,
                scheduled_at,
            } => {
                state.text.push_str(&text);
                let tokens = (prompt_tokens, completion_tokens);
                state.on_finish(arrived, &reason, tokens, scheduled_at);
                return ChoiceResult {
                    index,
                    state,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    prompt_logprobs,
                };
            }
        }
    }
    ChoiceResult {
        index,
        state,
        reason: FinishReason::Error("the engine stopped before the request finished".into()),
        prompt_tokens: 0,
        completion_tokens: 0,
        cached_tokens: 0,
        prompt_logprobs: None,
    }
}

/// A finished non-streamed response.
#[derive(Debug)]
pub struct Completed {
    /// The response document.
    pub json: String,
    /// Token counts.
    pub usage: Usage,
    /// The finish reason of the last choice.
    pub finish_reason: Option<&'static str>,
}

/// Runs a job to completion and returns the whole response as JSON.
pub async fn complete(
    service: &ModelService,
    metrics: &Metrics,
    job: Job,
    retry_after: u64,
) -> Result<Completed, ApiError> {
    let streams = service.submit(job.engine_requests(), retry_after)?;
    let arrived = job.arrived;
    let results = futures_util::future::join_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(index, stream)| collect_choice(index, stream, arrived)),
    )
    .await;
    let n = job.options.n;
    let mut usage = Usage::default();
    for result in &results {
        if let FinishReason::Error(message) = &result.reason {
            return Err(job.failure(message));
        }
        metrics.record_generation(service.name(), &result.state.timing);
        usage.add(
            result.prompt_tokens,
            result.completion_tokens,
            result.cached_tokens,
            result.index % n == 0,
        );
    }
    let finish_reason = results.last().map(|result| result.reason.as_openai_str());
    let created = super::unix_now();
    let want_logprobs = job.options.logprobs.is_some();
    let json = match job.kind {
        ApiKind::Chat => serde_json::to_string(&ChatCompletion {
            id: job.id,
            object: "chat.completion",
            created,
            model: service.name().to_owned(),
            choices: results
                .into_iter()
                .map(|result| {
                    let logprobs =
                        want_logprobs.then(|| chat_logprobs(service, &result.state.tokens));
                    let (message, finish_reason) = if job.harmony {
                        harmony::assistant_message(
                            &result.state.text,
                            &result.reason,
                            job.tool_calls.as_ref(),
                        )
                    } else {
                        assistant_message(
                            result.state.text,
                            &result.reason,
                            job.tool_calls.as_ref(),
                            job.reasoning,
                        )
                    };
                    ChatChoice {
                        index: result.index,
                        logprobs,
                        finish_reason,
                        stop_reason: result.reason.stop_reason().cloned(),
                        message,
                    }
                })
                .collect(),
            usage,
        }),
        ApiKind::Completion => serde_json::to_string(&Completion {
            id: job.id,
            object: "text_completion",
            created,
            model: service.name().to_owned(),
            choices: results
                .into_iter()
                .map(|result| {
                    let output = echo::Output {
                        prompt: &job.prompts[result.index / n].0,
                        prompt_logprobs: result.prompt_logprobs,
                        text: result.state.text,
                        tokens: &result.state.tokens,
                    };
                    echo::completion_choice(
                        service,
                        &job.options,
                        result.index,
                        output,
                        &result.reason,
                    )
                })
                .collect(),
            usage: Some(usage),
        }),
    };
    json.map_err(|err| ApiError::internal(format!("failed to encode the response: {err}")))
        .map(|json| Completed {
            json,
            usage,
            finish_reason,
        })
}

/// Submits a job and returns a streaming body of server-sent events ending with
/// `data: [DONE]`. A forwarding task owns the engine streams; when the client goes away the
/// body is dropped, the task sees its channel close and drops the streams, which cancels them.
/// When every choice has finished, the task reports the total usage on `usage_out`, whether or
/// not the client asked for a usage chunk. `accounting` follows the tokens generated and
/// delivered as they go, for a client that leaves early.
///
/// The task keeps reading the engine's events while the client is slow, holding at most
/// [`MAX_BUFFERED_STREAM_BYTES`] of them; a client that stops reading altogether has its
/// generation cancelled once that bound is reached.
pub fn stream(
    service: Arc<ModelService>,
    metrics: Arc<Metrics>,
    job: Job,
    retry_after: u64,
    usage_out: Option<oneshot::Sender<Usage>>,
    accounting: Arc<StreamAccounting>,
) -> Result<Body, ApiError> {
    let streams = service.submit(job.engine_requests(), retry_after)?;
    let (tx, rx) = mpsc::channel::<(Bytes, u64)>(STREAM_CHANNEL_EVENTS);
    let writer = ChunkWriter {
        service: Arc::clone(&service),
        id: job.id.clone(),
        kind: job.kind,
        created: super::unix_now(),
        logprobs: job.options.logprobs.is_some(),
        tool_calls: job.tool_calls,
        text_templates: HashMap::new(),
    };
    let forwarder = Forwarder {
        writer,
        metrics,
        job,
        tx,
        usage_out,
        accounting: Arc::clone(&accounting),
        pending: VecDeque::new(),
        pending_bytes: 0,
    };
    tokio::spawn(forwarder.run(streams));
    let body = StreamBody::new(stream::unfold(
        (rx, accounting),
        |(mut rx, accounting)| async move {
            let (chunk, tokens) = rx.recv().await?;
            accounting.delivered.fetch_add(tokens, Ordering::AcqRel);
            Some((
                Ok::<_, std::convert::Infallible>(Frame::data(chunk)),
                (rx, accounting),
            ))
        },
    ));
    Ok(body.boxed_unsync())
}

type EventStream = BoxStream<'static, (usize, GenerationEvent)>;

fn merge(streams: Vec<GenerationStream>) -> EventStream {
    stream::select_all(streams.into_iter().enumerate().map(|(index, events)| {
        stream::unfold(events, move |mut events| async move {
            events.next().await.map(|event| ((index, event), events))
        })
        .boxed()
    }))
    .boxed()
}

/// Why forwarding ended early.
enum Cut {
    /// The client went away (the body was dropped).
    ClientGone,
    /// The client stopped reading and its buffered output reached the bound.
    Overflow,
}

/// The task that turns engine events into server-sent events for one response.
struct Forwarder {
    writer: ChunkWriter,
    metrics: Arc<Metrics>,
    job: Job,
    tx: mpsc::Sender<(Bytes, u64)>,
    usage_out: Option<oneshot::Sender<Usage>>,
    accounting: Arc<StreamAccounting>,
    /// Events read from the engine that the body has not taken yet, with their token counts.
    pending: VecDeque<(Bytes, u64)>,
    pending_bytes: usize,
}

impl Forwarder {
    async fn run(mut self, streams: Vec<GenerationStream>) {
        let reasoning = self.job.reasoning;
        let reads_harmony = self.job.harmony;
        let mut states: Vec<ChoiceState> = (0..streams.len())
            .map(|_| ChoiceState {
                reasoning: reasoning.map(ReasoningSplitter::new),
                harmony: reads_harmony
                    .then(|| harmony::HarmonyStream::new(self.job.tool_calls.as_ref())),
                ..ChoiceState::default()
            })
            .collect();
        let outcome = self.forward(merge(streams), &mut states).await;
        // Dropping the engine streams (above, with the merged stream) cancelled what was left.
        if let Err(cut) = outcome {
            if matches!(cut, Cut::Overflow) {
                self.accounting.overflowed.store(true, Ordering::Release);
                tracing::warn!(
                    request_id = %self.job.request_id,
                    limit_bytes = MAX_BUFFERED_STREAM_BYTES,
                    "the client stopped reading its stream; generation cancelled"
                );
            }
            let n = self.job.options.n.max(1);
            for (index, state) in states.iter_mut().enumerate() {
                if state.finished {
                    continue;
                }
                let prompt = self.job.prompts.get(index / n).map_or(0, |(p, _)| p.len());
                let timing = state.abandoned(self.job.arrived, prompt);
                self.metrics
                    .record_generation(self.writer.service.name(), timing);
            }
        }
    }

    /// Queues an event for the body; refuses once the client holds too much unread output.
    fn queue(&mut self, chunk: Bytes, tokens: u64) -> Result<(), Cut> {
        self.pending_bytes += chunk.len();
        self.pending.push_back((chunk, tokens));
        if self.pending_bytes > MAX_BUFFERED_STREAM_BYTES {
            return Err(Cut::Overflow);
        }
        Ok(())
    }

    /// Moves queued events to the body as it takes them, until none is left.
    async fn drain(&mut self) -> Result<(), Cut> {
        while let Some((chunk, tokens)) = self.pending.pop_front() {
            self.pending_bytes -= chunk.len();
            self.tx
                .send((chunk, tokens))
                .await
                .map_err(|_| Cut::ClientGone)?;
        }
        Ok(())
    }

    async fn forward(
        &mut self,
        mut events: EventStream,
        states: &mut [ChoiceState],
    ) -> Result<(), Cut> {
        let n = self.job.options.n.max(1);
        let mut usage = Usage::default();
        let mut carried = 0;
        for index in 0..states.len() {
            if let Some(chunk) = self.writer.role(index) {
                self.queue(chunk, 0)?;
            }
        }
        loop {
            let next = tokio::select! {
                biased;
                () = self.tx.closed() => return Err(Cut::ClientGone),
                permit = self.tx.reserve(), if !self.pending.is_empty() => {
                    let permit = permit.map_err(|_| Cut::ClientGone)?;
                    if let Some((chunk, tokens)) = self.pending.pop_front() {
                        self.pending_bytes -= chunk.len();
                        permit.send((chunk, tokens));
                    }
                    continue;
                }
                next = events.next() => next,
            };
            let Some((index, event)) = next else { break };
            let Some(state) = states.get_mut(index) else {
                continue;
            };
            let (chunk, tokens) = match event {
                GenerationEvent::Token {
                    token,
                    text,
                    logprob,
                } => {
                    let offset = state.text.len();
                    let tokens: Vec<(u32, TokenLogprob)> = logprob
                        .clone()
                        .map(|lp| vec![(token, lp)])
                        .unwrap_or_default();
                    state.on_token(token, &text, logprob);
                    self.accounting.generated.fetch_add(1, Ordering::AcqRel);
                    if let Some(harmony) = &mut state.harmony {
                        let pieces = harmony.push(&text);
                        (self.writer.harmony_delta(index, pieces, &tokens, None), 1)
                    } else if let Some(splitter) = &mut state.reasoning {
                        // Reasoning streams as it comes; the answer too unless tool calls
                        // may be in it (then it is held back like any auto tool output).
                        let (thought, answer) = splitter.push(&text);
                        state.answer.push_str(&answer);
                        let answer = match self.writer.tool_calls {
                            Some(_) => String::new(),
                            None => answer,
                        };
                        (self.writer.split_delta(index, thought, answer, &tokens), 1)
                    } else if let Some(parsing) = &self.writer.tool_calls {
                        if parsing.enforced {
                            // The grammar makes the output calls: send them as they grow.
                            let streamer = state.tool_stream.get_or_insert_with(|| {
                                ToolCallStreamer::new(parsing.format, parsing.parallel)
                            });
                            let updates = streamer.update(&state.text);
                            state.tool_call_sent |= !updates.is_empty();
                            (self.writer.tool_call_deltas(index, updates, &[], None), 1)
                        } else {
                            // Held back until the choice ends: the whole output decides
                            // whether it is text or tool calls.
                            (None, 1)
                        }
                    } else {
                        let chunk = if tokens.is_empty() && !text.is_empty() {
                            Some(self.writer.text_only(index, &text))
                        } else {
                            self.writer.content(index, text, &tokens, offset, None)
                        };
                        (chunk, 1)
                    }
                }
                GenerationEvent::Hidden { .. } => (None, 0),
                GenerationEvent::Finished {
                    reason,
                    text,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    scheduled_at,
                    ..
                } => {
                    // Tokens that produced no event of their own (EOS, a stop token).
                    let unseen = completion_tokens.saturating_sub(state.generated) as u64;
                    self.accounting
                        .generated
                        .fetch_add(unseen, Ordering::AcqRel);
                    state.text.push_str(&text);
                    let tokens = (prompt_tokens, completion_tokens);
                    state.on_finish(self.job.arrived, &reason, tokens, scheduled_at);
                    self.metrics
                        .record_generation(self.writer.service.name(), &state.timing);
                    usage.add(
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        index % n == 0,
                    );
                    // The rest of a reasoning model's output: its last reasoning, and the
                    // answer that the finishing chunk below carries.
                    let (thought, text) = match &mut state.reasoning {
                        Some(splitter) => {
                            let (mut thought, mut answer) = splitter.push(&text);
                            let (last_thought, last_answer) = splitter.finish();
                            thought.push_str(&last_thought);
                            answer.push_str(&last_answer);
                            state.answer.push_str(&answer);
                            (thought, answer)
                        }
                        None => (String::new(), text),
                    };
                    let lead = self.writer.split_delta(index, thought, String::new(), &[]);
                    let chunk = match &reason {
                        FinishReason::Error(message) => {
                            Some(error_event(&self.job.failure(message)))
                        }
                        reason if state.harmony.is_some() => {
                            state.harmony.as_mut().and_then(|harmony| {
                                let pieces = harmony.finish(&text, reason);
                                let called = harmony.called();
                                self.writer.harmony_delta(
                                    index,
                                    pieces,
                                    &[],
                                    Some((reason, called)),
                                )
                            })
                        }
                        reason => match &self.writer.tool_calls {
                            Some(parsing) if parsing.enforced && state.tool_call_sent => {
                                let updates = state
                                    .tool_stream
                                    .as_mut()
                                    .map(|streamer| streamer.update(&state.text))
                                    .unwrap_or_default();
                                self.writer.tool_call_deltas(
                                    index,
                                    updates,
                                    &state.tokens,
                                    Some(reason),
                                )
                            }
                            // Nothing streamed yet (or calls not enforced): the whole output.
                            Some(parsing) => Some(self.writer.held_back(
                                parsing,
                                index,
                                match state.reasoning {
                                    Some(_) => state.answer.clone(),
                                    None => state.text.clone(),
                                },
                                &state.tokens,
                                reason,
                            )),
                            None => self.writer.content(index, text, &[], 0, Some(reason)),
                        },
                    };
                    let chunk = match (lead, chunk) {
                        (Some(lead), Some(chunk)) => Some(Bytes::from([lead, chunk].concat())),
                        (lead, chunk) => chunk.or(lead),
                    };
                    (chunk, unseen)
                }
            };
            // Tokens without an event of their own count as delivered with the next event.
            carried += tokens;
            if let Some(chunk) = chunk {
                self.queue(chunk, std::mem::take(&mut carried))?;
            }
        }
        if let Some(out) = self.usage_out.take() {
            let _ = out.send(usage);
        }
        if self.job.options.include_usage {
            let chunk = self.writer.usage(usage);
            self.queue(chunk, 0)?;
        }
        self.queue(Bytes::from_static(b"data: [DONE]\n\n"), carried)?;
        self.drain().await
    }
}
