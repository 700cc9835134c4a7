//! The i-quants of 2 to 3 bits (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): weights as
//! indices into ggml's grids of 4 or 8 magnitudes (`iq_grids`), with a sign per weight and a
//! 4-bit scale per 16 or 32, paired with Q8_K activations. Dequantizers follow
//! ggml-quants.c; dot products follow the AVX2 `ggml_vec_dot_*_q8_K` of
//! ggml-cpu/arch/x86/quants.c, which all share one float shape: each super-block's signed
//! values against the activation in eight i32 lanes (element p in lane (p % 32) / 4, times
//! its group's odd scale 2 * s + 1, see `kquants::x86_lanes`), `acc = fma(d * d_x, lanes,
//! acc)`, then the type's constant factor times `hsum_float_8`. The `tiled_*` dots are
//! llama.cpp's tiled product's (8 or more tokens, `scalar::tiled`): the same integers, one
//! accumulator, d times the factor.

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::{blocks, pairs, q8k_qs, x86_lanes, QK_K};
use crate::util::rd_i16;
use super::lanes::{fma_lanes, hsum_float_8};
use super::tiled::{tiled_dot, Block};
use crate::util::{rd_f16, rd_f32, rd_u32};

/// The i-quants of this module.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IqKind {
    /// d | per 32 elements: four grid indices (bytes), a u32 of four 7-bit sign groups and
    /// the scale in its top 4 bits.
    Iq2Xxs,
    /// d | 32 u16 (9-bit grid index, 7 sign bits) | 8 bytes of two 4-bit scales.
    Iq2Xs,
    /// d | 32 grid index bytes | 32 sign bytes | 8 bytes of the indices' 2 high bits | 8 of
    /// two scales.
    Iq2S,
    /// d | 64 grid index bytes (4 magnitudes each) | per 32 elements a u32 of sign groups and
    /// scale as IQ2_XXS.
    Iq3Xxs,
    /// d | 64 grid index bytes | 8 bytes of their 9th bits | 32 sign bytes | 4 bytes of two
    /// scales (per 32 elements).
    Iq3S,
}

impl IqKind {
    /// Bytes per block.
    pub const fn bytes(self) -> usize {
        match self {
            IqKind::Iq2Xxs => 66,
            IqKind::Iq2Xs => 74,
            IqKind::Iq2S => 82,
            IqKind::Iq3Xxs => 98,
            IqKind::Iq3S => 110,
        }
    }

    /// The constant ggml's vec_dot multiplies the reduced sum by, and its tiled product d.
    pub const fn factor(self) -> f32 {
        match self {
            IqKind::Iq2Xxs | IqKind::Iq2Xs | IqKind::Iq2S => 0.125,
            IqKind::Iq3Xxs => 0.25,
            IqKind::Iq3S => 1.0,
        }
    }

    /// A group's dequantization scale from the block's d and the group's 4-bit s, in
    /// ggml's float order.
    fn group_scale(self, d: f32, s: u8) -> f32 {
        match self {
            IqKind::Iq2Xxs | IqKind::Iq2Xs | IqKind::Iq2S => d * (0.5 + s as f32) * 0.25,
            IqKind::Iq3Xxs => d * (0.5 + s as f32) * 0.5,
            IqKind::Iq3S => d * (1 + 2 * s as i32) as f32,
        }
    }
}

/// One 32-element sub-block: its four octets of magnitudes (byte j of word l is element
/// 8l + j), their sign bytes (bit j set: negative) and the 4-bit scales of its two halves.
pub struct SubBlock {
    pub grid: [u64; 4],
    pub signs: [u8; 4],
    pub scales: [u8; 2],
}

