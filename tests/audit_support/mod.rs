//! A log written through the real writer with what a server's log holds: requests of several
//! principals answered 200, refused (429, 401) or failed (500), client request ids, HMAC'd
//! content, and the start-up events of a run on the simulated TEE.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use inferno_audit::{
    AuditConfig, AuditLog, CompletionRecord, ContentMode, ContentPolicy, RecordBody, RequestRecord,
    SecurityEvent, StartInfo, StdFileOps,
};

/// Runs `inferno audit ARGS`.
pub fn audit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .arg("audit")
        .args(args)
        .output()
        .expect("runs inferno")
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What [`write_log`] wrote: (principal, status) per request, in order.
pub const REQUESTS: [(&str, u16); 9] = [
    ("alice", 200),
    ("alice", 200),
    ("bob", 200),
    ("bob", 429),
    ("alice", 401),
    ("carol", 500),
    ("alice", 200),
    ("bob", 429),
    ("carol", 200),
];

/// Writes the log into `dir`; request `i` has server id `req-i` and client id `client-i`.
pub fn write_log(dir: &Path) {
    let cfg = AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 5,
        checkpoint_every_seconds: 0,
        ..AuditConfig::default()
    };
    let signer = AuditLog::generate_signer(&cfg).expect("signer");
    let start = StartInfo {
        software_version: "report-test".into(),
        evidence: Vec::new(),
    };
    let log = AuditLog::open(&cfg, Arc::new(StdFileOps), signer, start).expect("opens");
    let hmac = ContentPolicy::new(ContentMode::Hmac, Some(&[7u8; 32])).expect("policy");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let event = |e: SecurityEvent| log.append(RecordBody::Event(e));
        event(SecurityEvent::Appraisal {
            subject: "startup".into(),
            report_digest: "ab".repeat(32),
            passed: true,
            detail: "policy \"development\" (sha256 cd), SIMULATED TEE".into(),
        })
        .await
        .expect("append");
        event(SecurityEvent::PolicyConfig {
            policy_digest: Some("cd".repeat(32)),
            config_digest: None,
            content_mode: "hmac".into(),
        })
        .await
        .expect("append");
        event(SecurityEvent::KeyRelease {
            key_id: "model-key".into(),
            released: false,
            reason: "policy refused the evidence".into(),
        })
        .await
        .expect("append");
        for (i, (principal, status)) in REQUESTS.iter().enumerate() {
            let id = format!("req-{i}");
            let refused = *status == 429 || *status == 401;
            let prompt = hmac.seal("prompt", &id, "a prompt").expect("seal");
            log.append(RecordBody::Request(RequestRecord {
                request_id: id.clone(),
                client_request_id: Some(format!("client-{i}")),
                principal: (*principal).into(),
                endpoint: "/v1/chat/completions".into(),
                model_digest: "ef".repeat(32),
                stream: i % 2 == 0,
                prompt,
                status: refused.then_some(*status),
                constraint: None,
                transport: None,
            }))
            .await
            .expect("append");
            if !refused {
                let completion = hmac.seal("completion", &id, "an answer").expect("seal");
                log.append(RecordBody::Completion(CompletionRecord {
                    request_id: id,
                    prompt_tokens: 10 + i as u64,
                    completion_tokens: 20 + i as u64,
                    finish_reason: Some("stop".into()),
                    status: *status,
                    latency_ms: 15,
                    completion,
                }))
                .await
                .expect("append");
            }
        }
        event(SecurityEvent::GpuReady {
            ready: false,
            detail: "no GPU: model m (ef) serves on the CPU backend".into(),
        })
        .await
        .expect("append");
        log.shutdown("report test").await.expect("shutdown");
    });
}
