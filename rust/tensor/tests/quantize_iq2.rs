//! Rows ggml's IQ2 quantizers abort on (GGML_ASSERT in iq2_find_best_neighbour when no
//! candidate's distance is finite: NaN, infinite or ~1e15 values) quantize here without a panic.
//! (The bytes of finite rows are tests/quantize_iq.rs's and dequantize.rs's tiny-model rebuilds.)

mod common;

use common::tr;
use ferrollama_tensor::scalar::weighted::quantize_row_weighted;
use ferrollama_tensor::GgmlType;

#[test]
fn non_finite_rows_quantize_without_panicking() {
    let finite: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
    let mut x = finite.clone();
    x[3] = f32::NAN;
    x[300] = f32::INFINITY;
    x[301] = f32::NEG_INFINITY;
    let huge: Vec<f32> = finite.iter().map(|v| v * 1e17).collect();
    let mut qw = vec![1.0f32; 512];
    qw[7] = f32::INFINITY;
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S] {
        for row in [&x, &huge] {
            let mut out = vec![0u8; tr(ty).row_bytes(512)];
            quantize_row_weighted(ty, row, &qw, &mut out).expect("an IQ2 quantizer");
            if ty == GgmlType::IQ2_S {
                (tr(ty).from_f32_ref.expect("IQ2_S quantizes without weights"))(row, &mut out);
            }
        }
    }
}
