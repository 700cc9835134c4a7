//! typical: keeps the candidates whose surprise is closest to the entropy until their mass
//! exceeds p (locally typical sampling).

use crate::candidates::{Candidates, TokenData};
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;
use crate::stdsort;

/// `llama_sampler_init_typical(p, min_keep)`; p ≥ 1 disables it. Leaves the candidates
/// in order of |surprise − entropy| (unsorted).
#[derive(Debug, Clone)]
pub struct Typical {
    p: f32,
    min_keep: usize,
}

impl Typical {
    /// A typical sampler.
    pub fn new(p: f32, min_keep: usize) -> Result<Self, SamplingError> {
        check_not_nan("p", p)?;
        Ok(Typical { p, min_keep })
    }
}

impl Sampler for Typical {
    fn name(&self) -> &'static str {
        "typical"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.p >= 1.0 || c.data.is_empty() {
            return;
        }
        c.softmax(true);
        let mut entropy = 0.0f32;
        for t in &c.data {
            entropy += -t.p * t.p.ln();
        }
        let shifted: Vec<f32> = c.data.iter().map(|t| (-t.p.ln() - entropy).abs()).collect();
        let mut indices: Vec<usize> = (0..c.data.len()).collect();
        stdsort::sort(&mut indices, &mut |&a, &b| shifted[a] < shifted[b]);

        let mut cum_sum = 0.0f32;
        let mut last_idx = indices.len();
        for (i, &idx) in indices.iter().enumerate() {
            cum_sum += c.data[idx].p;
            if cum_sum > self.p && (self.min_keep == 0 || i + 1 >= self.min_keep) {
                last_idx = i + 1;
                break;
            }
        }
        let kept: Vec<TokenData> = indices[..last_idx].iter().map(|&i| c.data[i]).collect();
        c.data.clear();
        c.data.extend_from_slice(&kept);
        c.sorted = false;
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
