//! LoRA adapters as llama.cpp applies them (llama-adapter.cpp, build_lora_mm): a GGUF file of
//! `general.type = adapter`, `adapter.type = lora`, holding pairs `<base tensor>.lora_a` and
//! `.lora_b` for some of the model's matrices. A context with adapters set computes every
//! product y = W·x whose W has a pair as y = W·x + Σ scale · B·(A·x), with
//! scale = user scale · alpha / rank (alpha 0: the user scale), adapter by adapter. The token
//! embedding's pair adds scale · B·A[token] to each token's embedding row; experts' 3-D pairs
//! give each expert its own A and B.
//!
//! A stays in the file's map, in its stored type, and goes through the same products as the
//! model's weights (F16 activations for an F16 A, as ggml converts them). B has as many
//! columns as the rank (16 or so): a product of dot products that short is mostly call
//! overhead, so B is kept transposed in f32 and B·(A·x) is a sum of rank scaled rows of it,
//! with A·x first rounded to what ggml converts it to for B's type (its vec_dot_type).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Weak};

use ferrollama_gguf::{GgufFile, TensorInfo};
use ferrollama_tensor::{matmul, MatmulScratch, QMatrix, SendPtr, TensorError, Threads, TypeTraits, WeightBytes};

use crate::error::{EngineError, Result};
use crate::model::Model;

/// The products of a decoder layer an adapter can add to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q, K, V, O, Gate, Up, Down,
    /// The experts' router (ffn_gate_inp).
    Router,
    /// The experts' matrices: one A and one B per expert.
    GateExps, UpExps, DownExps,
}

const N_PROJ: usize = Proj::DownExps as usize + 1;

impl Proj {
    fn index(self) -> usize { self as usize }
}

/// Where a pair applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Site {
    TokEmbd,
    Output,
    Layer(usize, Proj),
}

/// One pair (or a block of rows of one, for fused matrices) at one site: `a[e]` and `b[e]` of
/// expert e (one of each for a dense matrix). A is rank rows of the input's width (the token
/// embedding's: n_vocab rows of rank, indexed by token); B is the output's rows of rank.
#[derive(Clone)]
struct Target {
    site: Site,
    a: Vec<QMatrix>,
    b: Vec<Arc<BTransposed>>,
}

/// A lora_b matrix transposed to f32: rank rows of the output's width, and the type ggml
/// converts B's input to (B's vec_dot_type).
pub struct BTransposed {
    data: Vec<f32>,
    rank: usize,
    rows: usize,
    input: &'static TypeTraits,
}

impl BTransposed {
    fn new(b: &QMatrix) -> Result<BTransposed> {
        let (rank, rows) = (b.cols, b.rows);
        let input = ferrollama_tensor::traits(b.traits().vec_dot_type).expect("vec_dot types are in the table");
        if input.from_f32.is_none() || rank % input.block_size != 0 {
            return Err(EngineError::Unsupported(format!("a LoRA B of type {} and rank {rank}", b.ty)));
        }
        let mut data = vec![0.0; rank * rows];
        let mut row = vec![0.0; rank];
        for r in 0..rows {
            b.dequantize_row(r, &mut row);
            for (k, &v) in row.iter().enumerate() {
                data[k * rows + r] = v;
            }
        }
        Ok(BTransposed { data, rank, rows, input })
    }
}

/// A loaded adapter, valid for the model it was loaded against.
pub struct LoraAdapter {
    model: Weak<Model>,
    pub file: Arc<GgufFile>,
    /// adapter.lora.alpha (0 when absent: the scale is the user's as given).
    pub alpha: f32,
    /// The rank of each pair (the rows of A), by base tensor name.
    pub ranks: BTreeMap<String, usize>,
    /// Tensors llama.cpp skips as well (`*_norm.weight`: "most adapters still work fine
    /// without it"), listed so that the caller can say so.
    pub skipped: Vec<String>,
    targets: Vec<Target>,
}

/// The adapter file's bytes, shared by its matrices.
struct FileBytes(Arc<GgufFile>);

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] { self.0.bytes() }
}

