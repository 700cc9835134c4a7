//! (a) every dot product is llama.cpp's x86 `ggml_vec_dot_*` bit for bit, at every
//! instruction-set level, and the tiled k-quant dots are its tiled matrix product's outputs
//! (fixtures from tests/gen_dot_fixtures.py); (b) every dot product
//! equals a float64 dot of the dequantized weight and the dequantized activation within a
//! rounding bound; (c) quantize -> dequantize round trips stay within each type's error bound.

mod common;

use common::*;
use ferrollama_tensor::traits::{build_table, TypeTraits, VecDot, VecDotX4};
use ferrollama_tensor::{GgmlType, Isa};

/// One section of tests/data/quants/vec_dot.fix: rows of one type against activations, with
/// ggml's quantized activations and ggml's dot products.
struct DotSection {
    ty: GgmlType,
    n: usize,
    seeds: Vec<usize>,
    rows: Vec<Vec<u8>>,
    acts: Vec<Vec<u8>>,
    /// result[r * acts.len() + a]
    results: Vec<f32>,
}

fn read_dot_fixture() -> Vec<DotSection> {
    read_sections("vec_dot.fix", b"FVDX")
}

/// tests/data/quants/lowbit_vec_dot.fix: the types of issue 27 (tests/gen_lowbit_fixtures.py,
/// recorded with ggml's AVX2 kernels).
fn read_lowbit_fixture() -> Vec<DotSection> {
    read_sections("lowbit_vec_dot.fix", b"FVDX")
}

/// tests/data/quants/lowbit_repacked.fix: MXFP4 rows through ggml's repacked x86 kernel.
fn read_lowbit_repacked_fixture() -> Vec<DotSection> {
    read_sections("lowbit_repacked.fix", b"FRPX")
}

/// tests/data/quants/tiled.fix: ggml_mul_mat of k-quant rows with 8 activation rows.
fn read_tiled_fixture() -> Vec<DotSection> {
    read_sections("tiled.fix", b"FTLX")
}

fn read_sections(file: &str, magic: &[u8; 4]) -> Vec<DotSection> {
    let path = format!("{DATA}/quants/{file}");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&b[..4], magic);
    let mut off = 4;
    let u32_at = |off: &mut usize| {
        let v = u32::from_le_bytes(b[*off..*off + 4].try_into().unwrap()) as usize;
        *off += 4;
        v
    };
    let count = u32_at(&mut off);
    let mut sections = Vec::new();
    for _ in 0..count {
        let ty = GgmlType::from_id(u32_at(&mut off) as u32).expect("known type");
        let (n, n_rows, n_acts) = (u32_at(&mut off), u32_at(&mut off), u32_at(&mut off));
        let seeds: Vec<usize> = (0..n_acts).map(|_| u32_at(&mut off)).collect();
        let (wb, xb) = (tr(ty).row_bytes(n), tr(tr(ty).vec_dot_type).row_bytes(n));
        let mut take = |len: usize| {
            let v = b[off..off + len].to_vec();
            off += len;
            v
        };
        let rows = (0..n_rows).map(|_| take(wb)).collect();
        let acts = (0..n_acts).map(|_| take(xb)).collect();
        let results = take(4 * n_rows * n_acts).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        sections.push(DotSection { ty, n, seeds, rows, acts, results });
    }
    sections
}

/// The activation formula of gen_dot_fixtures.py (exact in f32).
fn fixture_activation(n: usize, seed: usize) -> Vec<f32> {
    let scale = [1.0f32, 0.0625, 3.0][seed % 3];
    (0..n)
        .map(|i| {
            let v = ((i * 7919 + seed * 104729 + 17) % 2001) as f32 - 1000.0;
            let x = v / 250.0 * scale;
            if (i + seed) % 37 == 0 { x * 4.0 } else { x }
        })
        .collect()
}

fn entry(table: &[TypeTraits], ty: GgmlType) -> &TypeTraits {
    table.iter().find(|t| t.ty == ty).expect("type in table")
}

