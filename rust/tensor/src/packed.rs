//! Weight matrices repacked at load into groups of 16 rows interleaved four bytes at a time,
//! so that one 512-bit vector holds the same four weights of 16 rows and one VPDPBUSD against
//! a broadcast activation dword advances 16 dot products (the layout idea of ggml's
//! repack.cpp, with AVX-512's 16 lanes). Activations are quantized once per product into a
//! matching layout (quants, f32 scales, and per-block integer corrections). AVX2 machines
//! repack Q8_0, Q5_0 and Q4_K into the same groups and read each as two halves of eight rows
//! (`simd::packed_avx2`); two details of the layout depend on the ISA (`q8_0_offset`,
//! `q5_0_bits_by_row`).
//!
//! Numerics: the kernels reproduce, bit for bit, the arithmetic llama.cpp uses for each type
//! on an AVX-512 CPU, with one exception:
//! - Q8_0, Q5_0 (ggml's `vec_dot` and llamafile's tinyBLAS): eight float partial sums per
//!   output, lane l gathering the products of bytes 4l..4l+3 of every block, fused
//!   multiply-added once per block with d_w * d_x, reduced in `hsum_float_8`'s order.
//!   The exception: in products of 8 tokens or more (`crate::TILED_TOKENS`, where
//!   llama.cpp switches its k-quants to one accumulator) ferrollama computes these two
//!   types with one accumulator per output, updated once per block with the block's exact
//!   integer sum, as llama.cpp's repacked Q4_0 (`scalar::repacked::vec_dot_q8_0_q8_0_blocks`).
//!   The eight lanes cost a conversion and an FMA per VPDPBUSD, which held these products
//!   to a quarter of the VNNI peak and the 8-sequence decode step to 3.2x one sequence's
//!   time. One accumulator rounds once per block from an exact sum (no less accurate) and
//!   keeps the real models' divergence from llama.cpp where it was (see the closing notes
//!   of issue 8); decoding one token stays bit for bit llama.cpp's;
//! - Q6_K (ggml's `vec_dot_q6_K_q8_K`): the same eight lanes, once per super-block;
//! - Q4_0, IQ4_NL, Q4_K (llama.cpp repacks these): one float accumulator per output, see
//!   `scalar::repacked`.
//!
//! Group layout: a group is a sequence of chunks of one or two blocks (32 elements for the
//! legacy types, 256 for the k-quants), each chunk a multiple of 64 bytes holding the block's
//! fields plane by plane (scales, quants, ...), so that a product streams every matrix
//! front to back as one sequence of cache lines (separate plane streams per group measured
//! 10-80 % slower for one token: the hardware prefetchers restart on every short stream).

use crate::scalar::kquants::{scale_min_k4, QK_K, Q4_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use crate::scalar::legacy::{Q4_0_BYTES, Q5_0_BYTES, Q8_0_BYTES, QK};
use crate::util::{f16_to_f32, rd_f32, rd_i16, rd_u32};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::{GgmlType, SendPtr, Threads, TypeTraits};

/// Rows per group.
pub const GROUP: usize = 16;

/// The packed types. The discriminants are the kernels' `KIND` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackKind {
    Q8_0,
    Q5_0,
    Q4_0,
    Iq4Nl,
    Q4K,
    Q6K,
}

/// Index in a `Q8Lanes` block's aux of two 16-bit corrections: -offset times the sum of the
/// block's bytes 4l and 4l + 1 over the lanes l (low word), of bytes 4l + 2 and 4l + 3 (high
/// word); the words of the pair sums `vpmaddubsw` leaves (AVX2 Q5_0 kernels).
pub const Q5_0_WORD_CORRECTIONS: usize = 8;

/// How a kind's activations are quantized and corrected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    /// Q8_0 blocks; per block and lane l: -offset * (sum of bytes 4l..4l+3), then the
    /// word corrections (`Q5_0_WORD_CORRECTIONS`), then the lanes' total (10 i32).
    Q8Lanes { offset: i32 },
    /// Q8_0 blocks; per block: -offset * (sum of the 32 bytes) (1 i32).
    Q8Block { offset: i32 },
    /// Q8_K blocks; per block the 16 group sums as 8 pairs of i16 (8 i32).
    Q8KPairs,
    /// Q8_K blocks; per block the 8 sums of 32 as 4 pairs of i16 (4 i32).
    Q8KSums32,
}

