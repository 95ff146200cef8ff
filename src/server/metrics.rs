//! Prometheus metrics in text format, under vLLM's metric names so existing dashboards work.
//!
//! Engine gauges and the prefix-cache counters are refreshed from [`EngineStats`] at scrape time;
//! token counters, latency histograms and per-principal request counts are recorded by the
//! handlers as requests finish.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::EngineStats;

/// The `model_name` label every vLLM metric carries.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model_name: String,
}

/// Labels of the per-principal request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
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

type HistogramFamily = Family<ModelLabel, Histogram, fn() -> Histogram>;

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

/// All metrics of the server.
pub struct Metrics {
    registry: Registry,
    running: Family<ModelLabel, Gauge>,
    waiting: Family<ModelLabel, Gauge>,
    kv_usage: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    prefix_queries: Family<ModelLabel, Counter>,
    prefix_hits: Family<ModelLabel, Counter>,
    prompt_tokens: Family<ModelLabel, Counter>,
    generation_tokens: Family<ModelLabel, Counter>,
    ttft: HistogramFamily,
    itl: HistogramFamily,
    e2e: HistogramFamily,
    finished: Family<FinishLabel, Counter>,
    requests: Family<RequestLabel, Counter>,
    engine_cpu: Family<EngineCpuLabel, Counter<f64, AtomicU64>>,
    /// Engine thread CPU seconds already folded into `engine_cpu`: (backend step, host).
    engine_cpu_seen: Mutex<(f64, f64)>,
    grammar_mask_steps: Family<ModelLabel, Gauge>,
    grammar_mask_overlapped_steps: Family<ModelLabel, Gauge>,
    grammar_mask_wait: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    /// Engine prefix-cache totals already folded into the counters: (queries, hits).
    prefix_seen: Mutex<(u64, u64)>,
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
        let running = Family::default();
        let waiting = Family::default();
        let kv_usage = Family::default();
        let prefix_queries = Family::default();
        let prefix_hits = Family::default();
        let prompt_tokens = Family::default();
        let generation_tokens = Family::default();
        let ttft = HistogramFamily::new_with_constructor(latency_histogram);
        let itl = HistogramFamily::new_with_constructor(latency_histogram);
        let e2e = HistogramFamily::new_with_constructor(request_histogram);
        let finished = Family::default();
        let requests = Family::default();
        let engine_cpu = Family::default();
        registry.register(
            "inferno:engine_thread_cpu_seconds",
            "CPU time of the engine thread: inside the backend's steps (part=backend_step) and \
             the engine's own host work (part=host)",
            engine_cpu.clone(),
        );
        let grammar_mask_steps = Family::default();
        let grammar_mask_overlapped_steps = Family::default();
        let grammar_mask_wait = Family::default();
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
            "API requests answered, by principal, endpoint and HTTP status",
            requests.clone(),
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
        Self {
            registry,
            running,
            waiting,
            kv_usage,
            prefix_queries,
            prefix_hits,
            prompt_tokens,
            generation_tokens,
            ttft,
            itl,
            e2e,
            finished,
            requests,
            grammar_mask_steps,
            grammar_mask_overlapped_steps,
            grammar_mask_wait,
            prefix_seen: Mutex::new((0, 0)),
            engine_cpu,
            engine_cpu_seen: Mutex::new((0.0, 0.0)),
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
                principal: principal.to_owned(),
                endpoint: endpoint.to_owned(),
                status: status.to_string(),
            })
            .inc();
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
        if let Some(ttft) = timing.time_to_first_token {
            self.ttft.get_or_create(&label).observe(ttft.as_secs_f64());
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

    /// Refreshes the engine gauges and counters and renders the text exposition.
    pub fn render(&self, engine: Option<(&str, &EngineStats)>) -> String {
        if let Some((model, stats)) = engine {
            self.observe_engine(model, stats);
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("failed to encode metrics");
        }
        out
    }

    fn observe_engine(&self, model: &str, stats: &EngineStats) {
        let label = Self::label(model);
        self.running
            .get_or_create(&label)
            .set(i64::try_from(stats.running).unwrap_or(i64::MAX));
        self.waiting
            .get_or_create(&label)
            .set(i64::try_from(stats.waiting).unwrap_or(i64::MAX));
        let usage = if stats.kv_blocks_total == 0 {
            0.0
        } else {
            stats.kv_blocks_used as f64 / stats.kv_blocks_total as f64
        };
        self.kv_usage.get_or_create(&label).set(usage);
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.grammar_mask_steps
            .get_or_create(&label)
            .set(count(stats.grammar_mask_steps));
        self.grammar_mask_overlapped_steps
            .get_or_create(&label)
            .set(count(stats.grammar_mask_overlapped_steps));
        self.grammar_mask_wait
            .get_or_create(&label)
            .set(stats.grammar_mask_wait_us as f64 / 1e6);
        let mut seen = self
            .prefix_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (queries, hits) = *seen;
        self.prefix_queries
            .get_or_create(&label)
            .inc_by(stats.prefix_cache_queries.saturating_sub(queries));
        self.prefix_hits
            .get_or_create(&label)
            .inc_by(stats.prefix_cache_hits.saturating_sub(hits));
        *seen = (
            queries.max(stats.prefix_cache_queries),
            hits.max(stats.prefix_cache_hits),
        );
        drop(seen);
        let host = stats.host_work_seconds();
        let mut seen = self
            .engine_cpu_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (backend_seen, host_seen) = *seen;
        for (part, total, earlier) in [
            ("backend_step", stats.backend_cpu_seconds, backend_seen),
            ("host", host, host_seen),
        ] {
            self.engine_cpu
                .get_or_create(&EngineCpuLabel {
                    model_name: model.to_owned(),
                    part,
                })
                .inc_by((total - earlier).max(0.0));
        }
        *seen = (
            backend_seen.max(stats.backend_cpu_seconds),
            host_seen.max(host),
        );
    }
}

/// Timing and size of one finished generation, for the metrics.
#[derive(Debug, Clone, Default)]
pub struct GenerationTiming {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
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
        let text = metrics.render(Some(("m", &stats)));
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
        metrics.render(Some(("m", &stats)));
        stats.thread_cpu_seconds = 3.0;
        stats.backend_cpu_seconds = 2.25;
        let text = metrics.render(Some(("m", &stats)));
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
        metrics.render(Some(("m", &stats)));
        stats.prefix_cache_queries = 25;
        stats.prefix_cache_hits = 6;
        let text = metrics.render(Some(("m", &stats)));
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
            },
        );
        metrics.record_request("m", "alice", "/v1/completions", 200);
        metrics.record_request("m", "alice", "/v1/completions", 200);
        let text = metrics.render(None);
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
        assert!(text.contains("finished_reason=\"stop\""), "{text}");
    }
}
