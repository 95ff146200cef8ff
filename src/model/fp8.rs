//! FP8 E4M3 (the OCP `e4m3fn` format the H100's tensor cores read): conversions, and the scaling
//! schemes of the published FP8 checkpoints, applied on the host (the CPU backend computes with
//! the dequantized values, which is exactly what an FP8 product multiplies).
//!
//! E4M3 has 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, one NaN pattern per
//! sign (`S.1111.111`), and ±448 as its largest finite values.

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The smallest scale a dynamic quantization uses, so an all-zero row divides by no zero (the
/// same floor as vLLM's: 1 / (448 · 512)).
pub const MIN_DYNAMIC_SCALE: f32 = 1.0 / (E4M3_MAX * 512.0);

/// Widens an E4M3 byte to f32 (exact for every code).
pub fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((byte >> 3) & 0x0f);
    let mantissa = f32::from(byte & 0x07);
    if exponent == 0x0f && byte & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exponent == 0 {
        mantissa / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
    };
    sign * magnitude
}

/// The 127 non-negative finite E4M3 values, by code (code `i` is `POSITIVE[i]`).
fn positive_values() -> &'static [f32; 127] {
    static TABLE: std::sync::OnceLock<[f32; 127]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|code| e4m3_to_f32(code as u8)))
}

/// Rounds `x` to the nearest E4M3 value (ties to the even code), saturating at ±448; NaN stays
/// NaN. The value returned is the E4M3 byte.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let magnitude = x.abs().min(E4M3_MAX);
    let table = positive_values();
    // The first code whose value is at least the magnitude.
    let upper = table.partition_point(|&v| v < magnitude);
    let code = if upper == 0 {
        0
    } else if upper == table.len() {
        table.len() - 1
    } else {
        let (below, above) = (table[upper - 1], table[upper]);
        let (to_below, to_above) = (magnitude - below, above - magnitude);
        if to_below < to_above || (to_below == to_above && (upper - 1) % 2 == 0) {
            upper - 1
        } else {
            upper
        }
    };
    sign | code as u8
}

/// `x` rounded to E4M3 and widened back: the value an FP8 tensor holds for `x`.
pub fn round_to_e4m3(x: f32) -> f32 {
    e4m3_to_f32(f32_to_e4m3(x))
}

/// How a weight matrix's scales are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightScale {
    /// One scale for the whole matrix.
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per `[rows, cols]` block of the matrix (the last blocks may be partial).
    Block {
        /// Block height (output rows).
        rows: usize,
        /// Block width (input columns).
        cols: usize,
    },
}

impl WeightScale {
    /// The shape of the scale tensor of an `[out, in]` matrix, as checkpoints store it.
    pub fn scale_shape(self, out: usize, inp: usize) -> Vec<usize> {
        match self {
            Self::Tensor => vec![1],
            Self::Channel => vec![out, 1],
            Self::Block { rows, cols } => vec![out.div_ceil(rows), inp.div_ceil(cols)],
        }
    }

    /// How many scales an `[out, in]` matrix has.
    fn scale_count(self, out: usize, inp: usize) -> usize {
        match self {
            Self::Tensor => 1,
            Self::Channel => out,
            Self::Block { rows, cols } => out.div_ceil(rows) * inp.div_ceil(cols),
        }
    }

    /// The index of the scale of element `(row, col)` of a matrix `inp` columns wide.
    fn scale_index(self, row: usize, col: usize, inp: usize) -> usize {
        match self {
            Self::Tensor => 0,
            Self::Channel => row,
            Self::Block { rows, cols } => (row / rows) * inp.div_ceil(cols) + col / cols,
        }
    }

    /// The `[out, in]` matrix whose E4M3 `values` (widened to f32, unscaled) are multiplied by
    /// their `scales`.
    pub fn dequantize(self, values: &[f32], scales: &[f32], inp: usize) -> Vec<f32> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| v * scales[self.scale_index(i / inp, i % inp, inp)])
            .collect()
    }

    /// Quantizes the `[out, in]` matrix `weights` with this layout of scales (each scale the
    /// largest magnitude it covers over 448): the E4M3 values (widened to f32, unscaled) and the
    /// scales.
    pub fn quantize(self, weights: &[f32], out: usize, inp: usize) -> (Vec<f32>, Vec<f32>) {
        let mut amax = vec![0f32; self.scale_count(out, inp)];
        for (i, w) in weights.iter().enumerate() {
            let g = self.scale_index(i / inp, i % inp, inp);
            amax[g] = amax[g].max(w.abs());
        }
        let scales: Vec<f32> = amax
            .iter()
            .map(|a| (a / E4M3_MAX).max(MIN_DYNAMIC_SCALE))
            .collect();
        let values = weights
            .iter()
            .enumerate()
            .map(|(i, w)| round_to_e4m3(w / scales[self.scale_index(i / inp, i % inp, inp)]))
            .collect();
        (values, scales)
    }
}

/// How the input of an FP8 product is quantized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ActivationScale {
    /// Not at all: the activations stay in 16 bits and the weights are widened (weight-only FP8).
    None,
    /// One scale per token, from the token's largest magnitude (capped at `upper_bound` when
    /// given: fbgemm's `activation_scale_ub`).
    DynamicPerToken {
        /// The cap on the largest magnitude a scale is computed from.
        upper_bound: Option<f32>,
    },
    /// One scale per token and group of `group` consecutive features (block-wise FP8).
    DynamicPerTokenGroup {
        /// Features per group.
        group: usize,
    },
    /// One scale for every token, fixed by the checkpoint (`input_scale`).
    StaticPerTensor,
}

