//! greedy: selects the candidate with the highest logit (the first one on ties).

use crate::candidates::Candidates;
use crate::sampler::Sampler;

/// `llama_sampler_init_greedy`.
#[derive(Debug, Clone, Default)]
pub struct Greedy;

impl Greedy {
    /// A greedy sampler.
    pub fn new() -> Self {
        Greedy
    }
}

impl Sampler for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if c.data.is_empty() {
            c.selected = None;
            return;
        }
        let mut best = 0;
        for i in 1..c.data.len() {
            if c.data[i].logit > c.data[best].logit {
                best = i;
            }
        }
        c.selected = Some(best);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