/// Two 4-magnitude grid entries as one octet.
#[inline(always)]
fn pair32(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

/// Sub-block `ib` (0..8) of a block of `kind`.
#[inline(always)]
pub fn sub_block(kind: IqKind, b: &[u8], ib: usize) -> SubBlock {
    let sign7 = |aux: u32, l: usize| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
    match kind {
        IqKind::Iq2Xxs => {
            let (idx, aux) = (rd_u32(b, 2 + 8 * ib), rd_u32(b, 6 + 8 * ib));
            let s = (aux >> 28) as u8;
            SubBlock { grid: std::array::from_fn(|l| IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize]), signs: std::array::from_fn(|l| sign7(aux, l)), scales: [s, s] }
        }
        IqKind::Iq2Xs => {
            let q = |l: usize| u16::from_le_bytes([b[2 + 8 * ib + 2 * l], b[3 + 8 * ib + 2 * l]]) as usize;
            let sc = b[66 + ib];
            SubBlock { grid: std::array::from_fn(|l| IQ2XS_GRID[q(l) & 511]), signs: std::array::from_fn(|l| KSIGNS_IQ2XS[q(l) >> 9]), scales: [sc & 15, sc >> 4] }
        }
        IqKind::Iq2S => {
            let qh = b[66 + ib] as usize;
            let index = |l: usize| b[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            let sc = b[74 + ib];
            SubBlock { grid: std::array::from_fn(|l| IQ2S_GRID[index(l)]), signs: std::array::from_fn(|l| b[34 + 4 * ib + l]), scales: [sc & 15, sc >> 4] }
        }
        IqKind::Iq3Xxs => {
            let g = |k: usize| IQ3XXS_GRID[b[2 + 8 * ib + k] as usize];
            let aux = rd_u32(b, 66 + 4 * ib);
            let s = (aux >> 28) as u8;
            SubBlock { grid: std::array::from_fn(|l| pair32(g(2 * l), g(2 * l + 1))), signs: std::array::from_fn(|l| sign7(aux, l)), scales: [s, s] }
        }
        IqKind::Iq3S => {
            let qh = b[66 + ib] as usize;
            let g = |k: usize| IQ3S_GRID[b[2 + 8 * ib + k] as usize | ((qh << (8 - k)) & 256)];
            let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
            SubBlock { grid: std::array::from_fn(|l| pair32(g(2 * l), g(2 * l + 1))), signs: std::array::from_fn(|l| b[74 + 4 * ib + l]), scales: [s, s] }
        }
    }
}

/// The 256 signed grid values of a block and the 4-bit scales of its 16 groups.
pub fn values(kind: IqKind, b: &[u8]) -> ([i8; QK_K], [u8; 16]) {
    let mut v = [0i8; QK_K];
    let mut scales = [0u8; 16];
    for ib in 0..8 {
        let sb = sub_block(kind, b, ib);
        for l in 0..4 {
            for j in 0..8 {
                let m = (sb.grid[l] >> (8 * j)) as u8 as i8;
                v[32 * ib + 8 * l + j] = if sb.signs[l] >> j & 1 != 0 { -m } else { m };
            }
        }
        scales[2 * ib..2 * ib + 2].copy_from_slice(&sb.scales);
    }
    (v, scales)
}

pub fn dequantize(kind: IqKind, src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, kind.bytes()) {
        let d = rd_f16(b, 0);
        let (v, scales) = values(kind, b);
        for (g, (ys, vs)) in y.chunks_exact_mut(16).zip(v.chunks_exact(16)).enumerate() {
            let db = kind.group_scale(d, scales[g]);
            for (y, &q) in ys.iter_mut().zip(vs) {
                // ggml: db * magnitude * (sign ? -1 : 1), the sign exact.
                *y = db * q.unsigned_abs() as f32 * if q < 0 { -1.0 } else { 1.0 };
            }
        }
    }
}

/// The eight lanes of a block against an activation block: the odd group scales 2 s + 1.
fn block_lanes(kind: IqKind, bw: &[u8], bx: &[u8]) -> [i32; 8] {
    let (v, scales) = values(kind, bw);
    x86_lanes(&v, q8k_qs(bx), &scales.map(|s| 2 * s as i32 + 1))
}

/// ggml's AVX2 vec_dot of the kind.
pub fn vec_dot(kind: IqKind, n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in pairs(w, x, kind.bytes(), n) {
        fma_lanes(&mut acc, rd_f16(bw, 0) * rd_f32(bx, 0), &block_lanes(kind, bw, bx));
    }
    kind.factor() * hsum_float_8(&acc)
}

/// llama.cpp's tiled product of the kind.
pub fn tiled(kind: IqKind, n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, kind.bytes(), |bw, bx| {
        let isum = block_lanes(kind, bw, bx).iter().sum();
        Block { isum, d: rd_f16(bw, 0) * kind.factor(), min: None }
    })
}

/// The table's functions of each kind.
macro_rules! iq_entry_points {
    ($($kind:ident $deq:ident $dot:ident $tiled:ident),*) => {$(
        pub fn $deq(src: &[u8], dst: &mut [f32]) {
            dequantize(IqKind::$kind, src, dst)
        }
        pub fn $dot(n: usize, w: &[u8], x: &[u8]) -> f32 {
            vec_dot(IqKind::$kind, n, w, x)
        }
        pub fn $tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
            tiled(IqKind::$kind, n, w, x)
        }
    )*};
}

