//! dist: draws a token from the softmax of the candidates with a seeded mt19937.

use crate::candidates::{Candidates, MaxCxx};
use crate::rng::Mt19937;
use crate::sampler::Sampler;

/// `llama_sampler_init_dist(seed)`: softmax without sorting, one uniform double, walk the
/// cumulative sum in candidate order; leaves every candidate's normalized p.
#[derive(Debug, Clone)]
pub struct Dist {
    seed: u32,
    rng: Mt19937,
}

impl Dist {
    /// A dist sampler seeded with `seed`. (llama.cpp's LLAMA_DEFAULT_SEED, 0xFFFFFFFF,
    /// means "random"; here every seed is taken as given: pick a random one yourself.)
    pub fn new(seed: u32) -> Self {
        Dist { seed, rng: Mt19937::new(seed) }
    }

    /// The seed.
    pub fn seed(&self) -> u32 {
        self.seed
    }
}

impl Sampler for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if c.data.is_empty() {
            c.selected = None;
            return;
        }
        c.selected = Some(0);
        if c.data.len() == 1 {
            c.data[0].p = 1.0;
            return;
        }
        let mut max_l = c.data[0].logit;
        if !c.sorted {
            for t in &c.data[1..] {
                max_l = max_l.max_cxx(t.logit);
            }
        }
        let mut sum_cum = 0.0f64;
        for t in &mut c.data {
            let p = (t.logit - max_l).exp();
            t.p = p;
            sum_cum += p as f64;
        }
        let target = sum_cum * self.rng.uniform_f64();
        let mut sum_run = 0.0f64;
        let mut found = None;
        for (i, t) in c.data.iter_mut().enumerate() {
            if found.is_none() {
                sum_run += t.p as f64;
                if sum_run >= target {
                    found = Some(i);
                }
            }
            t.p = (t.p as f64 / sum_cum) as f32;
        }
        c.selected = Some(found.unwrap_or(c.data.len() - 1));
    }

    fn reset(&mut self) {
        self.rng.reseed(self.seed);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
