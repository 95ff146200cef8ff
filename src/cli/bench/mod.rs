//! `inferno bench`: throughput and latency of the engine alone (`offline`) or of a running
//! server over HTTPS (`serve`). Prints a table and optionally writes the figures as JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::backend::{self, Device};
use crate::constrain::{
    CompiledConstraint, ConstraintKind, ConstraintSource, ConstraintSpec, GrammarCompiler,
};
use crate::engine::{
    BLOCK_SIZE, Backend, BackendError, BatchRow, Engine, EngineConfig, EngineHandle, EngineStats,
    GenerationEvent, GenerationRequest, KvCacheShape, ModelInfo, SamplingParams, StepOutput,
    StopParams, itl_stall_limit_in_force,
};
use crate::model::Model;

mod serve;

/// Arguments of `inferno bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, clap::Subcommand)]
enum Mode {
    /// Drive the engine in-process: no HTTP, no TLS.
    Offline(Box<OfflineArgs>),
    /// Drive a running `inferno serve` over HTTPS (OpenAI streaming completions).
    Serve(Box<ServeArgs>),
}

/// The request mix shared by both modes.
#[derive(Debug, Clone, clap::Args)]
struct LoadArgs {
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Requests in flight at once (closed loop).
    #[arg(long, conflicts_with = "batch_size")]
    concurrency: Option<usize>,
    /// Submit this many requests at once and wait for all (a batch of the same size).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Total requests (default: the batch size, or 4 x the concurrency).
    #[arg(long)]
    num_prompts: Option<usize>,
    /// Keep generating past EOS so every request produces exactly `output_len` tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sampling temperature of every request (0: greedy; above 0 draws from the whole
    /// distribution, as an OpenAI client's default of 1 does).
    #[arg(long, default_value_t = 0.0, value_parser = temperature)]
    temperature: f32,
    /// Write the figures to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A sampling temperature: a finite number from 0 to 2, the range the API accepts.
fn temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if (0.0..=2.0).contains(&t) => Ok(t),
        _ => Err(format!("{s:?} is not a temperature from 0 to 2")),
    }
}

impl LoadArgs {
    fn concurrency(&self) -> usize {
        self.batch_size.or(self.concurrency).unwrap_or(1).max(1)
    }
    fn num_prompts(&self) -> usize {
        self.num_prompts.unwrap_or(match self.batch_size {
            Some(b) => b,
            None => 4 * self.concurrency(),
        })
    }
}

