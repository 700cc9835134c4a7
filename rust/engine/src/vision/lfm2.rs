//! LFM2-VL's projector (clip.cpp's `clip_graph_siglip` for PROJECTOR_TYPE_LFM2): SigLIP2
//! NaFlex at the image's own size — its learned position embeddings (a square grid) resized to
//! the image's patch grid by antialiased bilinear interpolation (`resize_position_embeddings`)
//! — then the patches pixel-unshuffled n_merge × n_merge (the grid padded with zeros to whole
//! blocks), LayerNorm'd by `mm.input_norm` where the file has it, and through `mm.1`, GELU, `mm.2`.

use ferrollama_tensor::{QMatrix, Threads};

use super::idefics3::pixel_shuffle;
use super::params::VisionParams;
use super::product;
use crate::error::Result;
use crate::ops::{add_bias, gelu_inplace, layer_norm_rows};
use crate::weights::Loader;

/// The epsilon of `mm.input_norm` (clip.cpp: "default nn.LayerNorm"), not the encoder's.
const INPUT_NORM_EPS: f32 = 1e-5;

pub struct Lfm2Head {
    /// `mm.input_norm`: the LayerNorm's scale (the norm runs only with it) and bias (added
    /// with or without it), both optional.
    norm_w: Option<Vec<f32>>,
    norm_b: Option<Vec<f32>>,
    mm1: QMatrix,
    mm1_b: Vec<f32>,
    mm2: QMatrix,
    mm2_b: Vec<f32>,
}

impl Lfm2Head {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<Lfm2Head> {
        let merged = p.n_embd * p.n_merge * p.n_merge;
        let rows = |name: &str| ld.shape(name).and_then(|s| s.get(1).copied()).ok_or_else(|| ld.error(format!("missing tensor '{name}'")));
        let (hidden, out) = (rows("mm.1.weight")?, rows("mm.2.weight")?);
        Ok(Lfm2Head {
            norm_w: ld.opt_vector("mm.input_norm.weight", merged)?,
            norm_b: ld.opt_vector("mm.input_norm.bias", merged)?,
            mm1: ld.matrix("mm.1.weight", merged, hidden)?,
            mm1_b: ld.vector("mm.1.bias", hidden)?,
            mm2: ld.matrix("mm.2.weight", hidden, out)?,
            mm2_b: ld.vector("mm.2.bias", out)?,
        })
    }

    /// The width of the output rows (clip_n_mmproj_embd: mm.2's rows).
    pub fn n_embd_out(&self) -> usize { self.mm2.rows }
}

/// Output rows of an image of nx × ny pixels: one per n_merge × n_merge block of patches,
/// partial blocks counted (clip_n_output_tokens' CLIP_ALIGN).
pub fn n_tokens(p: &VisionParams, nx: usize, ny: usize) -> usize {
    let side = p.patch_size * p.n_merge;
    nx.div_ceil(side) * ny.div_ceil(side)
}

/// The position embeddings for a grid of `width` × `height` patches: the learned ones where
/// the grid is theirs, else resized (resize_position_embeddings).
pub fn positions(learned: &[f32], d: usize, width: usize, height: usize) -> std::borrow::Cow<'_, [f32]> {
    let side = (learned.len() / d).isqrt();
    if width == side && height == side {
        return learned.into();
    }
    resize_antialiased(learned, d, side, side, width, height).into()
}

/// ggml_interpolate(GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ANTIALIAS) of a grid of
/// `src_w` × `src_h` rows of `d` channels (row y·src_w + x) to `dst_w` × `dst_h`, as ggml's
/// CPU kernel computes it in f32 (PyTorch's antialiased bilinear, align_corners false): each
/// output a triangle-weighted mean of the source points within the filter's support.
fn resize_antialiased(src: &[f32], d: usize, src_w: usize, src_h: usize, dst_w: usize, dst_h: usize) -> Vec<f32> {
    let taps = |n_src: usize, n_dst: usize| -> Vec<Vec<(usize, f32)>> {
        let scale = n_dst as f32 / n_src as f32;
        let support = (1.0 / scale).max(1.0);
        let inv = 1.0 / support;
        (0..n_dst).map(|i| {
            let centre = (i as f32 + 0.5) / scale;
            // C's float -> int64 conversion truncates toward zero
            let lo = ((centre - support + 0.5) as i64).max(0) as usize;
            let hi = ((centre + support + 0.5) as i64).min(n_src as i64).max(0) as usize;
            (lo..hi).map(|s| (s, (1.0 - ((s as f32 - centre + 0.5) * inv).abs()).max(0.0))).collect()
        }).collect()
    };
    let (tx, ty) = (taps(src_w, dst_w), taps(src_h, dst_h));
    let mut out = vec![0.0f32; dst_w * dst_h * d];
    for (y, wys) in ty.iter().enumerate() {
        for (x, wxs) in tx.iter().enumerate() {
            let row = &mut out[(y * dst_w + x) * d..][..d];
            for (c, v) in row.iter_mut().enumerate() {
                let (mut sum, mut total) = (0.0f32, 0.0f32);
                for &(sy, wy) in wys {
                    for &(sx, wx) in wxs {
                        let w = wx * wy;
                        if w <= 0.0 {
                            continue;
                        }
                        sum += src[(sy * src_w + sx) * d + c] * w;
                        total += w;
                    }
                }
                *v = if total > 0.0 { sum / total } else { sum };
            }
        }
    }
    out
}

