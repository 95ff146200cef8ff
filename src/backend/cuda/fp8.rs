//! FP8 projections on the device, host side: the E4M3 values and their scales in the layout the
//! FP8 kernels (`kernels/fp8.cu`) and cuBLASLt read, built from a checkpoint's values and scales
//! or quantized at load from a 16-bit checkpoint.
//!
//! On the device every FP8 projection is its `[out, in]` E4M3 bytes and an f32 scale per row and
//! group of `group` input columns (`groups` of them per row): one group per row for per-tensor
//! (the scale repeated) and per-channel scales, ⌈in / c⌉ groups of `c` columns for `[r, c]`
//! blocks (each row repeats its block row's scales). Rows of stacked projections (q/k/v,
//! gate/up) are then simply concatenated, whatever their block alignment.

use rayon::prelude::*;

use crate::model::fp8::{ActivationScale, E4M3_MAX, MIN_DYNAMIC_SCALE, WeightScale};
use crate::model::weights::{DType, TensorView, bf16_to_f32, f16_to_f32};

/// The most threads of `fp8_quantize_input`'s and `fp8_swiglu_quantize`'s blocks
/// (`FP8_QUANT_THREADS` in `kernels/fp8.cu`).
pub const QUANT_THREADS: u32 = 1024;

/// Threads of an input quantization block (`fp8_quantize_input`, `fp8_swiglu_quantize`) over
/// groups of `width` columns (a row's width for one scale per token): enough warps to cover a
/// group once, at most [`QUANT_THREADS`] (at decode one block per token is the whole launch, so
/// its threads set its latency).
pub fn quant_threads(width: usize) -> u32 {
    (width.max(1).next_multiple_of(32) as u32).min(QUANT_THREADS)
}

/// Blocks per token and group of an input quantization (`fp8_quantize_input`'s `gridDim.z`)
/// over groups of `width` columns in a step of `m` rows: for a decode step's rows (at most
/// `plan::GEMV_MAX_M`) one per 2 values a thread of [`quant_threads`], so a wide row (the down
/// product's 14,336 values) is not quantized by one block while the GPU idles (each block reads
/// the whole group for its scale, from L2); one for longer steps, whose rows fill the GPU.
pub fn quant_chunks(width: usize, m: usize) -> usize {
    if m > crate::backend::cuda::plan::GEMV_MAX_M {
        return 1;
    }
    width.div_ceil(2 * quant_threads(width) as usize).max(1)
}

/// The most warps per block of the FP8 small-M kernels (`FP8_GEMV_MAX_WARPS`).
pub const GEMV_MAX_WARPS: usize = 8;

/// Weight columns one step of an FP8 small-M warp covers (32 lanes × 16 bytes).
const GEMV_STEP: usize = 512;

/// The launch of an FP8 small-M product (`fp8_gemv_mM` / `fp8_gemv_r4_mM` in `kernels/fp8.cu`):
/// blocks of `warps` warps, each `warps / splits` row groups of `rows` weight rows whose
/// `splits` warps divide K between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvGeometry {
    /// Weight rows per row group: 2 (`fp8_gemv_mM`) or 4 (`fp8_gemv_r4_mM`).
    pub rows: usize,
    /// Warps per block, at most [`GEMV_MAX_WARPS`].
    pub warps: usize,
    /// Warps of a row group, each taking every `splits`-th step of K; divides `warps`.
    pub splits: usize,
}

impl GemvGeometry {
    /// The geometry for an `[m, k] · [n, k]ᵀ` product: row groups of 4 rows in blocks of 4
    /// warps, K split 2 ways (at most one way per 512-column step), 1 way from 8 rows of x on.
    /// Measured on an H100 over every geometry (`scripts/fp8-check.cu`, 8B decode shapes, call A
    /// of 2026-12-07): this was the fastest or within 3% of it for q/k/v, o, gate/up and down
    /// at M = 1, 2, 4 and 8 (splits 1 at M = 8).
    pub fn choose(m: usize, _n: usize, k: usize, _sms: usize) -> Self {
        let splits = if m >= 8 { 1 } else { 2 };
        Self {
            rows: 4,
            warps: GEMV_MAX_WARPS.min(4),
            splits: splits.min(k.div_ceil(GEMV_STEP)).max(1),
        }
    }

