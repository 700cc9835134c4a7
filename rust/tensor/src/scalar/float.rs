//! F32, F16 and BF16: conversions and ggml's generic dot products, which sum the f32
//! products in f64 (`ggml_float`).

use crate::util::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, rd_f32};

pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = rd_f32(s, 0);
    }
}

pub fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// ggml_vec_dot_f32 (generic): f32 products accumulated in f64.
pub fn vec_dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in w[..4 * n].chunks_exact(4).zip(x[..4 * n].chunks_exact(4)) {
        sum += (rd_f32(a, 0) * rd_f32(b, 0)) as f64;
    }
    sum as f32
}

fn halves(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

pub fn f16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(halves(src)) {
        *d = f16_to_f32(h);
    }
}

pub fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_f16(*s).to_le_bytes());
    }
}

/// ggml_vec_dot_f16 (generic). The product of two halves is exact in f32.
pub fn vec_dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in halves(&w[..2 * n]).zip(halves(&x[..2 * n])) {
        sum += (f16_to_f32(a) * f16_to_f32(b)) as f64;
    }
    sum as f32
}

pub fn bf16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(halves(src)) {
        *d = bf16_to_f32(h);
    }
}

pub fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// ggml_vec_dot_bf16 (generic). The product of two bf16 values is exact in f32.
pub fn vec_dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in halves(&w[..2 * n]).zip(halves(&x[..2 * n])) {
        sum += (bf16_to_f32(a) * bf16_to_f32(b)) as f64;
    }
    sum as f32
}
