//! TPM verifier against the shared real-world vectors (GCE vTPM, Azure SNP CVM vTPM) and
//! against broken copies of them.

use std::path::{Path, PathBuf};

use inferno_attestation::tpm::{
    self, AkKey, AkPublic, HashAlg, PcrBank, PcrValue, QuoteEvidence, Signature, TpmError,
    TpmEvidence, azure_hcl, eventlog::EventLog,
};

/// Folder of the shared vectors, or `None` (the test then skips loudly).
fn vectors(sub: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/attestation-vectors")
        .join(sub);
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: {} is absent", dir.display());
        None
    }
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

/// GCE evidence with the three quotes (SHA-1, SHA-256, SHA-384 banks) and the event log.
fn gce_evidence(dir: &Path) -> TpmEvidence {
    let quotes = [
        ("sha1", HashAlg::Sha1),
        ("sha256", HashAlg::Sha256),
        ("sha384", HashAlg::Sha384),
    ]
    .into_iter()
    .map(|(name, bank)| {
        let text = String::from_utf8(read(dir, &format!("quote_{name}.pcrs.txt"))).unwrap();
        QuoteEvidence {
            attest: read(dir, &format!("quote_{name}.tpms_attest.bin")),
            signature: read(dir, &format!("quote_{name}.tpmt_signature.bin")),
            pcrs: PcrBank::from_text(bank, &text).unwrap(),
        }
    })
    .collect();
    TpmEvidence {
        ak: AkPublic::TpmtPublic(read(dir, "ak_pub.tpmt_public.bin")),
        quotes,
        event_log: Some(read(dir, "event_log.bin")),
    }
}

