//! The client chain of trust against the real server (`inferno serve`, simulated TEE, embedded
//! model, CPU backend) under `policy/client-development.toml`: `inferno verify`, the
//! `inferno-client` library and `inferno proxy`, and the attacks they must reject, each naming
//! the failing check. The relays are real TCP/TLS programs on loopback.

mod proxy_support;
mod spawn_support;
mod trust_support;

use proxy_support::development_policy;
use trust_support::{
    Impostor, Relay, RelayMode, Served, development_client, inferno, runtime, verify_json,
};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use inferno_client::{Observation, TrustReport};

const CHECKS: [&str; 10] = [
    "tls.certificate_evidence",
    "evidence.appraisal",
    "tls.spki",
    "fresh.challenge",
    "fresh.same_instance",
    "policy.server_policy_digest",
    "policy.model_digest",
    "policy.measurement",
    "policy.min_tcb",
    "policy.gpu",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The failed checks' names.
fn failed(report: &TrustReport) -> Vec<&str> {
    report.failures().map(|c| c.id.as_str()).collect()
}

/// A client policy: the development one with `extra` top-level keys.
fn policy_with(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let base = std::fs::read_to_string(development_policy()).expect("policy");
    let text = base.replacen(
        "accept_simulated = true\n",
        &format!("accept_simulated = true\n{extra}\n"),
        1,
    );
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write policy");
    path
}

fn failed_json(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn verify_trusts_the_simulated_server_and_names_every_check() {
    let served = Served::start();
    let out = inferno(&[
        "verify",
        &served.base,
        "--policy",
        development_policy().to_str().expect("utf8"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("verdict: TRUSTED (SIMULATED TEE"), "{text}");
    for check in CHECKS {
        assert!(
            text.contains(&format!("[pass] {check}: ")),
            "{check} missing:\n{text}"
        );
    }

    let (code, report) = verify_json(&served.base, &development_policy());
    assert_eq!(code, 0);
    assert_eq!(report["verdict"], "pass");
    assert_eq!(report["simulated"], true);
    let ids: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| c["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, CHECKS);
    assert_eq!(
        report["measurement"].as_str().expect("measurement").len(),
        96
    );
    assert_eq!(report["model_digest"].as_str().expect("model").len(), 64);
}

#[test]
fn verify_rejects_a_wrong_measurement_server_policy_or_model_naming_the_check() {
    let served = Served::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, trusted) = verify_json(&served.base, &development_policy());
    let server_policy = trusted["server_policy_sha256"]
        .as_str()
        .expect("policy digest");
    let model = trusted["model_digest"].as_str().expect("model digest");
    let measurement = trusted["measurement"].as_str().expect("measurement");

    let cases = [
        (
            "measurement.toml",
            format!("measurements = [\"{}\"]", "ab".repeat(48)),
            "policy.measurement",
        ),
        (
            "server-policy.toml",
            format!("server_policy_sha256 = [\"{}\"]", "cd".repeat(32)),
            "policy.server_policy_digest",
        ),
        (
            "model.toml",
            format!("model_digests = [\"{}\"]", "ef".repeat(32)),
            "policy.model_digest",
        ),
    ];
    for (name, extra, check) in cases {
        let policy = policy_with(dir.path(), name, &extra);
        let (code, report) = verify_json(&served.base, &policy);
        assert_eq!(code, 1, "{check}: {report}");
        assert_eq!(report["verdict"], "reject");
        assert_eq!(failed_json(&report), [check], "{report}");
        let text = inferno(&[
            "verify",
            &served.base,
            "--policy",
            policy.to_str().expect("utf8"),
        ]);
        assert_eq!(text.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&text.stdout).contains(&format!("[FAIL] {check}: ")),
            "{}",
            String::from_utf8_lossy(&text.stdout)
        );
    }

    // The right values pass as allow-lists.
    let pinned = policy_with(
        dir.path(),
        "pinned.toml",
        &format!(
            "measurements = [\"{measurement}\"]\nserver_policy_sha256 = [\"{server_policy}\"]\nmodel_digests = [\"{model}\"]"
        ),
    );
    let (code, report) = verify_json(&served.base, &pinned);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn verify_reports_bad_input_on_one_line() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "verify",
                "https://127.0.0.1:9",
                "--policy",
                "/nonexistent/policy.toml",
            ],
            "cannot read client policy",
        ),
        (
            &[
                "verify",
                "http://127.0.0.1:9",
                "--policy",
                "policy/client-development.toml",
            ],
            "scheme must be https",
        ),
        (
            &[
                "verify",
                "https://127.0.0.1",
                "--policy",
                "policy/client-development.toml",
            ],
            "port is required",
        ),
        (
            &[
                "verify",
                "https://127.0.0.1:9",
                "--policy",
                "policy/development.toml",
            ],
            "client policy",
        ),
    ];
    for (args, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(args)
            .current_dir(repo())
            .output()
            .expect("runs inferno");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty());
    }
    // Nothing listens on port 9: an unreachable server is an error, not a verdict.
    let out = inferno(&[
        "verify",
        "https://127.0.0.1:9",
        "--policy",
        development_policy().to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn replayed_evidence_and_replayed_nonces_are_refused() {
    let served = Served::start();
    let rt = runtime();
    let client = development_client();
    let target = served.target();
    let nonce: [u8; 32] = rand::random();
    let (first, _a) = rt
        .block_on(client.exchange(&target, &nonce))
        .expect("first exchange");
    let (second, _b) = rt
        .block_on(client.exchange(&target, &rand::random::<[u8; 32]>()))
        .expect("second exchange");
    assert!(
        client.appraise(&first).trusted(),
        "{}",
        client.appraise(&first)
    );
    assert!(client.appraise(&second).trusted());

    // Fresh evidence from another connection, replayed on this one.
    let replayed = Observation {
        fresh_evidence: first.fresh_evidence.clone(),
        ..second.clone()
    };
    let report = client.appraise(&replayed);
    assert_eq!(failed(&report), ["fresh.challenge"], "{report}");
    assert!(
        report
            .failure_summary()
            .contains("another connection or another nonce")
    );

    // An answer to an earlier nonce, on the connection it was produced for.
    let old_nonce = Observation {
        nonce: rand::random::<[u8; 32]>().to_vec(),
        ..first.clone()
    };
    assert_eq!(failed(&client.appraise(&old_nonce)), ["fresh.challenge"]);

    // The server refuses a nonce it has answered before.
    let Err(err) = rt.block_on(client.exchange(&target, &nonce)) else {
        panic!("a replayed nonce is refused");
    };
    let message = err.to_string();
    assert!(message.contains("HTTP 400"), "{message}");

    // Another certificate (a plain self-signed one) on this connection.
    let plain = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let swapped = Observation {
        certificate: plain.cert.der().to_vec(),
        ..first
    };
    let report = client.appraise(&swapped);
    let failures = failed(&report);
    assert!(
        failures.contains(&"tls.certificate_evidence"),
        "{failures:?}"
    );
    assert!(failures.contains(&"tls.spki"), "{failures:?}");
}

#[test]
fn relays_that_terminate_tls_are_rejected_and_a_plain_tcp_relay_is_not() {
    let served = Served::start();
    let rt = runtime();
    let policy = development_policy();

    // A TCP relay that only moves bytes: the TLS session is still the server's.
    let relay = rt.block_on(Relay::start(served.addr(), RelayMode::Pass, None));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 0, "{report}");

    // A relay that terminates TLS with its own key and a certificate carrying the server's
    // evidence extension, and forwards the client's bytes over its own TLS session.
    let impostor = rt.block_on(Impostor::new(&served));
    let relay = rt.block_on(Relay::start(
        served.addr(),
        RelayMode::Terminate,
        Some(Arc::new(impostor)),
    ));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 1, "{report}");
    let failures = failed_json(&report);
    assert!(failures.contains(&"tls.spki".to_owned()), "{report}");
    assert!(failures.contains(&"fresh.challenge".to_owned()), "{report}");
    assert!(
        !failures.contains(&"tls.certificate_evidence".to_owned()),
        "{report}"
    );

    // A relay that answers the attestation request with fresh evidence it obtained over
    // another connection (for the same nonce it is asked, as a relay could).
    let impostor = rt.block_on(Impostor::new(&served));
    let relay = rt.block_on(Relay::start(
        served.addr(),
        RelayMode::Replay,
        Some(Arc::new(impostor)),
    ));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 1, "{report}");
    assert!(
        failed_json(&report).contains(&"fresh.challenge".to_owned()),
        "{report}"
    );
}
