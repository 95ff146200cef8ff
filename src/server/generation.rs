//! Running a validated request through the engine: submitting one engine request per choice,
//! then either collecting every choice (a whole response) or forwarding events as server-sent
//! events. Dropping a [`GenerationStream`] cancels its request, so a client that goes away
//! frees its KV blocks as soon as its response body is dropped.

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
use super::openai::echo::{self, completion_logprobs};
use super::openai::request::GenerationOptions;
use super::openai::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatLogprobs,
    ChatTokenLogprob, Completion, CompletionChoice, Delta, FunctionCall, FunctionDelta, ToolCall,
    ToolCallDelta, TopLogprob, Usage,
};
use super::openai::tools::{
    ToolCallFormat, ToolCallStreamer, ToolCallUpdate, enforced_tool_calls, parse_tool_calls,
};
use super::service::ModelService;
use crate::constrain::CompiledConstraint;
use crate::engine::{
    FinishReason, GenerationEvent, GenerationRequest, GenerationStream, PromptLogprob, StopParams,
    TokenLogprob,
};

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

/// Tool-call parsing of a chat request.
#[derive(Debug, Clone, Copy)]
pub struct ToolCalls {
    /// The model's tool-call format.
    pub format: ToolCallFormat,
    /// Whether several calls may be returned (`parallel_tool_calls`); otherwise the first counts.
    pub parallel: bool,
    /// Whether the grammar enforces the calls (`tool_choice` `required` or a named function):
    /// the output is then calls only, and a stream sends them as they are generated.
    pub enforced: bool,
}

impl ToolCalls {
    /// Splits a choice's output into content and tool calls (`None` when it calls no tool).
    /// Enforced calls keep their arguments as generated (what a stream sent), a call cut off by
    /// the length limit included.
    fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ToolCall>)> {
        let (content, mut calls) = if self.enforced {
            (None, enforced_tool_calls(self.format, text, self.parallel)?)
        } else {
            parse_tool_calls(self.format, text)?
        };
        if !self.parallel {
            calls.truncate(1);
        }
        let calls = calls
            .into_iter()
            .map(|call| ToolCall {
                id: new_call_id(),
                kind: "function",
                function: FunctionCall {
                    name: call.name,
                    arguments: call.arguments,
                },
            })
            .collect();
        Some((content, calls))
    }
}

/// A new tool-call id.
fn new_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// The assistant message of a finished choice and its finish reason (`tool_calls` when the
/// output is parsed as tool calls, `length` when enforced calls were cut off).
fn assistant_message(
    text: String,
    reason: &FinishReason,
    tool_calls: Option<&ToolCalls>,
) -> (AssistantMessage, &'static str) {
    match tool_calls.and_then(|parsing| parsing.parse(&text)) {
        Some((content, calls)) => (
            AssistantMessage {
                role: "assistant",
                content,
                tool_calls: calls,
            },
            tool_calls_finish(reason),
        ),
        None => (
            AssistantMessage {
                role: "assistant",
                content: Some(text),
                tool_calls: Vec::new(),
            },
            reason.as_openai_str(),
        ),
    }
}

