//! BERT and nomic-bert: encoders for embeddings. Token embeddings plus the first token type's
//! (and, for BERT, learned position embeddings) through a LayerNorm; each layer attends over
//! the whole sequence (no causal mask, no cache kept between decodes), adds the residual and
//! LayerNorms, then a GELU FFN (nomic-bert: SwiGLU, and NEOX RoPE instead of position
//! embeddings), residual and LayerNorm again. No output head: the last hidden states are
//! the embeddings, pooled by the context.

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::Threads;

use crate::arch::blocks::{attend, embed, ffn, fill_rope_caches, project_qkv, rope_and_store};
use crate::arch::ArchInfo;
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::HParams;
use crate::kvstore::KvStore;
use crate::model::{load_qkv, load_qkv_biases, AttnWeights, EncoderInputs, Ffn, GatedFfn, LayerNorm, LayerWeights, Loader, Model,
                   PlainFfn, RopeFactors, Weights};
use crate::ops::{add_inplace, layer_norm_inplace, swiglu};

pub const BERT: ArchInfo = ArchInfo { name: "bert", rope_neox: true, hparams, load: load_bert, forward, encoder: true };
pub const NOMIC_BERT: ArchInfo = ArchInfo { name: "nomic-bert", rope_neox: true, hparams, load: load_nomic, forward, encoder: true };

fn hparams(hp: &mut HParams, file: &GgufFile) -> Result<()> {
    hp.norm_eps = hp.f32(file, "attention.layer_norm_epsilon")?;
    if file.get(&format!("{}.attention.causal", hp.arch)).and_then(|v| v.as_bool()) == Some(true) {
        return Err(crate::error::EngineError::Unsupported(format!("{} with causal attention", hp.arch)));
    }
    if hp.pooling_type == 4 {
        return Err(crate::error::EngineError::Unsupported("rank pooling (a reranker's classifier head)".into()));
    }
    Ok(())
}

fn load_bert(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load(ld, hp, true)
}

fn load_nomic(ld: &Loader, hp: &HParams) -> Result<Weights> {
    load(ld, hp, false)
}

fn load(ld: &Loader, hp: &HParams, bert: bool) -> Result<Weights> {
    let d = hp.n_embd;
    let tok_embd = ld.matrix("token_embd.weight", d, hp.n_vocab)?;
    let type_row0 = match ld.shape("token_types.weight") {
        Some(shape) if shape.len() == 2 => {
            let types = ld.matrix("token_types.weight", d, shape[1])?;
            let mut row = vec![0.0; d];
            types.dequantize_row(0, &mut row);
            Some(row)
        }
        Some(shape) => return Err(ld.error(format!("token_types.weight has shape {shape:?}"))),
        None => None,
    };
    let pos_embd = if bert { Some(ld.matrix("position_embd.weight", d, hp.n_ctx_train)?) } else { None };
    let norm = layer_norm(ld, "token_embd_norm", d)?;
    let layers = (0..hp.n_layer).map(|il| load_layer(ld, hp, il, bert)).collect::<Result<Vec<_>>>()?;
    Ok(Weights {
        output: tok_embd.clone(), tok_embd, output_norm: Vec::new(), output_norm_b: None, output_b: None, output_s: None, output_tied: false, layers,
        rope_factors: RopeFactors::default(), encoder: Some(EncoderInputs { pos_embd, type_row0, norm }),
        extras: Default::default(),
    })
}

fn layer_norm(ld: &Loader, name: &str, n: usize) -> Result<LayerNorm> {
    Ok(LayerNorm { w: ld.vector(&format!("{name}.weight"), n)?, b: ld.vector(&format!("{name}.bias"), n)? })
}

fn load_layer(ld: &Loader, hp: &HParams, il: usize, bert: bool) -> Result<LayerWeights> {
    let (d, ff, kv) = (hp.n_embd, hp.n_ff, hp.n_embd_k_gqa());
    let n = |s: &str| format!("blk.{il}.{s}");
    let [wq, wk, wv] = load_qkv(ld, &n, d, [d, kv, kv])?;
    let [bq, bk, bv] = load_qkv_biases(ld, &n, [d, kv, kv])?;
    let up = ld.matrix(&n("ffn_up.weight"), d, ff)?;
    let down = ld.matrix(&n("ffn_down.weight"), ff, d)?;
    let ffn = if bert {
        let (up_b, down_b) = (ld.opt_vector(&n("ffn_up.bias"), ff)?, ld.opt_vector(&n("ffn_down.bias"), d)?);
        Ffn::Plain(PlainFfn { up, down, up_b, down_b, up_s: None, down_s: None })
    } else {
        // llama.cpp's nomic-bert graph adds no FFN biases: a file with them is refused.
        let gate = ld.matrix(&n("ffn_gate.weight"), d, ff)?;
        Ffn::Gated(GatedFfn { gate, up, down, gate_b: None, up_b: None, down_b: None, gate_s: None, up_s: None, down_s: None })
    };
    let attn = AttnWeights {
        wq, wk, wv,
        wo: ld.matrix(&n("attn_output.weight"), d, d)?,
        bq, bk, bv,
        bo: ld.opt_vector(&n("attn_output.bias"), d)?,
        // llama.cpp's BERT graphs apply attention scales too; no NVFP4 encoder exists to
        // check them against, so a file with them is refused (unread).
        scales: Default::default(),
        q_norm: None, k_norm: None, sinks: None,
    };
    Ok(LayerWeights {
        attn_norm: None, attn: Some(attn), rs: None,
        post_attn_norm: None, ffn_norm: None, ffn, post_ffn_norm: None,
        attn_out_norm: Some(layer_norm(ld, &n("attn_output_norm"), d)?),
        layer_out_norm: Some(layer_norm(ld, &n("layer_output_norm"), d)?),
        attn_norm_b: None, ffn_norm_b: None, latent: None,
    })
}

