//! `inferno proxy --listen 127.0.0.1:PORT --upstream https://HOST:PORT --policy CLIENT.toml`:
//! a local plain-HTTP OpenAI endpoint for unmodified clients. No byte of a request is forwarded
//! on an upstream TLS connection before it is verified: the first connection in full
//! (certificate evidence, fresh evidence bound to that connection, client policy); later ones
//! reuse that verification while they present the same certificate and it is younger than
//! `--reverify-after` (concurrent first requests wait for one verification instead of each
//! spending one of the server's attestation challenges), and a connection presenting another
//! certificate is verified in full again. When verification fails the proxy answers 502 with
//! the reason as OpenAI error JSON, and it serves again as soon as a verification passes. Bodies
//! stream through unbuffered, and each response names what was verified in
//! `inferno-verified-measurement` and `inferno-verified-model`. Downstream connections are
//! bounded, cut when their headers are slow or they idle (`crate::netlimits`), and running out
//! of file descriptors backs off instead of exiting.
//!
//! With `--ohttp` (`sealed`) every request is sealed to the attested Oblivious HTTP
//! key instead, so the server may sit behind a TLS-terminating gateway or an Oblivious relay.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use anyhow::Context as _;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use inferno_client::{Client, ClientError, Target, VerificationCache};
use tokio::net::TcpListener;

use crate::netlimits::{self, Acceptor};

mod sealed;

/// How many downstream connections are served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 1024;

/// The response header naming the verified launch measurement.
pub const VERIFIED_MEASUREMENT_HEADER: &str = "inferno-verified-measurement";
/// The response header naming the verified model digest.
pub const VERIFIED_MODEL_HEADER: &str = "inferno-verified-model";

/// Headers that belong to one hop and are not forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Arguments of `inferno proxy`.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// The local address to serve plain HTTP on (keep it on loopback).
    #[arg(long)]
    listen: SocketAddr,
    /// The Inferno server: `https://HOST:PORT`.
    #[arg(long)]
    upstream: String,
    /// The client policy (TOML) every upstream connection must pass.
    #[arg(long)]
    policy: PathBuf,
    /// An offline collateral bundle (`inferno attest bundle`) for the vendor chains.
    #[arg(long)]
    collateral: Option<PathBuf>,
    /// How long (seconds) one verification is reused for new upstream connections presenting
    /// the same certificate; after that, and on any other certificate, a connection is verified
    /// again in full.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    reverify_after: u64,
    /// Seal every request with Oblivious HTTP (RFC 9458) to the gateway key the server's
    /// evidence names; `--upstream` may then be a TLS-terminating gateway (`https://` or
    /// `http://` origin) in front of the server.
    #[arg(long)]
    ohttp: bool,
    /// An Oblivious relay resource that forwards the sealed requests (with `--ohttp`).
    #[arg(long, requires = "ohttp")]
    relay: Option<String>,
}