impl ActivationScale {
    /// Rounds `x` (`tokens` rows) in place to what an FP8 product reads under this scheme:
    /// each value divided by its scale, rounded to E4M3 and multiplied back. `input_scale` is
    /// the checkpoint's static scale (used only by [`ActivationScale::StaticPerTensor`]).
    pub fn apply(self, x: &mut [f32], tokens: usize, input_scale: Option<f32>) {
        if tokens == 0 {
            return;
        }
        let width = x.len() / tokens;
        match self {
            Self::None => {}
            Self::DynamicPerToken { upper_bound } => {
                for row in x.chunks_exact_mut(width) {
                    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let amax = upper_bound.map_or(amax, |ub| amax.min(ub));
                    round_with_scale(row, (amax / E4M3_MAX).max(MIN_DYNAMIC_SCALE));
                }
            }
            Self::DynamicPerTokenGroup { group } => {
                for row in x.chunks_exact_mut(width) {
                    for chunk in row.chunks_mut(group.max(1)) {
                        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                        round_with_scale(chunk, (amax / E4M3_MAX).max(MIN_DYNAMIC_SCALE));
                    }
                }
            }
            Self::StaticPerTensor => round_with_scale(x, input_scale.unwrap_or(1.0)),
        }
    }
}

/// Each value of `x` divided by `scale`, rounded to E4M3 (saturating) and multiplied back.
fn round_with_scale(x: &mut [f32], scale: f32) {
    for v in x {
        *v = round_to_e4m3(*v / scale) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=u8::MAX {
            let value = e4m3_to_f32(code);
            if value.is_nan() {
                assert_eq!(code & 0x7f, 0x7f, "{code:#04x}");
                continue;
            }
            // Negative zero comes back as itself; every other code too.
            assert_eq!(f32_to_e4m3(value), code, "{code:#04x} = {value}");
        }
    }

    #[test]
    fn known_values_and_saturation() {
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0xc0), -2.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        // 1.0625 lies halfway between 1.0 (code 0x38) and 1.125 (0x39): the even code wins.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.1875 lies halfway between 1.125 (0x39) and 1.25 (0x3a).
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00);
        assert_eq!(round_to_e4m3(0.3), 0.3125);
    }

    #[test]
    fn weight_scales_dequantize_by_layout() {
        let codes = [1.0, 2.0, 1.0, 2.0, 1.0, 2.0];
        let channel = WeightScale::Channel.dequantize(&codes, &[0.5, 2.0], 3);
        assert_eq!(channel, vec![0.5, 1.0, 0.5, 4.0, 2.0, 4.0]);
        let tensor = WeightScale::Tensor.dequantize(&codes, &[3.0], 3);
        assert_eq!(tensor, vec![3.0, 6.0, 3.0, 6.0, 3.0, 6.0]);
        let block = WeightScale::Block { rows: 1, cols: 2 };
        assert_eq!(block.scale_shape(2, 3), vec![2, 2]);
        let blocked = block.dequantize(&codes, &[1.0, 10.0, 2.0, 20.0], 3);
        assert_eq!(blocked, vec![1.0, 2.0, 10.0, 4.0, 2.0, 40.0]);
    }

    #[test]
    fn quantizing_weights_keeps_each_group_within_its_scale() {
        let weights: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.37)
            .collect();
        for layout in [
            WeightScale::Tensor,
            WeightScale::Channel,
            WeightScale::Block { rows: 3, cols: 5 },
        ] {
            let (values, scales) = layout.quantize(&weights, 8, 8);
            let back = layout.dequantize(&values, &scales, 8);
            for (w, b) in weights.iter().zip(&back) {
                // E4M3 keeps 3 mantissa bits: a relative error of at most 1/16 (plus subnormals).
                assert!(
                    (w - b).abs() <= w.abs() / 16.0 + 1e-3,
                    "{layout:?}: {w} -> {b}"
                );
            }
            // Each group's largest magnitude maps to 448 exactly.
            assert!(values.iter().any(|v| v.abs() == E4M3_MAX), "{layout:?}");
        }
    }

    #[test]
    fn activation_schemes_round_per_token_or_group() {
        let mut x = vec![1.0, -448.0, 0.3, 100.0, 0.0, 0.0, 0.0, 0.0];
        ActivationScale::DynamicPerToken { upper_bound: None }.apply(&mut x, 2, None);
        assert_eq!(x[1], -448.0);
        assert_eq!(x[0], 1.0);
        // 0.3 in a row scaled by 1 rounds to E4M3.
        assert_eq!(x[2], round_to_e4m3(0.3));
        assert!(
            x[4..].iter().all(|v| *v == 0.0),
            "an all-zero token stays zero"
        );

        // Capped: values beyond the bound saturate.
        let mut capped = vec![1000.0, 1.0];
        ActivationScale::DynamicPerToken {
            upper_bound: Some(448.0),
        }
        .apply(&mut capped, 1, None);
        assert_eq!(capped, vec![448.0, 1.0]);

        let mut grouped = vec![448.0, 1.0, 0.001, 0.002];
        ActivationScale::DynamicPerTokenGroup { group: 2 }.apply(&mut grouped, 1, None);
        assert_eq!(grouped[..2], [448.0, 1.0]);
        assert!((grouped[3] - 0.002).abs() < 1e-9);

        let mut fixed = vec![3.3];
        ActivationScale::StaticPerTensor.apply(&mut fixed, 1, Some(0.5));
        assert_eq!(fixed, vec![3.25]);
        let mut untouched = vec![0.123];
        ActivationScale::None.apply(&mut untouched, 1, None);
        assert_eq!(untouched, vec![0.123]);
    }
}
