//! Attestation of the server: bind the TLS key, the audit-log key, the model digest, the policy
//! digest and the software version into a runtime-data document, collect evidence over it, and
//! appraise that evidence with the server policy before anything is served; then, on request,
//! fresh evidence over the same document with clients' challenge bindings added
//! ([`AttestationService::fresh`]), concurrent challenges sharing one hardware request.
//!
//! `docs/serving-attestation.md` describes the sequence, `docs/attestation-protocol.md` the
//! exchange with clients. [`binding`] checks, offline, that the
//! start events of an audit log carry evidence binding their checkpoint keys.

pub mod binding;
mod gpu;
mod simulated;
mod tpm;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::{BundleError, CollateralBundle};
use inferno_attestation::collect::{
    CollectError, EvidenceSource, collect_evidence, detect_hardware,
};
use inferno_attestation::evidence::Evidence;
use inferno_attestation::pki::{self, ClockFloor};
use inferno_attestation::policy::{LoadedPolicy, Platform, PolicyError};
use inferno_attestation::report::AppraisalReport;
use inferno_attestation::runtime_data::{MAX_CHALLENGE_BINDINGS, RuntimeData};
use serde::Serialize;
use tokio::sync::oneshot;

use self::gpu::GpuAttester;
use self::tpm::TpmAttester;

use crate::config::{AttestationConfig, AttestationProfile};
use inferno_audit::{EvidenceBlob, SecurityEvent};

/// The development policy (`policy/development.toml`), used by the development profile when
/// the configuration names no policy file.
pub const DEVELOPMENT_POLICY: &[u8] = include_bytes!("../../policy/development.toml");
/// The production policy (`policy/production.toml`), used by the production profile when the
/// configuration names no policy file.
pub const PRODUCTION_POLICY: &[u8] = include_bytes!("../../policy/production.toml");
/// The vTPM resource-manager device quoted when the configuration names no TCTI.
pub const TPM_DEVICE: &str = "/dev/tpmrm0";
/// The `kind` of the audit start event's evidence blob: the JSON evidence envelope.
pub const EVIDENCE_BLOB_KIND: &str = "inferno-evidence-envelope-v1";

