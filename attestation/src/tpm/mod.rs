//! TPM 2.0 evidence: parsing, offline verification, AK binding and (feature `tpm-collect`)
//! collection through tss-esapi.
//!
//! # Public API (for the appraisal)
//! - [`TpmEvidence`] (serde; bytes as base64): the AK ([`AkPublic`]: a TPMT_PUBLIC or a DER
//!   SubjectPublicKeyInfo), one [`QuoteEvidence`] per PCR bank (TPMS_ATTEST, TPMT_SIGNATURE
//!   and the PCR values), and the optional TCG event log.
//! - [`verify`]`(&TpmEvidence, expected_nonce) -> Result<`[`TpmClaims`]`, `[`TpmError`]`>`
//!   checks, for every quote, the AK signature (RSASSA with SHA-1/256/384, ECDSA P-256 with
//!   SHA-256), that extraData equals the nonce, and that the digest of the supplied PCR values
//!   (with the signature's hash) equals pcrDigest; then it replays the event log. Each failed
//!   check is its own [`TpmError`] variant, naming the quote, bank and PCR.
//! - AK binding: [`TpmClaims::ak_spki_sha256`] (SHA-256 of the AK's DER SubjectPublicKeyInfo,
//!   also [`AkKey::spki_sha256`]) is the runtime-data document's `tpm_ak_sha256`;
//!   [`TpmClaims::ak_restricted`] says whether the AK's TPMT_PUBLIC attributes (fixedTPM,
//!   restricted, sign) were checked. On Azure,
//!   [`azure_hcl::parse_and_bind`] checks that the SNP REPORT_DATA holds the hash of the HCL
//!   variable data and returns `HCLAkPub` plus the SNP report, which the SNP verifier must
//!   still verify; [`azure_hcl::verify_quote_with_hcl`] does the binding and the quote check
//!   together and requires that `HCLAkPub` signed the quotes.
//! - AK certificates (GCE): [`verify_ak_certificate`] checks that a provider CA certified this
//!   AK, chaining to a caller-supplied root at `now`.
//! - Collection: `collect::collect` (feature `tpm-collect`) quotes through any TCTI.

mod abi;
mod ak_cert;
mod alg;
pub mod azure_hcl;
#[cfg(feature = "tpm-collect")]
pub mod collect;
mod error;
pub mod eventlog;
mod evidence;
mod key;
mod reader;
mod verify;

pub use abi::{AkKey, PcrSelection, Quote, Signature, check_ak_attributes, parse_tpmt_public};
pub use ak_cert::{AkCertClaims, verify_ak_certificate};
pub use alg::HashAlg;
pub use error::TpmError;
pub use evidence::{AkPublic, PcrBank, PcrValue, QuoteEvidence, TpmEvidence};
pub use verify::{ReplayClaims, TpmClaims, check_nonce, quoted_nonce, verify, verify_authenticity};
