//! Appraisal: is verified evidence acceptable under a policy? Produces an [`AppraisalReport`]
//! with every check, the claims and the policy digest.

mod gpu;
mod snp;
mod tdx;
mod tpm;

use time::OffsetDateTime;

use crate::bundle::CollateralBundle;
use crate::evidence::{Base64Bytes, Evidence, StandaloneEvidence};
use crate::nvidia::GpuEvidence;
use crate::pki::{self, ClockFloor};
use crate::policy::{LoadedPolicy, Platform, ReferenceValuesUse};
use crate::report::{AppraisalReport, CheckList, Claims, Verdict};
use crate::runtime_data::RuntimeData;
use crate::tpm::TpmEvidence;

/// Everything an appraisal needs.
#[derive(Debug, Clone, Copy)]
pub struct AppraisalInput<'a> {
    /// The evidence.
    pub evidence: &'a Evidence,
    /// The policy and its digest.
    pub policy: &'a LoadedPolicy,
    /// Offline vendor collateral.
    pub collateral: Option<&'a CollateralBundle>,
    /// The time to judge at (from the caller; never read from the system clock here).
    pub now: OffsetDateTime,
    /// The newest signed timestamp remembered from earlier (e.g. the last audit checkpoint).
    pub clock_floor: Option<&'a ClockFloor>,
    /// The server's self-appraisal before it sets the GPU ready state: the policy's
    /// `require_ready_state` is not applied yet. Verifiers of a running server pass `false`.
    pub gpu_ready_pending: bool,
}

/// Standalone TPM or GPU evidence, with what judging it needs.
#[derive(Debug, Clone, Copy)]
pub struct StandaloneInput<'a> {
    /// The evidence.
    pub evidence: &'a StandaloneEvidence,
    /// The policy (its `[tpm]`, `[gpu]`, `[simulated]` and `[time]` tables apply) and digest.
    pub policy: &'a LoadedPolicy,
    /// Offline vendor collateral (RIMs and OCSP responses for GPUs).
    pub collateral: Option<&'a CollateralBundle>,
    /// The time to judge at.
    pub now: OffsetDateTime,
    /// Roots (DER) an AK certificate chain must end at, e.g. a cloud provider's EK/AK CA.
    pub tpm_roots: &'a [Vec<u8>],
}

/// What the vTPM and GPU appraisals read, from platform or standalone evidence.
struct Sections<'a> {
    policy: &'a LoadedPolicy,
    collateral: Option<&'a CollateralBundle>,
    now: OffsetDateTime,
    gpu_ready_pending: bool,
    runtime_data: Option<&'a Base64Bytes>,
    tpm: Option<&'a TpmEvidence>,
    /// AK certificate, then intermediates (standalone evidence only).
    tpm_ak_certs: &'a [Base64Bytes],
    tpm_roots: &'a [Vec<u8>],
    gpus: Vec<&'a GpuEvidence>,
    expected_nonce: Option<&'a [u8]>,
    /// How the CPU evidence pins the kernel (see [`PlatformOutcome::kernel_pinned`]).
    kernel_pinned: Option<&'a str>,
    /// The caller waived freshness: qualifying data and SPDM nonces that nothing binds are
    /// reported, not failed (the `freshness` check judges the waiver).
    no_freshness: bool,
}

/// What a platform appraisal hands back to the common part.
struct PlatformOutcome {
    simulated: bool,
    report_data: Option<[u8; 64]>,
    /// SHA-256 of the vTPM AK's SPKI when a paravisor (Azure HCL) fixes REPORT_DATA and binds
    /// the AK instead; the runtime data is then bound through the vTPM quote.
    paravisor_ak: Option<[u8; 32]>,
    signed_timestamps: Vec<(OffsetDateTime, String)>,
    /// How the CPU evidence pins the kernel, initrd and command line, when it does (SEV-SNP
    /// measured direct boot with a listed launch measurement): a zero PCR 11 is then accepted.
    kernel_pinned: Option<String>,
}

