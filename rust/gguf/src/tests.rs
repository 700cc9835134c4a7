use super::*;
use crate::value::tag;

/// Builds GGUF bytes for tests.
#[derive(Default)]
pub(crate) struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<u8>,
    n_tensors: u64,
}

impl Writer {
    fn string(buf: &mut Vec<u8>, s: &[u8]) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s);
    }
    fn kv(&mut self, key: &str, type_id: u32, payload: &[u8]) -> &mut Self {
        Self::string(&mut self.kv, key.as_bytes());
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend(payload);
        self.n_kv += 1;
        self
    }
    fn tensor(&mut self, name: &str, shape: &[u64], type_id: u32, offset: u64) -> &mut Self {
        Self::string(&mut self.tensors, name.as_bytes());
        self.tensors.extend((shape.len() as u32).to_le_bytes());
        for d in shape { self.tensors.extend(d.to_le_bytes()); }
        self.tensors.extend(type_id.to_le_bytes());
        self.tensors.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }
    fn finish(&self, version: u32, data: &[u8]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.tensors);
        while out.len() % DEFAULT_ALIGNMENT != 0 { out.push(0); }
        out.extend(data);
        out
    }
}

fn every_type_file() -> Vec<u8> {
    let mut w = Writer::default();
    let mut s = Vec::new();
    Writer::string(&mut s, b"hello");
    let mut arr = tag::STRING.to_le_bytes().to_vec();
    arr.extend(2u64.to_le_bytes());
    Writer::string(&mut arr, b"a");
    Writer::string(&mut arr, b"\xff");
    // array of arrays: [[1u8, 2u8], []]
    let mut nested = tag::ARRAY.to_le_bytes().to_vec();
    nested.extend(2u64.to_le_bytes());
    nested.extend(tag::U8.to_le_bytes()); nested.extend(2u64.to_le_bytes()); nested.extend([1u8, 2]);
    nested.extend(tag::U8.to_le_bytes()); nested.extend(0u64.to_le_bytes());
    w.kv("u8", tag::U8, &[7])
        .kv("i8", tag::I8, &[0xff])
        .kv("u16", tag::U16, &300u16.to_le_bytes())
        .kv("i16", tag::I16, &(-300i16).to_le_bytes())
        .kv("u32", tag::U32, &70000u32.to_le_bytes())
        .kv("i32", tag::I32, &(-70000i32).to_le_bytes())
        .kv("u64", tag::U64, &(1u64 << 40).to_le_bytes())
        .kv("i64", tag::I64, &(-(1i64 << 40)).to_le_bytes())
        .kv("f32", tag::F32, &1.5f32.to_le_bytes())
        .kv("f64", tag::F64, &(-2.25f64).to_le_bytes())
        .kv("bool", tag::BOOL, &[1])
        .kv("str", tag::STRING, &s)
        .kv("strs", tag::ARRAY, &arr)
        .kv("nested", tag::ARRAY, &nested)
        .tensor("t", &[4, 2], 0, 0);
    w.finish(3, &[0u8; 32])
}

#[test]
fn reads_every_value_type() {
    let f = GgufFile::from_bytes("mem", every_type_file()).unwrap();
    assert_eq!(f.get("u8"), Some(&Value::U8(7)));
    assert_eq!(f.get("i8"), Some(&Value::I8(-1)));
    assert_eq!(f.get("u16"), Some(&Value::U16(300)));
    assert_eq!(f.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(f.get("u32"), Some(&Value::U32(70000)));
    assert_eq!(f.get("i32"), Some(&Value::I32(-70000)));
    assert_eq!(f.get("u64"), Some(&Value::U64(1 << 40)));
    assert_eq!(f.get("i64"), Some(&Value::I64(-(1 << 40))));
    assert_eq!(f.get("f32"), Some(&Value::F32(1.5)));
    assert_eq!(f.get("f64"), Some(&Value::F64(-2.25)));
    assert_eq!(f.get("bool"), Some(&Value::Bool(true)));
    assert_eq!(f.get_str("str"), Some("hello"));
    assert_eq!(f.get_array("strs"), Some(&Array::Str([&b"a"[..], b"\xff"].into_iter().collect())));
    assert_eq!(f.get_array("nested"), Some(&Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![])])));
    let t = f.tensor("t").unwrap();
    assert_eq!((t.shape.clone(), t.ggml_type, t.nbytes), (vec![4, 2], GgmlType::F32, 32));
    assert_eq!(f.tensor_data(t).len(), 32);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = every_type_file();
    for n in 0..bytes.len() - 1 {
        let r = GgufFile::from_bytes("mem", bytes[..n].to_vec());
        assert!(r.is_err(), "truncated to {n} bytes parsed");
    }
}

