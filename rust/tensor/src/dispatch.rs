//! Which instruction set the kernels use, decided once per process.
//!
//! The choice is made on first use from the CPU's features (`is_x86_feature_detected!`) and
//! the environment variable `FERROLLAMA_FORCE_SCALAR=1`, which forces the scalar kernels so
//! that conformance tests can run on both paths.

use std::sync::OnceLock;

/// An instruction-set level the kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, the specification.
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F, BW, VL and VNNI and BMI2 on top of AVX2 (a CPU with AVX-512 but no VNNI
    /// uses the AVX2 kernels; every CPU with AVX-512 has BMI2).
    Avx512,
}

impl Isa {
    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("bmi2");
            if avx512 {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// True when this CPU can run kernels written for `self`.
    pub fn available(self) -> bool {
        self <= Isa::detect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The level the kernel table was built for: the detected one, or Scalar when
/// FERROLLAMA_FORCE_SCALAR=1.
pub fn active_isa() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let forced = std::env::var("FERROLLAMA_FORCE_SCALAR").map(|v| v == "1").unwrap_or(false);
        if forced { Isa::Scalar } else { Isa::detect() }
    })
}
