//! Gemma 4's projector (clip.cpp's PROJECTOR_TYPE_GEMMA4V, graph models/gemma4v.cpp): pixels
//! mapped to [-1, 1], patches embedded by a bias-free convolution, plus a learned row of an x
//! table and of a y table for each patch's column and row; blocks of RMS norms with per-head
//! Q/K norms, a 2-D NEOX RoPE (the first half of each head by column, the second by row,
//! theta 100), values RMS-normed, unscaled attention, post-attention and post-FFN norms, a
//! gated FFN and a per-block output scale; then the patches average-pooled n_merge ×
//! n_merge, scaled by sqrt(n_embd), optionally standardized, RMS-normed and projected.
//!
//! Every product goes through Gemma4ClippableLinear (`build_mm`): its input and output are
//! clamped to the matrix's `input_min/max` and `output_min/max` scalars (±FLT_MAX without).
//! Images take any size of whole n_merge × n_merge blocks of patches (the preprocessing's
//! smart resize), up to the position tables' length per side.

use ferrollama_tensor::{full_attention_scaled, GgmlType, QMatrix, Threads};

use super::gemma3::avg_pool;
use super::params::{FfnAct, VisionParams};
use super::product;
use super::vit::{im2col, on_rows, patch_kernel};
use crate::error::{EngineError, Result};
use crate::ops::{
    add_bias, add_inplace, geglu, gelu_quick_inplace, rms_norm_inplace, rms_norm_plain_inplace, scale_inplace, swiglu,
    RopeParams,
};
use crate::weights::Loader;

/// clip.cpp's hparams.rope_theta for Gemma 4's vision RoPE.
const ROPE_THETA: f32 = 100.0;

/// A matrix with Gemma4ClippableLinear's clamps of its input and output (min, max).
struct Linear {
    w: QMatrix,
    b: Option<Vec<f32>>,
    input: (f32, f32),
    output: (f32, f32),
}

impl Linear {
    fn load(ld: &Loader, prefix: &str, cols: usize, rows: usize) -> Result<Linear> {
        let scalar = |what: &str, default: f32| Ok::<f32, EngineError>(ld.opt_vector(&format!("{prefix}.{what}"), 1)?.map_or(default, |v| v[0]));
        Ok(Linear {
            w: ld.matrix(&format!("{prefix}.weight"), cols, rows)?,
            b: ld.opt_vector(&format!("{prefix}.bias"), rows)?,
            input: (scalar("input_min", -f32::MAX)?, scalar("input_max", f32::MAX)?),
            output: (scalar("output_min", -f32::MAX)?, scalar("output_max", f32::MAX)?),
        })
    }

    /// clamp(W · clamp(x)) (+ b) for n rows of x, as build_mm then ggml_add.
    fn apply(&self, x: &[f32], n: usize, threads: &Threads) -> Vec<f32> {
        let clamped: Vec<f32> = x.iter().map(|&v| clamp(v, self.input)).collect();
        let mut out = product(&self.w, &clamped, n, threads);
        let b = self.b.as_deref();
        on_rows(&mut out, self.w.rows, threads, |_, rows| {
            rows.iter_mut().for_each(|v| *v = clamp(*v, self.output));
            if let Some(b) = b {
                add_bias(rows, b);
            }
        });
        out
    }
}

/// ggml_clamp: MAX(MIN(x, max), min).
fn clamp(x: f32, (min, max): (f32, f32)) -> f32 {
    let v = if x < max { x } else { max };
    if v > min { v } else { min }
}

struct Layer {
    ln1: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Per head (head_dim values) or over the whole row (n_embd), as build_vit tells them apart.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    attn_post_norm: Option<Vec<f32>>,
    ln2: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
    ffn_post_norm: Option<Vec<f32>>,
    /// The block output's scale (`out_scale`, Gemma 4's layer_scalar): one value or n_embd.
    out_scale: Option<Vec<f32>>,
}

