//! Per-position logits and speculative decoding on the CUDA backend, on the GPU machine
//! (`scripts/gpu-check.sh`, stage `spec`): `step_logits` against the CPU backend at every
//! position of a verification row and of an echoed prompt, in one step with a plain decode row;
//! the tokens sampled on the device at every verified position against the host's argmax; and
//! greedy output with and without speculation through the engine.
//!
//! `INFERNO_FIXTURES` points at the fixture directory (default: `tests/fixtures`);
//! `INFERNO_SPEC_MODEL` names a model directory for the greedy-identity test instead of the
//! fixtures (the stage's 8B-shaped weights), `INFERNO_SPEC_PROMPTS` its prompt count.

mod support;

use support::{GREEDY, gpu_fixtures, max_abs_diff, require_gpu};

use std::path::{Path, PathBuf};

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions};
use inferno::engine::{
    Backend, BatchRow, Engine, EngineConfig, EngineHandle, GenerationEvent, GenerationRequest,
    ModelInfo, SampleSpec, SpeculativeConfig, SpeculativeMethod,
};
use inferno::model::Model;

/// Logits and hidden-state tolerance against the CPU backend: the CUDA backend rounds
/// activations to bf16 between products (as `TOL_CPU` of `tests/cuda_backend/`).
const TOL_CPU: f32 = 0.1;
/// Logit margins below this are near-ties whose argmax may differ between two computations.
const MARGIN: f32 = 0.1;

fn config(memory: f64) -> EngineConfig {
    EngineConfig {
        gpu_memory_fraction: memory,
        max_batched_tokens: 2048,
        max_num_seqs: Some(16),
        ..EngineConfig::default()
    }
}

fn cuda(model: &Model, config: &EngineConfig, sample_on_device: bool) -> CudaBackend {
    cuda_with(model, config, sample_on_device, true, false)
}

/// A CUDA backend; `measure_products` as served (product paths and cuBLASLt algorithms timed at
/// start-up) or not (every backend computing bit for bit the same, for tests that compare).
fn cuda_with(
    model: &Model,
    config: &EngineConfig,
    sample_on_device: bool,
    eager_small_steps: bool,
    measure_products: bool,
) -> CudaBackend {
    let options = CudaOptions {
        sample_on_device,
        measure_products,
        eager_small_steps,
        ..CudaOptions::default()
    };
    CudaBackend::new(model, config, options).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// The index of the largest value and its margin over the second.
fn argmax(v: &[f32]) -> (usize, f32) {
    let best = v
        .iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > v[b] { i } else { b });
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &x)| x)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, v[best] - second)
}

fn greedy_spec(output: &[u32]) -> SampleSpec<'_> {
    SampleSpec {
        params: &GREEDY,
        seed: 0,
        draw_index: output.len() as u64,
        prompt: &[],
        output,
        logprobs: None,
        mask: None,
    }
}

/// The three sequences of the compared step, with their own blocks: an echoed prompt (every
/// position), a verification row (its last token and four proposals, after its prompt was
/// computed by an earlier step) and a plain decode row (after its prompt).
struct Scene {
    echo: Vec<u32>,
    verify: Vec<u32>,
    decode: Vec<u32>,
    tables: [Vec<u32>; 3],
}

impl Scene {
    fn new(prompt: &[u32]) -> Self {
        let n = prompt.len();
        let verify: Vec<u32> = prompt.iter().chain(&prompt[..5.min(n)]).copied().collect();
        let decode: Vec<u32> = prompt.iter().rev().copied().collect();
        let blocks = |len: usize| len.div_ceil(16) as u32;
        let (a, b, c) = (blocks(n), blocks(verify.len()), blocks(decode.len()));
        Self {
            tables: [
                (0..a).collect(),
                (a..a + b).collect(),
                (a + b..a + b + c).collect(),
            ],
            echo: prompt.to_vec(),
            verify,
            decode,
        }
    }

    /// The verification row's prompt part (computed first), and its verified tokens.
    fn verify_split(&self) -> usize {
        self.verify.len() - 5
    }

