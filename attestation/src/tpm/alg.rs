//! TPM 2.0 algorithm identifiers (TPM_ALG_ID) used by quotes, keys and event logs.

use serde::{Deserialize, Serialize};

/// A hash algorithm that a PCR bank, a quote signature or an event log may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HashAlg {
    /// SHA-1 (TPM_ALG_SHA1, 0x0004), only for legacy PCR banks.
    Sha1,
    /// SHA-256 (TPM_ALG_SHA256, 0x000B).
    Sha256,
    /// SHA-384 (TPM_ALG_SHA384, 0x000C).
    Sha384,
}

impl HashAlg {
    /// Maps a TPM_ALG_ID to a supported hash, or `None`.
    pub fn from_tpm_alg(id: u16) -> Option<Self> {
        match id {
            0x0004 => Some(Self::Sha1),
            0x000B => Some(Self::Sha256),
            0x000C => Some(Self::Sha384),
            _ => None,
        }
    }

    /// The TPM_ALG_ID of this hash.
    pub fn tpm_alg(self) -> u16 {
        match self {
            Self::Sha1 => 0x0004,
            Self::Sha256 => 0x000B,
            Self::Sha384 => 0x000C,
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha384 => 48,
        }
    }

    /// Hashes `data` with this algorithm.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        let alg = match self {
            Self::Sha1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
            Self::Sha256 => &ring::digest::SHA256,
            Self::Sha384 => &ring::digest::SHA384,
        };
        ring::digest::digest(alg, data).as_ref().to_vec()
    }

    /// Lower-case name (`sha1`, `sha256`, `sha384`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
        }
    }
}

impl std::fmt::Display for HashAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// TPM_ALG_NULL.
pub(crate) const ALG_NULL: u16 = 0x0010;
/// TPM_ALG_RSA.
pub(crate) const ALG_RSA: u16 = 0x0001;
/// TPM_ALG_ECC.
pub(crate) const ALG_ECC: u16 = 0x0023;
/// TPM_ALG_RSASSA.
pub(crate) const ALG_RSASSA: u16 = 0x0014;
/// TPM_ALG_ECDSA.
pub(crate) const ALG_ECDSA: u16 = 0x0018;
/// TPM_ECC_NIST_P256.
pub(crate) const ECC_NIST_P256: u16 = 0x0003;
