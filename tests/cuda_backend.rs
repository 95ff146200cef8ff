//! The CUDA backend against the CPU backend and transformers (the fixtures' `golden.json`), on
//! the GPU machine. Every test skips loudly where no NVIDIA driver or GPU is present (CI).
//!
//! Run there with `--test-threads=1` (each test takes a slice of GPU memory for its KV cache).
//! `INFERNO_FIXTURES` points at the fixture directory (default: `tests/fixtures`).

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, probe};
use inferno::engine::{Backend, BatchRow, EngineConfig, SampleSpec, SamplingParams, StepOutput};
use inferno::model::Model;

/// Logits tolerance against the CPU backend (fp32 reference, bf16 weights): bf16 activations
/// between GEMMs give relative errors of a few 1e-3, so logits of magnitude ~10 differ by up to
/// a few 1e-2.
const TOL_CPU: f32 = 0.08;
/// Logits tolerance against transformers' bf16 forward pass (which rounds to bf16 at more
/// places than this backend does).
const TOL_HF: f32 = 0.15;
/// Reference margins below this are near-ties whose argmax may legitimately differ.
const MARGIN: f32 = 0.05;

fn fixtures() -> PathBuf {
    std::env::var_os("INFERNO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn gpu_or_skip() -> bool {
    match probe() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device: {e}");
            false
        }
    }
}

fn load(name: &str) -> Option<Model> {
    let dir = fixtures().join(name);
    if !dir.join("config.json").exists() {
        eprintln!("SKIPPED: fixture {} is absent", dir.display());
        return None;
    }
    Some(Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display())))
}

fn engine_config() -> EngineConfig {
    EngineConfig { gpu_memory_fraction: 0.02, max_batched_tokens: 512, max_num_seqs: 16, ..EngineConfig::default() }
}

fn cuda(model: &Model, sample_on_device: bool) -> CudaBackend {
    CudaBackend::new(model, &engine_config(), CudaOptions { device: 0, sample_on_device })
        .unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// Hands out physical KV blocks in order.
struct Blocks {
    next: u32,
}

impl Blocks {
    fn take(&mut self, n: usize) -> Vec<u32> {
        let out = (self.next..self.next + n as u32).collect();
        self.next += n as u32;
        out
    }
}

/// A sequence being stepped by hand.
struct Seq {
    tokens: Vec<u32>,
    table: Vec<u32>,
}

impl Seq {
    fn new(tokens: Vec<u32>, blocks: &mut Blocks, capacity: usize) -> Self {
        Self { tokens, table: blocks.take(capacity.div_ceil(16)) }
    }
}

static GREEDY: SamplingParams = SamplingParams {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
    repetition_penalty: 1.0,
    seed: None,
};

fn spec(logprobs: Option<u32>) -> SampleSpec<'static> {
    SampleSpec { params: &GREEDY, seed: 0, draw_index: 0, prompt: &[], output: &[], logprobs }
}

fn logits(out: StepOutput) -> Vec<Vec<f32>> {
    match out {
        StepOutput::Logits(l) => l,
        StepOutput::Sampled(_) => panic!("expected logits"),
    }
}

/// Runs `seq.tokens[start..end]` as one row that asks for the next token; returns its logits.
fn run_chunk(backend: &mut dyn Backend, seq: &Seq, start: usize, end: usize) -> Vec<f32> {
    let row = BatchRow { seq_id: 1, tokens: &seq.tokens[start..end], start_pos: start, block_table: &seq.table, sample: Some(spec(None)) };
    logits(backend.step(&[row]).expect("step")).remove(0)
}

/// Teacher-forced logits: the prompt in one prefill, then each reference token as a decode.
fn teacher_forced(backend: &mut dyn Backend, prompt_len: usize, seq: &Seq) -> Vec<Vec<f32>> {
    let mut out = vec![run_chunk(backend, seq, 0, prompt_len)];
    for pos in prompt_len..seq.tokens.len() - 1 {
        out.push(run_chunk(backend, seq, pos, pos + 1));
    }
    out
}

fn argmax(v: &[f32]) -> (usize, f32) {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    let second = v.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max);
    (best, v[best] - second)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().map(|a| a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect()).unwrap_or_default()
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value.as_array().map(|a| a.iter().filter_map(|v| v.as_f64()).map(|v| v as f32).collect()).unwrap_or_default()
}

