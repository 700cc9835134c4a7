//! The grammar sampler over a vocabulary: which candidates it leaves, end-of-generation
//! handling, UTF-8 split across tokens, the chain's fast path, and constrained generation
//! from a JSON schema.

use std::sync::Arc;

use ferrollama_sampling::*;

/// A small vocabulary: single characters, a few multi-character pieces, a UTF-8
/// character split over two tokens, an empty piece and an end-of-generation token.
fn vocab() -> Arc<TokenPieces> {
    let mut pieces: Vec<Vec<u8>> = (0x20u8..0x7F).map(|b| vec![b]).collect(); // ids 0..95
    pieces.push(b"ab".to_vec()); // 95
    pieces.push(b"abc".to_vec()); // 96
    pieces.push(vec![0xE2, 0x82]); // 97: first two bytes of '€'
    pieces.push(vec![0xAC]); // 98: its last byte
    pieces.push(Vec::new()); // 99: empty
    pieces.push(b"</s>".to_vec()); // 100: end of generation
    pieces.push(b"<tool>".to_vec()); // 101: a special token that is not end of generation
    Arc::new(TokenPieces { pieces, eog: vec![100] })
}

const EOS: u32 = 100;

fn id_of(c: char) -> u32 {
    c as u32 - 0x20
}

fn allowed(g: &mut Grammar, n_vocab: usize) -> Vec<u32> {
    let mut c = Candidates::from_logits(&vec![0.0; n_vocab]);
    g.apply(&mut c);
    c.data.iter().filter(|t| t.logit != f32::NEG_INFINITY).map(|t| t.id).collect()
}

#[test]
fn candidates_are_constrained() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"ab\" [0-9]", "root").unwrap();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![id_of('a'), 95]);
    g.try_accept(95).unwrap();
    let digits: Vec<u32> = ('0'..='9').map(id_of).collect();
    assert_eq!(allowed(&mut g, v.n_vocab()), digits);
    assert!(g.try_accept(id_of('x')).is_err(), "x is not allowed");
    g.try_accept(id_of('7')).unwrap();
    // complete: only the end-of-generation token is left
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![EOS]);
    g.try_accept(EOS).unwrap();
}

#[test]
fn end_of_generation_only_where_the_grammar_can_end() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"a\"+", "root").unwrap();
    assert!(!allowed(&mut g, v.n_vocab()).contains(&EOS));
    assert!(g.try_accept(EOS).is_err());
    g.try_accept(id_of('a')).unwrap();
    let now = allowed(&mut g, v.n_vocab());
    assert!(now.contains(&EOS) && now.contains(&id_of('a')));
}

#[test]
fn utf8_split_over_tokens() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"€\" \"!\"", "root").unwrap();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![97]);
    g.try_accept(97).unwrap();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![98]);
    g.try_accept(98).unwrap();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![id_of('!')]);
}

#[test]
fn empty_pieces_are_never_allowed() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= [^x]*", "root").unwrap();
    let a = allowed(&mut g, v.n_vocab());
    assert!(!a.contains(&99));
    assert!(!a.contains(&id_of('x')));
    assert!(a.contains(&96));
}

#[test]
fn piece_tokens_resolve_through_the_vocabulary() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"a\" <tool>", "root").unwrap();
    g.try_accept(id_of('a')).unwrap();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![101]);
    g.try_accept(101).unwrap();
    assert!(g.matcher().is_complete());
    // as in llama.cpp, an end-of-generation token is allowed only where the grammar can
    // end, even where the grammar names it
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"a\" </s>", "root").unwrap();
    g.try_accept(id_of('a')).unwrap();
    assert!(allowed(&mut g, v.n_vocab()).is_empty());
    assert!(Grammar::new(Arc::clone(&v), "root ::= <nope>", "root").is_err());
}

