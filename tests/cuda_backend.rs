//! The CUDA backend against the CPU backend and transformers (the fixtures' `golden.json`), on
//! the GPU machine. Every test skips loudly where no NVIDIA driver or GPU is present (CI).
//!
//! Run there with `--test-threads=1` (each test takes a slice of GPU memory for its KV cache).
//! `INFERNO_FIXTURES` points at the fixture directory (default: `tests/fixtures`).

mod support;
use support::{GREEDY, Generated, max_abs_diff, run_request};

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, EarlyUpload, OpenedDevice, probe};
use inferno::engine::{Backend, BatchRow, EngineConfig, SampleSpec, SamplingParams, StepOutput};
use inferno::model::{Model, ModelFiles};

/// Logits tolerance against the CPU backend and the fixtures' reference (both compute in fp32 over
/// the bf16 weights): this backend rounds activations to bf16 between GEMMs (relative error
/// ~4e-3 each), so logits of magnitude ~3 may differ by a few 1e-2.
const TOL_CPU: f32 = 0.1;
/// Logits tolerance against the transformers reference in `golden.json`.
const TOL_REF: f32 = 0.1;
/// Reference margins below this are near-ties whose argmax may legitimately differ.
const MARGIN: f32 = 0.05;

/// How far two prefills of the same tokens that split the work differently (chunks, tiles, the
/// tensor-core kernel against the paged kernel) may differ, in logits. The prefill attention
/// kernel rounds the softmax weights to bf16 before P·V, as FlashAttention does, so such runs
/// agree to within that rounding, not bit for bit (measured on an H100: up to 0.029 on the
/// fixtures). The comparison with the CPU backend and transformers keeps its own 0.1.
const PREFILL_TOLERANCE: f32 = 0.05;

