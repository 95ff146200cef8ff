//! vTPM appraisal. Whenever the evidence carries a vTPM section its quotes are verified, on
//! every path, each aspect as its own check:
//! - `tpm.required`: presence, when the policy's `[tpm] required` is set;
//! - `tpm.quote`: the AK signature, the PCR digests against the supplied PCR values, and the
//!   event-log replay;
//! - `tpm.nonce`: the quotes' qualifying data against what the evidence binds (the SHA-256 of
//!   the runtime-data document) or, without a document, the caller's expected nonce (not
//!   checked when the caller waived freshness);
//! - `tpm.ak_binding`: the AK is the one the CPU evidence vouches for (the runtime data's
//!   `tpm_ak_sha256`, or under a paravisor the HCL report's `HCLAkPub`);
//! - `tpm.pcr_selection`: the verified SHA-256 bank covers the policy's PCRs;
//! - `tpm.pcr_values`: each PCR with accepted values (`[tpm] pcr_values`, or the reference
//!   values the policy names) holds one of them; a failure names the PCR and its value. The one
//!   per-platform rule: PCR 11 (the UKI, measured by systemd-stub) may be zero only when the CPU
//!   evidence pins the kernel instead (SEV-SNP measured direct boot with a listed launch
//!   measurement, `[sev_snp] measured_direct_boot`); TDX's MRTD does not, so there it fails.

use super::Sections;
use crate::report::{CheckList, Claims};
use crate::runtime_data::RuntimeData;
use crate::tpm::{HashAlg, TpmEvidence};

/// What vouches for the vTPM's attestation key.
#[derive(Debug, Clone, Copy)]
pub(super) enum AkAnchor {
    /// A paravisor (Azure HCL) fixes REPORT_DATA and binds this AK (SHA-256 of its SPKI); the
    /// runtime data must then be bound by the quotes' qualifying data.
    Paravisor([u8; 32]),
    /// The runtime-data document already bound to verified CPU evidence names the AK.
    RuntimeData,
    /// Standalone evidence: an AK certificate chaining to a caller's root must.
    Certificate,
    /// Nothing does: the CPU evidence did not verify.
    Unverified,
}

/// Appraises the vTPM section (see the module documentation).
pub(super) fn appraise(
    input: &Sections<'_>,
    anchor: AkAnchor,
    checks: &mut CheckList,
    claims: &mut Claims,
) {
    let expected_nonce = input.expected_nonce;
    let required = input.policy.policy.tpm.as_ref().is_some_and(|t| t.required);
    // Under a paravisor the runtime data is bound here, through the quote.
    let paravisor_doc = match anchor {
        AkAnchor::Paravisor(_) => super::runtime_data_document(input, checks),
        _ => None,
    };
    let Some(evidence) = input.tpm else {
        if required {
            checks.fail(
                "tpm.required",
                "the policy requires vTPM evidence; the evidence carries none",
            );
        }
        if paravisor_doc.is_some() {
            checks.fail(
                "runtime_data.binding",
                "the paravisor fixes REPORT_DATA, so the runtime data must be bound by a vTPM quote; the evidence has none",
            );
        }
        return;
    };
    if required {
        checks.pass("tpm.required", "vTPM evidence present");
    }

    let verified = match crate::tpm::verify_authenticity(evidence) {
        Ok(v) => {
            checks.pass(
                "tpm.quote",
                format!(
                    "{} quote(s): AK signature and PCR digests verify{}",
                    evidence.quotes.len(),
                    match &v.event_log {
                        Some(log) => format!(
                            "; the event log ({} events) replays to the quoted PCRs",
                            log.events
                        ),
                        None => "; no event log supplied".to_owned(),
                    }
                ),
            );
            Some(v)
        }
        Err(e) => {
            checks.fail("tpm.quote", e.to_string());
            None
        }
    };

    let doc = match anchor {
        AkAnchor::Paravisor(_) => paravisor_doc,
        _ => claims.runtime_data.clone(),
    };
    let nonce_ok = check_nonce(
        input,
        evidence,
        doc.as_ref(),
        expected_nonce,
        anchor,
        checks,
    );
    let ak_ok = match anchor {
        AkAnchor::Certificate => check_ak_certificate(input, evidence, checks),
        _ => check_ak_binding(evidence, doc.as_ref(), anchor, checks),
    };
    if let Some(verified) = &verified {
        check_pcr_selection(input, verified, checks);
        check_pcr_values(input, verified, checks);
    }
    if let (AkAnchor::Paravisor(_), Some(doc)) = (anchor, doc) {
        if verified.is_some() && nonce_ok && ak_ok {
            checks.pass(
                "runtime_data.binding",
                "SHA-256 of the runtime-data document is the vTPM quote's qualifying data (paravisor mode)",
            );
            claims.runtime_data = Some(doc);
        } else {
            checks.fail(
                "runtime_data.binding",
                "the paravisor fixes REPORT_DATA and the vTPM quote that must bind the runtime data did not verify",
            );
        }
    }
    claims.tpm = verified;
}

