//! `inferno keybroker`: the HTTP server side of the key-release exchange
//! ([`super::protocol`]). Every release, and every refusal of an attestation that answers a
//! live challenge, is durable in the broker's own audit log before the answer leaves. Requests
//! refused before that point (unknown sessions, malformed bodies, challenge limits) are counted
//! per client address and written as one record per address and window ("N refusals from ADDR
//! in the last 60 s"), so junk costs no durable write each and is not silent either.
//!
//! Limits against one client starving the others: at most [`MAX_SESSIONS_PER_CLIENT`]
//! outstanding challenges per client address and [`MAX_SESSIONS`] in all; once more than half
//! of those are taken, new challenges live at most [`PRESSURE_CHALLENGE_TTL`]. Connections are
//! bounded and cut when slow or idle, and running out of file descriptors backs off
//! (`crate::netlimits`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
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
use crate::netlimits::{self, Acceptor};
use crate::seal::recipient::{self, RecipientKey, RecipientSecret};

/// The broker's private key file in `--keys DIR` (raw 32 bytes, mode 0600).
pub const SECRET_FILE: &str = "broker.key";
/// The broker's public key file in `--keys DIR` (hex): what `inferno seal --recipient` reads.
pub const PUBLIC_FILE: &str = "broker.pub";
/// How long a challenge stays valid unless told otherwise.
pub const DEFAULT_CHALLENGE_TTL: Duration = Duration::from_secs(60);
/// The most outstanding challenges; more are refused (503) until some expire or are used.
pub const MAX_SESSIONS: usize = 1024;
/// The most outstanding challenges of one client address; more are refused (429).
pub const MAX_SESSIONS_PER_CLIENT: usize = 8;
/// The lifetime of a challenge issued while more than half of [`MAX_SESSIONS`] are outstanding.
pub const PRESSURE_CHALLENGE_TTL: Duration = Duration::from_secs(10);
/// How often the counted refusals are written to the audit log (one record per address).
pub const DEFAULT_REFUSAL_WINDOW: Duration = Duration::from_secs(60);
/// How many client addresses the refusal counts name; refusals from more addresses in one
/// window are counted together.
const MAX_TALLIED_ADDRESSES: usize = 1024;
/// How long a client may take to send a request body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How many connections the broker serves at once.
const MAX_CONNECTIONS: usize = 1024;

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
        let mut bytes = crate::model::files::read_regular(&secret_path)
            .with_context(|| format!("cannot read {}", secret_path.display()))?;
        let secret = RecipientSecret::from_bytes(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", secret_path.display()));
        bytes.zeroize();
        let secret = secret?;
        let public = secret.public();
        return Ok((secret, public, false));
    }
    crate::seal::create_private_dir(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let (secret, public) = RecipientSecret::generate();
    crate::seal::write_private_file(&secret_path, &secret.to_bytes())
        .with_context(|| format!("cannot create {}", secret_path.display()))?;
    crate::seal::write_new_file(
        &public_path,
        format!("{}\n", public.to_hex()).as_bytes(),
        0o644,
    )
    .with_context(|| format!("cannot write {}", public_path.display()))?;
    Ok((secret, public, true))
}

struct Session {
    nonce: [u8; NONCE_LEN],
    request: AuthRequest,
    issued: Instant,
    ttl: Duration,
    client: IpAddr,
}

/// Refusals counted since the last audit record of them: per client address, with the last
/// reason, plus those from addresses beyond [`MAX_TALLIED_ADDRESSES`].
#[derive(Default)]
struct RefusalTally {
    by_address: HashMap<IpAddr, (u64, String)>,
    others: u64,
}

