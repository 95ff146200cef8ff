//! Collection from a real GPU through NVML, loaded at run time with libloading.
//!
//! [`Nvml::load`] probes `libnvidia-ml.so.1` before calling anything, so machines without a
//! GPU or driver get a clean [`GpuError::Nvml`]. Only read-only queries are made, except
//! [`Nvml::set_ready_state`], which refuses unless the system is in CC mode: on a GPU that
//! is not in CC mode this module never changes a setting.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use libloading::Library;

use super::certs::pem_chain;
use super::error::GpuError;
use super::evidence::{CcMode, GpuEvidence};
use super::spdm::NONCE_LEN;

/// Library names tried in order.
const LIBRARY_NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];
/// NVML_SUCCESS.
const NVML_SUCCESS: c_int = 0;
/// Size of `nvmlConfComputeGpuCertificate_t::certChain`.
const CERT_CHAIN_SIZE: usize = 0x1000;
/// Size of `nvmlConfComputeGpuCertificate_t::attestationCertChain`.
const ATTESTATION_CERT_CHAIN_SIZE: usize = 0x1400;
/// Size of `nvmlConfComputeGpuAttestationReport_t::attestationReport`.
const ATTESTATION_REPORT_SIZE: usize = 0x2000;
/// Size of `nvmlConfComputeGpuAttestationReport_t::cecAttestationReport`.
const CEC_ATTESTATION_REPORT_SIZE: usize = 0x1000;

/// `nvmlConfComputeSystemState_t`.
#[repr(C)]
#[derive(Default)]
struct RawSystemState {
    environment: c_uint,
    cc_feature: c_uint,
    dev_tools_mode: c_uint,
}

/// `nvmlConfComputeGpuCertificate_t`.
#[repr(C)]
struct RawCertificate {
    cert_chain_size: c_uint,
    attestation_cert_chain_size: c_uint,
    cert_chain: [u8; CERT_CHAIN_SIZE],
    attestation_cert_chain: [u8; ATTESTATION_CERT_CHAIN_SIZE],
}

/// `nvmlConfComputeGpuAttestationReport_t`.
#[repr(C)]
struct RawAttestationReport {
    is_cec_attestation_report_present: c_uint,
    attestation_report_size: c_uint,
    cec_attestation_report_size: c_uint,
    nonce: [u8; NONCE_LEN],
    attestation_report: [u8; ATTESTATION_REPORT_SIZE],
    cec_attestation_report: [u8; CEC_ATTESTATION_REPORT_SIZE],
}

/// The system CC state as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcState {
    /// CC mode (devtools when the feature is on with developer tools enabled).
    pub mode: CcMode,
    /// `NVML_CC_SYSTEM_ENVIRONMENT_*`: 0 unavailable, 1 simulation, 2 production.
    pub environment: u32,
}

