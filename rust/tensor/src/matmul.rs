//! Quantized weight matrices and the matrix product.

use std::ops::Range;
use std::sync::{Arc, OnceLock, Weak};

use crate::packed::{self, KindKernels, PackKind, Packed, PackedActs};
use crate::simd::{SumsGemm, TileFactors, OCTET_MAX_QUADS, SUMS_MAX_QUADS};
use crate::traits::{VecDot, VecDotX4};
use crate::{traits, GgmlType, SendPtr, TensorError, Threads, TypeTraits};

/// The bytes of a weight matrix: a range of a shared buffer (the model file's map) or an
/// owned buffer (a repacked layout, a test matrix).
#[derive(Clone)]
pub enum WeightBytes {
    Shared { owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize> },
    Owned(Arc<Vec<u8>>),
}

impl WeightBytes {
    pub fn bytes(&self) -> &[u8] {
        match self {
            WeightBytes::Shared { owner, range } => &(**owner).as_ref()[range.clone()],
            WeightBytes::Owned(v) => v,
        }
    }
}

/// A row-major matrix of `rows` rows of `cols` elements of type `ty` (ggml's ne0 = cols).
///
/// On CPUs with packed kernels (AVX-512 VNNI: six types; AVX2: Q8_0, Q5_0 and Q4_K) the whole
/// 16-row groups of the types that have them are also kept repacked (`crate::packed`); the
/// products use the groups of that copy published so far and the rows in place for the rest.
/// The copy is made at construction (`new`) or later by a [`PackJob`] (`new_deferred`),
/// possibly part by part. Both give the same bits (the packed kernels repeat the in-place
/// row arithmetic), so when each group switches does not matter.
#[derive(Clone)]
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    traits: &'static TypeTraits,
    data: WeightBytes,
    packed: Arc<OnceLock<(Arc<Packed>, KindKernels)>>,
    /// The per-row dot product the product computes (see [`QMatrix::row_dot`]).
    row_dot: VecDot,
    row_dot_x4: Option<VecDotX4>,
    /// The one it computes in products of `TILED_TOKENS` tokens or more, where that differs
    /// (`many_token_dot`).
    tiled_dot: Option<(VecDot, Option<VecDotX4>)>,
    /// The two-row, four-token kernel of the one-accumulator dots, and the token count from
    /// which the product computes them (see `sums_gemm`).
    sums_gemm: Option<(SumsGemm, usize)>,
    /// Eight rows at a time for one token, bit for bit `row_dot`, where the type has such a
    /// kernel (`simd::rows8_dot_for`, `simd::repacked_rows8_dot_for`).
    row_dot8: Option<crate::simd::Rows8Dot>,
    /// Four-token tiles two rows at a time (NVFP4) or on the tile's f32 activation scales
    /// (Q1_0), bit for bit `row_dot_x4`, where the type has such a kernel.
    row_dot2_x4: Option<crate::simd::Rows2X4Dot>,
    scaled_x4: Option<crate::simd::ScaledX4Dot>,
}

/// llama.cpp's repacking is on (FERROLLAMA_NO_REPACK=1 turns ours off, for comparisons).
fn repack_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERROLLAMA_NO_REPACK").map(|v| v != "1").unwrap_or(true))
}

/// True when llama.cpp's CPU backend repacks a `rows`-row matrix of this type: on x86 with
/// AVX2 it repacks Q4_0, IQ4_NL and Q4_K matrices whose row count is a multiple of 8, whose
/// kernels round differently from `vec_dot` (`scalar::repacked`).
fn llama_repacks(t: &'static TypeTraits, rows: usize) -> bool {
    t.vec_dot_repacked.is_some() && t.isa >= crate::Isa::Avx2 && rows % 8 == 0
}

/// The dot product llama.cpp's CPU backend uses for each row of such a matrix.
fn llama_row_dot(t: &'static TypeTraits, rows: usize) -> (VecDot, Option<VecDotX4>) {
    match t.vec_dot_repacked {
        Some(dot) if llama_repacks(t, rows) => (dot, t.vec_dot_repacked_x4),
        _ => (t.vec_dot, t.vec_dot_x4),
    }
}

