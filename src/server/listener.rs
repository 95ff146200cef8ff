//! The TLS accept loop: a connection limit, handshake and header timeouts, HTTP/1.1 or HTTP/2
//! by ALPN, and graceful draining on shutdown.

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use inferno_attestation::runtime_data::{TLS_EXPORTER_LABEL, TLS_EXPORTER_LEN};

use super::app::{App, RequestContext};
use super::attestation::ConnectionExporter;

/// How often an idle HTTP/2 connection is pinged, and how long the ping may go unanswered.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// Accepts connections until `shutdown` turns true, then lets open connections finish within
/// `grace` and aborts the rest.
pub async fn run(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Arc<App>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let limits = app.config().limits.clone();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let handshake_timeout = limits.header_read_timeout();
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = stopped(&mut shutdown) => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => break,
        };
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "set_nodelay failed");
        }
        let acceptor = acceptor.clone();
        let app = Arc::clone(&app);
        let watcher = graceful.watcher();
        let header_timeout = limits.header_read_timeout();
        connections.spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(H2_KEEPALIVE)
                .keep_alive_timeout(H2_KEEPALIVE)
                .max_concurrent_streams(256);
            let builder = if h2 {
                builder.http2_only()
            } else {
                builder.http1_only()
            };
            // The exporter of this connection, for channel-bound fresh evidence.
            let exporter = tls
                .get_ref()
                .1
                .export_keying_material([0u8; TLS_EXPORTER_LEN], TLS_EXPORTER_LABEL, None)
                .map(ConnectionExporter)
                .map_err(|err| tracing::warn!(%peer, error = %err, "no TLS exporter"))
                .ok();
            let auditing = Arc::clone(&app);
            let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                if let Some(exporter) = exporter {
                    request.extensions_mut().insert(exporter);
                }
                Arc::clone(&app).handle(request)
            });
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(err) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
                if let Some(status) = parser_refusal(err.as_ref()) {
                    record_parser_refusal(&auditing, status).await;
                }
            }
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(open_connections = open, "stopped accepting; draining");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "in-flight requests did not finish in time; closing their connections"
        );
        connections.abort_all();
    }
    while connections.join_next().await.is_some() {}
}

/// The status hyper's HTTP/1 parser answered a malformed request with, if that ended the
/// connection: 431 for headers over the limit, 400 for anything else it could not parse.
fn parser_refusal(err: &(dyn std::error::Error + 'static)) -> Option<http::StatusCode> {
    let err = err.downcast_ref::<hyper::Error>()?;
    if err.is_parse_too_large() {
        Some(http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    } else if err.is_parse() {
        Some(http::StatusCode::BAD_REQUEST)
    } else {
        None
    }
}

/// Records a request that hyper's parser refused (issue 14, defect 8.2). hyper writes that
/// response itself, without a hook, so this record follows the response instead of preceding it
/// (and its body is hyper's, empty); the request had no method, path or caller that parsed.
async fn record_parser_refusal(app: &App, status: http::StatusCode) {
    let ctx = RequestContext {
        request_id: uuid::Uuid::new_v4().to_string(),
        client_request_id: None,
        arrived: std::time::Instant::now(),
        ohttp: false,
    };
    if let Err(err) =
        super::audit::record_answered(app, &ctx, "anonymous", UNPARSED_ENDPOINT, status).await
    {
        tracing::error!(status = status.as_u16(), error = ?err, "audit: parser refusal not recorded");
    }
}

/// The endpoint recorded for a request whose request line or headers did not parse.
pub const UNPARSED_ENDPOINT: &str = "(unparsed)";

/// Resolves once the shutdown flag is set (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender was dropped, which also means stop.
    let _ = shutdown.wait_for(|stop| *stop).await;
}
