//! Collection: obtaining evidence from the platform, behind the [`EvidenceSource`] trait so that
//! everything above it compiles and is tested on any machine.
//!
//! Sources: Linux configfs-tsm ([`configfs::ConfigFsTsm`], SEV-SNP and TDX), `/dev/sev-guest`
//! ([`sev_guest::SevGuestDevice`]) and, with the feature `simulated`, the simulated TEE
//! (`simulated::SimulatedSnp`).

pub mod configfs;
pub mod sev_guest;
#[cfg(feature = "simulated")]
pub mod simulated;

use crate::evidence::{Base64Bytes, EVIDENCE_VERSION, Evidence, SnpEvidence, TdxEvidence};
use crate::policy::Platform;
use crate::runtime_data::RuntimeData;

/// Errors while collecting evidence.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// A device or configfs file could not be used.
    #[error("{what}: {source}")]
    Io {
        /// The path or operation.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The platform returned something malformed or unexpected.
    #[error("{0}")]
    Platform(String),
    /// The runtime-data document is invalid.
    #[error("runtime-data document: {0}")]
    RuntimeData(#[from] crate::runtime_data::RuntimeDataError),
}

/// Platform evidence for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformEvidence {
    /// An SEV-SNP report and its certificates.
    SevSnp(SnpEvidence),
    /// A TDX quote.
    Tdx(TdxEvidence),
}

/// Something that produces CPU TEE evidence over caller-chosen REPORT_DATA.
pub trait EvidenceSource {
    /// Produces evidence whose REPORT_DATA is `report_data`.
    fn collect(&self, report_data: &[u8; 64]) -> Result<PlatformEvidence, CollectError>;
}

/// Collects evidence binding `runtime_data` (its SHA-512 becomes REPORT_DATA) into an envelope.
/// The caller adds vTPM and GPU sections collected with [`RuntimeData::tpm_qualifying_data`]
/// and [`RuntimeData::gpu_nonce`].
pub fn collect_evidence(
    source: &dyn EvidenceSource,
    runtime_data: &RuntimeData,
) -> Result<Evidence, CollectError> {
    runtime_data.validate()?;
    let report_data = runtime_data.report_data();
    let platform_evidence = source.collect(&report_data)?;
    let (platform, sev_snp, tdx) = match platform_evidence {
        PlatformEvidence::SevSnp(e) => (Platform::SevSnp, Some(e), None),
        PlatformEvidence::Tdx(e) => (Platform::Tdx, None, Some(e)),
    };
    Ok(Evidence {
        version: EVIDENCE_VERSION,
        platform,
        runtime_data: Some(Base64Bytes(runtime_data.to_canonical_bytes())),
        sev_snp,
        tdx,
        tpm: None,
        gpu: None,
    })
}

/// The hardware source on this machine: configfs-tsm when the kernel offers it, otherwise
/// `/dev/sev-guest`. `None` when neither exists (not a confidential VM).
pub fn detect_hardware() -> Option<Box<dyn EvidenceSource>> {
    let tsm = configfs::ConfigFsTsm::default();
    if tsm.available() {
        tracing::info!(root = %tsm.root().display(), "using configfs-tsm for attestation");
        return Some(Box::new(tsm));
    }
    let dev = sev_guest::SevGuestDevice::default();
    if dev.available() {
        tracing::info!("using /dev/sev-guest for attestation");
        return Some(Box::new(dev));
    }
    None
}