fn invalid(msg: String) -> EngineError { EngineError::InvalidArgument(msg) }

impl LoraAdapter {
    /// Loads and checks an adapter for `model`: its type and architecture, that every pair is
    /// complete, names a matrix of the model the engine applies adapters to, and has shapes
    /// that fit it (llama_adapter_lora_init's checks, with clear errors).
    pub fn load(model: &Arc<Model>, path: impl AsRef<Path>) -> Result<LoraAdapter> {
        let path = path.as_ref();
        let file = Arc::new(GgufFile::open(path, true)?);
        let what = path.display();
        let general_type = file.get_str("general.type").unwrap_or("");
        if general_type != "adapter" {
            return Err(invalid(format!("{what}: not a LoRA adapter (general.type is '{general_type}', expected 'adapter')")));
        }
        let arch = file.get_str("general.architecture").unwrap_or("");
        if arch != model.arch_name() {
            return Err(invalid(format!("{what}: the adapter is for architecture '{arch}', the model is '{}'", model.arch_name())));
        }
        let adapter_type = file.get_str("adapter.type").unwrap_or("");
        if adapter_type != "lora" {
            return Err(invalid(format!("{what}: adapter.type is '{adapter_type}', expected 'lora'")));
        }
        let alpha = match file.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v.as_f64().ok_or_else(|| file.error("adapter.lora.alpha is not a number"))? as f32,
        };
        let (pairs, skipped) = pair_tensors(&file)?;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(FileBytes(file.clone()));
        let mut targets = Vec::new();
        let mut ranks = BTreeMap::new();
        for (name, (a, b)) in &pairs {
            let rank = check_shapes(model, &file, name, a, b)?;
            ranks.insert(name.clone(), rank);
            targets.extend(targets_of(model, &file, &owner, name, a, b)?);
        }
        Ok(LoraAdapter { model: Arc::downgrade(model), file, alpha, ranks, skipped, targets })
    }

    /// Whether the adapter was loaded against this model.
    pub fn is_for(&self, model: &Arc<Model>) -> bool { Weak::ptr_eq(&self.model, &Arc::downgrade(model)) }

    /// The scale of a pair of `rank` at a user scale (llama_adapter_lora_weight::get_scale).
    fn scale(&self, rank: usize, user_scale: f32) -> f32 {
        if self.alpha != 0.0 { user_scale * self.alpha / rank as f32 } else { user_scale }
    }
}

/// The file's tensors grouped into (A, B) pairs by base name; `*_norm.weight` tensors are
/// skipped as llama.cpp skips them, any other name is an error.
#[allow(clippy::type_complexity)]
fn pair_tensors(file: &GgufFile) -> Result<(BTreeMap<String, (&TensorInfo, &TensorInfo)>, Vec<String>)> {
    let mut halves: BTreeMap<String, (Option<&TensorInfo>, Option<&TensorInfo>)> = BTreeMap::new();
    let mut skipped = Vec::new();
    for t in &file.tensors {
        if let Some(base) = t.name.strip_suffix(".lora_a") {
            halves.entry(base.to_string()).or_default().0 = Some(t);
        } else if let Some(base) = t.name.strip_suffix(".lora_b") {
            halves.entry(base.to_string()).or_default().1 = Some(t);
        } else if t.name.ends_with("_norm.weight") {
            skipped.push(t.name.clone());
        } else {
            return Err(file.error(format!("LoRA tensor '{}' has unexpected suffix (expected .lora_a or .lora_b)", t.name)).into());
        }
    }
    let mut pairs = BTreeMap::new();
    for (name, half) in halves {
        match half {
            (Some(a), Some(b)) => { pairs.insert(name, (a, b)); }
            _ => return Err(file.error(format!("LoRA tensor pair for '{name}' is missing one component")).into()),
        }
    }
    Ok((pairs, skipped))
}