/// An initialised NVML; shut down on drop.
pub struct Nvml {
    lib: Library,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

/// `nvmlDevice_t`.
type Device = *mut c_void;

impl Nvml {
    /// Loads and initialises NVML, or explains why it is unavailable.
    pub fn load() -> Result<Self, GpuError> {
        let mut last = String::new();
        for name in LIBRARY_NAMES {
            // SAFETY: loading the NVIDIA management library runs its initialisers, which have
            // no preconditions; the library is kept alive in `Nvml` for every symbol used.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    // SAFETY: nvmlInit_v2 takes no arguments and returns an nvmlReturn_t; the
                    // library outlives the call.
                    let rc = unsafe {
                        let init = lib
                            .get::<unsafe extern "C" fn() -> c_int>(b"nvmlInit_v2")
                            .map_err(|e| GpuError::Nvml(format!("{name}: no nvmlInit_v2: {e}")))?;
                        init()
                    };
                    if rc != NVML_SUCCESS {
                        return Err(GpuError::Nvml(format!(
                            "nvmlInit_v2: {}",
                            error_string(&lib, rc)
                        )));
                    }
                    return Ok(Self { lib });
                }
                Err(e) => last = format!("{name}: {e}"),
            }
        }
        Err(GpuError::Nvml(format!(
            "no NVIDIA driver library (no GPU or driver on this machine): {last}"
        )))
    }

    /// Calls a symbol of type `fn() -> nvmlReturn_t`.
    ///
    /// # Safety
    /// `name` must be an NVML function taking no arguments.
    unsafe fn call0(&self, name: &str) -> Result<c_int, GpuError> {
        // SAFETY: the caller guarantees the signature; the library outlives the call.
        unsafe {
            let f = self.symbol::<unsafe extern "C" fn() -> c_int>(name)?;
            Ok(f())
        }
    }

    /// Looks up a symbol.
    ///
    /// # Safety
    /// `T` must be the symbol's true type.
    unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T, GpuError> {
        // SAFETY: the caller guarantees `T`; the library lives as long as `self`.
        unsafe {
            self.lib
                .get::<T>(name.as_bytes())
                .map(|s| *s)
                .map_err(|e| GpuError::Nvml(format!("{name} not in the driver library: {e}")))
        }
    }

    /// Maps a return code to a result.
    fn check(&self, rc: c_int, what: &str) -> Result<(), GpuError> {
        if rc == NVML_SUCCESS {
            Ok(())
        } else {
            Err(GpuError::Nvml(format!(
                "{what}: {}",
                error_string(&self.lib, rc)
            )))
        }
    }

    /// The system's confidential-computing state (read only).
    pub fn cc_state(&self) -> Result<CcState, GpuError> {
        let mut raw = RawSystemState::default();
        // SAFETY: the function fills an nvmlConfComputeSystemState_t, which RawSystemState
        // mirrors (three unsigned ints); the pointer is valid for the call.
        let rc = unsafe {
            let f = self.symbol::<unsafe extern "C" fn(*mut RawSystemState) -> c_int>(
                "nvmlSystemGetConfComputeState",
            )?;
            f(&mut raw)
        };
        self.check(rc, "nvmlSystemGetConfComputeState")?;
        let mode = match (raw.cc_feature, raw.dev_tools_mode) {
            (0, _) => CcMode::Off,
            (_, 0) => CcMode::On,
            _ => CcMode::Devtools,
        };
        Ok(CcState {
            mode,
            environment: raw.environment,
        })
    }

    /// Whether the GPUs accept work (the CC ready state; read only).
    pub fn ready_state(&self) -> Result<bool, GpuError> {
        let mut accepting: c_uint = 0;
        // SAFETY: the function writes one unsigned int through a valid pointer.
        let rc = unsafe {
            let f = self.symbol::<unsafe extern "C" fn(*mut c_uint) -> c_int>(
                "nvmlSystemGetConfComputeGpusReadyState",
            )?;
            f(&mut accepting)
        };
        self.check(rc, "nvmlSystemGetConfComputeGpusReadyState")?;
        Ok(accepting != 0)
    }

    /// Number of GPUs.
    pub fn device_count(&self) -> Result<u32, GpuError> {
        let mut count: c_uint = 0;
        // SAFETY: the function writes one unsigned int through a valid pointer.
        let rc = unsafe {
            let f =
                self.symbol::<unsafe extern "C" fn(*mut c_uint) -> c_int>("nvmlDeviceGetCount_v2")?;
            f(&mut count)
        };
        self.check(rc, "nvmlDeviceGetCount_v2")?;
        Ok(count)
    }

    /// Handle of GPU `index`.
    fn device(&self, index: u32) -> Result<Device, GpuError> {
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: the function writes an opaque nvmlDevice_t through a valid pointer.
        let rc = unsafe {
            let f = self.symbol::<unsafe extern "C" fn(c_uint, *mut Device) -> c_int>(
                "nvmlDeviceGetHandleByIndex_v2",
            )?;
            f(index, &mut device)
        };
        self.check(rc, &format!("nvmlDeviceGetHandleByIndex_v2({index})"))?;
        Ok(device)
    }

    /// Collects the SPDM report for `nonce` and the device chain of GPU `index`, with the
    /// current CC and ready states. Fails cleanly when the system is not in CC mode.
    pub fn collect(&self, index: u32, nonce: &[u8; NONCE_LEN]) -> Result<GpuEvidence, GpuError> {
        let state = self.cc_state()?;
        if state.mode == CcMode::Off {
            return Err(GpuError::Nvml(
                "the GPU is not in CC mode: no attestation report (state left unchanged)".into(),
            ));
        }
        let ready_state = self.ready_state()?;
        let device = self.device(index)?;
        let mut report = Box::new(RawAttestationReport {
            is_cec_attestation_report_present: 0,
            attestation_report_size: 0,
            cec_attestation_report_size: 0,
            nonce: *nonce,
            attestation_report: [0; ATTESTATION_REPORT_SIZE],
            cec_attestation_report: [0; CEC_ATTESTATION_REPORT_SIZE],
        });
        // SAFETY: RawAttestationReport mirrors nvmlConfComputeGpuAttestationReport_t; the
        // boxed struct is valid and exclusively borrowed for the call; `device` came from NVML.
        let rc = unsafe {
            let f = self
                .symbol::<unsafe extern "C" fn(Device, *mut RawAttestationReport) -> c_int>(
                    "nvmlDeviceGetConfComputeGpuAttestationReport",
                )?;
            f(device, &mut *report)
        };
        self.check(rc, "nvmlDeviceGetConfComputeGpuAttestationReport")?;
        let report_len = bounded(
            report.attestation_report_size,
            ATTESTATION_REPORT_SIZE,
            "report",
        )?;
        let mut cert = Box::new(RawCertificate {
            cert_chain_size: 0,
            attestation_cert_chain_size: 0,
            cert_chain: [0; CERT_CHAIN_SIZE],
            attestation_cert_chain: [0; ATTESTATION_CERT_CHAIN_SIZE],
        });
        // SAFETY: RawCertificate mirrors nvmlConfComputeGpuCertificate_t; the boxed struct
        // is valid and exclusively borrowed for the call; `device` came from NVML.
        let rc = unsafe {
            let f = self.symbol::<unsafe extern "C" fn(Device, *mut RawCertificate) -> c_int>(
                "nvmlDeviceGetConfComputeGpuCertificate",
            )?;
            f(device, &mut *cert)
        };
        self.check(rc, "nvmlDeviceGetConfComputeGpuCertificate")?;
        let chain_len = bounded(
            cert.attestation_cert_chain_size,
            ATTESTATION_CERT_CHAIN_SIZE,
            "attestation certificate chain",
        )?;
        let cert_chain = split_chain(&cert.attestation_cert_chain[..chain_len])?;
        Ok(GpuEvidence {
            report: report.attestation_report[..report_len].to_vec(),
            cert_chain,
            cc_mode: state.mode,
            ready_state,
        })
    }

    /// Sets the CC ready state, after the server's own evidence passed appraisal. Refuses,
    /// changing nothing, unless the system is in CC mode.
    pub fn set_ready_state(&self, ready: bool) -> Result<(), GpuError> {
        if self.cc_state()?.mode == CcMode::Off {
            return Err(GpuError::Nvml(
                "refusing to set the ready state: the GPU is not in CC mode".into(),
            ));
        }
        // SAFETY: the function takes one unsigned int by value.
        let rc = unsafe {
            let f = self.symbol::<unsafe extern "C" fn(c_uint) -> c_int>(
                "nvmlSystemSetConfComputeGpusReadyState",
            )?;
            f(c_uint::from(ready))
        };
        self.check(rc, "nvmlSystemSetConfComputeGpusReadyState")
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: nvmlShutdown takes no arguments; NVML was initialised by `load`.
        if let Ok(rc) = unsafe { self.call0("nvmlShutdown") }
            && rc != NVML_SUCCESS
        {
            tracing::warn!(rc, "nvmlShutdown failed");
        }
    }
}