#[test]
fn chain_fast_path_checks_only_the_chosen_token() {
    let v = vocab();
    let n = v.n_vocab();
    let grammar = Grammar::new(Arc::clone(&v), "root ::= [a-z]+", "root").unwrap();
    let mut chain = Chain::new(vec![Box::new(grammar), Box::new(Greedy::new())]);
    // the best token ('q') is allowed: the candidates were never constrained
    let mut logits = vec![0.0f32; n];
    logits[id_of('q') as usize] = 5.0;
    assert_eq!(chain.sample(&logits).unwrap(), id_of('q'));
    assert!(chain.last_candidates().data.iter().all(|t| t.logit.is_finite()));
    chain.accept(id_of('q'));
    // the best token ('Q') is rejected: full constraint, the best allowed one wins
    logits[id_of('Q') as usize] = 9.0;
    logits[id_of('z') as usize] = 3.0;
    assert_eq!(chain.sample(&logits).unwrap(), id_of('q'));
    let constrained = &chain.last_candidates().data;
    assert_eq!(constrained[id_of('Q') as usize].logit, f32::NEG_INFINITY);
    // apply() runs the grammar in place like llama_sampler_apply
    let mut c = Candidates::from_logits(&logits);
    chain.apply(&mut c);
    assert_eq!(c.selected_token(), Some(id_of('q')));
}

#[test]
fn accept_checked_refuses_what_the_grammar_rejects() {
    let v = vocab();
    let mut chain = Chain::new(vec![
        Box::new(Penalties::new(8, 1.5, 0.0, 0.0).unwrap()),
        Box::new(Grammar::new(Arc::clone(&v), "root ::= \"ab\"", "root").unwrap()),
        Box::new(Greedy::new()),
    ]);
    assert!(matches!(chain.accept_checked(id_of('b')), Err(SamplingError::GrammarRejected { .. })));
    chain.accept_checked(id_of('a')).unwrap();
    chain.accept_checked(id_of('b')).unwrap();
    chain.accept_checked(EOS).unwrap();
}

#[test]
fn grammar_reset_and_clone() {
    let v = vocab();
    let mut g = Grammar::new(Arc::clone(&v), "root ::= \"ab\"", "root").unwrap();
    g.try_accept(id_of('a')).unwrap();
    let mut copy = g.clone_box();
    g.reset();
    assert_eq!(allowed(&mut g, v.n_vocab()), vec![id_of('a'), 95]);
    let mut c = Candidates::from_logits(&vec![0.0; v.n_vocab()]);
    copy.apply(&mut c);
    let left: Vec<u32> = c.data.iter().filter(|t| t.logit.is_finite()).map(|t| t.id).collect();
    assert_eq!(left, vec![id_of('b')]);
}

/// Generates with random logits under a JSON-schema grammar until end of generation;
/// the text must be valid JSON within the schema.
#[test]
fn json_schema_constrained_generation() {
    let v = vocab();
    let schema: serde_json::Value = serde_json::from_str(
        r#"{"type": "object", "properties": {
              "a": {"type": "integer", "minimum": 0, "maximum": 99},
              "b": {"enum": ["x", "y"]},
              "c": {"type": "boolean"}},
            "required": ["a", "b", "c"]}"#,
    )
    .unwrap();
    for seed in 0..20u32 {
        let grammar = Grammar::from_json_schema(Arc::clone(&v), &schema).unwrap();
        let mut chain = Chain::new(vec![
            Box::new(grammar),
            Box::new(LogitBias::new(v.n_vocab(), vec![(EOS, 50.0)]).unwrap()),
            Box::new(Dist::new(seed)),
        ]);
        let mut rng = Mt19937::new(seed + 1000);
        let mut text = Vec::new();
        for _ in 0..400 {
            let logits: Vec<f32> = (0..v.n_vocab()).map(|_| rng.uniform_f32() * 4.0).collect();
            let token = chain.sample(&logits).unwrap();
            chain.accept_checked(token).unwrap();
            if token == EOS {
                break;
            }
            text.extend_from_slice(v.piece(token));
        }
        let parsed: serde_json::Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&text)));
        let a = parsed["a"].as_i64().unwrap();
        assert!((0..=99).contains(&a));
        assert!(parsed["b"] == "x" || parsed["b"] == "y");
        assert!(parsed["c"].is_boolean());
    }
}
