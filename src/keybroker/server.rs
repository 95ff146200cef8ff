//! `inferno keybroker`: the HTTP server side of the key-release exchange
//! ([`super::protocol`]). Every release and every refusal is durable in the broker's own audit
//! log before the answer leaves.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use inferno_attestation::appraise::{AppraisalInput, Expectations, appraise_with};
use inferno_attestation::evidence::Evidence;
use inferno_audit::{AuditSink, SecurityEvent};
use ring::rand::{SecureRandom as _, SystemRandom};
use tokio::net::TcpListener;
use zeroize::Zeroize as _;

use super::policy::ReleasePolicy;
use super::protocol::{
    ATTEST_PATH, AUTH_PATH, AttestRequest, AuthRequest, AuthResponse, ErrorBody, ErrorDetail,
    MAX_REQUEST_BYTES, NONCE_LEN, PROTOCOL_VERSION, RELEASE_INFO, ReleaseResponse,
};
use crate::seal::recipient::{self, RecipientKey, RecipientSecret};

/// The broker's private key file in `--keys DIR` (raw 32 bytes, mode 0600).
pub const SECRET_FILE: &str = "broker.key";
/// The broker's public key file in `--keys DIR` (hex): what `inferno seal --recipient` reads.
pub const PUBLIC_FILE: &str = "broker.pub";
/// How long a challenge stays valid unless told otherwise.
pub const DEFAULT_CHALLENGE_TTL: Duration = Duration::from_secs(60);
/// The most outstanding challenges; more are refused (503) until some expire or are used.
pub const MAX_SESSIONS: usize = 1024;

/// Reads the broker's key pair from `dir`, or creates it (the directory 0700, the secret 0600)
/// when absent. Returns the pair and whether it was created.
pub fn load_or_create_keys(
    dir: &Path,
) -> Result<(RecipientSecret, RecipientKey, bool), anyhow::Error> {
    use anyhow::Context as _;
    let secret_path = dir.join(SECRET_FILE);
    let public_path = dir.join(PUBLIC_FILE);
    if secret_path.exists() {
        let mode = std::fs::metadata(&secret_path)
            .with_context(|| format!("{}", secret_path.display()))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{}: mode {mode:04o} lets others read it; it must be 0600",
                secret_path.display()
            );
        }
        let mut bytes = std::fs::read(&secret_path)
            .with_context(|| format!("cannot read {}", secret_path.display()))?;
        let secret = RecipientSecret::from_bytes(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", secret_path.display()));
        bytes.zeroize();
        let secret = secret?;
        let public = secret.public();
        return Ok((secret, public, false));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let (secret, public) = RecipientSecret::generate();
    crate::seal::write_private_file(&secret_path, &secret.to_bytes())
        .with_context(|| format!("cannot create {}", secret_path.display()))?;
    std::fs::write(&public_path, format!("{}\n", public.to_hex()))
        .with_context(|| format!("cannot write {}", public_path.display()))?;
    Ok((secret, public, true))
}

struct Session {
    nonce: [u8; NONCE_LEN],
    request: AuthRequest,
    issued: Instant,
}

/// The key broker: its key pair, release policy, audit log and outstanding challenges.
pub struct Broker {
    secret: RecipientSecret,
    public: RecipientKey,
    policy: ReleasePolicy,
    audit: AuditSink,
    sessions: Mutex<HashMap<String, Session>>,
    challenge_ttl: Duration,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("public", &self.public.to_hex())
            .field("policy", &self.policy.digest)
            .field("challenge_ttl", &self.challenge_ttl)
            .finish_non_exhaustive()
    }
}

/// A refusal: HTTP status, error type and one-line message.
struct Refusal {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    fn policy(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "policy_refused", message)
    }
}

impl Broker {
    /// A broker releasing under `policy`, auditing to `audit`.
    pub fn new(
        secret: RecipientSecret,
        policy: ReleasePolicy,
        audit: AuditSink,
        challenge_ttl: Duration,
    ) -> Self {
        let public = secret.public();
        Self {
            secret,
            public,
            policy,
            audit,
            sessions: Mutex::new(HashMap::new()),
            challenge_ttl,
        }
    }

