//! (a) Dequantization of real blocks from every tiny model equals the `gguf` Python
//! package's gguf.quants.dequantize bit for bit (fixtures from tests/gen_fixtures.py), and
//! the reference quantizers rebuild every tiny model's weights byte for byte from the
//! F32 model (the files were written by `gguf` and `llama-quantize --pure` from it). Q1_0
//! and Q2_0, which the `gguf` package cannot dequantize, are checked against ggml's own
//! dequantize_row_* (tests/gen_q1q2_fixtures.py).

mod common;

use common::*;
use ferrollama_gguf::GgufFile;
use ferrollama_tensor::scalar::weighted::quantize_row_weighted;
use ferrollama_tensor::{GgmlType, QMatrix, WeightBytes};
use std::sync::Arc;

struct Section {
    name: String,
    rows: Vec<usize>,
    cols: usize,
    values: Vec<f32>,
}

fn u32_at(b: &[u8], off: &mut usize) -> usize {
    let v = u32::from_le_bytes(b[*off..*off + 4].try_into().unwrap()) as usize;
    *off += 4;
    v
}

/// The next `len` bytes at `off`.
fn take<'a>(b: &'a [u8], off: &mut usize, len: usize) -> &'a [u8] {
    *off += len;
    &b[*off - len..*off]
}

fn read_fixture(suffix: &str) -> Vec<Section> {
    let path = format!("{DATA}/quants/{suffix}.fix");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&b[..4], b"FQFX");
    let mut off = 4;
    let count = u32_at(&b, &mut off);
    (0..count)
        .map(|_| {
            let len = u32_at(&b, &mut off);
            let name = String::from_utf8(b[off..off + len].to_vec()).unwrap();
            off += len;
            let n_rows = u32_at(&b, &mut off);
            let cols = u32_at(&b, &mut off);
            let rows = (0..n_rows).map(|_| u32_at(&b, &mut off)).collect();
            let values = b[off..off + 4 * n_rows * cols].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            off += 4 * n_rows * cols;
            Section { name, rows, cols, values }
        })
        .collect()
}

fn matrix(file: &Arc<GgufFile>, name: &str) -> QMatrix {
    let info = file.tensor(name).unwrap_or_else(|| panic!("{name} in model"));
    let start = file.data_offset + info.offset;
    struct Owner(Arc<GgufFile>);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            self.0.bytes()
        }
    }
    let data = WeightBytes::Shared { owner: Arc::new(Owner(file.clone())), range: start..start + info.nbytes };
    QMatrix::new(info.ggml_type, info.n_rows(), info.row_len(), data).expect("valid matrix")
}

#[test]
fn dequantization_matches_the_gguf_package_bit_for_bit() {
    for &(suffix, ty) in MODEL_TYPES {
        let file = Arc::new(GgufFile::open(model_path(suffix), true).expect("tiny model opens"));
        for s in read_fixture(suffix) {
            let m = matrix(&file, &s.name);
            assert_eq!(m.ty, ty, "{suffix} {}", s.name);
            assert_eq!(m.cols, s.cols);
            let mut row = vec![0f32; s.cols];
            for (i, &r) in s.rows.iter().enumerate() {
                m.dequantize_row(r, &mut row);
                let want = &s.values[i * s.cols..(i + 1) * s.cols];
                for (c, (a, b)) in row.iter().zip(want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{suffix} {} row {r} col {c}: {a} != {b}", s.name);
                }
            }
        }
    }
}

/// Checks every section of a b"FDQX" fixture (random rows of a type and ggml's values for
/// them) bit for bit; returns the sections' types.
fn random_blocks_dequantize_as_recorded(file: &str) -> Vec<GgmlType> {
    let path = format!("{DATA}/quants/{file}");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&b[..4], b"FDQX");
    let mut off = 4;
    let mut types = Vec::new();
    for _ in 0..u32_at(&b, &mut off) {
        let ty = GgmlType::from_id(u32_at(&b, &mut off) as u32).expect("known type");
        let (n, n_rows) = (u32_at(&b, &mut off), u32_at(&b, &mut off));
        let bytes = &b[off..off + n_rows * tr(ty).row_bytes(n)];
        off += bytes.len();
        let got = dequantize(ty, bytes, n_rows * n);
        for (i, (g, w)) in got.iter().zip(b[off..off + 4 * n_rows * n].chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes(w.try_into().unwrap());
            assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: {g} != {w}");
        }
        off += 4 * n_rows * n;
        types.push(ty);
    }
    types
}

/// tests/data/quants/lowbit_dequant.fix (tests/gen_lowbit_fixtures.py): random blocks of the
/// types of issue 27, every code value, with gguf.quants.dequantize's values.
#[test]
fn random_blocks_of_the_new_types_dequantize_as_the_gguf_package() {
    let types = random_blocks_dequantize_as_recorded("lowbit_dequant.fix");
    let iquants = [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M];
    assert_eq!(types, [[GgmlType::MXFP4, GgmlType::TQ1_0, GgmlType::TQ2_0].as_slice(), &iquants].concat());
}

