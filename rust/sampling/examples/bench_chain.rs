//! Speed of sampling over a 151936-token vocabulary (qwen2's size), in µs per sample:
//!   1. llama.cpp's default chain (penalties last_n 64 repeat 1.1, top_k 40, typical 1.0,
//!      top_p 0.95, min_p 0.05, temp 0.8, dist) over random logits;
//!   2. the same chain behind a JSON-schema grammar, when the sampled token fits the
//!      grammar (the fast path: one token checked);
//!   3. the same when it does not (the whole vocabulary constrained, then sampled again).
//!
//! Run: `cargo run --release -p ferrollama-sampling --example bench_chain`
//! The vocabulary is synthetic (bytes, words, JSON punctuation, numbers): the crate reads
//! no tokenizer, and the grammar's cost depends on piece lengths and characters, which
//! this mix resembles.

use std::sync::Arc;
use std::time::Instant;

use ferrollama_sampling::*;

const N_VOCAB: usize = 151_936;
const EOS: u32 = N_VOCAB as u32 - 1;

fn default_chain(seed: u32) -> Vec<Box<dyn Sampler>> {
    vec![
        Box::new(Penalties::new(64, 1.1, 0.0, 0.0).unwrap()),
        Box::new(TopK::new(40)),
        Box::new(Typical::new(1.0, 1).unwrap()),
        Box::new(TopP::new(0.95, 1).unwrap()),
        Box::new(MinP::new(0.05, 1).unwrap()),
        Box::new(Temp::new(0.8).unwrap()),
        Box::new(Dist::new(seed)),
    ]
}

/// Roughly normal logits (sum of four uniforms), spread like a model's.
fn random_logits(rng: &mut Mt19937) -> Vec<f32> {
    (0..N_VOCAB)
        .map(|_| {
            let s: f32 = (0..4).map(|_| rng.uniform_f32()).sum();
            (s - 2.0) * 6.0
        })
        .collect()
}

fn synthetic_vocab(rng: &mut Mt19937) -> Arc<TokenPieces> {
    let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let punct: [&[u8]; 14] = [b"{\"", b"\":", b"\",", b", \"", b"\": \"", b"}", b"]", b"[\"", b"\"]", b"\"}", b": ", b",\n", b"  ", b"\n"];
    pieces.extend(punct.iter().map(|p| p.to_vec()));
    for n in 0..1000 {
        pieces.push(n.to_string().into_bytes());
    }
    let letters = b"etaoinshrdlcumwfgypbvkjxqz";
    while pieces.len() < N_VOCAB - 1 {
        let len = 1 + (rng.next_u32() % 9) as usize;
        let mut word = Vec::with_capacity(len + 1);
        if rng.next_u32() & 1 == 0 {
            word.push(b' ');
        }
        for _ in 0..len {
            // skewed toward frequent letters
            let r = rng.uniform_f32();
            word.push(letters[(r * r * letters.len() as f32) as usize]);
        }
        if rng.next_u32() % 5 < 1 {
            let first = usize::from(word[0] == b' ');
            word[first] = word[first].to_ascii_uppercase();
        }
        pieces.push(word);
    }
    pieces.push(b"<|endoftext|>".to_vec());
    Arc::new(TokenPieces { pieces, eog: vec![EOS] })
}

fn report(name: &str, times_us: &mut [f64]) {
    times_us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = times_us.iter().sum::<f64>() / times_us.len() as f64;
    let median = times_us[times_us.len() / 2];
    let p90 = times_us[times_us.len() * 9 / 10];
    println!("{name:<58} mean {mean:9.1} µs   median {median:9.1} µs   p90 {p90:9.1} µs   ({} samples)", times_us.len());
}

fn bench_default_chain(rng: &mut Mt19937) {
    let logit_sets: Vec<Vec<f32>> = (0..8).map(|_| random_logits(rng)).collect();
    let mut chain = Chain::new(default_chain(42));
    for _ in 0..64 {
        chain.accept(rng.next_u32() % N_VOCAB as u32);
    }
    let mut times = Vec::new();
    for i in 0..2000 {
        let logits = &logit_sets[i % logit_sets.len()];
        let t0 = Instant::now();
        let token = chain.sample(logits).unwrap();
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        chain.accept(token);
    }
    report("default chain, 151936 random logits", &mut times);
}

const SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
  "required": ["name", "age", "tags"]}"#;

fn grammar_chain(vocab: &Arc<TokenPieces>, seed: u32) -> Chain {
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let mut samplers: Vec<Box<dyn Sampler>> = vec![Box::new(Grammar::from_json_schema(Arc::clone(vocab), &schema).unwrap())];
    samplers.extend(default_chain(seed));
    Chain::new(samplers)
}

