//! Audit-log benchmarks, run with `scripts/audit-bench.sh` (or
//! `cargo test --release --test audit_bench -- --ignored --nocapture --test-threads 1`):
//!
//! - `audit_writer_throughput`: requests per second the writer sustains (group commit with
//!   fsync); each simulated request awaits its request record, as the server does before it
//!   answers, then appends its completion record.
//! - `serving_throughput_with_and_without_audit`: the real server (`inferno serve`, embedded
//!   model, CPU backend) saturated by concurrent clients, with and without `[audit]`: both
//!   servers run side by side and short measurement windows alternate between them (the order
//!   alternating between pairs); prints each pair's throughputs, server CPU time per request
//!   and costs, then the median costs and their spread (quartiles, min and max over the
//!   pairs).

mod spawn_support;

use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferno_audit::{AuditConfig, AuditSink, CompletionFacts, ContentMode, RequestFacts};

#[test]
#[ignore = "benchmark; run explicitly"]
fn audit_writer_throughput() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        dir: tmp.path().to_path_buf(),
        ..AuditConfig::default()
    };
    let sink = Arc::new(AuditSink::open(&cfg, ContentMode::None, "bench").expect("opens"));
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
                                client_request_id: None,
                                principal: "bench",
                                endpoint: "/v1/chat/completions",
                                model_digest: "sha256:00",
                                stream: true,
                                prompt: &prompt,
                                status: None,
                                constraint: None,
                                transport: None,
                            })
                            .await
                            .expect("request record");
                            sink.completion(CompletionFacts {
                                request_id: id,
                                prompt_tokens: 500,
                                completion_tokens: 200,
                                finish_reason: Some("stop".into()),
                                status: 200,
                                latency_ms: 1000,
                                completion: None,
                            })
                            .expect("completion record");
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

fn serve(audit_dir: Option<&Path>, work: &Path) -> (Child, String) {
    let audit = match audit_dir {
        Some(dir) => format!("[audit]\ndir = {:?}\n", dir.to_str().expect("utf8")),
        None => String::new(),
    };
    let toml = format!("[attestation]\nprofile = \"development\"\n{audit}");
    spawn_support::spawn_server(&toml, work, "error")
}

/// Saturates the server for `secs` seconds with `clients` concurrent clients; returns requests/s.
fn saturate(rt: &tokio::runtime::Runtime, base: &str, clients: usize, secs: u64) -> f64 {
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("client");
        let stop = Instant::now() + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (client, base) = (client.clone(), base.to_owned());
                tokio::spawn(async move {
                    let mut done = 0u64;
                    let body = serde_json::json!({
                        "model": "inferno-tiny",
                        "prompt": "Once upon a time",
                        "max_tokens": 16,
                    });
                    while Instant::now() < stop {
                        let sent = client
                            .post(format!("{base}/v1/completions"))
                            .json(&body)
                            .send()
                            .await;
                        if let Ok(r) = sent
                            && r.status().is_success()
                            && r.bytes().await.is_ok()
                        {
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("task");
        }
        total as f64 / secs as f64
    })
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Pairs of measurement windows of the serving benchmark (`AUDIT_BENCH_PAIRS`, default 12).
fn pairs() -> usize {
    std::env::var("AUDIT_BENCH_PAIRS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(12)
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, normally 100).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU seconds (user and system, every thread, exited ones included) used so far by `pid`.
fn cpu_seconds(pid: u32, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / ticks
}

/// One measurement window on one server: requests/s and server CPU milliseconds per request.
#[derive(Debug, Clone, Copy)]
struct Window {
    rate: f64,
    cpu_ms: f64,
}

fn window(
    rt: &tokio::runtime::Runtime,
    server: (&Child, &str),
    clients: usize,
    secs: u64,
    ticks: f64,
) -> Window {
    let before = cpu_seconds(server.0.id(), ticks);
    let rate = saturate(rt, server.1, clients, secs);
    let used = cpu_seconds(server.0.id(), ticks) - before;
    Window {
        rate,
        cpu_ms: used * 1000.0 / (rate * secs as f64).max(1.0),
    }
}

/// Median, quartiles, min and max of `values`, as text.
fn spread(values: &mut [f64]) -> String {
    let n = values.len();
    let m = median(values);
    let q = |k: usize| values[(k * (n - 1)) / 4];
    format!(
        "median {m:+.2}%, quartiles {:+.2}% .. {:+.2}%, min {:+.2}%, max {:+.2}%",
        q(1),
        q(3),
        values[0],
        values[n - 1]
    )
}

#[test]
#[ignore = "benchmark; run explicitly"]
fn serving_throughput_with_and_without_audit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let clients = 32;
    let secs = 3;
    let ticks = clock_ticks();
    // Both servers run side by side for the whole benchmark (an idle one costs nothing), and
    // short windows alternate between them: drift in the machine's load (other processes)
    // then hits both sides alike. Besides throughput, each window measures the server's CPU
    // time per request, which other processes on the machine disturb far less.
    let plain_work = tmp.path().join("plain");
    let audited_work = tmp.path().join("audited");
    std::fs::create_dir_all(&plain_work).expect("work dir");
    std::fs::create_dir_all(&audited_work).expect("work dir");
    let audit_dir = tmp.path().join("audit");
    // `AUDIT_BENCH_CALIBRATE=1`: the second server runs without the log too; the "cost" of
    // that run is the noise floor (and any bias between the two slots) of this machine.
    let calibrate = std::env::var_os("AUDIT_BENCH_CALIBRATE").is_some_and(|v| v == "1");
    if calibrate {
        println!("calibration: both servers run WITHOUT the audit log");
    }
    let (mut plain, plain_base) = serve(None, &plain_work);
    let (mut audited, audited_base) =
        serve((!calibrate).then_some(audit_dir.as_path()), &audited_work);
    saturate(&rt, &plain_base, clients, 1);
    saturate(&rt, &audited_base, clients, 1);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut costs, mut cpu_costs) = (Vec::new(), Vec::new());
    for pair in 0..pairs() {
        let measure = |audit: bool| {
            let server = if audit {
                (&audited, audited_base.as_str())
            } else {
                (&plain, plain_base.as_str())
            };
            window(&rt, server, clients, secs, ticks)
        };
        let (a, b) = if pair.is_multiple_of(2) {
            let b = measure(false);
            (measure(true), b)
        } else {
            let a = measure(true);
            (a, measure(false))
        };
        let cost = (b.rate - a.rate) / b.rate * 100.0;
        let cpu_cost = (a.cpu_ms - b.cpu_ms) / b.cpu_ms * 100.0;
        println!(
            "pair {pair:>2}: without the log {:7.1} requests/s, {:.3} CPU ms/request; with it {:7.1} requests/s, {:.3} CPU ms/request: throughput cost {cost:+.2}%, CPU cost {cpu_cost:+.2}%",
            b.rate, b.cpu_ms, a.rate, a.cpu_ms
        );
        with.push(a.rate);
        without.push(b.rate);
        costs.push(cost);
        cpu_costs.push(cpu_cost);
    }
    for child in [&mut plain, &mut audited] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (with_median, without_median) = (median(&mut with), median(&mut without));
    println!(
        "{} pairs of {secs} s windows: median {without_median:.1} requests/s without the audit log, {with_median:.1} with it (cost of the medians {:+.2}%)",
        costs.len(),
        (without_median - with_median) / without_median * 100.0,
    );
    println!("throughput cost per pair: {}", spread(&mut costs));
    println!("CPU-per-request cost per pair: {}", spread(&mut cpu_costs));
}
