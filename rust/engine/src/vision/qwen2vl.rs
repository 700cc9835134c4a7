//! The Qwen VL encoders (clip.cpp's PROJECTOR_TYPE_QWEN2VL, QWEN25VL: graph
//! models/qwen2vl.cpp; QWEN3VL: models/qwen3vl.cpp, whose own parts are in `qwen3vl.rs`).
//!
//! The patches are embedded by Conv3D over two frames, which llama.cpp runs on a still image
//! as two conv2d kernels over the same pixels, added. The patches are then reordered so that
//! each 2 × 2 block of them is four consecutive rows (the merger's units), and stay in that
//! order: the blocks' 2-D rotary positions (ggml_rope_multi's vision mode: the first half of a
//! head's pairs rotate by the patch's row, the second half by its column) follow them.
//! Qwen2.5-VL attends within windows of 112 pixels except in every n_wa_pattern-th block: the
//! units are permuted so that each window is a contiguous range, and the merged rows are put
//! back in the image's order at the end (clip.cpp's inv_window_idx and window_idx).
//! Numerics as in `vit.rs` (f16 im2col, f16 activations into F16 products, GELU tables, flash
//! attention with K and V in f16; the window mask's masked keys add nothing to a row's sums).

use ferrollama_tensor::{full_attention, GgmlType, QMatrix, Threads};

use super::params::{FfnAct, ProjectorType, VisionParams, QWEN_WINDOW};
use super::qwen3vl::{self, Deepstack};
use super::vit::{add_rows, im2col, linear, on_rows, patch_kernel};
use super::{product, Projector};
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, add_inplace, gelu_inplace, gelu_quick_inplace, layer_norm_rows, rms_norm_inplace, swiglu};
use crate::weights::Loader;

/// Patches per side of a merger unit (clip.cpp's graphs merge 2 × 2 whatever n_merge says).
const MERGE: usize = 2;
/// Rows of a merger unit.
const UNIT: usize = MERGE * MERGE;

/// A norm as clip.cpp's build_norm runs it: LayerNorm (Qwen2-VL, Qwen3-VL) or RMSNorm
/// (Qwen2.5-VL), times the weight, plus the bias where there is one.
pub(super) struct Norm {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    rms: bool,
}

impl Norm {
    pub(super) fn load(ld: &Loader, prefix: &str, n: usize, rms: bool) -> Result<Norm> {
        Ok(Norm { w: ld.vector(&format!("{prefix}.weight"), n)?, b: ld.opt_vector(&format!("{prefix}.bias"), n)?, rms })
    }

    fn opt_load(ld: &Loader, prefix: &str, n: usize, rms: bool) -> Result<Option<Norm>> {
        match ld.has(&format!("{prefix}.weight")) {
            true => Ok(Some(Norm::load(ld, prefix, n, rms)?)),
            false => Ok(None),
        }
    }

    /// The norm of each row (of the weight's length) of x, on the threads.
    pub(super) fn apply(&self, x: &mut [f32], eps: f32, threads: &Threads) {
        on_rows(x, self.w.len(), threads, |_, rows| match self.rms {
            true => {
                rms_norm_inplace(rows, &self.w, eps);
                if let Some(b) = &self.b {
                    add_bias(rows, b);
                }
            }
            false => layer_norm_rows(rows, &self.w, self.b.as_deref(), eps),
        });
    }
}

/// A product and its optional bias.
pub(super) struct Linear {
    w: QMatrix,
    b: Option<Vec<f32>>,
}

impl Linear {
    pub(super) fn load(ld: &Loader, prefix: &str, cols: usize, rows: usize) -> Result<Linear> {
        Ok(Linear { w: ld.matrix(&format!("{prefix}.weight"), cols, rows)?, b: ld.opt_vector(&format!("{prefix}.bias"), rows)? })
    }

    /// A layer whose rows the file gives (the first dimension is `cols`).
    pub(super) fn load_sized(ld: &Loader, prefix: &str, cols: usize) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let rows = ld.shape(&name).and_then(|s| s.get(1).copied()).ok_or_else(|| ld.error(format!("missing tensor '{name}'")))?;
        Linear::load(ld, prefix, cols, rows)
    }

    pub(super) fn from_parts(w: QMatrix, b: Option<Vec<f32>>) -> Linear { Linear { w, b } }

    pub(super) fn rows(&self) -> usize { self.w.rows }

    pub(super) fn apply(&self, x: &[f32], n: usize, threads: &Threads) -> Vec<f32> { linear(&self.w, self.b.as_deref(), x, n, threads) }
}

