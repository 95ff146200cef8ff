//! TDX appraisal: DCAP verification, then the policy's rules on TCB status, advisories,
//! TD attributes and measurement registers.

use super::{AppraisalInput, PlatformOutcome, allow_list};
use crate::report::{CheckList, Claims, TdxClaims};
use crate::verify::tdx::verify;

pub(super) fn appraise(
    input: &AppraisalInput<'_>,
    checks: &mut CheckList,
    claims: &mut Claims,
) -> Option<PlatformOutcome> {
    let policy = &input.policy.policy;
    let Some(section) = &input.evidence.tdx else {
        checks.fail("tdx.quote_format", "evidence has no tdx section");
        return None;
    };
    let Some(tdx_policy) = &policy.tdx else {
        checks.fail("tdx.policy", "the policy has no [tdx] table");
        return None;
    };
    let collateral = input
        .collateral
        .map(|c| c.intel.as_slice())
        .unwrap_or_default();
    let grace = time::Duration::seconds(
        i64::try_from(policy.time.collateral_grace_seconds).unwrap_or(i64::MAX),
    );
    let verified = match verify(&section.quote.0, collateral, input.now, grace) {
        Ok(v) => v,
        Err(e) => {
            checks.fail(e.check_id(), e.to_string());
            return None;
        }
    };
    checks.pass(
        "tdx.quote_format",
        format!("DCAP quote version {}", verified.quote_version),
    );
    for (id, reason) in &verified.passed {
        checks.pass(id, reason.clone());
    }
    if tdx_policy.allowed_tcb_status.contains(&verified.tcb_status) {
        checks.pass(
            "tdx.tcb_status",
            format!("TCB status {} is accepted", verified.tcb_status),
        );
    } else {
        checks.fail(
            "tdx.tcb_status",
            format!(
                "TCB status {} is not among {:?}",
                verified.tcb_status, tdx_policy.allowed_tcb_status
            ),
        );
    }
    let unexpected: Vec<&String> = verified
        .advisory_ids
        .iter()
        .filter(|a| !tdx_policy.allowed_advisories.contains(a))
        .collect();
    if unexpected.is_empty() {
        checks.pass(
            "tdx.advisories",
            if verified.advisory_ids.is_empty() {
                "no security advisories apply".to_owned()
            } else {
                format!(
                    "advisories {:?} are tolerated by the policy",
                    verified.advisory_ids
                )
            },
        );
    } else {
        checks.fail(
            "tdx.advisories",
            format!("advisories not tolerated by the policy: {unexpected:?}"),
        );
    }
    let td = &verified.report;
    let attrs = hex::encode(td.td_attributes);
    if td.debug() && !tdx_policy.allow_debug {
        checks.fail(
            "tdx.debug",
            format!("TD attributes {attrs} have DEBUG set; the policy forbids it"),
        );
    } else {
        checks.pass(
            "tdx.debug",
            format!(
                "TD attributes {attrs}: DEBUG {}",
                if td.debug() { "set" } else { "clear" }
            ),
        );
    }
    allow_list(
        checks,
        input.policy,
        ("tdx.mrtd", "tdx.mrtd"),
        "MRTD",
        &td.mr_td,
        tdx_policy.mrtd.as_ref(),
    );
    let rtmr_lists = [
        &tdx_policy.rtmr0,
        &tdx_policy.rtmr1,
        &tdx_policy.rtmr2,
        &tdx_policy.rtmr3,
    ];
    for (i, (value, list)) in td.rtmrs.iter().zip(rtmr_lists).enumerate() {
        let id = format!("tdx.rtmr{i}");
        allow_list(
            checks,
            input.policy,
            (&id, &id),
            &format!("RTMR{i}"),
            value,
            list.as_ref(),
        );
    }
    allow_list(
        checks,
        input.policy,
        ("tdx.mr_config_id", "tdx.mr_config_id"),
        "MRCONFIGID",
        &td.mr_config_id,
        tdx_policy.mr_config_id.as_ref(),
    );

    claims.tdx = Some(TdxClaims {
        quote_version: verified.quote_version,
        tcb_status: verified.tcb_status.clone(),
        advisory_ids: verified.advisory_ids.clone(),
        fmspc: verified.fmspc.clone(),
        td_attributes: attrs,
        debug: td.debug(),
        mrtd: hex::encode(td.mr_td),
        rtmrs: td.rtmrs.map(hex::encode),
        mr_config_id: hex::encode(td.mr_config_id),
        report_data: hex::encode(td.report_data),
    });
    Some(PlatformOutcome {
        simulated: false,
        report_data: Some(td.report_data),
        paravisor_ak: None,
        signed_timestamps: verified.signed_timestamps,
        // MRTD measures the firmware only; nothing here pins the kernel (RTMR2 is not enforced).
        kernel_pinned: None,
    })
}
