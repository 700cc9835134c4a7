//! mirostat v2: drops the candidates whose surprise exceeds mu, samples from the rest,
//! and adapts mu toward the target surprise tau.

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::rng::{discrete_sample, resolve_seed, Mt19937};
use crate::sampler::Sampler;

/// `llama_sampler_init_mirostat_v2(seed, tau, eta)`.
#[derive(Debug, Clone)]
pub struct MirostatV2 {
    seed: u32,
    tau: f32,
    eta: f32,
    mu: f32,
    rng: Mt19937,
}

impl MirostatV2 {
    /// A mirostat v2 sampler; mu starts at 2·tau.
    pub fn new(seed: u32, tau: f32, eta: f32) -> Result<Self, SamplingError> {
        check_not_nan("tau", tau)?;
        check_not_nan("eta", eta)?;
        Ok(MirostatV2 { seed, tau, eta, mu: 2.0 * tau, rng: Mt19937::new(resolve_seed(seed)) })
    }

    /// The current target surprise mu.
    pub fn mu(&self) -> f32 {
        self.mu
    }
}

impl Sampler for MirostatV2 {
    fn name(&self) -> &'static str {
        "mirostat-v2"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if c.data.is_empty() {
            c.selected = None;
            return;
        }
        c.softmax(true);
        let mu = self.mu;
        let keep = c.data.iter().position(|t| -t.p.log2() > mu).unwrap_or(c.data.len());
        c.data.truncate(keep.max(1));
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
