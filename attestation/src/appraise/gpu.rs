//! GPU appraisal: the NVIDIA verifier's checks, each reported apart (device chain, SPDM
//! signature, nonce, FWID, allow-lists, RIMs), then the policy's rules on CC mode, ready state
//! and reference values; a protected-PCIe set of GPUs is also judged as a set (`gpu.set`).

use super::Sections;
use crate::bundle::RimComponent;
use crate::nvidia::rim::{ParsedRim, Rim, RimKind};
use crate::nvidia::{CcMode, GpuTrust};
use crate::nvidia::{GpuClaims, GpuError, GpuEvidence};
use crate::ocsp::{self, OcspError, OcspResponses};
use crate::report::{CheckList, Claims};

/// Appraises the GPU section(s): one GPU, or a protected-PCIe set judged as a set. Returns
/// whether a GPU chain ends at a simulated root.
pub(super) fn appraise(input: &Sections<'_>, checks: &mut CheckList, claims: &mut Claims) -> bool {
    let gpu_policy = &input.policy.policy.gpu;
    if input.gpus.is_empty() {
        if gpu_policy.required {
            checks.fail(
                "gpu.required",
                "the policy requires verified GPU evidence; the evidence carries none",
            );
        }
        return false;
    }
    if gpu_policy.required {
        checks.pass("gpu.required", "GPU evidence present");
    }
    // The nonce every report must carry: the runtime data's (bound to verified CPU evidence),
    // or the caller's expected nonce for evidence without a document.
    let expected = match (&claims.runtime_data, input.expected_nonce) {
        (Some(doc), _) => Some((doc.gpu_nonce().to_vec(), "SHA-256 of the runtime data")),
        (None, Some(nonce)) => Some((nonce.to_vec(), "the expected nonce")),
        (None, None) => None,
    };
    let set = input.gpus.len() > 1;
    let mut simulated = false;
    let mut verified_set = Vec::with_capacity(input.gpus.len());
    for (index, evidence) in input.gpus.iter().enumerate() {
        let prefix = if set {
            format!("gpu.{index}")
        } else {
            "gpu".to_owned()
        };
        if let Some(claims) = appraise_one(input, evidence, expected.as_ref(), &prefix, checks) {
            simulated |= claims.simulated;
            verified_set.push(claims);
        }
    }
    if set {
        check_set(input.gpus.len(), &verified_set, checks);
    }
    // The report's claims name the first GPU; a set is described by its checks.
    claims.gpu = verified_set.into_iter().next();
    simulated
}