struct Layer {
    ln1: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: Norm,
    up: Linear,
    /// Qwen2.5-VL's gate (SwiGLU: silu(gate) · up).
    gate: Option<Linear>,
    down: Linear,
}

pub struct QwenVlWeights {
    /// The Conv3D's two frames' kernels (v.patch_embd.weight and .weight.1) as vit.rs's
    /// patch matrices.
    patch: [QMatrix; 2],
    patch_b: Option<Vec<f32>>,
    /// Qwen3-VL's learned positions: a square of side × side rows of n_embd.
    pos: Option<(Vec<f32>, usize)>,
    pre_ln: Option<Norm>,
    layers: Vec<Layer>,
    /// Qwen3-VL's deepstack mergers, by block.
    deepstack: Vec<(usize, Deepstack)>,
    post_ln: Option<Norm>,
    /// The merger: mm.0 (4 n_embd in), GELU, mm.2 (to the text model's width).
    mm0: Linear,
    mm2: Linear,
}

impl QwenVlWeights {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<QwenVlWeights> {
        let (d, ps) = (p.n_embd, p.patch_size);
        let qwen3 = p.projector == ProjectorType::Qwen3Vl;
        let rms = p.projector == ProjectorType::Qwen25Vl;
        if p.head_dim() % 4 != 0 || ps * MERGE > QWEN_WINDOW {
            return Err(EngineError::Unsupported(format!(
                "a Qwen VL encoder with heads of {} (2-D rotary positions take multiples of 4) and patches of {ps}", p.head_dim())));
        }
        let kernel = |name: &str| -> Result<QMatrix> {
            patch_kernel(ld.row_blocks(name, &[ps, ps, 3, d], 3 * ps * ps, &[d])?.pop().expect("one block"))
        };
        let patch = [kernel("v.patch_embd.weight")?, kernel("v.patch_embd.weight.1")?];
        if patch[0].ty != patch[1].ty {
            return Err(ld.error("the two patch embedding kernels have different types"));
        }
        // clip.cpp asserts Qwen2(.5)-VL files have no patch bias and Qwen3-VL's have one
        let patch_b = ld.opt_vector("v.patch_embd.bias", d)?;
        if patch_b.is_some() != qwen3 {
            return Err(ld.error(format!("a {} projector {} v.patch_embd.bias", p.projector.name(), if qwen3 { "needs" } else { "has" })));
        }
        let pos = match qwen3 {
            true => Some(qwen3vl::load_positions(ld, d)?),
            false => None,
        };
        let layers = (0..p.n_layer).map(|il| load_layer(ld, p, il, rms)).collect::<Result<Vec<_>>>()?;
        let deepstack = match qwen3 {
            true => qwen3vl::load_deepstack(ld, p)?,
            false => Vec::new(),
        };
        let mm0 = Linear::load_sized(ld, "mm.0", UNIT * d)?;
        let mm2 = Linear::load_sized(ld, "mm.2", mm0.rows())?;
        Ok(QwenVlWeights {
            patch,
            patch_b,
            pos,
            pre_ln: Norm::opt_load(ld, "v.pre_ln", d, rms)?,
            layers,
            deepstack,
            post_ln: Norm::opt_load(ld, "v.post_ln", d, rms)?,
            mm0,
            mm2,
        })
    }

    /// The width of the output rows: the merger's, and one more per deepstack merger
    /// (clip_n_mmproj_embd).
    pub fn n_embd_out(&self) -> usize { self.mm2.rows() * (1 + self.deepstack.len()) }
}

