//! The vision transformer of clip.cpp's `build_vit` with LayerNorms (SigLIP, CLIP): patches
//! embedded by a convolution, learned position embeddings, pre-norm blocks of full
//! (non-causal) attention and an FFN, a final LayerNorm. CLIP as llava's graph runs it
//! (models/llava.cpp) adds a class embedding after the patches, a LayerNorm before the blocks,
//! and stops at a feature layer. Pixtral's (models/pixtral.cpp) has RMS norms, no learned
//! positions (a RoPE of its own on the queries and keys, `forward_with`) and a gated SiLU FFN.
//!
//! Numerics follow ggml's CPU backend where it rounds: the convolution runs on an f16 im2col
//! of the pixels against the f16 kernel (ggml_conv_2d), products with f16 weights round
//! their activations to f16 (ggml_mul_mat), GELU is looked up in ggml's f16 table, and
//! attention is flash attention's tiled path, which keeps queries and scores in f32 and
//! rounds K and V to f16 (clip.cpp turns flash attention on where the backend has it).

use ferrollama_tensor::attn::reduce16;
use ferrollama_tensor::{full_attention, GgmlType, QMatrix, SendPtr, Threads};
use half::f16;

use super::params::{FfnAct, ProjectorType, VisionParams};
use super::{dequantized, float_matrix, product};
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, add_inplace, gelu_erf_inplace, gelu_inplace, gelu_quick_inplace, layer_norm_rows, rms_norm_inplace, swiglu};
use crate::weights::Loader;

pub struct VitLayer {
    ln1: (Vec<f32>, Option<Vec<f32>>),
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    bo: Option<Vec<f32>>,
    ln2: (Vec<f32>, Option<Vec<f32>>),
    up: QMatrix,
    up_b: Option<Vec<f32>>,
    /// The gate of a gated FFN (Pixtral's: silu(gate · x) ⊙ up · x).
    gate: Option<(QMatrix, Option<Vec<f32>>)>,
    down: QMatrix,
    down_b: Option<Vec<f32>>,
}

pub struct VitWeights {
    /// The convolution kernel as a matrix: n_embd rows of 3 × patch × patch (channel, row,
    /// column: im2col's order), in the type ggml_conv_2d's product runs it: F16 (the pixels
    /// rounded to F16 too), or F32 for a BF16 kernel (the pixels as they are).
    patch: QMatrix,
    patch_b: Option<Vec<f32>>,
    /// One row of n_embd per patch of a full-size image (then one for the class embedding);
    /// none where the encoder rotates its queries and keys instead (Pixtral).
    pos: Option<Vec<f32>>,
    /// CLIP's class embedding, a row after the patches (ggml_concat(patches, class_embd)).
    class_embd: Option<Vec<f32>>,
    pre_ln: Option<(Vec<f32>, Option<Vec<f32>>)>,
    layers: Vec<VitLayer>,
    post_ln: Option<(Vec<f32>, Option<Vec<f32>>)>,
    /// Every norm's kind: RMS norms (Pixtral's) or LayerNorms.
    rms: bool,
}

impl VitWeights {
    /// The learned position embeddings: a row of n_embd per patch of an image_size image.
    pub fn positions(&self) -> &[f32] { self.pos.as_deref().unwrap_or_default() }

