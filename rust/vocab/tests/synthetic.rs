//! UGM (t5), RWKV and PLaMo-2 tokenizers against llama.cpp on small synthetic vocabularies
//! (tests/data/vocab/synthetic.json, see its "about"), and WPM (bert) on llama.cpp's own
//! ggml-vocab-bert-bge suite files.

mod common;

use serde_json::Value;

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len() / 2).map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array().map(|a| a.iter().map(|t| t.as_u64().unwrap() as u32).collect())
}

#[test]
fn ugm_rwkv_plamo2_match_llama_cpp() {
    let text = std::fs::read_to_string(common::data_dir().join("vocab/synthetic.json")).unwrap();
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let vocabs = fixture["vocabs"].as_object().unwrap();
    assert_eq!(vocabs.len(), 4);
    for (name, rec) in vocabs {
        let vocab = common::load(&common::data_dir().join("vocab").join(name));
        let texts: Vec<Vec<u8>> = rec["texts_hex"].as_array().unwrap().iter().map(|t| unhex(t.as_str().unwrap())).collect();
        for (i, text) in texts.iter().enumerate() {
            for (key, add, parse) in [("tokens_plain", false, false), ("tokens_special", true, true)] {
                let expected = ids(&rec[key][i]).unwrap_or_else(|| panic!("{name} {i}: llama.cpp error {}", rec[key][i]));
                let got = vocab.tokenize(text, add, parse).unwrap();
                assert_eq!(got, expected, "{name} text {i} ({key}): {:?}", String::from_utf8_lossy(text));
            }
            let plain = ids(&rec["tokens_plain"][i]).unwrap();
            assert_eq!(vocab.detokenize(&plain, false, false), unhex(rec["detokenized_hex"][i].as_str().unwrap()), "{name} text {i}: detokenized");
        }
        println!("{name} ({}): {} texts", vocab.model_kind(), texts.len());
    }
}

#[test]
fn wpm_suite_bert_bge() {
    let vocab = common::suite_vocab("bert-bge");
    assert_eq!(vocab.model_kind(), "bert");
    let cases = common::read_suite("bert-bge");
    for (text, expected) in &cases {
        assert_eq!(&vocab.tokenize(text, false, false).unwrap(), expected, "{:?}", String::from_utf8_lossy(text));
    }
    // BERT wraps the text in [CLS] ... [SEP]
    let with_special = vocab.tokenize(b"hello world", true, false).unwrap();
    assert_eq!((with_special[0], *with_special.last().unwrap()), (vocab.bos().unwrap(), vocab.sep().unwrap()));
    println!("bert-bge: {}/{} cases", cases.len(), cases.len());
}
