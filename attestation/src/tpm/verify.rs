//! Verification of TPM evidence: quote signatures, nonce, PCR digests and event-log replay.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::abi::{Quote, Signature, check_ak_attributes};
use super::alg::HashAlg;
use super::error::TpmError;
use super::eventlog::EventLog;
use super::evidence::{AkPublic, QuoteEvidence, TpmEvidence};

/// What verified TPM evidence vouches for. Plain data; digests are lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TpmClaims {
    /// SHA-256 of the AK's DER SubjectPublicKeyInfo (hex): the runtime-data document's
    /// `tpm_ak_sha256`.
    pub ak_spki_sha256: String,
    /// True when the AK came as a TPMT_PUBLIC whose attributes (fixedTPM, restricted, sign)
    /// were checked; false when only its public key was given (e.g. Azure's `HCLAkPub`,
    /// which the HCL report vouches for instead).
    pub ak_restricted: bool,
    /// The quotes' extraData (hex), equal to the expected nonce.
    pub nonce: String,
    /// Verified PCR values: bank → PCR index → hex digest.
    pub pcrs: BTreeMap<HashAlg, BTreeMap<u8, String>>,
    /// TPM clock of the first quote.
    pub clock: u64,
    /// Reset count of the first quote.
    pub reset_count: u32,
    /// Restart count of the first quote.
    pub restart_count: u32,
    /// TPM firmware version.
    pub firmware_version: u64,
    /// Event-log replay result, when the evidence carries a log.
    pub event_log: Option<ReplayClaims>,
}

/// Outcome of replaying the event log against the quoted PCRs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayClaims {
    /// Number of events in the log (header excluded).
    pub events: usize,
    /// Per bank, the quoted PCRs whose value the log reproduces.
    pub reproduced: BTreeMap<HashAlg, BTreeSet<u8>>,
    /// Per bank, quoted PCRs that no event extends and whose value is not the reset value, or
    /// [`OS_EXTENDED_PCRS`] that do not replay (measured by something the log does not record,
    /// such as IMA in PCR 10 or systemd-pcrphase in PCR 11).
    pub unaccounted: BTreeMap<HashAlg, BTreeSet<u8>>,
}

/// PCRs an operating system extends after ExitBootServices without entries in the firmware's
/// event log: IMA (10), systemd-pcrphase's boot phases after systemd-stub's UKI measurements
/// (11), systemd's machine-id, file-system and volume-key measurements (15). A firmware log
/// that does not replay to their quoted value leaves them in [`ReplayClaims::unaccounted`]
/// instead of failing: their accepted values are the policy's `[tpm] pcr_values`.
pub const OS_EXTENDED_PCRS: [u8; 3] = [10, 11, 15];

/// Verifies every quote (AK signature, nonce, PCR digest) and replays the event log.
///
/// A PCR extended by the event log must replay to its quoted value, except the
/// [`OS_EXTENDED_PCRS`]; a PCR the log never extends (or one of those that does not replay) is
/// reported in [`ReplayClaims::unaccounted`] when it differs from its reset value.
pub fn verify(evidence: &TpmEvidence, expected_nonce: &[u8]) -> Result<TpmClaims, TpmError> {
    let claims = verify_authenticity(evidence)?;
    check_nonce(&claims.nonce, expected_nonce)?;
    Ok(claims)
}

/// Verifies every quote's AK signature, PCR selection and PCR digest, that all quotes carry
/// the same qualifying data, and replays the event log; the qualifying data is returned in
/// [`TpmClaims::nonce`] for the caller to judge (see [`check_nonce`]).
pub fn verify_authenticity(evidence: &TpmEvidence) -> Result<TpmClaims, TpmError> {
    let ak = evidence.ak.key()?;
    let ak_hash = ak.spki_sha256()?;
    let ak_restricted = match &evidence.ak {
        AkPublic::TpmtPublic(bytes) => {
            check_ak_attributes(bytes)?;
            true
        }
        AkPublic::SpkiDer(_) => false,
    };
    let mut pcrs: BTreeMap<HashAlg, BTreeMap<u8, String>> = BTreeMap::new();
    let mut quotes: Vec<Quote> = Vec::with_capacity(evidence.quotes.len());
    for (index, q) in evidence.quotes.iter().enumerate() {
        let quote = verify_quote(index, q, &ak)?;
        if let Some(head) = quotes.first()
            && head.extra_data != quote.extra_data
        {
            return Err(TpmError::NonceMismatch {
                index,
                expected: hex::encode(&head.extra_data),
                found: hex::encode(&quote.extra_data),
            });
        }
        quotes.push(quote);
        let bank = pcrs.entry(q.pcrs.bank).or_default();
        for v in &q.pcrs.values {
            bank.insert(v.index, hex::encode(&v.value));
        }
    }
    let head = quotes.first().ok_or(TpmError::NoQuote)?;
    let event_log = evidence
        .event_log
        .as_deref()
        .map(|log| replay_against(log, &pcrs))
        .transpose()?;
    Ok(TpmClaims {
        ak_spki_sha256: hex::encode(ak_hash),
        ak_restricted,
        nonce: hex::encode(&head.extra_data),
        pcrs,
        clock: head.clock,
        reset_count: head.reset_count,
        restart_count: head.restart_count,
        firmware_version: head.firmware_version,
        event_log,
    })
}

