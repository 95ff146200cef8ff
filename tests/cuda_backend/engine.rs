//! The engine on the CUDA backend: preemption and the prefix cache leave outputs unchanged.

use super::*;

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
