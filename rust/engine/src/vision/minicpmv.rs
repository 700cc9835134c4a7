//! MiniCPM-V's projector (clip.cpp's PROJECTOR_TYPE_MINICPMV, "resampler"; graph
//! models/minicpmv.cpp): SigLIP at the slice's own size, its learned position embeddings (a
//! 70 × 70 table) picked by bucketing the patch grid onto the table, then a resampler — one
//! block of cross-attention of learned queries over the patches:
//!
//!   v = LN_kv(kv · patches), q = LN_q(query), k = v + 2-D sin-cos positions of the patches,
//!   out = proj · LN_post(attn_out(attention(attn_q q, attn_k k, attn_v v))),
//!
//! heads of 128, one row per query whatever the slice's size. The attention runs as clip.cpp's
//! (flash attention: K and V rounded to f16, `cross_attention`).

use ferrollama_tensor::{cross_attention, QMatrix, Threads};

use super::params::VisionParams;
use super::product;
use crate::error::Result;
use crate::ops::{add_bias, add_inplace, layer_norm_rows};
use crate::weights::Loader;

/// The side of SigLIP-NaViT's position table (980 / 14 patches), which any patch grid is
/// bucketed onto.
pub const POS_BUCKETS: usize = 70;
/// The resampler's head size (clip.cpp's d_head).
const HEAD_DIM: usize = 128;
/// The sin-cos positions' base frequency.
const BASE_FREQ: f32 = 10000.0;

type Norm = (Vec<f32>, Vec<f32>);

pub struct MinicpmvHead {
    /// The learned queries: minicpmv_query_num rows of the resampler's width.
    query: Vec<f32>,
    kv: QMatrix,
    ln_q: Norm,
    ln_kv: Norm,
    ln_post: Norm,
    /// attn.q, attn.k, attn.v, attn.out with their biases.
    attn: [(QMatrix, Vec<f32>); 4],
    proj: QMatrix,
}

impl MinicpmvHead {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<MinicpmvHead> {
        let d = match ld.shape("resampler.proj.weight").as_deref() {
            Some(&[d, ..]) => d,
            _ => return Err(ld.error("missing tensor 'resampler.proj.weight'")),
        };
        // clip.cpp splits the width into heads of 128 and the positions into 4 quarters
        if d % HEAD_DIM != 0 {
            return Err(ld.error(format!("a resampler width of {d} is not whole heads of {HEAD_DIM}")));
        }
        let norm = |which: &str| -> Result<Norm> {
            Ok((ld.vector(&format!("resampler.ln_{which}.weight"), d)?, ld.vector(&format!("resampler.ln_{which}.bias"), d)?))
        };
        let attn = |which: &str| -> Result<(QMatrix, Vec<f32>)> {
            Ok((ld.matrix(&format!("resampler.attn.{which}.weight"), d, d)?, ld.vector(&format!("resampler.attn.{which}.bias"), d)?))
        };
        let n_query = p.minicpmv_query_num;
        let query = ld.opt_vector_2d("resampler.query", d, n_query)?.ok_or_else(|| ld.error("missing tensor 'resampler.query'"))?;
        // clip.cpp loads pos_embed_k (the converter's precomputed 70 × 70 sin-cos table) and
        // computes the positions in the graph instead; a 2.5 conversion's pos_embed it ignores
        ld.skip("resampler.pos_embed_k", true)?;
        ld.skip("resampler.pos_embed", false)?;
        Ok(MinicpmvHead {
            query,
            kv: ld.matrix("resampler.kv.weight", p.n_embd, d)?,
            ln_q: norm("q")?,
            ln_kv: norm("kv")?,
            ln_post: norm("post")?,
            attn: [attn("q")?, attn("k")?, attn("v")?, attn("out")?],
            proj: ld.matrix("resampler.proj.weight", d, d)?,
        })
    }

    /// The width of the output rows (clip_n_mmproj_embd: resampler.proj's).
    pub fn n_embd_out(&self) -> usize { self.proj.rows }
}

/// Output rows of any image or slice: one per query.
pub fn n_tokens(p: &VisionParams) -> usize { p.minicpmv_query_num }

