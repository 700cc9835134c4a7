//! The samplers, one per file, each mirroring its `llama_sampler_init_*`.

mod dist;
mod dry;
mod grammar;
mod greedy;
mod infill;
mod logit_bias;
mod min_p;
mod mirostat_v1;
mod mirostat_v2;
mod penalties;
mod temp;
mod temp_ext;
mod top_k;
mod top_n_sigma;
mod top_p;
mod typical;
mod xtc;

pub use dist::Dist;
pub use dry::Dry;
pub use grammar::Grammar;
pub use greedy::Greedy;
pub use infill::Infill;
pub use logit_bias::LogitBias;
pub use min_p::MinP;
pub use mirostat_v1::MirostatV1;
pub use mirostat_v2::MirostatV2;
pub use penalties::Penalties;
pub use temp::Temp;
pub use temp_ext::TempExt;
pub use top_k::TopK;
pub use top_n_sigma::TopNSigma;
pub use top_p::TopP;
pub use typical::Typical;
pub use xtc::Xtc;