fn load_layer(ld: &Loader, p: &VisionParams, il: usize, rms: bool) -> Result<Layer> {
    let d = p.n_embd;
    let name = |part: &str| format!("v.blk.{il}.{part}");
    let (q, k, v) = match p.projector {
        ProjectorType::Qwen3Vl => qwen3vl::load_qkv(ld, &name("attn_qkv"), d)?,
        _ => (Linear::load(ld, &name("attn_q"), d, d)?, Linear::load(ld, &name("attn_k"), d, d)?, Linear::load(ld, &name("attn_v"), d, d)?),
    };
    if q.b.is_none() || k.b.is_none() || v.b.is_none() {
        return Err(ld.error(format!("vision block {il} has no Q, K or V bias (the Qwen VL graphs add them)")));
    }
    // The feed-forward width is the tensors' (Qwen2-VL files state the merger's as
    // feed_forward_length). Old conversions swap up and down as for llava (clip.cpp's
    // is_ffn_swapped, Qwen2(.5)-VL only).
    let swapped = p.projector != ProjectorType::Qwen3Vl && ld.shape(&name("ffn_down.weight")).is_some_and(|s| s.first() == Some(&d));
    let (up, down) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
    let up = Linear::load_sized(ld, &name(up), d)?;
    let gate = match ld.has(&name("ffn_gate.weight")) {
        true => Some(Linear::load(ld, &name("ffn_gate"), d, up.rows())?),
        false => None,
    };
    if gate.is_some() != (p.ffn_act == FfnAct::Silu) {
        return Err(EngineError::Unsupported(format!(
            "vision block {il}: {} FFN with {:?} (the Qwen VL encoders gate SiLU only)", if gate.is_some() { "a gated" } else { "an ungated" }, p.ffn_act)));
    }
    Ok(Layer {
        ln1: Norm::load(ld, &name("ln1"), d, rms)?,
        q,
        k,
        v,
        o: Linear::load(ld, &name("attn_out"), d, d)?,
        ln2: Norm::load(ld, &name("ln2"), d, rms)?,
        down: Linear::load(ld, &name(down), up.rows(), d)?,
        up,
        gate,
    })
}

/// Output rows of an image of nx × ny pixels: one per 2 × 2 block of patches.
pub fn n_tokens(p: &VisionParams, nx: usize, ny: usize) -> usize { (nx / p.patch_size / MERGE) * (ny / p.patch_size / MERGE) }

/// The image's embeddings: n_tokens rows of `Projector::params.n_embd_out`.
pub fn encode(w: &QwenVlWeights, p: &VisionParams, pixels: &[f32], nx: usize, ny: usize, threads: &Threads) -> Vec<f32> {
    let (d, ps) = (p.n_embd, p.patch_size);
    let (px, py) = (nx / ps, ny / ps);
    let order = merge_order(px, py);
    let mut x = gathered(&patch_embeddings(w, pixels, nx, ny, ps, threads), &order, d);
    if let Some(b) = &w.patch_b {
        on_rows(&mut x, d, threads, |_, rows| add_bias(rows, b));
    }
    if let Some((pos, side)) = &w.pos {
        add_inplace(&mut x, &gathered(&qwen3vl::resized_positions(pos, *side, d, px, py), &order, d));
    }
    if let Some(norm) = &w.pre_ln {
        norm.apply(&mut x, p.eps, threads);
    }
    let mut positions: Vec<[usize; 2]> = order.iter().map(|&i| [i / px, i % px]).collect();
    let windows = match p.n_wa_pattern {
        0 => None,
        _ => Some(Windows::new(px / MERGE, py / MERGE, QWEN_WINDOW / ps / MERGE)),
    };
    if let Some(win) = &windows {
        x = gathered(&x, &win.inv_idx, UNIT * d);
        positions = win.inv_idx.iter().flat_map(|&u| positions[u * UNIT..(u + 1) * UNIT].to_vec()).collect();
    }
    let rope = RopeTable::new(&positions, p.head_dim());
    let n = positions.len();
    let mut deepstack = Vec::new();
    for (il, l) in w.layers.iter().enumerate() {
        let full = p.n_wa_pattern == 0 || (il + 1) % p.n_wa_pattern == 0;
        block(l, p, &mut x, n, &rope, if full { None } else { windows.as_ref() }, threads);
        if let Some((_, ds)) = w.deepstack.iter().find(|(at, _)| *at == il) {
            deepstack.push(ds.features(&x, n / UNIT, p.eps, threads));
        }
    }
    if let Some(norm) = &w.post_ln {
        norm.apply(&mut x, p.eps, threads);
    }
    let mut h = w.mm0.apply(&x, n / UNIT, threads);
    on_rows(&mut h, w.mm0.rows(), threads, |_, rows| gelu_inplace(rows));
    let mut out = w.mm2.apply(&h, n / UNIT, threads);
    if let Some(win) = &windows {
        out = gathered(&out, &win.idx, w.mm2.rows());
    }
    match deepstack.is_empty() {
        true => out,
        false => qwen3vl::concat_features(&out, &deepstack, n / UNIT),
    }
}