    /// The broker's public key (what models are sealed to).
    pub fn public_key(&self) -> &RecipientKey {
        &self.public
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditSink {
        &self.audit
    }

    fn auth(&self, request: AuthRequest) -> Result<AuthResponse, Refusal> {
        let invalid = |m: String| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", m);
        if request.version != PROTOCOL_VERSION {
            return Err(invalid(format!(
                "protocol version {:?} is not {PROTOCOL_VERSION:?}",
                request.version
            )));
        }
        if !matches!(request.tee.as_str(), "sev-snp" | "tdx") {
            return Err(invalid(format!("unknown tee {:?}", request.tee)));
        }
        if request.model_id.is_empty() || request.model_id.len() > 256 {
            return Err(invalid("model_id must be 1..=256 bytes".into()));
        }
        if request.key_id.len() != 32 || !request.key_id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("key_id must be 16 bytes of hex".into()));
        }
        let rng = SystemRandom::new();
        let mut nonce = [0u8; NONCE_LEN];
        let mut session = [0u8; 16];
        rng.fill(&mut nonce)
            .and_then(|()| rng.fill(&mut session))
            .map_err(|_| {
                Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "no randomness",
                )
            })?;
        let session = hex::encode(session);
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.challenge_ttl;
        sessions.retain(|_, s| s.issued.elapsed() <= ttl);
        if sessions.len() >= MAX_SESSIONS {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many outstanding challenges; retry later",
            ));
        }
        sessions.insert(
            session.clone(),
            Session {
                nonce,
                request,
                issued: Instant::now(),
            },
        );
        Ok(AuthResponse {
            session,
            nonce: hex::encode(nonce),
            expires_in_seconds: ttl.as_secs(),
        })
    }

    /// Judges an attestation request; `Ok` holds the response and what allowed the release.
    fn judge(
        &self,
        session: Session,
        request: &AttestRequest,
    ) -> Result<(ReleaseResponse, String), Refusal> {
        let invalid = |m: String| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", m);
        let key_id = &session.request.key_id;
        let tee_key = RecipientKey::from_hex(&request.tee_pubkey)
            .map_err(|e| invalid(format!("tee_pubkey: {e}")))?;
        let evidence: Evidence = serde_json::from_value(request.evidence.clone())
            .map_err(|e| invalid(format!("evidence: {e}")))?;
        let report = appraise_with(
            &AppraisalInput {
                evidence: &evidence,
                policy: &self.policy.appraisal,
                collateral: self.policy.collateral.as_ref(),
                now: time::OffsetDateTime::now_utc(),
                clock_floor: None,
                gpu_ready_pending: false,
            },
            &Expectations {
                nonce: Some(&session.nonce),
                tls_exporter: None,
            },
        );
        if !report.passed() {
            let reasons = report
                .failures()
                .map(|c| format!("{}: {}", c.id, c.reason))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(Refusal::policy(format!(
                "evidence rejected by attestation policy {:?}: {reasons}",
                report.policy_name
            )));
        }
        let doc = report
            .claims
            .runtime_data
            .as_ref()
            .ok_or_else(|| Refusal::policy("the evidence binds no runtime data"))?;
        if doc.key_release_x25519.as_deref() != Some(tee_key.to_hex().as_str()) {
            return Err(Refusal::policy(
                "the evidence does not bind tee_pubkey as key_release_x25519",
            ));
        }
        let rule = self.policy.rule(&session.request.model_id).ok_or_else(|| {
            Refusal::policy(format!(
                "model {:?} is not released by this broker",
                session.request.model_id
            ))
        })?;
        let allowed = rule.allows(key_id, &report).map_err(Refusal::policy)?;
        if request.wrapped_key.recipient != self.public.to_hex() {
            return Err(Refusal::policy(format!(
                "the model was sealed for key broker {}, not this one ({})",
                request.wrapped_key.recipient,
                self.public.to_hex()
            )));
        }
        let key = recipient::unwrap(&request.wrapped_key, &self.secret, key_id)
            .map_err(|e| Refusal::policy(e.to_string()))?;
        let sealed = recipient::wrap_with_info(&key, &tee_key, RELEASE_INFO).map_err(|e| {
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        drop(key);
        let simulated = if report.simulated {
            ", SIMULATED TEE"
        } else {
            ""
        };
        Ok((
            ReleaseResponse {
                key_id: key_id.clone(),
                key: sealed,
            },
            format!(
                "{allowed}, appraised under {:?}{simulated}",
                report.policy_name
            ),
        ))
    }

    async fn attest(&self, request: AttestRequest) -> Result<ReleaseResponse, Refusal> {
        let session = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request.session);
        let (key_id, subject) = match &session {
            Some(s) => (
                s.request.key_id.clone(),
                format!("model {:?} session {}", s.request.model_id, request.session),
            ),
            None => (
                "unknown".to_owned(),
                format!("session {:?}", request.session),
            ),
        };
        let outcome = match session {
            None => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "invalid_session",
                "unknown or already used session: a challenge answers one attestation only",
            )),
            Some(s) if s.issued.elapsed() > self.challenge_ttl => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "invalid_session",
                format!(
                    "the challenge expired ({} s old, valid for {} s)",
                    s.issued.elapsed().as_secs(),
                    self.challenge_ttl.as_secs()
                ),
            )),
            Some(s) => self.judge(s, &request),
        };
        let (released, reason) = match &outcome {
            Ok((_, allowed)) => (true, format!("{subject}: released: {allowed}")),
            Err(refusal) => (false, format!("{subject}: refused: {}", refusal.message)),
        };
        let record = self
            .audit
            .event(SecurityEvent::KeyRelease {
                key_id,
                released,
                reason: reason.clone(),
            })
            .await;
        tracing::info!(released, %reason, "key release");
        match (outcome, record) {
            (Ok((response, _)), Ok(_)) => Ok(response),
            (Ok(_), Err(err)) => Err(Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the audit record failed, so nothing is released: {err}"),
            )),
            (Err(refusal), Ok(_)) => Err(refusal),
            (Err(refusal), Err(err)) => {
                tracing::error!(error = %err, "the audit record of a refusal failed");
                Err(refusal)
            }
        }
    }
}