iq_entry_points!(
    Iq2Xxs dequantize_iq2_xxs vec_dot_iq2_xxs_q8_k tiled_iq2_xxs_q8_k,
    Iq2Xs dequantize_iq2_xs vec_dot_iq2_xs_q8_k tiled_iq2_xs_q8_k,
    Iq2S dequantize_iq2_s vec_dot_iq2_s_q8_k tiled_iq2_s_q8_k,
    Iq3Xxs dequantize_iq3_xxs vec_dot_iq3_xxs_q8_k tiled_iq3_xxs_q8_k,
    Iq3S dequantize_iq3_s vec_dot_iq3_s_q8_k tiled_iq3_s_q8_k
);

// ---------------------------------------------------------------- IQ1_S
// d | qs[32] (grid index, low 8 bits) | qh[8] (u16: three 3-bit high parts, a 3-bit scale,
// the delta's sign in bit 15)

pub const IQ1_S_BYTES: usize = 50;
/// ggml's IQ1S_DELTA: the values are grid + delta, the grid's -1, 0, 1 shifted by 1/8.
const IQ1S_DELTA: f32 = 0.125;

/// Sub-block ib's u16 of high bits, scale and delta sign.
#[inline(always)]
fn iq1_s_qh(b: &[u8], ib: usize) -> u16 {
    u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]])
}

/// The 256 grid values (-1, 0, 1) of an IQ1_S block.
pub fn iq1_s_grid_values(b: &[u8]) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for (ib, sub) in v.chunks_exact_mut(32).enumerate() {
        let qh = iq1_s_qh(b, ib) as usize;
        for (l, oct) in sub.chunks_exact_mut(8).enumerate() {
            let grid = IQ1S_GRID[b[2 + 4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8)];
            for (j, x) in oct.iter_mut().enumerate() {
                *x = (grid >> (8 * j)) as u8 as i8;
            }
        }
    }
    v
}

/// Sub-block ib's odd scale 2 s + 1 and delta sign (1 or -1).
#[inline(always)]
pub fn iq1_s_scale_sign(b: &[u8], ib: usize) -> (i32, i32) {
    let qh = iq1_s_qh(b, ib);
    (2 * ((qh >> 12) & 7) as i32 + 1, if qh & 0x8000 != 0 { -1 } else { 1 })
}

pub fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, IQ1_S_BYTES) {
        let d = rd_f16(b, 0);
        let v = iq1_s_grid_values(b);
        for (ib, (ys, vs)) in y.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let (ls, sign) = iq1_s_scale_sign(b, ib);
            let (dl, delta) = (d * ls as f32, sign as f32 * IQ1S_DELTA);
            for (y, &g) in ys.iter_mut().zip(vs) {
                *y = dl * (g as f32 + delta);
            }
        }
    }
}

/// The exact integer delta term of a block: the activation's sum over each sub-block times
/// its scale and delta sign.
fn iq1_s_delta_sum(bw: &[u8], bx: &[u8]) -> i32 {
    (0..8)
        .map(|ib| {
            let (ls, sign) = iq1_s_scale_sign(bw, ib);
            (rd_i16(bx, 4 + QK_K + 4 * ib) as i32 + rd_i16(bx, 6 + QK_K + 4 * ib) as i32) * sign * ls
        })
        .sum()
}

/// The grid's lanes of a block against an activation block, times the sub-block scales.
fn iq1_s_lanes(bw: &[u8], bx: &[u8]) -> [i32; 8] {
    x86_lanes(&iq1_s_grid_values(bw), q8k_qs(bx), &std::array::from_fn(|g| iq1_s_scale_sign(bw, g / 2).0))
}

/// ggml_vec_dot_iq1_s_q8_K on AVX2: the grid in eight lanes, `acc = fma(d * d_x, lanes,
/// acc)`; the delta term as one integer per block, `acc1 = fma(d * d_x, float(sum), acc1)`
/// (GCC contracts ggml's `accum1 += d * sumi1`); the result `hsum_float_8(acc) + 1/8 * acc1`.
pub fn vec_dot_iq1_s_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc1) = ([0.0f32; 8], 0.0f32);
    for (bw, bx) in pairs(w, x, IQ1_S_BYTES, n) {
        let d = rd_f32(bx, 0) * rd_f16(bw, 0);
        fma_lanes(&mut acc, d, &iq1_s_lanes(bw, bx));
        acc1 = d.mul_add(iq1_s_delta_sum(bw, bx) as f32, acc1);
    }
    hsum_float_8(&acc) + IQ1S_DELTA * acc1
}

