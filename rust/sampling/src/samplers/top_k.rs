//! top-k: keeps the k most likely candidates, sorted.

use crate::candidates::Candidates;
use crate::sampler::Sampler;

/// `llama_sampler_init_top_k(k)`; k ≤ 0 keeps everything.
#[derive(Debug, Clone)]
pub struct TopK {
    k: i32,
}

impl TopK {
    /// A top-k sampler (k ≤ 0 disables it, as in llama.cpp).
    pub fn new(k: i32) -> Self {
        TopK { k }
    }
}

impl Sampler for TopK {
    fn name(&self) -> &'static str {
        "top-k"
    }

    fn apply(&mut self, c: &mut Candidates) {
        c.top_k(self.k);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
