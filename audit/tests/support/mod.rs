//! Helpers shared by the audit crate's integration tests: opening a log with a fresh checkpoint
//! key, and request and completion records. Each test binary uses a subset.

#![allow(dead_code)]

use std::sync::Arc;

use inferno_audit::{
    AuditConfig, AuditError, AuditLog, CompletionRecord, FileOps, RecordBody, RequestRecord,
    SealedContent, StartInfo, StdFileOps,
};

/// Opens the log of `cfg` through `ops`, with a freshly generated checkpoint key.
pub fn open_with(cfg: &AuditConfig, ops: Arc<dyn FileOps>) -> Result<AuditLog, AuditError> {
    let signer = AuditLog::generate_signer(cfg)?;
    AuditLog::open(
        cfg,
        ops,
        signer,
        StartInfo {
            software_version: "test".into(),
            evidence: Vec::new(),
        },
    )
}

/// Opens the log of `cfg` on the real file system.
pub fn open(cfg: &AuditConfig) -> AuditLog {
    open_with(cfg, Arc::new(StdFileOps)).expect("log opens")
}

/// A runtime for driving the log's futures from a plain test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// An accepted generation request with id `id`.
pub fn request(id: &str) -> RecordBody {
    RecordBody::Request(RequestRecord {
        request_id: id.into(),
        client_request_id: None,
        principal: "key-1".into(),
        endpoint: "/v1/chat/completions".into(),
        model_digest: "sha256:00".into(),
        stream: false,
        prompt: SealedContent::None,
        status: None,
        constraint: None,
        transport: None,
    })
}

/// The completion of request `id`.
pub fn completion(id: &str) -> RecordBody {
    RecordBody::Completion(CompletionRecord {
        request_id: id.into(),
        prompt_tokens: 3,
        completion_tokens: 5,
        finish_reason: Some("stop".into()),
        status: 200,
        latency_ms: 12,
        completion: SealedContent::None,
    })
}