/// The finish reason of a choice that called tools: `length` when the limit cut it off (only
/// enforced calls are returned then), else `tool_calls`.
fn tool_calls_finish(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => reason.as_openai_str(),
        _ => "tool_calls",
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

fn chat_logprobs(service: &ModelService, tokens: &[(u32, TokenLogprob)]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|(token, logprob)| {
                let text = service.token_text(*token);
                ChatTokenLogprob {
                    bytes: text.as_bytes().to_vec(),
                    token: text,
                    logprob: logprob.logprob,
                    top_logprobs: logprob
                        .top
                        .iter()
                        .map(|(id, lp)| {
                            let text = service.token_text(*id);
                            TopLogprob {
                                bytes: text.as_bytes().to_vec(),
                                token: text,
                                logprob: *lp,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
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
                    let (message, finish_reason) = assistant_message(
                        result.state.text,
                        &result.reason,
                        job.tool_calls.as_ref(),
                    );
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

/// Builds the SSE chunks of one job.
struct ChunkWriter {
    service: Arc<ModelService>,
    id: String,
    kind: ApiKind,
    created: u64,
    logprobs: bool,
    tool_calls: Option<ToolCalls>,
    /// Each choice's text-only chunk, serialized once (`None`: could not be split).
    text_templates: HashMap<usize, Option<TextTemplate>>,
}

/// The text placeholder a template is serialized with, as JSON writes it (quotes included).
const PLACEHOLDER_JSON: &str = "\"\\u0000\"";

/// A serialized server-sent event whose only varying part is one string field, split around
/// it: the chunk of each new token is the part before, the token's text as a JSON string, and
/// the part after (byte for byte what serializing the whole chunk gives, without building it).
#[derive(Debug, Clone, PartialEq)]
struct TextTemplate {
    before: String,
    after: String,
}

impl TextTemplate {
    /// Splits `event` (serialized with the text `"\u{0}"`) around the placeholder; `None` unless
    /// it occurs exactly once.
    fn split(event: &str) -> Option<Self> {
        let mut found = event.match_indices(PLACEHOLDER_JSON);
        let (at, _) = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(Self {
            before: event[..at].to_owned(),
            after: event[at + PLACEHOLDER_JSON.len()..].to_owned(),
        })
    }

    /// The event carrying `text`.
    fn render(&self, text: &str) -> Bytes {
        let mut out = Vec::with_capacity(self.before.len() + self.after.len() + text.len() + 8);
        out.extend_from_slice(self.before.as_bytes());
        // Writing a string into a vector cannot fail.
        let _ = serde_json::to_writer(&mut out, text);
        out.extend_from_slice(self.after.as_bytes());
        Bytes::from(out)
    }
}

impl ChunkWriter {
    fn event<T: serde::Serialize>(value: &T) -> Bytes {
        match serde_json::to_string(value) {
            Ok(json) => Bytes::from(format!("data: {json}\n\n")),
            Err(err) => error_event(&ApiError::internal(format!("encoding failed: {err}"))),
        }
    }

    /// The chunk carrying only new text for choice `index`, from its template.
    fn text_only(&mut self, index: usize, text: &str) -> Bytes {
        if !self.text_templates.contains_key(&index) {
            let event = self.content(index, "\u{0}".to_owned(), &[], 0, None);
            let template = event
                .as_deref()
                .and_then(|bytes| std::str::from_utf8(bytes).ok())
                .and_then(TextTemplate::split);
            self.text_templates.insert(index, template);
        }
        match self.text_templates.get(&index) {
            Some(Some(template)) => template.render(text),
            _ => self
                .content(index, text.to_owned(), &[], 0, None)
                .unwrap_or_default(),
        }
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Bytes {
        Self::event(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.service.name().to_owned(),
            choices,
            usage,
        })
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Bytes {
        Self::event(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.service.name().to_owned(),
            choices,
            usage,
        })
    }

    /// The opening chunk of a chat choice (announces the role).
    fn role(&self, index: usize) -> Option<Bytes> {
        (self.kind == ApiKind::Chat).then(|| {
            self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: Delta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            )
        })
    }

    /// A chunk carrying new text (and its tokens' logprobs), or the choice's last chunk.
    fn content(
        &self,
        index: usize,
        text: String,
        tokens: &[(u32, TokenLogprob)],
        text_offset: usize,
        finish: Option<&FinishReason>,
    ) -> Option<Bytes> {
        if text.is_empty() && tokens.is_empty() && finish.is_none() {
            return None;
        }
        let stop_reason = finish.and_then(FinishReason::stop_reason).cloned();
        let finish = finish.map(FinishReason::as_openai_str);
        Some(match self.kind {
            ApiKind::Chat => self.chat_chunk(
                vec![ChatChunkChoice {
                    index,
                    delta: Delta {
                        role: None,
                        content: (!text.is_empty()).then_some(text),
                        tool_calls: None,
                    },
                    logprobs: (self.logprobs && !tokens.is_empty())
                        .then(|| chat_logprobs(&self.service, tokens)),
                    finish_reason: finish,
                    stop_reason,
                }],
                None,
            ),
            ApiKind::Completion => self.completion_chunk(
                vec![CompletionChoice {
                    index,
                    logprobs: (self.logprobs && !tokens.is_empty())
                        .then(|| completion_logprobs(&self.service, tokens, text_offset)),
                    text,
                    finish_reason: finish,
                    stop_reason,
                    prompt_logprobs: None,
                }],
                None,
            ),
        })
    }

    /// The last chunk of a chat choice whose output was held back for tool-call parsing: its
    /// tool calls (or its whole text, when it called no tool) with the finish reason.
    fn held_back(
        &self,
        parsing: &ToolCalls,
        index: usize,
        text: String,
        tokens: &[(u32, TokenLogprob)],
        reason: &FinishReason,
    ) -> Bytes {
        let (message, finish) = assistant_message(text, reason, Some(parsing));
        let tool_calls = (!message.tool_calls.is_empty()).then(|| {
            message
                .tool_calls
                .into_iter()
                .enumerate()
                .map(|(index, call)| ToolCallDelta::whole(index, call))
                .collect()
        });
        self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: message.content.filter(|text| !text.is_empty()),
                    tool_calls,
                },
                logprobs: (self.logprobs && !tokens.is_empty())
                    .then(|| chat_logprobs(&self.service, tokens)),
                finish_reason: Some(finish),
                stop_reason: reason.stop_reason().cloned(),
            }],
            None,
        )
    }

    /// A chunk with the tool-call pieces of an enforced choice generated since the last one;
    /// the choice's last chunk also carries its finish reason and every token's logprobs.
    fn tool_call_deltas(
        &self,
        index: usize,
        updates: Vec<ToolCallUpdate>,
        tokens: &[(u32, TokenLogprob)],
        finish: Option<&FinishReason>,
    ) -> Option<Bytes> {
        if updates.is_empty() && finish.is_none() {
            return None;
        }
        let deltas: Vec<ToolCallDelta> = updates
            .into_iter()
            .map(|update| match update {
                ToolCallUpdate::Start { index, name } => ToolCallDelta {
                    index,
                    id: Some(new_call_id()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: String::new(),
                    },
                },
                ToolCallUpdate::Arguments { index, fragment } => ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: fragment,
                    },
                },
            })
            .collect();
        Some(self.chat_chunk(
            vec![ChatChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: None,
                    tool_calls: (!deltas.is_empty()).then_some(deltas),
                },
                logprobs: (finish.is_some() && self.logprobs && !tokens.is_empty())
                    .then(|| chat_logprobs(&self.service, tokens)),
                finish_reason: finish.map(tool_calls_finish),
                stop_reason: finish.and_then(FinishReason::stop_reason).cloned(),
            }],
            None,
        ))
    }

    fn usage(&self, usage: Usage) -> Bytes {
        match self.kind {
            ApiKind::Chat => self.chat_chunk(Vec::new(), Some(usage)),
            ApiKind::Completion => self.completion_chunk(Vec::new(), Some(usage)),
        }
    }
}