    pub fn load(ld: &Loader, p: &VisionParams) -> Result<VitWeights> {
        let rotary = p.projector == ProjectorType::Pixtral;
        if p.ffn_act == FfnAct::Silu && !rotary {
            return Err(EngineError::Unsupported("a vision encoder with a SiLU FFN (clip.use_silu)".into()));
        }
        let (d, ps) = (p.n_embd, p.patch_size);
        let patch = patch_kernel(ld.row_blocks("v.patch_embd.weight", &[ps, ps, 3, d], 3 * ps * ps, &[d])?.pop().expect("one block"))?;
        let side = p.image_size / ps;
        let class_embd = match p.projector {
            ProjectorType::Mlp => ld.opt_vector("v.class_embd", d)?,
            _ => None,
        };
        let n_pos = match p.projector {
            // SigLIP-NaViT's 70 × 70 table, which MiniCPM-V's buckets index at any slice size
            ProjectorType::Minicpmv => super::minicpmv::POS_BUCKETS * super::minicpmv::POS_BUCKETS,
            _ => side * side + class_embd.is_some() as usize,
        };
        let pos = match rotary {
            // clip.cpp loads a position embedding where the file has one; Pixtral's graph leaves it unused
            true => {
                ld.skip("v.position_embd.weight", false)?;
                None
            }
            false => Some(ld.opt_vector_2d("v.position_embd.weight", d, n_pos)?
                .ok_or_else(|| ld.error("missing tensor 'v.position_embd.weight'"))?),
        };
        let pre_ln = match ld.has("v.pre_ln.weight") {
            true => Some(norm(ld, "v.pre_ln", d)?),
            false => None,
        };
        let layers = (0..p.n_layer).map(|il| load_layer(ld, p, il)).collect::<Result<_>>()?;
        let post_ln = match ld.has("v.post_ln.weight") {
            true => Some(norm(ld, "v.post_ln", d)?),
            false => None,
        };
        if ld.has("v.class_embd") && class_embd.is_none() {
            return Err(EngineError::Unsupported(format!("tensor 'v.class_embd' in a {} projector", p.projector.name())));
        }
        Ok(VitWeights { patch, patch_b: ld.opt_vector("v.patch_embd.bias", d)?, pos, class_embd, pre_ln, layers, post_ln, rms: rotary })
    }
}

/// ggml_conv_2d's operands: an im2col in F16 against the kernel converted to F16 (F32 for
/// a BF16 kernel, whose im2col is F32).
pub(crate) fn patch_kernel(stored: QMatrix) -> Result<QMatrix> {
    let ty = match stored.ty {
        GgmlType::F16 => return Ok(stored),
        GgmlType::BF16 => GgmlType::F32,
        _ => GgmlType::F16,
    };
    float_matrix(ty, stored.rows, stored.cols, &dequantized(&stored))
}

pub(crate) fn norm(ld: &Loader, prefix: &str, d: usize) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
    Ok((ld.vector(&format!("{prefix}.weight"), d)?, ld.opt_vector(&format!("{prefix}.bias"), d)?))
}

fn load_layer(ld: &Loader, p: &VisionParams, il: usize) -> Result<VitLayer> {
    load_layer_at(ld, "v", p.n_embd, p.n_ff, p.ffn_act, p.projector != ProjectorType::Pixtral, il)
}

/// Block `il` of an encoder whose tensors are named `{prefix}.blk.{il}.*` (clip.cpp's "v" for
/// vision, "a" for audio), of width d and FFN width ff, its FFN's activation `ffn_act`;
/// `swappable`: an old conversion's swapped FFN names are read as clip.cpp reads them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_layer_at(ld: &Loader, prefix: &str, d: usize, ff: usize, ffn_act: FfnAct, swappable: bool, il: usize) -> Result<VitLayer> {
    let name = |part: &str, what: &str| format!("{prefix}.blk.{il}.{part}.{what}");
    let mat = |part: &str, cols: usize, rows: usize| ld.matrix(&name(part, "weight"), cols, rows);
    let bias = |part: &str, n: usize| ld.opt_vector(&name(part, "bias"), n);
    // clip.cpp's build_ffn gates with the FFN's activation: SiLU is the one supported (Pixtral's)
    let gated = ld.has(&name("ffn_gate", "weight"));
    if gated != (ffn_act == FfnAct::Silu) || ld.has(&name("attn_qkv", "weight")) {
        return Err(EngineError::Unsupported(format!(
            "vision block {il}: a fused QKV, a gated FFN other than SiLU's, or a SiLU FFN without a gate")));
    }
    // Old conversions (llava's) named CLIP's fc1 ffn_down and fc2 ffn_up: clip.cpp swaps the
    // two (and their biases) where ffn_down takes n_embd inputs, for the projector types of
    // those conversions (not Pixtral's).
    let swapped = swappable && ld.shape(&name("ffn_down", "weight")).is_some_and(|s| s.first() == Some(&d));
    let (up, down) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
    Ok(VitLayer {
        ln1: norm(ld, &format!("{prefix}.blk.{il}.ln1"), d)?,
        wq: mat("attn_q", d, d)?,
        wk: mat("attn_k", d, d)?,
        wv: mat("attn_v", d, d)?,
        wo: mat("attn_out", d, d)?,
        bq: bias("attn_q", d)?,
        bk: bias("attn_k", d)?,
        bv: bias("attn_v", d)?,
        bo: bias("attn_out", d)?,
        ln2: norm(ld, &format!("{prefix}.blk.{il}.ln2"), d)?,
        up: mat(up, d, ff)?,
        up_b: bias(up, ff)?,
        gate: match gated {
            true => Some((mat("ffn_gate", d, ff)?, bias("ffn_gate", ff)?)),
            false => None,
        },
        down: mat(down, ff, d)?,
        down_b: bias(down, d)?,
    })
}

