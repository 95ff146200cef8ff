//! The CUDA backend's mixture-of-experts path (`kernels/moe.cu`) against the CPU backend (the
//! reference, itself checked against transformers in `tests/model_moe.rs`) on the three tiny MoE
//! fixtures, on the GPU machine: teacher-forced logits one token per step (the decode path:
//! routing, permutation and gather in one block), whole prompts as one prefill chunk and several
//! prompts in one step (the many-token path), and free-running greedy tokens against
//! transformers'. The fixtures' routers give experts 2 and 5 the same row, so many tokens tie at
//! the top-k boundary: the GPU must choose as torch does on the CPU.
//!
//! Run there with `--test-threads=1`. `INFERNO_FIXTURES` points at the fixture directory
//! (default: `tests/fixtures`).

mod support;
use support::{GREEDY, argmax, max_abs_diff};

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, probe};
use inferno::engine::{Backend, BatchRow, EngineConfig, SampleSpec, StepOutput};
use inferno::model::Model;

/// Logits tolerance against the CPU backend: the bf16 rounding of activations between products
/// (`tests/cuda_backend.rs`' bound).
const TOL_CPU: f32 = 0.1;
/// Reference margins below this are near-ties whose argmax may legitimately differ.
const MARGIN: f32 = 0.05;

const FIXTURES: [&str; 3] = ["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen2-moe"];