/// The i-quant tiny models were written by llama_model_quantize with an importance matrix of ones
/// (make_tiny_types.py): the weighted quantizers under the same weights give every tensor's bytes.
#[test]
fn weighted_quantizers_rebuild_the_i_quant_tiny_models() {
    let f32_file = GgufFile::open(model_path("f32"), true).expect("f32 model");
    for &(suffix, ty) in MODEL_TYPES.iter().filter(|(_, t)| NO_QUANTIZER.contains(t)) {
        let file = GgufFile::open(model_path(suffix), true).expect("tiny model opens");
        let t = tr(ty);
        let mut checked = 0;
        for info in file.tensors.iter().filter(|i| i.ggml_type == ty) {
            let src = f32_file.tensor(&info.name).expect("same tensor in the f32 model");
            let x: Vec<f32> = f32_file.tensor_data(src).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let (n, rb) = (info.row_len(), t.row_bytes(info.row_len()));
            let ones = vec![1.0f32; n];
            let mut q = vec![0u8; t.row_bytes(x.len())];
            for (row, dst) in x.chunks_exact(n).zip(q.chunks_exact_mut(rb)) {
                quantize_row_weighted(ty, row, &ones, dst).expect("a weighted quantizer");
            }
            let first_bad = q.iter().zip(file.tensor_data(info)).position(|(a, b)| a != b);
            assert!(first_bad.is_none(), "{suffix} {}: first differing byte {} (row {})", info.name, first_bad.unwrap(), first_bad.unwrap() / rb);
            checked += 1;
        }
        assert!(checked > 0, "{suffix}: no {ty} tensors");
    }
}

/// tests/data/quants/q1q2_dequant.fix (tests/gen_q1q2_fixtures.py): random Q1_0 and Q2_0
/// blocks with ggml's dequantize_row_q1_0 / dequantize_row_q2_0 values.
#[test]
fn random_q1_0_and_q2_0_blocks_dequantize_as_ggml() {
    assert_eq!(random_blocks_dequantize_as_recorded("q1q2_dequant.fix"), [GgmlType::Q1_0, GgmlType::Q2_0]);
}

/// tests/data/quants/q1q2_quantize.fix (tests/gen_q1q2_fixtures.py): rows of random values and
/// of edge cases (zeros and -0.0, ties of roundf, a maximum below f16's range), with what
/// ggml's quantize_row_q1_0_ref / q2_0_ref write and what quantize_q1_0 / q2_0 write under
/// importance weights (the same: ggml ignores them for these types).
#[test]
fn q1_0_and_q2_0_quantizers_write_ggml_bytes() {
    let path = format!("{DATA}/quants/q1q2_quantize.fix");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&b[..4], b"FQZX");
    let mut off = 4;
    let f32s = |bytes: &[u8]| -> Vec<f32> { bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let mut types = Vec::new();
    for _ in 0..u32_at(&b, &mut off) {
        let ty = GgmlType::from_id(u32_at(&b, &mut off) as u32).expect("known type");
        let (n, n_rows) = (u32_at(&b, &mut off), u32_at(&b, &mut off));
        let rb = tr(ty).row_bytes(n);
        let values = f32s(take(&b, &mut off, 4 * n * n_rows));
        let weights = f32s(take(&b, &mut off, 4 * n));
        let (reference, weighted) = (take(&b, &mut off, rb * n_rows), take(&b, &mut off, rb * n_rows));
        for r in 0..n_rows {
            let x = &values[r * n..(r + 1) * n];
            assert_eq!(quantize_ref(ty, x), reference[r * rb..(r + 1) * rb], "{ty} row {r}: reference quantizer");
            let mut q = vec![0u8; rb];
            quantize_row_weighted(ty, x, &weights, &mut q).expect("Q1_0 and Q2_0 take importance weights");
            assert_eq!(q, weighted[r * rb..(r + 1) * rb], "{ty} row {r}: under importance weights");
        }
        types.push(ty);
    }
    assert_eq!(types, [GgmlType::Q1_0, GgmlType::Q2_0]);
}

#[test]
fn reference_quantizers_rebuild_every_tiny_model() {
    let f32_file = GgufFile::open(model_path("f32"), true).expect("f32 model");
    for &(suffix, ty) in MODEL_TYPES.iter().filter(|(_, t)| *t != GgmlType::F32 && !NO_QUANTIZER.contains(t)) {
        let file = GgufFile::open(model_path(suffix), true).expect("tiny model opens");
        let t = tr(ty);
        for info in file.tensors.iter().filter(|i| i.ggml_type == ty) {
            let src = f32_file.tensor(&info.name).expect("same tensor in the f32 model");
            let x: Vec<f32> = f32_file.tensor_data(src).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let mut q = vec![0u8; t.row_bytes(x.len())];
            (t.from_f32_ref.unwrap())(&x, &mut q);
            let want = file.tensor_data(info);
            let rb = t.row_bytes(info.row_len());
            let first_bad = q.iter().zip(want).position(|(a, b)| a != b);
            assert!(first_bad.is_none(), "{suffix} {}: first differing byte {} (row {})", info.name, first_bad.unwrap(), first_bad.unwrap() / rb);
        }
    }
}
