//! Replays the cache operations of llama.cpp's recorded scenarios on the cells alone and
//! checks every recorded `seq_rm` result and `check_pos` (seq_pos_min / seq_pos_max) exactly.
//!
//! Decode steps are placed as llama.cpp does for a unified cache: pending shifts are taken
//! first, the batch is split in order into micro-batches of `n_ubatch` tokens, all of them are
//! prepared (all or none) and then applied. Gemma 3 runs on a pair of caches (full + sliding
//! window of 512) as `llama_kv_cache_iswa` does; its positions are read from the sliding one.

use ferrollama_kv::{padded_ctx_size, swa_cache_size, KvCells, Pos, SeqId, SwaParams, UBatchView};
use serde_json::Value;

const SCENARIOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/scenarios/");

/// Sliding window of gemma-3-270m (tokens).
const GEMMA3_N_SWA: u32 = 512;

struct Replay {
    /// The caches of the context; with two, the last is the sliding one.
    caches: Vec<KvCells>,
    n_ubatch: usize,
}

/// A recorded (or replayed) observation: the `returns` of a seq_rm or a check_pos.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
enum Record {
    Returns {
        step: u64,
        value: bool,
    },
    Pos {
        step: u64,
        seq_id: i64,
        min: i64,
        max: i64,
    },
}

fn load(name: &str) -> Value {
    let path = format!("{SCENARIOS}{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn int(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("missing integer {key} in {v}"))
}

fn i32s(v: &Value) -> Vec<i32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("int") as i32)
        .collect()
}

impl Replay {
    /// The context of a scenario; `pad` false keeps n_ctx cells instead of llama.cpp's 256-padding.
    fn new(scenario: &Value, pad: bool) -> Replay {
        let ctx = &scenario["context"];
        let n_ctx = int(ctx, "n_ctx") as u32;
        let n_ubatch = int(ctx, "n_ubatch") as u32;
        let n_seq_max = ctx["n_seq_max"].as_i64().unwrap_or(1) as u32;
        let size = if pad { padded_ctx_size(n_ctx) } else { n_ctx };
        let mut caches = vec![KvCells::new(size, n_seq_max).unwrap()];
        if scenario["model"]
            .as_str()
            .unwrap_or("")
            .starts_with("gemma-3")
        {
            let swa_size = swa_cache_size(size, GEMMA3_N_SWA, n_seq_max, true, n_ubatch, false);
            let swa = SwaParams::standard(GEMMA3_N_SWA);
            caches.push(KvCells::with_swa(swa_size, n_seq_max, swa).unwrap());
        }
        Replay {
            caches,
            n_ubatch: n_ubatch as usize,
        }
    }

    fn run(&mut self, scenario: &Value) -> Vec<Record> {
        let mut records = Vec::new();
        for (i, step) in scenario["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            let i = i as u64;
            if let Some(value) = self.step(step) {
                records.push(Record::Returns { step: i, value });
            }
            if let Some(seqs) = step.get("check_pos") {
                for s in i32s(seqs) {
                    let last = self.caches.last().expect("a cache");
                    let min = i64::from(last.seq_pos_min(s).unwrap());
                    let max = i64::from(last.seq_pos_max(s).unwrap());
                    records.push(Record::Pos {
                        step: i,
                        seq_id: i64::from(s),
                        min,
                        max,
                    });
                }
            }
        }
        records
    }

    /// Runs one step; returns the result of a seq_rm.
    fn step(&mut self, step: &Value) -> Option<bool> {
        let op = step["op"].as_str().expect("op");
        let p = |k: &str| int(step, k) as Pos;
        let s = |k: &str| int(step, k) as SeqId;
        for kv in &mut self.caches {
            match op {
                "decode" => {}
                "seq_rm" => {}
                "seq_cp" => kv.seq_cp(s("src"), s("dst"), p("p0"), p("p1")).unwrap(),
                "seq_keep" => kv.seq_keep(s("seq_id")).unwrap(),
                "seq_add" => kv
                    .seq_add(s("seq_id"), p("p0"), p("p1"), p("delta"))
                    .unwrap(),
                "seq_div" => kv
                    .seq_div(s("seq_id"), p("p0"), p("p1"), int(step, "d") as i32)
                    .unwrap(),
                "clear" => kv.clear(),
                other => panic!("unknown op {other}"),
            }
        }
        match op {
            "decode" => {
                self.decode(step);
                None
            }
            "seq_rm" => {
                let mut all = true;
                for kv in &mut self.caches {
                    all &= kv.seq_rm(s("seq_id"), p("p0"), p("p1")).unwrap();
                }
                Some(all)
            }
            _ => None,
        }
    }

