//! The whole envelope: simulated SEV-SNP plus a simulated GPU and a real software TPM (swtpm),
//! all bound to one runtime-data document, appraised together; and each binding broken.

mod swtpm_support;

use std::path::PathBuf;

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::SimulatedSnp;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::nvidia::CcMode;
use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::AppraisalReport;
use inferno_attestation::runtime_data::RuntimeData;
use time::macros::datetime;

const NOW: time::OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

fn policy_text(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../policy")
            .join(name),
    )
    .unwrap()
}

fn dev() -> LoadedPolicy {
    LoadedPolicy::from_bytes(policy_text("development.toml").as_bytes()).unwrap()
}

fn doc(policy: &LoadedPolicy) -> RuntimeData {
    let mut doc = RuntimeData::new(policy.digest, "inferno/test");
    doc.set_challenge_bindings([[7u8; 32]]).unwrap();
    doc
}

fn gpu(config: SimulatedGpuConfig) -> SimulatedGpu {
    SimulatedGpu::new(TEST_SEED, config).unwrap()
}

fn judge(evidence: &Evidence, policy: &LoadedPolicy, ready_pending: bool) -> AppraisalReport {
    appraise(&AppraisalInput {
        evidence,
        policy,
        collateral: None,
        now: NOW,
        clock_floor: None,
        gpu_ready_pending: ready_pending,
    })
}

fn failed(r: &AppraisalReport) -> Vec<String> {
    r.failures().map(|c| c.id.clone()).collect()
}

fn snp_with_gpu(doc: &RuntimeData, gpu: &SimulatedGpu, nonce: [u8; 32]) -> Evidence {
    let mut evidence = collect_evidence(&SimulatedSnp::new().unwrap(), doc).unwrap();
    evidence.gpu = Some(gpu.evidence(&nonce).unwrap());
    evidence
}

#[test]
fn development_policy_names_the_simulated_gpu_root() {
    let fingerprint = hex::encode(inferno_attestation::pki::sha256(
        gpu(SimulatedGpuConfig::default()).root_der(),
    ));
    assert_eq!(
        dev().policy.simulated.trusted_gpu_root_sha256,
        [fingerprint]
    );
}

#[test]
fn simulated_cpu_and_gpu_pass_together_under_development_policy() {
    let policy = dev();
    let doc = doc(&policy);
    let g = gpu(SimulatedGpuConfig::default());
    let evidence = snp_with_gpu(&doc, &g, doc.gpu_nonce());
    let evidence = Evidence::from_bytes(evidence.to_json().as_bytes()).unwrap();
    let r = judge(&evidence, &policy, false);
    assert!(r.passed(), "{r}");
    assert!(r.simulated);
    let gpu_claims = r.claims.gpu.as_ref().unwrap();
    assert!(gpu_claims.simulated);
    assert_eq!(gpu_claims.nonce, hex::encode(doc.gpu_nonce()));
    assert!(r.to_string().contains("gpu: driver 550.90.07"));
}

#[test]
fn gpu_evidence_for_another_nonce_is_rejected() {
    let policy = dev();
    let doc = doc(&policy);
    let g = gpu(SimulatedGpuConfig::default());
    let evidence = snp_with_gpu(&doc, &g, [9; 32]);
    assert_eq!(failed(&judge(&evidence, &policy, false)), ["gpu.nonce"]);
}