/// What the caller expects beside the policy (a verifier's own challenge).
#[derive(Debug, Clone, Copy, Default)]
pub struct Expectations<'a> {
    /// The nonce the caller chose: the qualifying data of the vTPM quotes and the SPDM nonce of
    /// the GPU reports when the evidence carries no runtime-data document (which otherwise
    /// fixes both); when it does, the document's `challenge_bindings` must hold
    /// [`challenge_binding`](crate::runtime_data::challenge_binding)`(nonce, tls_exporter)`.
    pub nonce: Option<&'a [u8]>,
    /// The TLS exporter value of the connection the evidence was asked for on (see
    /// [`TLS_EXPORTER_LABEL`](crate::runtime_data::TLS_EXPORTER_LABEL)); `None` for a challenge
    /// made outside TLS, whose binding then covers the nonce alone (an empty exporter).
    pub tls_exporter: Option<&'a [u8]>,
    /// The caller waives proof of freshness (`--no-freshness`): evidence with no nonce to check
    /// (vTPM quotes or GPU reports taken without one, start-up evidence re-read from an old
    /// audit log) is appraised, and the `freshness` check says NOT FRESH. It fails unless the
    /// policy allows unfresh evidence for offline audit (`[time] allow_unfresh_evidence`).
    pub no_freshness: bool,
}

/// Appraises evidence against a policy. Never fails: every problem is a failed check.
pub fn appraise(input: &AppraisalInput<'_>) -> AppraisalReport {
    appraise_with(input, &Expectations::default())
}

/// [`appraise`], also checking the caller's [`Expectations`].
pub fn appraise_with(input: &AppraisalInput<'_>, expected: &Expectations<'_>) -> AppraisalReport {
    let policy = &input.policy.policy;
    let mut checks = CheckList::default();
    let mut claims = Claims::default();
    let platform = input.evidence.platform;

    if policy.platforms.contains(&platform) {
        checks.pass(
            "platform.allowed",
            format!("{} is accepted by the policy", platform_name(platform)),
        );
    } else {
        checks.fail(
            "platform.allowed",
            format!(
                "{} is not among the policy's platforms",
                platform_name(platform)
            ),
        );
    }

    reference_values_check(input.policy, &mut checks);
    let outcome = match platform {
        Platform::SevSnp => snp::appraise(input, &mut checks, &mut claims),
        Platform::Tdx => tdx::appraise(input, &mut checks, &mut claims),
    };

    let cpu_simulated = outcome.as_ref().is_some_and(|o| o.simulated);
    let sections = Sections {
        policy: input.policy,
        collateral: input.collateral,
        now: input.now,
        gpu_ready_pending: input.gpu_ready_pending,
        runtime_data: input.evidence.runtime_data.as_ref(),
        tpm: input.evidence.tpm.as_ref(),
        tpm_ak_certs: &[],
        tpm_roots: &[],
        gpus: input.evidence.gpu.iter().collect(),
        expected_nonce: expected.nonce,
        no_freshness: expected.no_freshness,
        kernel_pinned: outcome.as_ref().and_then(|o| o.kernel_pinned.as_deref()),
    };
    let anchor = match &outcome {
        Some(PlatformOutcome {
            paravisor_ak: Some(ak),
            ..
        }) => tpm::AkAnchor::Paravisor(*ak),
        Some(outcome) => {
            appraise_runtime_data(&sections, outcome.report_data, &mut checks, &mut claims);
            tpm::AkAnchor::RuntimeData
        }
        None => tpm::AkAnchor::Unverified,
    };
    // The vTPM is appraised on every path; under a paravisor it also binds the runtime data.
    tpm::appraise(&sections, anchor, &mut checks, &mut claims);
    check_runtime_data_challenge(expected, &claims, &mut checks);
    let gpu_simulated = gpu::appraise(&sections, &mut checks, &mut claims);
    let simulated = cpu_simulated || gpu_simulated;
    if simulated {
        let which = match (cpu_simulated, gpu_simulated) {
            (true, true) => "the CPU TEE and the GPU chain",
            (true, false) => "the CPU TEE chains",
            _ => "the GPU chains",
        };
        checks.pass(
            "simulated",
            format!("{which} to a simulated root that the policy names: simulated, no hardware protection"),
        );
    }

    let mut floor = input.clock_floor.cloned().unwrap_or_default();
    for (t, what) in outcome.iter().flat_map(|o| o.signed_timestamps.iter()) {
        floor.observe(*t, what.clone());
    }
    match floor.check(input.now) {
        Ok(()) => checks.pass(
            "time.clock_floor",
            match floor.newest() {
                Some(t) => format!(
                    "now is not earlier than the newest signed timestamp ({})",
                    pki::rfc3339(t)
                ),
                None => "no signed timestamp seen".to_owned(),
            },
        ),
        Err(e) => checks.fail("time.clock_floor", e.to_string()),
    }
    let not_fresh = freshness_check(input.policy, expected, &mut checks);

    let verdict = if checks.all_passed() {
        Verdict::Pass
    } else {
        Verdict::Reject
    };
    AppraisalReport {
        verdict,
        simulated,
        not_fresh,
        platform: Some(platform),
        policy_name: policy.name.clone(),
        policy_sha256: input.policy.digest_hex(),
        now: pki::rfc3339(input.now),
        checks: checks.into_checks(),
        claims,
    }
}

