//! Serialisable GPU evidence and the trust anchors and reference values a verifier uses.

use serde::{Deserialize, Serialize};

use super::error::GpuError;
use super::rim::Rim;
use super::roots;

/// Confidential-computing mode of the GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CcMode {
    /// CC mode on (production).
    On,
    /// CC mode off.
    Off,
    /// CC developer-tools mode (not confidential).
    Devtools,
}

/// What a GPU vouches for: the signed SPDM report, its certificate chain, and the CC and
/// ready states read from the driver (unsigned: the appraisal treats them as such).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEvidence {
    /// SPDM GET_MEASUREMENTS request (37 bytes) followed by the MEASUREMENTS response, base64.
    #[serde(with = "crate::serde_b64")]
    pub report: Vec<u8>,
    /// Device certificate chain, leaf first, each DER in base64.
    #[serde(with = "crate::serde_b64::vec")]
    pub cert_chain: Vec<Vec<u8>>,
    /// CC mode as reported by NVML.
    pub cc_mode: CcMode,
    /// GPU ready state (accepting work) as reported by NVML.
    pub ready_state: bool,
}

/// Trust anchors, reference values and allow-lists for [`super::verify`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuTrust {
    /// Device roots (DER) of real hardware, e.g. [`roots::nvidia_device_root`].
    pub device_roots: Vec<Vec<u8>>,
    /// Roots of simulated GPUs (DER). Only a policy that names them puts them here; claims
    /// from a chain anchored in one are marked `simulated`.
    pub simulated_roots: Vec<Vec<u8>>,
    /// Roots of RIM signers (DER), e.g. [`roots::nvidia_rim_root`].
    pub rim_roots: Vec<Vec<u8>>,
    /// Driver and VBIOS RIMs. When empty, no reference-value comparison is made and
    /// [`super::GpuClaims::reference_values`] is `None`.
    pub rims: Vec<Rim>,
    /// Accepted driver versions; `None` accepts any.
    pub allowed_driver_versions: Option<Vec<String>>,
    /// Accepted VBIOS versions (compared without case); `None` accepts any.
    pub allowed_vbios_versions: Option<Vec<String>>,
}

impl GpuTrust {
    /// NVIDIA's production device and RIM roots, no RIMs, no allow-lists.
    pub fn nvidia() -> Result<Self, GpuError> {
        Ok(Self {
            device_roots: vec![roots::nvidia_device_root()?],
            rim_roots: vec![roots::nvidia_rim_root()?],
            ..Self::default()
        })
    }
}
