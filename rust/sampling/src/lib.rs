//! llama.cpp's samplers, bit for bit where its records can tell: the candidate array and
//! its sorted flag, every sampler of `llama_sampler_init_*` (each in its own file under
//! `samplers/`), the sampler chain with the grammar fast path, `std::mt19937` and
//! libstdc++'s distributions (so a seed picks the same token), GBNF grammars and the
//! JSON-schema converter.
//!
//! The crate knows nothing of models or tokenizers: the vocabulary reaches it as
//! [`TokenPieces`] (the bytes of every token and the end-of-generation ids).
//!
//! ```
//! use ferrollama_sampling::*;
//! let mut chain = Chain::new(vec![
//!     Box::new(TopK::new(40)),
//!     Box::new(TopP::new(0.95, 1).unwrap()),
//!     Box::new(Temp::new(0.8).unwrap()),
//!     Box::new(Dist::new(42)),
//! ]);
//! let token = chain.sample(&[0.1, 2.0, -1.0, 0.5]).unwrap();
//! chain.accept(token);
//! ```

mod candidates;
mod cfg;
mod chain;
mod error;
mod pieces;
mod rng;
mod sampler;
mod stdsort;

pub mod grammar;
pub mod json_schema;
pub mod samplers;

pub use candidates::{Candidates, TokenData};
pub use cfg::{apply_guidance, log_softmax};
pub use chain::Chain;
pub use error::SamplingError;
pub use pieces::TokenPieces;
pub use rng::{discrete_sample, resolve_seed, Mt19937, DEFAULT_SEED};
pub use sampler::Sampler;
pub use samplers::{
    Dist, Dry, Grammar, Greedy, Infill, LogitBias, MinP, MirostatV1, MirostatV2, Penalties, Temp, TempExt, TopK,
    TopNSigma, TopP, Typical, Xtc,
};
