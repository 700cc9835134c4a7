//! SIMD kernels (x86-64 AVX2 and AVX-512), substituted into the traits table when the CPU
//! has them. Every one is tested against the scalar kernel of its type (tests/simd.rs).
//!
//! The safe wrappers here check the slice lengths the raw-pointer kernels rely on; the
//! dispatch guarantees the CPU features.

use crate::dispatch::Isa;
use crate::traits::{FromF32, VecDot, VecDotX4};
use crate::GgmlType;

#[cfg(target_arch = "x86_64")]
pub mod x86;
#[cfg(target_arch = "x86_64")]
pub mod packed_x86;
#[cfg(target_arch = "x86_64")]
pub mod packed_avx2;
#[cfg(target_arch = "x86_64")]
pub mod ternary_avx2;
#[cfg(target_arch = "x86_64")]
pub mod ternary_avx512;
#[cfg(target_arch = "x86_64")]
pub mod iquants_avx2;
#[cfg(target_arch = "x86_64")]
pub mod iquants_avx512;
#[cfg(target_arch = "x86_64")]
pub mod q1q2_avx2;
#[cfg(target_arch = "x86_64")]
pub mod q1q2_avx512;
#[cfg(target_arch = "x86_64")]
pub mod nvfp4_avx2;
#[cfg(target_arch = "x86_64")]
pub mod nvfp4_avx512;
#[cfg(target_arch = "x86_64")]
pub mod ssm_x86;

/// The SIMD replacements for one type at one instruction-set level.
#[derive(Default, Clone, Copy)]
pub struct SimdKernels {
    pub vec_dot: Option<VecDot>,
    pub vec_dot_x4: Option<VecDotX4>,
    pub vec_dot_tiled: Option<VecDot>,
    pub vec_dot_tiled_x4: Option<VecDotX4>,
    pub vec_dot_repacked: Option<VecDot>,
    pub vec_dot_repacked_x4: Option<VecDotX4>,
    pub from_f32: Option<FromF32>,
}

