//! (d) The matrix product over any number of threads equals the single-thread result
//! exactly, whatever the number of tokens, and each output is the row dot llama.cpp uses
//! of its row with the quantized activation row: the type's vec_dot, or for the types
//! llama.cpp repacks (Q4_0, IQ4_NL, MXFP4, Q4_K with a multiple of 8 rows, on AVX2+) its repacked
//! arithmetic, or from 8 tokens for Q3_K, Q5_K, IQ4_XS and the i-quants its tiled product's, and from 8
//! tokens for Q8_0 and Q5_0 ferrollama's one accumulator fed exact block sums; packed and
//! plain rows of one matrix agree with it alike.

mod common;

use common::*;
use ferrollama_tensor::{matmul, GgmlType, MatmulScratch, QMatrix, Threads, WeightBytes, TILED_TOKENS};
use std::sync::Arc;

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> QMatrix {
    let mut bytes = Vec::new();
    for _ in 0..rows {
        bytes.extend(random_weights(ty, cols, rng));
    }
    QMatrix::new(ty, rows, cols, WeightBytes::Owned(Arc::new(bytes))).expect("valid matrix")
}

/// True when FERROLLAMA_NO_REPACK=1 turns repacking off (see `QMatrix::new`).
fn repack_off() -> bool {
    std::env::var("FERROLLAMA_NO_REPACK").as_deref() == Ok("1")
}

fn product(m: &QMatrix, x: &[f32], n_tokens: usize, threads: &Threads) -> Vec<f32> {
    let mut out = vec![f32::NAN; n_tokens * m.rows];
    matmul(m, x, n_tokens, &mut out, &mut MatmulScratch::default(), threads);
    out
}

#[test]
fn threads_and_token_counts_do_not_change_a_single_bit() {
    let mut rng = Rng::new(21);
    let pools = [Threads::new(1), Threads::new(2), Threads::new(3)];
    for &ty in WEIGHT_TYPES {
        let cols = 512;
        let m = random_matrix(ty, 67, cols, &mut rng);
        let n_tokens = 11;
        let x = rng.vec(n_tokens * cols, 1.0);
        let single = product(&m, &x, n_tokens, &pools[0]);
        for pool in &pools[1..] {
            let multi = product(&m, &x, n_tokens, pool);
            assert!(single.iter().zip(&multi).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty} with {} threads", pool.n_threads());
        }
        // Each token gives the same bits alone as inside a batch under TILED_TOKENS (the
        // 4-token tiles agree with the 1-token kernel)...
        let small = product(&m, &x, TILED_TOKENS - 1, &pools[1]);
        for t in [0, 5, TILED_TOKENS - 2] {
            let alone = product(&m, &x[t * cols..(t + 1) * cols], 1, &pools[1]);
            assert!(alone.iter().zip(&small[t * m.rows..(t + 1) * m.rows]).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty} token {t}");
        }
        // ...and each output is the row dot llama.cpp uses at that token count: `vec_dot`
        // (or its repacked arithmetic) under TILED_TOKENS, the tiled product's from there on
        // for Q3_K, Q5_K, IQ4_XS and the i-quants (and ferrollama's one accumulator for Q8_0
        // and Q5_0).
        let tr = tr(ty);
        let xq = quantize(tr.vec_dot_type, &x[3 * cols..4 * cols]);
        let tiled = matches!(ty, GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::IQ4_XS | GgmlType::Q8_0 | GgmlType::Q5_0)
            || NO_QUANTIZER.contains(&ty);
        let batch_dot = if tiled { tr.vec_dot_tiled.expect("tiled dot") } else { m.row_dot() };
        assert_eq!(m.row_dot_for(1) as usize, m.row_dot() as usize, "{ty}");
        assert_eq!(m.row_dot_for(n_tokens) as usize, batch_dot as usize, "{ty}");
        for r in [0, 33, 66] {
            let v = (m.row_dot())(cols, m.row(r), &xq);
            assert_eq!(v.to_bits(), small[3 * m.rows + r].to_bits(), "{ty} row {r}, {} tokens", TILED_TOKENS - 1);
            let v = batch_dot(cols, m.row(r), &xq);
            assert_eq!(v.to_bits(), single[3 * m.rows + r].to_bits(), "{ty} row {r}, {n_tokens} tokens");
        }
    }
}

