//! Offline check that every checkpoint-signing key of an audit log was bound, through the
//! runtime-data document of its start event's evidence, to evidence that passes a policy.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use inferno_attestation::appraise::{AppraisalInput, Expectations, appraise_with};
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::policy::LoadedPolicy;
use time::OffsetDateTime;

use super::EVIDENCE_BLOB_KIND;
use inferno_audit::StartEvent;
use inferno_audit::note::VerifierKey;

/// What the binding check needs besides the start events.
#[derive(Debug, Clone, Copy)]
pub struct BindingInput<'a> {
    /// The policy every start event's evidence must pass.
    pub policy: &'a LoadedPolicy,
    /// Offline vendor collateral.
    pub collateral: Option<&'a CollateralBundle>,
    /// The time to judge the evidence at.
    pub now: OffsetDateTime,
    /// Freshness waived (`--no-freshness`): evidence re-read from an old log is NOT FRESH, and
    /// passes only under a policy that allows unfresh evidence for offline audit.
    pub no_freshness: bool,
}

/// Checks every start event: its evidence envelope passes the policy and its verified
/// runtime-data document names the event's checkpoint key. Returns the number of keys checked,
/// or the first failure as `record N: reason`.
pub fn check_start_events(
    starts: &[StartEvent],
    input: &BindingInput<'_>,
) -> Result<usize, String> {
    if starts.is_empty() {
        return Err("the log has no start event, so no checkpoint key is bound".to_owned());
    }
    for start in starts {
        check_one(start, input).map_err(|reason| format!("record {}: {reason}", start.index))?;
    }
    Ok(starts.len())
}

fn check_one(start: &StartEvent, input: &BindingInput<'_>) -> Result<(), String> {
    let key = VerifierKey::parse(&start.checkpoint_key)
        .map_err(|e| format!("start event's checkpoint key is malformed: {e}"))?;
    let blob = start
        .evidence
        .iter()
        .find(|b| b.kind == EVIDENCE_BLOB_KIND)
        .ok_or_else(|| {
            format!(
                "start event carries no `{EVIDENCE_BLOB_KIND}` evidence for checkpoint key {}",
                start.checkpoint_key
            )
        })?;
    let bytes = STANDARD
        .decode(blob.data_b64.as_bytes())
        .map_err(|e| format!("start event evidence is not base64: {e}"))?;
    let evidence =
        Evidence::from_bytes(&bytes).map_err(|e| format!("start event evidence: {e}"))?;
    let report = appraise_with(
        &AppraisalInput {
            evidence: &evidence,
            policy: input.policy,
            collateral: input.collateral,
            now: input.now,
            clock_floor: None,
            gpu_ready_pending: true,
        },
        &Expectations {
            no_freshness: input.no_freshness,
            ..Expectations::default()
        },
    );
    if let Some(failed) = report.failures().next() {
        return Err(format!(
            "start evidence rejected by policy {:?}: {}: {}",
            report.policy_name, failed.id, failed.reason
        ));
    }
    let bound = report
        .claims
        .runtime_data
        .as_ref()
        .and_then(|doc| doc.audit_key.as_deref())
        .ok_or("the start evidence's runtime-data document names no audit key")?;
    if bound != hex::encode(key.public) {
        return Err(format!(
            "checkpoint key {} is not the audit key {bound} bound into the start evidence",
            start.checkpoint_key
        ));
    }
    Ok(())
}
