use super::*;
use crate::attn::{v_cols, V_SETS};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }
    fn below(&mut self, n: usize) -> usize {
        ((self.next() / 4.0 + 0.5) * n as f32) as usize % n
    }
}

fn cache(ty: GgmlType, vals: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F16 => vals.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect(),
        _ => vals.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    }
}

#[test]
fn the_expf_port_is_close_to_libm_and_handles_the_limits() {
    for i in -2000..2000 {
        let x = i as f32 * 0.0437;
        let (a, b) = (expf_avx2(x), x.exp());
        assert!((a - b).abs() <= b * 3e-7, "{x}: {a} vs {b}");
    }
    assert_eq!(expf_avx2(f32::NEG_INFINITY), 0.0);
    assert_eq!(expf_avx2(-1000.0), 0.0);
    assert_eq!(expf_avx2(0.0), 1.0);
    // Past the fast path (|n| > 126): subnormal results still close to libm's.
    let (a, b) = (expf_avx2(-95.0), (-95f32).exp());
    assert!((a - b).abs() <= b * 1e-6, "{a} vs {b}");
}

#[test]
fn the_vector_expf_equals_the_scalar_one_bit_for_bit() {
    if !Isa::Avx2.available() {
        return;
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run() {
        use std::arch::x86_64::*;
        let mut rng = Lcg(9);
        for i in 0..20000 {
            // Mixed chunks: the slow path runs whenever one lane needs it.
            let x: [f32; 8] = std::array::from_fn(|l| if (i + l) % 5 == 0 { rng.next() * 60.0 } else { rng.next() * 5.0 - (i % 7) as f32 * 3.0 });
            let mut y = [0f32; 8];
            _mm256_storeu_ps(y.as_mut_ptr(), x86::expf8(_mm256_loadu_ps(x.as_ptr())));
            for l in 0..8 {
                assert_eq!(y[l].to_bits(), expf_avx2(x[l]).to_bits(), "{}", x[l]);
            }
        }
    }
    // SAFETY: AVX2+FMA+F16C checked above.
    unsafe { run() }
}

/// One random call: n_t tokens of n_q heads over n_kv cells of a cache of `cells` cells.
struct Case {
    kt: GgmlType,
    vt: GgmlType,
    dk: usize,
    dv: usize,
    n_kv: usize,
    n_q: usize,
    n_t: usize,
    /// 0: causal prefixes with holes. Otherwise token t is in sequence s = t % seqs, as after
    /// prompts of several sequences in one batch and decoding in turns: it sees the s-th
    /// contiguous part of the cache and every cell j with j % seqs == s.
    seqs: usize,
}

fn check(c: &Case, rng: &mut Lcg) {
    let n_head_kv = 2;
    let cells = c.n_kv + 70;
    let cols = v_cols(cells);
    let kvals: Vec<f32> = (0..cells * n_head_kv * c.dk).map(|_| rng.next()).collect();
    let vvals: Vec<f32> = (0..V_SETS * cols * n_head_kv * c.dv).map(|_| rng.next()).collect();
    let (k, v) = (cache(c.kt, &kvals), cache(c.vt, &vvals));
    let es = |t: GgmlType| if t == GgmlType::F16 { 2 } else { 4 };
    let q: Vec<f32> = (0..c.n_t * c.n_q * c.dk).map(|_| rng.next()).collect();
    // Token t sees a causal prefix with holes; token 1 sees nothing.
    let mut mask = vec![f32::NEG_INFINITY; c.n_t * c.n_kv];
    for t in 0..c.n_t {
        let end = if t == 1 { 0 } else { c.n_kv - rng.below(c.n_kv.min(40)) };
        for j in 0..end {
            let seen = if c.seqs == 0 { rng.below(5) != 0 } else { j % c.seqs == t % c.seqs || j / (c.n_kv / c.seqs) == t % c.seqs };
            if seen {
                mask[t * c.n_kv + j] = 0.0;
            }
        }
    }
    let g = 1;
    let h = Heads {
        k_type: c.kt,
        v_type: c.vt,
        k: &k,
        k_stride: c.dk * es(c.kt),
        k_offset: g * cells * c.dk * es(c.kt),
        v: &v,
        v_stride: c.dv * es(c.vt),
        v_offset: g * V_SETS * cols * c.dv * es(c.vt),
        v_cols: cols,
        head_dim_k: c.dk,
        head_dim_v: c.dv,
        n_kv: c.n_kv,
        q: &q,
        q_stride: c.n_q * c.dk,
        n_q: c.n_q,
        n_t: c.n_t,
        mask: &mask,
        mask_stride: c.n_kv,
        out_stride: c.n_q * c.dv,
        scale: 0.125,
        order_kq: crate::attn::DotOrder::VecDot,
        order_vp: crate::attn::DotOrder::VecDot,
    };
    assert!(shape_ok(&h));
    let len = c.n_t * c.n_q * c.dv;
    let mut want = vec![f32::NAN; len];
    attend_spec(&h, &mut want, &mut SpecScratch::default());
    assert!(want.iter().all(|x| x.is_finite()));
    if c.n_t > 1 {
        assert!(want[c.n_q * c.dv..2 * c.n_q * c.dv].iter().all(|&x| x == 0.0), "a fully masked token outputs zeros");
    }
    if !Isa::Avx2.available() {
        return;
    }
    let mut got = vec![f32::NAN; len];
    let mut s = Avx2Scratch::default();
    // Twice with the same scratch: nothing depends on what a previous call left.
    for _ in 0..2 {
        // SAFETY: `got` holds every output of the call.
        unsafe { attend_raw(&h, got.as_mut_ptr(), &mut s) };
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{:?}/{:?} dk {} dv {} n_kv {} n_q {} n_t {}: output {i}: {a} vs {b}", c.kt, c.vt, c.dk, c.dv, c.n_kv, c.n_q, c.n_t);
        }
    }
}