#[test]
fn activation_quantizers_give_ggml_x86_bytes() {
    let lowbit = read_lowbit_fixture().into_iter().chain(read_lowbit_repacked_fixture()).chain(read_sections("lowbit_tiled.fix", b"FTLX"));
    let lowbit = lowbit.chain(read_q1q2_fixture());
    for s in read_dot_fixture().into_iter().chain(read_tiled_fixture()).chain(lowbit) {
        let act = tr(s.ty).vec_dot_type;
        for (seed, want) in s.seeds.iter().zip(&s.acts) {
            assert_eq!(&quantize(act, &fixture_activation(s.n, *seed)), want, "{act} seed {seed}");
        }
    }
}

#[test]
fn dot_products_are_ggml_x86_bit_for_bit() {
    let sections = read_dot_fixture();
    assert_eq!(sections.len(), 24, "two sections for each of the 12 quantized types");
    sections_are_ggml_bit_for_bit(&sections, |e| Some((e.vec_dot, e.vec_dot_x4)));
}

#[test]
fn new_types_dot_products_are_ggml_avx2_bit_for_bit() {
    let sections = read_lowbit_fixture();
    let types: Vec<GgmlType> = sections.iter().map(|s| s.ty).collect();
    let done = [GgmlType::MXFP4, GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M];
    assert_eq!(types, done.iter().flat_map(|&t| [t, t]).collect::<Vec<_>>(), "two sections for each type of issue 27");
    sections_are_ggml_bit_for_bit(&sections, |e| Some((e.vec_dot, e.vec_dot_x4)));
}

/// tests/data/quants/q1q2_vec_dot.fix (tests/gen_q1q2_fixtures.py): Q1_0 through ggml's AVX2
/// kernel, Q2_0 through its generic one (x86 has no other).
fn read_q1q2_fixture() -> Vec<DotSection> {
    read_sections("q1q2_vec_dot.fix", b"FVDX")
}

#[test]
fn q1_0_and_q2_0_dot_products_are_ggml_x86_bit_for_bit() {
    let sections = read_q1q2_fixture();
    let types: Vec<GgmlType> = sections.iter().map(|s| s.ty).collect();
    assert_eq!(types, [GgmlType::Q1_0, GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::Q2_0], "two sections for each type");
    sections_are_ggml_bit_for_bit(&sections, |e| Some((e.vec_dot, e.vec_dot_x4)));
}

#[test]
fn mxfp4_repacked_dots_are_ggml_repacked_kernel_bit_for_bit() {
    let sections = read_lowbit_repacked_fixture();
    assert!(sections.len() == 1 && sections[0].ty == GgmlType::MXFP4);
    sections_are_ggml_bit_for_bit(&sections, |e| Some((e.vec_dot_repacked?, e.vec_dot_repacked_x4)));
}

/// Every level's kernel (`kernel` picks it, and its four-token form, from an entry) gives
/// each fixture result bit for bit.
fn sections_are_ggml_bit_for_bit(sections: &[DotSection], kernel: impl Fn(&TypeTraits) -> Option<(VecDot, Option<VecDotX4>)>) {
    let levels: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|l| l.available()).collect();
    for isa in levels {
        let table = build_table(isa);
        for s in sections {
            let (dot, dot_x4) = kernel(entry(&table, s.ty)).unwrap_or_else(|| panic!("{} {isa:?}: no such kernel", s.ty));
            let na = s.acts.len();
            for (r, row) in s.rows.iter().enumerate() {
                for (a, act) in s.acts.iter().enumerate() {
                    let (got, want) = (dot(s.n, row, act), s.results[r * na + a]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{} {isa:?} n={} row {r} act {a}: {got} vs ggml {want}", s.ty, s.n);
                }
                if let Some(x4) = dot_x4 {
                    let order = [0, 1, 2, 0].map(|a| a % na);
                    let stride = s.acts[0].len();
                    let xs: Vec<u8> = order.iter().flat_map(|&a| s.acts[a].iter().copied()).collect();
                    let mut out = [0f32; 4];
                    x4(s.n, row, &xs, stride, &mut out);
                    for (t, &a) in order.iter().enumerate() {
                        assert_eq!(out[t].to_bits(), s.results[r * na + a].to_bits(), "{} {isa:?} four-token kernel, row {r} token {t}", s.ty);
                    }
                }
            }
        }
    }
}

