//! Azure SEV-SNP CVM evidence (HCL report + SNP report + vTPM quote, from
//! `../shared/attestation-vectors/azure-snp-vtpm/`) through the full appraisal: the vTPM quote
//! is verified on every path, with or without a runtime-data document, and `[tpm] required`
//! holds. Regression tests for issue 15 part 1: before the fix, evidence without a runtime-data
//! document skipped the quote entirely.
//!
//! Without `../shared` these tests are ignored (`cfg(shared_vectors)`, set by build.rs).

use std::path::PathBuf;

use inferno_attestation::appraise::{AppraisalInput, Expectations, appraise_with};
use inferno_attestation::evidence::{Base64Bytes, Evidence, SnpCert, SnpCertKind, SnpEvidence};
use inferno_attestation::policy::{LoadedPolicy, Platform};
use inferno_attestation::report::AppraisalReport;
use inferno_attestation::tpm::{
    AkPublic, HashAlg, PcrBank, PcrValue, QuoteEvidence, Signature, TpmEvidence, azure_hcl,
};
use time::macros::datetime;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/attestation-vectors")
}

fn read(rel: &str) -> Vec<u8> {
    let path = vectors().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Milan TCB 3,0,8,115 as the vector; `[tpm] required` set by the caller.
fn policy(tpm_required: bool, runtime_data_required: bool) -> LoadedPolicy {
    let text = format!(
        r#"
schema = 2
name = "azure-vector-test"
platforms = ["sev-snp"]
[time]
collateral_grace_seconds = 0
[runtime_data]
required = {runtime_data_required}
[sev_snp]
products = ["Milan"]
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
[tpm]
required = {tpm_required}
pcrs = [0, 1, 2, 3, 4, 5, 6, 7]
[gpu]
required = false
require_cc_mode = false
require_ready_state = false
[audit]
content = "none"
[auth]
require_api_key = false
"#
    );
    LoadedPolicy::from_bytes(text.as_bytes()).unwrap()
}

/// The vector's quote JSON (`message`, `signature` hex, `pcrs` hex list, index = PCR).
#[derive(serde::Deserialize)]
struct AzureQuote {
    signature: String,
    message: String,
    pcrs: Vec<String>,
}

/// The vTPM section: the quote signed by HCLAkPub, with the AK as a DER SPKI.
fn azure_tpm() -> TpmEvidence {
    let hcl = azure_hcl::parse_and_bind(&read("azure-snp-vtpm/trustee-original/hcl-report.bin"))
        .expect("HCL binding holds");
    let quote: AzureQuote =
        serde_json::from_slice(&read("azure-snp-vtpm/trustee-original/tpm-quote-v1.json")).unwrap();
    let values = quote
        .pcrs
        .iter()
        .enumerate()
        .map(|(i, v)| PcrValue {
            index: u8::try_from(i).unwrap(),
            value: hex::decode(v).unwrap(),
        })
        .collect();
    TpmEvidence {
        ak: AkPublic::SpkiDer(hcl.ak.to_spki_der().unwrap()),
        quotes: vec![QuoteEvidence {
            attest: hex::decode(&quote.message).unwrap(),
            signature: Signature::marshal_rsassa(
                HashAlg::Sha256,
                &hex::decode(&quote.signature).unwrap(),
            )
            .unwrap(),
            pcrs: PcrBank {
                bank: HashAlg::Sha256,
                values,
            },
        }],
        event_log: None,
    }
}

/// The GCE vTPM's SHA-256 quote: valid, but signed by another AK.
fn gce_tpm() -> TpmEvidence {
    let dir = vectors().join("tpm/go-tpm-tools/gce-cos-85-nonce9009");
    let file = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let text = String::from_utf8(file("quote_sha256.pcrs.txt")).unwrap();
    TpmEvidence {
        ak: AkPublic::TpmtPublic(file("ak_pub.tpmt_public.bin")),
        quotes: vec![QuoteEvidence {
            attest: file("quote_sha256.tpms_attest.bin"),
            signature: file("quote_sha256.tpmt_signature.bin"),
            pcrs: PcrBank::from_text(HashAlg::Sha256, &text).unwrap(),
        }],
        event_log: None,
    }
}

/// The whole Azure evidence, as a verifier receives it, without a runtime-data document.
fn azure_evidence() -> Evidence {
    let hcl = read("azure-snp-vtpm/trustee-original/hcl-report.bin");
    let vcek_pem = read("azure-snp-vtpm/trustee-original/vcek.pem");
    let vcek = inferno_attestation::pki::pem_blocks(&vcek_pem, "vcek.pem").unwrap()[0].clone();
    Evidence {
        version: 1,
        platform: Platform::SevSnp,
        runtime_data: None,
        sev_snp: Some(SnpEvidence {
            report: Base64Bytes(read("azure-snp-vtpm/derived/standalone/snp-report.bin")),
            certs: vec![SnpCert {
                kind: SnpCertKind::Vcek,
                der: Base64Bytes(vcek),
            }],
            hcl_report: Some(Base64Bytes(hcl)),
        }),
        tdx: None,
        tpm: Some(azure_tpm()),
        gpu: None,
    }
}

fn judge(evidence: &Evidence, policy: &LoadedPolicy, nonce: Option<&[u8]>) -> AppraisalReport {
    appraise_with(
        &AppraisalInput {
            evidence,
            policy,
            collateral: None,
            now: datetime!(2024-01-01 0:00 UTC),
            clock_floor: None,
            gpu_ready_pending: false,
        },
        &Expectations {
            nonce,
            tls_exporter: None,
            no_freshness: false,
        },
    )
}

fn failed(r: &AppraisalReport) -> Vec<String> {
    r.failures().map(|c| c.id.clone()).collect()
}

fn reason<'r>(r: &'r AppraisalReport, id: &str) -> &'r str {
    r.checks
        .iter()
        .find(|c| c.id == id)
        .map(|c| c.reason.as_str())
        .unwrap_or_else(|| panic!("no check {id} in {r}"))
}