#[test]
fn production_gpu_rules_cc_mode_ready_state_and_reference_values() {
    // The development policy with production's GPU table (and the simulated roots kept).
    let text = policy_text("development.toml").replace(
        "required = false\nrequire_cc_mode = false\nrequire_ready_state = false",
        "required = true\nrequire_cc_mode = true\nrequire_ready_state = true\nrequire_reference_values = true",
    );
    let policy = LoadedPolicy::from_bytes(text.as_bytes()).unwrap();
    assert!(policy.policy.gpu.required);
    let doc = doc(&policy);

    let off = gpu(SimulatedGpuConfig {
        cc_mode: CcMode::Off,
        ..SimulatedGpuConfig::default()
    });
    let r = judge(&snp_with_gpu(&doc, &off, doc.gpu_nonce()), &policy, false);
    assert_eq!(
        failed(&r),
        ["gpu.cc_mode", "gpu.ready_state", "gpu.reference_values"],
        "{r}"
    );

    let ready = gpu(SimulatedGpuConfig {
        ready_state: true,
        ..SimulatedGpuConfig::default()
    });
    let r = judge(&snp_with_gpu(&doc, &ready, doc.gpu_nonce()), &policy, false);
    assert_eq!(failed(&r), ["gpu.reference_values"], "{r}");

    // The server's self-appraisal before it sets the ready state.
    let not_ready = gpu(SimulatedGpuConfig::default());
    let r = judge(
        &snp_with_gpu(&doc, &not_ready, doc.gpu_nonce()),
        &policy,
        true,
    );
    assert_eq!(failed(&r), ["gpu.reference_values"], "{r}");

    // No GPU at all.
    let evidence = collect_evidence(&SimulatedSnp::new().unwrap(), &doc).unwrap();
    assert_eq!(failed(&judge(&evidence, &policy, false)), ["gpu.required"]);
}

#[test]
fn production_policy_does_not_trust_the_simulated_gpu() {
    let policy = LoadedPolicy::from_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/production.toml"),
    )
    .unwrap();
    let doc = doc(&policy);
    let g = gpu(SimulatedGpuConfig::default());
    let r = judge(&snp_with_gpu(&doc, &g, doc.gpu_nonce()), &policy, false);
    assert!(!r.passed());
    assert!(!r.simulated);
    assert!(failed(&r).contains(&"snp.chain".to_owned()), "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tpm_quotes_for_another_nonce_are_rejected() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/attestation-vectors/tpm/go-tpm-tools/gce-cos-85-nonce9009");
    if !dir.is_dir() {
        eprintln!("SKIPPED: {} is absent", dir.display());
        return;
    }
    use inferno_attestation::tpm::{AkPublic, HashAlg, PcrBank, QuoteEvidence, TpmEvidence};
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let text = String::from_utf8(read("quote_sha256.pcrs.txt")).unwrap();
    let tpm = TpmEvidence {
        ak: AkPublic::TpmtPublic(read("ak_pub.tpmt_public.bin")),
        quotes: vec![QuoteEvidence {
            attest: read("quote_sha256.tpms_attest.bin"),
            signature: read("quote_sha256.tpmt_signature.bin"),
            pcrs: PcrBank::from_text(HashAlg::Sha256, &text).unwrap(),
        }],
        event_log: None,
    };
    let policy = dev();
    let mut evidence = collect_evidence(&SimulatedSnp::new().unwrap(), &doc(&policy)).unwrap();
    evidence.tpm = Some(tpm);
    let r = judge(&evidence, &policy, false);
    // The quote itself verifies; its nonce and its AK are not the ones the evidence binds.
    assert_eq!(failed(&r), ["tpm.nonce", "tpm.ak_binding"], "{r}");
}

/// A quote of PCRs 0–7 (SHA-256 bank) by the software TPM at `tcti`, signed by its template
/// RSA-2048 attestation key, over `nonce`.
fn swtpm_quote(tcti: &str, nonce: &[u8]) -> inferno_attestation::tpm::TpmEvidence {
    use inferno_attestation::tpm::{HashAlg, collect};
    let pcrs: Vec<u8> = (0..8).collect();
    collect::collect(&collect::QuoteRequest {
        tcti,
        ak_handle: None,
        ak_kind: collect::AkKind::Rsa2048,
        banks: &[HashAlg::Sha256],
        pcrs: &pcrs,
        nonce,
        event_log: None,
    })
    .unwrap()
}

