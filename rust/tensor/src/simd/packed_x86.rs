//! AVX-512 VNNI kernels over packed 16-row groups (see `crate::packed` for the layouts and
//! the arithmetic each type must reproduce). One 512-bit vector holds 16 rows; VPDPBUSD
//! multiplies four unsigned weight bytes per row by four signed activation bytes broadcast to
//! all rows. Weights are stored (or decoded) unsigned with an offset, and the accumulator of
//! each VPDPBUSD starts at the activation's precomputed correction -offset * sum(x), so the
//! integer results are exactly the signed dot products.
//!
//! SAFETY (whole module): `KernelArgs` points at a packed matrix with at least g + 1 groups,
//! activations for tokens t0..t0 + T and outputs for them (checked by `packed::product`'s
//! callers), and these functions are only reached on CPUs with AVX-512 F/BW/VL/VNNI
//! (`packed::kernels` checks the active ISA).

use std::arch::x86_64::*;

use crate::packed::{KernelArgs, KindKernels, PackKind};

/// Block b of plane i.
#[inline(always)]
pub(super) unsafe fn at(a: &KernelArgs, base: *const u8, b: usize, i: usize) -> *const u8 {
    let (c, k) = if a.bpc == 2 { (b >> 1, b & 1) } else { (b, 0) };
    base.add(c * a.chunk_bytes + a.plane[i] + k * a.plane_size[i])
}

/// The kernels for `kind`, with their token tile.
pub fn kernels(kind: PackKind) -> KindKernels {
    match kind {
        PackKind::Q8_0 => KindKernels { tile: 2, tiled: legacy_lanes::<0, 2>, single: legacy_lanes::<0, 1>, many: Some(legacy_many::<0>) },
        PackKind::Q5_0 => KindKernels { tile: 2, tiled: legacy_lanes::<1, 2>, single: legacy_lanes::<1, 1>, many: Some(legacy_many::<1>) },
        PackKind::Q4_0 => KindKernels { tile: 4, tiled: legacy::<2, 4>, single: legacy::<2, 1>, many: Some(legacy_many::<2>) },
        PackKind::Iq4Nl => KindKernels { tile: 4, tiled: legacy::<3, 4>, single: legacy::<3, 1>, many: Some(legacy_many::<3>) },
        PackKind::Q4K => KindKernels { tile: 4, tiled: q4_k::<4, false>, single: q4_k::<1, false>, many: Some(q4_k_many) },
        PackKind::Q6K => KindKernels { tile: 2, tiled: q6_k::<2>, single: q6_k::<1>, many: Some(q6_k_many) },
    }
}

/// VPDPWSSD (acc + pairwise i16 products), written out because LLVM otherwise splits it
/// into VPMADDWD + VPADDD on generic targets (one more instruction in the Q6_K inner loop).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut r = acc;
    std::arch::asm!("vpdpwssd {r}, {a}, {b}", r = inout(zmm_reg) r, a = in(zmm_reg) a, b = in(zmm_reg) b,
                    options(pure, nomem, nostack, preserves_flags));
    r
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// The activation dword (4 quants) at byte `off` of token t's row, broadcast to 16 lanes.
#[inline(always)]
unsafe fn act4(a: &KernelArgs, t: usize, off: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(a.qs.add(t * a.cols + off) as *const i32))
}

#[inline(always)]
unsafe fn aux(a: &KernelArgs, t: usize, b: usize, i: usize) -> i32 {
    *a.aux.add((t * a.nb + b) * a.aux_per_block + i)
}

#[inline(always)]
unsafe fn act_d(a: &KernelArgs, t: usize, b: usize) -> __m512 {
    _mm512_set1_ps(*a.d.add(t * a.nb + b))
}

/// 16 f16 scales of a plane block as f32.
#[inline(always)]
unsafe fn scales16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// ggml's hsum_float_8 applied lane-wise to eight accumulators: ((x0 + x4) + (x2 + x6)) +
/// ((x1 + x5) + (x3 + x7)).
#[inline(always)]
unsafe fn hsum8(x: &[__m512; 8]) -> __m512 {
    let r0 = _mm512_add_ps(x[4], x[0]);
    let r1 = _mm512_add_ps(x[5], x[1]);
    let r2 = _mm512_add_ps(x[6], x[2]);
    let r3 = _mm512_add_ps(x[7], x[3]);
    _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3))
}

