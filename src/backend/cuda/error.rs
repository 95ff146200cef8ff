//! Why the CUDA backend could not start: the error every start-up module returns, kept apart
//! from the backend so that the weight upload and the early copies need not import it.

use crate::engine::BackendError;

use super::compile::KernelError;
use super::probe::CudaUnavailable;

/// Why the CUDA backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaInitError {
    /// No usable driver or GPU.
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
    /// The model's shapes are outside what the kernels serve.
    #[error("the CUDA backend cannot serve this model: {0}")]
    Unsupported(String),
    /// A kernel failed to compile or load.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A weight is missing or malformed.
    #[error("weights: {0}")]
    Weights(String),
    /// The device failed.
    #[error("CUDA device: {0}")]
    Device(String),
}

impl From<BackendError> for CudaInitError {
    fn from(e: BackendError) -> Self {
        CudaInitError::Device(e.to_string())
    }
}