pub struct Gemma4vEncoder {
    patch: QMatrix,
    /// Rows of n_embd per column index (x) and per row index (y) of a patch.
    pos_x: Vec<f32>,
    pos_y: Vec<f32>,
    /// Rows in each position table: the most patches a side may have.
    pos_size: usize,
    layers: Vec<Layer>,
    /// `v.std_bias` and `v.std_scale`: (x - bias) * scale after the pooling.
    standardize: Option<(Vec<f32>, Vec<f32>)>,
    proj: Linear,
}

impl Gemma4vEncoder {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<Gemma4vEncoder> {
        let (d, ps, hd) = (p.n_embd, p.patch_size, p.head_dim());
        if hd % 4 != 0 {
            return Err(EngineError::Unsupported(format!("a gemma4v head size of {hd}: its 2-D RoPE rotates two halves of pairs")));
        }
        let patch = patch_kernel(ld.row_blocks("v.patch_embd.weight", &[ps, ps, 3, d], 3 * ps * ps, &[d])?.pop().expect("one block"))?;
        const POS: &str = "v.position_embd.weight";
        let pos_size = match ld.shape(POS).as_deref() {
            Some([w, n, 2]) if *w == d && *n > 0 => *n,
            Some(s) => return Err(ld.error(format!("tensor '{POS}' has shape {s:?}, expected [{d}, positions, 2]"))),
            None => return Err(ld.error(format!("missing tensor '{POS}'"))),
        };
        let mut tables = ld.row_blocks(POS, &[d, pos_size, 2], d, &[pos_size, pos_size])?.into_iter().map(|m| super::dequantized(&m));
        let (pos_x, pos_y) = (tables.next().expect("x table"), tables.next().expect("y table"));
        let layers = (0..p.n_layer).map(|il| load_layer(ld, p, il)).collect::<Result<_>>()?;
        let standardize = match (ld.opt_vector("v.std_bias", d)?, ld.opt_vector("v.std_scale", d)?) {
            (Some(b), Some(s)) => Some((b, s)),
            (None, None) => None,
            // clip.cpp skips the step unless the file has both
            _ => return Err(EngineError::Unsupported("a gemma4v projector with only one of v.std_bias and v.std_scale".into())),
        };
        let rows = ld.shape("mm.input_projection.weight").and_then(|s| s.get(1).copied()).unwrap_or(0);
        let proj = Linear::load(ld, "mm.input_projection", d, rows)?;
        Ok(Gemma4vEncoder { patch, pos_x, pos_y, pos_size, layers, standardize, proj })
    }

    /// The width of the output rows (clip_n_mmproj_embd: mm.input_projection's rows).
    pub fn n_embd_out(&self) -> usize { self.proj.w.rows }

    /// The most patches a side of an image may have (the position tables' rows).
    pub fn max_patches_per_side(&self) -> usize { self.pos_size }
}

fn load_layer(ld: &Loader, p: &VisionParams, il: usize) -> Result<Layer> {
    let (d, ff, hd) = (p.n_embd, p.n_ff, p.head_dim());
    let name = |part: &str| format!("v.blk.{il}.{part}");
    let linear = |part: &str, cols: usize, rows: usize| Linear::load(ld, &name(part), cols, rows);
    let norm = |part: &str| ld.vector(&name(&format!("{part}.weight")), d);
    let opt_norm = |part: &str| ld.opt_vector(&name(&format!("{part}.weight")), d);
    let qk_norm = |part: &str| {
        let weight = name(&format!("{part}.weight"));
        match ld.shape(&weight).and_then(|s| s.first().copied()) {
            Some(n) if n == hd => ld.vector(&weight, hd).map(Some),
            Some(_) => ld.vector(&weight, d).map(Some),
            None => Ok(None),
        }
    };
    if !ld.has(&name("ffn_gate.weight")) {
        return Err(EngineError::Unsupported(format!("a gemma4v block ({il}) without a gated FFN")));
    }
    let out_scale = match ld.shape(&name("out_scale.weight")).and_then(|s| s.first().copied()) {
        Some(1) => Some(ld.vector(&name("out_scale.weight"), 1)?),
        Some(_) => Some(ld.vector(&name("out_scale.weight"), d)?),
        None => None,
    };
    Ok(Layer {
        ln1: norm("ln1")?,
        q: linear("attn_q", d, d)?,
        k: linear("attn_k", d, d)?,
        v: linear("attn_v", d, d)?,
        o: linear("attn_out", d, d)?,
        q_norm: qk_norm("attn_q_norm")?,
        k_norm: qk_norm("attn_k_norm")?,
        attn_post_norm: opt_norm("attn_post_norm")?,
        ln2: norm("ln2")?,
        gate: linear("ffn_gate", d, ff)?,
        up: linear("ffn_up", d, ff)?,
        down: linear("ffn_down", ff, d)?,
        ffn_post_norm: opt_norm("ffn_post_norm")?,
        out_scale,
    })
}