/// Start-up attestation failed; the server refuses to serve.
#[derive(Debug, thiserror::Error)]
pub enum AttestationError {
    /// The policy could not be read or is invalid.
    #[error("attestation policy {source_name}: {source}")]
    Policy {
        /// The file, or `embedded development/production policy`.
        source_name: String,
        /// The cause.
        source: PolicyError,
    },
    /// The production profile found no TEE to collect evidence from.
    #[error(
        "attestation: no TEE found (no configfs-tsm report interface, no /dev/sev-guest); the production profile refuses to serve without hardware evidence (set [attestation] profile = \"development\" to use the simulated TEE)"
    )]
    NoHardware,
    /// The development profile in a build without the simulated TEE.
    #[error(
        "attestation: the development profile needs the simulated TEE, which this build leaves out (built without the `simulated-tee` feature); use the production profile on TEE hardware"
    )]
    NoSimulator,
    /// The GPU is not in CC mode and the policy requires it.
    #[error(
        "attestation: {gpu} is in CC mode {mode:?}; policy {policy:?} requires CC mode On: refusing to serve (no GPU setting was changed)"
    )]
    GpuNotInCcMode {
        /// The GPU.
        gpu: &'static str,
        /// The CC mode the driver reports.
        mode: inferno_attestation::nvidia::CcMode,
        /// The policy's name.
        policy: String,
    },
    /// The GPU's CC state cannot be read and the policy requires CC mode.
    #[error(
        "attestation: cannot read the CC state of {gpu} ({cause}); policy {policy:?} requires CC mode: refusing to serve"
    )]
    GpuState {
        /// The GPU.
        gpu: &'static str,
        /// Why NVML could not report it.
        cause: String,
        /// The policy's name.
        policy: String,
    },
    /// GPU evidence could not be collected, or the ready state could not be set.
    #[error("attestation: GPU: {0}")]
    Gpu(String),
    /// The policy requires a vTPM and the machine has none.
    #[error(
        "attestation: policy {policy:?} requires a vTPM and {device} is absent: refusing to serve"
    )]
    NoTpm {
        /// The policy's name.
        policy: String,
        /// The TPM resource-manager device looked for.
        device: &'static str,
    },
    /// The vTPM could not be opened or quoted.
    #[error("attestation: vTPM: {0}")]
    Tpm(String),
    /// The TLS certificate could not be parsed to hash its public key.
    #[error("attestation: the TLS certificate cannot be parsed: {0}")]
    Certificate(String),
    /// The configured collateral bundle could not be loaded.
    #[error("attestation: [attestation] collateral: {0}")]
    Collateral(#[from] BundleError),
    /// Evidence could not be collected.
    #[error("attestation: collecting evidence failed: {0}")]
    Collect(#[from] CollectError),
    /// The blocking attestation task did not complete.
    #[error("attestation: the start-up task failed: {0}")]
    Task(String),
    /// Fresh evidence could not be produced (the reason is shared by every coalesced caller).
    #[error("attestation: fresh evidence: {0}")]
    Fresh(String),
    /// The attestation worker has stopped.
    #[error("attestation: the attestation worker has stopped")]
    Stopped,
    /// The evidence does not pass the policy.
    #[error("attestation rejected by policy {policy:?}: {reasons}")]
    Rejected {
        /// The policy's name.
        policy: String,
        /// The failed checks, `id: reason; ...`.
        reasons: String,
    },
}

/// What the start-up evidence binds beside the policy and the software version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupBinding {
    /// SHA-256 of the DER SubjectPublicKeyInfo of the server's TLS key.
    pub tls_spki_sha256: [u8; 32],
    /// The raw Ed25519 audit-log checkpoint key, with an audit log.
    pub audit_key: Option<[u8; 32]>,
    /// The served model's digest (`crate::model::ModelDigest::bytes`).
    pub model_digest: [u8; 32],
    /// The format the projections are quantized to at load, if they are.
    pub quantized_at_load: Option<crate::model::QuantizeAtLoad>,
    /// SHA-256 of the Oblivious HTTP key configuration the gateway serves, when it runs.
    pub ohttp_key_config_sha256: Option<[u8; 32]>,
}

/// The server's evidence, its runtime-data document and the appraisal that admitted it.
#[derive(Debug, Clone, Serialize)]
pub struct StartupAttestation {
    /// The profile in force.
    #[serde(skip)]
    pub profile: AttestationProfile,
    /// The evidence envelope.
    pub evidence: Evidence,
    /// The runtime-data document bound into the evidence.
    pub runtime_data: RuntimeData,
    /// The appraisal of the evidence under the server policy.
    pub appraisal: AppraisalReport,
    /// SHA-256 of the appraisal report's JSON serialisation, hex (recorded in the audit log).
    pub appraisal_sha256: String,
}

/// Fresh evidence answering one or more challenges, with the server's own appraisal of it: the
/// body of `POST /v1/attestation`.
#[derive(Debug, Serialize)]
pub struct FreshEvidence {
    /// The evidence envelope; its runtime data lists every challenge binding it answers.
    pub evidence: Evidence,
    /// The server's appraisal of that evidence under its policy.
    pub appraisal: AppraisalReport,
}

impl FreshEvidence {
    /// The response body: `{"appraisal": ..., "evidence": ...}`, compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One caller's challenge, waiting for the next hardware request.
struct Challenge {
    binding: [u8; 32],
    reply: oneshot::Sender<Result<Arc<FreshEvidence>, AttestationError>>,
}

/// The evidence sources, opened once: the CPU TEE, the vTPM session and the GPU.
struct Attester {
    policy: LoadedPolicy,
    collateral: Option<CollateralBundle>,
    clock_floor: Option<ClockFloor>,
    source: Box<dyn EvidenceSource>,
    tpm: Option<TpmAttester>,
    gpu: GpuAttester,
}

impl Attester {
    /// Opens the sources in key-first order (the vTPM AK and the GPU state before any report).
    fn open(
        config: &AttestationConfig,
        clock_floor: Option<ClockFloor>,
    ) -> Result<Self, AttestationError> {
        let policy = load_policy(config)?;
        let collateral = config
            .collateral
            .as_deref()
            .map(CollateralBundle::from_file)
            .transpose()?;
        let tpm = TpmAttester::open(config.tpm_tcti.as_deref(), &policy)?;
        let gpu = GpuAttester::prepare(&policy, config.profile, config.cuda)?;
        let source: Box<dyn EvidenceSource> = match (detect_hardware(), config.profile) {
            (Some(hardware), _) => hardware,
            (None, AttestationProfile::Development) => simulated::tee()?,
            (None, AttestationProfile::Production) => return Err(AttestationError::NoHardware),
        };
        Ok(Self {
            policy,
            collateral,
            clock_floor,
            source,
            tpm,
            gpu,
        })
    }