fn assert_quote_checked(r: &AppraisalReport) {
    for id in ["snp.hcl_binding", "snp.report_signature", "tpm.required"] {
        assert!(
            r.checks.iter().any(|c| c.id == id && c.passed),
            "{id} should pass: {r}"
        );
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_evidence_passes_with_its_quote_verified() {
    let r = judge(&azure_evidence(), &policy(true, false), None);
    assert!(r.passed(), "{r}");
    assert_quote_checked(&r);
    assert!(reason(&r, "tpm.quote").contains("AK signature"), "{r}");
    assert!(reason(&r, "tpm.ak_binding").contains("HCLAkPub"), "{r}");
    assert!(reason(&r, "tpm.nonce").contains("bound to nothing"), "{r}");
    let tpm = r.claims.tpm.as_ref().expect("vTPM claims");
    assert_eq!(tpm.nonce, hex::encode(b"challenge"));
    // The verifier's own challenge, when it names one, is checked.
    let r = judge(&azure_evidence(), &policy(true, false), Some(b"challenge"));
    assert!(r.passed(), "{r}");
    let r = judge(&azure_evidence(), &policy(true, false), Some(b"other"));
    assert_eq!(failed(&r), ["tpm.nonce"], "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_quote_with_a_flipped_signature_byte_is_rejected() {
    let mut evidence = azure_evidence();
    let sig = &mut evidence.tpm.as_mut().unwrap().quotes[0].signature;
    let last = sig.len() - 1;
    sig[last] ^= 0x01;
    for tpm_required in [true, false] {
        let r = judge(&evidence, &policy(tpm_required, false), None);
        assert_eq!(failed(&r), ["tpm.quote"], "{r}");
        assert!(reason(&r, "tpm.quote").contains("signature"), "{r}");
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_quote_with_a_flipped_pcr_value_is_rejected() {
    let mut evidence = azure_evidence();
    evidence.tpm.as_mut().unwrap().quotes[0].pcrs.values[4].value[0] ^= 0x01;
    let r = judge(&evidence, &policy(true, false), None);
    assert_eq!(failed(&r), ["tpm.quote"], "{r}");
    assert!(reason(&r, "tpm.quote").contains("PCR"), "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_evidence_without_a_quote_fails_when_the_policy_requires_a_vtpm() {
    let mut evidence = azure_evidence();
    evidence.tpm = None;
    let r = judge(&evidence, &policy(true, false), None);
    assert_eq!(failed(&r), ["tpm.required"], "{r}");
    // Not required: the SNP and HCL evidence stand on their own.
    let r = judge(&evidence, &policy(false, false), None);
    assert!(r.passed(), "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_evidence_with_a_quote_signed_by_another_key_is_rejected() {
    // A valid quote from another vTPM (the GCE vector), under its own AK.
    let mut evidence = azure_evidence();
    evidence.tpm = Some(gce_tpm());
    let r = judge(&evidence, &policy(true, false), None);
    assert!(failed(&r).contains(&"tpm.ak_binding".to_owned()), "{r}");
    assert!(reason(&r, "tpm.ak_binding").contains("not by the HCL report's HCLAkPub"));
    assert!(!r.passed());
    // The Azure quote claimed under the other vTPM's AK: the signature does not verify.
    let mut evidence = azure_evidence();
    evidence.tpm.as_mut().unwrap().ak = gce_tpm().ak;
    let r = judge(&evidence, &policy(true, false), None);
    assert!(failed(&r).contains(&"tpm.quote".to_owned()), "{r}");
    assert!(failed(&r).contains(&"tpm.ak_binding".to_owned()), "{r}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_evidence_without_runtime_data_fails_a_policy_that_requires_it() {
    let r = judge(&azure_evidence(), &policy(true, true), None);
    assert!(
        failed(&r).contains(&"runtime_data.binding".to_owned()),
        "{r}"
    );
    assert!(!r.passed());
}
