//! Connecting: TLS 1.3 to the server, its certificate and this connection's exporter, one
//! `POST /v1/attestation` with a fresh nonce over the same connection, the appraisal, and only
//! then the connection handed back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::runtime_data::{TLS_EXPORTER_LABEL, TLS_EXPORTER_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use time::OffsetDateTime;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::appraisal::{Observation, TrustReport, appraise_connection};
use crate::policy::LoadedClientPolicy;

/// The length of the nonce [`Client::connect`] chooses.
pub const NONCE_LEN: usize = 32;
/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the attestation request may take (a hardware report can take seconds).
const ATTESTATION_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest attestation response read.
const MAX_RESPONSE: usize = 16 << 20;

/// Connecting to or verifying a server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server address is not `https://HOST:PORT`.
    #[error("bad server address {address:?}: {reason}")]
    Address {
        /// What was given.
        address: String,
        /// Why it is not usable.
        reason: String,
    },
    /// The nonce is too short or too long.
    #[error("the nonce must be 16 to 64 bytes, not {0}")]
    Nonce(usize),
    /// TCP or TLS failed.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The server.
        target: String,
        /// The cause.
        reason: String,
    },
    /// The attestation request failed or its answer is malformed.
    #[error("attestation request to {target} failed: {reason}")]
    Attestation {
        /// The server.
        target: String,
        /// The cause.
        reason: String,
    },
    /// The server's evidence does not pass the client policy.
    #[error("{target} is not trusted: {}", .report.failure_summary())]
    Rejected {
        /// The server.
        target: String,
        /// The full appraisal.
        report: Box<TrustReport>,
    },
    /// An Oblivious HTTP exchange failed: the path refused or altered it, or the gateway could
    /// not open it.
    #[error("{target}: {reason}")]
    Ohttp {
        /// The gateway and its path.
        target: String,
        /// The cause.
        reason: String,
    },
}

