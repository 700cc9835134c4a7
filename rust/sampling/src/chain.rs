//! The sampler chain (llama_sampler_chain plus common_sampler's grammar fast path).

use crate::candidates::Candidates;
use crate::error::SamplingError;
use crate::sampler::Sampler;

/// Samplers applied in order to one candidate array.
///
/// [`Chain::apply`] runs every sampler in its place, as `llama_sampler_apply` on a chain.
/// [`Chain::sample`] is what llama.cpp's `common_sampler_sample` does when the chain holds
/// grammar samplers: run the others first and check only the chosen token against the
/// grammars; constrain the whole vocabulary (grammars first, then the rest of the chain,
/// which draws again) only when that token is rejected.
pub struct Chain {
    samplers: Vec<Box<dyn Sampler>>,
    cur: Candidates,
}

impl Clone for Chain {
    fn clone(&self) -> Self {
        Chain { samplers: self.samplers.iter().map(|s| s.clone_box()).collect(), cur: Candidates::default() }
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("samplers", &self.names()).finish()
    }
}

impl Chain {
    /// A chain of samplers, applied in the given order.
    pub fn new(samplers: Vec<Box<dyn Sampler>>) -> Self {
        Chain { samplers, cur: Candidates::default() }
    }

    /// Appends a sampler.
    pub fn push(&mut self, sampler: Box<dyn Sampler>) {
        self.samplers.push(sampler);
    }

    /// The samplers' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.samplers.iter().map(|s| s.name()).collect()
    }

    /// The number of samplers.
    pub fn len(&self) -> usize {
        self.samplers.len()
    }

    /// Whether the chain has no sampler.
    pub fn is_empty(&self) -> bool {
        self.samplers.is_empty()
    }

    /// Applies every sampler in order.
    pub fn apply(&mut self, c: &mut Candidates) {
        for s in &mut self.samplers {
            s.apply(c);
        }
    }

    /// Applies the chain to the logits and returns the selected token (without accepting
    /// it: call [`Chain::accept`] with the token you keep). Grammar samplers are checked
    /// on the chosen token only, unless it is rejected (see the type's documentation).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        let has_grammar = self.samplers.iter_mut().any(|s| s.as_grammar_mut().is_some());
        let mut cur = std::mem::take(&mut self.cur);
        cur.fill_from_logits(logits);
        if !has_grammar {
            self.apply(&mut cur);
            let token = cur.selected_token();
            self.cur = cur;
            return token.ok_or(SamplingError::NoSelection);
        }
        self.apply_matching(&mut cur, false);
        let token = cur.selected_token().ok_or(SamplingError::NoSelection);
        let token = match token {
            Ok(t) if self.grammars_allow(t) => Ok(t),
            Ok(_) => {
                // rejected: constrain the full vocabulary, then sample again
                cur.fill_from_logits(logits);
                self.apply_matching(&mut cur, true);
                self.apply_matching(&mut cur, false);
                cur.selected_token().ok_or(SamplingError::NoSelection)
            }
            Err(e) => Err(e),
        };
        self.cur = cur;
        token
    }

    /// [`Chain::sample`] then [`Chain::accept`] (what `llama_sampler_sample` does).
    pub fn sample_and_accept(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let token = self.sample(logits)?;
        self.accept(token);
        Ok(token)
    }

    /// The candidates as the last [`Chain::sample`] left them.
    pub fn last_candidates(&self) -> &Candidates {
        &self.cur
    }

    /// Tells every sampler the emitted token. A grammar that does not allow it keeps its
    /// state (see [`Chain::accept_checked`] to be told).
    pub fn accept(&mut self, token: u32) {
        for s in &mut self.samplers {
            s.accept(token);
        }
    }

    /// Like [`Chain::accept`], but first checks the token against every grammar and, if
    /// one refuses it, changes nothing and returns the error.
    pub fn accept_checked(&mut self, token: u32) -> Result<(), SamplingError> {
        for s in &mut self.samplers {
            if let Some(g) = s.as_grammar_mut() {
                if !g.matcher().is_dead() && !g.allows(token) {
                    return Err(SamplingError::GrammarRejected { token });
                }
            }
        }
        self.accept(token);
        Ok(())
    }

    /// Resets every sampler.
    pub fn reset(&mut self) {
        for s in &mut self.samplers {
            s.reset();
        }
    }

    /// Applies, in order, the grammar samplers (`grammars` true) or all the others.
    fn apply_matching(&mut self, c: &mut Candidates, grammars: bool) {
        for s in &mut self.samplers {
            if s.as_grammar_mut().is_some() == grammars {
                s.apply(c);
            }
        }
    }

    fn grammars_allow(&mut self, token: u32) -> bool {
        self.samplers.iter_mut().filter_map(|s| s.as_grammar_mut()).all(|g| g.allows(token))
    }
}

/// A chain is itself a sampler (as llama.cpp's chain is), so chains can nest.
impl Sampler for Chain {
    fn name(&self) -> &'static str {
        "chain"
    }

    fn apply(&mut self, c: &mut Candidates) {
        Chain::apply(self, c);
    }

    fn accept(&mut self, token: u32) {
        Chain::accept(self, token);
    }

    fn reset(&mut self) {
        Chain::reset(self);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
