//! SwiGLU as llama.cpp's CPU backend computes it on this CPU (ggml_vec_swiglu_f32):
//! y = silu(x) * g, silu(x) = x / (1 + exp(-x)), row by row. On an AVX2 (+FMA) build ggml
//! takes each row's whole chunks of eight through `ggml_v_silu`, whose exponential is the
//! AVX2 `ggml_v_expf` (`attn_avx2::expf_avx2`, the same bits lane by lane), and the row's
//! last `row % 8` elements through libm's expf. On an AVX-512 build ggml takes chunks of
//! sixteen through its AVX-512 `ggml_v_expf` (another polynomial's last steps: a scalef
//! instead of an exponent add), reproduced by `silu_mul_avx512` on AVX-512 machines. Elsewhere
//! ferrollama uses libm's expf for every element, as ggml's scalar build does.
//!
//! SiLU alone (ggml_silu: ggml_vec_silu_f32 row by row) takes the same path without the gate:
//! `silu`, each row's whole chunks of 8 (AVX2) or 16 (AVX-512) through ggml_v_silu, the rest
//! through libm's expf.

use crate::dispatch::{active_isa, Isa};

/// x = silu(x) over rows of `row` elements (x.len() a multiple of `row`), as ggml_silu computes
/// it on this CPU (ggml_vec_silu_f32 per row).
pub fn silu(x: &mut [f32], row: usize) {
    silu_isa(active_isa(), x, row)
}

/// `silu` at the given instruction-set level (which the CPU must support).
fn silu_isa(isa: Isa, x: &mut [f32], row: usize) {
    assert!(row > 0 && x.len() % row == 0, "rows of {row} elements");
    assert!(isa.available(), "{} kernels on a CPU without them", isa.name());
    let lanes = match isa {
        Isa::Avx2 => 8,
        Isa::Avx512 => 16,
        Isa::Scalar => 0,
    };
    for xr in x.chunks_exact_mut(row) {
        let chunks_end = if lanes > 0 { row - row % lanes } else { 0 };
        if chunks_end > 0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports `isa` (checked above): AVX2 and FMA for Isa::Avx2,
            // AVX-512 F too for Isa::Avx512; the slice is a multiple of the lanes.
            unsafe {
                if lanes == 16 {
                    silu_avx512(&mut xr[..chunks_end])
                } else {
                    silu_avx2(&mut xr[..chunks_end])
                }
            };
        }
        for a in &mut xr[chunks_end..] {
            *a = silu_libm(*a);
        }
    }
}

/// ggml_v_silu (AVX2), eight at a time: x / (1 + ggml_v_expf(0 - x)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let (one, zero) = (_mm256_set1_ps(1.0), _mm256_setzero_ps());
    for xc in x.chunks_exact_mut(8) {
        let v = _mm256_loadu_ps(xc.as_ptr());
        let e = crate::attn_avx2::x86::expf8(_mm256_sub_ps(zero, v));
        _mm256_storeu_ps(xc.as_mut_ptr(), _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
}

/// ggml_v_silu (AVX-512), sixteen at a time: x / (1 + ggml_v_expf(0 - x)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_avx512(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let (one, zero) = (_mm512_set1_ps(1.0), _mm512_setzero_ps());
    for xc in x.chunks_exact_mut(16) {
        let v = _mm512_loadu_ps(xc.as_ptr());
        let e = expf16(_mm512_sub_ps(zero, v));
        _mm512_storeu_ps(xc.as_mut_ptr(), _mm512_div_ps(v, _mm512_add_ps(one, e)));
    }
}