/// An image's embeddings: `pixels` ny rows of nx normalized RGB triples, whole n_merge ×
/// n_merge blocks of patches (checked by the caller); (nx / ps / n_merge) × (ny / ps /
/// n_merge) rows of the text model's width.
pub fn encode(e: &Gemma4vEncoder, p: &VisionParams, pixels: &[f32], nx: usize, ny: usize, threads: &Threads) -> Vec<f32> {
    let (d, ps) = (p.n_embd, p.patch_size);
    let (px, py) = (nx / ps, ny / ps);
    let n = px * py;
    // patches * 2 - 1 (ggml_scale_bias: exact in f32 up to the one rounding of the add)
    let scaled: Vec<f32> = pixels.iter().map(|&v| v * 2.0 - 1.0).collect();
    let cols = im2col(&scaled, nx, ny, ps, e.patch.ty == GgmlType::F16);
    let mut x = product(&e.patch, &cols, n, threads);
    on_rows(&mut x, d, threads, |at, rows| {
        for (j, row) in rows.chunks_exact_mut(d).enumerate() {
            let patch = at / d + j;
            add_inplace(row, &e.pos_x[(patch % px) * d..][..d]);
            add_inplace(row, &e.pos_y[(patch / px) * d..][..d]);
        }
    });
    let rope = Rope2d::new(p.head_dim(), px, py);
    for l in &e.layers {
        block(l, p, &rope, &mut x, n, threads);
    }
    let k = p.n_merge;
    let mut pooled = avg_pool(&x, px, py, k, d);
    let rows = pooled.len() / d;
    scale_inplace(&mut pooled, (d as f32).sqrt());
    if let Some((bias, scale)) = &e.standardize {
        for row in pooled.chunks_exact_mut(d) {
            row.iter_mut().zip(bias).zip(scale).for_each(|((v, &b), &s)| *v = (*v - b) * s);
        }
    }
    rms_norm_plain_inplace(&mut pooled, d, p.eps);
    e.proj.apply(&pooled, rows, threads)
}

/// The cos/sin caches of the 2-D RoPE: per column index and per row index, the n_dims / 2
/// pairs of a rotation of n_dims = head_dim / 2 dimensions (NEOX order).
struct Rope2d {
    by_col: Vec<Vec<f32>>,
    by_row: Vec<Vec<f32>>,
}

impl Rope2d {
    fn new(hd: usize, px: usize, py: usize) -> Rope2d {
        let params = RopeParams {
            n_dims: hd / 2,
            neox: true,
            freq_base: ROPE_THETA,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
            n_ctx_orig: 0,
        };
        let cache = |pos: usize| {
            let mut c = vec![0f32; hd / 2];
            params.fill_cache(pos as f32, None, &mut c);
            c
        };
        Rope2d { by_col: (0..px).map(cache).collect(), by_row: (0..py).map(cache).collect() }
    }

    /// Rotates each head of each token's row (of n_head × hd): the first half of a head by the
    /// patch's column, the second half by its row (patch i is at column i % px, row i / px).
    fn apply(&self, x: &mut [f32], d: usize, hd: usize, threads: &Threads) {
        let px = self.by_col.len();
        on_rows(x, d, threads, |at, rows| {
            for (j, row) in rows.chunks_exact_mut(d).enumerate() {
                let patch = at / d + j;
                for head in row.chunks_exact_mut(hd) {
                    let (first, second) = head.split_at_mut(hd / 2);
                    rotate_neox(first, &self.by_col[patch % px]);
                    rotate_neox(second, &self.by_row[patch / px]);
                }
            }
        });
    }
}

