//! Finding a usable NVIDIA driver and GPU without letting cudarc panic.
//!
//! cudarc loads the CUDA libraries lazily and panics when one is missing, so every library the
//! backend uses is looked for first; only then does the backend call into cudarc.

use cudarc::driver::result as drv;

/// Why the CUDA backend cannot run on this machine. The message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    /// The driver library is not installed.
    #[error("no NVIDIA driver: libcuda.so could not be loaded")]
    NoDriver,
    /// The driver is present but a CUDA library the backend needs is not.
    #[error(
        "CUDA library {0} could not be loaded (set LD_LIBRARY_PATH to the CUDA 13 lib directory)"
    )]
    MissingLibrary(&'static str),
    /// The driver refused to initialise.
    #[error("the NVIDIA driver failed to initialise: {0}")]
    InitFailed(String),
    /// The driver works but sees no GPU.
    #[error("the NVIDIA driver reports no GPU")]
    NoDevice,
}

/// Checks that the driver, NVRTC and cuBLASLt load and that at least one GPU is visible.
/// Returns the number of GPUs.
pub fn probe() -> Result<usize, CudaUnavailable> {
    // SAFETY: the probes only try to open the libraries by name (running their initialisers,
    // which are the vendor's own) and report whether that worked; nothing is called through them.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err(CudaUnavailable::NoDriver);
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaUnavailable::MissingLibrary("libnvrtc"));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        return Err(CudaUnavailable::MissingLibrary("libcublasLt"));
    }
    drv::init().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    let count = drv::device::get_count().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevice);
    }
    Ok(count as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the NVIDIA driver (CI), the probe fails with a one-line cause
    /// instead of panicking. On a GPU machine it finds at least one device.
    #[test]
    fn probe_reports_a_one_line_cause_or_a_device() {
        match probe() {
            Ok(count) => assert!(count >= 1),
            Err(err) => {
                let text = err.to_string();
                assert!(!text.contains('\n'), "multi-line cause: {text}");
                assert!(!text.is_empty());
            }
        }
    }
}
