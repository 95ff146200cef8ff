//! Collection of TPM evidence through tss-esapi: an AK, one quote per PCR bank over the
//! selected PCRs with the caller's nonce, the PCR values, and the firmware event log.
//!
//! [`TpmSession`] splits this for key-first binding: the AK first, the quotes later over a
//! nonce that names it.
//!
//! The AK is either a persistent key (for instance the Azure paravisor's AK at 0x81000003)
//! or a primary restricted signing key (RSA-2048 RSASSA-SHA256, or ECDSA P-256 SHA-256)
//! created from a fixed template in the endorsement hierarchy (so the same TPM always yields
//! the same AK) and flushed after use.

use std::path::Path;
use std::str::FromStr as _;

use tss_esapi::Context;
use tss_esapi::attributes::ObjectAttributesBuilder;
use tss_esapi::handles::{KeyHandle, TpmHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::structures::{
    Data, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme, PcrSelectionList,
    PcrSelectionListBuilder, PcrSlot, Public, PublicBuilder, PublicEccParametersBuilder,
    PublicKeyRsa, PublicRsaParametersBuilder, RsaExponent, RsaScheme, SignatureScheme,
};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::Marshall as _;

use super::alg::HashAlg;
use super::error::TpmError;
use super::evidence::{AkPublic, PcrBank, PcrValue, QuoteEvidence, TpmEvidence};

/// Where Linux exposes the firmware (UEFI) event log.
pub const DEFAULT_EVENT_LOG_PATH: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// How many times a quote is retaken when the PCRs change between the quote and the read.
const QUOTE_ATTEMPTS: usize = 3;

/// The algorithm of a template AK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AkKind {
    /// RSA-2048 with RSASSA-PKCS1-v1_5 and SHA-256.
    Rsa2048,
    /// NIST P-256 with ECDSA and SHA-256.
    EccP256,
}

/// What to collect.
#[derive(Debug, Clone)]
pub struct QuoteRequest<'a> {
    /// TCTI configuration, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
    pub tcti: &'a str,
    /// Persistent handle of an existing AK; `None` creates the template AK of `ak_kind`.
    pub ak_handle: Option<u32>,
    /// Algorithm of the template AK (ignored with `ak_handle`).
    pub ak_kind: AkKind,
    /// Banks to quote, one quote each.
    pub banks: &'a [HashAlg],
    /// PCR indices to quote (0–23).
    pub pcrs: &'a [u8],
    /// Qualifying data (at most 64 bytes on most TPMs).
    pub nonce: &'a [u8],
    /// Event-log file to include when it exists (see [`DEFAULT_EVENT_LOG_PATH`]).
    pub event_log: Option<&'a Path>,
}

/// Quotes the requested PCRs and returns evidence for [`super::verify`].
pub fn collect(request: &QuoteRequest<'_>) -> Result<TpmEvidence, TpmError> {
    let mut session = TpmSession::open(request.tcti, request.ak_handle, request.ak_kind)?;
    session.evidence(
        request.banks,
        request.pcrs,
        request.nonce,
        request.event_log,
    )
}

/// An open TPM with its AK loaded, for key-first collection: read [`TpmSession::ak_public`],
/// bind its hash into the runtime-data document, then quote over that document with
/// [`TpmSession::evidence`]. A template AK is flushed when the session is dropped.
pub struct TpmSession {
    ctx: Context,
    ak: KeyHandle,
    transient: bool,
    ak_public: Vec<u8>,
}

impl std::fmt::Debug for TpmSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmSession")
            .field("transient_ak", &self.transient)
            .finish_non_exhaustive()
    }
}