#[test]
fn large_batches_quantized_in_parallel_match_one_thread() {
    let mut rng = Rng::new(22);
    let (one, two) = (Threads::new(1), Threads::new(2));
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32] {
        let m = random_matrix(ty, 96, 1024, &mut rng);
        let n_tokens = 64;
        let x = rng.vec(n_tokens * 1024, 1.0);
        let a = product(&m, &x, n_tokens, &one);
        let b = product(&m, &x, n_tokens, &two);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{ty}");
        assert!(a.iter().all(|v| v.is_finite()), "{ty}: every output written");
    }
}

#[test]
fn shape_mismatches_are_errors() {
    let bytes = WeightBytes::Owned(Arc::new(vec![0u8; 144]));
    assert!(QMatrix::new(GgmlType::Q4_K, 1, 255, bytes.clone()).is_err());
    assert!(QMatrix::new(GgmlType::Q4_K, 2, 256, bytes.clone()).is_err());
    assert!(QMatrix::new(GgmlType::Q4_K, 1, 256, bytes).is_ok());
    // A type the table does not hold.
    assert!(QMatrix::new(GgmlType::I32, 1, 256, WeightBytes::Owned(Arc::new(vec![0u8; 1024]))).is_err());
}

/// The repacked products of every packed type equal, bit for bit, the per-row dot products
/// llama.cpp computes (for Q8_0 and Q5_0 from 8 tokens, ferrollama's one accumulator): the
/// 16-row groups (packed kernels: token tiles, single tokens, passes over many tokens) and
/// the rows after the last whole group (plain kernels) alike, over 1 and 2 threads.
#[test]
fn packed_products_equal_llama_cpp_row_arithmetic() {
    use ferrollama_tensor::scalar::repacked as rp;
    let mut rng = Rng::new(23);
    let pools = [Threads::new(1), Threads::new(2)];
    let cases: &[(GgmlType, usize)] = &[
        (GgmlType::Q8_0, 96), (GgmlType::Q5_0, 96), (GgmlType::Q4_0, 64), (GgmlType::IQ4_NL, 64),
        (GgmlType::Q4_K, 512), (GgmlType::Q6_K, 512), (GgmlType::MXFP4, 64),
    ];
    for &(ty, cols) in cases {
        // 56 rows: three packed groups and 8 plain rows (still a multiple of 8).
        let m = random_matrix(ty, 56, cols, &mut rng);
        // The types this CPU packs: all six but MXFP4 with AVX-512 VNNI, Q8_0, Q5_0 and Q4_K with AVX2.
        let isa = ferrollama_tensor::dispatch::active_isa();
        let packs = !repack_off() && match isa {
            ferrollama_tensor::Isa::Avx512 => ty != GgmlType::MXFP4,
            ferrollama_tensor::Isa::Avx2 => matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_K),
            ferrollama_tensor::Isa::Scalar => false,
        };
        assert_eq!(m.is_packed(), packs, "{ty} on {isa:?}");
        let t = tr(ty);
        let expected_dot = |n_tokens: usize| match ty {
            GgmlType::Q4_0 if t.isa >= ferrollama_tensor::Isa::Avx2 => rp::vec_dot_q4_0_q8_0,
            GgmlType::IQ4_NL if t.isa >= ferrollama_tensor::Isa::Avx2 => rp::vec_dot_iq4_nl_q8_0,
            GgmlType::MXFP4 if t.isa >= ferrollama_tensor::Isa::Avx2 => rp::vec_dot_mxfp4_q8_0,
            GgmlType::Q4_K if t.isa >= ferrollama_tensor::Isa::Avx2 => rp::vec_dot_q4_k_q8_k,
            GgmlType::Q8_0 if n_tokens >= TILED_TOKENS => rp::vec_dot_q8_0_q8_0_blocks,
            GgmlType::Q5_0 if n_tokens >= TILED_TOKENS => rp::vec_dot_q5_0_q8_0_blocks,
            _ => t.vec_dot,
        };
        // From 9 tokens the packed groups run passes of 8, 4, 2 and 1 tokens over token
        // chunks, except that AVX2's Q5_0 and Q4_K kernels go block by block up to 16
        // tokens; 40 tokens on one thread make chunks of 20, which those run in passes (Q5_0
        // decoding the group into a buffer first).
        for n_tokens in [1usize, 2, 3, 5, 9, 13, 40] {
            let expected_dot = expected_dot(n_tokens);
            let x = rng.vec(n_tokens * cols, 1.0);
            for pool in &pools {
                let got = product(&m, &x, n_tokens, pool);
                for tok in 0..n_tokens {
                    let xq = quantize(t.vec_dot_type, &x[tok * cols..(tok + 1) * cols]);
                    for r in 0..m.rows {
                        let want = expected_dot(cols, m.row(r), &xq);
                        let g = got[tok * m.rows + r];
                        assert_eq!(g.to_bits(), want.to_bits(), "{ty} packed={} tokens {n_tokens} token {tok} row {r}: {g} vs {want}", m.is_packed());
                    }
                }
            }
        }
    }
}

