//! The dense f32 kernels of the CPU backend, parallelised with rayon.

use rayon::prelude::*;

/// Output features computed per rayon task.
const FEATURES_PER_TASK: usize = 16;

/// Dot product with eight independent accumulators, so the compiler can vectorise it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `y[t][o] = Σ_i x[t][i] · w[o][i]` for `tokens` rows of `x` and a `[out, in]` weight matrix
/// (the Hugging Face layout), parallel over output features.
pub fn matmul(x: &[f32], w: &[f32], tokens: usize, inp: usize, out: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), tokens * inp);
    debug_assert_eq!(w.len(), out * inp);
    if tokens == 0 {
        return Vec::new();
    }
    // Feature-major scratch: each task owns whole features, so writes never interleave.
    let mut by_feature = vec![0.0f32; out * tokens];
    by_feature
        .par_chunks_mut(tokens * FEATURES_PER_TASK)
        .enumerate()
        .for_each(|(task, chunk)| {
            for (k, column) in chunk.chunks_mut(tokens).enumerate() {
                let o = task * FEATURES_PER_TASK + k;
                let row = &w[o * inp..(o + 1) * inp];
                for (t, y) in column.iter_mut().enumerate() {
                    *y = dot(&x[t * inp..(t + 1) * inp], row);
                }
            }
        });
    if tokens == 1 {
        return by_feature;
    }
    let mut y = vec![0.0f32; tokens * out];
    y.par_chunks_mut(out).enumerate().for_each(|(t, row)| {
        for (o, v) in row.iter_mut().enumerate() {
            *v = by_feature[o * tokens + t];
        }
    });
    y
}

/// RMSNorm of each `width`-wide row of `x`, scaled by `weight` (computed as transformers does:
/// `x · rsqrt(mean(x²) + eps) · weight`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let width = weight.len();
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(out, row)| {
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
            let scale = 1.0 / (mean_sq + eps).sqrt();
            for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
                *o = w * (v * scale);
            }
        });
    y
}

/// Adds `bias` to each row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `x += y`, elementwise.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.par_iter_mut()
        .zip(y.par_iter())
        .for_each(|(a, b)| *a += b);
}

/// Rotates each `head_dim`-wide head of a token's row by its position (the "rotate half"
/// convention of transformers: dimension `i` pairs with `i + head_dim / 2`).
pub fn rope(row: &mut [f32], head_dim: usize, position: usize, inv_freqs: &[f32]) {
    let half = head_dim / 2;
    for head in row.chunks_mut(head_dim) {
        for (i, &freq) in inv_freqs.iter().enumerate().take(half) {
            let angle = position as f32 * freq;
            let (sin, cos) = angle.sin_cos();
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * cos - x2 * sin;
            head[i + half] = x2 * cos + x1 * sin;
        }
    }
}

/// `silu(gate) · up`, elementwise, into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    gate.par_iter_mut().zip(up.par_iter()).for_each(|(g, u)| {
        *g = *g / (1.0 + (-*g).exp()) * u;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_the_naive_product() {
        let (t, i, o) = (3, 19, 37);
        let x: Vec<f32> = (0..t * i).map(|v| (v as f32 * 0.31).sin()).collect();
        let w: Vec<f32> = (0..o * i).map(|v| (v as f32 * 0.17).cos()).collect();
        let y = matmul(&x, &w, t, i, o);
        for tt in 0..t {
            for oo in 0..o {
                let want: f32 = (0..i).map(|k| x[tt * i + k] * w[oo * i + k]).sum();
                assert!((y[tt * o + oo] - want).abs() < 1e-4, "({tt},{oo})");
            }
        }
    }

    #[test]
    fn rms_norm_normalises_rows() {
        let y = rms_norm(&[3.0, 4.0, 0.0, 0.0, 1.0, 1.0], &[1.0, 2.0, 1.0], 0.0);
        let scale = 1.0 / (25.0f32 / 3.0).sqrt();
        assert!((y[0] - 3.0 * scale).abs() < 1e-6 && (y[1] - 8.0 * scale).abs() < 1e-6);
        assert!((y[4] - 2.0 * (1.0 / (2.0f32 / 3.0).sqrt())).abs() < 1e-6);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let mut row = vec![1.0, 2.0, 3.0, 4.0];
        rope(&mut row, 4, 0, &[1.0, 0.5]);
        assert_eq!(row, vec![1.0, 2.0, 3.0, 4.0]);
        rope(&mut row, 4, 7, &[1.0, 0.5]);
        let norm: f32 = row.iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-4);
    }
}
