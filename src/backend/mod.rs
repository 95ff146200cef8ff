//! Forward-pass implementations of [`crate::engine::Backend`], and the choice between them.

pub mod cpu;
pub mod cuda;

use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use crate::engine::{Backend, EngineConfig};
use crate::model::{Model, ModelTensors};

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
    /// The CUDA backend failed, or no driver or GPU is present for `--device cuda`.
    #[error("CUDA backend: {0}")]
    Cuda(#[from] cuda::CudaInitError),
}

/// How long each phase of building a backend took, for the start-up timeline. Phases may
/// overlap: the CUDA backend builds everything else (kernels, KV cache, product choice, decode
/// graphs) while it uploads the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendPhases {
    /// Driver probe, context and stream creation.
    pub context: Duration,
    /// Kernel compilation (or the compile cache) and module loading.
    pub kernels: Duration,
    /// Weight upload (CUDA) or conversion (CPU).
    pub weights: Duration,
    /// Choosing a product path per small-M GEMM shape.
    pub gemm_selection: Duration,
    /// Decode graph capture.
    pub graphs: Duration,
}

/// Builds the backend for `device`. `auto` picks CUDA when the driver loads and reports a GPU,
/// and the CPU otherwise (logging why).
pub fn select(
    device: Device,
    model: &Model,
    config: &EngineConfig,
) -> Result<Box<dyn Backend>, BackendInitError> {
    select_reporting(
        device,
        model.tensors(),
        config,
        &ProgressBar::hidden(),
        None,
    )
    .map(|(backend, _)| backend)
}

/// [`select`] from a model's configuration and weights, advancing `progress` by the weight
/// bytes uploaded, and returning how long each phase took. With `opened` (a CUDA device opened
/// beforehand, [`cuda::OpenedDevice`]) the CUDA backend is built on it, whatever `device` says.
pub fn select_reporting(
    device: Device,
    model: ModelTensors<'_>,
    config: &EngineConfig,
    progress: &ProgressBar,
    opened: Option<cuda::OpenedDevice>,
) -> Result<(Box<dyn Backend>, BackendPhases), BackendInitError> {
    let use_cuda = opened.is_some()
        || match device {
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
        let options = cuda::CudaOptions::default();
        let backend = match opened {
            Some(opened) => cuda::CudaBackend::on_device(opened, model, config, options, progress)?,
            None => cuda::CudaBackend::new_reporting(model, config, options, progress)?,
        };
        let phases = backend.startup_phases();
        Ok((Box::new(backend), phases))
    } else {
        let started = Instant::now();
        let backend = cpu::CpuBackend::from_tensors(model, config.kv_cache_bytes)?
            .with_kv_cache_dtype(config.kv_cache_dtype, model)?;
        let phases = BackendPhases {
            weights: started.elapsed(),
            ..BackendPhases::default()
        };
        Ok((Box::new(backend), phases))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU (CI), `--device cuda` fails with a one-line cause and never panics, and
    /// `auto` falls back to the CPU.
    #[test]
    fn without_a_gpu_cuda_fails_in_one_line_and_auto_picks_the_cpu() {
        if cuda::probe().is_ok() {
            eprintln!("SKIPPED: a GPU is present");
            return;
        }
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
        if !dir.exists() {
            eprintln!("SKIPPED: {} is absent", dir.display());
            return;
        }
        let model = Model::load(&dir).expect("fixture loads");
        let config = EngineConfig::default();
        let err = match select(Device::Cuda, &model, &config) {
            Ok(_) => panic!("CUDA backend started without a GPU"),
            Err(e) => e.to_string(),
        };
        assert!(!err.contains('\n'), "{err}");
        assert!(err.starts_with("CUDA backend: "), "{err}");
        let auto = select(Device::Auto, &model, &config).expect("auto falls back to the CPU");
        assert_eq!(auto.name(), "cpu");
    }

    /// An FP8 KV cache is served by the CPU backend; the CUDA backend no longer refuses it
    /// (without a GPU, as in CI, it fails on the device in one line, as for a bf16 cache).
    #[test]
    fn an_fp8_kv_cache_is_served_by_the_cpu_and_not_refused_by_cuda() {
        let model = Model::embedded().expect("embedded model");
        let config = EngineConfig {
            kv_cache_dtype: crate::engine::KvCacheDtype::Fp8,
            ..EngineConfig::default()
        };
        if let Err(e) = select(Device::Cuda, &model, &config) {
            let err = e.to_string();
            assert!(!err.contains("FP8 KV cache is not served"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let cpu = select(Device::Cpu, &model, &config).expect("the CPU serves it");
        assert_eq!(cpu.name(), "cpu");
    }
}
