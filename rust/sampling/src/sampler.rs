//! The sampler interface (llama_sampler_i).

use crate::candidates::Candidates;
use crate::samplers::Grammar;

/// One sampling step, as llama.cpp's `llama_sampler_i`: `apply` transforms the candidate
/// array (filter, reorder, rescale, or select), `accept` tells the sampler which token was
/// emitted, `reset` returns it to its initial state.
pub trait Sampler: Send {
    /// The sampler's name as llama.cpp reports it ("top-k", "dist", ...).
    fn name(&self) -> &'static str;
    /// Applies the sampler to the candidates.
    fn apply(&mut self, c: &mut Candidates);
    /// Records an emitted token (penalties, DRY and grammars keep history).
    fn accept(&mut self, _token: u32) {}
    /// Returns to the state right after construction (RNGs are re-seeded).
    fn reset(&mut self) {}
    /// A copy with the same state.
    fn clone_box(&self) -> Box<dyn Sampler>;
    /// The grammar sampler, for the chain's grammar fast path; `None` for every other sampler.
    fn as_grammar_mut(&mut self) -> Option<&mut Grammar> {
        None
    }
}

impl Clone for Box<dyn Sampler> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}
