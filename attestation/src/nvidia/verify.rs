//! Verification of GPU evidence: nonce, device chain, SPDM signature, FWID, versions,
//! allow-lists and RIM reference values.

use std::collections::BTreeMap;

use serde::Serialize;
use time::OffsetDateTime;

use super::certs::{leaf_fwid, parse_der, verify_chain};
use super::error::GpuError;
use super::evidence::{CcMode, GpuEvidence, GpuTrust};
use super::opaque::{FIELD_BOARD_ID, FIELD_CHIP_SKU, FIELD_PROJECT, FIELD_PROJECT_SKU, OpaqueData};
use super::rim::{ParsedRim, RimKind};
use super::spdm::{MeasurementBlock, SpdmReport};

/// What verified GPU evidence vouches for. Plain data; digests are lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuClaims {
    /// True when the chain is anchored in a simulated root: never real hardware.
    pub simulated: bool,
    /// The verifier's nonce, echoed in the signed request (hex).
    pub nonce: String,
    /// Driver version from the signed opaque data.
    pub driver_version: String,
    /// VBIOS version from the signed opaque data (e.g. `96.00.9F.00.01`).
    pub vbios_version: String,
    /// FWID (hex), equal to the leaf certificate's.
    pub fwid: String,
    /// Measurement block index (1-based) → value (hex).
    pub measurements: BTreeMap<u8, String>,
    /// CC mode reported by the driver (not signed).
    pub cc_mode: CcMode,
    /// Ready state reported by the driver (not signed).
    pub ready_state: bool,
    /// Board id (hex), when present.
    pub board_id: Option<String>,
    /// Chip SKU, when present.
    pub chip_sku: Option<String>,
    /// Project, when present.
    pub project: Option<String>,
    /// Project SKU, when present.
    pub project_sku: Option<String>,
    /// Subject of the device leaf certificate.
    pub leaf_subject: String,
    /// The device's identity: SHA-256 of its leaf certificate's SubjectPublicKeyInfo (hex; empty
    /// when the leaf does not parse). Unlike the FWID, a firmware measurement that every GPU
    /// with the same firmware shares, it differs between devices.
    pub device_identity: String,
    /// Bytes after the SPDM signature (ignored by the signature check).
    pub trailing_bytes: usize,
    /// The RIM comparison, or `None` when no RIMs were supplied.
    pub reference_values: Option<ReferenceValues>,
}

/// Outcome of the RIM comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReferenceValues {
    /// `tagId` of the driver RIM.
    pub driver_rim: String,
    /// `tagId` of the VBIOS RIM.
    pub vbios_rim: String,
    /// Number of active golden measurements that matched.
    pub compared: usize,
}

/// Every check of one GPU's evidence, each with its own outcome: a wrong nonce does not hide a
/// broken chain or a bad signature, nor the reverse.
#[derive(Debug)]
pub struct GpuChecks {
    /// The device chain to a root of [`GpuTrust`] at `now`.
    pub chain: Result<(), GpuError>,
    /// The SPDM signature under the device leaf certificate.
    pub signature: Result<(), GpuError>,
    /// The request nonce against the expected one.
    pub nonce: Result<(), GpuError>,
    /// The opaque-data FWID against the leaf certificate's.
    pub fwid: Result<(), GpuError>,
    /// The driver and VBIOS versions against the allow-lists.
    pub versions: Result<(), GpuError>,
    /// The measurements against the RIMs; `Ok(None)` when no RIMs were supplied.
    pub reference_values: Result<Option<ReferenceValues>, GpuError>,
    /// What the report says. Vouched for only when every check above passed.
    pub claims: GpuClaims,
}

impl GpuChecks {
    /// The claims when every check passed, else the first failure in the order chain,
    /// signature, nonce, FWID, versions, reference values.
    pub fn into_result(self) -> Result<GpuClaims, GpuError> {
        self.chain?;
        self.signature?;
        self.nonce?;
        self.fwid?;
        self.versions?;
        let mut claims = self.claims;
        claims.reference_values = self.reference_values?;
        Ok(claims)
    }
}

/// Verifies GPU evidence against `trust`, the caller's nonce, and `now` (for certificate
/// validity). Each failed check returns its own [`GpuError`] variant; the chain and the
/// signature are judged before the nonce ([`check`] reports every check).
pub fn verify(
    evidence: &GpuEvidence,
    trust: &GpuTrust,
    expected_nonce: &[u8],
    now: OffsetDateTime,
) -> Result<GpuClaims, GpuError> {
    check(evidence, trust, expected_nonce, now)?.into_result()
}

