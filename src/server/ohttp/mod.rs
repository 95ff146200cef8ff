//! The Oblivious HTTP gateway (RFC 9458) for the server's own API.
//!
//! - `GET /.well-known/ohttp-gateway` serves the key configuration (`application/ohttp-keys`),
//!   generated in memory at start-up ([`GatewayKey`]); its SHA-256 is bound into the runtime
//!   data, so the evidence names the key that requests are sealed to.
//! - `POST /v1/ohttp` takes an encapsulated Binary HTTP request (`message/ohttp-req`, or
//!   `message/ohttp-chunked-req` for a chunked answer, draft-ietf-ohai-chunked-ohttp) for any
//!   API route, serves it with the same router in-process, and answers the encapsulated
//!   response (`message/ohttp-res`, or `message/ohttp-chunked-res` whose chunks follow the
//!   server-sent events as they are produced). The receipt headers travel inside.
//! - Replays are refused: a `Date` within [`replay::MAX_DATE_SKEW`] and a bounded window of the
//!   encapsulated keys seen ([`replay`]).
//!
//! A request that fails before it could be opened (wrong media type, too large, not
//! decryptable, replayed) gets a plain OpenAI error; once opened, every answer is sealed.
//! `docs/ohttp.md` describes the exchange.

mod keys;
mod message;
mod replay;
#[cfg(test)]
mod rfc9458;
mod stream;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures_util::AsyncReadExt;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

pub use keys::{GatewayKey, KeyConfigError, PUBLIC_KEY_LEN};

use super::app::{App, RequestContext};
use super::attestation::ConnectionExporter;
use super::body::{Body, RequestBody, full, read_limited};
use super::error::ApiError;
use replay::{Refusal, ReplayWindow};

/// The gateway resource.
pub const GATEWAY_PATH: &str = "/v1/ohttp";
/// Where the key configuration is served (RFC 9540).
pub const KEYS_PATH: &str = "/.well-known/ohttp-gateway";
/// The media type of an encapsulated request.
pub const REQUEST_TYPE: &str = "message/ohttp-req";
/// The media type of an encapsulated response.
pub const RESPONSE_TYPE: &str = "message/ohttp-res";
/// The media type of a chunked encapsulated request.
pub const CHUNKED_REQUEST_TYPE: &str = "message/ohttp-chunked-req";
/// The media type of a chunked encapsulated response.
pub const CHUNKED_RESPONSE_TYPE: &str = "message/ohttp-chunked-res";
/// The media type of the key configuration.
pub const KEYS_TYPE: &str = "application/ohttp-keys";

/// What an encapsulated request may add to `[limits] max_body_bytes`: the encapsulation
/// header, the AEAD tags, the Binary HTTP framing and header fields.
const ENVELOPE_ALLOWANCE: usize = 64 << 10;

/// The length of the encapsulation header before `enc`: key id, KEM, KDF and AEAD ids.
const HEADER_LEN: usize = 7;

/// The gateway: its key and its replay window.
pub struct Gateway {
    key: GatewayKey,
    replay: ReplayWindow,
}

/// The request extension of a request that came out of an Oblivious HTTP message.
#[derive(Debug, Clone)]
pub struct Sealed {
    /// The key configuration's identifier.
    pub key_id: u8,
    /// The gateway's public key the request was sealed to.
    pub public_key: [u8; PUBLIC_KEY_LEN],
    /// The client as rate limits see it: SHA-256 of the outer TLS connection's exporter value
    /// (the relay's or the client's connection; unique per connection).
    pub client: [u8; 32],
}

impl Gateway {
    /// A gateway with a fresh key.
    pub fn generate() -> Result<Self, KeyConfigError> {
        Ok(Self {
            key: GatewayKey::generate()?,
            replay: ReplayWindow::default(),
        })
    }

    /// The gateway's key configuration.
    pub fn key(&self) -> &GatewayKey {
        &self.key
    }
}

