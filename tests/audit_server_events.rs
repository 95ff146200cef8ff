//! The security events the real server writes to its audit log (in-process, the embedded model
//! on the CPU backend): each records what happened on this machine.

mod server_support;

use inferno::config::Config;
use inferno_audit::{AuditConfig, RecordBody, SecurityEvent, read_records};
use server_support::{Harness, base_config, runtime};

#[test]
fn a_model_served_on_the_cpu_records_no_gpu_ready_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config: Config = base_config();
    config.audit = Some(AuditConfig {
        dir: tmp.path().to_path_buf(),
        ..AuditConfig::default()
    });
    let mut harness = Harness::start(config, true);
    runtime().block_on(harness.take_server().shutdown());
    let gpu_events: Vec<(bool, String)> = read_records(tmp.path())
        .expect("the log reads")
        .into_iter()
        .filter_map(|r| match r.record.body {
            RecordBody::Event(SecurityEvent::GpuReady { ready, detail }) => Some((ready, detail)),
            _ => None,
        })
        .collect();
    assert_eq!(gpu_events.len(), 1, "{gpu_events:?}");
    let (ready, detail) = &gpu_events[0];
    assert!(!ready, "the CPU backend has no GPU to be ready: {detail}");
    assert!(detail.starts_with("no GPU: "), "{detail}");
    assert!(detail.contains("CPU backend"), "{detail}");
}
