//! Helpers shared by the integration tests: paths of the reference data, a deterministic
//! random generator, and dequantizing/quantizing whole rows through the traits table.
#![allow(dead_code)]

use ferrollama_tensor::{traits, GgmlType, TypeTraits};

pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

/// The types with a tiny model in tests/data/models, by file-name suffix.
pub const MODEL_TYPES: &[(&str, GgmlType)] = &[
    ("f32", GgmlType::F32),
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("q2_k", GgmlType::Q2_K),
    ("q3_k", GgmlType::Q3_K),
    ("q4_k", GgmlType::Q4_K),
    ("q5_k", GgmlType::Q5_K),
    ("q6_k", GgmlType::Q6_K),
    ("iq4_nl", GgmlType::IQ4_NL),
    ("iq4_xs", GgmlType::IQ4_XS),
    ("mxfp4", GgmlType::MXFP4),
    ("tq1_0", GgmlType::TQ1_0),
    ("tq2_0", GgmlType::TQ2_0),
    ("iq2_xxs", GgmlType::IQ2_XXS),
    ("iq2_xs", GgmlType::IQ2_XS),
    ("iq2_s", GgmlType::IQ2_S),
    ("iq3_xxs", GgmlType::IQ3_XXS),
    ("iq3_s", GgmlType::IQ3_S),
    ("iq1_s", GgmlType::IQ1_S),
    ("iq1_m", GgmlType::IQ1_M),
    ("q1_0", GgmlType::Q1_0),
    ("q2_0", GgmlType::Q2_0),
];

/// Every weight type of the table (the activation-only Q8_1/Q8_K excluded).
pub const WEIGHT_TYPES: &[GgmlType] = &[
    GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
    GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
    GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4,
    GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
    GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::Q1_0, GgmlType::Q2_0,
];

/// The i-quants: no run-time quantizer (ggml's CPU backend has none: activations are never
/// i-quants), and their reference quantizers search grids under importance weights (IQ2_XXS,
/// IQ2_XS and IQ1_S only with them). Their tiny models were written by llama.cpp's quantizer
/// under weights of ones; their random test weights are random bytes with a sane scale.
pub const NO_QUANTIZER: &[GgmlType] = &[GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M];

pub fn model_path(suffix: &str) -> String {
    format!("{DATA}/models/tiny-llama-{suffix}.gguf")
}

pub fn tr(ty: GgmlType) -> &'static TypeTraits {
    traits(ty).unwrap_or_else(|| panic!("{ty} is in the table"))
}

/// xorshift64*: reproducible test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Roughly Gaussian (sum of four uniforms), like trained weights and activations.
    pub fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }
}

pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let t = tr(ty);
    let mut out = vec![0u8; t.row_bytes(x.len())];
    (t.from_f32.expect("quantizable"))(x, &mut out);
    out
}

pub fn quantize_ref(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let t = tr(ty);
    let mut out = vec![0u8; t.row_bytes(x.len())];
    (t.from_f32_ref.expect("quantizable"))(x, &mut out);
    out
}

pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    (tr(ty).to_f32)(bytes, &mut out);
    out
}

/// Random weights as the type stores them: quantized from Gaussian floats with a few
/// outliers, so every scale and level is exercised.
pub fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    if NO_QUANTIZER.contains(&ty) {
        return random_iquant_blocks(ty, n, rng);
    }
    let mut x = rng.vec(n, 0.05);
    for i in (0..n).step_by(97) {
        x[i] *= 6.0;
    }
    quantize_ref(ty, &x)
}

/// Random blocks of an i-quant (every grid index, sign and scale), the f16 d between about
/// 2^-8 and 2^-5, either sign: at byte 0, or for IQ1_M in the top nibbles of its four scale
/// words.
fn random_iquant_blocks(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut bytes = rng.bytes(tr(ty).row_bytes(n));
    for b in bytes.chunks_exact_mut(ty.type_size()) {
        let d = half::f16::from_f32((0.004 + 0.03 * rng.uniform()) * if rng.uniform() < 0.5 { -1.0 } else { 1.0 }).to_bits();
        if ty == GgmlType::IQ1_M {
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | (((d >> (4 * k)) & 0xf) as u8) << 4;
            }
        } else {
            b[0..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}