#[inline(always)]
unsafe fn store(a: &KernelArgs, g: usize, t: usize, v: __m512) {
    _mm512_storeu_ps(a.out.add(t * a.out_stride + g * 16), v);
}

#[inline(always)]
unsafe fn nibbles(v: __m512i, high: bool) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0f);
    if high { _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) } else { _mm512_and_si512(v, m4) }
}

/// The weights of one 16-row group as the lane kernels read them: per block, 16 f16 scales
/// and eight 64-byte vectors of unsigned weights (lane l: bytes 4l..4l+3 of every row).
trait LaneWeights {
    unsafe fn scales(&self, b: usize) -> *const u8;
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i;
}

/// A packed Q8_0 group (weights stored + 128).
#[derive(Clone, Copy)]
struct PackedQ8<'a> {
    a: &'a KernelArgs,
    base: *const u8,
}

impl LaneWeights for PackedQ8<'_> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 { at(self.a, self.base, b, 0) }
    #[inline(always)]
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i { load(at(self.a, self.base, b, 1).add(l * 64)) }
}

/// A packed Q5_0 group, decoded on the fly to q + 16 (0..31).
#[derive(Clone, Copy)]
struct PackedQ5<'a> {
    a: &'a KernelArgs,
    base: *const u8,
}

impl LaneWeights for PackedQ5<'_> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 { at(self.a, self.base, b, 0) }
    #[inline(always)]
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i {
        let nib = nibbles(load(at(self.a, self.base, b, 1).add((l & 3) * 64)), l >= 4);
        let bits = std::ptr::read_unaligned(at(self.a, self.base, b, 2).add(l * 8) as *const u64);
        _mm512_mask_add_epi8(nib, bits, nib, _mm512_set1_epi8(16))
    }
}

/// A group decoded once into a buffer (scales: nb x 32 bytes, weights: nb x 512 bytes), for
/// products over many tokens: the decoding is then paid once per group, not per token pair.
#[derive(Clone, Copy)]
struct Expanded {
    d: *const u8,
    w: *const u8,
}

impl LaneWeights for Expanded {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 { self.d.add(b * 32) }
    #[inline(always)]
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i { load(self.w.add(b * 512 + l * 64)) }
}

/// Eight lane accumulators per output (ggml's vec_dot for Q8_0 and Q5_0).
#[inline(always)]
unsafe fn lanes<W: LaneWeights, const T: usize>(w: &W, a: &KernelArgs, g: usize, t0: usize) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for b in 0..a.nb {
        let dw = scales16(w.scales(b));
        let mut ds = [_mm512_setzero_ps(); T];
        for t in 0..T {
            ds[t] = _mm512_mul_ps(dw, act_d(a, t0 + t, b));
        }
        for l in 0..8 {
            let wl = w.lane(b, l);
            for t in 0..T {
                let init = _mm512_set1_epi32(aux(a, t0 + t, b, l));
                let s = _mm512_dpbusd_epi32(init, wl, act4(a, t0 + t, b * 32 + 4 * l));
                acc[t][l] = _mm512_fmadd_ps(ds[t], _mm512_cvtepi32_ps(s), acc[t][l]);
            }
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, hsum8(&acc[t]));
    }
}

/// Q8_0 (KIND 0) and Q5_0 (KIND 1) straight from the packed group.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn legacy_lanes<const KIND: u8, const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    if KIND == 0 {
        lanes::<_, T>(&PackedQ8 { a, base }, a, g, t0)
    } else {
        lanes::<_, T>(&PackedQ5 { a, base }, a, g, t0)
    }
}

