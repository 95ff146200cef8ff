//! `POST /v1/embeddings`: every input becomes an engine request that computes its prompt in the
//! same steps as generation and returns its last token's final hidden state, pooled as the
//! model's sentence-transformers files say. Audited like a completion: the request record
//! (endpoint `/v1/embeddings`) before the response, the completion record after.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::app::{App, RequestContext};
use super::audit;
use super::auth::Principal;
use super::body::Body;
use super::endpoint::Endpoint;
use super::error::ApiError;
use super::handlers::{GenerateError, add_ignored_header, json_response};
use super::openai::embeddings::{
    EmbeddingInput, check_dimensions, parse_embeddings, pool, response,
};
use crate::engine::{FinishReason, GenerationEvent, GenerationRequest, SamplingParams, StopParams};

/// `POST /v1/embeddings`, for [`super::handlers::generate`] once the body (`body`, with its
/// copy `received` for the audit record) was read within the limits.
pub(super) async fn embeddings(
    app: &Arc<App>,
    principal: &Principal,
    ctx: &RequestContext,
    body: bytes::Bytes,
    received: bytes::Bytes,
) -> Result<Response<Body>, GenerateError> {
    use GenerateError::{Failed, Refused};
    let service = app.ready_service().map_err(Refused)?;
    let limits = &app.config().limits;
    let for_job = Arc::clone(&service);
    let (request, prompts) = tokio::task::spawn_blocking(move || {
        let request = parse_embeddings(&body)?;
        for_job.check_model(&request.model)?;
        let pooling = for_job.pooling().ok_or_else(|| {
            ApiError::invalid_request(
                "this model is not an embedding model (its directory has no sentence-transformers modules.json)",
            )
        })?;
        check_dimensions(pooling, for_job.hidden_size(), request.dimensions)?;
        let prompts = request
            .inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                let tokens = match input {
                    EmbeddingInput::Text(text) => match &pooling.default_prompt {
                        Some(prompt) => for_job.encode(&format!("{prompt}{text}"), true)?,
                        None => for_job.encode(text, true)?,
                    },
                    EmbeddingInput::Tokens(tokens) => {
                        for_job.check_tokens(tokens)?;
                        tokens.clone()
                    }
                };
                if tokens.is_empty() || tokens.len() >= for_job.max_context() {
                    let mut err = ApiError::invalid_param(
                        "input",
                        format!(
                            "input[{index}] has {} tokens; the model takes 1 to {}",
                            tokens.len(),
                            for_job.max_context() - 1
                        ),
                    );
                    err.code = Some("context_length_exceeded");
                    return Err(err);
                }
                Ok(tokens)
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok::<_, ApiError>((request, prompts))
    })
    .await
    .map_err(|err| Refused(ApiError::internal(format!("request preparation failed: {err}"))))?
    .map_err(Refused)?;
    let durable = audit::record_request(
        app,
        audit::RequestAudit {
            ctx,
            principal,
            endpoint: Endpoint::Embeddings,
            stream: false,
            model_digest: service.digest(),
            constraint: None,
        },
        &received,
    );
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let failed = |err: ApiError| {
        audit::record_completion(app, ctx, (prompt_tokens, 0), err.status, None);
        Failed(err)
    };
    let salt = app.cache_salt(principal);
    let requests = prompts
        .into_iter()
        .enumerate()
        .map(|(index, prompt)| GenerationRequest {
            id: format!("{}-{index}", ctx.request_id),
            prompt,
            sampling: SamplingParams::default(),
            stop: StopParams {
                max_tokens: 1,
                ..StopParams::default()
            },
            logprobs: None,
            cache_salt: salt,
            prompt_logprobs: None,
            constraint: None,
        })
        .collect();
    let abandoned = audit::AbandonedGuard::new(app, ctx, prompt_tokens);
    let states = async {
        let streams = service.submit_embeddings(requests, limits.retry_after_secs)?;
        let states = futures_util::future::join_all(streams.into_iter().map(hidden_state)).await;
        states.into_iter().collect::<Result<Vec<_>, ApiError>>()
    };
    let (recorded, states) = tokio::join!(durable, states);
    abandoned.disarm();
    let receipt = recorded.map_err(Failed)?;
    let states = states.map_err(failed)?;
    let pooling = service
        .pooling()
        .ok_or_else(|| failed(ApiError::internal("the model lost its pooling")))?;
    let vectors: Vec<Vec<f32>> = states
        .into_iter()
        .map(|state| pool(state, pooling, request.dimensions))
        .collect();
    let json = response(service.name(), &vectors, request.format, prompt_tokens);
    audit::record_completion(
        app,
        ctx,
        (prompt_tokens, 0),
        StatusCode::OK,
        Some((json.as_str(), Some("stop"))),
    );
    let mut response = json_response(StatusCode::OK, json);
    add_ignored_header(&mut response, &request.ignored.join(", "));
    super::receipt::add_headers(&mut response, receipt);
    Ok(response)
}

/// The hidden state one embedding request's stream carries.
async fn hidden_state(mut stream: crate::engine::GenerationStream) -> Result<Vec<f32>, ApiError> {
    let mut state = None;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Hidden { state: hidden } => state = Some(hidden),
            GenerationEvent::Finished {
                reason: FinishReason::Error(message),
                ..
            } => return Err(ApiError::internal(message)),
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Token { .. } => {}
        }
    }
    state.ok_or_else(|| ApiError::internal("the engine returned no hidden state"))
}