/// Generates one document under the grammar (every step constrained), to replay.
fn generate_document(vocab: &Arc<TokenPieces>, rng: &mut Mt19937) -> Vec<u32> {
    let mut chain = grammar_chain(vocab, 7);
    let mut tokens = Vec::new();
    for _ in 0..300 {
        let mut logits = random_logits(rng);
        // favour word pieces, and closing quotes often enough that strings end
        for (id, piece) in vocab.pieces.iter().enumerate() {
            if piece.contains(&b'"') {
                logits[id] += 17.0;
            } else if piece.len() > 2 && piece.iter().all(|b| b.is_ascii_alphabetic() || *b == b' ') {
                logits[id] += 8.0;
            }
        }
        logits[EOS as usize] += 40.0;
        let token = chain.sample(&logits).unwrap();
        chain.accept_checked(token).unwrap();
        tokens.push(token);
        if token == EOS {
            break;
        }
    }
    tokens
}

fn bench_grammar(vocab: &Arc<TokenPieces>, rng: &mut Mt19937) {
    let doc = generate_document(vocab, rng);
    let text: Vec<u8> = doc.iter().flat_map(|&t| vocab.piece(t).to_vec()).collect();
    println!("JSON document replayed ({} tokens): {}", doc.len(), String::from_utf8_lossy(&text).replace('\n', "\\n"));
    let logit_sets: Vec<Vec<f32>> = (0..8).map(|_| random_logits(rng)).collect();

    // fast path: the intended token has the top logit by far, so it is sampled and fits
    let mut fast = Vec::new();
    let mut slow = Vec::new();
    for round in 0..6 {
        let mut chain = grammar_chain(vocab, round);
        for (step, &want) in doc.iter().enumerate() {
            let mut logits = logit_sets[(step + round as usize) % logit_sets.len()].clone();
            logits[want as usize] = 60.0;
            let t0 = Instant::now();
            let token = chain.sample(&logits).unwrap();
            fast.push(t0.elapsed().as_secs_f64() * 1e6);
            assert_eq!(token, want);
            chain.accept_checked(token).unwrap();
        }
    }
    // slow path: the top token never fits (a lone '\u{1}' byte), forcing the full constraint
    for round in 0..2 {
        let mut chain = grammar_chain(vocab, round);
        for (step, &want) in doc.iter().enumerate() {
            let mut logits = logit_sets[step % logit_sets.len()].clone();
            logits[1] = 80.0;
            logits[want as usize] = 60.0;
            let t0 = Instant::now();
            let token = chain.sample(&logits).unwrap();
            slow.push(t0.elapsed().as_secs_f64() * 1e6);
            assert_eq!(token, want, "the constrained chain picks the best allowed token");
            chain.accept_checked(token).unwrap();
        }
    }
    report("JSON grammar + default chain, sampled token fits", &mut fast);
    report("JSON grammar + default chain, rejected: full vocabulary", &mut slow);
}

/// Single samplers (then dist) over gemma3's 262144-token vocabulary, where the sorting
/// strategy (heap select, bucket sort, adaptive top-p) matters.
fn bench_single_samplers(rng: &mut Mt19937) {
    let logits: Vec<f32> = (0..262_144)
        .map(|_| {
            let s: f32 = (0..4).map(|_| rng.uniform_f32()).sum();
            (s - 2.0) * 6.0
        })
        .collect();
    type MakeSampler = Box<dyn Fn() -> Box<dyn Sampler>>;
    let cases: Vec<(&str, MakeSampler)> = vec![
        ("top_k 40", Box::new(|| Box::new(TopK::new(40)))),
        ("top_k 1000 (bucket sort)", Box::new(|| Box::new(TopK::new(1000)))),
        ("top_p 0.95 (adaptive partial sort)", Box::new(|| Box::new(TopP::new(0.95, 1).unwrap()))),
        ("min_p 0.05 (unsorted filter)", Box::new(|| Box::new(MinP::new(0.05, 1).unwrap()))),
        ("typical 0.9 (full sort)", Box::new(|| Box::new(Typical::new(0.9, 1).unwrap()))),
        ("xtc 1.0 0.1 (full sort)", Box::new(|| Box::new(Xtc::new(1.0, 0.1, 1, 3).unwrap()))),
    ];
    for (name, make) in cases {
        let mut chain = Chain::new(vec![make(), Box::new(Dist::new(1))]);
        let mut times = Vec::new();
        for _ in 0..40 {
            let t0 = Instant::now();
            chain.sample(&logits).unwrap();
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        report(&format!("{name} + dist, 262144 logits"), &mut times);
    }
}

fn main() {
    let mut rng = Mt19937::new(12345);
    bench_default_chain(&mut rng);
    bench_single_samplers(&mut rng);
    let vocab = synthetic_vocab(&mut rng);
    bench_grammar(&vocab, &mut rng);
}
