//! Judging one connection: the certificate's start-up evidence, the fresh channel-bound evidence
//! and the client policy, each check by name (`docs/client.md` lists them).

use std::fmt;

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::pki;
use inferno_attestation::report::{AppraisalReport, Check, CheckList, Verdict};
use inferno_attestation::runtime_data::{RuntimeData, challenge_binding};
use serde::Serialize;
use time::OffsetDateTime;

use crate::certificate::read_certificate;
use crate::policy::LoadedClientPolicy;

/// What a client observed on one TLS connection: the inputs of [`appraise_connection`].
#[derive(Debug, Clone)]
pub struct Observation {
    /// The DER leaf certificate the server presented on this connection.
    pub certificate: Vec<u8>,
    /// This connection's TLS exporter value (label `TLS_EXPORTER_LABEL`, no context, 32 bytes).
    pub exporter: Vec<u8>,
    /// The nonce the client sent in `POST /v1/attestation`.
    pub nonce: Vec<u8>,
    /// The evidence envelope the server answered with.
    pub fresh_evidence: Evidence,
}

/// The outcome of judging one connection.
#[derive(Debug, Clone, Serialize)]
pub struct TrustReport {
    /// `pass` when every check passed.
    pub verdict: Verdict,
    /// Whether any evidence chains to the simulated TEE (test keys, no hardware protection).
    pub simulated: bool,
    /// The client policy's name.
    pub policy_name: String,
    /// SHA-256 of the client policy file.
    pub policy_sha256: String,
    /// The time the evidence was judged at.
    pub now: String,
    /// Every check, in order, with what it compared.
    pub checks: Vec<Check>,
    /// The verified launch measurement (SEV-SNP MEASUREMENT or TDX MRTD), hex.
    pub measurement: Option<String>,
    /// The verified model digest, hex.
    pub model_digest: Option<String>,
    /// The verified server-policy digest, hex.
    pub server_policy_sha256: Option<String>,
    /// The appraisal of the certificate's start-up evidence.
    pub certificate_appraisal: Option<AppraisalReport>,
    /// The appraisal of the fresh evidence.
    pub fresh_appraisal: AppraisalReport,
}

