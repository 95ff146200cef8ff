//! `inferno bench serve`: the load over HTTPS against a running server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};

use super::{LongPrompt, Report, RequestTiming, ServeArgs, cpu_seconds, finish, split_engine_cpu};
use crate::cli::thread_cpu;

pub(super) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve_async(args))
}

async fn serve_async(args: ServeArgs) -> anyhow::Result<()> {
    let load = &args.load;
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    if let Some(path) = &args.ca_cert {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        builder = builder.add_root_certificate(
            reqwest::Certificate::from_pem(&pem)
                .with_context(|| format!("parsing {}", path.display()))?,
        );
    }
    if args.insecure {
        builder = builder.danger_accept_invalid_certs(true);
    }
    let client = builder.build()?;
    let url = format!("{}/v1/completions", args.url.trim_end_matches('/'));
    if args.shared_prefix_len >= load.input_len.max(1) {
        bail!(
            "--shared-prefix-len ({}) must be below --input-len ({})",
            args.shared_prefix_len,
            load.input_len
        );
    }
    let n = load.num_prompts();
    let cpu_before = cpu_seconds(args.server_pid);
    let threads_before = args.server_pid.and_then(thread_cpu::Snapshot::of);
    let metrics_url = format!("{}/metrics", args.url.trim_end_matches('/'));
    let engine_before = engine_cpu(&client, &metrics_url, args.api_key.as_deref()).await;
    let started = Instant::now();
    let shared = Arc::new(Shared {
        client,
        url,
        model: args.model.clone(),
        key: args.api_key.clone(),
        input_len: load.input_len,
        shared_prefix_len: args.shared_prefix_len,
        seed: load.seed,
        temperature: load.temperature,
    });
    let long = args.long_prompt_len.map(|len| {
        let (shared, after) = (shared.clone(), args.long_prompt_after.max(0.0));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(after)).await;
            let long = Shared {
                input_len: len,
                shared_prefix_len: 0,
                ..(*shared).clone()
            };
            let timing = stream_request(&long, long.prompt(usize::MAX), 1, false).await;
            (after, timing)
        })
    });
    let mut tasks = tokio::task::JoinSet::new();
    match args.rate {
        Some(rate) if rate > 0.0 => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(load.seed);
            for i in 0..n {
                let shared = shared.clone();
                let (out, ignore_eos) = (load.output_len, load.ignore_eos);
                tasks.spawn(async move { stream_one(&shared, i, out, ignore_eos).await });
                // Exponential inter-arrival times give a Poisson process.
                let gap = -(1.0 - rng.random::<f64>()).ln() / rate;
                tokio::time::sleep(Duration::from_secs_f64(gap)).await;
            }
        }
        _ => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..load.concurrency() {
                let (shared, next) = (shared.clone(), next.clone());
                let (out, ignore_eos) = (load.output_len, load.ignore_eos);
                tasks.spawn(async move {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        mine.extend(stream_one(&shared, i, out, ignore_eos).await);
                    }
                    mine
                });
            }
        }
    }
    let mut timings = Vec::new();
    while let Some(done) = tasks.join_next().await {
        timings.extend(done?);
    }
    let duration = started.elapsed().as_secs_f64();
    let cpu = cpu_before
        .zip(cpu_seconds(args.server_pid))
        .map(|(a, b)| b - a);
    let threads_after = args.server_pid.and_then(thread_cpu::Snapshot::of);
    let engine_after = engine_cpu(&shared.client, &metrics_url, args.api_key.as_deref()).await;
    let mut report = Report::new(
        "serve",
        args.url.clone(),
        load,
        args.rate,
        &timings,
        duration,
        cpu,
    );
    if let Some((before, after)) = threads_before.zip(threads_after) {
        let groups = thread_cpu::split(&before, &after);
        report.server_threads =
            thread_cpu::per_group(&groups, duration, report.total_output_tokens);
    }
    if let Some((before, after)) = engine_before.zip(engine_after) {
        report.engine_split = split_engine_cpu(before, after, &report);
    }
    if let Some(long) = long {
        let (after, timing) = long.await?;
        report.long_prompt = Some(match timing {
            Ok(t) => LongPrompt {
                prompt_tokens: t.prompt_tokens,
                sent_after_s: after,
                ttft_ms: t.ttft * 1e3,
                e2e_ms: t.e2e * 1e3,
                failed: None,
            },
            Err(e) => LongPrompt {
                prompt_tokens: 0,
                sent_after_s: after,
                ttft_ms: 0.0,
                e2e_ms: 0.0,
                failed: Some(format!("{e:#}")),
            },
        });
    }
    finish(&report, load.json.as_ref())
}