    /// Blocks of a launch over `n` weight rows.
    pub fn blocks(&self, n: usize) -> usize {
        n.div_ceil(self.rows * self.warps / self.splits)
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.warps * 32) as u32
    }

    /// The index of the kernel for `m` rows of x in `FP8_GEMV_ENTRIES`.
    pub fn entry(&self, m: usize) -> usize {
        let family = if self.rows == 4 { 1 } else { 0 };
        family * crate::backend::cuda::plan::GEMV_MAX_M + m - 1
    }
}

/// Rounds `x` to E4M3 by its bits (nearest, ties to the even code, saturating at ±448, NaN to
/// `0x7f`): the same code as [`crate::model::fp8::f32_to_e4m3`], at a fraction of its cost (a
/// checkpoint quantized at load converts billions of values), and the same arithmetic as
/// `f32_to_e4m3` in `kernels/fp8.cu`.
pub fn f32_to_e4m3_fast(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let magnitude = x.abs();
    if magnitude >= E4M3_MAX {
        return sign | 0x7e;
    }
    if magnitude < 2f32.powi(-6) {
        // Subnormal codes are multiples of 2^-9: scaling by 2^9 is exact, the rounding is
        // nearest-even on the integer.
        return sign | (magnitude * 512.0).round_ties_even() as u8;
    }
    let bits = magnitude.to_bits();
    let exponent = (bits >> 23) - 120;
    let mantissa = (bits >> 20) & 7;
    let rest = bits & 0xf_ffff;
    let mut code = (exponent << 3) | mantissa;
    if rest > 0x8_0000 || (rest == 0x8_0000 && mantissa & 1 == 1) {
        code += 1;
    }
    sign | code as u8
}

/// An FP8 projection's scales as the device reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceScales {
    /// `[rows, groups]` f32 scales.
    pub scales: Vec<f32>,
    /// Scales per row.
    pub groups: usize,
    /// Input columns per scale (the row's width when `groups` is 1).
    pub group: usize,
}

impl DeviceScales {
    /// The device layout of a checkpoint's `scales` in `layout` for an `[out, inp]` matrix.
    pub fn from_checkpoint(layout: WeightScale, scales: &[f32], out: usize, inp: usize) -> Self {
        match layout {
            WeightScale::Tensor => Self {
                scales: vec![scales[0]; out],
                groups: 1,
                group: inp,
            },
            WeightScale::Channel => Self {
                scales: scales[..out].to_vec(),
                groups: 1,
                group: inp,
            },
            WeightScale::Block { rows, cols } => {
                let groups = inp.div_ceil(cols);
                let scales = (0..out)
                    .flat_map(|row| {
                        let first = (row / rows) * groups;
                        scales[first..first + groups].iter().copied()
                    })
                    .collect();
                Self {
                    scales,
                    groups,
                    group: cols,
                }
            }
        }
    }

    /// The scales of `parts` stacked row after row; `None` when their groups differ.
    pub fn stack(parts: &[DeviceScales]) -> Option<Self> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.groups != first.groups || p.group != first.group)
        {
            return None;
        }
        Some(Self {
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
            groups: first.groups,
            group: first.group,
        })
    }
}

/// The 16-bit (or f32) `[out, inp]` matrix `view` quantized per channel, as
/// `WeightScale::Channel.quantize` does (each row's largest magnitude over 448, at least
/// [`MIN_DYNAMIC_SCALE`]): its E4M3 bytes and the per-row scales. Rows run in parallel.
pub fn quantize_per_channel(view: &TensorView<'_>, out: usize, inp: usize) -> (Vec<u8>, Vec<f32>) {
    let width = view.dtype.size();
    let value = |bytes: &[u8]| match view.dtype {
        DType::BF16 => bf16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])),
        DType::F16 => f16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])),
        DType::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        DType::F8E4M3 => crate::model::fp8::e4m3_to_f32(bytes[0]),
    };
    let mut codes = vec![0u8; out * inp];
    let mut scales = vec![0f32; out];
    codes
        .par_chunks_mut(inp.max(1))
        .zip(scales.par_iter_mut())
        .zip(view.data.par_chunks(inp.max(1) * width))
        .for_each(|((codes, scale), row)| {
            let amax = row
                .chunks_exact(width)
                .fold(0f32, |m, b| m.max(value(b).abs()));
            *scale = (amax / E4M3_MAX).max(MIN_DYNAMIC_SCALE);
            for (code, b) in codes.iter_mut().zip(row.chunks_exact(width)) {
                *code = f32_to_e4m3_fast(value(b) / *scale);
            }
        });
    (codes, scales)
}

