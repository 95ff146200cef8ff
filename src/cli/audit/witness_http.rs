//! The witness over HTTP: `POST /add-checkpoint` with the request and response formats of
//! `c2sp.org/tlog-witness`.
//!
//! Request body: `old <size>\n`, one base64 consistency-proof hash per line, a blank line, then
//! the checkpoint (signed note). Responses: 200 with the cosignature line; 409 with the
//! witness's size (`text/x.tlog.size`) when `old` is not it; 403 when the log signature does not
//! verify under any known log key; 404 for another log's origin; 422 when the consistency proof
//! fails (a fork); 400 for malformed requests and rollbacks.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use inferno_audit::note::{NoteSigner, SignedNote, VerifierKey};
use inferno_audit::{ConsistencyProof, WitnessError, add_checkpoint};

/// The largest request body accepted.
const MAX_BODY: usize = 64 << 10;

/// What the HTTP witness needs.
pub struct HttpWitness {
    /// The witness's signing key.
    pub signer: NoteSigner,
    /// The witness state file.
    pub state: PathBuf,
    /// A file of log verifier keys, one per line, re-read for every request (append the key of
    /// each new appliance run after checking its attestation).
    pub log_keys: PathBuf,
}

impl std::fmt::Debug for HttpWitness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWitness")
            .field("state", &self.state)
            .field("log_keys", &self.log_keys)
            .finish_non_exhaustive()
    }
}

/// Parses an add-checkpoint request body.
pub fn parse_request(body: &str) -> Result<(ConsistencyProof, SignedNote), String> {
    let (head, note) = body
        .split_once("\n\n")
        .ok_or("expected the proof, a blank line and the checkpoint")?;
    let mut lines = head.lines();
    let old = lines
        .next()
        .and_then(|l| l.strip_prefix("old "))
        .ok_or("the first line must be `old <size>`")?
        .parse::<u64>()
        .map_err(|_| "`old` is not a number")?;
    let hashes = lines
        .map(|l| {
            B64.decode(l)
                .ok()
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| format!("{l:?} is not a base64 SHA-256 hash"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let note = SignedNote::parse(note).map_err(|e| e.to_string())?;
    let new = note.checkpoint().map_err(|e| e.to_string())?.size;
    Ok((ConsistencyProof { old, new, hashes }, note))
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    reply(status, "text/plain; charset=utf-8", body.into())
}

impl HttpWitness {
    fn log_keys(&self) -> Result<Vec<VerifierKey>, String> {
        let text = std::fs::read_to_string(&self.log_keys)
            .map_err(|e| format!("{}: {e}", self.log_keys.display()))?;
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| VerifierKey::parse(l).map_err(|e| format!("log key {l:?}: {e}")))
            .collect()
    }

    /// Handles one add-checkpoint request body.
    pub fn add(&self, body: &str, now_unix: u64) -> Response<Full<Bytes>> {
        let (proof, note) = match parse_request(body) {
            Ok(x) => x,
            Err(e) => return text(StatusCode::BAD_REQUEST, e),
        };
        let keys = match self.log_keys() {
            Ok(k) => k,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e),
        };
        let Some(key) = keys.iter().find(|k| k.verify(&note).is_ok()) else {
            return text(
                StatusCode::FORBIDDEN,
                "no known log key signed this checkpoint",
            );
        };
        // With no state yet, the first checkpoint must be cosigned from files (`--init`).
        match add_checkpoint(
            &self.state,
            &self.signer,
            &note,
            key,
            Some(&proof),
            false,
            now_unix,
        ) {
            Ok(cosigned) => {
                let mine = self.signer.verifier();
                let line = cosigned
                    .render()
                    .lines()
                    .find(|l| l.starts_with(&format!("\u{2014} {} ", mine.name)))
                    .map(|l| format!("{l}\n"))
                    .unwrap_or_default();
                text(StatusCode::OK, line)
            }
            Err(WitnessError::Conflict { have, .. }) => reply(
                StatusCode::CONFLICT,
                "text/x.tlog.size",
                format!("{have}\n"),
            ),
            Err(e @ WitnessError::Signature(_)) => text(StatusCode::FORBIDDEN, e.to_string()),
            Err(e @ WitnessError::UnknownOrigin { .. }) => {
                text(StatusCode::NOT_FOUND, e.to_string())
            }
            Err(e @ WitnessError::Fork(_)) => text(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            Err(e @ (WitnessError::Rollback { .. } | WitnessError::NoState)) => {
                text(StatusCode::BAD_REQUEST, e.to_string())
            }
            Err(e @ WitnessError::Io(_)) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

async fn handle(
    witness: Arc<Mutex<HttpWitness>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if request.uri().path() != "/add-checkpoint" {
        return Ok(text(StatusCode::NOT_FOUND, "not found"));
    }
    if request.method() != Method::POST {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "use POST"));
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(text(StatusCode::PAYLOAD_TOO_LARGE, "request too large")),
    };
    let Ok(body) = std::str::from_utf8(&body) else {
        return Ok(text(StatusCode::BAD_REQUEST, "body is not UTF-8"));
    };
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let now = u64::try_from(now).unwrap_or(0);
    // One request at a time: each one reads and replaces the state file.
    let response = match witness.lock() {
        Ok(w) => w.add(body, now),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "witness state lock poisoned",
        ),
    };
    Ok(response)
}

/// Serves the witness on `listener` until the process ends.
pub async fn serve(listener: TcpListener, witness: HttpWitness) -> std::io::Result<()> {
    let witness = Arc::new(Mutex::new(witness));
    loop {
        let (stream, peer) = listener.accept().await?;
        let witness = Arc::clone(&witness);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(Arc::clone(&witness), r));
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "witness connection ended");
            }
        });
    }
}