/// Checks a pair's shapes against the model's tensor (llama.cpp's checks, plus the expert
/// count of 3-D pairs); returns the rank.
fn check_shapes(model: &Model, file: &GgufFile, name: &str, a: &TensorInfo, b: &TensorInfo) -> Result<usize> {
    let base = model.file.tensor(name).ok_or_else(|| invalid(format!(
        "{}: LoRA tensor '{name}' does not exist in the base model (wrong base model?)", file.path().display())))?;
    let wrong = || invalid(format!("{}: tensor '{name}' has incorrect shape: base {:?}, lora_a {:?}, lora_b {:?} (wrong base model?)",
                                   file.path().display(), base.shape, a.shape, b.shape));
    let dims = base.shape.len();
    if a.shape.len() != dims || b.shape.len() != dims || !(2..=3).contains(&dims) {
        return Err(wrong());
    }
    if name == "token_embd.weight" {
        // A is stored transposed (a row per token), B is not (llm_build_inp_embd).
        if base.shape[0] != b.shape[1] || base.shape[1] != a.shape[1] || a.shape[0] != b.shape[0] {
            return Err(wrong());
        }
        return positive_rank(file, name, b.shape[0]);
    }
    if base.shape[0] != a.shape[0] || base.shape[1] != b.shape[1] {
        return Err(wrong());
    }
    if a.shape[1] != b.shape[0] {
        return Err(file.error(format!("lora_a tensor of '{name}' is not transposed (an adapter of the old \"finetune\" example)")).into());
    }
    if dims == 3 && (a.shape[2] != base.shape[2] || b.shape[2] != base.shape[2]) {
        return Err(wrong());
    }
    positive_rank(file, name, a.shape[1])
}

fn positive_rank(file: &GgufFile, name: &str, rank: usize) -> Result<usize> {
    if rank == 0 {
        return Err(file.error(format!("LoRA pair of '{name}' has rank 0")).into());
    }
    Ok(rank)
}

