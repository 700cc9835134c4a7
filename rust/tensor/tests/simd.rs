//! Every SIMD kernel against the scalar specification, at every instruction-set level this
//! CPU has: integer parts exactly (unit scales make every float operation exact, so the
//! results must be the same integer); the quantized types' results bit for bit (both repeat
//! ggml's x86 summation order); the F16/F32 float dots within 2^-16 of max|w| * sum|x| (the
//! SIMD kernels sum in a different order from the scalar loop, each order within a few
//! dozen roundings of 2^-24 of that magnitude); four-token kernels bit-identical to the
//! one-token kernel; quantizers byte-identical.

mod common;

use common::*;
use ferrollama_tensor::traits::{build_table, TypeTraits, VecDot, VecDotX4};
use ferrollama_tensor::{GgmlType, Isa};

fn levels() -> Vec<(Isa, Vec<TypeTraits>)> {
    let found: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|l| l.available()).collect();
    if found.is_empty() {
        eprintln!("no SIMD level on this CPU: only the scalar kernels exist here");
    }
    found.into_iter().map(|l| (l, build_table(l))).collect()
}

fn entry(table: &[TypeTraits], ty: GgmlType) -> &TypeTraits {
    table.iter().find(|t| t.ty == ty).expect("type in table")
}

/// Sets the f16 scales of every block to 1.0 (and mins to 1.0) so that dot products are
/// small exact integers.
fn unit_scales(ty: GgmlType, bytes: &mut [u8]) {
    let one = 0x3c00u16.to_le_bytes();
    let bs = ty.type_size();
    for b in bytes.chunks_exact_mut(bs) {
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => {
                b[0..2].copy_from_slice(&one);
                b[2..4].copy_from_slice(&one);
            }
            GgmlType::Q6_K => {
                b[208..210].copy_from_slice(&one);
                for s in &mut b[192..208] {
                    *s = ((*s as i8) / 5) as u8; // |scale| <= 25 keeps sums below 2^24
                }
            }
            GgmlType::Q2_K => {
                b[80..82].copy_from_slice(&one);
                b[82..84].copy_from_slice(&one);
            }
            GgmlType::Q3_K => b[108..110].copy_from_slice(&one),
            // The E8M0 exponent of 2^0 (its halved scale times the doubled levels).
            GgmlType::MXFP4 => b[0] = 128,
            // UE4M3 2.0 (exponent 8), halved to 1 for the doubled levels.
            GgmlType::NVFP4 => b[0..4].fill(0x40),
            GgmlType::TQ1_0 => b[52..54].copy_from_slice(&one),
            GgmlType::TQ2_0 => b[64..66].copy_from_slice(&one),
            // 8 and 4: the kernels' factors 1/8 and 1/4 make them one.
            GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => b[0..2].copy_from_slice(&0x4800u16.to_le_bytes()),
            GgmlType::IQ3_XXS => b[0..2].copy_from_slice(&0x4400u16.to_le_bytes()),
            GgmlType::IQ3_S => b[0..2].copy_from_slice(&one),
            // 8: its delta term is 1/8 of an integer.
            GgmlType::IQ1_S => b[0..2].copy_from_slice(&0x4800u16.to_le_bytes()),
            // The same 8 (0x4800) in the top nibbles of the four scale words.
            GgmlType::IQ1_M => {
                for (k, nibble) in [0u8, 0, 8, 4].into_iter().enumerate() {
                    b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | nibble << 4;
                }
            }
            GgmlType::IQ4_XS | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::Q1_0 | GgmlType::Q2_0 => {
                b[0..2].copy_from_slice(&one)
            }
            _ => {}
        }
    }
}

/// Activation rows with unit scale and quants in [-31, 31] (Q8_0, Q8_1 or Q8_K).
fn unit_activation(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|i| if i % 7 == 0 { 31.0 } else { (rng.uniform() * 31.0).round() }).collect();
    let q = quantize_ref(ty, &x.iter().map(|v| v * (127.0 / 31.0)).collect::<Vec<_>>());
    let mut q = q;
    for b in q.chunks_exact_mut(ty.type_size()) {
        match ty {
            GgmlType::Q8_0 => {
                b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
                for v in &mut b[2..] {
                    *v = ((*v as i8) / 4) as u8;
                }
            }
            GgmlType::Q8_1 => {
                // d = 1 and s = sum(q) * d, an integer below 2048: exact in f16.
                b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
                for v in &mut b[4..] {
                    *v = ((*v as i8) / 4) as u8;
                }
                let sum: i32 = b[4..].iter().map(|&v| v as i8 as i32).sum();
                b[2..4].copy_from_slice(&half::f16::from_f32(sum as f32).to_bits().to_le_bytes());
            }
            GgmlType::Q8_K => {
                b[0..4].copy_from_slice(&1.0f32.to_le_bytes());
                for v in &mut b[4..260] {
                    *v = ((*v as i8) / 4) as u8;
                }
                for g in 0..16 {
                    let s: i32 = b[4 + 16 * g..20 + 16 * g].iter().map(|&v| v as i8 as i32).sum();
                    b[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
                }
            }
            _ => unreachable!(),
        }
    }
    q
}

fn simd_types(t: &[TypeTraits]) -> Vec<GgmlType> {
    t.iter().filter(|e| e.vec_dot as usize != e.vec_dot_scalar as usize).map(|e| e.ty).collect()
}

#[test]
fn integer_parts_are_exact() {
    let mut rng = Rng::new(11);
    for (isa, table) in levels() {
        assert!(simd_types(&table).len() >= 14, "{isa:?} has its kernels in the table");
        for ty in simd_types(&table) {
            let e = entry(&table, ty);
            if matches!(ty, GgmlType::F16 | GgmlType::F32 | GgmlType::BF16) {
                continue; // no integer part: covered by the float comparison
            }
            let n = e.block_size.max(256);
            for _ in 0..20 {
                let mut w = rng.bytes(e.row_bytes(n));
                unit_scales(ty, &mut w);
                let x = unit_activation(e.vec_dot_type, n, &mut rng);
                let (got, want) = ((e.vec_dot)(n, &w, &x), (e.vec_dot_scalar)(n, &w, &x));
                assert_eq!(got, want, "{ty} {isa:?}");
                assert_eq!(got.fract(), 0.0, "{ty} {isa:?}: unit scales give an integer");
            }
        }
    }
}