/// Group g + 1's cache lines, to be brought into L2 a share per block of group g, for
/// kernels that run many tokens over group g: their arithmetic issues few loads, so the
/// hardware prefetchers do not run ahead, and without this each group's weights arrive from
/// memory only when its first pass asks for them (measured on a matrix 36 MB large: Q5_0
/// over 8 tokens 38 % faster). Spread over the blocks, so that the requests do not queue up
/// at once. A prefetch never faults: the lines after the last group are harmless.
#[derive(Clone, Copy)]
pub(super) struct NextGroup {
    next: *const u8,
    per_block: usize,
}

impl NextGroup {
    /// Computed once per group: a division per block cost 3 % of a Q5_0 product in L2.
    #[inline(always)]
    pub(super) fn after(a: &KernelArgs, g: usize) -> NextGroup {
        let lines = a.group_bytes / 64;
        NextGroup { next: a.w.wrapping_add((g + 1) * a.group_bytes), per_block: lines.div_ceil(a.nb.max(1)) }
    }

    /// Asks for block b's share of the lines.
    #[inline(always)]
    pub(super) unsafe fn fetch(&self, b: usize) {
        // A plain count: the last block's share may run past the group (harmless, above);
        // clamping it at the group's end cost a compare and a move per line (Q5_0 products
        // of eight tokens 2-6 % slower, alternating in one process).
        let first = self.next.wrapping_add(b * self.per_block * 64);
        for i in 0..self.per_block {
            _mm_prefetch::<_MM_HINT_T1>(first.wrapping_add(i * 64) as *const i8);
        }
    }
}

/// Lane weights read straight from group g that also fetch group g + 1 ahead (the first
/// pass over a group in a many-token product).
struct AheadOf<W> {
    w: W,
    next: NextGroup,
}

impl<W: LaneWeights> LaneWeights for AheadOf<W> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 {
        self.next.fetch(b);
        self.w.scales(b)
    }
    #[inline(always)]
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i { self.w.lane(b, l) }
}

/// One float accumulator per output, updated once per block with the block's exact integer
/// sum: acc = fma(float(isum), d_w * d_x, acc) (`scalar::repacked`); the block's correction
/// is the token's last aux entry. Under four tokens each sum runs as two VPDPBUSD chains
/// (even and odd lanes, added at the block's end: integers, so the same sum), to hide the
/// instruction's latency.
#[inline(always)]
unsafe fn block_sums<W: LaneWeights, const T: usize>(w: &W, a: &KernelArgs, g: usize, t0: usize) {
    let split = T < 4;
    let total = a.aux_per_block - 1;
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..a.nb {
        let dw = scales16(w.scales(b));
        let mut s = [[_mm512_setzero_si512(); 2]; T];
        for t in 0..T {
            s[t][0] = _mm512_set1_epi32(aux(a, t0 + t, b, total));
        }
        for l in 0..8 {
            let wl = w.lane(b, l);
            let c = if split { l & 1 } else { 0 };
            for t in 0..T {
                s[t][c] = _mm512_dpbusd_epi32(s[t][c], wl, act4(a, t0 + t, b * 32 + 4 * l));
            }
        }
        for t in 0..T {
            let isum = if split { _mm512_add_epi32(s[t][0], s[t][1]) } else { s[t][0] };
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, act_d(a, t0 + t, b)), acc[t]);
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, acc[t]);
    }
}

/// `block_sums` over as many of tokens t..t1 as one pass takes (8, 4, 2 or 1); returns them.
#[inline(always)]
unsafe fn block_sums_pass<W: LaneWeights>(w: &W, a: &KernelArgs, g: usize, t: usize, t1: usize) -> usize {
    match t1 - t {
        n if n >= 8 => { block_sums::<_, 8>(w, a, g, t); 8 }
        n if n >= 4 => { block_sums::<_, 4>(w, a, g, t); 4 }
        n if n >= 2 => { block_sums::<_, 2>(w, a, g, t); 2 }
        _ => { block_sums::<_, 1>(w, a, g, t); 1 }
    }
}