impl ActKind {
    /// i32 entries of `aux` per block.
    pub fn aux_per_block(self) -> usize {
        match self {
            ActKind::Q8Lanes { .. } => 10,
            ActKind::Q8KPairs => 8,
            ActKind::Q8Block { .. } => 1,
            ActKind::Q8KSums32 => 4,
        }
    }
    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            ActKind::Q8Lanes { .. } | ActKind::Q8Block { .. } => QK,
            ActKind::Q8KPairs | ActKind::Q8KSums32 => QK_K,
        }
    }
}

impl PackKind {
    /// The packed kind of a type, if it has one.
    pub fn of(ty: GgmlType) -> Option<PackKind> {
        Some(match ty {
            GgmlType::Q8_0 => PackKind::Q8_0,
            GgmlType::Q5_0 => PackKind::Q5_0,
            GgmlType::Q4_0 => PackKind::Q4_0,
            GgmlType::IQ4_NL => PackKind::Iq4Nl,
            GgmlType::Q4_K => PackKind::Q4K,
            GgmlType::Q6_K => PackKind::Q6K,
            _ => return None,
        })
    }

    /// True for the kinds computed with llama.cpp's repacked arithmetic, which llama.cpp uses
    /// only for matrices whose row count is a multiple of 8 (others take `vec_dot`'s).
    pub fn repacked_by_llama(self) -> bool {
        matches!(self, PackKind::Q4_0 | PackKind::Iq4Nl | PackKind::Q4K)
    }

    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            PackKind::Q4K | PackKind::Q6K => QK_K,
            _ => QK,
        }
    }

    /// Bytes per block of one plain row.
    fn row_block_bytes(self) -> usize {
        match self {
            PackKind::Q8_0 => Q8_0_BYTES,
            PackKind::Q5_0 => Q5_0_BYTES,
            PackKind::Q4_0 | PackKind::Iq4Nl => Q4_0_BYTES,
            PackKind::Q4K => Q4_K_BYTES,
            PackKind::Q6K => Q6_K_BYTES,
        }
    }

    /// Blocks per chunk: two for the legacy types, so that chunks fill whole cache lines.
    pub fn blocks_per_chunk(self) -> usize {
        if self.block() == QK { 2 } else { 1 }
    }

    /// Byte offset of each plane in a chunk (the planes of a chunk's blocks follow each other
    /// within the plane), and the chunk's size.
    pub fn chunk_layout(self) -> ([usize; 5], usize) {
        let (sizes, bpc) = (self.planes(), self.blocks_per_chunk());
        let mut off = [0usize; 5];
        let mut at = 0;
        for (i, &sz) in sizes.iter().enumerate() {
            // Planes read as whole 512-bit vectors start on a cache line.
            if sz >= 64 {
                at = align64(at);
            }
            off[i] = at;
            at += sz * bpc;
        }
        (off, align64(at))
    }

    /// Bytes per block of a group, plane by plane.
    pub fn planes(self) -> &'static [usize] {
        match self {
            // d[16] f16 | quants + `q8_0_offset()`: [lane 8][row 16][4]
            PackKind::Q8_0 => &[32, 512],
            // d[16] | qs: [lane 4][row 16][4] (low nibbles: lanes 0..4, high: 4..8) |
            // fifth bits: [lane 8] u64 masks, bit 4r+k for byte k of row r (or by row,
            // `q5_0_bits_by_row`)
            PackKind::Q5_0 => &[32, 256, 64],
            // d[16] | qs as Q5_0
            PackKind::Q4_0 | PackKind::Iq4Nl => &[32, 256],
            // d[16] | dmin[16] | scales u8 [sub-block 8][row 16] | mins u8 [pair 4][row 16][2] |
            // qs: [pair 4][lane 8][row 16][4] (low nibbles: sub-block 2p, high: 2p+1)
            PackKind::Q4K => &[32, 32, 128, 128, 2048],
            // d[16] | scales i8 [pair 8][row 16][2] | quants: [half h 2][lane l 8] x
            // (ql bytes 64h + 4l.., ql bytes 64h + 32 + 4l.., qh bytes 32h + 4l..) each [row 16][4],
            // so that the kernel reads them in address order
            PackKind::Q6K => &[32, 256, 3072],
        }
    }

    /// The activation layout its kernels read.
    pub fn act(self) -> ActKind {
        match self {
            PackKind::Q8_0 => ActKind::Q8Lanes { offset: q8_0_offset() },
            PackKind::Q5_0 => ActKind::Q8Lanes { offset: 16 },
            PackKind::Q4_0 => ActKind::Q8Block { offset: 8 },
            PackKind::Iq4Nl => ActKind::Q8Block { offset: 128 },
            PackKind::Q4K => ActKind::Q8KSums32,
            PackKind::Q6K => ActKind::Q8KPairs,
        }
    }
}