const GCE_NONCE: [u8; 2] = [0x90, 0x09];

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_quotes_verify_and_event_log_replays() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let evidence = gce_evidence(&dir);
    let claims = tpm::verify(&evidence, &GCE_NONCE).expect("GCE evidence verifies");
    assert_eq!(claims.nonce, "9009");
    assert_eq!(claims.pcrs.len(), 3);
    let replay = claims.event_log.expect("event log replayed");
    let expected: Vec<u8> = (0..=9).chain(11..=16).chain([23]).collect();
    for bank in [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha384] {
        let reproduced = &replay.reproduced[&bank];
        for pcr in &expected {
            assert!(reproduced.contains(pcr), "{bank} PCR {pcr} not reproduced");
        }
        assert!(
            !reproduced.contains(&10),
            "PCR 10 (IMA) is not in the firmware log"
        );
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_ak_pem_and_tpmt_public_are_the_same_key() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let tpmt = tpm::parse_tpmt_public(&read(&dir, "ak_pub.tpmt_public.bin")).unwrap();
    let pem = String::from_utf8(read(&dir, "ak_pub.pem")).unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let from_pem = AkKey::from_spki_der(&block.contents).unwrap();
    assert_eq!(tpmt, from_pem);
    assert_eq!(from_pem.to_spki_der().unwrap(), block.contents);
    // The AK hash over the SPKI equals SHA-256 of the PEM's DER body.
    assert_eq!(
        tpmt.spki_sha256().unwrap().to_vec(),
        HashAlg::Sha256.digest(&block.contents)
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_wrong_nonce_is_rejected() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let err = tpm::verify(&gce_evidence(&dir), b"9009").unwrap_err();
    assert!(
        matches!(err, TpmError::NonceMismatch { index: 0, .. }),
        "{err}"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_flipped_signed_bit_is_rejected() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let mut evidence = gce_evidence(&dir);
    let last = evidence.quotes[1].attest.len() - 1;
    evidence.quotes[1].attest[last] ^= 0x01;
    let err = tpm::verify(&evidence, &GCE_NONCE).unwrap_err();
    assert!(matches!(err, TpmError::BadSignature { index: 1 }), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_altered_pcr_value_is_rejected() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let mut evidence = gce_evidence(&dir);
    evidence.quotes[2].pcrs.values[4].value[0] ^= 0x80;
    let err = tpm::verify(&evidence, &GCE_NONCE).unwrap_err();
    assert!(
        matches!(
            err,
            TpmError::PcrDigestMismatch {
                index: 2,
                bank: HashAlg::Sha384
            }
        ),
        "{err}"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_missing_pcr_value_is_rejected() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let mut evidence = gce_evidence(&dir);
    evidence.quotes[0].pcrs.values.retain(|v| v.index != 7);
    let err = tpm::verify(&evidence, &GCE_NONCE).unwrap_err();
    assert!(matches!(err, TpmError::PcrValue { pcr: 7, .. }), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_tampered_event_log_fails_replay() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let mut evidence = gce_evidence(&dir);
    let log = evidence.event_log.as_mut().unwrap();
    let parsed = EventLog::parse(log).unwrap();
    let target = parsed
        .events
        .iter()
        .find(|e| e.pcr == 4 && e.event_type != 3)
        .unwrap();
    let digest = &target.digests[&HashAlg::Sha256];
    let at = log
        .windows(digest.len())
        .position(|w| w == digest.as_slice())
        .unwrap();
    log[at] ^= 0x01;
    let err = tpm::verify(&evidence, &GCE_NONCE).unwrap_err();
    assert!(
        matches!(err, TpmError::ReplayMismatch { pcr: 4, .. }),
        "{err}"
    );
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn truncated_structures_name_the_field() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let attest = read(&dir, "quote_sha256.tpms_attest.bin");
    for len in 0..attest.len() {
        let err = tpm::Quote::parse(&attest[..len]).unwrap_err();
        assert!(
            matches!(err, TpmError::Truncated { .. }),
            "len {len}: {err}"
        );
    }
    let mut longer = attest.clone();
    longer.push(0);
    assert!(matches!(
        tpm::Quote::parse(&longer),
        Err(TpmError::TrailingBytes { count: 1, .. })
    ));
    let sig = read(&dir, "quote_sha256.tpmt_signature.bin");
    assert!(Signature::parse(&sig[..sig.len() - 1]).is_err());
    let log = read(&dir, "event_log.bin");
    assert!(EventLog::parse(&log[..log.len() - 3]).is_err());
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn evidence_round_trips_through_json() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let evidence = gce_evidence(&dir);
    let json = serde_json::to_string(&evidence).unwrap();
    let back: TpmEvidence = serde_json::from_str(&json).unwrap();
    assert_eq!(back, evidence);
}

/// The Azure quote JSON (`message`, `signature` hex, `pcrs` hex list).
#[derive(serde::Deserialize)]
struct AzureQuote {
    signature: String,
    message: String,
    pcrs: Vec<String>,
}

fn azure_evidence(dir: &Path, ak: &AkKey) -> TpmEvidence {
    let quote: AzureQuote =
        serde_json::from_slice(&read(dir, "trustee-original/tpm-quote-v1.json")).unwrap();
    let values = quote
        .pcrs
        .iter()
        .enumerate()
        .map(|(i, v)| PcrValue {
            index: u8::try_from(i).unwrap(),
            value: hex::decode(v).unwrap(),
        })
        .collect();
    let raw_sig = hex::decode(&quote.signature).unwrap();
    TpmEvidence {
        ak: AkPublic::SpkiDer(ak.to_spki_der().unwrap()),
        quotes: vec![QuoteEvidence {
            attest: hex::decode(&quote.message).unwrap(),
            signature: Signature::marshal_rsassa(HashAlg::Sha256, &raw_sig).unwrap(),
            pcrs: PcrBank {
                bank: HashAlg::Sha256,
                values,
            },
        }],
        event_log: None,
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_hcl_binds_the_ak_and_the_quote_verifies() {
    let Some(dir) = vectors("azure-snp-vtpm") else {
        return;
    };
    let hcl = azure_hcl::parse_and_bind(&read(&dir, "trustee-original/hcl-report.bin"))
        .expect("HCL binding holds");
    assert_eq!(
        hcl.snp_report,
        read(&dir, "derived/standalone/snp-report.bin")
    );
    assert_eq!(
        hcl.variable_data,
        read(&dir, "derived/standalone/hcl-var-data.json")
    );
    let claims = tpm::verify(&azure_evidence(&dir, &hcl.ak), b"challenge").expect("quote verifies");
    assert_eq!(claims.nonce, hex::encode(b"challenge"));
    assert!(!claims.ak_restricted, "a JWK carries no TPM attributes");
    assert_eq!(claims.pcrs[&HashAlg::Sha256].len(), 24);
    // The standalone attest matches the JSON message.
    let quote = tpm::Quote::parse(&read(&dir, "derived/standalone/tpm-quote-attest.bin")).unwrap();
    assert_eq!(quote.extra_data, b"challenge");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_hcl_with_altered_variable_data_is_rejected() {
    let Some(dir) = vectors("azure-snp-vtpm") else {
        return;
    };
    let mut report = read(&dir, "trustee-original/hcl-report.bin");
    let at = report.windows(8).position(|w| w == b"HCLAkPub").unwrap();
    report[at] = b'X';
    let err = azure_hcl::parse_and_bind(&report).unwrap_err();
    assert!(err.to_string().contains("REPORT_DATA"), "{err}");
    assert!(azure_hcl::parse_and_bind(&report[..1200]).is_err());
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_quote_with_the_wrong_ak_is_rejected() {
    let Some(dir) = vectors("azure-snp-vtpm") else {
        return;
    };
    let var = read(&dir, "derived/standalone/hcl-var-data.json");
    let json = String::from_utf8(var)
        .unwrap()
        .replace("HCLAkPub", "Other")
        .replace("HCLEkPub", "HCLAkPub");
    let ek = azure_hcl::ak_from_variable_data(json.as_bytes()).unwrap();
    let err = tpm::verify(&azure_evidence(&dir, &ek), b"challenge").unwrap_err();
    assert!(matches!(err, TpmError::BadSignature { index: 0 }), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_ak_hash_is_over_the_spki_and_attributes_are_enforced() {
    let Some(dir) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let claims = tpm::verify(&gce_evidence(&dir), &GCE_NONCE).unwrap();
    assert!(claims.ak_restricted);
    // The AK hash is over the DER SPKI, which the PEM file holds.
    let pem = String::from_utf8(read(&dir, "ak_pub.pem")).unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(
        claims.ak_spki_sha256,
        hex::encode(HashAlg::Sha256.digest(&block.contents))
    );
    // Clearing `restricted` (bit 16 of objectAttributes at offset 4) is refused, even though
    // the key itself, and so every signature, is unchanged.
    let mut evidence = gce_evidence(&dir);
    let AkPublic::TpmtPublic(bytes) = &mut evidence.ak else {
        unreachable!("GCE evidence carries a TPMT_PUBLIC");
    };
    bytes[5] &= !0x01;
    let err = tpm::verify(&evidence, &GCE_NONCE).unwrap_err();
    assert!(
        matches!(
            err,
            TpmError::AkAttributes {
                missing: "restricted",
                ..
            }
        ),
        "{err}"
    );
}

/// A certificate file in PEM or DER.
fn cert(dir: &Path, name: &str) -> Vec<u8> {
    let bytes = read(dir, name);
    if bytes.starts_with(b"-----BEGIN") {
        let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).unwrap();
        pem.contents
    } else {
        bytes
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn gce_ak_certificate_chains_to_the_ek_root() {
    let Some(dir) = vectors("tpm/go-tpm-tools") else {
        return;
    };
    let ak =
        tpm::parse_tpmt_public(&read(&dir, "gce-cos-85-nonce9009/ak_pub.tpmt_public.bin")).unwrap();
    let ak_cert = read(&dir, "gce-cos-85-nonce9009/ak_cert.der");
    let intermediate = cert(&dir, "gce-ek-ca/tpm_ek_intermediate_2.crt");
    let other_intermediate = cert(&dir, "gce-ek-ca/tpm_ek_intermediate_3.crt");
    let root = cert(&dir, "gce-ek-ca/tpm_ek_root_1.cer");
    let other_root = cert(&dir, "gce-ek-ca/gcp_ek_ak_ca_root.crt");
    let now = time::macros::datetime!(2024-01-01 0:00 UTC);

    let claims = tpm::verify_ak_certificate(
        &ak,
        &ak_cert,
        &[other_intermediate.clone(), intermediate.clone()],
        std::slice::from_ref(&root),
        now,
    )
    .expect("the AK certificate chains");
    assert_eq!(claims.chain.len(), 2);

    let without = tpm::verify_ak_certificate(
        &ak,
        &ak_cert,
        &[other_intermediate],
        std::slice::from_ref(&root),
        now,
    );
    assert!(matches!(without, Err(TpmError::AkCertificate(_))));
    let foreign = tpm::verify_ak_certificate(
        &ak,
        &ak_cert,
        std::slice::from_ref(&intermediate),
        &[other_root],
        now,
    );
    assert!(matches!(foreign, Err(TpmError::AkCertificate(_))));
    let early = tpm::verify_ak_certificate(
        &ak,
        &ak_cert,
        std::slice::from_ref(&intermediate),
        std::slice::from_ref(&root),
        time::macros::datetime!(2021-01-01 0:00 UTC),
    );
    assert!(matches!(early, Err(TpmError::AkCertificate(_))));
    let other_key = AkKey::Rsa {
        modulus: vec![0xc5; 256],
        exponent: 65_537,
    };
    let err = tpm::verify_ak_certificate(&other_key, &ak_cert, &[intermediate], &[root], now)
        .unwrap_err();
    assert!(err.to_string().contains("not the AK"), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn azure_quote_must_be_signed_by_the_hcl_ak() {
    let Some(dir) = vectors("azure-snp-vtpm") else {
        return;
    };
    let report = read(&dir, "trustee-original/hcl-report.bin");
    let hcl = azure_hcl::parse_and_bind(&report).unwrap();
    let bound =
        azure_hcl::verify_quote_with_hcl(&report, &azure_evidence(&dir, &hcl.ak), b"challenge")
            .expect("the quote is bound to the HCL report");
    assert_eq!(bound.tpm.nonce, hex::encode(b"challenge"));
    assert_eq!(bound.hcl.snp_report.len(), 1184);
    // Valid evidence signed by another AK (the GCE vector) is refused for this HCL report.
    let Some(gce) = vectors("tpm/go-tpm-tools/gce-cos-85-nonce9009") else {
        return;
    };
    let err =
        azure_hcl::verify_quote_with_hcl(&report, &gce_evidence(&gce), &GCE_NONCE).unwrap_err();
    assert!(err.to_string().contains("HCLAkPub"), "{err}");
}