#[test]
fn quantized_results_equal_the_scalar_kernel_bit_for_bit() {
    let mut rng = Rng::new(15);
    for (isa, table) in levels() {
        let quantized: Vec<GgmlType> = simd_types(&table).into_iter().filter(|t| !matches!(t, GgmlType::F16 | GgmlType::F32 | GgmlType::BF16)).collect();
        assert!(quantized.len() >= 12, "{isa:?}: every quantized weight type has a SIMD kernel");
        for ty in quantized {
            let e = entry(&table, ty);
            // Odd block counts too (IQ4_NL pairs its blocks and treats a last one apart).
            for n in [e.block_size.max(256), 4096, 4864, 7 * e.block_size, 9 * e.block_size] {
                if n % e.block_size != 0 {
                    continue;
                }
                for scale in [0.02f32, 2.0, 300.0] {
                    let w = random_weights(ty, n, &mut rng);
                    let xq = quantize(e.vec_dot_type, &rng.vec(n, scale));
                    let (got, want) = ((e.vec_dot)(n, &w, &xq), (e.vec_dot_scalar)(n, &w, &xq));
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} {isa:?} n={n} scale {scale}: {got} vs {want}");
                }
            }
        }
    }
}

/// The kernels of one alternative order (`kernels` gives an entry's SIMD one-token and
/// four-token kernels and its scalar specification, where the type has that order) against
/// the specification, bit for bit, at every SIMD level.
fn order_equals_its_specification(order: &str, types: &[GgmlType], kernels: fn(&TypeTraits) -> Option<(VecDot, Option<VecDotX4>, VecDot)>) {
    let mut rng = Rng::new(16);
    for (isa, table) in levels() {
        let with: Vec<GgmlType> = table.iter().filter(|e| kernels(e).is_some()).map(|e| e.ty).collect();
        assert_eq!(with, types, "the types with a {order} order");
        for e in table.iter().filter(|e| kernels(e).is_some()) {
            let (simd, simd_x4, scalar) = kernels(e).unwrap();
            assert_ne!(simd as usize, scalar as usize, "{} {isa:?} has a SIMD {order} kernel", e.ty);
            let simd_x4 = simd_x4.unwrap_or_else(|| panic!("{} {isa:?} has a four-token {order} kernel", e.ty));
            for n in [256, 4096, 4864] {
                for scale in [0.02f32, 2.0, 300.0] {
                    let w = random_weights(e.ty, n, &mut rng);
                    let xs: Vec<u8> = (0..4).flat_map(|_| quantize(e.vec_dot_type, &rng.vec(n, scale))).collect();
                    let stride = xs.len() / 4;
                    let mut out = [0f32; 4];
                    simd_x4(n, &w, &xs, stride, &mut out);
                    for (t, x) in xs.chunks_exact(stride).enumerate() {
                        let want = scalar(n, &w, x);
                        assert_eq!(simd(n, &w, x).to_bits(), want.to_bits(), "{} {order} {isa:?} n={n} scale {scale}", e.ty);
                        assert_eq!(out[t].to_bits(), want.to_bits(), "{} {order} {isa:?} four-token, token {t}", e.ty);
                    }
                }
            }
        }
    }
}

#[test]
fn tiled_kernels_equal_the_scalar_specification_bit_for_bit() {
    use GgmlType as T;
    order_equals_its_specification("tiled", &[T::Q5_0, T::Q8_0, T::Q2_K, T::Q3_K, T::Q4_K, T::Q5_K, T::Q6_K, T::IQ2_XXS, T::IQ2_XS, T::IQ2_S, T::IQ3_XXS, T::IQ3_S, T::IQ1_S, T::IQ1_M, T::IQ4_XS], |e| {
        Some((e.vec_dot_tiled?, e.vec_dot_tiled_x4, e.vec_dot_tiled_scalar?))
    });
}

#[test]
fn repacked_kernels_equal_the_scalar_specification_bit_for_bit() {
    use GgmlType as T;
    order_equals_its_specification("repacked", &[T::Q4_0, T::Q4_K, T::IQ4_NL, T::MXFP4], |e| {
        Some((e.vec_dot_repacked?, e.vec_dot_repacked_x4, e.vec_dot_repacked_scalar?))
    });
}

#[test]
fn float_results_agree_with_scalar() {
    let mut rng = Rng::new(12);
    for (isa, table) in levels() {
        for ty in [GgmlType::F16, GgmlType::F32, GgmlType::BF16] {
            let e = entry(&table, ty);
            for n in [e.block_size.max(256), 4096, 4864] {
                let w = random_weights(ty, n, &mut rng);
                let x = rng.vec(n, 2.0);
                let xq = quantize(e.vec_dot_type, &x);
                let got = (e.vec_dot)(n, &w, &xq) as f64;
                let want = (e.vec_dot_scalar)(n, &w, &xq) as f64;
                let wd = dequantize(ty, &w, n);
                let xd = dequantize(e.vec_dot_type, &xq, n);
                let scale = wd.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) * xd.iter().map(|v| v.abs() as f64).sum::<f64>();
                assert!((got - want).abs() <= scale / 65536.0, "{ty} {isa:?} n={n}: {got} vs {want}");
            }
        }
    }
}

/// The BF16 row dot of each level equals, bit for bit, the portable specification of ggml's
/// ggml_vec_dot_bf16 built for that level (AVX2: four accumulators of 8 lanes; AVX-512F
/// without AVX512_BF16: two of 16), at lengths with and without a tail, on values of
/// every sign and of magnitudes 2^-60 to 2^60 (sums that cancel and round).
#[test]
fn bf16_row_dots_equal_ggml_x86_orders() {
    use ferrollama_tensor::scalar::float::{vec_dot_bf16_avx2, vec_dot_bf16_avx512};
    let mut rng = Rng::new(59);
    for (isa, table) in levels() {
        let (dot, spec): (VecDot, VecDot) = (entry(&table, GgmlType::BF16).vec_dot, if isa == Isa::Avx512 { vec_dot_bf16_avx512 } else { vec_dot_bf16_avx2 });
        for n in [1, 31, 32, 33, 96, 895, 896, 4864, 4871] {
            for spread in [0.0f32, 4.0, 60.0] {
                let values = |rng: &mut Rng| -> Vec<u8> {
                    let v: Vec<f32> = (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) * (spread * (rng.uniform() * 2.0 - 1.0)).exp2()).collect();
                    quantize(GgmlType::BF16, &v)
                };
                let (w, x) = (values(&mut rng), values(&mut rng));
                assert_eq!(dot(n, &w, &x).to_bits(), spec(n, &w, &x).to_bits(), "{isa:?} n={n} spread {spread}");
            }
        }
    }
}

