//! Helpers shared by the integration tests: fixture locations, golden files and a small driver
//! that runs requests through a real engine on the CPU backend.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, probe};
use inferno::engine::{
    Backend, BatchRow, Engine, EngineConfig, EngineHandle, FinishReason, GenerationEvent,
    GenerationRequest, ModelInfo, SampleSpec, SamplingParams, StepOutput, StopParams,
};
use inferno::model::Model;
use serde::Deserialize;

/// The committed fixtures (always present).
pub fn committed_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fixture from `../shared/fixtures`. Tests that use it carry
/// `#[cfg_attr(not(shared_fixture), ignore = ...)]`, so it is only absent under `--ignored`.
pub fn shared_fixture(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures")
        .join(name);
    assert!(dir.is_dir(), "{} is absent", dir.display());
    dir
}

/// One case of a `golden.json`.
#[derive(Debug, Deserialize)]
pub struct GoldenCase {
    pub kind: String,
    pub input: serde_json::Value,
    pub input_ids: Vec<u32>,
    pub per_position_argmax: Vec<u32>,
    pub last_logits_top20: TopLogits,
    pub greedy_24: Vec<u32>,
    pub greedy_margins: Vec<f32>,
    pub greedy_text: String,
}

/// Top logits at the last position.
#[derive(Debug, Deserialize)]
pub struct TopLogits {
    pub ids: Vec<u32>,
    pub values: Vec<f32>,
}

/// Reads `dir/golden.json`.
pub fn golden(dir: &Path) -> Vec<GoldenCase> {
    #[derive(Deserialize)]
    struct Golden {
        cases: Vec<GoldenCase>,
    }
    let text = std::fs::read_to_string(dir.join("golden.json")).expect("golden.json is readable");
    serde_json::from_str::<Golden>(&text)
        .expect("golden.json parses")
        .cases
}

/// The block tables of a sequence of `len` tokens on `backend`: one per KV group of its cache,
/// one after the other (the layout of `BatchRow::block_table`), every group's blocks distinct and
/// counted from 0.
pub fn block_tables(backend: &dyn inferno::engine::Backend, len: usize) -> Vec<u32> {
    let blocks = len.div_ceil(inferno::engine::BLOCK_SIZE);
    let groups = backend.kv_cache().groups.count();
    (0..(groups * blocks) as u32).collect()
}

/// The logits at every position of `tokens` on a fresh sequence of `backend`, decoding one token
/// per step (the decode path).
pub fn logits_per_position(backend: &mut CpuBackend, tokens: &[u32]) -> Vec<Vec<f32>> {
    use inferno::engine::{Backend, BatchRow, SampleSpec, StepOutput};
    let blocks = block_tables(backend, tokens.len());
    let params = SamplingParams::default();
    (0..tokens.len())
        .map(|pos| {
            let spec = SampleSpec {
                params: &params,
                seed: 0,
                draw_index: 0,
                prompt: &[],
                output: &[],
                logprobs: None,
                mask: None,
            };
            let row = BatchRow {
                seq_id: 1,
                tokens: &tokens[pos..=pos],
                start_pos: pos,
                block_table: &blocks,
                sample: Some(spec),
            };
            match backend.step(&[row]).expect("step runs") {
                StepOutput::Logits(mut rows) => rows.remove(0),
                StepOutput::Sampled(_) => panic!("the CPU backend returns logits"),
            }
        })
        .collect()
}

/// Starts an engine on the CPU backend.
pub fn engine(model: &Model, config: EngineConfig) -> EngineHandle {
    let backend = CpuBackend::new(model, config.kv_cache_bytes).expect("CPU backend builds");
    Engine::spawn(Box::new(backend), ModelInfo::of(model), config).expect("engine starts")
}

/// A greedy request for `max_tokens` tokens that ignores EOS.
pub fn greedy(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        id: "test".into(),
        prompt: prompt.to_vec(),
        sampling: SamplingParams::default(),
        stop: StopParams {
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        },
        logprobs: None,
        cache_salt: 0,
        prompt_logprobs: None,
        constraint: None,
    }
}

/// What a finished request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// Collects a stream to its end.
pub fn collect(mut stream: inferno::engine::GenerationStream) -> Outcome {
    let mut outcome = Outcome {
        tokens: vec![],
        text: String::new(),
        reason: FinishReason::Cancelled,
        cached_tokens: 0,
        completion_tokens: 0,
    };
    while let Some(event) = stream.blocking_next() {
        match event {
            GenerationEvent::Token { token, text, .. } => {
                outcome.tokens.push(token);
                outcome.text.push_str(&text);
            }
            GenerationEvent::Hidden { .. } => {}
            GenerationEvent::Finished {
                reason,
                text,
                cached_tokens,
                completion_tokens,
                ..
            } => {
                outcome.text.push_str(&text);
                outcome.reason = reason;
                outcome.cached_tokens = cached_tokens;
                outcome.completion_tokens = completion_tokens;
            }
        }
    }
    outcome
}