/// Every check of one GPU, under `prefix` (`gpu`, or `gpu.N` in a set). Returns its claims
/// when all passed.
fn appraise_one(
    input: &Sections<'_>,
    evidence: &GpuEvidence,
    expected: Option<&(Vec<u8>, &str)>,
    prefix: &str,
    checks: &mut CheckList,
) -> Option<GpuClaims> {
    let policy = &input.policy.policy;
    let gpu_policy = &policy.gpu;
    let id = |check: &str| format!("{prefix}.{check}");
    let mut trust = match GpuTrust::nvidia() {
        Ok(t) => t,
        Err(e) => {
            checks.fail(&id("chain"), format!("built-in NVIDIA roots: {e}"));
            return None;
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
    // Without an expected nonce the nonce check fails; the others still report.
    let nonce_bytes = expected.map(|(n, _)| n.as_slice()).unwrap_or_default();
    let result = match crate::nvidia::check(evidence, &trust, nonce_bytes, input.now) {
        Ok(r) => r,
        Err(e) => {
            checks.fail(&id("report_format"), e.to_string());
            return None;
        }
    };
    let mut all = true;
    let mut record =
        |checks: &mut CheckList, check: &str, outcome: &Result<(), GpuError>, ok: String| {
            match outcome {
                Ok(()) => checks.pass(&id(check), ok),
                Err(e) => {
                    all = false;
                    checks.fail(&id(check), e.to_string());
                }
            }
        };
    record(
        checks,
        "chain",
        &result.chain,
        format!(
            "device chain to the {} root at now",
            if result.claims.simulated {
                "simulated (policy-named)"
            } else {
                "NVIDIA"
            }
        ),
    );
    record(
        checks,
        "signature",
        &result.signature,
        "SPDM signature verifies under the device leaf certificate".to_owned(),
    );
    match expected {
        Some((_, what)) => record(
            checks,
            "nonce",
            &result.nonce,
            format!("the SPDM request nonce is {what}"),
        ),
        None if input.no_freshness => checks.pass(
            &id("nonce"),
            format!(
                "the SPDM request nonce {} is not checked: no runtime-data document and freshness waived (--no-freshness)",
                result.claims.nonce
            ),
        ),
        None => record(
            checks,
            "nonce",
            &Err(GpuError::NonceMismatch {
                expected: "(none: no verified runtime-data document or expected nonce)".into(),
                found: result.claims.nonce.clone(),
            }),
            String::new(),
        ),
    }
    record(
        checks,
        "fwid",
        &result.fwid,
        "the report's FWID is the leaf certificate's".to_owned(),
    );
    record(
        checks,
        "versions",
        &result.versions,
        format!(
            "driver {} and VBIOS {} allowed",
            result.claims.driver_version, result.claims.vbios_version
        ),
    );
    check_ocsp(input, evidence, &trust.rims, &id("ocsp"), checks);
    let claims = &result.claims;
    if gpu_policy.require_cc_mode && claims.cc_mode != CcMode::On {
        all = false;
        checks.fail(
            &id("cc_mode"),
            format!(
                "driver reports CC mode {:?}; the policy requires On",
                claims.cc_mode
            ),
        );
    } else {
        checks.pass(
            &id("cc_mode"),
            format!("driver reports CC mode {:?}", claims.cc_mode),
        );
    }
    if gpu_policy.require_ready_state && !input.gpu_ready_pending && !claims.ready_state {
        all = false;
        checks.fail(
            &id("ready_state"),
            "the GPU is not in CC ready state; the policy requires it",
        );
    } else {
        checks.pass(
            &id("ready_state"),
            if input.gpu_ready_pending {
                format!(
                    "ready state {} (not yet required: the server sets it after this appraisal)",
                    claims.ready_state
                )
            } else {
                format!("ready state {}", claims.ready_state)
            },
        );
    }
    match (
        &result.reference_values,
        gpu_policy.require_reference_values,
    ) {
        (Ok(Some(rv)), _) => checks.pass(
            &id("reference_values"),
            format!(
                "measurements match the signed RIMs {} and {}",
                rv.driver_rim, rv.vbios_rim
            ),
        ),
        (Err(e), _) => {
            all = false;
            checks.fail(&id("reference_values"), e.to_string());
        }
        (Ok(None), true) => {
            all = false;
            checks.fail(
                &id("reference_values"),
                "the policy requires RIM reference values; the collateral bundle has none",
            );
        }
        (Ok(None), false) => checks.pass(
            &id("reference_values"),
            "no RIMs in the collateral; the policy does not require reference values",
        ),
    }
    if all { result.into_result().ok() } else { None }
}

/// A protected-PCIe set: every GPU verified, no device twice (by its leaf certificate's key),
/// one driver and VBIOS across the set.
fn check_set(count: usize, verified: &[GpuClaims], checks: &mut CheckList) {
    if verified.len() != count {
        return checks.fail(
            "gpu.set",
            format!(
                "{} of the set's {count} GPUs verified; the set passes only as a whole",
                verified.len()
            ),
        );
    }
    // A device is its leaf certificate's key: the FWID is the firmware's measurement, the same
    // on every GPU that runs the same firmware.
    let mut devices: Vec<&str> = verified
        .iter()
        .map(|c| c.device_identity.as_str())
        .collect();
    devices.sort_unstable();
    devices.dedup();
    if devices.len() != count || devices.contains(&"") {
        return checks.fail(
            "gpu.set",
            "the set holds the same GPU (device certificate key) more than once",
        );
    }
    let first = &verified[0];
    if let Some(odd) = verified.iter().find(|c| {
        c.driver_version != first.driver_version || c.vbios_version != first.vbios_version
    }) {
        return checks.fail(
            "gpu.set",
            format!(
                "the set mixes driver {} / VBIOS {} with driver {} / VBIOS {}",
                first.driver_version, first.vbios_version, odd.driver_version, odd.vbios_version
            ),
        );
    }
    checks.pass(
        "gpu.set",
        format!(
            "{count} distinct GPUs verified as one set (driver {}, VBIOS {})",
            first.driver_version, first.vbios_version
        ),
    );
}

/// OCSP of the device chain (from its second certificate: the first is the attestation key
/// certificate the GPU firmware issues at boot, which NVIDIA's responder does not know) and of
/// each bundled RIM's signing chain. A response present is always checked; a certificate
/// without one fails only when the policy sets `require_ocsp`.
fn check_ocsp(
    input: &Sections<'_>,
    evidence: &GpuEvidence,
    rims: &[Rim],
    id: &str,
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
        Err(e) => return checks.fail(id, e.to_string()),
    };
    if responses.is_empty() && !required {
        return checks.pass(
            id,
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
            Err(e) => return checks.fail(id, e.to_string()),
        }
    }
    let grace = time::Duration::seconds(
        i64::try_from(policy.time.collateral_grace_seconds).unwrap_or(i64::MAX),
    );
    let (mut good, mut uncovered) = (0usize, 0usize);
    for (name, chain, first) in &chains {
        let outcomes = match ocsp::check_chain(&responses, chain, *first, input.now, grace, name) {
            Ok(o) => o,
            Err(e) => return checks.fail(id, e.to_string()),
        };
        for outcome in outcomes {
            match outcome.status {
                Ok(_) => good += 1,
                Err(OcspError::Missing { .. }) if !required => uncovered += 1,
                Err(e) => return checks.fail(id, e.to_string()),
            }
        }
    }
    checks.pass(
        id,
        if uncovered == 0 {
            format!("{good} certificate(s) of the GPU and RIM chains have good, fresh OCSP responses")
        } else {
            format!(
                "{good} certificate(s) good by OCSP; {uncovered} without a response (the policy does not require OCSP)"
            )
        },
    );
}
