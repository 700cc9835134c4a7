//! penalties: repetition, frequency and presence penalties over the last n tokens.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_penalties(last_n, repeat, freq, present)`. A token seen `count`
/// times in the window has its logit divided by `repeat` (multiplied when ≤ 0), then
/// lowered by `count·freq + present`. last_n ≤ 0 disables it (llama.cpp clamps −1 to 0).
#[derive(Debug, Clone)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    freq: f32,
    present: f32,
    window: VecDeque<u32>,
    counts: HashMap<u32, u32>,
}

impl Penalties {
    /// A penalties sampler.
    pub fn new(last_n: i32, repeat: f32, freq: f32, present: f32) -> Result<Self, SamplingError> {
        check_not_nan("repeat", repeat)?;
        check_not_nan("freq", freq)?;
        check_not_nan("present", present)?;
        Ok(Penalties {
            last_n: last_n.max(0) as usize,
            repeat,
            freq,
            present,
            window: VecDeque::new(),
            counts: HashMap::new(),
        })
    }

    fn penalize(&self, logit: &mut f32, count: u32) {
        if *logit <= 0.0 {
            *logit *= self.repeat;
        } else {
            *logit /= self.repeat;
        }
        let present = if count > 0 { 1.0f32 } else { 0.0 };
        *logit -= count as f32 * self.freq + present * self.present;
    }
}

impl Sampler for Penalties {
    fn name(&self) -> &'static str {
        "penalties"
    }

    fn accept(&mut self, token: u32) {
        if self.last_n == 0 {
            return;
        }
        *self.counts.entry(token).or_insert(0) += 1;
        if self.window.len() >= self.last_n {
            if let Some(old) = self.window.pop_front() {
                if let Some(n) = self.counts.get_mut(&old) {
                    *n -= 1;
                    if *n == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.window.push_back(token);
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.last_n == 0 || (self.repeat == 1.0 && self.freq == 0.0 && self.present == 0.0) {
            return;
        }
        // Candidates still at their own index (the usual case: penalties run first on a
        // fresh array) are reached directly; the others by one scan. Either way every
        // candidate whose id was seen is penalized once, as llama.cpp's per-candidate lookup does.
        let mut missing: HashSet<u32> = HashSet::new();
        for (&token, &count) in &self.counts {
            let i = token as usize;
            if i < c.data.len() && c.data[i].id == token {
                let mut logit = c.data[i].logit;
                self.penalize(&mut logit, count);
                c.data[i].logit = logit;
            } else {
                missing.insert(token);
            }
        }
        if !missing.is_empty() {
            for t in c.data.iter_mut() {
                if missing.contains(&t.id) {
                    let count = self.counts[&t.id];
                    let mut logit = t.logit;
                    self.penalize(&mut logit, count);
                    t.logit = logit;
                }
            }
        }
        c.sorted = false;
    }

    fn reset(&mut self) {
        self.window.clear();
        self.counts.clear();
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