#[test]
fn teacher_forced_logits_match_transformers_and_the_cpu_backend() {
    if !gpu_or_skip() {
        return;
    }
    for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"] {
        let Some(model) = load(name) else { continue };
        let golden: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixtures().join(name).join("golden.json")).expect("golden.json"),
        )
        .expect("golden.json parses");
        let mut gpu = cuda(&model, false);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let mut worst_cpu = 0.0f32;
        let mut worst_hf = 0.0f32;
        let mut compared = 0;
        for (c, case) in golden["cases"].as_array().expect("cases").iter().enumerate() {
            let prompt = ids(&case["input_ids"]);
            let reference = ids(&case["greedy_24"]);
            let margins = floats(&case["greedy_margins"]);
            let mut tokens = prompt.clone();
            tokens.extend(&reference);
            let mut blocks = Blocks { next: 0 };
            let seq = Seq::new(tokens, &mut blocks, prompt.len() + reference.len());
            let g = teacher_forced(&mut gpu, prompt.len(), &seq);
            let r = teacher_forced(&mut cpu, prompt.len(), &seq);
            // Against transformers: the top-20 logits after the prompt.
            let top = &case["last_logits_top20"];
            for (id, value) in ids(&top["ids"]).iter().zip(floats(&top["values"])) {
                worst_hf = worst_hf.max((g[0][*id as usize] - value).abs());
            }
            for (step, (gl, cl)) in g.iter().zip(&r).enumerate() {
                worst_cpu = worst_cpu.max(max_abs_diff(gl, cl));
                let (cpu_arg, cpu_margin) = argmax(cl);
                let (gpu_arg, _) = argmax(gl);
                if cpu_margin > MARGIN {
                    assert_eq!(gpu_arg, cpu_arg, "{name} case {c} step {step}: argmax differs from the CPU backend");
                }
                if let (Some(&want), Some(&margin)) = (reference.get(step), margins.get(step))
                    && margin > MARGIN
                {
                    assert_eq!(gpu_arg as u32, want, "{name} case {c} step {step}: argmax differs from transformers (margin {margin})");
                    compared += 1;
                }
            }
        }
        println!("RESULT {name}: max|cuda-cpu| = {worst_cpu:.4}, max|cuda-hf top20| = {worst_hf:.4}, {compared} argmax checks vs transformers");
        assert!(worst_cpu <= TOL_CPU, "{name}: logits differ from the CPU backend by {worst_cpu}");
        assert!(worst_hf <= TOL_HF, "{name}: logits differ from transformers by {worst_hf}");
        assert!(compared > 0, "{name}: no reference step had a margin above {MARGIN}");
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7919 + salt * 104_729) % 30_000 + 100).collect()
}