/// f64 dot of the dequantized operands, and the magnitude sum(|x|) * max(|w|) the float
/// rounding of a kernel is measured against.
fn reference(ty: GgmlType, w: &[u8], xq: &[u8], n: usize) -> (f64, f64) {
    let wd = dequantize(ty, w, n);
    let xd = dequantize(tr(ty).vec_dot_type, xq, n);
    let dot: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
    let wmax = wd.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    let xsum: f64 = xd.iter().map(|&v| v.abs() as f64).sum();
    (dot, wmax * xsum)
}

/// Why 2^-16: a kernel's float work is one product and one addition per block of 32 (the
/// integer sums are exact), so for n = 4096 at most ~2 * 128 roundings of 2^-24 relative to
/// partial sums no larger than sum(|x|) * max(|w|): below 2^-16 of it. One wrong element
/// would move the result by about 1/n = 2^-12 of that magnitude and be caught.
const DOT_BOUND: f64 = 1.0 / 65536.0;

#[test]
fn every_dot_product_matches_a_float64_reference() {
    let n = 4096;
    let mut rng = Rng::new(1);
    for &ty in WEIGHT_TYPES {
        for trial in 0..4 {
            let w = random_weights(ty, n, &mut rng);
            let x = rng.vec(n, if trial == 0 { 1.0 } else { 3.0 });
            let t = tr(ty);
            let xq = quantize(t.vec_dot_type, &x);
            let (want, scale) = reference(ty, &w, &xq, n);
            for (name, f) in [("scalar", t.vec_dot_scalar), ("table", t.vec_dot)] {
                let got = f(n, &w, &xq) as f64;
                assert!((got - want).abs() <= DOT_BOUND * scale, "{ty} {name} trial {trial}: {got} vs {want} (scale {scale})");
            }
        }
    }
}

/// Largest round-trip error allowed, as a fraction of the block's absolute maximum.
/// Legacy types: half a quantization step (plus the clamp of the extreme level for the
/// symmetric ones) plus the f16 rounding of the scale. k-quants and IQ4: half a step of
/// the coarsest sub-block scale; their searched scales have no closed-form bound, so these
/// are the errors measured on this data (max 0.30, 0.13, 0.061, 0.027, 0.016, 0.088 of the
/// super-block maximum) with about 1.4x room.
fn round_trip_bound(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1.0 / 2048.0,
        GgmlType::BF16 => 1.0 / 256.0,
        GgmlType::Q8_0 | GgmlType::Q8_1 => 0.5 / 127.0 + 1.0 / 2048.0,
        GgmlType::Q8_K => 0.5 / 127.0 + 1e-6,
        GgmlType::Q4_0 => 1.0 / 8.0 + 1.0 / 1024.0,
        GgmlType::Q5_0 => 1.0 / 16.0 + 1.0 / 1024.0,
        GgmlType::Q4_1 => 1.0 / 15.0 + 1.0 / 512.0,
        GgmlType::Q5_1 => 1.0 / 31.0 + 1.0 / 512.0,
        GgmlType::Q2_K => 0.40,
        GgmlType::Q3_K => 0.18,
        GgmlType::Q4_K => 0.09,
        GgmlType::Q5_K => 0.04,
        GgmlType::Q6_K => 0.025,
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => 0.12,
        // Levels 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2^e with 4 <= amax / 2^e < 8: the widest gap
        // (4 to 6) and the clamp above 6 both err by at most a quarter of the block maximum.
        GgmlType::MXFP4 => 0.25,
        // -amax, 0 or amax: at most half the block maximum.
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => 0.5,
        // Q2_0: -amax, 0, amax (or 2 amax, which no value reaches), plus the f16 rounding of
        // amax. Q1_0: +-mean(|x|), no farther from any value than the block maximum.
        GgmlType::Q2_0 => 0.5 + 1.0 / 1024.0,
        GgmlType::Q1_0 => 1.0 + 1.0 / 1024.0,
        other => panic!("no bound for {other}"),
    }
}

