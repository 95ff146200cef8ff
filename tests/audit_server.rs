//! The audit log written by the real server (`inferno serve` on the embedded model, CPU
//! backend): every answered request has its request record, the CLI verifies the log, and a
//! `kill -9` under load (a bounded number of rounds) loses no answered request.

mod spawn_support;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .output()
        .expect("runs inferno")
}

/// A running `inferno serve` and its HTTPS address.
struct Served {
    child: Child,
    base: String,
}

fn serve(dir: &Path, work: &Path) -> Served {
    serve_with(dir, work, "")
}

fn serve_with(dir: &Path, work: &Path, extra: &str) -> Served {
    let toml = format!(
        "[attestation]\nprofile = \"development\"\n[audit]\ndir = {:?}\ncheckpoint_every_records = 20\ncheckpoint_every_seconds = 1\n{extra}",
        dir.to_str().expect("utf8")
    );
    let (child, base) = spawn_support::spawn_server(&toml, work, "warn");
    Served { child, base }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn complete(client: &reqwest::Client, base: &str, id: &str, stream: bool) -> bool {
    complete_status(client, base, id, stream).await == Some(200)
}

/// The HTTP status of one completion request whose body was read in full.
async fn complete_status(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    stream: bool,
) -> Option<u16> {
    let body = serde_json::json!({
        "model": "inferno-tiny",
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "stream": stream,
    });
    match client
        .post(format!("{base}/v1/completions"))
        .header("x-request-id", id)
        .json(&body)
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            response.bytes().await.ok().map(|_| status)
        }
        Err(_) => None,
    }
}

