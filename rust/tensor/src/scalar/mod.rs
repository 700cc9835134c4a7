//! The scalar kernels: the specification every SIMD path is tested against.

pub mod float;
pub mod iq2quantize;
pub mod iq_grids;
pub mod iq1quantize;
pub mod iq3quantize;
pub mod iq_index;
pub mod iquants;
pub mod kquantize;
pub mod kquants;
pub mod lanes;
pub mod legacy;
pub mod q1q2;
pub mod repacked;
pub mod ternary;
pub mod tiled;
pub mod weighted;