    /// The step that computes the verification and decode rows' earlier tokens.
    fn first_step(&self) -> Vec<BatchRow<'_>> {
        let split = self.verify_split();
        vec![
            BatchRow {
                seq_id: 2,
                tokens: &self.verify[..split],
                start_pos: 0,
                block_table: &self.tables[1],
                sample: None,
            },
            BatchRow {
                seq_id: 3,
                tokens: &self.decode[..self.decode.len() - 1],
                start_pos: 0,
                block_table: &self.tables[2],
                sample: None,
            },
        ]
    }

    /// The compared step: echo (every position), verification (five), decode (one).
    fn second_step(&self) -> (Vec<BatchRow<'_>>, Vec<usize>) {
        let split = self.verify_split();
        let rows = vec![
            BatchRow {
                seq_id: 1,
                tokens: &self.echo,
                start_pos: 0,
                block_table: &self.tables[0],
                sample: None,
            },
            BatchRow {
                seq_id: 2,
                tokens: &self.verify[split..],
                start_pos: split,
                block_table: &self.tables[1],
                sample: Some(greedy_spec(&[])),
            },
            BatchRow {
                seq_id: 3,
                tokens: &self.decode[self.decode.len() - 1..],
                start_pos: self.decode.len() - 1,
                block_table: &self.tables[2],
                sample: Some(greedy_spec(&[])),
            },
        ];
        (rows, vec![self.echo.len(), 5, 1])
    }
}

/// The compared step on `backend`: its per-position logits and the echoed row's hidden state.
fn positions_of(backend: &mut dyn Backend, scene: &Scene) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    backend
        .step_logits(&scene.first_step(), &[0, 0], &[])
        .expect("first step");
    let (rows, positions) = scene.second_step();
    backend
        .step_logits(&rows, &positions, &[0])
        .expect("step_logits")
}

