//! The OpenAI-compatible API served over TLS.
//!
//! [`Server::start`] binds the listener and starts accepting at once; `/health` answers 503
//! until [`Server::set_model`] hands over the loaded model and its engine. See `docs/server.md`.

pub mod app;
mod attestation;
mod audit;
pub mod auth;
pub mod body;
pub mod error;
mod generation;
mod handlers;
mod listener;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod service;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use inferno_attestation::pki::ClockFloor;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use app::App;
pub use error::ApiError;
pub use policy::ServerPolicy;
pub use service::ModelService;
pub use tls::ServerIdentity;

use crate::attest::StartupAttestation;
use crate::config::Config;

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Serving beyond loopback without API keys would expose the model to anyone.
    #[error(
        "refusing to listen on {0} without API keys: add [[auth.keys]] to the config or listen on a loopback address"
    )]
    NoKeysOffLoopback(SocketAddr),
    /// The policy requires API keys and the configuration has none.
    #[error(
        "policy {policy:?} requires API keys ([auth] require_api_key = true) but the configuration has no [[auth.keys]]"
    )]
    ApiKeysRequired {
        /// The policy's name.
        policy: String,
    },
    /// The policy asks the audit log to keep content, and there is no audit log.
    #[error(
        "policy {policy:?} asks the audit log for `{mode}` content but the configuration has no [audit] table"
    )]
    AuditRequired {
        /// The policy's name.
        policy: String,
        /// The content mode asked for.
        mode: &'static str,
    },
    /// The policy asks for a content mode that the configured key cannot provide.
    #[error("policy {policy:?}: {source}")]
    ContentKey {
        /// The policy's name.
        policy: String,
        /// Why the content policy cannot be built.
        source: crate::audit::AuditError,
    },
    /// The policy file changed between the server's reading and the attestation's.
    #[error(
        "the policy changed during start-up (read with SHA-256 {read}, attested with {attested}): refusing to serve"
    )]
    PolicyChanged {
        /// The digest the server read.
        read: String,
        /// The digest bound into the evidence.
        attested: String,
    },
    /// A configured key hash is malformed.
    #[error(transparent)]
    BadKey(#[from] auth::BadKeyHash),
    /// The certificate or key could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The audit log could not be opened (or is inconsistent with its witness).
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    /// Start-up attestation failed: the server refuses to serve.
    #[error(transparent)]
    Attestation(#[from] crate::attest::AttestationError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A running server.
pub struct Server {
    app: Arc<App>,
    local_addr: SocketAddr,
    identity: ServerIdentity,
    attestation: Arc<StartupAttestation>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds `config.server.listen`, loads or generates the certificate and starts accepting.
    /// Must be called inside a Tokio runtime.
    pub async fn start(config: Config) -> Result<Self, ServerError> {
        let listen = config.server.listen;
        let policy = ServerPolicy::load(&config.attestation)?;
        let auth = auth::Authenticator::new(&config.auth.keys)?;
        if !auth.has_keys() {
            if policy.require_api_key {
                return Err(ServerError::ApiKeysRequired {
                    policy: policy.name,
                });
            }
            if !listen.ip().is_loopback() {
                return Err(ServerError::NoKeysOffLoopback(listen));
            }
            tracing::warn!(
                %listen,
                "no API keys configured: serving loopback only, without authentication"
            );
        }
        let content = content_policy(&config, &policy)?;
        let identity = ServerIdentity::from_config(&config.tls, listen.ip())?;
        let signer = match &config.audit {
            Some(audit) => Some(crate::audit::AuditLog::generate_signer(audit)?),
            None => None,
        };
        let attestation = Arc::new(attest_startup(&config, &identity, signer.as_ref()).await?);
        if attestation.policy_sha256() != policy.digest {
            return Err(ServerError::PolicyChanged {
                read: policy.digest,
                attested: attestation.policy_sha256().to_owned(),
            });
        }
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: listen,
            source,
        })?;
        let grace = config.server.shutdown_grace();
        let audit = open_audit(&config, content, &identity, signer, &attestation).await?;
        let mut app = App::new(config, auth)
            .with_attestation(Arc::clone(&attestation))
            .with_content_in_logs(policy.content_in_logs);
        if let Some(audit) = audit {
            app = app.with_audit(audit);
        }
        let app = Arc::new(app);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let acceptor = TlsAcceptor::from(Arc::clone(&identity.config));
        let task = tokio::spawn(listener::run(
            listener,
            acceptor,
            Arc::clone(&app),
            shutdown_rx,
            grace,
        ));
        Ok(Self {
            app,
            local_addr,
            identity,
            attestation,
            shutdown,
            task,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate the server presents.
    pub fn identity(&self) -> &ServerIdentity {
        &self.identity
    }

    /// The start-up evidence and the appraisal that admitted it.
    pub fn attestation(&self) -> &StartupAttestation {
        &self.attestation
    }

    /// Shared state (metrics, the loaded model).
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Hands over the loaded model; the server becomes ready.
    /// The configured `server.tool_call_parser` overrides the format detected from the chat
    /// template.
    pub fn set_model(&self, mut service: ModelService) {
        service.set_tool_call_format(self.app.config().server.tool_call_parser);
        let detail = format!("model {} ({}) loaded", service.name(), service.digest());
        self.app.set_service(Arc::new(service));
        audit::record_event(
            &self.app,
            crate::audit::SecurityEvent::GpuReady {
                ready: true,
                detail,
            },
        );
    }

    /// Records the digests of the configuration file and policy in force in the audit log.
    pub fn record_config(&self, config_digest: Option<String>, policy_digest: Option<String>) {
        let content_mode = self
            .app
            .audit()
            .map_or("none", |audit| audit.content_mode().as_str())
            .to_owned();
        audit::record_event(
            &self.app,
            crate::audit::SecurityEvent::PolicyConfig {
                policy_digest,
                config_digest,
                content_mode,
            },
        );
    }

    /// Stops accepting, lets in-flight requests finish within the configured grace period,
    /// then stops the engine.
    pub async fn shutdown(self) {
        // The accept loop holds the receiver until it exits, so this cannot fail before then.
        let _ = self.shutdown.send(true);
        if let Err(err) = self.task.await {
            tracing::error!(error = %err, "the accept loop panicked");
        }
        if let Some(service) = self.app.service() {
            service.engine().shutdown();
        }
        if let Some(audit) = self.app.audit()
            && let Err(err) = audit.shutdown("server stopped").await
        {
            tracing::error!(error = %err, "audit: final checkpoint failed");
        }
    }
}

/// The audit content policy that `policy` asks for, with the configured key; `None` without
/// an `[audit]` table (allowed only when the policy keeps no content).
fn content_policy(
    config: &Config,
    policy: &ServerPolicy,
) -> Result<Option<crate::audit::ContentPolicy>, ServerError> {
    let mode = policy.audit_content;
    let Some(audit) = &config.audit else {
        if mode.needs_key() {
            return Err(ServerError::AuditRequired {
                policy: policy.name.clone(),
                mode: mode.as_str(),
            });
        }
        return Ok(None);
    };
    crate::audit::AuditSink::content_policy(audit, mode)
        .map(Some)
        .map_err(|source| ServerError::ContentKey {
            policy: policy.name.clone(),
            source,
        })
}

/// Collects and appraises the start-up evidence binding the TLS key and the audit key.
async fn attest_startup(
    config: &Config,
    identity: &ServerIdentity,
    signer: Option<&crate::audit::note::NoteSigner>,
) -> Result<StartupAttestation, ServerError> {
    let attestation_config = config.attestation.clone();
    let cert = identity.cert_pem.clone().into_bytes();
    let audit_key = signer.map(|s| s.verifier().public);
    let audit_dir = config.audit.as_ref().map(|a| a.dir.clone());
    let attested = tokio::task::spawn_blocking(move || {
        let newest = match audit_dir {
            Some(dir) => crate::audit::recovery::newest_record_time(&dir)?,
            None => None,
        };
        let floor = newest.map(|t| ClockFloor::starting_at(t, "the audit log's newest record"));
        StartupAttestation::establish(&attestation_config, &cert, audit_key, floor.as_ref())
            .map_err(ServerError::from)
    })
    .await
    .map_err(|err| crate::attest::AttestationError::Task(err.to_string()))??;
    if attested.appraisal.simulated {
        tracing::warn!("attestation: SIMULATED TEE (development profile), not for production");
    }
    Ok(attested)
}

/// Opens the audit log of `[audit]` (recovering it, checking its witness) with the attested
/// checkpoint key, and records the appraisal and the certificate in use; `None` with a warning
/// when the table is absent.
async fn open_audit(
    config: &Config,
    content: Option<crate::audit::ContentPolicy>,
    identity: &ServerIdentity,
    signer: Option<crate::audit::note::NoteSigner>,
    attestation: &StartupAttestation,
) -> Result<Option<Arc<crate::audit::AuditSink>>, ServerError> {
    let (Some(audit_config), Some(content), Some(signer)) = (config.audit.clone(), content, signer)
    else {
        tracing::warn!("no [audit] table: requests are NOT recorded in an audit log");
        return Ok(None);
    };
    let start = crate::audit::StartInfo {
        software_version: env!("CARGO_PKG_VERSION").to_owned(),
        evidence: vec![attestation.evidence_blob()],
    };
    let sink = tokio::task::spawn_blocking(move || {
        crate::audit::AuditSink::open_with_signer(&audit_config, content, signer, start)
    })
    .await
    .map_err(|err| crate::audit::AuditError::Config(format!("audit open panicked: {err}")))??;
    sink.event(attestation.appraisal_event()).await?;
    let certificate_digest = identity.fingerprint.to_lowercase().replace(':', "");
    sink.event(crate::audit::SecurityEvent::CertificateRotated { certificate_digest })
        .await?;
    Ok(Some(Arc::new(sink)))
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}