/// `GET /.well-known/ohttp-gateway`: the key configuration, `application/ohttp-keys`.
pub fn key_configs(app: &App) -> Result<Response<Body>, ApiError> {
    let gateway = app
        .ohttp()
        .ok_or_else(|| ApiError::route_not_found(KEYS_PATH))?;
    let mut response = Response::new(full(gateway.key.list().to_vec()));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(KEYS_TYPE));
    // A restart makes a new key: clients revalidate it (and its attestation) each time.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// `POST /v1/ohttp`. Resolves to whether the sealed request was served (its own audit records
/// then exist), and the outer response. The future is boxed: the router serves the sealed
/// request, so its future would otherwise contain itself.
pub fn gateway(
    app: &Arc<App>,
    request: Request<RequestBody>,
) -> BoxFuture<'_, (bool, Result<Response<Body>, ApiError>)> {
    Box::pin(async move {
        match open_and_serve(app, request).await {
            Ok(response) => (true, Ok(response)),
            Err(err) => (false, Err(err)),
        }
    })
}

async fn open_and_serve(
    app: &Arc<App>,
    request: Request<RequestBody>,
) -> Result<Response<Body>, ApiError> {
    let gateway = app
        .ohttp()
        .ok_or_else(|| ApiError::route_not_found(GATEWAY_PATH))?;
    let chunked = media_type(request.headers())?;
    let client: [u8; 32] = request
        .extensions()
        .get::<ConnectionExporter>()
        .map_or([0; 32], |exporter| Sha256::digest(exporter.0).into());
    let limits = &app.config().limits;
    let (parts, body) = request.into_parts();
    let sealed_bytes = read_limited(
        &parts.headers,
        body,
        limits.max_body_bytes + ENVELOPE_ALLOWANCE,
        limits.body_read_timeout(),
    )
    .await?;
    let sealed = Sealed {
        key_id: gateway.key.key_id(),
        public_key: gateway.key.public_key(),
        client,
    };
    if chunked {
        let mut reader = gateway
            .key
            .server()
            .clone()
            .decapsulate_stream(futures_util::io::Cursor::new(sealed_bytes.to_vec()));
        let mut plain = Vec::new();
        reader
            .read_to_end(&mut plain)
            .await
            .map_err(|_| undecryptable())?;
        let inner = admit(gateway, &sealed_bytes, &plain, sealed)?;
        let response = dispatch(app, inner).await;
        let pending = stream::Pending::default();
        let writer = reader.response(pending.clone()).map_err(|err| {
            tracing::error!(error = %err, "ohttp: the chunked response could not start");
            ApiError::internal("the sealed response could not be made")
        })?;
        Ok(outer(
            CHUNKED_RESPONSE_TYPE,
            stream::seal_streaming(writer, pending, response),
        ))
    } else {
        let (plain, responder) = gateway
            .key
            .server()
            .decapsulate(&sealed_bytes)
            .map_err(|_| undecryptable())?;
        let inner = admit(gateway, &sealed_bytes, &plain, sealed)?;
        let response = dispatch(app, inner).await;
        let (head, body) = response.into_parts();
        // Bodies are bounded by the router's own limits; an event stream is sealed once whole.
        let content = body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        let head = Response::from_parts(head, ());
        let encoded = message::encode_response(&head, &content).map_err(ApiError::internal)?;
        let sealed_response = responder.encapsulate(&encoded).map_err(|err| {
            tracing::error!(error = %err, "ohttp: the response could not be sealed");
            ApiError::internal("the sealed response could not be made")
        })?;
        Ok(outer(RESPONSE_TYPE, full(sealed_response)))
    }
}

/// Whether the request asks for a chunked answer; 415 for anything but the two media types.
fn media_type(headers: &http::HeaderMap) -> Result<bool, ApiError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match value.as_deref() {
        Some(REQUEST_TYPE) => Ok(false),
        Some(CHUNKED_REQUEST_TYPE) => Ok(true),
        other => Err(ApiError::unsupported_media_type(
            other
                .map(|media| {
                    let shown: String = media.chars().take(64).collect();
                    format!("{shown} (expected {REQUEST_TYPE} or {CHUNKED_REQUEST_TYPE})")
                })
                .as_deref(),
        )),
    }
}

