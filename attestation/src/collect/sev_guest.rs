//! `/dev/sev-guest` through the `sev` crate: an extended report request returns the raw report
//! and the host's certificate table.

use std::path::Path;

use super::{CollectError, EvidenceSource, PlatformEvidence};
use crate::evidence::{Base64Bytes, SnpCert, SnpCertKind, SnpEvidence};

/// The SEV guest device.
#[derive(Debug, Clone, Default)]
pub struct SevGuestDevice {
    /// VMPL to request the report at (0 when `None`).
    pub vmpl: Option<u32>,
}

/// The device path.
pub const DEVICE: &str = "/dev/sev-guest";

impl SevGuestDevice {
    /// Whether the device node exists.
    pub fn available(&self) -> bool {
        Path::new(DEVICE).exists()
    }
}

fn kind(cert_type: &sev::firmware::host::CertType) -> Option<SnpCertKind> {
    use sev::firmware::host::CertType;
    match cert_type {
        CertType::ARK => Some(SnpCertKind::Ark),
        CertType::ASK => Some(SnpCertKind::Ask),
        CertType::VCEK => Some(SnpCertKind::Vcek),
        CertType::VLEK => Some(SnpCertKind::Vlek),
        _ => None,
    }
}

impl EvidenceSource for SevGuestDevice {
    fn collect(&self, report_data: &[u8; 64]) -> Result<PlatformEvidence, CollectError> {
        let mut fw = sev::firmware::guest::Firmware::open().map_err(|source| CollectError::Io {
            what: DEVICE.to_owned(),
            source,
        })?;
        let (report, table) = fw
            .get_ext_report(None, Some(*report_data), Some(self.vmpl.unwrap_or(0)))
            .map_err(|e| {
                CollectError::Platform(format!("{DEVICE}: extended report request failed: {e}"))
            })?;
        let certs = table
            .unwrap_or_default()
            .into_iter()
            .filter_map(|entry| {
                kind(&entry.cert_type).map(|kind| SnpCert {
                    kind,
                    der: Base64Bytes(entry.data),
                })
            })
            .collect();
        Ok(PlatformEvidence::SevSnp(SnpEvidence {
            report: Base64Bytes(report),
            certs,
            hcl_report: None,
        }))
    }
}
