//! Per-layer embeddings (Gemma 4's and Gemma 3n's, as llama.cpp's graphs compute them): each
//! token gets, for every layer, a small vector of n_pl values: its row of a second embedding
//! table plus a normalized projection of its scaled embedding. After each layer, the hidden
//! state gates that layer's vector through a GELU, and a normalized projection of the product
//! is added back to the hidden state.

use ferrollama_tensor::{QMatrix, Threads};

use crate::arch::blocks::lora_mm;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::model::Loader;
use crate::ops::{add_inplace, gelu_inplace, rms_norm_inplace, scale_inplace};
use crate::recurrent::sized;

pub struct PerLayerEmbeddings {
    /// Values per layer and token.
    pub n_pl: usize,
    /// n_vocab rows of n_layer × n_pl values (`per_layer_token_embd`).
    pub tok_embd: QMatrix,
    /// n_layer × n_pl rows of n_embd (`per_layer_model_proj`).
    pub model_proj: QMatrix,
    /// The projection's RMSNorm weights, n_pl values shared by the layers (`per_layer_proj_norm`).
    pub proj_norm: Vec<f32>,
    pub layers: Vec<PleLayer>,
}

/// A layer's use of its per-layer input.
pub struct PleLayer {
    /// n_pl rows of n_embd (`blk.N.inp_gate`).
    pub inp_gate: QMatrix,
    /// n_embd rows of n_pl (`blk.N.proj`).
    pub proj: QMatrix,
    /// n_embd values (`blk.N.post_norm`).
    pub post_norm: Vec<f32>,
}

/// The per-layer embeddings of a file whose `n_pl` (embedding_length_per_layer_input) is not
/// 0; None for 0.
pub fn load(ld: &Loader, hp: &HParams, n_pl: usize) -> Result<Option<PerLayerEmbeddings>> {
    if n_pl == 0 {
        return Ok(None);
    }
    let (d, width) = (hp.n_embd, n_pl * hp.n_layer);
    let layers = (0..hp.n_layer)
        .map(|il| {
            let n = |s: &str| format!("blk.{il}.{s}");
            Ok(PleLayer {
                inp_gate: ld.matrix(&n("inp_gate.weight"), d, n_pl)?,
                proj: ld.matrix(&n("proj.weight"), n_pl, d)?,
                post_norm: ld.vector(&n("post_norm.weight"), d)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(PerLayerEmbeddings {
        n_pl,
        tok_embd: ld.matrix("per_layer_token_embd.weight", width, hp.n_vocab)?,
        model_proj: ld.matrix("per_layer_model_proj.weight", d, width)?,
        proj_norm: ld.vector("per_layer_proj_norm.weight", n_pl)?,
        layers,
    }))
}

/// ws.ple = each token's inputs of every layer (n tokens × n_layer × n_pl), from ws.x (the
/// embeddings, already scaled): (RMSNorm(W_proj·x / sqrt(n_embd)) + row(token) · sqrt(n_pl))
/// / sqrt(2), in ggml's order of products (llama.cpp's build_inp_per_layer and
/// project_per_layer_inputs). A batch of embeddings (an image's) has no token ids: llama.cpp
/// takes the row of token 0 (the padding token) for every position.
pub fn inputs(p: &PerLayerEmbeddings, hp: &HParams, ws: &mut Workspace, ub: &UBatchView, threads: &Threads) {
    let (n, d, width) = (ub.tokens.len(), hp.n_embd, p.n_pl * hp.n_layer);
    let ple = sized(&mut ws.ple, n * width);
    lora_mm(&p.model_proj, None, &[], &ws.x[..n * d], n, ple, &mut ws.mm, &mut ws.lora, threads);
    scale_inplace(ple, 1.0 / (d as f32).sqrt());
    rms_norm_inplace(ple, &p.proj_norm, hp.rms_eps);
    let row = sized(&mut ws.ple_gate, width);
    let tok_scale = (p.n_pl as f32).sqrt();
    for (t, &tok) in ub.tokens.iter().enumerate() {
        let tok = if ub.embd.is_some() { 0 } else { tok };
        p.tok_embd.dequantize_row(tok as usize, row);
        scale_inplace(row, tok_scale);
        add_inplace(&mut ple[t * width..(t + 1) * width], row);
    }
    scale_inplace(ple, 1.0 / 2f32.sqrt());
}

/// ws.x += RMSNorm(W_proj · (gelu(W_gate · ws.x) * input of layer il)) for n tokens, through
/// ws.h and ws.o (llama_model_gemma4's per-layer embedding step after the FFN's residual).
pub fn apply(p: &PerLayerEmbeddings, hp: &HParams, il: usize, ws: &mut Workspace, n: usize, threads: &Threads) {
    let d = hp.n_embd;
    ws.h[..n * d].copy_from_slice(&ws.x[..n * d]);
    gated_projection(p, hp, il, ws, n, threads);
    add_inplace(&mut ws.x[..n * d], &ws.o[..n * d]);
}

/// ws.o = RMSNorm(W_proj · (gelu(W_gate · ws.h) * input of layer il)) for n tokens: what
/// layer il's per-layer input adds to the hidden state (Gemma 4's whole; Gemma 3n's
/// predictions but the active one), gated by the state in ws.h.
pub fn gated_projection(p: &PerLayerEmbeddings, hp: &HParams, il: usize, ws: &mut Workspace, n: usize, threads: &Threads) {
    let (d, n_pl, width) = (hp.n_embd, p.n_pl, p.n_pl * hp.n_layer);
    let l = &p.layers[il];
    let gate = sized(&mut ws.ple_gate, n * n_pl);
    lora_mm(&l.inp_gate, None, &[], &ws.h[..n * d], n, gate, &mut ws.mm, &mut ws.lora, threads);
    gelu_inplace(gate);
    for (t, g) in gate.chunks_exact_mut(n_pl).enumerate() {
        let input = &ws.ple[t * width + il * n_pl..t * width + (il + 1) * n_pl];
        g.iter_mut().zip(input).for_each(|(a, &b)| *a *= b);
    }
    lora_mm(&l.proj, None, &[], gate, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    rms_norm_inplace(&mut ws.o[..n * d], &l.post_norm, hp.rms_eps);
}