/// The ViT's output for an image of nx × ny pixels (ny rows of nx RGB triples, normalized):
/// one row of n_embd per patch, patches in row-major order, then the class embedding's row
/// where the encoder has one; the output of block `p.n_layer_used` (post-LN'd if the file has it).
pub fn forward(w: &VitWeights, p: &VisionParams, pixels: &[f32], nx: usize, ny: usize, threads: &Threads) -> Vec<f32> {
    forward_with(w, p, pixels, nx, ny, w.pos.as_deref(), None, threads)
}

/// What an encoder does to each block's queries and keys (n tokens of n_head × head_dim)
/// before attention: Pixtral's 2-D RoPE.
pub type QkRotation<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

/// `forward` with position embeddings of the caller's (`pos`: LFM2's, resized to the image's
/// patch grid, one row of n_embd per patch, then the class embedding's; None: none, as
/// Pixtral's) and the queries and keys of every block rotated by `rotate` (Pixtral's 2-D RoPE).
#[allow(clippy::too_many_arguments)]
pub fn forward_with(w: &VitWeights, p: &VisionParams, pixels: &[f32], nx: usize, ny: usize, pos: Option<&[f32]>,
                    rotate: Option<QkRotation>, threads: &Threads) -> Vec<f32> {
    let (d, ps) = (p.n_embd, p.patch_size);
    let n_patches = (nx / ps) * (ny / ps);
    let cols = im2col(pixels, nx, ny, ps, w.patch.ty == GgmlType::F16);
    let mut x = patch_embeddings(&w.patch, &cols, n_patches, threads);
    if let Some(b) = &w.patch_b {
        add_bias(&mut x, b);
    }
    if let Some(cls) = &w.class_embd {
        x.extend_from_slice(cls);
    }
    let n = x.len() / d;
    if let Some(pos) = pos {
        add_inplace(&mut x, &pos[..n * d]);
    }
    if let Some(ln) = &w.pre_ln {
        normalize(w.rms, p.n_embd, p.eps, &mut x, ln, threads);
    }
    for l in &w.layers[..p.n_layer_used] {
        block(l, &BlockShape::of(w, p), &mut x, n, rotate, threads);
    }
    if let Some(ln) = &w.post_ln {
        normalize(w.rms, p.n_embd, p.eps, &mut x, ln, threads);
    }
    x
}

/// x's rows normed in place by the encoder's kind of norm (ggml_norm or ggml_rms_norm, then the
/// weight and the bias if any).
fn normalize(rms: bool, d: usize, eps: f32, x: &mut [f32], (g, b): &(Vec<f32>, Option<Vec<f32>>), threads: &Threads) {
    on_rows(x, d, threads, |_, rows| match rms {
        true => {
            rms_norm_inplace(rows, g, eps);
            if let Some(b) = b {
                add_bias(rows, b);
            }
        }
        false => layer_norm_rows(rows, g, b.as_deref(), eps),
    });
}