/// A real software TPM: the template AK's hash goes into the runtime data, the quote's
/// qualifying data is the runtime data's SHA-256, and the appraisal binds both to the SNP report.
#[test]
fn swtpm_quote_binds_through_the_runtime_data() {
    use inferno_attestation::tpm;

    let Some(swtpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let tcti = swtpm_support::tcti(&swtpm);
    let quote = |nonce: &[u8]| swtpm_quote(&tcti, nonce);
    // Learn the (stable) template AK first.
    let probe = quote(b"probe");
    let ak = tpm::verify(&probe, b"probe").unwrap().ak_spki_sha256;

    let policy = LoadedPolicy::from_bytes(
        policy_text("development.toml")
            .replace(
                "[tpm]\n# A vTPM is verified when present, not required.\nrequired = false",
                "[tpm]\nrequired = true",
            )
            .as_bytes(),
    )
    .unwrap();
    assert!(policy.policy.tpm.as_ref().unwrap().required);
    let mut runtime = doc(&policy);
    runtime.tpm_ak_sha256 = Some(ak.clone());
    let mut evidence = collect_evidence(&SimulatedSnp::new().unwrap(), &runtime).unwrap();
    evidence.tpm = Some(quote(&runtime.tpm_qualifying_data()));
    let r = judge(&evidence, &policy, false);
    assert!(r.passed(), "{r}");
    assert_eq!(r.claims.tpm.as_ref().unwrap().ak_spki_sha256, ak);

    // The same quote under a document that does not name the AK.
    let unbound = doc(&policy);
    let mut evidence2 = collect_evidence(&SimulatedSnp::new().unwrap(), &unbound).unwrap();
    evidence2.tpm = Some(quote(&unbound.tpm_qualifying_data()));
    assert_eq!(
        failed(&judge(&evidence2, &policy, false)),
        ["tpm.ak_binding"]
    );

    // A quote replayed from the first evidence into the second.
    evidence2.tpm = evidence.tpm.clone();
    assert_eq!(
        failed(&judge(&evidence2, &policy, false)),
        ["tpm.nonce", "tpm.ak_binding"]
    );
}

/// A real software TPM quote appraised under reference values for PCR 7: the quoted value
/// passes, any other fails `tpm.pcr_values`, naming the PCR and the quoted value.
#[test]
fn swtpm_pcr_not_in_the_reference_values_fails_naming_it() {
    use inferno_attestation::tpm::{self, HashAlg};

    let Some(swtpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let tcti = swtpm_support::tcti(&swtpm);
    let quote = |nonce: &[u8]| swtpm_quote(&tcti, nonce);
    let probe = tpm::verify(&quote(b"probe"), b"probe").unwrap();
    let pcr7 = probe.pcrs[&HashAlg::Sha256][&7].to_ascii_lowercase();

    let judge_with = |accepted: &str| {
        let text = policy_text("development.toml").replacen(
            "platforms = ",
            "reference_values = \"reference-values.toml\"\nplatforms = ",
            1,
        );
        let values =
            format!("schema = 1\nimage = \"inferno\"\n[tpm.sha256]\n7 = [\"{accepted}\"]\n");
        let policy =
            LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap();
        let mut runtime = doc(&policy);
        runtime.tpm_ak_sha256 = Some(probe.ak_spki_sha256.clone());
        let mut evidence = collect_evidence(&SimulatedSnp::new().unwrap(), &runtime).unwrap();
        evidence.tpm = Some(quote(&runtime.tpm_qualifying_data()));
        judge(&evidence, &policy, false)
    };
    let r = judge_with(&pcr7);
    assert!(r.passed(), "{r}");
    let check = r.checks.iter().find(|c| c.id == "tpm.pcr_values").unwrap();
    assert!(
        check
            .reason
            .contains(&format!("PCR 7 = {pcr7} is in the reference values")),
        "{r}"
    );
    let r = judge_with(&"ab".repeat(32));
    assert_eq!(failed(&r), ["tpm.pcr_values"], "{r}");
    let reason = &r.failures().next().unwrap().reason;
    assert!(
        reason.contains(&format!("PCR 7 = {pcr7} is not in the reference values")),
        "{reason}"
    );
}

/// Issue 49: PCR 11 under the production policy, per boot path. The policy is
/// `policy/production.toml` with its real reference values, changed only where simulation needs
/// it: the simulated ARK is trusted, the GPU is not required (a simulated GPU has no NVIDIA
/// RIMs or OCSP responses), and the reference PCR 11 is the one this software TPM shows after
/// a "UKI" extend (no software TPM can replay systemd-stub's real sections). The simulated SNP
/// report carries a listed launch measurement (Milan, 8 vCPUs).
/// - UKI boot: PCR 11 is the reference value: accepted on SEV-SNP.
/// - SEV-SNP measured direct boot: PCR 11 is zero, accepted because the listed launch
///   measurement pins the kernel; with an unlisted measurement both checks fail.
/// - TDX direct boot: PCR 11 is zero and MRTD pins no kernel: `tpm.pcr_values` fails (the TDX
///   quote itself cannot be produced here, so its own checks fail too; the PCR 11 verdict does
///   not depend on them, as the same envelope with the UKI's PCR 11 shows).
#[test]
fn pcr_11_under_the_production_policy_per_boot_path() {
    use inferno_attestation::evidence::TdxEvidence;
    use inferno_attestation::policy::Platform;
    use inferno_attestation::tpm::{self, HashAlg, collect};
    use tss_esapi::handles::PcrHandle;
    use tss_esapi::interface_types::algorithm::HashingAlgorithm;
    use tss_esapi::structures::{Digest, DigestValues};

    let Some(swtpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let tcti = swtpm_support::tcti(&swtpm);
    let production_pcrs: Vec<u8> = vec![0, 1, 2, 3, 4, 5, 6, 7, 11];
    let quote = |nonce: &[u8]| {
        collect::collect(&collect::QuoteRequest {
            tcti: &tcti,
            ak_handle: None,
            ak_kind: collect::AkKind::Rsa2048,
            banks: &[HashAlg::Sha256],
            pcrs: &production_pcrs,
            nonce,
            event_log: None,
        })
        .unwrap()
    };
    // Direct boot first: nothing has extended PCR 11.
    let direct = tpm::verify(&quote(b"probe"), b"probe").unwrap();
    assert_eq!(direct.pcrs[&HashAlg::Sha256][&11], "00".repeat(32));
    let ak = direct.ak_spki_sha256.clone();

    let text = policy_text("production.toml");
    let simulated = format!(
        "[simulated]\ntrusted_ark_sha256 = [\"{}\"]\n\n[runtime_data]",
        inferno_attestation::collect::simulated::ark_fingerprint()
    );
    let text = text.replacen("[runtime_data]", &simulated, 1).replacen(
        "[gpu]\n# An NVIDIA H100/H200 in confidential-computing mode, with ready state set, is required, and its\n# measurements must match NVIDIA's signed RIMs from the collateral bundle.\nrequired = true",
        "[gpu]\nrequired = false",
        1,
    );
    assert!(text.contains("[gpu]\nrequired = false"), "{text}");
    let values = policy_text("reference-values.toml");
    let reference_pcr11 = |pcr11: &str| {
        let values = regex_free_replace(&values, "\n11 = [\"", &format!("\n11 = [\"{pcr11}\"]\n"));
        LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap()
    };

    // The "UKI": systemd-stub would extend PCR 11 with the UKI's sections.
    let mut uki_boot = DigestValues::new();
    uki_boot.set(
        HashingAlgorithm::Sha256,
        Digest::try_from(vec![0x11; 32]).unwrap(),
    );
    let judge_path = |policy: &LoadedPolicy, platform: Platform, measurement: [u8; 48]| {
        let mut runtime = doc(policy);
        runtime.tpm_ak_sha256 = Some(ak.clone());
        let mut sim = SimulatedSnp::new().unwrap();
        sim.measurement = measurement;
        let mut evidence = collect_evidence(&sim, &runtime).unwrap();
        evidence.tpm = Some(quote(&runtime.tpm_qualifying_data()));
        if platform == Platform::Tdx {
            evidence.platform = Platform::Tdx;
            evidence.sev_snp = None;
            evidence.tdx = Some(TdxEvidence {
                quote: inferno_attestation::evidence::Base64Bytes(vec![0; 64]),
            });
        }
        judge(&evidence, policy, false)
    };
    let listed: [u8; 48] = hex::decode(
        "736578aed40313fa4751245b1cd0cbebd15d6a13d33cd09647c7310502a08dec1246e73f939dd489236bd8df1f3b5041",
    )
    .unwrap()
    .try_into()
    .unwrap();
    let pcr_check = |r: &AppraisalReport| {
        r.checks
            .iter()
            .find(|c| c.id == "tpm.pcr_values")
            .cloned()
            .unwrap_or_else(|| panic!("no tpm.pcr_values: {r}"))
    };

    // SEV-SNP measured direct boot, PCR 11 zero, under the reference PCR 11 of a UKI boot.
    // What the "UKI" extend below gives: SHA-256(zeros ‖ 0x11*32).
    let uki_value = {
        let mut input = vec![0u8; 32];
        input.extend_from_slice(&[0x11; 32]);
        hex::encode(HashAlg::Sha256.digest(&input))
    };
    let policy = reference_pcr11(&uki_value);
    let r = judge_path(&policy, Platform::SevSnp, listed);
    assert!(r.passed(), "{r}");
    let check = pcr_check(&r);
    assert!(
        check
            .reason
            .contains("PCR 11 is zero: measured direct boot")
            && check.reason.contains("pins the kernel"),
        "{check:?}"
    );
    // An unlisted launch measurement pins nothing: both fail.
    let r = judge_path(&policy, Platform::SevSnp, [0x42; 48]);
    assert_eq!(failed(&r), ["snp.measurement", "tpm.pcr_values"], "{r}");
    // The same policy without `measured_direct_boot` refuses a zero PCR 11.
    let strict = LoadedPolicy::with_reference_values(
        text.replacen("measured_direct_boot = true\n", "", 1)
            .as_bytes(),
        regex_free_replace(
            &values,
            "\n11 = [\"",
            &format!("\n11 = [\"{uki_value}\"]\n"),
        )
        .as_bytes(),
    )
    .unwrap();
    let r = judge_path(&strict, Platform::SevSnp, listed);
    assert_eq!(failed(&r), ["tpm.pcr_values"], "{r}");
    // TDX direct boot: PCR 11 zero is refused, naming why.
    let r = judge_path(&policy, Platform::Tdx, listed);
    let check = pcr_check(&r);
    assert!(
        !check.passed && check.reason.contains("PCR 11 is zero") && check.reason.contains("TDX"),
        "{r}"
    );

    // UKI boot: systemd-stub extended PCR 11; accepted on SEV-SNP, and PCR 11 passes on TDX.
    let conf = tcti.parse().unwrap();
    let mut ctx = tss_esapi::Context::new(conf).unwrap();
    ctx.execute_with_nullauth_session(|c| c.pcr_extend(PcrHandle::Pcr11, uki_boot))
        .unwrap();
    drop(ctx);
    let r = judge_path(&policy, Platform::SevSnp, listed);
    assert!(r.passed(), "{r}");
    let check = pcr_check(&r);
    assert!(
        check
            .reason
            .contains(&format!("PCR 11 = {uki_value} is in the reference values")),
        "{check:?}"
    );
    let r = judge_path(&policy, Platform::Tdx, listed);
    assert!(pcr_check(&r).passed, "{r}");
    assert!(failed(&r).iter().any(|id| id.starts_with("tdx.")), "{r}");
}

/// `text` with the line that starts at `start` replaced by `line` (through its end of line).
fn regex_free_replace(text: &str, start: &str, line: &str) -> String {
    let at = text.find(start).unwrap_or_else(|| panic!("no {start:?}"));
    let end = text[at + 1..]
        .find('\n')
        .map_or(text.len(), |e| at + 1 + e + 1);
    format!("{}{}{}", &text[..at], line, &text[end..])
}
