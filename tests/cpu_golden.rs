//! The CPU backend reproduces transformers: every greedy token of every golden case, and the
//! top-20 logits at the last prompt position within 1e-3 absolute.

mod support;

use std::path::Path;

use inferno::backend::cpu::CpuBackend;
use inferno::engine::{
    BLOCK_SIZE, Backend, BatchRow, EngineConfig, SampleSpec, SamplingParams, StepOutput,
};
use inferno::model::Model;
use support::{
    committed_fixture, engine, golden, greedy, logits_per_position, run, shared_fixture,
};

const LOGIT_TOLERANCE: f32 = 1e-3;

/// Logits after a single prefill of `prompt` on a fresh backend.
fn prefill_logits(backend: &mut CpuBackend, prompt: &[u32]) -> Vec<f32> {
    let blocks: Vec<u32> = (0..prompt.len().div_ceil(BLOCK_SIZE) as u32).collect();
    let params = SamplingParams::default();
    let spec = SampleSpec {
        params: &params,
        seed: 0,
        draw_index: 0,
        prompt,
        output: &[],
        logprobs: None,
        mask: None,
    };
    let row = BatchRow {
        seq_id: 1,
        tokens: prompt,
        start_pos: 0,
        block_table: &blocks,
        sample: Some(spec),
    };
    match backend.step(&[row]).expect("step runs") {
        StepOutput::Logits(mut rows) => rows.remove(0),
        StepOutput::Sampled(_) => panic!("the CPU backend returns logits"),
    }
}

fn check_fixture(dir: &Path) {
    let model = Model::load(dir).expect("fixture loads");
    let cases = golden(dir);
    let mut backend = CpuBackend::new(&model, 64 << 20).expect("backend builds");
    let mut worst = 0.0f32;
    for (i, case) in cases.iter().enumerate() {
        let logits = prefill_logits(&mut backend, &case.input_ids);
        for (&id, &want) in case
            .last_logits_top20
            .ids
            .iter()
            .zip(&case.last_logits_top20.values)
        {
            let err = (logits[id as usize] - want).abs();
            worst = worst.max(err);
            assert!(
                err < LOGIT_TOLERANCE,
                "{}: case {i}, logit {id}: {} vs {want}",
                dir.display(),
                logits[id as usize]
            );
        }
    }
    eprintln!(
        "{}: max |logit error| over top-20 = {worst:.2e}",
        dir.display()
    );

    // Greedy decoding through the whole engine, with a small step budget so the long case is
    // prefilled in chunks.
    let config = EngineConfig {
        max_batched_tokens: 128,
        kv_cache_bytes: 64 << 20,
        ..Default::default()
    };
    let engine = engine(&model, config);
    for (i, case) in cases.iter().enumerate() {
        let out = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
        assert_eq!(
            out.tokens,
            case.greedy_24,
            "{}: greedy tokens of case {i}",
            dir.display()
        );
    }
    engine.shutdown();
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn shared_tiny_llama3_matches_transformers() {
    check_fixture(&shared_fixture("tiny-llama3"));
}

#[test]
fn committed_llama3_fixture_matches_transformers() {
    check_fixture(&committed_fixture("inferno-tiny"));
}

#[test]
fn committed_qwen2_fixture_matches_transformers() {
    check_fixture(&committed_fixture("tiny-qwen2"));
}

#[test]
fn committed_qwen3_fixture_matches_transformers() {
    check_fixture(&committed_fixture("tiny-qwen3"));
}

#[test]
fn committed_qwen3_moe_fixture_matches_transformers() {
    check_fixture(&committed_fixture("tiny-qwen3-moe"));
}

#[test]
fn committed_qwen2_moe_fixture_matches_transformers() {
    check_fixture(&committed_fixture("tiny-qwen2-moe"));
}

#[test]
fn committed_mixtral_fixture_matches_transformers() {
    check_fixture(&committed_fixture("tiny-mixtral"));
}

/// Decoding one token per step (the decode path) gives the reference argmax at every position.
#[test]
fn per_position_argmax_matches_when_decoding_token_by_token() {
    let dir = committed_fixture("inferno-tiny");
    let model = Model::load(&dir).expect("fixture loads");
    let mut backend = CpuBackend::new(&model, 16 << 20).expect("backend builds");
    for case in golden(&dir).iter().filter(|c| c.input_ids.len() <= 64) {
        let logits = logits_per_position(&mut backend, &case.input_ids);
        for (pos, (row, want)) in logits.iter().zip(&case.per_position_argmax).enumerate() {
            assert_eq!(
                inferno::engine::sampling::argmax(row),
                *want,
                "position {pos}"
            );
        }
    }
}
