//! `inferno serve` as an operator runs it, output to a pipe: configuration errors, the flags that
//! override the file, the banner, JSON logs without colour and with progress lines, the shipped
//! example configuration, a second shutdown signal, and `bench serve` against a server whose
//! certificate it does not trust.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// `inferno serve --device cpu` with `args`, stderr piped; waits for the banner's last line.
struct Served {
    child: Child,
    /// Everything written to stderr so far.
    log: Arc<Mutex<String>>,
    /// `https://127.0.0.1:PORT`.
    base: String,
}

impl Served {
    fn start(args: &[&str], config: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(["serve", "--device", "cpu", "--config"])
            .arg(config)
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn inferno serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut base = None;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.trim().strip_prefix("listening:") {
                    base = Some(addr.trim().to_owned());
                }
                if let Ok(mut log) = sink.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
                // The banner's last line.
                if line.trim_start().starts_with("metrics:")
                    && let Some(base) = base.take()
                {
                    let _ = tx.send(base);
                }
            }
        });
        let Ok(base) = rx.recv_timeout(Duration::from_secs(120)) else {
            let _ = child.kill();
            panic!("the server did not become ready:\n{}", log.lock().unwrap());
        };
        Self { child, log, base }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits until the log contains `text`.
    fn wait_for_log(&self, text: &str, within: Duration) {
        let started = Instant::now();
        while !self.log().contains(text) {
            assert!(
                started.elapsed() < within,
                "no {text:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the process to exit; its status code.
    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if started.elapsed() > within {
                let _ = self.child.kill();
                panic!("the server did not exit in {within:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("inferno.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// `inferno serve` that is expected to stop at start-up.
fn serve_fails(config_text: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), config_text);
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--device", "cpu", "--config"])
        .arg(&config)
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno serve")
}

/// The one `error:` line of a failed start.
fn error_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_owned()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
}

const DEVELOPMENT: &str = "[attestation]\nprofile = \"development\"\n";

#[test]
fn out_of_range_settings_stop_start_up_naming_key_and_range() {
    for (setting, key, range) in [
        (
            "max_batched_tokens = 0",
            "engine.max_batched_tokens",
            "1 to 1048576",
        ),
        (
            "gpu_memory_fraction = 1.7",
            "engine.gpu_memory_fraction",
            "0.01 to 1.0",
        ),
        ("max_waiting = 0", "engine.max_waiting", "1 to 16777216"),
    ] {
        let out = serve_fails(&format!("{DEVELOPMENT}[engine]\n{setting}\n"), &[]);
        let line = error_line(&out);
        assert!(line.contains(key) && line.contains(range), "{line}");
    }
    // A flag is checked as the file is.
    let out = serve_fails(DEVELOPMENT, &["--gpu-memory-utilization", "1.7"]);
    let line = error_line(&out);
    assert!(line.contains("engine.gpu_memory_fraction"), "{line}");
}

#[test]
fn a_wrong_type_names_its_key_and_a_cause_prints_once() {
    let out = serve_fails(&format!("{DEVELOPMENT}[limits]\nmax_n = \"four\"\n"), &[]);
    let line = error_line(&out);
    assert!(line.contains("limits.max_n"), "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--config", "/nonexistent/inferno.toml"])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let line = error_line(&out);
    assert_eq!(line.matches("os error 2").count(), 1, "{line}");
}

#[test]
fn an_empty_config_runs_production_and_says_what_it_needs() {
    let out = serve_fails("", &[]);
    let line = error_line(&out);
    assert!(line.contains("[audit]"), "{line}");
    assert!(line.contains("profile = \"development\""), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_override_the_file_and_the_banner_shows_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:1\"\nserved_model_name = \"from-file\"\n\
             [engine]\ngpu_memory_fraction = 0.5\n"
        ),
    );
    let key_file = dir.path().join("keys");
    std::fs::write(&key_file, "# operators\nkey-from-file\n\n").unwrap();
    let served = Served::start(
        &[
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--served-model-name",
            "from-flag",
            "--api-key",
            "key-one",
            "--api-key",
            "key-two",
            "--api-key-file",
            key_file.to_str().unwrap(),
            "--max-model-len",
            "64",
            "--gpu-memory-utilization",
            "0.8",
        ],
        &config,
    );
    let log = served.log();
    assert!(!served.base.ends_with(":1"), "{log}");
    assert!(log.contains("auth:        on (3 API keys)"), "{log}");
    assert!(log.contains("audit:       off"), "{log}");
    assert!(log.contains("tool parser:"), "{log}");
    assert!(log.contains("context:     64 tokens"), "{log}");
    for key in ["key-one", "key-two", "key-from-file"] {
        let models: serde_json::Value = client()
            .get(format!("{}/v1/models", served.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], "from-flag", "{models}");
        assert_eq!(models["data"][0]["max_model_len"], 64, "{models}");
    }
    let refused = client()
        .get(format!("{}/v1/models", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::UNAUTHORIZED);
    // The cache_config_info labels carry the flag's fraction.
    let metrics = client()
        .get(format!("{}/metrics", served.base))
        .bearer_auth("key-one")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gpu_memory_utilization=\"0.8\""),
        "{metrics}"
    );
}

