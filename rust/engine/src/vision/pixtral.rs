//! Pixtral's projector (clip.cpp's `clip_graph_pixtral`, PROJECTOR_TYPE_PIXTRAL: Pixtral 12B,
//! Mistral Small 3.1 / 3.2): a ViT of RMS norms and gated SiLU FFNs whose queries and keys turn
//! by a 2-D RoPE (no learned positions), on images of any size in whole patches; Mistral Small's
//! patch merger (the output RMS-normed by `mm.input_norm`, each n_merge × n_merge block of
//! patches concatenated and projected back to the vision width by `mm.patch_merger`); then
//! mm.1, GELU, mm.2 to the text model's width; and the `[IMG_BREAK]` token's embedding
//! (`v.token_embd.img_break`) after every row of image tokens but the last.

use ferrollama_tensor::{QMatrix, Threads};

use super::params::VisionParams;
use super::vit::{self, on_rows, VitWeights};
use super::product;
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, gelu_inplace, rms_norm_inplace, RopeParams};
use crate::weights::Loader;

/// clip.cpp's rope_theta for Pixtral, whatever the file says (a Mistral-format conversion writes
/// clip.rope.freq_base, which clip.cpp does not read).
const ROPE_THETA: f32 = 10000.0;

pub struct PixtralHead {
    merger: Option<PatchMerger>,
    mm1: QMatrix,
    mm1_b: Option<Vec<f32>>,
    mm2: QMatrix,
    mm2_b: Option<Vec<f32>>,
    /// The text model's embedding of [IMG_BREAK], which ends each row of image tokens but the last.
    img_break: Vec<f32>,
}

/// Mistral Small 3.1's patch merger (transformers' Mistral3PatchMerger).
struct PatchMerger {
    input_norm: Vec<f32>,
    /// n_embd rows of n_merge² × n_embd (channel, block row, block column: ggml_im2col's order).
    w: QMatrix,
}

impl PixtralHead {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<PixtralHead> {
        let d = p.n_embd;
        if p.head_dim() % 4 != 0 {
            return Err(ld.error(format!("Pixtral's 2-D RoPE turns pairs in each half of a head: head size {} is not a multiple of 4",
                                        p.head_dim())));
        }
        let merger = match ld.has("mm.patch_merger.weight") {
            true => Some(PatchMerger {
                input_norm: ld.vector("mm.input_norm.weight", d)?,
                w: ld.matrix("mm.patch_merger.weight", d * p.n_merge * p.n_merge, d)?,
            }),
            false => {
                // loaded by clip.cpp, used by its graph only with the merger
                ld.skip("mm.input_norm.weight", false)?;
                if p.n_merge > 1 {
                    return Err(EngineError::Unsupported(format!(
                        "a pixtral projector with clip.vision.spatial_merge_size {} and no patch merger (mm.patch_merger.weight)",
                        p.n_merge)));
                }
                None
            }
        };
        let rows = |name: &str| ld.shape(name).and_then(|s| s.get(1).copied()).ok_or_else(|| ld.error(format!("missing tensor '{name}'")));
        let (hidden, n_out) = (rows("mm.1.weight")?, rows("mm.2.weight")?);
        Ok(PixtralHead {
            merger,
            mm1: ld.matrix("mm.1.weight", d, hidden)?,
            mm1_b: ld.opt_vector("mm.1.bias", hidden)?,
            mm2: ld.matrix("mm.2.weight", hidden, n_out)?,
            mm2_b: ld.opt_vector("mm.2.bias", n_out)?,
            img_break: ld.vector("v.token_embd.img_break", n_out)?,
        })
    }

    /// The width of the output rows (clip_n_mmproj_embd: mm.2's rows).
    pub fn n_embd_out(&self) -> usize { self.mm2.rows }
}

/// Image tokens per row and rows of an image of nx × ny pixels: its patches merged n_merge × n_merge.
fn token_grid(p: &VisionParams, nx: usize, ny: usize) -> (usize, usize) {
    let side = p.patch_size * p.n_merge;
    (nx / side, ny / side)
}