/// Runs every check of GPU evidence apart. Fails only when the SPDM report or its opaque data
/// cannot be parsed, which leaves nothing to check.
pub fn check(
    evidence: &GpuEvidence,
    trust: &GpuTrust,
    expected_nonce: &[u8],
    now: OffsetDateTime,
) -> Result<GpuChecks, GpuError> {
    let report = SpdmReport::parse(&evidence.report)?;
    let opaque = OpaqueData::parse(report.opaque)?;
    let fwid = opaque.fwid()?.to_vec();
    let driver_version = opaque.driver_version()?;
    let vbios_version = opaque.vbios_version()?;

    let roots: Vec<Vec<u8>> = trust
        .device_roots
        .iter()
        .chain(&trust.simulated_roots)
        .cloned()
        .collect();
    let chain = verify_chain(&evidence.cert_chain, &roots, now, "device");
    let simulated = chain
        .as_ref()
        .is_ok_and(|c| c.root_index >= trust.device_roots.len());
    // The leaf as given: the signature and FWID are judged even when the chain is broken.
    let leaf = match evidence.cert_chain.first() {
        Some(der) => parse_der(der, "device", 0),
        None => Err(GpuError::CertChain {
            chain: "device",
            reason: "no certificates".into(),
        }),
    };
    let signature = leaf.as_ref().map_err(clone_error).and_then(|leaf| {
        let point = leaf.public_key().subject_public_key.data.as_ref();
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P384_SHA384_FIXED, point)
            .verify(report.signed, report.signature)
            .map_err(|_| GpuError::BadSignature)
    });
    let nonce = if report.request_nonce.as_slice() == expected_nonce {
        Ok(())
    } else {
        Err(GpuError::NonceMismatch {
            expected: hex::encode(expected_nonce),
            found: hex::encode(report.request_nonce),
        })
    };
    let fwid_check = leaf
        .as_ref()
        .map_err(clone_error)
        .and_then(|leaf| leaf_fwid(leaf))
        .and_then(|cert_fwid| {
            if fwid == cert_fwid {
                Ok(())
            } else {
                Err(GpuError::Fwid(format!(
                    "report FWID {} differs from the leaf certificate's {}",
                    hex::encode(&fwid),
                    hex::encode(&cert_fwid)
                )))
            }
        });
    let versions = check_allowed(
        "driver",
        &driver_version,
        trust.allowed_driver_versions.as_deref(),
    )
    .and_then(|()| {
        check_allowed(
            "VBIOS",
            &vbios_version,
            trust.allowed_vbios_versions.as_deref(),
        )
    });
    let reference_values = if trust.rims.is_empty() {
        Ok(None)
    } else {
        compare_rims(trust, now, &report.blocks, &driver_version, &vbios_version).map(Some)
    };
    let claims = GpuClaims {
        simulated,
        nonce: hex::encode(report.request_nonce),
        driver_version,
        vbios_version,
        fwid: hex::encode(&fwid),
        measurements: report
            .blocks
            .iter()
            .map(|b| (b.index, hex::encode(&b.value)))
            .collect(),
        cc_mode: evidence.cc_mode,
        ready_state: evidence.ready_state,
        board_id: opaque.hex(FIELD_BOARD_ID),
        chip_sku: opaque.text(FIELD_CHIP_SKU),
        project: opaque.text(FIELD_PROJECT),
        project_sku: opaque.text(FIELD_PROJECT_SKU),
        leaf_subject: leaf
            .as_ref()
            .map(|l| l.subject().to_string())
            .unwrap_or_default(),
        device_identity: leaf
            .as_ref()
            .map(|l| {
                hex::encode(ring::digest::digest(
                    &ring::digest::SHA256,
                    l.public_key().raw,
                ))
            })
            .unwrap_or_default(),
        trailing_bytes: report.trailing,
        reference_values: None,
    };
    Ok(GpuChecks {
        chain: chain.map(|_| ()),
        signature,
        nonce,
        fwid: fwid_check,
        versions,
        reference_values,
        claims,
    })
}

/// A leaf-parsing failure, repeated for each check that needs the leaf.
fn clone_error(e: &GpuError) -> GpuError {
    GpuError::CertChain {
        chain: "device",
        reason: format!("leaf certificate: {e}"),
    }
}