#[derive(Debug, clap::Args)]
struct OfflineArgs {
    /// The model directory.
    #[arg(long)]
    model: PathBuf,
    /// cpu, cuda or auto.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Fraction of free GPU memory for the KV cache.
    #[arg(long)]
    gpu_memory_fraction: Option<f64>,
    /// Most tokens per engine step.
    #[arg(long)]
    max_batched_tokens: Option<usize>,
    /// The engine's `itl_stall_limit` (a step carrying prompt chunks takes at most this many
    /// decode steps' time while sequences decode; 1.0 or less: no limit). Default: no limit (an
    /// offline run is a batch job; no client waits on a stream); 1.5 is the serving default.
    #[arg(long)]
    itl_stall_limit: Option<f64>,
    /// Run every decode step eagerly instead of replaying CUDA graphs (for A/B comparisons).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Run steps that carry prompt tokens wholly eagerly instead of replaying their segments
    /// between attention launches from CUDA graphs (for A/B comparisons).
    #[arg(long)]
    no_mixed_graphs: bool,
    /// Launch CUDA kernels in plain stream order instead of with programmatic dependent launch
    /// (for A/B comparisons).
    #[arg(long)]
    no_programmatic_launch: bool,
    /// Quantize a 16-bit checkpoint's projections when loading it (`fp8`).
    #[arg(long, value_enum, value_name = "FORMAT")]
    quantization: Option<crate::model::QuantizeAtLoad>,
    /// The KV cache's element type: `auto` or `fp8`.
    #[arg(long, value_enum, value_name = "DTYPE")]
    kv_cache_dtype: Option<crate::engine::KvCacheDtype>,
    /// Submit every prompt as an embedding request (its last token's final hidden state, no
    /// output token) instead of a generation; `--output-len` is then not used.
    #[arg(long)]
    embeddings: bool,
    /// Constrain every request's output to the JSON schema in this file, as `response_format`
    /// `json_schema` does (the grammar compiled once, against the model's tokenizer).
    #[arg(long, value_name = "FILE", conflicts_with = "embeddings")]
    json_schema: Option<PathBuf>,
    #[command(flatten)]
    speculation: SpeculationArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// `bench offline`'s speculative decoding (`[speculative]`, `docs/engine.md`).
#[derive(Debug, Clone, clap::Args)]
struct SpeculationArgs {
    /// Speculative decoding with this proposer (`ngram`).
    #[arg(long, value_enum)]
    speculative: Option<crate::engine::SpeculativeMethod>,
    /// The most tokens proposed per sequence and step.
    #[arg(long, requires = "speculative")]
    num_speculative_tokens: Option<usize>,
    /// Propose up to K whenever lookup matches, instead of the adaptive rule.
    #[arg(long, requires = "speculative")]
    no_adaptive_speculation: bool,
    /// Test mode for performance predictions: accept each proposal with this probability
    /// whatever the model says, proposals padded to K (the output is not the model's).
    #[arg(long, requires = "speculative", value_name = "SHARE")]
    forced_acceptance: Option<f64>,
}

impl SpeculationArgs {
    /// The `[speculative]` table these flags make.
    fn config(&self) -> crate::engine::SpeculativeConfig {
        let defaults = crate::engine::SpeculativeConfig::default();
        crate::engine::SpeculativeConfig {
            method: self.speculative,
            num_speculative_tokens: self
                .num_speculative_tokens
                .unwrap_or(defaults.num_speculative_tokens),
            adaptive: !self.no_adaptive_speculation,
            forced_acceptance: self.forced_acceptance,
            ..defaults
        }
    }
}

/// Speculative decoding over a `bench offline` run.
#[derive(Debug, Serialize)]
struct Speculation {
    /// Rows that verified proposals.
    verifications: u64,
    /// Tokens proposed in them.
    draft_tokens: u64,
    /// Of those, accepted.
    accepted_tokens: u64,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Base URL of the server, e.g. https://127.0.0.1:8443.
    #[arg(long)]
    url: String,
    /// The served model id.
    #[arg(long)]
    model: String,
    /// API key (Bearer token).
    #[arg(long, env = "INFERNO_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// PEM file with the CA (or self-signed certificate) that the server's TLS chain ends in.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Skip verification of the server certificate (local benchmarks only).
    #[arg(long)]
    insecure: bool,
    /// Open-loop Poisson arrivals at this many requests per second instead of a closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// The server's process id, to report its CPU time per output token.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Tokens at the start of every prompt that all prompts share (a cached prefix after the
    /// first request); the rest of each prompt is its own. 0: prompts share nothing.
    #[arg(long, default_value_t = 0)]
    shared_prefix_len: usize,
    /// Also send one prompt of this many tokens while the run is under way, report its timings
    /// on their own, and keep it out of the run's figures (how a long prompt arriving mid-run
    /// disturbs the running streams).
    #[arg(long)]
    long_prompt_len: Option<usize>,
    /// Seconds after the start of the run at which the long prompt is sent.
    #[arg(long, default_value_t = 2.0, requires = "long_prompt_len")]
    long_prompt_after: f64,
    #[command(flatten)]
    load: LoadArgs,
}

/// Timings of one request.
#[derive(Debug, Clone, Default)]
struct RequestTiming {
    ttft: f64,
    itl: Vec<f64>,
    e2e: f64,
    output_tokens: usize,
    prompt_tokens: usize,
    failed: Option<String>,
}

/// p50/p90/p99 and mean of a sample, in milliseconds.
#[derive(Debug, Clone, Serialize, Default)]
struct Percentiles {
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
}

impl Percentiles {
    fn of(seconds: &[f64]) -> Self {
        if seconds.is_empty() {
            return Self::default();
        }
        let mut v: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
        Self {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Serialize)]
struct Report {
    mode: &'static str,
    target: String,
    input_len: usize,
    output_len: usize,
    /// Every request's sampling temperature.
    temperature: f32,
    concurrency: usize,
    rate: Option<f64>,
    requests: usize,
    failed: usize,
    /// The causes of the failed requests, each once, most frequent first, with their counts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failures: Vec<(String, usize)>,
    duration_s: f64,
    request_throughput: f64,
    output_token_throughput: f64,
    total_output_tokens: usize,
    ttft_ms: Percentiles,
    tpot_ms: Percentiles,
    itl_ms: Percentiles,
    e2e_ms: Percentiles,
    cpu_ms_per_output_token: Option<f64>,
    /// The measured process's CPU over the run, in cores (CPU time over wall time).
    cpu_cores: Option<f64>,
    /// The server's CPU by thread group (`bench serve --server-pid` only).
    server_threads: Vec<super::thread_cpu::GroupCpu>,
    /// The long prompt sent mid-run, if any: prompt tokens, TTFT and end-to-end time.
    long_prompt: Option<LongPrompt>,
    /// The engine thread's CPU over the run, split into its host work and its time inside
    /// backend steps (`bench serve`: from the server's `/metrics`).
    engine_split: Vec<super::thread_cpu::GroupCpu>,
    /// The engine's `itl_stall_limit` in force (`bench offline` only; 1.0 or less: none).
    itl_stall_limit: Option<f64>,
    /// Engine steps over the run (`bench offline` only).
    engine_steps: Option<u64>,
    /// Speculative decoding over the run (`bench offline --speculative` only).
    speculation: Option<Speculation>,
    /// Wall-clock seconds the device waited for the engine thread between steps over the run
    /// (`EngineStats::step_gap_seconds`; `bench offline` only).
    engine_step_gaps_s: Option<f64>,
}

/// Timings of the long prompt sent while a serving run was under way.
#[derive(Debug, Serialize)]
struct LongPrompt {
    prompt_tokens: usize,
    sent_after_s: f64,
    ttft_ms: f64,
    e2e_ms: f64,
    failed: Option<String>,
}

impl Report {
    fn new(
        mode: &'static str,
        target: String,
        load: &LoadArgs,
        rate: Option<f64>,
        timings: &[RequestTiming],
        duration: f64,
        cpu_s: Option<f64>,
    ) -> Self {
        let ok: Vec<&RequestTiming> = timings.iter().filter(|t| t.failed.is_none()).collect();
        let total: usize = ok.iter().map(|t| t.output_tokens).sum();
        let tpot: Vec<f64> = ok
            .iter()
            .filter(|t| t.output_tokens > 1)
            .map(|t| (t.e2e - t.ttft) / (t.output_tokens - 1) as f64)
            .collect();
        let itl: Vec<f64> = ok.iter().flat_map(|t| t.itl.iter().copied()).collect();
        Self {
            mode,
            target,
            input_len: load.input_len,
            output_len: load.output_len,
            temperature: load.temperature,
            concurrency: load.concurrency(),
            rate,
            requests: ok.len(),
            failed: timings.len() - ok.len(),
            failures: failure_causes(timings),
            duration_s: duration,
            request_throughput: ok.len() as f64 / duration,
            output_token_throughput: total as f64 / duration,
            total_output_tokens: total,
            ttft_ms: Percentiles::of(&ok.iter().map(|t| t.ttft).collect::<Vec<_>>()),
            tpot_ms: Percentiles::of(&tpot),
            itl_ms: Percentiles::of(&itl),
            e2e_ms: Percentiles::of(&ok.iter().map(|t| t.e2e).collect::<Vec<_>>()),
            cpu_ms_per_output_token: cpu_s.filter(|_| total > 0).map(|s| s * 1e3 / total as f64),
            cpu_cores: cpu_s.filter(|_| duration > 0.0).map(|s| s / duration),
            server_threads: Vec::new(),
            long_prompt: None,
            engine_split: Vec::new(),
            itl_stall_limit: None,
            engine_steps: None,
            speculation: None,
            engine_step_gaps_s: None,
        }
    }