    /// The start-up document: policy, software version, the binding (none for the platform
    /// check) and the vTPM AK.
    fn startup_document(
        &self,
        binding: Option<&StartupBinding>,
    ) -> Result<RuntimeData, AttestationError> {
        let mut runtime_data = RuntimeData::new(
            self.policy.digest,
            format!("inferno/{}", env!("CARGO_PKG_VERSION")),
        );
        if let Some(binding) = binding {
            runtime_data.tls_spki_sha256 = Some(hex::encode(binding.tls_spki_sha256));
            runtime_data.audit_key = binding.audit_key.map(hex::encode);
            runtime_data.model_digest = Some(hex::encode(binding.model_digest));
            runtime_data.quantized_at_load = binding.quantized_at_load.map(|q| q.name().into());
            runtime_data.ohttp_key_config_sha256 = binding.ohttp_key_config_sha256.map(hex::encode);
        }
        if let Some(tpm) = &self.tpm {
            tpm.bind_ak(&mut runtime_data)?;
        }
        Ok(runtime_data)
    }

    /// One hardware request: the CPU report, the vTPM quote and the GPU report over `doc`.
    fn collect(&mut self, doc: &RuntimeData) -> Result<Evidence, AttestationError> {
        let mut evidence = collect_evidence(self.source.as_ref(), doc)?;
        evidence.tpm = self.tpm.as_mut().map(|t| t.quote(doc)).transpose()?;
        evidence.gpu = self.gpu.collect(&doc.gpu_nonce())?;
        Ok(evidence)
    }

    fn appraise(&self, evidence: &Evidence, gpu_ready_pending: bool) -> AppraisalReport {
        appraise(&AppraisalInput {
            evidence,
            policy: &self.policy,
            collateral: self.collateral.as_ref(),
            now: time::OffsetDateTime::now_utc(),
            clock_floor: self.clock_floor.as_ref(),
            gpu_ready_pending,
        })
    }

    /// Evidence over `runtime_data`, appraised (any rejection is an error; `gpu_ready_pending`
    /// while the GPU's ready state is still to be set).
    fn collect_passing(
        &mut self,
        runtime_data: &RuntimeData,
        gpu_ready_pending: bool,
    ) -> Result<(Evidence, AppraisalReport), AttestationError> {
        let evidence = self.collect(runtime_data)?;
        let appraisal = self.appraise(&evidence, gpu_ready_pending);
        if !appraisal.passed() {
            let reasons = appraisal
                .failures()
                .map(|c| format!("{}: {}", c.id, c.reason))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(AttestationError::Rejected {
                policy: appraisal.policy_name.clone(),
                reasons,
            });
        }
        Ok((evidence, appraisal))
    }

    /// The platform check: evidence over a document that binds no start-up value (no TLS key,
    /// audit key or model, so it can never pass for the server's evidence), appraised like the
    /// start-up evidence, then the GPU set ready.
    fn check_platform(&mut self) -> Result<(), AttestationError> {
        let runtime_data = self.startup_document(None)?;
        let (_, appraisal) = self.collect_passing(&runtime_data, true)?;
        self.gpu.set_ready()?;
        tracing::info!(
            policy = %appraisal.policy_name,
            simulated = appraisal.simulated,
            "attestation: the platform passed; the GPU may be used before the start-up evidence"
        );
        Ok(())
    }

