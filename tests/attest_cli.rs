//! `inferno attest verify` on standalone vTPM and GPU evidence (`--nonce`, `--tpm-root`), on a
//! simulated protected-PCIe GPU set, and on a TDX quote given as hex text. The tests on the real
//! vectors of `../shared/attestation-vectors` are ignored without it (`cfg(shared_vectors)`, set
//! by build.rs), never counted as passed.

mod attest_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use attest_support::{attest_verify as verify, check, failed};
use inferno_attestation::evidence::{Base64Bytes, StandaloneEvidence};
use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
use inferno_attestation::nvidia::{CcMode, GpuEvidence};
use inferno_attestation::tpm::{AkPublic, HashAlg, PcrBank, QuoteEvidence, TpmEvidence};
use serde_json::Value;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/attestation-vectors")
}

fn read(rel: &str) -> Vec<u8> {
    let path = vectors().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A policy for standalone evidence: its `[tpm]`, `[gpu]` and `[simulated]` tables apply.
fn policy(dir: &Path, simulated_gpu_root: Option<&[u8]>, tpm_required: bool) -> PathBuf {
    let roots = simulated_gpu_root
        .map(|der| {
            format!(
                "\"{}\"",
                hex::encode(ring::digest::digest(&ring::digest::SHA256, der))
            )
        })
        .unwrap_or_default();
    let text = format!(
        r#"
schema = 2
name = "standalone-cli-test"
platforms = ["tdx"]
[time]
collateral_grace_seconds = 0
[simulated]
trusted_gpu_root_sha256 = [{roots}]
[runtime_data]
required = false
[tdx]
allowed_tcb_status = ["UpToDate"]
allow_debug = false
[tpm]
required = {tpm_required}
pcrs = [0, 1, 2, 3, 4, 5, 6, 7]
[gpu]
required = false
require_cc_mode = true
require_ready_state = false
[audit]
content = "none"
[auth]
require_api_key = false
"#
    );
    let path = dir.join("policy.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn write_evidence(dir: &Path, evidence: &StandaloneEvidence) -> PathBuf {
    let path = dir.join("evidence.json");
    std::fs::write(&path, evidence.to_json()).unwrap();
    path
}

fn standalone() -> StandaloneEvidence {
    StandaloneEvidence {
        version: 1,
        tpm: None,
        tpm_ak_certs: Vec::new(),
        gpu: None,
        gpus: Vec::new(),
    }
}

fn der_or_pem(bytes: Vec<u8>) -> Vec<Vec<u8>> {
    if bytes.starts_with(b"-----BEGIN") {
        inferno_attestation::pki::pem_blocks(&bytes, "test").unwrap()
    } else {
        vec![bytes]
    }
}

/// The GCE vTPM: three quotes (SHA-1, SHA-256, SHA-384 banks), the event log, the AK as a
/// TPMT_PUBLIC, and its certificate with the intermediate.
fn gce() -> StandaloneEvidence {
    let dir = "tpm/go-tpm-tools/gce-cos-85-nonce9009";
    let quotes = [
        ("sha1", HashAlg::Sha1),
        ("sha256", HashAlg::Sha256),
        ("sha384", HashAlg::Sha384),
    ]
    .into_iter()
    .map(|(name, bank)| QuoteEvidence {
        attest: read(&format!("{dir}/quote_{name}.tpms_attest.bin")),
        signature: read(&format!("{dir}/quote_{name}.tpmt_signature.bin")),
        pcrs: PcrBank::from_text(
            bank,
            &String::from_utf8(read(&format!("{dir}/quote_{name}.pcrs.txt"))).unwrap(),
        )
        .unwrap(),
    })
    .collect();
    let mut certs = der_or_pem(read(&format!("{dir}/ak_cert.der")));
    certs.extend(der_or_pem(read(
        "tpm/go-tpm-tools/gce-ek-ca/tpm_ek_intermediate_2.crt",
    )));
    StandaloneEvidence {
        tpm: Some(TpmEvidence {
            ak: AkPublic::TpmtPublic(read(&format!("{dir}/ak_pub.tpmt_public.bin"))),
            quotes,
            event_log: Some(read(&format!("{dir}/event_log.bin"))),
        }),
        tpm_ak_certs: certs.into_iter().map(Base64Bytes).collect(),
        ..standalone()
    }
}

const GCE_ROOT: &str = "tpm/go-tpm-tools/gce-ek-ca/tpm_ek_root_1.cer";
const HOPPER_NONCE: &str = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb";

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_quote_verifies_under_its_own_nonce_through_the_cli() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, true);
    let evidence = write_evidence(work.path(), &gce());
    let root = vectors().join(GCE_ROOT);
    let root = root.to_str().unwrap();
    let now = ["--now", "2025-01-01T00:00:00Z"];

    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--nonce", "9009", "--tpm-root", root]].concat(),
    );
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["platform"], Value::Null);
    for id in [
        "tpm.required",
        "tpm.quote",
        "tpm.nonce",
        "tpm.ak_certificate",
        "tpm.pcr_selection",
    ] {
        let (passed, reason) = check(&report, id);
        assert!(passed, "{id}: {reason}");
    }
    let (_, quote) = check(&report, "tpm.quote");
    assert!(
        quote.contains("3 quote(s)") && quote.contains("event log"),
        "{quote}"
    );
    assert_eq!(report["claims"]["tpm"]["nonce"], "9009");

    // Another nonce: only the nonce fails; the signature and the AK chain still report.
    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--nonce", "9008", "--tpm-root", root]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["tpm.nonce"], "{report:#}");

    // No root for the AK certificate: nothing vouches for the AK.
    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--nonce", "9009"]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["tpm.ak_certificate"], "{report:#}");

    // Issue 47: the policy pins the AK's public key (`[tpm] ak_public_keys`, SHA-256 of its
    // SubjectPublicKeyInfo): trusted without a certificate chain; another pinned key is not.
    let ak = gce().tpm.unwrap().ak.key().unwrap().spki_sha256().unwrap();
    let pinned = |key: &str, name: &str| {
        let text = std::fs::read_to_string(&policy).unwrap().replacen(
            "pcrs = [0, 1, 2, 3, 4, 5, 6, 7]\n",
            &format!("pcrs = [0, 1, 2, 3, 4, 5, 6, 7]\nak_public_keys = [\"{key}\"]\n"),
            1,
        );
        let path = work.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (code, report) = verify(
        &evidence,
        &pinned(&hex::encode(ak), "pinned.toml"),
        &[&now[..], &["--nonce", "9009"]].concat(),
    );
    assert_eq!(code, Some(0), "{report:#}");
    let (_, reason) = check(&report, "tpm.ak_certificate");
    assert!(reason.contains("pins this AK"), "{reason}");
    let (code, report) = verify(
        &evidence,
        &pinned(&"00".repeat(32), "other-pin.toml"),
        &[&now[..], &["--nonce", "9009"]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["tpm.ak_certificate"], "{report:#}");

    // No nonce at all: standalone evidence cannot be fresh.
    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--tpm-root", root]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert!(
        failed(&report).contains(&"evidence.nonce".to_owned()),
        "{report:#}"
    );

    // A flipped PCR value breaks the quote's digest, whatever the nonce.
    let mut forged = gce();
    forged.tpm.as_mut().unwrap().quotes[1].pcrs.values[0].value[0] ^= 1;
    let path = write_evidence(work.path(), &forged);
    let (code, report) = verify(
        &path,
        &policy,
        &[&now[..], &["--nonce", "9009", "--tpm-root", root]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert!(
        failed(&report).contains(&"tpm.quote".to_owned()),
        "{report:#}"
    );
}

/// The Hopper report with its device chain; `chain` names the PEM file of the chain.
fn hopper(chain: &str) -> StandaloneEvidence {
    let text = read("nvidia-h100/nvtrust/hopperAttestationReport.txt");
    let hex_text: Vec<u8> = text
        .into_iter()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    let report = hex::decode(hex_text).unwrap();
    let cert_chain = inferno_attestation::pki::pem_blocks(&read(chain), chain).unwrap();
    StandaloneEvidence {
        gpu: Some(GpuEvidence {
            report,
            cert_chain,
            cc_mode: CcMode::On,
            ready_state: true,
        }),
        ..standalone()
    }
}

const HOPPER_CHAIN: &str = "nvidia-h100/nvtrust/hopperCertChain.txt";

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn hopper_report_verifies_under_its_own_nonce_and_every_check_reports() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, false);
    let evidence = write_evidence(work.path(), &hopper(HOPPER_CHAIN));
    let now = ["--now", "2025-01-01T00:00:00Z"];
    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--nonce", HOPPER_NONCE]].concat(),
    );
    assert_eq!(code, Some(0), "{report:#}");
    for id in [
        "gpu.chain",
        "gpu.signature",
        "gpu.nonce",
        "gpu.fwid",
        "gpu.versions",
    ] {
        let (passed, reason) = check(&report, id);
        assert!(passed, "{id}: {reason}");
    }
    assert_eq!(report["claims"]["gpu"]["driver_version"], "550.90.07");
    assert_eq!(report["claims"]["gpu"]["vbios_version"], "96.00.9F.00.01");

    // A wrong nonce fails the nonce alone: chain, signature and FWID still pass.
    let wrong = "00".repeat(32);
    let (code, report) = verify(
        &evidence,
        &policy,
        &[&now[..], &["--nonce", wrong.as_str()]].concat(),
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["gpu.nonce"], "{report:#}");
    for id in ["gpu.chain", "gpu.signature", "gpu.fwid"] {
        assert!(check(&report, id).0, "{id} should still pass: {report:#}");
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn hopper_broken_chains_are_rejected_for_the_chain_even_with_a_wrong_nonce() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, false);
    for case in [2, 3, 4] {
        let chain = format!("nvidia-h100/trustee/hopper_cert_chain_case{case}.txt");
        let evidence = write_evidence(work.path(), &hopper(&chain));
        for nonce in [HOPPER_NONCE.to_owned(), "11".repeat(32)] {
            let (code, report) = verify(
                &evidence,
                &policy,
                &["--now", "2025-01-01T00:00:00Z", "--nonce", nonce.as_str()],
            );
            assert_eq!(code, Some(1), "case {case}: {report:#}");
            let (passed, reason) = check(&report, "gpu.chain");
            assert!(
                !passed && reason.contains("certificate chain"),
                "case {case}: {reason}"
            );
            // The nonce is judged on its own: right stays right, wrong is wrong.
            assert_eq!(
                check(&report, "gpu.nonce").0,
                nonce == HOPPER_NONCE,
                "case {case}"
            );
        }
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn hopper_report_against_the_test_rims_is_rejected_for_the_mismatch() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, false);
    let evidence = write_evidence(work.path(), &hopper(HOPPER_CHAIN));
    let bundle = work.path().join("bundle.json");
    let status = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["attest", "bundle", "--out"])
        .arg(&bundle)
        .arg("--driver-rim")
        .arg(vectors().join("nvidia-h100/nvtrust/Driver_RIM_test_no_gpu.swidtag"))
        .arg("--vbios-rim")
        .arg(vectors().join("nvidia-h100/nvtrust/1010_0200_882_96005E0001_test_no_gpu.swidtag"))
        .status()
        .unwrap();
    assert!(status.success());
    let (code, report) = verify(
        &evidence,
        &policy,
        &[
            "--now",
            "2025-01-01T00:00:00Z",
            "--nonce",
            HOPPER_NONCE,
            "--collateral",
            bundle.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["gpu.reference_values"], "{report:#}");
    let (_, reason) = check(&report, "gpu.reference_values");
    assert!(
        reason.contains("545.00") && reason.contains("550.90.07"),
        "{reason}"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_quote_as_hex_text_verifies() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, false);
    let quote = work.path().join("quote.hex");
    let mut text = hex::encode(read("tdx/dcap-qvl/tdx_quote"));
    text.push('\n');
    std::fs::write(&quote, text).unwrap();
    let bundle = work.path().join("bundle.json");
    let status = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["attest", "bundle", "--out"])
        .arg(&bundle)
        .arg("--tdx-collateral")
        .arg(vectors().join("tdx/dcap-qvl/tdx_quote_collateral.json"))
        .status()
        .unwrap();
    assert!(status.success());
    let (code, report) = verify(
        &quote,
        &policy,
        &[
            "--now",
            "2025-07-19T10:00:34Z",
            "--collateral",
            bundle.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["claims"]["tdx"]["tcb_status"], "UpToDate");
}

/// A protected-PCIe set of simulated GPUs (one hierarchy, distinct devices), judged as a set.
/// The members share one FWID, as real GPUs with the same firmware do (issue 47): devices are
/// told apart by their certificates' keys.
#[test]
fn simulated_gpu_set_is_appraised_as_a_set() {
    let work = tempfile::tempdir().unwrap();
    let config = SimulatedGpuConfig {
        ready_state: true,
        ..SimulatedGpuConfig::default()
    };
    let members: Vec<SimulatedGpu> = (0..4)
        .map(|i| SimulatedGpu::set_member(TEST_SEED, i, config.clone()).unwrap())
        .collect();
    let policy = policy(work.path(), Some(members[0].root_der()), false);
    let nonce = [0x5a; 32];
    let nonce_hex = hex::encode(nonce);
    let set = StandaloneEvidence {
        gpus: members
            .iter()
            .map(|g| g.evidence(&nonce).unwrap())
            .collect(),
        ..standalone()
    };
    let evidence = write_evidence(work.path(), &set);
    let (code, report) = verify(&evidence, &policy, &["--nonce", nonce_hex.as_str()]);
    assert_eq!(code, Some(0), "{report:#}");
    let (_, reason) = check(&report, "gpu.set");
    assert!(reason.contains("4 distinct GPUs"), "{reason}");
    assert_eq!(report["simulated"], true);
    for i in 0..4 {
        assert!(
            check(&report, &format!("gpu.{i}.signature")).0,
            "{report:#}"
        );
    }

    // One GPU twice is not a set of distinct devices.
    let mut twice = set.clone();
    twice.gpus[3] = twice.gpus[0].clone();
    let evidence = write_evidence(work.path(), &twice);
    let (code, report) = verify(&evidence, &policy, &["--nonce", nonce_hex.as_str()]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["gpu.set"], "{report:#}");

    // One member answering another nonce fails itself and the set.
    let mut stale = set.clone();
    stale.gpus[2] = members[2].evidence(&[0x11; 32]).unwrap();
    let evidence = write_evidence(work.path(), &stale);
    let (code, report) = verify(&evidence, &policy, &["--nonce", nonce_hex.as_str()]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["gpu.2.nonce", "gpu.set"], "{report:#}");

    // A member in another CC mode fails the policy on its own.
    let mut off = set;
    off.gpus[1].cc_mode = CcMode::Off;
    let evidence = write_evidence(work.path(), &off);
    let (code, report) = verify(&evidence, &policy, &["--nonce", nonce_hex.as_str()]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["gpu.1.cc_mode", "gpu.set"], "{report:#}");
}

/// `inferno attest simulate --nonce --tls-exporter` binds the challenge into the runtime data's
/// `challenge_bindings`; `inferno attest verify` checks it (`runtime_data.challenge`) and names
/// a wrong nonce or exporter.
#[test]
#[cfg(feature = "simulated-tee")]
fn a_simulated_challenge_binding_verifies_only_for_its_nonce_and_exporter() {
    let work = tempfile::tempdir().unwrap();
    let policy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policy/development.toml");
    let evidence = work.path().join("evidence.json");
    let nonce = "ab".repeat(16);
    let exporter = "cd".repeat(32);
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["attest", "simulate", "--policy"])
        .arg(&policy)
        .args(["--nonce", &nonce, "--tls-exporter", &exporter, "--out"])
        .arg(&evidence)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, report) = verify(
        &evidence,
        &policy,
        &["--nonce", &nonce, "--tls-exporter", &exporter],
    );
    assert_eq!(code, Some(0), "{report:#}");
    let (passed, reason) = check(&report, "runtime_data.challenge");
    assert!(passed && reason.contains("TLS exporter"), "{reason}");
    let binding = report["claims"]["runtime_data"]["challenge_bindings"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let expected = ring::digest::digest(
        &ring::digest::SHA256,
        &hex::decode(format!("{nonce}{exporter}")).unwrap(),
    );
    assert_eq!(binding, hex::encode(expected.as_ref()));

    let other_exporter = "ce".repeat(32);
    let other_nonce = "ac".repeat(16);
    for args in [
        ["--nonce", &nonce, "--tls-exporter", &other_exporter],
        ["--nonce", &other_nonce, "--tls-exporter", &exporter],
    ] {
        let (code, report) = verify(&evidence, &policy, &args);
        assert_eq!(code, Some(1), "{report:#}");
        assert_eq!(failed(&report), ["runtime_data.challenge"], "{report:#}");
    }
    // Without the exporter the binding covers the nonce alone, which is not this binding.
    let (code, report) = verify(&evidence, &policy, &["--nonce", &nonce]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["runtime_data.challenge"], "{report:#}");
}

