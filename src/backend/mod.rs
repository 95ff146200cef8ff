//! Forward-pass implementations of [`crate::engine::Backend`] and the choice between them.

pub mod cpu;
pub mod cuda;

use std::str::FromStr;

use crate::engine::{Backend, EngineConfig};
use crate::model::Model;

/// Which device runs the forward pass (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend; fails when no driver or GPU is present.
    Cuda,
    /// CUDA when a driver and GPU are present, else the CPU.
    #[default]
    Auto,
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "auto" => Ok(Self::Auto),
            other => Err(format!(
                "unknown device {other:?} (expected cpu, cuda or auto)"
            )),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Auto => "auto",
        })
    }
}

/// A backend could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BackendInitError {
    /// The CPU backend failed.
    #[error("CPU backend: {0}")]
    Cpu(String),
    /// The CUDA backend failed (or no GPU is present for `--device cuda`).
    #[error("CUDA backend: {0}")]
    Cuda(#[from] cuda::CudaInitError),
}

/// Creates the backend for `device`. `auto` picks CUDA when the driver loads and reports a GPU,
/// and the CPU otherwise (logging why).
pub fn select(
    device: Device,
    model: &Model,
    cfg: &EngineConfig,
) -> Result<Box<dyn Backend>, BackendInitError> {
    let use_cuda = match device {
        Device::Cpu => false,
        Device::Cuda => true,
        Device::Auto => match cuda::probe() {
            Ok(count) => {
                tracing::info!(gpus = count, "device auto: using CUDA");
                true
            }
            Err(why) => {
                tracing::info!(reason = %why, "device auto: no usable GPU, using the CPU");
                false
            }
        },
    };
    if use_cuda {
        let backend = cuda::CudaBackend::new(model, cfg, cuda::CudaOptions::default())?;
        Ok(Box::new(backend))
    } else {
        let backend = cpu::CpuBackend::new(model, cfg.kv_cache_bytes)
            .map_err(|e| BackendInitError::Cpu(e.to_string()))?;
        Ok(Box::new(backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda));
        assert_eq!("auto".parse::<Device>(), Ok(Device::Auto));
        assert!("gpu".parse::<Device>().is_err());
    }

    /// Without a GPU (CI), `--device cuda` fails with a one-line cause and never panics.
    #[test]
    fn cuda_without_a_gpu_fails_with_one_line() {
        if cuda::probe().is_ok() {
            eprintln!("SKIPPED: a GPU is present");
            return;
        }
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-llama3");
        if !dir.exists() {
            eprintln!("SKIPPED: {} is absent", dir.display());
            return;
        }
        let model = Model::load(&dir).expect("fixture loads");
        let err = match select(Device::Cuda, &model, &EngineConfig::default()) {
            Ok(_) => panic!("CUDA backend started without a GPU"),
            Err(e) => e.to_string(),
        };
        assert!(!err.contains('\n'), "{err}");
        assert!(
            err.contains("NVIDIA driver") || err.contains("CUDA"),
            "{err}"
        );
    }
}
