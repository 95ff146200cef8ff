//! Real vendor evidence from `../shared/attestation-vectors` reaches the verdict its README
//! gives, with `now` pinned as the README says. Skips loudly when the folder is absent.

use std::path::PathBuf;

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::{CollateralBundle, IntelCollateral};
use inferno_attestation::evidence::{Base64Bytes, Evidence};
use inferno_attestation::pki;
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::reference_values::ReferenceValues;
use inferno_attestation::report::AppraisalReport;
use time::OffsetDateTime;
use time::macros::datetime;

fn vectors() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/attestation-vectors");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is absent; vendor-vector tests did not run",
            dir.display()
        );
        None
    }
}

/// A policy for vendor vectors: real roots only, no runtime-data or GPU requirement (the
/// vectors predate this project), and no reference values.
const VECTOR_POLICY: &str = r#"
schema = 2
name = "vector-test"
platforms = ["sev-snp", "tdx"]
[time]
collateral_grace_seconds = 0
[runtime_data]
required = false
[sev_snp]
products = ["Milan", "Genoa", "Turin"]
min_report_version = 2
allow_debug = false
allow_smt = true
allow_migration_agent = false
vmpls = [0]
[sev_snp.min_tcb.Milan]
bootloader = 3
tee = 0
snp = 8
microcode = 115
[tdx]
allowed_tcb_status = ["UpToDate"]
allow_debug = false
[gpu]
required = false
require_cc_mode = false
require_ready_state = false
[audit]
content = "none"
[auth]
require_api_key = false
"#;

fn policy() -> LoadedPolicy {
    LoadedPolicy::from_bytes(VECTOR_POLICY.as_bytes()).unwrap()
}

fn snp_appraisal(
    report: &[u8],
    vcek: &[u8],
    now: OffsetDateTime,
    policy: &LoadedPolicy,
) -> AppraisalReport {
    let evidence = Evidence::from_bytes(report).unwrap();
    let mut bundle = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    bundle.amd.vcek.push(Base64Bytes(vcek.to_vec()));
    appraise(&AppraisalInput {
        evidence: &evidence,
        policy,
        collateral: Some(&bundle),
        now,
        clock_floor: None,
        gpu_ready_pending: false,
    })
}

fn failed_ids(report: &AppraisalReport) -> Vec<String> {
    report.failures().map(|c| c.id.clone()).collect()
}