/// `block_sums` over tokens t0..t1 (at least one), eight at a time: eight independent
/// VPDPBUSD chains hide its latency, and each weight vector loaded serves eight tokens. The
/// first pass reads `first` (which may fetch ahead), the others `w`.
#[inline(always)]
unsafe fn block_sums_many<F: LaneWeights, W: LaneWeights>(first: &F, w: &W, a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let mut t = t0 + block_sums_pass(first, a, g, t0, t1);
    while t < t1 {
        t += block_sums_pass(w, a, g, t, t1);
    }
}

thread_local! {
    /// Per-thread buffer for decoded groups.
    static EXPANDED: std::cell::RefCell<Vec<__m512i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A packed Q4_0 (KIND 0, weights stored + 8) or IQ4_NL (KIND 1, levels + 128 looked up)
/// group.
#[derive(Clone, Copy)]
struct PackedQ4<'a, const KIND: u8> {
    a: &'a KernelArgs,
    base: *const u8,
}

impl<const KIND: u8> LaneWeights for PackedQ4<'_, KIND> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 { at(self.a, self.base, b, 0) }
    #[inline(always)]
    unsafe fn lane(&self, b: usize, l: usize) -> __m512i {
        let nib = nibbles(load(at(self.a, self.base, b, 1).add((l & 3) * 64)), l >= 4);
        if KIND == 0 {
            return nib;
        }
        // IQ4_NL levels + 128, as unsigned bytes, in each 128-bit lane.
        let table = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15));
        _mm512_shuffle_epi8(table, nib)
    }
}

/// Binds `$w` to group g's weights of legacy kind `$kind` (0 Q8_0, 1 Q5_0, 2 Q4_0,
/// 3 IQ4_NL) for `$body`.
macro_rules! with_legacy_weights {
    ($kind:expr, $a:expr, $g:expr, $w:ident => $body:expr) => {{
        let (a, base) = ($a, $a.w.add($g * $a.group_bytes));
        match $kind {
            0 => { let $w = PackedQ8 { a, base }; $body }
            1 => { let $w = PackedQ5 { a, base }; $body }
            2 => { let $w = PackedQ4::<0> { a, base }; $body }
            _ => { let $w = PackedQ4::<1> { a, base }; $body }
        }
    }};
}

/// Legacy kind KIND (see `with_legacy_weights`) over tokens t0..t0 + T with one
/// accumulator (Q4_0 and IQ4_NL: llama.cpp's repacked arithmetic at every token count).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn legacy<const KIND: u8, const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    with_legacy_weights!(KIND, a, g, w => block_sums::<_, T>(&w, a, g, t0))
}

/// Legacy kind KIND over tokens t0..t1 (products of 8 tokens or more, where Q8_0 and Q5_0
/// too have one accumulator), in passes of eight tokens, the first also fetching the next
/// group. Q5_0 over 16 tokens or more decodes the group once into a buffer and
/// runs over that.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn legacy_many<const KIND: u8>(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    if KIND == 1 && t1 - t0 >= 16 {
        return q5_0_expanded(a, g, t0, t1);
    }
    with_legacy_weights!(KIND, a, g, w => block_sums_many(&AheadOf { w, next: NextGroup::after(a, g) }, &w, a, g, t0, t1))
}

/// (A target_feature function, not inline(always): the closure inside inherits its features.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q5_0_expanded(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let src = PackedQ5 { a, base: a.w.add(g * a.group_bytes) };
    EXPANDED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let lines = a.nb * (32 + 512) / 64 + 1;
        if buf.len() < lines {
            buf.resize(lines, _mm512_setzero_si512());
        }
        let d = buf.as_mut_ptr() as *mut u8;
        let w = d.add((a.nb * 32).div_ceil(64) * 64);
        let next = NextGroup::after(a, g);
        for b in 0..a.nb {
            next.fetch(b);
            std::ptr::copy_nonoverlapping(src.scales(b), d.add(b * 32), 32);
            for l in 0..8 {
                _mm512_storeu_si512(w.add(b * 512 + l * 64) as *mut __m512i, src.lane(b, l));
            }
        }
        let e = Expanded { d, w };
        block_sums_many(&e, &e, a, g, t0, t1);
    });
}