/// Output rows of an image: its tokens and an [IMG_BREAK] after each row but the last.
pub fn n_tokens(p: &VisionParams, nx: usize, ny: usize) -> usize {
    let (cols, rows) = token_grid(p, nx, ny);
    cols * rows + rows.saturating_sub(1)
}

/// Pixtral takes images of any size in whole merged patches (mtmd's preprocessing aligns them so).
pub fn check_size(p: &VisionParams, nx: usize, ny: usize) -> Result<()> {
    let side = p.patch_size * p.n_merge;
    if nx == 0 || ny == 0 || nx % side != 0 || ny % side != 0 {
        return Err(EngineError::InvalidArgument(format!(
            "the pixtral projector takes images of whole {side}x{side}-pixel blocks (preprocess first), not {nx}x{ny}")));
    }
    Ok(())
}

/// The ViT's output for an image of nx × ny pixels, its queries and keys turned by the 2-D RoPE.
pub fn vit_forward(w: &VitWeights, p: &VisionParams, pixels: &[f32], nx: usize, ny: usize, threads: &Threads) -> Vec<f32> {
    let rope = Rope2d::new(p, nx / p.patch_size, ny / p.patch_size);
    let rotate = |x: &mut [f32]| rope.apply(x, threads);
    vit::forward_with(w, p, pixels, nx, ny, Some(w.positions()).filter(|p| !p.is_empty()), Some(&rotate), threads)
}

/// The ViT's output for an image of nx × ny pixels (its patches row-major) to the text model's embeddings.
pub fn project(h: &PixtralHead, p: &VisionParams, vit_out: Vec<f32>, nx: usize, ny: usize, threads: &Threads) -> Vec<f32> {
    let (cols, rows) = token_grid(p, nx, ny);
    let mut x = vit_out;
    if let Some(m) = &h.merger {
        rms_norm_inplace(&mut x, &m.input_norm, p.eps);
        let blocks = merge_blocks(&x, nx / p.patch_size, p.n_merge, p.n_embd, cols, rows);
        x = product(&m.w, &blocks, cols * rows, threads);
    }
    let n = cols * rows;
    let mut hidden = product(&h.mm1, &x, n, threads);
    if let Some(b) = &h.mm1_b {
        add_bias(&mut hidden, b);
    }
    on_rows(&mut hidden, h.mm1.rows, threads, |_, chunk| gelu_inplace(chunk));
    let mut out = product(&h.mm2, &hidden, n, threads);
    if let Some(b) = &h.mm2_b {
        add_bias(&mut out, b);
    }
    with_row_breaks(&out, cols, &h.img_break)
}

/// ggml_im2col of a grid of rows of `d` values (`side` per grid row), kernel = stride = `m`:
/// one row per block (cols × rows of them, row-major) of its values channel by channel, each
/// channel's m × m row-major (the graph's im2col of the permuted grid, in F32: no rounding).
fn merge_blocks(x: &[f32], side: usize, m: usize, d: usize, cols: usize, rows: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(cols * rows * d * m * m);
    for by in 0..rows {
        for bx in 0..cols {
            for c in 0..d {
                for ky in 0..m {
                    out.extend((0..m).map(|kx| x[((by * m + ky) * side + bx * m + kx) * d + c]));
                }
            }
        }
    }
    out
}

/// The image tokens, `cols` a row, with `img_break` after each row but the last (the graph's
/// concatenation of the break to every row, viewed without the last one).
fn with_row_breaks(tokens: &[f32], cols: usize, img_break: &[f32]) -> Vec<f32> {
    let row = cols * img_break.len();
    let mut out = Vec::with_capacity(tokens.len() + tokens.len() / row.max(1) * img_break.len());
    for (i, r) in tokens.chunks_exact(row).enumerate() {
        if i > 0 {
            out.extend_from_slice(img_break);
        }
        out.extend_from_slice(r);
    }
    out
}