fn read(dir: &std::path::Path, rel: &str) -> Vec<u8> {
    std::fs::read(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_milan_virtee_passes() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "sev-snp/virtee-sev/report_milan.hex"),
        &read(&v, "sev-snp/virtee-sev/vcek_milan.der"),
        datetime!(2024-01-01 0:00 UTC),
        &policy(),
    );
    assert!(r.passed(), "{r}");
    assert!(!r.simulated);
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.product, "Milan");
    assert_eq!(snp.report_version, 2);
    assert_eq!(snp.vmpl, 0);
    assert_eq!(snp.guest_policy, "0x30000");
    assert!(!snp.debug);
    assert_eq!(
        (
            snp.reported_tcb.bootloader,
            snp.reported_tcb.tee,
            snp.reported_tcb.snp,
            snp.reported_tcb.microcode
        ),
        (3, 0, 8, 115)
    );
    assert_eq!(
        snp.measurement,
        "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_go_sev_guest_debug_guest_is_rejected_for_debug_only() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "sev-snp/go-sev-guest/attestation.bin"),
        &read(&v, "sev-snp/go-sev-guest/vcek.testcer"),
        datetime!(2023-01-01 0:00 UTC),
        &policy(),
    );
    assert!(!r.passed());
    // Signature and chain are valid; the guest policy's debug bit rejects it (and its 2022
    // firmware is below the policy's Milan minimum TCB).
    assert_eq!(failed_ids(&r), ["snp.debug", "snp.min_tcb"], "{r}");
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.guest_policy, "0xb0000");
    assert_eq!(
        snp.measurement,
        "b07af9620f3b839b47996422ddec6058338951d984e312115131ea82705eaf5b6bdf8a9ece31a5a608eb0cf2e4872b01"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_trustee_milan_passes() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "sev-snp/trustee/test-report.bin"),
        &read(&v, "sev-snp/trustee/test-vcek.der"),
        datetime!(2024-01-01 0:00 UTC),
        &policy(),
    );
    assert!(r.passed(), "{r}");
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.guest_policy, "0x3001f");
    assert_eq!(snp.guest_svn, 4);
    assert_eq!(
        snp.measurement,
        "a1f3930413247bb38cfc171579ea3c12d5fe4901f0c792f63fd75d98f1ef827c23500644e0e692e6be917f9050d3d38c"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_turin_v5_passes_with_fmc() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "sev-snp/project-oak/turin_report.bin"),
        &read(&v, "sev-snp/project-oak/turin_vcek.der"),
        datetime!(2025-08-01 0:00 UTC),
        &policy(),
    );
    assert!(r.passed(), "{r}");
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.product, "Turin");
    assert_eq!(snp.report_version, 5);
    let t = snp.reported_tcb;
    assert_eq!(
        (t.fmc, t.bootloader, t.tee, t.snp, t.microcode),
        (Some(0), 1, 0, 2, 71)
    );
    assert_eq!(
        snp.measurement,
        "f924dd18f168df60fbea937f0b086284d51b1b376de872bac43694f61134d57967c318018de7335503023dbb50dee624"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_reports_fail_when_now_is_outside_certificate_validity() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "sev-snp/virtee-sev/report_milan.hex"),
        &read(&v, "sev-snp/virtee-sev/vcek_milan.der"),
        datetime!(2000-01-01 0:00 UTC),
        &policy(),
    );
    assert_eq!(failed_ids(&r), ["snp.cert_validity"], "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_negative_vectors_fail() {
    let Some(v) = vectors() else { return };
    let r = snp_appraisal(
        &read(&v, "negative/snp_milan_report_byte21_xor80.bin"),
        &read(&v, "sev-snp/virtee-sev/vcek_milan.der"),
        datetime!(2024-01-01 0:00 UTC),
        &policy(),
    );
    assert_eq!(failed_ids(&r), ["snp.report_signature"], "{r}");
    let r = snp_appraisal(
        &read(&v, "sev-snp/virtee-sev/report_milan.hex"),
        &read(&v, "negative/snp_vcek_milan_byte40_xorff.der"),
        datetime!(2024-01-01 0:00 UTC),
        &policy(),
    );
    assert_eq!(failed_ids(&r), ["snp.chain"], "{r}");
    for name in ["test-vcek-invalid-legacy.der", "test-vcek-invalid-new.der"] {
        let der = read(&v, &format!("sev-snp/trustee/{name}"));
        let cert = pki::parse_certificate(&der, name).unwrap();
        assert!(
            inferno_attestation::verify::snp::hw_id(&cert).is_some(),
            "{name} hwID parses"
        );
        let r = snp_appraisal(
            &read(&v, "sev-snp/trustee/test-report.bin"),
            &der,
            datetime!(2024-01-01 0:00 UTC),
            &policy(),
        );
        assert_eq!(failed_ids(&r), ["snp.chain"], "{name}: {r}");
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn amd_roots_chain_and_products_do_not_mix() {
    let Some(v) = vectors() else { return };
    let pem = |rel: &str| pki::pem_blocks(&read(&v, rel), rel).unwrap();
    for product in ["milan", "genoa", "turin"] {
        let ark = pem(&format!("sev-snp/amd-roots/virtee_{product}_ark.pem")).remove(0);
        let ask = pem(&format!("sev-snp/amd-roots/virtee_{product}_ask.pem")).remove(0);
        let ark = pki::parse_certificate(&ark, "ark").unwrap();
        let ask = pki::parse_certificate(&ask, "ask").unwrap();
        pki::verify_issued_by(&ark, &ark, "ark").unwrap();
        pki::verify_issued_by(&ask, &ark, "ask").unwrap();
    }
    for name in [
        "gosevguest_ask_ark_milan.pem",
        "gosevguest_ask_ark_genoa.pem",
        "gosevguest_ask_ark_milan_vlek.pem",
        "gosevguest_ask_ark_genoa_vlek.pem",
        "gosevguest_ask_ark_turin_vcek.pem",
        "gosevguest_ask_ark_turin_vlek.pem",
    ] {
        let blocks = pem(&format!("sev-snp/amd-roots/{name}"));
        assert_eq!(blocks.len(), 2, "{name}");
        let inter = pki::parse_certificate(&blocks[0], "intermediate").unwrap();
        let ark = pki::parse_certificate(&blocks[1], "ark").unwrap();
        pki::verify_issued_by(&ark, &ark, name).unwrap();
        pki::verify_issued_by(&inter, &ark, name).unwrap();
    }
    let milan_vcek = read(&v, "sev-snp/virtee-sev/vcek_milan.der");
    let milan_vcek = pki::parse_certificate(&milan_vcek, "vcek").unwrap();
    let genoa_ask = pem("sev-snp/amd-roots/virtee_genoa_ask.pem").remove(0);
    let genoa_ask = pki::parse_certificate(&genoa_ask, "genoa ask").unwrap();
    assert!(pki::verify_issued_by(&milan_vcek, &genoa_ask, "vcek").is_err());
    let milan_ask = pem("sev-snp/amd-roots/virtee_milan_ask.pem").remove(0);
    let milan_ask = pki::parse_certificate(&milan_ask, "milan ask").unwrap();
    pki::verify_issued_by(&milan_vcek, &milan_ask, "vcek").unwrap();

    let turin_vcek = read(&v, "sev-snp/virtee-sev/vcek_turin.der");
    let turin_vcek = pki::parse_certificate(&turin_vcek, "turin vcek").unwrap();
    let turin_ask = pem("sev-snp/amd-roots/virtee_turin_ask.pem").remove(0);
    let turin_ask = pki::parse_certificate(&turin_ask, "turin ask").unwrap();
    pki::verify_issued_by(&turin_vcek, &turin_ask, "vcek").unwrap();
    assert_eq!(
        inferno_attestation::verify::snp::hw_id(&turin_vcek)
            .map(hex::encode)
            .as_deref(),
        Some("1e550a8ee5cf9f4d")
    );
}

fn tdx_appraisal(quote: &[u8], collateral_json: &[u8], now: OffsetDateTime) -> AppraisalReport {
    let evidence = Evidence::from_bytes(quote).unwrap();
    let mut bundle = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    bundle.intel.push(IntelCollateral {
        fmspc: None,
        collateral: serde_json::from_slice(collateral_json).unwrap(),
    });
    appraise(&AppraisalInput {
        evidence: &evidence,
        policy: &policy(),
        collateral: Some(&bundle),
        now,
        clock_floor: None,
        gpu_ready_pending: false,
    })
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_quote_v4_up_to_date_passes() {
    let Some(v) = vectors() else { return };
    let r = tdx_appraisal(
        &read(&v, "tdx/dcap-qvl/tdx_quote"),
        &read(&v, "tdx/dcap-qvl/tdx_quote_collateral.json"),
        datetime!(2025-07-19 10:00:34 UTC),
    );
    assert!(r.passed(), "{r}");
    let tdx = r.claims.tdx.as_ref().unwrap();
    assert_eq!(tdx.quote_version, 4);
    assert_eq!(tdx.fmspc, "b0c06f000000");
    assert_eq!(tdx.tcb_status, "UpToDate");
    assert!(tdx.advisory_ids.is_empty());
    assert_eq!(tdx.td_attributes, "0000001000000000");
    assert!(!tdx.debug);
    assert!(tdx.mrtd.starts_with("91eb2b44"));
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_quote_v5_without_matching_tcb_level_is_rejected() {
    let Some(v) = vectors() else { return };
    let r = tdx_appraisal(
        &read(&v, "tdx/dcap-qvl/tdx_quote_outdated"),
        &read(&v, "tdx/dcap-qvl/tdx_quote_outdated_collateral.json"),
        datetime!(2026-03-20 10:41:14 UTC),
    );
    assert!(!r.passed());
    assert_eq!(failed_ids(&r), ["tdx.quote_signature"], "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_negative_and_stale_collateral_fail() {
    let Some(v) = vectors() else { return };
    let collateral = read(&v, "tdx/dcap-qvl/tdx_quote_collateral.json");
    let r = tdx_appraisal(
        &read(&v, "negative/tdx_dcapqvl_tdx_quote_reportdata0_xor01.bin"),
        &collateral,
        datetime!(2025-07-19 10:00:34 UTC),
    );
    assert_eq!(failed_ids(&r), ["tdx.quote_signature"], "{r}");
    // One day past the TCB info's next update, with no grace in the policy.
    let r = tdx_appraisal(
        &read(&v, "tdx/dcap-qvl/tdx_quote"),
        &collateral,
        datetime!(2025-07-20 10:00:00 UTC),
    );
    assert_eq!(failed_ids(&r), ["tdx.collateral_freshness"], "{r}");
}

/// Azure SEV-SNP CVM: the HCL report binds the vTPM AK through REPORT_DATA, and the runtime
/// data must come through the vTPM quote. The vector's quote was taken over "challenge", not
/// over a runtime-data document, so binding it to one must fail — at the quote, after the SNP
/// report and the HCL binding verified.
#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_hcl_binds_the_ak_and_runtime_data_goes_through_the_vtpm() {
    let Some(v) = vectors() else { return };
    use inferno_attestation::evidence::SnpEvidence;
    use inferno_attestation::runtime_data::RuntimeData;
    use inferno_attestation::tpm::{
        AkPublic, HashAlg, PcrBank, PcrValue, QuoteEvidence, Signature, TpmEvidence, azure_hcl,
    };

    let hcl = read(&v, "azure-snp-vtpm/trustee-original/hcl-report.bin");
    let bound = azure_hcl::parse_and_bind(&hcl).unwrap();
    let vcek = pki::pem_blocks(
        &read(&v, "azure-snp-vtpm/trustee-original/vcek.pem"),
        "vcek",
    )
    .unwrap()
    .remove(0);
    #[derive(serde::Deserialize)]
    struct AzureQuote {
        signature: String,
        message: String,
        pcrs: Vec<String>,
    }
    let quote: AzureQuote = serde_json::from_slice(&read(
        &v,
        "azure-snp-vtpm/trustee-original/tpm-quote-v1.json",
    ))
    .unwrap();
    let tpm = TpmEvidence {
        ak: AkPublic::SpkiDer(bound.ak.to_spki_der().unwrap()),
        quotes: vec![QuoteEvidence {
            attest: hex::decode(&quote.message).unwrap(),
            signature: Signature::marshal_rsassa(
                HashAlg::Sha256,
                &hex::decode(&quote.signature).unwrap(),
            )
            .unwrap(),
            pcrs: PcrBank {
                bank: HashAlg::Sha256,
                values: quote
                    .pcrs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| PcrValue {
                        index: u8::try_from(i).unwrap(),
                        value: hex::decode(p).unwrap(),
                    })
                    .collect(),
            },
        }],
        event_log: None,
    };
    let policy = policy();
    let doc = RuntimeData::new(policy.digest, "inferno/test");
    let mut evidence = Evidence {
        version: 1,
        platform: inferno_attestation::policy::Platform::SevSnp,
        runtime_data: Some(Base64Bytes(doc.to_canonical_bytes())),
        sev_snp: Some(SnpEvidence {
            report: Base64Bytes(bound.snp_report.clone()),
            certs: vec![inferno_attestation::evidence::SnpCert {
                kind: inferno_attestation::evidence::SnpCertKind::Vcek,
                der: Base64Bytes(vcek),
            }],
            hcl_report: Some(Base64Bytes(hcl.clone())),
        }),
        tdx: None,
        tpm: Some(tpm),
        gpu: None,
    };
    let judge = |e: &Evidence| {
        appraise(&AppraisalInput {
            evidence: e,
            policy: &policy,
            collateral: None,
            now: datetime!(2024-01-01 0:00 UTC),
            clock_floor: None,
            gpu_ready_pending: false,
        })
    };
    let r = judge(&evidence);
    // The quote verifies, but its qualifying data is the vector's "challenge", not the
    // SHA-256 of this runtime-data document, so the document is not bound.
    assert_eq!(failed_ids(&r), ["tpm.nonce", "runtime_data.binding"], "{r}");
    assert!(
        r.checks
            .iter()
            .any(|c| c.id == "snp.hcl_binding" && c.passed),
        "{r}"
    );
    assert!(
        r.checks
            .iter()
            .any(|c| c.id == "snp.report_signature" && c.passed),
        "{r}"
    );
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.product, "Milan");
    let t = snp.reported_tcb;
    assert_eq!((t.bootloader, t.tee, t.snp, t.microcode), (3, 0, 8, 115));

    // Without the vTPM quote the runtime data cannot be bound at all.
    evidence.tpm = None;
    assert_eq!(failed_ids(&judge(&evidence)), ["runtime_data.binding"]);

    // Altered variable data breaks the HCL binding.
    let mut altered = hcl.clone();
    let at = altered.windows(8).position(|w| w == b"HCLAkPub").unwrap();
    altered[at + 2] ^= 1;
    evidence.sev_snp.as_mut().unwrap().hcl_report = Some(Base64Bytes(altered));
    assert_eq!(failed_ids(&judge(&evidence)), ["snp.hcl_binding"]);
}

/// Strict collateral time: a PCK CRL whose thisUpdate lies after `now` is refused (before its
/// signature is even looked at), with no grace. The CRL is the later vector's (issued
/// 2026-02-18), put into the 2025 collateral.
#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_crl_issued_after_now_is_refused() {
    let v = vectors().expect("cfg(shared_vectors) is set only when the folder exists");
    let later: serde_json::Value =
        serde_json::from_slice(&read(&v, "tdx/dcap-qvl/tdx_quote_outdated_collateral.json"))
            .unwrap();
    let mut collateral: serde_json::Value =
        serde_json::from_slice(&read(&v, "tdx/dcap-qvl/tdx_quote_collateral.json")).unwrap();
    collateral["pck_crl"] = later["pck_crl"].clone();
    let r = tdx_appraisal(
        &read(&v, "tdx/dcap-qvl/tdx_quote"),
        collateral.to_string().as_bytes(),
        datetime!(2025-07-19 10:00:34 UTC),
    );
    assert!(!r.passed(), "{r}");
    let text = r.to_string();
    assert!(
        text.contains("Intel PCK CRL") && text.contains("2026-02-18"),
        "{text}"
    );
}

/// The vector policy naming reference values whose SEV-SNP measurements are `measurements`.
fn policy_with_snp_reference_values(measurements: &[&str]) -> LoadedPolicy {
    let text = VECTOR_POLICY.replacen(
        "platforms = ",
        "reference_values = \"reference-values.toml\"\nplatforms = ",
        1,
    );
    let list: Vec<String> = measurements
        .iter()
        .map(|m| format!("{{ product = \"Milan\", vcpus = 1, measurement = \"{m}\" }}"))
        .collect();
    let values = format!(
        "schema = 1\nimage = \"inferno\"\n[sev_snp]\nmeasurements = [{}]\n",
        list.join(", ")
    );
    LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap()
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn snp_measurement_not_in_the_reference_values_fails_naming_it() {
    let Some(v) = vectors() else { return };
    let real = "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f";
    let judge = |policy: &LoadedPolicy| {
        snp_appraisal(
            &read(&v, "sev-snp/virtee-sev/report_milan.hex"),
            &read(&v, "sev-snp/virtee-sev/vcek_milan.der"),
            datetime!(2024-01-01 0:00 UTC),
            policy,
        )
    };
    let r = judge(&policy_with_snp_reference_values(&[real]));
    assert!(r.passed(), "{r}");

    let r = judge(&policy_with_snp_reference_values(&[&"00".repeat(48)]));
    assert_eq!(failed_ids(&r), ["snp.measurement"], "{r}");
    let reason = &r.failures().next().unwrap().reason;
    assert!(
        reason.contains(real),
        "the failure names the measurement: {reason}"
    );
    assert!(reason.contains("reference values"), "{reason}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_mrtd_not_in_the_reference_values_fails_naming_it() {
    let Some(v) = vectors() else { return };
    let evidence = Evidence::from_bytes(&read(&v, "tdx/dcap-qvl/tdx_quote")).unwrap();
    let mut bundle = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    bundle.intel.push(IntelCollateral {
        fmspc: None,
        collateral: serde_json::from_slice(&read(&v, "tdx/dcap-qvl/tdx_quote_collateral.json"))
            .unwrap(),
    });
    let judge = |mrtd: &str| {
        let text = VECTOR_POLICY.replacen(
            "platforms = ",
            "reference_values = \"reference-values.toml\"\nplatforms = ",
            1,
        );
        let values = format!("schema = 1\nimage = \"inferno\"\n[tdx]\nmrtd = [\"{mrtd}\"]\n");
        let policy =
            LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap();
        appraise(&AppraisalInput {
            evidence: &evidence,
            policy: &policy,
            collateral: Some(&bundle),
            now: datetime!(2025-07-19 10:00:34 UTC),
            clock_floor: None,
            gpu_ready_pending: false,
        })
    };
    let real = judge(&"00".repeat(48));
    assert_eq!(failed_ids(&real), ["tdx.mrtd"], "{real}");
    let mrtd = real.claims.tdx.as_ref().unwrap().mrtd.clone();
    let reason = &real.failures().next().unwrap().reason;
    assert!(
        reason.contains(&mrtd),
        "the failure names the MRTD: {reason}"
    );
    assert!(judge(&mrtd).passed());
}

/// The vector policy with the shipped `policy/reference-values.toml` applied, its `[tdx] mrtd`
/// list extended by `extra_mrtd` (the vectors carry no vTPM quote, so its PCR values are left
/// out: the vector policy has no `[tpm]` table).
fn policy_with_shipped_reference_values(extra_mrtd: Option<&str>) -> (LoadedPolicy, Vec<String>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/reference-values.toml");
    let mut values = ReferenceValues::from_bytes(&std::fs::read(path).unwrap()).unwrap();
    values.tpm = None;
    let shipped = values.tdx.as_ref().unwrap().mrtd.clone().unwrap();
    if let Some(mrtd) = extra_mrtd {
        let tdx = values.tdx.as_mut().unwrap();
        tdx.mrtd.as_mut().unwrap().push(mrtd.to_owned());
    }
    let text = VECTOR_POLICY.replacen(
        "platforms = ",
        "reference_values = \"reference-values.toml\"\nplatforms = ",
        1,
    );
    let values = toml::to_string(&values).unwrap();
    let policy = LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap();
    (policy, shipped)
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn tdx_quote_from_another_firmware_is_refused_by_the_shipped_mrtd_naming_it() {
    let Some(v) = vectors() else { return };
    let evidence = Evidence::from_bytes(&read(&v, "tdx/dcap-qvl/tdx_quote")).unwrap();
    let mut bundle = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    bundle.intel.push(IntelCollateral {
        fmspc: None,
        collateral: serde_json::from_slice(&read(&v, "tdx/dcap-qvl/tdx_quote_collateral.json"))
            .unwrap(),
    });
    let judge = |policy: &LoadedPolicy| {
        appraise(&AppraisalInput {
            evidence: &evidence,
            policy,
            collateral: Some(&bundle),
            now: datetime!(2025-07-19 10:00:34 UTC),
            clock_floor: None,
            gpu_ready_pending: false,
        })
    };
    // The shipped values list the MRTDs of the appliance's TDVF (scripts/tdvf-build.sh, in the
    // two orders a host may add its pages in), not the vector's firmware: the quote is refused
    // for its MRTD alone, and the failure names it.
    let (policy, shipped) = policy_with_shipped_reference_values(None);
    assert_eq!(shipped.len(), 2, "{shipped:?}");
    let refused = judge(&policy);
    assert_eq!(failed_ids(&refused), ["tdx.mrtd"], "{refused}");
    let mrtd = refused.claims.tdx.as_ref().unwrap().mrtd.clone();
    assert!(mrtd.starts_with("91eb2b44"));
    assert!(!shipped.contains(&mrtd));
    let reason = &refused.failures().next().unwrap().reason;
    assert!(
        reason.contains(&mrtd),
        "the failure names the MRTD: {reason}"
    );
    assert!(reason.contains("reference values"), "{reason}");
    // The same values with the quote's MRTD added accept it.
    let (policy, _) = policy_with_shipped_reference_values(Some(&mrtd));
    let accepted = judge(&policy);
    assert!(accepted.passed(), "{accepted}");
}
