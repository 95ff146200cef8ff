//! Audit receipts (issue 9): an answered request's response names its request record's index and
//! leaf hash; `GET /v1/audit/proof?index=N` proves that record against the latest signed
//! checkpoint; `inferno audit receipt` checks the pair offline against the attested audit key and
//! rejects it after one byte of the proof or of the record changes.

mod server_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use inferno::model::EMBEDDED_MODEL_NAME as MODEL;
use inferno::server::receipt::{INDEX_HEADER, LEAF_HEADER, ProofResponse, ReceiptError, verify};
use inferno_audit::AuditConfig;
use reqwest::StatusCode;
use serde_json::json;
use server_support::{ALICE, BOB, Harness, base_config, runtime};

/// A server with an audit log in `dir` that signs a checkpoint after every record.
fn start(dir: &Path) -> Harness {
    let mut config = base_config();
    config.audit = Some(AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 1,
        ..AuditConfig::default()
    });
    Harness::start(config, true)
}

/// The attested audit key: the start-up runtime data's `audit_key` (hex Ed25519 public key).
fn audit_key(harness: &Harness) -> String {
    harness
        .app
        .attestation()
        .expect("attested")
        .startup()
        .runtime_data
        .audit_key
        .clone()
        .expect("the runtime data binds the audit key")
}

/// Sends one completion as `key`; returns the receipt headers (index, leaf hex).
async fn answered(harness: &Harness, key: &str) -> (u64, String) {
    let response = harness
        .post(
            "/v1/completions",
            key,
            &json!({"model": MODEL, "prompt": "receipt", "max_tokens": 2}),
        )
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .unwrap_or_else(|| panic!("{name} header missing"))
            .to_str()
            .expect("ASCII header")
            .to_owned()
    };
    let index = header(INDEX_HEADER).parse().expect("index is a number");
    let leaf = header(LEAF_HEADER);
    assert_eq!(leaf.len(), 64, "leaf hash in hex: {leaf}");
    (index, leaf)
}

/// Fetches the proof of `index` as `key`, retrying while no checkpoint covers it yet.
async fn proof(harness: &Harness, key: &str, index: u64) -> ProofResponse {
    for _ in 0..100 {
        let response = harness
            .client()
            .get(harness.url(&format!("/v1/audit/proof?index={index}")))
            .bearer_auth(key)
            .send()
            .await
            .expect("proof request");
        match response.status() {
            StatusCode::OK => return response.json().await.expect("proof JSON"),
            StatusCode::SERVICE_UNAVAILABLE => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("proof request answered {other}"),
        }
    }
    panic!("no checkpoint covered record {index}");
}

fn cli_receipt(file: &Path, key: &str, leaf: Option<&str>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inferno"));
    command
        .args(["audit", "receipt"])
        .arg(file)
        .args(["--key", key]);
    if let Some(leaf) = leaf {
        command.args(["--leaf", leaf]);
    }
    command.output().expect("inferno runs")
}

/// Flips one bit of the byte at `at` of a base64 text's decoded bytes.
fn flip_base64(text: &str, at: usize) -> String {
    let mut bytes = B64.decode(text).expect("base64");
    bytes[at] ^= 1;
    B64.encode(bytes)
}

#[test]
fn a_receipt_verifies_and_fails_after_one_byte_of_proof_or_record_changes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let harness = start(&tmp.path().join("audit"));
    let key = audit_key(&harness);
    let (receipt, leaf, bobs) = runtime().block_on(async {
        // A few records first, so that the proof has hashes in it.
        for _ in 0..3 {
            answered(&harness, BOB).await;
        }
        let (index, leaf) = answered(&harness, ALICE).await;
        let receipt = proof(&harness, ALICE, index).await;
        let bobs = proof(&harness, BOB, index).await;
        (receipt, leaf, bobs)
    });
    assert_eq!(receipt.leaf, leaf, "the proof is for the header's leaf");
    assert!(receipt.record.is_some(), "the caller gets its own record");
    assert!(
        bobs.record.is_none(),
        "another principal gets the proof but not the record"
    );

    let verified = verify(&receipt, &key, Some(&leaf)).expect("the receipt verifies");
    assert!(verified.record_checked);
    assert!(verified.checkpoint_size > verified.index);

    // The CLI, offline, on the receipt file.
    let file = tmp.path().join("receipt.json");
    std::fs::write(&file, serde_json::to_string(&receipt).unwrap()).unwrap();
    let ok = cli_receipt(&file, &key, Some(&leaf));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("receipt verified"));

    // One byte of a proof hash changed.
    let mut lines: Vec<String> = receipt.proof.lines().map(str::to_owned).collect();
    assert!(lines.len() > 4, "the proof has hashes: {}", receipt.proof);
    lines[4] = flip_base64(&lines[4], 0);
    let bad_proof = ProofResponse {
        proof: lines.join("\n") + "\n",
        ..receipt.clone()
    };
    assert!(matches!(
        verify(&bad_proof, &key, Some(&leaf)),
        Err(ReceiptError::Proof(_))
    ));
    std::fs::write(&file, serde_json::to_string(&bad_proof).unwrap()).unwrap();
    let rejected = cli_receipt(&file, &key, Some(&leaf));
    assert!(!rejected.status.success());
    let stderr = String::from_utf8_lossy(&rejected.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("inclusion proof"), "{stderr}");

    // One byte of the record changed.
    let bad_record = ProofResponse {
        record: receipt.record.as_deref().map(|r| flip_base64(r, 10)),
        ..receipt.clone()
    };
    assert_eq!(
        verify(&bad_record, &key, Some(&leaf)),
        Err(ReceiptError::Record)
    );

    // Another key, or a leaf other than the response's.
    let other_key = hex::encode([7u8; 32]);
    assert!(matches!(
        verify(&receipt, &other_key, None),
        Err(ReceiptError::Signature(_))
    ));
    assert!(matches!(
        verify(&receipt, &key, Some(&hex::encode([0u8; 32]))),
        Err(ReceiptError::Leaf { .. })
    ));
}

#[test]
fn the_proof_route_refuses_bad_indexes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let harness = start(&tmp.path().join("audit"));
    runtime().block_on(async {
        answered(&harness, ALICE).await;
        let get = |query: &'static str| {
            harness
                .client()
                .get(harness.url(&format!("/v1/audit/proof{query}")))
                .bearer_auth(ALICE)
                .send()
        };
        assert_eq!(get("").await.unwrap().status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            get("?index=x").await.unwrap().status(),
            StatusCode::BAD_REQUEST
        );
        // Far beyond the log: not covered by any checkpoint.
        let beyond = get("?index=999999").await.unwrap();
        assert_eq!(beyond.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = beyond.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("not covered"),
            "{body}"
        );
    });
}
