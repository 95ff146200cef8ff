//! Shared server state and request routing.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;

use super::auth::{Authenticator, Principal};
use super::body::Body;
use super::error::ApiError;
use super::generation::ApiKind;
use super::handlers;
use super::metrics::Metrics;
use super::service::ModelService;
use crate::config::Config;
use inferno_audit::AuditSink;

/// The request-id header: on a request, the client's own id; on every response, the id the
/// server generated for the request (audit records are matched by it).
pub const REQUEST_ID: &str = "x-request-id";

/// The response header that echoes the client's own request id (as kept).
pub const CLIENT_REQUEST_ID: &str = "x-client-request-id";

/// Longest client request id kept; longer ones are cut to this many bytes.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Per-request facts the handlers share.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The id the server generated for this request (a UUID), which its audit records carry.
    pub request_id: String,
    /// The client's own `X-Request-Id`, if it sent a usable one (see [`client_request_id`]).
    pub client_request_id: Option<String>,
    /// When the request arrived.
    pub arrived: Instant,
}

/// State shared by every connection.
pub struct App {
    config: Config,
    auth: Authenticator,
    metrics: Arc<Metrics>,
    service: OnceLock<Arc<ModelService>>,
    audit: OnceLock<Arc<AuditSink>>,
    attestation: OnceLock<Arc<crate::attest::AttestationService>>,
    challenges: super::attestation::ChallengeGate,
    content_in_logs: bool,
    /// Whether the last look at the audit log found it failed (logged once per change).
    audit_failed: AtomicBool,
}

/// How the router answered a request, and what the audit log already knows of it.
struct Routed {
    /// The authenticated principal, if the route required and passed authentication.
    principal: Option<Principal>,
    /// The caller as the audit log names it (see [`Authenticator::audit_name`]).
    caller: String,
    /// Whether the handler already wrote the request's records (accepted generation).
    recorded: bool,
    /// The response or the error to answer with.
    result: Result<Response<Body>, ApiError>,
}

/// The routes, for 404 versus 405.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Metrics,
    Models,
    Model,
    Chat,
    Completions,
    AuditCheckpoint,
    AuditProof,
    Attestation,
    Tokenize,
    Detokenize,
    Version,
}

impl Route {
    fn from_path(path: &str) -> Option<Self> {
        match path {
            "/health" => Some(Self::Health),
            "/metrics" => Some(Self::Metrics),
            "/v1/models" => Some(Self::Models),
            "/v1/chat/completions" => Some(Self::Chat),
            "/v1/completions" => Some(Self::Completions),
            "/v1/audit/checkpoint" => Some(Self::AuditCheckpoint),
            "/v1/audit/proof" => Some(Self::AuditProof),
            "/v1/attestation" => Some(Self::Attestation),
            "/tokenize" => Some(Self::Tokenize),
            "/detokenize" => Some(Self::Detokenize),
            "/version" => Some(Self::Version),
            _ if model_id(path).is_some() => Some(Self::Model),
            _ => None,
        }
    }

    fn allows(self, method: &Method) -> bool {
        match self {
            Self::Health
            | Self::Metrics
            | Self::Models
            | Self::Model
            | Self::AuditCheckpoint
            | Self::AuditProof
            | Self::Version => method == Method::GET || method == Method::HEAD,
            Self::Chat | Self::Completions | Self::Tokenize | Self::Detokenize => {
                method == Method::POST
            }
            Self::Attestation => {
                method == Method::GET || method == Method::HEAD || method == Method::POST
            }
        }
    }

    fn allow(self) -> &'static str {
        match self {
            Self::Chat | Self::Completions => "POST",
            Self::Attestation => "GET, HEAD, POST",
            _ => "GET, HEAD",
        }
    }
}

impl App {
    /// State for a server whose model is not loaded yet.
    pub fn new(config: Config, auth: Authenticator) -> Self {
        let challenges = super::attestation::ChallengeGate::new(&config.attestation);
        Self {
            config,
            auth,
            metrics: Arc::new(Metrics::new()),
            challenges,
            service: OnceLock::new(),
            audit: OnceLock::new(),
            attestation: OnceLock::new(),
            content_in_logs: false,
            audit_failed: AtomicBool::new(false),
        }
    }

