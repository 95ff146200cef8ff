//! vTPM appraisal: the quotes verify with the AK over the runtime data's qualifying data, and
//! the AK is the one the runtime-data document (bound into the CPU evidence) names.

use super::AppraisalInput;
use crate::report::{CheckList, Claims};
use crate::runtime_data::RuntimeData;
use crate::tpm::HashAlg;

/// Paravisor mode (Azure HCL): REPORT_DATA binds the AK, so the runtime data must be bound by
/// the vTPM quote's qualifying data, and the quoting AK must be the one the HCL report names.
pub(super) fn appraise_paravisor(
    input: &AppraisalInput<'_>,
    paravisor_ak: [u8; 32],
    checks: &mut CheckList,
    claims: &mut Claims,
) {
    let Some(doc) = super::runtime_data_document(input, checks) else {
        return;
    };
    let Some(evidence) = &input.evidence.tpm else {
        checks.fail(
            "runtime_data.binding",
            "the paravisor fixes REPORT_DATA, so the runtime data must be bound by a vTPM quote; the evidence has none",
        );
        return;
    };
    let Some(verified) = verify_quotes(evidence, &doc, checks) else {
        return;
    };
    checks.pass(
        "tpm.quote",
        "quotes verify with the AK over the runtime data's SHA-256",
    );
    if !verified
        .ak_spki_sha256
        .eq_ignore_ascii_case(&hex::encode(paravisor_ak))
    {
        checks.fail(
            "tpm.ak_binding",
            format!(
                "the quotes are signed by AK {}, not by the HCL report's HCLAkPub",
                verified.ak_spki_sha256
            ),
        );
        return;
    }
    checks.pass(
        "tpm.ak_binding",
        "the quoting AK is the HCL report's HCLAkPub, bound by the SNP REPORT_DATA",
    );
    check_pcr_selection(input, &verified, checks);
    checks.pass(
        "runtime_data.binding",
        "SHA-256 of the runtime-data document is the vTPM quote's qualifying data (paravisor mode)",
    );
    claims.runtime_data = Some(doc);
    claims.tpm = Some(verified);
}

/// Verifies the quotes over the document's qualifying data; a failure is recorded.
fn verify_quotes(
    evidence: &crate::tpm::TpmEvidence,
    doc: &RuntimeData,
    checks: &mut CheckList,
) -> Option<crate::tpm::TpmClaims> {
    crate::tpm::verify(evidence, &doc.tpm_qualifying_data())
        .map_err(|e| checks.fail("tpm.quote", e.to_string()))
        .ok()
}

/// The verified SHA-256 bank covers every PCR the policy's `[tpm] pcrs` names.
fn check_pcr_selection(
    input: &AppraisalInput<'_>,
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

pub(super) fn appraise(input: &AppraisalInput<'_>, checks: &mut CheckList, claims: &mut Claims) {
    let required = input.policy.policy.tpm.as_ref().is_some_and(|t| t.required);
    let Some(evidence) = &input.evidence.tpm else {
        if required {
            checks.fail(
                "tpm.required",
                "the policy requires vTPM evidence; the evidence carries none",
            );
        }
        return;
    };
    if required {
        checks.pass("tpm.required", "vTPM evidence present");
    }
    // Only a runtime-data document already bound to verified CPU evidence is used.
    let Some(doc) = claims.runtime_data.clone() else {
        checks.fail(
            "tpm.quote",
            "no verified runtime-data document to check the quotes' qualifying data against",
        );
        return;
    };
    let Some(verified) = verify_quotes(evidence, &doc, checks) else {
        return;
    };
    checks.pass(
        "tpm.quote",
        format!(
            "{} quote(s): AK signature, qualifying data (SHA-256 of the runtime data) and PCR digests verify{}",
            evidence.quotes.len(),
            match &verified.event_log {
                Some(log) => format!("; the event log ({} events) replays to the quoted PCRs", log.events),
                None => "; no event log supplied".to_owned(),
            }
        ),
    );
    check_pcr_selection(input, &verified, checks);
    match &doc.tpm_ak_sha256 {
        Some(bound) if bound.eq_ignore_ascii_case(&verified.ak_spki_sha256) => checks.pass(
            "tpm.ak_binding",
            "the runtime data's tpm_ak_sha256 names this AK, binding it to the CPU evidence",
        ),
        Some(bound) => checks.fail(
            "tpm.ak_binding",
            format!(
                "the runtime data names AK {bound}, but the quotes are signed by AK {}",
                verified.ak_spki_sha256
            ),
        ),
        None => checks.fail(
            "tpm.ak_binding",
            "the runtime-data document has no tpm_ak_sha256: the AK is not bound to the CPU evidence",
        ),
    }
    claims.tpm = Some(verified);
}
