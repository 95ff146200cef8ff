//! The Azure HCL (paravisor) report, which binds the vTPM attestation key to an SEV-SNP report.
//!
//! Layout: a 32-byte header starting with `HCLA`, the 1184-byte SNP report at 0x20, then the
//! IGVM request data (five little-endian `u32`: data size, version, report type, report-data
//! hash type, variable-data size) followed by the JSON variable data, which holds the AK as a
//! JWK with `kid` `HCLAkPub`. The paravisor puts the hash of the variable data into the first
//! bytes of the SNP REPORT_DATA. This module checks that binding and extracts the AK; the SNP
//! report itself must still be verified by the SNP verifier.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

use super::abi::AkKey;
use super::error::TpmError;

/// Header magic.
const HCL_MAGIC: &[u8; 4] = b"HCLA";
/// Offset of the SNP report.
const SNP_REPORT_OFFSET: usize = 0x20;
/// Size of an SNP attestation report.
const SNP_REPORT_LEN: usize = 1184;
/// Offset of REPORT_DATA inside an SNP report.
const SNP_REPORT_DATA_OFFSET: usize = 0x50;
/// Size of the IGVM request-data header.
const IGVM_HEADER_LEN: usize = 20;
/// `kid` of the attestation key in the variable data.
const AK_KID: &str = "HCLAkPub";

/// An HCL report whose SNP REPORT_DATA binds its variable data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HclReport {
    /// The embedded SEV-SNP report (1184 bytes), still to be verified by the SNP verifier.
    pub snp_report: Vec<u8>,
    /// The JSON variable data whose hash is in REPORT_DATA.
    pub variable_data: Vec<u8>,
    /// The vTPM attestation key (`HCLAkPub`).
    pub ak: AkKey,
}

/// Parses an HCL report, checks REPORT_DATA against the hash of the variable data, and
/// extracts `HCLAkPub`.
pub fn parse_and_bind(report: &[u8]) -> Result<HclReport, TpmError> {
    let err = |m: String| TpmError::Hcl(m);
    if report.len() < SNP_REPORT_OFFSET + SNP_REPORT_LEN + IGVM_HEADER_LEN {
        return Err(err(format!("{} bytes is too short", report.len())));
    }
    if &report[..4] != HCL_MAGIC {
        return Err(err("header magic is not `HCLA`".into()));
    }
    let snp_report = &report[SNP_REPORT_OFFSET..SNP_REPORT_OFFSET + SNP_REPORT_LEN];
    let igvm = &report[SNP_REPORT_OFFSET + SNP_REPORT_LEN..];
    let word = |i: usize| u32::from_le_bytes([igvm[i], igvm[i + 1], igvm[i + 2], igvm[i + 3]]);
    let hash_type = word(12);
    let var_len = usize::try_from(word(16)).map_err(|_| err("variable-data size".into()))?;
    let variable_data = igvm
        .get(IGVM_HEADER_LEN..)
        .and_then(|rest| rest.get(..var_len))
        .ok_or_else(|| {
            err(format!(
                "variable data of {var_len} bytes overruns the report"
            ))
        })?;
    let digest = match hash_type {
        1 => ring::digest::digest(&ring::digest::SHA256, variable_data),
        2 => ring::digest::digest(&ring::digest::SHA384, variable_data),
        3 => ring::digest::digest(&ring::digest::SHA512, variable_data),
        other => return Err(err(format!("unknown report-data hash type {other}"))),
    };
    let report_data = &snp_report[SNP_REPORT_DATA_OFFSET..SNP_REPORT_DATA_OFFSET + 64];
    if &report_data[..digest.as_ref().len()] != digest.as_ref() {
        return Err(err(
            "SNP REPORT_DATA does not hold the hash of the variable data".into(),
        ));
    }
    let ak = ak_from_variable_data(variable_data)?;
    Ok(HclReport {
        snp_report: snp_report.to_vec(),
        variable_data: variable_data.to_vec(),
        ak,
    })
}

/// A JWK set as found in the variable data.
#[derive(Deserialize)]
struct VariableData {
    keys: Vec<Jwk>,
}

/// An RSA JWK.
#[derive(Deserialize)]
struct Jwk {
    kid: String,
    kty: String,
    #[serde(default)]
    n: String,
    #[serde(default)]
    e: String,
}

/// Extracts the `HCLAkPub` RSA key from the variable-data JSON.
pub fn ak_from_variable_data(json: &[u8]) -> Result<AkKey, TpmError> {
    let err = |m: String| TpmError::Hcl(m);
    let data: VariableData = serde_json::from_slice(json)
        .map_err(|e| err(format!("variable data is not the expected JSON: {e}")))?;
    let jwk = data
        .keys
        .iter()
        .find(|k| k.kid == AK_KID)
        .ok_or_else(|| err(format!("variable data has no `{AK_KID}` key")))?;
    if jwk.kty != "RSA" {
        return Err(err(format!("`{AK_KID}` has kty {}", jwk.kty)));
    }
    let modulus = URL_SAFE_NO_PAD
        .decode(jwk.n.as_bytes())
        .map_err(|e| err(format!("`{AK_KID}`.n: {e}")))?;
    let e = URL_SAFE_NO_PAD
        .decode(jwk.e.as_bytes())
        .map_err(|e| err(format!("`{AK_KID}`.e: {e}")))?;
    if e.is_empty() || e.len() > 4 {
        return Err(err(format!("`{AK_KID}`.e has {} bytes", e.len())));
    }
    let exponent = e.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b));
    Ok(AkKey::Rsa { modulus, exponent })
}

/// The result of [`verify_quote_with_hcl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HclBoundQuote {
    /// The HCL report; its `snp_report` must still pass the SNP verifier.
    pub hcl: HclReport,
    /// The verified quote claims, signed by `HCLAkPub`.
    pub tpm: super::TpmClaims,
}

/// The Azure path in one call: checks the HCL binding, verifies the TPM evidence with the
/// expected nonce, and requires that the quotes were signed by the HCL's `HCLAkPub` (so the
/// quote is tied, through the variable data and REPORT_DATA, to the SNP report).
pub fn verify_quote_with_hcl(
    hcl_report: &[u8],
    evidence: &super::TpmEvidence,
    expected_nonce: &[u8],
) -> Result<HclBoundQuote, TpmError> {
    let hcl = parse_and_bind(hcl_report)?;
    let tpm = super::verify(evidence, expected_nonce)?;
    if tpm.ak_spki_sha256 != hex::encode(hcl.ak.spki_sha256()?) {
        return Err(TpmError::Hcl(format!(
            "the quotes are signed by AK {}, not by the HCL's `{AK_KID}`",
            tpm.ak_spki_sha256
        )));
    }
    Ok(HclBoundQuote { hcl, tpm })
}
