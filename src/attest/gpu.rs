//! The GPU part of start-up attestation: read the CC state of the GPU the CUDA backend will
//! use, refuse a GPU that is not in CC mode when the policy requires it, collect its SPDM report
//! over the runtime data, and set the CC ready state only after the appraisal passed.
//!
//! On a GPU that is not in CC mode only state is read; no GPU setting is ever changed. The
//! development profile without a CC-mode GPU attaches evidence from the crate's simulated GPU
//! (fixed test seed), which only the development policy trusts and every appraisal names
//! "simulated".

use inferno_attestation::nvidia::nvml::Nvml;
use inferno_attestation::nvidia::{CcMode, GpuEvidence};
use inferno_attestation::policy::LoadedPolicy;

use super::{AttestationError, simulated};
use crate::config::AttestationProfile;

/// The GPU the server attests: the one the CUDA backend uses first.
const GPU_INDEX: u32 = 0;
/// How the refusal names the GPU.
const GPU_NAME: &str = "GPU 0 (NVML)";

/// Where the GPU section of the start-up evidence comes from.
#[derive(Debug)]
pub(super) enum GpuAttester {
    /// No GPU evidence: the CPU backend outside the development profile, or a GPU that is
    /// not in CC mode under a policy that allows it (state read only, nothing changed).
    Absent,
    /// A GPU in CC mode (or CC developer-tools mode), read and later readied through NVML.
    Hardware(Nvml),
    /// The crate's simulated GPU (development profile only).
    Simulated(Box<simulated::Gpu>),
}

impl GpuAttester {
    /// Decides the GPU source before any evidence is collected. `cuda` says whether the
    /// selected backend is CUDA. Refuses (fail closed) when the policy requires CC mode and the
    /// GPU is not in it, or its state cannot be read.
    pub(super) fn prepare(
        policy: &LoadedPolicy,
        profile: AttestationProfile,
        cuda: bool,
    ) -> Result<Self, AttestationError> {
        let require_cc = policy.policy.gpu.require_cc_mode;
        if cuda {
            let state = Nvml::load().and_then(|nvml| nvml.cc_state().map(|s| (nvml, s.mode)));
            match state {
                Ok((nvml, mode)) => {
                    check_cc_mode(mode, require_cc, &policy.policy.name)?;
                    if mode != CcMode::Off {
                        return Ok(Self::Hardware(nvml));
                    }
                    tracing::warn!(
                        gpu = GPU_NAME,
                        "the GPU is not in CC mode; the policy allows it: no GPU evidence from it, no GPU setting changed"
                    );
                }
                Err(e) if require_cc => {
                    return Err(AttestationError::GpuState {
                        gpu: GPU_NAME,
                        cause: e.to_string(),
                        policy: policy.policy.name.clone(),
                    });
                }
                Err(e) => {
                    tracing::warn!(gpu = GPU_NAME, error = %e, "cannot read the GPU's CC state");
                }
            }
        }
        match profile {
            AttestationProfile::Development => Ok(Self::Simulated(Box::new(simulated::gpu()?))),
            AttestationProfile::Production => Ok(Self::Absent),
        }
    }

    /// The GPU section over `nonce` (the runtime data's `gpu_nonce()`), if any.
    pub(super) fn collect(
        &self,
        nonce: &[u8; 32],
    ) -> Result<Option<GpuEvidence>, AttestationError> {
        let evidence = match self {
            Self::Absent => return Ok(None),
            Self::Hardware(nvml) => nvml.collect(GPU_INDEX, nonce),
            Self::Simulated(gpu) => gpu.evidence(nonce),
        };
        evidence
            .map(Some)
            .map_err(|e| AttestationError::Gpu(e.to_string()))
    }

    /// Sets the CC ready state on a hardware GPU in CC mode; called only after the appraisal
    /// passed. Changes nothing for the simulated or an absent GPU.
    pub(super) fn set_ready(&self) -> Result<(), AttestationError> {
        match self {
            Self::Hardware(nvml) => {
                nvml.set_ready_state(true)
                    .map_err(|e| AttestationError::Gpu(format!("setting the ready state: {e}")))?;
                tracing::info!(
                    gpu = GPU_NAME,
                    "GPU CC ready state set after a passing appraisal"
                );
                Ok(())
            }
            Self::Absent | Self::Simulated(_) => Ok(()),
        }
    }
}

/// Refuses a GPU whose CC mode is not `On` when the policy requires CC mode.
pub(super) fn check_cc_mode(
    mode: CcMode,
    require_cc: bool,
    policy: &str,
) -> Result<(), AttestationError> {
    if require_cc && mode != CcMode::On {
        return Err(AttestationError::GpuNotInCcMode {
            gpu: GPU_NAME,
            mode,
            policy: policy.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_requiring_cc() -> LoadedPolicy {
        let text = std::str::from_utf8(super::super::DEVELOPMENT_POLICY)
            .unwrap()
            .replace("require_cc_mode = false", "require_cc_mode = true");
        LoadedPolicy::from_bytes(text.as_bytes()).unwrap()
    }

    #[test]
    #[cfg(feature = "simulated-tee")]
    fn a_simulated_gpu_not_in_cc_mode_is_refused_when_the_policy_requires_cc_mode() {
        use inferno_attestation::nvidia::simulated::SimulatedGpuConfig;
        let gpu = simulated::gpu_with(SimulatedGpuConfig {
            cc_mode: CcMode::Off,
            ..SimulatedGpuConfig::default()
        })
        .unwrap();
        let mode = gpu.evidence(&[7; 32]).unwrap().cc_mode;
        let policy = policy_requiring_cc();
        let err = check_cc_mode(mode, true, &policy.policy.name).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, AttestationError::GpuNotInCcMode { .. }),
            "{msg}"
        );
        assert!(
            msg.contains("GPU 0") && msg.contains("development"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert!(check_cc_mode(CcMode::Devtools, true, "p").is_err());
        assert!(check_cc_mode(CcMode::Off, false, "p").is_ok());
        assert!(check_cc_mode(CcMode::On, true, "p").is_ok());
    }

    #[test]
    fn cuda_without_a_readable_gpu_is_refused_when_the_policy_requires_cc_mode() {
        if Nvml::load().is_ok() {
            eprintln!("SKIPPED: NVML loads on this machine");
            return;
        }
        let err = GpuAttester::prepare(
            &policy_requiring_cc(),
            AttestationProfile::Development,
            true,
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, AttestationError::GpuState { .. }), "{msg}");
        assert!(
            msg.contains("GPU 0") && msg.contains("requires CC mode"),
            "{msg}"
        );
    }
}