    /// Start-up evidence, appraised (any rejection is an error), then the GPU set ready unless
    /// the platform check already did.
    fn startup(
        &mut self,
        profile: AttestationProfile,
        binding: &StartupBinding,
        gpu_ready: bool,
    ) -> Result<StartupAttestation, AttestationError> {
        let runtime_data = self.startup_document(Some(binding))?;
        let (evidence, appraisal) = self.collect_passing(&runtime_data, !gpu_ready)?;
        if !gpu_ready {
            self.gpu.set_ready()?;
        }
        let appraisal_sha256 = hex::encode(pki::sha256(
            &serde_json::to_vec(&appraisal).unwrap_or_default(),
        ));
        Ok(StartupAttestation {
            profile,
            evidence,
            runtime_data,
            appraisal,
            appraisal_sha256,
        })
    }

    /// Fresh evidence over the start-up document with `bindings` added.
    fn fresh(
        &mut self,
        startup: &RuntimeData,
        bindings: impl IntoIterator<Item = [u8; 32]>,
    ) -> Result<FreshEvidence, AttestationError> {
        let mut doc = startup.clone();
        doc.set_challenge_bindings(bindings)
            .map_err(|e| AttestationError::Fresh(e.to_string()))?;
        let evidence = self.collect(&doc)?;
        let appraisal = self.appraise(&evidence, false);
        if !appraisal.passed() {
            tracing::warn!(
                failed = %appraisal.failures().map(|c| c.id.as_str()).collect::<Vec<_>>().join(", "),
                "attestation: the server's own appraisal rejects its fresh evidence"
            );
        }
        Ok(FreshEvidence {
            evidence,
            appraisal,
        })
    }
}

/// The server's attestation: the start-up evidence, and a worker thread that owns the evidence
/// sources and answers challenges with fresh evidence.
///
/// Challenges that arrive while a hardware request is in flight wait for the next one, which
/// serves all of them (up to [`MAX_CHALLENGE_BINDINGS`]): one hardware request at a time,
/// however many callers.
pub struct AttestationService {
    startup: Arc<StartupAttestation>,
    challenges: mpsc::Sender<Challenge>,
    hardware_requests: Arc<AtomicU64>,
}

/// Evidence sources opened (and, when asked, the platform checked and the GPU set ready), waiting
/// for the values the start-up evidence binds; see [`AttestationService::prepare`].
pub struct PreparedAttestation {
    bindings: mpsc::Sender<StartupBinding>,
    started: mpsc::Receiver<Result<Arc<StartupAttestation>, AttestationError>>,
    challenges: mpsc::Sender<Challenge>,
    hardware_requests: Arc<AtomicU64>,
}

impl std::fmt::Debug for PreparedAttestation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedAttestation")
            .finish_non_exhaustive()
    }
}

impl PreparedAttestation {
    /// Produces and appraises the start-up evidence binding `binding` (any rejection is an
    /// error) and keeps the worker for fresh evidence. Blocks until the evidence exists.
    pub fn start(self, binding: StartupBinding) -> Result<AttestationService, AttestationError> {
        let exited = || AttestationError::Task("the attestation worker exited".to_owned());
        self.bindings.send(binding).map_err(|_| exited())?;
        let startup = self.started.recv().map_err(|_| exited())??;
        Ok(AttestationService {
            startup,
            challenges: self.challenges,
            hardware_requests: self.hardware_requests,
        })
    }
}

impl AttestationService {
    /// Opens the evidence sources on a worker thread, produces and appraises the start-up
    /// evidence binding `binding` (any rejection is an error) and keeps the worker for fresh
    /// evidence. Blocks until the start-up evidence exists. [`AttestationService::prepare`]
    /// and [`PreparedAttestation::start`] split this in two.
    ///
    /// Hardware evidence is used whenever the machine offers it; without hardware, only the
    /// development profile falls back to the simulated TEE. `clock_floor` is the newest time
    /// the appliance already recorded (its audit log's newest record): the appraisal rejects a
    /// system clock earlier than it.
    pub fn start(
        config: &AttestationConfig,
        binding: StartupBinding,
        clock_floor: Option<ClockFloor>,
    ) -> Result<Self, AttestationError> {
        Self::prepare(config, clock_floor, false)?.start(binding)
    }

