//! SEV-SNP appraisal: verification, then the policy's rules on the verified report.

use super::{AppraisalInput, PlatformOutcome, allow_list};
use crate::abi::snp::{SigningKey, SnpReport};
use crate::policy::SnpPolicy;
use crate::report::{CheckList, Claims, SnpClaims};
use crate::verify::snp::{SnpVerifyInput, verify};

pub(super) fn appraise(
    input: &AppraisalInput<'_>,
    checks: &mut CheckList,
    claims: &mut Claims,
) -> Option<PlatformOutcome> {
    let policy = &input.policy.policy;
    let Some(section) = &input.evidence.sev_snp else {
        checks.fail("snp.report_format", "evidence has no sev_snp section");
        return None;
    };
    let Some(snp_policy) = &policy.sev_snp else {
        checks.fail("snp.policy", "the policy has no [sev_snp] table");
        return None;
    };
    let report = match SnpReport::parse(&section.report.0) {
        Ok(r) => r,
        Err(e) => {
            checks.fail("snp.report_format", e.to_string());
            return None;
        }
    };
    checks.pass(
        "snp.report_format",
        format!(
            "{}-byte report, version {}",
            report.as_bytes().len(),
            report.version()
        ),
    );
    let paravisor_ak = match &section.hcl_report {
        None => None,
        Some(hcl) => match crate::tpm::azure_hcl::parse_and_bind(&hcl.0) {
            Ok(bound) if bound.snp_report.as_slice() != report.as_bytes().as_slice() => {
                checks.fail(
                    "snp.hcl_binding",
                    "the HCL report embeds another SNP report than `report`",
                );
                return None;
            }
            Ok(bound) => match bound.ak.spki_sha256() {
                Ok(ak) => {
                    checks.pass(
                        "snp.hcl_binding",
                        "REPORT_DATA holds the hash of the HCL variable data, which names the vTPM AK (HCLAkPub)",
                    );
                    Some(ak)
                }
                Err(e) => {
                    checks.fail("snp.hcl_binding", format!("HCLAkPub: {e}"));
                    return None;
                }
            },
            Err(e) => {
                checks.fail("snp.hcl_binding", e.to_string());
                return None;
            }
        },
    };

    let verify_input = SnpVerifyInput {
        certs: &section.certs,
        collateral: input.collateral.map(|c| &c.amd),
        trusted_simulated_arks: &policy.simulated.trusted_ark_sha256,
        now: input.now,
        grace: time::Duration::seconds(
            i64::try_from(policy.time.collateral_grace_seconds).unwrap_or(i64::MAX),
        ),
    };
    let verified = match verify(&report, &verify_input) {
        Ok(v) => v,
        Err(e) => {
            checks.fail(e.check_id(), e.to_string());
            return None;
        }
    };
    for (id, reason) in &verified.passed {
        checks.pass(id, reason.clone());
    }

    let product = verified.product.name();
    if snp_policy.products.iter().any(|p| p == product) {
        checks.pass(
            "snp.product_allowed",
            format!("{product} is accepted by the policy"),
        );
    } else {
        checks.fail(
            "snp.product_allowed",
            format!("{product} is not among the policy's products"),
        );
    }
    if snp_policy.require_crl && !verified.crl_checked {
        checks.fail(
            "snp.crl",
            "the policy requires the ARK's CRL; the collateral has none for this root",
        );
    } else if !verified.crl_checked {
        checks.pass(
            "snp.crl",
            "no CRL for this root in the collateral; the policy does not require one",
        );
    }
    let version = report.version();
    if version >= snp_policy.min_report_version {
        checks.pass(
            "snp.report_version",
            format!(
                "report version {version} ≥ {}",
                snp_policy.min_report_version
            ),
        );
    } else {
        checks.fail(
            "snp.report_version",
            format!(
                "report version {version} < {}",
                snp_policy.min_report_version
            ),
        );
    }
    let vmpl = report.vmpl();
    if snp_policy.vmpls.contains(&vmpl) {
        checks.pass("snp.vmpl", format!("VMPL {vmpl} is accepted"));
    } else {
        checks.fail(
            "snp.vmpl",
            format!("VMPL {vmpl} is not among {:?}", snp_policy.vmpls),
        );
    }
    let gp = report.guest_policy();
    bit_rule(
        checks,
        "snp.debug",
        "debugging",
        report.debug_allowed(),
        snp_policy.allow_debug,
        gp,
    );
    bit_rule(
        checks,
        "snp.smt",
        "SMT",
        report.smt_allowed(),
        snp_policy.allow_smt,
        gp,
    );
    bit_rule(
        checks,
        "snp.migration_agent",
        "a migration agent",
        report.migration_agent_allowed(),
        snp_policy.allow_migration_agent,
        gp,
    );

    let tcb = verified.reported_tcb;
    match snp_policy.min_tcb.get(product) {
        None => checks.pass(
            "snp.min_tcb",
            format!("the policy sets no minimum TCB for {product}"),
        ),
        Some(min) => {
            let mut low = Vec::new();
            let mut cmp = |name: &str, have: u8, need: u8| {
                if have < need {
                    low.push(format!("{name} {have} < {need}"));
                }
            };
            cmp("bootloader", tcb.bootloader, min.bootloader);
            cmp("tee", tcb.tee, min.tee);
            cmp("snp", tcb.snp, min.snp);
            cmp("microcode", tcb.microcode, min.microcode);
            if let Some(fmc) = tcb.fmc {
                cmp("fmc", fmc, min.fmc);
            }
            if low.is_empty() {
                checks.pass(
                    "snp.min_tcb",
                    format!("REPORTED_TCB meets the {product} minimum"),
                );
            } else {
                checks.fail(
                    "snp.min_tcb",
                    format!(
                        "REPORTED_TCB below the {product} minimum: {}",
                        low.join(", ")
                    ),
                );
            }
        }
    }
    allow_list(
        checks,
        input.policy,
        ("snp.measurement", "sev_snp.measurements"),
        "measurement",
        &report.measurement(),
        snp_policy.measurements.as_ref(),
    );
    allow_list(
        checks,
        input.policy,
        ("snp.host_data", "sev_snp.host_data"),
        "HOST_DATA",
        &report.host_data(),
        snp_policy.host_data.as_ref(),
    );

    claims.sev_snp = Some(SnpClaims {
        product: product.to_owned(),
        signing_key: match verified.signing_key {
            SigningKey::Vlek => "vlek".to_owned(),
            _ => "vcek".to_owned(),
        },
        report_version: version,
        vmpl,
        guest_policy: format!("{gp:#x}"),
        debug: report.debug_allowed(),
        smt: report.smt_allowed(),
        migration_agent: report.migration_agent_allowed(),
        guest_svn: report.guest_svn(),
        reported_tcb: tcb,
        measurement: hex::encode(report.measurement()),
        host_data: hex::encode(report.host_data()),
        report_data: hex::encode(report.report_data()),
        chip_id: hex::encode(report.chip_id()),
    });
    let kernel_pinned = kernel_pinned(snp_policy, &report, paravisor_ak.is_some());
    Some(PlatformOutcome {
        kernel_pinned,
        simulated: verified.simulated,
        // Under a paravisor, REPORT_DATA is the paravisor's, not the runtime data's.
        report_data: paravisor_ak.is_none().then(|| report.report_data()),
        paravisor_ak,
        signed_timestamps: verified.signed_timestamps,
    })
}

fn bit_rule(checks: &mut CheckList, id: &str, what: &str, set: bool, allowed: bool, gp: u64) {
    if set && !allowed {
        checks.fail(
            id,
            format!("guest policy {gp:#x} allows {what}; the policy forbids it"),
        );
    } else {
        checks.pass(
            id,
            format!(
                "guest policy {gp:#x} {} {what}",
                if set { "allows" } else { "forbids" }
            ),
        );
    }
}

/// Whether the launch measurement pins the kernel, initrd and command line: the policy's
/// measurements are of measured direct boot (`measured_direct_boot`) and this report's is listed.
/// Under a paravisor the measurement is the paravisor's, which pins no guest kernel.
fn kernel_pinned(policy: &SnpPolicy, report: &SnpReport, paravisor: bool) -> Option<String> {
    let measurement = hex::encode(report.measurement());
    let listed = policy
        .measurements
        .as_ref()?
        .iter()
        .any(|m| m.eq_ignore_ascii_case(&measurement));
    (policy.measured_direct_boot && listed && !paravisor).then(|| {
        format!(
            "the SEV-SNP launch measurement {measurement} is a listed one of measured direct boot, which pins the kernel, initrd and command line"
        )
    })
}