/// ggml_conv_2d's product of its im2col (one row per patch) and the kernel: llamafile's
/// tinyBLAS (`product`'s order) takes it where the patches, its first operand's rows, are a
/// multiple of its 4-row tiles; otherwise (an image of an odd number of patches: Pixtral's)
/// ggml's row dot products of each patch with each kernel row, ggml_vec_dot_f16 for the F16
/// operands. (An F32 im2col, a BF16 kernel's, stays in `product`'s order.)
fn patch_embeddings(kernel: &QMatrix, cols: &[f32], n_patches: usize, threads: &Threads) -> Vec<f32> {
    if n_patches % 4 == 0 || kernel.ty != GgmlType::F16 {
        return product(kernel, cols, n_patches, threads);
    }
    let (k, d) = (kernel.cols, kernel.rows);
    let w = dequantized(kernel);
    let mut out = vec![0.0; n_patches * d];
    on_rows(&mut out, d, threads, |at, chunk| {
        for (i, row) in chunk.chunks_exact_mut(d).enumerate() {
            let patch = &cols[(at / d + i) * k..][..k];
            row.iter_mut().zip(w.chunks_exact(k)).for_each(|(v, kernel_row)| *v = vec_dot_f16(patch, kernel_row));
        }
    });
    out
}

/// ggml_vec_dot_f16 on AVX-512 of two rows of f16 values (given as f32): four accumulators of
/// 16 lanes over steps of 64 terms, added (0 + 2) + (1 + 3), the lanes by _mm512_reduce_add_ps;
/// the terms past the last step added in f64.
fn vec_dot_f16(a: &[f32], b: &[f32]) -> f32 {
    let steps = a.len() / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..steps).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                let t = i + 16 * j + l;
                *v = a[t].mul_add(b[t], *v);
            }
        }
    }
    let lanes: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let tail = a[steps..].iter().zip(&b[steps..]).fold(reduce16(&lanes) as f64, |s, (&x, &y)| s + (x * y) as f64);
    tail as f32
}

/// ggml_im2col of a convolution with stride = kernel = `ps`: one row per patch (row-major),
/// of 3 × ps × ps values (channel, kernel row, kernel column), rounded to f16 where
/// ggml_conv_2d makes its im2col in F16.
pub(crate) fn im2col(pixels: &[f32], nx: usize, ny: usize, ps: usize, to_f16: bool) -> Vec<f32> {
    let (px, py) = (nx / ps, ny / ps);
    let mut out = Vec::with_capacity(px * py * 3 * ps * ps);
    for oy in 0..py {
        for ox in 0..px {
            for c in 0..3 {
                for ky in 0..ps {
                    let row = (oy * ps + ky) * nx + ox * ps;
                    out.extend((0..ps).map(|kx| pixels[(row + kx) * 3 + c]).map(|v| if to_f16 { f16_round(v) } else { v }));
                }
            }
        }
    }
    out
}

/// The sizes a block runs with (a vision encoder's, or clip.cpp's audio hparams').
pub(crate) struct BlockShape {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub eps: f32,
    pub ffn_act: FfnAct,
    /// RMS norms (Pixtral's) instead of layer norms.
    pub rms: bool,
}

impl BlockShape {
    fn of(w: &VitWeights, p: &VisionParams) -> BlockShape {
        BlockShape { n_embd: p.n_embd, n_head: p.n_head, n_ff: p.n_ff, eps: p.eps, ffn_act: p.ffn_act, rms: w.rms }
    }
}