impl TpmSession {
    /// Opens the TPM behind `tcti` (e.g. `device:/dev/tpmrm0`) and loads the persistent AK at
    /// `ak_handle`, or creates the template AK of `ak_kind`, and reads its public area.
    pub fn open(tcti: &str, ak_handle: Option<u32>, ak_kind: AkKind) -> Result<Self, TpmError> {
        let conf =
            TctiNameConf::from_str(tcti).map_err(|e| tss_err(&format!("TCTI `{tcti}`"), e))?;
        let mut ctx =
            Context::new(conf).map_err(|e| tss_err(&format!("opening the TPM `{tcti}`"), e))?;
        let (ak, transient) = match ak_handle {
            Some(raw) => {
                let handle = TpmHandle::try_from(raw)
                    .map_err(|e| tss_err(&format!("AK handle {raw:#x}"), e))?;
                let object = ctx
                    .tr_from_tpm_public(handle)
                    .map_err(|e| tss_err(&format!("loading AK {raw:#x}"), e))?;
                (KeyHandle::from(object), false)
            }
            None => {
                let template = ak_template(ak_kind)?;
                let created = ctx
                    .execute_with_nullauth_session(|c| {
                        c.create_primary(Hierarchy::Endorsement, template, None, None, None, None)
                    })
                    .map_err(|e| tss_err("creating the AK", e))?;
                (created.key_handle, true)
            }
        };
        let mut session = Self {
            ctx,
            ak,
            transient,
            ak_public: Vec::new(),
        };
        let (public, _, _) = session
            .ctx
            .read_public(ak)
            .map_err(|e| tss_err("reading the AK public area", e))?;
        session.ak_public = public
            .marshall()
            .map_err(|e| tss_err("marshalling TPMT_PUBLIC", e))?;
        Ok(session)
    }

    /// The AK as evidence carries it (its marshalled TPMT_PUBLIC).
    pub fn ak_public(&self) -> AkPublic {
        AkPublic::TpmtPublic(self.ak_public.clone())
    }

    /// Takes one quote per bank over `pcrs` with qualifying data `nonce`, and reads the event
    /// log at `event_log` when that file exists.
    pub fn evidence(
        &mut self,
        banks: &[HashAlg],
        pcrs: &[u8],
        nonce: &[u8],
        event_log: Option<&Path>,
    ) -> Result<TpmEvidence, TpmError> {
        let nonce =
            Data::try_from(nonce.to_vec()).map_err(|e| tss_err("nonce (at most 64 bytes)", e))?;
        let mut quotes = Vec::with_capacity(banks.len());
        for bank in banks {
            let selection = selection(*bank, pcrs)?;
            quotes.push(quote_bank(
                &mut self.ctx,
                self.ak,
                &nonce,
                *bank,
                &selection,
            )?);
        }
        Ok(TpmEvidence {
            ak: self.ak_public(),
            quotes,
            event_log: read_event_log(event_log)?,
        })
    }
}

impl Drop for TpmSession {
    fn drop(&mut self) {
        if self.transient
            && let Err(e) = self.ctx.flush_context(self.ak.into())
        {
            tracing::warn!(error = %e, "could not flush the transient AK");
        }
    }
}

/// Reads the event log when `path` names an existing file that this process may read (the
/// kernel's copy is readable by root only; without permission the log is left out).
fn read_event_log(path: Option<&Path>) -> Result<Option<Vec<u8>>, TpmError> {
    match path {
        Some(path) if path.exists() => match std::fs::read(path) {
            Ok(log) => Ok(Some(log)),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(path = %path.display(), "the TPM event log is not readable; collecting without it");
                Ok(None)
            }
            Err(e) => Err(TpmError::Collect(format!(
                "reading event log {}: {e}",
                path.display()
            ))),
        },
        Some(path) => {
            tracing::info!(path = %path.display(), "no TPM event log; collecting without it");
            Ok(None)
        }
        None => Ok(None),
    }
}

/// Quotes one bank, retrying while the PCR values move under the quote.
fn quote_bank(
    ctx: &mut Context,
    ak: KeyHandle,
    nonce: &Data,
    bank: HashAlg,
    selection: &PcrSelectionList,
) -> Result<QuoteEvidence, TpmError> {
    for _ in 0..QUOTE_ATTEMPTS {
        let before = read_pcrs(ctx, bank, selection)?;
        let (attest, signature) = ctx
            .execute_with_nullauth_session(|c| {
                c.quote(ak, nonce.clone(), SignatureScheme::Null, selection.clone())
            })
            .map_err(|e| tss_err("TPM2_Quote", e))?;
        let after = read_pcrs(ctx, bank, selection)?;
        if before == after {
            return Ok(QuoteEvidence {
                attest: attest
                    .marshall()
                    .map_err(|e| tss_err("marshalling TPMS_ATTEST", e))?,
                signature: signature
                    .marshall()
                    .map_err(|e| tss_err("marshalling TPMT_SIGNATURE", e))?,
                pcrs: PcrBank {
                    bank,
                    values: after,
                },
            });
        }
        tracing::debug!(%bank, "PCRs changed during the quote; retrying");
    }
    Err(TpmError::Collect(format!(
        "{bank} PCRs kept changing during {QUOTE_ATTEMPTS} quote attempts"
    )))
}

