//! llama.cpp's vocabulary test suite (tests/data/vocab): every text of NAME.gguf.inp,
//! tokenized with add_special = false and parse_special = false, must give the ids of the
//! matching line of NAME.gguf.out.

mod common;

const VOCABS: &[&str] = &["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "starcoder"];

#[test]
fn every_case_of_every_vocabulary() {
    let mut failures = Vec::new();
    let mut total = 0;
    for name in VOCABS {
        let vocab = common::suite_vocab(name);
        let cases = common::read_suite(name);
        let mut passed = 0;
        for (text, expected) in &cases {
            let got = vocab.tokenize(text, false, false).expect("tokenize");
            if &got == expected {
                passed += 1;
            } else {
                failures.push(format!("{name}: {:?}\n  expected {expected:?}\n  got      {got:?}", String::from_utf8_lossy(text)));
            }
        }
        println!("{name}: {passed}/{} cases", cases.len());
        assert!(cases.len() >= 40, "{name}: only {} cases read", cases.len());
        total += cases.len();
    }
    assert!(failures.is_empty(), "{} of {total} cases differ:\n{}", failures.len(), failures.join("\n"));
}