/// The sites a pair applies to, with its matrices split as the model's weights are: fused
/// Q/K/V and gate/up matrices take B's blocks of rows, expert tensors one matrix per expert.
fn targets_of(model: &Model, file: &GgufFile, owner: &Arc<dyn AsRef<[u8]> + Send + Sync>, name: &str,
              a: &TensorInfo, b: &TensorInfo) -> Result<Vec<Target>> {
    let hp = &model.hparams;
    let w = model.weights()?;
    let unsupported = || EngineError::Unsupported(format!("the engine does not apply a LoRA adapter to '{name}'"));
    let blocks = |t: &TensorInfo, rows: &[usize]| matrix_blocks(file, owner, t, rows);
    let transposed = |ms: Vec<QMatrix>| ms.iter().map(|m| BTransposed::new(m).map(Arc::new)).collect::<Result<Vec<_>>>();
    let one = |site: Site| -> Result<Vec<Target>> {
        Ok(vec![Target { site, a: blocks(a, &[a.shape[1]])?, b: transposed(blocks(b, &[b.shape[1]])?)? }])
    };
    if name == "token_embd.weight" {
        if w.output_tied && w.encoder.is_none() {
            // llama.cpp would run the output product with the embedding's pair (A transposed)
            // and abort on the shapes.
            return Err(EngineError::Unsupported(format!(
                "a LoRA of 'token_embd.weight' on a model whose output projection is the token embedding ('{}')", model.arch_name())));
        }
        return one(Site::TokEmbd);
    }
    if name == "output.weight" {
        return one(Site::Output);
    }
    let (il, rest) = name.strip_prefix("blk.").and_then(|s| s.split_once('.')).ok_or_else(unsupported)?;
    let il: usize = il.parse().map_err(|_| unsupported())?;
    if il >= hp.n_layer {
        return Err(unsupported());
    }
    // Latent attention's projections are plain products in llama.cpp's graph (no adapter
    // terms) but for the output projection.
    if w.layers[il].latent.is_some() && rest.starts_with("attn_") && rest != "attn_output.weight" {
        return Err(unsupported());
    }
    let at = |p: Proj| Site::Layer(il, p);
    let split = |projs: &[Proj], rows: &[usize]| -> Result<Vec<Target>> {
        if rows.iter().sum::<usize>() != b.shape[1] {
            return Err(unsupported());
        }
        let a_m = blocks(a, &[a.shape[1]])?;
        let b_blocks = transposed(blocks(b, rows)?)?;
        Ok(projs.iter().zip(b_blocks).map(|(&p, bm)| Target { site: at(p), a: a_m.clone(), b: vec![bm] }).collect())
    };
    let experts = |p: Proj| -> Result<Vec<Target>> {
        let n_exp = a.shape[2];
        Ok(vec![Target { site: at(p), a: blocks(a, &vec![a.shape[1]; n_exp])?, b: transposed(blocks(b, &vec![b.shape[1]; n_exp])?)? }])
    };
    let fused_gate_up = model.file.tensor(&format!("blk.{il}.ffn_gate.weight")).is_none() && b.shape[1] == 2 * hp.n_ff;
    match rest {
        "attn_q.weight" => one(at(Proj::Q)),
        "attn_k.weight" => one(at(Proj::K)),
        "attn_v.weight" => one(at(Proj::V)),
        "attn_qkv.weight" => {
            let (hd_k, hd_v) = (hp.head_dim_k_of(il), hp.head_dim_v_of(il));
            split(&[Proj::Q, Proj::K, Proj::V], &[hd_k * hp.n_head, hd_k * hp.n_head_kv_of(il), hd_v * hp.n_head_kv_of(il)])
        }
        "attn_output.weight" => one(at(Proj::O)),
        "ffn_gate.weight" => refuse_scaled_nvfp4(w, il, name, Proj::Gate).and_then(|_| one(at(Proj::Gate))),
        "ffn_up.weight" if fused_gate_up => split(&[Proj::Gate, Proj::Up], &[hp.n_ff, hp.n_ff]),
        "ffn_up.weight" => refuse_scaled_nvfp4(w, il, name, Proj::Up).and_then(|_| one(at(Proj::Up))),
        "ffn_down.weight" => refuse_scaled_nvfp4(w, il, name, Proj::Down).and_then(|_| one(at(Proj::Down))),
        "ffn_gate_inp.weight" => one(at(Proj::Router)),
        "ffn_gate_exps.weight" => experts(Proj::GateExps),
        "ffn_up_exps.weight" => experts(Proj::UpExps),
        "ffn_down_exps.weight" => experts(Proj::DownExps),
        _ => Err(unsupported()),
    }
}

/// llama.cpp's build_ffn asserts that an NVFP4 FFN matrix with a second scale has no adapter:
/// the scale is multiplied in after the adapter's terms, which it should not scale.
fn refuse_scaled_nvfp4(w: &crate::model::Weights, il: usize, name: &str, p: Proj) -> Result<()> {
    let crate::model::Ffn::Gated(f) = &w.layers[il].ffn else { return Ok(()) };
    let (m, s) = match p {
        Proj::Gate => (&f.gate, f.gate_s),
        Proj::Up => (&f.up, f.up_s),
        _ => (&f.down, f.down_s),
    };
    if s.is_some() && m.ty == ferrollama_tensor::GgmlType::NVFP4 {
        return Err(EngineError::Unsupported(format!("a LoRA adapter of '{name}', an NVFP4 matrix with a scale (llama.cpp asserts)")));
    }
    Ok(())
}

