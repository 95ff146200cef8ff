//! Prometheus metrics under vLLM's metric names so existing dashboards work, served as
//! OpenMetrics or as the 0.0.4 text format as the scraper's `Accept` header asks ([`Format`]).
//!
//! Engine gauges and counters are refreshed from [`EngineStats`] at scrape time; token counters,
//! latency histograms and request counts are recorded by the handlers as requests finish. The
//! per-principal request counter lives in a registry of its own, rendered only for the scrape
//! key (`[metrics] key_sha256`): other scrapers do not learn the principals' names.

mod format;
mod process;
mod speculative;
mod step_tokens;

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use format::Format;

use crate::engine::{EngineConfig, EngineStats};

/// The `model_name` label every vLLM metric carries.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model_name: String,
}

/// Labels of the request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    model_name: String,
    endpoint: String,
    status: String,
}

/// Labels of the per-principal request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalRequestLabel {
    model_name: String,
    principal: String,
    endpoint: String,
    status: String,
}

/// Labels of the engine thread's CPU counter: `part` is `backend_step` or `host`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineCpuLabel {
    model_name: String,
    part: &'static str,
}

/// Labels of the finished-request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishLabel {
    model_name: String,
    finished_reason: String,
}

/// Labels of `vllm:cache_config_info` (vLLM's names).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheConfigLabel {
    block_size: String,
    num_gpu_blocks: String,
    gpu_memory_utilization: String,
    enable_prefix_caching: String,
}

/// Labels of `inferno:build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
}

type HistogramFamily = Family<ModelLabel, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ])
}

fn request_histogram() -> Histogram {
    Histogram::new([
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0,
    ])
}

/// Token counts: 1, 2, 5, 10, 20, 50, ... up to 1,000,000 (vLLM's 1-2-5 buckets).
fn token_histogram() -> Histogram {
    let mut buckets = Vec::new();
    let mut decade = 1.0;
    while decade <= 1e6 {
        for step in [1.0, 2.0, 5.0] {
            if step * decade <= 1e6 {
                buckets.push(step * decade);
            }
        }
        decade *= 10.0;
    }
    Histogram::new(buckets)
}

/// The state of the audit log and the attestation, as `/metrics` shows it.
#[derive(Debug, Clone, Default)]
pub struct ServerState {
    /// Whether an audit log is configured and open.
    pub audit_enabled: bool,
    /// Whether the audit log has failed, so every `/v1` request is refused (fail closed).
    pub audit_failed: bool,
    /// The audit log's durable records.
    pub audit_records: u64,
    /// The records its latest signed checkpoint covers, and that checkpoint's text (its age is
    /// counted from the first scrape that saw it).
    pub audit_checkpoint: Option<(u64, String)>,
}

/// All metrics of the server.
pub struct Metrics {
    /// What every scraper may read.
    registry: Registry,
    /// What only the scrape key reads: the per-principal series.
    private: Registry,
    running: Family<ModelLabel, Gauge>,
    waiting: Family<ModelLabel, Gauge>,
    kv_usage: Family<ModelLabel, FloatGauge>,
    prefix_queries: Family<ModelLabel, Counter>,
    prefix_hits: Family<ModelLabel, Counter>,
    preemptions: Family<ModelLabel, Counter>,
    engine_steps: Family<ModelLabel, Counter>,
    prompt_tokens: Family<ModelLabel, Counter>,
    generation_tokens: Family<ModelLabel, Counter>,
    request_prompt_tokens: HistogramFamily,
    request_generation_tokens: HistogramFamily,
    ttft: HistogramFamily,
    itl: HistogramFamily,
    tpot: HistogramFamily,
    decode_time: HistogramFamily,
    queue_time: HistogramFamily,
    prefill_time: HistogramFamily,
    inference_time: HistogramFamily,
    iteration_tokens: Family<ModelLabel, step_tokens::StepTokenHistogram>,
    e2e: HistogramFamily,
    finished: Family<FinishLabel, Counter>,
    requests: Family<RequestLabel, Counter>,
    requests_by_principal: Family<PrincipalRequestLabel, Counter>,
    engine_cpu: Family<EngineCpuLabel, Counter<f64, AtomicU64>>,
    cache_config: Family<CacheConfigLabel, Gauge>,
    grammar_mask_steps: Family<ModelLabel, Gauge>,
    grammar_mask_overlapped_steps: Family<ModelLabel, Gauge>,
    grammar_mask_wait: Family<ModelLabel, FloatGauge>,
    audit_enabled: Gauge,
    audit_fail_closed: Gauge,
    audit_records: Gauge,
    audit_records_behind: Gauge,
    audit_checkpoint_age: FloatGauge,
    /// The latest checkpoint seen at a scrape and when it was first seen.
    audit_checkpoint_seen: Mutex<Option<(String, Instant)>>,
    attestation_verdict: Gauge,
    attestation_age: FloatGauge,
    /// When the start-up evidence passed its appraisal.
    attested_at: OnceLock<Instant>,
    process: process::ProcessMetrics,
    speculative: speculative::SpeculativeMetrics,
    /// Engine totals already folded into the counters.
    engine_seen: Mutex<EngineSeen>,
}

