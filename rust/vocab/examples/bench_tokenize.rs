//! Tokenization speed: a ~1 MB text (tests/data/texts, prose, chat, code and mixed-script
//! text, plus the multilingual inputs of llama.cpp's vocabulary suite, repeated) tokenized
//! with a vocabulary, and the vocabulary's load time.
//!
//! cargo run --release -p ferrollama-vocab --example bench_tokenize [-- VOCAB.gguf [MB]]
//! Default vocabulary: the Qwen2 one of llama.cpp's suite (tests/data/vocab/ggml-vocab-qwen2.gguf).

use std::time::Instant;

use ferrollama_gguf::GgufFile;
use ferrollama_vocab::Vocab;

fn corpus(megabytes: usize) -> Vec<u8> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/texts");
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(root).expect("texts").map(|e| e.expect("entry").path()).collect();
    names.sort();
    for p in names {
        parts.push(std::fs::read(p).expect("text"));
    }
    let suite = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/vocab/ggml-vocab-qwen2.gguf.inp");
    parts.push(std::fs::read(suite).expect("suite inputs"));
    let mut text = Vec::new();
    while text.len() < megabytes << 20 {
        for p in &parts {
            text.extend_from_slice(p);
            text.push(b'\n');
        }
    }
    text
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/vocab/ggml-vocab-qwen2.gguf").to_string());
    let megabytes: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);

    let t0 = Instant::now();
    let file = GgufFile::open(&path, true).expect("open gguf");
    let t1 = Instant::now();
    let vocab = Vocab::from_gguf(&file).expect("load vocab");
    let t2 = Instant::now();
    println!("vocab {} ({} tokens, model {}, pre {})", path, vocab.n_tokens(), vocab.model_kind(), vocab.pre());
    println!("load: gguf parse {:.1} ms, vocab build {:.1} ms", (t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3);

    let text = corpus(megabytes);
    let mut best = f64::MAX;
    let mut n_tokens = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let tokens = vocab.tokenize(&text, false, false).expect("tokenize");
        best = best.min(t.elapsed().as_secs_f64());
        n_tokens = tokens.len();
    }
    println!(
        "tokenize {:.2} MB -> {} tokens: best of 5 {:.1} ms = {:.2} M tokens/s, {:.1} MB/s",
        text.len() as f64 / 1048576.0,
        n_tokens,
        best * 1e3,
        n_tokens as f64 / best / 1e6,
        text.len() as f64 / best / 1048576.0
    );
    let t = Instant::now();
    let special = vocab.tokenize(&text, true, true).expect("tokenize");
    println!("tokenize with special-token parsing: {:.1} ms ({} tokens)", t.elapsed().as_secs_f64() * 1e3, special.len());
    let tokens = vocab.tokenize(&text, false, false).expect("tokenize");
    let t = Instant::now();
    let back = vocab.detokenize(&tokens, false, false);
    println!("detokenize: {:.1} ms ({} bytes)", t.elapsed().as_secs_f64() * 1e3, back.len());
}
