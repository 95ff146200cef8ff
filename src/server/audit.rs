//! The server's audit hooks: the request record (durable before any response byte), the
//! completion record, fail-closed refusal, and `GET /v1/audit/checkpoint`.
//!
//! The prompt kept under the content policy is the request body as received; the completion is
//! the response body as sent (the JSON document, or the server-sent events of a stream).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use super::app::{App, RequestContext};
use super::auth::Principal;
use super::body::{Body, full};
use super::endpoint::Endpoint;
use super::error::ApiError;
use super::generation::StreamAccounting;
use super::openai::response::Usage;
use tokio::sync::oneshot;

use inferno_audit::{Appended, AuditSink, CompletionFacts, ContentMode, RequestFacts};

fn latency_ms(ctx: &RequestContext) -> u64 {
    u64::try_from(ctx.arrived.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Refuses service (HTTP 503) while the audit log is failed, or configured and not open yet
/// (it opens after start-up attestation): nothing is served unaudited. One log line marks each
/// change of state, not one per refused request.
pub fn check_available(app: &App) -> Result<(), ApiError> {
    if app.config().audit.is_some() && app.audit().is_none() {
        return Err(ApiError::unavailable(
            "the audit log opens after start-up attestation; retry later",
        ));
    }
    match app.audit_failure() {
        Some(_) => Err(log_unavailable()),
        None => Ok(()),
    }
}

fn log_unavailable() -> ApiError {
    ApiError::unavailable("the audit log cannot be written")
}

/// What a request needs to write its records.
#[derive(Debug, Clone, Copy)]
pub struct RequestAudit<'a> {
    /// The request.
    pub ctx: &'a RequestContext,
    /// The caller.
    pub principal: &'a Principal,
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Whether the response is streamed.
    pub stream: bool,
    /// The served model's digest.
    pub model_digest: &'a str,
    /// The constraint's kind and grammar digest, for a constrained request.
    pub constraint: Option<(&'a str, &'a str)>,
}

/// Hands the request record of an accepted generation request to the log now. The returned
/// future resolves once the record is durable (HTTP 503 if it cannot be written): the response
/// must not start before, but generation may run meanwhile.
pub fn record_request(
    app: &App,
    request: RequestAudit<'_>,
    body: &Bytes,
) -> impl Future<Output = Result<Option<Appended>, ApiError>> + Send + 'static + use<> {
    let pending = app.audit().map(|sink| {
        let prompt = String::from_utf8_lossy(body);
        sink.request(RequestFacts {
            request_id: &request.ctx.request_id,
            client_request_id: request.ctx.client_request_id.as_deref(),
            principal: request.principal.name(),
            endpoint: request.endpoint.path(),
            model_digest: request.model_digest,
            stream: request.stream,
            prompt: &prompt,
            status: None,
            constraint: request.constraint,
        })
    });
    let request_id = request.ctx.request_id.clone();
    async move {
        let Some(pending) = pending else {
            return Ok(None);
        };
        pending.await.map(Some).map_err(|err| {
            tracing::error!(error = %err, %request_id, "audit: request record failed");
            log_unavailable()
        })
    }
}

/// Durably records an API request answered without generation: a refusal (bad or missing
/// key, malformed body, unknown route, ...) or a call of another `/v1` endpoint. `caller` is
/// the principal if known, else `anonymous` or `invalid-key`. An error (HTTP 503) means the
/// record could not be written and the response must not be sent.
pub async fn record_answered(
    app: &App,
    ctx: &RequestContext,
    caller: &str,
    endpoint: &str,
    status: StatusCode,
) -> Result<Option<Appended>, ApiError> {
    let Some(sink) = app.audit() else {
        return Ok(None);
    };
    let model_digest = app.service().map_or("", |service| service.digest());
    let pending = sink.request(RequestFacts {
        request_id: &ctx.request_id,
        client_request_id: ctx.client_request_id.as_deref(),
        principal: caller,
        endpoint,
        model_digest,
        stream: false,
        prompt: "",
        status: Some(status.as_u16()),
        constraint: None,
    });
    pending.await.map(Some).map_err(|err| {
        tracing::error!(error = %err, request_id = %ctx.request_id, "audit: request record failed");
        log_unavailable()
    })
}