    /// Lets prompts and completions appear in debug-level logs, as the server policy's
    /// `[audit] content_in_logs` allows (default: never).
    pub fn with_content_in_logs(mut self, allowed: bool) -> Self {
        self.content_in_logs = allowed;
        self
    }

    /// Whether the policy lets prompts and completions appear in logs.
    pub fn content_in_logs(&self) -> bool {
        self.content_in_logs
    }

    /// Adds the audit log every API request is recorded in (once it is open, after start-up
    /// attestation). A second call is ignored.
    pub fn set_audit(&self, audit: Arc<AuditSink>) {
        if self.audit.set(audit).is_err() {
            tracing::warn!("the audit log was already set");
        }
    }

    /// Adds the attestation service: the start-up evidence served at `GET /v1/attestation` and
    /// fresh evidence for `POST /v1/attestation`. A second call is ignored.
    pub fn set_attestation(&self, attestation: Arc<crate::attest::AttestationService>) {
        if self.attestation.set(attestation).is_err() {
            tracing::warn!("the attestation service was already set");
        } else {
            self.metrics.record_attested();
        }
    }

    /// The attestation service, once start-up evidence exists.
    pub fn attestation(&self) -> Option<&Arc<crate::attest::AttestationService>> {
        self.attestation.get()
    }

    /// The admission rules of fresh-evidence challenges (nonce replay, rate limit).
    pub(super) fn challenges(&self) -> &super::attestation::ChallengeGate {
        &self.challenges
    }

    /// The principal whose attestation-challenge budget a request is charged to: the holder of
    /// the valid API key it sends, if any.
    pub(super) fn challenge_principal(&self, headers: &http::HeaderMap) -> Option<String> {
        if !self.auth.has_keys() || !headers.contains_key(header::AUTHORIZATION) {
            return None;
        }
        self.auth.authenticate(headers).ok().map(|p| p.0)
    }

    /// The audit log, once open (configured with `[audit]`, opened after attestation).
    pub fn audit(&self) -> Option<&Arc<AuditSink>> {
        self.audit.get()
    }

