//! The engine end to end on the CPU backend: batching, chunked prefill, preemption, prefix
//! caching, seeded sampling, stopping, cancellation and admission limits.

mod support;

use std::time::{Duration, Instant};

use inferno::engine::{
    Backend as _, EngineConfig, EngineHandle, FinishReason, GenerationEvent, GenerationRequest,
    SamplingParams, StopReason, SubmitError,
};
use inferno::model::Model;
use support::{collect, committed_fixture, engine, golden, greedy, run, run_all};

fn model() -> Model {
    Model::load(&committed_fixture("inferno-tiny")).expect("fixture loads")
}

/// The golden prompts of the fixture: two short chats, an 826-token chat and three raw texts.
fn prompts() -> Vec<Vec<u32>> {
    golden(&committed_fixture("inferno-tiny"))
        .into_iter()
        .map(|c| c.input_ids)
        .collect()
}

fn wait_until(
    engine: &EngineHandle,
    what: &str,
    cond: impl Fn(&inferno::engine::EngineStats) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond(&engine.stats()) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn mixed_batches_and_chunked_prefill_give_the_solo_results() {
    let model = model();
    let prompts = prompts();
    let solo_engine = engine(&model, EngineConfig::default());
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run(&solo_engine, greedy(p, 16)).tokens)
        .collect();
    solo_engine.shutdown();

    let config = EngineConfig {
        max_batched_tokens: 40,
        ..Default::default()
    };
    let batched_engine = engine(&model, config);
    let batched = run_all(
        &batched_engine,
        prompts.iter().map(|p| greedy(p, 16)).collect(),
    );
    for (i, (b, s)) in batched.iter().zip(&solo).enumerate() {
        assert_eq!(&b.tokens, s, "prompt {i} in a mixed batch");
    }
    assert!(
        batched_engine.stats().steps > 826 / 40,
        "the long prompt was prefilled in chunks"
    );
}

#[test]
fn preemption_recomputes_and_loses_nothing() {
    let model = model();
    let prompt: Vec<u32> = prompts()[1].clone(); // 48 tokens
    // 2 KiB of KV per token: 12 blocks hold 192 tokens, while four requests need 4 × 88.
    let block_bytes = 4 * 2 * 64 * 4 * 16;
    // Four sequences at once (the limit derived from 12 blocks would be 1, which never preempts).
    let config = EngineConfig {
        kv_cache_bytes: 12 * block_bytes,
        max_num_seqs: Some(4),
        ..Default::default()
    };
    let engine = engine(&model, config);
    let solo = run(&engine, greedy(&prompt, 40)).tokens;
    let outcomes = run_all(&engine, (0..4).map(|_| greedy(&prompt, 40)).collect());
    for outcome in &outcomes {
        assert_eq!(outcome.tokens, solo);
        assert_eq!(outcome.reason, FinishReason::Length);
    }
    assert!(engine.stats().preemptions > 0, "{:?}", engine.stats());
}

#[test]
fn a_request_larger_than_the_cache_is_refused_and_others_wait() {
    let model = model();
    let block_bytes = 4 * 2 * 64 * 4 * 16;
    let engine = engine(
        &model,
        EngineConfig {
            kv_cache_bytes: 4 * block_bytes,
            ..Default::default()
        },
    );
    let err = engine
        .submit(greedy(&[1; 60], 10))
        .expect_err("70 tokens exceed 64 slots");
    assert_eq!(
        err,
        SubmitError::TooLong {
            prompt: 60,
            max_tokens: 10,
            limit: 64
        }
    );
    let err = engine
        .submit(greedy(&[1; 10], 5000))
        .expect_err("over the context");
    assert!(
        matches!(err, SubmitError::TooLong { limit: 2048, .. }),
        "{err:?}"
    );
    assert_eq!(
        engine.submit(greedy(&[], 5)).expect_err("empty"),
        SubmitError::EmptyPrompt
    );
    // Three requests of 48 tokens each fit only one at a time: they queue and all complete.
    let outcomes = run_all(&engine, (0..3).map(|_| greedy(&[5; 40], 8)).collect());
    assert!(outcomes.iter().all(|o| o.tokens.len() == 8));
}

