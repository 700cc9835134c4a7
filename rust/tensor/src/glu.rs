//! SwiGLU as llama.cpp's CPU backend computes it on this CPU (ggml_vec_swiglu_f32):
//! y = silu(x) * g, silu(x) = x / (1 + exp(-x)), row by row. On an AVX2 (+FMA) build ggml
//! takes each row's whole chunks of eight through `ggml_v_silu`, whose exponential is the
//! AVX2 `ggml_v_expf` (`attn_avx2::expf_avx2`, the same bits lane by lane), and the row's
//! last `row % 8` elements through libm's expf. Elsewhere ferrollama uses libm's expf for
//! every element, as ggml's scalar build does (ggml's AVX-512 build has a vector expf of
//! its own, which is not reproduced here).

use crate::dispatch::{active_isa, Isa};

/// x = silu(x) * g over rows of `row` elements (x.len() a multiple of `row`).
pub fn swiglu(x: &mut [f32], g: &[f32], row: usize) {
    assert!(row > 0 && x.len() % row == 0 && g.len() == x.len(), "rows of {row} elements, x and g alike");
    let vector = active_isa() == Isa::Avx2;
    for (xr, gr) in x.chunks_exact_mut(row).zip(g.chunks_exact(row)) {
        let chunks_end = if vector { row - row % 8 } else { 0 };
        if chunks_end > 0 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Isa::Avx2 is active only on CPUs with AVX2 and FMA; the slices are
            // equal and a multiple of 8 long.
            unsafe {
                silu_mul_avx2(&mut xr[..chunks_end], &gr[..chunks_end])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_avx2::expf_avx2;

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
        let vector = active_isa() == Isa::Avx2;
        for (i, (&a, (&xi, &gi))) in got.iter().zip(x.iter().zip(&g)).enumerate() {
            let col = i % row;
            let want = if vector && col < row - row % 8 { xi / (1.0 + expf_avx2(0.0 - xi)) * gi } else { silu_libm(xi) * gi };
            assert_eq!(a.to_bits(), want.to_bits(), "element {i} (column {col}) x = {xi}: {a} vs {want}");
        }
    }
}