#[test]
fn quantize_dequantize_round_trips_within_the_type_bound() {
    let n = 8192;
    let mut rng = Rng::new(2);
    let quantizable = WEIGHT_TYPES.iter().copied().filter(|t| !NO_QUANTIZER.contains(t));
    let types: Vec<GgmlType> = quantizable.chain([GgmlType::Q8_1, GgmlType::Q8_K]).collect();
    for ty in types {
        let t = tr(ty);
        let mut x = rng.vec(n, 0.7);
        for i in (0..n).step_by(61) {
            x[i] *= 5.0;
        }
        for (name, q) in [("runtime", quantize(ty, &x)), ("reference", quantize_ref(ty, &x))] {
            let y = dequantize(ty, &q, n);
            let block = t.block_size.max(32);
            let mut worst = 0f32;
            for (xb, yb) in x.chunks(block).zip(y.chunks(block)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in xb.iter().zip(yb) {
                    worst = worst.max((a - b).abs() / amax);
                }
            }
            assert!(worst <= round_trip_bound(ty), "{ty} {name}: worst error {worst} of the block maximum");
        }
    }
}

#[test]
fn q8_0_activation_quantizer_is_x86_ggml() {
    // 127/amax then round-half-even: 0.5 * 127/127 rounds to 0, ggml's ref (roundf) gives 1.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = -1.5;
    let q = quantize(GgmlType::Q8_0, &x);
    assert_eq!(q[2..5], [127u8, 0, (-2i8) as u8]);
    let r = quantize_ref(GgmlType::Q8_0, &x);
    assert_eq!(r[2..5], [127u8, 1, (-2i8) as u8]);
}

#[test]
fn tiled_dot_products_are_ggml_tiled_matmul_bit_for_bit() {
    let sections = read_tiled_fixture();
    assert_eq!(sections.len(), 6, "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS");
    tiled_sections_are_ggml_bit_for_bit(&sections);
}

#[test]
fn new_types_tiled_dot_products_are_ggml_tiled_matmul_bit_for_bit() {
    let sections = read_sections("lowbit_tiled.fix", b"FTLX");
    assert_eq!(sections.iter().map(|s| s.ty).collect::<Vec<_>>(), [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M], "every i-quant");
    tiled_sections_are_ggml_bit_for_bit(&sections);
}

fn tiled_sections_are_ggml_bit_for_bit(sections: &[DotSection]) {
    let levels: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|l| l.available()).collect();
    for isa in levels {
        let table = build_table(isa);
        for s in sections {
            let e = entry(&table, s.ty);
            let na = s.acts.len();
            let tiled = e.vec_dot_tiled.expect("a tiled kernel");
            assert_eq!(e.vec_dot_tiled_x4.is_some(), isa != Isa::Scalar, "{} {isa:?}: four-token tiled kernel with SIMD", s.ty);
            let mut vec_dot_differs = 0;
            for (r, row) in s.rows.iter().enumerate() {
                for (a, act) in s.acts.iter().enumerate() {
                    let (got, want) = (tiled(s.n, row, act), s.results[r * na + a]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{} {isa:?} row {r} act {a}: {got} vs ggml {want}", s.ty);
                    vec_dot_differs += ((e.vec_dot)(s.n, row, act).to_bits() != want.to_bits()) as usize;
                }
                if let Some(x4) = e.vec_dot_tiled_x4 {
                    let stride = s.acts[0].len();
                    for a0 in (0..na).step_by(4) {
                        let xs: Vec<u8> = s.acts[a0..a0 + 4].concat();
                        let mut out = [0f32; 4];
                        x4(s.n, row, &xs, stride, &mut out);
                        for t in 0..4 {
                            assert_eq!(out[t].to_bits(), s.results[r * na + a0 + t].to_bits(), "{} {isa:?} four-token tiled, row {r} token {}", s.ty, a0 + t);
                        }
                    }
                }
            }
            // The fixture does hold the tiled order: the vec_dot order rounds differently.
            assert!(vec_dot_differs > 0, "{}: vec_dot reproduces the tiled results too", s.ty);
        }
    }
}
