//! AVX-512 VNNI kernels over packed 16-row groups (see `crate::packed` for the layouts and
//! the arithmetic each type must reproduce). One 512-bit vector holds 16 rows; VPDPBUSD
//! multiplies four unsigned weight bytes per row by four signed activation bytes broadcast to
//! all rows. Weights are stored (or decoded) unsigned with an offset, and the accumulator of
//! each VPDPBUSD starts at the activation's precomputed correction -offset * sum(x), so the
//! integer results are exactly the signed dot products.
//!
//! SAFETY (whole module): `KernelArgs` points at a packed matrix with at least g + 1 groups,
//! activations for tokens t0..t0 + T and outputs for them (checked by `packed::product`'s
//! callers), and these functions are only reached on CPUs with AVX-512 F/BW/VL/VNNI
//! (`packed::kernels` checks the active ISA).

use std::arch::x86_64::*;

use crate::packed::{KernelArgs, KindKernels, PackKind};

/// Block b of plane i.
#[inline(always)]
unsafe fn at(a: &KernelArgs, base: *const u8, b: usize, i: usize) -> *const u8 {
    let (c, k) = if a.bpc == 2 { (b >> 1, b & 1) } else { (b, 0) };
    base.add(c * a.chunk_bytes + a.plane[i] + k * a.plane_size[i])
}

/// The kernels for `kind`, with their token tile.
pub fn kernels(kind: PackKind) -> KindKernels {
    match kind {
        PackKind::Q8_0 => KindKernels { tile: 2, tiled: legacy_lanes::<0, 2>, single: legacy_lanes::<0, 1> },
        PackKind::Q5_0 => KindKernels { tile: 2, tiled: legacy_lanes::<1, 2>, single: legacy_lanes::<1, 1> },
        PackKind::Q4_0 => KindKernels { tile: 4, tiled: legacy_block::<0, 4>, single: legacy_block::<0, 1> },
        PackKind::Iq4Nl => KindKernels { tile: 4, tiled: legacy_block::<1, 4>, single: legacy_block::<1, 1> },
        PackKind::Q4K => KindKernels { tile: 4, tiled: q4_k::<4>, single: q4_k::<1> },
        PackKind::Q6K => KindKernels { tile: 2, tiled: q6_k::<2>, single: q6_k::<1> },
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// The activation dword (4 quants) at byte `off` of token t's row, broadcast to 16 lanes.
#[inline(always)]
unsafe fn act4(a: &KernelArgs, t: usize, off: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(a.qs.add(t * a.cols + off) as *const i32))
}

#[inline(always)]
unsafe fn aux(a: &KernelArgs, t: usize, b: usize, i: usize) -> i32 {
    *a.aux.add((t * a.nb + b) * a.aux_per_block + i)
}

#[inline(always)]
unsafe fn act_d(a: &KernelArgs, t: usize, b: usize) -> __m512 {
    _mm512_set1_ps(*a.d.add(t * a.nb + b))
}

/// 16 f16 scales of a plane block as f32.
#[inline(always)]
unsafe fn scales16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// ggml's hsum_float_8 applied lane-wise to eight accumulators: ((x0 + x4) + (x2 + x6)) +
/// ((x1 + x5) + (x3 + x7)).
#[inline(always)]
unsafe fn hsum8(x: &[__m512; 8]) -> __m512 {
    let r0 = _mm512_add_ps(x[4], x[0]);
    let r1 = _mm512_add_ps(x[5], x[1]);
    let r2 = _mm512_add_ps(x[6], x[2]);
    let r3 = _mm512_add_ps(x[7], x[3]);
    _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3))
}

#[inline(always)]
unsafe fn store(a: &KernelArgs, g: usize, t: usize, v: __m512) {
    _mm512_storeu_ps(a.out.add(t * a.out_stride + g * 16), v);
}

#[inline(always)]
unsafe fn nibbles(v: __m512i, high: bool) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0f);
    if high { _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) } else { _mm512_and_si512(v, m4) }
}

/// Q8_0 (KIND 0) and Q5_0 (KIND 1): eight lane accumulators per output (ggml's vec_dot).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn legacy_lanes<const KIND: u8, const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for b in 0..a.nb {
        let (dp, qp, hp) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2));
        let dw = scales16(dp);
        let mut ds = [_mm512_setzero_ps(); T];
        for t in 0..T {
            ds[t] = _mm512_mul_ps(dw, act_d(a, t0 + t, b));
        }
        for l in 0..8 {
            let w = if KIND == 0 {
                load(qp.add(l * 64))
            } else {
                let nib = nibbles(load(qp.add((l & 3) * 64)), l >= 4);
                let bits = std::ptr::read_unaligned(hp.add(l * 8) as *const u64);
                _mm512_mask_add_epi8(nib, bits, nib, _mm512_set1_epi8(16))
            };
            for t in 0..T {
                let init = _mm512_set1_epi32(aux(a, t0 + t, b, l));
                let s = _mm512_dpbusd_epi32(init, w, act4(a, t0 + t, b * 32 + 4 * l));
                acc[t][l] = _mm512_fmadd_ps(ds[t], _mm512_cvtepi32_ps(s), acc[t][l]);
            }
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, hsum8(&acc[t]));
    }
}