    fn print(&self) {
        println!("mode                      {} ({})", self.mode, self.target);
        println!(
            "input/output tokens       {} / {}",
            self.input_len, self.output_len
        );
        println!("temperature               {}", self.temperature);
        match self.itl_stall_limit.map(itl_stall_limit_in_force) {
            Some(Some(limit)) => println!("ITL stall limit           {limit}x a decode step"),
            Some(None) => println!("ITL stall limit           none"),
            None => {}
        }
        match self.rate {
            Some(r) => println!("arrivals                  Poisson, {r} req/s"),
            None => println!("concurrency               {}", self.concurrency),
        }
        println!(
            "requests (failed)         {} ({})",
            self.requests, self.failed
        );
        for (cause, count) in &self.failures {
            println!("  failed ({count:>4})           {cause}");
        }
        println!("duration                  {:.2} s", self.duration_s);
        println!(
            "request throughput        {:.3} req/s",
            self.request_throughput
        );
        println!(
            "output throughput         {:.1} tok/s",
            self.output_token_throughput
        );
        println!(
            "{:<25} {:>10} {:>10} {:>10} {:>10}",
            "latency (ms)", "mean", "p50", "p90", "p99"
        );
        for (name, p) in [
            ("TTFT", &self.ttft_ms),
            ("TPOT", &self.tpot_ms),
            ("ITL", &self.itl_ms),
            ("E2E", &self.e2e_ms),
        ] {
            println!(
                "{name:<25} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                p.mean, p.p50, p.p90, p.p99
            );
        }
        if let Some(cpu) = self.cpu_ms_per_output_token {
            println!("CPU time per output token {cpu:.3} ms");
        }
        if let Some(cores) = self.cpu_cores {
            println!("CPU cores (CPU / wall)    {cores:.3}");
        }
        for group in &self.server_threads {
            println!(
                "  {:<23} {:>8.3} ms/token {:>7.3} cores {:>8.2} s",
                format!("{} threads", group.group),
                group.ms_per_output_token.unwrap_or(0.0),
                group.cores,
                group.seconds
            );
        }
        for part in &self.engine_split {
            println!(
                "    {:<21} {:>8.3} ms/token {:>7.3} cores {:>8.2} s",
                part.group,
                part.ms_per_output_token.unwrap_or(0.0),
                part.cores,
                part.seconds
            );
        }
        if let Some(steps) = self.engine_steps.filter(|&n| n > 0) {
            println!(
                "engine steps              {steps}: {:.3} ms each, host work {:.3} ms per step, \
                 {:.3} ms between steps",
                self.duration_s * 1e3 / steps as f64,
                self.engine_split
                    .iter()
                    .find(|part| part.group == HOST_WORK)
                    .map_or(0.0, |host| host.seconds * 1e3 / steps as f64),
                self.engine_step_gaps_s.unwrap_or(0.0) * 1e3 / steps as f64
            );
        }
        if let Some(spec) = &self.speculation {
            println!(
                "speculation               {} verifications, {} proposed, {} accepted \
                 ({:.1}%), {:.2} tokens per verification",
                spec.verifications,
                spec.draft_tokens,
                spec.accepted_tokens,
                100.0 * spec.accepted_tokens as f64 / spec.draft_tokens.max(1) as f64,
                1.0 + spec.accepted_tokens as f64 / spec.verifications.max(1) as f64
            );
        }
        if let Some(long) = &self.long_prompt {
            match &long.failed {
                None => println!(
                    "long prompt               {} tokens sent at {:.1} s: TTFT {:.2} ms, E2E {:.2} ms",
                    long.prompt_tokens, long.sent_after_s, long.ttft_ms, long.e2e_ms
                ),
                Some(err) => println!("long prompt               failed: {err}"),
            }
        }
    }
}

/// CPU time (user + system) of a process in seconds, from /proc (Linux clock ticks of 1/100 s).
fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Random prompts of ordinary tokens: ids from the upper three quarters of the vocabulary, where
/// special tokens (usually at the start or the very end) are rare.
fn random_prompts(load: &LoadArgs, vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(load.seed);
    let (lo, hi) = (
        (vocab / 4) as u32,
        vocab.saturating_sub(256).max(vocab / 2) as u32,
    );
    (0..load.num_prompts())
        .map(|_| {
            (0..load.input_len)
                .map(|_| rng.random_range(lo..hi))
                .collect()
        })
        .collect()
}

/// Runs `inferno bench`. Logs (the backend's start-up timeline among them) go to stderr,
/// filtered by `RUST_LOG` (default `info`).
pub fn run(args: BenchArgs) -> ExitCode {
    super::init_tracing();
    let result = match args.mode {
        Mode::Offline(a) => offline(*a),
        Mode::Serve(a) => serve::serve(*a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::fail(&e),
    }
}

fn finish(report: &Report, json: Option<&PathBuf>) -> anyhow::Result<()> {
    report.print();
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some((cause, count)) = report.failures.first() {
        bail!(
            "{} of {} requests failed; {count} with: {cause}{}",
            report.failed,
            report.failed + report.requests,
            trust_hint(cause),
        );
    }
    Ok(())
}

/// The distinct causes among `timings`' failures with their counts, most frequent first.
fn failure_causes(timings: &[RequestTiming]) -> Vec<(String, usize)> {
    let mut causes: Vec<(String, usize)> = Vec::new();
    for cause in timings.iter().filter_map(|t| t.failed.as_deref()) {
        match causes.iter_mut().find(|(c, _)| c == cause) {
            Some((_, count)) => *count += 1,
            None => causes.push((cause.to_owned(), 1)),
        }
    }
    causes.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    causes
}

/// What to do about a failure that is the server's certificate not being trusted.
fn trust_hint(cause: &str) -> &'static str {
    if cause.contains("certificate") || cause.contains("UnknownIssuer") {
        " (the server's certificate is not trusted: pass it with --ca-cert FILE, or --insecure \
         for a self-signed development server)"
    } else {
        ""
    }
}

/// `bench offline`'s ITL stall limit unless `--itl-stall-limit` is given: none. An offline run is
/// a batch job in which no client waits on a stream, so a step may carry prompt chunks up to
/// `max_batched_tokens` while sequences decode; the serving default (`EngineConfig`'s 1.5)
/// protects streams' inter-token latency at the cost of a burst's throughput (batch 64,
/// 1000/256 on an H200: 3,579 against 4,599 output tok/s, and a longer median step, because
/// prompts spread over more mixed steps; `docs/engine.md`, "Scheduler defaults, measured").
/// vLLM likewise gives its offline entry point a larger per-step token budget than its server.
const OFFLINE_ITL_STALL_LIMIT: f64 = 0.0;

fn offline(args: OfflineArgs) -> anyhow::Result<()> {
    let load = &args.load;
    let mut model =
        Model::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    if let Some(quantize) = args.quantization {
        quantize.apply(&mut model.config);
    }
    if model.config.headless && !args.embeddings {
        bail!(
            "{} is an embedding model without an LM head: it cannot generate (use --embeddings)",
            args.model.display()
        );
    }
    let embed = args.embeddings;
    let concurrency = load.concurrency();
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        // Derived from the KV cache unless the load asks for more rows than the derived cap.
        max_num_seqs: (concurrency > crate::engine::MAX_NUM_SEQS_CAP).then_some(concurrency),
        max_batched_tokens: args
            .max_batched_tokens
            .unwrap_or(defaults.max_batched_tokens),
        itl_stall_limit: args.itl_stall_limit.unwrap_or(OFFLINE_ITL_STALL_LIMIT),
        gpu_memory_fraction: args
            .gpu_memory_fraction
            .unwrap_or(defaults.gpu_memory_fraction),
        max_waiting: load.num_prompts().max(defaults.max_waiting),
        prefix_caching: false,
        cuda_graphs: !args.no_cuda_graphs,
        cuda_mixed_graphs: !args.no_mixed_graphs,
        programmatic_launch: !args.no_programmatic_launch,
        kv_cache_dtype: args.kv_cache_dtype.unwrap_or(defaults.kv_cache_dtype),
        speculative: args.speculation.config(),
        ..defaults
    };
    let (dropped_tx, dropped) = std::sync::mpsc::channel();
    let backend = SignalOnDrop {
        inner: Some(backend::select(args.device, &model, &config)?),
        dropped: dropped_tx,
    };
    let target = format!("{} on {}", model.name, backend.name());
    let kv = backend.kv_cache();
    let info = ModelInfo {
        max_context: model
            .config
            .max_position_embeddings
            .min(kv.capacity_tokens()),
        ..ModelInfo::of(&model)
    };
    let stall_limit = config.itl_stall_limit;
    let config_speculative = config.speculative.enabled();
    let engine = Engine::spawn(Box::new(backend), info, config)?;
    let prompts = random_prompts(load, model.config.vocab_size);
    let constraint = args
        .json_schema
        .as_deref()
        .map(|path| compile_schema(&model, path))
        .transpose()?;

