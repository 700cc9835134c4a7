//! Idefics3's projector (SmolVLM, SmolVLM2, Idefics3; clip.cpp's `clip_graph_siglip` for
//! PROJECTOR_TYPE_IDEFICS3): the SigLIP output of one tile, a grid of side × side patches,
//! pixel-shuffled (`build_patch_merge_permute`: each n_merge × n_merge block of patches becomes
//! one row of n_merge² × the vision width), then projected to the text model's width by
//! `mm.model.fc` (no bias, no norm).

use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, Threads};

use super::params::VisionParams;
use crate::error::Result;
use crate::weights::Loader;

pub struct Idefics3Head {
    /// `mm.model.fc.weight`: n_embd_out rows of n_merge² × the vision width.
    fc: QMatrix,
}

impl Idefics3Head {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<Idefics3Head> {
        Ok(Idefics3Head { fc: ld.matrix("mm.model.fc.weight", p.n_embd * p.n_merge * p.n_merge, p.n_embd_out)? })
    }
}

/// The ViT's output (`side` × `side` patches, row-major, of the vision width) to the text
/// model's embeddings.
pub fn project(h: &Idefics3Head, p: &VisionParams, vit_out: Vec<f32>, side: usize, threads: &Threads) -> Vec<f32> {
    let merged = pixel_shuffle(&vit_out, side, side, p.n_merge, p.n_embd);
    let n = merged.len() / h.fc.cols;
    let mut out = vec![0.0; n * p.n_embd_out];
    matmul(&h.fc, &merged, n, &mut out, &mut MatmulScratch::default(), threads);
    out
}

/// build_patch_merge_permute's reshapes and permutes on a `width` × `height` grid (both
/// multiples of `s`, checked at load) of rows of d values: one row per s × s block, blocks
/// row-major; a block's row holds its patches row after row (patch (dx, dy) of the block at
/// offset (dy × s + dx) × d).
pub(super) fn pixel_shuffle(x: &[f32], width: usize, height: usize, s: usize, d: usize) -> Vec<f32> {
    let (bw, bh) = (width / s, height / s);
    let mut out = Vec::with_capacity(x.len());
    for by in 0..bh {
        for bx in 0..bw {
            for dy in 0..s {
                let row = (by * s + dy) * width + bx * s;
                out.extend_from_slice(&x[row * d..(row + s) * d]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::pixel_shuffle;

    /// The ggml ops of build_patch_merge_permute, index by index: reshape to
    /// (d·s, w/s, h), permute(0,2,1,3), cont to (d·s², h/s, w/s), permute(0,2,1,3), cont.
    fn ggml_reference(x: &[f32], w: usize, h: usize, s: usize, d: usize) -> Vec<f32> {
        // after the first cont: a' = c + d·(x%s) + d·s·(y%s) at (yb = y/s, xb = x/s), stored
        // with a' fastest, then yb, then xb; the last permute + cont swaps yb and xb
        let (bw, bh) = (w / s, h / s);
        let mut out = vec![f32::NAN; x.len()];
        for y in 0..h {
            for xx in 0..w {
                for c in 0..d {
                    let a = c + d * (xx % s) + d * s * (y % s);
                    let row = (y / s) * bw + xx / s;
                    out[row * d * s * s + a] = x[(y * w + xx) * d + c];
                }
            }
        }
        assert!(bh * bw * d * s * s == out.len());
        out
    }

    #[test]
    fn pixel_shuffle_is_build_patch_merge_permute() {
        for (w, h, s, d) in [(8, 8, 2, 3), (27, 27, 3, 2), (32, 16, 4, 5), (6, 4, 2, 1)] {
            let x: Vec<f32> = (0..w * h * d).map(|i| i as f32).collect();
            assert_eq!(pixel_shuffle(&x, w, h, s, d), ggml_reference(&x, w, h, s, d), "{w}x{h} by {s}");
        }
    }
}
