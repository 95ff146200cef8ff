//! The OpenAI-compatible API served over TLS.
//!
//! [`Server::start`] generates the TLS key, binds the listener and starts accepting at once;
//! [`Server::attest`] produces the start-up evidence once the model digest is known (the
//! certificate then carries it, and the audit log opens with it); `/health` answers 503 until
//! that and [`Server::set_model`] have happened. See `docs/server.md`.

pub mod app;
mod attestation;
mod audit;
pub mod auth;
pub mod body;
mod content_tokens;
mod embeddings;
mod endpoint;
pub mod error;
mod generation;
mod handlers;
mod listener;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod receipt;
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

use crate::attest::{AttestationService, PreparedAttestation, StartupAttestation, StartupBinding};
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
        source: inferno_audit::AuditError,
    },
    /// The production profile refuses a content key file that other users may read.
    #[error(
        "the audit content key file {path} has mode {mode:o}: other users may read it, and the production profile refuses that (chmod 600 it)"
    )]
    ContentKeyExposed {
        /// The key file.
        path: String,
        /// Its permission bits.
        mode: u32,
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
    /// A configured key is malformed, or its name is reserved.
    #[error(transparent)]
    BadKey(#[from] auth::BadKeyHash),
    /// The certificate or key could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The audit log could not be opened (or is inconsistent with its witness).
    #[error(transparent)]
    Audit(#[from] inferno_audit::AuditError),
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
    policy_digest: String,
    /// What opening the audit log needs, taken by [`Server::attest`].
    pending_audit: std::sync::Mutex<Option<PendingAudit>>,
    /// The attestation prepared by [`Server::check_platform`], taken by [`Server::attest`].
    prepared: std::sync::Mutex<Option<PreparedAttestation>>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The audit log's content policy and checkpoint key, waiting for the start-up evidence.
struct PendingAudit {
    content: Option<inferno_audit::ContentPolicy>,
    signer: Option<inferno_audit::note::NoteSigner>,
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
        let production =
            config.attestation.profile == crate::config::AttestationProfile::Production;
        let content = content_policy(&config, &policy, production)?;
        let identity = ServerIdentity::generate(listen.ip())?;
        let signer = match &config.audit {
            Some(audit) => Some(inferno_audit::AuditLog::generate_signer(audit)?),
            None => None,
        };
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
        let app = Arc::new(App::new(config, auth).with_content_in_logs(policy.content_in_logs));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let acceptor = TlsAcceptor::from(identity.config());
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
            policy_digest: policy.digest,
            pending_audit: std::sync::Mutex::new(Some(PendingAudit { content, signer })),
            prepared: std::sync::Mutex::new(None),
            shutdown,
            task,
        })
    }

    /// The platform check ahead of [`Server::attest`]: opens the evidence sources and appraises
    /// the platform (CPU TEE, vTPM, GPU) on evidence that binds no start-up value, then sets the
    /// GPU ready, so the GPU may be used while the model is still read. Nothing is served until
    /// [`Server::attest`] bound the model digest. Any failure means the GPU must not be used.
    pub async fn check_platform(&self) -> Result<(), ServerError> {
        let prepared = prepare_attestation(self.app.config(), true).await?;
        *self.prepared.lock().unwrap_or_else(|e| e.into_inner()) = Some(prepared);
        Ok(())
    }

    /// Start-up attestation, once the model digest is known: collects and appraises evidence
    /// binding the TLS key, the audit key, `model_digest` and the policy; puts that evidence in
    /// the certificate; opens the audit log with it. Any failure means the server must not
    /// serve. A second call fails.
    pub async fn attest(
        &self,
        model_digest: [u8; 32],
    ) -> Result<Arc<StartupAttestation>, ServerError> {
        let pending = self
            .pending_audit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                crate::attest::AttestationError::Task("start-up attestation already ran".into())
            })?;
        let config = self.app.config();
        let binding = StartupBinding {
            tls_spki_sha256: self.identity.spki_sha256(),
            audit_key: pending.signer.as_ref().map(|s| s.verifier().public),
            model_digest,
            quantized_at_load: config.model.quantization,
        };
        let prepared = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let prepared = match prepared {
            Some(prepared) => prepared,
            None => prepare_attestation(config, false).await?,
        };
        let service = Arc::new(attest_startup(prepared, binding).await?);
        let attestation = Arc::clone(service.startup());
        if attestation.policy_sha256() != self.policy_digest {
            return Err(ServerError::PolicyChanged {
                read: self.policy_digest.clone(),
                attested: attestation.policy_sha256().to_owned(),
            });
        }
        self.identity
            .install_evidence(&attestation.evidence_json())?;
        if let Some(audit) = open_audit(
            config,
            pending.content,
            &self.identity,
            pending.signer,
            &attestation,
        )
        .await?
        {
            self.app.set_audit(audit);
        }
        self.app.set_attestation(service);
        Ok(attestation)
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate the server presents.
    pub fn identity(&self) -> &ServerIdentity {
        &self.identity
    }

    /// The start-up evidence and the appraisal that admitted it, once [`Server::attest`] ran.
    pub fn attestation(&self) -> Option<&Arc<StartupAttestation>> {
        self.app.attestation().map(|service| service.startup())
    }

    /// Shared state (metrics, the loaded model).
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Hands over the loaded model; the server becomes ready.
    /// The configured `server.tool_call_parser` overrides the format detected from the chat
    /// template, `server.reasoning_parser` the reasoning format; `server.max_model_len` caps the
    /// context served.
    pub fn set_model(&self, mut service: ModelService) {
        service.set_tool_call_format(self.app.config().server.tool_call_parser);
        service.set_reasoning_format(self.app.config().server.reasoning_parser);
        service.limit_context(self.app.config().server.max_model_len);
        let event = model_loaded_event(&service);
        self.app.set_service(Arc::new(service));
        audit::record_event(&self.app, event);
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
            inferno_audit::SecurityEvent::PolicyConfig {
                policy_digest,
                config_digest,
                content_mode,
            },
        );
    }

    /// Records the release, or the refusal, of a sealed model's key and waits until the record
    /// is durable (nothing to do without an audit log).
    pub async fn record_key_release(
        &self,
        key_id: String,
        released: bool,
        reason: String,
    ) -> Result<(), inferno_audit::AuditError> {
        let Some(sink) = self.app.audit() else {
            return Ok(());
        };
        let event = inferno_audit::SecurityEvent::KeyRelease {
            key_id,
            released,
            reason,
        };
        sink.log()
            .append(inferno_audit::RecordBody::Event(event))
            .await
            .map(|_| ())
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

/// The `gpu_ready` event of a model that starts serving: ready only when its engine runs on a
/// GPU backend; on the CPU backend it records that no GPU serves.
fn model_loaded_event(service: &ModelService) -> inferno_audit::SecurityEvent {
    let backend = service.engine().backend();
    let (ready, detail) = if backend == "cpu" {
        (
            false,
            format!(
                "no GPU: model {} ({}) serves on the CPU backend",
                service.name(),
                service.digest()
            ),
        )
    } else {
        (
            true,
            format!(
                "model {} ({}) loaded on the {backend} backend",
                service.name(),
                service.digest()
            ),
        )
    };
    inferno_audit::SecurityEvent::GpuReady { ready, detail }
}

/// The audit content policy that `policy` asks for, with the configured key; `None` without
/// an `[audit]` table (allowed only when the policy keeps no content). A key file that other
/// users may read is refused in `production` and warned about otherwise.
fn content_policy(
    config: &Config,
    policy: &ServerPolicy,
    production: bool,
) -> Result<Option<inferno_audit::ContentPolicy>, ServerError> {
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
    if let (Some(path), true) = (&audit.content_key_file, mode.needs_key()) {
        let exposure =
            inferno_audit::key_file_exposure(path).map_err(|e| ServerError::ContentKey {
                policy: policy.name.clone(),
                source: inferno_audit::AuditError::Config(e.to_string()),
            })?;
        if let Some(bits) = exposure {
            if production {
                return Err(ServerError::ContentKeyExposed {
                    path: path.display().to_string(),
                    mode: bits,
                });
            }
            tracing::warn!(
                path = %path.display(),
                mode = format!("{bits:o}"),
                "the audit content key file is readable by other users (the production profile refuses this): chmod 600 it"
            );
        }
    }
    inferno_audit::AuditSink::content_policy(audit, mode)
        .map(Some)
        .map_err(|source| ServerError::ContentKey {
            policy: policy.name.clone(),
            source,
        })
}

/// Opens the evidence sources on the attestation worker (see [`AttestationService::prepare`];
/// `check_platform` appraises the platform and sets the GPU ready first), with the audit log's
/// newest record as the clock floor.
async fn prepare_attestation(
    config: &Config,
    check_platform: bool,
) -> Result<PreparedAttestation, ServerError> {
    let attestation_config = config.attestation.clone();
    let audit_dir = config.audit.as_ref().map(|a| a.dir.clone());
    tokio::task::spawn_blocking(move || {
        let newest = match audit_dir {
            Some(dir) => inferno_audit::newest_record_time(&dir)?,
            None => None,
        };
        let floor = newest.map(|t| ClockFloor::starting_at(t, "the audit log's newest record"));
        AttestationService::prepare(&attestation_config, floor, check_platform)
            .map_err(ServerError::from)
    })
    .await
    .map_err(|err| crate::attest::AttestationError::Task(err.to_string()))?
}

/// Collects and appraises the start-up evidence over `binding`, on the attestation worker.
async fn attest_startup(
    prepared: PreparedAttestation,
    binding: StartupBinding,
) -> Result<AttestationService, ServerError> {
    let service = tokio::task::spawn_blocking(move || prepared.start(binding))
        .await
        .map_err(|err| crate::attest::AttestationError::Task(err.to_string()))??;
    if service.startup().appraisal.simulated {
        tracing::warn!("attestation: SIMULATED TEE (development profile), not for production");
    }
    Ok(service)
}

/// Opens the audit log of `[audit]` (recovering it, checking its witness) with the attested
/// checkpoint key, and records the appraisal and the certificate in use; `None` with a warning
/// when the table is absent.
async fn open_audit(
    config: &Config,
    content: Option<inferno_audit::ContentPolicy>,
    identity: &ServerIdentity,
    signer: Option<inferno_audit::note::NoteSigner>,
    attestation: &StartupAttestation,
) -> Result<Option<Arc<inferno_audit::AuditSink>>, ServerError> {
    let (Some(audit_config), Some(content), Some(signer)) = (config.audit.clone(), content, signer)
    else {
        tracing::warn!("no [audit] table: requests are NOT recorded in an audit log");
        return Ok(None);
    };
    let start = inferno_audit::StartInfo {
        software_version: env!("CARGO_PKG_VERSION").to_owned(),
        evidence: vec![attestation.evidence_blob()],
    };
    let sink = tokio::task::spawn_blocking(move || {
        inferno_audit::AuditSink::open_with_signer(&audit_config, content, signer, start)
    })
    .await
    .map_err(|err| inferno_audit::AuditError::Config(format!("audit open panicked: {err}")))??;
    sink.event(attestation.appraisal_event()).await?;
    let certificate_digest = identity.fingerprint().to_lowercase().replace(':', "");
    sink.event(inferno_audit::SecurityEvent::CertificateRotated { certificate_digest })
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
