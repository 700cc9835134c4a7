//! temp: divides the logits by a temperature (≤ 0: keep only the maximum).

use crate::candidates::Candidates;
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_temp(t)`.
#[derive(Debug, Clone)]
pub struct Temp {
    t: f32,
}

impl Temp {
    /// A temperature sampler; t ≤ 0 leaves only the first maximum finite.
    pub fn new(t: f32) -> Result<Self, SamplingError> {
        check_not_nan("t", t)?;
        Ok(Temp { t })
    }
}

impl Sampler for Temp {
    fn name(&self) -> &'static str {
        "temp"
    }

    fn apply(&mut self, c: &mut Candidates) {
        c.apply_temperature(self.t);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}
