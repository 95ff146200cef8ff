//! `inferno audit` end to end, through the built binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use inferno_audit::merkle::{verify_consistency, verify_inclusion};
use inferno_audit::note::SignedNote;
use inferno_audit::{
    AuditConfig, AuditLog, CompletionRecord, RecordBody, RequestRecord, StartInfo, StdFileOps,
};
use inferno_audit::{ConsistencyProof, InclusionProof};
use inferno_audit::{ContentMode, ContentPolicy};

fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .arg("audit")
        .args(args)
        .output()
        .expect("runs inferno")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Writes a log with `n` requests (request `req-0` has no completion) using content mode `mode`.
fn write_log(dir: &Path, n: usize, segment_max_bytes: u64, content: Option<&ContentPolicy>) {
    let cfg = AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 7,
        checkpoint_every_seconds: 0,
        segment_max_bytes,
        ..AuditConfig::default()
    };
    let signer = AuditLog::generate_signer(&cfg).expect("signer");
    let start = StartInfo {
        software_version: "cli-test".into(),
        evidence: Vec::new(),
    };
    let log = AuditLog::open(&cfg, Arc::new(StdFileOps), signer, start).expect("opens");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let none = ContentPolicy::none();
    let policy = content.unwrap_or(&none);
    rt.block_on(async {
        for i in 0..n {
            let id = format!("req-{i}");
            let prompt = policy
                .seal("prompt", &id, &format!("prompt {i}"))
                .expect("seal");
            log.append(RecordBody::Request(RequestRecord {
                request_id: id.clone(),
                client_request_id: None,
                principal: format!("key-{}", i % 2),
                endpoint: "/v1/completions".into(),
                model_digest: "sha256:ab".into(),
                stream: i % 2 == 0,
                prompt,
                status: None,
                constraint: None,
                transport: None,
            }))
            .await
            .expect("append");
            if i > 0 {
                let completion = policy.seal("completion", &id, "an answer").expect("seal");
                log.append(RecordBody::Completion(CompletionRecord {
                    request_id: id,
                    prompt_tokens: 4,
                    completion_tokens: 9,
                    finish_reason: Some("stop".into()),
                    status: 200,
                    latency_ms: 30,
                    completion,
                }))
                .await
                .expect("append");
            }
        }
        log.shutdown("cli test").await.expect("shutdown");
    });
}

