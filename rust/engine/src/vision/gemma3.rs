//! Gemma 3's projector (clip.cpp's `clip_graph_siglip` for PROJECTOR_TYPE_GEMMA3): the
//! SigLIP output, a grid of side × side patches, average-pooled n_merge × n_merge (256
//! tokens from 64 × 64 patches), RMS-normed with `mm.soft_emb_norm`, then projected to the
//! text model's width by `mm.input_projection`.

use ferrollama_tensor::{QMatrix, Threads};

use super::params::VisionParams;
use super::{dequantized, float_matrix, product};
use crate::error::Result;
use crate::ops::rms_norm_inplace;
use crate::weights::Loader;

pub struct Gemma3Head {
    soft_emb_norm: Vec<f32>,
    /// `mm.input_projection` transposed to n_embd_out rows of the vision width, in the file's
    /// type (the graph multiplies by ggml_cont(ggml_transpose(W))).
    proj: QMatrix,
}

impl Gemma3Head {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<Gemma3Head> {
        let soft_emb_norm = ld.vector("mm.soft_emb_norm.weight", p.n_embd)?;
        // Stored as n_embd (vision) rows of n_embd_out values.
        let stored = ld.matrix("mm.input_projection.weight", p.n_embd_out, p.n_embd)?;
        Ok(Gemma3Head { soft_emb_norm, proj: transposed(&stored)? })
    }
}

/// A matrix's transpose in its own type: exact for the float types ggml_cont can transpose.
fn transposed(m: &QMatrix) -> Result<QMatrix> {
    let (rows, cols) = (m.rows, m.cols);
    let values = dequantized(m);
    let t: Vec<f32> = (0..cols).flat_map(|c| (0..rows).map(move |r| (r, c))).map(|(r, c)| values[r * cols + c]).collect();
    float_matrix(m.ty, cols, rows, &t)
}

/// Output rows of a (full-size) image: the pooled grid.
pub fn n_tokens(p: &VisionParams, nx: usize, ny: usize) -> usize {
    (nx / p.patch_size / p.n_merge) * (ny / p.patch_size / p.n_merge)
}

/// The ViT's output (`side` × `side` patches, row-major, of the vision width) to the text
/// model's embeddings.
pub fn project(h: &Gemma3Head, p: &VisionParams, vit_out: Vec<f32>, side: usize, threads: &Threads) -> Vec<f32> {
    let d = p.n_embd;
    let mut pooled = avg_pool(&vit_out, side, side, p.n_merge, d);
    rms_norm_inplace(&mut pooled, &h.soft_emb_norm, p.eps);
    product(&h.proj, &pooled, pooled.len() / d, threads)
}

/// ggml_pool_2d (average, kernel = stride = k, no padding) over a grid of ny rows of nx
/// patches, each d values: (nx / k) × (ny / k) rows, row-major.
pub(crate) fn avg_pool(x: &[f32], nx: usize, ny: usize, k: usize, d: usize) -> Vec<f32> {
    let (out_x, out_y) = (nx / k, ny / k);
    let mut out = vec![0.0f32; out_x * out_y * d];
    for oy in 0..out_y {
        for ox in 0..out_x {
            let dst = &mut out[(oy * out_x + ox) * d..][..d];
            for c in 0..d {
                let mut sum = 0.0f32;
                for ky in 0..k {
                    for kx in 0..k {
                        sum += x[((oy * k + ky) * nx + ox * k + kx) * d + c];
                    }
                }
                dst[c] = sum / (k * k) as f32;
            }
        }
    }
    out
}