/// Zeroed bytes aligned to 2 MiB and, on Linux, advised to be backed by transparent huge
/// pages: a product streams hundreds of megabytes, and with 4 KiB pages (under a hypervisor,
/// two-level page walks) the TLB misses cost a third of the memory bandwidth.
struct HugeBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// The mapping (Linux: start and length as mmap returned them).
    #[cfg(target_os = "linux")]
    map: (*mut libc::c_void, usize),
}

// SAFETY: plain owned bytes.
unsafe impl Send for HugeBuf {}
unsafe impl Sync for HugeBuf {}

const HUGE_ALIGN: usize = 2 << 20;

impl HugeBuf {
    /// On Linux an anonymous mapping: the kernel supplies zero pages on first write, so the
    /// threads that fill the buffer also take its page faults, in parallel.
    #[cfg(target_os = "linux")]
    fn zeroed(len: usize) -> HugeBuf {
        if len == 0 {
            return HugeBuf { ptr: std::ptr::NonNull::dangling(), len: 0, map: (std::ptr::null_mut(), 0) };
        }
        let total = len.checked_add(HUGE_ALIGN).expect("buffer size");
        // SAFETY: a fresh private anonymous mapping, no file, no fixed address.
        let raw = unsafe {
            libc::mmap(std::ptr::null_mut(), total, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(len, HUGE_ALIGN).expect("buffer size"));
        }
        let skip = (HUGE_ALIGN - raw as usize % HUGE_ALIGN) % HUGE_ALIGN;
        // SAFETY: skip < HUGE_ALIGN, inside the mapping of len + HUGE_ALIGN bytes.
        let start = unsafe { (raw as *mut u8).add(skip) };
        // SAFETY: advising our own mapping; failure only loses the hint.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        let ptr = std::ptr::NonNull::new(start).expect("mmap returned a non-null address");
        HugeBuf { ptr, len, map: (raw, total) }
    }