/// The key broker: its key pair, release policy, audit log and outstanding challenges.
pub struct Broker {
    secret: RecipientSecret,
    public: RecipientKey,
    policy: ReleasePolicy,
    audit: AuditSink,
    sessions: Mutex<HashMap<String, Session>>,
    challenge_ttl: Duration,
    refusals: Mutex<RefusalTally>,
    refusal_window: Duration,
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
            refusals: Mutex::new(RefusalTally::default()),
            refusal_window: DEFAULT_REFUSAL_WINDOW,
        }
    }

    /// The same broker writing its refusal counts every `window` instead of every
    /// [`DEFAULT_REFUSAL_WINDOW`].
    pub fn with_refusal_window(mut self, window: Duration) -> Self {
        self.refusal_window = window.max(Duration::from_millis(10));
        self
    }

    /// Counts a refusal of `client` for the next aggregated audit record.
    fn tally(&self, client: IpAddr, reason: &str) {
        let mut tally = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        let tracked = tally.by_address.len() < MAX_TALLIED_ADDRESSES
            || tally.by_address.contains_key(&client);
        if tracked {
            let entry = tally.by_address.entry(client).or_default();
            entry.0 += 1;
            reason.clone_into(&mut entry.1);
        } else {
            tally.others += 1;
        }
    }

    /// Writes the refusals counted since the last call to the audit log: one record per client
    /// address ("N refusals from ADDR in the last ..."), and one for the addresses beyond the
    /// tracked ones.
    pub async fn flush_refusals(&self) {
        let tally = std::mem::take(&mut *self.refusals.lock().unwrap_or_else(|p| p.into_inner()));
        let window = self.refusal_window.as_secs_f64();
        let mut lines: Vec<String> = tally
            .by_address
            .into_iter()
            .map(|(client, (count, last))| {
                format!("{count} refusals from {client} in the last {window:.0} s (last: {last})")
            })
            .collect();
        if tally.others > 0 {
            lines.push(format!(
                "{} refusals from further addresses in the last {window:.0} s",
                tally.others
            ));
        }
        lines.sort();
        for reason in lines {
            tracing::warn!(%reason, "key broker refusals");
            let written = self
                .audit
                .event(SecurityEvent::KeyRelease {
                    key_id: "unknown".to_owned(),
                    released: false,
                    reason,
                })
                .await;
            if let Err(err) = written {
                tracing::error!(error = %err, "the audit record of refusals failed");
            }
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

    fn auth(&self, client: IpAddr, request: AuthRequest) -> Result<AuthResponse, Refusal> {
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
        sessions.retain(|_, s| s.issued.elapsed() <= s.ttl);
        if sessions.values().filter(|s| s.client == client).count() >= MAX_SESSIONS_PER_CLIENT {
            return Err(Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "busy",
                format!(
                    "this client has {MAX_SESSIONS_PER_CLIENT} outstanding challenges; answer or let them expire first"
                ),
            ));
        }
        if sessions.len() >= MAX_SESSIONS {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many outstanding challenges; retry later",
            ));
        }
        let ttl = if sessions.len() >= MAX_SESSIONS / 2 {
            self.challenge_ttl.min(PRESSURE_CHALLENGE_TTL)
        } else {
            self.challenge_ttl
        };
        sessions.insert(
            session.clone(),
            Session {
                nonce,
                request,
                issued: Instant::now(),
                ttl,
                client,
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
                no_freshness: false,
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

    /// Answers an attestation; the flag says whether the outcome is in the audit log (it is for
    /// every request that answered a live challenge).
    async fn attest(&self, request: AttestRequest) -> (Result<ReleaseResponse, Refusal>, bool) {
        let session = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request.session);
        // Without a live challenge nothing was appraised: the caller counts such refusals.
        let Some(session) = session else {
            let refusal = Refusal::new(
                StatusCode::UNAUTHORIZED,
                "invalid_session",
                "unknown or already used session: a challenge answers one attestation only",
            );
            return (Err(refusal), false);
        };
        let key_id = session.request.key_id.clone();
        let subject = format!(
            "model {:?} session {}",
            session.request.model_id, request.session
        );
        let outcome = if session.issued.elapsed() > session.ttl {
            Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "invalid_session",
                format!(
                    "the challenge expired ({} s old, valid for {} s)",
                    session.issued.elapsed().as_secs(),
                    session.ttl.as_secs()
                ),
            ))
        } else {
            self.judge(session, &request)
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
        let reply = match (outcome, record) {
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
        };
        (reply, true)
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
    let collected = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(request.into_body(), MAX_REQUEST_BYTES).collect(),
    )
    .await
    .map_err(|_| {
        Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request",
            format!("the body did not arrive within {BODY_READ_TIMEOUT:?}"),
        )
    })?;
    let body = collected
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

/// A reply, and whether a refusal in it is already in the audit log (otherwise it is counted
/// for the aggregated record).
async fn handle(
    broker: Arc<Broker>,
    client: IpAddr,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (reply, audited) = answer(&broker, client, request).await;
    if let Err(refusal) = &reply
        && !audited
    {
        broker.tally(client, &refusal.message);
    }
    Ok(match reply {
        Ok(body) => json_reply(StatusCode::OK, body),
        Err(refusal) => refusal_reply(refusal),
    })
}

async fn answer(
    broker: &Arc<Broker>,
    client: IpAddr,
    request: Request<Incoming>,
) -> (Result<Vec<u8>, Refusal>, bool) {
    let path = request.uri().path().to_owned();
    if path != AUTH_PATH && path != ATTEST_PATH {
        let refusal = Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request",
            format!("no such endpoint {path}"),
        );
        return (Err(refusal), false);
    }
    if request.method() != Method::POST {
        let refusal = Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request",
            "use POST",
        );
        return (Err(refusal), false);
    }
    let internal = |e: String| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e);
    if path == AUTH_PATH {
        let reply = read_json::<AuthRequest>(request)
            .await
            .and_then(|auth| broker.auth(client, auth))
            .and_then(|r| serde_json::to_vec(&r).map_err(|e| internal(e.to_string())));
        return (reply, false);
    }
    let attest = match read_json::<AttestRequest>(request).await {
        Ok(attest) => attest,
        Err(refusal) => return (Err(refusal), false),
    };
    let judging = Arc::clone(broker);
    // Appraisal verifies signatures: off the async workers.
    let judged = tokio::task::spawn_blocking(move || {
        tokio::runtime::Handle::current().block_on(judging.attest(attest))
    })
    .await;
    match judged {
        Ok((result, audited)) => (
            result.and_then(|r| serde_json::to_vec(&r).map_err(|e| internal(e.to_string()))),
            audited,
        ),
        Err(e) => (
            Err(internal(format!("the attestation task failed: {e}"))),
            false,
        ),
    }
}

/// Serves `broker` on `listener` until `shutdown` resolves (connections in flight are dropped;
/// every answer already sent was audited first, and the refusals counted since the last
/// aggregated record are written before this returns).
pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let acceptor = Acceptor::new(listener, MAX_CONNECTIONS);
    let mut flush = tokio::time::interval(broker.refusal_window);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    flush.tick().await;
    loop {
        let accepted = tokio::select! {
            accepted = acceptor.accept() => accepted,
            _ = flush.tick() => {
                broker.flush_refusals().await;
                continue;
            }
            () = &mut shutdown => {
                broker.flush_refusals().await;
                return Ok(());
            }
        };
        let broker = Arc::clone(&broker);
        tokio::spawn(async move {
            let _permit = accepted.permit;
            let peer = accepted.peer;
            let client = peer.ip();
            let service =
                hyper::service::service_fn(move |r| handle(Arc::clone(&broker), client, r));
            if let Err(err) = netlimits::http1_builder()
                .serve_connection(TokioIo::new(accepted.stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "key broker connection ended");
            }
        });
    }
}