#[test]
fn prefix_cache_is_shared_within_a_principal_only() {
    let model = model();
    let long = prompts()[2].clone();
    let engine = engine(&model, EngineConfig::default());
    let with_salt = |salt| GenerationRequest {
        cache_salt: salt,
        prompt_logprobs: None,
        ..greedy(&long, 4)
    };
    let first = run(&engine, with_salt(1));
    let again = run(&engine, with_salt(1));
    let other = run(&engine, with_salt(2));
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(again.cached_tokens, (long.len() - 1) / 16 * 16);
    assert_eq!(
        other.cached_tokens, 0,
        "another principal never hits the first one's prefix"
    );
    assert_eq!(first.tokens, again.tokens);
    assert_eq!(first.tokens, other.tokens);
    let stats = engine.stats();
    assert_eq!(stats.prefix_cache_hits, again.cached_tokens as u64);
    assert_eq!(stats.prefix_cache_queries, 3 * long.len() as u64);

    let shared = engine_with_shared_cache(&model);
    run(&shared, with_salt(1));
    assert!(
        run(&shared, with_salt(2)).cached_tokens > 0,
        "a shared cache crosses principals"
    );
}

fn engine_with_shared_cache(model: &Model) -> EngineHandle {
    engine(
        model,
        EngineConfig {
            share_prefix_cache: true,
            ..Default::default()
        },
    )
}

#[test]
fn a_seed_gives_the_same_draws_whatever_the_batch_holds() {
    let model = model();
    let prompt = prompts()[0].clone();
    let engine = engine(&model, EngineConfig::default());
    let sampled = |seed| GenerationRequest {
        sampling: SamplingParams {
            temperature: 1.2,
            top_p: 0.95,
            seed: Some(seed),
            ..Default::default()
        },
        ..greedy(&prompt, 24)
    };
    let alone = run(&engine, sampled(7)).tokens;
    assert_eq!(run(&engine, sampled(7)).tokens, alone);
    let mut batch: Vec<GenerationRequest> = (0..3).map(|i| greedy(&prompts()[i % 2], 20)).collect();
    batch.insert(1, sampled(7));
    let outcomes = run_all(&engine, batch);
    assert_eq!(
        outcomes[1].tokens, alone,
        "batch composition changed the draws"
    );
    let others: Vec<Vec<u32>> = (8..12).map(|s| run(&engine, sampled(s)).tokens).collect();
    assert!(
        others.iter().any(|t| *t != alone),
        "different seeds should differ"
    );
}

#[test]
fn eos_stop_strings_and_max_tokens_end_generation() {
    let model = model();
    let prompt = prompts()[0].clone(); // "What is confidential computing?"
    let engine = engine(&model, EngineConfig::default());
    let natural = run(
        &engine,
        GenerationRequest {
            stop: Default::default(),
            ..greedy(&prompt, 100)
        },
    );
    let mut natural_request = greedy(&prompt, 100);
    natural_request.stop.ignore_eos = false;
    let natural_eos = run(&engine, natural_request);
    assert_eq!(natural.reason, FinishReason::Length);
    assert_eq!(natural_eos.reason, FinishReason::Stop(None));
    assert!(
        natural_eos
            .text
            .starts_with("Confidential computing protects data"),
        "{}",
        natural_eos.text
    );
    assert!(
        !natural_eos.text.contains("<|"),
        "special tokens are not emitted"
    );
    assert_eq!(
        natural_eos.completion_tokens,
        natural_eos.tokens.len() + 1,
        "EOS counts but is not emitted"
    );

    let mut stopped = greedy(&prompt, 100);
    stopped.stop.stop_strings = vec![" data in".into()];
    let out = run(&engine, stopped);
    assert_eq!(
        out.reason,
        FinishReason::Stop(Some(StopReason::String(" data in".into())))
    );
    assert_eq!(out.text, "Confidential computing protects");

    // A stop token of the request: the stop reason names it, and it is not emitted.
    let tokens = &natural_eos.tokens;
    let at = (1..tokens.len())
        .find(|&i| !tokens[..i].contains(&tokens[i]))
        .expect("a token that does not occur before it");
    let stop_token = tokens[at];
    let mut by_token = greedy(&prompt, 100);
    by_token.stop.stop_token_ids = vec![stop_token];
    let out = run(&engine, by_token);
    assert_eq!(
        out.reason,
        FinishReason::Stop(Some(StopReason::TokenId(stop_token)))
    );
    assert_eq!(out.tokens, tokens[..at]);

    let limited = run(&engine, greedy(&prompt, 3));
    assert_eq!(
        (limited.reason, limited.completion_tokens),
        (FinishReason::Length, 3)
    );
}

