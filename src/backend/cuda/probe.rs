//! Finding a usable NVIDIA driver and GPU without letting cudarc panic.
//!
//! cudarc loads the CUDA libraries lazily and panics when one is missing, so every library the
//! backend uses is looked for first; only then does the backend call into cudarc.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;

use cudarc::driver::result as drv;
use rustix::fs::{Advice, fadvise};

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

/// Loads the CUDA driver, NVRTC and cuBLASLt libraries (dlopen, kept loaded for cudarc) and asks
/// the kernel to read them and this executable into the page cache in the background
/// (`posix_fadvise(WILLNEED)`), without initialising the driver or calling any library function,
/// so that it may be called before the GPU may be used. After a cold boot the GPU context would
/// otherwise fault the driver in from disk page by page once the model is read (on the H200 host
/// the cold context took 1.1 s without this, 0.87 s with it, 0.33–0.44 s warm), and the device
/// probe and the product planner would each load their library on the start-up's critical path.
/// Returns the files advised.
pub fn prefetch_driver() -> Vec<PathBuf> {
    // SAFETY: these only load the libraries (dlopen); `culib` keeps each loaded for cudarc's
    // later calls and is reached only once its library is known to be present. No CUDA, NVRTC
    // or cuBLASLt function is called.
    unsafe {
        if cudarc::driver::sys::is_culib_present() {
            cudarc::driver::sys::culib();
        }
        if cudarc::nvrtc::sys::is_culib_present() {
            cudarc::nvrtc::sys::culib();
        }
        if cudarc::cublaslt::sys::is_culib_present() {
            cudarc::cublaslt::sys::culib();
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut files: BTreeSet<PathBuf> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| {
            ["libcuda.so", "libnvrtc", "libcublasLt.so"]
                .iter()
                .any(|name| path.contains(name))
        })
        .map(PathBuf::from)
        .collect();
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        files.insert(exe);
    }
    files
        .into_iter()
        .filter(|path| {
            File::open(path)
                .and_then(|file| Ok(fadvise(&file, 0, None, Advice::WillNeed)?))
                .is_ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefetching needs no driver: this executable is always advised.
    #[test]
    fn prefetching_advises_at_least_this_executable() {
        let advised = prefetch_driver();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(advised.contains(&exe), "{advised:?}");
    }

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