fn fixtures() -> PathBuf {
    std::env::var_os("INFERNO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// Every test here needs a GPU: they are ignored by default and run with `--include-ignored`
/// on the GPU machine (scripts/gpu-check.sh), where a missing device is a failure.
fn require_gpu() {
    if let Err(e) = probe() {
        panic!("no CUDA device: {e}");
    }
}

fn load(name: &str) -> Model {
    let dir = fixtures().join(name);
    Model::load(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// inferno-tiny's weights read as 2 query heads and 1 KV head of 64 dimensions (the projections
/// keep their shapes), in a temporary copy: a model whose prefill attention takes the kernel's
/// Hopper path (head_dim 64 or 128) where the device has it. Its outputs mean nothing; kernels
/// are compared on it.
fn tiny_with_head_dim_64() -> (tempfile::TempDir, Model) {
    let dir = tiny_copy(|config| {
        config["num_attention_heads"] = 2.into();
        config["num_key_value_heads"] = 1.into();
        config["head_dim"] = 64.into();
    });
    let model = Model::load(dir.path()).expect("loading the reshaped fixture");
    (dir, model)
}

/// A temporary copy of the inferno-tiny fixture whose config.json `edit` has changed.
fn tiny_copy(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let source = fixtures().join("inferno-tiny");
    let dir = tempfile::tempdir().expect("temporary directory");
    for entry in std::fs::read_dir(&source).expect("inferno-tiny fixture") {
        let entry = entry.expect("fixture entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name()))
            .expect("copying the fixture");
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("config")).expect("config JSON");
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec(&config).expect("config JSON")).expect("config");
    dir
}

/// inferno-tiny with its tied embedding grown to `vocab` rows, in a temporary copy: row `i` is row
/// `i % 1024` of the fixture, exactly in even copies and with every value's lowest bit flipped in
/// odd ones, so a row of logits holds exact ties and near ties across the whole vocabulary. The
/// final norm's weight is scaled by 4 (exactly), so most of a row's probability sits on a few
/// hundred ids, as in a trained model's rows: over a near-uniform row of 128k ids the reference's
/// sequential float sums drift by more than one id's probability, and no two implementations
/// would agree draw for draw. Its outputs mean nothing; the sampler is compared on it at a real
/// model's vocabulary size.
fn tiny_with_vocab(vocab: usize) -> (tempfile::TempDir, Model) {
    let dir = tiny_copy(|config| config["vocab_size"] = vocab.into());
    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("fixture weights");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("fixture weights");
    let embed = tensors
        .tensor("model.embed_tokens.weight")
        .expect("tied embedding");
    let (rows, row_bytes) = (embed.shape()[0], embed.data().len() / embed.shape()[0]);
    let grown: Vec<u8> = (0..vocab)
        .flat_map(|i| {
            let row = &embed.data()[(i % rows) * row_bytes..][..row_bytes];
            let flip = u8::from(!(i / rows).is_multiple_of(2));
            row.iter().enumerate().map(move |(b, &byte)| {
                if b.is_multiple_of(2) {
                    byte ^ flip
                } else {
                    byte
                }
            })
        })
        .collect();
    let norm = tensors.tensor("model.norm.weight").expect("final norm");
    let sharper: Vec<u8> = norm
        .data()
        .chunks_exact(2)
        .flat_map(|b| {
            let value = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) * 4.0;
            ((value.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "model.embed_tokens.weight" && name != "model.norm.weight")
        .collect();
    views.push((
        "model.norm.weight".into(),
        safetensors::tensor::TensorView::new(norm.dtype(), norm.shape().to_vec(), &sharper)
            .expect("scaled norm"),
    ));
    views.push((
        "model.embed_tokens.weight".into(),
        safetensors::tensor::TensorView::new(embed.dtype(), vec![vocab, embed.shape()[1]], &grown)
            .expect("grown embedding"),
    ));
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors::serialize(views, None).expect("serialising the weights"),
    )
    .expect("weights");
    let model = Model::load(dir.path()).expect("loading the grown fixture");
    (dir, model)
}

/// The inferno-tiny fixture, once a GPU is known to be present.
fn tiny_on_gpu() -> Model {
    require_gpu();
    load("inferno-tiny")
}

fn engine_config() -> EngineConfig {
    EngineConfig {
        gpu_memory_fraction: 0.02,
        max_batched_tokens: 2048,
        max_num_seqs: Some(16),
        ..EngineConfig::default()
    }
}

/// A CUDA backend for `model`. Every backend built here takes the small-M product kernel
/// wherever it fits instead of timing it against cuBLASLt, so backends compared with each other
/// run the same kernels (a timed choice can differ between two start-ups).
fn cuda_backend(model: &Model, config: &EngineConfig, options: CudaOptions) -> CudaBackend {
    let options = CudaOptions {
        measure_products: false,
        ..options
    };
    CudaBackend::new(model, config, options).unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

fn cuda(model: &Model, sample_on_device: bool) -> CudaBackend {
    let options = CudaOptions {
        sample_on_device,
        ..CudaOptions::default()
    };
    cuda_backend(model, &engine_config(), options)
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
        Self {
            tokens,
            table: blocks.take(capacity.div_ceil(16)),
        }
    }
}

fn spec(logprobs: Option<u32>) -> SampleSpec<'static> {
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

fn logits(out: StepOutput) -> Vec<Vec<f32>> {
    match out {
        StepOutput::Logits(l) => l,
        StepOutput::Sampled(_) => panic!("expected logits"),
    }
}

/// Runs `seq.tokens[start..end]` as one row that asks for the next token; returns its logits.
fn run_chunk(backend: &mut dyn Backend, seq: &Seq, start: usize, end: usize) -> Vec<f32> {
    let row = BatchRow {
        seq_id: 1,
        tokens: &seq.tokens[start..end],
        start_pos: start,
        block_table: &seq.table,
        sample: Some(spec(None)),
    };
    logits(backend.step(&[row]).expect("step")).remove(0)
}

fn argmax(v: &[f32]) -> (usize, f32) {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .map(|(_, &x)| x)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, v[best] - second)
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_f64())
                .map(|v| v as f32)
                .collect()
        })
        .unwrap_or_default()
}

/// Logits at every position of `tokens`, feeding one token per step (teacher forcing).
fn per_position(backend: &mut dyn Backend, seq: &Seq) -> Vec<Vec<f32>> {
    (0..seq.tokens.len())
        .map(|pos| run_chunk(backend, seq, pos, pos + 1))
        .collect()
}

/// Free-running greedy generation with sampling on the device.
fn greedy(
    backend: &mut dyn Backend,
    prompt: &[u32],
    steps: usize,
    blocks: &mut Blocks,
) -> Vec<u32> {
    let mut seq = Seq::new(prompt.to_vec(), blocks, prompt.len() + steps);
    let mut start = 0;
    let mut out = Vec::new();
    for _ in 0..steps {
        let end = seq.tokens.len();
        let row = BatchRow {
            seq_id: 7,
            tokens: &seq.tokens[start..end],
            start_pos: start,
            block_table: &seq.table,
            sample: Some(spec(None)),
        };
        let StepOutput::Sampled(tokens) = backend.step(&[row]).expect("step") else {
            panic!("expected sampled tokens")
        };
        start = end;
        seq.tokens.push(tokens[0].token);
        out.push(tokens[0].token);
    }
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn teacher_forced_logits_match_the_references_and_the_cpu_backend() {
    require_gpu();
    for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"] {
        let model = load(name);
        let golden: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixtures().join(name).join("golden.json")).expect("golden.json"),
        )
        .expect("golden.json parses");
        let mut gpu = cuda(&model, false);
        let mut sampler = cuda(&model, true);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (mut worst_cpu, mut worst_ref, mut worst_prefill) = (0.0f32, 0.0f32, 0.0f32);
        let (mut argmax_checks, mut greedy_checked) = (0, 0);
        let mut mismatches = Vec::new();
        for (c, case) in golden["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let forced = &case["teacher_forced"];
            let tokens = ids(&forced["tokens"]);
            let margins = floats(&forced["margins"]);
            let mut blocks = Blocks { next: 0 };
            let seq = Seq::new(tokens.clone(), &mut blocks, tokens.len());
            let g = per_position(&mut gpu, &seq);
            let r = per_position(&mut cpu, &seq);
            for (pos, ((gl, cl), margin)) in g.iter().zip(&r).zip(&margins).enumerate() {
                worst_cpu = worst_cpu.max(max_abs_diff(gl, cl));
                let top_ids = ids(&forced["top5_ids"][pos]);
                for (id, value) in top_ids.iter().zip(floats(&forced["top5_values"][pos])) {
                    worst_ref = worst_ref.max((gl[*id as usize] - value).abs());
                }
                if *margin > MARGIN {
                    let got = argmax(gl).0;
                    if got as u32 != top_ids[0] {
                        let want = top_ids[0] as usize;
                        mismatches.push(format!(
                            "{name} case {c} position {pos}: argmax {got} (cuda {:.4} / cpu {:.4}), reference {want} (cuda {:.4} / cpu {:.4}), reference margin {margin:.4}",
                            gl[got], cl[got], gl[want], cl[want]
                        ));
                    }
                    argmax_checks += 1;
                }
            }
            // The prompt as one prefill chunk gives the same last logits as token-by-token steps.
            let prompt = ids(&case["input_ids"]);
            let fresh = Seq::new(prompt.clone(), &mut blocks, prompt.len());
            let prefill = run_chunk(&mut gpu, &fresh, 0, prompt.len());
            worst_prefill = worst_prefill.max(max_abs_diff(&prefill, &g[prompt.len() - 1]));
            // Free-running greedy output agrees up to the first near-tie.
            let reference = ids(&case["greedy_24"]);
            let greedy_margins = floats(&case["greedy_margins"]);
            let produced = greedy(&mut sampler, &prompt, reference.len(), &mut blocks);
            for (step, ((want, got), margin)) in reference
                .iter()
                .zip(&produced)
                .zip(&greedy_margins)
                .enumerate()
            {
                if *margin < MARGIN {
                    break;
                }
                if got != want {
                    mismatches.push(format!(
                        "{name} case {c}: free-running greedy step {step} produced {got}, reference {want} (margin {margin:.4})"
                    ));
                    break;
                }
                greedy_checked += 1;
            }
        }
        println!(
            "RESULT {name}: max|cuda-cpu| = {worst_cpu:.4}, max|cuda-reference top5| = {worst_ref:.4}, max|prefill-stepwise| = {worst_prefill:.4}, {argmax_checks} argmax checks, {greedy_checked} greedy steps checked"
        );
        for m in &mismatches {
            println!("RESULT MISMATCH {m}");
        }
        assert!(
            mismatches.is_empty(),
            "{name}: {} of {argmax_checks} positions disagree with the reference",
            mismatches.len()
        );
        assert!(
            worst_cpu <= TOL_CPU,
            "{name}: logits differ from the CPU backend by {worst_cpu}"
        );
        assert!(
            worst_ref <= TOL_REF,
            "{name}: logits differ from the reference by {worst_ref}"
        );
        assert!(
            worst_prefill <= TOL_CPU,
            "{name}: prefill differs from stepwise by {worst_prefill}"
        );
        assert!(
            argmax_checks > 0,
            "{name}: no position had a margin above {MARGIN}"
        );
    }
}

/// inferno-tiny in a temporary copy whose shard header carries padding metadata, so the tensors
/// start 600 KiB before the first 16 MiB block boundary and the weights straddle it.
fn tiny_across_read_blocks() -> tempfile::TempDir {
    let dir = tiny_copy(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).expect("shard");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value =
        serde_json::from_slice(&bytes[8..8 + header_len]).expect("shard header");
    let target = (16 << 20) - (600 << 10);
    header["__metadata__"] = serde_json::json!({ "pad": "" });
    let bare = serde_json::to_vec(&header).unwrap().len();
    header["__metadata__"]["pad"] = "p".repeat(target - 8 - bare).into();
    let json = serde_json::to_vec(&header).unwrap();
    assert_eq!(8 + json.len(), target);
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(&path, out).expect("padded shard");
    dir
}