    #[cfg(not(target_os = "linux"))]
    fn zeroed(len: usize) -> HugeBuf {
        if len == 0 {
            return HugeBuf { ptr: std::ptr::NonNull::dangling(), len: 0 };
        }
        let layout = std::alloc::Layout::from_size_align(len, HUGE_ALIGN).expect("buffer size");
        // SAFETY: non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HugeBuf { ptr, len }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made in `zeroed`, unmapped once.
        unsafe {
            libc::munmap(self.map.0, self.map.1);
        }
        #[cfg(not(target_os = "linux"))]
        {
            let layout = std::alloc::Layout::from_size_align(self.len, HUGE_ALIGN).expect("buffer size");
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// The first `n_groups * 16` rows of a matrix in the packed layout, filled front to back
/// and published group by group: products read the first `ready_groups()` groups from here
/// and the other rows in place, so a copy being made is already used for what it holds.
pub struct Packed {
    pub kind: PackKind,
    pub n_groups: usize,
    pub cols: usize,
    /// Blocks per row.
    pub nb: usize,
    /// Byte offset of each plane inside a chunk.
    pub plane: [usize; 5],
    pub chunk_bytes: usize,
    pub group_bytes: usize,
    /// Bytes per plain row.
    row_bytes: usize,
    data: HugeBuf,
    /// Groups written and visible to readers (Release on publishing, Acquire on reading).
    ready: AtomicUsize,
    /// Held while groups are written, so that two fillers never write the same group.
    filling: Mutex<()>,
    /// Products running that may read unpublished rows in place (see `InPlaceReader`).
    in_place_readers: AtomicUsize,
}

/// A product that may read a matrix's rows in place (`Packed::in_place_reader`).
pub struct InPlaceReader<'a>(&'a AtomicUsize);

impl Drop for InPlaceReader<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn align64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

impl Packed {
    /// An empty copy of the whole groups of `rows` rows of `cols` elements: no group is
    /// ready, and the memory is taken only as groups are written.
    pub fn allocate(kind: PackKind, rows: usize, cols: usize) -> Packed {
        let nb = cols / kind.block();
        let (plane, chunk_bytes) = kind.chunk_layout();
        let group_bytes = nb.div_ceil(kind.blocks_per_chunk()) * chunk_bytes;
        let n_groups = rows / GROUP;
        let row_bytes = nb * kind.row_block_bytes();
        let data = HugeBuf::zeroed(group_bytes * n_groups);
        Packed { kind, n_groups, cols, nb, plane, chunk_bytes, group_bytes, row_bytes, data, ready: AtomicUsize::new(0), filling: Mutex::new(()), in_place_readers: AtomicUsize::new(0) }
    }

    /// Repacks the whole groups of `rows` rows of `cols` elements stored row-major in `src`,
    /// on up to `max_threads` threads.
    pub fn new(kind: PackKind, src: &[u8], rows: usize, cols: usize, max_threads: usize) -> Packed {
        let packed = Packed::allocate(kind, rows, cols);
        // Every core repacks a share of the groups (loading is this copy, and the first
        // touch of each new page, which the kernel zeroes).
        let n_threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(max_threads).min(packed.n_groups / 64).max(1);
        packed.fill_to(src, packed.n_groups, n_threads);
        packed
    }

    /// Groups that products may read.
    pub fn ready_groups(&self) -> usize {
        self.ready.load(Ordering::Acquire)
    }

    /// Counts a product as a possible reader of the rows in place until the guard drops.
    /// Taken before the product reads `ready_groups`: once every group is published and
    /// no reader is counted, no product reads the source rows again.
    pub fn in_place_reader(&self) -> InPlaceReader<'_> {
        self.in_place_readers.fetch_add(1, Ordering::SeqCst);
        // With the fence in `wait_for_in_place_readers`: either this product then sees every
        // group published, or the waiting thread sees it counted.
        std::sync::atomic::fence(Ordering::SeqCst);
        InPlaceReader(&self.in_place_readers)
    }

    /// Waits until no product counted by `in_place_reader` is running (each lasts one
    /// product: milliseconds). Call it after publishing the last group.
    pub fn wait_for_in_place_readers(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        while self.in_place_readers.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Bytes of the plain rows that the first `groups` groups hold.
    pub fn src_bytes(&self, groups: usize) -> usize {
        groups * GROUP * self.row_bytes
    }

    /// Writes groups `ready_groups()..upto` from `src` (the matrix's plain rows) on up to
    /// `n_threads` threads, then publishes them.
    pub fn fill_to(&self, src: &[u8], upto: usize, n_threads: usize) {
        let upto = upto.min(self.n_groups);
        assert!(src.len() >= self.src_bytes(upto), "repacking source too short");
        let _writer = self.filling.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let first = self.ready.load(Ordering::Acquire);
        if first >= upto || self.group_bytes == 0 {
            return;
        }
        let gb = self.group_bytes;
        // SAFETY: groups first..upto lie inside the buffer; no reader looks past `ready`
        // (= first) and the lock excludes other writers, so this is the only reference to
        // those bytes until they are published below.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.data.ptr.as_ptr().add(first * gb), (upto - first) * gb) };
        let rb = self.row_bytes;
        let repack_range = |g0: usize, dst: &mut [u8]| {
            for (i, out) in dst.chunks_exact_mut(gb).enumerate() {
                let g = g0 + i;
                repack_group(self.kind, &src[g * GROUP * rb..(g + 1) * GROUP * rb], rb, self.nb, out);
            }
        };
        let per_thread = (upto - first).div_ceil(n_threads.max(1));
        if n_threads <= 1 {
            repack_range(first, dst);
        } else {
            std::thread::scope(|scope| {
                for (k, part) in dst.chunks_mut(per_thread * gb).enumerate() {
                    let repack_range = &repack_range;
                    scope.spawn(move || repack_range(first + k * per_thread, part));
                }
            });
        }
        self.ready.store(upto, Ordering::Release);
    }

    /// The start of the packed groups (read only the first `ready_groups()`).
    pub fn as_ptr(&self) -> *const u8 {
        self.data.ptr.as_ptr()
    }
}

/// What packed Q8_0 quants are stored plus: 128 for AVX-512's VPDPBUSD, which multiplies
/// unsigned weights (an activation correction takes the offset back out), 0 for the AVX2
/// kernels, whose sign trick multiplies the signed bytes as they are (stored + 128, they
/// would need an XOR per vector, and LLVM then kept every lane's vectors live and spilled
/// them: 15 % slower).
pub fn q8_0_offset() -> i32 {
    if crate::dispatch::active_isa() >= crate::Isa::Avx512 { 128 } else { 0 }
}

/// Where packed Q5_0 keeps the fifth bits (plane 2, 64 bytes a block). AVX-512: per lane l a
/// 64-bit mask, bit 4r + k for byte k of row r (a mask register adds 16 where set). AVX2
/// (true): byte 4r + k holds that byte's bit of every lane, lane l in bit l, so that a
/// lane's bits come out of one vector by a shift and a mask.
pub fn q5_0_bits_by_row() -> bool {
    crate::dispatch::active_isa() < crate::Isa::Avx512
}

/// Scatters 16 plain rows into one group.
fn repack_group(kind: PackKind, src: &[u8], row_bytes: usize, nb: usize, dst: &mut [u8]) {
    let (q8_offset, q5_bits_by_row) = (q8_0_offset(), q5_0_bits_by_row());
    let bb = kind.row_block_bytes();
    let sizes = kind.planes();
    let (off, chunk) = kind.chunk_layout();
    let bpc = kind.blocks_per_chunk();
    for b in 0..nb {
        // The block b of each plane, as a mutable slice.
        let base = (b / bpc) * chunk;
        let mut p: [&mut [u8]; 5] = Default::default();
        let mut rest = &mut dst[..];
        let mut consumed = 0;
        for (i, &sz) in sizes.iter().enumerate() {
            let start = base + off[i] + (b % bpc) * sz;
            let (_, tail) = rest.split_at_mut(start - consumed);
            let (cur, tail) = tail.split_at_mut(sz);
            p[i] = cur;
            rest = tail;
            consumed = start + sz;
        }
        for r in 0..GROUP {
            let blk = &src[r * row_bytes + b * bb..r * row_bytes + (b + 1) * bb];
            match kind {
                PackKind::Q8_0 => {
                    p[0][2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                    for l in 0..8 {
                        for k in 0..4 {
                            p[1][l * 64 + r * 4 + k] = (blk[2 + 4 * l + k] as i8 as i32 + q8_offset) as u8;
                        }
                    }
                }
                PackKind::Q5_0 => {
                    p[0][2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                    scatter_nibbles(&blk[6..22], r, p[1]);
                    // Lane l's high bits (qh bits 4l..4l + 3) go to bits 4r..4r + 3 of the
                    // lane's 64-bit mask: one nibble of one byte.
                    let qh = rd_u32(blk, 2);
                    if q5_bits_by_row {
                        for (k, byte) in p[2][4 * r..4 * r + 4].iter_mut().enumerate() {
                            *byte = (0..8).map(|l| (((qh >> (4 * l + k)) & 1) as u8) << l).sum();
                        }
                    } else {
                        for l in 0..8 {
                            p[2][l * 8 + r / 2] |= (((qh >> (4 * l)) & 0xF) as u8) << (4 * (r % 2));
                        }
                    }
                }
                PackKind::Q4_0 | PackKind::Iq4Nl => {
                    p[0][2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                    scatter_nibbles(&blk[2..18], r, p[1]);
                }
                PackKind::Q4K => {
                    p[0][2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                    p[1][2 * r..2 * r + 2].copy_from_slice(&blk[2..4]);
                    for j in 0..8 {
                        let (sc, m) = scale_min_k4(j, &blk[4..16]);
                        p[2][j * 16 + r] = sc;
                        p[3][(j / 2) * 32 + r * 2 + j % 2] = m;
                    }
                    for pr in 0..4 {
                        for l in 0..8 {
                            for k in 0..4 {
                                p[4][pr * 512 + l * 64 + r * 4 + k] = blk[16 + 32 * pr + 4 * l + k];
                            }
                        }
                    }
                }
                PackKind::Q6K => {
                    p[0][2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
                    for l in 0..8 {
                        p[1][l * 32 + r * 2] = blk[192 + 2 * l];
                        p[1][l * 32 + r * 2 + 1] = blk[192 + 2 * l + 1];
                    }
                    for h in 0..2 {
                        for l in 0..8 {
                            let at = (h * 8 + l) * 192 + r * 4;
                            for k in 0..4 {
                                p[2][at + k] = blk[64 * h + 4 * l + k];
                                p[2][at + 64 + k] = blk[64 * h + 32 + 4 * l + k];
                                p[2][at + 128 + k] = blk[128 + 32 * h + 4 * l + k];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The 16 nibble bytes of a legacy block into [lane 4][row 16][4].
fn scatter_nibbles(qs: &[u8], r: usize, dst: &mut [u8]) {
    for l in 0..4 {
        for k in 0..4 {
            dst[l * 64 + r * 4 + k] = qs[4 * l + k];
        }
    }
}

/// Quantized activations in the layout the packed kernels read, reused between products.
#[derive(Default)]
pub struct PackedActs {
    /// n_tokens rows of `cols` i8 quants.
    pub qs: Vec<u8>,
    /// n_tokens rows of nb f32 scales.
    pub d: Vec<f32>,
    /// n_tokens rows of nb * aux_per_block i32.
    pub aux: Vec<i32>,
    /// One row of the vec_dot type (the quantizer's output), per task.
    row: Vec<u8>,
}

/// Quantizes `n_tokens` rows of `cols` floats for kernels of `act`.
pub fn pack_activations(act: ActKind, quant: &'static TypeTraits, x: &[f32], cols: usize, n_tokens: usize,
                        acts: &mut PackedActs, threads: &Threads) {
    let nb = cols / act.block();
    let apb = act.aux_per_block();
    grow(&mut acts.qs, n_tokens * cols);
    grow(&mut acts.d, n_tokens * nb);
    grow(&mut acts.aux, n_tokens * nb * apb);
    let qrow = quant.row_bytes(cols);
    let n_tasks = if n_tokens >= 4 { threads.n_threads().min(n_tokens) } else { 1 };
    grow(&mut acts.row, qrow * n_tasks);
    let (qs, d, aux) = (SendPtr(acts.qs.as_mut_ptr()), SendPtr(acts.d.as_mut_ptr()), SendPtr(acts.aux.as_mut_ptr()));
    let rowbuf = SendPtr(acts.row.as_mut_ptr());
    let from_f32 = quant.from_f32.expect("activation types quantize");
    let per_task = n_tokens.div_ceil(n_tasks);
    let body = |task: usize| {
        let (qs, d, aux, rowbuf) = (&qs, &d, &aux, &rowbuf);
        // SAFETY: task-private row buffer; token rows of the outputs are disjoint per task.
        let row = unsafe { std::slice::from_raw_parts_mut(rowbuf.0.add(task * qrow), qrow) };
        for t in task * per_task..((task + 1) * per_task).min(n_tokens) {
            from_f32(&x[t * cols..(t + 1) * cols], row);
            unsafe {
                let qs_t = std::slice::from_raw_parts_mut(qs.0.add(t * cols), cols);
                let d_t = std::slice::from_raw_parts_mut(d.0.add(t * nb), nb);
                let aux_t = std::slice::from_raw_parts_mut(aux.0.add(t * nb * apb), nb * apb);
                unpack_row(act, row, qs_t, d_t, aux_t);
            }
        }
    };
    if n_tasks == 1 {
        body(0);
    } else {
        threads.run(n_tasks, body);
    }
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Splits one quantized row (Q8_0 or Q8_K blocks) into quants, scales and corrections.
fn unpack_row(act: ActKind, row: &[u8], qs: &mut [u8], d: &mut [f32], aux: &mut [i32]) {
    let apb = act.aux_per_block();
    match act {
        ActKind::Q8Lanes { offset } | ActKind::Q8Block { offset } => {
            for (b, blk) in row.chunks_exact(Q8_0_BYTES).enumerate() {
                let q = &blk[2..34];
                qs[b * QK..(b + 1) * QK].copy_from_slice(q);
                d[b] = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                let lanes: [i32; 8] = std::array::from_fn(|l| q[4 * l..4 * l + 4].iter().map(|&v| v as i8 as i32).sum());
                let aux = &mut aux[b * apb..(b + 1) * apb];
                if apb == 10 {
                    for (c, lane) in aux[..8].iter_mut().zip(lanes) {
                        *c = -offset * lane;
                    }
                    // Q5_0's: |16 * 16 * 127| fits a word (Q8_0's offset makes words
                    // nothing reads).
                    let pairs = |k: usize| (0..8).map(|l| q[4 * l + k] as i8 as i32 + q[4 * l + k + 1] as i8 as i32).sum::<i32>();
                    let (low, high) = ((-offset * pairs(0)) as i16, (-offset * pairs(2)) as i16);
                    aux[Q5_0_WORD_CORRECTIONS] = (low as u16 as u32 | (high as u16 as u32) << 16) as i32;
                }
                aux[apb - 1] = -offset * lanes.iter().sum::<i32>();
            }
        }
        ActKind::Q8KPairs | ActKind::Q8KSums32 => {
            for (b, blk) in row.chunks_exact(Q8_K_BYTES).enumerate() {
                qs[b * QK_K..(b + 1) * QK_K].copy_from_slice(&blk[4..4 + QK_K]);
                d[b] = rd_f32(blk, 0);
                let bsum = |j: usize| rd_i16(blk, 4 + QK_K + 2 * j);
                let pair = |lo: i16, hi: i16| (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32;
                if act == ActKind::Q8KPairs {
                    for l in 0..8 {
                        aux[b * apb + l] = pair(bsum(2 * l), bsum(2 * l + 1));
                    }
                } else {
                    let s32 = |j: usize| bsum(2 * j).wrapping_add(bsum(2 * j + 1));
                    for jp in 0..4 {
                        aux[b * apb + jp] = pair(s32(2 * jp), s32(2 * jp + 1));
                    }
                }
            }
        }
    }
}

/// What a kernel needs to compute 16 rows (one group) for a few tokens.
pub struct KernelArgs {
    pub w: *const u8,
    pub group_bytes: usize,
    /// Offset of each plane in a chunk, bytes per block of each plane, and per chunk.
    pub plane: [usize; 5],
    pub plane_size: [usize; 5],
    pub chunk_bytes: usize,
    /// Blocks per chunk (1 or 2).
    pub bpc: usize,
    pub nb: usize,
    pub cols: usize,
    pub qs: *const u8,
    pub d: *const f32,
    pub aux: *const i32,
    pub aux_per_block: usize,
    /// out[token * out_stride + row].
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Computes rows [16 g, 16 g + 16) for tokens [t0, t0 + T).
pub type GroupKernel = unsafe fn(a: &KernelArgs, g: usize, t0: usize);

/// Computes rows [16 g, 16 g + 16) for tokens [t0, t1), decoding the group once.
pub type GroupManyKernel = unsafe fn(a: &KernelArgs, g: usize, t0: usize, t1: usize);

/// The kernels of one kind: (tokens per call, kernel) for the main tiles, one token, and
/// optionally a kernel for many tokens that decodes the group once into a buffer.
#[derive(Clone, Copy)]
pub struct KindKernels {
    pub tile: usize,
    pub tiled: GroupKernel,
    pub single: GroupKernel,
    pub many: Option<GroupManyKernel>,
}

/// Tokens from which a product runs the kernels for many tokens (on every token chunk: for
/// Q8_0 and Q5_0 they compute the one-accumulator arithmetic of `crate::TILED_TOKENS`).
const MANY_TOKENS: usize = crate::TILED_TOKENS;

/// The packed kernels of this CPU for a kind, if it has them (AVX-512 VNNI: every kind;
/// AVX2: Q8_0, Q5_0 and Q4_K).
pub fn kernels(kind: PackKind) -> Option<KindKernels> {
    #[cfg(target_arch = "x86_64")]
    {
        match crate::dispatch::active_isa() {
            crate::Isa::Avx512 => return Some(crate::simd::packed_x86::kernels(kind)),
            crate::Isa::Avx2 => return crate::simd::packed_avx2::kernels(kind),
            _ => {}
        }
    }
    let _ = kind;
    None
}

/// out[t * out_stride + r] for rows r < 16 * n_groups and tokens t < n_tokens, where
/// `n_groups` ≤ `p.ready_groups()`.
/// `batch_invariant`: Q8_0 and Q5_0 take the many-token kernels' one accumulator at every
/// token count (see `MatmulScratch::batch_invariant`).
#[allow(clippy::too_many_arguments)]
pub fn product(p: &Packed, n_groups: usize, kk: &KindKernels, acts: &PackedActs, n_tokens: usize, batch_invariant: bool, out: *mut f32,
               out_stride: usize, threads: &Threads) {
    assert!(n_groups <= p.ready_groups(), "product over unpublished groups");
    let args = KernelArgs {
        w: p.as_ptr(),
        group_bytes: p.group_bytes,
        plane: p.plane,
        plane_size: {
            let mut ps = [0usize; 5];
            ps[..p.kind.planes().len()].copy_from_slice(p.kind.planes());
            ps
        },
        chunk_bytes: p.chunk_bytes,
        bpc: p.kind.blocks_per_chunk(),
        nb: p.nb,
        cols: p.cols,
        qs: acts.qs.as_ptr(),
        d: acts.d.as_ptr(),
        aux: acts.aux.as_ptr(),
        aux_per_block: p.kind.act().aux_per_block(),
        out,
        out_stride,
    };
    let args = SendArgs(args);
    // Tasks: ranges of groups times ranges of tokens. Small products split the tokens too,
    // so that both threads get work.
    let n_threads = threads.n_threads();
    let tok_chunk = if n_groups >= 8 * n_threads || n_tokens <= kk.tile { n_tokens } else { (kk.tile * 4).max(n_tokens.div_ceil(n_threads * 2)) };
    let n_tok_chunks = n_tokens.div_ceil(tok_chunk);
    let work_per_group = p.group_bytes.max(1) * n_tokens.min(tok_chunk);
    // About 64 KiB-token units of work per task, and at least 8 tasks per thread (with 4, the
    // threads finished Gemma's 8-token products of eight tasks up to a task apart: its worker
    // idled 4.5-5.0 % of the step's samples, with 8 3.6-3.9 %). A group over many tokens is
    // already more than that; such tasks take runs of groups up to 128 KiB of weights, so
    // that a thread walks its weights front to back (its next-group prefetch fetches what it
    // reads next, not the other thread's group) and claims fewer tasks. Larger runs left the
    // threads unbalanced on matrices of few, wide groups.
    let by_size = (64 * 1024 / work_per_group).max(1);
    let by_count = (n_groups * n_tok_chunks).div_ceil(8 * n_threads).max(1);
    let many_from = if batch_invariant && matches!(p.kind, PackKind::Q8_0 | PackKind::Q5_0) { 1 } else { MANY_TOKENS };
    let many = kk.many.is_some() && n_tokens >= many_from;
    let by_weights = (128 * 1024 / p.group_bytes.max(1)).max(1);
    let groups_per_task = if many { by_weights.min(by_count) } else { by_size.min(by_count) };
    let n_group_chunks = n_groups.div_ceil(groups_per_task);
    threads.run(n_group_chunks * n_tok_chunks, |task| {
        let whole = &args; // the Sync wrapper, not its field
        let a = &whole.0;
        let (gc, tc) = (task / n_tok_chunks, task % n_tok_chunks);
        let groups = gc * groups_per_task..((gc + 1) * groups_per_task).min(n_groups);
        let (t_start, t_end) = (tc * tok_chunk, ((tc + 1) * tok_chunk).min(n_tokens));
        for g in groups {
            let mut t = t_start;
            // SAFETY: every (group, token) output block is written by exactly one task; the
            // kernel reads the packed group g and token rows t..t+T, all in bounds.
            unsafe {
                if let Some(many) = kk.many.filter(|_| n_tokens >= many_from) {
                    many(a, g, t_start, t_end);
                    continue;
                }
                while t + kk.tile <= t_end {
                    (kk.tiled)(a, g, t);
                    t += kk.tile;
                }
                while t < t_end {
                    (kk.single)(a, g, t);
                    t += 1;
                }
            }
        }
    });
}

struct SendArgs(KernelArgs);
unsafe impl Sync for SendArgs {}
unsafe impl Send for SendArgs {}