/// How an FP8 product's input is quantized on the device (`fp8_quantize_input` in
/// `kernels/fp8.cu`): its arguments, or `None` for weight-only FP8 (the input stays bf16).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InputQuantization {
    /// Columns per scale; 0: one scale per token.
    pub group: usize,
    /// The cap on a token's largest magnitude (fbgemm's `activation_scale_ub`); 0: none.
    pub upper_bound: f32,
    /// The static scale (`input_scale`); 0: dynamic.
    pub static_scale: f32,
}

impl InputQuantization {
    /// The device's quantization of a product's input under `scheme`; `input_scale` is the
    /// static scale where the scheme has one (the largest of the stacked projections').
    pub fn of(scheme: ActivationScale, input_scale: Option<f32>) -> Option<Self> {
        match scheme {
            ActivationScale::None => None,
            ActivationScale::DynamicPerToken { upper_bound } => Some(Self {
                group: 0,
                upper_bound: upper_bound.unwrap_or(0.0),
                static_scale: 0.0,
            }),
            ActivationScale::DynamicPerTokenGroup { group } => Some(Self {
                group,
                upper_bound: 0.0,
                static_scale: 0.0,
            }),
            ActivationScale::StaticPerTensor => Some(Self {
                group: 0,
                upper_bound: 0.0,
                static_scale: input_scale.unwrap_or(1.0),
            }),
        }
    }

    /// Scales per token of a `width`-column input.
    pub fn groups(&self, width: usize) -> usize {
        if self.group == 0 {
            1
        } else {
            width.div_ceil(self.group)
        }
    }