fn undecryptable() -> ApiError {
    ApiError::invalid_request(
        "the encapsulated request could not be opened: it is malformed, was altered on the way, or was sealed to another key configuration (fetch /.well-known/ohttp-gateway again)",
    )
}

/// The replay checks and the inner request, or the refusal. A replay is refused in plain text
/// (whoever replays it learns nothing it did not already know); a request without a usable
/// `Date` gets a sealed 400 carrying the gateway's `Date` (RFC 9458 §6.5), so that the client
/// can correct its clock.
fn admit(
    gateway: &Gateway,
    sealed_bytes: &[u8],
    plain: &[u8],
    sealed: Sealed,
) -> Result<Inner, ApiError> {
    let enc = sealed_bytes
        .get(HEADER_LEN..HEADER_LEN + PUBLIC_KEY_LEN)
        .ok_or_else(undecryptable)?;
    let request = match message::decode_request(plain) {
        Ok(request) => request,
        Err(reason) => return Ok(Inner::Refused(ApiError::invalid_request(reason))),
    };
    let date = request
        .headers()
        .get(header::DATE)
        .and_then(|value| value.to_str().ok());
    if let Err(reason) = replay::check_date(date, SystemTime::now()) {
        return Ok(Inner::Refused(ApiError::invalid_request(reason)));
    }
    let key: [u8; 32] = Sha256::digest(enc).into();
    match gateway.replay.admit(key, sealed.client, Instant::now()) {
        Ok(()) => {}
        Err(Refusal::Replayed) => {
            return Err(ApiError::invalid_request(
                "this encapsulated request was received before: a replay is refused",
            ));
        }
        Err(Refusal::Full) => {
            return Err(ApiError::rate_limited(
                "too many Oblivious HTTP requests within the replay window; retry later",
                1,
            ));
        }
    }
    if request.uri().path() == GATEWAY_PATH {
        return Ok(Inner::Refused(ApiError::invalid_request(
            "an Oblivious HTTP request cannot carry another one",
        )));
    }
    let mut request = request.map(http_body_util::Full::new);
    request.extensions_mut().insert(sealed);
    Ok(Inner::Request(request))
}

/// An opened request, or the sealed refusal it gets.
enum Inner {
    Request(Request<http_body_util::Full<Bytes>>),
    Refused(ApiError),
}

/// Serves the inner request with the router, in-process.
async fn dispatch(app: &Arc<App>, inner: Inner) -> Response<Body> {
    let mut response = match inner {
        Inner::Request(request) => match Arc::clone(app).handle(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Inner::Refused(err) => refused(app, err).await,
    };
    let now = httpdate::fmt_http_date(SystemTime::now());
    if let Ok(value) = HeaderValue::from_str(&now) {
        response.headers_mut().insert(header::DATE, value);
    }
    response
}

/// A sealed refusal, recorded in the audit log like any refused `/v1` request (fail closed: a
/// refusal whose record cannot be written answers 503).
async fn refused(app: &App, err: ApiError) -> Response<Body> {
    let ctx = RequestContext {
        request_id: uuid::Uuid::new_v4().to_string(),
        client_request_id: None,
        arrived: Instant::now(),
        ohttp: true,
    };
    let mut response = err.into_response();
    let recorded = match super::audit::check_available(app) {
        Ok(()) => {
            super::audit::record_answered(app, &ctx, "anonymous", GATEWAY_PATH, response.status())
                .await
        }
        Err(err) => Err(err),
    };
    match recorded {
        Ok(receipt) => super::receipt::add_headers(&mut response, receipt),
        Err(err) => response = err.into_response(),
    }
    if let Ok(value) = HeaderValue::from_str(&ctx.request_id) {
        response.headers_mut().insert(super::app::REQUEST_ID, value);
    }
    response
}

fn outer(media_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
