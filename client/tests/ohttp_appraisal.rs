//! The client's checks on a gateway reached over Oblivious HTTP, each failure by name, on
//! evidence the simulated TEE signs here: the evidence must name the key configuration the
//! client seals to and answer the nonce sealed to it. `tests/ohttp_relay.rs` runs the attack of
//! a relay serving its own key against the real server.

use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::SimulatedSnp;
use inferno_attestation::runtime_data::{RuntimeData, ohttp_challenge_binding};
use inferno_client::ohttp::{GatewayObservation, appraise_gateway};
use inferno_client::policy::LoadedClientPolicy;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

const NONCE: &[u8] = &[7u8; 32];

fn development() -> LoadedClientPolicy {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/client-development.toml"),
    )
    .expect("client development policy");
    LoadedClientPolicy::from_bytes(text.as_bytes()).expect("client policy")
}

/// An encoded key configuration: key id, X25519, a public key of `key` bytes, one suite.
fn key_config(id: u8, key: u8) -> Vec<u8> {
    let mut config = vec![id, 0x00, 0x20];
    config.extend([key; 32]);
    config.extend([0, 4, 0, 1, 0, 1]);
    config
}

/// Fresh evidence of an instance whose gateway serves `served`, answering `nonce` sealed to
/// `sealed_to`.
fn observe(served: &[u8], sealed_to: &[u8], nonce: &[u8]) -> GatewayObservation {
    let tee = SimulatedSnp::new().expect("simulated TEE");
    let mut document = RuntimeData::new([0x22; 32], "inferno/test");
    document.model_digest = Some("11".repeat(32));
    document.ohttp_key_config_sha256 = Some(hex::encode(Sha256::digest(served)));
    document
        .set_challenge_bindings([ohttp_challenge_binding(
            nonce,
            sealed_to[0],
            &sealed_to[3..35],
        )])
        .expect("binding");
    GatewayObservation {
        key_config: sealed_to.to_vec(),
        nonce: NONCE.to_vec(),
        fresh_evidence: collect_evidence(&tee, &document).expect("evidence"),
    }
}

fn failed(observed: &GatewayObservation) -> Vec<String> {
    let report = appraise_gateway(observed, &development(), None, OffsetDateTime::now_utc());
    report.failures().map(|c| c.id.clone()).collect()
}

#[test]
fn the_attested_key_and_a_fresh_sealed_nonce_pass() {
    let config = key_config(3, 0x41);
    let observed = observe(&config, &config, NONCE);
    let report = appraise_gateway(&observed, &development(), None, OffsetDateTime::now_utc());
    assert!(report.trusted(), "{report}");
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        &ids[..3],
        ["evidence.appraisal", "ohttp.key_config", "ohttp.challenge"]
    );
}

#[test]
fn a_key_that_is_not_the_attested_one_fails_ohttp_key_config() {
    let attested = key_config(3, 0x41);
    let impostor = key_config(3, 0x42);
    // The instance attests its own key but answered a nonce sealed to the impostor's.
    assert_eq!(
        failed(&observe(&attested, &impostor, NONCE)),
        ["ohttp.key_config"]
    );
}

#[test]
fn evidence_for_another_nonce_or_key_id_fails_ohttp_challenge() {
    let config = key_config(3, 0x41);
    assert_eq!(
        failed(&observe(&config, &config, &[8u8; 32])),
        ["ohttp.challenge"]
    );
    let mut other_id = config.clone();
    let observed = observe(&config, &config, NONCE);
    other_id[0] = 4;
    let relabelled = GatewayObservation {
        key_config: other_id,
        ..observed
    };
    let failures = failed(&relabelled);
    assert!(
        failures.contains(&"ohttp.challenge".to_owned()),
        "{failures:?}"
    );
}