/// The many-token kernels (`SumsGemm`) and the token count from which they serve: the
/// products whose dot is one accumulator fed exact block sums (`scalar::repacked`), Q8_0 and
/// Q5_0 from `TILED_TOKENS` (`many_token_dot`), Q4_0, IQ4_NL, MXFP4 and Q4_K where llama.cpp
/// repacks them, always; Q6_K; and the i-quants from `TILED_TOKENS` (llama.cpp's tiled
/// arithmetic).
fn sums_gemm(t: &'static TypeTraits, rows: usize) -> Option<(SumsGemm, usize)> {
    let gemm = SumsGemm::for_type(t.ty, t.isa)?;
    match t.ty {
        GgmlType::Q8_0 | GgmlType::Q5_0 => many_token_dot(t).map(|_| (gemm, TILED_TOKENS)),
        // Q6_K's octets compute ggml's vec_dot lanes, its arithmetic at every token count;
        // below 8 tokens decoding the octets costs more than they save (4864 x 896, one
        // thread: 8 tokens 42.4 GMAC/s against the four-token kernel's 38.6).
        GgmlType::Q6_K => Some((gemm, 8)),
        // The i-quants' octets compute llama.cpp's tiled arithmetic, which it uses from 8 tokens.
        ty if is_iquant(ty) => Some((gemm, TILED_TOKENS)),
        // The ternary types' octets (AVX-512 VNNI) compute ggml's vec_dot lanes, the row dot
        // at every token count; from 8 tokens, as Q6_K's.
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => Some((gemm, 8)),
        // Q2_0's (AVX-512 VNNI) compute the generic kernel's exact sub-block sums and float
        // steps, also at every token count.
        GgmlType::Q2_0 => Some((gemm, 8)),
        // Q1_0's (AVX-512 VNNI) ggml's AVX2 vec_dot lanes, its arithmetic at every token count.
        GgmlType::Q1_0 => Some((gemm, 8)),
        // NVFP4's (AVX-512 VNNI) its vec_dot lanes likewise.
        GgmlType::NVFP4 => Some((gemm, 8)),
        _ => llama_repacks(t, rows).then_some((gemm, 1)),
    }
}

/// Tokens from which llama.cpp's CPU backend multiplies the k-quant matrices it does not
/// repack with its tiled product (`ggml-cpu/tiled`), whose one float accumulator per output
/// rounds differently from `vec_dot`; and from which ferrollama computes Q8_0 and Q5_0
/// products with one accumulator (`TypeTraits::vec_dot_tiled`).
pub const TILED_TOKENS: usize = 8;

/// The dot of products of `TILED_TOKENS` tokens or more, where it is not the row dot:
/// llama.cpp's tiled product's for Q3_K, Q5_K, IQ4_XS and the i-quants (Q2_K is repacked there, Q4_K and
/// Q6_K are repacked here: their groups run `vec_dot`'s order, and their leftover rows must
/// agree with the groups), ferrollama's one accumulator for Q8_0 and Q5_0 (its packed
/// groups compute the same).
fn many_token_dot(t: &'static TypeTraits) -> Option<(VecDot, Option<VecDotX4>)> {
    let tiled = matches!(t.ty, GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::IQ4_XS | GgmlType::Q8_0 | GgmlType::Q5_0) || is_iquant(t.ty);
    tiled.then_some(t.vec_dot_tiled.map(|d| (d, t.vec_dot_tiled_x4))).flatten()
}

/// The i-quants of 1 to 3 bits, which llama.cpp's tiled product also takes from 8 tokens.
fn is_iquant(ty: GgmlType) -> bool {
    use GgmlType as T;
    matches!(ty, T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S | T::IQ1_M)
}

