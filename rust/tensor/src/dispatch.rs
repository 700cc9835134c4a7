//! Which instruction set the kernels use, decided once per process.
//!
//! The choice is made on first use from the CPU's features (`is_x86_feature_detected!`),
//! capped by the environment variable `FERROLLAMA_ISA` (`scalar`, `avx2` or `avx512`) so that
//! tests (and users comparing paths) can run every level this CPU has; `FERROLLAMA_FORCE_SCALAR=1`
//! is the older spelling of `FERROLLAMA_ISA=scalar`.

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

    /// The level of a name (`scalar`, `avx2`, `avx512`; `portable` is `scalar`).
    pub fn from_name(name: &str) -> Option<Isa> {
        match name.trim().to_ascii_lowercase().as_str() {
            "scalar" | "portable" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The level the kernel table was built for: the detected one, capped by FERROLLAMA_ISA (or
/// Scalar when FERROLLAMA_FORCE_SCALAR=1). A cap above what the CPU has leaves the detected
/// level; a name that is no level is reported once on stderr and ignored (the kernels must
/// still run, and this is read deep inside the first product, where no error can be returned).
pub fn active_isa() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let detected = Isa::detect();
        if std::env::var("FERROLLAMA_FORCE_SCALAR").as_deref() == Ok("1") {
            return Isa::Scalar;
        }
        match std::env::var("FERROLLAMA_ISA") {
            Ok(name) => match Isa::from_name(&name) {
                Some(cap) => cap.min(detected),
                None => {
                    eprintln!("ferrollama: FERROLLAMA_ISA={name:?} is not one of scalar, avx2, avx512; using {}", detected.name());
                    detected
                }
            },
            Err(_) => detected,
        }
    })
}