    /// Why the audit log cannot be written, if it cannot: every `/v1` request is then refused
    /// (HTTP 503) and `/health` answers 503. The first look after a change of state logs it.
    pub fn audit_failure(&self) -> Option<String> {
        let failure = self.audit.get().and_then(|sink| sink.failure());
        let failed = failure.is_some();
        if self.audit_failed.swap(failed, Ordering::AcqRel) != failed {
            match &failure {
                Some(why) => tracing::error!(
                    reason = %why,
                    "the audit log has failed; refusing every /v1 request until it recovers"
                ),
                None => tracing::info!("the audit log is writable again; serving requests"),
            }
        }
        failure
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A shared handle to the metrics.
    pub fn metrics_handle(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Marks the model as loaded; `/health` turns 200. A second call is ignored.
    pub fn set_service(&self, service: Arc<ModelService>) {
        if self.service.set(service).is_err() {
            tracing::warn!("the model service was already set");
        }
    }

    /// The loaded model, if any.
    pub fn service(&self) -> Option<&Arc<ModelService>> {
        self.service.get()
    }

    /// The loaded model, or HTTP 503 while it loads.
    pub fn ready_service(&self) -> Result<Arc<ModelService>, ApiError> {
        self.service
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("the model is still loading"))
    }

    /// The prefix-cache salt for `principal` (0 for everyone when the cache is shared).
    pub fn cache_salt(&self, principal: &Principal) -> u64 {
        if self.config.engine.share_prefix_cache {
            0
        } else {
            principal.cache_salt()
        }
    }

    /// Whether the caller may read `/metrics`, and with the per-principal series (`true`: the
    /// scrape key) or without (`false`). The scrape key (`[metrics] key_sha256`) reads all;
    /// `[metrics] public` opens the rest to anyone; the development profile also lets API keys
    /// read it. Otherwise the production profile has no `/metrics` (404).
    fn metrics_view(&self, headers: &http::HeaderMap) -> Result<bool, ApiError> {
        let settings = &self.config.metrics;
        if let Some(hash) = &settings.key_sha256
            && super::auth::presents_key(headers, hash)
        {
            return Ok(true);
        }
        if settings.public {
            return Ok(false);
        }
        if self.config.attestation.profile == crate::config::AttestationProfile::Development {
            return self.auth.authenticate(headers).map(|_| false);
        }
        if settings.key_sha256.is_some() {
            return Err(ApiError::unauthorized(
                "/metrics needs the scrape key ([metrics] key_sha256) as `Authorization: Bearer <key>`",
            ));
        }
        Err(ApiError::route_not_found("/metrics"))
    }

    /// Serves one request. Never fails: errors become OpenAI-style error responses. Every
    /// request to a `/v1/` path gets an audit record before its response: accepted generation
    /// requests in the handler, every other one (refusals included) here.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let ctx = RequestContext {
            request_id: uuid::Uuid::new_v4().to_string(),
            client_request_id: client_request_id(&request),
            arrived: Instant::now(),
        };
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let api = path.starts_with("/v1/");
        let routed = self.route(request, &ctx).await;
        // A server-side failure's cause, logged with the request below (clients see only the
        // message, which is safe to show).
        let server_error = routed
            .result
            .as_ref()
            .err()
            .filter(|err| err.status.is_server_error())
            .map(|err| match &err.cause {
                Some(cause) => format!("{}: {cause}", err.message),
                None => err.message.clone(),
            });
        let mut response = routed.result.unwrap_or_else(ApiError::into_response);
        if api && !routed.recorded {
            let recorded = match super::audit::check_available(&self) {
                Ok(()) => {
                    super::audit::record_answered(
                        &self,
                        &ctx,
                        &routed.caller,
                        &audit_endpoint(&path),
                        response.status(),
                    )
                    .await
                }
                Err(err) => Err(err),
            };
            // Fail closed: a response whose record cannot be written is not sent.
            match recorded {
                Ok(receipt) => super::receipt::add_headers(&mut response, receipt),
                Err(err) => response = err.into_response(),
            }
        }
        if method == Method::HEAD {
            // RFC 9110 §9.3.2: no content; over HTTP/2 the HEADERS frame then ends the stream.
            *response.body_mut() = super::body::empty();
        }
        if let Ok(value) = HeaderValue::from_str(&ctx.request_id) {
            response.headers_mut().insert(REQUEST_ID, value);
        }
        if let Some(value) = ctx
            .client_request_id
            .as_deref()
            .and_then(|id| HeaderValue::from_str(id).ok())
        {
            response.headers_mut().insert(CLIENT_REQUEST_ID, value);
        }
        let status = response.status().as_u16();
        let principal_name = routed.principal.as_ref().map_or("-", Principal::name);
        if api {
            let model = self.service().map_or("", |service| service.name());
            self.metrics
                .record_request(model, principal_name, &path_label(&path), status);
        }
        let elapsed_ms = ctx.arrived.elapsed().as_millis() as u64;
        let path = path_label(&path);
        match server_error {
            Some(cause) if status == 500 => tracing::error!(
                request_id = %ctx.request_id,
                client_request_id = ?ctx.client_request_id,
                principal = principal_name,
                %method,
                %path,
                status,
                elapsed_ms,
                %cause,
                "request failed"
            ),
            Some(cause) => tracing::warn!(
                request_id = %ctx.request_id,
                client_request_id = ?ctx.client_request_id,
                principal = principal_name,
                %method,
                %path,
                status,
                elapsed_ms,
                %cause,
                "request refused"
            ),
            None => tracing::info!(
                request_id = %ctx.request_id,
                client_request_id = ?ctx.client_request_id,
                principal = principal_name,
                %method,
                %path,
                status,
                elapsed_ms,
                "request"
            ),
        }
        Ok(response)
    }

    async fn route(self: &Arc<Self>, request: Request<Incoming>, ctx: &RequestContext) -> Routed {
        let unauthenticated = |result| Routed {
            principal: None,
            caller: self.auth.audit_name(request.headers()),
            recorded: false,
            result,
        };
        let path = request.uri().path();
        let Some(route) = Route::from_path(path) else {
            return unauthenticated(Err(ApiError::route_not_found(path)));
        };
        // HEAD is answered as GET is, without the body (see `handle`).
        if !route.allows(request.method()) {
            let mut response = ApiError::method_not_allowed(route.allow()).into_response();
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(route.allow()));
            return unauthenticated(Ok(response));
        }
        match route {
            Route::Health => return unauthenticated(Ok(handlers::health(self))),
            Route::Version => return unauthenticated(Ok(handlers::version())),
            Route::AuditCheckpoint => return unauthenticated(super::audit::checkpoint(self)),
            Route::Attestation if request.method() != Method::POST => {
                return unauthenticated(super::attestation::document(self));
            }
            Route::Attestation => {
                let caller = self.auth.audit_name(request.headers());
                return Routed {
                    principal: None,
                    caller,
                    recorded: false,
                    result: super::attestation::fresh(self, request).await,
                };
            }
            Route::Metrics => {
                let result = self
                    .metrics_view(request.headers())
                    .map(|per_principal| handlers::metrics(self, request.headers(), per_principal));
                return unauthenticated(result);
            }
            _ => {}
        }
        let principal = match self.auth.authenticate(request.headers()) {
            Ok(principal) => principal,
            Err(err) => return unauthenticated(Err(err)),
        };
        let (recorded, result) = match route {
            Route::Chat | Route::Completions => {
                let kind = if route == Route::Chat {
                    ApiKind::Chat
                } else {
                    ApiKind::Completion
                };
                match handlers::generate(self, kind, &principal, ctx, request).await {
                    Ok(response) => (true, Ok(response)),
                    Err(handlers::GenerateError::Failed(err)) => (true, Err(err)),
                    Err(handlers::GenerateError::Refused(err)) => (false, Err(err)),
                }
            }
            Route::Metrics => (
                false,
                self.metrics_view(request.headers())
                    .map(|per_principal| handlers::metrics(self, request.headers(), per_principal)),
            ),
            Route::Models => (false, handlers::models(self)),
            Route::Model => (
                false,
                handlers::model(self, model_id(request.uri().path()).unwrap_or_default()),
            ),
            Route::Health => (false, Ok(handlers::health(self))),
            Route::Version => (false, Ok(handlers::version())),
            Route::Tokenize => (false, handlers::tokenize(self, request).await),
            Route::Detokenize => (false, handlers::detokenize(self, request).await),
            Route::AuditCheckpoint => (false, super::audit::checkpoint(self)),
            Route::AuditProof => (
                false,
                super::receipt::proof(self, request.uri().query(), principal.name()).await,
            ),
            Route::Attestation => (false, super::attestation::document(self)),
        };
        Routed {
            caller: principal.name().to_owned(),
            principal: Some(principal),
            recorded,
            result,
        }
    }
}

