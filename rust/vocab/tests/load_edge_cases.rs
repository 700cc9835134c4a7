//! Loading corner cases on edited copies of the suite's vocabularies: repeated token texts
//! (reported with the ids of the first text found again, in id order, as llama.cpp's
//! `token_to_id` would meet it) and hybriddna's k-mers (looked up with their marker, shown
//! without it).

mod common;

use ferrollama_gguf::{Array, GgufFile, Value};
use ferrollama_vocab::{Vocab, VocabError};

fn suite_file(name: &str) -> GgufFile {
    GgufFile::open(common::data_dir().join(format!("vocab/ggml-vocab-{name}.gguf")), true).unwrap()
}

fn set_string(f: &mut GgufFile, key: &str, value: &str) {
    let slot = f.metadata.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}"));
    slot.1 = Value::Str(value.as_bytes().to_vec());
}

/// Replaces the texts of some tokens.
fn set_texts(f: &mut GgufFile, texts: &[(usize, &[u8])]) {
    let slot = f.metadata.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens").expect("tokens");
    let Value::Array(Array::Str(tokens)) = &mut slot.1 else { panic!("tokens are not strings") };
    for &(id, text) in texts {
        tokens.set(id, text);
    }
}

/// Sets the `tokenizer.ggml.token_type` of some tokens (1 normal, 3 control).
fn set_types(f: &mut GgufFile, types: &[(usize, i32)]) {
    let slot = f.metadata.iter_mut().find(|(k, _)| k == "tokenizer.ggml.token_type").expect("token types");
    let Value::Array(Array::I32(all)) = &mut slot.1 else { panic!("token types are not I32") };
    for &(id, t) in types {
        all[id] = t;
    }
}

fn load_error(f: &GgufFile) -> String {
    match Vocab::from_gguf(f) {
        Err(VocabError::Invalid(message)) => message,
        other => panic!("expected an invalid vocabulary, got {:?}", other.map(|v| v.n_tokens())),
    }
}

#[test]
fn repeated_texts_are_reported_first_in_id_order() {
    // qwen2 is byte-level BPE: texts that decode and texts that do not (a raw space) are
    // indexed apart, and the first repeat overall is reported either way
    let decodes: &[u8] = b"abc";
    let does_not: &[u8] = b"a b";
    for (edits, expected) in [
        (vec![(300, decodes), (900, decodes)], "'abc' has ids 300 and 900"),
        (vec![(300, does_not), (900, does_not)], "'a b' has ids 300 and 900"),
        (vec![(300, decodes), (900, decodes), (400, does_not), (800, does_not)], "'a b' has ids 400 and 800"),
        (vec![(300, does_not), (900, does_not), (400, decodes), (800, decodes)], "'abc' has ids 400 and 800"),
        (vec![(300, decodes), (500, decodes), (700, decodes)], "'abc' has ids 300 and 500"),
    ] {
        for name in ["qwen2", "llama-spm"] {
            let mut f = suite_file(name);
            set_texts(&mut f, &edits);
            assert_eq!(load_error(&f), format!("duplicate token in vocabulary: {expected}"), "{name} {edits:?}");
        }
    }
    // an empty text is named after its id, and that name may repeat
    let mut f = suite_file("qwen2");
    set_texts(&mut f, &[(300, b""), (900, b"[EMPTY_300]")]);
    assert_eq!(load_error(&f), "duplicate token in vocabulary: '[EMPTY_300]' has ids 300 and 900");
}

#[test]
fn hybriddna_kmers_are_found_with_their_marker_and_shown_without() {
    const MARKER: &str = "\u{E000}";
    let mut f = suite_file("qwen2");
    set_string(&mut f, "tokenizer.ggml.model", "hybriddna");
    let n = Vocab::from_gguf(&f).unwrap().n_tokens();
    let (oov, open, close, kmer, other) = (n - 6, n - 5, n - 4, n - 3, n - 2);
    let kmer_text = format!("ACGTAC{MARKER}");
    let other_text = format!("AAAAAA{MARKER}");
    let before_oov = format!("CCCCCC{MARKER}");
    set_texts(&mut f, &[
        (100, before_oov.as_bytes()),
        (oov, b"<oov>"),
        (open, b"<dna>"),
        (close, b"</dna>"),
        (kmer, kmer_text.as_bytes()),
        (other, other_text.as_bytes()),
    ]);
    // the DNA tags are control tokens (not split out of the text without parse_special)
    set_types(&mut f, &[(100, 1), (oov, 3), (open, 3), (close, 3), (kmer, 1), (other, 1)]);
    let v = Vocab::from_gguf(&f).unwrap();
    // k-mers after "<oov>" lose the marker in their text and piece, not in the lookup
    assert_eq!(v.token_text(kmer as u32), b"ACGTAC");
    assert_eq!(v.token_to_piece(kmer as u32, true), b"ACGTAC");
    assert_eq!(v.text_to_token(kmer_text.as_bytes()), Some(kmer as u32));
    assert_eq!(v.text_to_token(b"ACGTAC"), None);
    assert_eq!(v.token_text(100), before_oov.as_bytes());
    assert_eq!(v.text_to_token(b"<oov>"), Some(oov as u32));
    let tokens = v.tokenize(b"hi <dna>acgtacAAAAAAGG</dna> there", false, false).unwrap();
    let dna: Vec<u32> = [open, kmer, other, oov, close].iter().map(|&t| t as u32).collect();
    let at = tokens.iter().position(|&t| t == open as u32).expect("<dna> token");
    assert_eq!(&tokens[at..at + 5], dna.as_slice());
    assert_eq!(v.detokenize(&dna, false, true), b"<dna>ACGTACAAAAAA<oov></dna>");
}
