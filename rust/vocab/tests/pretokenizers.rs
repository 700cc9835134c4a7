//! Every `tokenizer.ggml.pre` value against llama.cpp: tests/data/vocab/pretokenizers.json
//! holds llama.cpp's tokens and detokenized text for a set of texts with the Qwen2 vocabulary
//! of the suite, its pre-tokenizer replaced by each value (see the file's "about").

mod common;

use ferrollama_gguf::{GgufFile, Value};
use ferrollama_vocab::{Vocab, VocabError};
use serde_json::Value as Json;

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len() / 2).map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn set_string(f: &mut GgufFile, key: &str, value: &str) {
    let slot = f.metadata.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}"));
    slot.1 = Value::Str(value.as_bytes().to_vec());
}

/// The Qwen2 vocabulary with another pre-tokenizer (and the "whitespace" tokenizer model for
/// the "whitespace" pre-tokenizer, as recorded).
fn vocab_with_pre(f: &mut GgufFile, pre: &str) -> Vocab {
    set_string(f, "tokenizer.ggml.pre", pre);
    set_string(f, "tokenizer.ggml.model", if pre == "whitespace" { "whitespace" } else { "gpt2" });
    Vocab::from_gguf(f).unwrap_or_else(|e| panic!("pre {pre}: {e}"))
}

#[test]
fn every_pre_tokenizer_matches_llama_cpp() {
    let text = std::fs::read_to_string(common::data_dir().join("vocab/pretokenizers.json")).unwrap();
    let fixture: Json = serde_json::from_str(&text).unwrap();
    let texts: Vec<Vec<u8>> = fixture["texts_hex"].as_array().unwrap().iter().map(|t| unhex(t.as_str().unwrap())).collect();
    let mut file = GgufFile::open(common::data_dir().join("vocab/ggml-vocab-qwen2.gguf"), true).unwrap();
    let mut n_pre = 0;
    let mut n_cases = 0;
    for group in fixture["groups"].as_array().unwrap() {
        for pre in group["pre"].as_array().unwrap() {
            let pre = pre.as_str().unwrap();
            let vocab = vocab_with_pre(&mut file, pre);
            assert_eq!(vocab.pre(), pre);
            for (i, text) in texts.iter().enumerate() {
                let expected = &group["tokens"][i];
                let got = vocab.tokenize(text, true, true);
                match expected {
                    Json::String(err) => assert!(matches!(got, Err(VocabError::Invalid(_))), "pre {pre} text {i}: llama.cpp fails ({err}), got {got:?}"),
                    _ => {
                        let expected: Vec<u32> = expected.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
                        let got = got.unwrap_or_else(|e| panic!("pre {pre} text {i}: {e}"));
                        assert_eq!(got, expected, "pre {pre} text {i}: {:?}", String::from_utf8_lossy(text));
                        let detok = vocab.detokenize(&got, false, false);
                        assert_eq!(detok, unhex(group["detokenized_hex"][i].as_str().unwrap()), "pre {pre} text {i}: detokenized");
                    }
                }
                n_cases += 1;
            }
            n_pre += 1;
        }
    }
    println!("{n_pre} pre-tokenizers, {n_cases} cases");
    assert_eq!(n_pre, 91);
}

#[test]
fn unknown_pre_tokenizer_is_unsupported_and_named() {
    let mut f = GgufFile::open(common::data_dir().join("vocab/ggml-vocab-qwen2.gguf"), true).unwrap();
    set_string(&mut f, "tokenizer.ggml.pre", "no-such-pre");
    match Vocab::from_gguf(&f) {
        Err(VocabError::Unsupported(msg)) => assert!(msg.contains("no-such-pre"), "{msg}"),
        other => panic!("expected Unsupported, got {:?}", other.map(|v| v.pre().to_string())),
    }
}
