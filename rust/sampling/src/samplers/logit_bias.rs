//! logit-bias: adds a fixed bias to chosen tokens' logits.

use crate::candidates::Candidates;
use crate::error::{check_not_nan, invalid, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_logit_bias(n_vocab, biases)`. A token may be named more than once.
/// Biases of tokens found at their own index are all added; the others are looked up in
/// one scan where, as in llama.cpp, only the first bias naming a candidate applies.
#[derive(Debug, Clone)]
pub struct LogitBias {
    n_vocab: usize,
    biases: Vec<(u32, f32)>,
    to_search: Vec<(u32, f32)>,
}

impl LogitBias {
    /// A logit-bias sampler for a vocabulary of `n_vocab` tokens.
    pub fn new(n_vocab: usize, biases: Vec<(u32, f32)>) -> Result<Self, SamplingError> {
        for &(token, bias) in &biases {
            check_not_nan("bias", bias)?;
            if token as usize >= n_vocab {
                return Err(invalid("token", token, "must be below n_vocab"));
            }
        }
        Ok(LogitBias { n_vocab, biases, to_search: Vec::new() })
    }

    /// The vocabulary size given at construction.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
}

impl Sampler for LogitBias {
    fn name(&self) -> &'static str {
        "logit-bias"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.biases.is_empty() {
            return;
        }
        self.to_search.clear();
        for &(token, bias) in &self.biases {
            let i = token as usize;
            if i < c.data.len() && c.data[i].id == token {
                c.data[i].logit += bias;
            } else {
                self.to_search.push((token, bias));
            }
        }
        if self.to_search.is_empty() {
            return;
        }
        for t in c.data.iter_mut() {
            if let Some(&(_, bias)) = self.to_search.iter().find(|(token, _)| *token == t.id) {
                t.logit += bias;
            }
        }
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(LogitBias { n_vocab: self.n_vocab, biases: self.biases.clone(), to_search: Vec::new() })
    }
}
