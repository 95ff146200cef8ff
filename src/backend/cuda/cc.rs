//! Reading (never changing) the GPU's confidential-computing state through NVML.
//!
//! In CC mode every host-device copy goes through encrypted bounce buffers, which is why the
//! backend packs each step into one copy each way. The state is only logged.

use std::ffi::c_uint;

/// The system's confidential-computing state as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcState {
    /// NVML's environment code (0: unavailable, 1: simulation, 2: hardware).
    pub environment: u32,
    /// Whether the CC feature is enabled (1) or not (0).
    pub feature_enabled: bool,
    /// Whether devtools mode is on.
    pub devtools: bool,
}

#[repr(C)]
#[derive(Default)]
struct NvmlConfComputeSystemState {
    environment: c_uint,
    cc_feature: c_uint,
    dev_tools_mode: c_uint,
}

type NvmlInit = unsafe extern "C" fn() -> c_uint;
type NvmlGetCc = unsafe extern "C" fn(*mut NvmlConfComputeSystemState) -> c_uint;
type NvmlShutdown = unsafe extern "C" fn() -> c_uint;

/// Queries NVML for the CC state. `None` when NVML is missing or does not know the call (old
/// drivers); the caller logs that and carries on.
pub fn read_cc_state() -> Option<CcState> {
    // SAFETY: loading NVML runs the vendor library's initialisers; the symbols below are looked
    // up with the exact C signatures NVML documents (nvml.h), and the state struct is
    // `#[repr(C)]` with the documented three unsigned ints. Init is paired with shutdown.
    unsafe {
        let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
        let init: libloading::Symbol<NvmlInit> = lib.get(b"nvmlInit_v2\0").ok()?;
        let get: libloading::Symbol<NvmlGetCc> =
            lib.get(b"nvmlSystemGetConfComputeState\0").ok()?;
        let shutdown: libloading::Symbol<NvmlShutdown> = lib.get(b"nvmlShutdown\0").ok()?;
        if init() != 0 {
            return None;
        }
        let mut state = NvmlConfComputeSystemState::default();
        let rc = get(&mut state);
        shutdown();
        (rc == 0).then_some(CcState {
            environment: state.environment,
            feature_enabled: state.cc_feature == 1,
            devtools: state.dev_tools_mode == 1,
        })
    }
}
