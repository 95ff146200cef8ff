//! End to end against a real software TPM: starts `swtpm` (Debian package `swtpm`), extends a
//! PCR, collects a quote through tss-esapi and verifies it. Skips loudly without `swtpm`.
#![cfg(feature = "tpm-collect")]

mod swtpm_support;

use inferno_attestation::tpm::{self, HashAlg, TpmError, collect};
use swtpm_support::{free_port_pair, start_swtpm, tcti};
use tss_esapi::handles::PcrHandle;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::structures::{Digest, DigestValues};

/// Extends PCR 16 with a known SHA-256 digest through tss-esapi.
fn extend_pcr16(tcti: &str) {
    let conf = tcti.parse().expect("TCTI");
    let mut ctx = tss_esapi::Context::new(conf).expect("open swtpm");
    let mut digests = DigestValues::new();
    digests.set(
        HashingAlgorithm::Sha256,
        Digest::try_from(vec![0x5a; 32]).expect("digest"),
    );
    ctx.execute_with_nullauth_session(|c| c.pcr_extend(PcrHandle::Pcr16, digests))
        .expect("extend PCR 16");
}

#[test]
fn swtpm_quote_round_trip() {
    let Some(tpm) = start_swtpm() else { return };
    let tcti = tcti(&tpm);
    extend_pcr16(&tcti);
    let nonce = b"inferno swtpm nonce";
    let pcrs: Vec<u8> = (0..24).collect();
    let banks = [HashAlg::Sha256, HashAlg::Sha1];
    let request = collect::QuoteRequest {
        tcti: &tcti,
        ak_handle: None,
        ak_kind: collect::AkKind::Rsa2048,
        banks: &banks,
        pcrs: &pcrs,
        nonce,
        event_log: None,
    };
    let evidence = collect::collect(&request).expect("collect from swtpm");
    assert_eq!(evidence.quotes.len(), 2);

    let claims = tpm::verify(&evidence, nonce).expect("swtpm evidence verifies");
    // PCR 16 = SHA-256(zeros ‖ 0x5a*32).
    let mut input = vec![0u8; 32];
    input.extend_from_slice(&[0x5a; 32]);
    assert_eq!(
        claims.pcrs[&HashAlg::Sha256][&16],
        hex::encode(HashAlg::Sha256.digest(&input))
    );
    assert_eq!(claims.pcrs[&HashAlg::Sha256].len(), 24);

    // The template AK is stable: a second collection yields the same AK hash.
    let again = collect::collect(&request).expect("second collection");
    let claims_again = tpm::verify(&again, nonce).expect("second verification");
    assert_eq!(claims.ak_spki_sha256, claims_again.ak_spki_sha256);
    assert!(claims.ak_restricted);

    // A replayed quote does not pass for another nonce.
    let err = tpm::verify(&evidence, b"another nonce").unwrap_err();
    assert!(matches!(err, TpmError::NonceMismatch { .. }), "{err}");

    // A PCR value changed after the quote breaks the PCR digest.
    let mut forged = evidence.clone();
    let value = forged.quotes[0]
        .pcrs
        .values
        .iter_mut()
        .find(|v| v.index == 16)
        .expect("PCR 16 collected");
    value.value[0] ^= 1;
    let err = tpm::verify(&forged, nonce).unwrap_err();
    assert!(
        matches!(err, TpmError::PcrDigestMismatch { index: 0, .. }),
        "{err}"
    );
}

#[test]
fn swtpm_ecdsa_p256_quote_verifies() {
    let Some(tpm) = start_swtpm() else { return };
    let tcti = tcti(&tpm);
    let nonce = b"ecdsa nonce";
    let request = collect::QuoteRequest {
        tcti: &tcti,
        ak_handle: None,
        ak_kind: collect::AkKind::EccP256,
        banks: &[HashAlg::Sha256, HashAlg::Sha384],
        pcrs: &[0, 1, 2, 3, 4, 5, 6, 7],
        nonce,
        event_log: None,
    };
    let evidence = collect::collect(&request).expect("collect an ECDSA quote");
    let sig = tpm::Signature::parse(&evidence.quotes[0].signature).expect("TPMT_SIGNATURE");
    assert!(matches!(sig, tpm::Signature::Ecdsa { .. }), "{sig:?}");
    let claims = tpm::verify(&evidence, nonce).expect("ECDSA evidence verifies");
    assert!(claims.ak_restricted);
    assert_eq!(claims.pcrs[&HashAlg::Sha384].len(), 8);
    let mut broken = evidence.clone();
    let last = broken.quotes[1].signature.len() - 1;
    broken.quotes[1].signature[last] ^= 1;
    let err = tpm::verify(&broken, nonce).unwrap_err();
    assert!(matches!(err, TpmError::BadSignature { index: 1 }), "{err}");
}

