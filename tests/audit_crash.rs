//! `kill -9` of a process writing the audit log under load, repeated a bounded number of times:
//! afterwards the log recovers, verifies, and holds every request record that was acknowledged.

use std::collections::HashSet;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use inferno_audit::{AuditConfig, AuditSink, CompletionFacts, ContentMode, RequestFacts};
use inferno_audit::{VerifyOptions, verify};

const CHILD_ENV: &str = "INFERNO_AUDIT_CRASH_CHILD_DIR";
const ROUNDS: usize = 5;

fn config(dir: &Path) -> AuditConfig {
    AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 50,
        checkpoint_every_seconds: 1,
        segment_max_bytes: 64 << 10,
        ..AuditConfig::default()
    }
}

/// The child: appends requests from many tasks and prints `ACK <id>` once each is durable.
#[test]
#[ignore = "run by crash_under_load_loses_no_acknowledged_request"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let sink = Arc::new(
        AuditSink::open(&config(Path::new(&dir)), ContentMode::None, "crash-test").expect("opens"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        for id in rx {
            let _ = writeln!(out, "ACK {id}");
            let _ = out.flush();
        }
    });
    rt.block_on(async {
        let tasks: Vec<_> = (0..32)
            .map(|t| {
                let sink = Arc::clone(&sink);
                let tx = tx.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let id = format!("{}-{t}-{i}", std::process::id());
                        let facts = RequestFacts {
                            request_id: &id,
                            client_request_id: None,
                            principal: "load",
                            endpoint: "/v1/completions",
                            model_digest: "sha256:00",
                            stream: false,
                            prompt: "hello",
                            status: None,
                            constraint: None,
                            transport: None,
                        };
                        if sink.request(facts).await.is_err() {
                            return;
                        }
                        let _ = tx.send(id.clone());
                        let _ = sink.completion(CompletionFacts {
                            request_id: id,
                            prompt_tokens: 1,
                            completion_tokens: 1,
                            finish_reason: Some("stop".into()),
                            status: 200,
                            latency_ms: 1,
                            completion: None,
                        });
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
}

#[test]
fn crash_under_load_loses_no_acknowledged_request() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let exe = std::env::current_exe().expect("test binary");
    let mut acknowledged = HashSet::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, received) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(id) = line.strip_prefix("ACK ") {
                    let _ = sender.send(id.to_owned());
                }
            }
        });
        // Once it acknowledges (its start-up, which recovers the log the previous round tore,
        // takes longer on a loaded machine), let it run under load for a varying time, then
        // SIGKILL it.
        let first = received.recv_timeout(Duration::from_secs(60));
        if first.is_ok() {
            std::thread::sleep(Duration::from_millis(200 + 150 * round as u64));
        }
        child.kill().expect("kill -9");
        let _ = child.wait();
        reader.join().expect("reader");
        let ids: Vec<String> = first.into_iter().chain(received.try_iter()).collect();
        assert!(
            !ids.is_empty(),
            "round {round}: the child acknowledged nothing in 60 s"
        );
        acknowledged.extend(ids);
    }
    // Reopen once more (recovering any torn tail), then verify.
    let sink =
        AuditSink::open(&config(&dir), ContentMode::None, "crash-test-final").expect("recovers");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async { sink.shutdown("done").await.expect("shutdown") });
    let report = verify(&dir, &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    let output = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["audit", "export"])
        .arg(&dir)
        .args(["--format", "jsonl"])
        .output()
        .expect("export");
    let mut logged = HashSet::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        if v["type"] == "request" {
            logged.insert(v["request_id"].as_str().expect("id").to_owned());
        }
    }
    let missing: Vec<_> = acknowledged.difference(&logged).take(5).collect();
    assert!(
        missing.is_empty(),
        "acknowledged but not logged: {missing:?}"
    );
    eprintln!(
        "{ROUNDS} kill -9 rounds: {} acknowledged requests, all logged; {} records, {} incomplete",
        acknowledged.len(),
        report.size,
        report.incomplete.len()
    );
}
