//! Ported from llama.cpp's tests/test-sampling.cpp: each sampler on small distributions
//! with the probabilities it must leave, DRY and penalties with token histories, and the
//! sampler-queue checks over a 10000-token vocabulary.

use ferrollama_sampling::*;

/// Candidates with logit = ln(p) and p as given, unsorted (llama.cpp's sampler_tester).
fn tester(probs: &[f32]) -> Candidates {
    Candidates {
        data: probs.iter().enumerate().map(|(i, &p)| TokenData { id: i as u32, logit: p.ln(), p }).collect(),
        selected: None,
        sorted: false,
    }
}

fn check(c: &Candidates, expected: &[f32], what: &str) {
    let got: Vec<f32> = c.data.iter().map(|t| t.p).collect();
    assert_eq!(got.len(), expected.len(), "{what}: {got:?} vs {expected:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-5, "{what}: {got:?} vs {expected:?}");
    }
}

/// Applies the sampler, then dist(0) (which leaves normalized p), and checks p.
fn with_dist(probs: &[f32], expected: &[f32], mut s: Box<dyn Sampler>, what: &str) {
    let mut c = tester(probs);
    s.apply(&mut c);
    Dist::new(0).apply(&mut c);
    check(&c, expected, what);
}

const P4: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

#[test]
fn temp() {
    with_dist(&P4, &P4, Box::new(Temp::new(1.0).unwrap()), "temp 1");
    with_dist(&P4, &[0.0, 0.0, 0.0, 1.0], Box::new(Temp::new(0.0).unwrap()), "temp 0");
    with_dist(&P4, &P4, Box::new(TempExt::new(1.0, 0.0, 1.0).unwrap()), "temp_ext 1");
    with_dist(&P4, &[0.0, 0.0, 0.0, 1.0], Box::new(TempExt::new(0.0, 0.0, 1.0).unwrap()), "temp_ext 0");
}

#[test]
fn top_k() {
    with_dist(&P4, &[1.0], Box::new(TopK::new(1)), "k 1");
    with_dist(&P4, &[0.44444, 0.33333, 0.22222], Box::new(TopK::new(3)), "k 3");
    with_dist(&P4, &[0.4, 0.3, 0.2, 0.1], Box::new(TopK::new(4)), "k 4");
    with_dist(&P4, &P4, Box::new(TopK::new(0)), "k 0");
}

#[test]
fn top_p() {
    with_dist(&P4, &[1.0], Box::new(TopP::new(0.0, 0).unwrap()), "p 0");
    with_dist(&P4, &[0.571429, 0.428571], Box::new(TopP::new(0.7, 0).unwrap()), "p 0.7");
    with_dist(&P4, &[0.44444, 0.33333, 0.22222], Box::new(TopP::new(0.8, 0).unwrap()), "p 0.8");
    with_dist(&P4, &P4, Box::new(TopP::new(1.0, 0).unwrap()), "p 1");
}

