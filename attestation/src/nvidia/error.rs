//! Errors of GPU evidence parsing, verification and collection, one variant per check.

/// Why GPU evidence was malformed or failed a check.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The SPDM request or response is malformed at the named field.
    #[error("SPDM {message}: {reason} (field `{field}`)")]
    Spdm {
        /// `GET_MEASUREMENTS request` or `MEASUREMENTS response`.
        message: &'static str,
        /// Field being decoded.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The opaque data is malformed or lacks a required field.
    #[error("SPDM opaque data: {0}")]
    OpaqueData(String),
    /// The request nonce differs from the verifier's nonce.
    #[error("nonce {found} differs from the expected {expected}")]
    NonceMismatch {
        /// Hex of the expected nonce.
        expected: String,
        /// Hex of the nonce in the request.
        found: String,
    },
    /// A certificate chain (device or RIM signer) does not verify.
    #[error("{chain} certificate chain: {reason}")]
    CertChain {
        /// `device` or `RIM signer`.
        chain: &'static str,
        /// What is wrong, naming the certificate by position and subject.
        reason: String,
    },
    /// The SPDM signature does not verify under the leaf certificate.
    #[error("SPDM signature does not verify under the device leaf certificate")]
    BadSignature,
    /// The leaf certificate's FWID differs from the report's.
    #[error("FWID: {0}")]
    Fwid(String),
    /// A RIM could not be parsed or its signature failed.
    #[error("RIM {rim}: {reason}")]
    Rim {
        /// Which RIM (driver or VBIOS, with its tag id when known).
        rim: String,
        /// What is wrong.
        reason: String,
    },
    /// A RIM describes a different driver or VBIOS version than the report.
    #[error("{kind} RIM is for version {rim_version}, the GPU reports {reported}")]
    RimVersionMismatch {
        /// `driver` or `VBIOS`.
        kind: &'static str,
        /// Version named by the RIM.
        rim_version: String,
        /// Version in the report.
        reported: String,
    },
    /// A measurement differs from every golden alternative of the RIMs.
    #[error("measurement block {index} ({rim} RIM) matches none of its golden values")]
    MeasurementMismatch {
        /// 1-based measurement block index.
        index: u8,
        /// RIM that holds the golden value.
        rim: &'static str,
    },
    /// The driver or VBIOS version is not in the allow-list.
    #[error("{kind} version {version} is not allowed")]
    VersionNotAllowed {
        /// `driver` or `VBIOS`.
        kind: &'static str,
        /// The reported version.
        version: String,
    },
    /// NVML collection failed or no GPU/driver is present.
    #[error("NVML: {0}")]
    Nvml(String),
    /// Building simulated evidence failed.
    #[error("simulated GPU: {0}")]
    Simulated(String),
}
