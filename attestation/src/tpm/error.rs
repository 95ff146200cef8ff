//! Errors of TPM evidence parsing and verification, one variant per failed check.

use super::alg::HashAlg;

/// Why TPM evidence was malformed or failed a check.
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    /// A structure ended before the named field.
    #[error("{structure}: truncated at field `{field}`")]
    Truncated {
        /// Structure being decoded (e.g. `TPMS_ATTEST`).
        structure: &'static str,
        /// Field that did not fit.
        field: &'static str,
    },
    /// A structure had bytes after its last field.
    #[error("{structure}: {count} trailing bytes")]
    TrailingBytes {
        /// Structure being decoded.
        structure: &'static str,
        /// Number of unread bytes.
        count: usize,
    },
    /// A field held a value this verifier does not accept.
    #[error("{structure}: field `{field}` has unsupported value {value:#x}")]
    Unsupported {
        /// Structure being decoded.
        structure: &'static str,
        /// Offending field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// The TPMS_ATTEST magic was not TPM_GENERATED_VALUE.
    #[error("TPMS_ATTEST: magic {0:#010x} is not TPM_GENERATED_VALUE (0xff544347)")]
    NotTpmGenerated(u32),
    /// The attestation structure is not a quote (TPM_ST_ATTEST_QUOTE).
    #[error("TPMS_ATTEST: type {0:#06x} is not TPM_ST_ATTEST_QUOTE (0x8018)")]
    NotAQuote(u16),
    /// The AK public key could not be decoded.
    #[error("AK public key: {0}")]
    AkKey(String),
    /// The AK's TPMT_PUBLIC lacks an attribute every attestation key must have.
    #[error("AK objectAttributes {attributes:#010x} lack `{missing}`")]
    AkAttributes {
        /// The TPMA_OBJECT bits.
        attributes: u32,
        /// The missing attribute.
        missing: &'static str,
    },
    /// The signature scheme does not fit the AK's key type.
    #[error("quote {index}: signature algorithm {sig_alg:#06x} does not match the AK key type")]
    SignatureKeyMismatch {
        /// Quote index in the evidence.
        index: usize,
        /// TPM_ALG_ID of the signature.
        sig_alg: u16,
    },
    /// The quote signature does not verify under the AK.
    #[error("quote {index}: signature does not verify under the AK")]
    BadSignature {
        /// Quote index in the evidence.
        index: usize,
    },
    /// extraData (qualifying data) differs from the expected nonce.
    #[error("quote {index}: extraData {found} differs from the expected nonce {expected}")]
    NonceMismatch {
        /// Quote index in the evidence.
        index: usize,
        /// Hex of the expected nonce.
        expected: String,
        /// Hex of the quote's extraData.
        found: String,
    },
    /// The evidence holds no quote.
    #[error("the evidence holds no quote")]
    NoQuote,
    /// A quote selects more than one PCR bank, or a bank other than the one its values name.
    #[error(
        "quote {index}: PCR selection {selected} does not match the supplied {supplied} values"
    )]
    PcrBankMismatch {
        /// Quote index in the evidence.
        index: usize,
        /// Banks selected by the quote.
        selected: String,
        /// Bank of the supplied values.
        supplied: HashAlg,
    },
    /// A selected PCR has no supplied value, or a supplied value has the wrong length.
    #[error("quote {index}: PCR {pcr} of bank {bank}: {reason}")]
    PcrValue {
        /// Quote index in the evidence.
        index: usize,
        /// Bank.
        bank: HashAlg,
        /// PCR index.
        pcr: u8,
        /// What is wrong.
        reason: &'static str,
    },
    /// A supplied PCR value is not covered by the quote's selection.
    #[error("quote {index}: PCR {pcr} of bank {bank} is supplied but not quoted")]
    PcrNotQuoted {
        /// Quote index in the evidence.
        index: usize,
        /// Bank.
        bank: HashAlg,
        /// PCR index.
        pcr: u8,
    },
    /// The digest of the supplied PCR values differs from the quote's pcrDigest.
    #[error("quote {index}: digest of the supplied {bank} PCR values differs from pcrDigest")]
    PcrDigestMismatch {
        /// Quote index in the evidence.
        index: usize,
        /// Bank.
        bank: HashAlg,
    },
    /// A PCR value text file is malformed.
    #[error("PCR values, line {line}: {reason}")]
    PcrText {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The event log is malformed.
    #[error("event log: {reason} at byte {offset}")]
    EventLog {
        /// What is wrong.
        reason: String,
        /// Byte offset of the event.
        offset: usize,
    },
    /// Replaying the event log gives a PCR value other than the quoted one.
    #[error("event log replay: PCR {pcr} of bank {bank} replays to {replayed}, quoted {quoted}")]
    ReplayMismatch {
        /// Bank.
        bank: HashAlg,
        /// PCR index.
        pcr: u8,
        /// Hex of the replayed value.
        replayed: String,
        /// Hex of the quoted value.
        quoted: String,
    },
    /// The AK certificate does not certify the AK or does not chain to a trusted root.
    #[error("AK certificate: {0}")]
    AkCertificate(String),
    /// The Azure HCL report is malformed or does not bind its variable data.
    #[error("Azure HCL report: {0}")]
    Hcl(String),
    /// TPM collection failed.
    #[error("TPM collection: {0}")]
    Collect(String),
}
