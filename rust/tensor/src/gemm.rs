//! A register-blocked matrix product for long batches (a vision encoder's thousands of
//! patches) in the summation order of llamafile's tinyBLAS, which ggml_mul_mat hands such
//! products with F16 weights (`tinyBLAS<16, __m512, __m512, ggml_fp16_t, ggml_fp16_t, float>`
//! on AVX-512, 8 lanes on AVX2): every output keeps one accumulator of `lanes` f32 lanes,
//! term k going to lane k % lanes, over the whole row; the lanes are added at the end
//! (`hsum`: GCC's `_mm512_reduce_add_ps` tree, or the AVX2 halves). An F16 product first
//! rounds the activations to f16, as ggml converts them to the weights' vec_dot_type.
//!
//! Outputs are computed in tiles of RM weight rows × RN tokens (RM × RN accumulators in
//! registers), the tiles of a block of rows × tokens on one thread, from an f32 copy of the
//! weights made once per product (exact). A row length that is
//! not a multiple of the lanes ends on a step whose missing terms are zeros (tinyBLAS
//! refuses such rows; ggml then takes vec_dot, whose order this does not follow).
//! `gemm_spec` is the specification, one term at a time; the kernels equal it bit for bit.

use crate::attn::reduce16;
use crate::dispatch::{active_isa, Isa};
use crate::scalar::lanes::hsum_float_8;
use crate::threads::{SendPtr, Threads};
use crate::util::{f16_to_f32, f32_to_f16};
use crate::{GgmlType, QMatrix};

/// Weight rows and tokens per register tile: 24 accumulators of 16 lanes of the 32
/// AVX-512 registers; 12 of the 16 AVX2 ones.
const TILE_AVX512: (usize, usize) = (4, 6);
const TILE_AVX2: (usize, usize) = (3, 4);
/// Tiles per task along the rows and the tokens: a block of weights and activations that
/// stays in L2 while its tiles are computed.
const BLOCK_TILES: (usize, usize) = (16, 16);
/// The activations of a block of tokens take at most this many floats (512 KiB) where the
/// rows are long.
const BLOCK_FLOATS: usize = 1 << 17;

/// out[t * w.rows + r] = Σ_k W[r][k] · X[t][k] for an F16 or F32 `w` (rows × cols) and
/// n_tokens rows of `x` (cols each), in tinyBLAS's order; `x` rounded to f16 for F16 `w`.
pub fn gemm(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32], threads: &Threads) {
    gemm_isa(active_isa(), w, x, n_tokens, out, threads)
}

/// `gemm` at the given instruction-set level (which the CPU must support).
pub fn gemm_isa(isa: Isa, w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32], threads: &Threads) {
    let (rows, k) = (w.rows, w.cols);
    assert!(matches!(w.ty, GgmlType::F16 | GgmlType::F32), "gemm of a {} matrix", w.ty);
    assert!(x.len() == n_tokens * k && out.len() == n_tokens * rows, "gemm operand sizes");
    assert!(isa.available(), "{} kernels on a CPU without them", isa.name());
    let rounded: Vec<f32>;
    let x = match w.ty {
        GgmlType::F16 => {
            rounded = rounded_to_f16(isa, x, threads);
            &rounded[..]
        }
        _ => x,
    };
    let (rm, rn) = match isa {
        Isa::Avx512 => TILE_AVX512,
        _ => TILE_AVX2,
    };
    // Long rows take fewer tokens per block, so that the block's activations stay in L2.
    let token_tiles = (BLOCK_FLOATS / (k * rn).max(1)).clamp(1, BLOCK_TILES.1);
    let (block_rows, block_tokens) = (rm * BLOCK_TILES.0, rn * token_tiles);
    let row_blocks = rows.div_ceil(block_rows);
    let wf = weights_f32(w, threads);
    let out_ptr = SendPtr(out.as_mut_ptr());
    threads.run(row_blocks * n_tokens.div_ceil(block_tokens), |task| {
        let r_block = (task % row_blocks) * block_rows..rows.min((task % row_blocks + 1) * block_rows);
        let t0 = (task / row_blocks) * block_tokens;
        let t_block = t0..n_tokens.min(t0 + block_tokens);
        for r0 in r_block.clone().step_by(rm) {
            let m = rm.min(r_block.end - r0);
            // A tile past the last row or token repeats it (its outputs are not stored).
            let ws: [&[f32]; 4] = std::array::from_fn(|i| &wf[(r0 + i.min(m - 1)) * k..][..k]);
            for t in t_block.clone().step_by(rn) {
                let nt = rn.min(t_block.end - t);
                let xs: [&[f32]; 6] = std::array::from_fn(|j| &x[(t + j.min(nt - 1)) * k..][..k]);
                let mut c = [[0f32; 6]; 4];
                tile(isa, &ws, &xs, k, &mut c);
                for (i, ci) in c.iter().enumerate().take(m) {
                    for (j, &v) in ci.iter().enumerate().take(nt) {
                        // SAFETY: tasks cover disjoint (row, token) blocks of `out`.
                        unsafe { *out_ptr.get().add((t + j) * rows + r0 + i) = v };
                    }
                }
            }
        }
    });
}