/// NVML's text for a return code.
fn error_string(lib: &Library, rc: c_int) -> String {
    // SAFETY: nvmlErrorString takes an nvmlReturn_t and returns a static C string (or null,
    // which is checked); the library outlives the call.
    let text = unsafe {
        lib.get::<unsafe extern "C" fn(c_int) -> *const c_char>(b"nvmlErrorString")
            .ok()
            .map(|f| f(rc))
            .filter(|p| !p.is_null())
            .map(|p| CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    text.unwrap_or_else(|| format!("NVML error {rc}"))
}

/// Checks a size reported by NVML against its buffer.
fn bounded(size: c_uint, max: usize, what: &str) -> Result<usize, GpuError> {
    usize::try_from(size)
        .ok()
        .filter(|s| *s <= max)
        .ok_or_else(|| GpuError::Nvml(format!("{what} size {size} exceeds its {max}-byte buffer")))
}

/// Splits the attestation chain, PEM or concatenated DER, into DER certificates.
pub fn split_chain(bytes: &[u8]) -> Result<Vec<Vec<u8>>, GpuError> {
    if bytes.starts_with(b"-----BEGIN") {
        return pem_chain(bytes, "device");
    }
    let mut rest = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (after, _) =
            x509_parser::parse_x509_certificate(rest).map_err(|e| GpuError::CertChain {
                chain: "device",
                reason: format!("certificate {} in the NVML chain: {e}", out.len()),
            })?;
        let used = rest.len() - after.len();
        out.push(rest[..used].to_vec());
        rest = after;
    }
    Ok(out)
}
