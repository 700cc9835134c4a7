//! temp-ext: dynamic temperature, scaled by the normalized entropy of the candidates.

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_temp_ext(t, delta, exponent)`: with delta > 0 the temperature
/// ranges over [t − delta, t + delta] by (entropy / max entropy)^exponent, and the
/// probabilities are recomputed in double; otherwise a plain temperature.
#[derive(Debug, Clone)]
pub struct TempExt {
    t: f32,
    delta: f32,
    exponent: f32,
}

impl TempExt {
    /// A dynamic-temperature sampler.
    pub fn new(t: f32, delta: f32, exponent: f32) -> Result<Self, SamplingError> {
        check_not_nan("t", t)?;
        check_not_nan("delta", delta)?;
        check_not_nan("exponent", exponent)?;
        Ok(TempExt { t, delta, exponent })
    }

    fn dynamic_temperature(&self, c: &mut Candidates) -> f32 {
        let min_temp = (self.t - self.delta).max(0.0);
        let max_temp = self.t + self.delta;
        let max_entropy = -(1.0f32 / c.data.len() as f32).ln();
        c.softmax(true);
        let mut entropy = 0.0f32;
        for t in &c.data {
            if t.p > 0.0 {
                entropy -= t.p * t.p.ln();
            }
        }
        let normalized = entropy / max_entropy;
        min_temp + (max_temp - min_temp) * normalized.powf(self.exponent)
    }
}

impl Sampler for TempExt {
    fn name(&self) -> &'static str {
        "temp-ext"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.delta <= 0.0 {
            c.apply_temperature(self.t);
            return;
        }
        if c.data.len() <= 1 {
            return;
        }
        let dyn_temp = self.dynamic_temperature(c);
        c.apply_temperature(dyn_temp);
        let max_l = c.data[0].logit as f64;
        let mut cum_sum = 0.0f64;
        for t in &mut c.data {
            let p = (t.logit as f64 - max_l).exp();
            t.p = p as f32;
            cum_sum += p;
        }
        for t in &mut c.data {
            t.p = (t.p as f64 / cum_sum) as f32;
        }
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