/// Reads the selected PCRs of one bank.
fn read_pcrs(
    ctx: &mut Context,
    bank: HashAlg,
    selection: &PcrSelectionList,
) -> Result<Vec<PcrValue>, TpmError> {
    let data = tss_esapi::abstraction::pcr::read_all(ctx, selection.clone())
        .map_err(|e| tss_err("TPM2_PCR_Read", e))?;
    let values = data
        .pcr_bank(hashing(bank))
        .ok_or_else(|| TpmError::Collect(format!("the TPM returned no {bank} bank")))?;
    values
        .into_iter()
        .map(|(slot, digest)| {
            let mask = u32::from(*slot);
            let index = u8::try_from(mask.trailing_zeros())
                .map_err(|_| TpmError::Collect("PCR slot out of range".into()))?;
            Ok(PcrValue {
                index,
                value: digest.value().to_vec(),
            })
        })
        .collect()
}

/// Builds a single-bank PCR selection.
fn selection(bank: HashAlg, pcrs: &[u8]) -> Result<PcrSelectionList, TpmError> {
    let slots = pcrs
        .iter()
        .map(|pcr| {
            1u32.checked_shl(u32::from(*pcr))
                .filter(|_| *pcr < 24)
                .ok_or_else(|| TpmError::Collect(format!("PCR {pcr} out of range")))
                .and_then(|mask| {
                    PcrSlot::try_from(mask).map_err(|e| tss_err(&format!("PCR {pcr}"), e))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    PcrSelectionListBuilder::new()
        .with_selection(hashing(bank), &slots)
        .build()
        .map_err(|e| tss_err("PCR selection", e))
}

/// The restricted signing-key template of the AK.
fn ak_template(kind: AkKind) -> Result<Public, TpmError> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()
        .map_err(|e| tss_err("AK attributes", e))?;
    let builder = PublicBuilder::new()
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes);
    let builder = match kind {
        AkKind::Rsa2048 => {
            let params = PublicRsaParametersBuilder::new()
                .with_scheme(RsaScheme::RsaSsa(HashScheme::new(HashingAlgorithm::Sha256)))
                .with_key_bits(RsaKeyBits::Rsa2048)
                .with_exponent(RsaExponent::default())
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(true)
                .build()
                .map_err(|e| tss_err("AK RSA parameters", e))?;
            builder
                .with_public_algorithm(PublicAlgorithm::Rsa)
                .with_rsa_parameters(params)
                .with_rsa_unique_identifier(PublicKeyRsa::default())
        }
        AkKind::EccP256 => {
            let params = PublicEccParametersBuilder::new()
                .with_ecc_scheme(EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)))
                .with_curve(EccCurve::NistP256)
                .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(true)
                .build()
                .map_err(|e| tss_err("AK ECC parameters", e))?;
            builder
                .with_public_algorithm(PublicAlgorithm::Ecc)
                .with_ecc_parameters(params)
                .with_ecc_unique_identifier(EccPoint::default())
        }
    };
    builder.build().map_err(|e| tss_err("AK template", e))
}

/// Maps a bank to tss-esapi's hashing algorithm.
fn hashing(bank: HashAlg) -> HashingAlgorithm {
    match bank {
        HashAlg::Sha1 => HashingAlgorithm::Sha1,
        HashAlg::Sha256 => HashingAlgorithm::Sha256,
        HashAlg::Sha384 => HashingAlgorithm::Sha384,
    }
}

/// Wraps a tss-esapi error with what was being done.
fn tss_err(what: &str, e: tss_esapi::Error) -> TpmError {
    TpmError::Collect(format!("{what}: {e}"))
}