/// x = silu(x) * g over rows of `row` elements (x.len() a multiple of `row`).
pub fn swiglu(x: &mut [f32], g: &[f32], row: usize) {
    assert!(row > 0 && x.len() % row == 0 && g.len() == x.len(), "rows of {row} elements, x and g alike");
    let lanes = match active_isa() {
        Isa::Avx2 => 8,
        Isa::Avx512 => 16,
        Isa::Scalar => 0,
    };
    for (xr, gr) in x.chunks_exact_mut(row).zip(g.chunks_exact(row)) {
        let chunks_end = if lanes > 0 { row - row % lanes } else { 0 };
        if chunks_end > 0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Isa::Avx2 is active only on CPUs with AVX2 and FMA, Isa::Avx512 only on
            // those with AVX-512 F/BW/VL too; the slices are equal and a multiple of the lanes.
            unsafe {
                if lanes == 16 {
                    silu_mul_avx512(&mut xr[..chunks_end], &gr[..chunks_end])
                } else {
                    silu_mul_avx2(&mut xr[..chunks_end], &gr[..chunks_end])
                }
            };
        }
        for (a, &b) in xr[chunks_end..].iter_mut().zip(&gr[chunks_end..]) {
            *a = silu_libm(*a) * b;
        }
    }
}

/// ggml_silu_f32: x / (1 + expf(-x)) with libm's expf.
fn silu_libm(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml_v_silu (AVX2) times g, eight at a time: x / (1 + ggml_v_expf(0 - x)) * g.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(x: &mut [f32], g: &[f32]) {
    use std::arch::x86_64::*;
    let (one, zero) = (_mm256_set1_ps(1.0), _mm256_setzero_ps());
    for (xc, gc) in x.chunks_exact_mut(8).zip(g.chunks_exact(8)) {
        let v = _mm256_loadu_ps(xc.as_ptr());
        let e = crate::attn_avx2::x86::expf8(_mm256_sub_ps(zero, v));
        let silu = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(xc.as_mut_ptr(), _mm256_mul_ps(silu, _mm256_loadu_ps(gc.as_ptr())));
    }
}

/// ggml's AVX-512 ggml_v_expf, sixteen lanes: the same reduction as the AVX2 one, then
/// 1 + b·(c1 + ...) scaled by 2^n with scalef (AVX2 adds n to the exponent and multiplies).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn expf16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let r = _mm512_set1_ps(f32::from_bits(0x4b40_0000)); // 0x1.8p23
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3fb8_aa3b)), r); // 0x1.715476p+0
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x35bf_be8e)), // 0x1.7f7d1cp-20
                             _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3f31_7200)), x)); // 0x1.62e4p-1
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3c07_2010)), b, // 0x1.0e4020p-7
                                        _mm512_set1_ps(f32::from_bits(0x3d2b_9f17))), // 0x1.573e2ep-5
                        u,
                        _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3e2a_af33)), b, // 0x1.555e66p-3
                                        _mm512_set1_ps(f32::from_bits(0x3eff_fedb)))), // 0x1.fffdb6p-2
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3f7f_fff6)), b, _mm512_set1_ps(1.0))); // 0x1.ffffecp-1
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps()), _mm512_set1_ps(f32::INFINITY),
                                   _mm512_setzero_ps());
    _mm512_mask_blend_ps(d, res, alt)
}

