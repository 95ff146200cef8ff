//! Verification of proposed tokens against the target model's logits at each proposed
//! position: greedy-exact for greedy rows, the standard rejection rule for sampled ones (the
//! output distribution is the target's), or a fixed share accepted in the forced test mode.
//!
//! The standard rule accepts a proposal `d` drawn from the proposer's distribution `q` with
//! probability `min(1, p(d) / q(d))` and otherwise draws from `max(0, p − q)`, normalised, where
//! `p` is the target's distribution after the request's processing (mask, bias, penalties,
//! temperature, filters). Prompt lookup proposes deterministically: `q` is a point mass on `d`,
//! so `d` is accepted with probability `p(d)` and a rejection draws from `p` without `d`. That is
//! exactly what drawing the target's own token `t ~ p` and accepting `d` when `t = d` does (`t`
//! is then the correction), which is how it is realised here: with the request's own counter
//! draw, so a seeded request gives the same tokens with speculation as without it, whatever
//! else is in the batch and however many tokens were proposed.

use crate::engine::backend::{SampleSpec, SampledToken};
use crate::engine::request::TokenLogprob;
use crate::engine::sampling::{
    argmax, kept_distribution, log_softmax, pick, process_logits, top_k_entries, uniform,
};

/// Separates the forced-acceptance draws.
const FORCED_STREAM: u64 = 0x2545_f491_4f6c_dd1d;

/// What verifying one row's proposals produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The tokens to append, in order: the accepted proposals, then the target's own token
    /// (the correction after a rejection, or the bonus token after all were accepted).
    pub tokens: Vec<SampledToken>,
    /// How many proposals were accepted (`tokens.len() - 1`).
    pub accepted: usize,
}

/// The target's own token at one position from processed logits, as the sampler draws it.
fn target_token(logits: &[f32], spec: &SampleSpec<'_>) -> u32 {
    if spec.params.temperature <= 0.0 {
        argmax(logits)
    } else {
        pick(
            &kept_distribution(logits, spec.params),
            uniform(spec.seed, spec.draw_index),
        )
    }
}

/// Verifies `draft` against `logits` (one vector per position: after the row's last accepted
/// token, then after each proposal; `draft.len() + 1` of them). `spec` is the row's sampling
/// spec for the first position; position `j` sees the proposals before it as output and draws
/// with index `draw_index + j`. `forced`: the test mode that accepts each proposal with this
/// probability whatever the target says.
pub fn verify_row(
    logits: Vec<Vec<f32>>,
    draft: &[u32],
    spec: &SampleSpec<'_>,
    forced: Option<f64>,
) -> Verified {
    debug_assert_eq!(logits.len(), draft.len() + 1);
    let mut output = spec.output.to_vec();
    let mut tokens = Vec::with_capacity(logits.len());
    for (j, raw) in logits.into_iter().enumerate() {
        let at = SampleSpec {
            output: &output,
            draw_index: spec.draw_index + j as u64,
            ..*spec
        };
        let table = spec.logprobs.map(|_| log_softmax(&raw));
        let mut processed = raw;
        process_logits(&mut processed, &at);
        let (token, accepted) = match draft.get(j) {
            None => (target_token(&processed, &at), false),
            Some(&d) => match forced {
                Some(share) => {
                    if f64::from(uniform(at.seed ^ FORCED_STREAM, at.draw_index)) < share {
                        (d, true)
                    } else {
                        (target_token(&processed, &at), false)
                    }
                }
                // The standard rule for a point-mass proposal (see the module documentation):
                // the target's own draw, accepted when it is the proposal.
                None => {
                    let t = target_token(&processed, &at);
                    (t, t == d)
                }
            },
        };
        let logprob = match (spec.logprobs, table) {
            (Some(k), Some(table)) => Some(TokenLogprob {
                logprob: table[token as usize],
                top: top_k_entries(&table, k as usize),
            }),
            _ => None,
        };
        tokens.push(SampledToken { token, logprob });
        if !accepted {
            break;
        }
        output.push(token);
    }
    Verified {
        accepted: tokens.len() - 1,
        tokens,
    }
}

/// [`verify_row`] from the target's own token at every position, sampled by the backend with
/// the specs [`verify_row`] would use (`targets`: `draft.len() + 1` of them, with their
/// logprobs when the row asked for them). In the forced test mode a proposal accepted against
/// the target's choice has no logprob (the backend computed the target's).
pub fn verify_sampled(
    targets: Vec<SampledToken>,
    draft: &[u32],
    spec: &SampleSpec<'_>,
    forced: Option<f64>,
) -> Verified {
    debug_assert_eq!(targets.len(), draft.len() + 1);
    let mut tokens = Vec::with_capacity(targets.len());
    for (j, target) in targets.into_iter().enumerate() {
        let draw = spec.draw_index + j as u64;
        let (token, accepted) = match draft.get(j) {
            None => (target, false),
            Some(&d) => match forced {
                Some(share) if f64::from(uniform(spec.seed ^ FORCED_STREAM, draw)) < share => {
                    let logprob = target.logprob.filter(|_| target.token == d);
                    (SampledToken { token: d, logprob }, true)
                }
                Some(_) => (target, false),
                None => {
                    let accepted = target.token == d;
                    (target, accepted)
                }
            },
        };
        tokens.push(token);
        if !accepted {
            break;
        }
    }
    Verified {
        accepted: tokens.len() - 1,
        tokens,
    }
}
