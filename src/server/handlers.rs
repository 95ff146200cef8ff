//! The endpoint handlers. Each returns a response or an [`ApiError`]; the router adds the
//! request id and records the outcome.

use std::sync::Arc;

use http::{HeaderValue, Response, StatusCode, header};

use super::app::{App, RequestContext};
use super::audit;
use super::auth::Principal;
use super::body::{Body, RequestBody, full, read_limited, require_json};
use super::endpoint::Endpoint;
use super::error::ApiError;
use super::generation::{self, ApiKind, Job, ToolCalls};
use super::metrics::{Format, ServerState};
use super::openai::request::{GenerationOptions, Prompt, ToolChoice, parse_chat, parse_completion};
use super::openai::response::{ModelCard, ModelList};
use super::openai::responses::output::{ResponseShell, from_chat};
use super::openai::responses::request::{parse_responses, responses_error, responses_ignored};
use super::openai::responses::stream::responses_stream;
use super::openai::tokenize::{TokenizeRequest, parse_detokenize, parse_tokenize};
use super::openai::tools::tool_constraint;
use super::service::{ChatPolicy, ModelService};
use serde_json::Value;

pub(super) fn json_response(status: StatusCode, json: String) -> Response<Body> {
    let mut response = Response::new(full(json));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `GET /health`: 200 once the model is loaded and attested and the audit log (when configured)
/// can be written; 503 while the model loads or is attested, or while the audit log has failed,
/// since every `/v1` request is then refused. The body names both states:
/// `{"status":"ok"|"loading"|"unavailable","audit":"ok"|"pending"|"failed"|"disabled"}`
/// (`pending`: configured, opened once start-up attestation ran).
pub fn health(app: &App) -> Response<Body> {
    let audit_failed = app.audit_failure().is_some();
    let audit = match (
        app.config().audit.is_some(),
        app.audit().is_some(),
        audit_failed,
    ) {
        (false, _, _) => "disabled",
        (true, false, _) => "pending",
        (true, true, false) => "ok",
        (true, true, true) => "failed",
    };
    let ready = app.service().is_some() && app.attestation().is_some();
    let status = match (ready, audit_failed) {
        (true, false) => "ok",
        (false, _) => "loading",
        (true, true) => "unavailable",
    };
    let json = serde_json::json!({ "status": status, "audit": audit }).to_string();
    if status == "ok" {
        return json_response(StatusCode::OK, json);
    }
    let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, json);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
    response
}

/// `GET /metrics`: OpenMetrics or the Prometheus 0.0.4 text format, as the `Accept` header of
/// `headers` asks; `per_principal` adds the per-principal series (the scrape key's view).
pub fn metrics(app: &App, headers: &http::HeaderMap, per_principal: bool) -> Response<Body> {
    let format = Format::negotiate(
        headers
            .get(header::ACCEPT)
            .and_then(|value| value.to_str().ok()),
    );
    let service = app.service();
    let stats = service.map(|service| (service.name().to_owned(), service.engine().stats()));
    let audit = app.audit();
    let state = ServerState {
        audit_enabled: audit.is_some(),
        audit_failed: audit.is_some_and(|sink| sink.failure().is_some()),
        audit_records: audit.map_or(0, |sink| sink.log().durable_size()),
        // A checkpoint's second line is the number of records it covers.
        audit_checkpoint: audit
            .and_then(|sink| sink.latest_checkpoint())
            .and_then(|text| {
                let covered = text.lines().nth(1)?.trim().parse().ok()?;
                Some((covered, text))
            }),
    };
    let engine = &app.config().engine;
    let text = app.metrics().render(
        stats
            .as_ref()
            .map(|(name, stats)| (name.as_str(), stats, engine)),
        state,
        format,
        per_principal,
    );
    let mut response = Response::new(full(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    response
}

fn model_card(service: &ModelService) -> ModelCard {
    ModelCard {
        id: service.name().to_owned(),
        object: "model",
        created: service.created(),
        owned_by: "inferno",
        max_model_len: service.max_context(),
        digest: service.digest().to_owned(),
        weight_format: service.weight_format().to_owned(),
    }
}

/// `GET /v1/models`.
pub fn models(app: &App) -> Result<Response<Body>, ApiError> {
    let service = app.ready_service()?;
    let list = ModelList {
        object: "list",
        data: vec![model_card(&service)],
    };
    let json = serde_json::to_string(&list)
        .map_err(|err| ApiError::internal(format!("failed to encode the model list: {err}")))?;
    Ok(json_response(StatusCode::OK, json))
}

/// `GET /v1/models/{id}`: the served model, or 404 for any other id.
pub fn model(app: &App, id: &str) -> Result<Response<Body>, ApiError> {
    let service = app.ready_service()?;
    service.check_model(id)?;
    let json = serde_json::to_string(&model_card(&service))
        .map_err(|err| ApiError::internal(format!("failed to encode the model: {err}")))?;
    Ok(json_response(StatusCode::OK, json))
}

/// `GET /version`: the server's version.
pub fn version() -> Response<Body> {
    json_response(
        StatusCode::OK,
        serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }).to_string(),
    )
}