fn forward(model: &Model, w: &Weights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, threads: &Threads, _logits: &mut [f32]) {
    let hp = &model.hparams;
    let (n, d, eps) = (ub.tokens.len(), hp.n_embd, hp.norm_eps);
    let enc = w.encoder.as_ref().expect("an encoder's weights have its inputs");
    embed(w, ws, ub, hp, 1.0, threads);
    add_inputs(enc, ws, ub, d);
    layer_norm_inplace(&mut ws.x[..n * d], &enc.norm.w, &enc.norm.b, eps);
    if enc.pos_embd.is_none() {
        fill_rope_caches(hp, ws, ub);
    }
    for (il, lw) in w.layers.iter().enumerate() {
        if let Some(s) = ws.stats.as_deref_mut() {
            s.begin_layer(il);
        }
        ws.h[..n * d].copy_from_slice(&ws.x[..n * d]);
        project_qkv(lw.attn(), ws, n, ub.lora_layer(il), threads);
        if enc.pos_embd.is_none() {
            let rope_cache = std::mem::take(&mut ws.rope_cache);
            rope_and_store(hp, lw.attn(), ub.rope, &rope_cache, ws, kv, ub, il);
            ws.rope_cache = rope_cache;
        } else {
            store_kv(lw.attn(), ws, kv, ub, il);
        }
        attend(hp, lw.attn(), ws, kv, ub, il, hp.attn_scale, 0.0, threads);
        add_and_norm(ws, lw.attn_out_norm.as_ref(), eps, n, d);
        ws.h[..n * d].copy_from_slice(&ws.x[..n * d]);
        ffn(hp, lw, ws, n, swiglu, ub.lora_layer(il), threads);
        add_and_norm(ws, lw.layer_out_norm.as_ref(), eps, n, d);
    }
    // The embeddings are the last hidden states of the wanted rows (no output norm).
    for (i, &r) in ub.out_rows.iter().enumerate() {
        ws.h[i * d..(i + 1) * d].copy_from_slice(&ws.x[r * d..(r + 1) * d]);
    }
}

/// The first token type's embedding and (BERT) each token's position embedding.
fn add_inputs(enc: &EncoderInputs, ws: &mut Workspace, ub: &UBatchView, d: usize) {
    let mut row = vec![0.0; d];
    for (t, &p) in ub.pos.iter().enumerate() {
        let x = &mut ws.x[t * d..(t + 1) * d];
        if let Some(ty) = &enc.type_row0 {
            add_inplace(x, ty);
        }
        if let Some(pe) = &enc.pos_embd {
            pe.dequantize_row(p as usize, &mut row);
            // ggml adds the position embedding first: pos + (tok + type).
            for (v, &q) in x.iter_mut().zip(&row) {
                *v = q + *v;
            }
        }
    }
}

/// Stores each token's K and V (no RoPE: BERT's positions are in its embeddings).
fn store_kv(lw: &AttnWeights, ws: &mut Workspace, kv: &mut KvStore, ub: &UBatchView, il: usize) {
    let (k_dim, v_dim) = (lw.wk.rows, lw.wv.rows);
    for t in 0..ub.tokens.len() {
        kv.write(il, ub.kv(il).slots[t] as usize, &ws.k[t * k_dim..(t + 1) * k_dim], &ws.v[t * v_dim..(t + 1) * v_dim]);
    }
}

/// ws.x = LayerNorm(ws.o + ws.x).
fn add_and_norm(ws: &mut Workspace, norm: Option<&LayerNorm>, eps: f32, n: usize, d: usize) {
    for (x, &o) in ws.x[..n * d].iter_mut().zip(&ws.o[..n * d]) {
        *x = o + *x;
    }
    if let Some(ln) = norm {
        layer_norm_inplace(&mut ws.x[..n * d], &ln.w, &ln.b, eps);
    }
}
