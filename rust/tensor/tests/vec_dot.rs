//! (b) every dot product equals a float64 dot of the dequantized weight and the dequantized
//! activation within a rounding bound; (c) quantize -> dequantize round trips stay within
//! each type's error bound.

mod common;

use common::*;
use ferrollama_tensor::GgmlType;

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
        other => panic!("no bound for {other}"),
    }
}

#[test]
fn quantize_dequantize_round_trips_within_the_type_bound() {
    let n = 8192;
    let mut rng = Rng::new(2);
    let types: Vec<GgmlType> = WEIGHT_TYPES.iter().copied().chain([GgmlType::Q8_1, GgmlType::Q8_K]).collect();
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
