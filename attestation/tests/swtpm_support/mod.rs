//! A real software TPM for tests: starts `swtpm` (Debian package `swtpm`) on two free local
//! ports with a fresh state directory and kills it on drop. Shared by the crate's swtpm test and
//! the server's start-up attestation test (`#[path]`-included there).
//!
//! Without `swtpm` the tests skip loudly, except under CI (`CI` set), where its absence fails.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running swtpm, killed on drop.
pub struct Swtpm {
    child: Child,
    /// The TPM command port (the control port is the next one).
    pub port: u16,
    _state: tempfile::TempDir,
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two consecutive free local ports (server, control).
pub fn free_port_pair() -> u16 {
    for _ in 0..50 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local address").port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two consecutive free ports");
}

/// Serialises port choice and start-up between the tests of one binary, which run in parallel:
/// without it, one test's command port can be another's control port.
static START: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Starts swtpm, or `None` (after a loud skip message) when it is not installed.
pub fn start_swtpm() -> Option<Swtpm> {
    if Command::new("swtpm").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "swtpm is not installed, and CI must run the swtpm tests (apt-get install swtpm)"
        );
        eprintln!("SKIPPED: swtpm is not installed (apt-get install swtpm)");
        return None;
    }
    let _serial = START
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // A port taken by another process between the choice and swtpm's bind makes swtpm exit:
    // choose again.
    for _ in 0..5 {
        if let Some(tpm) = try_start() {
            return Some(tpm);
        }
    }
    panic!("swtpm did not start on five port pairs");
}

/// One start on a fresh port pair: `None` when swtpm exits before both its ports accept.
fn try_start() -> Option<Swtpm> {
    let state = tempfile::tempdir().expect("temporary TPM state dir");
    let port = free_port_pair();
    let child = Command::new("swtpm")
        .args(["socket", "--tpm2"])
        .args(["--server", &format!("type=tcp,port={port}")])
        .args(["--ctrl", &format!("type=tcp,port={}", port + 1)])
        .args(["--tpmstate", &format!("dir={}", state.path().display())])
        .args(["--flags", "startup-clear"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start swtpm");
    let mut tpm = Swtpm {
        child,
        port,
        _state: state,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    // Both the command and the control port must accept: the swtpm TCTI opens both.
    for probe in [port, port + 1] {
        while TcpStream::connect(("127.0.0.1", probe)).is_err() {
            if tpm.child.try_wait().expect("poll swtpm").is_some() {
                return None;
            }
            assert!(Instant::now() < deadline, "swtpm did not listen on {probe}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Some(tpm)
}

/// The TCTI string for tss-esapi.
pub fn tcti(tpm: &Swtpm) -> String {
    format!("swtpm:host=127.0.0.1,port={}", tpm.port)
}