/// x += attn(LN1(x)); x += ffn(LN2(x)).
pub(crate) fn block(l: &VitLayer, p: &BlockShape, x: &mut [f32], n: usize, rotate: Option<QkRotation>, threads: &Threads) {
    let d = p.n_embd;
    let norm = |x: &[f32], ln: &(Vec<f32>, Option<Vec<f32>>)| {
        let mut h = x.to_vec();
        normalize(p.rms, d, p.eps, &mut h, ln, threads);
        h
    };
    let project = |w: &QMatrix, b: &Option<Vec<f32>>, input: &[f32]| linear(w, b.as_deref(), input, n, threads);
    let residual = |x: &mut [f32], y: Vec<f32>| add_rows(x, &y, d, threads);
    let h = norm(x, &l.ln1);
    let mut q = project(&l.wq, &l.bq, &h);
    let mut k = project(&l.wk, &l.bk, &h);
    let v = project(&l.wv, &l.bv, &h);
    if let Some(rotate) = rotate {
        rotate(&mut q);
        rotate(&mut k);
    }
    let attn = full_attention(&q, &k, &v, n, p.n_head, d / p.n_head, threads);
    residual(x, project(&l.wo, &l.bo, &attn));
    let h = norm(x, &l.ln2);
    let mut u = project(&l.up, &l.up_b, &h);
    match (&l.gate, p.ffn_act) {
        // ggml_swiglu_split(gate, up): silu(gate) ⊙ up
        (Some((g, g_b)), FfnAct::Silu) => {
            let mut gated = project(g, g_b, &h);
            on_rows(&mut gated, p.n_ff, threads, |at, rows| swiglu(rows, &u[at..at + rows.len()], p.n_ff));
            u = gated;
        }
        (None, FfnAct::Gelu) => on_rows(&mut u, p.n_ff, threads, |_, rows| gelu_inplace(rows)),
        (None, FfnAct::GeluQuick) => on_rows(&mut u, p.n_ff, threads, |_, rows| gelu_quick_inplace(rows)),
        (None, FfnAct::GeluErf) => on_rows(&mut u, p.n_ff, threads, |_, rows| gelu_erf_inplace(rows)),
        _ => unreachable!("refused at load"),
    }
    residual(x, project(&l.down, &l.down_b, &u));
}

/// w · input + b for n rows of input (ggml_mul_mat, then ggml_add of the bias).
pub(super) fn linear(w: &QMatrix, b: Option<&[f32]>, input: &[f32], n: usize, threads: &Threads) -> Vec<f32> {
    let mut out = product(w, input, n, threads);
    if let Some(b) = b {
        on_rows(&mut out, w.rows, threads, |_, rows| add_bias(rows, b));
    }
    out
}

/// x += y, rows of `row` values on the threads (the residuals).
pub(super) fn add_rows(x: &mut [f32], y: &[f32], row: usize, threads: &Threads) {
    on_rows(x, row, threads, |at, rows| add_inplace(rows, &y[at..at + rows.len()]));
}

/// f(offset, chunk) on chunks of whole rows (of `row` values) of x, on the threads: the
/// element-wise passes over thousands of patches.
pub(crate) fn on_rows(x: &mut [f32], row: usize, threads: &Threads, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let chunk = 64 * row;
    let len = x.len();
    let ptr = SendPtr(x.as_mut_ptr());
    threads.run(len.div_ceil(chunk), |c| {
        let at = c * chunk;
        // SAFETY: the chunks are disjoint parts of x.
        f(at, unsafe { std::slice::from_raw_parts_mut(ptr.get().add(at), chunk.min(len - at)) });
    });
}

pub(crate) fn f16_round(x: f32) -> f32 { f16::from_f32(x).to_f32() }

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml_vec_dot_f16's order sums what an f64 sum does, within f32 rounding, for rows with
    /// and without a tail past its 64-term steps.
    #[test]
    fn vec_dot_f16_is_a_dot_product() {
        for n in [48, 192, 200] {
            let a: Vec<f32> = (0..n).map(|i| f16_round(((i * 37 % 101) as f32 - 50.0) / 17.0)).collect();
            let b: Vec<f32> = (0..n).map(|i| f16_round(((i * 53 % 97) as f32 - 48.0) / 13.0)).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert!((vec_dot_f16(&a, &b) as f64 - exact).abs() < 1e-4 * exact.abs().max(1.0), "n {n}");
        }
    }
}
