//! NVFP4: 64-element blocks of E2M1 (FP4) values, as MXFP4, with a UE4M3 scale per 16
//! elements instead of one E8M0 exponent per 32: d[4] | qs[32], sub-block s in bytes
//! 8s..8s+7 (its elements 0..7 in the low nibbles, 8..15 in the high ones). Paired with Q8_0
//! activations, two Q8_0 blocks per NVFP4 block. The dequantizer and quantizer follow
//! ggml-quants.c (`dequantize_row_nvfp4`, `quantize_row_nvfp4_ref`), the dot product the AVX2
//! `ggml_vec_dot_nvfp4_q8_0` of ggml-cpu/arch/x86/quants.c.

use super::lanes::hsum_float_8;
use super::legacy::{block_lanes, KVALUES_MXFP4, Q8_0_BYTES, QK};
use crate::util::rd_f16;

/// Elements of an NVFP4 block.
pub const QK_NVFP4: usize = 64;
/// Elements sharing one UE4M3 scale.
const SUB: usize = 16;
/// Bytes of an NVFP4 block: four scales, then 32 bytes of nibbles.
pub const NVFP4_BYTES: usize = 36;

/// The bits of ggml_ue4m3_to_fp32(x): an unsigned E4M3 scale (exponent bias 7, subnormals
/// man * 2^-9 at exponent 0) halved, as the E2M1 levels are doubled. 0x7F (E4M3's NaN) reads
/// as 0; the sign bit is not looked at (0xFF is 240). Built from integers: every value is
/// exact in f32.
const fn ue4m3_half_bits(x: u8) -> u32 {
    let (exp, man) = (((x >> 3) & 0x0f) as u32, (x & 7) as u32);
    if x == 0x7f || (exp == 0 && man == 0) {
        return 0;
    }
    if exp > 0 {
        // (1 + man / 8) * 2^(exp - 7) / 2
        return ((exp + 127 - 8) << 23) | (man << 20);
    }
    // man * 2^-10, normalized at its leading bit p.
    let p = 31 - man.leading_zeros();
    ((127 - 10 + p) << 23) | ((man - (1 << p)) << (23 - p))
}

static UE4M3_HALF_BITS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue4m3_half_bits(i as u8);
        i += 1;
    }
    t
};

/// ggml_ue4m3_to_fp32 (see `ue4m3_half_bits`), by table as ggml's CPU backend reads it.
#[inline]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    f32::from_bits(UE4M3_HALF_BITS[x as usize])
}

/// ggml_fp32_to_ue4m3: round to nearest on the first dropped mantissa bit (ties away), 448
/// at most; from 2^8 on the exponent is out of range and every value saturates to 0x7E
/// (448), as in ggml. Zero, negatives and NaN give 0.
pub fn f32_to_ue4m3(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = x.min(448.0);
    let bits = x.to_bits();
    let mut exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    if exp <= 0 {
        // Subnormal: man * 2^-9.
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7e;
    }
    let mut man = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7e;
        }
    }
    ((exp << 3) | man) as u8
}

/// The 64 levels of a block (doubled E2M1 values) in element order, as two 32-element
/// halves (each against one Q8_0 block).
pub fn nvfp4_values(b: &[u8]) -> [[i8; QK]; 2] {
    let mut v = [[0i8; QK]; 2];
    for s in 0..4 {
        let (half, off) = (&mut v[s / 2], (s % 2) * SUB);
        for j in 0..SUB / 2 {
            let q = b[4 + 8 * s + j];
            half[off + j] = KVALUES_MXFP4[(q & 0x0f) as usize];
            half[off + j + SUB / 2] = KVALUES_MXFP4[(q >> 4) as usize];
        }
    }
    v
}

pub fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(NVFP4_BYTES).zip(dst.chunks_exact_mut(QK_NVFP4)) {
        let levels = nvfp4_values(b);
        for (s, ys) in y.chunks_exact_mut(SUB).enumerate() {
            let d = ue4m3_to_f32_half(b[s]);
            for (v, &q) in ys.iter_mut().zip(&levels[s / 2][(s % 2) * SUB..]) {
                *v = q as f32 * d;
            }
        }
    }
}

