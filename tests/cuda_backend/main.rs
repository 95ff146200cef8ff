//! The CUDA backend against the CPU backend and transformers (the fixtures' `golden.json`), on
//! the GPU machine. Every test is ignored by default (CI has no GPU) and fails where it runs
//! without one; one module per subject.
//!
//! Run there with `--test-threads=1` (each test takes a slice of GPU memory for its KV cache).
//! `INFERNO_FIXTURES` points at the fixture directory (default: `tests/fixtures`).

#[path = "../support/mod.rs"]
mod support;

mod engine;
mod graphs;
mod logits;
mod prefill;
mod sampler;

use support::{Generated, gpu_fixtures, greedy_spec, max_abs_diff, require_gpu, run_request};

use inferno::backend::cpu::CpuBackend;
use inferno::backend::cuda::{CudaBackend, CudaOptions, EarlyUpload, OpenedDevice};
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

fn load(name: &str) -> Model {
    let dir = gpu_fixtures().join(name);
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
    let source = gpu_fixtures().join("inferno-tiny");
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
        sample: Some(greedy_spec(None)),
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
            sample: Some(greedy_spec(None)),
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

/// A deterministic prompt of `len` ids in 50..950, varied by `salt`.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + salt * 104_729) % 900 + 50)
        .collect()
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