/// A server address: `https://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host name or IP address.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl Target {
    /// Parses `https://HOST:PORT` (a trailing `/` is accepted; a path is not).
    pub fn parse(address: &str) -> Result<Self, ClientError> {
        let bad = |reason: &str| ClientError::Address {
            address: address.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = address
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        if uri.scheme_str() != Some("https") {
            return Err(bad("the scheme must be https"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("give the server's origin only, without a path"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = authority
            .port_u16()
            .ok_or_else(|| bad("the port is required (https://HOST:PORT)"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// The `Host` header value for this server.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "https://{}", self.authority())
    }
}

/// A TLS connection whose server passed the client policy, ready for requests.
pub struct VerifiedConnection {
    /// The TLS stream; nothing but the attestation exchange has been sent on it.
    pub stream: TlsStream<TcpStream>,
    /// The appraisal that admitted it.
    pub report: TrustReport,
}

/// One server's last verification, for [`Client::connect_cached`] to reuse on later connections
/// that present the same certificate within a bounded age.
pub struct VerificationCache {
    max_age: Duration,
    entry: tokio::sync::Mutex<Option<CachedVerification>>,
}

struct CachedVerification {
    certificate: Vec<u8>,
    report: TrustReport,
    verified: Instant,
}

impl CachedVerification {
    fn new(certificate: Vec<u8>, report: &TrustReport) -> Self {
        Self {
            certificate,
            report: report.clone(),
            verified: Instant::now(),
        }
    }
}

impl VerificationCache {
    /// An empty cache whose verifications are reused for at most `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            entry: tokio::sync::Mutex::new(None),
        }
    }
}

/// Connects to servers and verifies each connection against one client policy.
#[derive(Clone)]
pub struct Client {
    policy: Arc<LoadedClientPolicy>,
    collateral: Option<Arc<CollateralBundle>>,
    tls: Arc<ClientConfig>,
}

impl Client {
    /// A client judging by `policy`, with offline vendor collateral when given.
    pub fn new(policy: LoadedClientPolicy, collateral: Option<CollateralBundle>) -> Self {
        Self {
            policy: Arc::new(policy),
            collateral: collateral.map(Arc::new),
            tls: crate::tls::client_config(),
        }
    }

    /// The client policy.
    pub fn policy(&self) -> &LoadedClientPolicy {
        &self.policy
    }

    /// Connects, verifies the server with a fresh random nonce, and hands back the connection
    /// only when every check passes.
    pub async fn connect(&self, target: &Target) -> Result<VerifiedConnection, ClientError> {
        let (stream, certificate) = self.open(target).await?;
        self.verify_opened(target, stream, &certificate).await
    }

    /// Judges an observation with this client's policy and collateral, now.
    pub fn appraise(&self, observed: &Observation) -> TrustReport {
        appraise_connection(
            observed,
            &self.policy,
            self.collateral.as_deref(),
            OffsetDateTime::now_utc(),
        )
    }

    /// The exchange without the verdict: connects, reads the certificate and exporter, asks for
    /// fresh evidence with `nonce`, and returns what was observed with the still-unverified
    /// connection. Callers must [`Client::appraise`] before they send anything on it.
    pub async fn exchange(
        &self,
        target: &Target,
        nonce: &[u8],
    ) -> Result<(Observation, TlsStream<TcpStream>), ClientError> {
        use inferno_attestation::runtime_data::{MAX_CHALLENGE_NONCE, MIN_CHALLENGE_NONCE};
        if !(MIN_CHALLENGE_NONCE..=MAX_CHALLENGE_NONCE).contains(&nonce.len()) {
            return Err(ClientError::Nonce(nonce.len()));
        }
        let (stream, certificate) = self.open(target).await?;
        self.challenge(target, stream, certificate, nonce).await
    }

    /// Connects with a [`VerificationCache`]: when the cache holds a verification of the same
    /// server certificate younger than its maximum age, the new connection is trusted on it
    /// without a new challenge (the TLS handshake proved the server holds that certificate's
    /// key, which the verification bound to the attested instance); otherwise the connection is
    /// verified in full and the cache updated. Concurrent callers that find the cache empty wait
    /// for one verification instead of each spending a challenge.
    pub async fn connect_cached(
        &self,
        target: &Target,
        cache: &VerificationCache,
    ) -> Result<VerifiedConnection, ClientError> {
        let reusable = {
            let mut entry = cache.entry.lock().await;
            match entry
                .as_ref()
                .filter(|cached| cached.verified.elapsed() < cache.max_age)
            {
                Some(cached) => (cached.certificate.clone(), cached.report.clone()),
                None => {
                    // Verified while holding the lock: the callers queued behind reuse it.
                    let (stream, certificate) = self.open(target).await?;
                    let connection = self.verify_opened(target, stream, &certificate).await?;
                    *entry = Some(CachedVerification::new(certificate, &connection.report));
                    return Ok(connection);
                }
            }
        };
        let (stream, certificate) = self.open(target).await?;
        if certificate == reusable.0 {
            return Ok(VerifiedConnection {
                stream,
                report: reusable.1,
            });
        }
        // Another certificate: this connection is verified in full, and replaces the entry only
        // when it passes (a failed one leaves nothing to reuse).
        let mut entry = cache.entry.lock().await;
        let verified = self.verify_opened(target, stream, &certificate).await;
        *entry = verified
            .as_ref()
            .ok()
            .map(|connection| CachedVerification::new(certificate, &connection.report));
        verified
    }

    /// Challenges an opened connection with a fresh random nonce and appraises it.
    async fn verify_opened(
        &self,
        target: &Target,
        stream: TlsStream<TcpStream>,
        certificate: &[u8],
    ) -> Result<VerifiedConnection, ClientError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| ClientError::Connect {
                target: target.to_string(),
                reason: "the system random number generator failed".to_owned(),
            })?;
        let (observed, stream) = self
            .challenge(target, stream, certificate.to_vec(), &nonce)
            .await?;
        let report = self.appraise(&observed);
        if report.trusted() {
            Ok(VerifiedConnection { stream, report })
        } else {
            Err(ClientError::Rejected {
                target: target.to_string(),
                report: Box::new(report),
            })
        }
    }

    /// A TLS session with the server and its leaf certificate (DER); nothing sent yet.
    async fn open(&self, target: &Target) -> Result<(TlsStream<TcpStream>, Vec<u8>), ClientError> {
        let connect_err = |reason: String| ClientError::Connect {
            target: target.to_string(),
            reason,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, self.handshake(target))
            .await
            .map_err(|_| connect_err(format!("no TLS session within {CONNECT_TIMEOUT:?}")))?
            .map_err(connect_err)?;
        let certificate = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .ok_or_else(|| connect_err("the server presented no certificate".to_owned()))?
            .to_vec();
        Ok((stream, certificate))
    }

    /// Reads the connection's exporter and asks for fresh evidence with `nonce` on it.
    async fn challenge(
        &self,
        target: &Target,
        stream: TlsStream<TcpStream>,
        certificate: Vec<u8>,
        nonce: &[u8],
    ) -> Result<(Observation, TlsStream<TcpStream>), ClientError> {
        let exporter = stream
            .get_ref()
            .1
            .export_keying_material(vec![0u8; TLS_EXPORTER_LEN], TLS_EXPORTER_LABEL, None)
            .map_err(|e| ClientError::Connect {
                target: target.to_string(),
                reason: format!("no TLS exporter: {e}"),
            })?;
        let attestation_err = |reason: String| ClientError::Attestation {
            target: target.to_string(),
            reason,
        };
        let (fresh_evidence, stream) =
            tokio::time::timeout(ATTESTATION_TIMEOUT, request_evidence(stream, target, nonce))
                .await
                .map_err(|_| attestation_err(format!("no answer within {ATTESTATION_TIMEOUT:?}")))?
                .map_err(attestation_err)?;
        Ok((
            Observation {
                certificate,
                exporter,
                nonce: nonce.to_vec(),
                fresh_evidence,
            },
            stream,
        ))
    }

    async fn handshake(&self, target: &Target) -> Result<TlsStream<TcpStream>, String> {
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from(target.host.clone()).map_err(|e| e.to_string())?;
        TlsConnector::from(Arc::clone(&self.tls))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    }
}

/// Sends `POST /v1/attestation` on the connection, reads the answer, and returns the evidence
/// with the connection (hyper hands the stream back once the exchange is over).
async fn request_evidence(
    stream: TlsStream<TcpStream>,
    target: &Target,
    nonce: &[u8],
) -> Result<(Evidence, TlsStream<TcpStream>), String> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let body = serde_json::json!({ "nonce": hex::encode(nonce) }).to_string();
    let request = http::Request::post("/v1/attestation")
        .header(http::header::HOST, target.authority())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let exchange = async move {
        let response = sender.send_request(request).await;
        drop(sender);
        let response = response.map_err(|e| e.to_string())?;
        let status = response.status();
        let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, bytes))
    };
    let (parts, answer) = tokio::join!(connection.without_shutdown(), exchange);
    let (status, bytes) = answer?;
    let parts = parts.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "HTTP {status}: {}",
            error_message(&bytes).unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned())
        ));
    }
    if !parts.read_buf.is_empty() {
        return Err("the server sent bytes after the attestation answer".to_owned());
    }
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let evidence = value
        .get("evidence")
        .ok_or("the answer has no `evidence`")?;
    let evidence: Evidence = serde_json::from_value(evidence.clone())
        .map_err(|e| format!("the answer's evidence: {e}"))?;
    evidence
        .validate()
        .map_err(|e| format!("the answer's evidence: {e}"))?;
    Ok((evidence, parts.io.into_inner()))
}

/// The `error.message` of an OpenAI error body.
fn error_message(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(value.get("error")?.get("message")?.as_str()?.to_owned())
}