#[test]
fn json_logs_on_a_pipe_carry_no_colour_and_report_progress() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:0\"\n"),
    );
    let served = Served::start(&["--log-format", "json"], &config);
    // The progress thread polls the bar: its line about the finished upload may follow the banner.
    served.wait_for_log("start-up progress", Duration::from_secs(10));
    let log = served.log();
    assert!(!log.contains('\u{1b}'), "ANSI escapes on a pipe:\n{log}");
    let events: Vec<serde_json::Value> = log
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(events.len() >= 3, "{log}");
    for event in &events {
        assert!(
            event["level"].is_string() && event["message"].is_string(),
            "{event}"
        );
    }
    assert!(
        events.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("start-up progress"))
            && e["phase"].is_string()),
        "no progress line:\n{log}"
    );
    assert!(
        events.iter().any(|e| e["message"] == "start-up timeline"),
        "{log}"
    );
    // Every line that is not JSON is the banner's.
    let banner_start = log
        .find(&format!("inferno {} ready", env!("CARGO_PKG_VERSION")))
        .expect("banner");
    assert!(
        log[..banner_start]
            .lines()
            .all(|line| line.starts_with('{')),
        "{log}"
    );
}

#[test]
fn text_logs_on_a_pipe_carry_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:0\"\n"),
    );
    let served = Served::start(&[], &config);
    served.wait_for_log("start-up progress", Duration::from_secs(10));
    let log = served.log();
    assert!(!log.contains('\u{1b}'), "ANSI escapes on a pipe:\n{log}");
}

#[test]
fn the_example_configuration_starts_as_shipped() {
    let example = Path::new(REPO).join("inferno.example.toml");
    let served = Served::start(&["--port", "0"], &example);
    let log = served.log();
    assert!(log.contains("ready"), "{log}");
    assert!(log.contains("auth:        off"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_forces_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_secs = 300\n\
             [audit]\ndir = \"{}\"\n",
            dir.path().join("audit").display()
        ),
    );
    let mut served = Served::start(&[], &config);
    // A client that never reads its stream keeps the request in flight.
    let stalled = client()
        .post(format!("{}/v1/completions", served.base))
        .json(
            &serde_json::json!({"model": inferno::model::EMBEDDED_MODEL_NAME, "prompt": "Once",
                                  "max_tokens": 1900, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stalled.status(), reqwest::StatusCode::OK);
    // The audit log's gauges (no API keys: the loopback development server's /metrics is open).
    let metrics = client()
        .get(format!("{}/metrics", served.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let gauge = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert_eq!(gauge("inferno:audit_enabled"), 1.0);
    assert_eq!(gauge("inferno:audit_fail_closed"), 0.0);
    assert!(gauge("inferno:audit_records") >= 1.0, "{metrics}");
    served.signal("TERM");
    served.wait_for_log("finishing in-flight requests", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "the first signal waits for the stream:\n{}",
        served.log()
    );
    served.signal("INT");
    let code = served.wait_exit(Duration::from_secs(20));
    let log = served.log();
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("second shutdown signal"), "{log}");
    assert!(log.contains("stopped (forced by a second signal)"), "{log}");
    drop(stalled);
}

#[test]
fn bench_serve_says_why_requests_to_an_untrusted_server_fail() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:0\"\n"),
    );
    let served = Served::start(&[], &config);
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args([
            "bench",
            "serve",
            "--url",
            &served.base,
            "--model",
            inferno::model::EMBEDDED_MODEL_NAME,
        ])
        .args([
            "--num-prompts",
            "2",
            "--concurrency",
            "1",
            "--input-len",
            "4",
            "--output-len",
            "2",
        ])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let line = error_line(&out);
    assert!(line.contains("2 of 2 requests failed"), "{line}");
    assert!(line.contains("certificate"), "{line}");
    assert!(line.contains("--ca-cert"), "{line}");
}

/// Issue 49: an internal error (the audit log on disk damaged under a running server) answers
/// HTTP 500 with a one-sentence OpenAI error body, and the request's log line is at ERROR and
/// carries the cause, which the client does not get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_error_is_logged_at_error_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit");
    let config = write_config(
        dir.path(),
        &format!(
            "{DEVELOPMENT}[server]\nlisten = \"127.0.0.1:0\"\n\
             [audit]\ndir = \"{}\"\ncheckpoint_every_records = 1\n",
            audit.display()
        ),
    );
    let served = Served::start(&["--log-format", "json"], &config);
    let completion = client()
        .post(format!("{}/v1/completions", served.base))
        .json(
            &serde_json::json!({"model": inferno::model::EMBEDDED_MODEL_NAME, "prompt": "Once",
                                  "max_tokens": 2}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(completion.status(), reqwest::StatusCode::OK);
    // The proof route answers once a checkpoint covers record 0 (the start event).
    let proof = || async {
        client()
            .get(format!("{}/v1/audit/proof?index=0", served.base))
            .send()
            .await
            .unwrap()
    };
    let started = Instant::now();
    loop {
        let status = proof().await.status();
        if status == reqwest::StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "proof: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One byte flipped inside the first record (the start event, with its evidence).
    let segment = std::fs::read_dir(&audit)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "seg"))
        .expect("a segment file");
    // In place: the server keeps appending to the file.
    let bytes = std::fs::read(&segment).unwrap();
    let at = bytes.len() / 4;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at as u64)).unwrap();
    std::io::Write::write_all(&mut file, &[bytes[at] ^ 0x55]).unwrap();
    drop(file);

    let response = proof().await;
    assert_eq!(
        response.status(),
        reqwest::StatusCode::INTERNAL_SERVER_ERROR
    );
    let body: serde_json::Value = response.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(message, "the audit log cannot be read", "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");

    served.wait_for_log("\"request failed\"", Duration::from_secs(10));
    let log = served.log();
    let line: serde_json::Value = log
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["message"] == "request failed")
        .unwrap_or_else(|| panic!("no request-failed line:\n{log}"));
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["status"], 500, "{line}");
    assert_eq!(line["path"], "/v1/audit/proof", "{line}");
    let cause = line["cause"].as_str().unwrap_or_default();
    assert!(
        cause.starts_with("the audit log cannot be read: ") && cause.len() > message.len() + 10,
        "the log names the cause beyond the client's sentence: {line}"
    );
}