/// What every request of a serving run shares.
#[derive(Clone)]
struct Shared {
    client: reqwest::Client,
    url: String,
    model: String,
    key: Option<String>,
    input_len: usize,
    shared_prefix_len: usize,
    seed: u64,
    temperature: f32,
}

impl Shared {
    /// The prompt of request `index`, as token ids (so its length is exact whatever the
    /// tokenizer): the run's shared prefix, then random ids of its own, all drawn from
    /// `PROMPT_IDS`, so no two prompts share more than the prefix in the prefix cache.
    fn prompt(&self, index: usize) -> Vec<u32> {
        let mut shared = rand::rngs::StdRng::seed_from_u64(self.seed);
        let mut own =
            rand::rngs::StdRng::seed_from_u64(self.seed ^ (index as u64 + 1).rotate_left(32));
        (0..self.input_len)
            .map(|i| {
                let rng = if i < self.shared_prefix_len {
                    &mut shared
                } else {
                    &mut own
                };
                rng.random_range(PROMPT_IDS)
            })
            .collect()
    }
}

/// Token ids the serving prompts are drawn from: ordinary tokens in every supported vocabulary
/// (the smallest, the test fixtures', has 1,024 ids; real models keep special tokens at the top
/// of much larger ones).
const PROMPT_IDS: std::ops::Range<u32> = 100..1000;

/// One streaming completion; returns a list so closed-loop workers and open-loop arrivals share
/// a result type.
async fn stream_one(
    shared: &Shared,
    index: usize,
    output_len: usize,
    ignore_eos: bool,
) -> Vec<RequestTiming> {
    let timing = match stream_request(shared, shared.prompt(index), output_len, ignore_eos).await {
        Ok(t) => t,
        Err(e) => RequestTiming {
            failed: Some(format!("{e:#}")),
            ..Default::default()
        },
    };
    vec![timing]
}

async fn stream_request(
    shared: &Shared,
    prompt: Vec<u32>,
    output_len: usize,
    ignore_eos: bool,
) -> anyhow::Result<RequestTiming> {
    let Shared {
        client,
        url,
        model,
        key,
        temperature,
        ..
    } = shared;
    let mut body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if ignore_eos {
        body["ignore_eos"] = serde_json::Value::Bool(true);
    }
    let mut request = client.post(url.as_str()).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let started = Instant::now();
    let mut response = request.send().await?;
    if !response.status().is_success() {
        let status = response.status();
        bail!(
            "HTTP {status}: {}",
            response.text().await.unwrap_or_default()
        );
    }
    let mut timing = RequestTiming::default();
    let mut buffer = String::new();
    let mut last = None::<Instant>;
    let mut usage_tokens = None;
    while let Some(chunk) = response.chunk().await? {
        let now = Instant::now();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    continue;
                }
                let value: serde_json::Value =
                    serde_json::from_str(data).context("a stream event is not JSON")?;
                if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
                    usage_tokens = usage["completion_tokens"].as_u64().map(|v| v as usize);
                    timing.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                }
                let has_text = value["choices"]
                    .get(0)
                    .and_then(|c| c["text"].as_str())
                    .is_some_and(|t| !t.is_empty());
                if has_text {
                    match last {
                        None => timing.ttft = (now - started).as_secs_f64(),
                        Some(prev) => timing.itl.push((now - prev).as_secs_f64()),
                    }
                    last = Some(now);
                    timing.output_tokens += 1;
                }
            }
        }
    }
    timing.e2e = started.elapsed().as_secs_f64();
    if let Some(n) = usage_tokens {
        timing.output_tokens = n;
    }
    Ok(timing)
}

/// The engine thread's CPU seconds (host work, inside backend steps) from the server's
/// `/metrics`; `None` when the server does not report them.
async fn engine_cpu(client: &reqwest::Client, url: &str, key: Option<&str>) -> Option<(f64, f64)> {
    let mut request = client.get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let text = request.send().await.ok()?.text().await.ok()?;
    thread_cpu::engine_cpu_from_metrics(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_share_exactly_the_requested_prefix() {
        let shared = |shared_prefix_len| Shared {
            client: reqwest::Client::new(),
            url: String::new(),
            model: String::new(),
            key: None,
            input_len: 300,
            shared_prefix_len,
            seed: 5,
            temperature: 0.0,
        };
        let common = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let none = shared(0);
        let (a, b) = (none.prompt(1), none.prompt(2));
        assert_eq!((a.len(), b.len()), (300, 300));
        assert!(common(&a, &b) < 3, "{a:?} {b:?}");
        assert_eq!(
            a,
            none.prompt(1),
            "a prompt is a function of the seed and the index"
        );
        let prefixed = shared(256);
        let (a, b) = (prefixed.prompt(1), prefixed.prompt(2));
        assert!((256..259).contains(&common(&a, &b)));
        assert!(a.iter().all(|id| PROMPT_IDS.contains(id)));
    }
}