/// Defines, for one kernel of one level, the safe `VecDot` and `VecDotX4` wrappers.
#[cfg(target_arch = "x86_64")]
macro_rules! block_dot {
    ($name:ident, $name4:ident, $kernel:path, $block:expr, $wbytes:expr, $xbytes:expr) => {
        fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let nb = n / $block;
            assert!(w.len() >= nb * $wbytes && x.len() >= nb * $xbytes, "row shorter than {n} elements");
            let mut out = [0f32; 1];
            // SAFETY: lengths checked above; the table only holds this for CPUs with the level.
            unsafe { $kernel(nb, w.as_ptr(), [x.as_ptr()], &mut out) };
            out[0]
        }
        fn $name4(n: usize, w: &[u8], x: &[u8], stride: usize, out: &mut [f32; 4]) {
            let nb = n / $block;
            assert!(w.len() >= nb * $wbytes && stride >= nb * $xbytes && x.len() >= 3 * stride + nb * $xbytes, "rows shorter than {n} elements");
            let p = x.as_ptr();
            // SAFETY: as above, for each of the four activation rows.
            unsafe { $kernel(nb, w.as_ptr(), [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], out) };
        }
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! float_dot {
    ($name:ident, $kernel:path, $bytes:expr) => {
        fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            assert!(w.len() >= n * $bytes && x.len() >= n * $bytes, "row shorter than {n} elements");
            // SAFETY: lengths checked above; CPU features guaranteed by the dispatch.
            unsafe { $kernel(n, w.as_ptr(), x.as_ptr()) }
        }
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! quantizer {
    ($name:ident, $kernel:path, $block:expr, $bytes:expr) => {
        fn $name(src: &[f32], dst: &mut [u8]) {
            let nb = src.len() / $block;
            assert!(src.len() % $block == 0 && dst.len() >= nb * $bytes, "bad quantization buffer sizes");
            // SAFETY: lengths checked above; CPU features guaranteed by the dispatch.
            unsafe { $kernel(nb, src.as_ptr(), dst.as_mut_ptr()) }
        }
    };
}

/// The wrappers of one level, and its table of kernels per type (`iq`, `tq`, `q12`: the
/// level's modules of i-quant, ternary and Q1_0/Q2_0 kernels).
#[cfg(target_arch = "x86_64")]
macro_rules! level {
    ($modname:ident, $lvl:ident, $iq:ident, $tq:ident, $q12:ident) => {
        pub mod $modname {
            use super::x86::$lvl as k;
            use super::$iq as iq;
            use super::$q12 as q12;
            use super::$tq as tq;
            use super::SimdKernels;
            use crate::GgmlType;
            block_dot!(q8_0, q8_0_x4, k::q8_0, 32, 34, 34);
            block_dot!(q4_0, q4_0_x4, k::q4_0, 32, 18, 34);
            block_dot!(q5_0, q5_0_x4, k::q5_0, 32, 22, 34);
            block_dot!(q8_0_tiled, q8_0_tiled_x4, k::q8_0_tiled, 32, 34, 34);
            block_dot!(q5_0_tiled, q5_0_tiled_x4, k::q5_0_tiled, 32, 22, 34);
            block_dot!(iq4_nl, iq4_nl_x4, k::iq4_nl, 32, 18, 34);
            block_dot!(mxfp4, mxfp4_x4, k::mxfp4, 32, 17, 34);
            block_dot!(mxfp4_repacked, mxfp4_repacked_x4, k::mxfp4_repacked, 32, 17, 34);
            block_dot!(nvfp4, nvfp4_x4, k::nvfp4, 64, 36, 68);
            block_dot!(q4_1, q4_1_x4, k::q4_1, 32, 20, 36);
            block_dot!(q5_1, q5_1_x4, k::q5_1, 32, 24, 36);
            block_dot!(q2_k, q2_k_x4, k::q2_k, 256, 84, 292);
            block_dot!(q3_k, q3_k_x4, k::q3_k, 256, 110, 292);
            block_dot!(q4_k, q4_k_x4, k::q4_k, 256, 144, 292);
            block_dot!(q5_k, q5_k_x4, k::q5_k, 256, 176, 292);
            block_dot!(iq4_xs, iq4_xs_x4, k::iq4_xs, 256, 136, 292);
            block_dot!(q2_k_tiled, q2_k_tiled_x4, k::q2_k_tiled, 256, 84, 292);
            block_dot!(q3_k_tiled, q3_k_tiled_x4, k::q3_k_tiled, 256, 110, 292);
            block_dot!(q4_k_tiled, q4_k_tiled_x4, k::q4_k_tiled, 256, 144, 292);
            block_dot!(q5_k_tiled, q5_k_tiled_x4, k::q5_k_tiled, 256, 176, 292);
            block_dot!(q6_k_tiled, q6_k_tiled_x4, k::q6_k_tiled, 256, 210, 292);
            block_dot!(iq4_xs_tiled, iq4_xs_tiled_x4, k::iq4_xs_tiled, 256, 136, 292);
            block_dot!(q6_k, q6_k_x4, k::q6_k, 256, 210, 292);
            block_dot!(q4_0_repacked, q4_0_repacked_x4, k::q4_0_repacked, 32, 18, 34);
            block_dot!(iq4_nl_repacked, iq4_nl_repacked_x4, k::iq4_nl_repacked, 32, 18, 34);
            block_dot!(q4_k_repacked, q4_k_repacked_x4, k::q4_k_repacked, 256, 144, 292);
            float_dot!(f16, k::f16, 2);
            float_dot!(bf16, k::bf16, 2);
            float_dot!(f32, k::f32, 4);
            quantizer!(quantize_q8_0, k::quantize_q8_0, 32, 34);
            quantizer!(quantize_q8_k, k::quantize_q8_k, 256, 292);
            quantizer!(quantize_f16, k::f16_from_f32, 1, 2);

            block_dot!(tq1_0, tq1_0_x4, tq::tq1_0, 256, 54, 292);
            block_dot!(tq2_0, tq2_0_x4, tq::tq2_0, 256, 66, 292);
            block_dot!(iq2_xxs, iq2_xxs_x4, iq::iq2_xxs, 256, 66, 292);
            block_dot!(iq2_xxs_tiled, iq2_xxs_tiled_x4, iq::iq2_xxs_tiled, 256, 66, 292);
            block_dot!(iq2_xs, iq2_xs_x4, iq::iq2_xs, 256, 74, 292);
            block_dot!(iq2_xs_tiled, iq2_xs_tiled_x4, iq::iq2_xs_tiled, 256, 74, 292);
            block_dot!(iq2_s, iq2_s_x4, iq::iq2_s, 256, 82, 292);
            block_dot!(iq2_s_tiled, iq2_s_tiled_x4, iq::iq2_s_tiled, 256, 82, 292);
            block_dot!(iq3_xxs, iq3_xxs_x4, iq::iq3_xxs, 256, 98, 292);
            block_dot!(iq3_xxs_tiled, iq3_xxs_tiled_x4, iq::iq3_xxs_tiled, 256, 98, 292);
            block_dot!(iq3_s, iq3_s_x4, iq::iq3_s, 256, 110, 292);
            block_dot!(iq3_s_tiled, iq3_s_tiled_x4, iq::iq3_s_tiled, 256, 110, 292);
            block_dot!(iq1_s, iq1_s_x4, iq::iq1_s, 256, 50, 292);
            block_dot!(iq1_s_tiled, iq1_s_tiled_x4, iq::iq1_s_tiled, 256, 50, 292);
            block_dot!(iq1_m, iq1_m_x4, iq::iq1_m, 256, 56, 292);
            block_dot!(iq1_m_tiled, iq1_m_tiled_x4, iq::iq1_m_tiled, 256, 56, 292);
            block_dot!(q1_0, q1_0_x4, q12::q1_0, 128, 18, 136);
            block_dot!(q2_0, q2_0_x4, q12::q2_0, 64, 18, 68);

            pub fn kernels(ty: GgmlType) -> SimdKernels {
                let both = |d: crate::traits::VecDot, d4: crate::traits::VecDotX4| SimdKernels { vec_dot: Some(d), vec_dot_x4: Some(d4), ..SimdKernels::default() };
                let kq = |d: crate::traits::VecDot, d4: crate::traits::VecDotX4, t: crate::traits::VecDot, t4: crate::traits::VecDotX4| SimdKernels {
                    vec_dot_tiled: Some(t),
                    vec_dot_tiled_x4: Some(t4),
                    ..both(d, d4)
                };
                let rp = |k: SimdKernels, d: crate::traits::VecDot, d4: crate::traits::VecDotX4| SimdKernels {
                    vec_dot_repacked: Some(d),
                    vec_dot_repacked_x4: Some(d4),
                    ..k
                };
                match ty {
                    GgmlType::Q8_0 => SimdKernels { from_f32: Some(quantize_q8_0), ..kq(q8_0, q8_0_x4, q8_0_tiled, q8_0_tiled_x4) },
                    GgmlType::Q4_0 => rp(both(q4_0, q4_0_x4), q4_0_repacked, q4_0_repacked_x4),
                    GgmlType::Q5_0 => kq(q5_0, q5_0_x4, q5_0_tiled, q5_0_tiled_x4),
                    GgmlType::IQ4_NL => rp(both(iq4_nl, iq4_nl_x4), iq4_nl_repacked, iq4_nl_repacked_x4),
                    GgmlType::MXFP4 => rp(both(mxfp4, mxfp4_x4), mxfp4_repacked, mxfp4_repacked_x4),
                    GgmlType::NVFP4 => both(nvfp4, nvfp4_x4),
                    GgmlType::Q4_1 => both(q4_1, q4_1_x4),
                    GgmlType::Q5_1 => both(q5_1, q5_1_x4),
                    GgmlType::Q2_K => kq(q2_k, q2_k_x4, q2_k_tiled, q2_k_tiled_x4),
                    GgmlType::Q3_K => kq(q3_k, q3_k_x4, q3_k_tiled, q3_k_tiled_x4),
                    GgmlType::Q4_K => rp(kq(q4_k, q4_k_x4, q4_k_tiled, q4_k_tiled_x4), q4_k_repacked, q4_k_repacked_x4),
                    GgmlType::Q5_K => kq(q5_k, q5_k_x4, q5_k_tiled, q5_k_tiled_x4),
                    GgmlType::Q6_K => kq(q6_k, q6_k_x4, q6_k_tiled, q6_k_tiled_x4),
                    GgmlType::IQ4_XS => kq(iq4_xs, iq4_xs_x4, iq4_xs_tiled, iq4_xs_tiled_x4),
                    GgmlType::TQ1_0 => both(tq1_0, tq1_0_x4),
                    GgmlType::TQ2_0 => both(tq2_0, tq2_0_x4),
                    GgmlType::IQ2_XXS => kq(iq2_xxs, iq2_xxs_x4, iq2_xxs_tiled, iq2_xxs_tiled_x4),
                    GgmlType::IQ2_XS => kq(iq2_xs, iq2_xs_x4, iq2_xs_tiled, iq2_xs_tiled_x4),
                    GgmlType::IQ2_S => kq(iq2_s, iq2_s_x4, iq2_s_tiled, iq2_s_tiled_x4),
                    GgmlType::IQ3_XXS => kq(iq3_xxs, iq3_xxs_x4, iq3_xxs_tiled, iq3_xxs_tiled_x4),
                    GgmlType::IQ3_S => kq(iq3_s, iq3_s_x4, iq3_s_tiled, iq3_s_tiled_x4),
                    GgmlType::IQ1_S => kq(iq1_s, iq1_s_x4, iq1_s_tiled, iq1_s_tiled_x4),
                    GgmlType::IQ1_M => kq(iq1_m, iq1_m_x4, iq1_m_tiled, iq1_m_tiled_x4),
                    GgmlType::Q1_0 => both(q1_0, q1_0_x4),
                    GgmlType::Q2_0 => both(q2_0, q2_0_x4),
                    GgmlType::Q8_K => SimdKernels { from_f32: Some(quantize_q8_k), ..SimdKernels::default() },
                    GgmlType::F16 => SimdKernels { vec_dot: Some(f16), from_f32: Some(quantize_f16), ..SimdKernels::default() },
                    GgmlType::BF16 => SimdKernels { vec_dot: Some(bf16), ..SimdKernels::default() },
                    GgmlType::F32 => SimdKernels { vec_dot: Some(f32), ..SimdKernels::default() },
                    _ => SimdKernels::default(),
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
level!(avx2, avx2, iquants_avx2, ternary_avx2, q1q2_avx2);
#[cfg(target_arch = "x86_64")]
level!(avx512, avx512, iquants_avx512, ternary_avx512, q1q2_avx512);

/// The kernel of `ty` in `table`, a list of AVX2 kernels, when `isa` is AVX2 or above and
/// this CPU has it (the `*_dot_for` lookups); None on other architectures.
#[cfg(target_arch = "x86_64")]
fn avx2_kernel<K: Copy>(ty: GgmlType, isa: Isa, table: &[(GgmlType, K)]) -> Option<K> {
    if isa < Isa::Avx2 || !isa.available() {
        return None;
    }
    table.iter().find(|(t, _)| *t == ty).map(|&(_, k)| k)
}

/// `avx2_kernel` on x86-64 (where the kernels exist), None elsewhere.
macro_rules! avx2_kernel {
    ($ty:expr, $isa:expr, [$($entry:expr),* $(,)?]) => {{
        #[cfg(target_arch = "x86_64")]
        let kernel = avx2_kernel($ty, $isa, &[$($entry),*]);
        #[cfg(not(target_arch = "x86_64"))]
        let kernel = {
            let _ = ($ty, $isa);
            None
        };
        kernel
    }};
}

/// The kernel of `ty` in `avx512`, a list of AVX-512 VNNI kernels, when `isa` is that level
/// and this CPU has it; else its kernel in `avx2` as `avx2_kernel`.
#[cfg(target_arch = "x86_64")]
fn level_kernel<K: Copy>(ty: GgmlType, isa: Isa, avx2: &[(GgmlType, K)], avx512: &[(GgmlType, K)]) -> Option<K> {
    let at_512 = (isa >= Isa::Avx512 && isa.available()).then(|| avx512.iter().find(|(t, _)| *t == ty).map(|&(_, k)| k)).flatten();
    at_512.or_else(|| avx2_kernel(ty, isa, avx2))
}

/// `level_kernel` on x86-64 (where the kernels exist), None elsewhere.
macro_rules! level_kernel {
    ($ty:expr, $isa:expr, [$($entry:expr),* $(,)?], [$($entry512:expr),* $(,)?]) => {{
        #[cfg(target_arch = "x86_64")]
        let kernel = level_kernel($ty, $isa, &[$($entry),*], &[$($entry512),*]);
        #[cfg(not(target_arch = "x86_64"))]
        let kernel = {
            let _ = ($ty, $isa);
            None
        };
        kernel
    }};
}

/// Eight consecutive weight rows times one activation row (of the type's `vec_dot_type`):
/// out[r] = row r of `w` (rows of n elements) times `x`, each bit for bit the type's row dot.
pub type Rows8Dot = fn(n: usize, w: &[u8], x: &[u8], out: &mut [f32; 8]);

/// Defines the safe wrapper of an eight-row one-token kernel.
#[cfg(target_arch = "x86_64")]
macro_rules! rows8_dot {
    ($name:ident, $kernel:path, $block:expr, $wbytes:expr, $xbytes:expr) => {
        fn $name(n: usize, w: &[u8], x: &[u8], out: &mut [f32; 8]) {
            let nb = n / $block;
            assert!(w.len() >= 8 * nb * $wbytes && x.len() >= nb * $xbytes, "rows shorter than {n} elements");
            // SAFETY: lengths checked above; `rows8_dot_for` returns it only for CPUs with its level.
            unsafe { $kernel(nb, w.as_ptr(), nb * $wbytes, x.as_ptr(), out) }
        }
    };
}
#[cfg(target_arch = "x86_64")]
rows8_dot!(nvfp4_rows8, nvfp4_avx2::nvfp4_rows8, 64, 36, 68);
#[cfg(target_arch = "x86_64")]
rows8_dot!(q1_0_rows8, q1q2_avx2::q1_0_rows8, 128, 18, 136);
#[cfg(target_arch = "x86_64")]
rows8_dot!(tq1_0_rows8, ternary_avx2::tq1_0_rows8, 256, 54, 292);
#[cfg(target_arch = "x86_64")]
rows8_dot!(tq2_0_rows8, ternary_avx2::tq2_0_rows8, 256, 66, 292);
#[cfg(target_arch = "x86_64")]
rows8_dot!(tq1_0_rows8_512, ternary_avx512::tq1_0_rows8, 256, 54, 292);
#[cfg(target_arch = "x86_64")]
rows8_dot!(q1_0_rows8_512, q1q2_avx512::q1_0_rows8, 128, 18, 136);
#[cfg(target_arch = "x86_64")]
rows8_dot!(tq2_0_rows8_512, ternary_avx512::tq2_0_rows8, 256, 66, 292);
#[cfg(target_arch = "x86_64")]
rows8_dot!(q4_0_repacked_rows8, x86::avx2::q4_0_repacked_rows8, 32, 18, 34);
#[cfg(target_arch = "x86_64")]
rows8_dot!(iq4_nl_repacked_rows8, x86::avx2::iq4_nl_repacked_rows8, 32, 18, 34);
#[cfg(target_arch = "x86_64")]
rows8_dot!(mxfp4_repacked_rows8, x86::avx2::mxfp4_repacked_rows8, 32, 17, 34);
#[cfg(target_arch = "x86_64")]
rows8_dot!(q4_0_repacked_rows8_512, x86::avx512::q4_0_repacked_rows8, 32, 18, 34);
#[cfg(target_arch = "x86_64")]
rows8_dot!(iq4_nl_repacked_rows8_512, x86::avx512::iq4_nl_repacked_rows8, 32, 18, 34);
#[cfg(target_arch = "x86_64")]
rows8_dot!(mxfp4_repacked_rows8_512, x86::avx512::mxfp4_repacked_rows8, 32, 17, 34);

/// The eight-row one-token kernel of `ty` at `isa`, for the types whose row dot keeps one
/// vector accumulator per row (NVFP4, Q1_0 against Q8_0; TQ1_0, TQ2_0 against Q8_K):
/// llama.cpp's one-token products of these call vec_dot row by row, and eight rows at a time
/// share the activation's loads and scales (and the ternary types' eight horizontal sums are
/// done together).
pub fn rows8_dot_for(ty: GgmlType, isa: Isa) -> Option<Rows8Dot> {
    level_kernel!(
        ty,
        isa,
        [(GgmlType::NVFP4, nvfp4_rows8 as Rows8Dot), (GgmlType::Q1_0, q1_0_rows8), (GgmlType::TQ1_0, tq1_0_rows8), (GgmlType::TQ2_0, tq2_0_rows8)],
        [(GgmlType::Q1_0, q1_0_rows8_512 as Rows8Dot), (GgmlType::TQ1_0, tq1_0_rows8_512), (GgmlType::TQ2_0, tq2_0_rows8_512)]
    )
}

/// The eight-row one-token kernel of the types llama.cpp repacks (Q4_0, IQ4_NL, MXFP4), for
/// matrices it repacks: their row dot is then one accumulator fed exact block sums
/// (`scalar::repacked`), eight rows at a time reduced together and accumulated by one vector
/// FMA (llama.cpp's repacked gemv shape).
pub fn repacked_rows8_dot_for(ty: GgmlType, isa: Isa) -> Option<Rows8Dot> {
    level_kernel!(
        ty,
        isa,
        [(GgmlType::Q4_0, q4_0_repacked_rows8 as Rows8Dot), (GgmlType::IQ4_NL, iq4_nl_repacked_rows8), (GgmlType::MXFP4, mxfp4_repacked_rows8)],
        [(GgmlType::Q4_0, q4_0_repacked_rows8_512 as Rows8Dot), (GgmlType::IQ4_NL, iq4_nl_repacked_rows8_512), (GgmlType::MXFP4, mxfp4_repacked_rows8_512)]
    )
}

/// Two consecutive weight rows times four activation rows (row t at x[t * stride..]):
/// out[r][t] bit for bit the type's row dot of row r and token t.
pub type Rows2X4Dot = fn(n: usize, w: &[u8], x: &[u8], stride: usize, out: &mut [[f32; 4]; 2]);

/// Defines the safe wrapper of a two-row, four-token kernel.
#[cfg(target_arch = "x86_64")]
macro_rules! rows2_x4_dot {
    ($name:ident, $kernel:path, $block:expr, $wbytes:expr, $xbytes:expr) => {
        fn $name(n: usize, w: &[u8], x: &[u8], stride: usize, out: &mut [[f32; 4]; 2]) {
            let nb = n / $block;
            assert!(w.len() >= 2 * nb * $wbytes && stride >= nb * $xbytes && x.len() >= 3 * stride + nb * $xbytes, "rows shorter than {n} elements");
            let (w, p) = (w.as_ptr(), x.as_ptr());
            // SAFETY: lengths checked above; `rows2_x4_dot_for` returns it only for CPUs with AVX2.
            unsafe { $kernel(nb, [w, w.add(nb * $wbytes)], [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], out) }
        }
    };
}
#[cfg(target_arch = "x86_64")]
rows2_x4_dot!(nvfp4_2x4, nvfp4_avx2::nvfp4_2x4, 64, 36, 68);

/// One weight row times four Q8_0 activation rows (row t at x[t * stride..]) whose sub-block
/// scales were converted to f32 beforehand (`q8_0_tile_scales`): out[t] bit for bit the
/// type's row dot of the row and token t.
pub type ScaledX4Dot = fn(n: usize, w: &[u8], x: &[u8], stride: usize, dx: &[f32], out: &mut [f32; 4]);

/// The f16 scales of four Q8_0 activation rows of n elements (row t at x[t * stride..]) as
/// f32, sub-block by sub-block: dx[4 * s + t] is sub-block s of row t (what `ScaledX4Dot`
/// kernels read).
pub fn q8_0_tile_scales(n: usize, x: &[u8], stride: usize, dx: &mut Vec<f32>) {
    let subs = n / 32;
    assert!(stride >= subs * 34 && x.len() >= 3 * stride + subs * 34, "rows shorter than {n} elements");
    dx.clear();
    for s in 0..subs {
        for t in 0..4 {
            let at = t * stride + s * 34;
            dx.push(crate::util::f16_to_f32(u16::from_le_bytes([x[at], x[at + 1]])));
        }
    }
}

/// Defines the safe wrapper of Q1_0's four-token kernel on f32 activation scales.
#[cfg(target_arch = "x86_64")]
macro_rules! q1_0_x4_scaled {
    ($name:ident, $kernel:path) => {
        fn $name(n: usize, w: &[u8], x: &[u8], stride: usize, dx: &[f32], out: &mut [f32; 4]) {
            let nb = n / 128;
            assert!(w.len() >= nb * 18 && stride >= nb * 136 && x.len() >= 3 * stride + nb * 136 && dx.len() >= 16 * nb, "rows shorter than {n} elements");
            let p = x.as_ptr();
            // SAFETY: lengths checked above; `scaled_x4_dot_for` returns it only for CPUs with its level.
            unsafe { $kernel(nb, w.as_ptr(), [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], dx.as_ptr(), out) }
        }
    };
}
#[cfg(target_arch = "x86_64")]
q1_0_x4_scaled!(q1_0_x4_scaled, q1q2_avx2::q1_0_x4_scaled);
#[cfg(target_arch = "x86_64")]
q1_0_x4_scaled!(q1_0_x4_scaled_512, q1q2_avx512::q1_0_x4_scaled);

/// The one-row, four-token kernel on f32 activation scales of `ty` at `isa` (Q1_0, whose
/// four Q8_0 scales per block and token otherwise cost as much to convert as the block's
/// products).
pub fn scaled_x4_dot_for(ty: GgmlType, isa: Isa) -> Option<ScaledX4Dot> {
    level_kernel!(ty, isa, [(GgmlType::Q1_0, q1_0_x4_scaled as ScaledX4Dot)], [(GgmlType::Q1_0, q1_0_x4_scaled_512 as ScaledX4Dot)])
}

/// The two-row, four-token kernel of `ty` at `isa` (NVFP4; see `rows8_dot_for`).
pub fn rows2_x4_dot_for(ty: GgmlType, isa: Isa) -> Option<Rows2X4Dot> {
    avx2_kernel!(ty, isa, [(GgmlType::NVFP4, nvfp4_2x4 as Rows2X4Dot)])
}

/// The kernels written for `ty` at `isa` (empty for Scalar or on other architectures).
/// Panics if `isa` is not available on this CPU: callers pass the detected level.
pub fn kernels_for(ty: GgmlType, isa: Isa) -> SimdKernels {
    assert!(isa.available(), "{} kernels requested on a CPU without them", isa.name());
    match isa {
        Isa::Scalar => SimdKernels::default(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::kernels(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::kernels(ty),
        #[cfg(not(target_arch = "x86_64"))]
        _ => SimdKernels::default(),
    }
}

/// The level whose kernels `kernels_for(ty, isa)` holds: `isa` itself; Scalar when there is
/// no SIMD row dot for `ty` at all (what the product of `ty` then falls back to). Panics as
/// `kernels_for` does.
pub fn kernel_isa(ty: GgmlType, isa: Isa) -> Isa {
    if kernels_for(ty, isa).vec_dot.is_none() { Isa::Scalar } else { isa }
}

/// Products of many tokens, for CPUs whose products have no packed kernels: Q8_0, Q4_0,
/// Q5_0, IQ4_NL, MXFP4 (against Q8_0 activations) and Q4_K (against Q8_K) with the
/// one-accumulator arithmetic of `scalar::repacked`, Q6_K with ggml's vec_dot lanes, the
/// i-quants with llama.cpp's tiled arithmetic (`scalar::iquants::tiled`, decoded into signed
/// values against biased activations, `iquants_avx2::octet_sums_iq`). Two kernels, both
/// bit-identical to the one-output dots:
/// - octets (every kind): eight rows decoded once per product into a transposed form
///   (`decode_octet`), one row per lane, so that a token's sums for the eight rows come out
///   of multiplies against its broadcast four-byte groups with no horizontal reduction;
/// - pairs (the legacy kinds, for the rows left over): two rows times four or eight tokens,
///   each quad's eight block sums reduced together and accumulated by one vector FMA.
#[derive(Clone, Copy, Debug)]
pub struct SumsGemm {
    kind: u8,
    wbytes: usize,
    /// The i-quants' octets go through the AVX-512 VNNI kernel (`iquants_avx512`).
    vnni: bool,
}

/// Quads of four tokens one `SumsGemm::run` covers at most.
pub const SUMS_MAX_QUADS: usize = 2;

/// Quads of four tokens one `SumsGemm::run_octet` covers at most, and one `TileFactors`
/// holds.
pub const OCTET_MAX_QUADS: usize = 4;

/// What `SumsGemm::run` needs of each quad of activation rows (see `sums_tile_factors`).
#[derive(Default)]
pub struct TileFactors {
    d: [Vec<f32>; OCTET_MAX_QUADS],
    corr: [Vec<i32>; OCTET_MAX_QUADS],
    /// The i-quant kinds' activation quants + 128, 256 bytes a block, the four rows of a
    /// quad one after another (`iquants_avx2::octet_sums_iq`).
    biased: [Vec<u8>; OCTET_MAX_QUADS],
}

/// `SumsGemm::kind` of Q4_K and Q6_K (the others are `decode32`'s).
const KIND_Q4_K: u8 = 5;
const KIND_Q6_K: u8 = 6;
/// The i-quants' kinds: this plus `iquants_avx2`'s octet kind (0..=6).
const KIND_IQ: u8 = 7;
/// TQ1_0 and TQ2_0 (the AVX-512 VNNI level only: `ternary_avx512`).
const KIND_TQ1: u8 = 14;
const KIND_TQ2: u8 = 15;
/// Q2_0 (the AVX-512 VNNI level only: `q1q2_avx512`).
const KIND_Q2: u8 = 16;
/// Q1_0 and NVFP4 (likewise: `q1q2_avx512`, `nvfp4_avx512`).
const KIND_Q1: u8 = 17;
const KIND_NV: u8 = 18;

/// The quants of the 4 * quads Q8_K rows x[t * stride..] (nb blocks each) + 128, as the
/// i-quant octet kernels take them (`TileFactors::biased`).
fn biased_quants(nb: usize, x: &[u8], stride: usize, quads: usize, f: &mut TileFactors) {
    for q in 0..quads {
        f.biased[q].resize(4 * nb * 256, 0);
        for t in 0..4 {
            let row = &x[(4 * q + t) * stride..];
            let dst = &mut f.biased[q][t * nb * 256..(t + 1) * nb * 256];
            for (b, d) in dst.chunks_exact_mut(256).enumerate() {
                for (d, &v) in d.iter_mut().zip(&row[292 * b + 4..292 * b + 260]) {
                    *d = v ^ 0x80;
                }
            }
        }
    }
}

/// The ternary kinds' factors of the 4 * quads Q8_K rows x[t * stride..] (nb blocks each):
/// minus their group-sum pairs (`ternary_avx512::tq_tile_factors`), in `TileFactors::corr`.
fn tq_factors(nb: usize, x: &[u8], stride: usize, quads: usize, f: &mut TileFactors) {
    for q in 0..quads {
        f.corr[q].resize(4 * nb * 8, 0);
        #[cfg(target_arch = "x86_64")]
        {
            let p = x[4 * q * stride..].as_ptr();
            // SAFETY: `check_acts` checked the rows; `for_type` gave the ternary kinds only to
            // AVX-512 VNNI CPUs.
            unsafe { ternary_avx512::tq_tile_factors(nb, [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], f.corr[q].as_mut_ptr()) };
        }
    }
}

impl SumsGemm {
    /// The kernel for `ty` at `isa`, if there is one (AVX2 and up).
    pub fn for_type(ty: GgmlType, isa: Isa) -> Option<SumsGemm> {
        if isa < Isa::Avx2 || !isa.available() {
            return None;
        }
        let (kind, wbytes) = match ty {
            GgmlType::Q8_0 => (0, 34),
            GgmlType::Q4_0 => (1, 18),
            GgmlType::Q5_0 => (2, 22),
            GgmlType::IQ4_NL => (3, 18),
            GgmlType::MXFP4 => (4, 17),
            GgmlType::Q4_K => (KIND_Q4_K, 144),
            GgmlType::Q6_K => (KIND_Q6_K, 210),
            GgmlType::IQ2_XXS => (KIND_IQ, 66),
            GgmlType::IQ2_XS => (KIND_IQ + 1, 74),
            GgmlType::IQ2_S => (KIND_IQ + 2, 82),
            GgmlType::IQ3_XXS => (KIND_IQ + 3, 98),
            GgmlType::IQ3_S => (KIND_IQ + 4, 110),
            GgmlType::IQ1_S => (KIND_IQ + 5, 50),
            GgmlType::IQ1_M => (KIND_IQ + 6, 56),
            GgmlType::TQ1_0 if isa >= Isa::Avx512 => (KIND_TQ1, 54),
            GgmlType::TQ2_0 if isa >= Isa::Avx512 => (KIND_TQ2, 66),
            GgmlType::Q2_0 if isa >= Isa::Avx512 => (KIND_Q2, 18),
            GgmlType::Q1_0 if isa >= Isa::Avx512 => (KIND_Q1, 18),
            GgmlType::NVFP4 if isa >= Isa::Avx512 => (KIND_NV, 36),
            _ => return None,
        };
        cfg!(target_arch = "x86_64").then_some(SumsGemm { kind, wbytes, vnni: isa >= Isa::Avx512 })
    }

    /// The level of the kernels `run_octet` uses: AVX-512 for the i-quants and the signed
    /// legacy kinds (Q8_0, IQ4_NL, MXFP4) on a CPU with it (and the ternary types, which have
    /// octets there only), AVX2 otherwise.
    pub fn octet_isa(&self) -> Isa {
        if self.vnni && (self.is_iq() || self.is_tq() || self.is_q1q2() || self.signed()) { Isa::Avx512 } else { Isa::Avx2 }
    }

    /// Whether the kind is an i-quant's.
    fn is_iq(&self) -> bool {
        (KIND_IQ..KIND_TQ1).contains(&self.kind)
    }

    /// Whether the kind is Q1_0's, Q2_0's or NVFP4's (against Q8_0 sub-blocks of 32, in
    /// blocks of 64 or 128).
    fn is_q1q2(&self) -> bool {
        matches!(self.kind, KIND_Q1 | KIND_Q2 | KIND_NV)
    }

    /// Whether the kind is TQ1_0's or TQ2_0's.
    fn is_tq(&self) -> bool {
        matches!(self.kind, KIND_TQ1 | KIND_TQ2)
    }

    /// Whether the kind's levels are signed (Q8_0, IQ4_NL).
    fn signed(&self) -> bool {
        matches!(self.kind, 0 | 3 | 4)
    }

    /// Whether `run` (two rows) serves this kind: the legacy ones.
    pub fn has_pairs(&self) -> bool {
        self.kind < KIND_Q4_K
    }

    /// Elements and activation bytes of a block.
    fn block(&self) -> (usize, usize) {
        match self.kind {
            KIND_Q2 | KIND_NV => (64, 68),
            KIND_Q1 => (128, 136),
            k if k >= KIND_Q4_K => (256, 292),
            _ => (32, 34),
        }
    }

    /// Bytes `decode_octet` writes for eight rows of n elements.
    pub fn octet_bytes(&self, n: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        let per_block = match self.kind {
            KIND_Q4_K => x86::avx2::Q4K_OCTET_BYTES,
            KIND_Q6_K => x86::avx2::Q6K_OCTET_BYTES,
            KIND_Q2 => q1q2_avx512::Q2_OCTET_BYTES,
            KIND_Q1 => q1q2_avx512::Q1_OCTET_BYTES,
            KIND_NV => nvfp4_avx512::NV_OCTET_BYTES,
            k if k >= KIND_TQ1 => ternary_avx512::TQ_OCTET_BYTES,
            k if k >= KIND_IQ => iquants_avx2::IQ_OCTET_BYTES,
            _ => x86::avx2::OCTET_BLOCK_BYTES,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let per_block = 0;
        n / self.block().0 * per_block
    }

    /// Decodes eight consecutive weight rows of n elements (`w`) into `dst`
    /// (`octet_bytes(n)` long), the operand of `run_octet`.
    pub fn decode_octet(&self, n: usize, w: &[u8], dst: &mut [u8]) {
        let nb = n / self.block().0;
        assert!(w.len() >= 8 * nb * self.wbytes && dst.len() >= self.octet_bytes(n), "operands shorter than 8 rows of {n} elements");
        #[cfg(target_arch = "x86_64")]
        {
            let (row_bytes, src, out) = (nb * self.wbytes, w.as_ptr(), dst.as_mut_ptr());
            // SAFETY: lengths checked above; `for_type` checked the CPU's AVX2 (AVX-512 VNNI
            // for the ternary kinds).
            unsafe {
                match self.kind {
                    0 => x86::avx2::decode_octet::<0>(nb, src, row_bytes, self.wbytes, out),
                    1 => x86::avx2::decode_octet::<1>(nb, src, row_bytes, self.wbytes, out),
                    2 => x86::avx2::decode_octet::<2>(nb, src, row_bytes, self.wbytes, out),
                    3 => x86::avx2::decode_octet::<3>(nb, src, row_bytes, self.wbytes, out),
                    4 => x86::avx2::decode_octet::<4>(nb, src, row_bytes, self.wbytes, out),
                    KIND_Q4_K => x86::avx2::decode_octet_q4_k(nb, src, row_bytes, out),
                    KIND_Q6_K => x86::avx2::decode_octet_q6_k(nb, src, row_bytes, out),
                    7 => iquants_avx2::decode_octet_iq::<0>(nb, src, row_bytes, out),
                    8 => iquants_avx2::decode_octet_iq::<1>(nb, src, row_bytes, out),
                    9 => iquants_avx2::decode_octet_iq::<2>(nb, src, row_bytes, out),
                    10 => iquants_avx2::decode_octet_iq::<3>(nb, src, row_bytes, out),
                    11 => iquants_avx2::decode_octet_iq::<4>(nb, src, row_bytes, out),
                    12 => iquants_avx2::decode_octet_iq::<5>(nb, src, row_bytes, out),
                    13 => iquants_avx2::decode_octet_iq::<6>(nb, src, row_bytes, out),
                    KIND_TQ1 => ternary_avx512::decode_octet_tq::<true>(nb, src, row_bytes, out),
                    KIND_TQ2 => ternary_avx512::decode_octet_tq::<false>(nb, src, row_bytes, out),
                    KIND_Q2 => q1q2_avx512::decode_octet_q2_0(nb, src, row_bytes, out),
                    KIND_NV => nvfp4_avx512::decode_octet_nvfp4(nb, src, row_bytes, out),
                    _ => q1q2_avx512::decode_octet_q1_0(nb, src, row_bytes, out),
                }
            }
        }
    }

    /// out[(4 q + t) * ldo + r] = row r of the octet `decode_octet` made of eight rows of n
    /// elements times activation row 4 (first_quad + q) + t of `x` (as given to `factors`,
    /// which prepared `f`), for q < quads. Bit-identical to `run` and the one-output kernels.
    ///
    /// # Safety
    /// `out` must be valid for writes of 8 floats at every (4 q + t) * ldo, q < quads.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_octet(&self, n: usize, octet: &[u8], x: &[u8], stride: usize, first_quad: usize, quads: usize, f: &TileFactors, out: *mut f32, ldo: usize) {
        assert!(octet.len() >= self.octet_bytes(n), "an octet of {n}-element rows");
        self.check_acts(n, x, stride, first_quad, quads, OCTET_MAX_QUADS);
        #[cfg(target_arch = "x86_64")]
        {
            let rows = |q: usize| -> [*const u8; 4] { std::array::from_fn(|t| x.as_ptr().wrapping_add((4 * (first_quad + q) + t) * stride)) };
            let o = octet.as_ptr();
            // The kernels take the quad count as a constant: one instance for each.
            macro_rules! per_quads {
                ($kernel:ident $(::<$narrow:literal>)? ($nb:expr $(, $per_quad:expr)*)) => {
                    match quads {
                        4 => $kernel::<4 $(, $narrow)?>($nb, o, std::array::from_fn(rows) $(, std::array::from_fn($per_quad))*, out, ldo),
                        3 => $kernel::<3 $(, $narrow)?>($nb, o, std::array::from_fn(rows) $(, std::array::from_fn($per_quad))*, out, ldo),
                        2 => $kernel::<2 $(, $narrow)?>($nb, o, std::array::from_fn(rows) $(, std::array::from_fn($per_quad))*, out, ldo),
                        _ => $kernel::<1 $(, $narrow)?>($nb, o, std::array::from_fn(rows) $(, std::array::from_fn($per_quad))*, out, ldo),
                    }
                };
            }
            let nb = n / self.block().0;
            if self.kind < KIND_Q4_K {
                assert!((first_quad..first_quad + quads).all(|q| f.d[q].len() >= 4 * nb && f.corr[q].len() >= 4 * nb), "tile factors of another size");
            }
            let d = |q: usize| f.d[first_quad + q].as_ptr();
            let c = |q: usize| f.corr[first_quad + q].as_ptr();
            if self.is_iq() {
                assert!((first_quad..first_quad + quads).all(|q| f.biased[q].len() >= 4 * nb * 256), "tile factors of another size");
            }
            if self.is_tq() {
                return self.run_octet_tq(nb, o, &rows, first_quad, quads, f, out, ldo);
            }
            if self.is_q1q2() {
                // Their Q8_0 sub-blocks: two a Q2_0 or NVFP4 block, four a Q1_0 block.
                let subs = self.block().0 / 32;
                assert!((first_quad..first_quad + quads).all(|q| f.d[q].len() >= 4 * subs * nb && f.corr[q].len() >= 4 * subs * nb), "tile factors of another size");
                use nvfp4_avx512::octet_sums_nvfp4;
                use q1q2_avx512::{octet_sums_q1_0, octet_sums_q2_0};
                // SAFETY: lengths checked above, `out` by the caller; `for_type` gave these
                // kinds only to AVX-512 VNNI CPUs.
                return match self.kind {
                    KIND_Q2 => per_quads!(octet_sums_q2_0(nb, d, c)),
                    KIND_NV => per_quads!(octet_sums_nvfp4(nb, d)),
                    _ => per_quads!(octet_sums_q1_0(nb, d)),
                };
            }
            if self.signed() && self.vnni {
                return self.run_octet_signed::<false>(nb, o, 0, &rows, first_quad, quads, f, out, ldo);
            }
            let biased = |q: usize| -> [*const u8; 4] { std::array::from_fn(|t| f.biased[first_quad + q][t * nb * 256..].as_ptr()) };
            use iquants_avx2::octet_sums_iq;
            use iquants_avx512::octet_sums_iq as octet_sums_iq_vnni;
            use x86::avx2::{octet_sums, octet_sums_q4_k, octet_sums_q6_k, octet_sums_signed};
            // SAFETY: lengths checked above, `out` by the caller; `for_type` checked the CPU's
            // AVX2, and its AVX-512 VNNI where `vnni` is set.
            match self.kind {
                k if k >= KIND_IQ && self.vnni && iquants_avx512::scale_per_32(k - KIND_IQ) => per_quads!(octet_sums_iq_vnni::<true>(nb, biased)),
                k if k >= KIND_IQ && self.vnni => per_quads!(octet_sums_iq_vnni::<false>(nb, biased)),
                k if k >= KIND_IQ && iquants_avx2::narrow_values(k - KIND_IQ) => per_quads!(octet_sums_iq::<true>(nb, biased)),
                k if k >= KIND_IQ => per_quads!(octet_sums_iq::<false>(nb, biased)),
                KIND_Q6_K => per_quads!(octet_sums_q6_k(nb)),
                KIND_Q4_K => per_quads!(octet_sums_q4_k(nb)),
                _ if self.signed() => per_quads!(octet_sums_signed(nb, d)),
                _ => per_quads!(octet_sums(nb, d, c)),
            }
        }
    }

    /// Whether `run_octet_pair` serves this kind (the i-quants and the signed legacy kinds
    /// at the AVX-512 level; the ternary kinds' octets fill 512-bit vectors by themselves).
    pub fn has_octet_pairs(&self) -> bool {
        self.vnni && (self.is_iq() || self.signed())
    }

    /// `run_octet` (PAIR false) or `run_octet_pair` (PAIR true) of the signed legacy kinds
    /// at the AVX-512 VNNI level (`x86::avx512::octet_sums_signed`), as `run_octet_tq`.
    ///
    /// # Safety
    /// As `run_octet_tq`.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_octet_signed<const PAIR: bool>(&self, nb: usize, octet: *const u8, octet_bytes: usize, rows: &dyn Fn(usize) -> [*const u8; 4],
                                                first_quad: usize, quads: usize, f: &TileFactors, out: *mut f32, ldo: usize) {
        assert!((first_quad..first_quad + quads).all(|q| f.d[q].len() >= 4 * nb), "tile factors of another size");
        let d = |q: usize| f.d[first_quad + q].as_ptr();
        macro_rules! call {
            ($kernel:ident, $q:literal) => {
                x86::avx512::$kernel::<$q>(nb, octet, octet_bytes, std::array::from_fn(rows), std::array::from_fn(d), out, ldo)
            };
        }
        // SAFETY: as the caller's; `vnni` is set for AVX-512 VNNI CPUs only.
        match (PAIR, quads) {
            (false, 4) => call!(octet_sums_signed, 4),
            (false, 3) => call!(octet_sums_signed, 3),
            (false, 2) => call!(octet_sums_signed, 2),
            (false, _) => call!(octet_sums_signed, 1),
            (true, 4) => call!(octet_pair_sums_signed, 4),
            (true, 3) => call!(octet_pair_sums_signed, 3),
            (true, 2) => call!(octet_pair_sums_signed, 2),
            (true, _) => call!(octet_pair_sums_signed, 1),
        }
    }

    /// `run_octet` of the ternary kinds, whose factors are the activations' group sums
    /// (`ternary_avx512::tq_tile_factors`), eight rows in 512-bit vectors.
    ///
    /// # Safety
    /// As `run_octet`; `octet` holds the octet of nb super-blocks and `rows(q)` the quads'
    /// activation rows, checked by the caller.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_octet_tq(&self, nb: usize, octet: *const u8, rows: &dyn Fn(usize) -> [*const u8; 4], first_quad: usize, quads: usize, f: &TileFactors,
                           out: *mut f32, ldo: usize) {
        assert!((first_quad..first_quad + quads).all(|q| f.corr[q].len() >= 4 * nb * 8), "tile factors of another size");
        let corr = |q: usize| f.corr[first_quad + q].as_ptr();
        macro_rules! call {
            ($q:literal) => {
                ternary_avx512::octet_sums_tq::<$q>(nb, octet, std::array::from_fn(rows), std::array::from_fn(corr), out, ldo)
            };
        }
        // SAFETY: as the caller's; `for_type` gave the ternary kinds only to AVX-512 VNNI CPUs.
        match quads {
            4 => call!(4),
            3 => call!(3),
            2 => call!(2),
            _ => call!(1),
        }
    }

    /// Makes two octets `decode_octet` wrote one after the other (of sixteen consecutive
    /// rows of n elements) the operand of `run_octet_pair`: the i-quants' are interleaved in
    /// place; the signed legacy kinds' kernel reads the two side by side as they are.
    /// Panics unless `has_octet_pairs`.
    pub fn pair_octets(&self, n: usize, octets: &mut [u8], scratch: &mut Vec<u8>) {
        assert!(self.has_octet_pairs(), "octet pairs of the i-quants and signed legacy kinds at the AVX-512 level only");
        if !self.is_iq() {
            return;
        }
        let octet_bytes = self.octet_bytes(n);
        assert!(octets.len() >= 2 * octet_bytes, "two octets of {n}-element rows");
        // SAFETY: length checked above; `for_type` checked the CPU's AVX-512 VNNI (`vnni`).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            iquants_avx512::interleave_octets(octets.as_mut_ptr(), octet_bytes, scratch)
        }
    }

    /// `run_octet` on `pairs` (1 or 2) pairs of octets made by `pair_octets`, one after the
    /// other (16 or 32 consecutive rows): out[(4 q + t) * ldo + r] for rows r of
    /// 0..16 pairs. Panics unless `has_octet_pairs`.
    ///
    /// # Safety
    /// `out` must be valid for writes of 16 pairs floats at every (4 q + t) * ldo, q < quads.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_octet_pair(&self, n: usize, octets: &[u8], pairs: usize, x: &[u8], stride: usize, first_quad: usize, quads: usize, f: &TileFactors, out: *mut f32, ldo: usize) {
        assert!(self.has_octet_pairs(), "octet pairs of the i-quants and signed legacy kinds at the AVX-512 level only");
        assert!(matches!(pairs, 1 | 2), "one or two pairs of octets");
        let octet_bytes = self.octet_bytes(n);
        assert!(octets.len() >= 2 * pairs * octet_bytes, "{pairs} pairs of octets of {n}-element rows");
        self.check_acts(n, x, stride, first_quad, quads, OCTET_MAX_QUADS);
        let nb = n / self.block().0;
        #[cfg(target_arch = "x86_64")]
        {
            let rows = |q: usize| -> [*const u8; 4] { std::array::from_fn(|t| x.as_ptr().wrapping_add((4 * (first_quad + q) + t) * stride)) };
            if self.signed() {
                for pair in 0..pairs {
                    let octet = octets.as_ptr().add(2 * pair * octet_bytes);
                    self.run_octet_signed::<true>(nb, octet, octet_bytes, &rows, first_quad, quads, f, out.add(16 * pair), ldo);
                }
                return;
            }
            assert!((first_quad..first_quad + quads).all(|q| f.biased[q].len() >= 4 * nb * 256), "tile factors of another size");
            let biased = |q: usize| -> [*const u8; 4] { std::array::from_fn(|t| f.biased[first_quad + q][t * nb * 256..].as_ptr()) };
            let o = octets.as_ptr();
            macro_rules! call {
                ($q:literal, $r:literal) => {
                    if iquants_avx512::scale_per_32(self.kind - KIND_IQ) {
                        iquants_avx512::octet_pair_sums_iq::<$q, true, $r>(nb, o, 2 * octet_bytes, std::array::from_fn(rows), std::array::from_fn(biased), out, ldo)
                    } else {
                        iquants_avx512::octet_pair_sums_iq::<$q, false, $r>(nb, o, 2 * octet_bytes, std::array::from_fn(rows), std::array::from_fn(biased), out, ldo)
                    }
                };
            }
            // SAFETY: lengths checked above, `out` by the caller; `for_type` checked the CPU's
            // AVX-512 VNNI (`vnni`).
            match (quads, pairs) {
                (4, 1) => call!(4, 1),
                (3, 1) => call!(3, 1),
                (2, 1) => call!(2, 1),
                (_, 1) => call!(1, 1),
                (4, _) => call!(4, 2),
                (3, _) => call!(3, 2),
                (2, _) => call!(2, 2),
                _ => call!(1, 2),
            }
        }
    }

    /// Checks quads first_quad..first_quad + quads of activation rows x.
    fn check_acts(&self, n: usize, x: &[u8], stride: usize, first_quad: usize, quads: usize, max_quads: usize) {
        let (elems, act_bytes) = self.block();
        let row = n / elems * act_bytes;
        assert!((1..=max_quads).contains(&quads) && first_quad + quads <= OCTET_MAX_QUADS, "1 to {max_quads} quads of tokens, within a tile's {OCTET_MAX_QUADS}");
        assert!(stride >= row && x.len() >= (4 * (first_quad + quads) - 1) * stride + row, "activation rows shorter than {n} elements");
    }

    /// Prepares `f` for the 4 * quads activation rows x[t * stride..] of n elements (the
    /// legacy kinds' activation scales and corrections, the i-quants' biased quants; the
    /// k-quant kernels read their own).
    pub fn factors(&self, n: usize, x: &[u8], stride: usize, quads: usize, f: &mut TileFactors) {
        self.check_acts(n, x, stride, 0, quads, OCTET_MAX_QUADS);
        if self.is_tq() {
            return tq_factors(n / 256, x, stride, quads, f);
        }
        if self.is_iq() {
            return biased_quants(n / 256, x, stride, quads, f);
        }
        if self.kind >= KIND_Q4_K && !self.is_q1q2() {
            return;
        }
        let nb = n / 32;
        for q in 0..quads {
            f.d[q].resize(4 * nb, 0.0);
            f.corr[q].resize(4 * nb, 0);
            #[cfg(target_arch = "x86_64")]
            {
                let p = x[4 * q * stride..].as_ptr();
                // Q2_0's codes are its values plus 1.
                let offset = if self.kind == KIND_Q2 { 1 } else { x86::avx2::unsigned_offset(self.kind) };
                // SAFETY: lengths checked above; `for_type` checked the CPU's AVX2.
                unsafe { x86::avx2::sums_tile_factors(nb, [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], offset, f.d[q].as_mut_ptr(), f.corr[q].as_mut_ptr()) };
            }
        }
    }

    /// out[q][r][t] = row r of `w` (two consecutive rows of n elements) times activation row
    /// 4 (first_quad + q) + t (x[(4 (first_quad + q) + t) * stride..], as given to
    /// `factors`, which prepared `f`), for q < quads. Panics unless `has_pairs`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(&self, n: usize, w: &[u8], x: &[u8], stride: usize, first_quad: usize, quads: usize, f: &TileFactors, out: &mut [[[f32; 4]; 2]; SUMS_MAX_QUADS]) {
        assert!(self.has_pairs(), "two-row kernels of the legacy kinds only");
        self.check_acts(n, x, stride, first_quad, quads, SUMS_MAX_QUADS);
        let nb = n / 32;
        assert!(w.len() >= 2 * nb * self.wbytes, "weight rows shorter than {n} elements");
        assert!((first_quad..first_quad + quads).all(|q| f.d[q].len() >= 4 * nb && f.corr[q].len() >= 4 * nb), "tile factors of another size");
        #[cfg(target_arch = "x86_64")]
        {
            use x86::avx2::sums_2xq;
            let w0 = w.as_ptr();
            let w = [w0, w0.wrapping_add(nb * self.wbytes)];
            let rows = |q: usize| std::array::from_fn(|t| x.as_ptr().wrapping_add((4 * (first_quad + q) + t) * stride));
            let (d, c) = (|q: usize| f.d[first_quad + q].as_ptr(), |q: usize| f.corr[first_quad + q].as_ptr());
            macro_rules! call {
                ($kind:literal) => {
                    // SAFETY: lengths checked above; `for_type` checked the CPU's AVX2.
                    unsafe {
                        if quads == 2 {
                            sums_2xq::<$kind, 2>(nb, w, self.wbytes, [rows(0), rows(1)], [d(0), d(1)], [c(0), c(1)], out)
                        } else {
                            let mut one = [out[0]];
                            sums_2xq::<$kind, 1>(nb, w, self.wbytes, [rows(0)], [d(0)], [c(0)], &mut one);
                            out[0] = one[0];
                        }
                    }
                };
            }
            match self.kind {
                0 => call!(0),
                1 => call!(1),
                2 => call!(2),
                3 => call!(3),
                _ => call!(4),
            }
        }
    }
}