#[test]
fn logprobs_come_with_each_token() {
    let model = model();
    let engine = engine(&model, EngineConfig::default());
    let mut request = greedy(&prompts()[0], 5);
    request.logprobs = Some(3);
    let mut stream = engine.submit(request).expect("accepted");
    let mut seen = 0;
    while let Some(event) = stream.blocking_next() {
        if let GenerationEvent::Token { token, logprob, .. } = event {
            let lp = logprob.expect("logprobs requested");
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, token, "greedy picks the most likely token");
            assert!(lp.logprob <= 0.0 && lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            seen += 1;
        }
    }
    assert_eq!(seen, 5);
}

#[test]
fn dropping_a_stream_cancels_and_frees_its_blocks() {
    let model = model();
    let engine = engine(
        &model,
        EngineConfig {
            prefix_caching: false,
            ..Default::default()
        },
    );
    let mut stream = engine
        .submit(greedy(&prompts()[2], 1000))
        .expect("accepted");
    for _ in 0..2 {
        stream.blocking_next().expect("an event");
    }
    assert!(engine.stats().kv_blocks_used > 0);
    drop(stream);
    wait_until(&engine, "blocks to be freed", |s| {
        s.kv_blocks_used == 0 && s.running == 0
    });
}

#[test]
fn a_full_queue_refuses_with_queue_full() {
    let model = model();
    let config = EngineConfig {
        max_num_seqs: Some(1),
        max_waiting: 1,
        ..Default::default()
    };
    let engine = engine(&model, config);
    let prompt = prompts()[2].clone();
    let running = engine
        .submit(greedy(&prompt, 500))
        .expect("first is accepted");
    wait_until(&engine, "the first request to run", |s| s.running == 1);
    let waiting = engine.submit(greedy(&prompt, 10)).expect("second waits");
    assert_eq!(
        engine
            .submit(greedy(&prompt, 10))
            .expect_err("third is refused"),
        SubmitError::QueueFull
    );
    drop(running);
    let finished = collect(waiting);
    assert_eq!(finished.tokens.len(), 10);
}