/// `inferno serve`'s start-up path: the backend prepared from the configuration before the
/// weights are read, the weights copied into it as the model is read, gives exactly the staged
/// upload's logits, whether every block was copied as it arrived, none was (the backend prepared
/// after the read), one waited for its shard's header and the weights' places and was copied
/// after them, or the backend was prepared for another configuration (then it is built again).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn weights_copied_while_the_model_is_read_give_the_staged_uploads_logits() {
    use inferno::model::BlockSink;
    let reference_model = tiny_on_gpu();
    let mut reference = cuda(&reference_model, false);
    let seq = Seq::new(prompt(21, 7), &mut Blocks { next: 0 }, 32);
    let expected = run_chunk(&mut reference, &seq, 0, seq.tokens.len());
    let dir = tiny_across_read_blocks();
    let block = inferno::model::files::READ_BLOCK;
    let hidden = indicatif::ProgressBar::hidden();
    let options = CudaOptions {
        measure_products: false,
        sample_on_device: false,
        ..CudaOptions::default()
    };
    let config = &reference_model.config;
    let mut other = config.clone();
    other.intermediate_size *= 2;
    for case in [
        "prepared, then read",
        "read, then prepared",
        "block 1 before the places, then block 0",
        "prepared for another configuration",
    ] {
        let early = std::sync::Arc::new(EarlyUpload::new());
        let mut opened = OpenedDevice::open(0).expect("opening the GPU");
        let files = match case {
            "prepared, then read" => {
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap()
            }
            "read, then prepared" => {
                let files = ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap();
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                files
            }
            "block 1 before the places, then block 0" => {
                let files = ModelFiles::read_dir(dir.path()).unwrap();
                let names: Vec<&str> = files.names().collect();
                let lens: Vec<(&str, usize)> = names
                    .iter()
                    .map(|n| (*n, files.get(n).unwrap().as_slice().len()))
                    .collect();
                early.begin(&lens);
                let index = names
                    .iter()
                    .position(|n| *n == "model.safetensors")
                    .unwrap();
                let shard = files.get("model.safetensors").unwrap().as_slice();
                early.block(index, block, &shard[block..]);
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                early.block(index, 0, &shard[..block]);
                files
            }
            _ => {
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(&other, &engine_config(), options)
                    .unwrap();
                ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap()
            }
        };
        let model = Model::from_files(&files, "inferno-tiny".into()).unwrap();
        let mut backend =
            CudaBackend::on_device(opened, model.tensors(), &engine_config(), options, &hidden)
                .unwrap_or_else(|e| panic!("CUDA backend ({case}): {e}"));
        let stats = early.stats();
        println!("RESULT early upload, {case}: {stats:?}");
        let shard = files.get("model.safetensors").unwrap().as_slice();
        let data = shard.len() - 8 - u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
        match case {
            "prepared, then read" => {
                // Blocks read before their shard's header waited, then were copied.
                assert_eq!(stats.bytes, data, "every weight byte was copied early");
                assert!(stats.deferred_bytes <= data, "{stats:?}");
                assert_eq!(stats.whole_tensors, model.weights.names().count());
            }
            "read, then prepared" => assert_eq!((stats.bytes, stats.whole_tensors), (0, 0)),
            "block 1 before the places, then block 0" => {
                assert_eq!(stats.bytes, data, "{stats:?}");
                assert_eq!(stats.deferred_bytes, shard.len() - block, "{stats:?}");
            }
            _ => assert!(stats.bytes > 0 && stats.bytes < data, "{stats:?}"),
        }
        let got = run_chunk(&mut backend, &seq, 0, seq.tokens.len());
        assert_eq!(max_abs_diff(&got, &expected), 0.0, "{case}");
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + salt * 104_729) % 900 + 50)
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn mixed_batches_chunked_prefill_and_prefix_hits_match_single_runs() {
    let model = tiny_on_gpu();
    let mut gpu = cuda(&model, false);
    let mut blocks = Blocks { next: 0 };
    let seqs: Vec<Seq> = [5usize, 17, 33, 40]
        .iter()
        .enumerate()
        .map(|(i, &n)| Seq::new(prompt(n, i as u32), &mut blocks, n + 8))
        .collect();
    let alone: Vec<Vec<f32>> = seqs
        .iter()
        .map(|s| run_chunk(&mut gpu, s, 0, s.tokens.len()))
        .collect();

    // All four prompts in one step.
    let rows = prompt_rows(&seqs, 0, Some(spec(None)));
    let batched = logits(gpu.step(&rows).expect("mixed step"));
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let diff = max_abs_diff(b, a);
        println!("RESULT mixed batch row {i}: max diff {diff:.5}");
        assert!(diff <= 0.02, "row {i}: batched logits differ by {diff}");
    }

    // Chunked prefill of the 40-token prompt: 16 + 7 + 17 tokens.
    let s = &seqs[3];
    for (start, end) in [(0, 16), (16, 23)] {
        let row = BatchRow {
            seq_id: 9,
            tokens: &s.tokens[start..end],
            start_pos: start,
            block_table: &s.table,
            sample: None,
        };
        gpu.step(&[row]).expect("chunk");
    }
    let chunked = run_chunk(&mut gpu, s, 23, 40);
    let diff = max_abs_diff(&chunked, &alone[3]);
    println!("RESULT chunked prefill: max diff {diff:.5}");
    assert!(
        diff <= PREFILL_TOLERANCE,
        "chunked prefill differs by {diff}"
    );

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
    assert!(diff <= PREFILL_TOLERANCE, "prefix hit differs by {diff}");

    // A decode row and a prefill row in one step.
    let a = &seqs[0];
    let mut a_tokens = a.tokens.clone();
    a_tokens.push(42);
    let a2 = Seq {
        tokens: a_tokens,
        table: a.table.clone(),
    };
    let decode_alone = run_chunk(&mut gpu, &a2, 5, 6);
    let b = &seqs[1];
    let rows = [
        BatchRow {
            seq_id: 1,
            tokens: &a2.tokens[5..6],
            start_pos: 5,
            block_table: &a2.table,
            sample: Some(spec(None)),
        },
        BatchRow {
            seq_id: 2,
            tokens: &b.tokens,
            start_pos: 0,
            block_table: &b.table,
            sample: Some(spec(None)),
        },
    ];
    let mixed = logits(gpu.step(&rows).expect("decode + prefill"));
    let diff = max_abs_diff(&mixed[0], &decode_alone).max(max_abs_diff(&mixed[1], &alone[1]));
    println!("RESULT decode+prefill step: max diff {diff:.5}");
    assert!(
        diff <= PREFILL_TOLERANCE,
        "decode + prefill step differs by {diff}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampling_matches_host_logits_with_one_copy_each_way() {
    let model = tiny_on_gpu();
    let mut host = cuda(&model, false);
    let mut device = cuda(&model, true);
    let mut blocks = Blocks { next: 0 };
    let seq = Seq::new(prompt(20, 3), &mut blocks, 40);
    let reference = run_chunk(&mut host, &seq, 0, 20);
    let row = BatchRow {
        seq_id: 1,
        tokens: &seq.tokens,
        start_pos: 0,
        block_table: &seq.table,
        sample: Some(spec(Some(5))),
    };
    let before = device.copy_stats();
    let out = device.step(&[row]).expect("step");
    let copies = device.copy_stats().since(&before);
    assert_eq!(
        (copies.steps, copies.h2d, copies.d2h),
        (1, 1, 1),
        "{copies:?}"
    );
    let StepOutput::Sampled(tokens) = out else {
        panic!("expected sampled tokens")
    };
    let (want, _) = argmax(&reference);
    assert_eq!(tokens[0].token as usize, want);
    let max = reference.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + reference.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let lp = tokens[0].logprob.as_ref().expect("logprobs");
    assert!(
        (lp.logprob - (reference[want] - lse)).abs() < 1e-3,
        "{} vs {}",
        lp.logprob,
        reference[want] - lse
    );
    assert_eq!(lp.top.len(), 5);
    assert_eq!(lp.top[0].0 as usize, want);
    for pair in lp.top.windows(2) {
        assert!(
            pair[0].1 >= pair[1].1,
            "alternatives out of order: {:?}",
            lp.top
        );
    }
    // The engine's reference sampler, fed the same logits, picks the same token and the same
    // alternatives (same order) with the same logprobs.
    let host = inferno::engine::sampling::sample(reference.clone(), &spec(Some(5)));
    let host_lp = host.logprob.as_ref().expect("reference logprobs");
    assert_eq!(host.token, tokens[0].token);
    assert!((host_lp.logprob - lp.logprob).abs() < 1e-4);
    let ids = |top: &[(u32, f32)]| top.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    assert_eq!(ids(&host_lp.top), ids(&lp.top));
    for ((_, a), (_, b)) in host_lp.top.iter().zip(&lp.top) {
        assert!((a - b).abs() < 1e-4, "{:?} vs {:?}", host_lp.top, lp.top);
    }

    // Decode steps: exactly one copy each way per step.
    let mut tokens = seq.tokens.clone();
    tokens.push(tokens[0]);
    let seq = Seq {
        tokens,
        table: seq.table,
    };
    let before = device.copy_stats();
    for _ in 0..4 {
        let row = BatchRow {
            seq_id: 1,
            tokens: &seq.tokens[20..21],
            start_pos: 20,
            block_table: &seq.table,
            sample: Some(spec(None)),
        };
        device.step(&[row]).expect("decode");
    }
    let copies = device.copy_stats().since(&before);
    println!("RESULT copies over 4 decode steps: {copies:?}");
    assert_eq!((copies.steps, copies.h2d, copies.d2h), (4, 4, 4));
}