/// The qualifying data (extraData) the evidence's quotes carry, read without verifying them:
/// what a verifier reports beside a failed signature. All quotes must carry the same.
pub fn quoted_nonce(evidence: &TpmEvidence) -> Result<Vec<u8>, TpmError> {
    let mut nonce: Option<Vec<u8>> = None;
    for (index, q) in evidence.quotes.iter().enumerate() {
        let quote = Quote::parse(&q.attest)?;
        match &nonce {
            Some(head) if *head != quote.extra_data => {
                return Err(TpmError::NonceMismatch {
                    index,
                    expected: hex::encode(head),
                    found: hex::encode(&quote.extra_data),
                });
            }
            Some(_) => {}
            None => nonce = Some(quote.extra_data),
        }
    }
    nonce.ok_or(TpmError::NoQuote)
}

/// Compares the quotes' qualifying data (hex, as in [`TpmClaims::nonce`]) with the expected
/// nonce.
pub fn check_nonce(quoted_hex: &str, expected_nonce: &[u8]) -> Result<(), TpmError> {
    if quoted_hex.eq_ignore_ascii_case(&hex::encode(expected_nonce)) {
        Ok(())
    } else {
        Err(TpmError::NonceMismatch {
            index: 0,
            expected: hex::encode(expected_nonce),
            found: quoted_hex.to_owned(),
        })
    }
}

/// Checks one quote: signature, selection and PCR digest.
fn verify_quote(
    index: usize,
    q: &QuoteEvidence,
    ak: &super::abi::AkKey,
) -> Result<Quote, TpmError> {
    let quote = Quote::parse(&q.attest)?;
    let signature = Signature::parse(&q.signature)?;
    ak.verify(&q.attest, &signature, index)?;
    let bank = q.pcrs.bank;
    let selected: Vec<_> = quote
        .selections
        .iter()
        .filter(|s| !s.pcrs.is_empty())
        .collect();
    let [selection] = selected.as_slice() else {
        return Err(TpmError::PcrBankMismatch {
            index,
            selected: describe(&quote),
            supplied: bank,
        });
    };
    if selection.bank != bank {
        return Err(TpmError::PcrBankMismatch {
            index,
            selected: describe(&quote),
            supplied: bank,
        });
    }
    let supplied: BTreeMap<u8, &[u8]> = q
        .pcrs
        .values
        .iter()
        .map(|v| (v.index, v.value.as_slice()))
        .collect();
    if let Some(extra) = supplied.keys().find(|i| !selection.pcrs.contains(i)) {
        return Err(TpmError::PcrNotQuoted {
            index,
            bank,
            pcr: *extra,
        });
    }
    let mut concatenated = Vec::new();
    for pcr in &selection.pcrs {
        let value = supplied.get(pcr).ok_or(TpmError::PcrValue {
            index,
            bank,
            pcr: *pcr,
            reason: "selected by the quote but not supplied",
        })?;
        if value.len() != bank.digest_len() {
            return Err(TpmError::PcrValue {
                index,
                bank,
                pcr: *pcr,
                reason: "value length does not match the bank's digest size",
            });
        }
        concatenated.extend_from_slice(value);
    }
    if signature.hash().digest(&concatenated) != quote.pcr_digest {
        return Err(TpmError::PcrDigestMismatch { index, bank });
    }
    Ok(quote)
}

/// Names the banks a quote selects, for error messages.
fn describe(quote: &Quote) -> String {
    let names: Vec<_> = quote
        .selections
        .iter()
        .filter(|s| !s.pcrs.is_empty())
        .map(|s| s.bank.name())
        .collect();
    format!("[{}]", names.join(", "))
}

/// Replays the log for every quoted bank that it carries and compares.
fn replay_against(
    log: &[u8],
    pcrs: &BTreeMap<HashAlg, BTreeMap<u8, String>>,
) -> Result<ReplayClaims, TpmError> {
    let log = EventLog::parse(log)?;
    let mut claims = ReplayClaims {
        events: log.events.len(),
        reproduced: BTreeMap::new(),
        unaccounted: BTreeMap::new(),
    };
    for (bank, quoted) in pcrs {
        if !log.banks.contains(bank) {
            continue;
        }
        let replay = log.replay(*bank)?;
        for (pcr, quoted_hex) in quoted {
            let Some(replayed) = replay.values.get(pcr) else {
                continue;
            };
            let replayed_hex = hex::encode(replayed);
            if &replayed_hex == quoted_hex {
                claims.reproduced.entry(*bank).or_default().insert(*pcr);
            } else if replay.extended.contains(pcr) && !OS_EXTENDED_PCRS.contains(pcr) {
                return Err(TpmError::ReplayMismatch {
                    bank: *bank,
                    pcr: *pcr,
                    replayed: replayed_hex,
                    quoted: quoted_hex.clone(),
                });
            } else {
                claims.unaccounted.entry(*bank).or_default().insert(*pcr);
            }
        }
    }
    Ok(claims)
}