#[test]
fn rejects_bad_headers() {
    let good = every_type_file();
    let msg = |b: Vec<u8>| GgufFile::from_bytes("x.gguf", b).err().expect("must fail").to_string();
    let mut b = good.clone(); b[0] = b'X';
    assert!(msg(b).contains("not a GGUF file (it starts with \"XGUF\", not \"GGUF\")"));
    // A zip: the bytes that are not printable are escaped, not listed as numbers.
    assert!(msg(b"PK\x03\x04rest".to_vec()).contains("(it starts with \"PK\\x03\\x04\", not \"GGUF\")"));
    let mut b = good.clone(); b[4] = 9;
    assert!(msg(b).contains("unsupported GGUF version 9"));
    let mut b = good.clone(); b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(msg(b).contains("tensor count"));
    let mut b = good.clone(); b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(msg(b).starts_with("x.gguf: "));
}

#[test]
fn rejects_bad_tensors() {
    let cases: Vec<(Writer, &str)> = vec![
        ({ let mut w = Writer::default(); w.tensor("t", &[4, 2], 0, 32); w }, "outside"),
        ({ let mut w = Writer::default(); w.tensor("t", &[4, 2], 4, 0); w }, "unknown type id 4"),
        ({ let mut w = Writer::default(); w.tensor("t", &[1 << 62, 1 << 62], 0, 0); w }, "overflow"),
        ({ let mut w = Writer::default(); w.tensor("t", &[1, 1, 1, 1, 1], 0, 0); w }, "5 dimensions"),
        ({ let mut w = Writer::default(); w.tensor("t", &[31], 8, 0); w }, "block size"),
        ({ let mut w = Writer::default(); w.tensor("t", &[4], 0, 4); w }, "not aligned"),
        ({ let mut w = Writer::default(); w.tensor("t", &[4], 0, 0).tensor("t", &[4], 0, 0); w }, "duplicate"),
    ];
    for (w, want) in cases {
        let e = GgufFile::from_bytes("mem", w.finish(3, &[0u8; 32])).err().expect("must fail").to_string();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    }
}

fn tiny_model_path(kind: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/data/models/tiny-llama-{kind}.gguf"))
}

#[test]
fn reads_tiny_model() {
    let f = GgufFile::open(tiny_model_path("q4_k"), true).unwrap();
    assert!(f.is_mapped());
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get_u64("llama.embedding_length"), Some(256));
    let t = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Q4_K);
    assert_eq!(t.shape, vec![256, 256]);
    assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().len(), 512);
}

/// Mutation fuzzing: flip, zero and max out bytes of a real header and of lengths.
/// Every mutant either parses or returns an error; none panics or allocates wildly.
#[test]
fn mutation_fuzz_never_panics() {
    let base = std::fs::read(tiny_model_path("q8_0")).unwrap();
    let header_len = GgufFile::from_bytes("m", base.clone()).unwrap().data_offset;
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
    let cases: usize = std::env::var("FERROLLAMA_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    for _ in 0..cases {
        let mut b = base[..header_len + 64].to_vec();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header_len;
            match next() % 4 {
                0 => b[at] ^= 1 << (next() % 8),
                1 => b[at] = 0xff,
                2 => b[at] = 0,
                _ => { let end = (at + 8).min(b.len()); for x in &mut b[at..end] { *x = next() as u8; } }
            }
        }
        if next() % 3 == 0 { b.truncate((next() as usize) % b.len()); }
        let _ = GgufFile::from_bytes("m", b);
    }
}