/// Log-probability difference within which two greedy runs count as numerically equal: the
/// CUDA backend is not batch-invariant bit for bit (a decode row's products and attention round
/// differently in a mixed step than alone, up to ~0.03 in a logit), so a near-tie can flip.
const NEAR_TIE: f32 = 0.1;

/// Checks that `other` is `reference` up to numerics: the same tokens with chosen-token
/// log-probabilities within `NEAR_TIE` of each other until the first token that differs, and
/// that token only at a near-tie: in each run, the other run's pick is among the top
/// candidates within `NEAR_TIE` of its own pick. Returns whether the runs were identical.
fn same_up_to_a_near_tie(name: &str, reference: &Generated, other: &Generated) -> bool {
    assert_eq!(
        reference.tokens.len(),
        other.tokens.len(),
        "{name}: lengths"
    );
    for (i, (r, o)) in reference.logprobs.iter().zip(&other.logprobs).enumerate() {
        let (rt, ot) = (reference.tokens[i], other.tokens[i]);
        if rt == ot {
            assert!(
                (r.logprob - o.logprob).abs() <= NEAR_TIE,
                "{name}: token {i} ({rt}) has log-probability {} here and {} alone",
                o.logprob,
                r.logprob
            );
            continue;
        }
        // The gap between a run's pick and the other run's pick, when the latter is listed.
        let gap = |lp: &inferno::engine::TokenLogprob, rival: u32| {
            lp.top
                .iter()
                .find(|(token, _)| *token == rival)
                .map(|(_, logprob)| lp.logprob - logprob)
        };
        let (gap_alone, gap_here) = (gap(r, ot), gap(o, rt));
        assert!(
            gap_alone.is_some_and(|g| g <= NEAR_TIE) && gap_here.is_some_and(|g| g <= NEAR_TIE),
            "{name}: token {i} differs ({ot} here, {rt} alone) without a near-tie: top {:?} here, {:?} alone",
            o.top,
            r.top
        );
        println!(
            "RESULT {name}: first difference at token {i}, a near-tie (gap {:.4} alone, {:.4} here)",
            gap_alone.unwrap_or_default(),
            gap_here.unwrap_or_default()
        );
        return false;
    }
    true
}

/// The engine on the CUDA backend with a KV cache too small for all requests at once: the
/// scheduler must preempt and recompute, and every request still produces the tokens it
/// produces alone, up to numerics: log-probabilities within `NEAR_TIE`, and a different token
/// only at a near-tie (each run's pick within `NEAR_TIE` of the other's, see
/// `same_up_to_a_near_tie`). Re-sending a prompt hits the prefix cache.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn engine_on_cuda_preempts_and_hits_the_prefix_cache_without_changing_outputs() {
    use inferno::engine::{Engine, ModelInfo};
    let model = tiny_on_gpu();
    let info = || ModelInfo {
        max_context: 512,
        ..ModelInfo::of(&model)
    };
    // 20 blocks of 16 tokens: room for four of the six requests below (5 blocks each) at once.
    // The cache is a fraction of free memory, which differs between GPUs (80 GB on an H100,
    // 141 GB on an H200), so the fraction comes from the blocks a probe backend got.
    let fraction_of = |gpu_memory_fraction: f64| EngineConfig {
        gpu_memory_fraction,
        max_num_seqs: Some(8),
        max_batched_tokens: 256,
        ..EngineConfig::default()
    };
    let probe_fraction = 1e-5;
    let probe = cuda_backend(&model, &fraction_of(probe_fraction), CudaOptions::default());
    let probe_blocks = inferno::engine::Backend::kv_cache(&probe).num_blocks;
    drop(probe);
    let tiny = fraction_of(probe_fraction * 20.5 / probe_blocks as f64);
    // The small-M kernel wherever it fits, not a timed choice per M: a request batched with
    // others runs its rows' products at other M than alone, and a timed choice may take
    // cuBLASLt for one M and the small-M kernel for another, whose sums round differently
    // (enough to move a seeded draw).
    let backend = cuda_backend(&model, &tiny, CudaOptions::default());
    let blocks = inferno::engine::Backend::kv_cache(&backend).num_blocks;
    println!("RESULT preemption test cache: {blocks} blocks");
    assert!(
        (18..=22).contains(&blocks),
        "the cache should hold about 20 blocks, got {blocks}"
    );
    let engine = Engine::spawn(Box::new(backend), info(), tiny).expect("engine");
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(40, 100 + i)).collect();
    let alone: Vec<Generated> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| run_request(&engine, &format!("alone-{i}"), p.clone(), 32))
        .collect();
    let together: Vec<Generated> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let engine = &engine;
                scope.spawn(move || run_request(engine, &format!("together-{i}"), p.clone(), 32))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    let stats = engine.stats();
    println!("RESULT engine stats after the concurrent run: {stats:?}");
    let same = together
        .iter()
        .zip(&alone)
        .enumerate()
        .filter(|(i, (t, a))| same_up_to_a_near_tie(&format!("request {i}"), a, t))
        .count();
    let cached: usize = together.iter().map(|t| t.cached_tokens).sum();
    println!(
        "RESULT preemption: {same}/6 outputs identical to solo runs (the rest differ only after a near-tie), {cached} prompt tokens from the prefix cache"
    );
    assert!(
        stats.preemptions > 0,
        "the cache of {blocks} blocks never forced a preemption"
    );
    assert!(cached > 0, "re-sent prompts did not hit the prefix cache");
    engine.shutdown();
}

