//! MXFP4 (the OCP microscaling format with FP4 E2M1 elements), as gpt-oss checkpoints store their
//! experts: a projection's `*_blocks` tensor holds two E2M1 values per byte (the low nibble is the
//! even element, the high nibble the odd one), 32 elements (16 bytes) per block, and its `*_scales`
//! tensor one E8M0 scale per block (a power of two, `2^(byte − 127)`; `0xFF` is NaN).

/// Elements sharing one scale.
pub const BLOCK_ELEMENTS: usize = 32;

/// Bytes of one block of packed values.
pub const BLOCK_BYTES: usize = BLOCK_ELEMENTS / 2;

/// The exponent bias of an E8M0 scale.
pub const SCALE_BIAS: i32 = 127;

/// The E8M0 byte that encodes NaN.
pub const NAN_SCALE: u8 = 0xFF;

/// The sixteen E2M1 values, by code: sign bit 3, exponent bits 2–1, mantissa bit 0.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// An MXFP4 tensor that cannot be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mxfp4Error {
    /// The blocks and scales disagree in size.
    #[error("{blocks} bytes of blocks do not match {scales} scales ({BLOCK_BYTES} bytes each)")]
    Size {
        /// Bytes of packed values.
        blocks: usize,
        /// Scales.
        scales: usize,
    },
    /// A scale is the E8M0 NaN, which no finite weight has.
    #[error("scale {index} is 0xFF (NaN in E8M0)")]
    NanScale {
        /// The index of the scale.
        index: usize,
    },
}

/// The value of an E8M0 scale byte, `2^(byte − 127)` (exact in f32, subnormal for bytes 0 and
/// 1), or `None` for NaN.
pub fn e8m0_to_f32(byte: u8) -> Option<f32> {
    (byte != NAN_SCALE).then(|| 2f32.powi(i32::from(byte) - SCALE_BIAS))
}

/// The elements of `blocks` (16 bytes per block, low nibble first) times their blocks' scales,
/// in storage order: block `b` gives elements `32·b .. 32·b + 32`. Every value is exact in f32.
pub fn dequantize(blocks: &[u8], scales: &[u8]) -> Result<Vec<f32>, Mxfp4Error> {
    if blocks.len() != scales.len() * BLOCK_BYTES {
        return Err(Mxfp4Error::Size {
            blocks: blocks.len(),
            scales: scales.len(),
        });
    }
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (index, (block, &scale)) in blocks.chunks_exact(BLOCK_BYTES).zip(scales).enumerate() {
        let scale = e8m0_to_f32(scale).ok_or(Mxfp4Error::NanScale { index })?;
        for &byte in block {
            out.push(E2M1_VALUES[usize::from(byte & 0x0F)] * scale);
            out.push(E2M1_VALUES[usize::from(byte >> 4)] * scale);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_codes_decode_to_their_values() {
        // Sign, two exponent bits (bias 1), one mantissa bit; exponent 0 is subnormal (0.5·m).
        for code in 0..16u8 {
            let (sign, exponent, mantissa) = (code >> 3, (code >> 1) & 3, code & 1);
            let magnitude = if exponent == 0 {
                0.5 * f32::from(mantissa)
            } else {
                (1.0 + 0.5 * f32::from(mantissa)) * 2f32.powi(i32::from(exponent) - 1)
            };
            let want = if sign == 1 { -magnitude } else { magnitude };
            assert_eq!(E2M1_VALUES[usize::from(code)], want, "code {code}");
            assert_eq!(E2M1_VALUES[usize::from(code)].is_sign_negative(), sign == 1);
        }
    }

    #[test]
    fn e8m0_scales_are_powers_of_two_with_bias_127() {
        assert_eq!(e8m0_to_f32(127), Some(1.0));
        assert_eq!(e8m0_to_f32(128), Some(2.0));
        assert_eq!(e8m0_to_f32(120), Some(1.0 / 128.0));
        assert_eq!(e8m0_to_f32(254), Some(2f32.powi(127)));
        assert_eq!(e8m0_to_f32(0), Some(2f32.powi(-127)));
        assert!(e8m0_to_f32(0).is_some_and(|s| s > 0.0 && !s.is_normal()));
        assert_eq!(e8m0_to_f32(0xFF), None);
    }

    /// Known values: the low nibble is the even element, and the block's scale applies to all
    /// 32 of its elements.
    #[test]
    fn blocks_unpack_low_nibble_first_and_scale() {
        let mut blocks = [0u8; 32];
        // Block 0 (scale 2^1): bytes 0x21 → [0.5, 1.0]·2, 0xF7 → [6, −6]·2, 0x98 → [−0, −0.5]·2.
        blocks[0] = 0x21;
        blocks[1] = 0xF7;
        blocks[2] = 0x98;
        // Block 1 (scale 2^-2): byte 15 is the last pair; 0x5C → [−2, 3]·0.25.
        blocks[31] = 0x5C;
        let values = dequantize(&blocks, &[128, 125]).unwrap();
        assert_eq!(values.len(), 64);
        assert_eq!(&values[..6], &[1.0, 2.0, 12.0, -12.0, -0.0, -1.0]);
        assert!(values[4].is_sign_negative());
        assert!(values[6..32].iter().all(|&v| v == 0.0));
        assert!(values[32..62].iter().all(|&v| v == 0.0));
        assert_eq!(&values[62..], &[-0.5, 0.75]);
    }

    #[test]
    fn nan_scales_and_mismatched_sizes_are_refused() {
        assert_eq!(
            dequantize(&[0; 32], &[127, 0xFF]),
            Err(Mxfp4Error::NanScale { index: 1 })
        );
        assert_eq!(
            dequantize(&[0; 31], &[127, 127]),
            Err(Mxfp4Error::Size {
                blocks: 31,
                scales: 2
            })
        );
    }
}