    /// Opens the evidence sources on a worker thread, ready for [`PreparedAttestation::start`].
    /// With `check_platform`, it first appraises the platform (CPU TEE, vTPM, GPU) on evidence
    /// that binds no start-up value and sets the GPU ready, failing on any rejection: the GPU
    /// may then be used (weights copied to it while the model is still read, so before its
    /// digest is known) while nothing is served until the start-up evidence binds the digest.
    /// Blocks until the sources are open and, with `check_platform`, the check passed.
    pub fn prepare(
        config: &AttestationConfig,
        clock_floor: Option<ClockFloor>,
        check_platform: bool,
    ) -> Result<PreparedAttestation, AttestationError> {
        let (challenges, queue) = mpsc::channel::<Challenge>();
        let (prepared_tx, prepared) = mpsc::channel();
        let (binding_tx, bindings) = mpsc::channel::<StartupBinding>();
        let (started_tx, started) = mpsc::channel();
        let hardware_requests = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&hardware_requests);
        let config = config.clone();
        std::thread::Builder::new()
            .name("attestation".to_owned())
            .spawn(move || {
                let opened = Attester::open(&config, clock_floor).and_then(|mut attester| {
                    if check_platform {
                        attester.check_platform()?;
                    }
                    Ok(attester)
                });
                let mut attester = match opened {
                    Ok(attester) => attester,
                    Err(err) => {
                        let _ = prepared_tx.send(Err(err));
                        return;
                    }
                };
                if prepared_tx.send(Ok(())).is_err() {
                    return;
                }
                // Dropped unstarted: the worker ends.
                let Ok(binding) = bindings.recv() else {
                    return;
                };
                let startup = match attester.startup(config.profile, &binding, check_platform) {
                    Ok(startup) => Arc::new(startup),
                    Err(err) => {
                        let _ = started_tx.send(Err(err));
                        return;
                    }
                };
                if started_tx.send(Ok(Arc::clone(&startup))).is_err() {
                    return;
                }
                serve_challenges(&mut attester, &startup.runtime_data, &queue, &counter);
            })
            .map_err(|e| AttestationError::Task(e.to_string()))?;
        prepared
            .recv()
            .map_err(|_| AttestationError::Task("the attestation worker exited".to_owned()))??;
        Ok(PreparedAttestation {
            bindings: binding_tx,
            started,
            challenges,
            hardware_requests,
        })
    }

    /// The start-up evidence.
    pub fn startup(&self) -> &Arc<StartupAttestation> {
        &self.startup
    }

    /// Fresh evidence whose runtime data carries `binding` (and those of the challenges served
    /// by the same hardware request).
    pub async fn fresh(&self, binding: [u8; 32]) -> Result<Arc<FreshEvidence>, AttestationError> {
        let (reply, answer) = oneshot::channel();
        self.challenges
            .send(Challenge { binding, reply })
            .map_err(|_| AttestationError::Stopped)?;
        answer.await.map_err(|_| AttestationError::Stopped)?
    }

    /// How many hardware requests fresh evidence has taken so far.
    pub fn hardware_requests(&self) -> u64 {
        self.hardware_requests.load(Ordering::Relaxed)
    }
}

/// The worker's loop: take every queued challenge (up to [`MAX_CHALLENGE_BINDINGS`]), answer
/// all of them with one hardware request, repeat until the service is dropped.
fn serve_challenges(
    attester: &mut Attester,
    startup: &RuntimeData,
    queue: &mpsc::Receiver<Challenge>,
    hardware_requests: &AtomicU64,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_CHALLENGE_BINDINGS {
            match queue.try_recv() {
                Ok(challenge) => batch.push(challenge),
                Err(_) => break,
            }
        }
        let result = attester
            .fresh(startup, batch.iter().map(|c| c.binding))
            .map(Arc::new)
            .map_err(|e| e.to_string());
        hardware_requests.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            challenges = batch.len(),
            ok = result.is_ok(),
            "attestation: fresh evidence"
        );
        for challenge in batch {
            // A caller that went away no longer waits for its answer.
            let _ = challenge.reply.send(match &result {
                Ok(fresh) => Ok(Arc::clone(fresh)),
                Err(reason) => Err(AttestationError::Fresh(reason.clone())),
            });
        }
    }
}