fn cuda_with(model: &Model, cuda_graphs: bool, sample_on_device: bool) -> CudaBackend {
    cuda_launching(model, cuda_graphs, sample_on_device, true)
}

fn cuda_launching(
    model: &Model,
    cuda_graphs: bool,
    sample_on_device: bool,
    programmatic_launch: bool,
) -> CudaBackend {
    let config = EngineConfig {
        cuda_graphs,
        programmatic_launch,
        ..engine_config()
    };
    let options = CudaOptions {
        sample_on_device,
        ..CudaOptions::default()
    };
    cuda_backend(model, &config, options)
}

/// Decode steps replayed from the captured graphs (batch sizes that fill a bucket and padded
/// ones) give the logits of eager steps and the same greedy tokens, with one copy each way; and
/// kernels launched with programmatic dependent launch compute exactly what plain stream-ordered
/// launches compute.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn decode_graphs_replay_what_eager_steps_compute() {
    let model = tiny_on_gpu();
    let mut eager = cuda_launching(&model, false, false, false);
    let mut graphed = cuda_with(&model, true, false);
    let mut plain = cuda_launching(&model, true, false, false);
    let mut sampled = cuda_with(&model, true, true);
    assert!(eager.graph_buckets().is_empty());
    assert_eq!(graphed.graph_buckets(), &[1, 2, 4, 8, 16]);

    let sizes = [1usize, 3, 4, 5, 13, 16];
    let mut blocks = Blocks { next: 0 };
    let mut seqs: Vec<Seq> = (0..16)
        .map(|i| {
            let n = 3 + 5 * i;
            Seq::new(prompt(n, i as u32 + 200), &mut blocks, n + sizes.len())
        })
        .collect();
    let prefill = prompt_rows(&seqs, 0, None);
    for backend in [&mut eager, &mut graphed, &mut plain, &mut sampled] {
        backend.step(&prefill).expect("prefill");
    }
    assert_eq!(
        graphed.graph_replays(),
        0,
        "a prefill step replayed a graph"
    );

    for (step, &size) in sizes.iter().enumerate() {
        for (i, s) in seqs.iter_mut().take(size).enumerate() {
            s.tokens.push(((step * 31 + i * 7) % 900 + 50) as u32);
        }
        let rows = last_token_rows(&seqs[..size]);
        let want = logits(eager.step(&rows).expect("eager decode"));
        let (replays, copies) = (graphed.graph_replays(), graphed.copy_stats());
        let got = logits(graphed.step(&rows).expect("graph decode"));
        let copies = graphed.copy_stats().since(&copies);
        let stream_ordered = logits(plain.step(&rows).expect("plain graph decode"));
        assert!(
            got == stream_ordered,
            "{size} rows: programmatic launches changed the logits"
        );
        assert_eq!(
            graphed.graph_replays(),
            replays + 1,
            "{size} rows ran eagerly"
        );
        assert_eq!(
            (copies.steps, copies.h2d, copies.d2h),
            (1, 1, 1),
            "{copies:?}"
        );
        let StepOutput::Sampled(tokens) = sampled.step(&rows).expect("sampled decode") else {
            panic!("expected sampled tokens");
        };
        assert_eq!((want.len(), got.len(), tokens.len()), (size, size, size));
        let mut worst = 0.0f32;
        for (r, ((w, g), t)) in want.iter().zip(&got).zip(&tokens).enumerate() {
            worst = worst.max(max_abs_diff(w, g));
            let (eager_best, margin) = argmax(w);
            let (graph_best, _) = argmax(g);
            // The sampling backend replays the same graph, so its token is the argmax exactly.
            assert_eq!(t.token as usize, graph_best, "{size} rows, row {r}");
            if margin > MARGIN {
                assert_eq!(graph_best, eager_best, "{size} rows, row {r}");
            }
        }
        println!("RESULT decode graph, {size} rows: max |graph - eager| logit {worst:.5}");
        assert!(worst <= 0.02, "{size} rows: graph logits differ by {worst}");
    }
    assert_eq!(eager.graph_replays(), 0);
    assert_eq!(sampled.graph_replays(), sizes.len() as u64);
}

/// Steps that carry prompt tokens, padded to a token-count bucket and replayed from segment
/// graphs between eagerly launched attention, give the logits of the same steps run wholly
/// eagerly, with one copy each way: prompts alone, and decode rows beside a prefill chunk, at a
/// bucket's exact size and padded.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn mixed_step_graphs_replay_what_eager_steps_compute() {
    let model = tiny_on_gpu();
    let config = |cuda_mixed_graphs| EngineConfig {
        cuda_mixed_graphs,
        ..engine_config()
    };
    let options = CudaOptions {
        sample_on_device: false,
        ..CudaOptions::default()
    };
    let mut eager = cuda_backend(&model, &config(false), options);
    let mut graphed = cuda_backend(&model, &config(true), options);
    assert!(eager.mixed_graph_buckets().is_empty());
    assert_eq!(graphed.mixed_graph_buckets().first(), Some(&16));
    assert_eq!(graphed.mixed_graph_buckets().last(), Some(&512));
    assert_eq!(graphed.step_sizes(), graphed.mixed_graph_buckets());

    // Four prompts of 10 to 19 tokens in one step (58 tokens, padded to 64); then the four
    // decode beside chunks of a fifth, 600-token prompt: 4 + 12 = 16 tokens (exact), 104
    // (padded to 112), 256 (exact), 236 (padded to 256), and its last 4 tokens, sampled (8,
    // padded to 16).
    let mut blocks = Blocks { next: 0 };
    let mut seqs: Vec<Seq> = (0..4)
        .map(|i| {
            let n = 10 + 3 * i;
            Seq::new(prompt(n, 300 + i as u32), &mut blocks, n + 8)
        })
        .collect();
    let long = Seq::new(prompt(600, 399), &mut blocks, 600);
    let first = prompt_rows(&seqs, 0, Some(spec(None)));
    compare_mixed_step(&mut eager, &mut graphed, &first, "four prompts");
    for (step, (start, end)) in [(0, 12), (12, 112), (112, 364), (364, 596), (596, 600)]
        .into_iter()
        .enumerate()
    {
        for (i, s) in seqs.iter_mut().enumerate() {
            s.tokens.push(((step * 37 + i * 11) % 900 + 50) as u32);
        }
        let mut rows = last_token_rows(&seqs);
        rows.push(BatchRow {
            seq_id: 9,
            tokens: &long.tokens[start..end],
            start_pos: start,
            block_table: &long.table,
            sample: (end == long.tokens.len()).then(|| spec(None)),
        });
        let what = format!("4 decodes + prompt tokens {start}..{end}");
        compare_mixed_step(&mut eager, &mut graphed, &rows, &what);
    }
    assert_eq!(eager.mixed_graph_replays(), 0);
    assert_eq!(
        graphed.graph_replays(),
        0,
        "a step with prompt tokens replayed a decode graph"
    );
}