/// `POST /tokenize` (vLLM's shape): a prompt, or messages rendered by the chat template, to
/// `{"count", "max_model_len", "tokens"}`.
pub async fn tokenize(
    app: &App,
    request: http::Request<RequestBody>,
) -> Result<Response<Body>, ApiError> {
    let service = app.ready_service()?;
    let body = read_body(app, request).await?;
    let chat_policy = ChatPolicy::from(&app.config().server);
    let json = tokio::task::spawn_blocking(move || {
        let (model, request) = parse_tokenize(&body)?;
        if let Some(model) = model {
            service.check_model(&model)?;
        }
        let tokens = match request {
            TokenizeRequest::Prompt {
                prompt,
                add_special_tokens,
            } => service.encode(&prompt, add_special_tokens)?,
            TokenizeRequest::Chat {
                messages,
                tools,
                add_generation_prompt,
                template_kwargs,
            } => service.chat_prompt(
                &messages,
                tools.as_ref(),
                add_generation_prompt,
                &template_kwargs,
                chat_policy,
            )?,
        };
        Ok::<_, ApiError>(
            serde_json::json!({
                "count": tokens.len(),
                "max_model_len": service.max_context(),
                "tokens": tokens,
            })
            .to_string(),
        )
    })
    .await
    .map_err(|err| ApiError::internal(format!("tokenization failed: {err}")))??;
    Ok(json_response(StatusCode::OK, json))
}

/// `POST /detokenize` (vLLM's shape): `{"tokens"}` to `{"prompt"}`.
pub async fn detokenize(
    app: &App,
    request: http::Request<RequestBody>,
) -> Result<Response<Body>, ApiError> {
    let service = app.ready_service()?;
    let body = read_body(app, request).await?;
    let (model, tokens) = parse_detokenize(&body)?;
    if let Some(model) = model {
        service.check_model(&model)?;
    }
    let text = service.decode(&tokens)?;
    Ok(json_response(
        StatusCode::OK,
        serde_json::json!({ "prompt": text }).to_string(),
    ))
}

/// Reads a request body within the configured limits.
async fn read_body(
    app: &App,
    request: http::Request<RequestBody>,
) -> Result<bytes::Bytes, ApiError> {
    let limits = &app.config().limits;
    let (parts, body) = request.into_parts();
    read_limited(
        &parts.headers,
        body,
        limits.max_body_bytes,
        limits.body_read_timeout(),
    )
    .await
}

/// Renders, tokenizes and length-checks a chat request off the async threads, and compiles its
/// constraint (structured output or enforced tool call).
async fn chat_job(
    app: &App,
    service: &Arc<ModelService>,
    principal: &Principal,
    ctx: &RequestContext,
    body: bytes::Bytes,
) -> Result<Job, ApiError> {
    let limits = app.config().limits.clone();
    let chat_policy = ChatPolicy::from(&app.config().server);
    let service_for_job = Arc::clone(service);
    let (options, prompt, constraint, tool_calls, reasoning, harmony) = tokio::task::spawn_blocking(move || {
        let mut request = parse_chat(&body, service_for_job.defaults(), &limits)?;
        if request.reasoning_effort_set && !service_for_job.reads_reasoning_effort() {
            request.options.ignored.push("reasoning_effort");
        }
        service_for_job.check_model(&request.options.model)?;
        service_for_job.check_generates()?;
        service_for_job.check_logit_bias(&request.options.sampling.logit_bias)?;
        let prompt = service_for_job.chat_prompt(
            &request.messages,
            request.tools.as_ref(),
            request.add_generation_prompt,
            &request.template_kwargs,
            chat_policy,
        )?;
        let tools = request.tools.as_ref().and_then(Value::as_array);
        let tool_calls = match (tools, &request.tool_choice) {
            (None, _) | (_, ToolChoice::None) => None,
            (Some(_), _) => Some(service_for_job.tool_call_format().ok_or_else(|| {
                ApiError::invalid_param(
                    "tools",
                    "this model's chat template shows no known tool-call format; set server.tool_call_parser",
                )
            })?),
        };
        let tool_spec = match (tools, tool_calls) {
            (Some(tools), Some(format)) => tool_constraint(
                format,
                tools,
                &request.tool_choice,
                request.parallel_tool_calls,
            ),
            _ => None,
        };
        // The tool grammar applies unless a response format took precedence.
        let enforced = tool_spec.is_some() && request.options.constraint.is_none();
        let constraint = match (&request.options.constraint, tool_spec) {
            (Some(spec), _) => Some(service_for_job.compile_constraint(spec, constraint_param(&request.options))?),
            (None, Some(spec)) => Some(service_for_job.compile_constraint(&spec, "tool_choice")?),
            (None, None) => None,
        };
        let tool_calls = tool_calls.map(|format| ToolCalls {
            format,
            parallel: request.parallel_tool_calls,
            enforced,
        });
        // A grammar holds the whole output, so it has no reasoning block to split off.
        let reasoning = service_for_job
            .reasoning_format()
            .filter(|_| constraint.is_none());
        // A harmony model's output is messages, unless a response format's grammar holds it
        // (a tool-call grammar writes the messages' framing).
        let harmony = service_for_job.harmony() && request.options.constraint.is_none();
        Ok::<_, ApiError>((request.options, prompt, constraint, tool_calls, reasoning, harmony))
    })
    .await
    .map_err(|err| ApiError::internal(format!("request preparation failed: {err}")))??;
    let stop = options.stop_for(prompt.len(), service.max_context(), &app.config().limits)?;
    Ok(Job {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        request_id: ctx.request_id.clone(),
        kind: ApiKind::Chat,
        options,
        prompts: vec![(prompt, stop)],
        cache_salt: app.cache_salt(principal),
        arrived: ctx.arrived,
        constraint,
        tool_calls,
        reasoning,
        harmony,
    })
}

