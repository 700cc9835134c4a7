//! Round trip: detokenize(tokenize(s)) == s for arbitrary Unicode strings (seeded generator),
//! with tokenize(add_special = false, parse_special = false) and
//! detokenize(remove_special = false, unparse_special = false). The rule holds exactly when:
//! * BPE (byte-level): always for valid UTF-8; with `clean_spaces` vocabularies (gpt-2,
//!   llama-bpe) the detokenizer rewrites " ." " ," " ?" " !" and " '", so strings there avoid
//!   the characters . , ? ! and ' (the clean-up is then the identity);
//! * SPM: the leading space SPM adds (add_space_prefix) is the one the detokenizer removes;
//!   strings must not contain U+2581 (SPM's visible space, which decodes to a space), and the
//!   vocabulary must have the "▁" token (the 512-token tiny vocabulary has not: its spaces
//!   fall back to the byte tokens of U+2581, which decode to those bytes, as in llama.cpp).
//!
//! A streaming decoder fed the same tokens one by one gives the same text, and never a
//! replacement character for this valid input (split characters are held back).

mod common;

use ferrollama_vocab::{StreamDecoder, Vocab};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize { (self.next() % n as u64) as usize }
}

const POOLS: &[&str] = &[
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    "\"#$%&()*+-/:;<=>@[\\]^_`{|}~",
    ".,?!'",
    "    \n\n\t\r\u{b}\u{c}\u{a0}\u{3000}\u{2028}\u{85}",
    "éèàùçÉÀñöüßøåÆŒ",
    "αβγδεΩΣκόλпривет",
    "你好世界中文字符한국어カタカナひらがな",
    "ภาษาไทยहिन्दीالعربية",
    "🦙🚀😀👍🏽❤️\u{301}\u{308}",
    "\u{378}\u{e000}\u{f0000}\u{fffd}①½²𝔘ﬁＨ\u{2581}",
];

/// A random string; `excluded` characters are left out.
fn random_text(rng: &mut Rng, excluded: &str) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(12) {
        let pool: Vec<char> = POOLS[rng.below(POOLS.len())].chars().filter(|c| !excluded.contains(*c)).collect();
        if pool.is_empty() {
            continue;
        }
        for _ in 0..1 + rng.below(6) {
            s.push(pool[rng.below(pool.len())]);
        }
    }
    s
}

fn check(name: &str, vocab: &Vocab, excluded: &str, cases: usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    for i in 0..cases {
        let text = random_text(&mut rng, excluded);
        let tokens = vocab.tokenize(text.as_bytes(), false, false).unwrap();
        let back = vocab.detokenize(&tokens, false, false);
        assert_eq!(String::from_utf8_lossy(&back), text, "{name} case {i}: tokens {tokens:?}");

        let mut stream = StreamDecoder::new(vocab, false);
        let mut streamed = String::new();
        for &t in &tokens {
            streamed.push_str(&stream.push(t));
        }
        streamed.push_str(&stream.flush());
        // the stream has no leading-space removal: compare with the raw concatenation
        let mut pieces = Vec::new();
        for &t in &tokens {
            pieces.extend_from_slice(&vocab.token_to_piece(t, false));
        }
        assert_eq!(streamed.as_bytes(), &pieces[..], "{name} case {i}: stream");
        assert!(!streamed.contains('\u{fffd}') || text.contains('\u{fffd}'), "{name} case {i}: broken character in stream");
    }
    println!("{name}: {cases} round trips");
}

#[test]
fn bpe_round_trips() {
    check("qwen2", &common::suite_vocab("qwen2"), "", 500);
    check("deepseek-coder", &common::suite_vocab("deepseek-coder"), "", 300);
    check("gpt-2", &common::suite_vocab("gpt-2"), ".,?!'", 300);
    check("llama-bpe", &common::suite_vocab("llama-bpe"), ".,?!'", 300);
    check("starcoder", &common::suite_vocab("starcoder"), ".,?!'", 300);
}

#[test]
fn spm_round_trips() {
    check("llama-spm", &common::suite_vocab("llama-spm"), "\u{2581}", 500);
    check("phi-3", &common::suite_vocab("phi-3"), "\u{2581}", 300);
}

#[test]
fn real_models_round_trip() {
    let Some(dir) = common::models_dir() else { return };
    check("qwen2.5-coder", &common::load(&dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")), "", 300);
    check("gemma-3", &common::load(&dir.join("gemma-3-270m-q4_k_m.gguf")), "\u{2581}", 300);
}
