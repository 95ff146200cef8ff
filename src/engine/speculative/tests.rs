//! The acceptance rule, tested statistically with fixed seeds.

use super::verify::{verify_row, verify_sampled};
use crate::engine::backend::SampleSpec;
use crate::engine::request::SamplingParams;
use crate::engine::sampling::sample;

/// Pearson's chi-square statistic of `counts` against the probabilities `expected`.
fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(expected)
        .filter(|(_, p)| **p > 0.0)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| f64::from((l - max) / temperature).exp())
        .collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

fn spec(params: &SamplingParams, seed: u64) -> SampleSpec<'_> {
    SampleSpec {
        params,
        seed,
        draw_index: 3,
        prompt: &[],
        output: &[],
        logprobs: None,
        mask: None,
    }
}

/// The 0.999 quantile of the chi-square distribution with 5 degrees of freedom: a correct rule
/// exceeds it once in a thousand seeds sets.
const CHI2_5_P999: f64 = 20.52;

const TRIALS: u64 = 20_000;

#[test]
fn a_prompt_lookup_proposal_leaves_the_first_token_distributed_as_the_target() {
    // Six tokens; the proposal (token 4) is unlikely, then likely (token 0).
    let logits = vec![2.0, 1.0, 0.5, 0.0, -0.5, 1.5];
    let params = SamplingParams {
        temperature: 0.8,
        ..Default::default()
    };
    let expected = softmax(&logits, 0.8);
    for draft in [4u32, 0] {
        let mut counts = [0u64; 6];
        let mut accepted = 0;
        for seed in 0..TRIALS {
            // The second position's logits do not matter for the first token.
            let out = verify_row(
                vec![logits.clone(), logits.clone()],
                &[draft],
                &spec(&params, seed),
                None,
            );
            counts[out.tokens[0].token as usize] += 1;
            accepted += out.accepted;
            // The first token is the one the request draws without speculation.
            if seed % 100 == 0 {
                let plain = sample(logits.clone(), &spec(&params, seed)).token;
                assert_eq!(out.tokens[0].token, plain);
            }
        }
        let chi2 = chi_square(&counts, &expected);
        assert!(chi2 < CHI2_5_P999, "draft {draft}: chi2 {chi2}, {counts:?}");
        // A point-mass proposal is accepted with the target's probability of it.
        let rate = accepted as f64 / TRIALS as f64;
        let want = expected[draft as usize];
        assert!(
            (rate - want).abs() < 0.015,
            "draft {draft}: {rate} vs {want}"
        );
    }
}

#[test]
fn greedy_accepts_exactly_the_argmax_chain_then_corrects() {
    let params = SamplingParams::default();
    let at = |best: usize| {
        let mut l = vec![0.0f32; 5];
        l[best] = 1.0;
        l
    };
    // Argmaxes 1, 2, 3, 4: proposals 1, 2, 0 -> accepted 1, 2, then the target's 3.
    let out = verify_row(
        vec![at(1), at(2), at(3), at(4)],
        &[1, 2, 0],
        &spec(&params, 1),
        None,
    );
    let tokens: Vec<u32> = out.tokens.iter().map(|t| t.token).collect();
    assert_eq!((tokens, out.accepted), (vec![1, 2, 3], 2));
    // All accepted: the bonus token follows.
    let out = verify_row(vec![at(1), at(2), at(4)], &[1, 2], &spec(&params, 1), None);
    let tokens: Vec<u32> = out.tokens.iter().map(|t| t.token).collect();
    assert_eq!((tokens, out.accepted), (vec![1, 2, 4], 2));
}

#[test]
fn forced_acceptance_accepts_the_configured_share() {
    let params = SamplingParams::default();
    let logits = vec![1.0f32, 0.0, 0.0];
    let (mut accepted, mut proposed) = (0, 0);
    for seed in 0..4000 {
        // The target never agrees (argmax 0, proposals 2).
        let out = verify_row(
            vec![logits.clone(); 5],
            &[2; 4],
            &spec(&params, seed),
            Some(0.6),
        );
        accepted += out.accepted;
        proposed += usize::from(out.accepted < 4) + out.accepted;
    }
    let rate = accepted as f64 / proposed as f64;
    assert!((rate - 0.6).abs() < 0.02, "{rate}");
}