/// Consecutive blocks of rows of an adapter tensor, as matrices over the file's map.
fn matrix_blocks(file: &GgufFile, owner: &Arc<dyn AsRef<[u8]> + Send + Sync>, t: &TensorInfo, rows: &[usize]) -> Result<Vec<QMatrix>> {
    let cols = t.shape[0];
    let tr = ferrollama_tensor::traits(t.ggml_type)
        .ok_or_else(|| EngineError::Unsupported(format!("LoRA tensor '{}' has type {}, which the engine does not support", t.name, t.ggml_type)))?;
    if cols % tr.block_size != 0 {
        return Err(file.error(format!("LoRA tensor '{}': {cols} columns is not a multiple of {}'s block size", t.name, t.ggml_type)).into());
    }
    let row_bytes = tr.row_bytes(cols);
    if rows.iter().sum::<usize>() * row_bytes != t.nbytes {
        return Err(file.error(format!("LoRA tensor '{}' holds {} bytes, not {} rows of {cols}", t.name, t.nbytes, rows.iter().sum::<usize>())).into());
    }
    let mut start = file.data_offset + t.offset;
    let mut out = Vec::with_capacity(rows.len());
    for &r in rows {
        let range = start..start + r * row_bytes;
        let m = QMatrix::with_layout(t.ggml_type, r, cols, WeightBytes::Shared { owner: owner.clone(), range: range.clone() }, false)
            .map_err(|e| match e {
                TensorError::Unsupported(ty) => EngineError::Unsupported(format!("LoRA tensor '{}' has type {ty}", t.name)),
                TensorError::Shape(s) => file.error(format!("LoRA tensor '{}': {s}", t.name)).into(),
            })?;
        out.push(m);
        start = range.end;
    }
    Ok(out)
}

/// A pair's matrices at a site with their effective scale.
pub struct Term {
    a: Vec<QMatrix>,
    b: Vec<Arc<BTransposed>>,
    scale: f32,
}

/// The adapters a context has set, resolved into the terms of each product.
pub struct LoraSet {
    tok_embd: Vec<Term>,
    output: Vec<Term>,
    /// N_PROJ lists per layer.
    layers: Vec<Vec<Term>>,
    /// The largest rank: what the scratch must hold.
    max_rank: usize,
}

impl LoraSet {
    /// The terms of `adapters` (with their user scales) for a model of `n_layer` layers;
    /// adapters of scale 0 add nothing (llama.cpp leaves them out). None when nothing applies.
    pub fn new(adapters: &[(Arc<LoraAdapter>, f32)], n_layer: usize) -> Option<LoraSet> {
        let mut set = LoraSet { tok_embd: Vec::new(), output: Vec::new(), layers: (0..n_layer * N_PROJ).map(|_| Vec::new()).collect(),
                                max_rank: 0 };
        let mut any = false;
        for (adapter, user_scale) in adapters.iter().filter(|(_, s)| *s != 0.0) {
            for t in &adapter.targets {
                // For the token embedding, A's rows are tokens and its columns the rank.
                let rank = if t.site == Site::TokEmbd { t.a[0].cols } else { t.a[0].rows };
                let term = Term { a: t.a.clone(), b: t.b.clone(), scale: adapter.scale(rank, *user_scale) };
                set.max_rank = set.max_rank.max(rank);
                any = true;
                match t.site {
                    Site::TokEmbd => set.tok_embd.push(term),
                    Site::Output => set.output.push(term),
                    Site::Layer(il, p) => set.layers[il * N_PROJ + p.index()].push(term),
                }
            }
        }
        any.then_some(set)
    }

    /// The scratch the products need for micro-batches of up to n_ubatch tokens.
    pub fn scratch(&self, n_ubatch: usize) -> LoraScratch {
        LoraScratch { mid: vec![0.0; n_ubatch * self.max_rank], rounded: vec![0; self.max_rank * 4] }
    }

    pub fn layer(&self, il: usize) -> LayerLora<'_> { LayerLora(Some(&self.layers[il * N_PROJ..(il + 1) * N_PROJ])) }
    pub fn output(&self) -> &[Term] { &self.output }
    pub fn tok_embd(&self) -> &[Term] { &self.tok_embd }
}

/// The terms of one layer (none without adapters).
#[derive(Clone, Copy, Default)]
pub struct LayerLora<'a>(Option<&'a [Vec<Term>]>);

impl<'a> LayerLora<'a> {
    pub fn terms(&self, p: Proj) -> &'a [Term] { self.0.map_or(&[], |t| &t[p.index()]) }
}

/// A·x for a micro-batch (n × rank), and one row of it in B's input type.
#[derive(Default)]
pub struct LoraScratch {
    mid: Vec<f32>,
    rounded: Vec<u8>,
}