/// Runs `inferno proxy` until interrupted.
pub fn run(args: ProxyArgs) -> ExitCode {
    super::init_tracing();
    if args.ohttp {
        return sealed::run(&args);
    }
    let prepared = super::verify::load_client(&args.policy, args.collateral.as_deref())
        .and_then(|client| Ok((client, Target::parse(&args.upstream)?)));
    let (client, target) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => return super::fail(&err),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return super::fail(&err.into()),
    };
    warn_off_loopback(args.listen);
    let cache = VerificationCache::new(std::time::Duration::from_secs(args.reverify_after));
    let upstream = Upstream::new(client, target, cache);
    let banner = format!(
        "upstream: {} (client policy {:?})",
        upstream.target,
        upstream.client.policy().policy.name
    );
    match runtime.block_on(serve(args.listen, banner, upstream, Upstream::forward)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

/// Warns when the proxy's plain-HTTP side is not on loopback.
fn warn_off_loopback(listen: SocketAddr) {
    if !listen.ip().is_loopback() {
        tracing::warn!(
            %listen,
            "not a loopback address: the hop from clients to this proxy is plain HTTP, unencrypted and unauthenticated"
        );
    }
}

/// Serves plain HTTP on `listen`, answering every request with `forward(upstream, request)`.
async fn serve<U, F, Fut>(
    listen: SocketAddr,
    banner: String,
    upstream: Arc<U>,
    forward: F,
) -> anyhow::Result<()>
where
    U: Send + Sync + 'static,
    F: Fn(Arc<U>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    eprintln!("{banner}");
    eprintln!("listening: http://{local}");
    let acceptor = Acceptor::new(listener, MAX_CONNECTIONS);
    loop {
        let accepted = tokio::select! {
            accepted = acceptor.accept() => accepted,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let upstream = Arc::clone(&upstream);
        tokio::spawn(async move {
            let _permit = accepted.permit;
            let peer = accepted.peer;
            let service = hyper::service::service_fn(move |request| {
                let upstream = Arc::clone(&upstream);
                async move { Ok::<_, std::convert::Infallible>(forward(upstream, request).await) }
            });
            if let Err(err) = netlimits::http1_builder()
                .serve_connection(TokioIo::new(accepted.stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "downstream connection ended with an error");
            }
        });
    }
}

/// The body of every answer: the upstream's, passed through, or the proxy's own.
type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// One verified upstream connection, idle or in use.
struct Pooled {
    sender: SendRequest<Incoming>,
    measurement: HeaderValue,
    model: HeaderValue,
}

/// The upstream server, its last verification and its verified idle connections.
struct Upstream {
    client: Client,
    target: Target,
    verified: VerificationCache,
    idle: Mutex<Vec<Pooled>>,
}

impl Upstream {
    fn new(client: Client, target: Target, verified: VerificationCache) -> Arc<Self> {
        Arc::new(Self {
            client,
            target,
            verified,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Forwards one request over a verified connection, or answers 502.
    async fn forward(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let mut request = match self.upstream_request(request) {
            Ok(request) => request,
            Err(message) => {
                return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message);
            }
        };
        // A pooled connection the server has closed meanwhile gives the request back unsent;
        // it then goes to a freshly verified connection.
        for _ in 0..2 {
            let mut pooled = match self.acquire().await {
                Ok(pooled) => pooled,
                Err(err) => return verification_failure(&err),
            };
            match pooled.sender.try_send_request(request).await {
                Ok(response) => return self.respond(response, pooled),
                Err(mut err) => match err.take_message() {
                    Some(unsent) => request = unsent,
                    None => {
                        return error_response(
                            StatusCode::BAD_GATEWAY,
                            "upstream_error",
                            &format!("the verified upstream connection failed: {}", err.error()),
                        );
                    }
                },
            }
        }
        error_response(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "the upstream closed two verified connections before the request was sent",
        )
    }

    fn upstream_request(&self, request: Request<Incoming>) -> Result<Request<Incoming>, String> {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        parts.uri = path
            .parse()
            .map_err(|e| format!("bad request target: {e}"))?;
        parts.version = http::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(
            header::HOST,
            HeaderValue::from_str(&self.target.authority()).map_err(|e| e.to_string())?,
        );
        Ok(Request::from_parts(parts, body))
    }

    /// An idle verified connection, or a new one verified now (or covered by the last
    /// verification of the same certificate).
    async fn acquire(&self) -> Result<Pooled, ClientError> {
        loop {
            let candidate = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            let Some(mut pooled) = candidate else { break };
            if pooled.sender.ready().await.is_ok() {
                return Ok(pooled);
            }
        }
        let connection = self
            .client
            .connect_cached(&self.target, &self.verified)
            .await?;
        let report = &connection.report;
        tracing::info!(
            upstream = %self.target,
            measurement = report.measurement.as_deref().unwrap_or(""),
            model = report.model_digest.as_deref().unwrap_or(""),
            simulated = report.simulated,
            "upstream connection verified"
        );
        let header = |value: &Option<String>| {
            HeaderValue::from_str(value.as_deref().unwrap_or(""))
                .unwrap_or(HeaderValue::from_static(""))
        };
        let measurement = header(&report.measurement);
        let model = header(&report.model_digest);
        let (sender, driver) =
            hyper::client::conn::http1::handshake(TokioIo::new(connection.stream))
                .await
                .map_err(|e| ClientError::Connect {
                    target: self.target.to_string(),
                    reason: e.to_string(),
                })?;
        tokio::spawn(async move {
            if let Err(err) = driver.await {
                tracing::debug!(error = %err, "upstream connection ended with an error");
            }
        });
        Ok(Pooled {
            sender,
            measurement,
            model,
        })
    }

    fn release(&self, pooled: Pooled) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(pooled);
        }
    }

    /// The upstream response with the verified headers; its connection returns to the pool once
    /// the body has been passed on in full.
    fn respond(
        self: Arc<Self>,
        response: Response<Incoming>,
        pooled: Pooled,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(
            HeaderName::from_static(VERIFIED_MEASUREMENT_HEADER),
            pooled.measurement.clone(),
        );
        parts.headers.insert(
            HeaderName::from_static(VERIFIED_MODEL_HEADER),
            pooled.model.clone(),
        );
        let body = ReleaseOnEnd {
            inner: body,
            release: Some((pooled, self)),
        };
        Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
    }
}

/// Passes the upstream body through frame by frame; at its end the connection goes back to the
/// pool (a body dropped early drops the connection with it).
struct ReleaseOnEnd {
    inner: Incoming,
    release: Option<(Pooled, Arc<Upstream>)>,
}

impl Body for ReleaseOnEnd {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // A body of known length ends with its last frame: the server above stops polling once
        // `is_end_stream` says so, so the end is checked after every frame, not only at `None`.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended && let Some((pooled, upstream)) = this.release.take() {
            upstream.release(pooled);
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

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

fn verification_failure(err: &ClientError) -> Response<ProxyBody> {
    tracing::warn!(error = %err, "upstream not verified; answering 502");
    // A server that answers no usable evidence is as unverified as one whose evidence fails.
    let code = match err {
        ClientError::Rejected { .. }
        | ClientError::Attestation { .. }
        | ClientError::Ohttp { .. } => "upstream_verification_failed",
        _ => "upstream_unreachable",
    };
    error_response(
        StatusCode::BAD_GATEWAY,
        code,
        &format!("inferno proxy: upstream not verified, nothing was sent: {err}"),
    )
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": if status == StatusCode::BAD_REQUEST { "invalid_request_error" } else { "upstream_error" },
            "param": null,
            "code": code,
        }
    })
    .to_string();
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
