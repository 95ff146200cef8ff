//! The appraisal report: every check with its outcome and reason, the claims read from the
//! evidence, and the digest of the policy that judged it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::policy::Platform;
use crate::runtime_data::RuntimeData;

/// The overall outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every check passed.
    Pass,
    /// At least one check failed.
    Reject,
}

/// One check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// A stable dotted identifier, e.g. `snp.report_signature`.
    pub id: String,
    /// Whether the check passed.
    pub passed: bool,
    /// Why it passed or failed, in words.
    pub reason: String,
}

/// A TCB version as its components.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcbClaims {
    /// FMC SVN (Turin and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fmc: Option<u8>,
    /// PSP bootloader SVN.
    pub bootloader: u8,
    /// PSP OS SVN.
    pub tee: u8,
    /// SNP firmware SVN.
    pub snp: u8,
    /// Microcode patch level.
    pub microcode: u8,
}

/// Claims read from a SEV-SNP report and its endorsement key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnpClaims {
    /// Processor product of the chain that verified (`Milan`, `Genoa`, `Turin`).
    pub product: String,
    /// `vcek` or `vlek`.
    pub signing_key: String,
    /// Report format version.
    pub report_version: u32,
    /// VMPL of the requesting code.
    pub vmpl: u32,
    /// The guest policy word, hex.
    pub guest_policy: String,
    /// Guest policy: debugging allowed.
    pub debug: bool,
    /// Guest policy: SMT allowed.
    pub smt: bool,
    /// Guest policy: migration agent allowed.
    pub migration_agent: bool,
    /// Guest SVN.
    pub guest_svn: u32,
    /// REPORTED_TCB.
    pub reported_tcb: TcbClaims,
    /// Launch measurement, hex.
    pub measurement: String,
    /// HOST_DATA, hex.
    pub host_data: String,
    /// REPORT_DATA, hex.
    pub report_data: String,
    /// CHIP_ID, hex (zeros when masked).
    pub chip_id: String,
}

/// Claims read from a TDX quote and its verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TdxClaims {
    /// Quote format version (4 or 5).
    pub quote_version: u16,
    /// TCB status from Intel's TCB info (e.g. `UpToDate`).
    pub tcb_status: String,
    /// Intel security advisories that apply.
    pub advisory_ids: Vec<String>,
    /// FMSPC of the platform, hex.
    pub fmspc: String,
    /// TD attributes, hex (8 bytes, little-endian as in the quote).
    pub td_attributes: String,
    /// Whether the TD's DEBUG attribute is set.
    pub debug: bool,
    /// MRTD, hex.
    pub mrtd: String,
    /// RTMR0 to RTMR3, hex.
    pub rtmrs: [String; 4],
    /// MRCONFIGID, hex.
    pub mr_config_id: String,
    /// REPORTDATA, hex.
    pub report_data: String,
}

/// Everything the evidence claims, once verified.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Claims {
    /// The runtime-data document bound into the evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_data: Option<RuntimeData>,
    /// SEV-SNP claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sev_snp: Option<SnpClaims>,
    /// TDX claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tdx: Option<TdxClaims>,
    /// vTPM claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<crate::tpm::TpmClaims>,
    /// GPU claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::nvidia::GpuClaims>,
}

/// The result of appraising evidence against a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppraisalReport {
    /// Pass only when every check passed.
    pub verdict: Verdict,
    /// True when the evidence chains to a simulated (test) root: no real TEE stands behind it.
    pub simulated: bool,
    /// True when the caller waived freshness (`--no-freshness`): nothing shows when the evidence
    /// was produced, and the verdict says NOT FRESH.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_fresh: bool,
    /// The CPU TEE the evidence claims to come from.
    pub platform: Option<Platform>,
    /// The policy's name.
    pub policy_name: String,
    /// SHA-256 of the policy file's exact bytes, hex.
    pub policy_sha256: String,
    /// The time the evidence was judged at, RFC 3339.
    pub now: String,
    /// Every check in the order it ran.
    pub checks: Vec<Check>,
    /// The claims read from the evidence.
    pub claims: Claims,
}

impl AppraisalReport {
    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// Whether the verdict is [`Verdict::Pass`].
    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Pass
    }
}

/// Collects checks while an appraisal runs.
#[derive(Debug, Default)]
pub struct CheckList {
    checks: Vec<Check>,
}

impl CheckList {
    /// Records a passed check.
    pub fn pass(&mut self, id: &str, reason: impl Into<String>) {
        self.push(id, true, reason.into());
    }

    /// Records a failed check.
    pub fn fail(&mut self, id: &str, reason: impl Into<String>) {
        self.push(id, false, reason.into());
    }

    /// Records `Ok` as a pass and `Err` as a failure, with the respective reason.
    pub fn record(&mut self, id: &str, outcome: Result<String, String>) {
        match outcome {
            Ok(reason) => self.pass(id, reason),
            Err(reason) => self.fail(id, reason),
        }
    }

    /// Whether every recorded check passed.
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The recorded checks.
    pub fn into_checks(self) -> Vec<Check> {
        self.checks
    }

