//! LLaVA 1.5's projector (clip.cpp's `clip_graph_llava` for PROJECTOR_TYPE_MLP): the CLIP
//! output's rows 1..=n_patches go through mm.0, GELU and mm.2 one by one (Yi-VL's MLP_NORM:
//! mm.0, LayerNorm mm.1, GELU, mm.3, LayerNorm mm.4). With a class
//! embedding that drops the first patch and keeps the class row (the graph appends it after
//! the patches but skips row 0 as if it came first): llama.cpp's rows, kept as they are.

use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, Threads};

use super::params::VisionParams;
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, gelu_inplace, layer_norm_rows};
use crate::weights::Loader;

pub struct LlavaHead {
    mm0: QMatrix,
    mm0_b: Vec<f32>,
    /// Yi-VL's (clip.cpp's MLP_NORM, a file with mm.3): LayerNorms after each layer (mm.1,
    /// mm.4), the second layer mm.3
    norms: Option<[(Vec<f32>, Vec<f32>); 2]>,
    /// The second layer: mm.2, or mm.3 with the norms.
    out: QMatrix,
    out_b: Vec<f32>,
}

impl LlavaHead {
    pub fn load(ld: &Loader, p: &VisionParams) -> Result<LlavaHead> {
        // LLaVA 1.6's newline embedding (v. as clip.cpp names it, model. as the legacy converter
        // does): libmtmd concatenates the overview's and tiles' rows without it
        for unused in ["v.image_newline", "model.image_newline"] {
            ld.skip(unused, false)?;
        }
        let rows = |name: &str| ld.shape(name).and_then(|s| s.get(1).copied());
        let hidden = rows("mm.0.weight").ok_or_else(|| ld.error("missing tensor 'mm.0.weight'"))?;
        let with_norms = ld.has("mm.3.weight");
        // what clip.cpp loads and the graph leaves unused: mm.2 beside mm.3, mm.1 without it
        for unused in if with_norms { ["mm.2.weight", "mm.2.bias"] } else { ["mm.1.weight", "mm.1.bias"] } {
            ld.skip(unused, false)?;
        }
        let second = if with_norms { "mm.3" } else { "mm.2" };
        let out = rows(&format!("{second}.weight")).ok_or_else(|| {
            EngineError::Unsupported("a llava projector without mm.2 (one linear layer) is not supported".into())
        })?;
        let norm = |name: &str, n: usize| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((ld.vector(&format!("{name}.weight"), n)?, ld.vector(&format!("{name}.bias"), n)?))
        };
        Ok(LlavaHead {
            mm0: ld.matrix("mm.0.weight", p.n_embd, hidden)?,
            mm0_b: ld.vector("mm.0.bias", hidden)?,
            norms: if with_norms { Some([norm("mm.1", hidden)?, norm("mm.4", out)?]) } else { None },
            out: ld.matrix(&format!("{second}.weight"), hidden, out)?,
            out_b: ld.vector(&format!("{second}.bias"), out)?,
        })
    }

    /// The width of the output rows (clip_n_mmproj_embd: the second layer's rows).
    pub fn n_embd_out(&self) -> usize { self.out.rows }
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
    if let Some([(w, b), _]) = &h.norms {
        layer_norm_rows(&mut hidden, w, Some(b), p.eps);
    }
    gelu_inplace(&mut hidden);
    let mut out = vec![0.0; n_tokens * h.out.rows];
    matmul(&h.out, &hidden, n_tokens, &mut out, &mut mm, threads);
    add_bias(&mut out, &h.out_b);
    if let Some([_, (w, b)]) = &h.norms {
        layer_norm_rows(&mut out, w, Some(b), p.eps);
    }
    out
}
