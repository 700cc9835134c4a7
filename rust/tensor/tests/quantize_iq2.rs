//! The IQ2 quantizers (beyond tests/quantize_iq.rs's recorded rows): they rebuild the tiny IQ2
//! models byte for byte from the F32 model, files written by llama.cpp's llama_model_quantize
//! (tests/data/make_tiny_types.py: every matrix in the type, an importance matrix of ones over
//! every column), i.e. ggml's quantizers on real model rows under unit weights; and rows ggml
//! aborts on (non-finite values) quantize without a panic.

mod common;

use common::{model_path, tr};
use ferrollama_gguf::GgufFile;
use ferrollama_tensor::scalar::weighted::quantize_row_weighted;
use ferrollama_tensor::GgmlType;

fn rebuild(suffix: &str, ty: GgmlType) {
    let f32_file = GgufFile::open(model_path("f32"), true).expect("f32 model");
    let file = GgufFile::open(model_path(suffix), true).expect("tiny model opens");
    let t = tr(ty);
    let mut checked = 0;
    for info in file.tensors.iter().filter(|i| i.ggml_type == ty) {
        let src = f32_file.tensor(&info.name).expect("same tensor in the f32 model");
        let x: Vec<f32> = f32_file.tensor_data(src).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let n = info.row_len();
        let ones = vec![1.0f32; n];
        let rb = t.row_bytes(n);
        for (r, (row, want)) in x.chunks_exact(n).zip(file.tensor_data(info).chunks_exact(rb)).enumerate() {
            let mut got = vec![0u8; rb];
            quantize_row_weighted(ty, row, &ones, &mut got).expect("an IQ2 quantizer");
            assert!(got == want, "{suffix} {} row {r}: first differing byte {:?}", info.name, got.iter().zip(want).position(|(a, b)| a != b));
        }
        checked += 1;
    }
    assert!(checked > 0, "no {ty} tensor in tiny-llama-{suffix}");
}

#[test]
fn iq2_xxs_rebuilds_its_tiny_model() { rebuild("iq2_xxs", GgmlType::IQ2_XXS) }
#[test]
fn iq2_xs_rebuilds_its_tiny_model() { rebuild("iq2_xs", GgmlType::IQ2_XS) }
#[test]
fn iq2_s_rebuilds_its_tiny_model() { rebuild("iq2_s", GgmlType::IQ2_S) }

/// ggml aborts on these (no finite distance in the neighbour search); ours write some block.
#[test]
fn non_finite_rows_quantize_without_panicking() {
    let mut x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
    x[3] = f32::NAN;
    x[300] = f32::INFINITY;
    x[301] = f32::NEG_INFINITY;
    let mut qw = vec![1.0f32; 512];
    qw[7] = f32::INFINITY;
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S] {
        let mut out = vec![0u8; tr(ty).row_bytes(512)];
        quantize_row_weighted(ty, &x, &qw, &mut out).expect("an IQ2 quantizer");
    }
    let mut out = vec![0u8; tr(GgmlType::IQ2_S).row_bytes(512)];
    (tr(GgmlType::IQ2_S).from_f32_ref.expect("IQ2_S quantizes without weights"))(&x, &mut out);
}