#[test]
fn verify_reports_intact_violation_and_usage_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    write_log(&dir, 5, 1 << 20, None);
    let d = dir.to_str().expect("utf8");
    let ok = inferno(&["verify", d]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    let out = stdout(&ok);
    assert!(out.starts_with("INTACT: 11 records"), "{out}");
    assert!(
        out.contains("incomplete: request req-0 has no completion record"),
        "{out}"
    );

    // Flip one byte in the middle of the segment.
    let seg = dir.join("0000000000000000.seg");
    let mut bytes = std::fs::read(&seg).expect("read");
    let pos = bytes.len() / 2;
    bytes[pos] ^= 0x01;
    std::fs::write(&seg, &bytes).expect("write");
    let bad = inferno(&["verify", d]);
    assert_eq!(bad.status.code(), Some(1));
    let line = stdout(&bad);
    assert!(line.starts_with("VIOLATION: record "), "{line}");
    assert!(line.contains("0000000000000000.seg offset "), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");

    assert_eq!(
        inferno(&["verify", "/nonexistent/log"]).status.code(),
        Some(2)
    );
    assert_eq!(inferno(&["verify"]).status.code(), Some(2));
    assert_eq!(
        inferno(&["verify", d, "--policy", "p"]).status.code(),
        Some(2)
    );
}

#[test]
fn verify_calls_a_directory_without_a_log_a_violation() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    write_log(&dir, 2, 1 << 20, None);
    // A copy whose segments and checkpoints were deleted.
    let wiped = tmp.path().join("wiped");
    std::fs::create_dir(&wiped).expect("mkdir");
    for entry in std::fs::read_dir(&dir).expect("dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        let ext = path.extension().and_then(|e| e.to_str());
        if ext != Some("seg") && name != "checkpoints.log" {
            std::fs::copy(&path, wiped.join(name)).expect("copy");
        }
    }
    let out = inferno(&["verify", wiped.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.starts_with("VIOLATION: "), "{text}");
    assert!(text.contains("is not an audit log"), "{text}");
    assert!(
        text.contains("no segment files (*.seg) and no checkpoints.log"),
        "{text}"
    );

    // A model directory.
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).expect("mkdir");
    std::fs::write(model.join("config.json"), "{}").expect("write");
    std::fs::write(model.join("tokenizer.json"), "{}").expect("write");
    let out = inferno(&["verify", model.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("is not an audit log"));

    // Checkpoints deleted, segments kept.
    std::fs::remove_file(dir.join("checkpoints.log")).expect("rm");
    let out = inferno(&["verify", dir.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("has no checkpoints.log"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn show_filters_and_export_formats() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    write_log(&dir, 6, 1 << 20, None);
    let d = dir.to_str().expect("utf8");
    let lines = |o: Output| -> Vec<serde_json::Value> {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    };
    let started = lines(inferno(&["show", d, "--event-type", "started"]));
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["event"], "started");
    let req3 = lines(inferno(&["show", d, "--request-id", "req-3"]));
    assert_eq!(req3.len(), 2);
    assert_eq!(req3[1]["type"], "completion");
    let key1 = lines(inferno(&["show", d, "--principal", "key-1"]));
    assert_eq!(key1.len(), 6, "3 requests of key-1 with their completions");
    let future = lines(inferno(&["show", d, "--since", "2999-01-01T00:00:00Z"]));
    assert!(future.is_empty());
    let all = lines(inferno(&["show", d, "--until", "2999-01-01T00:00:00Z"]));
    assert_eq!(all.len(), 13);
    assert_ne!(
        inferno(&["show", d, "--since", "yesterday"]).status.code(),
        Some(0)
    );

    let jsonl = inferno(&["export", d, "--format", "jsonl"]);
    assert_eq!(stdout(&jsonl).lines().count(), 13);
    let csv_path = tmp.path().join("out.csv");
    let csv = inferno(&[
        "export",
        d,
        "--format",
        "csv",
        "-o",
        csv_path.to_str().expect("utf8"),
    ]);
    assert_eq!(csv.status.code(), Some(0));
    // Issue 47: the export holds request metadata; it is private whatever the umask.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&csv_path).expect("csv").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&csv_path).expect("csv");
    let mut rows = text.lines();
    assert!(
        rows.next()
            .expect("header")
            .starts_with("index,time,type,event,request_id")
    );
    assert_eq!(rows.count(), 13);
}

#[test]
fn encrypted_content_is_decrypted_only_with_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let key_path = tmp.path().join("content.key");
    std::fs::write(&key_path, hex::encode([0x42u8; 32])).expect("key");
    let policy = ContentPolicy::new(ContentMode::Encrypted, Some(&[0x42; 32])).expect("policy");
    write_log(&dir, 2, 1 << 20, Some(&policy));
    let d = dir.to_str().expect("utf8");
    let raw = stdout(&inferno(&["show", d, "--request-id", "req-1"]));
    assert!(!raw.contains("prompt 1"), "{raw}");
    let k = key_path.to_str().expect("utf8");
    let plain = stdout(&inferno(&[
        "show",
        d,
        "--request-id",
        "req-1",
        "--decrypt-key",
        k,
    ]));
    assert!(plain.contains(r#""plaintext":"prompt 1""#), "{plain}");
    assert!(plain.contains(r#""plaintext":"an answer""#), "{plain}");
}

#[test]
fn prove_consistency_and_prune() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    write_log(&dir, 30, 1500, None);
    let d = dir.to_str().expect("utf8");

    let out = stdout(&inferno(&["prove", d, "--index", "17"]));
    let (proof_text, note_text) = out.split_once("\n\n").expect("proof then checkpoint");
    let proof = InclusionProof::parse(proof_text).expect("proof parses");
    let cp = SignedNote::parse(note_text)
        .and_then(|n| n.checkpoint())
        .expect("checkpoint");
    assert_eq!((proof.index, proof.size), (17, cp.size));
    verify_inclusion(17, cp.size, &proof.leaf, &proof.hashes, &cp.root)
        .expect("inclusion verifies");

    let out = inferno(&["consistency", d, "10", &cp.size.to_string()]);
    let proof = ConsistencyProof::parse(&stdout(&out)).expect("consistency proof");
    assert_eq!((proof.old, proof.new), (10, cp.size));
    assert!(inferno(&["consistency", d, "20", "10"]).status.code() != Some(0));

    let export = tmp.path().join("pruned.jsonl");
    let e = export.to_str().expect("utf8");
    let pruned = inferno(&["prune", d, "--keep-segments", "2", "--export", e]);
    assert_eq!(
        pruned.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    let exported = std::fs::read_to_string(&export)
        .expect("export")
        .lines()
        .count();
    assert!(exported > 0);
    let v = inferno(&["verify", d]);
    let verdict = stdout(&v);
    assert_eq!(v.status.code(), Some(0), "{verdict}");
    assert!(
        verdict.contains(&format!("pruned before record {exported}")),
        "{verdict}"
    );
    // Proofs of kept records still work after pruning.
    let out = stdout(&inferno(&[
        "prove",
        d,
        "--index",
        &(cp.size - 1).to_string(),
    ]));
    let (proof_text, _) = out.split_once("\n\n").expect("proof");
    let proof = InclusionProof::parse(proof_text).expect("parses");
    verify_inclusion(
        proof.index,
        proof.size,
        &proof.leaf,
        &proof.hashes,
        &cp.root,
    )
    .expect("verifies");
    // Consistency between two checkpoints stays provable from the witnessed size on.
    let out = inferno(&[
        "consistency",
        d,
        &exported.to_string(),
        &cp.size.to_string(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = ConsistencyProof::parse(&stdout(&out)).expect("parses");
    let old_root = {
        let (prefix, leaves) = inferno_audit::load_tree(&dir).expect("tree");
        inferno_audit::merkle::TreeView::new(&prefix, &leaves)
            .root_at(p.old)
            .expect("root")
    };
    verify_consistency(p.old, p.new, &old_root, &cp.root, &p.hashes).expect("consistent");
}

/// A log of three records in `tmp/log` and a fresh Ed25519 witness key (PKCS#8) in
/// `tmp/witness.der`.
fn log_and_witness_key(tmp: &Path) -> (PathBuf, PathBuf) {
    let dir = tmp.join("log");
    write_log(&dir, 3, 1 << 20, None);
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    let key = tmp.join("witness.der");
    std::fs::write(&key, pkcs8.as_ref()).expect("write key");
    (dir, key)
}

#[test]
fn witness_cosigns_through_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, key) = log_and_witness_key(tmp.path());
    let d = dir.to_str().expect("utf8");
    let k = key.to_str().expect("utf8");
    let vkey = stdout(&inferno(&[
        "witness",
        "vkey",
        "--key",
        k,
        "--name",
        "witness.test/w",
    ]));
    assert!(vkey.starts_with("witness.test/w+"), "{vkey}");

    let ckpt = tmp.path().join("c1");
    std::fs::write(&ckpt, stdout(&inferno(&["checkpoint", d]))).expect("write");
    let started = stdout(&inferno(&["show", d, "--event-type", "started"]));
    let started: serde_json::Value = serde_json::from_str(started.trim()).expect("json");
    let log_key = started["checkpoint_key"].as_str().expect("key").to_owned();
    let state = tmp.path().join("state");
    let out = tmp.path().join("cosigned");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "witness",
            "cosign",
            "--key",
            k,
            "--name",
            "witness.test/w",
            "--state",
            state.to_str().expect("utf8"),
            "--log-key",
            &log_key,
            "--out",
            out.to_str().expect("utf8"),
        ];
        args.extend_from_slice(extra);
        inferno(&args)
    };
    let c = ckpt.to_str().expect("utf8");
    assert_ne!(
        run(&["--checkpoint", c]).status.code(),
        Some(0),
        "no state without --init"
    );
    assert_eq!(run(&["--checkpoint", c, "--init"]).status.code(), Some(0));
    let cosigned = out.to_str().expect("utf8");
    let v = inferno(&[
        "verify",
        d,
        "--trusted-checkpoint",
        cosigned,
        "--witness-key",
        vkey.trim(),
    ]);
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    // A trusted checkpoint from a longer (other) history makes verification fail.
    let other = tmp.path().join("other");
    write_log(&other, 6, 1 << 20, None);
    let o = other.to_str().expect("utf8");
    let v = inferno(&["verify", o, "--trusted-checkpoint", cosigned]);
    assert_eq!(v.status.code(), Some(1), "{}", stdout(&v));
}

#[test]
fn witness_over_http_follows_tlog_witness() {
    use std::io::BufRead as _;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, key) = log_and_witness_key(tmp.path());
    let d = dir.to_str().expect("utf8");
    let k = key.to_str().expect("utf8");
    let name = "witness.test/http";
    let last_key = |d: &str| -> String {
        let started = stdout(&inferno(&["show", d, "--event-type", "started"]));
        let last: serde_json::Value =
            serde_json::from_str(started.lines().last().expect("a start")).expect("json");
        last["checkpoint_key"].as_str().expect("key").to_owned()
    };
    let c1 = stdout(&inferno(&["checkpoint", d]));
    let c1_path = tmp.path().join("c1");
    std::fs::write(&c1_path, &c1).expect("write");
    let state = tmp.path().join("state");
    let s = state.to_str().expect("utf8");
    let key1 = last_key(d);
    let out = tmp.path().join("c1.cosigned");
    let init = inferno(&[
        "witness",
        "cosign",
        "--key",
        k,
        "--name",
        name,
        "--state",
        s,
        "--log-key",
        &key1,
        "--checkpoint",
        c1_path.to_str().expect("utf8"),
        "--init",
        "--out",
        out.to_str().expect("utf8"),
    ]);
    assert_eq!(init.status.code(), Some(0));

    // The log grows in a new run with a new key; the witness operator adds that key.
    write_log(&dir, 2, 1 << 20, None);
    let keys = tmp.path().join("log-keys");
    std::fs::write(&keys, format!("{key1}\n{}\n", last_key(d))).expect("keys");
    let c2 = stdout(&inferno(&["checkpoint", d]));
    let size = |note: &str| {
        SignedNote::parse(note)
            .and_then(|n| n.checkpoint())
            .expect("cp")
            .size
    };
    let (s1, s2) = (size(&c1), size(&c2));
    let proof = stdout(&inferno(&[
        "consistency",
        d,
        &s1.to_string(),
        &s2.to_string(),
    ]));
    let hashes: String = proof.lines().skip(3).map(|l| format!("{l}\n")).collect();

    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args([
            "audit", "witness", "serve", "--key", k, "--name", name, "--state", s,
        ])
        .args(["--listen", "127.0.0.1:0", "--log-keys"])
        .arg(&keys)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn witness");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let url = format!(
        "{}/add-checkpoint",
        line.trim()
            .strip_prefix("witness listening on ")
            .expect("address line")
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let post = |body: String| {
        rt.block_on(async {
            let r = reqwest::Client::new()
                .post(&url)
                .body(body)
                .send()
                .await
                .expect("post");
            (r.status().as_u16(), r.text().await.expect("body"))
        })
    };
    let (status, cosig) = post(format!("old {s1}\n{hashes}\n{c2}"));
    assert_eq!(status, 200, "{cosig}");
    let witness_key = inferno_audit::note::VerifierKey::parse(
        stdout(&inferno(&["witness", "vkey", "--key", k, "--name", name])).trim(),
    )
    .expect("vkey");
    let cosigned = SignedNote::parse(&format!("{c2}{cosig}")).expect("cosigned note");
    assert!(
        witness_key
            .verify(&cosigned)
            .expect("cosignature verifies")
            .is_some()
    );
    // The same request again: the witness has moved on and says where it is.
    let (status, body) = post(format!("old {s1}\n{hashes}\n{c2}"));
    assert_eq!((status, body.as_str()), (409, format!("{s2}\n").as_str()));
    // Rollback to the first checkpoint.
    let (status, _) = post(format!("old {s2}\n\n{c1}"));
    assert_eq!(status, 400);
    // A checkpoint signed by a key the witness does not know.
    let other = tmp.path().join("other");
    write_log(&other, 1, 1 << 20, None);
    let foreign = stdout(&inferno(&["checkpoint", other.to_str().expect("utf8")]));
    let (status, _) = post(format!("old {s2}\n\n{foreign}"));
    assert_eq!(status, 403);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn prune_refuses_while_a_writer_has_the_log_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    write_log(&dir, 30, 1500, None);
    let segments = |dir: &Path| {
        std::fs::read_dir(dir)
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "seg"))
            })
            .count()
    };
    let before = segments(&dir);
    assert!(before > 2, "{before} segments");
    let cfg = AuditConfig {
        dir: dir.clone(),
        ..AuditConfig::default()
    };
    let start = StartInfo {
        software_version: "cli-test".into(),
        evidence: Vec::new(),
    };
    let signer = AuditLog::generate_signer(&cfg).expect("signer");
    let open = AuditLog::open(&cfg, Arc::new(StdFileOps), signer, start.clone()).expect("opens");
    let d = dir.to_str().expect("utf8");
    let export = tmp.path().join("pruned.jsonl");
    let e = export.to_str().expect("utf8");
    let refused = inferno(&["prune", d, "--keep-segments", "1", "--export", e]);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(stderr.lines().count() <= 2, "a short cause: {stderr}");
    assert!(!export.exists(), "nothing was exported");
    assert!(segments(&dir) >= before, "nothing was removed");
    // A second writer is refused the same way.
    let signer = AuditLog::generate_signer(&cfg).expect("signer");
    let second = AuditLog::open(&cfg, Arc::new(StdFileOps), signer, start);
    assert!(
        second
            .as_ref()
            .is_err_and(|e| e.to_string().contains("in use")),
        "{second:?}"
    );
    drop(open);
    let pruned = inferno(&["prune", d, "--keep-segments", "1", "--export", e]);
    assert_eq!(
        pruned.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    assert_eq!(segments(&dir), 1);
}