/// The two conv2d kernels over the image (the Conv3D's two frames, the still image in both),
/// added: rows of n_embd per patch, row-major.
fn patch_embeddings(w: &QwenVlWeights, pixels: &[f32], nx: usize, ny: usize, ps: usize, threads: &Threads) -> Vec<f32> {
    let n_patches = (nx / ps) * (ny / ps);
    let cols = im2col(pixels, nx, ny, ps, w.patch[0].ty == GgmlType::F16);
    let mut x = product(&w.patch[0], &cols, n_patches, threads);
    let second = product(&w.patch[1], &cols, n_patches, threads);
    add_rows(&mut x, &second, w.patch[0].rows, threads);
    x
}

/// The patches (row-major indices) in merger order: 2 × 2 blocks row by row, each block's
/// patches row by row (the graph's permute of the conv output).
fn merge_order(px: usize, py: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(px * py);
    for by in (0..py).step_by(MERGE) {
        for bx in (0..px).step_by(MERGE) {
            for dy in 0..MERGE {
                order.extend((0..MERGE).map(|dx| (by + dy) * px + bx + dx));
            }
        }
    }
    order
}

/// Rows `order[0]`, `order[1]`, ... of x (rows of `row` values): ggml_get_rows.
pub(super) fn gathered(x: &[f32], order: &[usize], row: usize) -> Vec<f32> {
    order.iter().flat_map(|&i| &x[i * row..(i + 1) * row]).copied().collect()
}

/// Qwen2.5-VL's windows over the merger units (clip.cpp's window_idx and inv_window_idx):
/// windows of `side` × `side` units, row by row; each window's units row by row.
struct Windows {
    /// For each unit in image order, its place in window order.
    idx: Vec<usize>,
    /// For each place in window order, the unit in image order.
    inv_idx: Vec<usize>,
    /// Each window's range of tokens (4 per unit) in window order.
    ranges: Vec<std::ops::Range<usize>>,
}

impl Windows {
    fn new(pw: usize, ph: usize, side: usize) -> Windows {
        let mut idx = vec![0; pw * ph];
        let mut inv_idx = Vec::with_capacity(pw * ph);
        let mut ranges = Vec::new();
        for y in (0..ph).step_by(side) {
            for x in (0..pw).step_by(side) {
                let start = inv_idx.len();
                for dy in 0..side.min(ph - y) {
                    for dx in 0..side.min(pw - x) {
                        let src = (y + dy) * pw + x + dx;
                        idx[src] = inv_idx.len();
                        inv_idx.push(src);
                    }
                }
                ranges.push(start * UNIT..inv_idx.len() * UNIT);
            }
        }
        Windows { idx, inv_idx, ranges }
    }
}

/// cos and sin of each token's rotation angles (ggml_mrope_cache_init in vision mode with
/// sections of hd/4: the first hd/4 pairs turn by the patch's row, the next hd/4 by its
/// column, each angle the position times 10000^(-4/hd) to the pair's index, by repeated f32
/// multiplication as ggml does).
struct RopeTable {
    /// Per token, hd/2 (cos, sin) pairs.
    cs: Vec<[f32; 2]>,
    half: usize,
}

impl RopeTable {
    fn new(positions: &[[usize; 2]], hd: usize) -> RopeTable {
        let (half, section) = (hd / 2, hd / 4);
        let theta_scale = 10000f32.powf(-2.0 / half as f32);
        let mut cs = Vec::with_capacity(positions.len() * half);
        for &[y, x] in positions {
            let (mut theta_y, mut theta_x) = (y as f32, x as f32);
            for i in 0..half {
                if i == section {
                    theta_x = x as f32;
                }
                let theta = if i < section { theta_y } else { theta_x };
                cs.push([theta.cos(), theta.sin()]);
                theta_y *= theta_scale;
                theta_x *= theta_scale;
            }
        }
        RopeTable { cs, half }
    }

