//! Serialisable TPM evidence: the AK, one or more quotes with their PCR values, the event log.

use serde::{Deserialize, Serialize};

use super::abi::{AkKey, parse_tpmt_public};
use super::alg::HashAlg;
use super::error::TpmError;

/// Everything a verifier needs to check a vTPM: the AK, quotes and (optionally) the event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpmEvidence {
    /// The attestation key that signed the quotes.
    pub ak: AkPublic,
    /// One quote per PCR bank (each quote's selection must name a single bank).
    pub quotes: Vec<QuoteEvidence>,
    /// TCG PC Client event log (crypto-agile or SHA-1 format), if collected.
    #[serde(default, with = "crate::serde_b64::option")]
    pub event_log: Option<Vec<u8>>,
}

/// The attestation key in one of its wire forms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AkPublic {
    /// A marshalled TPMT_PUBLIC (as returned by TPM2_ReadPublic), base64.
    TpmtPublic(#[serde(with = "crate::serde_b64")] Vec<u8>),
    /// A DER SubjectPublicKeyInfo, base64.
    SpkiDer(#[serde(with = "crate::serde_b64")] Vec<u8>),
}

impl AkPublic {
    /// Decodes the key.
    pub fn key(&self) -> Result<AkKey, TpmError> {
        match self {
            Self::TpmtPublic(bytes) => parse_tpmt_public(bytes),
            Self::SpkiDer(der) => AkKey::from_spki_der(der),
        }
    }
}

/// One quote: the signed TPMS_ATTEST, its TPMT_SIGNATURE and the PCR values it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuoteEvidence {
    /// Marshalled TPMS_ATTEST (the signed message), base64.
    #[serde(with = "crate::serde_b64")]
    pub attest: Vec<u8>,
    /// Marshalled TPMT_SIGNATURE, base64.
    #[serde(with = "crate::serde_b64")]
    pub signature: Vec<u8>,
    /// The values of the quoted PCRs.
    pub pcrs: PcrBank,
}

/// PCR values of one bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcrBank {
    /// The bank's hash algorithm.
    pub bank: HashAlg,
    /// Values in any order; the verifier orders them by index.
    pub values: Vec<PcrValue>,
}

/// One PCR value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcrValue {
    /// PCR index (0–23).
    pub index: u8,
    /// Digest, base64.
    #[serde(with = "crate::serde_b64")]
    pub value: Vec<u8>,
}

impl PcrBank {
    /// Parses the `"NN hexdigest"` per-line text format (as written by go-tpm-tools tests and
    /// `inferno` tooling); blank lines are ignored.
    pub fn from_text(bank: HashAlg, text: &str) -> Result<Self, TpmError> {
        let mut values = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let bad = |reason: &'static str| TpmError::PcrText {
                line: n + 1,
                reason,
            };
            let (idx, hex_value) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad("expected `INDEX HEX`"))?;
            let index = idx.parse::<u8>().map_err(|_| bad("bad PCR index"))?;
            let value = hex::decode(hex_value.trim()).map_err(|_| bad("bad hex digest"))?;
            values.push(PcrValue { index, value });
        }
        Ok(Self { bank, values })
    }
}