#[test]
fn four_token_kernels_equal_the_one_token_kernel_bit_for_bit() {
    let mut rng = Rng::new(13);
    let mut checked = 0;
    for (isa, table) in levels() {
        for e in table.iter().filter(|e| e.vec_dot_x4.is_some()) {
            let n = 1024;
            let w = random_weights(e.ty, n, &mut rng);
            let dt = e.vec_dot_type;
            let stride = ferrollama_tensor::traits(dt).unwrap().row_bytes(n);
            let mut xs = Vec::new();
            for _ in 0..4 {
                xs.extend(quantize(dt, &rng.vec(n, 1.5)));
            }
            let mut out = [0f32; 4];
            (e.vec_dot_x4.unwrap())(n, &w, &xs, stride, &mut out);
            for t in 0..4 {
                let one = (e.vec_dot)(n, &w, &xs[t * stride..(t + 1) * stride]);
                assert_eq!(out[t].to_bits(), one.to_bits(), "{} {isa:?} token {t}", e.ty);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 25 * levels().len(), "every quantized weight type has a four-token kernel");
}

#[test]
fn simd_quantizers_are_byte_identical() {
    let mut rng = Rng::new(14);
    for (isa, table) in levels() {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_K, GgmlType::F16] {
            let simd = entry(&table, ty).from_f32.unwrap();
            let scalar = build_table(Isa::Scalar).into_iter().find(|t| t.ty == ty).unwrap().from_f32.unwrap();
            for trial in 0..50 {
                // F16 (the KV cache's type) converts element by element: an odd length
                // takes its tail path too.
                let n = if ty == GgmlType::F16 { 1021 } else { 1024 };
                let mut x = rng.vec(n, 1.0 + trial as f32);
                if ty == GgmlType::F16 {
                    // Overflow to infinity, a subnormal half, a tie (to even), minus zero.
                    x[..4].copy_from_slice(&[65520.0, 1e-6, 1.0 + 1.0 / 2048.0, -0.0]);
                    x[n - 1] = -65520.0;
                }
                if trial % 5 == 0 {
                    x[3] = -x.iter().fold(0f32, |m, v| m.max(v.abs())); // ties between +amax and -amax
                    x[700] = -x[3];
                }
                if trial == 7 {
                    x[256..512].fill(0.0);
                }
                // Values exactly halfway between two levels.
                x[10] = 0.5 * x.iter().take(32).fold(0f32, |m, v| m.max(v.abs())) / 127.0 * 3.0;
                let bytes = ferrollama_tensor::traits(ty).unwrap().row_bytes(n);
                let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
                simd(&x, &mut a);
                scalar(&x, &mut b);
                assert_eq!(a, b, "{ty} {isa:?} trial {trial}");
            }
        }
    }
}

#[test]
fn force_scalar_environment_variable_selects_the_scalar_kernels() {
    let t = ferrollama_tensor::traits(GgmlType::Q4_K).unwrap();
    if std::env::var("FERROLLAMA_FORCE_SCALAR").as_deref() == Ok("1") {
        assert_eq!(t.isa, Isa::Scalar);
        assert_eq!(t.vec_dot as usize, t.vec_dot_scalar as usize);
        return;
    }
    assert_eq!(t.isa, ferrollama_tensor::dispatch::active_isa());
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "force_scalar_environment_variable_selects_the_scalar_kernels", "--test-threads=1"])
        .env("FERROLLAMA_FORCE_SCALAR", "1")
        .status()
        .expect("re-running the test binary");
    assert!(status.success(), "the forced-scalar run failed");
}

#[test]
fn isa_environment_variable_caps_the_kernel_level() {
    let t = ferrollama_tensor::traits(GgmlType::Q4_K).unwrap();
    if let Ok(name) = std::env::var("FERROLLAMA_ISA") {
        let cap = Isa::from_name(&name).expect("the parent passes a level name");
        assert_eq!(t.isa, cap.min(Isa::detect()));
        assert_eq!(ferrollama_tensor::dispatch::active_isa(), t.isa);
        return;
    }
    if std::env::var("FERROLLAMA_FORCE_SCALAR").is_ok() {
        return; // the forced-scalar run checks its own level above
    }
    for cap in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "isa_environment_variable_caps_the_kernel_level", "--test-threads=1"])
            .env("FERROLLAMA_ISA", cap.name())
            .status()
            .expect("re-running the test binary");
        assert!(status.success(), "the run capped at {} failed", cap.name());
    }
}

/// Runs the octet kernel of `gemm` on eight weight rows `w` (n elements each) and the
/// activation rows `xs` (4 (first_quad + quads) tokens) from quad first_quad on, and checks
/// every output against `dot` bit for bit, and that nothing else was written.
#[allow(clippy::too_many_arguments)]
fn check_octet(gemm: &ferrollama_tensor::simd::SumsGemm, dot: VecDot, n: usize, first_quad: usize, quads: usize, w: &[u8], xs: &[u8], what: &str) {
    use ferrollama_tensor::simd::{TileFactors, OCTET_MAX_QUADS};
    let tokens = 4 * (first_quad + quads);
    let stride = xs.len() / tokens;
    let mut octet = vec![0u8; gemm.octet_bytes(n)];
    gemm.decode_octet(n, w, &mut octet);
    let mut f = TileFactors::default();
    gemm.factors(n, xs, stride, first_quad + quads, &mut f);
    // Rows of 10 outputs: the kernel writes 8 a token, the 2 after stay NaN.
    let ldo = 10;
    let mut out = vec![f32::NAN; 4 * OCTET_MAX_QUADS * ldo];
    // SAFETY: out holds (4 (first_quad + quads) - 1) * ldo + 8 floats.
    unsafe { gemm.run_octet(n, &octet, xs, stride, first_quad, quads, &f, out[4 * first_quad * ldo..].as_mut_ptr(), ldo) };
    let wrow = w.len() / 8;
    for (t, x) in xs.chunks_exact(stride).enumerate() {
        for r in 0..ldo {
            let got = out[t * ldo + r];
            if t < 4 * first_quad || r >= 8 {
                assert!(got.is_nan(), "{what} n={n}: wrote token {t} lane {r}");
            } else {
                let want = dot(n, &w[r * wrow..(r + 1) * wrow], x);
                assert_eq!(got.to_bits(), want.to_bits(), "{what} n={n}: row {r} token {t}");
            }
        }
    }
}

