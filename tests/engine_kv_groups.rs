//! KV-cache groups through the engine on the CPU backend: sliding layers give back the blocks
//! their window left, so a KV cache too small to hold every layer's blocks still serves
//! generations longer than it, with transformers' greedy tokens.
//!
//! - tiny-gpt-oss (2 sliding layers with a window of 8, 1 full layer): the cache holds the full
//!   layer's blocks of the longest case and the sliding layers' window, not both groups' blocks;
//! - tiny-mixtral (only sliding layers, window 24): a cache of 4 blocks serves 200-token
//!   sequences;
//! - the prefix cache on gpt-oss: a repeated prompt reuses its blocks, with the same tokens.

mod support;

use inferno::engine::{BLOCK_SIZE, EngineConfig};
use inferno::model::Model;
use support::{committed_fixture, engine, golden, greedy, run, run_all};

/// Bytes of one KV block on the CPU backend (f32 keys and values) with `slots` layers per block
/// (the largest group's) of `kv_width` floats per token.
fn block_bytes(slots: usize, kv_width: usize) -> u64 {
    (slots * 2 * kv_width * std::mem::size_of::<f32>() * BLOCK_SIZE) as u64
}

/// The committed fixture `name`, its golden cases, and the longest case's prompt and greedy
/// tokens together.
fn fixture(name: &str) -> (Model, Vec<support::GoldenCase>, usize) {
    let dir = committed_fixture(name);
    let model = Model::load(&dir).expect("fixture loads");
    let cases = golden(&dir);
    let longest = cases
        .iter()
        .map(|c| c.input_ids.len() + c.greedy_24.len())
        .max()
        .expect("cases");
    (model, cases, longest)
}

#[test]
fn gpt_oss_generates_on_a_cache_that_holds_the_full_layers_and_the_window_only() {
    let (model, cases, longest) = fixture("tiny-gpt-oss");
    // A block holds 2 slots (the 2 sliding layers, or the full layer padded) of 2 KV heads of
    // 16. The full group's blocks of the longest case, and the 2 blocks a window of 8 spans.
    let blocks = longest.div_ceil(BLOCK_SIZE) + 2;
    for max_batched_tokens in [16, 64] {
        let config = EngineConfig {
            max_batched_tokens,
            kv_cache_bytes: blocks as u64 * block_bytes(2, 32),
            ..Default::default()
        };
        let engine = engine(&model, config);
        let kv = engine.kv_cache();
        assert_eq!(kv.num_blocks, blocks);
        assert!(kv.capacity_tokens() >= longest);
        // Keeping every block of both groups would take twice the full group's.
        assert!(2 * longest.div_ceil(BLOCK_SIZE) > kv.num_blocks);
        let requests = cases
            .iter()
            .map(|case| greedy(&case.input_ids, case.greedy_24.len()))
            .collect();
        for (i, (out, case)) in run_all(&engine, requests).iter().zip(&cases).enumerate() {
            assert_eq!(
                out.tokens, case.greedy_24,
                "case {i}, steps of {max_batched_tokens}"
            );
        }
        engine.shutdown();
    }
}

#[test]
fn an_all_sliding_model_generates_past_its_whole_cache() {
    let (model, cases, longest) = fixture("tiny-mixtral");
    // 4 blocks of 2 layers of 2 KV heads of 16: 64 tokens, where the longest case has 202.
    let config = EngineConfig {
        max_batched_tokens: 64,
        kv_cache_bytes: 4 * block_bytes(2, 32),
        ..Default::default()
    };
    let engine = engine(&model, config);
    assert_eq!(engine.kv_cache().num_blocks, 4);
    assert!(longest > 4 * BLOCK_SIZE);
    for (i, case) in cases.iter().enumerate() {
        let out = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
        assert_eq!(out.tokens, case.greedy_24, "case {i}");
    }
    engine.shutdown();
}

#[test]
fn a_repeated_gpt_oss_prompt_reuses_its_blocks_with_the_same_tokens() {
    let dir = committed_fixture("tiny-gpt-oss");
    let model = Model::load(&dir).expect("fixture loads");
    let cases = golden(&dir);
    let config = EngineConfig {
        max_batched_tokens: 16,
        kv_cache_bytes: 64 * block_bytes(2, 32),
        ..Default::default()
    };
    let engine = engine(&model, config);
    // The 47-token case: its first two blocks are reused; the sliding layers read block 1 only.
    let case = &cases[1];
    assert_eq!(case.input_ids.len(), 47);
    let first = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
    let again = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
    assert_eq!((first.cached_tokens, again.cached_tokens), (0, 32));
    assert_eq!(first.tokens, case.greedy_24);
    assert_eq!(again.tokens, case.greedy_24);
    engine.shutdown();
}