/// Q4_K: one accumulator for the scaled sums and one for the mins (llama.cpp's repack).
/// AHEAD: also fetch the next group (see `NextGroup`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q4_k<const T: usize, const AHEAD: bool>(a: &KernelArgs, g: usize, t0: usize) {
    let base = a.w.add(g * a.group_bytes);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    let next = NextGroup::after(a, g);
    for b in 0..a.nb {
        if AHEAD {
            next.fetch(b);
        }
        let (dp, mp, sp, np, qp) = (at(a, base, b, 0), at(a, base, b, 1), at(a, base, b, 2), at(a, base, b, 3), at(a, base, b, 4));
        let mut isum = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            let mut s_lo = [_mm512_setzero_si512(); T];
            let mut s_hi = [_mm512_setzero_si512(); T];
            for l in 0..8 {
                let v = load(qp.add(p * 512 + l * 64));
                let (lo, hi) = (nibbles(v, false), nibbles(v, true));
                for t in 0..T {
                    let row = b * 256 + 64 * p + 4 * l;
                    s_lo[t] = _mm512_dpbusd_epi32(s_lo[t], lo, act4(a, t0 + t, row));
                    s_hi[t] = _mm512_dpbusd_epi32(s_hi[t], hi, act4(a, t0 + t, row + 32));
                }
            }
            let sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(sp.add(2 * p * 16) as *const __m128i));
            let sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(sp.add((2 * p + 1) * 16) as *const __m128i));
            for t in 0..T {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s_lo[t], sc_lo));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s_hi[t], sc_hi));
            }
        }
        let mut imin = [_mm512_setzero_si512(); T];
        for jp in 0..4 {
            let m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(np.add(jp * 32) as *const __m256i));
            for t in 0..T {
                imin[t] = _mm512_dpwssd_epi32(imin[t], m, _mm512_set1_epi32(aux(a, t0 + t, b, jp)));
            }
        }
        let (dw, dmw) = (scales16(dp), scales16(mp));
        for t in 0..T {
            let dx = act_d(a, t0 + t, b);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, dx), acc[t]);
            acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[t]), _mm512_mul_ps(dmw, dx), acc_min[t]);
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, _mm512_sub_ps(acc[t], acc_min[t]));
    }
}

/// Q4_K over tokens t0..t1: tiles of four, the first also fetching the next group.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q4_k_many(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let mut t = t0;
    if t1 - t0 >= 4 {
        q4_k::<4, true>(a, g, t0);
        t += 4;
    }
    while t + 4 <= t1 {
        q4_k::<4, false>(a, g, t);
        t += 4;
    }
    while t < t1 {
        q4_k::<1, false>(a, g, t);
        t += 1;
    }
}

/// The weights of one 16-row Q6_K group as its kernel reads them: per super-block the 16 f16
/// scales, the 8-bit group scales as pairs [pair 8][row 16][2], and the 6-bit weights of
/// chunk k (32 elements 128h + 32k..) lane l as 16 rows x 4 unsigned bytes.
trait Q6Weights {
    unsafe fn d(&self, b: usize) -> *const u8;
    unsafe fn scales(&self, b: usize) -> *const u8;
    unsafe fn chunk(&self, b: usize, h: usize, k: usize, l: usize) -> __m512i;
}

struct PackedQ6<'a> {
    a: &'a KernelArgs,
    base: *const u8,
}

impl Q6Weights for PackedQ6<'_> {
    #[inline(always)]
    unsafe fn d(&self, b: usize) -> *const u8 { at(self.a, self.base, b, 0) }
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> *const u8 { at(self.a, self.base, b, 1) }
    #[inline(always)]
    unsafe fn chunk(&self, b: usize, h: usize, k: usize, l: usize) -> __m512i {
        let q = at(self.a, self.base, b, 2).add((h * 8 + l) * 192);
        let ql = load(q.add(64 * (k % 2)));
        let qh = load(q.add(128));
        let lo = nibbles(ql, k >= 2);
        let hb = match k {
            0 => _mm512_slli_epi16(qh, 4),
            1 => _mm512_slli_epi16(qh, 2),
            2 => qh,
            _ => _mm512_srli_epi16(qh, 2),
        };
        _mm512_or_si512(lo, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)))
    }
}