/// A backend that records when it is dropped.
struct DropSignal {
    inner: inferno::backend::cpu::CpuBackend,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl inferno::engine::Backend for DropSignal {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kv_cache(&self) -> inferno::engine::KvCacheShape {
        self.inner.kv_cache()
    }
    fn step(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
    ) -> Result<inferno::engine::StepOutput, inferno::engine::BackendError> {
        self.inner.step(rows)
    }
}

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A device backend must be torn down before the process exits (the CUDA driver's exit
/// handlers race with a late teardown), so `shutdown` returns only after the backend is gone.
#[test]
fn shutdown_returns_after_the_backend_is_released() {
    let model = model();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let backend = DropSignal {
        inner: inferno::backend::cpu::CpuBackend::new(&model, 16 << 20).expect("backend"),
        dropped: dropped.clone(),
    };
    let engine = inferno::engine::Engine::spawn(
        Box::new(backend),
        inferno::engine::ModelInfo::of(&model),
        EngineConfig::default(),
    )
    .expect("engine starts");
    let stream = engine
        .submit(greedy(&prompts()[0], 1000))
        .expect("accepted");
    engine.shutdown();
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(collect(stream).reason, FinishReason::Cancelled);
}

/// What a [`DeviceSampler`] saw.
#[derive(Debug, Default)]
struct SamplerLog {
    /// Rows sampled with a mask.
    masked: usize,
    /// Rows of constrained requests sampled without one.
    unmasked_constrained: usize,
    /// Steps started before their masks were ready (`start_step` with a late row).
    started_early: usize,
    /// Steps started (`start_step`, late rows or not).
    started: usize,
    /// Rows sampled.
    sampled: usize,
    /// Sampled rows flagged as getting their mask late.
    late_rows: usize,
    /// Rows flagged late that carried a mask at the start anyway, or free rows flagged late.
    wrong_flags: usize,
}

/// A backend that samples "on its device" (with the reference sampler, so outputs compare
/// exactly) and records the grammar masks it received, as the CUDA backend does. With `late`, it
/// starts steps as the CUDA backend does: `start_step` runs the forward pass, `finish_step`
/// samples with the masks that arrived meanwhile (the engine streams the previous step's tokens
/// in between).
struct DeviceSampler {
    inner: inferno::backend::cpu::CpuBackend,
    log: std::sync::Arc<std::sync::Mutex<SamplerLog>>,
    /// The sequence ids of constrained requests.
    constrained: std::collections::HashSet<u64>,
    late: bool,
    /// The logits of a started step.
    started: Option<Vec<Vec<f32>>>,
}

impl DeviceSampler {
    fn new(model: &Model, config: &EngineConfig, late: bool) -> Self {
        Self {
            inner: inferno::backend::cpu::CpuBackend::new(model, config.kv_cache_bytes)
                .expect("backend"),
            log: Default::default(),
            // Sequence ids count from 1 in submission order: the constrained requests are even.
            constrained: (1..=8).filter(|id| id % 2 == 0).collect(),
            late,
            started: None,
        }
    }

    fn forward(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
    ) -> Result<Vec<Vec<f32>>, inferno::engine::BackendError> {
        match self.inner.step(rows)? {
            inferno::engine::StepOutput::Logits(logits) => Ok(logits),
            _ => unreachable!("the CPU backend returns logits"),
        }
    }

    fn sample(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
        logits: Vec<Vec<f32>>,
    ) -> inferno::engine::StepOutput {
        let sampling: Vec<_> = rows.iter().filter(|r| r.sample.is_some()).collect();
        let mut log = self.log.lock().expect("lock");
        log.sampled += sampling.len();
        let mut tokens = Vec::new();
        for (row, logits) in sampling.iter().zip(logits) {
            let spec = row.sample.expect("a sampling row");
            if spec.mask.is_some() {
                log.masked += 1;
            } else if self.constrained.contains(&row.seq_id) {
                log.unmasked_constrained += 1;
            }
            tokens.push(inferno::engine::sampling::sample(logits, &spec));
        }
        inferno::engine::StepOutput::Sampled(tokens)
    }
}

impl inferno::engine::Backend for DeviceSampler {
    fn name(&self) -> &str {
        "device-sampler"
    }
    fn kv_cache(&self) -> inferno::engine::KvCacheShape {
        self.inner.kv_cache()
    }
    fn step(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
    ) -> Result<inferno::engine::StepOutput, inferno::engine::BackendError> {
        assert!(self.started.is_none(), "step while a started step is open");
        let logits = self.forward(rows)?;
        Ok(self.sample(rows, logits))
    }
    fn start_step(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
        late: &[bool],
    ) -> Result<bool, inferno::engine::BackendError> {
        if !self.late {
            return Ok(false);
        }
        let sampling: Vec<_> = rows.iter().filter(|r| r.sample.is_some()).collect();
        assert_eq!(sampling.len(), late.len(), "one flag per sampled row");
        {
            let mut log = self.log.lock().expect("lock");
            log.started += 1;
            log.started_early += usize::from(late.contains(&true));
            for (row, &late) in sampling.iter().zip(late) {
                log.late_rows += usize::from(late);
                let has_mask = row.sample.is_some_and(|s| s.mask.is_some());
                if late && (has_mask || !self.constrained.contains(&row.seq_id)) {
                    log.wrong_flags += 1;
                }
            }
        }
        // The forward pass needs no mask: it runs now.
        self.started = Some(self.forward(rows)?);
        Ok(true)
    }
    fn finish_step(
        &mut self,
        rows: &[inferno::engine::BatchRow<'_>],
    ) -> Result<inferno::engine::StepOutput, inferno::engine::BackendError> {
        let logits = self.started.take().expect("finish_step after start_step");
        Ok(self.sample(rows, logits))
    }
}

/// A backend that starts steps (as the CUDA backend does) has the previous step's tokens
/// streamed while its forward pass runs. Nothing a caller sees changes: text, tokens and finish
/// reasons (EOS, a stop string, a stop token, `max_tokens`, seeded sampling) are exactly the host
/// engine's. A stop string is found one step late, so its sequence drew exactly one more token,
/// which is dropped; without started steps every drawn token is one of the outputs.
#[test]
fn streaming_while_the_next_step_runs_changes_no_output() {
    let model = model();
    let info = inferno::engine::ModelInfo::of(&model);
    let prompt = prompts()[0].clone(); // "What is confidential computing?"
    // Without the prefix cache: which request reuses another's blocks depends on timing.
    let config = || EngineConfig {
        prefix_caching: false,
        ..EngineConfig::default()
    };
    let host = engine(&model, config());
    let mut eos = greedy(&prompt, 100);
    eos.stop.ignore_eos = false;
    let natural = run(&host, eos.clone());
    // A token of the greedy continuation not seen before it, as a stop token that ends it early.
    let at = (1..natural.tokens.len())
        .find(|&i| !natural.tokens[..i].contains(&natural.tokens[i]))
        .expect("a token that does not occur before it");
    let stop_token = natural.tokens[at];
    let requests = || {
        let mut stop_string = greedy(&prompt, 100);
        stop_string.stop.stop_strings = vec![" data in".into()];
        let mut by_token = eos.clone();
        by_token.stop.stop_token_ids = vec![stop_token];
        let mut sampled = greedy(&prompts()[1], 40);
        sampled.sampling = SamplingParams {
            temperature: 0.8,
            seed: Some(7),
            ..SamplingParams::default()
        };
        vec![
            eos.clone(),
            stop_string,
            by_token,
            greedy(&prompt, 3),
            sampled,
        ]
    };
    let want = run_all(&host, requests());
    host.shutdown();
    assert_eq!(
        want[1].reason,
        FinishReason::Stop(Some(StopReason::String(" data in".into())))
    );
    assert_eq!(
        want[2].reason,
        FinishReason::Stop(Some(StopReason::TokenId(stop_token)))
    );

    for starts_steps in [false, true] {
        let backend = DeviceSampler::new(&model, &config(), starts_steps);
        let log = backend.log.clone();
        let device = inferno::engine::Engine::spawn(Box::new(backend), info.clone(), config())
            .expect("engine");
        let got = run_all(&device, requests());
        device.shutdown();
        assert_eq!(got, want, "starts steps: {starts_steps}");
        let log = log.lock().expect("lock");
        let outputs: usize = got.iter().map(|o| o.completion_tokens).sum();
        let dropped = usize::from(starts_steps);
        assert_eq!(
            log.sampled,
            outputs + dropped,
            "starts steps: {starts_steps}"
        );
        assert_eq!(log.started > 0, starts_steps, "{log:?}");
    }
}

/// The grammar of the codes `[0-9]{3}-[a-z]{4}` (see `is_code`), compiled for `model`.
fn code_grammar(
    model: &Model,
    info: &inferno::engine::ModelInfo,
) -> inferno::constrain::CompiledConstraint {
    use inferno::constrain::{ConstraintKind, ConstraintSource, ConstraintSpec, GrammarCompiler};
    GrammarCompiler::new(&model.tokenizer, &info.eos_token_ids, info.vocab_size)
        .expect("tok")
        .compile(&ConstraintSpec {
            kind: ConstraintKind::Regex,
            source: ConstraintSource::Regex("[0-9]{3}-[a-z]{4}".into()),
        })
        .expect("compiles")
}

/// Grammar masks reach the backend with the step (a device sampler applies them there): every
/// sampled row of a constrained request carries its mask, and a backend that samples with them
/// produces exactly what the engine's host sampler produces, in a batch mixed with free rows.
/// A backend that takes masks late gets every constrained row's mask after it started the
/// step (the forward pass never waits for a mask), with the same outputs.
#[test]
fn grammar_masks_travel_with_the_step_to_a_device_sampler() {
    let model = model();
    let info = inferno::engine::ModelInfo::of(&model);
    let regex = code_grammar(&model, &info);
    let prompts = prompts();
    let requests = || {
        let mut out = Vec::new();
        for (i, prompt) in prompts.iter().take(4).enumerate() {
            let mut free = greedy(prompt, 6);
            free.id = format!("free-{i}");
            let mut constrained = greedy(prompt, 40);
            constrained.id = format!("regex-{i}");
            constrained.constraint = Some(regex.clone());
            constrained.stop.ignore_eos = false;
            constrained.sampling = SamplingParams {
                temperature: 0.8,
                seed: Some(i as u64),
                ..SamplingParams::default()
            };
            out.extend([free, constrained]);
        }
        out
    };
    let host = engine(&model, EngineConfig::default());
    let want = run_all(&host, requests());
    let idle = |s: &inferno::engine::EngineStats| s.running == 0 && s.waiting == 0;
    wait_until(&host, "the engine to publish its last step", idle);
    let host_stats = host.stats();
    host.shutdown();
    assert!(host_stats.grammar_mask_steps > 0, "{host_stats:?}");
    assert_eq!(
        host_stats.grammar_mask_overlapped_steps, 0,
        "{host_stats:?}"
    );

    for late in [false, true] {
        let config = EngineConfig::default();
        let backend = DeviceSampler::new(&model, &config, late);
        let log = backend.log.clone();
        let device = inferno::engine::Engine::spawn(Box::new(backend), info.clone(), config)
            .expect("engine");
        let got = run_all(&device, requests());
        wait_until(&device, "the engine to publish its last step", idle);
        let stats = device.stats();
        device.shutdown();

        let log = log.lock().expect("lock");
        assert_eq!(
            log.unmasked_constrained, 0,
            "late {late}: rows sampled without their mask"
        );
        // Every token of a constrained request was sampled with a mask (and then the end of
        // sequence, which is not a token of the output).
        let constrained_tokens: usize = got.iter().skip(1).step_by(2).map(|o| o.tokens.len()).sum();
        assert!(
            constrained_tokens > 0 && log.masked >= constrained_tokens,
            "late {late}: {} masked rows for {constrained_tokens} constrained tokens",
            log.masked
        );
        if late {
            // Every masked row's mask came after the step had started.
            assert_eq!(log.late_rows, log.masked, "{log:?}");
            assert_eq!(log.wrong_flags, 0, "{log:?}");
            assert_eq!(
                stats.grammar_mask_overlapped_steps,
                stats.grammar_mask_steps
            );
            assert_eq!(
                stats.grammar_mask_steps, log.started_early as u64,
                "{stats:?}"
            );
        } else {
            assert_eq!((log.started_early, log.late_rows), (0, 0));
            assert_eq!(stats.grammar_mask_overlapped_steps, 0, "{stats:?}");
        }
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.tokens, g.tokens, "late {late}: request {i}");
            if i % 2 == 1 {
                let re = regex_lite_match(&g.text);
                assert!(re, "request {i}: {:?} does not match the grammar", g.text);
            }
        }
    }
}

/// Whether `text` is three digits, a dash and four lowercase letters.
fn regex_lite_match(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 8
        && bytes[..3].iter().all(u8::is_ascii_digit)
        && bytes[3] == b'-'
        && bytes[4..].iter().all(u8::is_ascii_lowercase)
}

/// A batch of many constrained rows (their grammars advance on rayon's pool, see
/// `Worker::advance_grammars`) gives each request exactly what it gets alone, seeded draws
/// included, and every output follows its grammar.
#[test]
fn a_wide_constrained_batch_gives_the_solo_results() {
    let model = model();
    let info = inferno::engine::ModelInfo::of(&model);
    let regex = code_grammar(&model, &info);
    let prompts = prompts();
    let requests: Vec<GenerationRequest> = (0..12)
        .map(|i| {
            let mut request = greedy(&prompts[i % 3], 40);
            request.id = format!("regex-{i}");
            request.constraint = Some(regex.clone());
            request.stop.ignore_eos = false;
            request.sampling = SamplingParams {
                temperature: 0.9,
                seed: Some(i as u64),
                ..SamplingParams::default()
            };
            request
        })
        .collect();
    let engine = engine(&model, EngineConfig::default());
    let solo: Vec<_> = requests
        .iter()
        .map(|r| run_all(&engine, vec![r.clone()]).remove(0))
        .collect();
    let together = run_all(&engine, requests);
    engine.shutdown();
    for (i, (alone, batched)) in solo.iter().zip(&together).enumerate() {
        assert!(
            regex_lite_match(&alone.text),
            "request {i}: {:?}",
            alone.text
        );
        assert_eq!(alone.tokens, batched.tokens, "request {i}");
    }
}
