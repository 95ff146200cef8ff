//! The reference sampler: penalties, temperature, top-k, top-p, min-p and a counter-based random
//! draw, plus logprobs.
//!
//! Every backend that samples on its device implements exactly these semantics, in this order:
//! 0. the grammar mask of a constrained row ([`SampleSpec::mask`]) sets every disallowed logit
//!    to minus infinity, then `logit_bias` is added to the listed tokens' logits;
//! 1. penalties on the raw logits: repetition (Hugging Face: divide positive logits, multiply
//!    negative ones, for every token seen in prompt or output), then frequency and presence
//!    (OpenAI: subtract `frequency × count + presence` for every generated token);
//! 2. greedy (temperature 0): the highest logit, the lower id winning ties;
//! 3. otherwise: divide by the temperature, softmax, sort by probability (descending; ties by
//!    lower id), keep the top `k`, then the smallest prefix whose mass reaches `top_p`, then the
//!    tokens with probability at least `min_p` times the top one; draw `u = uniform(seed,
//!    draw_index)` and pick the first token whose cumulative kept mass exceeds `u` times the kept
//!    total.
//!
//! Logprobs are the log-softmax of the raw logits, before the mask, the biases, penalties and
//! temperature.

use std::collections::HashMap;

use super::backend::{SampleSpec, SampledToken};
use super::request::{SamplingParams, TokenLogprob};

/// The uniform draw in `[0, 1)` for a request's `draw_index`-th token.
///
/// A counter-based generator (two SplitMix64 finalisation rounds over the seed and the index), so
/// the draw depends only on the request's seed and position, never on what else is in the batch,
/// and a GPU kernel can compute it with the same integer arithmetic.
pub fn uniform(seed: u64, draw_index: u64) -> f32 {
    let mut z = seed
        ^ draw_index
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    // 24 random bits: every value is exactly representable, and the result is below 1.
    (z >> 40) as f32 / (1u32 << 24) as f32
}

/// Applies the repetition, frequency and presence penalties to `logits` in place.
pub fn apply_penalties(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
) {
    if params.repetition_penalty != 1.0 {
        let penalty = params.repetition_penalty;
        let mut seen = vec![false; logits.len()];
        for &token in prompt.iter().chain(output) {
            if let Some(slot) = seen.get_mut(token as usize) {
                *slot = true;
            }
        }
        for (logit, _) in logits.iter_mut().zip(&seen).filter(|(_, seen)| **seen) {
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
    if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &token in output {
            *counts.entry(token).or_default() += 1;
        }
        for (token, count) in counts {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit -= params.frequency_penalty * count as f32 + params.presence_penalty;
            }
        }
    }
}

/// Index of the largest value; the lowest index wins ties.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of `logits`, computed in f64 for a stable normaliser.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_sum = sum.ln() as f32;
    logits.iter().map(|&l| l - max - log_sum).collect()
}

/// The `k` largest entries as `(index, value)`, largest first, the lower index winning ties.
pub fn top_k_entries(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    let by_value_desc = |a: &u32, b: &u32| {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(order.len());
    if k == 0 {
        return Vec::new();
    }
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_value_desc);
        order.truncate(k);
    }
    order.sort_by(by_value_desc);
    order.into_iter().map(|i| (i, values[i as usize])).collect()
}

/// Sets the logits of tokens that `mask` disallows to minus infinity (bit `t % 32` of word
/// `t / 32` allows token `t`; tokens beyond the mask are disallowed).
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (token, logit) in logits.iter_mut().enumerate() {
        let allowed = mask
            .get(token / 32)
            .is_some_and(|word| word & (1 << (token % 32)) != 0);
        if !allowed {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// Adds each `(token, bias)` of `bias` to its token's logit.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(token, bias) in bias {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit += bias;
        }
    }
}