    // Each request is a task on one runtime thread, as the server's streams are tasks: with a
    // thread per request the engine thread woke a thread per token, and its host work at 256
    // rows on the H200 was 1.41 ms per step instead of 0.92 (`docs/performance.md`).
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    // Warm-up: one short request, so start-up work stays out of the figures.
    let warm = LoadArgs {
        output_len: 4,
        ..load.clone()
    };
    runtime.block_on(run_one(
        &engine,
        "warmup".into(),
        prompts[0].clone(),
        &warm,
        embed,
        constraint.clone(),
    ))?;

    let cpu_before = cpu_seconds(None);
    let engine_before = engine.stats();
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let prompts = Arc::new(prompts);
    let timings: Vec<RequestTiming> = runtime.block_on(async {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (engine, next, prompts, load, constraint) = (
                engine.clone(),
                next.clone(),
                prompts.clone(),
                load.clone(),
                constraint.clone(),
            );
            workers.spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(prompt) = prompts.get(i) else { break };
                    mine.push(
                        run_one(
                            &engine,
                            format!("bench-{i}"),
                            prompt.clone(),
                            &load,
                            embed,
                            constraint.clone(),
                        )
                        .await
                        .unwrap_or_else(|e| RequestTiming {
                            failed: Some(e.to_string()),
                            ..Default::default()
                        }),
                    );
                }
                mine
            });
        }
        let mut all = Vec::new();
        while let Some(done) = workers.join_next().await {
            all.extend(done.unwrap_or_default());
        }
        all
    });
    let duration = started.elapsed().as_secs_f64();
    let cpu = cpu_before.zip(cpu_seconds(None)).map(|(a, b)| b - a);
    let engine_after = engine.stats();
    engine.shutdown();
    // Leaving while the engine thread still frees device memory races the driver's exit handlers.
    if dropped.recv_timeout(Duration::from_secs(60)).is_err() {
        tracing::warn!("the engine did not release its backend within 60 s");
    }
    let mut report = Report::new("offline", target, load, None, &timings, duration, cpu);
    let cpu_parts = |s: &EngineStats| (s.host_work_seconds(), s.backend_cpu_seconds);
    report.engine_split =
        split_engine_cpu(cpu_parts(&engine_before), cpu_parts(&engine_after), &report);
    report.engine_steps = Some(engine_after.steps - engine_before.steps);
    report.speculation = config_speculative.then(|| Speculation {
        verifications: engine_after.spec_verifications - engine_before.spec_verifications,
        draft_tokens: engine_after.spec_draft_tokens - engine_before.spec_draft_tokens,
        accepted_tokens: engine_after.spec_accepted_tokens - engine_before.spec_accepted_tokens,
    });
    report.engine_step_gaps_s =
        Some(engine_after.step_gap_seconds - engine_before.step_gap_seconds);
    report.itl_stall_limit = Some(stall_limit);
    finish(&report, load.json.as_ref())
}