/// One decode row per sequence: its last token, sampled greedily.
fn last_token_rows(seqs: &[Seq]) -> Vec<BatchRow<'_>> {
    seqs.iter()
        .enumerate()
        .map(|(i, s)| BatchRow {
            seq_id: i as u64,
            tokens: &s.tokens[s.tokens.len() - 1..],
            start_pos: s.tokens.len() - 1,
            block_table: &s.table,
            sample: Some(spec(None)),
        })
        .collect()
}

/// Runs `rows` on both backends and checks that `graphed` replayed its mixed-step graphs with one
/// copy each way and computed the eager backend's logits.
fn compare_mixed_step(
    eager: &mut CudaBackend,
    graphed: &mut CudaBackend,
    rows: &[BatchRow<'_>],
    what: &str,
) {
    let want = logits(eager.step(rows).expect("eager step"));
    let (replays, copies) = (graphed.mixed_graph_replays(), graphed.copy_stats());
    let got = logits(graphed.step(rows).expect("graphed step"));
    let copies = graphed.copy_stats().since(&copies);
    assert_eq!(
        graphed.mixed_graph_replays(),
        replays + 1,
        "{what} ran eagerly"
    );
    assert_eq!(
        (copies.steps, copies.h2d, copies.d2h),
        (1, 1, 1),
        "{what}: {copies:?}"
    );
    assert_eq!(want.len(), got.len(), "{what}: sampled rows");
    let mut worst = 0.0f32;
    for (r, (w, g)) in want.iter().zip(&got).enumerate() {
        worst = worst.max(max_abs_diff(w, g));
        let (eager_best, margin) = argmax(w);
        if margin > MARGIN {
            assert_eq!(argmax(g).0, eager_best, "{what}, row {r}");
        }
    }
    println!("RESULT mixed-step graphs, {what}: max |graph - eager| logit {worst:.5}");
    assert!(
        worst <= PREFILL_TOLERANCE,
        "{what}: graph logits differ by {worst}"
    );
}

/// One row per sequence with its whole prompt but the last `hold_back` tokens, from position 0,
/// sampled as `sample` says.
fn prompt_rows<'a>(
    seqs: &'a [Seq],
    hold_back: usize,
    sample: Option<SampleSpec<'a>>,
) -> Vec<BatchRow<'a>> {
    seqs.iter()
        .enumerate()
        .map(|(i, s)| BatchRow {
            seq_id: i as u64,
            tokens: &s.tokens[..s.tokens.len() - hold_back],
            start_pos: 0,
            block_table: &s.table,
            sample,
        })
        .collect()
}

/// One decode row per sequence (its token 23), sampled as `specs` say.
fn decode_rows<'a>(seqs: &'a [Seq], specs: &[SampleSpec<'a>]) -> Vec<BatchRow<'a>> {
    seqs.iter()
        .zip(specs)
        .enumerate()
        .map(|(i, (s, spec))| BatchRow {
            seq_id: i as u64,
            tokens: &s.tokens[23..24],
            start_pos: 23,
            block_table: &s.table,
            sample: Some(*spec),
        })
        .collect()
}

/// A host-sampling and a device-sampling backend that have both prefilled the same 16 sequences
/// (all but the last of their 24 tokens, prompts salted from `salt`), ready for decode steps.
fn prefilled_host_and_device(model: &Model, salt: u32) -> (CudaBackend, CudaBackend, Vec<Seq>) {
    let mut host = cuda(model, false);
    let mut device = cuda(model, true);
    let mut blocks = Blocks { next: 0 };
    let seqs: Vec<Seq> = (0..16)
        .map(|i| Seq::new(prompt(24, salt + i), &mut blocks, 24))
        .collect();
    {
        let prefill = prompt_rows(&seqs, 1, None);
        host.step(&prefill).expect("prefill");
        device.step(&prefill).expect("prefill");
    }
    (host, device, seqs)
}

/// The device sampler against the engine's reference sampler (`engine::sampling`) on the same
/// logits, in every mode: the same token for every greedy draw (penalties included) and for at
/// least 99% of seeded draws, with one copy each way per step.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_agrees_with_the_reference_sampler_in_every_mode() {
    sampler_agrees_in_every_mode(&tiny_on_gpu(), 40);
}

/// The same at Llama 3's vocabulary of 128,256 ids (inferno-tiny's 1,024 fit in one pass of the
/// sampler's block; here every pass over a row keeps several loads in flight per thread and the
/// ranked-prefix search narrows 30 bits over a row of exact and near ties).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_agrees_with_the_reference_sampler_at_a_full_vocabulary() {
    require_gpu();
    let (_dir, model) = tiny_with_vocab(128_256);
    sampler_agrees_in_every_mode(&model, 10);
}

/// The device sampler against the reference sampler on `model`: every greedy draw equal, and at
/// least 99% of `seeded_steps` steps of 16 seeded draws in each sampling mode.
fn sampler_agrees_in_every_mode(model: &Model, seeded_steps: u64) {
    use inferno::engine::sampling;
    // Both backends run the same kernels on the same batches, so their logits are identical.
    let (mut host, mut device, seqs) = prefilled_host_and_device(model, 300);

    // The tokens each row would pick greedily, generated twice so far: the penalties must move
    // some rows away from them.
    let plain: Vec<SampleSpec<'_>> = (0..16).map(|_| spec(None)).collect();
    let first = logits(host.step(&decode_rows(&seqs, &plain)).expect("decode"));
    let outputs: Vec<Vec<u32>> = first
        .iter()
        .map(|l| {
            let best = argmax(l).0 as u32;
            vec![best, 7, best]
        })
        .collect();

    let base = SamplingParams::default();
    let modes: Vec<(&str, SamplingParams, bool)> = vec![
        ("greedy", base.clone(), true),
        (
            "top_k=1 at T=1",
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                ..base.clone()
            },
            true,
        ),
        (
            "greedy + penalties",
            SamplingParams {
                repetition_penalty: 1.5,
                frequency_penalty: 0.7,
                presence_penalty: 0.4,
                ..base.clone()
            },
            true,
        ),
        (
            "T=1",
            SamplingParams {
                temperature: 1.0,
                ..base.clone()
            },
            false,
        ),
        (
            "T=0.7 top_k=50",
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                ..base.clone()
            },
            false,
        ),
        (
            "T=1 top_p=0.9",
            SamplingParams {
                temperature: 1.0,
                top_p: 0.9,
                ..base.clone()
            },
            false,
        ),
        (
            "T=1 min_p=0.05",
            SamplingParams {
                temperature: 1.0,
                min_p: 0.05,
                ..base.clone()
            },
            false,
        ),
        (
            "T=0.8 top_k=40 top_p=0.95 min_p=0.02 + penalties",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.02,
                repetition_penalty: 1.2,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                ..base.clone()
            },
            false,
        ),
    ];
    let mut penalties_moved = 0;
    for (name, params, exact) in &modes {
        let (mut same, mut total) = (0usize, 0usize);
        let steps = if *exact { 2 } else { seeded_steps };
        for step in 0..steps {
            let specs: Vec<SampleSpec<'_>> = (0..16)
                .map(|r| SampleSpec {
                    params,
                    seed: 1000 + r as u64,
                    draw_index: step,
                    prompt: &seqs[r].tokens,
                    output: &outputs[r],
                    logprobs: (r % 4 == 0).then_some(3),
                    mask: None,
                })
                .collect();
            let rows = decode_rows(&seqs, &specs);
            let want = logits(host.step(&rows).expect("host decode"));
            let before = device.copy_stats();
            let StepOutput::Sampled(got) = device.step(&rows).expect("device decode") else {
                panic!("expected sampled tokens");
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!((copies.h2d, copies.d2h), (1, 1), "{name}: {copies:?}");
            for (r, (l, g)) in want.iter().zip(&got).enumerate() {
                let reference = sampling::sample(l.clone(), &specs[r]);
                total += 1;
                if reference.token == g.token {
                    same += 1;
                    if let (Some(a), Some(b)) = (&reference.logprob, &g.logprob) {
                        assert!(
                            (a.logprob - b.logprob).abs() < 1e-3,
                            "{name}: logprob {} vs {}",
                            a.logprob,
                            b.logprob
                        );
                    }
                }
                if *exact {
                    assert_eq!(reference.token, g.token, "{name}, row {r}, step {step}");
                }
                if params.has_penalties() && params.temperature == 0.0 {
                    let unpenalised = sampling::sample(l.clone(), &spec(None));
                    penalties_moved += usize::from(unpenalised.token != reference.token);
                }
            }
        }
        let share = same as f64 / total as f64;
        println!("RESULT device sampler, {name}: {same}/{total} draws equal the reference");
        assert!(share >= 0.99, "{name}: only {same}/{total} draws agree");
    }
    println!("RESULT penalties changed {penalties_moved} greedy tokens");
    assert!(penalties_moved > 0, "the penalties changed no greedy token");
}