/// quantize_row_nvfp4_ref: each sub-block's scale is amax / 6 (the largest E2M1 value) in
/// UE4M3, each value the level nearest to it at that scale (the first on ties).
pub fn quantize_nvfp4(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_NVFP4).zip(dst.chunks_exact_mut(NVFP4_BYTES)) {
        for (s, xs) in x.chunks_exact(SUB).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
            b[s] = f32_to_ue4m3(amax / 6.0);
            let d = ue4m3_to_f32_half(b[s]);
            let nearest = |v: f32| {
                let err = |i: usize| (KVALUES_MXFP4[i] as f32 * d - v).abs();
                (1..16).fold(0, |best, i| if err(i) < err(best) { i } else { best }) as u8
            };
            for j in 0..SUB / 2 {
                b[4 + 8 * s + j] = nearest(xs[j]) | (nearest(xs[j + SUB / 2]) << 4);
            }
        }
    }
}

/// ggml_vec_dot_nvfp4_q8_0 on AVX2: each half block against its Q8_0 block in eight i32
/// lanes (lanes 0-3 are the first sub-block, 4-7 the second), `acc = fma(d_w * d_x, lanes,
/// acc)` with each lane's own sub-block scale, one accumulator for the row, `hsum_float_8`.
pub fn vec_dot_nvfp4_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.chunks_exact(NVFP4_BYTES).zip(x.chunks_exact(2 * Q8_0_BYTES)).take(n / QK_NVFP4) {
        for (h, (levels, xh)) in nvfp4_values(bw).iter().zip(bx.chunks_exact(Q8_0_BYTES)).enumerate() {
            let dx = rd_f16(xh, 0);
            let scales = [ue4m3_to_f32_half(bw[2 * h]) * dx, ue4m3_to_f32_half(bw[2 * h + 1]) * dx];
            for (l, &sum) in block_lanes(levels, &xh[2..]).iter().enumerate() {
                acc[l] = scales[l / 4].mul_add(sum as f32, acc[l]);
            }
        }
    }
    hsum_float_8(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's formula: 0 for 0 and 0x7F, man * 2^-9 at exponent 0, else (1 + man / 8) *
    /// 2^(exp - 7); halved.
    #[test]
    fn the_table_is_ggmls_formula() {
        for x in 0..=255u8 {
            let (exp, man) = (((x >> 3) & 0x0f) as i32, (x & 7) as f32);
            let raw = if x == 0 || x == 0x7f { 0.0 } else if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
            assert_eq!(ue4m3_to_f32_half(x).to_bits(), (raw * 0.5).to_bits(), "{x:#04x}");
        }
    }

    /// Encoding then decoding: every code's value below 2^8 maps back to its code, those of
    /// the top exponent (256 to 448) to 0x7E as in ggml; and the rounding points.
    #[test]
    fn encoding_inverts_decoding() {
        for x in 1..0x78u8 {
            assert_eq!(f32_to_ue4m3(2.0 * ue4m3_to_f32_half(x)), x, "{x:#04x}");
        }
        for x in 0x78..0x7fu8 {
            assert_eq!(f32_to_ue4m3(2.0 * ue4m3_to_f32_half(x)), 0x7e, "{x:#04x}");
        }
        assert_eq!(f32_to_ue4m3(448.0), 0x7e);
        assert_eq!(f32_to_ue4m3(1e9), 0x7e);
        assert_eq!(f32_to_ue4m3(256.0), 0x7e, "ggml saturates the whole top binade");
        assert_eq!(f32_to_ue4m3(-1.0), 0);
        assert_eq!(f32_to_ue4m3(f32::NAN), 0);
        assert_eq!(f32_to_ue4m3(0.5 / 512.0), 1, "half the smallest subnormal rounds up");
        assert_eq!(f32_to_ue4m3(0.49 / 512.0), 0);
    }
}