/// `tpm.nonce`: the quotes' qualifying data against the runtime data's SHA-256 or, without a
/// document, the caller's expected nonce. Reported even when the signature failed (the
/// qualifying data is then read from the unverified quote, and the report says so).
fn check_nonce(
    input: &Sections<'_>,
    evidence: &TpmEvidence,
    doc: Option<&RuntimeData>,
    expected_nonce: Option<&[u8]>,
    anchor: AkAnchor,
    checks: &mut CheckList,
) -> bool {
    let quoted = match crate::tpm::quoted_nonce(evidence) {
        Ok(n) => n,
        Err(e) => {
            checks.fail("tpm.nonce", e.to_string());
            return false;
        }
    };
    let (expected, what) = match (doc, expected_nonce) {
        (Some(doc), _) => (
            doc.tpm_qualifying_data().to_vec(),
            "the SHA-256 of the runtime-data document",
        ),
        (None, Some(nonce)) => (nonce.to_vec(), "the expected nonce"),
        (None, None) => {
            // Nothing to compare with. Under a paravisor without runtime data (allowed only
            // when the policy does not require it; that failure is its own check) the
            // qualifying data is reported as unbound; otherwise the quote has no binding.
            let unbound = matches!(anchor, AkAnchor::Paravisor(_))
                && !input.policy.policy.runtime_data.required;
            if input.no_freshness {
                checks.pass(
                    "tpm.nonce",
                    format!(
                        "qualifying data {} is not checked: no runtime-data document and freshness waived (--no-freshness)",
                        hex::encode(&quoted)
                    ),
                );
                return true;
            }
            if unbound {
                checks.pass(
                    "tpm.nonce",
                    format!(
                        "qualifying data {} is bound to nothing: no runtime-data document and no expected nonce (no freshness)",
                        hex::encode(&quoted)
                    ),
                );
                return true;
            }
            checks.fail(
                "tpm.nonce",
                "no verified runtime-data document or expected nonce to check the quotes' qualifying data against",
            );
            return false;
        }
    };
    if quoted == expected {
        checks.pass(
            "tpm.nonce",
            format!("the quotes' qualifying data is {what}"),
        );
        true
    } else {
        checks.fail(
            "tpm.nonce",
            format!(
                "the quotes' qualifying data is {} but {what} is {}",
                hex::encode(&quoted),
                hex::encode(&expected)
            ),
        );
        false
    }
}

/// `tpm.ak_binding`: the evidence's AK (the one its signatures are checked under) is the one
/// the CPU evidence vouches for.
fn check_ak_binding(
    evidence: &TpmEvidence,
    doc: Option<&RuntimeData>,
    anchor: AkAnchor,
    checks: &mut CheckList,
) -> bool {
    let ak = match evidence.ak.key().and_then(|k| k.spki_sha256()) {
        Ok(ak) => hex::encode(ak),
        Err(e) => {
            checks.fail("tpm.ak_binding", format!("AK: {e}"));
            return false;
        }
    };
    let (bound, passed_reason) = match (anchor, doc) {
        (AkAnchor::Paravisor(hcl_ak), _) => (
            hex::encode(hcl_ak),
            "the quoting AK is the HCL report's HCLAkPub, bound by the SNP REPORT_DATA",
        ),
        (AkAnchor::RuntimeData, Some(doc)) => match &doc.tpm_ak_sha256 {
            Some(bound) => (
                bound.to_ascii_lowercase(),
                "the runtime data's tpm_ak_sha256 names this AK, binding it to the CPU evidence",
            ),
            None => {
                checks.fail(
                    "tpm.ak_binding",
                    "the runtime-data document has no tpm_ak_sha256: the AK is not bound to the CPU evidence",
                );
                return false;
            }
        },
        _ => {
            checks.fail(
                "tpm.ak_binding",
                "no verified CPU evidence or runtime-data document binds the AK",
            );
            return false;
        }
    };
    if ak == bound {
        checks.pass("tpm.ak_binding", passed_reason);
        true
    } else {
        checks.fail(
            "tpm.ak_binding",
            match anchor {
                AkAnchor::Paravisor(_) => format!(
                    "the quotes are signed by AK {ak}, not by the HCL report's HCLAkPub {bound}"
                ),
                _ => format!(
                    "the runtime data names AK {bound}, but the quotes are signed by AK {ak}"
                ),
            },
        );
        false
    }
}

