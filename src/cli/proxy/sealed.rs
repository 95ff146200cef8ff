//! `inferno proxy --ohttp --upstream URL [--relay URL]`: the local plain-HTTP endpoint seals
//! every request with Oblivious HTTP (RFC 9458) to the gateway key that the server's fresh
//! evidence names, so whatever terminates TLS in front of the server (a load balancer, an API
//! gateway, an Oblivious relay) sees neither prompt nor answer. Nothing is sealed before the
//! key configuration and the evidence pass the client policy; the verification is reused for
//! `--reverify-after` seconds and redone after any failed exchange (a restarted server has a
//! new key). A request whose JSON body asks for `"stream": true` gets a chunked answer, so
//! server-sent events arrive as they are produced.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use inferno_client::ClientError;
use inferno_client::ohttp::{OhttpClient, VerifiedGateway};

use super::{
    ProxyArgs, ProxyBody, VERIFIED_MEASUREMENT_HEADER, VERIFIED_MODEL_HEADER, error_response,
    serve, strip_hop_by_hop, verification_failure, warn_off_loopback,
};

/// The largest request body sealed (a sealed request is held whole before it is sent).
const MAX_REQUEST_BODY: usize = 32 << 20;

/// Runs the sealing proxy until interrupted.
pub(super) fn run(args: &ProxyArgs) -> ExitCode {
    let client = match crate::cli::verify::load_ohttp_client(
        &args.policy,
        args.collateral.as_deref(),
        &args.upstream,
        args.relay.as_deref(),
    ) {
        Ok(client) => client,
        Err(err) => return crate::cli::fail(&err),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return crate::cli::fail(&err.into()),
    };
    warn_off_loopback(args.listen);
    let banner = format!(
        "upstream: {} (client policy {:?})",
        client.target(),
        client.policy().policy.name
    );
    let sealing = Arc::new(Sealing {
        client,
        verified: tokio::sync::Mutex::new(None),
        max_age: Duration::from_secs(args.reverify_after),
    });
    match runtime.block_on(serve(args.listen, banner, sealing, Sealing::forward)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => crate::cli::fail(&err),
    }
}

/// The gateway, its last verification and the headers naming what it verified.
struct Sealing {
    client: OhttpClient,
    verified: tokio::sync::Mutex<Option<(Verified, Instant)>>,
    max_age: Duration,
}

#[derive(Clone)]
struct Verified {
    gateway: Arc<VerifiedGateway>,
    measurement: HeaderValue,
    model: HeaderValue,
}

impl Sealing {
    /// The verified gateway: the last verification while it is young enough, else a new one
    /// (concurrent callers wait for it instead of each spending a challenge).
    async fn gateway(&self) -> Result<Verified, ClientError> {
        let mut slot = self.verified.lock().await;
        if let Some((verified, at)) = slot.as_ref()
            && at.elapsed() < self.max_age
        {
            return Ok(verified.clone());
        }
        *slot = None;
        let gateway = self.client.verify().await?;
        let report = &gateway.report;
        tracing::info!(
            upstream = %self.client.target(),
            measurement = report.measurement.as_deref().unwrap_or(""),
            model = report.model_digest.as_deref().unwrap_or(""),
            simulated = report.simulated,
            "gateway key verified"
        );
        let header = |value: &Option<String>| {
            HeaderValue::from_str(value.as_deref().unwrap_or(""))
                .unwrap_or(HeaderValue::from_static(""))
        };
        let verified = Verified {
            measurement: header(&report.measurement),
            model: header(&report.model_digest),
            gateway: Arc::new(gateway),
        };
        *slot = Some((verified.clone(), Instant::now()));
        Ok(verified)
    }

    /// Forgets the verification: the next request verifies again.
    async fn forget(&self) {
        *self.verified.lock().await = None;
    }

    /// Seals one request to the verified gateway and passes the opened answer on, or answers
    /// 502 (nothing sealed while the gateway is not verified).
    async fn forward(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!(
                        "the request body could not be read (at most {MAX_REQUEST_BODY} bytes): {err}"
                    ),
                );
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        let chunked = asks_for_stream(&body);
        let request = Request::from_parts(parts, body);
        let verified = match self.gateway().await {
            Ok(verified) => verified,
            Err(err) => return verification_failure(&err),
        };
        let opened = match self.client.send(&verified.gateway, request, chunked).await {
            Ok(opened) => opened,
            Err(err) => {
                self.forget().await;
                tracing::warn!(error = %err, "sealed exchange failed");
                return error_response(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    &format!("inferno proxy: the sealed exchange failed: {err}"),
                );
            }
        };
        let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(opened.body.map(
            |chunk| {
                chunk
                    .map(Frame::data)
                    .map_err(|err| Box::new(err) as Box<dyn std::error::Error + Send + Sync>)
            },
        ))));
        *response.status_mut() = opened.status;
        *response.headers_mut() = opened.headers;
        let headers = response.headers_mut();
        strip_hop_by_hop(headers);
        headers.remove(http::header::TRANSFER_ENCODING);
        headers.remove(http::header::CONTENT_LENGTH);
        headers.insert(
            HeaderName::from_static(VERIFIED_MEASUREMENT_HEADER),
            verified.measurement,
        );
        headers.insert(
            HeaderName::from_static(VERIFIED_MODEL_HEADER),
            verified.model,
        );
        response
    }
}

/// Whether a JSON request body asks for a streamed answer (`"stream": true`).
fn asks_for_stream(body: &Bytes) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value.get("stream").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_json_stream_true_asks_for_a_chunked_answer() {
        assert!(asks_for_stream(&Bytes::from_static(br#"{"stream": true}"#)));
        assert!(!asks_for_stream(&Bytes::from_static(
            br#"{"stream": false}"#
        )));
        assert!(!asks_for_stream(&Bytes::from_static(br#"{"model": "m"}"#)));
        assert!(!asks_for_stream(&Bytes::from_static(b"not json")));
    }
}