/// Records the outcome of a non-streamed request (without waiting for it to be durable).
pub fn record_completion(
    app: &App,
    ctx: &RequestContext,
    tokens: (usize, usize),
    status: StatusCode,
    finished: Option<(&str, Option<&str>)>,
) {
    let Some(sink) = app.audit() else {
        return;
    };
    let keep = sink_keeps_content(sink);
    submit_completion(
        sink,
        CompletionFacts {
            request_id: ctx.request_id.clone(),
            prompt_tokens: tokens.0 as u64,
            completion_tokens: tokens.1 as u64,
            finish_reason: finished.and_then(|(_, reason)| reason).map(str::to_owned),
            status: status.as_u16(),
            latency_ms: latency_ms(ctx),
            completion: finished
                .filter(|_| keep)
                .map(|(response, _)| response.to_owned()),
        },
    );
}

/// The status recorded for a request whose client went away before its response (nginx's
/// "client closed request"; no response was sent).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// Records a non-streamed request as `client_disconnected` when dropped before [`disarm`]: the
/// handler's future is dropped when its client goes away mid-generation.
///
/// [`disarm`]: AbandonedGuard::disarm
pub struct AbandonedGuard<'a> {
    app: &'a App,
    ctx: &'a RequestContext,
    prompt_tokens: usize,
    armed: bool,
}

impl<'a> AbandonedGuard<'a> {
    /// A guard for the request of `ctx` with `prompt_tokens` prompt tokens.
    pub fn new(app: &'a App, ctx: &'a RequestContext, prompt_tokens: usize) -> Self {
        Self {
            app,
            ctx,
            prompt_tokens,
            armed: true,
        }
    }

    /// The request reached its end: the handler records it.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbandonedGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(sink) = self.app.audit() else {
            return;
        };
        tracing::info!(
            request_id = %self.ctx.request_id,
            "the client went away before its response"
        );
        submit_completion(
            sink,
            CompletionFacts {
                request_id: self.ctx.request_id.clone(),
                prompt_tokens: self.prompt_tokens as u64,
                completion_tokens: 0,
                finish_reason: Some("client_disconnected".into()),
                status: CLIENT_CLOSED_REQUEST,
                latency_ms: latency_ms(self.ctx),
                completion: None,
            },
        );
    }
}

fn sink_keeps_content(sink: &AuditSink) -> bool {
    sink.content_mode() != ContentMode::None
}

/// Hands a completion record to the writer without waiting; it is durable before the next
/// checkpoint. A log that fails later logs its failure itself.
fn submit_completion(sink: &AuditSink, facts: CompletionFacts) {
    let id = facts.request_id.clone();
    if let Err(err) = sink.completion(facts) {
        tracing::error!(error = %err, request_id = %id, "audit: completion record failed");
    }
}

/// Wraps a streamed response so that its completion record is written when the stream ends
/// (or the client goes away). `usage` delivers the engine's token counts once every choice has
/// finished.
pub fn audited_stream(
    app: &App,
    ctx: &RequestContext,
    prompt_tokens: usize,
    usage: oneshot::Receiver<Usage>,
    accounting: Arc<StreamAccounting>,
    body: Body,
) -> Body {
    let Some(sink) = app.audit() else {
        return body;
    };
    let keep = sink_keeps_content(sink);
    http_body_util::BodyExt::boxed_unsync(AuditedStream {
        inner: body,
        sink: Arc::clone(sink),
        ctx: ctx.clone(),
        prompt_tokens: prompt_tokens as u64,
        usage,
        accounting,
        finish_reason: None,
        text: keep.then(Vec::new),
        recorded: false,
    })
}

struct AuditedStream {
    inner: Body,
    sink: Arc<AuditSink>,
    ctx: RequestContext,
    prompt_tokens: u64,
    usage: oneshot::Receiver<Usage>,
    accounting: Arc<StreamAccounting>,
    finish_reason: Option<String>,
    text: Option<Vec<u8>>,
    recorded: bool,
}