/// A backend that reports when the engine thread has dropped it.
struct SignalOnDrop {
    inner: Option<Box<dyn Backend>>,
    dropped: std::sync::mpsc::Sender<()>,
}

impl SignalOnDrop {
    fn inner(&self) -> Result<&dyn Backend, BackendError> {
        self.inner.as_deref().ok_or_else(released)
    }

    fn inner_mut(&mut self) -> Result<&mut (dyn Backend + 'static), BackendError> {
        self.inner.as_deref_mut().ok_or_else(released)
    }
}

impl Backend for SignalOnDrop {
    fn name(&self) -> &str {
        self.inner().map_or("released", |b| b.name())
    }

    fn kv_cache(&self) -> KvCacheShape {
        self.inner().map_or(
            KvCacheShape {
                num_blocks: 0,
                block_size: BLOCK_SIZE,
                groups: Default::default(),
            },
            |b| b.kv_cache(),
        )
    }

    fn max_rows(&self) -> Option<usize> {
        self.inner().ok().and_then(|b| b.max_rows())
    }

    fn step_sizes(&self) -> &[usize] {
        self.inner().map_or(&[], |b| b.step_sizes())
    }

    fn step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        self.inner_mut()?.step(rows)
    }

    fn start_step(&mut self, rows: &[BatchRow<'_>], late: &[bool]) -> Result<bool, BackendError> {
        self.inner_mut()?.start_step(rows, late)
    }

    fn finish_step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        self.inner_mut()?.finish_step(rows)
    }

    fn step_with_hidden(
        &mut self,
        rows: &[BatchRow<'_>],
        hidden: &[usize],
    ) -> Result<(StepOutput, Vec<Vec<f32>>), BackendError> {
        self.inner_mut()?.step_with_hidden(rows, hidden)
    }

    fn position_logits(&self) -> bool {
        self.inner().is_ok_and(|b| b.position_logits())
    }

    fn step_logits(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden: &[usize],
    ) -> Result<crate::engine::PositionOutput, BackendError> {
        self.inner_mut()?.step_logits(rows, positions, hidden)
    }

    fn sampled_positions(&self) -> bool {
        self.inner().is_ok_and(|b| b.sampled_positions())
    }

    fn step_sampled_positions(
        &mut self,
        rows: &[BatchRow<'_>],
        specs: &[&[crate::engine::SampleSpec<'_>]],
    ) -> Result<Vec<crate::engine::SampledToken>, BackendError> {
        self.inner_mut()?.step_sampled_positions(rows, specs)
    }
}

/// The error of a call on a [`SignalOnDrop`] whose backend was dropped.
fn released() -> BackendError {
    BackendError::Device("backend already released".into())
}

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        drop(self.inner.take());
        let _ = self.dropped.send(());
    }
}

/// Compiles the JSON schema in the file at `path` against `model`'s tokenizer.
fn compile_schema(model: &Model, path: &std::path::Path) -> anyhow::Result<CompiledConstraint> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let schema: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let compiler = GrammarCompiler::new(
        &model.tokenizer,
        &model.eos_token_ids(),
        model.config.vocab_size,
    )?;
    let spec = ConstraintSpec {
        kind: ConstraintKind::JsonSchema,
        source: ConstraintSource::JsonSchema(schema),
    };
    Ok(compiler.compile(&spec)?)
}