/// `w` in f32 (exact), converted on the threads: each weight is read by many tiles.
fn weights_f32(w: &QMatrix, threads: &Threads) -> Vec<f32> {
    let k = w.cols;
    let mut wf = vec![0f32; w.rows * k];
    let wf_ptr = SendPtr(wf.as_mut_ptr());
    threads.run(w.rows.div_ceil(64), |c| {
        for r in c * 64..w.rows.min((c + 1) * 64) {
            // SAFETY: each task writes its own rows.
            let dst = unsafe { std::slice::from_raw_parts_mut(wf_ptr.get().add(r * k), k) };
            weight_row(w, r, dst);
        }
    });
    wf
}

/// x with every value rounded to f16 (to nearest, ties to even: F16C's conversion and
/// `f32_to_f16` alike), on the threads.
fn rounded_to_f16(isa: Isa, x: &[f32], threads: &Threads) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0f32; x.len()];
    let out_ptr = SendPtr(out.as_mut_ptr());
    threads.run(x.len().div_ceil(CHUNK), |c| {
        let src = &x[c * CHUNK..x.len().min((c + 1) * CHUNK)];
        // SAFETY: each task writes its own chunk.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(c * CHUNK), src.len()) };
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 {
            // SAFETY: AVX2 and F16C are available; equal lengths.
            unsafe { x86::round_f16(src, dst) };
            return;
        }
        let _ = isa;
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d = f16_to_f32(f32_to_f16(v)));
    });
    out
}

/// Row r of `w` in f32 (exact).
fn weight_row(w: &QMatrix, r: usize, dst: &mut [f32]) {
    match w.ty {
        GgmlType::F16 => crate::attn::f16_to_f32(w.row(r), dst),
        _ => dst.iter_mut().zip(w.row(r).chunks_exact(4)).for_each(|(d, b)| *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    }
}

/// c[i][j] = the dot product of ws[i] and xs[j] (k each), for the ISA's tile of rows and
/// tokens.
fn tile(isa: Isa, ws: &[&[f32]; 4], xs: &[&[f32]; 6], k: usize, c: &mut [[f32; 6]; 4]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports `isa` (checked by gemm_isa); every row holds k values.
        Isa::Avx512 => unsafe { x86::tile_avx512(&ws.map(|w| w.as_ptr()), &xs.map(|x| x.as_ptr()), k, c) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::tile_avx2(&ws.map(|w| w.as_ptr()), &xs.map(|x| x.as_ptr()), k, c) },
        _ => {
            let (rm, rn) = TILE_AVX2;
            for i in 0..rm {
                for j in 0..rn {
                    c[i][j] = dot_spec(16, ws[i], xs[j]);
                }
            }
        }
    }
}

/// One output in tinyBLAS's order with `lanes` (16 or 8) lanes: term i accumulated in lane
/// i % lanes by a fused multiply-add (missing terms of a last partial step are zeros), then
/// the lanes added in the tree of the ISA's hsum.
pub fn dot_spec(lanes: usize, w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for step in (0..w.len()).step_by(lanes) {
        for (l, a) in acc.iter_mut().enumerate().take(lanes) {
            let (wv, xv) = w.get(step + l).zip(x.get(step + l)).map_or((0.0, 0.0), |(&a, &b)| (a, b));
            *a = wv.mul_add(xv, *a);
        }
    }
    match lanes {
        16 => reduce16(&acc),
        8 => hsum_float_8(acc[..8].try_into().expect("8 lanes")),
        _ => panic!("{lanes} lanes"),
    }
}

