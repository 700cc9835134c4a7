//! Qwen3-VL's own parts of the Qwen VL encoder (models/qwen3vl.cpp): the fused QKV, the
//! learned position embeddings resized to the image (ggml_interpolate, bilinear with aligned
//! corners), and deepstack: the output of listed blocks merged 2 × 2 by its own
//! LayerNorm + MLP, its rows appended to the merger's (n_embd_text × (1 + n_deepstack)).

use ferrollama_tensor::Threads;

use super::params::VisionParams;
use super::qwen2vl::{Linear, Norm};
use super::vit::on_rows;
use crate::error::Result;
use crate::ops::gelu_inplace;
use crate::weights::Loader;

/// Rows of a merger unit (2 × 2 patches).
const UNIT: usize = 4;

/// Q, K and V of a fused `attn_qkv` (Q's rows, then K's, then V's; its bias the same).
pub(super) fn load_qkv(ld: &Loader, prefix: &str, d: usize) -> Result<(Linear, Linear, Linear)> {
    let mut blocks = ld.row_blocks(&format!("{prefix}.weight"), &[d, 3 * d], d, &[d, d, d])?.into_iter();
    let bias = ld.opt_vector(&format!("{prefix}.bias"), 3 * d)?;
    let mut part = |i: usize| Linear::from_parts(blocks.next().expect("three blocks"), bias.as_ref().map(|b| b[i * d..(i + 1) * d].to_vec()));
    Ok((part(0), part(1), part(2)))
}

/// v.position_embd.weight: a square of side × side rows of n_embd.
pub(super) fn load_positions(ld: &Loader, d: usize) -> Result<(Vec<f32>, usize)> {
    const NAME: &str = "v.position_embd.weight";
    let n_pos = ld.shape(NAME).and_then(|s| s.get(1).copied()).ok_or_else(|| ld.error(format!("missing tensor '{NAME}'")))?;
    let side = (n_pos as f64).sqrt() as usize;
    if side * side != n_pos {
        return Err(ld.error(format!("{NAME} has {n_pos} positions: not a square")));
    }
    Ok((ld.opt_vector_2d(NAME, d, n_pos)?.expect("present"), side))
}

/// The learned positions for px × py patches, row-major (clip_graph::resize_position_embeddings:
/// the square as it is when it fits, else ggml_interpolate's bilinear with aligned corners,
/// in f32 as ggml's CPU computes it).
pub(super) fn resized_positions(pos: &[f32], side: usize, d: usize, px: usize, py: usize) -> Vec<f32> {
    if px == side && py == side {
        return pos.to_vec();
    }
    // ggml_compute_forward_upscale_f32: the scale is (out - 1) / (in - 1) with aligned corners
    let scale = |out: usize| if out > 1 && side > 1 { (out - 1) as f32 / (side - 1) as f32 } else { out as f32 / side as f32 };
    let taps = |i: usize, sf: f32| {
        let s = i as f32 / sf;
        let i0 = (s.floor() as i64).clamp(0, side as i64 - 1) as usize;
        let i1 = (s.floor() as i64 + 1).clamp(0, side as i64 - 1) as usize;
        (i0, i1, (s - i0 as f32).clamp(0.0, 1.0))
    };
    let (sx, sy) = (scale(px), scale(py));
    let mut out = Vec::with_capacity(px * py * d);
    for oy in 0..py {
        let (y0, y1, dy) = taps(oy, sy);
        for ox in 0..px {
            let (x0, x1, dx) = taps(ox, sx);
            let at = |x: usize, y: usize, e: usize| pos[(y * side + x) * d + e];
            out.extend((0..d).map(|e| {
                at(x0, y0, e) * (1.0 - dx) * (1.0 - dy) + at(x1, y0, e) * dx * (1.0 - dy) + at(x0, y1, e) * (1.0 - dx) * dy
                    + at(x1, y1, e) * dx * dy
            }));
        }
    }
    out
}

/// A deepstack merger (v.deepstack.N.*): LayerNorm over a unit's 4 n_embd, fc1, GELU, fc2.
pub(super) struct Deepstack {
    norm: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// The deepstack mergers by block (clip.cpp takes a block's as present when it has fc1),
/// checked against clip.vision.is_deepstack_layers where the file has it.
pub(super) fn load_deepstack(ld: &Loader, p: &VisionParams) -> Result<Vec<(usize, Deepstack)>> {
    let width = UNIT * p.n_embd;
    let mut mergers = Vec::new();
    for il in 0..p.n_layer {
        let prefix = format!("v.deepstack.{il}");
        let present = ld.has(&format!("{prefix}.fc1.weight"));
        if p.deepstack_layers.get(il).is_some_and(|&flag| flag != present) {
            return Err(ld.error(format!("clip.vision.is_deepstack_layers says block {il} is{} a deepstack layer; its tensors say otherwise",
                                        if present { " not" } else { "" })));
        }
        if present {
            let fc1 = Linear::load_sized(ld, &format!("{prefix}.fc1"), width)?;
            let fc2 = Linear::load_sized(ld, &format!("{prefix}.fc2"), fc1.rows())?;
            mergers.push((il, Deepstack { norm: Norm::load(ld, &format!("{prefix}.norm"), width, false)?, fc1, fc2 }));
        }
    }
    Ok(mergers)
}

impl Deepstack {
    /// The merger over a block's output (n_units units of 4 patches, in merger order).
    pub(super) fn features(&self, x: &[f32], n_units: usize, eps: f32, threads: &Threads) -> Vec<f32> {
        let mut h = x.to_vec();
        self.norm.apply(&mut h, eps, threads);
        let mut hidden = self.fc1.apply(&h, n_units, threads);
        on_rows(&mut hidden, self.fc1.rows(), threads, |_, rows| gelu_inplace(rows));
        self.fc2.apply(&hidden, n_units, threads)
    }
}

/// Each output row: the merger's row, then each deepstack merger's (ggml_concat on dim 0).
pub(super) fn concat_features(main: &[f32], deepstack: &[Vec<f32>], n_rows: usize) -> Vec<f32> {
    let parts: Vec<&[f32]> = std::iter::once(main).chain(deepstack.iter().map(Vec::as_slice)).collect();
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for r in 0..n_rows {
        for part in &parts {
            let w = part.len() / n_rows;
            out.extend_from_slice(&part[r * w..(r + 1) * w]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_the_squares_size_are_kept_and_corners_align() {
        // 2 x 2 positions of width 1: values 0, 1 / 2, 3
        let pos = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(resized_positions(&pos, 2, 1, 2, 2), pos);
        // 3 wide, 2 high: the corners stay, the middle column is halfway
        assert_eq!(resized_positions(&pos, 2, 1, 3, 2), [0.0, 0.5, 1.0, 2.0, 2.5, 3.0]);
    }

    #[test]
    fn deepstack_rows_follow_the_main_row() {
        assert_eq!(concat_features(&[1.0, 2.0], &[vec![3.0, 4.0], vec![5.0, 6.0]], 2), [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    }
}
