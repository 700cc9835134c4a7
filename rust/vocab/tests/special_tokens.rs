//! Special ids, add_bos/add_eos and the end-of-generation set, as llama.cpp's C API reports
//! them (llama_vocab_bos / _eos / _eot / _nl / _pad / _fim_* / _get_add_bos / _get_add_eos,
//! llama_vocab_is_eog over every id), recorded from llama.cpp 0c1e570.
//!
//! EOT and the FIM ids are found by text when the GGUF has no key for them; with several
//! candidates ("<|im_end|>" and "<|endoftext|>" in Qwen) llama.cpp keeps the first one its
//! `std::unordered_map` yields, which these records pin down.

mod common;

use ferrollama_vocab::{Token, Vocab};

struct Expected {
    bos: Option<Token>,
    eos: Option<Token>,
    eot: Option<Token>,
    nl: Option<Token>,
    pad: Option<Token>,
    fim: [Option<Token>; 6],
    add_bos: bool,
    eog: &'static [Token],
}

fn check(name: &str, v: &Vocab, e: &Expected) {
    assert_eq!(v.bos(), e.bos, "{name}: bos");
    assert_eq!(v.eos(), e.eos, "{name}: eos");
    assert_eq!(v.eot(), e.eot, "{name}: eot");
    assert_eq!(v.eom(), None, "{name}: eom");
    assert_eq!(v.nl(), e.nl, "{name}: nl");
    assert_eq!(v.pad(), e.pad, "{name}: pad");
    assert_eq!(v.sep(), None, "{name}: sep");
    assert_eq!([v.fim_pre(), v.fim_suf(), v.fim_mid(), v.fim_pad(), v.fim_rep(), v.fim_sep()], e.fim, "{name}: fim");
    assert_eq!(v.add_bos(), e.add_bos, "{name}: add_bos");
    assert!(!v.add_eos(), "{name}: add_eos");
    let eog: Vec<Token> = (0..v.n_tokens() as Token).filter(|&t| v.is_eog(t)).collect();
    assert_eq!(eog, e.eog, "{name}: eog");
    for &t in e.eog {
        assert!(v.is_control(t), "{name}: EOG token {t} is control");
    }
}

const NO_FIM: [Option<Token>; 6] = [None; 6];

#[test]
fn suite_vocabularies() {
    let cases: &[(&str, Expected)] = &[
        ("llama-spm", Expected { bos: Some(1), eos: Some(2), eot: None, nl: Some(13), pad: None, fim: NO_FIM, add_bos: true, eog: &[2] }),
        ("phi-3", Expected { bos: Some(1), eos: Some(32000), eot: Some(32007), nl: Some(13), pad: Some(32000), fim: NO_FIM, add_bos: true, eog: &[2, 32000, 32007] }),
        ("llama-bpe", Expected { bos: Some(128000), eos: Some(128001), eot: Some(128009), nl: Some(198), pad: None, fim: NO_FIM, add_bos: true, eog: &[128001, 128009] }),
        ("qwen2", Expected { bos: Some(151643), eos: Some(151643), eot: Some(151645), nl: Some(198), pad: Some(151643), fim: NO_FIM, add_bos: false, eog: &[128247, 151643, 151645] }),
        ("gpt-2", Expected { bos: Some(50256), eos: Some(50256), eot: Some(50256), nl: Some(198), pad: None, fim: NO_FIM, add_bos: false, eog: &[50256] }),
        ("deepseek-coder", Expected { bos: Some(32013), eos: Some(32014), eot: Some(32014), nl: Some(185), pad: Some(32014), fim: [Some(32016), Some(32015), Some(32017), None, None, None], add_bos: true, eog: &[32014] }),
        ("starcoder", Expected { bos: Some(0), eos: Some(0), eot: Some(0), nl: Some(222), pad: None, fim: [Some(1), Some(3), Some(2), Some(4), None, None], add_bos: false, eog: &[0, 4] }),
    ];
    for (name, e) in cases {
        check(name, &common::suite_vocab(name), e);
    }
    let tiny = common::load(&common::data_dir().join("models/tiny-llama-f32.gguf"));
    check("tiny", &tiny, &Expected { bos: Some(1), eos: Some(2), eot: None, nl: Some(13), pad: None, fim: NO_FIM, add_bos: true, eog: &[2] });
}

#[test]
fn real_models() {
    let Some(dir) = common::models_dir() else { return };
    let qwen = common::load(&dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
    check("qwen2.5-coder", &qwen, &Expected {
        bos: Some(151643), eos: Some(151645), eot: Some(151645), nl: Some(198), pad: Some(151643),
        fim: [Some(151659), Some(151661), Some(151660), Some(151662), Some(151663), Some(151664)],
        add_bos: false, eog: &[128247, 151643, 151645, 151662, 151663, 151664],
    });
    let gemma = common::load(&dir.join("gemma-3-270m-q4_k_m.gguf"));
    check("gemma-3", &gemma, &Expected { bos: Some(2), eos: Some(1), eot: Some(106), nl: Some(248), pad: Some(0), fim: NO_FIM, add_bos: true, eog: &[1, 106, 212] });
    assert_eq!(gemma.token_text(106), b"<end_of_turn>");
    assert!(!gemma.add_space_prefix());
}

#[test]
fn parse_special_and_strip_attributes() {
    let qwen = common::suite_vocab("qwen2");
    let im_start = qwen.text_to_token(b"<|im_start|>").unwrap();
    let text = b"<|im_start|>user\nhi";
    assert_eq!(qwen.tokenize(text, false, true).unwrap()[0], im_start);
    assert_ne!(qwen.tokenize(text, false, false).unwrap()[0], im_start);
    assert_eq!(qwen.token_to_piece(im_start, true), b"<|im_start|>");
    assert!(qwen.token_to_piece(im_start, false).is_empty());

    // phi-3: llama.cpp gives every special token RSTRIP (whitespace after it is dropped)
    let phi = common::suite_vocab("phi-3");
    let user = phi.text_to_token(b"<|user|>").unwrap();
    assert!(phi.token_attr(user).intersects(ferrollama_vocab::TokenAttr::RSTRIP));
    let a = phi.tokenize(b"<|user|>   hello", false, true).unwrap();
    let b = phi.tokenize(b"<|user|>hello", false, true).unwrap();
    assert_eq!(a, b);
}

#[test]
fn out_of_range_and_empty_input() {
    let v = common::suite_vocab("qwen2");
    let n = v.n_tokens() as Token;
    assert!(v.token_to_piece(n, true).is_empty());
    assert!(v.token_text(n).is_empty());
    assert!(!v.is_eog(n));
    assert_eq!(v.tokenize(b"", false, false).unwrap(), Vec::<Token>::new());
    let spm = common::suite_vocab("llama-spm");
    assert_eq!(spm.tokenize(b"", true, false).unwrap(), vec![1]);
    assert_eq!(spm.detokenize(&[1, n], true, false), b"");
}
