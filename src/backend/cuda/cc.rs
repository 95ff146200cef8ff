//! Reading (never changing) the GPU's confidential-computing state, through the attestation
//! crate's NVML binding (`inferno_attestation::nvidia::nvml`), the one NVML binding of the
//! project.
//!
//! In CC mode every host-device copy goes through encrypted bounce buffers, which is why the
//! backend packs each step into one copy each way. The state is only logged.

use inferno_attestation::nvidia::CcMode;
use inferno_attestation::nvidia::nvml::Nvml;

/// The system's confidential-computing state as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcState {
    /// NVML's environment code (0: unavailable, 1: simulation, 2: hardware).
    pub environment: u32,
    /// Whether the CC feature is enabled.
    pub feature_enabled: bool,
    /// Whether devtools mode is on.
    pub devtools: bool,
}

/// Queries NVML for the CC state. `None` when NVML is missing or does not know the call (old
/// drivers); the caller logs that and carries on.
pub fn read_cc_state() -> Option<CcState> {
    let state = Nvml::load().and_then(|nvml| nvml.cc_state()).ok()?;
    Some(CcState {
        environment: state.environment,
        feature_enabled: state.mode != CcMode::Off,
        devtools: state.mode == CcMode::Devtools,
    })
}