/// Appraises standalone TPM or GPU evidence (no CPU TEE) against a policy and the caller's
/// expected nonce. Never fails: every problem is a failed check. The vTPM's AK must be
/// vouched for by an AK certificate chaining to `tpm_roots`; GPU reports carry the expected
/// nonce; several GPUs are judged as one protected-PCIe set.
pub fn appraise_standalone(
    input: &StandaloneInput<'_>,
    expected: &Expectations<'_>,
) -> AppraisalReport {
    let mut checks = CheckList::default();
    let mut claims = Claims::default();
    let sections = Sections {
        policy: input.policy,
        collateral: input.collateral,
        now: input.now,
        gpu_ready_pending: false,
        runtime_data: None,
        tpm: input.evidence.tpm.as_ref(),
        tpm_ak_certs: &input.evidence.tpm_ak_certs,
        tpm_roots: input.tpm_roots,
        gpus: input.evidence.gpus().collect(),
        expected_nonce: expected.nonce,
        no_freshness: expected.no_freshness,
        kernel_pinned: None,
    };
    if sections.tpm.is_none() && sections.gpus.is_empty() {
        checks.fail(
            "evidence.sections",
            "standalone evidence carries neither a `tpm` nor a `gpu`/`gpus` section",
        );
    }
    if expected.nonce.is_none() && !expected.no_freshness {
        checks.fail(
            "evidence.nonce",
            "standalone evidence needs the expected nonce (--nonce HEX): nothing else binds it (or --no-freshness for an offline audit)",
        );
    }
    tpm::appraise(
        &sections,
        tpm::AkAnchor::Certificate,
        &mut checks,
        &mut claims,
    );
    let simulated = gpu::appraise(&sections, &mut checks, &mut claims);
    if simulated {
        checks.pass(
            "simulated",
            "the GPU chains to a simulated root that the policy names: simulated, no hardware protection",
        );
    }
    let not_fresh = freshness_check(input.policy, expected, &mut checks);
    let verdict = if checks.all_passed() {
        Verdict::Pass
    } else {
        Verdict::Reject
    };
    AppraisalReport {
        verdict,
        simulated,
        not_fresh,
        platform: None,
        policy_name: input.policy.policy.name.clone(),
        policy_sha256: input.policy.digest_hex(),
        now: pki::rfc3339(input.now),
        checks: checks.into_checks(),
        claims,
    }
}

/// `freshness`, only when the caller waived it: NOT FRESH, a failure unless the policy allows
/// unfresh evidence for offline audit. Returns whether the appraisal is not fresh.
fn freshness_check(
    policy: &LoadedPolicy,
    expected: &Expectations<'_>,
    checks: &mut CheckList,
) -> bool {
    if !expected.no_freshness {
        return false;
    }
    if policy.policy.time.allow_unfresh_evidence {
        checks.pass(
            "freshness",
            "NOT FRESH: freshness waived (--no-freshness), nothing shows when the evidence was produced; the policy allows unfresh evidence for offline audit ([time] allow_unfresh_evidence)",
        );
    } else {
        checks.fail(
            "freshness",
            "NOT FRESH: freshness waived (--no-freshness), nothing shows when the evidence was produced; the policy does not allow unfresh evidence ([time] allow_unfresh_evidence is not set)",
        );
    }
    true
}

fn platform_name(p: Platform) -> &'static str {
    match p {
        Platform::SevSnp => "sev-snp",
        Platform::Tdx => "tdx",
    }
}

/// The evidence's runtime-data document, parsed. Without one, records whether the policy
/// required it; a malformed one fails the binding check.
fn runtime_data_document(input: &Sections<'_>, checks: &mut CheckList) -> Option<RuntimeData> {
    let Some(doc_bytes) = input.runtime_data else {
        if input.policy.policy.runtime_data.required {
            checks.fail(
                "runtime_data.binding",
                "the policy requires a runtime-data document; the evidence carries none",
            );
        } else {
            checks.pass(
                "runtime_data.binding",
                "no runtime-data document; the policy does not require one",
            );
        }
        return None;
    };
    RuntimeData::from_canonical_bytes(&doc_bytes.0)
        .map_err(|e| checks.fail("runtime_data.binding", e.to_string()))
        .ok()
}