impl QMatrix {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes) -> Result<QMatrix, TensorError> {
        Self::with_layout(ty, rows, cols, data, repack_enabled())
    }

    /// A matrix used in place only (`repack` false) or also repacked where this CPU has
    /// packed kernels for its type (`repack` true, what `new` does): for comparisons.
    pub fn with_layout(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes, repack: bool) -> Result<QMatrix, TensorError> {
        let traits = traits(ty).ok_or(TensorError::Unsupported(ty))?;
        if cols % traits.block_size != 0 {
            return Err(TensorError::Shape(format!("{cols} columns is not a multiple of {ty}'s block size")));
        }
        let want = traits.row_bytes(cols) * rows;
        if data.bytes().len() != want {
            return Err(TensorError::Shape(format!(
                "{rows}x{cols} {ty} needs {want} bytes, found {}", data.bytes().len()
            )));
        }
        let (row_dot, row_dot_x4) = llama_row_dot(traits, rows);
        let tiled_dot = many_token_dot(traits);
        let sums_gemm = sums_gemm(traits, rows);
        let row_dot8 = if llama_repacks(traits, rows) {
            crate::simd::repacked_rows8_dot_for(ty, traits.isa)
        } else {
            crate::simd::rows8_dot_for(ty, traits.isa)
        };
        let (row_dot2_x4, scaled_x4) = (crate::simd::rows2_x4_dot_for(ty, traits.isa), crate::simd::scaled_x4_dot_for(ty, traits.isa));
        let m = QMatrix { ty, rows, cols, traits, data, packed: Arc::new(OnceLock::new()), row_dot, row_dot_x4, tiled_dot, sums_gemm, row_dot8, row_dot2_x4, scaled_x4 };
        if repack {
            if let Some(job) = m.pack_job() {
                job.run(usize::MAX);
            }
        }
        Ok(m)
    }

    /// A matrix whose repacked copy is left to the returned job (None when it gets none):
    /// the caller runs it when it likes, on any thread, e.g. after loading so that loading
    /// does not wait for it.
    pub fn new_deferred(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes) -> Result<(QMatrix, Option<PackJob>), TensorError> {
        let m = Self::with_layout(ty, rows, cols, data, false)?;
        let job = if repack_enabled() { m.pack_job() } else { None };
        Ok((m, job))
    }

    fn pack_job(&self) -> Option<PackJob> {
        let kind = PackKind::of(self.ty).filter(|k| self.rows >= packed::GROUP && (!k.repacked_by_llama() || self.rows % 8 == 0))?;
        let kernels = packed::kernels(kind)?;
        Some(PackJob { slot: Arc::downgrade(&self.packed), data: self.data.clone(), kind, kernels, rows: self.rows, cols: self.cols })
    }

    /// The dot product of one weight row with one activation row (of the `vec_dot_type`)
    /// that the product computes for every output, bit for bit.
    pub fn row_dot(&self) -> VecDot { self.row_dot }
    /// The dot product every output of an `n_tokens`-token product is computed with.
    pub fn row_dot_for(&self, n_tokens: usize) -> VecDot { self.dots_for(n_tokens, false).0 }
    /// The dots of an `n_tokens`-token product (`batch_invariant`: of a many-token one).
    fn dots_for(&self, n_tokens: usize, batch_invariant: bool) -> (VecDot, Option<VecDotX4>) {
        match self.tiled_dot {
            Some(tiled) if batch_invariant || n_tokens >= TILED_TOKENS => tiled,
            _ => (self.row_dot, self.row_dot_x4),
        }
    }
    /// True when the products use a repacked copy of every whole 16-row group.
    pub fn is_packed(&self) -> bool { self.packed.get().is_some_and(|(p, _)| p.ready_groups() == p.n_groups) }
    pub fn traits(&self) -> &'static TypeTraits { self.traits }
    pub fn row_bytes(&self) -> usize { self.traits.row_bytes(self.cols) }
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.bytes()[r * rb..(r + 1) * rb]
    }
    /// Row `r` as f32 (embedding lookup).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        (self.traits.to_f32)(self.row(r), &mut out[..self.cols]);
    }
}

/// The repacking of one matrix, to run later (see [`QMatrix::new_deferred`]).
pub struct PackJob {
    /// Gone when every copy of the matrix was dropped: then there is nothing to do.
    slot: Weak<OnceLock<(Arc<Packed>, KindKernels)>>,
    data: WeightBytes,
    kind: PackKind,
    kernels: KindKernels,
    rows: usize,
    cols: usize,
}