impl StartupAttestation {
    /// SHA-256 of the server policy's exact bytes, hex.
    pub fn policy_sha256(&self) -> &str {
        &self.runtime_data.policy_sha256
    }

    /// The evidence envelope as compact JSON: the value of the certificate's evidence
    /// extension, byte for byte the `evidence` member of [`Self::to_json`].
    pub fn evidence_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.evidence).unwrap_or_default()
    }

    /// The evidence for the audit log's start event: the JSON envelope, base64.
    pub fn evidence_blob(&self) -> EvidenceBlob {
        EvidenceBlob {
            kind: EVIDENCE_BLOB_KIND.to_owned(),
            data_b64: STANDARD.encode(self.evidence.to_json()),
        }
    }

    /// The audit event recording the appraisal and its report digest.
    pub fn appraisal_event(&self) -> SecurityEvent {
        SecurityEvent::Appraisal {
            subject: "startup".to_owned(),
            report_digest: self.appraisal_sha256.clone(),
            passed: self.appraisal.passed(),
            detail: format!(
                "policy {:?} (sha256 {}){}",
                self.appraisal.policy_name,
                self.appraisal.policy_sha256,
                if self.appraisal.simulated {
                    ", SIMULATED TEE"
                } else {
                    ""
                }
            ),
        }
    }

    /// The startup banner's attestation line; loud when the TEE is simulated.
    pub fn banner_line(&self) -> String {
        if self.appraisal.simulated {
            format!(
                "SIMULATED TEE ({} policy) -- NOT FOR PRODUCTION, no hardware protection",
                self.appraisal.policy_name
            )
        } else {
            let platform = match self.evidence.platform {
                Platform::SevSnp => "SEV-SNP",
                Platform::Tdx => "TDX",
            };
            format!(
                "{platform} evidence passed policy {:?}",
                self.appraisal.policy_name
            )
        }
    }

    /// The `GET /v1/attestation` document: evidence envelope, runtime-data document, appraisal.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Collects fresh CPU TEE (and, when configured, vTPM) evidence over `runtime_data`, for a key
/// broker's challenge (`crate::keybroker`). The same source as at start-up: hardware when the
/// machine offers it, the simulated TEE only in the development profile. No GPU section: the
/// key release concerns the CPU TEE; the GPU was attested at start-up. With a vTPM, this
/// session's AK is named in `runtime_data` (`tpm_ak_sha256`) before the report is taken.
pub fn collect_fresh_evidence(
    config: &AttestationConfig,
    runtime_data: &mut RuntimeData,
) -> Result<Evidence, AttestationError> {
    let policy = load_policy(config)?;
    let tpm = TpmAttester::open(config.tpm_tcti.as_deref(), &policy)?;
    if let Some(tpm) = &tpm {
        tpm.bind_ak(runtime_data)?;
    }
    let source: Box<dyn EvidenceSource> = match (detect_hardware(), config.profile) {
        (Some(hardware), _) => hardware,
        (None, AttestationProfile::Development) => simulated::tee()?,
        (None, AttestationProfile::Production) => return Err(AttestationError::NoHardware),
    };
    let mut evidence = collect_evidence(source.as_ref(), runtime_data)?;
    evidence.tpm = tpm.map(|mut t| t.quote(runtime_data)).transpose()?;
    Ok(evidence)
}

/// Reads the server policy that start-up attestation appraises with: the configured file, or the
/// profile's embedded policy. The reference values the policy names are not applied: they are
/// computed from the image the server is part of, so the image cannot hold them; its verifiers
/// apply them (`docs/deploy-airgapped.md`, section 7).
pub fn load_policy(config: &AttestationConfig) -> Result<LoadedPolicy, AttestationError> {
    let (name, loaded) = match (&config.policy, config.profile) {
        (Some(path), _) => (
            path.display().to_string(),
            LoadedPolicy::from_file_for_self_appraisal(path),
        ),
        (None, AttestationProfile::Development) => (
            "embedded development policy".to_owned(),
            LoadedPolicy::for_self_appraisal(DEVELOPMENT_POLICY),
        ),
        (None, AttestationProfile::Production) => (
            "embedded production policy".to_owned(),
            LoadedPolicy::for_self_appraisal(PRODUCTION_POLICY),
        ),
    };
    loaded.map_err(|source| AttestationError::Policy {
        source_name: name,
        source,
    })
}

