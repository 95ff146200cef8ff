//! What the sealed-model serving tests share (tests/sealed_model.rs, tpm_sealing.rs,
//! key_broker.rs): a development config with an audit log, a spawned `inferno` that is waited on
//! until it listens, its clean stop, and the key-release events its audit log then holds.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use inferno_audit::{RecordBody, SecurityEvent, read_records};

/// Writes a development appliance config with its audit log in `work/audit`, plus `extra`.
pub fn dev_config(work: &Path, extra: &str) -> PathBuf {
    let config = work.join("inferno.toml");
    std::fs::write(
        &config,
        format!(
            "[attestation]\nprofile = \"development\"\n[audit]\ndir = \"{}\"\n{extra}",
            work.join("audit").display()
        ),
    )
    .unwrap();
    config
}

/// The arguments of `inferno serve` on the CPU, on an ephemeral loopback port, for the model
/// directory `sealed` and the config file `config`.
pub fn serve_args<'a>(sealed: &'a Path, config: &'a Path) -> Vec<&'a str> {
    vec![
        "serve",
        "--device",
        "cpu",
        "--listen",
        "127.0.0.1:0",
        "--model",
        sealed.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]
}

/// Spawns `inferno` with `args` and returns the child and its standard error up to the banner's
/// `listening:` line (or all of it, should the process exit first).
pub fn spawn_until_listening(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn inferno");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
            if line.trim().starts_with("listening:") {
                let _ = tx.send(seen.clone());
            }
        }
        let _ = tx.send(seen);
    });
    let banner = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("inferno starts");
    (child, banner)
}

/// Stops `child` with SIGTERM (a clean stop writes the audit log's final records) and waits.
pub fn terminate(mut child: Child) {
    let _ = Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    child.wait().unwrap();
}

/// The key-release events (released, reason) of the stopped audit log in `dir`.
pub fn key_releases(dir: &Path) -> Vec<(bool, String)> {
    read_records(dir)
        .expect("the log reads")
        .into_iter()
        .filter_map(|stored| match stored.record.body {
            RecordBody::Event(SecurityEvent::KeyRelease {
                released, reason, ..
            }) => Some((released, reason)),
            _ => None,
        })
        .collect()
}

/// Runs `inferno` with `args` to completion: its exit code, standard output and standard error.
pub fn inferno(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `inferno` with `args`, which must refuse to serve: exit 1, exactly one `error:` line,
/// and exactly one refused key release in the audit log in `audit_dir`. Returns that line (with
/// the whole standard error, for messages) and the release's reason.
pub fn refused_serve(args: &[&str], audit_dir: &Path) -> (String, String, String) {
    let (code, _, stderr) = inferno(args);
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let error = errors[0].to_owned();
    let releases = key_releases(audit_dir);
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(!releases[0].0, "{releases:?}");
    let reason = releases[0].1.clone();
    (error, stderr, reason)
}
