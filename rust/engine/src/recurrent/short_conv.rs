//! LFM2's gated short convolution (llama.cpp's build_shortconv_block, src/models/lfm2.cpp),
//! shared by lfm2 and lfm2moe: the input projection gives B, C and x (n_embd values each, in
//! that order); B·x goes through a causal depthwise convolution of `l_cache` taps whose first
//! l_cache - 1 inputs are the sequence's convolution state; C gates the convolution's output
//! before the output projection. The state is the convolution row alone (n_s = 0).

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{ssm, QMatrix, Threads};

use crate::actstats::Matrix;
use crate::arch::blocks::{lora_mm, note};
use crate::error::Result;
use crate::graph::{UBatchView, Workspace};
use crate::hparams::{Meta, RsParams};
use crate::model::Loader;
use crate::recurrent::{sized, RsStore};

/// A short-convolution mixer's weights (`blk.N.shortconv.*`).
pub struct ShortConvWeights {
    /// n_embd → B, C, x (3·n_embd rows).
    pub in_proj: QMatrix,
    /// n_embd rows of l_cache taps (stored [l_cache, n_embd], as ssm_conv takes it).
    pub conv: Vec<f32>,
    pub out_proj: QMatrix,
}

impl ShortConvWeights {
    /// Loads layer il's mixer as llama.cpp's lfm2 / lfm2moe loaders do (no second scales:
    /// the graph passes none for these matrices, so a file with them is refused as unread).
    pub fn load(ld: &Loader, rs: &RsParams, n_embd: usize, il: usize) -> Result<ShortConvWeights> {
        let n = |s: &str| format!("blk.{il}.shortconv.{s}");
        let conv_name = n("conv.weight");
        Ok(ShortConvWeights {
            in_proj: ld.matrix(&n("in_proj.weight"), n_embd, 3 * n_embd)?,
            conv: ld.opt_vector_2d(&conv_name, rs.d_conv, n_embd)?
                .ok_or_else(|| ld.error(format!("missing tensor {conv_name}")))?,
            out_proj: ld.matrix(&n("out_proj.weight"), n_embd, n_embd)?,
        })
    }
}

/// The state sizes of a short-convolution model (`{arch}.shortconv.l_cache` taps):
/// llama.cpp's n_embd_r = n_embd·(l_cache - 1) convolution values and no recurrent row
/// (n_embd_s = 0, the model having no ssm.* sizes). `layers` marks the convolution layers.
pub fn short_conv_params(file: &GgufFile, arch: &str, layers: Vec<bool>, n_embd: usize) -> Result<RsParams> {
    let l_cache = Meta { file, arch }.usize("shortconv.l_cache")?;
    // llama.cpp asserts l_cache > 1 (a convolution with no state would have nothing to keep).
    if !(2..=1 << 16).contains(&l_cache) {
        return Err(file.error(format!("{arch}.shortconv.l_cache = {l_cache} is out of range (2..=65536)")).into());
    }
    Ok(RsParams { layers, n_r: n_embd * (l_cache - 1), n_s: 0, d_conv: l_cache, d_inner: 0, d_state: 0, n_group: 0, dt_rank: 0 })
}

/// ws.o = the short convolution of ws.h (n tokens of n_embd) for layer il, the convolution
/// states of the micro-batch's sequence groups rolled forward. (LoRA adapters on recurrent
/// layers are refused when the adapter is loaded, so no terms are added here.)
#[allow(clippy::too_many_arguments)]
pub fn short_conv_mixer(rs: &RsParams, w: &ShortConvWeights, ws: &mut Workspace, store: &mut RsStore, ub: &UBatchView,
                        il: usize, threads: &Threads) {
    let g = ub.rs.expect("a recurrent layer needs the micro-batch's state cells");
    let n = ub.tokens.len();
    let d = w.out_proj.rows;
    let width = w.in_proj.rows;
    let sc = &mut ws.rs;
    let bcx = sized(&mut sc.proj, n * width);
    lora_mm(&w.in_proj, None, &[], &ws.h, n, bcx, &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::Other("shortconv.in_proj"), &ws.h[..n * w.in_proj.cols], n);
    // B·x, the convolution's input (ggml_mul: one product per value, exact in either order),
    // in the scratch of a mixer's output
    let bx = sized(&mut sc.y, n * d);
    for (row, out) in bcx.chunks_exact(width).zip(bx.chunks_exact_mut(d)) {
        for ((o, &b), &x) in out.iter_mut().zip(&row[..d]).zip(&row[2 * d..]) {
            *o = b * x;
        }
    }
    let conv = sized(&mut sc.conv, n * d);
    let t = g.n_seq_tokens;
    for s in 0..g.n_seqs {
        for (run, back) in store.token_runs(t) {
            let rows = s * t + run.start..s * t + run.end;
            let (conv_state, _) = store.states_mut(il, g.head + s);
            ssm::ssm_conv(conv_state, &bx[rows.start * d..rows.end * d], d, rows.len(), &w.conv, rs.d_conv, d,
                          &mut conv[rows.start * d..rows.end * d], threads);
            if back > 0 {
                store.snapshot(il, g.head + s, back);
            }
        }
    }
    // C gates the convolution's output
    for (out, row) in conv.chunks_exact_mut(d).zip(bcx.chunks_exact(width)) {
        for (o, &c) in out.iter_mut().zip(&row[d..2 * d]) {
            *o *= c;
        }
    }
    lora_mm(&w.out_proj, None, &[], conv, n, &mut ws.o[..n * d], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::Other("shortconv.out_proj"), conv, n);
}