fn error_event(err: &ApiError) -> Bytes {
    Bytes::from(format!("data: {}\n\n", err.to_json()))
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
        let mut states: Vec<ChoiceState> =
            (0..streams.len()).map(|_| ChoiceState::default()).collect();
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
                    if let Some(parsing) = &self.writer.tool_calls {
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
                    let chunk = match &reason {
                        FinishReason::Error(message) => {
                            Some(error_event(&self.job.failure(message)))
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
                                state.text.clone(),
                                &state.tokens,
                                reason,
                            )),
                            None => self.writer.content(index, text, &[], 0, Some(reason)),
                        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn completion_chunk(model: &str, text: &str) -> Bytes {
        ChunkWriter::event(&Completion {
            id: "cmpl-1".into(),
            object: "text_completion",
            created: 7,
            model: model.into(),
            choices: vec![CompletionChoice {
                index: 3,
                text: text.into(),
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
                prompt_logprobs: None,
            }],
            usage: None,
        })
    }

    fn chat_chunk(text: &str) -> Bytes {
        ChunkWriter::event(&ChatChunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk",
            created: 7,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: Some(text.into()),
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            usage: None,
        })
    }

    fn template(event: &Bytes) -> Option<TextTemplate> {
        TextTemplate::split(std::str::from_utf8(event).expect("UTF-8"))
    }

    proptest! {
        /// A rendered template is byte for byte the chunk serialized whole, whatever the text
        /// (quotes, backslashes, control characters, non-ASCII, the placeholder itself).
        #[test]
        fn templated_chunks_equal_serialized_ones(text in "(\\PC|[\"\\\\\u{0}-\u{1f}\u{7f}]){0,24}") {
            let completion = template(&completion_chunk("m", "\u{0}")).expect("splits");
            prop_assert_eq!(completion.render(&text), completion_chunk("m", &text));
            let chat = template(&chat_chunk("\u{0}")).expect("splits");
            prop_assert_eq!(chat.render(&text), chat_chunk(&text));
        }
    }

    #[test]
    fn a_placeholder_found_twice_gives_no_template() {
        // A model name that contains the placeholder's characters makes the split ambiguous.
        assert!(template(&completion_chunk("\u{0}", "\u{0}")).is_none());
        assert!(template(&completion_chunk("m", "none")).is_none());
        let split = template(&completion_chunk("m", "\u{0}")).expect("splits");
        assert!(split.before.starts_with("data: {\"id\":\"cmpl-1\""));
        assert!(split.after.ends_with("}\n\n"));
    }
}
