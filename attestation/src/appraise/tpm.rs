//! vTPM appraisal: the quotes verify with the AK over the runtime data's qualifying data, and
//! the AK is the one the runtime-data document (bound into the CPU evidence) names.

use super::AppraisalInput;
use crate::report::{CheckList, Claims};

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
    let verified = match crate::tpm::verify(evidence, &doc.tpm_qualifying_data()) {
        Ok(v) => v,
        Err(e) => {
            checks.fail("tpm.quote", e.to_string());
            return;
        }
    };
    checks.pass(
        "tpm.quote",
        format!(
            "{} quote(s): AK signature, qualifying data (SHA-512 of the runtime data) and PCR digests verify{}",
            evidence.quotes.len(),
            match &verified.event_log {
                Some(log) => format!("; the event log ({} events) replays to the quoted PCRs", log.events),
                None => "; no event log supplied".to_owned(),
            }
        ),
    );
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