    /// Whether cuBLASLt's FP8 product can take this input: one scale per token.
    pub fn per_token(&self) -> bool {
        self.group == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fp8::{e4m3_to_f32, f32_to_e4m3};

    /// The launch geometry here is the kernels' own.
    #[test]
    fn geometry_matches_the_kernel_source() {
        let source = include_str!("../../../kernels/fp8.cu");
        for define in [
            format!("#define FP8_QUANT_THREADS {QUANT_THREADS}"),
            format!("#define FP8_GEMV_MAX_WARPS {GEMV_MAX_WARPS}"),
        ] {
            assert!(source.contains(&define), "{define}");
        }
        let entries = crate::backend::cuda::kernels::FP8_GEMV_ENTRIES;
        let four = GemvGeometry::choose(3, 4096, 4096, 132);
        assert_eq!(entries[four.entry(3)], "fp8_gemv_r4_m3");
        let two = GemvGeometry { rows: 2, ..four };
        assert_eq!(entries[two.entry(8)], "fp8_gemv_m8");
    }

    #[test]
    fn quantization_blocks_cover_their_group() {
        // A decode step's down input: 7 blocks of 1,024 threads, 2 values a thread; a prefill's
        // rows one block each.
        assert_eq!(quant_chunks(14336, 1), 7);
        assert_eq!(quant_chunks(14336, 8), 7);
        assert_eq!(quant_chunks(14336, 9), 1);
        assert_eq!(quant_chunks(4096, 1), 2);
        assert_eq!(quant_chunks(128, 1), 1);
        assert_eq!(quant_chunks(0, 1), 1);
        assert_eq!(quant_threads(14336), 1024);
        assert_eq!(quant_threads(128), 128);
        assert_eq!(quant_threads(100), 128);
        assert_eq!(quant_threads(0), 32);
    }

    /// The measured geometry: K split 2 ways below 8 rows of x, never more ways than steps.
    #[test]
    fn small_m_geometry_is_the_measured_one() {
        let one = GemvGeometry::choose(1, 6144, 4096, 132);
        assert_eq!((one.rows, one.warps, one.splits), (4, 4, 2));
        assert_eq!(GemvGeometry::choose(8, 4096, 14336, 132).splits, 1);
        // 4 rows × 4 warps / 2 splits = 8 rows per block.
        assert_eq!(one.blocks(6144), 768);
        assert_eq!(one.blocks(6145), 769);
        assert_eq!(GemvGeometry::choose(1, 64, 400, 132).splits, 1);
    }

    #[test]
    fn fast_rounding_matches_the_reference() {
        for bits in 0..=u16::MAX {
            let x = bf16_to_f32(bits);
            for v in [x, x * 0.37, x * 1.0625, x / 3.0] {
                assert_eq!(
                    f32_to_e4m3_fast(v),
                    f32_to_e4m3(v),
                    "{v:e} ({:#010x})",
                    v.to_bits()
                );
            }
        }
        for code in 0..=u8::MAX {
            let v = e4m3_to_f32(code);
            if !v.is_nan() {
                assert_eq!(f32_to_e4m3_fast(v), code);
            }
        }
    }

    #[test]
    fn scales_expand_to_rows_and_groups() {
        let tensor = DeviceScales::from_checkpoint(WeightScale::Tensor, &[2.0], 3, 256);
        assert_eq!((tensor.scales, tensor.groups), (vec![2.0; 3], 1));
        let channel = DeviceScales::from_checkpoint(WeightScale::Channel, &[1.0, 2.0], 2, 16);
        assert_eq!(
            (channel.scales.clone(), channel.group),
            (vec![1.0, 2.0], 16)
        );
        assert_eq!(channel.groups, 1);
        // 3 rows of 300 columns in [2, 128] blocks: 2 block rows, 3 block columns.
        let block = WeightScale::Block { rows: 2, cols: 128 };
        let scales = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let blocked = DeviceScales::from_checkpoint(block, &scales, 3, 300);
        assert_eq!((blocked.groups, blocked.group), (3, 128));
        assert_eq!(
            blocked.scales,
            vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        // Stacking concatenates rows; differing groups cannot stack.
        let stacked = DeviceScales::stack(&[blocked.clone(), blocked.clone()]).unwrap();
        assert_eq!(stacked.scales.len(), 18);
        assert!(DeviceScales::stack(&[blocked, channel]).is_none());
    }

    #[test]
    fn quantizing_per_channel_matches_the_model_quantizer() {
        let (out, inp) = (5, 40);
        let values: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.013 * (1 + i / inp) as f32)
            .collect();
        let mut bytes = Vec::new();
        let mut rounded = Vec::new();
        for v in &values {
            let b = crate::backend::cuda::weights::f32_to_bf16(*v);
            bytes.extend_from_slice(&b.to_le_bytes());
            rounded.push(bf16_to_f32(b));
        }
        let view = TensorView {
            dtype: DType::BF16,
            shape: vec![out, inp],
            data: &bytes,
        };
        let (codes, scales) = quantize_per_channel(&view, out, inp);
        let (want_values, want_scales) = WeightScale::Channel.quantize(&rounded, out, inp);
        assert_eq!(scales, want_scales);
        let got: Vec<f32> = codes.iter().map(|&c| e4m3_to_f32(c)).collect();
        assert_eq!(got, want_values);
    }

    #[test]
    fn input_schemes_become_kernel_arguments() {
        assert_eq!(InputQuantization::of(ActivationScale::None, None), None);
        let token = InputQuantization::of(
            ActivationScale::DynamicPerToken {
                upper_bound: Some(1200.0),
            },
            None,
        )
        .unwrap();
        assert_eq!((token.upper_bound, token.groups(4096)), (1200.0, 1));
        assert!(token.per_token());
        let group =
            InputQuantization::of(ActivationScale::DynamicPerTokenGroup { group: 128 }, None)
                .unwrap();
        assert_eq!(group.groups(384), 3);
        assert!(!group.per_token());
        let fixed = InputQuantization::of(ActivationScale::StaticPerTensor, Some(0.5)).unwrap();
        assert_eq!(fixed.static_scale, 0.5);
    }
}