fn json_reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn refusal_reply(refusal: Refusal) -> Response<Full<Bytes>> {
    let body = ErrorBody {
        error: ErrorDetail {
            message: refusal.message,
            kind: refusal.kind.to_owned(),
        },
    };
    json_reply(
        refusal.status,
        serde_json::to_vec(&body).unwrap_or_default(),
    )
}

async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Refusal> {
    let invalid = |m: String| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", m);
    let body = Limited::new(request.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|_| {
            Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!("the body is over {MAX_REQUEST_BYTES} bytes or unreadable"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| invalid(format!("malformed JSON: {e}")))
}

async fn handle(
    broker: Arc<Broker>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let path = request.uri().path().to_owned();
    if path != AUTH_PATH && path != ATTEST_PATH {
        return Ok(refusal_reply(Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request",
            format!("no such endpoint {path}"),
        )));
    }
    if request.method() != Method::POST {
        return Ok(refusal_reply(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "use POST",
        )));
    }
    let reply = if path == AUTH_PATH {
        match read_json::<AuthRequest>(request).await {
            Ok(auth) => broker.auth(auth).map(|r| serde_json::to_vec(&r)),
            Err(refusal) => Err(refusal),
        }
    } else {
        match read_json::<AttestRequest>(request).await {
            Ok(attest) => {
                let broker = Arc::clone(&broker);
                // Appraisal verifies signatures: off the async workers.
                let judged = tokio::task::spawn_blocking(move || {
                    tokio::runtime::Handle::current().block_on(broker.attest(attest))
                })
                .await;
                match judged {
                    Ok(result) => result.map(|r| serde_json::to_vec(&r)),
                    Err(e) => Err(Refusal::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        format!("the attestation task failed: {e}"),
                    )),
                }
            }
            Err(refusal) => Err(refusal),
        }
    };
    Ok(match reply {
        Ok(Ok(body)) => json_reply(StatusCode::OK, body),
        Ok(Err(e)) => refusal_reply(Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )),
        Err(refusal) => refusal_reply(refusal),
    })
}

/// Serves `broker` on `listener` until `shutdown` resolves (connections in flight are dropped;
/// every answer already sent was audited first).
pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let broker = Arc::clone(&broker);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(Arc::clone(&broker), r));
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "key broker connection ended");
            }
        });
    }
}