/// IQ1_S as llama.cpp's tiled product: the values 8 * grid + delta sign, d / 8.
pub fn tiled_iq1_s_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, IQ1_S_BYTES, |bw, bx| {
        let grid: i32 = iq1_s_lanes(bw, bx).iter().sum();
        Block { isum: 8 * grid + iq1_s_delta_sum(bw, bx), d: rd_f16(bw, 0) * 0.125, min: None }
    })
}

// ---------------------------------------------------------------- IQ1_M
// qs[32] (grid index, low 8 bits) | qh[16] (per 8 elements a 3-bit high part and the delta's
// sign) | scales[8] (four u16: 3-bit scales of the 16-element groups; their top nibbles
// together the block's f16 d)

pub const IQ1_M_BYTES: usize = 56;

/// The block's d, spread over the top nibbles of its four scale words.
pub fn iq1_m_d(b: &[u8]) -> f32 {
    let sc = |k: usize| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
    let bits = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
    crate::util::f16_to_f32(bits)
}

/// The odd scales 2 s + 1 of the 16 groups.
pub fn iq1_m_scales16(b: &[u8]) -> [i32; 16] {
    std::array::from_fn(|g| {
        let word = u16::from_le_bytes([b[48 + 2 * (g / 4)], b[49 + 2 * (g / 4)]]);
        2 * ((word >> (3 * (g % 4))) & 7) as i32 + 1
    })
}

/// The 256 grid values (-1, 0, 1) of an IQ1_M block and the delta sign (1 or -1) of each
/// element.
pub fn iq1_m_values(b: &[u8]) -> ([i8; QK_K], [i8; QK_K]) {
    let (mut v, mut delta) = ([0i8; QK_K], [0i8; QK_K]);
    for k in 0..32 {
        let qh = b[32 + k / 2] >> (4 * (k % 2));
        let grid = IQ1S_GRID[b[k] as usize | (((qh & 7) as usize) << 8)];
        for j in 0..8 {
            v[8 * k + j] = (grid >> (8 * j)) as u8 as i8;
            delta[8 * k + j] = if qh & 8 != 0 { -1 } else { 1 };
        }
    }
    (v, delta)
}

pub fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks(src, dst, IQ1_M_BYTES) {
        let (d, scales) = (iq1_m_d(b), iq1_m_scales16(b));
        let (v, delta) = iq1_m_values(b);
        for (p, y) in y.iter_mut().enumerate() {
            *y = d * scales[p / 16] as f32 * (v[p] as f32 + delta[p] as f32 * IQ1S_DELTA);
        }
    }
}

/// The grid's lanes and the deltas' lanes of a block against an activation block.
fn iq1_m_lanes(bw: &[u8], bx: &[u8]) -> ([i32; 8], [i32; 8]) {
    let (v, delta) = iq1_m_values(bw);
    let scales = iq1_m_scales16(bw);
    (x86_lanes(&v, q8k_qs(bx), &scales), x86_lanes(&delta, q8k_qs(bx), &scales))
}

/// ggml_vec_dot_iq1_m_q8_K on AVX2: the grid and the deltas each in eight lanes with their
/// own accumulator, `acc = fma(d * d_x, lanes, acc)`; `hsum(acc) + 1/8 * hsum(acc_delta)`.
pub fn vec_dot_iq1_m_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_delta) = ([0.0f32; 8], [0.0f32; 8]);
    for (bw, bx) in pairs(w, x, IQ1_M_BYTES, n) {
        let d = rd_f32(bx, 0) * iq1_m_d(bw);
        let (grid, delta) = iq1_m_lanes(bw, bx);
        fma_lanes(&mut acc, d, &grid);
        fma_lanes(&mut acc_delta, d, &delta);
    }
    hsum_float_8(&acc) + IQ1S_DELTA * hsum_float_8(&acc_delta)
}

/// IQ1_M as llama.cpp's tiled product: the values 8 * grid + delta sign, d / 8.
pub fn tiled_iq1_m_q8_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    tiled_dot(n, w, x, IQ1_M_BYTES, |bw, bx| {
        let (grid, delta) = iq1_m_lanes(bw, bx);
        let isum = 8 * grid.iter().sum::<i32>() + delta.iter().sum::<i32>();
        Block { isum, d: iq1_m_d(bw) * 0.125, min: None }
    })
}
