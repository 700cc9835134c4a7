//! Classifier-free guidance (llama.cpp's former llama_sample_apply_guidance).

use crate::candidates::MaxCxx;
use crate::error::{check_not_nan, SamplingError};

/// Mixes the logits with those of a negative (guidance) prompt:
/// l = scale·(log_softmax(l) − log_softmax(g)) + log_softmax(g). Both arrays are turned
/// into log-probabilities in place; `logits` receives the result.
pub fn apply_guidance(logits: &mut [f32], guidance: &mut [f32], scale: f32) -> Result<(), SamplingError> {
    check_not_nan("scale", scale)?;
    if logits.len() != guidance.len() {
        return Err(SamplingError::LengthMismatch { what: "guidance logits", got: guidance.len(), expected: logits.len() });
    }
    log_softmax(logits);
    log_softmax(guidance);
    for (l, &g) in logits.iter_mut().zip(guidance.iter()) {
        *l = scale * (*l - g) + g;
    }
    Ok(())
}

/// In place: x ← log(exp(x − max) / Σ exp(x − max)), summed in float as llama.cpp did.
pub fn log_softmax(values: &mut [f32]) {
    let Some(&first) = values.first() else { return };
    let max_l = values.iter().fold(first, |m, &v| m.max_cxx(v));
    let mut sum = 0.0f32;
    for v in values.iter_mut() {
        let p = (*v - max_l).exp();
        sum += p;
        *v = p;
    }
    for v in values.iter_mut() {
        *v = (*v / sum).ln();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_one_gives_the_log_probabilities_of_the_logits() {
        let mut l = vec![1.0f32, 2.0, 3.0];
        let mut g = vec![0.5f32, 0.0, -1.0];
        apply_guidance(&mut l, &mut g, 1.0).unwrap();
        let mut expected = vec![1.0f32, 2.0, 3.0];
        log_softmax(&mut expected);
        for (a, b) in l.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn scale_zero_gives_the_guidance_log_probabilities() {
        let mut l = vec![1.0f32, 2.0, 3.0];
        let mut g = vec![0.5f32, 0.0, -1.0];
        apply_guidance(&mut l, &mut g, 0.0).unwrap();
        assert_eq!(l, g);
    }

    #[test]
    fn lengths_must_agree() {
        assert!(apply_guidance(&mut [1.0], &mut [1.0, 2.0], 1.5).is_err());
    }
}
