//! ggml's x86 summation order, emulated in portable code so that the scalar kernels give
//! the bits of llama.cpp's AVX2 `ggml_vec_dot_*` (ggml-cpu/arch/x86/quants.c).
//!
//! Those kernels hold one 32-byte register of weights against one of activations: the
//! integer products are summed into eight i32 lanes, lane k taking bytes 4k..4k+3 of the
//! register (`maddubs` + `madd`, or VNNI's `vpdpbusd`: the same exact integers). Every
//! kernel loads its elements in element order, so element p lands in lane (p % 32) / 4. A block's
//! lanes are converted to f32 and added to eight f32 accumulators with one FMA each, and the
//! accumulators are reduced at the end by `hsum_float_8`. Integer sums are exact in any
//! order; only the float steps need to be repeated, which is what these helpers do.

/// `acc = _mm256_fmadd_ps(set1(d), cvtepi32_ps(lanes), acc)`.
#[inline(always)]
pub fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (a, &l) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(l as f32, *a);
    }
}

/// ggml's `hsum_float_8`: upper half added to lower half, then lanes 2-3 to 0-1, then lane 1
/// to lane 0.
#[inline(always)]
pub fn hsum_float_8(acc: &[f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[i + 4] + acc[i]);
    hsum_float_4(&r)
}

/// The reduction of a 4-lane accumulator in ggml's Q4_K kernel (`movehl` + `add_ps`, then
/// `movehdup` + `add_ss`): (l0 + l2) + (l1 + l3).
#[inline(always)]
pub fn hsum_float_4(r: &[f32; 4]) -> f32 {
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Lane-wise sum of two accumulators (`_mm256_add_ps`).
#[inline(always)]
pub fn add_lanes(a: &[f32; 8], b: &[f32; 8]) -> [f32; 8] {
    std::array::from_fn(|i| a[i] + b[i])
}
