//! tests/data/tokenize.json: llama.cpp's tokens and pieces (special tokens rendered) for the
//! texts of tests/data/texts, with the tiny vocabulary and the two real models.

mod common;

use ferrollama_vocab::Vocab;
use serde_json::Value;

/// Bytes as the recording script printed them: UTF-8, undecodable bytes as "\xNN".
fn backslash_replace(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                let n = e.error_len().unwrap_or(bad.len());
                for b in &bad[..n] {
                    out.push_str(&format!("\\x{b:02x}"));
                }
                rest = &bad[n..];
            }
        }
    }
}

fn check_model(vocab: &Vocab, entry: &Value) -> usize {
    let model = entry["model"].as_str().unwrap();
    let cases = entry["cases"].as_array().unwrap();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        let add_special = case["add_special"].as_bool().unwrap();
        let parse_special = case["parse_special"].as_bool().unwrap();
        let expected: Vec<u32> = case["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let got = vocab.tokenize(text.as_bytes(), add_special, parse_special).unwrap();
        assert_eq!(got, expected, "{model} case {i} (add_special {add_special}, parse_special {parse_special})");
        let pieces: Vec<String> = got.iter().map(|&t| backslash_replace(&vocab.token_to_piece(t, true))).collect();
        let expected_pieces: Vec<&str> = case["pieces"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert_eq!(pieces, expected_pieces, "{model} case {i}: pieces");
    }
    cases.len()
}

fn entries() -> Vec<Value> {
    let text = std::fs::read_to_string(common::data_dir().join("tokenize.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap().as_array().unwrap().clone()
}

#[test]
fn tiny_vocabulary_matches_llama_cpp() {
    let entry = entries().into_iter().find(|e| e["model"] == "tiny-llama-f32.gguf").unwrap();
    let vocab = common::load(&common::data_dir().join("models/tiny-llama-f32.gguf"));
    let n = check_model(&vocab, &entry);
    println!("tiny-llama-f32: {n}/{n} cases");
    assert_eq!(n, 8);
}

#[test]
fn real_models_match_llama_cpp() {
    let Some(dir) = common::models_dir() else { return };
    let mut checked = 0;
    for entry in entries() {
        let model = entry["model"].as_str().unwrap().to_string();
        if model.starts_with("tiny") {
            continue;
        }
        let vocab = common::load(&dir.join(&model));
        let n = check_model(&vocab, &entry);
        println!("{model}: {n}/{n} cases");
        checked += 1;
    }
    assert_eq!(checked, 2);
}

#[test]
fn backslash_replace_is_pythons() {
    assert_eq!(backslash_replace(b"a\xc3"), "a\\xc3");
    assert_eq!(backslash_replace("é".as_bytes()), "é");
    assert_eq!(backslash_replace(b"\xe2\x96A"), "\\xe2\\x96A");
}
