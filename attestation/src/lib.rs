//! Evidence collection, offline verification and policy appraisal for confidential-computing
//! platforms (AMD SEV-SNP, Intel TDX, TPM 2.0 and NVIDIA H100/H200 GPUs).
//!
//! The crate keeps byte layouts, collection, authenticity and appraisal apart:
//! - [`abi`]: parse and serialise platform evidence, with no policy;
//! - [`evidence`]: the documented JSON evidence envelope;
//! - [`runtime_data`]: the runtime-data document whose SHA-512 is bound into REPORT_DATA;
//! - [`policy`]: the server policy (TOML) and its digest;
//! - [`report`]: the structured appraisal report;
//! - `fetch` (feature `fetch`): collateral from AMD KDS, Intel PCS and NVIDIA's services;
//! - [`pki`]: shared certificate, CRL and time helpers;
//! - [`ocsp`]: offline OCSP status of certificates from bundled responses;
//! - [`tpm`]: TPM 2.0 quotes, event logs and AK binding (`docs/attestation-tpm.md`);
//! - [`nvidia`]: NVIDIA H100/H200 SPDM evidence, RIMs and NVML (`docs/attestation-gpu.md`);
//! - [`snp_measurement`]: the expected SEV-SNP launch measurement of measured direct boot;
//! - [`tdx_measurement`]: the TDX firmware's metadata and the expected MRTD of a TD built from it;
//! - [`reference_values`]: the measurements one image build determines, as policy input.
//!
//! `docs/attestation.md` explains the design and every check.

#![warn(missing_docs)]

pub mod abi;
pub mod appraise;
pub mod bundle;
pub mod collect;
pub mod evidence;
#[cfg(feature = "fetch")]
pub mod fetch;
pub mod nvidia;
pub mod ocsp;
pub mod pki;
pub mod policy;
pub mod reference_values;
pub mod report;
pub mod runtime_data;
mod serde_b64;
pub mod snp_measurement;
pub mod tdx_measurement;
pub mod tpm;
pub mod verify;