/// Checks a version against an optional allow-list (case-insensitive).
fn check_allowed(
    kind: &'static str,
    version: &str,
    allowed: Option<&[String]>,
) -> Result<(), GpuError> {
    match allowed {
        Some(list) if !list.iter().any(|v| v.eq_ignore_ascii_case(version)) => {
            Err(GpuError::VersionNotAllowed {
                kind,
                version: version.to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// Verifies one RIM's signature chain and XML-DSig at `now`, and parses it.
pub fn verify_rim(
    xml: &[u8],
    kind: RimKind,
    rim_roots: &[Vec<u8>],
    now: OffsetDateTime,
) -> Result<ParsedRim, GpuError> {
    let parsed = ParsedRim::parse(xml, kind)?;
    verify_chain(&parsed.signer_chain, rim_roots, now, "RIM signer")?;
    let signer = parsed.signer_chain.first().ok_or_else(|| GpuError::Rim {
        rim: kind.name().into(),
        reason: "KeyInfo holds no certificate".into(),
    })?;
    super::xmldsig::verify_enveloped(xml, signer).map_err(|reason| GpuError::Rim {
        rim: format!("{} {}", kind.name(), parsed.tag_id),
        reason,
    })?;
    Ok(parsed)
}

/// Verifies both RIMs and compares their active golden measurements with the report.
fn compare_rims(
    trust: &GpuTrust,
    now: OffsetDateTime,
    blocks: &[MeasurementBlock],
    driver_version: &str,
    vbios_version: &str,
) -> Result<ReferenceValues, GpuError> {
    let pick = |kind: RimKind| -> Result<ParsedRim, GpuError> {
        let mut found = trust.rims.iter().filter(|r| r.kind == kind);
        let rim = found.next().ok_or_else(|| GpuError::Rim {
            rim: kind.name().into(),
            reason: "not supplied".into(),
        })?;
        if found.next().is_some() {
            return Err(GpuError::Rim {
                rim: kind.name().into(),
                reason: "more than one supplied".into(),
            });
        }
        verify_rim(&rim.xml, kind, &trust.rim_roots, now)
    };
    let driver = pick(RimKind::Driver)?;
    let vbios = pick(RimKind::Vbios)?;
    compare_reference_values(&driver, &vbios, blocks, driver_version, vbios_version)
}

/// Compares verified driver and VBIOS RIMs with the report: each RIM's version must equal
/// the reported one, no index may be active in both, and every active golden measurement
/// (RIM index `i` is report block `i + 1`) must equal one of its alternatives.
pub fn compare_reference_values(
    driver: &ParsedRim,
    vbios: &ParsedRim,
    blocks: &[MeasurementBlock],
    driver_version: &str,
    vbios_version: &str,
) -> Result<ReferenceValues, GpuError> {
    if driver.version != driver_version {
        return Err(GpuError::RimVersionMismatch {
            kind: "driver",
            rim_version: driver.version.clone(),
            reported: driver_version.into(),
        });
    }
    if !vbios.version.eq_ignore_ascii_case(vbios_version) {
        return Err(GpuError::RimVersionMismatch {
            kind: "VBIOS",
            rim_version: vbios.version.clone(),
            reported: vbios_version.into(),
        });
    }
    let mut compared = 0;
    for (rim, other, name) in [(driver, vbios, "driver"), (vbios, driver, "VBIOS")] {
        for golden in rim.golden.iter().filter(|g| g.active) {
            if other
                .golden
                .iter()
                .any(|o| o.active && o.index == golden.index)
            {
                return Err(GpuError::Rim {
                    rim: name.into(),
                    reason: format!("index {} is active in both RIMs", golden.index),
                });
            }
            let block_index = golden
                .index
                .checked_add(1)
                .ok_or(GpuError::MeasurementMismatch {
                    index: golden.index,
                    rim: name,
                })?;
            let actual = blocks.iter().find(|b| b.index == block_index);
            if !actual.is_some_and(|b| golden.alternatives.contains(&b.value)) {
                return Err(GpuError::MeasurementMismatch {
                    index: block_index,
                    rim: name,
                });
            }
            compared += 1;
        }
    }
    Ok(ReferenceValues {
        driver_rim: driver.tag_id.clone(),
        vbios_rim: vbios.tag_id.clone(),
        compared,
    })
}
