//! infill: for fill-in-the-middle, merges candidates that are prefixes of one another and
//! prefers end-of-generation once text tokens become unlikely.

use std::sync::Arc;

use crate::candidates::Candidates;
use crate::pieces::TokenPieces;
use crate::sampler::Sampler;

/// `llama_sampler_init_infill(vocab)`. `eot` is the token it falls back to when no text
/// token survives (llama.cpp takes EOT, or EOS when the vocabulary has no EOT).
/// Runs in O(n²) over the candidates, like llama.cpp: put it after a top-k.
#[derive(Debug, Clone)]
pub struct Infill {
    pieces: Arc<TokenPieces>,
    is_eog: Arc<Vec<bool>>,
    eot: u32,
}

impl Infill {
    /// An infill sampler over a vocabulary.
    pub fn new(pieces: Arc<TokenPieces>, eot: u32) -> Self {
        let is_eog = Arc::new(pieces.eog_flags());
        Infill { pieces, is_eog, eot }
    }

    fn eog(&self, token: u32) -> bool {
        self.is_eog.get(token as usize).copied().unwrap_or(false)
    }

    /// Keeps only the end-of-generation candidates, renormalized.
    fn keep_eog_only(&self, c: &mut Candidates) {
        c.data.retain(|t| self.eog(t.id));
        let p_sum: f32 = c.data.iter().fold(0.0f32, |s, t| s + t.p);
        for t in &mut c.data {
            t.p /= p_sum;
        }
    }

    /// Merges each candidate that is a prefix of another into the more likely of the two.
    fn combine_common_prefixes(&self, c: &mut Candidates) {
        let n = c.data.len();
        for i0 in 0..n {
            for i1 in 0..n {
                if c.data[i0].logit == f32::NEG_INFINITY {
                    break;
                }
                if i0 == i1 || c.data[i1].logit == f32::NEG_INFINITY {
                    continue;
                }
                let piece0 = self.pieces.piece(c.data[i0].id);
                let piece1 = self.pieces.piece(c.data[i1].id);
                if !piece0.is_empty() && piece1.starts_with(piece0) {
                    let (dst, src) = if c.data[i1].p > c.data[i0].p { (i1, i0) } else { (i0, i1) };
                    c.data[dst].p += c.data[src].p;
                    c.data[src].logit = f32::NEG_INFINITY;
                    c.data[src].p = 0.0;
                }
            }
        }
    }

    /// Keeps the candidates at or above `thold` and every EOG one; returns how many
    /// non-EOG candidates stayed and their total probability with the EOG ones.
    fn threshold(&self, c: &mut Candidates, thold: f32) -> (usize, f32) {
        let mut n_non_eog = 0;
        let mut p_sum = 0.0f32;
        c.data.retain(|t| {
            let is_eog = self.eog(t.id);
            if t.p < thold && !is_eog {
                return false;
            }
            if !is_eog {
                n_non_eog += 1;
            }
            p_sum += t.p;
            true
        });
        (n_non_eog, p_sum)
    }
}

impl Sampler for Infill {
    fn name(&self) -> &'static str {
        "infill"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if c.data.is_empty() {
            return;
        }
        c.softmax(true);
        let mut p_txt_sum = 0.0f32;
        let mut p_eog_sum = 0.0f32;
        for t in &c.data {
            if self.eog(t.id) {
                p_eog_sum += t.p;
            } else {
                p_txt_sum += t.p;
            }
        }
        if 3.0 * p_eog_sum * c.data.len() as f32 > p_txt_sum {
            self.keep_eog_only(c);
            return;
        }
        self.combine_common_prefixes(c);
        let (n_non_eog, p_sum) = self.threshold(c, 0.2);
        if n_non_eog == 0 {
            c.data.truncate(1);
            if let Some(first) = c.data.first_mut() {
                first.id = self.eot;
                first.logit = 1.0;
            }
            return;
        }
        for t in &mut c.data {
            t.p /= p_sum;
        }
        let thold = (1.0f64 / (n_non_eog as f64 + 1.0)) as f32;
        let (_, p_sum) = self.threshold(c, thold);
        for t in &mut c.data {
            t.p /= p_sum;
        }
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
