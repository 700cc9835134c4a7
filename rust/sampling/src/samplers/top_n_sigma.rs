//! top-n-sigma: masks the candidates more than n standard deviations below the top logit.

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_top_n_sigma(n)`; n ≤ 0 disables it. Masked candidates get a
/// -inf logit and stay where they are (the order and p are left untouched).
#[derive(Debug, Clone)]
pub struct TopNSigma {
    n: f32,
}

impl TopNSigma {
    /// A top-n-sigma sampler.
    pub fn new(n: f32) -> Result<Self, SamplingError> {
        check_not_nan("n", n)?;
        Ok(TopNSigma { n })
    }
}

impl Sampler for TopNSigma {
    fn name(&self) -> &'static str {
        "top-n-sigma"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.n <= 0.0 || c.data.len() <= 1 {
            return;
        }
        let mut max = c.data[0].logit;
        let mut logits_sum = 0.0f32;
        let mut valid_count = 0usize;
        for t in &c.data {
            if t.logit != f32::NEG_INFINITY {
                if t.logit > max {
                    max = t.logit;
                }
                logits_sum += t.logit;
                valid_count += 1;
            }
        }
        let mean = if valid_count > 0 { logits_sum / valid_count as f32 } else { 0.0 };
        // C++ `acc += pow(x, 2)`: the square is a double, the sum is rounded back to float
        let mut acc = 0.0f32;
        for t in &c.data {
            if t.logit != f32::NEG_INFINITY {
                let d = (t.logit - mean) as f64;
                acc = (acc as f64 + d * d) as f32;
            }
        }
        let std = if valid_count > 0 { (acc / valid_count as f32).sqrt() } else { 0.0 };
        let cutoff = max - self.n * std;
        for t in &mut c.data {
            if t.logit < cutoff {
                t.logit = f32::NEG_INFINITY;
            }
        }
        // At build 0c1e570 (the records) the sampler stops here: no softmax, no sort
        // (later builds sort and softmax the candidates).
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
