//! llama.cpp's recorded sampler behaviour (tests/data/samplers.json, see REFERENCE.md):
//! every case, every round — candidate ids in order, logits, p where the chain ends with
//! dist, the selected index and token.

use ferrollama_sampling::*;
use serde_json::Value;

const SAMPLERS_JSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/samplers.json");

/// The records hold -Infinity (not JSON); make them strings serde_json can read.
fn load_cases() -> Vec<Value> {
    let text = std::fs::read_to_string(SAMPLERS_JSON).expect("tests/data/samplers.json");
    let text = text.replace("-Infinity", "\"-inf\"").replace("Infinity", "\"inf\"").replace("NaN", "\"nan\"");
    let v: Value = serde_json::from_str(&text).expect("valid JSON after replacing infinities");
    v.as_array().expect("an array of cases").clone()
}

fn num(v: &Value) -> f64 {
    match v {
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(_) => f64::NAN,
        _ => v.as_f64().expect("a number"),
    }
}

fn f(spec: &Value, key: &str) -> f32 {
    num(&spec[key]) as f32
}

fn i(spec: &Value, key: &str) -> i64 {
    spec[key].as_i64().unwrap_or_else(|| panic!("integer {key} in {spec}"))
}

fn build(spec: &Value) -> Box<dyn Sampler> {
    let seed = |s: &Value| i(s, "seed") as u32;
    let min_keep = |s: &Value| i(s, "min_keep") as usize;
    match spec["type"].as_str().unwrap() {
        "greedy" => Box::new(Greedy::new()),
        "dist" => Box::new(Dist::new(seed(spec))),
        "top_k" => Box::new(TopK::new(i(spec, "k") as i32)),
        "top_p" => Box::new(TopP::new(f(spec, "p"), min_keep(spec)).unwrap()),
        "min_p" => Box::new(MinP::new(f(spec, "p"), min_keep(spec)).unwrap()),
        "typical" => Box::new(Typical::new(f(spec, "p"), min_keep(spec)).unwrap()),
        "temp" => Box::new(Temp::new(f(spec, "t")).unwrap()),
        "temp_ext" => Box::new(TempExt::new(f(spec, "t"), f(spec, "delta"), f(spec, "exponent")).unwrap()),
        "xtc" => Box::new(Xtc::new(f(spec, "p"), f(spec, "threshold"), min_keep(spec), seed(spec)).unwrap()),
        "top_n_sigma" => Box::new(TopNSigma::new(f(spec, "n")).unwrap()),
        "penalties" => Box::new(
            Penalties::new(i(spec, "last_n") as i32, f(spec, "repeat"), f(spec, "freq"), f(spec, "present")).unwrap(),
        ),
        "mirostat_v2" => Box::new(MirostatV2::new(seed(spec), f(spec, "tau"), f(spec, "eta")).unwrap()),
        "logit_bias" => {
            let biases = spec["bias"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| (b[0].as_u64().unwrap() as u32, num(&b[1]) as f32))
                .collect();
            Box::new(LogitBias::new(i(spec, "n_vocab") as usize, biases).unwrap())
        }
        other => panic!("sampler type {other} is in the records but not built here"),
    }
}

fn close(got: f32, want: f64) -> bool {
    if want.is_infinite() {
        return got as f64 == want;
    }
    let tol = 1e-4 * want.abs().max(1.0);
    (got as f64 - want).abs() <= tol
}

/// Compares one round; returns a description of the first difference.
fn check_round(c: &Candidates, expected: &Value, check_p: bool, n_logits: usize) -> Result<(), String> {
    let want = expected["candidates"].as_array().unwrap();
    let n_expected = expected.get("n_candidates").and_then(Value::as_u64).map_or(want.len(), |n| n as usize);
    if c.data.len() != n_expected {
        return Err(format!("{} candidates, expected {n_expected}", c.data.len()));
    }
    if n_logits >= 1000 && want.len() != n_expected.min(64) {
        return Err(format!("record holds {} candidates", want.len()));
    }
    for (k, w) in want.iter().enumerate() {
        let (id, logit, p) = (w[0].as_u64().unwrap() as u32, num(&w[1]), num(&w[2]));
        let t = c.data[k];
        if t.id != id {
            return Err(format!("candidate {k}: id {} expected {id}", t.id));
        }
        if !close(t.logit, logit) {
            return Err(format!("candidate {k} (id {id}): logit {} expected {logit}", t.logit));
        }
        if check_p && !close(t.p, p) {
            return Err(format!("candidate {k} (id {id}): p {} expected {p}", t.p));
        }
    }
    let selected = expected["selected"].as_i64().unwrap();
    let got_selected = c.selected.map_or(-1, |s| s as i64);
    if got_selected != selected {
        return Err(format!("selected {got_selected} expected {selected}"));
    }
    let token = expected["token"].as_i64().unwrap();
    let got_token = c.selected_token().map_or(-1, |t| t as i64);
    if got_token != token {
        return Err(format!("token {got_token} expected {token}"));
    }
    Ok(())
}

#[test]
fn every_recorded_case_matches() {
    let cases = load_cases();
    assert_eq!(cases.len(), 60, "the records hold 60 cases");
    let mut failures = Vec::new();
    let mut rounds_checked = 0;
    for (n, case) in cases.iter().enumerate() {
        let logits: Vec<f32> = case["logits"].as_array().unwrap().iter().map(|v| num(v) as f32).collect();
        let specs = case["chain"].as_array().unwrap();
        let ends_with_dist = specs.last().is_some_and(|s| s["type"] == "dist");
        let mut chain = Chain::new(specs.iter().map(build).collect());
        for t in case["accept"].as_array().unwrap() {
            chain.accept(t.as_u64().unwrap() as u32);
        }
        let rounds = case["rounds"].as_u64().unwrap() as usize;
        let expected = case["expected"].as_array().unwrap();
        assert_eq!(expected.len(), rounds, "case {n}");
        for (r, want) in expected.iter().enumerate() {
            let mut c = Candidates::from_logits(&logits);
            chain.apply(&mut c);
            rounds_checked += 1;
            if let Err(e) = check_round(&c, want, ends_with_dist, logits.len()) {
                let names: Vec<&str> = specs.iter().map(|s| s["type"].as_str().unwrap()).collect();
                failures.push(format!("case {n} {names:?} round {r}: {e}"));
                break;
            }
            if let Some(token) = c.selected_token() {
                chain.accept(token);
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    assert!(rounds_checked >= 60);
}

/// `Chain::sample` picks the token the records picked (same seed, same draw).
#[test]
fn chain_sample_agrees_with_apply() {
    for case in load_cases().iter().filter(|c| c["chain"].as_array().unwrap().last().unwrap()["type"] == "dist") {
        let logits: Vec<f32> = case["logits"].as_array().unwrap().iter().map(|v| num(v) as f32).collect();
        let specs = case["chain"].as_array().unwrap();
        let mut chain = Chain::new(specs.iter().map(build).collect());
        for t in case["accept"].as_array().unwrap() {
            chain.accept(t.as_u64().unwrap() as u32);
        }
        for want in case["expected"].as_array().unwrap() {
            let token = chain.sample_and_accept(&logits).unwrap();
            assert_eq!(token as i64, want["token"].as_i64().unwrap());
        }
    }
}