/// The ViT's output (`width` × `height` patches, row-major, of the vision width) to the text
/// model's embeddings.
pub fn project(h: &Lfm2Head, p: &VisionParams, vit_out: Vec<f32>, width: usize, height: usize, threads: &Threads) -> Vec<f32> {
    let (d, s) = (p.n_embd, p.n_merge);
    let (padded, pw, ph) = pad_to_blocks(vit_out, width, height, s, d);
    let mut x = pixel_shuffle(&padded, pw, ph, s, d);
    if let Some(w) = &h.norm_w {
        layer_norm_rows(&mut x, w, None, INPUT_NORM_EPS);
    }
    if let Some(b) = &h.norm_b {
        add_bias(&mut x, b);
    }
    let n = x.len() / h.mm1.cols;
    let mut hidden = product(&h.mm1, &x, n, threads);
    add_bias(&mut hidden, &h.mm1_b);
    gelu_inplace(&mut hidden);
    let mut out = product(&h.mm2, &hidden, n, threads);
    add_bias(&mut out, &h.mm2_b);
    out
}

/// ggml_pad of the patch grid to whole s × s blocks: zero rows after each grid row and zero
/// grid rows after the last (build_patch_merge_permute). Returns the grid and its new sides.
fn pad_to_blocks(x: Vec<f32>, width: usize, height: usize, s: usize, d: usize) -> (Vec<f32>, usize, usize) {
    let (pw, ph) = (width.next_multiple_of(s), height.next_multiple_of(s));
    if (pw, ph) == (width, height) {
        return (x, width, height);
    }
    let mut out = vec![0.0; pw * ph * d];
    for (y, row) in x.chunks_exact(width * d).enumerate() {
        out[y * pw * d..][..width * d].copy_from_slice(row);
    }
    (out, pw, ph)
}

#[cfg(test)]
mod tests {
    use super::{pad_to_blocks, resize_antialiased};

    #[test]
    fn resize_to_the_same_grid_keeps_the_values() {
        let src: Vec<f32> = (0..4 * 3 * 2).map(|i| i as f32 * 0.37 - 1.0).collect();
        assert_eq!(resize_antialiased(&src, 2, 4, 3, 4, 3), src);
    }

    /// Upscaling a line 2 -> 4 (scale 2, support 1): the outputs' centres 0.25, 0.75, 1.25,
    /// 1.75 take the source points whose triangle reaches them, normalized by the weights
    /// taken (the edges see one point: 0.75 of point 0, then 0.75/0.25, 0.25/0.75, 0.75 of point 1).
    #[test]
    fn upscaling_weighs_the_neighbours() {
        let out = resize_antialiased(&[0.0, 4.0], 1, 2, 1, 4, 1);
        assert_eq!(out, vec![0.0, 1.0, 3.0, 4.0]);
    }

    /// Downscaling 4 -> 2 (support 2): each output averages its block with the triangle's weights.
    #[test]
    fn downscaling_averages() {
        let out = resize_antialiased(&[1.0, 2.0, 3.0, 4.0], 1, 4, 1, 2, 1);
        // centre 1.0 (pixel units): taps 0..3 at offsets -0.5, 0.5, 1.5 -> weights 0.75, 0.75, 0.25
        let first = (1.0 * 0.75 + 2.0 * 0.75 + 3.0 * 0.25) / 1.75;
        let second = (2.0 * 0.25 + 3.0 * 0.75 + 4.0 * 0.75) / 1.75;
        assert_eq!(out, vec![first, second]);
    }

    #[test]
    fn padding_adds_zero_patches_after_rows_and_below() {
        let x: Vec<f32> = (1..=6).map(|v| v as f32).collect(); // 3 x 2 patches of 1 channel
        let (p, w, h) = pad_to_blocks(x, 3, 2, 2, 1);
        assert_eq!((w, h), (4, 2));
        assert_eq!(p, vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]);
    }
}