/// Submits and waits.
pub fn run(engine: &EngineHandle, request: GenerationRequest) -> Outcome {
    collect(engine.submit(request).expect("request accepted"))
}

/// Runs every request concurrently and returns the outcomes in order.
pub fn run_all(engine: &EngineHandle, requests: Vec<GenerationRequest>) -> Vec<Outcome> {
    let streams: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).expect("accepted"))
        .collect();
    let handles: Vec<_> = streams
        .into_iter()
        .map(|s| std::thread::spawn(move || collect(s)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("collector thread"))
        .collect()
}

/// A temporary copy of the model directory `source` whose weights carry, for each layer `i`,
/// `model.layers.{i}.self_attn.k_scale` and `v_scale` = `scales(i)` as f32 scalars (the form
/// compressed-tensors' `kv_cache_scheme` checkpoints store them in).
pub fn copy_with_kv_scales(source: &Path, scales: impl Fn(usize) -> [f32; 2]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    for entry in std::fs::read_dir(source).expect("fixture directory") {
        let entry = entry.expect("fixture entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name()))
            .expect("copying the fixture");
    }
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).expect("fixture weights");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("fixture weights");
    let names = tensors.names();
    let layers = (0..)
        .take_while(|i| {
            let prefix = format!("model.layers.{i}.");
            names.iter().any(|n| n.starts_with(&prefix))
        })
        .count();
    let values: Vec<(String, [u8; 4])> = (0..layers)
        .flat_map(|i| {
            let [k, v] = scales(i);
            [
                (
                    format!("model.layers.{i}.self_attn.k_scale"),
                    k.to_le_bytes(),
                ),
                (
                    format!("model.layers.{i}.self_attn.v_scale"),
                    v.to_le_bytes(),
                ),
            ]
        })
        .collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        tensors.tensors().into_iter().collect();
    for (name, value) in &values {
        views.push((
            name.clone(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![], value)
                .expect("scale tensor"),
        ));
    }
    std::fs::write(
        &path,
        safetensors::serialize(views, None).expect("serialising the weights"),
    )
    .expect("weights");
    dir
}

/// Greedy sampling parameters, for rows whose logits a test compares.
pub static GREEDY: SamplingParams = SamplingParams {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
    repetition_penalty: 1.0,
    seed: None,
    logit_bias: Vec::new(),
};

/// The largest absolute difference between two vectors of the same length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The index of the largest value (the first of equal ones).
pub fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