/// A grammar-style mask over `vocab` tokens allowing those `allow` picks (bit `t % 32` of word
/// `t / 32` is token `t`).
fn mask_of(vocab: usize, allow: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut mask = vec![0u32; vocab.div_ceil(32)];
    for t in (0..vocab).filter(|&t| allow(t)) {
        mask[t / 32] |= 1 << (t % 32);
    }
    mask
}

/// Grammar masks and `logit_bias` applied by the device sampler against the reference sampler
/// on the same logits: the same token for every greedy row and at least 99% of seeded draws,
/// never a token outside the mask, the raw logprobs of the reference, and still one copy each
/// way per step (the masks and biases travel in the packed inputs). Masks given late
/// (`start_step` queues the forward pass, `finish_step` brings the masks) draw the same tokens,
/// with one more host-to-device copy.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_applies_masks_and_logit_bias_like_the_reference() {
    use inferno::constrain::is_allowed;
    use inferno::engine::sampling;
    let model = tiny_on_gpu();
    let vocab = model.config.vocab_size;
    let (mut host, mut device, seqs) = prefilled_host_and_device(&model, 500);
    let plain: Vec<SampleSpec<'_>> = (0..16).map(|_| spec(None)).collect();
    let first = logits(host.step(&decode_rows(&seqs, &plain)).expect("decode"));
    let best: Vec<usize> = first.iter().map(|l| argmax(l).0).collect();

    // Per row: a mask of about a third of the vocabulary without the row's greedy token, and a
    // mask of two tokens (one past the last full word when the vocabulary has a partial one).
    let wide: Vec<Vec<u32>> = (0..16)
        .map(|r| mask_of(vocab, |t| t != best[r] && (t * 7 + r) % 3 == 0))
        .collect();
    let narrow: Vec<Vec<u32>> = (0..16)
        .map(|r| mask_of(vocab, |t| t == (r * 37) % vocab || t == vocab - 1 - r))
        .collect();
    // Per row: +100 on one token (it must win), -100 on the greedy token, and a few mild ones.
    let forced: Vec<SamplingParams> = (0..16)
        .map(|r| SamplingParams {
            logit_bias: vec![(((r * 53 + 11) % vocab) as u32, 100.0)],
            ..SamplingParams::default()
        })
        .collect();
    let mut mild_bias: Vec<Vec<(u32, f32)>> = (0..16)
        .map(|r| {
            let mut bias = vec![(best[r] as u32, -100.0), ((r * 13 % vocab) as u32, 2.5)];
            bias.push((((r * 13 + 1) % vocab) as u32, -1.25));
            bias.sort_by_key(|b| b.0);
            bias.dedup_by_key(|b| b.0);
            bias
        })
        .collect();
    let greedy_mild: Vec<SamplingParams> = mild_bias
        .iter()
        .map(|bias| SamplingParams {
            logit_bias: bias.clone(),
            ..SamplingParams::default()
        })
        .collect();
    let seeded_mild: Vec<SamplingParams> = mild_bias
        .drain(..)
        .map(|bias| SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            logit_bias: bias,
            ..SamplingParams::default()
        })
        .collect();
    let greedy_params: Vec<SamplingParams> = (0..16).map(|_| SamplingParams::default()).collect();
    let seeded_params: Vec<SamplingParams> = (0..16)
        .map(|_| SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        })
        .collect();
    let none: Vec<Option<Vec<u32>>> = (0..16).map(|_| None).collect();
    let wide_masks: Vec<Option<Vec<u32>>> = wide.iter().cloned().map(Some).collect();
    let narrow_masks: Vec<Option<Vec<u32>>> = narrow.iter().cloned().map(Some).collect();
    // (name, per-row parameters, per-row masks, exact)
    type Mode<'a> = (&'a str, &'a [SamplingParams], &'a [Option<Vec<u32>>], bool);
    let modes: Vec<Mode<'_>> = vec![
        ("greedy + wide mask", &greedy_params, &wide_masks, true),
        (
            "greedy + two-token mask",
            &greedy_params,
            &narrow_masks,
            true,
        ),
        ("greedy + logit_bias +100", &forced, &none, true),
        ("greedy + mild logit_bias", &greedy_mild, &none, true),
        (
            "greedy + mild logit_bias + wide mask",
            &greedy_mild,
            &wide_masks,
            true,
        ),
        ("T=1 + wide mask", &seeded_params, &wide_masks, false),
        ("T=1 + two-token mask", &seeded_params, &narrow_masks, false),
        (
            "T=0.9 top_k top_p penalties + mild logit_bias",
            &seeded_mild,
            &none,
            false,
        ),
        (
            "T=0.9 top_k top_p penalties + mild logit_bias + wide mask",
            &seeded_mild,
            &wide_masks,
            false,
        ),
    ];
    let outputs: Vec<Vec<u32>> = best.iter().map(|&b| vec![b as u32, 7]).collect();
    let mut moved = 0;
    for (name, params, masks, exact) in &modes {
        let (mut same, mut total) = (0usize, 0usize);
        let steps = if *exact { 2 } else { 30 };
        for step in 0..steps {
            let specs: Vec<SampleSpec<'_>> = (0..16)
                .map(|r| SampleSpec {
                    params: &params[r],
                    seed: 2000 + r as u64,
                    draw_index: step,
                    prompt: &seqs[r].tokens,
                    output: &outputs[r],
                    logprobs: (r % 3 == 0).then_some(4),
                    mask: masks[r].as_deref(),
                })
                .collect();
            let rows = decode_rows(&seqs, &specs);
            let want = logits(host.step(&rows).expect("host decode"));
            let before = device.copy_stats();
            let StepOutput::Sampled(got) = device.step(&rows).expect("device decode") else {
                panic!(
                    "{name}: expected sampled tokens: masked and biased rows sample on the device"
                );
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!(
                (copies.steps, copies.h2d, copies.d2h),
                (1, 1, 1),
                "{name}: {copies:?}"
            );
            // The same step started before its masks were ready (the engine computes them, and
            // streams the previous tokens, while the forward pass runs): a device-sampling
            // backend starts every step; the same tokens and logprobs, one extra small
            // host-to-device copy for the late masks, none when no row has a mask.
            let late: Vec<bool> = specs.iter().map(|s| s.mask.is_some()).collect();
            let early: Vec<SampleSpec<'_>> = specs
                .iter()
                .map(|s| SampleSpec { mask: None, ..*s })
                .collect();
            let before = device.copy_stats();
            let started = device
                .start_step(&decode_rows(&seqs, &early), &late)
                .expect("start a step");
            assert!(started, "{name}: the step was not started");
            let StepOutput::Sampled(late_got) = device.finish_step(&rows).expect("finish a step")
            else {
                panic!("{name}: expected sampled tokens");
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!(
                (copies.steps, copies.h2d, copies.d2h),
                (1, 1 + u64::from(late.contains(&true)), 1),
                "{name}, late masks: {copies:?}"
            );
            assert_eq!(late_got, got, "{name}: late masks changed the draws");
            for (r, (l, g)) in want.iter().zip(&got).enumerate() {
                if let Some(mask) = specs[r].mask {
                    assert!(
                        is_allowed(mask, g.token),
                        "{name}: row {r} took {}",
                        g.token
                    );
                }
                let reference = sampling::sample(l.clone(), &specs[r]);
                moved += usize::from(*exact && reference.token as usize != best[r]);
                total += 1;
                if reference.token == g.token {
                    same += 1;
                }
                if *exact {
                    assert_eq!(reference.token, g.token, "{name}, row {r}, step {step}");
                }
                // Logprobs are those of the raw logits, whatever the mask and biases did.
                if let (Some(a), Some(b)) = (&reference.logprob, &g.logprob)
                    && reference.token == g.token
                {
                    assert!(
                        (a.logprob - b.logprob).abs() < 1e-3,
                        "{name}: logprob {} vs {}",
                        a.logprob,
                        b.logprob
                    );
                }
            }
        }
        let share = same as f64 / total as f64;
        println!("RESULT device sampler, {name}: {same}/{total} draws equal the reference");
        assert!(share >= 0.99, "{name}: only {same}/{total} draws agree");
    }
    println!("RESULT masks and biases moved {moved} greedy tokens off the unconstrained argmax");
    assert!(moved > 0, "no mask or bias changed a greedy token");
}

fn cuda_paged_prefill(model: &Model) -> CudaBackend {
    let options = CudaOptions {
        flash_prefill: false,
        sample_on_device: false,
        ..CudaOptions::default()
    };
    cuda_backend(model, &engine_config(), options)
}

/// The tiled prefill attention kernel gives the logits of the paged split-K kernel: whole
/// prompts of several tiles and KV blocks, a chunked prefill, a prefix-cache hit, and a long
/// prompt whose few tiles split their keys over several blocks (`plan::prefill_splits`) whole
/// and as a short last chunk; on the fixtures (head_dim 16 and 32: `mma.sync`) and on
/// inferno-tiny read with head_dim 64 (warpgroup products on Hopper).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn flash_prefill_matches_the_paged_kernel() {
    require_gpu();
    let (_reshaped_dir, reshaped) = tiny_with_head_dim_64();
    let mut models: Vec<(&str, Model)> = ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"]
        .into_iter()
        .map(|name| (name, load(name)))
        .collect();
    models.push(("inferno-tiny as head_dim 64", reshaped));
    for (name, model) in models {
        // The warpgroup kernel wherever it can serve (on Hopper, head_dim 64), however few the
        // step's tiles.
        let options = CudaOptions {
            sample_on_device: false,
            warpgroup_prefill_blocks: Some(0),
            ..CudaOptions::default()
        };
        let mut flash = cuda_backend(&model, &engine_config(), options);
        let mut paged = cuda_paged_prefill(&model);
        let mut worst = 0.0f32;
        let mut blocks = Blocks { next: 0 };
        let seqs: Vec<Seq> = [3usize, 37, 130]
            .iter()
            .enumerate()
            .map(|(i, &n)| Seq::new(prompt(n, 40 + i as u32), &mut blocks, n))
            .collect();
        for s in &seqs {
            let n = s.tokens.len();
            let a = run_chunk(&mut flash, s, 0, n);
            let b = run_chunk(&mut paged, s, 0, n);
            worst = worst.max(max_abs_diff(&a, &b));
        }
        // Chunked: 50 + 47 + 33 tokens of the 130-token prompt, each chunk through the tiles.
        let s = &seqs[2];
        for (start, end) in [(0, 50), (50, 97)] {
            for backend in [&mut flash, &mut paged] {
                let row = BatchRow {
                    seq_id: 7,
                    tokens: &s.tokens[start..end],
                    start_pos: start,
                    block_table: &s.table,
                    sample: None,
                };
                backend.step(&[row]).expect("chunk");
            }
        }
        let a = run_chunk(&mut flash, s, 97, 130);
        let b = run_chunk(&mut paged, s, 97, 130);
        let chunked = max_abs_diff(&a, &b);
        // Prefix hit: the first 4 blocks of the 130-token prompt, then 20 new tokens.
        let mut tokens = s.tokens[..64].to_vec();
        tokens.extend(prompt(20, 99));
        let mut table = s.table[..4].to_vec();
        table.extend(blocks.take(2));
        let hit = Seq { tokens, table };
        let a = run_chunk(&mut flash, &hit, 64, 84);
        let b = run_chunk(&mut paged, &hit, 64, 84);
        let prefix = max_abs_diff(&a, &b);
        // Long context: 1,700 tokens in one step, then a 16-token chunk attending to 1,716 keys
        // (a tile or two: split in two over the keys).
        let long = Seq::new(prompt(1716, 77), &mut blocks, 1716);
        let mut split = 0.0f32;
        for (start, end) in [(0, 1700), (1700, 1716)] {
            let a = run_chunk(&mut flash, &long, start, end);
            let b = run_chunk(&mut paged, &long, start, end);
            split = split.max(max_abs_diff(&a, &b));
        }
        println!(
            "RESULT flash prefill vs paged, {name}: whole prompts {worst:.5}, chunked {chunked:.5}, prefix hit {prefix:.5}, long context split over blocks {split:.5}"
        );
        for (what, diff) in [
            ("whole", worst),
            ("chunked", chunked),
            ("prefix", prefix),
            ("split", split),
        ] {
            assert!(
                diff <= PREFILL_TOLERANCE,
                "{name} {what}: flash differs by {diff}"
            );
        }
    }
}
