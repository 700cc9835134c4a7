//! The i-quant quantizers against ggml's: tests/data/quants/iq_quantize.fix holds what
//! ggml_quantize_chunk (llama-quantize's quantizer, llama-cpp-python 0.3.36's build) wrote for
//! real and random rows, with importance weights and, for the types ggml quantizes without them,
//! with none (gen_iq_quantize_fixtures.py). Every byte must be equal.

mod common;

use common::{tr, DATA};
use ferrollama_tensor::scalar::weighted::quantize_row_weighted;
use ferrollama_tensor::GgmlType;

struct Section {
    ty: GgmlType,
    rows: usize,
    weights: Option<usize>,
    expected: Vec<u8>,
}

struct Fixture {
    n_per_row: usize,
    row_sets: Vec<Vec<f32>>,
    weight_sets: Vec<Vec<f32>>,
    sections: Vec<Section>,
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }
}

fn fixture() -> Fixture {
    let bytes = std::fs::read(format!("{DATA}/quants/iq_quantize.fix")).expect("iq_quantize.fix");
    let mut r = Reader(&bytes);
    assert_eq!(r.take(4), b"FIQQ");
    let n_per_row = r.u32() as usize;
    let row_sets = (0..r.u32()).map(|_| {
        let n_rows = r.u32() as usize;
        r.floats(n_rows * n_per_row)
    }).collect::<Vec<_>>();
    let weight_sets = (0..r.u32()).map(|_| r.floats(n_per_row)).collect();
    let sections = (0..r.u32()).map(|_| {
        let ty = GgmlType::from_id(r.u32()).expect("a ggml type");
        let rows = r.u32() as usize;
        let weights = usize::try_from(r.u32() as i32).ok();
        let len = row_sets[rows].len() / n_per_row * tr(ty).row_bytes(n_per_row);
        Section { ty, rows, weights, expected: r.take(len).to_vec() }
    }).collect();
    assert!(r.0.is_empty(), "trailing bytes in iq_quantize.fix");
    Fixture { n_per_row, row_sets, weight_sets, sections }
}

/// Quantizes every row of the sections of `ty` recorded with (or without) weights and compares
/// them with ggml's bytes, naming the first block that differs.
fn check(ty: GgmlType, weighted: bool) {
    let f = fixture();
    let row_bytes = tr(ty).row_bytes(f.n_per_row);
    let block_bytes = tr(ty).row_bytes(tr(ty).block_size);
    let mut checked = 0;
    for s in f.sections.iter().filter(|s| s.ty == ty && s.weights.is_some() == weighted) {
        for (i, (x, want)) in f.row_sets[s.rows].chunks_exact(f.n_per_row).zip(s.expected.chunks_exact(row_bytes)).enumerate() {
            let mut got = vec![0u8; row_bytes];
            match s.weights {
                Some(w) => quantize_row_weighted(ty, x, &f.weight_sets[w], &mut got).unwrap_or_else(|| panic!("{ty} has no weighted quantizer")),
                None => (tr(ty).from_f32_ref.unwrap_or_else(|| panic!("{ty} has no quantizer without weights")))(x, &mut got),
            }
            if let Some(b) = got.chunks(block_bytes).zip(want.chunks(block_bytes)).position(|(g, w)| g != w) {
                panic!("{ty} row set {} weights {:?} row {i}: block {b} differs from ggml's\n ours: {:?}\n ggml: {:?}", s.rows, s.weights,
                       &got[b * block_bytes..(b + 1) * block_bytes], &want[b * block_bytes..(b + 1) * block_bytes]);
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no {ty} rows in the fixture");
}

#[test]
fn iq2_xxs_with_imatrix() { check(GgmlType::IQ2_XXS, true) }
#[test]
fn iq2_xs_with_imatrix() { check(GgmlType::IQ2_XS, true) }
#[test]
fn iq2_s_with_imatrix() { check(GgmlType::IQ2_S, true) }
#[test]
fn iq2_s_without_imatrix() { check(GgmlType::IQ2_S, false) }
#[test]
fn iq3_xxs_with_imatrix() { check(GgmlType::IQ3_XXS, true) }
#[test]
fn iq3_xxs_without_imatrix() { check(GgmlType::IQ3_XXS, false) }
#[test]
fn iq3_s_with_imatrix() { check(GgmlType::IQ3_S, true) }
#[test]
fn iq3_s_without_imatrix() { check(GgmlType::IQ3_S, false) }
#[test]
fn iq1_s_with_imatrix() { check(GgmlType::IQ1_S, true) }
#[test]
fn iq1_m_with_imatrix() { check(GgmlType::IQ1_M, true) }
#[test]
fn iq1_m_without_imatrix() { check(GgmlType::IQ1_M, false) }

/// ggml refuses these without importance weights (ggml_quantize_requires_imatrix): so do we.
#[test]
fn types_that_need_weights_have_no_plain_quantizer() {
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_S] {
        assert!(tr(ty).from_f32_ref.is_none(), "{ty}");
    }
}