/// Runs one request to its end: a generation (held to `constraint` when given), or with `embed`
/// an embedding request (whose time to its hidden state is reported as its TTFT and end-to-end
/// time).
async fn run_one(
    engine: &EngineHandle,
    id: String,
    prompt: Vec<u32>,
    load: &LoadArgs,
    embed: bool,
    constraint: Option<CompiledConstraint>,
) -> anyhow::Result<RequestTiming> {
    let prompt_tokens = prompt.len();
    let request = GenerationRequest {
        id,
        prompt,
        sampling: SamplingParams {
            temperature: load.temperature,
            seed: Some(0),
            ..SamplingParams::default()
        },
        stop: StopParams {
            max_tokens: if embed { 1 } else { load.output_len },
            ignore_eos: load.ignore_eos,
            ..StopParams::default()
        },
        logprobs: None,
        cache_salt: 0,
        prompt_logprobs: None,
        constraint,
    };
    let started = Instant::now();
    let submitted = if embed {
        engine.submit_embedding(request)
    } else {
        engine.submit(request)
    };
    let mut stream = submitted.map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    let mut timing = RequestTiming {
        prompt_tokens,
        ..Default::default()
    };
    let mut last = None::<Instant>;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { .. } => {
                let now = Instant::now();
                match last {
                    None => timing.ttft = (now - started).as_secs_f64(),
                    Some(prev) => timing.itl.push((now - prev).as_secs_f64()),
                }
                last = Some(now);
                timing.output_tokens += 1;
            }
            GenerationEvent::Hidden { .. } => timing.ttft = started.elapsed().as_secs_f64(),
            GenerationEvent::Finished { reason, .. } => {
                if let crate::engine::FinishReason::Error(e) = reason {
                    bail!("request failed: {e}");
                }
                break;
            }
        }
    }
    timing.e2e = started.elapsed().as_secs_f64();
    Ok(timing)
}

/// The name of the engine thread's host work among its CPU parts.
const HOST_WORK: &str = "engine host work";

/// The engine thread's CPU between two readings of (host work, inside backend steps) seconds, per
/// part, over `report`'s run.
fn split_engine_cpu(
    before: (f64, f64),
    after: (f64, f64),
    report: &Report,
) -> Vec<super::thread_cpu::GroupCpu> {
    let parts = [
        (HOST_WORK, after.0 - before.0),
        ("engine backend steps", after.1 - before.1),
    ]
    .into_iter()
    .collect();
    super::thread_cpu::per_group(&parts, report.duration_s, report.total_output_tokens)
}

#[cfg(test)]
mod tests;
