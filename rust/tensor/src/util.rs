//! Small numeric helpers shared by every kernel: half-precision conversions, ggml's rounding
//! helpers, and little-endian field access inside a block's bytes.

/// IEEE half -> f32 (exact; every f16 is representable in f32).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // Subnormal half: mant * 2^-24, exactly representable as a normal f32.
            let v = mant as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 112) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// f32 -> IEEE half, round to nearest even (what F16C's `vcvtps2ph` and ggml do).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bf16 -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bf16 exactly as ggml's `ggml_compute_fp32_to_bf16`: NaN kept quiet, otherwise
/// round to nearest even.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// ggml's `nearest_int`: round to nearest, ties to even, through the float magic number
/// 1.5 * 2^23. Valid for |x| <= 4194303, as in ggml.
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0f32;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Reads the f16 at byte `off` of `b` as f32.
#[inline(always)]
pub fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Writes `v` as f16 at byte `off` of `b`.
#[inline(always)]
pub fn wr_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// Reads the little-endian f32 at byte `off`.
#[inline(always)]
pub fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads the little-endian u32 at byte `off`.
#[inline(always)]
pub fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads the little-endian i16 at byte `off`.
#[inline(always)]
pub fn rd_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// C's `roundf`: halfway cases away from zero.
#[inline(always)]
pub fn roundf(x: f32) -> f32 {
    x.round()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_matches_the_half_crate_for_every_value() {
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "{h:#x}");
        }
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(126.49), 126);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan_quiet() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between two bf16 values: ties to the even one (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }
}
