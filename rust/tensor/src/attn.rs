//! Row kernels for attention over an F16 or F32 cache: the scores of one cached key against
//! several queries (the heads sharing a KV head), f16 to f32 conversion of cached values,
//! and the probability-weighted accumulation of a value row into several outputs.
//!
//! `dot_queries` returns, bit for bit, what the table's `vec_dot` of the cache type returns
//! for each query (on AVX-512 it inlines the same arithmetic and loads the key once for all
//! queries; elsewhere it calls `vec_dot`), so attention can batch heads without changing a
//! score.

use crate::dispatch::{active_isa, Isa};
use crate::{traits, GgmlType};

/// Scores of key row `k` (n elements of `ty`, F16 or F32) against `n_q` queries: `out[h]`
/// is `traits(ty).vec_dot(n, k, q_bytes[h])`. The queries are given twice, as rows of `ty`
/// (`q_bytes`, n_q rows) and as their f32 values (`q_f32`, n_q rows of n).
pub fn dot_queries(ty: GgmlType, n: usize, k: &[u8], q_bytes: &[u8], q_f32: &[f32], n_q: usize, out: &mut [f32]) {
    let t = traits(ty).expect("cache types are in the table");
    let rb = t.row_bytes(n);
    assert!(k.len() >= rb && q_bytes.len() >= n_q * rb && q_f32.len() >= n_q * n && out.len() >= n_q);
    #[cfg(target_arch = "x86_64")]
    {
        if active_isa() == Isa::Avx512 && n % 64 == 0 {
            // SAFETY: lengths checked above; AVX-512 checked by the dispatch.
            unsafe {
                match ty {
                    GgmlType::F16 => return x86::dot_f16(n, k.as_ptr(), q_f32.as_ptr(), n_q, out.as_mut_ptr()),
                    GgmlType::F32 => return x86::dot_f32(n, k.as_ptr(), q_f32.as_ptr(), n_q, out.as_mut_ptr()),
                    _ => {}
                }
            }
        }
    }
    for h in 0..n_q {
        out[h] = (t.vec_dot)(n, k, &q_bytes[h * rb..(h + 1) * rb]);
    }
}

/// f16 row to f32 (exact).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert!(src.len() >= 2 * n);
    #[cfg(target_arch = "x86_64")]
    {
        if active_isa() >= Isa::Avx2 {
            // SAFETY: lengths checked above; F16C is part of the Avx2 level.
            unsafe { x86::f16_to_f32(n, src.as_ptr(), dst.as_mut_ptr()) };
            return;
        }
    }
    crate::scalar::float::f16_to_f32_row(&src[..2 * n], dst);
}

