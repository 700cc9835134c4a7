//! Errors of the sampling crate.

use crate::grammar::GrammarError;

/// Everything that can go wrong when building or running samplers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A sampler parameter is outside the range the sampler accepts.
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// The parameter's name, as in llama.h.
        name: &'static str,
        /// The value that was given, rendered.
        value: String,
        /// What the sampler expects instead.
        reason: &'static str,
    },
    /// The grammar text could not be parsed or is unusable.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// The JSON schema could not be converted to a grammar.
    #[error("JSON schema conversion failed: {0}")]
    JsonSchema(String),
    /// The chain ran but no sampler selected a token (no greedy, dist or mirostat at its end).
    #[error("no token was selected: end the chain with greedy, dist or mirostat")]
    NoSelection,
    /// The candidate array was empty.
    #[error("no candidates to sample from")]
    NoCandidates,
    /// A token id is outside the vocabulary the sampler was built for.
    #[error("token {token} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange {
        /// The offending token id.
        token: u32,
        /// The number of tokens the sampler knows.
        n_vocab: usize,
    },
    /// Two arrays that must have the same length do not.
    #[error("length mismatch: {what} has {got} entries, expected {expected}")]
    LengthMismatch {
        /// Which array.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
    /// The grammar does not allow the token that was accepted.
    #[error("the grammar rejects token {token}")]
    GrammarRejected {
        /// The rejected token id.
        token: u32,
    },
}

/// Builds an [`SamplingError::InvalidParameter`].
pub(crate) fn invalid(name: &'static str, value: impl ToString, reason: &'static str) -> SamplingError {
    SamplingError::InvalidParameter { name, value: value.to_string(), reason }
}

/// Checks that a float parameter is not NaN (every comparison with NaN is false, which
/// would silently disable or break a sampler).
pub(crate) fn check_not_nan(name: &'static str, value: f32) -> Result<(), SamplingError> {
    if value.is_nan() {
        return Err(invalid(name, value, "must be a number"));
    }
    Ok(())
}