/// Runs the octet-pair kernel of `gemm` (the i-quants and signed legacy kinds at the AVX-512
/// level) on sixteen or thirty-two weight rows `w` (one or two pairs) and the activation rows `xs` from quad
/// first_quad on, and checks every output against `dot` bit for bit, and that nothing else
/// was written.
#[allow(clippy::too_many_arguments)]
fn check_octet_pair(gemm: &ferrollama_tensor::simd::SumsGemm, dot: VecDot, n: usize, first_quad: usize, quads: usize, pairs: usize, w: &[u8], xs: &[u8], what: &str) {
    use ferrollama_tensor::simd::{TileFactors, OCTET_MAX_QUADS};
    let tokens = 4 * (first_quad + quads);
    let stride = xs.len() / tokens;
    let (octet_bytes, n_rows) = (gemm.octet_bytes(n), 16 * pairs);
    let wrow = w.len() / n_rows;
    let mut octets = vec![0u8; 2 * pairs * octet_bytes];
    for (o, rows) in w.chunks_exact(8 * wrow).enumerate() {
        gemm.decode_octet(n, rows, &mut octets[o * octet_bytes..(o + 1) * octet_bytes]);
    }
    for pair in octets.chunks_exact_mut(2 * octet_bytes) {
        gemm.pair_octets(n, pair, &mut Vec::new());
    }
    let mut f = TileFactors::default();
    gemm.factors(n, xs, stride, first_quad + quads, &mut f);
    // Rows of n_rows + 2 outputs: the kernel writes n_rows a token, the 2 after stay NaN.
    let ldo = n_rows + 2;
    let mut out = vec![f32::NAN; 4 * OCTET_MAX_QUADS * ldo];
    // SAFETY: out holds (4 (first_quad + quads) - 1) * ldo + n_rows floats.
    unsafe { gemm.run_octet_pair(n, &octets, pairs, xs, stride, first_quad, quads, &f, out[4 * first_quad * ldo..].as_mut_ptr(), ldo) };
    for (t, x) in xs.chunks_exact(stride).enumerate() {
        for r in 0..ldo {
            let got = out[t * ldo + r];
            if t < 4 * first_quad || r >= n_rows {
                assert!(got.is_nan(), "{what} n={n}: wrote token {t} lane {r}");
            } else {
                let want = dot(n, &w[r * wrow..(r + 1) * wrow], x);
                assert_eq!(got.to_bits(), want.to_bits(), "{what} n={n}: row {r} token {t}");
            }
        }
    }
}