impl AuditedStream {
    /// Notes the finish reason carried by the server-sent events of one chunk (chat and
    /// completion chunks, or the Responses API's typed events).
    fn observe(&mut self, chunk: &Bytes) {
        if let Some(text) = &mut self.text {
            text.extend_from_slice(chunk);
        }
        for line in chunk.split(|byte| *byte == b'\n') {
            if let Some(json) = line.strip_prefix(b"data: ") {
                self.observe_event(json);
            }
        }
    }

    fn observe_event(&mut self, json: &[u8]) {
        // Most events carry one token and nothing the record needs: skip parsing them.
        let interesting = [
            &b"\"finish_reason\":\""[..],
            b"\"error\"",
            b"\"response.completed\"",
            b"\"response.incomplete\"",
            b"\"response.failed\"",
        ]
        .iter()
        .any(|needle| json.windows(needle.len()).any(|w| w == *needle));
        if !interesting {
            return;
        }
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(json.trim_ascii()) else {
            return;
        };
        if event.get("error").is_some() {
            self.finish_reason = Some("error".into());
        }
        let reasons = event["choices"].as_array().into_iter().flatten();
        if let Some(reason) = reasons
            .filter_map(|c| c["finish_reason"].as_str())
            .next_back()
        {
            self.finish_reason = Some(reason.to_owned());
        }
        let response_reason = match event["type"].as_str() {
            Some("response.failed") => Some("error"),
            Some("response.incomplete") => Some("length"),
            Some("response.completed") => {
                let output = event["response"]["output"].as_array().into_iter().flatten();
                let mut kinds = output.filter_map(|item| item["type"].as_str());
                Some(if kinds.any(|kind| kind == "function_call") {
                    "tool_calls"
                } else {
                    "stop"
                })
            }
            _ => None,
        };
        if let Some(reason) = response_reason {
            self.finish_reason = Some(reason.to_owned());
        }
    }

    fn record(&mut self, finished: bool) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let finish_reason = match (&self.finish_reason, finished) {
            (Some(r), _) => Some(r.clone()),
            (None, _) if self.accounting.overflowed() => Some("client_not_reading".into()),
            (None, false) => Some("client_disconnected".into()),
            (None, true) => None,
        };
        if !finished {
            tracing::info!(
                request_id = %self.ctx.request_id,
                generated_tokens = self.accounting.generated(),
                delivered_tokens = self.accounting.delivered(),
                cut_off = self.accounting.overflowed(),
                "stream ended before its client read it to the end"
            );
        }
        let completion = self
            .text
            .take()
            .map(|t| String::from_utf8_lossy(&t).into_owned());
        submit_completion(
            &self.sink,
            CompletionFacts {
                request_id: self.ctx.request_id.clone(),
                // The engine's count once every choice finished; for a client that went
                // away earlier, the tokens generated until then.
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.usage.try_recv().map_or_else(
                    |_| self.accounting.generated(),
                    |u| u.completion_tokens as u64,
                ),
                finish_reason,
                status: StatusCode::OK.as_u16(),
                latency_ms: latency_ms(&self.ctx),
                completion,
            },
        );
    }
}

impl HttpBody for AuditedStream {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.observe(&data);
                }
            }
            Poll::Ready(None) => self.record(true),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AuditedStream {
    fn drop(&mut self) {
        self.record(false);
    }
}

/// Records a security event without waiting for it to be durable (from synchronous code).
pub fn record_event(app: &App, event: inferno_audit::SecurityEvent) {
    let Some(sink) = app.audit() else {
        return;
    };
    let name = event.name();
    let durable = sink.log().append(inferno_audit::RecordBody::Event(event));
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            if let Err(err) = durable.await {
                tracing::error!(error = %err, event = name, "audit: event record failed");
            }
        });
    }
}

/// `GET /v1/audit/checkpoint`: the latest signed checkpoint (C2SP signed note, text/plain).
pub fn checkpoint(app: &App) -> Result<Response<Body>, ApiError> {
    let sink = app
        .audit()
        .ok_or_else(|| ApiError::route_not_found("/v1/audit/checkpoint"))?;
    let note = sink
        .latest_checkpoint()
        .ok_or_else(|| ApiError::unavailable("no checkpoint has been written yet"))?;
    let mut response = Response::new(full(note));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(response)
}