/// ggml's NEOX rotation of x's pairs (i, i + half) by a cache of (cos, sin), as GCC compiles
/// rotate_pairs: each first product fused with the other's (rounded) negation or addend.
fn rotate_neox(x: &mut [f32], cache: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (c, s) = (cache[2 * i], cache[2 * i + 1]);
        let (a, b) = (x[i], x[i + half]);
        x[i] = a.mul_add(c, -(b * s));
        x[i + half] = a.mul_add(s, b * c);
    }
}

/// x = x + post_norm(attn(LN1(x))); x = (x + post_norm(ffn(LN2(x)))) · out_scale, with RMS
/// norms throughout (build_vit with NORM_TYPE_RMS and Gemma 4's extras).
fn block(l: &Layer, p: &VisionParams, rope: &Rope2d, x: &mut [f32], n: usize, threads: &Threads) {
    let (d, hd, eps) = (p.n_embd, p.head_dim(), p.eps);
    let normed = |x: &[f32], w: &[f32]| {
        let mut h = x.to_vec();
        on_rows(&mut h, d, threads, |_, rows| rms_norm_inplace(rows, w, eps));
        h
    };
    let post_norm = |y: &mut Vec<f32>, w: &Option<Vec<f32>>| {
        if let Some(w) = w {
            on_rows(y, d, threads, |_, rows| rms_norm_inplace(rows, w, eps));
        }
    };
    let h = normed(x, &l.ln1);
    let mut q = l.q.apply(&h, n, threads);
    let mut k = l.k.apply(&h, n, threads);
    let mut v = l.v.apply(&h, n, threads);
    for (t, w) in [(&mut q, &l.q_norm), (&mut k, &l.k_norm)] {
        if let Some(w) = w {
            on_rows(t, d, threads, |_, rows| rms_norm_inplace(rows, w, eps));
        }
    }
    rope.apply(&mut q, d, hd, threads);
    rope.apply(&mut k, d, hd, threads);
    on_rows(&mut v, d, threads, |_, rows| rms_norm_plain_inplace(rows, hd, eps));
    let attn = full_attention_scaled(&q, &k, &v, n, p.n_head, hd, 1.0, threads);
    let mut o = l.o.apply(&attn, n, threads);
    post_norm(&mut o, &l.attn_post_norm);
    on_rows(x, d, threads, |at, rows| add_inplace(rows, &o[at..at + rows.len()]));
    let h = normed(x, &l.ln2);
    let mut gate = l.gate.apply(&h, n, threads);
    let up = l.up.apply(&h, n, threads);
    let ff = p.n_ff;
    on_rows(&mut gate, ff, threads, |at, rows| {
        let up = &up[at..at + rows.len()];
        match p.ffn_act {
            FfnAct::Gelu => geglu(rows, up, ff),
            FfnAct::Silu => swiglu(rows, up, ff),
            FfnAct::GeluErf => unreachable!("GELU-erf is an audio encoder's (clip.cpp's Whisper)"),
            FfnAct::GeluQuick => {
                // ggml_vec_geglu_quick_f32: the f16 table's value of the gate times up
                gelu_quick_inplace(rows);
                rows.iter_mut().zip(up).for_each(|(a, &b)| *a *= b);
            }
        }
    });
    let mut down = l.down.apply(&gate, n, threads);
    post_norm(&mut down, &l.ffn_post_norm);
    on_rows(x, d, threads, |at, rows| {
        add_inplace(rows, &down[at..at + rows.len()]);
        match l.out_scale.as_deref() {
            Some([s]) => scale_inplace(rows, *s),
            Some(s) => rows.chunks_exact_mut(d).for_each(|r| r.iter_mut().zip(s).for_each(|(v, &k)| *v *= k)),
            None => {}
        }
    });
}