/// ggml_v_silu (AVX-512) times g, sixteen at a time: x / (1 + ggml_v_expf(0 - x)) * g.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_avx512(x: &mut [f32], g: &[f32]) {
    use std::arch::x86_64::*;
    let (one, zero) = (_mm512_set1_ps(1.0), _mm512_setzero_ps());
    for (xc, gc) in x.chunks_exact_mut(16).zip(g.chunks_exact(16)) {
        let v = _mm512_loadu_ps(xc.as_ptr());
        let e = expf16(_mm512_sub_ps(zero, v));
        let silu = _mm512_div_ps(v, _mm512_add_ps(one, e));
        _mm512_storeu_ps(xc.as_mut_ptr(), _mm512_mul_ps(silu, _mm512_loadu_ps(gc.as_ptr())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_avx2::expf_avx2;

    /// ggml's AVX-512 ggml_v_expf one value at a time: fused multiply-adds in f32, then
    /// j · 2^n rounded once (scalef), 0 or infinity past |n| = 192.
    fn expf_avx512_spec(x: f32) -> f32 {
        let c = |bits: u32| f32::from_bits(bits);
        let r = c(0x4b40_0000);
        let n = x.mul_add(c(0x3fb8_aa3b), r) - r;
        let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
        if n.abs() > 192.0 {
            return if n <= 0.0 { 0.0 } else { f32::INFINITY };
        }
        let u = b * b;
        let j = c(0x3c07_2010).mul_add(b, c(0x3d2b_9f17)).mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
            .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
        (j as f64 * 2f64.powi(n as i32)) as f32
    }

    /// Each row's whole chunks of eight follow ggml_v_silu (the AVX2 expf, bit for bit) on an
    /// AVX2 machine, the rest libm's silu; values cover the exponential's slow paths (|x| past
    /// 126 and 192 in the exponent), zeros and the tails of rows of 8k + 5 elements.
    #[test]
    fn swiglu_is_ggmls_row_by_row() {
        let row = 21;
        let specials = [0.0f32, -0.0, 1.0, -1.0, 87.0, -87.0, 89.0, -89.0, 100.0, -100.0, 140.0, -140.0, 1e-30, -3.5];
        let x: Vec<f32> = (0..4 * row).map(|i| if i < specials.len() { specials[i] } else { ((i * 7919) % 2000) as f32 / 100.0 - 10.0 }).collect();
        let g: Vec<f32> = (0..4 * row).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
        let mut got = x.clone();
        swiglu(&mut got, &g, row);
        let isa = active_isa();
        for (i, (&a, (&xi, &gi))) in got.iter().zip(x.iter().zip(&g)).enumerate() {
            let col = i % row;
            let want = match isa {
                Isa::Avx2 if col < row - row % 8 => xi / (1.0 + expf_avx2(0.0 - xi)) * gi,
                Isa::Avx512 if col < row - row % 16 => xi / (1.0 + expf_avx512_spec(0.0 - xi)) * gi,
                _ => silu_libm(xi) * gi,
            };
            assert_eq!(a.to_bits(), want.to_bits(), "element {i} (column {col}) x = {xi}: {a} vs {want}");
        }
    }

    /// silu at every level this CPU has, against the specification: each row's whole chunks of
    /// 8 (AVX2) or 16 (AVX-512) lanes follow ggml_v_silu with that level's expf bit for bit,
    /// the rest (and every element of the scalar level) libm's silu; values cover the
    /// exponential's slow paths, zeros, tiny values and rows of 16k + 5 elements.
    #[test]
    fn silu_is_ggmls_row_by_row_at_every_level() {
        let row = 37;
        let specials = [0.0f32, -0.0, 1.0, -1.0, 87.0, -87.0, 89.0, -89.0, 100.0, -100.0, 140.0, -140.0, 200.0, -200.0, 1e-30,
                        -3.5, 1e-45, -1e-45, 20.0, -20.0];
        let x: Vec<f32> = (0..5 * row)
            .map(|i| if i < specials.len() { specials[i] } else { ((i * 7919) % 4000) as f32 / 100.0 - 20.0 })
            .collect();
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let mut got = x.clone();
            silu_isa(isa, &mut got, row);
            for (i, (&a, &xi)) in got.iter().zip(&x).enumerate() {
                let col = i % row;
                let want = match isa {
                    Isa::Avx2 if col < row - row % 8 => xi / (1.0 + expf_avx2(0.0 - xi)),
                    Isa::Avx512 if col < row - row % 16 => xi / (1.0 + expf_avx512_spec(0.0 - xi)),
                    _ => silu_libm(xi),
                };
                assert_eq!(a.to_bits(), want.to_bits(), "{}: element {i} (column {col}) x = {xi}: {a} vs {want}", isa.name());
            }
        }
        // the dispatched entry point is the active level's
        let (mut a, mut b) = (x.clone(), x.clone());
        silu(&mut a, row);
        silu_isa(active_isa(), &mut b, row);
        assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}