impl PackJob {
    /// Repacks on up to `max_threads` threads; true when the matrix now has its copy (false:
    /// the matrix is gone, or was packed already).
    pub fn run(self, max_threads: usize) -> bool {
        let Some(slot) = self.slot.upgrade() else { return false };
        if slot.get().is_some() {
            return false;
        }
        let packed = Packed::new(self.kind, self.data.bytes(), self.rows, self.cols, max_threads);
        slot.set((Arc::new(packed), self.kernels)).is_ok()
    }

    /// Repacks on the calling thread, publishing the copy about `part_bytes` of source at a
    /// time: after each part, `on_part(range)` is told which bytes of the matrix's rows the
    /// products no longer read (the caller may drop their pages), and may return false to
    /// stop there (the rest of the rows stay in place). When every group is copied, waits
    /// for the products still reading rows in place and tells `on_part` once more of every
    /// group's bytes: those products may have touched pages of parts already dropped.
    /// True when every group was copied.
    pub fn run_in_parts(self, part_bytes: usize, mut on_part: impl FnMut(Range<usize>) -> bool) -> bool {
        let Some(slot) = self.slot.upgrade() else { return false };
        let packed = Arc::new(Packed::allocate(self.kind, self.rows, self.cols));
        if slot.set((packed.clone(), self.kernels)).is_err() {
            return false;
        }
        let groups_per_part = (part_bytes / packed.src_bytes(1).max(1)).max(1);
        let src = self.data.bytes();
        while packed.ready_groups() < packed.n_groups {
            let done = packed.ready_groups();
            packed.fill_to(src, done + groups_per_part, 1);
            if !on_part(packed.src_bytes(done)..packed.src_bytes(packed.ready_groups())) {
                return false;
            }
        }
        packed.wait_for_in_place_readers();
        on_part(0..packed.src_bytes(packed.n_groups));
        true
    }
}

/// Buffers a matrix product reuses between calls (the quantized activations).
#[derive(Default)]
pub struct MatmulScratch {
    quantized: Vec<u8>,
    packed: PackedActs,
    /// Batch-invariant products: every output is computed with the arithmetic of many-token
    /// products whatever the token count (the types whose arithmetic changes at
    /// `TILED_TOKENS` take their one-accumulator dot from one token on), so that a token's
    /// outputs do not depend on the batch it is in.
    pub batch_invariant: bool,
}

/// Tokens per weight-row pass when a four-token kernel exists.
const TOKEN_TILE: usize = 4;
/// Weight bytes a task keeps hot while it runs every token tile over them (fits in L2).
const ROW_CHUNK_BYTES: usize = 128 * 1024;

