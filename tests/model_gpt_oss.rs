//! gpt-oss (`tests/fixtures/tiny-gpt-oss` with MXFP4 experts, `tiny-gpt-oss-bf16` with the same
//! experts in transformers' dequantized layout; made by `scripts/make_gptoss_fixture.py`): the
//! definition its config declares, both expert layouts loaded to the same weights, a NaN MXFP4
//! scale refused, and the CPU backend's logits against transformers at every position, past the
//! sliding window, in decode steps and in one prefill, and decode steps against prefills over 320
//! positions.

mod support;

use inferno::backend::cpu::CpuBackend;
use inferno::engine::EngineConfig;
use inferno::engine::{Backend, BatchRow, SampleSpec, SamplingParams};
use inferno::model::gpt_oss::ExpertStorage;
use inferno::model::{ExpertKind, MlpDefinition, MlpTensors, Model, Routing, layout};
use serde::Deserialize;
use support::{
    block_tables, committed_fixture, engine, golden as cases, greedy, logits_per_position,
    max_abs_diff, pseudo_random_tokens, run_all, run_chunk,
};

/// Logits tolerance against transformers' fp32 forward over the same bf16 weights (the MoE and
/// CPU golden tests' bound).
const LOGIT_TOLERANCE: f32 = 1e-3;

/// The fixtures' sliding window.
const WINDOW: usize = 8;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    teacher_forced: TeacherForced,
}

#[derive(Deserialize)]
struct TeacherForced {
    tokens: Vec<u32>,
    top5_ids: Vec<Vec<u32>>,
    top5_values: Vec<Vec<f32>>,
}

fn load(name: &str) -> Model {
    Model::load(&committed_fixture(name)).expect("fixture loads")
}

