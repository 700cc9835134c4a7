//! dist: draws a token from the softmax of the candidates with a seeded mt19937.

use crate::candidates::{Candidates, MaxCxx};
use crate::rng::{resolve_seed, Mt19937};
use crate::sampler::Sampler;

/// `llama_sampler_init_dist(seed)`: softmax without sorting, one uniform double, walk the
/// cumulative sum in candidate order; leaves every candidate's normalized p.
#[derive(Debug, Clone)]
pub struct Dist {
    seed: u32,
    seed_cur: u32,
    rng: Mt19937,
}

impl Dist {
    /// A dist sampler seeded with `seed` ([`crate::DEFAULT_SEED`], 0xFFFFFFFF, draws a
    /// random seed, at construction and at every reset, as in llama.cpp).
    pub fn new(seed: u32) -> Self {
        let seed_cur = resolve_seed(seed);
        Dist { seed, seed_cur, rng: Mt19937::new(seed_cur) }
    }

    /// The seed in use (the drawn one when constructed with DEFAULT_SEED), as
    /// `llama_sampler_get_seed` reports it.
    pub fn seed_in_use(&self) -> u32 {
        self.seed_cur
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
            // llama.cpp draws anyway, keeping the RNG aligned with backend sampling, so the
            // tokens that follow depend on it.
            self.rng.uniform_f64();
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
        self.seed_cur = resolve_seed(self.seed);
        self.rng.reseed(self.seed_cur);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_candidate_still_draws() {
        // after a single-candidate round, the next draw is mt19937(42)'s second value
        let (mut a, mut b) = (Dist::new(42), Dist::new(42));
        let mut one = Candidates::from_logits(&[1.0]);
        a.apply(&mut one);
        let logits: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut ca, mut cb) = (Candidates::from_logits(&logits), Candidates::from_logits(&logits));
        a.apply(&mut ca);
        b.rng.uniform_f64();
        b.apply(&mut cb);
        assert_eq!(ca.selected, cb.selected);
    }
}