/// out[t * w.rows + r] = w.row(r) · x[t * w.cols ..], for t in 0..n_tokens, with the
/// activations first converted to the weight type's `vec_dot_type`.
///
/// Every output is computed by the same kernel call whatever the thread count and however
/// the tokens are tiled (the four-token kernels are bit-identical to the one-token ones),
/// so the result does not depend on `threads`; it depends on `n_tokens` only where the dot
/// changes at `TILED_TOKENS` (`QMatrix::row_dot_for`: Q3_K, Q5_K, IQ4_XS and the i-quants as in llama.cpp,
/// Q8_0 and Q5_0).
pub fn matmul(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: &Threads) {
    assert!(x.len() >= n_tokens * w.cols && out.len() >= n_tokens * w.rows, "matmul operands too short");
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    let dot_traits = traits(w.traits.vec_dot_type).expect("vec_dot types are in the table");
    let mut first_plain_row = 0;
    let packing = w.packed.get();
    // While repacking runs, this product may read rows in place that the repacking thread
    // is about to publish and drop: it tells the thread to wait for it (see `run_in_parts`).
    let _reader = packing.filter(|(p, _)| p.ready_groups() < p.n_groups).map(|(p, _)| p.in_place_reader());
    // The groups whose copy is published (all, once repacking is done) run packed.
    if let Some((p, kk)) = packing.filter(|(p, _)| p.ready_groups() > 0) {
        let n_groups = p.ready_groups();
        packed::pack_activations(p.kind.act(), dot_traits, &x[..n_tokens * w.cols], w.cols, n_tokens, &mut scratch.packed, threads);
        packed::product(p, n_groups, kk, &scratch.packed, n_tokens, scratch.batch_invariant, out.as_mut_ptr(), w.rows, threads);
        first_plain_row = n_groups * packed::GROUP;
        if first_plain_row == w.rows {
            return;
        }
    }
    let xrow = dot_traits.row_bytes(w.cols);
    let activations: &[u8] = if dot_traits.ty == GgmlType::F32 {
        f32_bytes(&x[..n_tokens * w.cols])
    } else {
        quantize_activations(dot_traits, &x[..n_tokens * w.cols], w.cols, n_tokens, scratch, threads);
        &scratch.quantized[..n_tokens * xrow]
    };
    let plain_rows = w.rows - first_plain_row;
    let rows_per_task = rows_per_task(w, plain_rows, n_tokens, threads.n_threads());
    let n_tasks = plain_rows.div_ceil(rows_per_task);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let n_threads = threads.n_threads();
    let invariant = scratch.batch_invariant;
    threads.run(n_tasks, |task| {
        let piece = piece_of_task(task, n_tasks, n_threads);
        let rows = first_plain_row + piece * rows_per_task..(first_plain_row + (piece + 1) * rows_per_task).min(w.rows);
        // SAFETY: tasks own disjoint row ranges, so each (t, r) is written by one task.
        unsafe { rows_product(w, activations, xrow, n_tokens, invariant, rows, &out_ptr) };
    });
}

/// The piece of the rows that task `task` computes. The threads claim tasks in turn, so with
/// the pieces in thread-sized regions (task k of thread j: piece k of region j) each thread's
/// successive tasks are usually neighbours: the eight-row kernels prefetch the rows after
/// their own, which are then the next task's, rather than another core's. Claiming stays
/// dynamic (a slowed thread still takes fewer tasks); only the order of the pieces changes.
/// 896 x 4864 NVFP4, one token, 2 threads: 0.343 -> 0.33 ms.
fn piece_of_task(task: usize, n_tasks: usize, n_threads: usize) -> usize {
    if n_threads < 2 || n_tasks % n_threads != 0 {
        return task;
    }
    (task % n_threads) * (n_tasks / n_threads) + task / n_threads
}

/// The activations as bytes (F32 rows are used in place).
fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

/// Converts every token row to the vec_dot type, in parallel when there are many.
fn quantize_activations(dt: &TypeTraits, x: &[f32], cols: usize, n_tokens: usize, scratch: &mut MatmulScratch, threads: &Threads) {
    let xrow = dt.row_bytes(cols);
    if scratch.quantized.len() < xrow * n_tokens {
        scratch.quantized.resize(xrow * n_tokens, 0);
    }
    let from_f32 = dt.from_f32.expect("vec_dot types can be quantized");
    let dst = &mut scratch.quantized[..xrow * n_tokens];
    if n_tokens < 4 || threads.n_threads() == 1 {
        for (xs, d) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(xrow)) {
            from_f32(xs, d);
        }
        return;
    }
    let per_task = n_tokens.div_ceil(threads.n_threads() * 2);
    let dst_ptr = SendPtr(dst.as_mut_ptr() as *mut f32);
    threads.run(n_tokens.div_ceil(per_task), |task| {
        let tokens = task * per_task..((task + 1) * per_task).min(n_tokens);
        let dst_ptr = &dst_ptr; // the whole wrapper, not its raw-pointer field
        let base = dst_ptr.0 as *mut u8;
        for t in tokens {
            // SAFETY: each token's destination row is written by exactly one task.
            let d = unsafe { std::slice::from_raw_parts_mut(base.add(t * xrow), xrow) };
            from_f32(&x[t * cols..(t + 1) * cols], d);
        }
    });
}

