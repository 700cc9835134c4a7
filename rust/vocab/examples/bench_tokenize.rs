//! Tokenization speed on ~1 MB of text, and the vocabulary's load time.
//!
//! The text: tests/data/texts (prose, chat, code, mixed scripts), the multilingual inputs of
//! llama.cpp's vocabulary suite, then the project's own Rust and Python sources (code and
//! English comments; the generated Unicode tables left out), cut at the requested size and
//! repeated only if the sources are too short. Pre-tokens repeat as in real text, and the
//! tokenizer merges each distinct pre-token once per call, so this is not a repeated-text
//! best case.
//!
//! cargo run --release -p ferrollama-vocab --example bench_tokenize [-- VOCAB.gguf [MB]]
//! Default vocabulary: the Qwen2 one of llama.cpp's suite (tests/data/vocab/ggml-vocab-qwen2.gguf).

use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrollama_gguf::GgufFile;
use ferrollama_vocab::Vocab;

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !path.ends_with("target") && !path.ends_with(".venv") {
                files_under(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs" || e == "py") && !path.ends_with("tables.rs") {
            out.push(path);
        }
    }
}

fn corpus(megabytes: usize) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut texts: Vec<PathBuf> = std::fs::read_dir(root.join("tests/data/texts")).expect("texts").flatten().map(|e| e.path()).collect();
    texts.sort();
    paths.extend(texts);
    paths.push(root.join("tests/data/vocab/ggml-vocab-qwen2.gguf.inp"));
    let mut sources = Vec::new();
    files_under(&root.join("rust"), &mut sources);
    files_under(&root.join("python"), &mut sources);
    sources.sort();
    paths.extend(sources);
    let mut text = Vec::new();
    while text.len() < megabytes << 20 {
        for p in &paths {
            text.extend_from_slice(&std::fs::read(p).expect("read corpus file"));
            text.push(b'\n');
            if text.len() >= megabytes << 20 {
                break;
            }
        }
    }
    text.truncate(megabytes << 20);
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