impl TrustReport {
    /// Whether every check passed.
    pub fn trusted(&self) -> bool {
        self.verdict == Verdict::Pass
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// The failed checks on one line: `id: reason; id: reason`.
    pub fn failure_summary(&self) -> String {
        self.failures()
            .map(|c| format!("{}: {}", c.id, c.reason))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Judges one connection's observation against a client policy at `now`. Never fails: every
/// problem is a failed check.
pub fn appraise_connection(
    observed: &Observation,
    policy: &LoadedClientPolicy,
    collateral: Option<&CollateralBundle>,
    now: OffsetDateTime,
) -> TrustReport {
    let mut checks = CheckList::default();
    let judge = |evidence: &Evidence| {
        appraise(&AppraisalInput {
            evidence,
            policy: &policy.appraisal,
            collateral,
            now,
            clock_floor: None,
            gpu_ready_pending: false,
        })
    };

    let certificate = read_certificate(&observed.certificate);
    let certificate_appraisal = match &certificate {
        Err(reason) => {
            checks.fail("tls.certificate_evidence", reason.clone());
            None
        }
        Ok(cert) => match &cert.evidence {
            Err(reason) => {
                checks.fail("tls.certificate_evidence", reason.clone());
                None
            }
            Ok(evidence) => {
                checks.pass(
                    "tls.certificate_evidence",
                    "the certificate carries an evidence envelope in its extension",
                );
                Some(judge(evidence))
            }
        },
    };
    let fresh_appraisal = judge(&observed.fresh_evidence);
    checks.record(
        "evidence.appraisal",
        appraisal_outcome(certificate_appraisal.as_ref(), &fresh_appraisal),
    );

    let startup = certificate_appraisal
        .as_ref()
        .and_then(|r| r.claims.runtime_data.as_ref());
    let fresh = fresh_appraisal.claims.runtime_data.as_ref();

    checks.record(
        "tls.spki",
        match (&certificate, startup) {
            (Ok(cert), Some(doc)) => match &doc.tls_spki_sha256 {
                Some(bound) if *bound == cert.spki_sha256 => Ok(format!(
                    "the start-up evidence binds SPKI SHA-256 {bound}, the key of this connection's certificate"
                )),
                Some(bound) => Err(format!(
                    "the start-up evidence binds SPKI SHA-256 {bound}, but this connection's certificate has {}",
                    cert.spki_sha256
                )),
                None => Err("the start-up evidence binds no TLS key".to_owned()),
            },
            _ => Err("no verified start-up runtime data to compare the certificate's key with".to_owned()),
        },
    );
    checks.record("fresh.challenge", challenge_outcome(observed, fresh));
    checks.record("fresh.same_instance", same_instance(startup, fresh));

    conclude(
        checks,
        policy,
        RuntimeDataSource::Certificate,
        certificate_appraisal,
        fresh_appraisal,
        now,
    )
}

/// Which appraised evidence's runtime data names the server's policy and model: the
/// certificate's start-up evidence on a TLS connection, the fresh evidence through an Oblivious
/// HTTP gateway (no certificate reaches the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuntimeDataSource {
    /// The certificate's start-up evidence.
    Certificate,
    /// The fresh evidence.
    Fresh,
}

/// Records the client policy's checks of the server (server policy digest, model digest,
/// measurement, minimum TCB, GPU) after the channel checks already in `checks`, and builds the
/// report with its verdict.
pub(crate) fn conclude(
    mut checks: CheckList,
    policy: &LoadedClientPolicy,
    source: RuntimeDataSource,
    certificate_appraisal: Option<AppraisalReport>,
    fresh_appraisal: AppraisalReport,
    now: OffsetDateTime,
) -> TrustReport {
    let runtime = match source {
        RuntimeDataSource::Certificate => certificate_appraisal
            .as_ref()
            .and_then(|r| r.claims.runtime_data.as_ref()),
        RuntimeDataSource::Fresh => fresh_appraisal.claims.runtime_data.as_ref(),
    };
    let server_policy = runtime.map(|d| d.policy_sha256.clone());
    let model = runtime.and_then(|d| d.model_digest.clone());
    checks.record(
        "policy.server_policy_digest",
        allow_list(
            "server policy SHA-256",
            server_policy.as_deref(),
            policy.policy.server_policy_sha256.as_deref(),
        ),
    );
    checks.record(
        "policy.model_digest",
        allow_list(
            "model digest",
            model.as_deref(),
            policy.policy.model_digests.as_deref(),
        ),
    );
    let measurement = measurement_of(&fresh_appraisal);
    checks.record(
        "policy.measurement",
        measurement_outcome(
            certificate_appraisal.as_ref().and_then(measurement_of),
            measurement.clone(),
            policy,
        ),
    );
    checks.record("policy.min_tcb", min_tcb_outcome(&fresh_appraisal, policy));
    checks.record("policy.gpu", gpu_outcome(&fresh_appraisal, policy));

    let simulated = fresh_appraisal.simulated
        || certificate_appraisal
            .as_ref()
            .is_some_and(|report| report.simulated);
    let verdict = if checks.all_passed() {
        Verdict::Pass
    } else {
        Verdict::Reject
    };
    TrustReport {
        verdict,
        simulated,
        policy_name: policy.policy.name.clone(),
        policy_sha256: hex::encode(policy.digest),
        now: pki::rfc3339(now),
        checks: checks.into_checks(),
        measurement,
        model_digest: model,
        server_policy_sha256: server_policy,
        certificate_appraisal,
        fresh_appraisal,
    }
}

pub(crate) fn appraisal_outcome(
    certificate: Option<&AppraisalReport>,
    fresh: &AppraisalReport,
) -> Result<String, String> {
    let describe = |what: &str, report: &AppraisalReport| {
        if report.passed() {
            Ok(format!(
                "{what}: all {} checks pass{}",
                report.checks.len(),
                if report.simulated {
                    " (SIMULATED TEE: test keys, no hardware protection)"
                } else {
                    ""
                }
            ))
        } else {
            Err(format!(
                "{what}: {}",
                report
                    .failures()
                    .map(|c| format!("{} ({})", c.id, c.reason))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    let certificate = match certificate {
        Some(report) => describe("certificate evidence", report),
        None => Err("certificate evidence: none to appraise".to_owned()),
    };
    let fresh = describe("fresh evidence", fresh);
    match (certificate, fresh) {
        (Ok(a), Ok(b)) => Ok(format!("{a}; {b}")),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
    }
}

fn challenge_outcome(
    observed: &Observation,
    fresh: Option<&RuntimeData>,
) -> Result<String, String> {
    let doc = fresh.ok_or("no verified runtime data in the fresh evidence")?;
    let binding = hex::encode(challenge_binding(&observed.nonce, &observed.exporter));
    let count = doc.challenge_bindings.len();
    if doc.binds_challenge(&observed.nonce, &observed.exporter) {
        Ok(format!(
            "SHA-256(nonce {} || this connection's exporter) = {binding} is among the fresh evidence's {count} challenge binding(s)",
            hex::encode(&observed.nonce)
        ))
    } else {
        Err(format!(
            "SHA-256(nonce {} || this connection's exporter) = {binding} is not among the fresh evidence's {count} challenge binding(s): the evidence was produced for another connection or another nonce",
            hex::encode(&observed.nonce)
        ))
    }
}

fn same_instance(
    startup: Option<&RuntimeData>,
    fresh: Option<&RuntimeData>,
) -> Result<String, String> {
    let (Some(startup), Some(fresh)) = (startup, fresh) else {
        return Err(
            "needs verified runtime data in both the certificate's and the fresh evidence"
                .to_owned(),
        );
    };
    let fields: [(&str, Option<&str>, Option<&str>); 4] = [
        (
            "tls_spki_sha256",
            startup.tls_spki_sha256.as_deref(),
            fresh.tls_spki_sha256.as_deref(),
        ),
        (
            "audit_key",
            startup.audit_key.as_deref(),
            fresh.audit_key.as_deref(),
        ),
        (
            "model_digest",
            startup.model_digest.as_deref(),
            fresh.model_digest.as_deref(),
        ),
        (
            "policy_sha256",
            Some(startup.policy_sha256.as_str()),
            Some(fresh.policy_sha256.as_str()),
        ),
    ];
    let differing: Vec<String> = fields
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(name, a, b)| {
            format!(
                "{name} {} in the certificate's evidence, {} in the fresh evidence",
                a.unwrap_or("(absent)"),
                b.unwrap_or("(absent)")
            )
        })
        .collect();
    if differing.is_empty() {
        Ok("the fresh evidence binds the same TLS key, audit key, model and server policy as the certificate's".to_owned())
    } else {
        Err(differing.join("; "))
    }
}

pub(crate) fn allow_list(
    what: &str,
    value: Option<&str>,
    list: Option<&[String]>,
) -> Result<String, String> {
    let value = value.ok_or_else(|| format!("the verified start-up evidence names no {what}"))?;
    match list {
        None => Ok(format!(
            "{what} {value} (the client policy sets no allow-list: any is accepted)"
        )),
        Some(list) if list.iter().any(|v| v.eq_ignore_ascii_case(value)) => Ok(format!(
            "{what} {value} is in the client policy's allow-list"
        )),
        Some(list) => Err(format!(
            "{what} {value} is not in the client policy's allow-list ({})",
            list.join(", ")
        )),
    }
}

/// The launch measurement a verified appraisal reports: SEV-SNP MEASUREMENT or TDX MRTD.
pub(crate) fn measurement_of(report: &AppraisalReport) -> Option<String> {
    if let Some(snp) = &report.claims.sev_snp {
        return Some(snp.measurement.to_ascii_lowercase());
    }
    report
        .claims
        .tdx
        .as_ref()
        .map(|tdx| tdx.mrtd.to_ascii_lowercase())
}

pub(crate) fn measurement_outcome(
    certificate: Option<String>,
    fresh: Option<String>,
    policy: &LoadedClientPolicy,
) -> Result<String, String> {
    let fresh = fresh.ok_or("the fresh evidence reports no launch measurement")?;
    if let Some(certificate) = certificate
        && certificate != fresh
    {
        return Err(format!(
            "the certificate's evidence has measurement {certificate}, the fresh evidence {fresh}"
        ));
    }
    allow_list(
        "launch measurement",
        Some(&fresh),
        policy.policy.measurements.as_deref(),
    )
}

pub(crate) fn min_tcb_outcome(
    report: &AppraisalReport,
    policy: &LoadedClientPolicy,
) -> Result<String, String> {
    if let Some(tdx) = &report.claims.tdx {
        return Ok(format!(
            "TDX: the TCB is judged by its status {} (tdx checks in evidence.appraisal)",
            tdx.tcb_status
        ));
    }
    let snp = report
        .claims
        .sev_snp
        .as_ref()
        .ok_or("the fresh evidence reports no TCB")?;
    let t = &snp.reported_tcb;
    let Some(min) = policy.policy.min_tcb.get(&snp.product) else {
        return Ok(format!(
            "{} reported TCB bootloader {}, tee {}, snp {}, microcode {} (the client policy sets no minimum for {})",
            snp.product, t.bootloader, t.tee, t.snp, t.microcode, snp.product
        ));
    };
    let mut low = Vec::new();
    for (name, have, need) in [
        ("bootloader", t.bootloader, min.bootloader),
        ("tee", t.tee, min.tee),
        ("snp", t.snp, min.snp),
        ("microcode", t.microcode, min.microcode),
    ] {
        if have < need {
            low.push(format!("{name} {have} < {need}"));
        }
    }
    if let Some(fmc) = t.fmc
        && fmc < min.fmc
    {
        low.push(format!("fmc {fmc} < {}", min.fmc));
    }
    if low.is_empty() {
        Ok(format!(
            "{} reported TCB bootloader {}, tee {}, snp {}, microcode {} meets the client policy's minimum",
            snp.product, t.bootloader, t.tee, t.snp, t.microcode
        ))
    } else {
        Err(format!(
            "{} reported TCB is below the client policy's minimum: {}",
            snp.product,
            low.join(", ")
        ))
    }
}

pub(crate) fn gpu_outcome(
    report: &AppraisalReport,
    policy: &LoadedClientPolicy,
) -> Result<String, String> {
    let required = policy.policy.gpu.required;
    match (&report.claims.gpu, required) {
        (Some(gpu), _) => Ok(format!(
            "GPU evidence verified for this challenge: driver {}, VBIOS {}, CC mode {:?}, ready {}{}",
            gpu.driver_version,
            gpu.vbios_version,
            gpu.cc_mode,
            gpu.ready_state,
            if gpu.simulated { " (simulated)" } else { "" }
        )),
        (None, true) => Err(
            "the client policy requires a GPU; the fresh evidence carries no verified GPU"
                .to_owned(),
        ),
        (None, false) => Ok("no GPU evidence; the client policy does not require a GPU".to_owned()),
    }
}

impl fmt::Display for TrustReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Pass => "TRUSTED",
            Verdict::Reject => "REJECTED",
        };
        if self.simulated {
            writeln!(
                f,
                "verdict: {verdict} (SIMULATED TEE: test keys, no hardware protection)"
            )?;
        } else {
            writeln!(f, "verdict: {verdict}")?;
        }
        writeln!(
            f,
            "client policy: {} (sha256 {})",
            self.policy_name, self.policy_sha256
        )?;
        writeln!(f, "now: {}", self.now)?;
        writeln!(f, "checks:")?;
        for check in &self.checks {
            let mark = if check.passed { "pass" } else { "FAIL" };
            writeln!(f, "  [{mark}] {}: {}", check.id, check.reason)?;
        }
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unverified)".to_owned());
        writeln!(f, "measurement: {}", show(&self.measurement))?;
        writeln!(f, "model digest: {}", show(&self.model_digest))?;
        writeln!(
            f,
            "server policy sha256: {}",
            show(&self.server_policy_sha256)
        )?;
        writeln!(f, "fresh evidence appraisal:")?;
        for line in self.fresh_appraisal.to_string().lines() {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}