#[test]
fn mixed_batches_chunked_prefill_and_prefix_hits_match_single_runs() {
    if !gpu_or_skip() {
        return;
    }
    let Some(model) = load("inferno-tiny") else { return };
    let mut gpu = cuda(&model, false);
    let mut blocks = Blocks { next: 0 };
    let seqs: Vec<Seq> = [5usize, 17, 33, 40].iter().enumerate().map(|(i, &n)| Seq::new(prompt(n, i as u32), &mut blocks, n + 8)).collect();
    let alone: Vec<Vec<f32>> = seqs.iter().map(|s| run_chunk(&mut gpu, s, 0, s.tokens.len())).collect();

    // All four prompts in one step.
    let rows: Vec<BatchRow<'_>> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| BatchRow { seq_id: i as u64, tokens: &s.tokens, start_pos: 0, block_table: &s.table, sample: Some(spec(None)) })
        .collect();
    let batched = logits(gpu.step(&rows).expect("mixed step"));
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let diff = max_abs_diff(b, a);
        println!("RESULT mixed batch row {i}: max diff {diff:.5}");
        assert!(diff <= 0.02, "row {i}: batched logits differ by {diff}");
    }

    // Chunked prefill of the 40-token prompt: 16 + 7 + 17 tokens.
    let s = &seqs[3];
    for (start, end) in [(0, 16), (16, 23)] {
        let row = BatchRow { seq_id: 9, tokens: &s.tokens[start..end], start_pos: start, block_table: &s.table, sample: None };
        gpu.step(&[row]).expect("chunk");
    }
    let chunked = run_chunk(&mut gpu, s, 23, 40);
    let diff = max_abs_diff(&chunked, &alone[3]);
    println!("RESULT chunked prefill: max diff {diff:.5}");
    assert!(diff <= 0.02, "chunked prefill differs by {diff}");

    // Prefix hit: a prompt that shares the first two blocks (32 tokens) of the 33-token prompt
    // reuses them and computes only its own tail.
    let mut tokens = seqs[2].tokens[..32].to_vec();
    tokens.extend(prompt(9, 77));
    let fresh = Seq::new(tokens.clone(), &mut blocks, tokens.len());
    let reference = run_chunk(&mut gpu, &fresh, 0, tokens.len());
    let mut table = seqs[2].table[..2].to_vec();
    table.extend(blocks.take(1));
    let hit = Seq { tokens, table };
    let cached = run_chunk(&mut gpu, &hit, 32, hit.tokens.len());
    let diff = max_abs_diff(&cached, &reference);
    println!("RESULT prefix hit: max diff {diff:.5}");
    assert!(diff <= 0.02, "prefix hit differs by {diff}");

    // A decode row and a prefill row in one step.
    let a = &seqs[0];
    let mut a_tokens = a.tokens.clone();
    a_tokens.push(42);
    let a2 = Seq { tokens: a_tokens, table: a.table.clone() };
    let decode_alone = run_chunk(&mut gpu, &a2, 5, 6);
    let b = &seqs[1];
    let rows = [
        BatchRow { seq_id: 1, tokens: &a2.tokens[5..6], start_pos: 5, block_table: &a2.table, sample: Some(spec(None)) },
        BatchRow { seq_id: 2, tokens: &b.tokens, start_pos: 0, block_table: &b.table, sample: Some(spec(None)) },
    ];
    let mixed = logits(gpu.step(&rows).expect("decode + prefill"));
    let diff = max_abs_diff(&mixed[0], &decode_alone).max(max_abs_diff(&mixed[1], &alone[1]));
    println!("RESULT decode+prefill step: max diff {diff:.5}");
    assert!(diff <= 0.02, "decode + prefill step differs by {diff}");
}

#[test]
fn device_sampling_matches_host_logits_with_one_copy_each_way() {
    if !gpu_or_skip() {
        return;
    }
    let Some(model) = load("inferno-tiny") else { return };
    let mut host = cuda(&model, false);
    let mut device = cuda(&model, true);
    let mut blocks = Blocks { next: 0 };
    let seq = Seq::new(prompt(20, 3), &mut blocks, 40);
    let reference = run_chunk(&mut host, &seq, 0, 20);
    let row = BatchRow { seq_id: 1, tokens: &seq.tokens, start_pos: 0, block_table: &seq.table, sample: Some(spec(Some(5))) };
    let before = device.copy_stats();
    let out = device.step(&[row]).expect("step");
    let copies = device.copy_stats().since(&before);
    assert_eq!((copies.steps, copies.h2d, copies.d2h), (1, 1, 1), "{copies:?}");
    let StepOutput::Sampled(tokens) = out else { panic!("expected sampled tokens") };
    let (want, _) = argmax(&reference);
    assert_eq!(tokens[0].token as usize, want);
    let max = reference.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + reference.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let lp = tokens[0].logprob.as_ref().expect("logprobs");
    assert!((lp.logprob - (reference[want] - lse)).abs() < 1e-3, "{} vs {}", lp.logprob, reference[want] - lse);
    assert_eq!(lp.top.len(), 5);
    assert_eq!(lp.top[0].0 as usize, want);
    for pair in lp.top.windows(2) {
        assert!(pair[0].1 >= pair[1].1, "alternatives out of order: {:?}", lp.top);
    }

    // Decode steps: exactly one copy each way per step.
    let mut tokens = seq.tokens.clone();
    tokens.push(tokens[0]);
    let seq = Seq { tokens, table: seq.table };
    let before = device.copy_stats();
    for _ in 0..4 {
        let row = BatchRow { seq_id: 1, tokens: &seq.tokens[20..21], start_pos: 20, block_table: &seq.table, sample: Some(spec(None)) };
        device.step(&[row]).expect("decode");
    }
    let copies = device.copy_stats().since(&before);
    println!("RESULT copies over 4 decode steps: {copies:?}");
    assert_eq!((copies.steps, copies.h2d, copies.d2h), (4, 4, 4));
}