#[test]
fn swtpm_unreachable_is_a_clean_error() {
    let port = free_port_pair();
    let tcti = format!("swtpm:host=127.0.0.1,port={port}");
    let request = collect::QuoteRequest {
        tcti: &tcti,
        ak_handle: None,
        ak_kind: collect::AkKind::Rsa2048,
        banks: &[HashAlg::Sha256],
        pcrs: &[0],
        nonce: b"n",
        event_log: None,
    };
    let err = collect::collect(&request).unwrap_err();
    assert!(matches!(err, TpmError::Collect(_)), "{err}");
}

/// Extends `pcr` with a SHA-256 digest through tss-esapi.
fn extend(tcti: &str, pcr: PcrHandle, digest: [u8; 32]) {
    let conf = tcti.parse().expect("TCTI");
    let mut ctx = tss_esapi::Context::new(conf).expect("open swtpm");
    let mut digests = DigestValues::new();
    digests.set(
        HashingAlgorithm::Sha256,
        Digest::try_from(digest.to_vec()).expect("digest"),
    );
    ctx.execute_with_nullauth_session(|c| c.pcr_extend(pcr, digests))
        .expect("extend");
}

/// A crypto-agile TCG event log (SHA-256 bank) of EV_IPL events `(pcr, digest)`.
fn event_log(events: &[(u8, [u8; 32])]) -> Vec<u8> {
    const TPM_ALG_SHA256: u16 = 0x000b;
    let mut spec = b"Spec ID Event03\0".to_vec();
    spec.extend_from_slice(&0u32.to_le_bytes()); // platformClass
    spec.extend_from_slice(&[0, 2, 0, 2]); // version 2.0, errata 0, uintnSize 2 (64-bit)
    spec.extend_from_slice(&1u32.to_le_bytes());
    spec.extend_from_slice(&TPM_ALG_SHA256.to_le_bytes());
    spec.extend_from_slice(&32u16.to_le_bytes());
    spec.push(0); // vendorInfoSize
    let mut log = Vec::new();
    log.extend_from_slice(&0u32.to_le_bytes()); // PCR 0
    log.extend_from_slice(&3u32.to_le_bytes()); // EV_NO_ACTION
    log.extend_from_slice(&[0; 20]);
    log.extend_from_slice(&u32::try_from(spec.len()).unwrap().to_le_bytes());
    log.extend_from_slice(&spec);
    for (pcr, digest) in events {
        log.extend_from_slice(&u32::from(*pcr).to_le_bytes());
        log.extend_from_slice(&0x0000_000du32.to_le_bytes()); // EV_IPL
        log.extend_from_slice(&1u32.to_le_bytes());
        log.extend_from_slice(&TPM_ALG_SHA256.to_le_bytes());
        log.extend_from_slice(digest);
        log.extend_from_slice(&0u32.to_le_bytes());
    }
    log
}

/// A firmware event log records systemd-stub's PCR 11 measurements but not the boot phases
/// systemd-pcrphase extends later: PCR 11 then need not replay (its value is pinned by the
/// policy's reference values instead), while a firmware PCR such as 4 still must.
#[test]
fn pcr_11_extended_after_the_firmware_log_is_unaccounted_but_pcr_4_must_replay() {
    let Some(tpm) = start_swtpm() else { return };
    let tcti = tcti(&tpm);
    extend(&tcti, PcrHandle::Pcr4, [0x44; 32]);
    extend(&tcti, PcrHandle::Pcr4, [0x45; 32]);
    extend(&tcti, PcrHandle::Pcr11, [0x11; 32]);
    extend(&tcti, PcrHandle::Pcr11, [0x12; 32]);
    let nonce = b"os-extended pcrs";
    let mut evidence = collect::collect(&collect::QuoteRequest {
        tcti: &tcti,
        ak_handle: None,
        ak_kind: collect::AkKind::Rsa2048,
        banks: &[HashAlg::Sha256],
        pcrs: &[4, 11],
        nonce,
        event_log: None,
    })
    .expect("collect from swtpm");

    // The log has both PCR 4 events and only the first PCR 11 event.
    evidence.event_log = Some(event_log(&[
        (4, [0x44; 32]),
        (4, [0x45; 32]),
        (11, [0x11; 32]),
    ]));
    let claims = tpm::verify(&evidence, nonce).expect("verifies");
    let replay = claims.event_log.expect("event log replayed");
    assert!(replay.reproduced[&HashAlg::Sha256].contains(&4));
    assert!(replay.unaccounted[&HashAlg::Sha256].contains(&11));

    // A PCR 4 event missing from the log is a replay mismatch.
    evidence.event_log = Some(event_log(&[(4, [0x44; 32]), (11, [0x11; 32])]));
    let err = tpm::verify(&evidence, nonce).unwrap_err();
    assert!(
        matches!(err, TpmError::ReplayMismatch { pcr: 4, .. }),
        "{err}"
    );
}
