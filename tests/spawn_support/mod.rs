//! Starts the real `inferno serve` binary as a child process for tests that need a separate
//! process (crashes, benchmarks): CPU backend, loopback, a config file written by the test.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Writes `config_toml` to `work/inferno.toml`, starts the server with it on an ephemeral
/// loopback port and returns the child and its base URL once it is listening.
pub fn spawn_server(config_toml: &str, work: &Path, log_level: &str) -> (Child, String) {
    let (child, base, _) = spawn_server_logged(config_toml, work, log_level);
    (child, base)
}

/// [`spawn_server`], also returning the server's standard error as it accumulates (its
/// diagnostic log at `log_level`).
pub fn spawn_server_logged(
    config_toml: &str,
    work: &Path,
    log_level: &str,
) -> (Child, String, Arc<Mutex<String>>) {
    let config = work.join("inferno.toml");
    std::fs::write(&config, config_toml).expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args([
            "serve",
            "--device",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config)
        .env("RUST_LOG", log_level)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let stderr = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.trim().strip_prefix("listening:") {
                let _ = tx.send(addr.trim().to_owned());
            }
            if let Ok(mut log) = sink.lock() {
                log.push_str(&line);
                log.push('\n');
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server became ready");
    (child, base, log)
}