    fn decode(&mut self, step: &Value) {
        let pos = i32s(&step["pos"]);
        let seq_ids: Vec<Vec<SeqId>> = step["seq_ids"]
            .as_array()
            .expect("seq_ids")
            .iter()
            .map(i32s)
            .collect();
        let ubatches: Vec<UBatchView<'_>> = pos
            .chunks(self.n_ubatch)
            .zip(seq_ids.chunks(self.n_ubatch))
            .map(|(p, s)| UBatchView::new(p, s))
            .collect();
        for kv in &mut self.caches {
            // the engine re-rotates K here; the cells only forget the pending shifts
            kv.take_shifts();
            let slots = kv
                .prepare(&ubatches)
                .expect("the recorded decode succeeded");
            for (cells, ub) in slots.iter().zip(&ubatches) {
                kv.apply_ubatch(cells, ub).unwrap();
                // every placed token holds its position and its sequences
                for (k, &c) in cells.iter().enumerate() {
                    assert_eq!(kv.pos_of(c), ub.pos[k]);
                }
            }
        }
    }
}

fn expected_records(scenario: &Value) -> Vec<Record> {
    let mut out = Vec::new();
    for e in scenario["expected"].as_array().expect("expected") {
        let step = e["step"].as_u64().expect("step");
        assert!(
            e.get("decode_rc").is_none(),
            "no recorded decode failure in these scenarios"
        );
        if let Some(v) = e.get("returns") {
            out.push(Record::Returns {
                step,
                value: v.as_bool().expect("bool"),
            });
        } else if e.get("pos_min").is_some() {
            let (seq_id, min, max) = (int(e, "seq_id"), int(e, "pos_min"), int(e, "pos_max"));
            out.push(Record::Pos {
                step,
                seq_id,
                min,
                max,
            });
        }
    }
    out
}

/// Replays `name` with llama.cpp's cache size and with the unpadded one; both must match.
fn check(name: &str) {
    let scenario = load(name);
    let mut expected = expected_records(&scenario);
    expected.sort();
    assert!(!expected.is_empty(), "{name} records no cache observation");
    for pad in [true, false] {
        let mut replay = Replay::new(&scenario, pad);
        let mut got = replay.run(&scenario);
        got.sort();
        assert_eq!(got, expected, "{name} (padded: {pad})");
    }
}

#[test]
fn ring_wrap() {
    check("ring-wrap");
}

#[test]
fn context_shift() {
    check("context-shift");
}

#[test]
fn seq_add_free() {
    check("seq-add-free");
}

#[test]
fn seq_rm_middle() {
    check("seq-rm-middle");
}

#[test]
fn seq_rm_regenerate() {
    check("seq-rm-regenerate");
}

#[test]
fn shared_prefix_keep() {
    check("shared-prefix-keep");
}

#[test]
fn self_extend() {
    check("self-extend");
}

#[test]
fn seq_cp_diverge() {
    check("seq-cp-diverge");
}

#[test]
fn seq_div() {
    check("seq-div");
}

#[test]
fn multi_seq_batch() {
    check("multi-seq-batch");
}

#[test]
fn qwen2_context_shift() {
    check("qwen2-context-shift");
}

#[test]
fn gemma3_context_shift_on_an_interleaved_pair() {
    check("gemma3-context-shift");
}

/// 700 tokens through Gemma 3's 512-token window: the sliding cache has 768 cells
/// (`GGML_PAD(min(1024, 512 + 128), 256)`) and keeps every position (none is reused yet).
#[test]
fn gemma3_sliding_window_places_every_token() {
    let scenario = load("gemma3-sliding-window");
    let mut replay = Replay::new(&scenario, true);
    assert_eq!(replay.caches[1].size(), 768);
    replay.run(&scenario);
    for kv in &replay.caches {
        assert_eq!(kv.used(), 700);
        assert_eq!(
            (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
            (0, 699)
        );
    }
}