fn appraise_runtime_data(
    input: &Sections<'_>,
    report_data: Option<[u8; 64]>,
    checks: &mut CheckList,
    claims: &mut Claims,
) {
    let Some(doc) = runtime_data_document(input, checks) else {
        return;
    };
    match report_data {
        Some(rd) if rd == doc.report_data() => {
            checks.pass(
                "runtime_data.binding",
                "SHA-512 of the canonical runtime-data document equals REPORT_DATA",
            );
            claims.runtime_data = Some(doc);
        }
        Some(rd) => checks.fail(
            "runtime_data.binding",
            format!(
                "SHA-512 of the runtime-data document is {} but REPORT_DATA is {}",
                hex::encode(doc.report_data()),
                hex::encode(rd)
            ),
        ),
        None => checks.fail(
            "runtime_data.binding",
            "no verified REPORT_DATA to bind the document to",
        ),
    }
}

/// With a caller's nonce and a bound runtime-data document, the document's challenge bindings
/// must hold the binding of that nonce (and TLS exporter).
fn check_runtime_data_challenge(
    expected: &Expectations<'_>,
    claims: &Claims,
    checks: &mut CheckList,
) {
    let (Some(nonce), Some(doc)) = (expected.nonce, &claims.runtime_data) else {
        return;
    };
    let exporter = expected.tls_exporter.unwrap_or_default();
    let binding = hex::encode(crate::runtime_data::challenge_binding(nonce, exporter));
    let channel = if expected.tls_exporter.is_some() {
        "and TLS exporter"
    } else {
        "(no TLS exporter)"
    };
    if doc.binds_challenge(nonce, exporter) {
        checks.pass(
            "runtime_data.challenge",
            format!("the runtime data binds the expected nonce {channel}: {binding}"),
        );
    } else {
        checks.fail(
            "runtime_data.challenge",
            format!(
                "the runtime data's challenge bindings ({}) do not hold {binding}, the binding of the expected nonce {channel}",
                if doc.challenge_bindings.is_empty() {
                    "none".to_owned()
                } else {
                    doc.challenge_bindings.join(", ")
                }
            ),
        );
    }
}

/// Checks an allow-list: `None` accepts anything (and says so), `Some` requires membership.
/// An allow-list check of `value` against policy field `field`'s list (absent: any value). The
/// message names the value and where the list comes from (the policy or its reference values).
fn allow_list(
    checks: &mut CheckList,
    policy: &LoadedPolicy,
    (id, field): (&str, &str),
    what: &str,
    value: &[u8],
    list: Option<&Vec<String>>,
) {
    let value_hex = hex::encode(value);
    let source = policy.allow_list_name(field);
    match list {
        None => checks.pass(
            id,
            format!("{what} {value_hex} (the policy sets no allow-list)"),
        ),
        Some(list) if list.iter().any(|v| v.eq_ignore_ascii_case(&value_hex)) => {
            checks.pass(id, format!("{what} {value_hex} is in {source}"))
        }
        Some(list) if list.is_empty() => checks.fail(
            id,
            format!("{what} {value_hex} is not listed: {source} list no value at all"),
        ),
        Some(_) => checks.fail(id, format!("{what} {value_hex} is not in {source}")),
    }
}

/// `policy.reference_values`: which reference values the appraisal applies, when the policy
/// names a file.
fn reference_values_check(policy: &LoadedPolicy, checks: &mut CheckList) {
    match &policy.reference_values {
        ReferenceValuesUse::None => {}
        ReferenceValuesUse::Applied {
            file,
            image,
            sha256,
            fields,
        } => checks.pass(
            "policy.reference_values",
            format!(
                "the reference values of image {image:?} from {file} (SHA-256 {}) apply to {}",
                hex::encode(sha256),
                fields.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
        ReferenceValuesUse::NotApplied { file } => checks.pass(
            "policy.reference_values",
            format!(
                "the reference values in {file} are not applied: this is the appliance's appraisal of its own evidence, which cannot hold the values of its own image; verifiers apply them"
            ),
        ),
    }
}