/// Draws the next token from raw `logits` as `spec` says (restricted to the tokens its grammar
/// mask allows, when it has one). `logits` is consumed as scratch space.
pub fn sample(mut logits: Vec<f32>, spec: &SampleSpec<'_>) -> SampledToken {
    let logprob_table = spec.logprobs.map(|_| log_softmax(&logits));
    let params = spec.params;
    process_logits(&mut logits, spec);
    let token = if params.temperature <= 0.0 {
        argmax(&logits)
    } else {
        draw(&logits, params, uniform(spec.seed, spec.draw_index))
    };
    let logprob = match (spec.logprobs, logprob_table) {
        (Some(k), Some(table)) => Some(TokenLogprob {
            logprob: table[token as usize],
            top: top_k_entries(&table, k as usize),
        }),
        _ => None,
    };
    SampledToken { token, logprob }
}

/// Temperature, the three filters and the inverse-CDF draw with `u`.
fn draw(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    pick(&kept_distribution(logits, params), u)
}

/// The tokens that survive temperature and the three filters, most likely first, with their
/// unnormalised probabilities: what [`sample`] draws from (its total is the kept mass).
pub fn kept_distribution(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    let inv_t = 1.0 / params.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let probs: Vec<f32> = logits.iter().map(|&l| ((l - max) * inv_t).exp()).collect();
    let keep_k = if params.top_k == 0 {
        probs.len()
    } else {
        params.top_k as usize
    };
    let mut kept = top_k_entries(&probs, keep_k);
    let total: f32 = probs.iter().sum();
    if params.top_p < 1.0 {
        let target = params.top_p * total;
        let mut mass = 0.0;
        let mut len = 0;
        for &(_, p) in &kept {
            mass += p;
            len += 1;
            if mass >= target {
                break;
            }
        }
        kept.truncate(len.max(1));
    }
    if params.min_p > 0.0 {
        let floor = params.min_p * kept[0].1;
        let len = kept.iter().take_while(|(_, p)| *p >= floor).count();
        kept.truncate(len.max(1));
    }
    kept
}

/// The inverse-CDF draw with `u` from `kept` (unnormalised probabilities, not empty): the first
/// token whose cumulative mass exceeds `u` times the total.
pub fn pick(kept: &[(u32, f32)], u: f32) -> u32 {
    let kept_total: f32 = kept.iter().map(|(_, p)| p).sum();
    let threshold = u * kept_total;
    let mut mass = 0.0;
    for &(token, p) in kept {
        mass += p;
        if mass > threshold {
            return token;
        }
    }
    // Rounding left the threshold unreached: the last kept token that can be drawn at all.
    kept.iter()
        .rev()
        .find(|(_, p)| *p > 0.0)
        .unwrap_or(&kept[kept.len() - 1])
        .0
}