/// SHA-256 of the DER SubjectPublicKeyInfo of a certificate given as DER or one PEM block.
pub fn tls_spki_sha256(cert: &[u8]) -> Result<[u8; 32], AttestationError> {
    let der = pki::certificate_der(cert, "TLS certificate")
        .map_err(|e| AttestationError::Certificate(e.to_string()))?;
    let parsed = pki::parse_certificate(&der, "TLS certificate")
        .map_err(|e| AttestationError::Certificate(e.to_string()))?;
    Ok(pki::sha256(parsed.tbs_certificate.subject_pki.raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINDING: StartupBinding = StartupBinding {
        tls_spki_sha256: [1; 32],
        audit_key: None,
        model_digest: [5; 32],
        quantized_at_load: Some(crate::model::QuantizeAtLoad::Fp8),
        ohttp_key_config_sha256: Some([6; 32]),
    };

    /// The start-up document carries every value of `binding`.
    fn assert_binds(doc: &RuntimeData, binding: &StartupBinding) {
        assert_eq!(
            doc.audit_key.as_deref(),
            binding.audit_key.map(hex::encode).as_deref()
        );
        assert_eq!(
            doc.tls_spki_sha256.as_deref(),
            Some(hex::encode(binding.tls_spki_sha256).as_str())
        );
        assert_eq!(
            doc.model_digest.as_deref(),
            Some(hex::encode(binding.model_digest).as_str())
        );
        assert_eq!(
            doc.quantized_at_load.as_deref(),
            binding.quantized_at_load.map(|q| q.name())
        );
        assert_eq!(
            doc.ohttp_key_config_sha256.as_deref(),
            binding.ohttp_key_config_sha256.map(hex::encode).as_deref()
        );
    }

    fn establish(
        config: &AttestationConfig,
        binding: StartupBinding,
        clock_floor: Option<ClockFloor>,
    ) -> Result<AttestationService, AttestationError> {
        AttestationService::start(config, binding, clock_floor)
    }

    #[test]
    #[cfg(feature = "simulated-tee")]
    fn development_profile_binds_keys_into_simulated_evidence() {
        let service = establish(
            &AttestationConfig::development(),
            StartupBinding {
                audit_key: Some([9; 32]),
                ..BINDING
            },
            None,
        )
        .unwrap();
        let attested = service.startup();
        assert!(attested.appraisal.passed());
        assert!(attested.appraisal.simulated);
        assert!(attested.banner_line().contains("SIMULATED TEE"));
        let doc = &attested.runtime_data;
        assert_binds(
            doc,
            &StartupBinding {
                audit_key: Some([9; 32]),
                ..BINDING
            },
        );
        assert!(doc.challenge_bindings.is_empty());
        assert_eq!(
            doc.policy_sha256,
            hex::encode(pki::sha256(DEVELOPMENT_POLICY))
        );
        assert_eq!(
            attested.appraisal.claims.runtime_data.as_ref(),
            Some(doc),
            "the appraisal verified the binding of this document"
        );
    }

    #[tokio::test]
    #[cfg(feature = "simulated-tee")]
    async fn fresh_evidence_binds_the_challenges_over_the_startup_document() {
        let service = establish(&AttestationConfig::development(), BINDING, None).unwrap();
        let fresh = service.fresh([0xaa; 32]).await.unwrap();
        assert_eq!(service.hardware_requests(), 1);
        assert!(fresh.appraisal.passed(), "{}", fresh.appraisal);
        let doc = fresh.appraisal.claims.runtime_data.as_ref().unwrap();
        assert_eq!(doc.challenge_bindings, [hex::encode([0xaa; 32])]);
        let mut without = doc.clone();
        without.challenge_bindings.clear();
        assert_eq!(&without, &service.startup().runtime_data);
    }

    #[tokio::test]
    #[cfg(feature = "simulated-tee")]
    async fn a_checked_platform_then_binds_the_startup_values() {
        let prepared =
            AttestationService::prepare(&AttestationConfig::development(), None, true).unwrap();
        let service = prepared.start(BINDING).unwrap();
        let attested = service.startup();
        assert!(attested.appraisal.passed(), "{}", attested.appraisal);
        let doc = &attested.runtime_data;
        assert_binds(doc, &BINDING);
        assert_eq!(attested.appraisal.claims.runtime_data.as_ref(), Some(doc));
        let fresh = service.fresh([0xbb; 32]).await.unwrap();
        assert!(fresh.appraisal.passed(), "{}", fresh.appraisal);
        assert_eq!(
            service.hardware_requests(),
            1,
            "start-up requests are not counted"
        );
    }

    #[test]
    #[cfg(feature = "simulated-tee")]
    fn a_rejected_platform_fails_before_anything_is_bound() {
        let future = time::OffsetDateTime::now_utc() + time::Duration::days(1);
        let floor = || {
            Some(ClockFloor::starting_at(
                future,
                "the audit log's newest record",
            ))
        };
        let config = AttestationConfig::development();
        let err = AttestationService::prepare(&config, floor(), true)
            .expect_err("the platform check fails closed")
            .to_string();
        assert!(err.contains("time.clock_floor"), "{err}");
        let unchecked = AttestationService::prepare(&config, floor(), false)
            .expect("without the check, nothing is appraised before start");
        let err = unchecked.start(BINDING).err().unwrap().to_string();
        assert!(err.contains("time.clock_floor"), "{err}");
    }

    #[test]
    fn production_profile_without_hardware_refuses() {
        if detect_hardware().is_some() {
            eprintln!("SKIPPED: this machine has TEE hardware");
            return;
        }
        let err = establish(&AttestationConfig::default(), BINDING, None)
            .err()
            .unwrap();
        assert!(matches!(err, AttestationError::NoHardware), "{err}");
    }

    #[test]
    #[cfg(feature = "simulated-tee")]
    fn a_system_clock_earlier_than_the_floor_is_rejected() {
        let future = time::OffsetDateTime::now_utc() + time::Duration::days(1);
        let floor = ClockFloor::starting_at(future, "the audit log's newest record");
        let err = establish(&AttestationConfig::development(), BINDING, Some(floor))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("time.clock_floor"), "{err}");
        assert!(err.contains("the audit log's newest record"), "{err}");
    }

    /// Start-up in the development profile with the policy file `policy`, which must fail.
    fn establish_in_development_with_policy(policy: &[u8]) -> AttestationError {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).unwrap();
        let config = AttestationConfig {
            policy: Some(path),
            ..AttestationConfig::development()
        };
        establish(&config, BINDING, None).err().unwrap()
    }

    #[test]
    #[cfg(feature = "simulated-tee")]
    fn development_profile_with_the_production_policy_is_rejected_as_simulated() {
        if detect_hardware().is_some() {
            eprintln!("SKIPPED: this machine has TEE hardware");
            return;
        }
        let err = establish_in_development_with_policy(PRODUCTION_POLICY);
        let msg = err.to_string();
        assert!(matches!(err, AttestationError::Rejected { .. }), "{msg}");
        assert!(msg.contains("production"), "{msg}");
    }

    #[test]
    fn a_policy_requiring_a_vtpm_refuses_without_one() {
        if std::path::Path::new(TPM_DEVICE).exists() {
            eprintln!("SKIPPED: {TPM_DEVICE} exists on this machine");
            return;
        }
        let text = std::str::from_utf8(DEVELOPMENT_POLICY).unwrap().replace(
            "[tpm]\n# A vTPM is verified when present, not required.\nrequired = false",
            "[tpm]\nrequired = true",
        );
        assert!(text.contains("[tpm]\nrequired = true"));
        let err = establish_in_development_with_policy(text.as_bytes());
        let msg = err.to_string();
        assert!(matches!(err, AttestationError::NoTpm { .. }), "{msg}");
        assert!(
            msg.contains("/dev/tpmrm0") && msg.contains("development"),
            "{msg}"
        );
    }
}