/// `policy` with `[time] allow_unfresh_evidence = true` (offline audit), written beside it.
fn allowing_unfresh(policy: &Path) -> PathBuf {
    let text = std::fs::read_to_string(policy).unwrap().replacen(
        "collateral_grace_seconds = 0\n",
        "collateral_grace_seconds = 0\nallow_unfresh_evidence = true\n",
        1,
    );
    let path = policy.with_file_name("offline-audit.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `inferno attest verify` in text form: exit code, standard output and standard error.
fn verify_text(evidence: &Path, policy: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["attest", "verify"])
        .arg(evidence)
        .arg("--policy")
        .arg(policy)
        .args(args)
        .output()
        .expect("run inferno attest verify");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 47: evidence whose nonce the verifier does not know is appraised only with
/// `--no-freshness`; the verdict says NOT FRESH and exits 1 unless the policy allows unfresh
/// evidence for offline audit.
#[test]
fn evidence_without_a_known_nonce_is_not_fresh_unless_the_policy_allows_it() {
    let work = tempfile::tempdir().unwrap();
    let gpu = SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default()).unwrap();
    let policy = policy(work.path(), Some(gpu.root_der()), false);
    let evidence = write_evidence(
        work.path(),
        &StandaloneEvidence {
            gpu: Some(gpu.evidence(&[0x3c; 32]).unwrap()),
            ..standalone()
        },
    );

    // Without a nonce and without the waiver: nothing binds the evidence.
    let (code, report) = verify(&evidence, &policy, &[]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(
        failed(&report),
        ["evidence.nonce", "gpu.nonce"],
        "{report:#}"
    );

    // Waived under a policy that does not allow it: only `freshness` fails, NOT FRESH.
    let (code, report) = verify(&evidence, &policy, &["--no-freshness"]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["freshness"], "{report:#}");
    assert_eq!(report["not_fresh"], true);
    let (_, reason) = check(&report, "gpu.nonce");
    assert!(reason.contains("not checked"), "{reason}");
    let (code, stdout, _) = verify_text(&evidence, &policy, &["--no-freshness"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert_eq!(stdout.lines().next(), Some("verdict: REJECT, NOT FRESH"));

    // A policy for offline audit accepts it, still NOT FRESH.
    let offline = allowing_unfresh(&policy);
    let (code, report) = verify(&evidence, &offline, &["--no-freshness"]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["not_fresh"], true);
    let (code, stdout, _) = verify_text(&evidence, &offline, &["--no-freshness"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("verdict: PASS, NOT FRESH")),
        "{stdout}"
    );
    // The allowing policy changes nothing for evidence judged with its nonce: fresh.
    let nonce = hex::encode([0x3c; 32]);
    let (code, report) = verify(&evidence, &offline, &["--nonce", &nonce]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report.get("not_fresh"), None, "{report:#}");

    // A nonce and the waiver together are a usage error, on one line.
    let (code, stdout, stderr) =
        verify_text(&evidence, &policy, &["--no-freshness", "--nonce", &nonce]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("--no-freshness"), "{stderr}");
}

/// Issue 47: the real GCE vTPM quote judged without its nonce, as quotes taken without one
/// must be: `--no-freshness` leaves the qualifying data unchecked and says NOT FRESH.
#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_quote_without_its_nonce_needs_no_freshness_and_an_offline_policy() {
    let work = tempfile::tempdir().unwrap();
    let policy = policy(work.path(), None, true);
    let evidence = write_evidence(work.path(), &gce());
    let root = vectors().join(GCE_ROOT);
    let root = root.to_str().unwrap();
    let args = [
        "--now",
        "2025-01-01T00:00:00Z",
        "--tpm-root",
        root,
        "--no-freshness",
    ];
    let (code, report) = verify(&evidence, &policy, &args);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(failed(&report), ["freshness"], "{report:#}");
    let (passed, reason) = check(&report, "tpm.nonce");
    assert!(passed && reason.contains("not checked"), "{reason}");
    let (code, report) = verify(&evidence, &allowing_unfresh(&policy), &args);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["not_fresh"], true);
    for id in ["tpm.quote", "tpm.ak_certificate", "freshness"] {
        let (passed, reason) = check(&report, id);
        assert!(passed, "{id}: {reason}");
    }
}
