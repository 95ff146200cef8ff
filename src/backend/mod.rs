//! Forward-pass implementations of [`crate::engine::Backend`], and choosing one for a device.

use std::str::FromStr;

pub mod cpu;

use crate::engine::{Backend, EngineConfig};
use crate::model::Model;

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU reference backend.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
    /// CUDA when available, else the CPU.
    Auto,
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "auto" => Ok(Self::Auto),
            other => Err(format!("unknown device {other:?}: use cpu, cuda or auto")),
        }
    }
}

/// No backend could be built for the requested device.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// This build has no CUDA backend.
    #[error("CUDA backend not available")]
    CudaUnavailable,
    /// The CPU backend could not be built.
    #[error("cannot start the CPU backend: {0}")]
    Cpu(String),
}

/// Builds the backend for `device`. `auto` picks the CPU until the CUDA backend exists.
pub fn select(
    device: Device,
    model: &Model,
    config: &EngineConfig,
) -> Result<Box<dyn Backend>, SelectError> {
    match device {
        Device::Cuda => Err(SelectError::CudaUnavailable),
        Device::Cpu | Device::Auto => cpu::CpuBackend::new(model, config.kv_cache_bytes)
            .map(|backend| Box::new(backend) as Box<dyn Backend>)
            .map_err(|err| SelectError::Cpu(err.to_string())),
    }
}
