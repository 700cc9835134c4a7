//! xtc (exclude top choices): with probability p, drops every candidate above the
//! threshold except the least likely of them.

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::rng::{resolve_seed, Mt19937};
use crate::sampler::Sampler;

/// `llama_sampler_init_xtc(p, threshold, min_keep, seed)`. Like llama.cpp, which moves
/// the array's start pointer, the dropped candidates are removed from the front.
#[derive(Debug, Clone)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
    seed: u32,
    rng: Mt19937,
}

impl Xtc {
    /// An XTC sampler; p ≤ 0 or threshold > 0.5 disables it.
    pub fn new(p: f32, threshold: f32, min_keep: usize, seed: u32) -> Result<Self, SamplingError> {
        check_not_nan("p", p)?;
        check_not_nan("threshold", threshold)?;
        Ok(Xtc { probability: p, threshold, min_keep, seed, rng: Mt19937::new(resolve_seed(seed)) })
    }
}

impl Sampler for Xtc {
    fn name(&self) -> &'static str {
        "xtc"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.probability <= 0.0 || self.threshold > 0.5 || c.data.len() < 2 {
            return;
        }
        let chance = self.rng.uniform_f32();
        if chance > self.probability {
            return;
        }
        c.softmax(true);
        let mut pos_last = 0;
        for (i, t) in c.data.iter().enumerate() {
            if t.p >= self.threshold {
                pos_last = i;
            } else {
                break;
            }
        }
        if c.data.len() - pos_last >= self.min_keep && pos_last > 0 {
            c.data.drain(..pos_last);
        }
    }

    fn reset(&mut self) {
        self.rng.reseed(resolve_seed(self.seed));
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