/// ggml's rotate_pairs in normal mode (adjacent pairs) on a cache of cos/sin pairs, as GCC
/// compiles it with FMA (its default contraction of x0·cos - x1·sin into fma(x0, cos, -(x1·sin)),
/// and of x0·sin + x1·cos into fma(x0, sin, x1·cos)).
fn rotate_pairs(x: &mut [f32], cache: &[f32]) {
    for (pair, cs) in x.chunks_exact_mut(2).zip(cache.chunks_exact(2)) {
        let (x0, x1, cos, sin) = (pair[0], pair[1], cs[0], cs[1]);
        pair[0] = x0.mul_add(cos, -(x1 * sin));
        pair[1] = x0.mul_add(sin, x1 * cos);
    }
}

/// Pixtral's 2-D RoPE (clip.cpp's build_rope_2d with interleave_freq): the first half of each
/// head turned by the patch's row, the second half by its column, each as ggml_rope_ext in
/// normal mode over head_dim / 2 dimensions (base 10000), the column's frequencies scaled by
/// base^(-2 / head_dim): a head_dim-wide RoPE's even frequencies for rows, odd ones for columns.
struct Rope2d {
    /// Per patch (row-major), the row's cos/sin pairs then the column's (head_dim / 2 values each).
    caches: Vec<f32>,
    n_head: usize,
    head_dim: usize,
}

impl Rope2d {
    fn new(p: &VisionParams, nx: usize, ny: usize) -> Rope2d {
        let hd = p.head_dim();
        let row = RopeParams {
            n_dims: hd / 2, neox: false, freq_base: ROPE_THETA, freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0,
            beta_fast: 0.0, beta_slow: 0.0, n_ctx_orig: 0,
        };
        let col = RopeParams { freq_scale: ROPE_THETA.powf(-2.0 / hd as f32), ..row };
        let mut caches = vec![0.0; nx * ny * hd];
        for (i, cache) in caches.chunks_exact_mut(hd).enumerate() {
            let (row_cache, col_cache) = cache.split_at_mut(hd / 2);
            row.fill_cache((i / nx) as f32, None, row_cache);
            col.fill_cache((i % nx) as f32, None, col_cache);
        }
        Rope2d { caches, n_head: p.n_head, head_dim: hd }
    }

    /// Turns x, one row of n_head heads per patch, in place.
    fn apply(&self, x: &mut [f32], threads: &Threads) {
        let (hd, width) = (self.head_dim, self.n_head * self.head_dim);
        on_rows(x, width, threads, |at, chunk| {
            for (t, token) in chunk.chunks_exact_mut(width).enumerate() {
                let (row_cache, col_cache) = self.caches[(at / width + t) * hd..][..hd].split_at(hd / 2);
                for head in token.chunks_exact_mut(hd) {
                    let (first, second) = head.split_at_mut(hd / 2);
                    rotate_pairs(first, row_cache);
                    rotate_pairs(second, col_cache);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaks_follow_every_row_but_the_last() {
        // 3 tokens a row, 2 rows, rows of 2 values
        let tokens: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let out = with_row_breaks(&tokens, 3, &[-1.0, -2.0]);
        assert_eq!(out, [0., 1., 2., 3., 4., 5., -1., -2., 6., 7., 8., 9., 10., 11.]);
    }

    #[test]
    fn merged_blocks_are_im2col_rows() {
        // a 4 x 2 grid of patches of 2 channels (value = 10 · patch + channel), merged 2 x 2
        let x: Vec<f32> = (0..8).flat_map(|p| [10.0 * p as f32, 10.0 * p as f32 + 1.0]).collect();
        let out = merge_blocks(&x, 4, 2, 2, 2, 1);
        // block 0: patches 0, 1 (first row) and 4, 5 (second), channel by channel
        assert_eq!(&out[..8], &[0., 10., 40., 50., 1., 11., 41., 51.]);
        assert_eq!(&out[8..], &[20., 30., 60., 70., 21., 31., 61., 71.]);
    }

    #[test]
    fn rotation_turns_pairs_by_their_angle() {
        let cache = [0.6f32, 0.8, 1.0, 0.0];
        let mut x = [1.0f32, 0.0, 2.0, 3.0];
        rotate_pairs(&mut x, &cache);
        assert_eq!(x, [0.6, 0.8, 2.0, 3.0]);
    }
}
