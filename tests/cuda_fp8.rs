//! FP8 projections on the CUDA backend against the CPU backend's FP8 reference (which
//! dequantizes the weights at load and rounds each product's input to FP8 as the checkpoint's
//! scheme says), teacher-forced, on the GPU machine: the four published forms in
//! `tests/fixtures/fp8/` and the bf16 fixtures quantized at load. Ignored without a GPU
//! (`scripts/gpu-check.sh` runs them with `--include-ignored`, stage `fp8`).

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, probe};
use inferno::engine::{Backend, BatchRow, EngineConfig, SampleSpec, SamplingParams, StepOutput};
use inferno::model::{Model, QuantizeAtLoad};

/// The bf16 checks' logit tolerance against the CPU backend (`tests/cuda_backend.rs`), times 4
/// (the FP8 issue's bound): the device rounds activations to bf16 between products and sums in
/// another order, so an input rounded to FP8 may land on the other side of a rounding boundary.
const TOL_FP8: f32 = 4.0 * 0.1;

/// Positions compared per model: the FP8 issue's 512, or `INFERNO_FP8_POSITIONS` (at least 64;
/// the GPU script's compute-sanitizer run takes fewer).
fn positions() -> usize {
    std::env::var("INFERNO_FP8_POSITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(512, |n: usize| n.max(64))
}

fn fixtures() -> PathBuf {
    std::env::var_os("INFERNO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// The FP8 models (with the 16-bit model they were quantized from, where it is at hand): each
/// published form, and each bf16 fixture quantized at load; only those
/// whose names contain one of `INFERNO_FP8_MODELS`' comma-separated parts, when it is set (the
/// GPU script's compute-sanitizer run takes two).
fn fp8_models() -> Vec<(String, Model, Option<Model>)> {
    let only: Option<Vec<String>> = std::env::var("INFERNO_FP8_MODELS")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|parts| parts.iter().any(|p| name.contains(p.as_str())))
    };
    let load = |name: &str| {
        let dir = fixtures().join(name);
        Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
    };
    let mut models: Vec<(String, Model, Option<Model>)> = [
        "compressed-tensors-dynamic",
        "compressed-tensors-static",
        "fbgemm",
        "block",
    ]
    .iter()
    .map(|form| format!("fp8/{form}"))
    .filter(|name| wanted(name))
    .map(|name| {
        let model = load(&name);
        (name, model, None)
    })
    .collect();
    for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"] {
        if !wanted(name) {
            continue;
        }
        let mut model = load(name);
        QuantizeAtLoad::Fp8.apply(&mut model.config);
        models.push((format!("{name} (fp8 at load)"), model, Some(load(name))));
    }
    models
}

fn cuda(model: &Model) -> CudaBackend {
    let config = EngineConfig {
        gpu_memory_fraction: 0.02,
        max_batched_tokens: 2048,
        max_num_seqs: Some(16),
        ..EngineConfig::default()
    };
    let options = CudaOptions {
        sample_on_device: false,
        measure_products: false,
        ..CudaOptions::default()
    };
    CudaBackend::new(model, &config, options).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
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
    logit_bias: Vec::new(),
};

/// The logits after `tokens[start..end]` run as one row of a sequence whose cache blocks are
/// `table`.
fn run_chunk(
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

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A fixed pseudo-random token sequence below `vocab`.
fn tokens(vocab: usize, len: usize) -> Vec<u32> {
    let mut state = 0x2545_f491_u64;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Teacher-forced logits over 512 positions, one token per step (the small-M FP8 kernel), agree
/// with the CPU backend's FP8 reference: top-1 on at least 99% of positions, every logit within
/// [`TOL_FP8`]. Prefills of 64 to 512 tokens (cuBLASLt's FP8 product, or the widened weights for
/// block scales) give the last position's logits within the same bound.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn fp8_teacher_forced_logits_match_the_cpu_reference() {
    if let Err(e) = probe() {
        panic!("no CUDA device: {e}");
    }
    let mut failures = Vec::new();
    let positions = positions();
    for (name, model, unquantized) in fp8_models() {
        let seq = tokens(model.config.vocab_size, positions);
        let table: Vec<u32> = (0..positions.div_ceil(16) as u32).collect();
        let mut gpu = cuda(&model);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (mut worst, mut agree) = (0.0f32, 0);
        let mut reference = Vec::with_capacity(positions);
        for pos in 0..positions {
            let g = run_chunk(&mut gpu, &seq, &table, pos, pos + 1);
            let c = run_chunk(&mut cpu, &seq, &table, pos, pos + 1);
            worst = worst.max(max_abs_diff(&g, &c));
            agree += usize::from(argmax(&g) == argmax(&c));
            reference.push(c);
        }
        let mut worst_prefill = 0.0f32;
        for end in (64..=positions).step_by(64) {
            let g = run_chunk(&mut gpu, &seq, &table, 0, end);
            worst_prefill = worst_prefill.max(max_abs_diff(&g, &reference[end - 1]));
        }
        // How far FP8 itself moves the logits, on the CPU and on the GPU: beside the bound above,
        // the scale of the quantization noise the comparison sees.
        if let Some(bf16) = unquantized {
            let mut cpu16 = CpuBackend::new(&bf16, 64 << 20).expect("CPU backend");
            let (mut cpu_shift, mut gpu_shift) = (0.0f32, 0.0f32);
            for (pos, c) in reference.iter().enumerate().take(128) {
                let u = run_chunk(&mut cpu16, &seq, &table, pos, pos + 1);
                cpu_shift = cpu_shift.max(max_abs_diff(c, &u));
                let g = run_chunk(&mut gpu, &seq, &table, pos, pos + 1);
                gpu_shift = gpu_shift.max(max_abs_diff(&g, &u));
            }
            println!(
                "RESULT {name}: over 128 positions, max|cpu fp8 - cpu bf16| {cpu_shift:.4}, max|cuda fp8 - cpu bf16| {gpu_shift:.4}"
            );
        }
        let agreement = agree as f64 / positions as f64;
        println!(
            "RESULT {name}: top-1 agreement {agreement:.4} over {positions} positions, max|cuda-cpu| stepwise {worst:.4}, prefill {worst_prefill:.4} (tolerance {TOL_FP8})"
        );
        if agreement < 0.99 || worst > TOL_FP8 || worst_prefill > TOL_FP8 {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}