/// `gemm` one output at a time (the specification): the lanes of `isa`'s kernel (16 for
/// the scalar ISA, whose kernel is this).
pub fn gemm_spec(isa: Isa, w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    let (rows, k) = (w.rows, w.cols);
    let lanes = if isa == Isa::Avx2 { 8 } else { 16 };
    let round = |v: f32| if w.ty == GgmlType::F16 { f16_to_f32(f32_to_f16(v)) } else { v };
    let mut wr = vec![0f32; k];
    for r in 0..rows {
        weight_row(w, r, &mut wr);
        for t in 0..n_tokens {
            let xt: Vec<f32> = x[t * k..(t + 1) * k].iter().map(|&v| round(v)).collect();
            out[t * rows + r] = dot_spec(lanes, &wr, &xt);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{TILE_AVX2, TILE_AVX512};

    const RM: usize = TILE_AVX512.0;
    const RN: usize = TILE_AVX512.1;

    /// c[i][j] = Σ_k w[i][k] · x[j][k], sixteen lanes per output.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    pub unsafe fn tile_avx512(w: &[*const f32; 4], x: &[*const f32; 6], k: usize, c: &mut [[f32; 6]; 4]) {
        let mut acc = [[_mm512_setzero_ps(); RN]; RM];
        for kk in (0..k).step_by(16) {
            // A last partial step loads zeros past the row's end.
            let mask: __mmask16 = if kk + 16 <= k { 0xffff } else { (1u16 << (k - kk)) - 1 };
            let mut wv = [_mm512_setzero_ps(); RM];
            for (i, v) in wv.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_ps(mask, w[i].add(kk));
            }
            for j in 0..RN {
                let xv = _mm512_maskz_loadu_ps(mask, x[j].add(kk));
                for i in 0..RM {
                    acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
        }
        for i in 0..RM {
            for j in 0..RN {
                c[i][j] = reduce512(acc[i][j]);
            }
        }
    }

    /// dst = src rounded to f16 values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(src: &[f32], dst: &mut [f32]) {
        let whole = src.len() - src.len() % 8;
        for i in (0..whole).step_by(8) {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        for i in whole..src.len() {
            dst[i] = crate::util::f16_to_f32(crate::util::f32_to_f16(src[i]));
        }
    }

    /// GCC's `_mm512_reduce_add_ps`.
    #[inline(always)]
    unsafe fn reduce512(x: __m512) -> f32 {
        let t = _mm256_add_ps(_mm512_extractf32x8_ps::<1>(x), _mm512_castps512_ps256(x));
        reduce256(t)
    }

    /// tinyBLAS's hsum of 8 lanes: the upper half onto the lower, then movehl and movehdup.
    #[inline(always)]
    unsafe fn reduce256(t: __m256) -> f32 {
        let u = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
        let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }

    /// c[i][j] for the AVX2 tile, eight lanes per output.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_avx2(w: &[*const f32; 4], x: &[*const f32; 6], k: usize, c: &mut [[f32; 6]; 4]) {
        const RM2: usize = TILE_AVX2.0;
        const RN2: usize = TILE_AVX2.1;
        let mut acc = [[_mm256_setzero_ps(); RN2]; RM2];
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for kk in (0..k).step_by(8) {
            // A last partial step loads zeros past the row's end.
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((k - kk).min(8) as i32), lane);
            let mut wv = [_mm256_setzero_ps(); RM2];
            for (i, v) in wv.iter_mut().enumerate() {
                *v = _mm256_maskload_ps(w[i].add(kk), mask);
            }
            for j in 0..RN2 {
                let xv = _mm256_maskload_ps(x[j].add(kk), mask);
                for i in 0..RM2 {
                    acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
        }
        for i in 0..RM2 {
            for j in 0..RN2 {
                c[i][j] = reduce256(acc[i][j]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::WeightBytes;
    use std::sync::Arc;

    fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
        let mut s = seed;
        let mut bytes = Vec::new();
        for _ in 0..rows * cols {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            match ty {
                GgmlType::F16 => bytes.extend(f32_to_f16(v).to_le_bytes()),
                _ => bytes.extend(v.to_le_bytes()),
            }
        }
        QMatrix::new(ty, rows, cols, WeightBytes::Owned(Arc::new(bytes))).expect("a matrix")
    }

    fn activations(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| { s = s.wrapping_mul(22_695_477).wrapping_add(1); (s >> 9) as f32 / (1u32 << 22) as f32 - 1.0 }).collect()
    }

    /// Every ISA this CPU has equals the specification bit for bit, for row lengths that are
    /// and are not multiples of the lanes and for rows and tokens that do not fill the
    /// tiles and blocks.
    #[test]
    fn kernels_equal_the_specification() {
        let threads = Threads::new(2);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()) {
            for ty in [GgmlType::F16, GgmlType::F32] {
                for (rows, k, n) in [(5, 37, 7), (70, 72, 100), (3, 16, 1), (130, 200, 13), (1, 8, 200)] {
                    let w = matrix(ty, rows, k, (rows * k) as u32);
                    let x = activations(n * k, (n + k) as u32);
                    let (mut got, mut want) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                    gemm_isa(isa, &w, &x, n, &mut got, &threads);
                    gemm_spec(isa, &w, &x, n, &mut want);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} {ty} {rows}x{k}, {n} tokens", isa.name());
                }
            }
        }
    }

    /// The specification is a dot product: close to the f64 one.
    #[test]
    fn specification_is_a_dot_product() {
        let (w, x) = (activations(100, 3), activations(100, 4));
        let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        for lanes in [8, 16] {
            assert!((dot_spec(lanes, &w, &x) as f64 - exact).abs() < 1e-5, "{lanes} lanes");
        }
    }
}
