//! GPU appraisal: the NVIDIA verifier (device chain, SPDM signature, nonce, FWID, RIMs,
//! allow-lists), then the policy's rules on CC mode, ready state and reference values.

use super::AppraisalInput;
use crate::bundle::RimComponent;
use crate::nvidia::GpuEvidence;
use crate::nvidia::rim::{ParsedRim, Rim, RimKind};
use crate::nvidia::{CcMode, GpuTrust};
use crate::ocsp::{self, OcspError, OcspResponses};
use crate::report::{CheckList, Claims};

/// Appraises the GPU section. Returns whether the GPU chain ends at a simulated root.
pub(super) fn appraise(
    input: &AppraisalInput<'_>,
    checks: &mut CheckList,
    claims: &mut Claims,
) -> bool {
    let policy = &input.policy.policy;
    let gpu_policy = &policy.gpu;
    let Some(evidence) = &input.evidence.gpu else {
        if gpu_policy.required {
            checks.fail(
                "gpu.required",
                "the policy requires verified GPU evidence; the evidence carries none",
            );
        }
        return false;
    };
    if gpu_policy.required {
        checks.pass("gpu.required", "GPU evidence present");
    }
    let Some(doc) = claims.runtime_data.clone() else {
        checks.fail(
            "gpu.verify",
            "no verified runtime-data document: the GPU report's nonce cannot be bound to the CPU evidence",
        );
        return false;
    };
    let mut trust = match GpuTrust::nvidia() {
        Ok(t) => t,
        Err(e) => {
            checks.fail("gpu.verify", format!("built-in NVIDIA roots: {e}"));
            return false;
        }
    };
    for der in &evidence.cert_chain {
        let fingerprint = hex::encode(crate::pki::sha256(der));
        if policy
            .simulated
            .trusted_gpu_root_sha256
            .contains(&fingerprint)
        {
            trust.simulated_roots.push(der.clone());
        }
    }
    trust.allowed_driver_versions = gpu_policy.driver_versions.clone();
    trust.allowed_vbios_versions = gpu_policy.vbios_versions.clone();
    for rim in input.collateral.iter().flat_map(|c| c.nvidia.rims.iter()) {
        let kind = match rim.component {
            RimComponent::Driver => RimKind::Driver,
            RimComponent::Vbios => RimKind::Vbios,
        };
        trust.rims.push(Rim {
            kind,
            xml: rim.data.0.clone(),
        });
    }
    let verified = match crate::nvidia::verify(evidence, &trust, &doc.gpu_nonce(), input.now) {
        Ok(v) => v,
        Err(e) => {
            checks.fail("gpu.verify", e.to_string());
            return false;
        }
    };
    checks.pass(
        "gpu.verify",
        format!(
            "device chain to the {} root, SPDM signature, nonce (SHA-256 of the runtime data) and FWID verify; driver {} and VBIOS {} allowed",
            if verified.simulated { "simulated (policy-named)" } else { "NVIDIA" },
            verified.driver_version,
            verified.vbios_version
        ),
    );
    check_ocsp(input, evidence, &trust.rims, checks);
    if gpu_policy.require_cc_mode && verified.cc_mode != CcMode::On {
        checks.fail(
            "gpu.cc_mode",
            format!(
                "driver reports CC mode {:?}; the policy requires On",
                verified.cc_mode
            ),
        );
    } else {
        checks.pass(
            "gpu.cc_mode",
            format!("driver reports CC mode {:?}", verified.cc_mode),
        );
    }
    if gpu_policy.require_ready_state && !input.gpu_ready_pending && !verified.ready_state {
        checks.fail(
            "gpu.ready_state",
            "the GPU is not in CC ready state; the policy requires it",
        );
    } else {
        checks.pass(
            "gpu.ready_state",
            if input.gpu_ready_pending {
                format!(
                    "ready state {} (not yet required: the server sets it after this appraisal)",
                    verified.ready_state
                )
            } else {
                format!("ready state {}", verified.ready_state)
            },
        );
    }
    match (
        &verified.reference_values,
        gpu_policy.require_reference_values,
    ) {
        (Some(rv), _) => checks.pass(
            "gpu.reference_values",
            format!(
                "measurements match the signed RIMs {} and {}",
                rv.driver_rim, rv.vbios_rim
            ),
        ),
        (None, true) => checks.fail(
            "gpu.reference_values",
            "the policy requires RIM reference values; the collateral bundle has none",
        ),
        (None, false) => checks.pass(
            "gpu.reference_values",
            "no RIMs in the collateral; the policy does not require reference values",
        ),
    }
    let simulated = verified.simulated;
    claims.gpu = Some(verified);
    simulated
}

/// OCSP of the device chain (from its second certificate: the first is the attestation key
/// certificate the GPU firmware issues at boot, which NVIDIA's responder does not know) and of
/// each bundled RIM's signing chain. A response present is always checked; a certificate
/// without one fails only when the policy sets `require_ocsp`.
fn check_ocsp(
    input: &AppraisalInput<'_>,
    evidence: &GpuEvidence,
    rims: &[Rim],
    checks: &mut CheckList,
) {
    let policy = &input.policy.policy;
    let required = policy.gpu.require_ocsp;
    let blobs = input
        .collateral
        .iter()
        .flat_map(|c| c.nvidia.ocsp.iter())
        .map(|b| (b.name.as_str(), b.data.0.as_slice()));
    let responses = match OcspResponses::parse(blobs) {
        Ok(r) => r,
        Err(e) => return checks.fail("gpu.ocsp", e.to_string()),
    };
    if responses.is_empty() && !required {
        return checks.pass(
            "gpu.ocsp",
            "no OCSP responses in the collateral; the policy does not require them",
        );
    }
    let mut chains = vec![(
        "GPU device chain".to_owned(),
        evidence.cert_chain.clone(),
        1,
    )];
    for rim in rims {
        match ParsedRim::parse(&rim.xml, rim.kind) {
            Ok(parsed) => chains.push((
                format!("{} RIM signing chain", rim.kind.name()),
                parsed.signer_chain,
                0,
            )),
            Err(e) => return checks.fail("gpu.ocsp", e.to_string()),
        }
    }
    let grace = time::Duration::seconds(
        i64::try_from(policy.time.collateral_grace_seconds).unwrap_or(i64::MAX),
    );
    let (mut good, mut uncovered) = (0usize, 0usize);
    for (name, chain, first) in &chains {
        let outcomes = match ocsp::check_chain(&responses, chain, *first, input.now, grace, name) {
            Ok(o) => o,
            Err(e) => return checks.fail("gpu.ocsp", e.to_string()),
        };
        for outcome in outcomes {
            match outcome.status {
                Ok(_) => good += 1,
                Err(OcspError::Missing { .. }) if !required => uncovered += 1,
                Err(e) => return checks.fail("gpu.ocsp", e.to_string()),
            }
        }
    }
    checks.pass(
        "gpu.ocsp",
        if uncovered == 0 {
            format!("{good} certificate(s) of the GPU and RIM chains have good, fresh OCSP responses")
        } else {
            format!(
                "{good} certificate(s) good by OCSP; {uncovered} without a response (the policy does not require OCSP)"
            )
        },
    );
}