#[test]
fn the_avx2_kernel_equals_the_specification_bit_for_bit() {
    let mut rng = Lcg(5);
    let types = [(GgmlType::F16, GgmlType::F16), (GgmlType::F32, GgmlType::F32), (GgmlType::F16, GgmlType::F32), (GgmlType::F32, GgmlType::F16)];
    let shapes = [(64, 64, 1000, 7, 1), (64, 64, 256, 7, 3), (128, 128, 300, 4, 2), (256, 256, 77, 2, 3), (64, 128, 37, 8, 2), (128, 64, 129, 5, 4), (64, 64, 5, 1, 2), (64, 64, 600, 3, 16),
        // Over 32 cells a lane: the weighted sums run in several blocks of cells.
        (64, 64, 2100, 3, 2)];
    for (kt, vt) in types {
        for (dk, dv, n_kv, n_q, n_t) in shapes {
            check(&Case { kt, vt, dk, dv, n_kv, n_q, n_t, seqs: 0 }, &mut rng);
        }
        // Several sequences in one cache: most cells are seen by no token of a call.
        for (dk, dv, n_kv, n_q, n_t, seqs) in [(64, 64, 1000, 7, 1, 8), (256, 256, 700, 4, 2, 8), (64, 64, 640, 2, 3, 4), (128, 128, 96, 1, 1, 3)] {
            check(&Case { kt, vt, dk, dv, n_kv, n_q, n_t, seqs }, &mut rng);
        }
    }
}

#[test]
fn the_specification_is_ggmls_sum_order() {
    // 40 terms: one step of 32 then eight leftovers (f64 for f16, after the reduce).
    let x: Vec<f32> = (0..40).map(|i| 1.0 + i as f32 * 1e-3).collect();
    let y: Vec<f32> = (0..40).map(|i| if i % 3 == 0 { 1e7 } else { 1.0 }).collect();
    let mut acc = [[0f32; 8]; 4];
    for i in 0..32 {
        acc[i / 8][i % 8] = x[i] * y[i];
    }
    let a: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
    let r = (t[0] + t[1]) + (t[2] + t[3]);
    let want = (32..40).fold(r as f64, |s, i| s + (x[i] * y[i]) as f64) as f32;
    assert_eq!(vec_dot(true, 40, |i| x[i], |i| y[i]).to_bits(), want.to_bits());
    assert_eq!(chunk_sum8(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), ((5.0 + 1.0) + (7.0 + 3.0)) + ((6.0 + 2.0) + (8.0 + 4.0)));
}
