//! The model key sealed to a TPM under a PCR policy (issue 10), against a real software TPM
//! (swtpm): it unseals while the PCRs match and not after one is extended, not on another TPM,
//! and `inferno seal --tpm-seal` + `inferno serve` with `[model.key] source = "tpm"` serve the
//! sealed model, then refuse it (one line, exit 1, audit record) once a PCR moved.
//!
//! Without swtpm these tests skip loudly, except under CI (`CI` set), where they fail.

mod sealed_serve_support;
#[path = "../attestation/tests/swtpm_support/mod.rs"]
mod swtpm_support;

use sealed_serve_support::{
    dev_config, inferno, key_releases, refused_serve, serve_args, spawn_until_listening, terminate,
};
use std::path::Path;
use std::str::FromStr as _;

use inferno::model::ModelDigest;
use inferno::seal::ModelKey;
use inferno::seal::tpm::{TpmSealError, TpmSealedKey, seal_key, unseal_key};
use tss_esapi::Context;
use tss_esapi::handles::PcrHandle;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::structures::{Digest, DigestValues};
use tss_esapi::tcti_ldr::TctiNameConf;

/// Extends PCR 16 (the debug PCR, extendable at locality 0) of the TPM behind `tcti`.
fn extend_pcr16(tcti: &str) {
    let mut ctx = Context::new(TctiNameConf::from_str(tcti).unwrap()).unwrap();
    let mut values = DigestValues::new();
    values.set(
        HashingAlgorithm::Sha256,
        Digest::try_from(vec![0x5a; 32]).unwrap(),
    );
    ctx.execute_with_nullauth_session(|c| c.pcr_extend(PcrHandle::Pcr16, values))
        .unwrap();
}

#[test]
fn the_key_unseals_with_matching_pcrs_only_and_only_on_its_tpm() {
    let Some(tpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let tcti = swtpm_support::tcti(&tpm);
    let key = ModelKey::generate().unwrap();
    let blob = seal_key(&tcti, &key, &[0, 7, 16]).expect("sealing works");
    assert_eq!(blob.key_id, key.id());
    assert_eq!(blob.pcrs.len(), 3);

    // Through the file (0600), as `inferno seal --tpm-seal` writes it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.tpm.json");
    blob.write(&path).unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let read = TpmSealedKey::read(&path).unwrap();
    assert_eq!(read, blob);
    // Twice: unsealing changes nothing.
    for _ in 0..2 {
        let unsealed = unseal_key(&tcti, &read).expect("unseals with the PCRs unchanged");
        assert_eq!(unsealed.id(), key.id());
    }

    // Another TPM cannot load the blob.
    let Some(other) = swtpm_support::start_swtpm() else {
        return;
    };
    let err = unseal_key(&swtpm_support::tcti(&other), &blob).unwrap_err();
    assert!(err.to_string().contains("TPM2_Load"), "{err}");

    // After a PCR of the policy moved, the TPM refuses, and the error names the PCR.
    extend_pcr16(&tcti);
    let err = unseal_key(&tcti, &blob).unwrap_err();
    assert!(
        matches!(&err, TpmSealError::PcrMismatch { changed } if changed == "16"),
        "{err}"
    );
    // The TPM enforces the policy, not the recorded values: a blob whose recorded PCR values
    // were rewritten to today's still does not unseal.
    let mut doctored = blob.clone();
    let now = seal_key(&tcti, &ModelKey::generate().unwrap(), &[0, 7, 16]).unwrap();
    doctored.pcrs = now.pcrs;
    let err = unseal_key(&tcti, &doctored).unwrap_err();
    assert!(err.to_string().contains("TPM2_Unseal"), "{err}");
}

#[test]
fn serve_a_model_sealed_to_the_tpm_and_refuse_it_after_a_pcr_extend() {
    let Some(tpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let tcti = swtpm_support::tcti(&tpm);
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let plain = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inferno-tiny");
    let sealed = w.join("sealed");
    let blob = w.join("model.tpm.json");
    let (code, stdout, stderr) = inferno(&[
        "seal",
        "--model",
        plain.to_str().unwrap(),
        "--out",
        sealed.to_str().unwrap(),
        "--tpm-seal",
        blob.to_str().unwrap(),
        "--tpm-tcti",
        &tcti,
        "--tpm-pcrs",
        "0,16",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("sealed to TPM"), "{stdout}");
    let key_source = format!(
        "[model.key]\nsource = \"tpm\"\nblob = \"{}\"\ntcti = \"{tcti}\"\n",
        blob.display()
    );

    let run1 = w.join("run1");
    std::fs::create_dir(&run1).unwrap();
    let config = dev_config(&run1, &key_source);
    let (child, banner) = spawn_until_listening(&serve_args(&sealed, &config));
    assert!(
        banner.contains(&ModelDigest::of_dir(&plain).unwrap().hex),
        "{banner}"
    );
    terminate(child);
    let releases = key_releases(&run1.join("audit"));
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(
        releases[0].0 && releases[0].1.contains("TPM"),
        "{releases:?}"
    );

    extend_pcr16(&tcti);
    let run2 = w.join("run2");
    std::fs::create_dir(&run2).unwrap();
    let config = dev_config(&run2, &key_source);
    let (error, stderr, _) = refused_serve(&serve_args(&sealed, &config), &run2.join("audit"));
    assert!(
        error.contains("sealed model refused") && error.contains("changed since sealing: 16"),
        "{stderr}"
    );
}
