//! mirostat (v1): estimates the Zipf exponent from the top m tokens, picks k so the
//! expected surprise matches mu, samples from the top k, and adapts mu toward tau.

use crate::candidates::{cvt_f32_to_i32, Candidates};
use crate::error::{check_not_nan, invalid, SamplingError};
use crate::rng::{discrete_sample, resolve_seed, Mt19937};
use crate::sampler::Sampler;

/// `llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m)`.
#[derive(Debug, Clone)]
pub struct MirostatV1 {
    n_vocab: i32,
    seed: u32,
    tau: f32,
    eta: f32,
    m: i32,
    mu: f32,
    rng: Mt19937,
}

impl MirostatV1 {
    /// A mirostat sampler (llama.cpp's default m is 100).
    pub fn new(n_vocab: i32, seed: u32, tau: f32, eta: f32, m: i32) -> Result<Self, SamplingError> {
        check_not_nan("tau", tau)?;
        check_not_nan("eta", eta)?;
        if n_vocab <= 0 {
            return Err(invalid("n_vocab", n_vocab, "must be positive"));
        }
        if m <= 0 {
            return Err(invalid("m", m, "must be positive"));
        }
        Ok(MirostatV1 { n_vocab, seed, tau, eta, m, mu: 2.0 * tau, rng: Mt19937::new(resolve_seed(seed)) })
    }

    /// The current target surprise mu.
    pub fn mu(&self) -> f32 {
        self.mu
    }

    /// s_hat: the least-squares Zipf exponent over the top m − 1 probability ratios.
    fn zipf_exponent(&self, c: &Candidates) -> f32 {
        let mut sum_ti_bi = 0.0f32;
        let mut sum_ti_sq = 0.0f32;
        let limit = (self.m as usize - 1).min(c.data.len() - 1);
        for i in 0..limit {
            let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b_i = (c.data[i].p / c.data[i + 1].p).ln();
            sum_ti_bi += t_i * b_i;
            sum_ti_sq += t_i * t_i;
        }
        sum_ti_bi / sum_ti_sq
    }
}

impl Sampler for MirostatV1 {
    fn name(&self) -> &'static str {
        "mirostat"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if c.data.is_empty() {
            c.selected = None;
            return;
        }
        c.softmax(true);
        let s_hat = self.zipf_exponent(c);
        let epsilon_hat = s_hat - 1.0;
        let k = ((epsilon_hat * 2f32.powf(self.mu)) / (1.0 - (self.n_vocab as f32).powf(-epsilon_hat)))
            .powf(1.0 / s_hat);
        c.top_k(cvt_f32_to_i32(k).max(1));
        c.softmax(true);
        let probs: Vec<f32> = c.data.iter().map(|t| t.p).collect();
        let idx = discrete_sample(&probs, &mut self.rng);
        c.selected = Some(idx);
        let observed_surprise = -c.data[idx].p.log2();
        let e = observed_surprise - self.tau;
        self.mu -= self.eta * e;
    }

    fn reset(&mut self) {
        self.mu = 2.0 * self.tau;
        self.rng.reseed(resolve_seed(self.seed));
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