/// Engine totals already folded into the counters that follow them.
#[derive(Debug, Default)]
struct EngineSeen {
    prefix_queries: u64,
    prefix_hits: u64,
    preemptions: u64,
    steps: u64,
    backend_cpu: f64,
    host_cpu: f64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut private = Registry::default();
        let running = Family::default();
        let waiting = Family::default();
        let kv_usage = Family::default();
        let prefix_queries = Family::default();
        let prefix_hits = Family::default();
        let preemptions = Family::default();
        let engine_steps = Family::default();
        let prompt_tokens = Family::default();
        let generation_tokens = Family::default();
        let request_prompt_tokens = HistogramFamily::new_with_constructor(token_histogram);
        let request_generation_tokens = HistogramFamily::new_with_constructor(token_histogram);
        let ttft = HistogramFamily::new_with_constructor(latency_histogram);
        let itl = HistogramFamily::new_with_constructor(latency_histogram);
        let tpot = HistogramFamily::new_with_constructor(latency_histogram);
        let decode_time = HistogramFamily::new_with_constructor(request_histogram);
        let e2e = HistogramFamily::new_with_constructor(request_histogram);
        let queue_time = HistogramFamily::new_with_constructor(request_histogram);
        let prefill_time = HistogramFamily::new_with_constructor(request_histogram);
        let inference_time = HistogramFamily::new_with_constructor(request_histogram);
        let iteration_tokens = Family::default();
        let finished = Family::default();
        let requests = Family::default();
        let requests_by_principal = Family::default();
        let engine_cpu = Family::default();
        let cache_config = Family::default();
        let grammar_mask_steps = Family::default();
        let grammar_mask_overlapped_steps = Family::default();
        let grammar_mask_wait = Family::default();
        let audit_enabled = Gauge::default();
        let audit_fail_closed = Gauge::default();
        let audit_records = Gauge::default();
        let audit_records_behind = Gauge::default();
        let audit_checkpoint_age = FloatGauge::default();
        let attestation_verdict = Gauge::default();
        let attestation_age = FloatGauge::default();
        let build_info = Family::<BuildLabel, Gauge>::default();
        build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "vllm:num_requests_running",
            "Number of requests in the running set of the engine",
            running.clone(),
        );
        registry.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be scheduled",
            waiting.clone(),
        );
        registry.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV-cache blocks in use (1 = full)",
            kv_usage.clone(),
        );
        registry.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            prefix_queries.clone(),
        );
        registry.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            prefix_hits.clone(),
        );
        registry.register(
            "vllm:num_preemptions",
            "Sequences preempted (and later recomputed)",
            preemptions.clone(),
        );
        registry.register(
            "vllm:cache_config_info",
            "The KV cache's configuration (value 1; the labels carry it)",
            cache_config.clone(),
        );
        registry.register(
            "vllm:prompt_tokens",
            "Prompt tokens processed",
            prompt_tokens.clone(),
        );
        registry.register(
            "vllm:generation_tokens",
            "Tokens generated",
            generation_tokens.clone(),
        );
        registry.register(
            "vllm:request_prompt_tokens",
            "Prompt tokens of each finished request",
            request_prompt_tokens.clone(),
        );
        registry.register(
            "vllm:request_generation_tokens",
            "Tokens generated for each finished request",
            request_generation_tokens.clone(),
        );
        registry.register(
            "vllm:time_to_first_token_seconds",
            "Time from request arrival to its first token",
            ttft.clone(),
        );
        registry.register(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            itl.clone(),
        );
        registry.register(
            "vllm:time_per_output_token_seconds",
            "Mean time per output token after the first, per request",
            tpot.clone(),
        );
        registry.register(
            "vllm:request_decode_time_seconds",
            "Time from a request's first token to its last",
            decode_time.clone(),
        );
        registry.register(
            "vllm:request_queue_time_seconds",
            "Time from a request's arrival until the engine first scheduled it",
            queue_time.clone(),
        );
        registry.register(
            "vllm:request_prefill_time_seconds",
            "Time from a request's first scheduling to its first token",
            prefill_time.clone(),
        );
        registry.register(
            "vllm:request_inference_time_seconds",
            "Time from a request's first scheduling to its last token",
            inference_time.clone(),
        );
        registry.register(
            "vllm:iteration_tokens_total",
            "Tokens (prompt and generated) computed per engine step",
            iteration_tokens.clone(),
        );
        registry.register(
            "vllm:e2e_request_latency_seconds",
            "Time from request arrival to its last token",
            e2e.clone(),
        );
        registry.register(
            "vllm:request_success",
            "Generations finished, by finish reason",
            finished.clone(),
        );
        registry.register(
            "inferno:api_requests",
            "API requests answered, by endpoint and HTTP status",
            requests.clone(),
        );
        registry.register(
            "inferno:engine_steps",
            "Forward steps the engine ran",
            engine_steps.clone(),
        );
        registry.register(
            "inferno:engine_thread_cpu_seconds",
            "CPU time of the engine thread: inside the backend's steps (part=backend_step) \
                 and the engine's own host work (part=host)",
            engine_cpu.clone(),
        );
        registry.register(
            "inferno:grammar_mask_steps",
            "Engine steps with a constrained row, which waited for grammar masks, since start",
            grammar_mask_steps.clone(),
        );
        registry.register(
            "inferno:grammar_mask_overlapped_steps",
            "Of those, steps whose forward pass ran while the engine waited, since start",
            grammar_mask_overlapped_steps.clone(),
        );
        registry.register(
            "inferno:grammar_mask_wait_seconds",
            "Time the engine waited for grammar masks in those steps, since start",
            grammar_mask_wait.clone(),
        );
        registry.register(
            "inferno:audit_enabled",
            "1 when an audit log is configured and open",
            audit_enabled.clone(),
        );
        registry.register(
            "inferno:audit_fail_closed",
            "1 while the audit log cannot be written and every /v1 request is refused",
            audit_fail_closed.clone(),
        );
        registry.register(
            "inferno:audit_records",
            "Durable records in the audit log",
            audit_records.clone(),
        );
        registry.register(
            "inferno:audit_records_behind_checkpoint",
            "Durable audit records that no signed checkpoint covers yet",
            audit_records_behind.clone(),
        );
        registry.register(
            "inferno:audit_checkpoint_age_seconds",
            "Seconds since the latest signed audit checkpoint was first seen (at a scrape)",
            audit_checkpoint_age.clone(),
        );
        registry.register(
            "inferno:attestation_verdict",
            "1 once the start-up evidence passed the server policy (0 before)",
            attestation_verdict.clone(),
        );
        registry.register(
            "inferno:attestation_evidence_age_seconds",
            "Seconds since the start-up evidence passed the server policy",
            attestation_age.clone(),
        );
        registry.register(
            "inferno:build_info",
            "The server's version (value 1; the labels carry it)",
            build_info,
        );
        private.register(
            "inferno:api_requests_by_principal",
            "API requests answered, by principal, endpoint and HTTP status (scrape key only)",
            requests_by_principal.clone(),
        );
        let process = process::ProcessMetrics::register(&mut registry);
        let speculative = speculative::SpeculativeMetrics::register(&mut registry);
        Self {
            registry,
            private,
            running,
            waiting,
            kv_usage,
            prefix_queries,
            prefix_hits,
            preemptions,
            engine_steps,
            prompt_tokens,
            generation_tokens,
            request_prompt_tokens,
            request_generation_tokens,
            ttft,
            itl,
            tpot,
            decode_time,
            queue_time,
            prefill_time,
            inference_time,
            iteration_tokens,
            e2e,
            finished,
            requests,
            requests_by_principal,
            engine_cpu,
            cache_config,
            grammar_mask_steps,
            grammar_mask_overlapped_steps,
            grammar_mask_wait,
            audit_enabled,
            audit_fail_closed,
            audit_records,
            audit_records_behind,
            audit_checkpoint_age,
            audit_checkpoint_seen: Mutex::new(None),
            attestation_verdict,
            attestation_age,
            attested_at: OnceLock::new(),
            process,
            speculative,
            engine_seen: Mutex::new(EngineSeen::default()),
        }
    }

    fn label(model: &str) -> ModelLabel {
        ModelLabel {
            model_name: model.to_owned(),
        }
    }

    /// Counts an answered API request.
    pub fn record_request(&self, model: &str, principal: &str, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabel {
                model_name: model.to_owned(),
                endpoint: endpoint.to_owned(),
                status: status.to_string(),
            })
            .inc();
        self.requests_by_principal
            .get_or_create(&PrincipalRequestLabel {
                model_name: model.to_owned(),
                principal: principal.to_owned(),
                endpoint: endpoint.to_owned(),
                status: status.to_string(),
            })
            .inc();
    }

    /// Records that the start-up evidence passed (the verdict and the evidence's age follow).
    pub fn record_attested(&self) {
        let _ = self.attested_at.set(Instant::now());
    }

    /// Records a finished generation (one choice).
    pub fn record_generation(&self, model: &str, timing: &GenerationTiming) {
        let label = Self::label(model);
        self.prompt_tokens
            .get_or_create(&label)
            .inc_by(timing.prompt_tokens as u64);
        self.generation_tokens
            .get_or_create(&label)
            .inc_by(timing.completion_tokens as u64);
        self.request_prompt_tokens
            .get_or_create(&label)
            .observe(timing.prompt_tokens as f64);
        self.request_generation_tokens
            .get_or_create(&label)
            .observe(timing.completion_tokens as f64);
        if let Some(ttft) = timing.time_to_first_token {
            self.ttft.get_or_create(&label).observe(ttft.as_secs_f64());
            let decode = timing.end_to_end.saturating_sub(ttft).as_secs_f64();
            self.decode_time.get_or_create(&label).observe(decode);
            if timing.completion_tokens > 1 {
                self.tpot
                    .get_or_create(&label)
                    .observe(decode / (timing.completion_tokens - 1) as f64);
            }
        }
        if let Some(queued) = timing.scheduled_after {
            self.queue_time
                .get_or_create(&label)
                .observe(queued.as_secs_f64());
            let running = timing.end_to_end.saturating_sub(queued);
            self.inference_time
                .get_or_create(&label)
                .observe(running.as_secs_f64());
            if let Some(ttft) = timing.time_to_first_token {
                self.prefill_time
                    .get_or_create(&label)
                    .observe(ttft.saturating_sub(queued).as_secs_f64());
            }
        }
        let itl = self.itl.get_or_create(&label);
        for gap in &timing.inter_token {
            itl.observe(gap.as_secs_f64());
        }
        drop(itl);
        self.e2e
            .get_or_create(&label)
            .observe(timing.end_to_end.as_secs_f64());
        self.finished
            .get_or_create(&FinishLabel {
                model_name: model.to_owned(),
                finished_reason: timing.finish_reason.to_owned(),
            })
            .inc();
    }

    /// Refreshes the gauges and counters that follow the engine (`engine`: the served model's
    /// name, its statistics and the engine configuration), the server's state and the process,
    /// then renders the exposition in `format`; `per_principal` adds the per-principal series
    /// (the scrape key's view).
    pub fn render(
        &self,
        engine: Option<(&str, &EngineStats, &EngineConfig)>,
        state: ServerState,
        format: Format,
        per_principal: bool,
    ) -> String {
        if let Some((model, stats, config)) = engine {
            self.observe_engine(model, stats, config);
        }
        self.observe_audit(&state);
        self.attestation_verdict
            .set(i64::from(self.attested_at.get().is_some()));
        self.attestation_age.set(
            self.attested_at
                .get()
                .map_or(0.0, |at| at.elapsed().as_secs_f64()),
        );
        self.process.observe();
        let mut out = String::new();
        let encoded = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
            .and_then(|()| {
                if per_principal {
                    prometheus_client::encoding::text::encode_registry(&mut out, &self.private)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
        if encoded.is_err() {
            tracing::error!("failed to encode metrics");
        }
        match format {
            Format::OpenMetrics => out,
            Format::Text => format::to_text(&out),
        }
    }

    fn observe_audit(&self, state: &ServerState) {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.audit_enabled.set(i64::from(state.audit_enabled));
        self.audit_fail_closed.set(i64::from(state.audit_failed));
        self.audit_records.set(count(state.audit_records));
        let Some((covered, text)) = &state.audit_checkpoint else {
            return;
        };
        self.audit_records_behind
            .set(count(state.audit_records.saturating_sub(*covered)));
        let mut seen = self
            .audit_checkpoint_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let since = match &*seen {
            Some((seen_text, at)) if seen_text == text => *at,
            _ => {
                *seen = Some((text.clone(), Instant::now()));
                Instant::now()
            }
        };
        self.audit_checkpoint_age.set(since.elapsed().as_secs_f64());
    }

    fn observe_engine(&self, model: &str, stats: &EngineStats, config: &EngineConfig) {
        let label = Self::label(model);
        self.speculative.observe(&label, stats);
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.running
            .get_or_create(&label)
            .set(count(stats.running as u64));
        self.waiting
            .get_or_create(&label)
            .set(count(stats.waiting as u64));
        let usage = if stats.kv_blocks_total == 0 {
            0.0
        } else {
            stats.kv_blocks_used as f64 / stats.kv_blocks_total as f64
        };
        self.kv_usage.get_or_create(&label).set(usage);
        self.cache_config.clear();
        self.cache_config
            .get_or_create(&CacheConfigLabel {
                block_size: crate::engine::BLOCK_SIZE.to_string(),
                num_gpu_blocks: stats.kv_blocks_total.to_string(),
                gpu_memory_utilization: config.gpu_memory_fraction.to_string(),
                enable_prefix_caching: config.prefix_caching.to_string(),
            })
            .set(1);
        self.iteration_tokens
            .get_or_create(&label)
            .set(&stats.step_tokens);
        self.grammar_mask_steps
            .get_or_create(&label)
            .set(count(stats.grammar_mask_steps));
        self.grammar_mask_overlapped_steps
            .get_or_create(&label)
            .set(count(stats.grammar_mask_overlapped_steps));
        self.grammar_mask_wait
            .get_or_create(&label)
            .set(stats.grammar_mask_wait_us as f64 / 1e6);
        let mut guard = self
            .engine_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = &mut *guard;
        for (counter, total, earlier) in [
            (
                &self.prefix_queries,
                stats.prefix_cache_queries,
                &mut seen.prefix_queries,
            ),
            (
                &self.prefix_hits,
                stats.prefix_cache_hits,
                &mut seen.prefix_hits,
            ),
            (&self.preemptions, stats.preemptions, &mut seen.preemptions),
            (&self.engine_steps, stats.steps, &mut seen.steps),
        ] {
            counter
                .get_or_create(&label)
                .inc_by(total.saturating_sub(*earlier));
            *earlier = (*earlier).max(total);
        }
        let host = stats.host_work_seconds();
        for (part, total, earlier) in [
            (
                "backend_step",
                stats.backend_cpu_seconds,
                &mut seen.backend_cpu,
            ),
            ("host", host, &mut seen.host_cpu),
        ] {
            self.engine_cpu
                .get_or_create(&EngineCpuLabel {
                    model_name: model.to_owned(),
                    part,
                })
                .inc_by((total - *earlier).max(0.0));
            *earlier = earlier.max(total);
        }
    }
}

/// Timing and size of one finished generation, for the metrics.
#[derive(Debug, Clone, Default)]
pub struct GenerationTiming {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Arrival to the engine's first scheduling of the request (`None`: never scheduled).
    pub scheduled_after: Option<Duration>,
    /// Arrival to first token.
    pub time_to_first_token: Option<Duration>,
    /// Gaps between consecutive tokens.
    pub inter_token: Vec<Duration>,
    /// Arrival to the last event.
    pub end_to_end: Duration,
    /// The OpenAI finish reason.
    pub finish_reason: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no line starting with {prefix} in\n{text}"))
    }

    fn render(metrics: &Metrics, stats: &EngineStats) -> String {
        metrics.render(
            Some(("m", stats, &EngineConfig::default())),
            ServerState::default(),
            Format::Text,
            false,
        )
    }

    #[test]
    fn renders_vllm_names_with_model_label() {
        let metrics = Metrics::new();
        let stats = EngineStats {
            running: 2,
            waiting: 3,
            kv_blocks_total: 10,
            kv_blocks_used: 4,
            prefix_cache_queries: 100,
            prefix_cache_hits: 40,
            ..EngineStats::default()
        };
        let text = render(&metrics, &stats);
        assert_eq!(
            value(&text, "vllm:num_requests_running{model_name=\"m\"}"),
            2.0
        );
        assert_eq!(
            value(&text, "vllm:num_requests_waiting{model_name=\"m\"}"),
            3.0
        );
        assert_eq!(
            value(&text, "vllm:kv_cache_usage_perc{model_name=\"m\"}"),
            0.4
        );
        assert_eq!(
            value(&text, "vllm:prefix_cache_queries_total{model_name=\"m\"}"),
            100.0
        );
        assert_eq!(
            value(&text, "vllm:prefix_cache_hits_total{model_name=\"m\"}"),
            40.0
        );
    }

    #[test]
    fn the_engine_threads_cpu_is_split_into_backend_steps_and_host_work() {
        let metrics = Metrics::new();
        let mut stats = EngineStats {
            thread_cpu_seconds: 2.0,
            backend_cpu_seconds: 1.5,
            ..EngineStats::default()
        };
        render(&metrics, &stats);
        stats.thread_cpu_seconds = 3.0;
        stats.backend_cpu_seconds = 2.25;
        let text = render(&metrics, &stats);
        let cpu = |part: &str| {
            value(
                &text,
                &format!(
                    "inferno:engine_thread_cpu_seconds_total{{model_name=\"m\",part=\"{part}\"}}"
                ),
            )
        };
        assert_eq!(cpu("backend_step"), 2.25);
        assert_eq!(cpu("host"), 0.75);
    }

    #[test]
    fn prefix_counters_follow_engine_totals_without_double_counting() {
        let metrics = Metrics::new();
        let mut stats = EngineStats {
            prefix_cache_queries: 10,
            prefix_cache_hits: 5,
            ..EngineStats::default()
        };
        render(&metrics, &stats);
        stats.prefix_cache_queries = 25;
        stats.prefix_cache_hits = 6;
        let text = render(&metrics, &stats);
        assert_eq!(
            value(&text, "vllm:prefix_cache_queries_total{model_name=\"m\"}"),
            25.0
        );
        assert_eq!(
            value(&text, "vllm:prefix_cache_hits_total{model_name=\"m\"}"),
            6.0
        );
    }

    #[test]
    fn generations_and_requests_are_counted() {
        let metrics = Metrics::new();
        metrics.record_generation(
            "m",
            &GenerationTiming {
                prompt_tokens: 7,
                completion_tokens: 3,
                time_to_first_token: Some(Duration::from_millis(20)),
                inter_token: vec![Duration::from_millis(5), Duration::from_millis(6)],
                end_to_end: Duration::from_millis(40),
                finish_reason: "stop",
                scheduled_after: Some(Duration::from_millis(4)),
            },
        );
        metrics.record_request("m", "alice", "/v1/completions", 200);
        metrics.record_request("m", "alice", "/v1/completions", 200);
        let text = metrics.render(None, ServerState::default(), Format::Text, true);
        assert_eq!(
            value(&text, "vllm:prompt_tokens_total{model_name=\"m\"}"),
            7.0
        );
        assert_eq!(
            value(&text, "vllm:generation_tokens_total{model_name=\"m\"}"),
            3.0
        );
        assert_eq!(
            value(
                &text,
                "vllm:time_to_first_token_seconds_count{model_name=\"m\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "vllm:inter_token_latency_seconds_count{model_name=\"m\"}"
            ),
            2.0
        );
        assert!(text.contains("principal=\"alice\""), "{text}");
        assert!(text.contains("inferno:api_requests_total{"), "{text}");
        // Queued 4 ms, first token at 20 ms, last at 40 ms.
        for (name, seconds) in [
            ("vllm:request_queue_time_seconds", 0.004),
            ("vllm:request_prefill_time_seconds", 0.016),
            ("vllm:request_inference_time_seconds", 0.036),
            ("vllm:request_decode_time_seconds", 0.020),
        ] {
            let label = "{model_name=\"m\"}";
            assert_eq!(value(&text, &format!("{name}_count{label}")), 1.0, "{name}");
            let sum = value(&text, &format!("{name}_sum{label}"));
            assert!((sum - seconds).abs() < 1e-9, "{name}: {sum}");
        }
        assert!(text.contains("finished_reason=\"stop\""), "{text}");
        assert_eq!(
            value(
                &text,
                "vllm:time_per_output_token_seconds_count{model_name=\"m\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "vllm:request_prompt_tokens_bucket{le=\"10.0\",model_name=\"m\"}"
            ),
            1.0
        );
    }

    #[test]
    fn engine_steps_are_a_histogram_of_their_tokens() {
        let metrics = Metrics::new();
        let mut stats = EngineStats::default();
        for tokens in [5, 1, 300] {
            stats.step_tokens.observe(tokens);
        }
        let text = render(&metrics, &stats);
        let series = |suffix: &str| {
            value(
                &text,
                &format!("vllm:iteration_tokens_total_{suffix}{{model_name=\"m\"}}"),
            )
        };
        assert_eq!(series("count"), 3.0);
        assert_eq!(series("sum"), 306.0);
        let bucket = |le: &str| {
            value(
                &text,
                &format!("vllm:iteration_tokens_total_bucket{{le=\"{le}\",model_name=\"m\"}}"),
            )
        };
        assert_eq!(bucket("1.0"), 1.0);
        assert_eq!(bucket("8.0"), 2.0);
        assert_eq!(bucket("256.0"), 2.0);
        assert_eq!(bucket("512.0"), 3.0);
        assert_eq!(bucket("+Inf"), 3.0);
        assert!(
            text.contains("# TYPE vllm:iteration_tokens_total histogram"),
            "{text}"
        );
    }

    #[test]
    fn principals_are_shown_only_to_the_scrape_key() {
        let metrics = Metrics::new();
        metrics.record_request("m", "alice", "/v1/completions", 200);
        let public = metrics.render(None, ServerState::default(), Format::OpenMetrics, false);
        assert!(!public.contains("alice"), "{public}");
        assert!(public.contains("inferno:api_requests_total{"), "{public}");
        let private = metrics.render(None, ServerState::default(), Format::OpenMetrics, true);
        assert!(private.contains("principal=\"alice\""), "{private}");
        assert!(private.ends_with("# EOF\n"), "{private}");
        assert_eq!(private.matches("# EOF").count(), 1, "{private}");
    }

    #[test]
    fn the_text_format_names_counters_as_their_samples() {
        let metrics = Metrics::new();
        metrics.record_request("m", "alice", "/v1/completions", 200);
        let text = metrics.render(None, ServerState::default(), Format::Text, false);
        assert!(
            text.contains("# TYPE inferno:api_requests_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        let openmetrics = metrics.render(None, ServerState::default(), Format::OpenMetrics, false);
        assert!(
            openmetrics.contains("# TYPE inferno:api_requests counter\n"),
            "{openmetrics}"
        );
    }

    #[test]
    fn server_state_process_and_build_series_are_rendered() {
        let metrics = Metrics::new();
        let state = ServerState {
            audit_enabled: true,
            audit_failed: true,
            audit_records: 12,
            audit_checkpoint: Some((10, "origin\n10\nroot\n".to_owned())),
        };
        let text = metrics.render(None, state, Format::Text, false);
        assert_eq!(value(&text, "inferno:audit_fail_closed "), 1.0);
        assert_eq!(value(&text, "inferno:audit_records "), 12.0);
        assert_eq!(
            value(&text, "inferno:audit_records_behind_checkpoint "),
            2.0
        );
        assert_eq!(value(&text, "inferno:attestation_verdict "), 0.0);
        metrics.record_attested();
        let text = metrics.render(None, ServerState::default(), Format::Text, false);
        assert_eq!(value(&text, "inferno:audit_fail_closed "), 0.0);
        assert_eq!(value(&text, "inferno:attestation_verdict "), 1.0);
        assert!(
            value(&text, "process_resident_memory_bytes ") > 0.0,
            "{text}"
        );
        assert!(value(&text, "process_open_fds ") > 0.0, "{text}");
        assert!(text.contains("inferno:build_info{version="), "{text}");
    }
}
