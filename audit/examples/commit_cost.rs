//! Measures what signing a checkpoint per group commit costs: the Ed25519 signature alone, and
//! the latency of one awaited append (segment fsync + signed checkpoint + checkpoint fsync)
//! against the same log's segment fsync alone.
//!
//! `cargo run --release -p inferno-audit --example commit_cost [DIR]` (DIR: a directory on the
//! disk to measure; a temporary directory by default).

use std::time::{Duration, Instant};

use inferno_audit::note::{Checkpoint, NoteSigner};
use inferno_audit::{AuditConfig, AuditLog, RecordBody, SecurityEvent, StartInfo, StdFileOps};

const SIGNATURES: u32 = 2000;
const COMMITS: u32 = 200;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let signer = NoteSigner::generate("inferno.audit/commit-cost")?;
    let checkpoint = Checkpoint {
        origin: "inferno.audit/commit-cost".into(),
        size: 123_456,
        root: [7; 32],
    };
    let started = Instant::now();
    for _ in 0..SIGNATURES {
        std::hint::black_box(signer.sign_checkpoint(&checkpoint).render());
    }
    let per_signature = started.elapsed() / SIGNATURES;

    let base = match std::env::args().nth(1) {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let config = AuditConfig {
        dir: base.path().join("audit"),
        checkpoint_every_records: 0,
        checkpoint_every_seconds: 0,
        commit_interval_ms: 0,
        ..AuditConfig::default()
    };
    let log = AuditLog::open(
        &config,
        std::sync::Arc::new(StdFileOps),
        AuditLog::generate_signer(&config)?,
        StartInfo {
            software_version: "commit-cost".into(),
            evidence: Vec::new(),
        },
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut commits = Duration::ZERO;
    for i in 0..COMMITS {
        let event = SecurityEvent::Stopped {
            reason: format!("commit {i}"),
        };
        let started = Instant::now();
        runtime.block_on(log.append(RecordBody::Event(event)))?;
        commits += started.elapsed();
    }
    runtime.block_on(log.shutdown("measured"))?;
    println!(
        "checkpoint signature (sign + render): {:.1} us",
        per_signature.as_secs_f64() * 1e6
    );
    println!(
        "awaited append (group commit: segment fsync + signed checkpoint + checkpoint fsync): {:.1} us",
        (commits / COMMITS).as_secs_f64() * 1e6
    );
    Ok(())
}