fn records(dir: &Path, kind: &str) -> Vec<serde_json::Value> {
    let out = inferno(&[
        "audit",
        "show",
        dir.to_str().expect("utf8"),
        "--event-type",
        kind,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

fn terminate(mut served: Served) {
    let pid = served.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while served.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_server_audits_every_request_and_the_cli_verifies_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let served = serve(&dir, tmp.path());
    let rt = runtime();
    let client = client();
    let checkpoint = rt.block_on(async {
        assert!(complete(&client, &served.base, "plain-1", false).await);
        assert!(complete(&client, &served.base, "stream-1", true).await);
        // The timer checkpoint (every second) covers the requests.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let response = client
            .get(format!("{}/v1/audit/checkpoint", served.base))
            .send()
            .await
            .expect("checkpoint");
        assert_eq!(response.status(), 200);
        response.text().await.expect("text")
    });
    let note = inferno_audit::note::SignedNote::parse(&checkpoint).expect("a signed note");
    // started, certificate, config, gpu-ready, 2 requests and 2 completions
    assert!(
        note.checkpoint().expect("checkpoint").size >= 8,
        "{checkpoint}"
    );
    terminate(served);

    let d = dir.to_str().expect("utf8");
    let verify = inferno(&["audit", "verify", d]);
    let verdict = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(0), "{verdict}");
    assert!(!verdict.contains("incomplete"), "{verdict}");
    let all = records(&dir, "request");
    // The checkpoint fetch is an API request too, answered without generation: one record
    // with its status.
    let (requests, answered): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|r| r.get("status").is_none());
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["endpoint"], "/v1/audit/checkpoint");
    assert_eq!(answered[0]["status"], 200);
    let ids: Vec<_> = requests
        .iter()
        .map(|r| r["client_request_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["plain-1", "stream-1"]);
    assert_eq!(requests[0]["principal"], "anonymous");
    assert_eq!(requests[1]["stream"], true);
    let completions = records(&dir, "completion");
    assert_eq!(completions.len(), 2);
    for c in &completions {
        assert_eq!(c["status"], 200);
        assert!(c["finish_reason"].is_string(), "{c}");
        assert!(c["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{c}");
    }
    // Both carry the engine's count, also the stream that asked for no usage chunk.
    for c in &completions {
        assert!(c["completion_tokens"].as_u64().unwrap_or(0) > 0, "{c}");
    }
    for event in [
        "started",
        "certificate_rotated",
        "policy_config",
        "gpu_ready",
        "stopped",
    ] {
        assert_eq!(records(&dir, event).len(), 1, "{event}");
    }
}

#[test]
fn kill_9_under_load_loses_no_answered_request() {
    const ROUNDS: usize = 3;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let rt = runtime();
    let mut answered = HashSet::new();
    for round in 0..ROUNDS {
        let mut served = serve(&dir, tmp.path());
        let base = served.base.clone();
        let ok: Vec<String> = rt.block_on(async {
            let client = client();
            let stop = Instant::now() + Duration::from_millis(1500);
            let tasks: Vec<_> = (0..8)
                .map(|t| {
                    let (client, base) = (client.clone(), base.clone());
                    tokio::spawn(async move {
                        let mut ok = Vec::new();
                        let mut i = 0;
                        while Instant::now() < stop {
                            let id = format!("r{round}-t{t}-{i}");
                            if complete(&client, &base, &id, i % 2 == 0).await {
                                ok.push(id);
                            }
                            i += 1;
                        }
                        ok
                    })
                })
                .collect();
            // Kill while requests are in flight.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            served.child.kill().expect("kill -9");
            let mut ok = Vec::new();
            for t in tasks {
                ok.extend(t.await.expect("task"));
            }
            ok
        });
        let _ = served.child.wait();
        assert!(!ok.is_empty(), "round {round}: nothing was answered");
        answered.extend(ok);
    }
    // A clean start and stop recovers the log; then it must verify and hold every answer.
    terminate(serve(&dir, tmp.path()));
    let verify = inferno(&["audit", "verify", dir.to_str().expect("utf8")]);
    let verdict = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(verify.status.code(), Some(0), "{verdict}");
    let logged: HashSet<String> = records(&dir, "request")
        .iter()
        .filter_map(|r| r["client_request_id"].as_str().map(str::to_owned))
        .collect();
    let missing: Vec<_> = answered.difference(&logged).take(5).collect();
    assert!(
        missing.is_empty(),
        "answered without a request record: {missing:?}"
    );
    assert_eq!(records(&dir, "started").len(), ROUNDS + 1);
    eprintln!(
        "{ROUNDS} kill -9 rounds: {} answered requests, all with request records; {verdict}",
        answered.len()
    );
}

#[test]
fn an_unwritable_log_fails_closed_with_503() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let served = serve_with(&dir, tmp.path(), "segment_max_bytes = 4096\n");
    let rt = runtime();
    let client = client();
    // One request answered while the log still works.
    let first = rt.block_on(complete_status(&client, &served.base, "f-0", false));
    assert_eq!(first, Some(200));
    // The next segment cannot be created (its name is taken by a directory): the next rotation
    // fails with an I/O error.
    let last = std::fs::read_dir(&dir)
        .expect("audit dir")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".seg")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .expect("a segment exists");
    let blocker = dir.join(format!("{:016}.seg", last + 1));
    std::fs::create_dir(&blocker).expect("block the next segment");
    let (statuses, refusal) = rt.block_on(async {
        let mut out = vec![first];
        for i in 1..40 {
            out.push(complete_status(&client, &served.base, &format!("f-{i}"), false).await);
        }
        // A refusal (here an unknown route, normally 404) cannot be recorded either: 503.
        let refusal = client
            .get(format!("{}/v1/nope", served.base))
            .header("x-request-id", "refused-after-failure")
            .send()
            .await
            .map(|r| r.status().as_u16());
        (out, refusal.ok())
    });
    assert_eq!(refusal, Some(503), "fail closed");
    let first_503 = statuses
        .iter()
        .position(|s| *s == Some(503))
        .unwrap_or_else(|| panic!("the log never failed: {statuses:?}"));
    assert!(
        statuses[first_503..].iter().all(|s| *s == Some(503)),
        "once failed, every request is refused: {statuses:?}"
    );
    let answered: Vec<String> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == Some(200))
        .map(|(i, _)| format!("f-{i}"))
        .collect();
    terminate(served);
    std::fs::remove_dir(&blocker).expect("unblock");
    terminate(serve(&dir, tmp.path()));
    let verify = inferno(&["audit", "verify", dir.to_str().expect("utf8")]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let logged: HashSet<String> = records(&dir, "request")
        .iter()
        .filter_map(|r| r["client_request_id"].as_str().map(str::to_owned))
        .collect();
    for id in &answered {
        assert!(logged.contains(id), "answered request {id} has no record");
    }
    assert!(!logged.contains("refused-after-failure"));
}

#[test]
fn content_reaches_the_diagnostic_log_only_when_the_policy_allows_it() {
    const MARKER: &str = "zebra crossing marker";
    let policy_text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/development.toml"),
    )
    .expect("development policy");
    assert!(policy_text.contains("content_in_logs = false"));
    let rt = runtime();
    for allowed in [false, true] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let policy = tmp.path().join("policy.toml");
        let text = policy_text.replace(
            "content_in_logs = false",
            &format!("content_in_logs = {allowed}"),
        );
        std::fs::write(&policy, text).expect("policy");
        let toml = format!(
            "[attestation]\nprofile = \"development\"\npolicy = {:?}\n[audit]\ndir = {:?}\n",
            policy.to_str().expect("utf8"),
            tmp.path().join("audit").to_str().expect("utf8")
        );
        // Debug level: the most the server ever logs about a request.
        let (child, base, log) =
            spawn_support::spawn_server_logged(&toml, tmp.path(), "inferno=debug");
        let served = Served { child, base };
        let client = client();
        let response_id = rt.block_on(async {
            let body = serde_json::json!({
                "model": "inferno-tiny",
                "prompt": MARKER,
                "max_tokens": 4,
            });
            let response = client
                .post(format!("{}/v1/completions", served.base))
                .json(&body)
                .send()
                .await
                .expect("sent");
            let status = response.status();
            let text = response.text().await.expect("body");
            assert_eq!(status, 200, "{text}");
            let json: serde_json::Value = serde_json::from_str(&text).expect("json");
            // The response id is unique: it appears in the log only with the response body.
            json["id"].as_str().unwrap_or("").to_owned()
        });
        terminate(served);
        let log = log.lock().map(|l| l.clone()).unwrap_or_default();
        assert!(
            log.contains("\"request\"") || log.contains(" request"),
            "{log}"
        );
        assert_eq!(log.contains(MARKER), allowed, "prompt in the log: {log}");
        assert!(response_id.starts_with("cmpl-"), "{response_id}");
        assert_eq!(
            log.contains(&response_id),
            allowed,
            "completion in the log: {log}"
        );
    }
}