#[test]
fn min_p() {
    let cases: &[(f32, &[f32])] = &[
        (0.00, &[0.1, 0.2, 0.3, 0.4]),
        (0.24, &[0.1, 0.2, 0.3, 0.4]),
        (0.26, &[0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.49, &[0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.51, &[0.3 / 0.7, 0.4 / 0.7]),
        (0.74, &[0.3 / 0.7, 0.4 / 0.7]),
        (0.76, &[1.0]),
        (1.00, &[1.0]),
        (1.05, &[1.0]),
    ];
    for &(p, expected) in cases {
        with_dist(&P4, expected, Box::new(MinP::new(p, 0).unwrap()), &format!("min_p {p}"));
    }
}

#[test]
fn xtc() {
    let probs = [0.4f32, 0.3, 0.2, 0.1];
    let cases: &[(f32, &[f32])] = &[(0.09, &[0.1]), (0.19, &[0.2, 0.1]), (0.29, &[0.3, 0.2, 0.1]), (0.39, &[0.4, 0.3, 0.2, 0.1])];
    for &(t, expected) in cases {
        let mut c = tester(&probs);
        Xtc::new(0.99, t, 0, 0).unwrap().apply(&mut c);
        check(&c, expected, &format!("xtc threshold {t}"));
    }
}

#[test]
fn typical() {
    let mut c = tester(&[0.97, 0.01, 0.01, 0.01]);
    Typical::new(0.5, 0).unwrap().apply(&mut c);
    check(&c, &[0.97], "typical 0.97");
    let mut c = tester(&[0.4, 0.2, 0.2, 0.2]);
    Typical::new(0.5, 0).unwrap().apply(&mut c);
    check(&c, &[0.2, 0.2, 0.2], "typical 0.4");
}

fn penalties(history: &[u32], expected: &[f32], repeat: f32, freq: f32, present: f32) {
    let mut s = Penalties::new(history.len() as i32, repeat, freq, present).unwrap();
    for &t in history {
        s.accept(t);
    }
    with_dist(&[0.2; 5], expected, Box::new(s), &format!("penalties {history:?} {repeat} {freq} {present}"));
}

#[test]
fn repetition_penalties() {
    penalties(&[0], &[0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0);
    penalties(&[0, 1, 2], &[0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0);
    penalties(&[0, 1, 2, 0, 0], &[0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0);
    penalties(&[0], &[0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0);
    penalties(&[0, 1, 2], &[0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0);
    penalties(&[0, 1, 2, 0, 0], &[0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0);
}

#[allow(clippy::too_many_arguments)]
fn dry(probs: &[f32], history: &[u32], expected: &[f32], mult: f32, base: f32, allowed: i32, last_n: i32, breakers: Vec<Vec<u32>>) {
    let mut s = Dry::with_token_breakers(1024, mult, base, allowed, last_n, breakers).unwrap();
    for &t in history {
        s.accept(t);
    }
    with_dist(probs, expected, Box::new(s), &format!("dry {history:?}"));
}

#[test]
fn dry_penalties() {
    dry(&[0.25; 4], &[0, 1], &[0.25; 4], 1.0, 1.1, 2, 4, vec![]);
    dry(&[0.25; 4], &[0, 1, 2, 0, 1], &[0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, vec![]);
    dry(&[0.2; 5], &[0, 1, 3, 4, 0, 1], &[0.2; 5], 1.0, 1.1, 2, 6, vec![vec![3]]);
    dry(&[0.2; 5], &[0, 1, 2, 0, 1], &[0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, vec![]);
    dry(&[0.2; 5], &[0, 1, 2, 3, 4, 0, 1], &[0.2; 5], 1.0, 1.1, 4, 7, vec![]);
}

#[test]
fn dry_string_breakers_work_from_pieces() {
    // pieces: 0 "a", 1 "b", 2 "x\n", 3 "c"; "\n" breaks inside token 2
    let pieces = TokenPieces { pieces: vec![b"a".to_vec(), b"b".to_vec(), b"x\n".to_vec(), b"c".to_vec()], eog: vec![] };
    let no_tokens = |_: &[u8]| Vec::new();
    let mut s = Dry::new(&pieces, &no_tokens, 1024, 1.0, 1.1, 2, 6, &["\n"]).unwrap();
    // a b c a b → "c" would extend the repeat "a b"
    for t in [0, 1, 3, 0, 1] {
        s.accept(t);
    }
    let mut c = tester(&[0.25; 4]);
    s.apply(&mut c);
    assert!(c.data[3].logit < c.data[0].logit, "c is penalized");
    // a history ending with the breaker cuts every repeat: nothing is penalized
    let mut s = Dry::new(&pieces, &no_tokens, 1024, 1.0, 1.1, 2, 6, &["\n"]).unwrap();
    for t in [0, 1, 3, 0, 1, 2] {
        s.accept(t);
    }
    let mut c = tester(&[0.25; 4]);
    s.apply(&mut c);
    assert!(c.data.iter().all(|t| (t.logit - 0.25f32.ln()).abs() < 1e-6));
    // a breaker token that would extend a repeat is never penalized itself
    let mut s = Dry::new(&pieces, &no_tokens, 1024, 1.0, 1.1, 2, 6, &["\n"]).unwrap();
    for t in [0, 1, 2, 3, 0, 1] {
        s.accept(t);
    }
    let mut c = tester(&[0.25; 4]);
    s.apply(&mut c);
    assert!((c.data[2].logit - 0.25f32.ln()).abs() < 1e-6);
}

#[test]
fn top_n_sigma() {
    with_dist(&P4, &[0.0, 0.0, 0.428571, 0.571429], Box::new(TopNSigma::new(1.0).unwrap()), "n 1");
    with_dist(&P4, &P4, Box::new(TopNSigma::new(0.0).unwrap()), "n 0");
    with_dist(&P4, &P4, Box::new(TopNSigma::new(3.0).unwrap()), "n 3");
}

/// llama.cpp's test_sampler_queue: logits ln(id) over n_vocab tokens, samplers in the
/// given order (each followed by dist), checking the count and the first and last ids.
fn sampler_queue(n_vocab: i32, sequence: &str, top_k: i32, top_p: f32, min_p: f32) {
    let mut c = Candidates {
        data: (0..n_vocab).map(|i| TokenData { id: i as u32, logit: (i as f32).ln(), p: 0.0 }).collect(),
        selected: None,
        sorted: false,
    };
    let mut min_token_id: i32 = 0;
    let max_token_id = n_vocab - 1;
    let what = format!("queue {sequence} k {top_k} p {top_p} m {min_p}");
    for s in sequence.chars() {
        let mut sampler: Box<dyn Sampler> = match s {
            'k' => Box::new(TopK::new(top_k)),
            'p' => Box::new(TopP::new(top_p, 1).unwrap()),
            'm' => Box::new(MinP::new(min_p, 1).unwrap()),
            _ => unreachable!("test sequences use k, p, m"),
        };
        sampler.apply(&mut c);
        Dist::new(0).apply(&mut c);
        let size = c.data.len() as i32;
        let id = |i: i32| c.data[i as usize].id as i32;
        match s {
            'k' => {
                let expected_size = size.min(top_k);
                min_token_id = min_token_id.max(n_vocab - top_k);
                assert_eq!(size, expected_size, "{what}");
                assert_eq!(id(0), max_token_id, "{what}");
                assert_eq!(id(expected_size - 1), min_token_id, "{what}");
            }
            'p' => {
                let divisor = n_vocab * (n_vocab - 1) / 2 - min_token_id * (min_token_id - 1) / 2;
                let target = (top_p * divisor as f32).ceil() as i32;
                min_token_id = n_vocab;
                let mut expected_size = 0;
                let mut cumsum = 0;
                loop {
                    min_token_id -= 1;
                    expected_size += 1;
                    cumsum += min_token_id;
                    if cumsum >= target {
                        break;
                    }
                }
                if min_token_id == 1 {
                    min_token_id -= 1;
                    expected_size += 1;
                }
                assert_eq!(size, expected_size, "{what}");
                assert!(!c.sorted || id(0) == max_token_id, "{what}");
                assert!(!c.sorted || id(expected_size - 1) == min_token_id, "{what}");
            }
            _ => {
                let mut expected_size = ((1.0f32 - min_p) * n_vocab as f32).ceil() as i32;
                expected_size = expected_size.max(1).min(size);
                min_token_id = (min_p * n_vocab as f32).floor() as i32;
                min_token_id = min_token_id.max(1).max(n_vocab - size).min(n_vocab - 1);
                assert_eq!(size, expected_size, "{what}");
                assert!(!c.sorted || id(0) == max_token_id, "{what}");
                assert!(!c.sorted || id(expected_size - 1) == min_token_id, "{what}");
            }
        }
    }
}

#[test]
fn sampler_queues() {
    sampler_queue(10000, "k", 10000, 1.0, 1.0);
    sampler_queue(10000, "k", 1, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 0.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1e-12);

    sampler_queue(10000, "k", 100, 1.0000, 1.0);
    sampler_queue(10000, "p", 10000, 0.0003, 1.0);
    sampler_queue(10000, "p", 10000, 0.8000, 1.0);
    sampler_queue(10000, "m", 10000, 1.0000, 9997.9 / 9999.0);
    sampler_queue(10000, "m", 10000, 1.0000, 0.1);

    for seq in ["kp", "km", "pk", "pm", "mk", "mp", "kpm", "kmp", "pkm", "pmk", "mkp", "mpk"] {
        sampler_queue(10000, seq, 100, 0.8, 0.1);
    }
    sampler_queue(10000, "mp", 100, 0.8, 9997.9 / 9999.0);
}

#[test]
fn mirostat_v1_adapts_mu_and_selects() {
    let logits: Vec<f32> = (0..1000).map(|i| -(i as f32) * 0.01).collect();
    let mut m = MirostatV1::new(1000, 42, 5.0, 0.1, 100).unwrap();
    let mu0 = m.mu();
    let mut c = Candidates::from_logits(&logits);
    m.apply(&mut c);
    assert!(c.selected.is_some());
    assert!(c.sorted && c.data.len() < 1000);
    assert_ne!(m.mu(), mu0);
    // the same seed replays the same choice
    let mut again = MirostatV1::new(1000, 42, 5.0, 0.1, 100).unwrap();
    let mut c2 = Candidates::from_logits(&logits);
    again.apply(&mut c2);
    assert_eq!(c.selected_token(), c2.selected_token());
    m.reset();
    assert_eq!(m.mu(), mu0);
}

#[test]
fn invalid_parameters_are_errors() {
    assert!(TopP::new(f32::NAN, 1).is_err());
    assert!(Temp::new(f32::NAN).is_err());
    assert!(MirostatV1::new(0, 1, 5.0, 0.1, 100).is_err());
    assert!(MirostatV1::new(10, 1, 5.0, 0.1, 0).is_err());
    assert!(Dry::with_token_breakers(1024, 1.0, 1.1, 2, -2, vec![]).is_err());
    assert!(LogitBias::new(8, vec![(8, 1.0)]).is_err());
}

#[test]
fn default_seed_draws_a_random_seed_and_reset_replays_a_fixed_one() {
    let a = Dist::new(DEFAULT_SEED);
    let b = Dist::new(DEFAULT_SEED);
    assert_ne!(a.seed_in_use(), DEFAULT_SEED);
    assert_ne!(a.seed_in_use(), b.seed_in_use(), "two random seeds");
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
    let mut d = Dist::new(7);
    let mut first = Vec::new();
    for _ in 0..5 {
        let mut c = Candidates::from_logits(&logits);
        d.apply(&mut c);
        first.push(c.selected_token());
    }
    d.reset();
    for want in first {
        let mut c = Candidates::from_logits(&logits);
        d.apply(&mut c);
        assert_eq!(c.selected_token(), want);
    }
}

#[test]
fn infill_prefers_end_of_generation_when_text_is_unlikely() {
    let pieces = std::sync::Arc::new(TokenPieces {
        pieces: vec![b"foo".to_vec(), b"foobar".to_vec(), b"baz".to_vec(), b"<eot>".to_vec()],
        eog: vec![3],
    });
    // text dominates: "foo" is a prefix of "foobar" and merges into the likelier one
    let mut s = Infill::new(std::sync::Arc::clone(&pieces), 3);
    let mut c = Candidates::from_logits(&[2.0, 3.0, -5.0, -9.0]);
    s.apply(&mut c);
    let ids: Vec<u32> = c.data.iter().map(|t| t.id).collect();
    assert!(ids.contains(&1) && !ids.contains(&0), "{ids:?}");
    let total: f32 = c.data.iter().map(|t| t.p).sum();
    assert!((total - 1.0).abs() < 1e-5);
    // end of generation dominates: only EOG candidates stay
    let mut c = Candidates::from_logits(&[-3.0, -3.0, -3.0, 4.0]);
    s.apply(&mut c);
    assert_eq!(c.data.iter().map(|t| t.id).collect::<Vec<_>>(), vec![3]);
}

#[test]
fn chains_nest_and_clone_with_state() {
    let inner = Chain::new(vec![Box::new(TopK::new(3)), Box::new(Temp::new(0.5).unwrap())]);
    let mut outer = Chain::new(vec![Box::new(inner), Box::new(Dist::new(11))]);
    let logits: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut copy = outer.clone();
    for _ in 0..5 {
        let a = outer.sample_and_accept(&logits).unwrap();
        let b = copy.sample_and_accept(&logits).unwrap();
        assert_eq!(a, b);
    }
    assert_eq!(outer.last_candidates().len(), 3);
    assert_eq!(outer.names(), vec!["chain", "dist"]);
}
