//! gpt-oss's mixture of experts on the CPU, as transformers computes it: the router's biased
//! logits, the top k of them and a softmax over those k, then for each chosen expert its biased
//! gate/up projection (interleaved), the clamped SwiGLU, its biased down projection, weighted and
//! added in expert order.

use rayon::prelude::*;

use crate::model::gpt_oss::{ExpertProjection, GptOssMoeTensors};
use crate::model::{ModelError, ModelWeights, Routing};

use super::math;
use super::moe::{boundary_gap, route};
use super::weights::Linear;

/// One projection of every expert in f32, `[E, out, in]`, with its biases `[E, out]`.
#[derive(Debug)]
pub struct BiasedExperts {
    /// The matrices, row-major `[E, out, in]`.
    pub weight: Vec<f32>,
    /// The biases, `[E, out]`.
    pub bias: Vec<f32>,
    /// Input features.
    pub inp: usize,
    /// Output features.
    pub out: usize,
}

impl BiasedExperts {
    /// Dequantizes (MXFP4) or transposes (the input-major layout) `spec`'s tensors.
    fn load(weights: &ModelWeights, spec: &ExpertProjection) -> Result<Self, ModelError> {
        let [_, out, inp] = spec.shape;
        Ok(Self {
            weight: spec.to_f32(weights)?,
            bias: weights.to_f32(&spec.bias.name, &spec.bias.shape)?,
            inp,
            out,
        })
    }

    /// `x · W_eᵀ + b_e` for `tokens` rows of `x` and expert `e`.
    fn apply(&self, e: usize, x: &[f32], tokens: usize) -> Vec<f32> {
        let size = self.out * self.inp;
        let mut y = math::matmul(
            x,
            &self.weight[e * size..(e + 1) * size],
            tokens,
            self.inp,
            self.out,
        );
        math::add_bias(&mut y, &self.bias[e * self.out..(e + 1) * self.out]);
        y
    }
}

/// A gpt-oss MLP's weights in f32.
#[derive(Debug)]
pub struct GptOssMoeWeights {
    /// The router, `[E, hidden]`, without its bias.
    pub router: Linear,
    /// The router's bias, `[E]`.
    pub router_bias: Vec<f32>,
    /// Gate and up, interleaved: `[E, 2·I, hidden]`.
    pub gate_up: BiasedExperts,
    /// Down: `[E, hidden, I]`.
    pub down: BiasedExperts,
}

impl GptOssMoeWeights {
    /// Converts the MLP's tensors, `router` already loaded.
    pub fn load(
        weights: &ModelWeights,
        tensors: &GptOssMoeTensors,
        router: Linear,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            router,
            router_bias: weights.to_f32(&tensors.router_bias.name, &tensors.router_bias.shape)?,
            gate_up: BiasedExperts::load(weights, &tensors.gate_up)?,
            down: BiasedExperts::load(weights, &tensors.down)?,
        })
    }
}

/// gpt-oss's SwiGLU of one interleaved gate/up row into `out` (half its width):
/// `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`.
pub fn clamped_swiglu(gate_up: &[f32], out: &mut [f32], alpha: f32, limit: f32) {
    for (o, pair) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
        let gate = pair[0].min(limit);
        let up = pair[1].clamp(-limit, limit);
        let glu = gate * (1.0 / (1.0 + (-(gate * alpha)).exp()));
        *o = (up + 1.0) * glu;
    }
}

/// The mixture's output for `tokens` rows of `x` (each `hidden` wide). Each token's
/// [`boundary_gap`] over the biased router logits lowers its entry of `gaps` where smaller.
pub fn apply(
    w: &GptOssMoeWeights,
    routing: Routing,
    [alpha, limit]: [f32; 2],
    x: &[f32],
    (tokens, hidden): (usize, usize),
    gaps: &mut [f32],
) -> Vec<f32> {
    let num_experts = w.router_bias.len();
    let mut logits = w.router.apply(x, tokens);
    math::add_bias(&mut logits, &w.router_bias);
    let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
    for ((t, row), gap) in logits.chunks(num_experts).enumerate().zip(gaps) {
        let chosen = route(row, routing);
        let experts: Vec<usize> = chosen.iter().map(|&(e, _)| e).collect();
        *gap = gap.min(boundary_gap(row, &experts));
        for (e, weight) in chosen {
            routed[e].push((t, weight));
        }
    }
    let inter = w.gate_up.out / 2;
    let mut out = vec![0.0f32; tokens * hidden];
    for (e, rows) in routed.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let n = rows.len();
        let gathered: Vec<f32> = rows
            .iter()
            .flat_map(|&(t, _)| x[t * hidden..(t + 1) * hidden].iter().copied())
            .collect();
        let gate_up = w.gate_up.apply(e, &gathered, n);
        let mut act = vec![0.0f32; n * inter];
        act.par_chunks_mut(inter)
            .zip(gate_up.par_chunks(2 * inter))
            .for_each(|(o, gu)| clamped_swiglu(gu, o, alpha, limit));
        let y = w.down.apply(e, &act, n);
        for (&(t, weight), row) in rows.iter().zip(y.chunks(hidden)) {
            for (o, v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(row) {
                *o += v * weight;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        // (gate, up) pairs: inside the limit, gate above it, up below and above it.
        let gate_up = [1.0, 2.0, 9.0, 0.5, -3.0, -8.0, 0.25, 10.0];
        let mut out = [0.0f32; 4];
        clamped_swiglu(&gate_up, &mut out, 1.702, 7.0);
        let want = [
            3.0 * sig(1.702),
            1.5 * 7.0 * sig(7.0 * 1.702),
            -6.0 * -3.0 * sig(-3.0 * 1.702),
            8.0 * 0.25 * sig(0.25 * 1.702),
        ];
        for (got, want) in out.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        // A very negative gate is not clamped from below: its output goes to zero.
        let mut out = [1.0f32];
        clamped_swiglu(&[-100.0, 3.0], &mut out, 1.702, 7.0);
        assert!(out[0].abs() < 1e-30);
    }
}
