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

/// The wrappers of one level, and its table of kernels per type.
#[cfg(target_arch = "x86_64")]
macro_rules! level {
    ($modname:ident, $lvl:ident) => {
        pub mod $modname {
            use super::x86::$lvl as k;
            use super::SimdKernels;
            use crate::GgmlType;
            block_dot!(q8_0, q8_0_x4, k::q8_0, 32, 34, 34);
            block_dot!(q4_0, q4_0_x4, k::q4_0, 32, 18, 34);
            block_dot!(q5_0, q5_0_x4, k::q5_0, 32, 22, 34);
            block_dot!(q8_0_tiled, q8_0_tiled_x4, k::q8_0_tiled, 32, 34, 34);
            block_dot!(q5_0_tiled, q5_0_tiled_x4, k::q5_0_tiled, 32, 22, 34);
            block_dot!(iq4_nl, iq4_nl_x4, k::iq4_nl, 32, 18, 34);
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
            float_dot!(f32, k::f32, 4);
            quantizer!(quantize_q8_0, k::quantize_q8_0, 32, 34);
            quantizer!(quantize_q8_k, k::quantize_q8_k, 256, 292);

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
                    GgmlType::Q4_1 => both(q4_1, q4_1_x4),
                    GgmlType::Q5_1 => both(q5_1, q5_1_x4),
                    GgmlType::Q2_K => kq(q2_k, q2_k_x4, q2_k_tiled, q2_k_tiled_x4),
                    GgmlType::Q3_K => kq(q3_k, q3_k_x4, q3_k_tiled, q3_k_tiled_x4),
                    GgmlType::Q4_K => rp(kq(q4_k, q4_k_x4, q4_k_tiled, q4_k_tiled_x4), q4_k_repacked, q4_k_repacked_x4),
                    GgmlType::Q5_K => kq(q5_k, q5_k_x4, q5_k_tiled, q5_k_tiled_x4),
                    GgmlType::Q6_K => kq(q6_k, q6_k_x4, q6_k_tiled, q6_k_tiled_x4),
                    GgmlType::IQ4_XS => kq(iq4_xs, iq4_xs_x4, iq4_xs_tiled, iq4_xs_tiled_x4),
                    GgmlType::Q8_K => SimdKernels { from_f32: Some(quantize_q8_k), ..SimdKernels::default() },
                    GgmlType::F16 => SimdKernels { vec_dot: Some(f16), ..SimdKernels::default() },
                    GgmlType::F32 => SimdKernels { vec_dot: Some(f32), ..SimdKernels::default() },
                    _ => SimdKernels::default(),
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
level!(avx2, avx2);
#[cfg(target_arch = "x86_64")]
level!(avx512, avx512);

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

/// Two weight rows times four or eight tokens with the one-accumulator arithmetic of
/// `scalar::repacked` (Q8_0, Q4_0, Q5_0, IQ4_NL against Q8_0 activations), for CPUs whose
/// many-token products have no packed kernels: each quad of tokens' eight outputs' block
/// sums are reduced together and accumulated by one vector FMA, and a block's weights are
/// decoded once for all the tokens. Bit-identical to the one-output kernels.
#[derive(Clone, Copy, Debug)]
pub struct SumsGemm {
    kind: u8,
    wbytes: usize,
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
            _ => return None,
        };
        cfg!(target_arch = "x86_64").then_some(SumsGemm { kind, wbytes })
    }

    /// Whether `decode_octet` and `run_octet` serve this kind: the unsigned ones (Q4_0,
    /// Q5_0), whose pair sums leave room to add in i16.
    pub fn has_octets(&self) -> bool {
        matches!(self.kind, 1 | 2)
    }

    /// Bytes `decode_octet` writes for eight rows of n elements.
    pub fn octet_bytes(n: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        return n / 32 * x86::avx2::OCTET_BLOCK_BYTES;
        #[cfg(not(target_arch = "x86_64"))]
        return n / 32 * (8 * 32 + 8 * 4);
    }

    /// Decodes eight consecutive weight rows of n elements (`w`) into `dst`
    /// (`octet_bytes(n)` long), the operand of `run_octet`. Panics unless `has_octets`.
    pub fn decode_octet(&self, n: usize, w: &[u8], dst: &mut [u8]) {
        let nb = n / 32;
        assert!(self.has_octets(), "octets of an unsigned kind only");
        assert!(w.len() >= 8 * nb * self.wbytes && dst.len() >= Self::octet_bytes(n), "operands shorter than 8 rows of {n} elements");
        #[cfg(target_arch = "x86_64")]
        {
            let (row_bytes, src, out) = (nb * self.wbytes, w.as_ptr(), dst.as_mut_ptr());
            // SAFETY: lengths checked above; `for_type` checked the CPU's AVX2.
            unsafe {
                if self.kind == 1 {
                    x86::avx2::decode_octet::<1>(nb, src, row_bytes, self.wbytes, out)
                } else {
                    x86::avx2::decode_octet::<2>(nb, src, row_bytes, self.wbytes, out)
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
        let nb = n / 32;
        assert!(self.has_octets() && octet.len() >= Self::octet_bytes(n), "an octet of {n}-element rows");
        Self::check_acts(n, x, stride, first_quad, quads, OCTET_MAX_QUADS);
        assert!((first_quad..first_quad + quads).all(|q| f.d[q].len() >= 4 * nb && f.corr[q].len() >= 4 * nb), "tile factors of another size");
        #[cfg(target_arch = "x86_64")]
        {
            use x86::avx2::octet_sums;
            let rows = |q: usize| std::array::from_fn(|t| x.as_ptr().wrapping_add((4 * (first_quad + q) + t) * stride));
            let (d, c) = (|q: usize| f.d[first_quad + q].as_ptr(), |q: usize| f.corr[first_quad + q].as_ptr());
            let o = octet.as_ptr();
            // SAFETY: lengths checked above, `out` by the caller; `for_type` checked the CPU's AVX2.
            match quads {
                4 => octet_sums::<4>(nb, o, [rows(0), rows(1), rows(2), rows(3)], [d(0), d(1), d(2), d(3)], [c(0), c(1), c(2), c(3)], out, ldo),
                3 => octet_sums::<3>(nb, o, [rows(0), rows(1), rows(2)], [d(0), d(1), d(2)], [c(0), c(1), c(2)], out, ldo),
                2 => octet_sums::<2>(nb, o, [rows(0), rows(1)], [d(0), d(1)], [c(0), c(1)], out, ldo),
                _ => octet_sums::<1>(nb, o, [rows(0)], [d(0)], [c(0)], out, ldo),
            }
        }
    }

    /// Checks quads first_quad..first_quad + quads of activation rows x and their factors.
    fn check_acts(n: usize, x: &[u8], stride: usize, first_quad: usize, quads: usize, max_quads: usize) {
        let nb = n / 32;
        assert!((1..=max_quads).contains(&quads) && first_quad + quads <= OCTET_MAX_QUADS, "1 to {max_quads} quads of tokens, within a tile's {OCTET_MAX_QUADS}");
        assert!(stride >= nb * 34 && x.len() >= (4 * (first_quad + quads) - 1) * stride + nb * 34, "activation rows shorter than {n} elements");
    }

    /// Prepares `f` for the 4 * quads activation rows x[t * stride..] of n elements.
    pub fn factors(&self, n: usize, x: &[u8], stride: usize, quads: usize, f: &mut TileFactors) {
        Self::check_acts(n, x, stride, 0, quads, OCTET_MAX_QUADS);
        let nb = n / 32;
        for q in 0..quads {
            f.d[q].resize(4 * nb, 0.0);
            f.corr[q].resize(4 * nb, 0);
            #[cfg(target_arch = "x86_64")]
            {
                let p = x[4 * q * stride..].as_ptr();
                let offset = x86::avx2::unsigned_offset(self.kind);
                // SAFETY: lengths checked above; `for_type` checked the CPU's AVX2.
                unsafe { x86::avx2::sums_tile_factors(nb, [p, p.add(stride), p.add(2 * stride), p.add(3 * stride)], offset, f.d[q].as_mut_ptr(), f.corr[q].as_mut_ptr()) };
            }
        }
    }

    /// out[q][r][t] = row r of `w` (two consecutive rows of n elements) times activation row
    /// 4 (first_quad + q) + t (x[(4 (first_quad + q) + t) * stride..], as given to
    /// `factors`, which prepared `f`), for q < quads.
    #[allow(clippy::too_many_arguments)]
    pub fn run(&self, n: usize, w: &[u8], x: &[u8], stride: usize, first_quad: usize, quads: usize, f: &TileFactors, out: &mut [[[f32; 4]; 2]; SUMS_MAX_QUADS]) {
        Self::check_acts(n, x, stride, first_quad, quads, SUMS_MAX_QUADS);
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
                _ => call!(3),
            }
        }
    }
}