/// A Q6_K group decoded into a buffer for many tokens, per super-block (Q6_EXPANDED bytes,
/// whole cache lines): at 0 the eight lanes' correction scales (lane l: the i16 pairs of
/// scale pair l times -32, for VPDPWSSD with the activation's group sums), at 512 the scale
/// vectors of the sixteen (e, chunk) uses (lanes 4e..4e+4 of chunk c = 4h + k: each row's
/// scale of group 8h + 2k + e twice as i16), at 1536 the 64 weight vectors (chunk c, lane l),
/// at 5632 the 16 f16 super-block scales. What the token tiles would otherwise redo on every
/// tile is done here once per group.
const Q6_EXPANDED: usize = 5696;
const Q6X_SCALES: usize = 512;
const Q6X_WEIGHTS: usize = 1536;
const Q6X_D: usize = 5632;

/// Q6_K: eight lane accumulators per output, updated once per super-block (ggml's vec_dot),
/// from the expanded group at `p`. Lane by lane, so that a lane's integer sums stay in
/// registers over its eight chunks; each token's lane sum in S independent chains (chunk c
/// into chain c % S, added at the end: the same integer sum) so that VPDPWSSD's latency does
/// not serialize the chunks.
#[inline(always)]
unsafe fn q6_lanes<const T: usize, const S: usize>(p: *const u8, a: &KernelArgs, g: usize, t0: usize) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for b in 0..a.nb {
        let x = p.add(b * Q6_EXPANDED);
        let dw = scales16(x.add(Q6X_D));
        let mut d = [_mm512_setzero_ps(); T];
        for t in 0..T {
            d[t] = _mm512_mul_ps(act_d(a, t0 + t, b), dw);
        }
        for e in 0..2 {
            let mut sc = [_mm512_setzero_si512(); 8];
            for (c, v) in sc.iter_mut().enumerate() {
                *v = load(x.add(Q6X_SCALES + (e * 8 + c) * 64));
            }
            for l in 4 * e..4 * e + 4 {
                // The lane starts at -32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]).
                let corr = load(x.add(l * 64));
                let mut isum = [[_mm512_setzero_si512(); S]; T];
                for t in 0..T {
                    isum[t][0] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), corr, _mm512_set1_epi32(aux(a, t0 + t, b, l)));
                }
                for c in 0..8 {
                    let wk = load(x.add(Q6X_WEIGHTS + (c * 8 + l) * 64));
                    for t in 0..T {
                        // Pairs of products (at most 2 * 63 * 127: no saturation), then
                        // the row's scale times their sum.
                        let pr = _mm512_maddubs_epi16(wk, act4(a, t0 + t, b * 256 + 32 * c + 4 * l));
                        isum[t][c % S] = dpwssd(isum[t][c % S], pr, sc[c]);
                    }
                }
                for t in 0..T {
                    let mut sum = isum[t][0];
                    for c in 1..S {
                        sum = _mm512_add_epi32(sum, isum[t][c]);
                    }
                    acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(sum), acc[t][l]);
                }
            }
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, hsum8(&acc[t]));
    }
}