/// Rows per task: an even share per thread (so the threads finish together), cut into
/// pieces for load balance when other work shares the cores: eight a thread for the short
/// products of one to three tokens, where a core taken away for a moment (a neighbour on a
/// shared host) otherwise leaves the other threads waiting for its half (llama.cpp's
/// one-token chunks are 64 rows).
fn rows_per_task(w: &QMatrix, rows: usize, n_tokens: usize, n_threads: usize) -> usize {
    let pieces = if n_tokens >= TOKEN_TILE { 4 } else { 8 };
    let share = rows.div_ceil(n_threads * pieces);
    let per_chunk = (ROW_CHUNK_BYTES / w.row_bytes().max(1)).max(1);
    let rows = if n_tokens >= TOKEN_TILE { share.min(per_chunk.max(16)) } else { share };
    // Whole octets for the octet kernel (see `sums_tiles`) and the eight-row kernels.
    let octets = (n_tokens >= TOKEN_TILE && w.sums_gemm.is_some()) || (n_tokens < TOKEN_TILE && w.row_dot8.is_some());
    if octets { rows.next_multiple_of(8) } else { rows.max(1) }
}

/// Asks for `bytes` to be brought into the cache (a hint: no effect on results).
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch reads nothing architecturally; the address is in `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr() as *const i8) };
    }
}

/// What a thread keeps between the tiles of one row range: the tile's activation factors
/// and the range's weight octets, decoded once per product (`SumsGemm::decode_octet`).
#[derive(Default)]
struct TileScratch {
    factors: TileFactors,
    octets: Vec<u8>,
    /// A copy of two octets while `SumsGemm::pair_octets` interleaves them.
    pair_scratch: Vec<u8>,
}

thread_local! {
    /// A tile's Q8_0 activation scales as f32 (`simd::q8_0_tile_scales`).
    static TILE_SCALES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static TILE_SCRATCH: std::cell::RefCell<TileScratch> = std::cell::RefCell::new(TileScratch::default());
}

/// Rows `rows` of the product for the whole quads of four tokens, up to `OCTET_MAX_QUADS`
/// quads a tile: groups of eight rows through the octet kernel where the kind has one
/// (decoded once for all the tiles), the rest through the two-row kernel (an odd last row
/// through the four-token dot, which gives the same bits); returns the first token it left.
///
/// # Safety
/// As `rows_product`.
unsafe fn sums_tiles(w: &QMatrix, gemm: SumsGemm, act: &[u8], xrow: usize, n_tokens: usize, invariant: bool, rows: Range<usize>,
                     out: &SendPtr<f32>) -> usize {
    let (all, rb) = (w.data.bytes(), w.row_bytes());
    let (row_dot, row_dot_x4) = w.dots_for(n_tokens, invariant);
    let n_octets = rows.len() / 8;
    let octet_bytes = gemm.octet_bytes(w.cols);
    let mut t0 = 0;
    TILE_SCRATCH.with(|scratch| {
        let TileScratch { factors: f, octets, pair_scratch } = &mut *scratch.borrow_mut();
        // With one tile of tokens each octet is used once: decode it just before, into one
        // slot that stays in L1, rather than all of them into L2 first.
        let one_tile = n_tokens < TOKEN_TILE * (OCTET_MAX_QUADS + 1);
        let slots = if one_tile { n_octets.min(1) } else { n_octets };
        if octets.len() < slots * octet_bytes {
            octets.resize(slots * octet_bytes, 0);
        }
        let decode = |o: usize, slot: &mut [u8]| {
            let first = rows.start + 8 * o;
            gemm.decode_octet(w.cols, &all[first * rb..(first + 8) * rb], slot);
        };
        // With all the octets decoded, two at a time where the kind has such a kernel.
        let paired = if !one_tile && gemm.has_octet_pairs() { n_octets / 2 } else { 0 };
        if !one_tile {
            for o in 0..n_octets {
                decode(o, &mut octets[o * octet_bytes..(o + 1) * octet_bytes]);
            }
            for p in 0..paired {
                gemm.pair_octets(w.cols, &mut octets[2 * p * octet_bytes..(2 * p + 2) * octet_bytes], pair_scratch);
            }
        }
        let mut pairs = [[[0f32; 4]; 2]; SUMS_MAX_QUADS];
        let put = |t: usize, r: usize, v: f32| *out.0.add(t * w.rows + r) = v;
        while t0 + TOKEN_TILE <= n_tokens {
            let quads = ((n_tokens - t0) / TOKEN_TILE).min(OCTET_MAX_QUADS);
            let xs = &act[t0 * xrow..(t0 + quads * TOKEN_TILE) * xrow];
            gemm.factors(w.cols, xs, xrow, quads, f);
            // Two pairs (32 rows) a call where there are two.
            for p in (0..paired).step_by(2) {
                let n_pairs = (paired - p).min(2);
                let dst = out.0.add(t0 * w.rows + rows.start + 16 * p);
                gemm.run_octet_pair(w.cols, &octets[2 * p * octet_bytes..2 * (p + n_pairs) * octet_bytes], n_pairs, xs, xrow, 0, quads, f, dst, w.rows);
            }
            for o in 2 * paired..n_octets {
                let slot = if one_tile { 0 } else { o };
                let octet = &mut octets[slot * octet_bytes..(slot + 1) * octet_bytes];
                // The octet's eight outputs of each token are consecutive in `out`.
                let dst = out.0.add(t0 * w.rows + rows.start + 8 * o);
                if !one_tile {
                    gemm.run_octet(w.cols, octet, xs, xrow, 0, quads, f, dst, w.rows);
                    continue;
                }
                decode(o, octet);
                // The next octet's weights come from memory while this one is multiplied
                // (its eight interleaved row streams do not start the hardware prefetch), a
                // share of its rows before each quad: all at once, the requests outnumber
                // the core's outstanding misses and the prefetches stall the multiplies.
                let next = (o + 1 < n_octets).then(|| &all[(rows.start + 8 * (o + 1)) * rb..(rows.start + 8 * (o + 2)) * rb]);
                for q in 0..quads {
                    if let Some(next) = next {
                        prefetch(&next[8 * q / quads * rb..8 * (q + 1) / quads * rb]);
                    }
                    gemm.run_octet(w.cols, octet, xs, xrow, q, 1, f, dst.add(4 * q * w.rows), w.rows);
                }
            }
            let mut r = rows.start + 8 * n_octets;
            while gemm.has_pairs() && r + 2 <= rows.end {
                for q0 in (0..quads).step_by(SUMS_MAX_QUADS) {
                    let part = (quads - q0).min(SUMS_MAX_QUADS);
                    gemm.run(w.cols, &all[r * rb..(r + 2) * rb], xs, xrow, q0, part, f, &mut pairs);
                    for (q, quad) in pairs.iter().enumerate().take(part) {
                        for (k, row) in quad.iter().enumerate() {
                            for (t, v) in row.iter().enumerate() {
                                put(t0 + 4 * (q0 + q) + t, r + k, *v);
                            }
                        }
                    }
                }
                r += 2;
            }
            for r in r..rows.end {
                let wr = &all[r * rb..(r + 1) * rb];
                for q in 0..quads {
                    let xq = &xs[4 * q * xrow..];
                    let mut four = [0f32; 4];
                    match row_dot_x4 {
                        Some(x4) => x4(w.cols, wr, xq, xrow, &mut four),
                        None => four = std::array::from_fn(|t| row_dot(w.cols, wr, &xq[t * xrow..(t + 1) * xrow])),
                    }
                    for (t, v) in four.iter().enumerate() {
                        put(t0 + 4 * q + t, r, *v);
                    }
                }
            }
            t0 += quads * TOKEN_TILE;
        }
    });
    t0
}

/// Computes rows `rows` of the product for every token, writing through `out`.
///
/// # Safety
/// `out` must point to n_tokens * w.rows floats, and no other thread may write the
/// entries of these rows.
unsafe fn rows_product(w: &QMatrix, act: &[u8], xrow: usize, n_tokens: usize, invariant: bool, rows: Range<usize>, out: &SendPtr<f32>) {
    let (all, rb) = (w.data.bytes(), w.row_bytes());
    let row = |r: usize| &all[r * rb..(r + 1) * rb];
    let (row_dot, row_dot_x4) = w.dots_for(n_tokens, invariant);
    // batch-invariant: the kernels that compute the tiled dot's arithmetic serve every tile
    let tiled_from = |from: usize| if invariant && w.tiled_dot.is_some() { 1 } else { from };
    let mut t0 = match w.sums_gemm {
        Some((gemm, from)) if n_tokens >= tiled_from(from).max(TOKEN_TILE) => sums_tiles(w, gemm, act, xrow, n_tokens, invariant, rows.clone(), out),
        _ => 0,
    };
    if let Some(x4) = row_dot_x4 {
        let mut res = [0f32; 4];
        // NVFP4 takes two rows at a time, Q1_0 its activation scales converted once per tile
        // (the same bits as the four-token dot).
        while t0 + TOKEN_TILE <= n_tokens {
            let xs = &act[t0 * xrow..(t0 + TOKEN_TILE) * xrow];
            if let Some(dot) = w.scaled_x4 {
                TILE_SCALES.with(|dx| {
                    let dx = &mut *dx.borrow_mut();
                    crate::simd::q8_0_tile_scales(w.cols, xs, xrow, dx);
                    for r in rows.clone() {
                        dot(w.cols, row(r), xs, xrow, dx, &mut res);
                        for (k, v) in res.iter().enumerate() {
                            *out.0.add((t0 + k) * w.rows + r) = *v;
                        }
                    }
                });
                t0 += TOKEN_TILE;
                continue;
            }
            let mut r = rows.start;
            while let Some(dot2) = w.row_dot2_x4.filter(|_| r + 2 <= rows.end) {
                let mut res2 = [[0f32; 4]; 2];
                dot2(w.cols, &all[r * rb..(r + 2) * rb], xs, xrow, &mut res2);
                for (k, row) in res2.iter().enumerate() {
                    for (t, v) in row.iter().enumerate() {
                        *out.0.add((t0 + t) * w.rows + r + k) = *v;
                    }
                }
                r += 2;
            }
            for r in r..rows.end {
                x4(w.cols, row(r), xs, xrow, &mut res);
                for (k, v) in res.iter().enumerate() {
                    *out.0.add((t0 + k) * w.rows + r) = *v;
                }
            }
            t0 += TOKEN_TILE;
        }
    }
    // The tokens left take eight rows at a time where the type has such a kernel: the row
    // dot's bits, with the activation's loads and scales shared by the rows (and, for the
    // one-accumulator kinds, one reduction for the eight rows' block sums).
    let dot8 = w.row_dot8.filter(|_| w.tiled_dot.is_none() || (!invariant && n_tokens < TILED_TOKENS));
    for tok in t0..n_tokens {
        let xs = &act[tok * xrow..(tok + 1) * xrow];
        let mut r = rows.start;
        while let Some(dot8) = dot8.filter(|_| r + 8 <= rows.end) {
            let mut eight = [0f32; 8];
            dot8(w.cols, &all[r * rb..(r + 8) * rb], xs, &mut eight);
            for (k, v) in eight.iter().enumerate() {
                *out.0.add(tok * w.rows + r + k) = *v;
            }
            r += 8;
        }
        for r in r..rows.end {
            *out.0.add(tok * w.rows + r) = row_dot(w.cols, row(r), xs);
        }
    }
}


#[cfg(test)]
mod tests {
    use super::piece_of_task;

    /// Every piece is computed by exactly one task, whatever the counts; with as many tasks
    /// per thread as pieces per region, a thread claiming every n-th task walks its region.
    #[test]
    fn tasks_cover_every_piece_once() {
        for n_threads in 1..6 {
            for n_tasks in 0..50 {
                let mut seen = vec![false; n_tasks];
                for task in 0..n_tasks {
                    let piece = piece_of_task(task, n_tasks, n_threads);
                    assert!(piece < n_tasks && !seen[piece], "{n_threads} threads, {n_tasks} tasks: task {task}");
                    seen[piece] = true;
                }
            }
        }
        let first_thread: Vec<usize> = (0..16).step_by(2).map(|t| piece_of_task(t, 16, 2)).collect();
        assert_eq!(first_thread, (0..8).collect::<Vec<_>>());
    }
}