/// Applies what precedes the draw to raw `logits` in place: the grammar mask, `logit_bias` and
/// the penalties (steps 0 and 1 of the module documentation).
pub fn process_logits(logits: &mut [f32], spec: &SampleSpec<'_>) {
    if let Some(mask) = spec.mask {
        apply_mask(logits, mask);
    }
    apply_logit_bias(logits, &spec.params.logit_bias);
    apply_penalties(logits, spec.params, spec.prompt, spec.output);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(
        params: &'a SamplingParams,
        seed: u64,
        index: u64,
        output: &'a [u32],
    ) -> SampleSpec<'a> {
        SampleSpec {
            params,
            seed,
            draw_index: index,
            prompt: &[],
            output,
            logprobs: None,
            mask: None,
        }
    }

    #[test]
    fn logit_bias_of_100_forces_a_token() {
        let params = SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(3, 100.0)],
            ..Default::default()
        };
        let logits = vec![5.0, 4.0, 3.0, -2.0];
        for i in 0..200 {
            assert_eq!(sample(logits.clone(), &spec(&params, 11, i, &[])).token, 3);
        }
        let banned = SamplingParams {
            logit_bias: vec![(0, -100.0)],
            ..Default::default()
        };
        assert_eq!(sample(logits, &spec(&banned, 1, 0, &[])).token, 1);
    }

    #[test]
    fn the_mask_limits_the_draw_to_allowed_tokens() {
        let params = SamplingParams {
            temperature: 1.5,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..70).map(|i| (i as f32 * 0.7).cos()).collect();
        // Allow tokens 33 and 65 only.
        let mask = [0u32, 1 << 1, 1 << 1];
        for i in 0..300 {
            let masked = SampleSpec {
                mask: Some(&mask),
                ..spec(&params, 4, i, &[])
            };
            let token = sample(logits.clone(), &masked).token;
            assert!(token == 33 || token == 65, "token {token}");
        }
        let greedy = SamplingParams::default();
        let masked = SampleSpec {
            mask: Some(&mask),
            ..spec(&greedy, 4, 0, &[])
        };
        let token = sample(logits, &masked).token;
        assert!(token == 33 || token == 65);
    }

    #[test]
    fn uniform_is_in_range_deterministic_and_spread() {
        let draws: Vec<f32> = (0..10_000).map(|i| uniform(42, i)).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert_eq!(uniform(42, 7), uniform(42, 7));
        assert_ne!(uniform(42, 7), uniform(43, 7));
        let mean = draws.iter().sum::<f32>() / draws.len() as f32;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        let low = draws.iter().filter(|&&u| u < 0.1).count();
        assert!((800..1200).contains(&low), "{low} draws below 0.1");
    }

    #[test]
    fn greedy_picks_argmax_with_lowest_id_on_ties() {
        let params = SamplingParams::default();
        let out = sample(vec![0.1, 3.0, 3.0, -1.0], &spec(&params, 1, 0, &[]));
        assert_eq!(out.token, 1);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_draw() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        for i in 0..50 {
            assert_eq!(
                sample(vec![0.0, 0.5, 2.0, 1.0], &spec(&params, 9, i, &[])).token,
                2
            );
        }
    }

    #[test]
    fn top_p_and_min_p_exclude_the_tail() {
        // Probabilities at temperature 1: about [0.64, 0.24, 0.09, 0.03].
        let logits = vec![3.0, 2.0, 1.0, -0.1];
        let top_p = SamplingParams {
            temperature: 1.0,
            top_p: 0.7,
            ..Default::default()
        };
        let min_p = SamplingParams {
            temperature: 1.0,
            min_p: 0.3,
            ..Default::default()
        };
        for i in 0..500 {
            assert!(sample(logits.clone(), &spec(&top_p, 3, i, &[])).token <= 1);
            assert!(sample(logits.clone(), &spec(&min_p, 3, i, &[])).token <= 1);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let params = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let logits = vec![0.0, (3.0f32).ln()]; // probabilities 0.25 and 0.75
        let ones = (0..8000)
            .filter(|&i| sample(logits.clone(), &spec(&params, 5, i, &[])).token == 1)
            .count();
        assert!((5800..6200).contains(&ones), "{ones} of 8000");
    }

    #[test]
    fn same_seed_and_index_give_the_same_token() {
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let a: Vec<u32> = (0..20)
            .map(|i| sample(logits.clone(), &spec(&params, 77, i, &[])).token)
            .collect();
        let b: Vec<u32> = (0..20)
            .map(|i| sample(logits.clone(), &spec(&params, 77, i, &[])).token)
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn penalties_follow_their_definitions() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        let mut logits = vec![4.0, -4.0, 4.0, 1.0];
        apply_penalties(&mut logits, &params, &[0, 1], &[2, 2]);
        assert_eq!(logits, vec![2.0, -8.0, 2.0 - 1.0 - 0.25, 1.0]);
    }

    #[test]
    fn logprobs_are_normalised_and_ranked() {
        let params = SamplingParams::default();
        let mut s = spec(&params, 1, 0, &[]);
        s.logprobs = Some(2);
        let out = sample(vec![1.0, 2.0, 3.0], &s);
        let lp = out.logprob.expect("logprobs requested");
        let total: f32 = log_softmax(&[1.0, 2.0, 3.0]).iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((lp.logprob - lp.top[0].1).abs() < 1e-7);
    }
}
