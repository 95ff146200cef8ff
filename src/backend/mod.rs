//! Forward-pass implementations of [`crate::engine::Backend`], and the choice between them.

pub mod cpu;

use crate::engine::{Backend, EngineConfig};
use crate::model::Model;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The f32 CPU reference backend.
    Cpu,
    /// The CUDA backend; fails when no NVIDIA driver and GPU are present.
    Cuda,
    /// CUDA when a driver and GPU are present, otherwise the CPU.
    #[default]
    Auto,
}

/// No backend could be built for the requested device.
#[derive(Debug, thiserror::Error)]
pub enum BackendInitError {
    /// The CPU backend failed to build.
    #[error(transparent)]
    Cpu(#[from] cpu::CpuBackendError),
    /// CUDA was requested but cannot be used here.
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(String),
}

/// Builds the backend for `device`.
pub fn select(
    device: Device,
    model: &Model,
    config: &EngineConfig,
) -> Result<Box<dyn Backend>, BackendInitError> {
    match device {
        Device::Cpu | Device::Auto => Ok(Box::new(cpu::CpuBackend::new(
            model,
            config.kv_cache_bytes,
        )?)),
        Device::Cuda => Err(BackendInitError::CudaUnavailable(
            "this build has no CUDA backend".into(),
        )),
    }
}
