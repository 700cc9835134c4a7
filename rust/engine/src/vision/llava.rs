//! LLaVA 1.5's projector (clip.cpp's `clip_graph_llava` for PROJECTOR_TYPE_MLP): the CLIP
//! output's rows 1..=n_patches go through mm.0, GELU and mm.2 one by one. With a class
//! embedding that drops the first patch and keeps the class row (the graph appends it after
//! the patches but skips row 0 as if it came first): llama.cpp's rows, kept as they are.

use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, Threads};

use super::params::VisionParams;
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, gelu_inplace};
use crate::weights::Loader;

pub struct LlavaHead {
    mm0: QMatrix,
    mm0_b: Vec<f32>,
    mm2: QMatrix,
    mm2_b: Vec<f32>,
}

impl LlavaHead {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<LlavaHead> {
        for name in ["mm.1.weight", "mm.3.weight", "mm.4.weight"] {
            if ld.has(name) {
                return Err(EngineError::Unsupported(format!(
                    "tensor '{name}': a llava projector with a norm between its layers (mlp_norm, Yi-VL) is not supported yet")));
            }
        }
        // LLaVA 1.6's newline embedding (v. as clip.cpp names it, model. as the legacy converter
        // does): libmtmd concatenates the overview's and tiles' rows without it
        for unused in ["v.image_newline", "model.image_newline"] {
            ld.skip(unused, false)?;
        }
        let hidden = ld.shape("mm.0.weight").and_then(|s| s.get(1).copied()).ok_or_else(|| ld.error("missing tensor 'mm.0.weight'"))?;
        let out = ld.shape("mm.2.weight").and_then(|s| s.get(1).copied()).ok_or_else(|| {
            EngineError::Unsupported("a llava projector without mm.2 (one linear layer) is not supported".into())
        })?;
        Ok(LlavaHead {
            mm0: ld.matrix("mm.0.weight", p.n_embd, hidden)?,
            mm0_b: ld.vector("mm.0.bias", hidden)?,
            mm2: ld.matrix("mm.2.weight", hidden, out)?,
            mm2_b: ld.vector("mm.2.bias", out)?,
        })
    }

    /// The width of the output rows (clip_n_mmproj_embd: mm.2's rows).
    pub fn n_embd_out(&self) -> usize { self.mm2.rows }
}

/// Output rows of an image: one per patch.
pub fn n_tokens(p: &VisionParams, nx: usize, ny: usize) -> usize { (nx / p.patch_size) * (ny / p.patch_size) }

/// The ViT's output (n_tokens rows, then the class row if any) to the text model's embeddings.
pub fn project(h: &LlavaHead, p: &VisionParams, vit_out: Vec<f32>, n_tokens: usize, threads: &Threads) -> Vec<f32> {
    let d = p.n_embd;
    let n_rows = vit_out.len() / d;
    // ggml_get_rows(embeddings, patches): rows offset by one where there is a class row
    let rows = &vit_out[(n_rows - n_tokens) * d..];
    let mut mm = MatmulScratch::default();
    let mut hidden = vec![0.0; n_tokens * h.mm0.rows];
    matmul(&h.mm0, rows, n_tokens, &mut hidden, &mut mm, threads);
    add_bias(&mut hidden, &h.mm0_b);
    gelu_inplace(&mut hidden);
    let mut out = vec![0.0; n_tokens * h.mm2.rows];
    matmul(&h.mm2, &hidden, n_tokens, &mut out, &mut mm, threads);
    add_bias(&mut out, &h.mm2_b);
    out
}