/// `acc[h * n + i] = acc[h * n + i] + p[h] * v[i]` (the product rounded, then the sum: the
/// arithmetic of a sequential weighted sum) for every query h with p[h] != 0.
pub fn accumulate(v: &[f32], p: &[f32], acc: &mut [f32]) {
    let n = v.len();
    assert!(acc.len() >= p.len() * n);
    #[cfg(target_arch = "x86_64")]
    {
        if active_isa() == Isa::Avx512 {
            for (h, &ph) in p.iter().enumerate() {
                if ph != 0.0 {
                    // SAFETY: lengths checked above; AVX-512 checked by the dispatch.
                    unsafe { x86::axpy(n, ph, v.as_ptr(), acc.as_mut_ptr().add(h * n)) };
                }
            }
            return;
        }
    }
    for (h, &ph) in p.iter().enumerate() {
        if ph != 0.0 {
            for (o, &x) in acc[h * n..(h + 1) * n].iter_mut().zip(v) {
                *o += ph * x;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// avx512::f16 of the table (four 16-lane accumulators over 64-element steps, then
    /// `_mm512_reduce_add_ps` of their sum), the key converted once for all queries.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_f16(n: usize, k: *const u8, q: *const f32, n_q: usize, out: *mut f32) {
        if n == 64 {
            let kv = [0, 1, 2, 3].map(|j| _mm512_cvtph_ps(_mm256_loadu_si256(k.add(32 * j) as *const __m256i)));
            for h in 0..n_q {
                let qh = q.add(h * n);
                let acc = [0, 1, 2, 3].map(|j| _mm512_fmadd_ps(kv[j], _mm512_loadu_ps(qh.add(16 * j)), _mm512_setzero_ps()));
                *out.add(h) = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
            }
            return;
        }
        for h in 0..n_q {
            let qh = q.add(h * n);
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                for j in 0..4 {
                    let a = _mm512_cvtph_ps(_mm256_loadu_si256(k.add(2 * (i + 16 * j)) as *const __m256i));
                    acc[j] = _mm512_fmadd_ps(a, _mm512_loadu_ps(qh.add(i + 16 * j)), acc[j]);
                }
                i += 64;
            }
            *out.add(h) = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        }
    }

    /// avx512::f32 of the table, for several queries.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_f32(n: usize, k: *const u8, q: *const f32, n_q: usize, out: *mut f32) {
        let k = k as *const f32;
        for h in 0..n_q {
            let qh = q.add(h * n);
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                for j in 0..4 {
                    acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(k.add(i + 16 * j)), _mm512_loadu_ps(qh.add(i + 16 * j)), acc[j]);
                }
                i += 64;
            }
            *out.add(h) = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_to_f32(n: usize, src: *const u8, dst: *mut f32) {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * i) as *const __m128i)));
            i += 8;
        }
        while i < n {
            *dst.add(i) = crate::util::f16_to_f32(std::ptr::read_unaligned(src.add(2 * i) as *const u16));
            i += 1;
        }
    }

    /// acc[i] = acc[i] + p * v[i], product and sum rounded separately.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn axpy(n: usize, p: f32, v: *const f32, acc: *mut f32) {
        let pv = _mm512_set1_ps(p);
        let mut i = 0;
        while i + 16 <= n {
            let prod = _mm512_mul_ps(pv, _mm512_loadu_ps(v.add(i)));
            _mm512_storeu_ps(acc.add(i), _mm512_add_ps(_mm512_loadu_ps(acc.add(i)), prod));
            i += 16;
        }
        while i < n {
            *acc.add(i) += p * *v.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }

    #[test]
    fn batched_scores_equal_vec_dot_bit_for_bit() {
        let mut seed = 5u64;
        for ty in [GgmlType::F16, GgmlType::F32] {
            let t = traits(ty).unwrap();
            for n in [64usize, 128, 256, 96] {
                let n_q = 7;
                let kf: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
                let qf: Vec<f32> = (0..n * n_q).map(|_| lcg(&mut seed)).collect();
                let mut k = vec![0u8; t.row_bytes(n)];
                (t.from_f32.unwrap())(&kf, &mut k);
                let mut qb = vec![0u8; t.row_bytes(n) * n_q];
                (t.from_f32.unwrap())(&qf, &mut qb);
                let mut q32 = vec![0f32; n * n_q];
                (t.to_f32)(&qb, &mut q32);
                let mut out = vec![0f32; n_q];
                dot_queries(ty, n, &k, &qb, &q32, n_q, &mut out);
                for h in 0..n_q {
                    let want = (t.vec_dot)(n, &k, &qb[h * t.row_bytes(n)..(h + 1) * t.row_bytes(n)]);
                    assert_eq!(out[h].to_bits(), want.to_bits(), "{ty} n {n} query {h}");
                }
            }
        }
    }

    #[test]
    fn conversion_and_accumulation_match_scalar() {
        let mut seed = 9u64;
        let n = 80;
        let vf: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let mut vb = vec![0u8; 2 * n];
        crate::scalar::float::f16_from_f32(&vf, &mut vb);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        f16_to_f32(&vb, &mut a);
        crate::scalar::float::f16_to_f32_row(&vb, &mut b);
        assert_eq!(a, b);
        let p = [0.25f32, 0.0, 0.3];
        let mut acc: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
        let mut want = acc.clone();
        accumulate(&a, &p, &mut acc);
        for h in 0..3 {
            for i in 0..n {
                if p[h] != 0.0 {
                    want[h * n + i] += p[h] * a[i];
                }
            }
        }
        assert!(acc.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