/// Longest path of an unknown route kept in its audit record.
const MAX_AUDITED_PATH: usize = 128;

/// The endpoint as an audit record names it: a known route's path, or an unknown path cut to
/// [`MAX_AUDITED_PATH`] bytes.
fn audit_endpoint(path: &str) -> String {
    if Route::from_path(path).is_some() {
        return path.to_owned();
    }
    let mut end = path.len().min(MAX_AUDITED_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path[..end].to_owned()
}

/// The client's `X-Request-Id`, kept for correlation only: printable ASCII (spaces and quotes
/// included: logs write it quoted and escaped), cut to [`MAX_REQUEST_ID_LEN`] bytes; `None`
/// when absent, empty or holding other bytes.
pub fn client_request_id<B>(request: &Request<B>) -> Option<String> {
    let id = request.headers().get(REQUEST_ID)?.as_bytes();
    if id.is_empty() || !id.iter().all(|b| (0x20..0x7f).contains(b)) {
        return None;
    }
    let kept = &id[..id.len().min(MAX_REQUEST_ID_LEN)];
    Some(String::from_utf8_lossy(kept).into_owned())
}

/// The path as a metrics label: known routes as themselves, anything else as `other` (so
/// clients cannot create unbounded label values).
fn path_label(path: &str) -> String {
    match Route::from_path(path) {
        Some(Route::Model) => "/v1/models/{id}".to_owned(),
        Some(_) => path.to_owned(),
        None => "other".to_owned(),
    }
}

/// The model id of a `/v1/models/{id}` path.
fn model_id(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/models/").filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_request_id_is_kept_printable_and_bounded() {
        let with = |id: &[u8]| {
            let request = Request::builder()
                .header(REQUEST_ID, HeaderValue::from_bytes(id).unwrap())
                .body(())
                .unwrap();
            client_request_id(&request)
        };
        assert_eq!(with(b"abc-123").as_deref(), Some("abc-123"));
        assert_eq!(with(b"a \"b\"").as_deref(), Some("a \"b\""));
        assert_eq!(
            with(&[b'x'; 200]).map(|id| id.len()),
            Some(MAX_REQUEST_ID_LEN)
        );
        assert_eq!(with(b"caf\xc3\xa9"), None, "bytes outside printable ASCII");
        assert_eq!(with(b"a\tb"), None);
        assert_eq!(with(b""), None);
        let none = Request::builder().body(()).unwrap();
        assert_eq!(client_request_id(&none), None);
    }

    #[test]
    fn prefix_cache_salt_is_per_principal_unless_shared() {
        let alice = Principal("alice".to_owned());
        let bob = Principal("bob".to_owned());
        let private = App::new(Config::default(), Authenticator::new(&[]).unwrap());
        assert_ne!(private.cache_salt(&alice), private.cache_salt(&bob));
        let mut config = Config::default();
        config.engine.share_prefix_cache = true;
        let shared = App::new(config, Authenticator::new(&[]).unwrap());
        assert_eq!(shared.cache_salt(&alice), shared.cache_salt(&bob));
    }

    #[test]
    fn production_metrics_are_off_unless_a_scrape_key_or_public_opens_them() {
        let hash =
            |key: &str| hex::encode(ring::digest::digest(&ring::digest::SHA256, key.as_bytes()));
        let api_key = crate::config::ApiKeyEntry {
            name: "alice".to_owned(),
            sha256: hash("k-alice"),
        };
        let app = |metrics: crate::config::MetricsConfig| {
            let config = Config {
                metrics,
                ..Config::default()
            };
            App::new(
                config,
                Authenticator::new(std::slice::from_ref(&api_key)).unwrap(),
            )
        };
        let bearer = |key: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                header::AUTHORIZATION,
                format!("Bearer {key}").parse().unwrap(),
            );
            headers
        };
        let off = app(crate::config::MetricsConfig::default());
        let err = off.metrics_view(&bearer("k-alice")).unwrap_err();
        assert_eq!(err.status, http::StatusCode::NOT_FOUND);
        let keyed = app(crate::config::MetricsConfig {
            public: false,
            key_sha256: Some(hash("scrape")),
        });
        assert!(keyed.metrics_view(&bearer("scrape")).unwrap());
        let err = keyed.metrics_view(&bearer("k-alice")).unwrap_err();
        assert_eq!(err.status, http::StatusCode::UNAUTHORIZED);
        let public = app(crate::config::MetricsConfig {
            public: true,
            key_sha256: None,
        });
        assert!(!public.metrics_view(&http::HeaderMap::new()).unwrap());
    }

    #[test]
    fn routes_know_their_methods() {
        assert_eq!(
            Route::from_path("/v1/completions"),
            Some(Route::Completions)
        );
        assert!(Route::Chat.allows(&Method::POST));
        assert!(!Route::Chat.allows(&Method::GET));
        assert!(Route::Attestation.allows(&Method::POST));
        assert!(Route::Models.allows(&Method::HEAD));
        assert_eq!(Route::Attestation.allow(), "GET, HEAD, POST");
        assert_eq!(Route::Models.allow(), "GET, HEAD");
        assert_eq!(Route::from_path("/v1/nope"), None);
        assert_eq!(path_label("/v1/nope"), "other");
        assert_eq!(Route::from_path("/v1/models/m"), Some(Route::Model));
        assert_eq!(path_label("/v1/models/anything"), "/v1/models/{id}");
        assert_eq!(model_id("/v1/models/org/name"), Some("org/name"));
        assert_eq!(Route::from_path("/v1/models/"), None);
    }
}
