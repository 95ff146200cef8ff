//! The CUDA backend: bf16 weights on one NVIDIA GPU, cuBLASLt matrix products and kernels
//! compiled at load time by NVRTC for the model's exact shapes and the GPU's architecture.
//!
//! `docs/cuda-backend.md` describes the design: the kernel families, the packed one-copy-each-
//! way step, the KV-cache sizing and what confidential-computing mode changes.

mod backend;
mod cc;
mod choices;
mod compile;
mod early;
mod error;
mod fp8;
mod gemm;
mod gpt_oss;
mod graphs;
mod inputs;
mod kernels;
mod launch;
mod memory;
mod moe;
mod plan;
mod probe;
mod upload;
mod wait;
mod weights;

pub use backend::{CudaBackend, CudaOptions, OpenedDevice};
pub use cc::{CcState, read_cc_state};
pub use compile::KernelError;
pub use early::{EarlyStats, EarlyUpload};
pub use error::CudaInitError;
pub use inputs::CopyStats;
pub use probe::{CudaUnavailable, prefetch_driver, probe};
