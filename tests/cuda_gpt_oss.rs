//! gpt-oss on the CUDA backend against the CPU backend (the reference, itself checked against
//! transformers in `tests/model_gpt_oss.rs`), on the GPU machine, for both tiny fixtures
//! (`tiny-gpt-oss`: MXFP4 experts kept in MXFP4 on the device, the products widening the codes
//! in registers; `tiny-gpt-oss-bf16`: the dequantized layout, bf16 experts): teacher-forced
//! logits of 320 positions (40 times the fixtures' sliding window of 8: sinks, sliding and full
//! layers, YaRN, the biased experts) one token per step, the same tokens as one prefill chunk and
//! as chunks of 100, and free-running greedy tokens against the CPU backend's.
//!
//! Run there with `--test-threads=1`. `INFERNO_FIXTURES` points at the fixture directory
//! (default: `tests/fixtures`).

mod support;
use support::{GREEDY, argmax, max_abs_diff, pseudo_random_tokens, run_chunk};

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::CudaBackend;
use inferno::engine::{Backend, BatchRow, SampleSpec, StepOutput};
use inferno::model::Model;

/// Logits tolerance against the CPU backend: the bf16 rounding of activations between products
/// (the bound of `tests/cuda_backend/` and `tests/cuda_moe.rs`).
const TOL_CPU: f32 = 0.1;
/// Reference margins below this are near-ties whose argmax may legitimately differ.
const MARGIN: f32 = 0.05;
/// Teacher-forced positions: far past the fixtures' window of 8.
const POSITIONS: usize = 320;

const FIXTURES: [&str; 2] = ["tiny-gpt-oss", "tiny-gpt-oss-bf16"];

use support::load_for_cuda as load;

/// A CUDA backend for `model` (see `support::small_cuda_backend`).
fn cuda(model: &Model, sample_on_device: bool) -> CudaBackend {
    support::small_cuda_backend(model, sample_on_device)
}

/// The block table of a sequence of `len` tokens from block 0.
fn table(len: usize) -> Vec<u32> {
    (0..len.div_ceil(16) as u32).collect()
}

/// Logits at every position of `tokens`, one token per step (teacher forcing).
fn per_position(backend: &mut dyn Backend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let table = table(tokens.len());
    (1..=tokens.len())
        .map(|end| run_chunk(backend, tokens, &table, end - 1, end))
        .collect()
}

/// Teacher-forced logits one token per step (decode attention with sinks over the sliding and
/// full layers, the experts at one token) against the CPU backend, within the bf16 tolerance,
/// with the argmax equal wherever the CPU's margin is clear.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage gptoss)"]
fn decode_logits_match_the_cpu_backend() {
    for name in FIXTURES {
        let model = load(name);
        let vocab = model.config.vocab_size;
        let tokens = pseudo_random_tokens(vocab, POSITIONS, 45);
        let mut gpu = cuda(&model, false);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let g = per_position(&mut gpu, &tokens);
        let r = per_position(&mut cpu, &tokens);
        let (mut worst, mut worst_at, mut checked, mut mismatches) = (0.0f32, 0, 0, Vec::new());
        for (pos, (gl, cl)) in g.iter().zip(&r).enumerate() {
            let diff = max_abs_diff(gl, cl);
            if diff > worst {
                (worst, worst_at) = (diff, pos);
            }
            let mut sorted = cl.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > MARGIN {
                checked += 1;
                if argmax(gl) != argmax(cl) {
                    mismatches.push(pos);
                }
            }
        }
        println!(
            "RESULT {name} decode: max|cuda-cpu| = {worst:.4} (position {worst_at}) over {POSITIONS} positions, {checked} argmax checks, {} mismatches",
            mismatches.len()
        );
        assert!(
            mismatches.is_empty(),
            "{name}: argmax differs at {mismatches:?}"
        );
        assert!(
            worst <= TOL_CPU,
            "{name}: logits differ from the CPU by {worst}"
        );
    }
}

/// The same tokens as one prefill chunk and as chunks of 100 (prefill attention with sinks, the
/// experts over many tokens): the last logits of each chunk against the CPU backend's. The chunks
/// of 320 and 100 tokens (1,280 and 400 expert rows over 8 experts) take the grouped tile path
/// (`gpt_oss_grouped`), the last chunk of 20 (80 rows) the per-slot products.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage gptoss)"]
fn prefill_logits_match_the_cpu_backend() {
    for name in FIXTURES {
        let model = load(name);
        let tokens = pseudo_random_tokens(model.config.vocab_size, POSITIONS, 46);
        let table = table(tokens.len());
        let mut gpu = cuda(&model, false);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let whole = max_abs_diff(
            &run_chunk(&mut gpu, &tokens, &table, 0, POSITIONS),
            &run_chunk(&mut cpu, &tokens, &table, 0, POSITIONS),
        );
        let mut chunked = 0.0f32;
        for start in (0..POSITIONS).step_by(100) {
            let end = (start + 100).min(POSITIONS);
            let g = run_chunk(&mut gpu, &tokens, &table, start, end);
            let r = run_chunk(&mut cpu, &tokens, &table, start, end);
            chunked = chunked.max(max_abs_diff(&g, &r));
        }
        println!(
            "RESULT {name} prefill: max|cuda-cpu| = {whole:.4} (one chunk of {POSITIONS}), {chunked:.4} (chunks of 100)"
        );
        assert!(whole <= TOL_CPU, "{name}: prefill logits differ by {whole}");
        assert!(
            chunked <= TOL_CPU,
            "{name}: chunked prefill differs by {chunked}"
        );
    }
}

/// Free-running greedy tokens with sampling on the device (decode steps from CUDA graphs), 200 of
/// them past a 40-token prompt, equal the CPU backend's up to its first near-tie.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage gptoss)"]
fn greedy_tokens_match_the_cpu_backend() {
    for name in FIXTURES {
        let model = load(name);
        let prompt = pseudo_random_tokens(model.config.vocab_size, 40, 47);
        let steps = 200;
        let table = table(prompt.len() + steps);
        // The CPU's greedy tokens and the margin of each choice.
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (mut reference, mut margins, mut tokens) = (Vec::new(), Vec::new(), prompt.clone());
        let mut start = 0;
        for _ in 0..steps {
            let logits = run_chunk(&mut cpu, &tokens, &table, start, tokens.len());
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            margins.push(sorted[0] - sorted[1]);
            start = tokens.len();
            let next = argmax(&logits) as u32;
            reference.push(next);
            tokens.push(next);
        }
        let mut sampler = cuda(&model, true);
        let (mut tokens, mut start, mut checked) = (prompt.clone(), 0, 0);
        let mut mismatch = None;
        for (i, (want, margin)) in reference.iter().zip(&margins).enumerate() {
            let row = BatchRow {
                seq_id: 7,
                tokens: &tokens[start..],
                start_pos: start,
                block_table: &table,
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
            let StepOutput::Sampled(out) = sampler.step(&[row]).expect("step") else {
                panic!("expected sampled tokens")
            };
            start = tokens.len();
            let got = out[0].token;
            tokens.push(got);
            if *margin < MARGIN {
                break;
            }
            if got != *want {
                mismatch = Some(format!("step {i}: {got}, CPU {want}"));
                break;
            }
            checked += 1;
        }
        println!("RESULT {name} greedy: {checked} steps equal to the CPU backend's");
        assert!(mismatch.is_none(), "{name}: {mismatch:?}");
        assert!(checked > 0, "{name}: no greedy step checked");
    }
}
