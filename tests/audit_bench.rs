//! Throughput of the audit writer (group commit with fsync), run with
//! `cargo test --release --test audit_bench -- --ignored --nocapture`.
//!
//! Each simulated request appends a request record (awaited, as the server does before it
//! answers) and then a completion record. The figure to compare with serving throughput is the
//! number of requests per second the log sustains at each concurrency.

use std::sync::Arc;
use std::time::Instant;

use inferno::audit::{AuditConfig, AuditSink, CompletionFacts, RequestFacts};

#[test]
#[ignore = "benchmark; run explicitly"]
fn audit_writer_throughput() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        dir: tmp.path().to_path_buf(),
        ..AuditConfig::default()
    };
    let sink = Arc::new(AuditSink::open(&cfg, "bench").expect("opens"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let prompt = "x".repeat(2000);
    for concurrency in [1usize, 16, 64, 256] {
        let per_task = 4000 / concurrency.min(64);
        let start = Instant::now();
        rt.block_on(async {
            let tasks: Vec<_> = (0..concurrency)
                .map(|t| {
                    let sink = Arc::clone(&sink);
                    let prompt = prompt.clone();
                    tokio::spawn(async move {
                        for i in 0..per_task {
                            let id = format!("{concurrency}-{t}-{i}");
                            sink.request(RequestFacts {
                                request_id: &id,
                                principal: "bench",
                                endpoint: "/v1/chat/completions",
                                model_digest: "sha256:00",
                                stream: true,
                                prompt: &prompt,
                            })
                            .await
                            .expect("request record");
                            let done = sink.completion(CompletionFacts {
                                request_id: id,
                                prompt_tokens: 500,
                                completion_tokens: 200,
                                finish_reason: Some("stop".into()),
                                status: 200,
                                latency_ms: 1000,
                                completion: None,
                            });
                            tokio::spawn(done);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
        });
        let n = concurrency * per_task;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "concurrency {concurrency:>4}: {n:>6} requests in {secs:.2}s = {:>8.0} requests/s, {:.3} ms per durable request record",
            n as f64 / secs,
            secs * 1000.0 * concurrency as f64 / n as f64
        );
    }
    rt.block_on(async { sink.shutdown("bench").await.expect("shutdown") });
    assert!(sink.failure().is_none());
}