    fn push(&mut self, id: &str, passed: bool, reason: String) {
        if passed {
            tracing::debug!(check = id, %reason, "attestation check passed");
        } else {
            tracing::info!(check = id, %reason, "attestation check failed");
        }
        self.checks.push(Check {
            id: id.to_owned(),
            passed,
            reason,
        });
    }
}

impl fmt::Display for AppraisalReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match (self.verdict, self.not_fresh) {
            (Verdict::Pass, false) => "PASS",
            (Verdict::Reject, false) => "REJECT",
            (Verdict::Pass, true) => "PASS, NOT FRESH (accepted for offline audit)",
            (Verdict::Reject, true) => "REJECT, NOT FRESH",
        };
        if self.simulated {
            writeln!(
                f,
                "verdict: {verdict} (simulated TEE: test keys, no hardware protection)"
            )?;
        } else {
            writeln!(f, "verdict: {verdict}")?;
        }
        let platform = match self.platform {
            Some(Platform::SevSnp) => "sev-snp",
            Some(Platform::Tdx) => "tdx",
            None => "none (standalone TPM or GPU evidence)",
        };
        writeln!(
            f,
            "platform: {platform}{}",
            if self.simulated { " (simulated)" } else { "" }
        )?;
        writeln!(
            f,
            "policy: {} (sha256 {})",
            self.policy_name, self.policy_sha256
        )?;
        writeln!(f, "now: {}", self.now)?;
        writeln!(f, "checks:")?;
        for check in &self.checks {
            let mark = if check.passed { "pass" } else { "FAIL" };
            writeln!(f, "  [{mark}] {}: {}", check.id, check.reason)?;
        }
        writeln!(f, "claims:")?;
        if let Some(snp) = &self.claims.sev_snp {
            let t = &snp.reported_tcb;
            writeln!(
                f,
                "  sev-snp product: {} ({})",
                snp.product, snp.signing_key
            )?;
            writeln!(
                f,
                "  report version: {}, vmpl: {}",
                snp.report_version, snp.vmpl
            )?;
            writeln!(
                f,
                "  guest policy: {} (debug {}, smt {}, migration agent {})",
                snp.guest_policy, snp.debug, snp.smt, snp.migration_agent
            )?;
            match t.fmc {
                Some(fmc) => writeln!(
                    f,
                    "  reported tcb: fmc {fmc}, bootloader {}, tee {}, snp {}, microcode {}",
                    t.bootloader, t.tee, t.snp, t.microcode
                )?,
                None => writeln!(
                    f,
                    "  reported tcb: bootloader {}, tee {}, snp {}, microcode {}",
                    t.bootloader, t.tee, t.snp, t.microcode
                )?,
            }
            writeln!(f, "  measurement: {}", snp.measurement)?;
            writeln!(f, "  host data: {}", snp.host_data)?;
            writeln!(f, "  report data: {}", snp.report_data)?;
        }
        if let Some(tdx) = &self.claims.tdx {
            writeln!(f, "  tdx quote version: {}", tdx.quote_version)?;
            writeln!(
                f,
                "  tcb status: {} (advisories: {})",
                tdx.tcb_status,
                if tdx.advisory_ids.is_empty() {
                    "none".to_owned()
                } else {
                    tdx.advisory_ids.join(", ")
                }
            )?;
            writeln!(
                f,
                "  td attributes: {} (debug {})",
                tdx.td_attributes, tdx.debug
            )?;
            writeln!(f, "  mrtd: {}", tdx.mrtd)?;
            for (i, rtmr) in tdx.rtmrs.iter().enumerate() {
                writeln!(f, "  rtmr{i}: {rtmr}")?;
            }
            writeln!(f, "  mrconfigid: {}", tdx.mr_config_id)?;
            writeln!(f, "  report data: {}", tdx.report_data)?;
        }
        if let Some(tpm) = &self.claims.tpm {
            writeln!(f, "  vtpm ak (spki sha256): {}", tpm.ak_spki_sha256)?;
            for (bank, pcrs) in &tpm.pcrs {
                writeln!(
                    f,
                    "  vtpm {bank} pcrs: {}",
                    pcrs.keys().map(u8::to_string).collect::<Vec<_>>().join(",")
                )?;
            }
        }
        if let Some(gpu) = &self.claims.gpu {
            writeln!(
                f,
                "  gpu: driver {}, vbios {}, cc mode {:?}, ready {}{}",
                gpu.driver_version,
                gpu.vbios_version,
                gpu.cc_mode,
                gpu.ready_state,
                if gpu.simulated { " (simulated)" } else { "" }
            )?;
            writeln!(
                f,
                "  gpu reference values: {}",
                if gpu.reference_values.is_some() {
                    "matched RIMs"
                } else {
                    "none supplied"
                }
            )?;
        }
        if let Some(rd) = &self.claims.runtime_data {
            writeln!(
                f,
                "  runtime data: software {}, policy {}",
                rd.software_version, rd.policy_sha256
            )?;
        }
        Ok(())
    }
}