fn golden(name: &str) -> Golden {
    let text = std::fs::read_to_string(committed_fixture(name).join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Sliding and full layers as `layer_types` says, sinks and biases on every attention, top-4
/// routing with a softmax over the chosen logits, the clamped SwiGLU; MXFP4 as the
/// `quantization_config` says.
#[test]
fn gpt_oss_declares_its_layers() {
    for (name, mxfp4) in [("tiny-gpt-oss", true), ("tiny-gpt-oss-bf16", false)] {
        let model = load(name);
        let d = model.definition();
        let windows: Vec<Option<usize>> = d
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        assert_eq!(windows, vec![Some(WINDOW), None, Some(WINDOW)], "{name}");
        assert!(!d.uniform_attention());
        for layer in &d.layers {
            let a = &layer.attention;
            assert!(
                a.qkv_bias && a.o_bias && a.sinks && a.qk_norm.is_none(),
                "{name}"
            );
            let MlpDefinition::Moe(moe) = layer.mlp else {
                panic!("{name}: every layer has experts");
            };
            assert_eq!((moe.num_experts, moe.expert_intermediate), (8, 32));
            assert_eq!(moe.routing, Routing::TopKSoftmax { top_k: 4 });
            assert_eq!(moe.shared_expert, None);
            assert_eq!(
                moe.experts,
                ExpertKind::ClampedSwiGlu {
                    alpha: 1.702,
                    limit: 7.0,
                    mxfp4
                }
            );
        }
        // Every tensor of the checkpoint is in the layout, and the layout validates.
        let tensors = layout(&d, None);
        assert_eq!(tensors.all().len(), model.weights.names().count(), "{name}");
        tensors.validate(&model.weights).unwrap();
    }
}

/// The MXFP4 experts dequantized and the bf16 experts transposed give the same `[E, out, in]`
/// weights, bit for bit (the fixture's bf16 experts are the MXFP4 ones, dequantized by
/// transformers' layout).
#[test]
fn mxfp4_and_bf16_experts_load_to_the_same_weights() {
    let (mx, bf) = (load("tiny-gpt-oss"), load("tiny-gpt-oss-bf16"));
    let (lm, lb) = (
        layout(&mx.definition(), None),
        layout(&bf.definition(), None),
    );
    for (layer, (a, b)) in lm.layers.iter().zip(&lb.layers).enumerate() {
        let (MlpTensors::GptOss(a), MlpTensors::GptOss(b)) = (&a.mlp, &b.mlp) else {
            panic!("layer {layer}: gpt-oss experts");
        };
        assert!(matches!(a.gate_up.storage, ExpertStorage::Mxfp4 { .. }));
        assert!(matches!(b.gate_up.storage, ExpertStorage::InputMajor(_)));
        for (pa, pb, shape) in [
            (&a.gate_up, &b.gate_up, [8, 64, 64]),
            (&a.down, &b.down, [8, 64, 32]),
        ] {
            assert_eq!(pa.shape, shape);
            let (x, y) = (
                pa.to_f32(&mx.weights).unwrap(),
                pb.to_f32(&bf.weights).unwrap(),
            );
            assert_eq!(x.len(), shape.iter().product::<usize>());
            assert!(x.iter().any(|&v| v != 0.0));
            assert_eq!(x, y, "layer {layer}");
        }
    }
}

/// One E8M0 scale set to 0xFF (NaN) in a copy of the MXFP4 fixture: the CPU backend refuses
/// the model in one line naming the tensor.
#[test]
fn a_nan_mxfp4_scale_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = committed_fixture("tiny-gpt-oss");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let weights = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let name = "model.layers.1.mlp.experts.down_proj_scales";
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[8 + header_len + start + 5] = 0xFF;
    std::fs::write(&weights, bytes).unwrap();
    let model = Model::load(dir.path()).expect("the layout is unchanged");
    let err = CpuBackend::new(&model, 1 << 20).unwrap_err().to_string();
    assert!(err.contains(name) && err.contains("0xFF"), "{err}");
    assert!(!err.contains('\n'));
}

/// Teacher-forced logits of every case at every position, one decode step per token, for both
/// expert layouts: within the tolerance of transformers' top-5 logits. The cases run past the
/// sliding window (8), so the sliding layers drop keys the full layer keeps.
#[test]
fn teacher_forced_logits_match_transformers_at_every_position() {
    for name in ["tiny-gpt-oss", "tiny-gpt-oss-bf16"] {
        let golden = golden(name);
        let model = load(name);
        let mut backend = CpuBackend::new(&model, 16 << 20).unwrap();
        let (mut worst, mut positions, mut past_window) = (0f32, 0, 0);
        for (i, case) in golden.cases.iter().enumerate() {
            let tf = &case.teacher_forced;
            let logits = logits_per_position(&mut backend, &tf.tokens);
            for (pos, row) in logits.iter().enumerate() {
                for (&id, &want) in tf.top5_ids[pos].iter().zip(&tf.top5_values[pos]) {
                    let err = (row[id as usize] - want).abs();
                    worst = worst.max(err);
                    assert!(
                        err < LOGIT_TOLERANCE,
                        "{name}: case {i}, position {pos}, logit {id}: {} vs {want}",
                        row[id as usize]
                    );
                }
                positions += 1;
                past_window += usize::from(pos >= WINDOW);
            }
        }
        assert!(
            past_window > positions / 2,
            "{name}: {past_window} of {positions}"
        );
        eprintln!("{name}: {positions} positions, max |logit error| over top-5 = {worst:.2e}");
    }
}

/// One token per step over 320 positions (40 windows: the sliding layers' keys come and go many
/// times) gives the same logits as prefills ending at the same positions, on both fixtures: the
/// reference that `tests/cuda_gpt_oss.rs` holds the GPU's decode steps to is consistent with
/// itself far past the golden cases' lengths, and records each step's router gap.
#[test]
fn decode_steps_equal_prefill_far_past_the_window() {
    for name in ["tiny-gpt-oss", "tiny-gpt-oss-bf16"] {
        let model = load(name);
        let tokens = pseudo_random_tokens(model.config.vocab_size, 320, 45);
        let mut stepwise = CpuBackend::new(&model, 64 << 20).unwrap();
        let table = block_tables(&stepwise, tokens.len());
        let decoded: Vec<Vec<f32>> = (1..=tokens.len())
            .map(|end| {
                let logits = run_chunk(&mut stepwise, &tokens, &table, end - 1, end);
                // The step's router gap (what the GPU tests skip near-ties by) is recorded.
                let gap = stepwise.router_gaps()[0];
                assert!(gap.is_finite() && gap >= 0.0, "{name}: router gap {gap}");
                logits
            })
            .collect();
        let mut prefill = CpuBackend::new(&model, 64 << 20).unwrap();
        for end in [8, 9, 16, 37, 64, 100, 135, 200, 282, 320] {
            let whole = run_chunk(&mut prefill, &tokens, &table, 0, end);
            let diff = max_abs_diff(&decoded[end - 1], &whole);
            assert!(diff <= 1e-4, "{name}: position {}: {diff}", end - 1);
        }
    }
}

/// The same logits from one prefill step over a whole case (every position's logits asked),
/// the path a prompt takes.
#[test]
fn prefill_logits_match_transformers() {
    let golden = golden("tiny-gpt-oss");
    let model = load("tiny-gpt-oss");
    let mut backend = CpuBackend::new(&model, 16 << 20).unwrap();
    let params = SamplingParams::default();
    for (i, case) in golden.cases.iter().enumerate() {
        let tf = &case.teacher_forced;
        let blocks = support::block_tables(&backend, tf.tokens.len());
        let row = BatchRow {
            seq_id: 1,
            tokens: &tf.tokens,
            start_pos: 0,
            block_table: &blocks,
            sample: Some(SampleSpec {
                params: &params,
                seed: 0,
                draw_index: 0,
                prompt: &[],
                output: &[],
                logprobs: None,
                mask: None,
            }),
        };
        let (logits, _) = backend
            .step_logits(&[row], &[tf.tokens.len()], &[])
            .unwrap();
        assert_eq!(logits.len(), tf.tokens.len());
        for (pos, row) in logits.iter().enumerate() {
            for (&id, &want) in tf.top5_ids[pos].iter().zip(&tf.top5_values[pos]) {
                let err = (row[id as usize] - want).abs();
                assert!(err < LOGIT_TOLERANCE, "case {i}, position {pos}: {err}");
            }
        }
    }
}

/// Greedy decoding through the whole engine, every case at once (batched rows) with a step
/// budget of 16 tokens, so the prompts are prefilled in chunks that cross the window: the tokens
/// transformers chose (the goldens' smallest top-2 margin is 1.7e-3, far above the logits'
/// error).
#[test]
fn greedy_generation_through_the_engine_matches_transformers() {
    let dir = committed_fixture("tiny-gpt-oss");
    let model = Model::load(&dir).unwrap();
    let config = EngineConfig {
        max_batched_tokens: 16,
        kv_cache_bytes: 16 << 20,
        ..Default::default()
    };
    let engine = engine(&model, config);
    let cases = cases(&dir);
    let requests = cases
        .iter()
        .map(|case| greedy(&case.input_ids, case.greedy_24.len()))
        .collect();
    for (i, (out, case)) in run_all(&engine, requests).iter().zip(&cases).enumerate() {
        assert!(case.greedy_margins.iter().all(|&m| m > 1e-3));
        assert_eq!(out.tokens, case.greedy_24, "case {i}");
    }
    engine.shutdown();
}