fn fixtures() -> PathBuf {
    std::env::var_os("INFERNO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn load(name: &str) -> Model {
    if let Err(e) = probe() {
        panic!("no CUDA device: {e}");
    }
    let dir = fixtures().join(name);
    Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

fn golden(name: &str) -> serde_json::Value {
    let path = fixtures().join(name).join("golden.json");
    serde_json::from_slice(&std::fs::read(&path).expect("golden.json")).expect("golden.json parses")
}

/// A CUDA backend for `model`; the small-M kernels serve every product they fit (no timing), so
/// runs are reproducible.
fn cuda(model: &Model, sample_on_device: bool) -> CudaBackend {
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

fn spec() -> SampleSpec<'static> {
    SampleSpec {
        params: &GREEDY,
        seed: 0,
        draw_index: 0,
        prompt: &[],
        output: &[],
        logprobs: None,
        mask: None,
    }
}

/// One row: `tokens[start..]` of sequence `seq_id` whose block table starts at `first_block`.
struct Row<'a> {
    seq_id: u64,
    tokens: &'a [u32],
    start: usize,
    table: Vec<u32>,
}

fn table(first_block: u32, len: usize) -> Vec<u32> {
    (first_block..first_block + len.div_ceil(16) as u32).collect()
}

/// The logits of each row's last token, all rows in one step.
fn step(backend: &mut dyn Backend, rows: &[Row<'_>]) -> Vec<Vec<f32>> {
    let batch: Vec<BatchRow<'_>> = rows
        .iter()
        .map(|r| BatchRow {
            seq_id: r.seq_id,
            tokens: &r.tokens[r.start..],
            start_pos: r.start,
            block_table: &r.table,
            sample: Some(spec()),
        })
        .collect();
    match backend.step(&batch).expect("step") {
        StepOutput::Logits(l) => l,
        StepOutput::Sampled(_) => panic!("expected logits"),
    }
}

/// Logits at every position of `tokens`, one token per step (teacher forcing).
fn per_position(backend: &mut dyn Backend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let table = table(0, tokens.len());
    (1..=tokens.len())
        .map(|end| {
            let row = Row {
                seq_id: 1,
                tokens: &tokens[..end],
                start: end - 1,
                table: table.clone(),
            };
            step(backend, &[row]).remove(0)
        })
        .collect()
}

/// Decodes the sequences `cases` (tokens and the CPU's logits at each position) in lockstep, one
/// token of each per step, as far as the shortest goes; the largest difference from the CPU's.
fn lockstep(backend: &mut dyn Backend, cases: &[(Vec<u32>, Vec<Vec<f32>>)]) -> f32 {
    let shortest = cases.iter().map(|(t, _)| t.len()).min().unwrap_or(0);
    let tables: Vec<Vec<u32>> = (0..cases.len())
        .map(|i| table(i as u32 * shortest.div_ceil(16) as u32, shortest))
        .collect();
    let mut worst = 0.0f32;
    for pos in 0..shortest {
        let rows: Vec<Row<'_>> = cases
            .iter()
            .zip(&tables)
            .enumerate()
            .map(|(i, ((tokens, _), table))| Row {
                seq_id: i as u64 + 1,
                tokens: &tokens[..=pos],
                start: pos,
                table: table.clone(),
            })
            .collect();
        for (logits, (_, cpu)) in step(backend, &rows).iter().zip(cases) {
            worst = worst.max(max_abs_diff(logits, &cpu[pos]));
        }
    }
    worst
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("a list of ids")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .expect("a list of numbers")
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

/// Teacher-forced logits one token per step (decode: one token, top-k slots through the fused
/// routing block and the grouped small-M products) against the CPU backend, within the bf16
/// tolerance, with the argmax equal wherever the CPU's margin is clear.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage moe)"]
fn decode_logits_match_the_cpu_backend() {
    for name in FIXTURES {
        let model = load(name);
        let golden = golden(name);
        let mut gpu = cuda(&model, false);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (mut worst, mut checked, mut mismatches) = (0.0f32, 0, Vec::new());
        // Positions, those beyond the tolerance and beyond half of it, and where the worst is.
        let (mut positions, mut over, mut over_half, mut worst_at) = (0, 0, 0, (0, 0));
        let mut cpu_logits = Vec::new();
        for (c, case) in golden["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let tokens = ids(&case["teacher_forced"]["tokens"]);
            let g = per_position(&mut gpu, &tokens);
            let r = per_position(&mut cpu, &tokens);
            cpu_logits.push((tokens, r.clone()));
            for (pos, (gl, cl)) in g.iter().zip(&r).enumerate() {
                let diff = max_abs_diff(gl, cl);
                positions += 1;
                over += usize::from(diff > TOL_CPU);
                over_half += usize::from(diff > TOL_CPU / 2.0);
                if diff > worst {
                    (worst, worst_at) = (diff, (c, pos));
                }
                let want = argmax(cl);
                let mut sorted = cl.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] > MARGIN {
                    checked += 1;
                    if argmax(gl) != want {
                        mismatches.push(format!("case {c} position {pos}"));
                    }
                }
            }
        }
        println!(
            "RESULT {name} decode: max|cuda-cpu| = {worst:.4} (case {} position {}), {over} of {positions} positions above {TOL_CPU}, {over_half} above {}, {checked} argmax checks, {} argmax mismatches",
            worst_at.0,
            worst_at.1,
            TOL_CPU / 2.0,
            mismatches.len()
        );
        // Several sequences decoded in lockstep, one token each per step: 3 (the one-block
        // routing, the batch padded to a graph bucket) and all cases (the many-token path).
        for rows in [3, cpu_logits.len()] {
            let batched = lockstep(&mut gpu, &cpu_logits[..rows]);
            println!("RESULT {name} decode, {rows} sequences a step: max|cuda-cpu| = {batched:.4}");
            assert!(
                batched <= TOL_CPU,
                "{name}: {rows} sequences a step differ from the CPU by {batched}"
            );
        }
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

/// Each case's teacher-forced tokens as one prefill chunk, and every case's prompt in one step
/// (many tokens: routing over many blocks, the one-block permutation, the gather, experts with
/// many rows): the last logits against the CPU backend's.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage moe)"]
fn prefill_logits_match_the_cpu_backend() {
    for name in FIXTURES {
        let model = load(name);
        let golden = golden(name);
        let cases = golden["cases"].as_array().expect("cases");
        let mut gpu = cuda(&model, false);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let mut worst = 0.0f32;
        for case in cases {
            let tokens = ids(&case["teacher_forced"]["tokens"]);
            let row = || Row {
                seq_id: 1,
                tokens: &tokens,
                start: 0,
                table: table(0, tokens.len()),
            };
            let g = step(&mut gpu, &[row()]);
            let r = step(&mut cpu, &[row()]);
            worst = worst.max(max_abs_diff(&g[0], &r[0]));
        }
        let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["input_ids"])).collect();
        let mut next_block = 0;
        let rows: Vec<Row<'_>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let row = Row {
                    seq_id: i as u64 + 1,
                    tokens: p,
                    start: 0,
                    table: table(next_block, p.len()),
                };
                next_block += p.len().div_ceil(16) as u32;
                row
            })
            .collect();
        let g = step(&mut gpu, &rows);
        let r = step(&mut cpu, &rows);
        let batched = g
            .iter()
            .zip(&r)
            .map(|(a, b)| max_abs_diff(a, b))
            .fold(0.0, f32::max);
        let total: usize = prompts.iter().map(Vec::len).sum();
        println!(
            "RESULT {name} prefill: max|cuda-cpu| = {worst:.4} (one chunk per case), {batched:.4} ({} prompts, {total} tokens in one step)",
            prompts.len()
        );
        assert!(worst <= TOL_CPU, "{name}: prefill logits differ by {worst}");
        assert!(
            batched <= TOL_CPU,
            "{name}: batched prefill differs by {batched}"
        );
    }
}

/// Free-running greedy tokens with sampling on the device (decode steps from CUDA graphs) equal
/// transformers' (`greedy_24`) up to the first near-tie of the reference.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it (stage moe)"]
fn greedy_tokens_match_transformers() {
    for name in FIXTURES {
        let model = load(name);
        let golden = golden(name);
        let mut sampler = cuda(&model, true);
        let (mut checked, mut mismatches) = (0, Vec::new());
        for (c, case) in golden["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let prompt = ids(&case["input_ids"]);
            let reference = ids(&case["greedy_24"]);
            let margins = floats(&case["greedy_margins"]);
            let mut tokens = prompt.clone();
            let table = table(0, prompt.len() + reference.len());
            let mut start = 0;
            for (i, (want, margin)) in reference.iter().zip(&margins).enumerate() {
                let row = BatchRow {
                    seq_id: 7,
                    tokens: &tokens[start..],
                    start_pos: start,
                    block_table: &table,
                    sample: Some(spec()),
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
                    mismatches.push(format!("case {c} step {i}: {got}, reference {want}"));
                    break;
                }
                checked += 1;
            }
        }
        println!("RESULT {name} greedy: {checked} steps equal to transformers'");
        assert!(mismatches.is_empty(), "{name}: {mismatches:?}");
        assert!(checked > 0, "{name}: no greedy step checked");
    }
}
