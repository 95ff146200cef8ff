//! NVIDIA H100/H200 confidential-computing evidence: SPDM measurement reports, device
//! certificate chains, RIM reference values, NVML collection and a simulated GPU.
//!
//! # Public API (for the appraisal)
//! - [`GpuEvidence`] (serde; bytes as base64): the SPDM GET_MEASUREMENTS request ‖ response,
//!   the device chain (DER, leaf first), and the CC mode and ready state from the driver.
//! - [`check`]`(&GpuEvidence, &GpuTrust, expected_nonce, now) -> Result<`[`GpuChecks`]`,
//!   `[`GpuError`]`>` parses the SPDM structure and opaque data, then runs every check apart,
//!   each with its own outcome: the device chain to a root in [`GpuTrust::device_roots`] or
//!   [`GpuTrust::simulated_roots`] at `now`; the SPDM signature (ECDSA P-384 over request ‖
//!   response up to the signature, located structurally) under the leaf as given; the request
//!   nonce; the opaque-data FWID against the leaf's TCG DICE FWID; the driver and VBIOS
//!   allow-lists; and, when [`GpuTrust::rims`] is not empty, each RIM's signer chain to
//!   [`GpuTrust::rim_roots`] at `now`, its XML-DSig (libxmlsec1), its version against the
//!   reported one, and every active golden measurement. [`verify`] returns the first failure
//!   in that order (chain and signature before the nonce), each its own [`GpuError`].
//! - [`GpuClaims::simulated`] is true when the chain ends in a simulated root; the appraisal
//!   must name it. [`GpuClaims::reference_values`] is `None` when no RIMs were supplied; a
//!   production policy must then reject.
//! - [`GpuTrust::nvidia`] holds the built-in NVIDIA roots ([`roots`]).

pub mod certs;
mod error;
mod evidence;
pub mod nvml;
pub mod opaque;
pub mod rim;
pub mod roots;
#[cfg(feature = "simulated")]
pub mod simulated;
pub mod spdm;
mod verify;
mod xmldsig;

pub use error::GpuError;
pub use evidence::{CcMode, GpuEvidence, GpuTrust};
pub use verify::{
    GpuChecks, GpuClaims, ReferenceValues, check, compare_reference_values, verify, verify_rim,
};
