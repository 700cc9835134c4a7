//! Arbitrary bytes never panic, and the streaming decoder holds back split characters.

mod common;

use ferrollama_vocab::{StreamDecoder, VocabError};

#[test]
fn arbitrary_bytes_never_panic() {
    let mut vocabs = vec![
        common::suite_vocab("qwen2"),
        common::suite_vocab("llama-spm"),
        common::suite_vocab("phi-3"),
        common::suite_vocab("deepseek-coder"),
        common::suite_vocab("bert-bge"),
        common::load(&common::data_dir().join("vocab/synth-ugm.gguf")),
        common::load(&common::data_dir().join("vocab/synth-rwkv.gguf")),
        common::load(&common::data_dir().join("vocab/synth-plamo2.gguf")),
    ];
    vocabs.push(common::load(&common::data_dir().join("models/tiny-llama-f32.gguf")));
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for v in &vocabs {
        for _ in 0..300 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            for (add, parse) in [(false, false), (true, true)] {
                match v.tokenize(&bytes, add, parse) {
                    Ok(tokens) => {
                        assert!(tokens.iter().all(|&t| (t as usize) < v.n_tokens()));
                        let _ = v.detokenize(&tokens, add, parse);
                    }
                    // only code points beyond U+10FFFF (which make llama.cpp throw) are refused
                    Err(VocabError::Invalid(msg)) => assert!(msg.contains("beyond U+10FFFF"), "{msg}"),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
}

#[test]
fn beyond_unicode_is_invalid_for_bpe_and_bytes_for_spm() {
    let text = b"a\xF4\x90\x80\x80b";
    assert!(matches!(common::suite_vocab("qwen2").tokenize(text, false, false), Err(VocabError::Invalid(_))));
    // SPM never decodes code points: the bytes fall back to byte tokens
    let spm = common::suite_vocab("llama-spm");
    let tokens = spm.tokenize(text, false, false).unwrap();
    assert_eq!(spm.detokenize(&tokens, false, false), text);
}

#[test]
fn stream_holds_back_split_characters() {
    // the tiny vocabulary spells "é" with the byte tokens <0xC3> <0xA9>
    let tiny = common::load(&common::data_dir().join("models/tiny-llama-f32.gguf"));
    let tokens = tiny.tokenize("é!".as_bytes(), false, false).unwrap();
    let c3 = tiny.text_to_token(b"<0xC3>").unwrap();
    let a9 = tiny.text_to_token(b"<0xA9>").unwrap();
    assert!(tokens.windows(2).any(|w| w == [c3, a9]), "{tokens:?}");
    let mut stream = StreamDecoder::new(&tiny, false);
    let mut outputs = Vec::new();
    for &t in &tokens {
        outputs.push(stream.push(t));
    }
    assert!(outputs.iter().all(|o| !o.contains('\u{fffd}')), "{outputs:?}");
    let pos = tokens.iter().position(|&t| t == c3).unwrap();
    assert_eq!(outputs[pos], "");
    assert!(outputs[pos + 1].ends_with('é'));
    // the prefix space has no token either: its byte tokens decode to U+2581, as in llama.cpp
    assert_eq!(outputs.concat() + &stream.flush(), "\u{2581}é!");

    // an unfinished character at the end comes out on flush, as U+FFFD
    let mut stream = StreamDecoder::new(&tiny, false);
    assert_eq!(stream.push(c3), "");
    assert_eq!(stream.flush(), "\u{fffd}");
    assert_eq!(stream.flush(), "");
}