#[test]
fn eagle3_is_refused_and_ranges_are_checked() {
    use super::{SpeculativeConfig, SpeculativeMethod};
    let eagle = SpeculativeConfig {
        method: Some(SpeculativeMethod::Eagle3),
        ..Default::default()
    };
    assert_eq!(
        eagle.validate().unwrap_err().to_string(),
        "speculative decoding with eagle3 is not supported yet (use ngram)"
    );
    let zero = SpeculativeConfig {
        method: Some(SpeculativeMethod::Ngram),
        num_speculative_tokens: 0,
        ..Default::default()
    };
    assert!(zero.validate().is_err());
    let ok: SpeculativeConfig =
        toml::from_str("method = \"ngram\"\nnum_speculative_tokens = 5").expect("parses");
    assert!(ok.validate().is_ok() && ok.enabled());
}

/// Verification from tokens sampled at every position (a device-sampling backend) gives what
/// verification from the logits gives, for greedy and seeded sampled rows with penalties that
/// see the proposals, and in the forced mode: the targets are drawn here with the reference
/// sampler and the specs `verify_row` uses at each position.
#[test]
fn verification_from_sampled_positions_equals_verification_from_logits() {
    let rows: Vec<Vec<f32>> = (0..5)
        .map(|j| (0..8).map(|t| ((t * 5 + j * 3) % 7) as f32 * 0.4).collect())
        .collect();
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        frequency_penalty: 0.3,
        ..Default::default()
    };
    let mut differing_outcomes = std::collections::HashSet::new();
    for params in [&greedy, &sampled] {
        for seed in 0..200 {
            for forced in [None, Some(0.5)] {
                let draft = [3u32, 5, 3, 1];
                let spec = spec(params, seed);
                let outputs: Vec<Vec<u32>> =
                    (0..=draft.len()).map(|j| draft[..j].to_vec()).collect();
                let targets = rows
                    .iter()
                    .zip(&outputs)
                    .enumerate()
                    .map(|(j, (logits, output))| {
                        let at = SampleSpec {
                            output,
                            draw_index: spec.draw_index + j as u64,
                            ..spec
                        };
                        sample(logits.clone(), &at)
                    })
                    .collect();
                let want = verify_row(rows.clone(), &draft, &spec, forced);
                let got = verify_sampled(targets, &draft, &spec, forced);
                assert_eq!(got, want, "seed {seed}, forced {forced:?}");
                differing_outcomes.insert(want.accepted);
            }
        }
    }
    assert!(differing_outcomes.len() > 2, "{differing_outcomes:?}");
}

/// The serving defaults (`itl_stall_limit` 1.5, the adaptive rule from its prior of one proposal
/// in two accepted, K = 4) propose on a GPU: with the step times the 8B-shaped weights measured on
/// an H100 (`docs/performance.md`, "Speculative decoding": 256-token prompts in 9.2 ms alone and
/// 52 ms for eight, decode steps of 5.30 and 5.52 ms at batch 1 and 8, verification steps of
/// K = 4 of 6.01 and 7.02 ms), the step budget leaves room for every proposal and the rule
/// proposes 4 tokens at batch 1 and at least 3 at batch 8, before and after verification steps have
/// priced a verified token.
#[test]
fn serving_defaults_propose_with_the_step_times_of_a_gpu() {
    use super::adaptive::Acceptance;
    use crate::engine::EngineConfig;
    use crate::engine::step_cost::{DecodeLoad, StepCosts};
    use std::time::Duration;

    let defaults = EngineConfig::default();
    let mixed_step_sizes: Vec<usize> = (1..=8)
        .map(|k| 16 * k)
        .chain([160, 192, 224, 256])
        .collect();
    for (batch, prefill_ms, decode_ms, verify_ms, want_k) in
        [(1, 9.2, 5.30, 6.01, 4), (8, 52.0, 5.52, 7.02, 3)]
    {
        let mut costs = StepCosts::new(defaults.itl_stall_limit, defaults.max_batched_tokens)
            .with_step_sizes(&mixed_step_sizes);
        let load = DecodeLoad {
            rows: batch,
            kv_tokens: batch * 300,
            target_rows: batch,
        };
        let seconds = |ms: f64| Duration::from_secs_f64(ms / 1e3);
        costs.record(DecodeLoad::default(), 256 * batch, seconds(prefill_ms));
        costs.record(load, 0, seconds(decode_ms));
        for verified_steps in 0..20 {
            let cost = super::token_cost(
                batch,
                costs.seconds_per_prefill_token(),
                costs.decode_estimate(batch),
            );
            let k = Acceptance::default().choose(defaults.speculative.num_speculative_tokens, cost);
            assert!(
                k >= want_k,
                "batch {batch}, {verified_steps} verifications: {k} proposed at cost {cost}"
            );
            let budget = costs.token_budget(load);
            assert!(
                budget >= batch * (1 + k),
                "batch {batch}: a budget of {budget} tokens"
            );
            costs.record(load, batch * 4, seconds(verify_ms));
        }
    }
}