fn prompt_of(dir: &Path) -> Vec<u32> {
    let cases = support::golden(dir);
    let first = &cases[0].input_ids;
    // Long enough for several prefill tiles and a second KV block.
    [first.as_slice(), first, first].concat()
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn step_logits_match_the_cpu_backend_at_every_position() {
    require_gpu();
    for name in ["inferno-tiny", "tiny-qwen3"] {
        let dir = gpu_fixtures().join(name);
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let scene = Scene::new(&prompt_of(&dir));
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (want, want_hidden) = positions_of(&mut cpu, &scene);
        for sample_on_device in [false, true] {
            let mut gpu = cuda(&model, &config(0.02), sample_on_device);
            let (got, got_hidden) = positions_of(&mut gpu, &scene);
            assert_eq!(got.len(), want.len(), "{name}: positions");
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| max_abs_diff(g, w))
                .fold(0.0, f32::max);
            let hidden = max_abs_diff(&got_hidden[0], &want_hidden[0]);
            println!(
                "RESULT step_logits {name} (device sampling {sample_on_device}): {} positions, \
                 max |Δlogit| {worst:.4}, hidden max |Δ| {hidden:.4}",
                got.len()
            );
            assert!(worst < TOL_CPU, "{name}: logits differ by {worst}");
            assert!(hidden < TOL_CPU, "{name}: hidden states differ by {hidden}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn tokens_sampled_at_every_verified_position_are_the_argmax() {
    require_gpu();
    let dir = gpu_fixtures().join("inferno-tiny");
    let model = Model::load(&dir).expect("fixture");
    let scene = Scene::new(&prompt_of(&dir));
    let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
    let (want, _) = positions_of(&mut cpu, &scene);
    let mut gpu = cuda(&model, &config(0.02), true);
    gpu.step_logits(&scene.first_step(), &[0, 0], &[])
        .expect("first step");
    let (rows, _) = scene.second_step();
    // Position j of the verification row sees the proposals before it as output.
    let split = scene.verify_split();
    let proposals = &scene.verify[split + 1..];
    let verify_specs: Vec<SampleSpec<'_>> = (0..=proposals.len())
        .map(|j| greedy_spec(&proposals[..j]))
        .collect();
    let decode_spec = [greedy_spec(&[])];
    let specs: [&[SampleSpec<'_>]; 3] = [&[], &verify_specs, &decode_spec];
    let tokens = gpu
        .step_sampled_positions(&rows, &specs)
        .expect("sampled positions");
    assert_eq!(tokens.len(), 6);
    let reference = &want[scene.echo.len()..];
    for (i, (token, logits)) in tokens.iter().zip(reference).enumerate() {
        let (best, margin) = argmax(logits);
        assert!(
            token.token as usize == best || margin < MARGIN,
            "position {i}: sampled {} against the CPU argmax {best} (margin {margin})",
            token.token
        );
    }
    println!("RESULT sampled positions: 6 of 6 equal to the CPU argmax (or within a near-tie)");
}

fn eager_speculation() -> SpeculativeConfig {
    SpeculativeConfig {
        method: Some(SpeculativeMethod::Ngram),
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        adaptive: false,
        forced_acceptance: None,
    }
}

/// One greedy request's tokens and, with logprobs asked, the margin of its top choice over the
/// second at each step.
fn generate(engine: &EngineHandle, prompt: &[u32], max_tokens: usize, logprobs: bool) -> Run {
    let request = GenerationRequest {
        logprobs: logprobs.then_some(2),
        ..support::greedy(prompt, max_tokens)
    };
    let mut stream = engine.submit(request).expect("accepted");
    let mut run = Run::default();
    while let Some(event) = stream.blocking_next() {
        match event {
            GenerationEvent::Token { token, logprob, .. } => {
                run.tokens.push(token);
                let margin = logprob
                    .and_then(|l| Some(l.top.first()?.1 - l.top.get(1)?.1))
                    .unwrap_or(f32::INFINITY);
                run.margins.push(margin);
            }
            GenerationEvent::Finished { reason, .. } => {
                assert!(
                    !matches!(reason, inferno::engine::FinishReason::Error(_)),
                    "{reason:?}"
                );
                break;
            }
            GenerationEvent::Hidden { .. } => {}
        }
    }
    run
}

#[derive(Debug, Default)]
struct Run {
    tokens: Vec<u32>,
    margins: Vec<f32>,
}

fn run_all(engine: &EngineHandle, prompts: &[Vec<u32>], max_tokens: usize, lp: bool) -> Vec<Run> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(move || generate(engine, p, max_tokens, lp)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("run"))
            .collect()
    })
}

/// Prompts that propose: the fixtures' golden prompts repeated, or, for a model directory given
/// by `INFERNO_SPEC_MODEL`, one token repeated 256 times (a different token per prompt).
///
/// Random weights (the stage's 8B-shaped model) never repeat a token in free text: a prompt of a
/// random run repeated three times made no proposal in 8 x 64 tokens (the first output token is
/// already new, so no n-gram of the context ever recurs). In a context of one token repeated,
/// every position holds the same values, so each position's hidden state is the same whatever
/// the weights; the next output tokens see that context almost unchanged and repeat the first
/// output token, which prompt lookup then proposes from the output itself.
fn identity_prompts(dir: &Path, vocab: usize, given: bool) -> Vec<Vec<u32>> {
    if !given {
        return support::golden(dir)
            .into_iter()
            .map(|c| [c.input_ids.clone(), c.input_ids].concat())
            .collect();
    }
    let count = std::env::var("INFERNO_SPEC_PROMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    support::pseudo_random_tokens(vocab, count, 51)
        .into_iter()
        .map(|token| vec![token; 256])
        .collect()
}

fn engine_on(model: &Model, config: EngineConfig) -> EngineHandle {
    let backend = cuda(model, &config, true);
    Engine::spawn(Box::new(backend), ModelInfo::of(model), config).expect("engine starts")
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn greedy_output_is_identical_with_speculation_on_cuda() {
    require_gpu();
    let given = std::env::var_os("INFERNO_SPEC_MODEL").map(PathBuf::from);
    let dir = given
        .clone()
        .unwrap_or_else(|| gpu_fixtures().join("inferno-tiny"));
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let prompts = identity_prompts(&dir, model.config.vocab_size, given.is_some());
    let memory = if given.is_some() { 0.3 } else { 0.02 };
    let max_tokens = 64;
    let plain = engine_on(&model, config(memory));
    let expected = run_all(&plain, &prompts, max_tokens, true);
    plain.shutdown();
    drop(plain);
    let speculative = engine_on(
        &model,
        EngineConfig {
            speculative: eager_speculation(),
            ..config(memory)
        },
    );
    let got = run_all(&speculative, &prompts, max_tokens, false);
    let stats = speculative.stats();
    speculative.shutdown();
    let mut identical = 0;
    for (i, (want, got)) in expected.iter().zip(&got).enumerate() {
        match want
            .tokens
            .iter()
            .zip(&got.tokens)
            .position(|(a, b)| a != b)
        {
            None => {
                assert_eq!(want.tokens.len(), got.tokens.len(), "prompt {i}: length");
                identical += 1;
            }
            Some(at) => {
                let margin = want.margins[at];
                println!("prompt {i}: first difference at output token {at}, margin {margin:.4}");
                assert!(
                    margin < MARGIN,
                    "prompt {i}: output token {at} differs with speculation (margin {margin})"
                );
            }
        }
    }
    println!(
        "RESULT greedy identity with speculation on CUDA ({}): {identical} of {} identical (the \
         rest differ first at a near-tie); {} verifications, {} proposed, {} accepted",
        dir.display(),
        prompts.len(),
        stats.spec_verifications,
        stats.spec_draft_tokens,
        stats.spec_accepted_tokens
    );
    assert!(stats.spec_verifications > 0, "{stats:?}");
    assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
}

/// Mean seconds per step of `step` run `steps` times after two warm-up runs; `step` is told the
/// run's index (0 and 1: the warm-ups).
fn mean_step(steps: usize, mut step: impl FnMut(usize)) -> f64 {
    step(0);
    step(1);
    let started = std::time::Instant::now();
    for i in 0..steps {
        step(2 + i);
    }
    started.elapsed().as_secs_f64() / steps as f64
}

/// `INFERNO_SPEC_PROFILE=B`: the verification-cost test measures batch `B` alone, as served, one
/// step of each kind after the warm-ups, and the profiler collects those two steps only (the
/// `spec` stage runs it under `ncu --profile-from-start off`: the time of each kernel of a decode
/// step, then of a verification step).
fn profiled_batch() -> Option<usize> {
    std::env::var("INFERNO_SPEC_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The cost of a verification step (each row its last token and `K = 4` proposals, every
/// position sampled on the device) against a plain decode step, at batch 1 and 8 after
/// `INFERNO_SPEC_CONTEXT` (default 512) prompt tokens, on `INFERNO_SPEC_MODEL` (the stage's
/// 8B-shaped weights; the fixture without it), every backend timing its product paths and
/// cuBLASLt algorithms at start-up as a served one does: as served (a verification step of at most 8
/// tokens eagerly through the small-M kernels, larger ones in mixed-step graphs), with small steps padded to
/// the smallest graph bucket instead, and with the mixed-step graphs off (or one batch profiled:
/// [`profiled_batch`]).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn verification_step_cost_against_a_decode_step() {
    require_gpu();
    let dir = std::env::var_os("INFERNO_SPEC_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| gpu_fixtures().join("inferno-tiny"));
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let context: usize = std::env::var("INFERNO_SPEC_CONTEXT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let profiled = profiled_batch();
    let steps = if profiled.is_some() { 1 } else { 64 };
    let k = 4;
    let arms = [
        ("served", true, true),
        ("small steps in graphs", true, false),
        ("mixed graphs off", false, true),
    ];
    let arms = if profiled.is_some() {
        &arms[..1]
    } else {
        &arms[..]
    };
    let batches = profiled.map_or(vec![1usize, 8], |b| vec![b]);
    for &(arm, mixed_graphs, eager_small) in arms {
        // Room for batch 8's 40 sampled positions.
        let config = EngineConfig {
            cuda_mixed_graphs: mixed_graphs,
            max_num_seqs: Some(64.max(batches.iter().max().map_or(0, |b| b * (k + 1)))),
            ..config(0.3)
        };
        // Products chosen by timing at start-up, as served.
        let mut gpu = cuda_with(&model, &config, true, eager_small, true);
        for &batch in &batches {
            let len = context + 2 * steps + k + 8;
            let per_row = len.div_ceil(16);
            let tables: Vec<Vec<u32>> = (0..batch)
                .map(|r| (r * per_row..(r + 1) * per_row).map(|b| b as u32).collect())
                .collect();
            let tokens: Vec<Vec<u32>> = (0..batch)
                .map(|r| (0..len).map(|i| ((i * 7 + r * 13) % 1000) as u32).collect())
                .collect();
            // One prompt per step, within the step's token limit.
            for r in 0..batch {
                let prefill = BatchRow {
                    seq_id: r as u64,
                    tokens: &tokens[r][..context],
                    start_pos: 0,
                    block_table: &tables[r],
                    sample: None,
                };
                gpu.step_logits(&[prefill], &[0], &[]).expect("prefill");
            }
            let decode = mean_step(steps, |i| {
                let rows: Vec<BatchRow<'_>> = (0..batch)
                    .map(|r| BatchRow {
                        seq_id: r as u64,
                        tokens: &tokens[r][context + i..=context + i],
                        start_pos: context + i,
                        block_table: &tables[r],
                        sample: Some(greedy_spec(&[])),
                    })
                    .collect();
                if profiled.is_some() && i == 2 {
                    gpu.profiler_collect(true).expect("profiler on");
                }
                gpu.step(&rows).expect("decode step");
            });
            if profiled.is_some() {
                gpu.profiler_collect(false).expect("profiler off");
            }
            let outputs: Vec<Vec<u32>> = (0..=k).map(|j| vec![1; j]).collect();
            let specs: Vec<SampleSpec<'_>> = outputs.iter().map(|o| greedy_spec(o)).collect();
            let verify = mean_step(steps, |i| {
                let rows: Vec<BatchRow<'_>> = (0..batch)
                    .map(|r| BatchRow {
                        seq_id: r as u64,
                        tokens: &tokens[r][context + i..=context + i + k],
                        start_pos: context + i,
                        block_table: &tables[r],
                        sample: Some(greedy_spec(&[])),
                    })
                    .collect();
                let all: Vec<&[SampleSpec<'_>]> = (0..batch).map(|_| specs.as_slice()).collect();
                if profiled.is_some() && i == 2 {
                    gpu.profiler_collect(true).expect("profiler on");
                }
                let got = gpu
                    .step_sampled_positions(&rows, &all)
                    .expect("verification step");
                assert_eq!(got.len(), batch * (k + 1));
            });
            if profiled.is_some() {
                gpu.profiler_collect(false).expect("profiler off");
            }
            println!(
                "RESULT verification cost batch={batch} K={k} context={context} ({arm}): \
                 decode {:.3} ms, verification {:.3} ms, ratio {:.3} (target <= 1.15)",
                decode * 1e3,
                verify * 1e3,
                verify / decode
            );
        }
    }
}

/// The prompt's logprobs of one request (`prompt_logprobs: 2`), through `engine`.
fn prompt_logprobs(
    engine: &EngineHandle,
    prompt: &[u32],
) -> Vec<Option<inferno::engine::PromptLogprob>> {
    let request = GenerationRequest {
        prompt_logprobs: Some(2),
        ..support::greedy(prompt, 1)
    };
    let mut stream = engine.submit(request).expect("accepted");
    while let Some(event) = stream.blocking_next() {
        if let GenerationEvent::Finished {
            prompt_logprobs, ..
        } = event
        {
            return prompt_logprobs.expect("prompt logprobs");
        }
    }
    panic!("no Finished event")
}

/// Prompt logprobs (the server's `echo` with `logprobs`) through the engine on the CUDA backend
/// equal the CPU backend's within the logits tolerance: a prompt longer than the step's token
/// budget (several prefill chunks) and than the logits buffer's rows (several LM-head chunks).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn prompt_logprobs_on_cuda_match_the_cpu_backend() {
    require_gpu();
    let dir = gpu_fixtures().join("inferno-tiny");
    let model = Model::load(&dir).expect("fixture");
    let prompt: Vec<u32> = prompt_of(&dir).into_iter().cycle().take(300).collect();
    let small = EngineConfig {
        max_batched_tokens: 128,
        ..config(0.02)
    };
    let cpu = support::engine(&model, small.clone());
    let want = prompt_logprobs(&cpu, &prompt);
    cpu.shutdown();
    let gpu = engine_on(&model, small);
    let got = prompt_logprobs(&gpu, &prompt);
    gpu.shutdown();
    assert_eq!(got.len(), prompt.len());
    assert!(got[0].is_none() && want[0].is_none());
    let mut worst = 0.0f32;
    for (i, (g, w)) in got.iter().zip(&want).enumerate().skip(1) {
        let (g, w) = (g.as_ref().expect("logprob"), w.as_ref().expect("logprob"));
        worst = worst.max((g.logprob - w.logprob).abs());
        assert!(
            (g.logprob - w.logprob).abs() < TOL_CPU,
            "position {i}: {} against {}",
            g.logprob,
            w.logprob
        );
    }
    println!(
        "RESULT prompt logprobs on CUDA: {} positions, max |Δlogprob| against the CPU {worst:.4}",
        prompt.len()
    );
}