/// Q4_0 (KIND 0) and IQ4_NL (KIND 1): one accumulator per output (llama.cpp's repack).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn legacy_block<const KIND: u8, const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    // IQ4_NL levels + 128, as unsigned bytes, in each 128-bit lane.
    let table = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..a.nb {
        let (dp, qp) = (at(a, base, b, 0), at(a, base, b, 1));
        let dw = scales16(dp);
        let mut w = [_mm512_setzero_si512(); 8];
        for l in 0..8 {
            let nib = nibbles(load(qp.add((l & 3) * 64)), l >= 4);
            w[l] = if KIND == 0 { nib } else { _mm512_shuffle_epi8(table, nib) };
        }
        for t in 0..T {
            let mut s = _mm512_set1_epi32(aux(a, t0 + t, b, 0));
            for l in 0..8 {
                s = _mm512_dpbusd_epi32(s, w[l], act4(a, t0 + t, b * 32 + 4 * l));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, act_d(a, t0 + t, b)), acc[t]);
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, acc[t]);
    }
}

/// Q4_K: one accumulator for the scaled sums and one for the mins (llama.cpp's repack).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q4_k<const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    for b in 0..a.nb {
        let (dp, mp, sp, np, qp) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2), at(a, base, b, 3), at(a, base, b, 4));
        let mut isum = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            let mut s_lo = [_mm512_setzero_si512(); T];
            let mut s_hi = [_mm512_setzero_si512(); T];
            for l in 0..8 {
                let v = load(qp.add(p * 512 + l * 64));
                let (lo, hi) = (nibbles(v, false), nibbles(v, true));
                for t in 0..T {
                    let row = b * 256 + 64 * p + 4 * l;
                    s_lo[t] = _mm512_dpbusd_epi32(s_lo[t], lo, act4(a, t0 + t, row));
                    s_hi[t] = _mm512_dpbusd_epi32(s_hi[t], hi, act4(a, t0 + t, row + 32));
                }
            }
            let sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(sp.add(2 * p * 16) as *const __m128i));
            let sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(sp.add((2 * p + 1) * 16) as *const __m128i));
            for t in 0..T {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s_lo[t], sc_lo));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s_hi[t], sc_hi));
            }
        }
        let mut imin = [_mm512_setzero_si512(); T];
        for jp in 0..4 {
            let m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(np.add(jp * 32) as *const __m256i));
            for t in 0..T {
                imin[t] = _mm512_dpwssd_epi32(imin[t], m, _mm512_set1_epi32(aux(a, t0 + t, b, jp)));
            }
        }
        let (dw, dmw) = (scales16(dp), scales16(mp));
        for t in 0..T {
            let dx = act_d(a, t0 + t, b);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, dx), acc[t]);
            acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[t]), _mm512_mul_ps(dmw, dx), acc_min[t]);
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, _mm512_sub_ps(acc[t], acc_min[t]));
    }
}

/// Q6_K: eight lane accumulators per output, updated once per super-block (ggml's vec_dot).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q6_k<const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    for b in 0..a.nb {
        let (dp, sp, qp) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2));
        // Lane l starts at -32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]) (the -32 offset).
        let mut isum = [[_mm512_setzero_si512(); 8]; T];
        for l in 0..8 {
            let pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add(l * 32) as *const __m256i));
            for t in 0..T {
                let c = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs, _mm512_set1_epi32(aux(a, t0 + t, b, l)));
                isum[t][l] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(c, 5));
            }
        }
        for h in 0..2 {
            // The scales of the two 16-element groups of chunk k (32 elements 128h + 32k..).
            let mut sc = [[_mm512_setzero_si512(); 2]; 4];
            for k in 0..4 {
                let pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add((4 * h + k) * 32) as *const __m256i));
                sc[k] = [_mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16), _mm512_srai_epi32(pairs, 16)];
            }
            for l in 0..8 {
                let q = qp.add((h * 8 + l) * 192);
                let (ql0, ql1, qh) = (load(q), load(q.add(64)), load(q.add(128)));
                for k in 0..4 {
                    let ql = if k % 2 == 0 { ql0 } else { ql1 };
                    let lo = if k < 2 { _mm512_and_si512(ql, m4) } else { _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) };
                    let hb = match k {
                        0 => _mm512_slli_epi16(qh, 4),
                        1 => _mm512_slli_epi16(qh, 2),
                        2 => qh,
                        _ => _mm512_srli_epi16(qh, 2),
                    };
                    let w = _mm512_or_si512(lo, _mm512_and_si512(hb, m30));
                    for t in 0..T {
                        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, act4(a, t0 + t, b * 256 + 128 * h + 32 * k + 4 * l));
                        isum[t][l] = _mm512_add_epi32(isum[t][l], _mm512_mullo_epi32(p, sc[k][l / 4]));
                    }
                }
            }
        }
        let dw = scales16(dp);
        for t in 0..T {
            let d = _mm512_mul_ps(act_d(a, t0 + t, b), dw);
            for l in 0..8 {
                acc[t][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[t][l]), acc[t][l]);
            }
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, hsum8(&acc[t]));
    }
}