/// The eight-row kernel of the legacy kinds (one to four quads of four tokens, started at
/// any quad of a tile) equals the specification's dot of each row with each token bit for
/// bit, writing only its outputs. Scale 0 is the extreme of each kind's i16 pair sums, as
/// raw blocks (d = 1.0): the unsigned kinds' top level (15, 31) against activations of -128,
/// the signed kinds' largest magnitude (Q8_0 -128, IQ4_NL -127, MXFP4 -12) against -127.
#[test]
fn octet_sums_kernel_equals_the_one_accumulator_dot() {
    use ferrollama_tensor::scalar::repacked as rp;
    use ferrollama_tensor::simd::SumsGemm;
    let mut rng = Rng::new(37);
    // (type, spec, block bytes, weight fill byte, activation fill byte)
    let spec: [(GgmlType, VecDot, usize, u8, u8); 5] = [
        (GgmlType::Q4_0, rp::vec_dot_q4_0_q8_0, 18, 0xff, 0x80),
        (GgmlType::Q5_0, rp::vec_dot_q5_0_q8_0_blocks, 22, 0xff, 0x80),
        (GgmlType::Q8_0, rp::vec_dot_q8_0_q8_0_blocks, 34, 0x80, 0x81),
        (GgmlType::IQ4_NL, rp::vec_dot_iq4_nl_q8_0, 18, 0x00, 0x81),
        (GgmlType::MXFP4, rp::vec_dot_mxfp4_q8_0, 17, 0xff, 0x81),
    ];
    for (isa, _) in levels() {
        for &(ty, dot, wbytes, wfill, xfill) in &spec {
            let gemm = SumsGemm::for_type(ty, isa).expect("a kernel at every SIMD level");
            for (n, first_quad, quads) in [(32, 0, 1), (896, 0, 4), (896, 1, 3), (640, 2, 2), (4864, 3, 1)] {
                for scale in [0.0f32, 0.02, 2.0, 300.0] {
                    let tokens = 4 * (first_quad + quads);
                    let (w, xs): (Vec<u8>, Vec<u8>) = if scale == 0.0 {
                        // d = 1.0: the f16 0x3c00, MXFP4's E8M0 exponent 128 (2^1, halved).
                        let scale: &[u8] = if ty == GgmlType::MXFP4 { &[128] } else { &[0x00, 0x3c] };
                        let wblock: Vec<u8> = scale.iter().copied().chain(std::iter::repeat_n(wfill, wbytes - scale.len())).collect();
                        let xblock: Vec<u8> = [0x00, 0x3c].into_iter().chain(std::iter::repeat_n(xfill, 32)).collect();
                        (wblock.repeat(8 * n / 32), xblock.repeat(tokens * n / 32))
                    } else {
                        let w = (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                        (w, (0..tokens).flat_map(|_| quantize(GgmlType::Q8_0, &rng.vec(n, scale))).collect())
                    };
                    check_octet(&gemm, dot, n, first_quad, quads, &w, &xs, &format!("{ty} {isa:?} scale {scale}"));
                    // The signed kinds' two-octet kernel (AVX-512 VNNI) on these rows and their
                    // reversal.
                    let signed = matches!(ty, GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4);
                    assert_eq!(gemm.has_octet_pairs(), signed && isa >= Isa::Avx512, "{ty} {isa:?}: octet pairs");
                    assert_eq!(gemm.octet_isa(), if gemm.has_octet_pairs() { Isa::Avx512 } else { Isa::Avx2 }, "{ty} {isa:?}");
                    if gemm.has_octet_pairs() {
                        let row = w.len() / 8;
                        let w16: Vec<u8> = w.iter().copied().chain(w.chunks_exact(row).rev().flatten().copied()).collect();
                        check_octet_pair(&gemm, dot, n, first_quad, quads, 1, &w16, &xs, &format!("{ty} {isa:?} scale {scale} (pair)"));
                        let w32: Vec<u8> = w16.iter().copied().chain(w16.chunks_exact(row).rev().flatten().copied()).collect();
                        check_octet_pair(&gemm, dot, n, first_quad, quads, 2, &w32, &xs, &format!("{ty} {isa:?} scale {scale} (two pairs)"));
                    }
                }
            }
        }
    }
}

/// The eight-row k-quant kernels equal their specifications bit for bit, from any quad of a
/// tile: Q4_K llama.cpp's repacked dot, Q6_K ggml's vec_dot (eight lanes, hsum_float_8).
/// Scale 0 is the extreme: every level at its top and every activation -128 (for Q4_K the
/// bound of the i16 sums).
#[test]
fn k_quant_octet_kernels_equal_their_dots() {
    use ferrollama_tensor::scalar::{kquants, repacked as rp};
    use ferrollama_tensor::simd::SumsGemm;
    let mut rng = Rng::new(41);
    let spec: [(GgmlType, VecDot); 2] = [(GgmlType::Q4_K, rp::vec_dot_q4_k_q8_k), (GgmlType::Q6_K, kquants::vec_dot_q6_k_q8_k)];
    for (isa, _) in levels() {
        for &(ty, dot) in &spec {
            let gemm = SumsGemm::for_type(ty, isa).expect("a kernel at every SIMD level");
            assert!(!gemm.has_pairs());
            for (n, first_quad, quads) in [(256, 0, 1), (2048, 0, 4), (4864, 1, 3), (1024, 2, 2), (512, 3, 1)] {
                for scale in [0.0f32, 0.02, 2.0, 300.0] {
                    let tokens = 4 * (first_quad + quads);
                    let (w, xs): (Vec<u8>, Vec<u8>) = if scale == 0.0 {
                        // Q4_K: d = dmin = 1.0, every 6-bit scale and min 63, every level 15.
                        // Q6_K: every level 63, every scale 127 (0x7f), d = 1.0.
                        let wblock: Vec<u8> = if ty == GgmlType::Q4_K {
                            [0x00, 0x3c, 0x00, 0x3c].into_iter().chain(std::iter::repeat_n(0xff, 140)).collect()
                        } else {
                            std::iter::repeat_n(0xff, 192).chain(std::iter::repeat_n(0x7f, 16)).chain([0x00, 0x3c]).collect()
                        };
                        let mut xblock: Vec<u8> = 1.0f32.to_le_bytes().into_iter().chain(std::iter::repeat_n(0x80, 256)).collect();
                        xblock.extend((0..16).flat_map(|_| (-2048i16).to_le_bytes()));
                        (wblock.repeat(8 * n / 256), xblock.repeat(tokens * n / 256))
                    } else {
                        let w = (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                        (w, (0..tokens).flat_map(|_| quantize(GgmlType::Q8_K, &rng.vec(n, scale))).collect())
                    };
                    check_octet(&gemm, dot, n, first_quad, quads, &w, &xs, &format!("{ty} {isa:?} scale {scale}"));
                }
            }
        }
    }
}

/// The legacy kinds' one-accumulator dots (`scalar::repacked`, the specification of the
/// two-row, octet and eight-row kernels).
fn one_accumulator_specs() -> [(GgmlType, VecDot); 5] {
    use ferrollama_tensor::scalar::repacked as rp;
    [
        (GgmlType::Q8_0, rp::vec_dot_q8_0_q8_0_blocks),
        (GgmlType::Q4_0, rp::vec_dot_q4_0_q8_0),
        (GgmlType::Q5_0, rp::vec_dot_q5_0_q8_0_blocks),
        (GgmlType::IQ4_NL, rp::vec_dot_iq4_nl_q8_0),
        (GgmlType::MXFP4, rp::vec_dot_mxfp4_q8_0),
    ]
}

/// The two-row one-accumulator kernel (one and two quads of four tokens) equals the
/// specification's dot of each row with each token bit for bit, for every type it serves.
#[test]
fn two_row_sums_kernel_equals_the_one_accumulator_dot() {
    use ferrollama_tensor::simd::{SumsGemm, TileFactors};
    let mut rng = Rng::new(31);
    for (isa, _) in levels() {
        for (ty, dot) in one_accumulator_specs() {
            let gemm = SumsGemm::for_type(ty, isa).expect("a kernel at every SIMD level");
            let mut f = TileFactors::default();
            for (n, quads) in [(32, 1), (896, 2), (4864, 1), (4864, 2)] {
                for scale in [0.02f32, 2.0, 300.0] {
                    let w: Vec<u8> = (0..2).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                    let xs: Vec<u8> = (0..4 * quads).flat_map(|_| quantize(GgmlType::Q8_0, &rng.vec(n, scale))).collect();
                    let stride = xs.len() / (4 * quads);
                    let mut out = [[[0f32; 4]; 2]; 2];
                    gemm.factors(n, &xs, stride, quads, &mut f);
                    gemm.run(n, &w, &xs, stride, 0, quads, &f, &mut out);
                    for (r, wr) in w.chunks_exact(w.len() / 2).enumerate() {
                        for (t, x) in xs.chunks_exact(stride).enumerate() {
                            let got = out[t / 4][r][t % 4];
                            assert_eq!(got.to_bits(), dot(n, wr, x).to_bits(), "{ty} {isa:?} n={n} scale {scale} row {r} token {t}");
                        }
                    }
                }
            }
        }
    }
}

/// The eight-row one-token kernels of the kinds llama.cpp repacks equal their one-accumulator
/// row dots (`scalar::repacked`, the specification) bit for bit, at every block count the
/// tiny and real models use and activations of several scales; the other kinds have none.
#[test]
fn eight_row_one_token_kernel_equals_the_one_accumulator_dot() {
    use ferrollama_tensor::simd::repacked_rows8_dot_for;
    let mut rng = Rng::new(37);
    let repacked = [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4];
    for (isa, _) in levels() {
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K] {
            assert!(repacked_rows8_dot_for(ty, isa).is_none(), "{ty}: its one-token dot is not one accumulator");
        }
        for (ty, dot) in one_accumulator_specs().into_iter().filter(|(ty, _)| repacked.contains(ty)) {
            let rows8 = repacked_rows8_dot_for(ty, isa).expect("a kernel at every SIMD level");
            for n in [32, 96, 896, 4864] {
                for scale in [0.02f32, 2.0, 300.0] {
                    let w: Vec<u8> = (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                    let x = quantize(GgmlType::Q8_0, &rng.vec(n, scale));
                    let mut out = [0f32; 8];
                    rows8(n, &w, &x, &mut out);
                    for (r, wr) in w.chunks_exact(w.len() / 8).enumerate() {
                        assert_eq!(out[r].to_bits(), dot(n, wr, &x).to_bits(), "{ty} {isa:?} n={n} scale {scale} row {r}");
                    }
                }
            }
        }
    }
}

/// A Q8_K activation row of n elements whose quants are all `q` (d = 1.0): the extreme of the
/// i-quant octet kernels' biased sums (q = 127: every biased byte 255).
fn constant_q8_k(n: usize, q: i8) -> Vec<u8> {
    let mut block: Vec<u8> = 1.0f32.to_le_bytes().into_iter().chain(std::iter::repeat_n(q as u8, 256)).collect();
    block.extend((0..16).flat_map(|_| (16 * q as i16).to_le_bytes()));
    block.repeat(n / 256)
}

/// The i-quants' one-row kernels (one token and four, ggml's vec_dot order and the tiled
/// one) equal the specification bit for bit at every level against activations all 127 or
/// all -127 (the Q8_K quantizer's range: it scales by -127 / max): the AVX-512 level negates
/// the activation where a weight is negative (a masked subtract) and sums a pair of
/// sub-blocks in one vector, so the extremes of every i16 and i32 sum are checked. (A -128,
/// which no Q8_K row holds, would wrap under a negative weight at both SIMD levels, as in
/// ggml's `_mm256_sign_epi8`, where the specification negates it.)
#[test]
fn iquant_one_row_kernels_equal_the_specification_at_the_extremes() {
    use GgmlType as T;
    let mut rng = Rng::new(47);
    for (isa, table) in levels() {
        for ty in [T::IQ2_XXS, T::IQ2_XS, T::IQ2_S, T::IQ3_XXS, T::IQ3_S, T::IQ1_S, T::IQ1_M] {
            let e = entry(&table, ty);
            let orders = [
                ("vec_dot", e.vec_dot, e.vec_dot_x4.expect("a four-token kernel"), e.vec_dot_scalar),
                ("tiled", e.vec_dot_tiled.unwrap(), e.vec_dot_tiled_x4.unwrap(), e.vec_dot_tiled_scalar.unwrap()),
            ];
            for n in [256, 2304] {
                let w = random_weights(ty, n, &mut rng);
                let xs: Vec<u8> = [127i8, -127, 127, -127].into_iter().flat_map(|q| constant_q8_k(n, q)).collect();
                let stride = xs.len() / 4;
                for (order, one, four, spec) in orders {
                    let mut out = [0f32; 4];
                    four(n, &w, &xs, stride, &mut out);
                    for (t, x) in xs.chunks_exact(stride).enumerate() {
                        let want = spec(n, &w, x);
                        assert_eq!(one(n, &w, x).to_bits(), want.to_bits(), "{ty} {order} {isa:?} n={n} token {t}");
                        assert_eq!(out[t].to_bits(), want.to_bits(), "{ty} {order} {isa:?} n={n} four-token, token {t}");
                    }
                }
            }
        }
    }
}

/// The eight-row i-quant kernels equal llama.cpp's tiled product (`scalar::iquants`'s
/// tiled dots) bit for bit, from any quad of a tile, with random blocks of every grid index,
/// sign and scale against random activations of several scales and against activations all
/// 127, all -127 or all -128 (the largest biased bytes, the largest unbiased magnitudes, and
/// the quantizer's extreme, which Q8_K rows hold wherever a block's largest value is positive).
#[test]
fn iquant_octet_kernels_equal_the_tiled_dots() {
    use ferrollama_tensor::scalar::iquants as iq;
    use ferrollama_tensor::simd::SumsGemm;
    let mut rng = Rng::new(43);
    let spec: [(GgmlType, VecDot); 7] = [
        (GgmlType::IQ2_XXS, iq::tiled_iq2_xxs_q8_k),
        (GgmlType::IQ2_XS, iq::tiled_iq2_xs_q8_k),
        (GgmlType::IQ2_S, iq::tiled_iq2_s_q8_k),
        (GgmlType::IQ3_XXS, iq::tiled_iq3_xxs_q8_k),
        (GgmlType::IQ3_S, iq::tiled_iq3_s_q8_k),
        (GgmlType::IQ1_S, iq::tiled_iq1_s_q8_k),
        (GgmlType::IQ1_M, iq::tiled_iq1_m_q8_k),
    ];
    for (isa, _) in levels() {
        for &(ty, dot) in &spec {
            let gemm = SumsGemm::for_type(ty, isa).expect("a kernel at every SIMD level");
            assert!(!gemm.has_pairs());
            for (n, first_quad, quads) in [(256, 0, 1), (2048, 0, 4), (4864, 1, 3), (1024, 2, 2), (512, 3, 1)] {
                for scale in [0.0f32, 0.02, 2.0, 300.0] {
                    let tokens = 4 * (first_quad + quads);
                    let w: Vec<u8> = (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                    let xs: Vec<u8> = if scale == 0.0 {
                        (0..tokens).flat_map(|t| constant_q8_k(n, [127, -127, -128][t % 3])).collect()
                    } else {
                        (0..tokens).flat_map(|_| quantize(GgmlType::Q8_K, &rng.vec(n, scale))).collect()
                    };
                    check_octet(&gemm, dot, n, first_quad, quads, &w, &xs, &format!("{ty} {isa:?} scale {scale}"));
                    // The two-octet kernel (AVX-512) on these rows and eight more.
                    assert_eq!(gemm.has_octet_pairs(), isa >= Isa::Avx512, "{ty} {isa:?}: octet pairs at the AVX-512 level");
                    // And on two pairs (these sixteen rows and sixteen more).
                    if gemm.has_octet_pairs() {
                        let more: Vec<u8> = (0..24).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                        let w32: Vec<u8> = w.iter().chain(&more).copied().collect();
                        check_octet_pair(&gemm, dot, n, first_quad, quads, 1, &w32[..w32.len() / 2], &xs, &format!("{ty} {isa:?} scale {scale} (pair)"));
                        check_octet_pair(&gemm, dot, n, first_quad, quads, 2, &w32, &xs, &format!("{ty} {isa:?} scale {scale} (two pairs)"));
                    }
                }
            }
        }
    }
}

/// The octet kernel of TQ1_0 and TQ2_0 (AVX-512 VNNI) equals the row dot and the scalar specification (ggml's vec_dot lanes) bit for bit,
/// from any quad of a tile: random quantized rows, and random bytes (TQ2_0's unused level 3,
/// TQ1_0's bytes past 3^5) with sane scales, against random activations of several scales
/// and activations all 127, all -127 or all -128.
#[test]
fn ternary_octet_kernels_equal_the_row_dot() {
    use ferrollama_tensor::simd::SumsGemm;
    let mut rng = Rng::new(53);
    for (isa, table) in levels() {
        for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0] {
            let Some(gemm) = SumsGemm::for_type(ty, isa) else {
                assert!(isa < Isa::Avx512, "{ty} {isa:?}: an octet kernel at the AVX-512 level");
                continue;
            };
            assert!(!gemm.has_pairs() && !gemm.has_octet_pairs());
            let (row_dot, spec) = (entry(&table, ty).vec_dot, entry(&table, ty).vec_dot_scalar);
            let rows = |rng: &mut Rng, n: usize, raw: bool| -> Vec<u8> {
                if !raw {
                    return (0..8).flat_map(|_| random_weights(ty, n, rng)).collect();
                }
                let mut w = rng.bytes(8 * tr(ty).row_bytes(n));
                let bytes = ty.type_size();
                for b in w.chunks_exact_mut(bytes) {
                    let d = half::f16::from_f32(0.01 + 0.02 * rng.uniform()).to_bits();
                    b[bytes - 2..].copy_from_slice(&d.to_le_bytes());
                }
                w
            };
            for (n, first_quad, quads) in [(256, 0, 1), (2048, 0, 4), (4864, 1, 3), (1024, 2, 2), (512, 3, 1)] {
                for scale in [0.0f32, 0.02, 2.0, 300.0] {
                    for raw in [false, true] {
                        let tokens = 4 * (first_quad + quads);
                        let xs: Vec<u8> = if scale == 0.0 {
                            (0..tokens).flat_map(|t| constant_q8_k(n, [127, -127, -128][t % 3])).collect()
                        } else {
                            (0..tokens).flat_map(|_| quantize(GgmlType::Q8_K, &rng.vec(n, scale))).collect()
                        };
                        let w = rows(&mut rng, n, raw);
                        for dot in [row_dot, spec] {
                            check_octet(&gemm, dot, n, first_quad, quads, &w, &xs, &format!("{ty} {isa:?} scale {scale} raw {raw}"));
                        }
                    }
                }
            }
        }
    }
}

/// The octet kernels of Q1_0, Q2_0 and NVFP4 (AVX-512 VNNI) equal the row dot and the scalar
/// specification (ggml's AVX2 and generic kernels) bit for bit, from any quad of a tile:
/// random quantized rows and random bytes (with sane f16 scales), against random
/// Q8_0 activations of several scales and activations all 127, all -127 or all -128 (d = 1).
#[test]
fn q1_0_q2_0_nvfp4_octet_kernels_equal_the_row_dot() {
    use ferrollama_tensor::simd::SumsGemm;
    let mut rng = Rng::new(61);
    for (isa, table) in levels() {
        for ty in [GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4] {
            let Some(gemm) = SumsGemm::for_type(ty, isa) else {
                assert!(isa < Isa::Avx512, "{isa:?}: an octet kernel at the AVX-512 level");
                continue;
            };
            assert!(!gemm.has_pairs() && !gemm.has_octet_pairs());
            let (row_dot, spec) = (entry(&table, ty).vec_dot, entry(&table, ty).vec_dot_scalar);
            for (n, first_quad, quads) in [(128, 0, 1), (896, 0, 4), (4864, 1, 3), (1024, 2, 2), (256, 3, 1)] {
                for scale in [0.0f32, 0.02, 2.0, 300.0] {
                    for raw in [false, true] {
                        let tokens = 4 * (first_quad + quads);
                        let xs: Vec<u8> = if scale == 0.0 {
                            (0..tokens).flat_map(|t| {
                                let q = [127i8, -127, -128][t % 3] as u8;
                                [0x00, 0x3c].into_iter().chain(std::iter::repeat_n(q, 32)).collect::<Vec<u8>>().repeat(n / 32)
                            }).collect()
                        } else {
                            (0..tokens).flat_map(|_| quantize(GgmlType::Q8_0, &rng.vec(n, scale))).collect()
                        };
                        let w: Vec<u8> = if raw {
                            // Random bytes: NVFP4's scale bytes take every value (subnormals, 0x7f).
                            let mut w = rng.bytes(8 * tr(ty).row_bytes(n));
                            for b in w.chunks_exact_mut(ty.type_size()).filter(|_| ty != GgmlType::NVFP4) {
                                b[..2].copy_from_slice(&half::f16::from_f32(0.01 + 0.02 * rng.uniform()).to_bits().to_le_bytes());
                            }
                            w
                        } else {
                            (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect()
                        };
                        // At -128 NVFP4's row dot (ggml's AVX2 sign trick: -(-128) stays -128) and
                        // its scalar specification (plain products) differ; the octets follow the
                        // row dot there. Q8_0 activations never hold -128.
                        let wraps = ty == GgmlType::NVFP4 && scale == 0.0;
                        for dot in if wraps { vec![row_dot] } else { vec![row_dot, spec] } {
                            check_octet(&gemm, dot, n, first_quad, quads, &w, &xs, &format!("{ty} {isa:?} scale {scale} raw {raw}"));
                        }
                    }
                }
            }
        }
    }
}

/// An eight-row kernel's outputs on rows `w` (eight of n elements) and activation `x` equal,
/// bit for bit, each of `dots` (the row dot, the scalar specification) row by row.
fn assert_rows8_equal_their_dots(dot8: ferrollama_tensor::simd::Rows8Dot, dots: [VecDot; 2], n: usize, w: &[u8], x: &[u8], what: &str) {
    let mut out = [0f32; 8];
    dot8(n, w, x, &mut out);
    for (r, wr) in w.chunks_exact(w.len() / 8).enumerate() {
        for (dot, which) in dots.iter().zip(["the row dot", "the scalar kernel"]) {
            assert_eq!(out[r].to_bits(), dot(n, wr, x).to_bits(), "{what} row {r}: {which}");
        }
    }
}

/// The eight-row one-token kernels of NVFP4, Q1_0 (against Q8_0), TQ1_0 and TQ2_0 (against
/// Q8_K) equal their row dots (ggml's vec_dot arithmetic, one vector accumulator per row) and
/// the scalar specification bit for bit, at several block counts (the benchmark shapes'
/// among them) and activation scales; other types and the scalar level have none.
#[test]
fn eight_row_vector_accumulator_kernels_equal_the_row_dot() {
    use ferrollama_tensor::simd::rows8_dot_for;
    let mut rng = Rng::new(41);
    assert!(rows8_dot_for(GgmlType::NVFP4, Isa::Scalar).is_none() && rows8_dot_for(GgmlType::TQ1_0, Isa::Scalar).is_none());
    for (isa, table) in levels() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::IQ2_XXS] {
            assert!(rows8_dot_for(ty, isa).is_none(), "{ty}");
        }
        let cases: [(GgmlType, GgmlType, &[usize]); 4] = [
            (GgmlType::NVFP4, GgmlType::Q8_0, &[128, 384, 896, 4864]),
            (GgmlType::Q1_0, GgmlType::Q8_0, &[128, 384, 896, 4864]),
            (GgmlType::TQ1_0, GgmlType::Q8_K, &[256, 1024, 4864]),
            (GgmlType::TQ2_0, GgmlType::Q8_K, &[256, 1024, 4864]),
        ];
        for (ty, act, ns) in cases {
            let dot8 = rows8_dot_for(ty, isa).expect("a kernel at every SIMD level");
            let (row_dot, spec) = (entry(&table, ty).vec_dot, entry(&table, ty).vec_dot_scalar);
            for &n in ns {
                for scale in [0.02f32, 2.0, 300.0] {
                    let w: Vec<u8> = (0..8).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                    let x = quantize(act, &rng.vec(n, scale));
                    assert_rows8_equal_their_dots(dot8, [row_dot, spec], n, &w, &x, &format!("{ty} {isa:?} n={n} scale {scale}"));
                }
            }
        }
    }
}

/// NVFP4's eight-row kernel converts the ue4m3 scales in vector arithmetic: on blocks of
/// random bytes whose scales take every byte value (subnormals, 0x7f, bit 7 set) it equals
/// the row dot and the scalar specification (ggml's table) bit for bit.
#[test]
fn nvfp4_eight_row_kernel_takes_every_scale_byte() {
    use ferrollama_tensor::simd::rows8_dot_for;
    let mut rng = Rng::new(47);
    for (isa, table) in levels() {
        let dot8 = rows8_dot_for(GgmlType::NVFP4, isa).expect("a kernel at every SIMD level");
        let (row_dot, spec) = (entry(&table, GgmlType::NVFP4).vec_dot, entry(&table, GgmlType::NVFP4).vec_dot_scalar);
        let n = 4864;
        let mut w = rng.bytes(8 * tr(GgmlType::NVFP4).row_bytes(n));
        for (k, block) in w.chunks_exact_mut(GgmlType::NVFP4.type_size()).enumerate() {
            for (j, scale) in block[..4].iter_mut().enumerate() {
                *scale = ((4 * k + j) % 256) as u8;
            }
        }
        for scale in [0.02f32, 2.0, 300.0] {
            let x = quantize(GgmlType::Q8_0, &rng.vec(n, scale));
            assert_rows8_equal_their_dots(dot8, [row_dot, spec], n, &w, &x, &format!("{isa:?} scale {scale}"));
        }
    }
}

/// The two-row, four-token kernel of NVFP4 and the one-row, four-token kernel of Q1_0 on f32
/// activation scales (`q8_0_tile_scales`) equal their row dots bit for bit, at several block
/// counts and activation scales, with activation rows further apart than their length; the
/// other types have none.
#[test]
fn four_token_tile_kernels_equal_the_row_dot() {
    use ferrollama_tensor::simd::{q8_0_tile_scales, rows2_x4_dot_for, scaled_x4_dot_for};
    let mut rng = Rng::new(43);
    for (isa, table) in levels() {
        assert!(rows2_x4_dot_for(GgmlType::Q4_0, isa).is_none() && rows2_x4_dot_for(GgmlType::Q1_0, isa).is_none());
        assert!(scaled_x4_dot_for(GgmlType::NVFP4, isa).is_none() && scaled_x4_dot_for(GgmlType::Q1_0, Isa::Scalar).is_none());
        for ty in [GgmlType::NVFP4, GgmlType::Q1_0] {
            let (row_dot, spec) = (entry(&table, ty).vec_dot, entry(&table, ty).vec_dot_scalar);
            for n in [128, 384, 896, 4864] {
                for scale in [0.02f32, 2.0, 300.0] {
                    let w: Vec<u8> = (0..2).flat_map(|_| random_weights(ty, n, &mut rng)).collect();
                    let xs: Vec<Vec<u8>> = (0..4).map(|_| quantize(GgmlType::Q8_0, &rng.vec(n, scale))).collect();
                    let stride = xs[0].len() + 68;
                    let mut x = vec![0u8; 3 * stride + xs[0].len()];
                    for (t, xt) in xs.iter().enumerate() {
                        x[t * stride..t * stride + xt.len()].copy_from_slice(xt);
                    }
                    let mut out = [[0f32; 4]; 2];
                    if ty == GgmlType::NVFP4 {
                        rows2_x4_dot_for(ty, isa).expect("a kernel at every SIMD level")(n, &w, &x, stride, &mut out);
                    } else {
                        let dot = scaled_x4_dot_for(ty, isa).expect("a kernel at every SIMD level");
                        let mut dx = Vec::new();
                        q8_0_tile_scales(n, &x, stride, &mut dx);
                        for (r, wr) in w.chunks_exact(w.len() / 2).enumerate() {
                            dot(n, wr, &x, stride, &dx, &mut out[r]);
                        }
                    }
                    for (r, wr) in w.chunks_exact(w.len() / 2).enumerate() {
                        for (t, xt) in xs.iter().enumerate() {
                            let what = format!("{ty} {isa:?} n={n} scale {scale} row {r} token {t}");
                            assert_eq!(out[r][t].to_bits(), row_dot(n, wr, xt).to_bits(), "{what}");
                            assert_eq!(out[r][t].to_bits(), spec(n, wr, xt).to_bits(), "{what}: the scalar kernel");
                        }
                    }
                }
            }
        }
    }
}

/// No weight type's product resolves to the portable kernel or to a lower level's kernels at
/// any SIMD level this CPU has: every row dot (and tiled dot) is the level's, and so are the
/// many-token (octet) products of the i-quants, MXFP4, the ternary types, Q1_0, Q2_0 and
/// NVFP4. Q8_1 and Q8_K are activation types only (their self-dots exist for the table's
/// totality).
#[test]
fn every_weight_type_resolves_to_the_kernels_of_each_level() {
    use ferrollama_tensor::simd::{kernel_isa, SumsGemm};
    let activation_only = [GgmlType::Q8_1, GgmlType::Q8_K];
    for (isa, table) in levels() {
        for e in table.iter().filter(|e| !activation_only.contains(&e.ty)) {
            assert_eq!(kernel_isa(e.ty, isa), isa, "{} at {isa:?}", e.ty);
            assert_ne!(e.vec_dot as usize, e.vec_dot_scalar as usize, "{} at {isa:?}: the table's row dot", e.ty);
            if let Some(tiled) = e.vec_dot_tiled {
                assert_ne!(tiled as usize, e.vec_dot_tiled_scalar.map_or(0, |d| d as usize), "{} at {isa:?}: a SIMD tiled dot", e.ty);
            }
        }
        // The many-token kernels of the i-quants are the level's too.
        for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M] {
            let gemm = SumsGemm::for_type(ty, isa).expect("an octet kernel at every SIMD level");
            assert_eq!(gemm.octet_isa(), isa, "{ty} at {isa:?}: the octet product");
        }
        let gemm = SumsGemm::for_type(GgmlType::MXFP4, isa).expect("an octet kernel at every SIMD level");
        assert_eq!(gemm.octet_isa(), isa, "MXFP4 at {isa:?}: the octet product");
        // The ternary types' and Q2_0's octets exist at the AVX-512 level only.
        for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4] {
            let gemm = SumsGemm::for_type(ty, isa);
            assert_eq!(gemm.map(|g| g.octet_isa()), (isa == Isa::Avx512).then_some(Isa::Avx512), "{ty} at {isa:?}: the octet product");
        }
    }
}
