//! The development profile's simulated TEE and GPU. They exist only in builds with the
//! `simulated-tee` feature (on by default), which carries the attestation crate's test keys; a
//! build without it (`--no-default-features`) carries none and refuses the development profile
//! with [`AttestationError::NoSimulator`].

use inferno_attestation::collect::EvidenceSource;
#[cfg(not(feature = "simulated-tee"))]
use inferno_attestation::nvidia::{GpuError, GpuEvidence};

use super::AttestationError;

#[cfg(feature = "simulated-tee")]
pub(super) use inferno_attestation::nvidia::simulated::SimulatedGpu as Gpu;

/// Stands for the simulated GPU in a build without it: no value of it exists.
#[cfg(not(feature = "simulated-tee"))]
#[derive(Debug)]
pub(super) enum Gpu {}

#[cfg(not(feature = "simulated-tee"))]
impl Gpu {
    /// Never called: there is no simulated GPU to ask.
    pub(super) fn evidence(&self, _nonce: &[u8; 32]) -> Result<GpuEvidence, GpuError> {
        match *self {}
    }
}

/// The simulated SEV-SNP guest.
pub(super) fn tee() -> Result<Box<dyn EvidenceSource>, AttestationError> {
    #[cfg(feature = "simulated-tee")]
    {
        Ok(Box::new(
            inferno_attestation::collect::simulated::SimulatedSnp::new()?,
        ))
    }
    #[cfg(not(feature = "simulated-tee"))]
    {
        Err(AttestationError::NoSimulator)
    }
}

/// The simulated GPU from the crate's fixed test seed, in its default configuration.
pub(super) fn gpu() -> Result<Gpu, AttestationError> {
    #[cfg(feature = "simulated-tee")]
    {
        gpu_with(inferno_attestation::nvidia::simulated::SimulatedGpuConfig::default())
    }
    #[cfg(not(feature = "simulated-tee"))]
    {
        Err(AttestationError::NoSimulator)
    }
}

/// The simulated GPU from the crate's fixed test seed, configured.
#[cfg(feature = "simulated-tee")]
pub(super) fn gpu_with(
    config: inferno_attestation::nvidia::simulated::SimulatedGpuConfig,
) -> Result<Gpu, AttestationError> {
    Gpu::new(inferno_attestation::nvidia::simulated::TEST_SEED, config)
        .map_err(|e| AttestationError::Gpu(e.to_string()))
}

#[cfg(all(test, not(feature = "simulated-tee")))]
mod tests {
    #[test]
    fn a_build_without_the_simulator_refuses_the_development_profile() {
        let err = super::tee().err().expect("no simulated TEE in this build");
        assert!(err.to_string().contains("simulated-tee"), "{err}");
        assert!(super::gpu().is_err());
    }
}