/// out[t] += scale · B_e·(A_e·x[t]) for each term, for n tokens of x (rows of A's width) and
/// out (rows of B's height); e is the expert (0 for a dense matrix).
#[allow(clippy::too_many_arguments)]
pub fn add_terms(terms: &[Term], e: usize, x: &[f32], n: usize, out: &mut [f32], sc: &mut LoraScratch,
                 mm: &mut MatmulScratch, threads: &Threads) {
    for term in terms {
        let a = &term.a[e];
        matmul(a, x, n, &mut sc.mid[..n * a.rows], mm, threads);
        add_b_product(&term.b[e], n, term.scale, out, sc, threads);
    }
}

/// Output columns a task computes at once (their sums stay in registers and L1).
const COLS: usize = 64;
/// Multiply-adds below which one thread does the whole product (a dispatch costs more).
const SERIAL_WORK: usize = 1 << 15;

/// out[t] += scale · (B·mid[t]) for n tokens (ggml_mul_mat, ggml_scale, ggml_add): mid is
/// first rounded to B's input type, then each output is its rank products summed in order.
fn add_b_product(b: &BTransposed, n: usize, scale: f32, out: &mut [f32], sc: &mut LoraScratch, threads: &Threads) {
    let (rank, rows) = (b.rank, b.rows);
    let mid = &mut sc.mid[..n * rank];
    if b.input.ty != ferrollama_tensor::GgmlType::F32 {
        let (from, bytes) = (b.input.from_f32.expect("checked at load"), &mut sc.rounded[..b.input.row_bytes(rank)]);
        for row in mid.chunks_exact_mut(rank) {
            from(row, bytes);
            (b.input.to_f32)(bytes, row);
        }
    }
    let mid = &sc.mid[..n * rank];
    let out = &mut out[..n * rows];
    let out_ptr = SendPtr(out.as_mut_ptr());
    let n_blocks = rows.div_ceil(COLS);
    if n * rows * rank < SERIAL_WORK || threads.n_threads() < 2 {
        // SAFETY: out holds n rows of `rows`; this thread alone writes it.
        (0..n_blocks).for_each(|blk| unsafe { add_columns(b, mid, scale, &out_ptr, n, blk) });
        return;
    }
    // SAFETY: as above; each task writes only its own block of columns of every row.
    threads.run(n_blocks, |blk| unsafe { add_columns(b, mid, scale, &out_ptr, n, blk) });
}

/// Columns blk·COLS.. of every token: sum over the rank in registers, then one add each.
///
/// # Safety
/// `out` points to n rows of b.rows floats, whose columns blk·COLS.. no one else accesses
/// meanwhile.
unsafe fn add_columns(b: &BTransposed, mid: &[f32], scale: f32, out: &SendPtr<f32>, n: usize, blk: usize) {
    let (rank, rows) = (b.rank, b.rows);
    let j0 = blk * COLS;
    let w = COLS.min(rows - j0);
    for t in 0..n {
        // SAFETY: in bounds (t < n, j0 + w <= rows) and this caller's columns only.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(t * rows + j0), w) };
        let mut acc = [0f32; COLS];
        for (k, &m) in mid[t * rank..(t + 1) * rank].iter().enumerate() {
            let col = &b.data[k * rows + j0..k * rows + j0 + w];
            for (a, &v) in acc[..w].iter_mut().zip(col) {
                *a += m * v;
            }
        }
        for (o, &a) in dst.iter_mut().zip(&acc[..w]) {
            *o += a * scale;
        }
    }
}

/// x[t] += scale · B·A[tokens[t]] for each term of the token embedding (rows of n_embd).
pub fn add_embedding_terms(terms: &[Term], tokens: &[u32], x: &mut [f32], sc: &mut LoraScratch, threads: &Threads) {
    for term in terms {
        let a = &term.a[0];
        let rank = a.cols;
        for (t, &tok) in tokens.iter().enumerate() {
            a.dequantize_row(tok as usize, &mut sc.mid[t * rank..(t + 1) * rank]);
        }
        add_b_product(&term.b[0], tokens.len(), term.scale, x, sc, threads);
    }
}