    /// Rotates each head of each token's row of x: pairs (i, i + hd/2) (rotate_pairs).
    fn apply(&self, x: &mut [f32], n_head: usize, threads: &Threads) {
        let (half, row) = (self.half, n_head * 2 * self.half);
        on_rows(x, row, threads, |at, rows| {
            for (t, r) in rows.chunks_exact_mut(row).enumerate() {
                let cs = &self.cs[(at / row + t) * half..][..half];
                for head in r.chunks_exact_mut(2 * half) {
                    let (a, b) = head.split_at_mut(half);
                    // fused as GCC compiles ggml's rotate_pairs (-ffp-contract=fast on an FMA CPU)
                    for ((x0, x1), &[c, s]) in a.iter_mut().zip(b.iter_mut()).zip(cs) {
                        let (v0, v1) = (*x0, *x1);
                        *x0 = v0.mul_add(c, -(v1 * s));
                        *x1 = v0.mul_add(s, v1 * c);
                    }
                }
            }
        });
    }
}

/// x += attn(norm1(x)); x += ffn(norm2(x)), attention within `windows` where given.
fn block(l: &Layer, p: &VisionParams, x: &mut [f32], n: usize, rope: &RopeTable, windows: Option<&Windows>, threads: &Threads) {
    let d = p.n_embd;
    let normed = |x: &[f32], norm: &Norm| {
        let mut h = x.to_vec();
        norm.apply(&mut h, p.eps, threads);
        h
    };
    let h = normed(x, &l.ln1);
    let (mut q, mut k, v) = (l.q.apply(&h, n, threads), l.k.apply(&h, n, threads), l.v.apply(&h, n, threads));
    rope.apply(&mut q, p.n_head, threads);
    rope.apply(&mut k, p.n_head, threads);
    let attn = match windows {
        None => full_attention(&q, &k, &v, n, p.n_head, p.head_dim(), threads),
        Some(win) => win.ranges.iter().flat_map(|r| {
            let rows = r.start * d..r.end * d;
            full_attention(&q[rows.clone()], &k[rows.clone()], &v[rows], r.len(), p.n_head, p.head_dim(), threads)
        }).collect(),
    };
    add_rows(x, &l.o.apply(&attn, n, threads), d, threads);
    let h = normed(x, &l.ln2);
    let mut u = l.up.apply(&h, n, threads);
    let ff = l.up.rows();
    match &l.gate {
        Some(gate) => {
            let mut g = gate.apply(&h, n, threads);
            on_rows(&mut g, ff, threads, |at, rows| swiglu(rows, &u[at..at + rows.len()], ff));
            u = g;
        }
        None if p.ffn_act == FfnAct::Gelu => on_rows(&mut u, ff, threads, |_, rows| gelu_inplace(rows)),
        None => on_rows(&mut u, ff, threads, |_, rows| gelu_quick_inplace(rows)),
    }
    add_rows(x, &l.down.apply(&u, n, threads), d, threads);
}

impl Projector {
    /// Qwen VL images: any size of whole 2 × 2 blocks of patches (the graphs assert it).
    pub(super) fn check_qwen_image(&self, nx: usize, ny: usize) -> Result<()> {
        let block = self.params.patch_size * MERGE;
        if nx == 0 || ny == 0 || nx % block != 0 || ny % block != 0 {
            return Err(EngineError::InvalidArgument(format!(
                "a {} image of {nx}x{ny} pixels is not whole blocks of {block}x{block} (preprocess first)", self.params.projector.name())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_order_takes_2x2_blocks_row_by_row() {
        assert_eq!(merge_order(4, 2), [0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn windows_are_clip_cpps_including_partial_ones() {
        // 3 x 2 units in windows of 2 x 2: a whole window, then the right column's partial one
        let w = Windows::new(3, 2, 2);
        assert_eq!(w.inv_idx, [0, 1, 3, 4, 2, 5]);
        assert_eq!(w.idx, [0, 1, 4, 2, 3, 5]);
        assert_eq!(w.ranges, [0..16, 16..24]);
        assert!(w.inv_idx.iter().enumerate().all(|(dst, &src)| w.idx[src] == dst));
    }

    #[test]
    fn rope_turns_rows_then_columns() {
        // heads of 8: pairs 0-1 turn by the row (y, y / 100), pairs 2-3 by the column (x, x / 100)
        let t = RopeTable::new(&[[0, 0], [2, 3]], 8);
        assert!(t.cs[..4].iter().all(|&[c, s]| c == 1.0 && s == 0.0));
        assert_eq!(t.cs[4], [2f32.cos(), 2f32.sin()]);
        assert_eq!(t.cs[6], [3f32.cos(), 3f32.sin()]);
        let ts = 10000f32.powf(-0.5);
        assert_eq!(t.cs[7], [(3.0 * ts).cos(), (3.0 * ts).sin()]);
    }
}
