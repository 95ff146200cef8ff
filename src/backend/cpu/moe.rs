//! The mixture-of-experts MLP on the CPU, as transformers computes it: the router's logits, the
//! routing rule per token, each chosen expert's SwiGLU over the tokens routed to it, and the
//! routing-weighted sum of their outputs, added in expert order; then, with a shared expert, its
//! output scaled by the sigmoid of its gate.

use crate::model::{MoeDefinition, Routing};

use super::math;
use super::topk::topk;
use super::weights::MoeWeights;

/// The experts a token uses, each with its weight, in the order `torch.topk` returns them.
pub fn route(logits: &[f32], routing: Routing) -> Vec<(usize, f32)> {
    match routing {
        Routing::SoftmaxTopK { top_k, renormalize } => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            let probs: Vec<f32> = exps.iter().map(|&e| e / sum).collect();
            let chosen = topk(&probs, top_k);
            let total: f32 = chosen.iter().map(|&e| probs[e]).sum();
            chosen
                .into_iter()
                .map(|e| {
                    let weight = if renormalize {
                        probs[e] / total
                    } else {
                        probs[e]
                    };
                    (e, weight)
                })
                .collect()
        }
        Routing::TopKSoftmax { top_k } => {
            let chosen = topk(logits, top_k);
            let max = chosen
                .iter()
                .map(|&e| logits[e])
                .fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = chosen.iter().map(|&e| (logits[e] - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            chosen
                .into_iter()
                .zip(exps)
                .map(|(e, x)| (e, x / sum))
                .collect()
        }
    }
}

/// How far a token's routing is from changing: the smallest gap between the router logit of a
/// chosen expert (`chosen`) and that of one left out, leaving out exact ties (equal logits, which
/// the tie order decides the same way wherever they are computed alike); infinity when no
/// logit differs across the boundary. A choice whose gap is below another implementation's
/// rounding of the logits may legitimately differ there.
pub fn boundary_gap(logits: &[f32], chosen: &[usize]) -> f32 {
    let left_out = (0..logits.len()).filter(|e| !chosen.contains(e));
    left_out
        .flat_map(|out| chosen.iter().map(move |&c| (logits[c] - logits[out]).abs()))
        .filter(|&gap| gap > 0.0)
        .fold(f32::INFINITY, f32::min)
}

/// The mixture's output for `tokens` rows of `x` (each `hidden` wide). Each token's
/// [`boundary_gap`] lowers its entry of `gaps` where smaller.
pub fn apply(
    moe: &MoeDefinition,
    w: &MoeWeights,
    x: &[f32],
    tokens: usize,
    hidden: usize,
    gaps: &mut [f32],
) -> Vec<f32> {
    let logits = w.router.apply(x, tokens);
    // For each expert, the tokens routed to it and their weights, in token order.
    let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); moe.num_experts];
    for ((t, row), gap) in logits.chunks(moe.num_experts).enumerate().zip(gaps) {
        let chosen = route(row, moe.routing);
        let experts: Vec<usize> = chosen.iter().map(|&(e, _)| e).collect();
        *gap = gap.min(boundary_gap(row, &experts));
        for (e, weight) in chosen {
            routed[e].push((t, weight));
        }
    }
    let mut out = vec![0.0f32; tokens * hidden];
    for (e, rows) in routed.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let n = rows.len();
        let gathered: Vec<f32> = rows
            .iter()
            .flat_map(|&(t, _)| x[t * hidden..(t + 1) * hidden].iter().copied())
            .collect();
        let mut gate = w.gate_proj.apply(e, &gathered, n);
        let up = w.up_proj.apply(e, &gathered, n);
        math::swiglu(&mut gate, &up);
        let y = w.down_proj.apply(e, &gate, n);
        for (&(t, weight), row) in rows.iter().zip(y.chunks(hidden)) {
            for (o, v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(row) {
                *o += v * weight;
            }
        }
    }
    if let Some(([gate_proj, up_proj, down_proj], shared_gate)) = &w.shared_expert {
        let mut gate = gate_proj.apply(x, tokens);
        let up = up_proj.apply(x, tokens);
        math::swiglu(&mut gate, &up);
        let y = down_proj.apply(&gate, tokens);
        let scales = shared_gate.apply(x, tokens);
        for ((row, shared), &scale) in out.chunks_mut(hidden).zip(y.chunks(hidden)).zip(&scales) {
            let scale = 1.0 / (1.0 + (-scale).exp());
            for (o, v) in row.iter_mut().zip(shared) {
                *o += scale * v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_then_top_k_with_and_without_renormalisation() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let exps: Vec<f32> = logits.iter().map(|l| (l - 3.0f32).exp()).collect();
        let sum: f32 = exps.iter().sum();
        let plain = route(
            &logits,
            Routing::SoftmaxTopK {
                top_k: 2,
                renormalize: false,
            },
        );
        assert_eq!(plain.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((plain[0].1 - exps[1] / sum).abs() < 1e-7);
        assert!((plain[1].1 - exps[2] / sum).abs() < 1e-7);
        let renormalised = route(
            &logits,
            Routing::SoftmaxTopK {
                top_k: 2,
                renormalize: true,
            },
        );
        let total: f32 = renormalised.iter().map(|r| r.1).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((renormalised[0].1 / renormalised[1].1 - 1.0f32.exp()).abs() < 1e-5);
    }

    #[test]
    fn the_boundary_gap_is_the_nearest_logit_across_the_boundary_ties_left_out() {
        // Chosen 1 (3.0) and 4 (2.5); left out 2 (2.25), 0 and 3.
        assert_eq!(boundary_gap(&[1.0, 3.0, 2.25, 0.0, 2.5], &[1, 4]), 0.25);
        // An exact tie at the boundary (experts 4 and 2 at 2.5) does not count; the next gap
        // across it does (expert 1 over expert 2).
        assert_eq!(boundary_gap(&[1.0, 3.0, 2.5, 0.0, 2.5], &[1, 4]), 0.5);
        assert_eq!(boundary_gap(&[1.0, 2.5, 2.5, 0.0], &[1]), 1.5);
        // Nothing differs across the boundary, or nothing is left out.
        assert_eq!(boundary_gap(&[2.0, 2.0, 2.0], &[0]), f32::INFINITY);
        assert_eq!(boundary_gap(&[1.0, 2.0], &[0, 1]), f32::INFINITY);
    }

    #[test]
    fn top_k_then_softmax_over_the_chosen_logits() {
        let logits = [1.0f32, 3.0, 2.0, 0.0, 2.5];
        let chosen = route(&logits, Routing::TopKSoftmax { top_k: 3 });
        assert_eq!(
            chosen.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![1, 4, 2]
        );
        let sum = 1.0 + (-0.5f32).exp() + (-1.0f32).exp();
        assert!((chosen[0].1 - 1.0 / sum).abs() < 1e-7);
        assert!((chosen[1].1 - (-0.5f32).exp() / sum).abs() < 1e-7);
        assert!((chosen[2].1 - (-1.0f32).exp() / sum).abs() < 1e-7);
    }
}