/// Q5_0 products of many tokens at the bounds of their 16-bit sums: rows whose levels are
/// all 31 (quant 15) or all 0 (quant -16), random levels, and activations of +127 or -127
/// in every byte, alone and mixed. The AVX2 kernels add a block's products of levels
/// (0..31) in 16-bit words that wrap, with the correction of the quants' 16 in the word
/// (true value within 16 * 16 * 127 = 32512: reached by levels 0 times -127); each output
/// equals the one-accumulator dot bit for bit.
#[test]
fn q5_0_products_are_exact_at_the_bounds_of_their_sums() {
    use ferrollama_tensor::scalar::repacked as rp;
    let mut rng = Rng::new(25);
    let cols = 256;
    // A block: d = 1.0 (f16), the fifth bits, then the nibbles.
    let block = |level: u8| -> Vec<u8> {
        let (high, low) = (if level & 16 != 0 { 0xff } else { 0 }, level & 15);
        [0x00, 0x3c].into_iter().chain([high; 4]).chain([low | low << 4; 16]).collect()
    };
    let row = |kind: usize, rng: &mut Rng| -> Vec<u8> {
        match kind % 3 {
            0 => block(31).repeat(cols / 32),
            1 => block(0).repeat(cols / 32),
            _ => random_weights(GgmlType::Q5_0, cols, rng),
        }
    };
    let rows = 48;
    let bytes: Vec<u8> = (0..rows).flat_map(|r| row(r / 2, &mut rng)).collect();
    let m = QMatrix::new(GgmlType::Q5_0, rows, cols, WeightBytes::Owned(Arc::new(bytes))).expect("valid matrix");
    // Tokens of all +1, all -1 (each quantized to 127 or -127 in every byte), alternating
    // signs by block, and random values.
    let token = |t: usize, rng: &mut Rng| -> Vec<f32> {
        match t % 4 {
            0 => vec![1.0; cols],
            1 => vec![-1.0; cols],
            2 => (0..cols).map(|i| if (i / 32) % 2 == 0 { 0.5 } else { -0.5 }).collect(),
            _ => rng.vec(cols, 1.0),
        }
    };
    for n_tokens in [TILED_TOKENS, 9, 16] {
        let x: Vec<f32> = (0..n_tokens).flat_map(|t| token(t, &mut rng)).collect();
        let got = product(&m, &x, n_tokens, &Threads::new(2));
        for tok in 0..n_tokens {
            let xq = quantize(GgmlType::Q8_0, &x[tok * cols..(tok + 1) * cols]);
            for r in 0..rows {
                let want = rp::vec_dot_q5_0_q8_0_blocks(cols, m.row(r), &xq);
                let g = got[tok * rows + r];
                assert_eq!(g.to_bits(), want.to_bits(), "tokens {n_tokens} token {tok} row {r}: {g} vs {want}");
            }
        }
    }
}

