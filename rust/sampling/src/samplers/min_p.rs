//! min-p: keeps the candidates whose probability is at least p times the largest one.

use crate::candidates::{Candidates, MaxCxx, TokenData};
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_min_p(p, min_keep)`: on unsorted candidates a filter that keeps
/// their order; when that leaves fewer than min_keep (or the array is sorted), the sorted
/// prefix.
#[derive(Debug, Clone)]
pub struct MinP {
    p: f32,
    min_keep: usize,
}

impl MinP {
    /// A min-p sampler; p ≤ 0 disables it.
    pub fn new(p: f32, min_keep: usize) -> Result<Self, SamplingError> {
        check_not_nan("p", p)?;
        Ok(MinP { p, min_keep })
    }

    /// The unsorted path; false when it kept too few.
    fn filter_unsorted(&self, c: &mut Candidates) -> bool {
        let mut max_logit = -f32::MAX;
        for t in &c.data {
            max_logit = max_logit.max_cxx(t.logit);
        }
        let min_logit = max_logit + self.p.ln();
        let kept: Vec<TokenData> = c.data.iter().copied().filter(|t| t.logit >= min_logit).collect();
        if kept.is_empty() || kept.len() < self.min_keep {
            return false;
        }
        c.data[..kept.len()].copy_from_slice(&kept);
        c.data.truncate(kept.len());
        true
    }
}

impl Sampler for MinP {
    fn name(&self) -> &'static str {
        "min-p"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.p <= 0.0 || c.data.is_empty() {
            return;
        }
        if !c.sorted && self.filter_unsorted(c) {
            return;
        }
        if !c.sorted {
            let n = c.data.len();
            c.partial_sort_inplace(n);
        }
        let min_logit = c.data[0].logit + self.p.ln();
        let mut i = 1;
        while i < c.data.len() {
            if c.data[i].logit < min_logit && i >= self.min_keep {
                break;
            }
            i += 1;
        }
        c.data.truncate(i);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
