//! Evidence collection, offline verification and policy appraisal for confidential-computing
//! platforms (AMD SEV-SNP, Intel TDX, TPM 2.0 and NVIDIA H100/H200 GPUs).

pub mod nvidia;
mod serde_b64;
pub mod tpm;