/// A copy made part by part (as the repacking thread does after loading) is used for the
/// groups published so far: after every part, and when repacking stops half way, the
/// product equals the in-place product bit for bit, and the parts cover the groups' source
/// bytes front to back (then once more whole, when every group is copied).
#[test]
fn a_copy_published_part_by_part_gives_the_in_place_bits_at_every_step() {
    use ferrollama_tensor::packed::{kernels, PackKind, GROUP};
    let mut rng = Rng::new(24);
    let pool = Threads::new(2);
    let cases: &[(GgmlType, usize)] = &[
        (GgmlType::Q8_0, 96), (GgmlType::Q5_0, 96), (GgmlType::Q4_0, 64), (GgmlType::IQ4_NL, 64),
        (GgmlType::Q4_K, 512), (GgmlType::Q6_K, 512),
    ];
    for &(ty, cols) in cases {
        let rows = 3 * GROUP + 8;
        let bytes: Vec<u8> = (0..rows).flat_map(|_| random_weights(ty, cols, &mut rng)).collect();
        let row_bytes = bytes.len() / rows;
        let data = WeightBytes::Owned(Arc::new(bytes));
        let in_place = QMatrix::with_layout(ty, rows, cols, data.clone(), false).expect("valid matrix");
        let x = rng.vec(9 * cols, 1.0);
        let want: Vec<Vec<f32>> = [1usize, 9].iter().map(|&n| product(&in_place, &x, n, &pool)).collect();
        let same_bits = |m: &QMatrix, step: &str| {
            for (k, &n) in [1usize, 9].iter().enumerate() {
                let got = product(m, &x, n, &pool);
                assert!(got.iter().zip(&want[k]).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty} {n} tokens, {step}");
            }
        };
        let has_kernels = PackKind::of(ty).and_then(kernels).is_some() && !repack_off();
        for stop_after in [usize::MAX, 1] {
            let (m, job) = QMatrix::new_deferred(ty, rows, cols, data.clone()).expect("valid matrix");
            assert_eq!(job.is_some(), has_kernels, "{ty}: a job exactly when the CPU has packed kernels (and repacking is on)");
            let Some(job) = job else { continue };
            same_bits(&m, "before repacking");
            let mut calls = Vec::new();
            // One byte per part: one group at a time.
            let finished = job.run_in_parts(1, |done| {
                calls.push(done);
                same_bits(&m, &format!("after part {}", calls.len()));
                calls.len() < stop_after
            });
            let group_bytes = GROUP * row_bytes;
            if stop_after == usize::MAX {
                assert!(finished && m.is_packed(), "{ty}");
                // Every group once, front to back, then all of them again: the pages that
                // products reading in place may have touched after their part was dropped.
                let parts: Vec<_> = (0..3).map(|g| g * group_bytes..(g + 1) * group_bytes).chain([0..3 * group_bytes]).collect();
                assert_eq!(calls, parts, "{ty}");
            } else {
                assert!(!finished && !m.is_packed(), "{ty}: stopped after one part");
                assert_eq!(calls, [0..group_bytes], "{ty}");
                same_bits(&m, "stopped half way");
            }
        }
    }
}

/// The low-bit types' many-token kernels (the i-quants' and MXFP4's eight-row octets, the rows
/// and tokens they leave to the row dots) give every output the row dot of its token count
/// bit for bit: row counts a multiple of 8 and not (MXFP4 is llama.cpp's repacked type only
/// then), token counts inside one tile of the octet kernel and over several, with quads and
/// single tokens left over.
#[test]
fn low_bit_products_equal_their_row_dots_at_every_token_count() {
    let mut rng = Rng::new(27);
    let two = Threads::new(2);
    let cols = 512;
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::MXFP4] {
        for rows in [40, 45] {
            let m = random_matrix(ty, rows, cols, &mut rng);
            for n_tokens in [8, 9, 19, 21, 37] {
                let x = rng.vec(n_tokens * cols, 1.0);
                let out = product(&m, &x, n_tokens, &two);
                let dot = m.row_dot_for(n_tokens);
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    let xq = quantize(tr(ty).vec_dot_type, xt);
                    for r in 0..rows {
                        let want = dot(cols, m.row(r), &xq);
                        assert_eq!(out[t * rows + r].to_bits(), want.to_bits(), "{ty} {rows} rows, {n_tokens} tokens: row {r} token {t}");
                    }
                }
            }
        }
    }
}

/// The products of NVFP4, Q1_0, TQ1_0 and TQ2_0 (eight-row kernels for the tokens the
/// four-token kernels leave, NVFP4's four-token tiles two rows at a time, Q1_0's on the
/// tile's activation scales converted once) give
/// every output its row dot bit for bit: row counts a multiple of 8 and not, one to nine
/// tokens, one and two threads.
#[test]
fn vector_accumulator_products_equal_their_row_dots() {
    let mut rng = Rng::new(41);
    let pools = [Threads::new(1), Threads::new(2)];
    for (ty, cols) in [(GgmlType::NVFP4, 896), (GgmlType::Q1_0, 896), (GgmlType::TQ1_0, 1024), (GgmlType::TQ2_0, 1024)] {
        for rows in [40, 45] {
            let m = random_matrix(ty, rows, cols, &mut rng);
            for n_tokens in [1, 2, 3, 5, 9] {
                let x = rng.vec(n_tokens * cols, 1.0);
                for pool in &pools {
                    let out = product(&m, &x, n_tokens, pool);
                    for (t, xt) in x.chunks_exact(cols).enumerate() {
                        let xq = quantize(tr(ty).vec_dot_type, xt);
                        for r in 0..rows {
                            let want = (tr(ty).vec_dot)(cols, m.row(r), &xq);
                            assert_eq!(out[t * rows + r].to_bits(), want.to_bits(), "{ty} {rows} rows, {n_tokens} tokens, {} threads: row {r} token {t}", pool.n_threads());
                        }
                    }
                }
            }
        }
    }
}
