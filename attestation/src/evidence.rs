//! The evidence envelope: a documented JSON object carrying the platform evidence and the
//! runtime-data document it binds, or standalone vTPM/GPU evidence. `docs/attestation.md`
//! describes the formats; raw forms (a bare SNP report or TDX quote, binary or hex) are
//! accepted too.

use serde::{Deserialize, Serialize};

use crate::policy::Platform;

/// The only envelope version this crate produces and accepts.
pub const EVIDENCE_VERSION: u32 = 1;

/// Errors when decoding evidence.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The JSON envelope is malformed.
    #[error("evidence envelope is not valid JSON of version {EVIDENCE_VERSION}: {0}")]
    Json(#[from] serde_json::Error),
    /// The envelope has another version.
    #[error("evidence envelope version {found} is not supported (expected {EVIDENCE_VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The envelope names a platform but lacks its section.
    #[error("evidence envelope for {platform} lacks its `{section}` section")]
    MissingSection {
        /// The platform named.
        platform: &'static str,
        /// The section expected.
        section: &'static str,
    },
    /// Raw bytes are neither an SNP report nor a TDX quote.
    #[error(
        "evidence is neither a JSON envelope, an SNP report (1184 bytes, raw or hex) nor a TDX quote (raw or hex)"
    )]
    UnknownFormat,
}

/// Bytes serialised as standard base64 in JSON (the crate's one serde base64 codec).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Base64Bytes(#[serde(with = "crate::serde_b64")] pub Vec<u8>);

/// The role of a certificate supplied with an SNP report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnpCertKind {
    /// Versioned Chip Endorsement Key.
    Vcek,
    /// Versioned Loaded Endorsement Key.
    Vlek,
    /// AMD SEV Signing Key (intermediate for VCEKs).
    Ask,
    /// AMD SEV-VLEK Signing Key (intermediate for VLEKs).
    Asvk,
    /// AMD Root Key.
    Ark,
}

/// One certificate (DER) supplied with an SNP report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpCert {
    /// Its role.
    pub kind: SnpCertKind,
    /// The DER certificate, base64.
    pub der: Base64Bytes,
}

/// SEV-SNP evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpEvidence {
    /// The 1184-byte attestation report, base64.
    pub report: Base64Bytes,
    /// The host-provided certificate table, if any (VCEK or VLEK, possibly ASK/ASVK/ARK).
    #[serde(default)]
    pub certs: Vec<SnpCert>,
    /// The Azure HCL (paravisor) report, base64, when the paravisor fixes REPORT_DATA. `report`
    /// must then be the SNP report embedded in it; REPORT_DATA binds the HCL variable data (and
    /// its vTPM AK), and the runtime data is bound through the vTPM quote instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hcl_report: Option<Base64Bytes>,
}

/// TDX evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TdxEvidence {
    /// The DCAP quote (v4 or v5), base64.
    pub quote: Base64Bytes,
}

/// The evidence envelope, version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// The envelope version; always [`EVIDENCE_VERSION`].
    pub version: u32,
    /// The CPU TEE.
    pub platform: Platform,
    /// The canonical runtime-data document whose SHA-512 is REPORT_DATA, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_data: Option<Base64Bytes>,
    /// SEV-SNP evidence, when `platform` is `sev-snp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sev_snp: Option<SnpEvidence>,
    /// TDX evidence, when `platform` is `tdx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tdx: Option<TdxEvidence>,
    /// vTPM evidence (quotes, AK, event log), when the instance has a vTPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<crate::tpm::TpmEvidence>,
    /// NVIDIA GPU evidence (SPDM report, device chain, CC and ready state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::nvidia::GpuEvidence>,
}

/// Standalone evidence: vTPM quotes or NVIDIA GPU reports taken without CPU-TEE evidence (by
/// another verifier's flow, with that verifier's nonce). `docs/attestation.md` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandaloneEvidence {
    /// The envelope version; always [`EVIDENCE_VERSION`].
    pub version: u32,
    /// vTPM evidence: the AK, quotes (any of the SHA-1, SHA-256, SHA-384 banks), PCR values,
    /// and the event log, replayed when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<crate::tpm::TpmEvidence>,
    /// The AK certificate, then its intermediates (DER, base64), checked against the caller's
    /// roots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tpm_ak_certs: Vec<Base64Bytes>,
    /// One GPU's evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::nvidia::GpuEvidence>,
    /// A protected-PCIe set of GPUs, appraised as a set (after `gpu`, when both are given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<crate::nvidia::GpuEvidence>,
}

impl StandaloneEvidence {
    /// Every GPU's evidence: `gpu`, then `gpus`.
    pub fn gpus(&self) -> impl Iterator<Item = &crate::nvidia::GpuEvidence> {
        self.gpu.iter().chain(&self.gpus)
    }

    /// The envelope as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Evidence as a verifier reads it from a file: CPU-TEE evidence, or standalone TPM/GPU
/// evidence (a JSON envelope without `platform`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyEvidence {
    /// SEV-SNP or TDX evidence, possibly with vTPM and GPU sections.
    Platform(Evidence),
    /// vTPM and/or GPU evidence on its own.
    Standalone(StandaloneEvidence),
}