/// The ViT's position embeddings for a grid of `width` × `height` patches: row (y, x) of the
/// 70 × 70 table at (⌊70·y/height⌋, ⌊70·x/width⌋) (clip.cpp's bucket_coords).
pub fn vit_positions(table: &[f32], d: usize, width: usize, height: usize) -> Vec<f32> {
    let bucket = |i: usize, n: usize| (POS_BUCKETS as f64 * i as f64 / n as f64).floor() as usize;
    let mut out = Vec::with_capacity(width * height * d);
    for y in 0..height {
        for x in 0..width {
            let row = bucket(y, height) * POS_BUCKETS + bucket(x, width);
            out.extend_from_slice(&table[row * d..(row + 1) * d]);
        }
    }
    out
}

/// The keys' positions for a grid of `width` × `height` patches: per patch (row-major)
/// sin(ω·x), cos(ω·x), sin(ω·y), cos(ω·y) with ω_i = 1 / 10000^(i / (d/4)), in f32 as
/// ggml's sin and cos (libm's) compute them.
fn sincos_positions(d: usize, width: usize, height: usize) -> Vec<f32> {
    let quarter = d / 4;
    let omega: Vec<f32> = (0..quarter).map(|i| 1.0 / BASE_FREQ.powf(i as f32 / quarter as f32)).collect();
    let mut out = Vec::with_capacity(width * height * d);
    for i in 0..width * height {
        for pos in [(i % width) as f32, (i / width) as f32] {
            out.extend(omega.iter().map(|w| (w * pos).sin()));
            out.extend(omega.iter().map(|w| (w * pos).cos()));
        }
    }
    out
}

/// The resampler over the ViT's output (`hidden`: one row of n_embd per patch of a
/// `width` × `height` grid): minicpmv_query_num rows of the resampler's width.
pub fn project(h: &MinicpmvHead, p: &VisionParams, hidden: Vec<f32>, width: usize, height: usize, threads: &Threads) -> Vec<f32> {
    let (n, nq, d) = (width * height, p.minicpmv_query_num, h.proj.rows);
    let norm = |mut x: Vec<f32>, (w, b): &Norm| {
        layer_norm_rows(&mut x, w, Some(b), p.eps);
        x
    };
    let linear = |(w, b): &(QMatrix, Vec<f32>), x: &[f32], rows: usize| {
        let mut y = product(w, x, rows, threads);
        add_bias(&mut y, b);
        y
    };
    let v = norm(product(&h.kv, &hidden, n, threads), &h.ln_kv);
    let q = norm(h.query.clone(), &h.ln_q);
    let mut k = v.clone();
    add_inplace(&mut k, &sincos_positions(d, width, height));
    let [aq, ak, av, ao] = &h.attn;
    let (q, k, v) = (linear(aq, &q, nq), linear(ak, &k, n), linear(av, &v, n));
    let attended = cross_attention(&q, nq, &k, &v, n, d / HEAD_DIM, HEAD_DIM, threads);
    let out = norm(linear(ao, &attended, nq), &h.ln_post);
    product(&h.proj, &out, nq, threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets: a 70-patch side takes the table's rows one for one; a smaller side spreads
    /// over it (clip.cpp's floor(70·i/n)).
    #[test]
    fn positions_bucket_the_grid_onto_the_table() {
        let table: Vec<f32> = (0..POS_BUCKETS * POS_BUCKETS).map(|r| r as f32).collect();
        assert_eq!(vit_positions(&table, 1, POS_BUCKETS, POS_BUCKETS), table);
        assert_eq!(vit_positions(&table, 1, 3, 2), vec![0.0, 23.0, 46.0, 2450.0, 2473.0, 2496.0]);
    }

    /// The first patch is at (0, 0): sines 0, cosines 1; the second's x is 1.
    #[test]
    fn sincos_positions_are_x_then_y() {
        let pos = sincos_positions(8, 2, 1);
        assert_eq!(&pos[..8], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(&pos[8..12], &[1f32.sin(), 0.01f32.sin(), 1f32.cos(), 0.01f32.cos()]);
    }
}