/// The request field a constraint came from, for the error of an invalid one.
fn constraint_param(options: &GenerationOptions) -> &'static str {
    options.constraint_param
}

/// Tokenizes and length-checks a completion request off the async threads.
async fn completion_job(
    app: &App,
    service: &Arc<ModelService>,
    principal: &Principal,
    ctx: &RequestContext,
    body: bytes::Bytes,
) -> Result<Job, ApiError> {
    let limits = app.config().limits.clone();
    let service_for_job = Arc::clone(service);
    let (options, prompts, constraint) = tokio::task::spawn_blocking(move || {
        let request = parse_completion(&body, service_for_job.defaults(), &limits)?;
        service_for_job.check_model(&request.options.model)?;
        service_for_job.check_generates()?;
        service_for_job.check_logit_bias(&request.options.sampling.logit_bias)?;
        let constraint = request
            .options
            .constraint
            .as_ref()
            .map(|spec| {
                service_for_job.compile_constraint(spec, constraint_param(&request.options))
            })
            .transpose()?;
        let prompts = request
            .prompts
            .into_iter()
            .map(|prompt| match prompt {
                Prompt::Text(text) => service_for_job.encode(&text, true),
                Prompt::Tokens(tokens) => {
                    service_for_job.check_tokens(&tokens)?;
                    Ok(tokens)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, ApiError>((request.options, prompts, constraint))
    })
    .await
    .map_err(|err| ApiError::internal(format!("request preparation failed: {err}")))??;
    let prompts = prompts
        .into_iter()
        .map(|prompt| {
            let stop = options
                .stop_for(prompt.len(), service.max_context(), &app.config().limits)
                .map_err(|err| match err.param.as_deref() {
                    Some("messages") => err.with_param("prompt"),
                    _ => err,
                })?;
            Ok((prompt, stop))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Job {
        id: format!("cmpl-{}", uuid::Uuid::new_v4().simple()),
        request_id: ctx.request_id.clone(),
        kind: ApiKind::Completion,
        options,
        prompts,
        cache_salt: app.cache_salt(principal),
        arrived: ctx.arrived,
        constraint,
        tool_calls: None,
        reasoning: None,
        harmony: false,
    })
}

/// Why a generation request got no successful response.
#[derive(Debug)]
pub enum GenerateError {
    /// Refused before its request record was written (no model yet, body too large or
    /// malformed, log failed, ...): the router records the refusal.
    Refused(ApiError),
    /// Failed after its request record was written; its completion record carries the status.
    Failed(ApiError),
}

/// `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses` (run as the
/// chat request it stands for, its result rewritten) and `POST /v1/embeddings` (its body
/// handed to `super::embeddings`).
///
/// The request record is handed to the log before the engine sees the job, and awaited before
/// any response byte: the fsync overlaps generation instead of preceding it.
pub async fn generate(
    app: &Arc<App>,
    endpoint: Endpoint,
    principal: &Principal,
    ctx: &RequestContext,
    request: http::Request<RequestBody>,
) -> Result<Response<Body>, GenerateError> {
    use GenerateError::{Failed, Refused};
    let service = app.ready_service().map_err(Refused)?;
    let limits = &app.config().limits;
    let (parts, body) = request.into_parts();
    require_json(&parts.headers).map_err(Refused)?;
    let body = read_limited(
        &parts.headers,
        body,
        limits.max_body_bytes,
        limits.body_read_timeout(),
    )
    .await
    .map_err(Refused)?;
    audit::check_available(app).map_err(Refused)?;
    let received = body.clone();
    let mut shell = None;
    let job = match endpoint {
        Endpoint::Chat => chat_job(app, &service, principal, ctx, body).await,
        Endpoint::Completions => completion_job(app, &service, principal, ctx, body).await,
        Endpoint::Responses => {
            let request = parse_responses(&body).map_err(Refused)?;
            shell = Some(ResponseShell::new(service.name().to_owned(), request.echo));
            let chat = bytes::Bytes::from(request.chat.to_string());
            chat_job(app, &service, principal, ctx, chat)
                .await
                .map(|mut job| {
                    responses_ignored(&mut job.options.ignored);
                    job
                })
                .map_err(responses_error)
        }
        Endpoint::Embeddings => {
            return super::embeddings::embeddings(app, principal, ctx, body, received).await;
        }
    }
    .map_err(Refused)?;
    let request = audit::RequestAudit {
        ctx,
        principal,
        endpoint,
        stream: job.options.stream,
        model_digest: service.digest(),
        constraint: job
            .constraint
            .as_ref()
            .map(|constraint| (constraint.kind().as_str(), constraint.digest())),
    };
    let durable = audit::record_request(app, request, &received);
    if app.content_in_logs() {
        tracing::debug!(
            request_id = %ctx.request_id,
            prompt = %String::from_utf8_lossy(&received),
            "request body (the policy allows content in logs)"
        );
    }
    let prompt_tokens = job.prompts.iter().map(|(prompt, _)| prompt.len()).sum();
    let ignored = job.options.ignored.join(", ");
    let retry_after = limits.retry_after_secs;
    let failed = |err: ApiError| {
        audit::record_completion(app, ctx, (prompt_tokens, 0), err.status, None);
        Failed(err)
    };
    if job.options.stream {
        let (usage_tx, usage_rx) = tokio::sync::oneshot::channel();
        let accounting = Arc::new(generation::StreamAccounting::default());
        let started = generation::stream(
            Arc::clone(&service),
            app.metrics_handle(),
            job,
            retry_after,
            Some(usage_tx),
            Arc::clone(&accounting),
        );
        // Prefill runs while the request record becomes durable; no byte leaves before.
        let receipt = durable.await.map_err(Failed)?;
        let body = started.map_err(failed)?;
        let body = match shell {
            Some(shell) => responses_stream(shell, body),
            None => body,
        };
        let body = audit::audited_stream(app, ctx, prompt_tokens, usage_rx, accounting, body);
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        add_ignored_header(&mut response, &ignored);
        super::receipt::add_headers(&mut response, receipt);
        Ok(response)
    } else {
        // A client that goes away drops this future: the guard then records the request as
        // `client_disconnected`, as a stream's end is.
        let abandoned = audit::AbandonedGuard::new(app, ctx, prompt_tokens);
        let generation = generation::complete(&service, app.metrics(), job, retry_after);
        let (recorded, completed) = tokio::join!(durable, generation);
        abandoned.disarm();
        let receipt = recorded.map_err(Failed)?;
        let mut completed = completed.map_err(failed)?;
        if let Some(shell) = &shell {
            completed.json = from_chat(shell, &completed.json).map_err(failed)?;
        }
        let usage = completed.usage;
        let tokens = (usage.prompt_tokens, usage.completion_tokens);
        let finished = (completed.json.as_str(), completed.finish_reason);
        audit::record_completion(app, ctx, tokens, StatusCode::OK, Some(finished));
        if app.content_in_logs() {
            tracing::debug!(
                request_id = %ctx.request_id,
                completion = %completed.json,
                "response body (the policy allows content in logs)"
            );
        }
        tracing::debug!(
            request_id = %ctx.request_id,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            "generation finished"
        );
        let mut response = json_response(StatusCode::OK, completed.json);
        add_ignored_header(&mut response, &ignored);
        super::receipt::add_headers(&mut response, receipt);
        Ok(response)
    }
}

/// Names the request's accepted-but-ignored fields (comma-separated) in the
/// `inferno-ignored-fields` header, when there are any.
pub(super) fn add_ignored_header(response: &mut Response<Body>, ignored: &str) {
    if let Ok(value) = HeaderValue::from_str(ignored)
        && !ignored.is_empty()
    {
        response.headers_mut().insert(
            http::HeaderName::from_static(crate::server::openai::request::IGNORED_FIELDS_HEADER),
            value,
        );
    }
}