/// Q6_K straight from the packed group, reading it in address order (one token streams the
/// weights from memory: the order matters to the prefetchers, and T = 1 leaves registers
/// for all eight lane sums).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q6_k<const T: usize>(a: &KernelArgs, g: usize, t0: usize) {
    let w = PackedQ6 { a, base: a.w.add(g * a.group_bytes) };
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for b in 0..a.nb {
        let sp = w.scales(b);
        // Lane l starts at -32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]) (the -32 offset).
        let mut isum = [[_mm512_setzero_si512(); 8]; T];
        for l in 0..8 {
            let pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add(l * 32) as *const __m256i));
            for t in 0..T {
                let c = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs, _mm512_set1_epi32(aux(a, t0 + t, b, l)));
                isum[t][l] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(c, 5));
            }
        }
        for h in 0..2 {
            // The scales of the two 16-element groups of chunk k (32 elements 128h + 32k..).
            let mut sc = [[_mm512_setzero_si512(); 2]; 4];
            for k in 0..4 {
                let pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add((4 * h + k) * 32) as *const __m256i));
                sc[k] = [_mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16), _mm512_srai_epi32(pairs, 16)];
            }
            for l in 0..8 {
                for k in 0..4 {
                    let wk = w.chunk(b, h, k, l);
                    for t in 0..T {
                        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wk, act4(a, t0 + t, b * 256 + 128 * h + 32 * k + 4 * l));
                        isum[t][l] = _mm512_add_epi32(isum[t][l], _mm512_mullo_epi32(p, sc[k][l / 4]));
                    }
                }
            }
        }
        let dw = scales16(w.d(b));
        for t in 0..T {
            let d = _mm512_mul_ps(act_d(a, t0 + t, b), dw);
            for l in 0..8 {
                acc[t][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[t][l]), acc[t][l]);
            }
        }
    }
    for t in 0..T {
        store(a, g, t0 + t, hsum8(&acc[t]));
    }
}

/// Q6_K over tokens t0..t1 with the group decoded once (`Q6_EXPANDED`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
unsafe fn q6_k_many(a: &KernelArgs, g: usize, t0: usize, t1: usize) {
    let src = PackedQ6 { a, base: a.w.add(g * a.group_bytes) };
    EXPANDED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let lines = a.nb * Q6_EXPANDED / 64;
        if buf.len() < lines {
            buf.resize(lines, _mm512_setzero_si512());
        }
        let p = buf.as_mut_ptr() as *mut u8;
        let next = NextGroup::after(a, g);
        // Byte shuffles duplicating the first (e = 0) or second (e = 1) i16 of each dword.
        let (a0, a1, a2, a3) = (0x0100_0100, 0x0504_0504, 0x0908_0908, 0x0d0c_0d0c);
        let (b0, b1, b2, b3) = (0x0302_0302, 0x0706_0706, 0x0b0a_0b0a, 0x0f0e_0f0e);
        let dup = [
            _mm512_setr_epi32(a0, a1, a2, a3, a0, a1, a2, a3, a0, a1, a2, a3, a0, a1, a2, a3),
            _mm512_setr_epi32(b0, b1, b2, b3, b0, b1, b2, b3, b0, b1, b2, b3, b0, b1, b2, b3),
        ];
        for b in 0..a.nb {
            next.fetch(b);
            let x = p.add(b * Q6_EXPANDED);
            let sp = src.scales(b);
            for c in 0..8 {
                let pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(sp.add(c * 32) as *const __m256i));
                // -32 * scale: at most 4096 in magnitude, an i16
                let corr = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(pairs, 5));
                _mm512_storeu_si512(x.add(c * 64) as *mut __m512i, corr);
                for (e, shuffle) in dup.iter().enumerate() {
                    _mm512_storeu_si512(x.add(Q6X_SCALES + (e * 8 + c) * 64) as *mut __m512i, _mm512_shuffle_epi8(pairs, *shuffle));
                }
            }
            for h in 0..2 {
                for k in 0..4 {
                    for l in 0..8 {
                        _mm512_storeu_si512(x.add(Q6X_WEIGHTS + ((h * 4 + k) * 8 + l) * 64) as *mut __m512i, src.chunk(b, h, k, l));
                    }
                }
            }
            std::ptr::copy_nonoverlapping(src.d(b), x.add(Q6X_D), 32);
        }
        let p = p as *const u8;
        let mut t = t0;
        // Tiles of three tokens, two chains each (measured on 4864 x 1024 and 1024 x 4608 at
        // 512 tokens against tiles of 2 and 4 with 1, 2 or 4 chains: 3 x 2 the fastest or tied).
        while t + 3 <= t1 {
            q6_lanes::<3, 2>(p, a, g, t);
            t += 3;
        }
        while t < t1 {
            q6_lanes::<1, 4>(p, a, g, t);
            t += 1;
        }
    });
}