/// `tpm.ak_certificate` (standalone evidence): the policy pins this AK's public key
/// (`[tpm] ak_public_keys`), or the AK certificate certifies this AK and chains through the
/// supplied intermediates to one of the caller's roots at `now`.
fn check_ak_certificate(
    input: &Sections<'_>,
    evidence: &TpmEvidence,
    checks: &mut CheckList,
) -> bool {
    let pinned = input
        .policy
        .policy
        .tpm
        .as_ref()
        .map(|tpm| tpm.ak_public_keys.as_slice())
        .unwrap_or_default();
    if !pinned.is_empty()
        && let Ok(ak) = evidence.ak.key().and_then(|k| k.spki_sha256())
    {
        let ak = hex::encode(ak);
        if pinned.iter().any(|key| key.eq_ignore_ascii_case(&ak)) {
            checks.pass(
                "tpm.ak_certificate",
                format!("the policy pins this AK's public key ([tpm] ak_public_keys: {ak})"),
            );
            return true;
        }
    }
    let Some((leaf, intermediates)) = input.tpm_ak_certs.split_first() else {
        checks.fail(
            "tpm.ak_certificate",
            "no CPU evidence and no AK certificate vouch for the AK (give `tpm_ak_certs` and --tpm-root)",
        );
        return false;
    };
    let intermediates: Vec<Vec<u8>> = intermediates.iter().map(|c| c.0.clone()).collect();
    let result = evidence.ak.key().and_then(|ak| {
        crate::tpm::verify_ak_certificate(&ak, &leaf.0, &intermediates, input.tpm_roots, input.now)
    });
    match result {
        Ok(cert) => {
            checks.pass(
                "tpm.ak_certificate",
                format!(
                    "the AK certificate certifies this AK and chains via {} to a trusted root",
                    cert.chain.join(" → ")
                ),
            );
            true
        }
        Err(e) => {
            checks.fail("tpm.ak_certificate", e.to_string());
            false
        }
    }
}

/// The verified SHA-256 bank covers every PCR the policy's `[tpm] pcrs` names.
fn check_pcr_selection(
    input: &Sections<'_>,
    verified: &crate::tpm::TpmClaims,
    checks: &mut CheckList,
) {
    let Some(policy) = &input.policy.policy.tpm else {
        return;
    };
    let quoted = verified.pcrs.get(&HashAlg::Sha256);
    let missing: Vec<String> = policy
        .pcrs
        .iter()
        .filter(|pcr| !quoted.is_some_and(|bank| bank.contains_key(pcr)))
        .map(u8::to_string)
        .collect();
    if missing.is_empty() {
        checks.pass(
            "tpm.pcr_selection",
            format!(
                "the SHA-256 quote covers the policy's PCRs {:?}",
                policy.pcrs
            ),
        );
    } else {
        checks.fail(
            "tpm.pcr_selection",
            format!(
                "the policy requires SHA-256 PCRs {:?}; no verified quote covers {}",
                policy.pcrs,
                missing.join(", ")
            ),
        );
    }
}

/// `tpm.pcr_values`: every PCR the policy gives accepted values for (`[tpm] pcr_values`, filled
/// from the reference values) holds one of them in the verified SHA-256 bank. A PCR that is not
/// quoted fails too (`tpm.pcr_selection` says so as well).
fn check_pcr_values(
    input: &Sections<'_>,
    verified: &crate::tpm::TpmClaims,
    checks: &mut CheckList,
) {
    let Some(policy) = input.policy.policy.tpm.as_ref() else {
        return;
    };
    if policy.pcr_values.is_empty() {
        return;
    }
    let quoted = verified.pcrs.get(&HashAlg::Sha256);
    let mut wrong = Vec::new();
    let mut matched = Vec::new();
    for (key, accepted) in &policy.pcr_values {
        let source = input
            .policy
            .allow_list_name(&format!("tpm.pcr_values.{key}"));
        let value = key
            .parse::<u8>()
            .ok()
            .and_then(|pcr| quoted.and_then(|bank| bank.get(&pcr)));
        match value {
            None => wrong.push(format!("PCR {key} is not quoted")),
            Some(value) if accepted.iter().any(|a| a.eq_ignore_ascii_case(value)) => {
                matched.push(format!(
                    "PCR {key} = {} is in {source}",
                    value.to_ascii_lowercase()
                ));
            }
            Some(value) if key == "11" && is_zero(value) => match input.kernel_pinned {
                Some(pinned) => matched.push(format!(
                    "PCR 11 is zero: measured direct boot runs no systemd-stub, and {pinned}"
                )),
                None => wrong.push(format!(
                    "PCR 11 is zero (no UKI was measured: direct boot) and is not in {source}; a zero PCR 11 is accepted only on SEV-SNP with [sev_snp] measured_direct_boot and a listed launch measurement, and here nothing pins the kernel (TDX's MRTD does not)"
                )),
            },
            Some(value) => wrong.push(format!(
                "PCR {key} = {} is not in {source}",
                value.to_ascii_lowercase()
            )),
        }
    }
    if wrong.is_empty() {
        checks.pass("tpm.pcr_values", matched.join("; "));
    } else {
        checks.fail("tpm.pcr_values", wrong.join("; "));
    }
}

/// Whether a PCR value (hex) is all zeros: never extended since reset.
fn is_zero(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b == b'0')
}