/// A fixed pseudo-random token sequence below `vocab` (a linear congruential generator seeded
/// with `seed`).
pub fn pseudo_random_tokens(vocab: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut state = 0x2545_f491_u64 ^ seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// The logits after `tokens[start..end]` run as one greedy row of a sequence whose cache blocks
/// are `table`.
pub fn run_chunk(
    backend: &mut dyn Backend,
    tokens: &[u32],
    table: &[u32],
    start: usize,
    end: usize,
) -> Vec<f32> {
    let row = BatchRow {
        seq_id: 1,
        tokens: &tokens[start..end],
        start_pos: start,
        block_table: table,
        sample: Some(SampleSpec {
            params: &GREEDY,
            seed: 0,
            draw_index: 0,
            prompt: &[],
            output: &[],
            logprobs: None,
            mask: None,
        }),
    };
    match backend.step(&[row]).expect("step") {
        StepOutput::Logits(mut rows) => rows.remove(0),
        StepOutput::Sampled(_) => panic!("expected logits"),
    }
}

/// What one greedy request produced: its tokens with their top-5 log-probabilities, and the
/// prompt tokens served from the prefix cache.
pub struct Generated {
    /// The tokens, in order.
    pub tokens: Vec<u32>,
    /// Each token's log-probability with the top 5.
    pub logprobs: Vec<inferno::engine::TokenLogprob>,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Runs one greedy request of `max_tokens` tokens, asking for the top-5 log-probabilities.
pub fn run_request(
    engine: &inferno::engine::EngineHandle,
    id: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> Generated {
    use inferno::engine::{GenerationEvent, GenerationRequest, StopParams};
    let request = GenerationRequest {
        id: id.to_string(),
        prompt,
        sampling: SamplingParams::default(),
        stop: StopParams {
            max_tokens,
            ignore_eos: true,
            ..StopParams::default()
        },
        logprobs: Some(5),
        cache_salt: 0,
        prompt_logprobs: None,
        constraint: None,
    };
    let mut stream = engine.submit(request).expect("submit");
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(event) = stream.blocking_next() {
        match event {
            GenerationEvent::Token { token, logprob, .. } => {
                tokens.push(token);
                logprobs.push(logprob.expect("logprobs were requested"));
            }
            GenerationEvent::Hidden { .. } => {}
            GenerationEvent::Finished {
                reason,
                cached_tokens,
                ..
            } => {
                assert!(
                    !matches!(reason, inferno::engine::FinishReason::Error(_)),
                    "{id}: {reason:?}"
                );
                return Generated {
                    tokens,
                    logprobs,
                    cached_tokens,
                };
            }
        }
    }
    panic!("{id}: stream ended without Finished");
}

/// A CUDA backend for `model` in the small engine configuration the GPU tests share (2% of the
/// GPU's memory, 2,048 batched tokens, 16 sequences); the small-M kernels serve every product
/// they fit (no timing), so runs are reproducible.
pub fn small_cuda_backend(model: &Model, sample_on_device: bool) -> CudaBackend {
    let config = EngineConfig {
        gpu_memory_fraction: 0.02,
        max_batched_tokens: 2048,
        max_num_seqs: Some(16),
        ..EngineConfig::default()
    };
    let options = CudaOptions {
        sample_on_device,
        measure_products: false,
        ..CudaOptions::default()
    };
    CudaBackend::new(model, &config, options).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// The fixtures the GPU tests read: `INFERNO_FIXTURES` (the GPU script's checkout), else the
/// committed ones.
pub fn gpu_fixtures() -> PathBuf {
    std::env::var_os("INFERNO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// Fails the test at once without a CUDA device: the GPU tests are ignored by default and run
/// with `--include-ignored` on the GPU machine (scripts/gpu-check.sh), where a missing device is
/// a failure.
pub fn require_gpu() {
    if let Err(e) = probe() {
        panic!("no CUDA device: {e}");
    }
}

/// Loads the fixture `name` for a GPU test, which fails at once without a CUDA device.
pub fn load_for_cuda(name: &str) -> Model {
    require_gpu();
    let dir = gpu_fixtures().join(name);
    Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// Router-logit gaps at the top-k boundary below this are near-ties whose routing may
/// legitimately differ between backends: the GPU's router reads its input rounded to bf16 (a
/// relative 2^-9 per value) after layers computed in bf16, which moves the tiny fixtures' router
/// logits by a few thousandths (about 1e-3 from the input's rounding alone at hidden 64 and
/// weights of std 0.1).
pub const NEAR_TIE: f32 = 0.01;

/// The gap between the two largest of `logits`.
pub fn top_margin(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > first {
            (first, second) = (l, first);
        } else if l > second {
            second = l;
        }
    }
    first - second
}

/// Logits at every position of `tokens` on the CPU, one token per step on a fresh sequence of
/// `cpu` (one block table per KV group), and each position's router gap
/// (`CpuBackend::router_gaps`).
pub fn per_position_with_router_gaps(
    cpu: &mut CpuBackend,
    tokens: &[u32],
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let table = block_tables(cpu, tokens.len());
    (1..=tokens.len())
        .map(|end| {
            let logits = run_chunk(cpu, tokens, &table, end - 1, end);
            (logits, cpu.router_gaps()[0])
        })
        .unzip()
}

/// An FP8 fixture: a published form (`fp8/...`) as stored, or a bf16 fixture named
/// `"NAME (fp8 at load)"` quantized at load; `weights_only`: its inputs left unquantized (FP8
/// weights with bf16 inputs). Read from [`gpu_fixtures`].
pub fn fp8_fixture(name: &str, weights_only: bool) -> Model {
    let (fixture, at_load) = match name.strip_suffix(" (fp8 at load)") {
        Some(fixture) => (fixture, true),
        None => (name, false),
    };
    let dir = gpu_fixtures().join(fixture);
    let mut model = Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()));
    if at_load {
        inferno::model::QuantizeAtLoad::Fp8.apply(&mut model.config);
    }
    if weights_only {
        model
            .config
            .quantization
            .as_mut()
            .expect("an FP8 model")
            .activations = inferno::model::fp8::ActivationScale::None;
    }
    model
}

/// A greedy draw with nothing beside it but `logprobs`: what the GPU tests sample with.
pub fn greedy_spec(logprobs: Option<u32>) -> SampleSpec<'static> {
    SampleSpec {
        params: &GREEDY,
        seed: 0,
        draw_index: 0,
        prompt: &[],
        output: &[],
        logprobs,
        mask: None,
    }
}