impl AnyEvidence {
    /// Decodes file bytes: a JSON envelope with a `platform` (see [`Evidence::from_bytes`]),
    /// a JSON envelope without one ([`StandaloneEvidence`]), or a raw form.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EvidenceError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.starts_with(b"{") {
            let value: serde_json::Value = serde_json::from_slice(trimmed)?;
            if value.get("platform").is_none() {
                let evidence: StandaloneEvidence = serde_json::from_value(value)?;
                if evidence.version != EVIDENCE_VERSION {
                    return Err(EvidenceError::Version {
                        found: evidence.version,
                    });
                }
                return Ok(Self::Standalone(evidence));
            }
        }
        Evidence::from_bytes(bytes).map(Self::Platform)
    }
}

/// Length of an SEV-SNP attestation report.
pub const SNP_REPORT_LEN: usize = 1184;

impl Evidence {
    /// Decodes evidence from file bytes: a JSON envelope, a raw or hex SNP report, or a raw
    /// TDX quote.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EvidenceError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.starts_with(b"{") {
            let evidence: Evidence = serde_json::from_slice(trimmed)?;
            evidence.validate()?;
            return Ok(evidence);
        }
        if bytes.len() == SNP_REPORT_LEN {
            return Ok(Self::snp(bytes.to_vec()));
        }
        let decoded = hex::decode(
            trimmed
                .iter()
                .filter(|b| !b.is_ascii_whitespace())
                .copied()
                .collect::<Vec<u8>>(),
        )
        .ok();
        if let Some(decoded) = &decoded
            && decoded.len() == SNP_REPORT_LEN
        {
            return Ok(Self::snp(decoded.clone()));
        }
        if crate::abi::tdx::looks_like_quote(bytes) {
            return Ok(Self::tdx(bytes.to_vec()));
        }
        // A TDX quote given as hex text, read like the SNP hex reports.
        if let Some(decoded) = decoded
            && crate::abi::tdx::looks_like_quote(&decoded)
        {
            return Ok(Self::tdx(decoded));
        }
        Err(EvidenceError::UnknownFormat)
    }

    fn tdx(quote: Vec<u8>) -> Self {
        Self {
            version: EVIDENCE_VERSION,
            platform: Platform::Tdx,
            runtime_data: None,
            sev_snp: None,
            tdx: Some(TdxEvidence {
                quote: Base64Bytes(quote),
            }),
            tpm: None,
            gpu: None,
        }
    }

    fn snp(report: Vec<u8>) -> Self {
        Self {
            version: EVIDENCE_VERSION,
            platform: Platform::SevSnp,
            runtime_data: None,
            sev_snp: Some(SnpEvidence {
                report: Base64Bytes(report),
                certs: Vec::new(),
                hcl_report: None,
            }),
            tdx: None,
            tpm: None,
            gpu: None,
        }
    }

    /// Checks the version and that the platform's section is present.
    pub fn validate(&self) -> Result<(), EvidenceError> {
        if self.version != EVIDENCE_VERSION {
            return Err(EvidenceError::Version {
                found: self.version,
            });
        }
        match self.platform {
            Platform::SevSnp if self.sev_snp.is_none() => Err(EvidenceError::MissingSection {
                platform: "sev-snp",
                section: "sev_snp",
            }),
            Platform::Tdx if self.tdx.is_none() => Err(EvidenceError::MissingSection {
                platform: "tdx",
                section: "tdx",
            }),
            _ => Ok(()),
        }
    }

    /// The envelope as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_rejects_unknown_fields() {
        let ev = Evidence {
            version: 1,
            platform: Platform::SevSnp,
            runtime_data: Some(Base64Bytes(b"{}".to_vec())),
            sev_snp: Some(SnpEvidence {
                report: Base64Bytes(vec![1; SNP_REPORT_LEN]),
                certs: vec![SnpCert {
                    kind: SnpCertKind::Vcek,
                    der: Base64Bytes(vec![0x30, 0]),
                }],
                hcl_report: None,
            }),
            tdx: None,
            tpm: None,
            gpu: None,
        };
        let json = ev.to_json();
        assert!(json.contains("\"platform\": \"sev-snp\""));
        assert_eq!(Evidence::from_bytes(json.as_bytes()).unwrap(), ev);
        let extra = json.replacen('{', "{\"surprise\": 1,", 1);
        assert!(Evidence::from_bytes(extra.as_bytes()).is_err());
        let wrong = json.replace("\"version\": 1", "\"version\": 2");
        assert!(matches!(
            Evidence::from_bytes(wrong.as_bytes()),
            Err(EvidenceError::Version { found: 2 })
        ));
    }

    #[test]
    fn base64_fields_reject_invalid_text() {
        let json = r#"{"version":1,"platform":"tdx","tdx":{"quote":"not base64!"}}"#;
        let err = Evidence::from_bytes(json.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("invalid base64"), "{err}");
        let ok = r#"{"version":1,"platform":"tdx","tdx":{"quote":"AAEC"}}"#;
        let evidence = Evidence::from_bytes(ok.as_bytes()).unwrap();
        assert_eq!(evidence.tdx.unwrap().quote, Base64Bytes(vec![0, 1, 2]));
    }

    #[test]
    fn raw_forms_are_recognised() {
        let raw = vec![2u8; SNP_REPORT_LEN];
        assert_eq!(
            Evidence::from_bytes(&raw).unwrap().platform,
            Platform::SevSnp
        );
        let hexed = hex::encode(&raw);
        assert_eq!(
            Evidence::from_bytes(hexed.as_bytes()).unwrap().platform,
            Platform::SevSnp
        );
        assert!(matches!(
            Evidence::from_bytes(&[0u8; 10]),
            Err(EvidenceError::UnknownFormat)
        ));
    }
}
