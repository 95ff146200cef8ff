//! Starts the real `inferno proxy` binary with the development client policy, for the tests of
//! the verifying proxy over attested TLS and over Oblivious HTTP (each test crate uses a part).
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The client policy that accepts the simulated TEE.
pub fn development_policy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policy/client-development.toml")
}

/// A running `inferno proxy`; stopped on drop.
pub struct Proxy {
    child: Child,
    /// The proxy's plain-HTTP base URL on loopback.
    pub base: String,
}

impl Proxy {
    /// Starts a proxy in front of `upstream` with `extra` arguments (e.g. `--ohttp`), on an
    /// ephemeral loopback port, and returns once it listens.
    pub fn start(upstream: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .arg("proxy")
            .args(extra)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                upstream,
                "--policy",
            ])
            .arg(development_policy())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn proxy");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.trim().strip_prefix("listening:") {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the proxy listens");
        Self { child, base }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
