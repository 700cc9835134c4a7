//! ggml's IQ2 quantizers (quantize_row_iq2_xxs_impl, _iq2_xs_impl, _iq2_s_impl), what
//! llama-quantize writes for IQ2_XXS, IQ2_XS and IQ2_S: per group of 8 the signs are split off,
//! the magnitudes are matched to levels 0..=2 at a searched scale and snapped to the nearest grid
//! point through the grid index (`iq_index`), and per super-block the group scales become 4-bit
//! codes of one f16 d. The float operations are in ggml's order, so the bytes are ggml's.
//!
//! IQ2_XXS and IQ2_XS need importance weights (ggml_quantize_requires_imatrix); IQ2_S without
//! them weighs each value by σ²/4 + x² (σ² twice the block's mean square). ggml aborts on a row
//! whose search meets no finite distance (NaN or infinite values); here such a row quantizes to
//! the first candidate grid point instead, with no panic.

use super::iq_index::{grid_index, GridIndex, Iq2Grid};
use super::iquants::IqKind;
use super::kquants::QK_K;
use super::weighted::{make_qp_quants, sum_squares};
use crate::util::{nearest_int, wr_f16};

const GROUP_MAX_EPS: f32 = 1e-15;
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
/// Levels are 0..KMAX (magnitudes 2·level + 1).
const KMAX: i32 = 3;

/// IQ2_XXS rows under importance weights `qw` (one per value).
pub fn quantize_iq2_xxs(x: &[f32], qw: &[f32], dst: &mut [u8]) {
    let index = grid_index(Iq2Grid::Xxs);
    for ((xb, wb), y) in super_blocks(x, qw, dst, IqKind::Iq2Xxs) {
        iq2_xxs_block(index, xb, wb, y);
    }
}

/// IQ2_XS rows under importance weights `qw` (one per value).
pub fn quantize_iq2_xs(x: &[f32], qw: &[f32], dst: &mut [u8]) {
    let index = grid_index(Iq2Grid::Xs);
    for ((xb, wb), y) in super_blocks(x, qw, dst, IqKind::Iq2Xs) {
        iq2_xs_block(index, xb, wb, y);
    }
}

/// IQ2_S rows under importance weights `qw` if given, else ggml's own weighting.
pub fn quantize_iq2_s_weighted(x: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let index = grid_index(Iq2Grid::S);
    match qw {
        Some(qw) => super_blocks(x, qw, dst, IqKind::Iq2S).for_each(|((xb, wb), y)| iq2_s_block(index, xb, Some(wb), y)),
        None => x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(IqKind::Iq2S.bytes())).for_each(|(xb, y)| iq2_s_block(index, xb, None, y)),
    }
}

/// The super-blocks of a row with their weights and output blocks.
fn super_blocks<'a>(x: &'a [f32], qw: &'a [f32], dst: &'a mut [u8], kind: IqKind)
                    -> impl Iterator<Item = ((&'a [f32], &'a [f32]), &'a mut [u8])> {
    x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(dst.chunks_exact_mut(kind.bytes()))
}

/// IQ2_S rows without importance weights (ggml's quantize_row_iq2_s_ref).
pub fn quantize_iq2_s(x: &[f32], dst: &mut [u8]) {
    quantize_iq2_s_weighted(x, None, dst)
}

/// The magnitudes of one group of 8 into `xval` and its sign bits (bit i: x[i] < 0). With
/// `even_parity` (IQ2_XXS, IQ2_XS store 7 sign bits, the 8th implied by even parity) an odd
/// count of negatives is made even by flipping the sign of the value of least weight·x², whose
/// magnitude then goes in negated.
fn split_signs(x: &[f32], weight: &[f32], xval: &mut [f32], even_parity: bool) -> u8 {
    let mut signs = 0u8;
    for i in 0..8 {
        xval[i] = if x[i] >= 0.0 { x[i] } else { signs |= 1 << i; -x[i] };
    }
    if even_parity && signs.count_ones() % 2 == 1 {
        let mut imin = 0;
        let mut min = weight[0] * x[0] * x[0];
        for i in 1..8 {
            let ax = weight[i] * x[i] * x[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        signs ^= 1 << imin;
    }
    signs
}

fn max_of(x: &[f32]) -> f32 {
    x[1..].iter().fold(x[0], |m, &v| if m > v { m } else { v })
}

/// Levels 0..KMAX-1 of `xval` at inverse scale `id` (before snapping to the grid).
fn raw_levels(xval: &[f32], id: f32, levels: &mut [i8]) {
    for (l, &v) in levels.iter_mut().zip(xval) {
        *l = nearest_int(0.5 * (id * v - 1.0)).clamp(0, KMAX - 1) as i8;
    }
}

/// Octet k's levels at 1/id, each octet moved to its nearest grid point (at `scale`).
fn snap_octet(index: &GridIndex, k: usize, id: f32, scale: f32, xval: &[f32], waux: &[f32], levels: &mut [i8]) {
    let r = 8 * k..8 * k + 8;
    raw_levels(&xval[r.clone()], id, &mut levels[r.clone()]);
    index.nearest(&mut levels[r.clone()], &xval[r.clone()], &waux[r], scale);
}

/// Σ w·x·q and Σ w·q² over the magnitudes q = 2·level + 1.
fn weighted_sums(xval: &[f32], weight: &[f32], levels: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..xval.len() {
        let (w, q) = (weight[i], (2 * levels[i] as i32 + 1) as f32);
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// A group's 4-bit scale code under the block's inverse d.
fn scale_code(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// The grid index of each octet of `levels` (all on the grid after the searches: the index of
/// the all-zero point where a non-finite input left one off it).
fn grid_indices<const N: usize>(index: &GridIndex, levels: &[i8]) -> [usize; N] {
    std::array::from_fn(|k| index.on_grid(&levels[8 * k..8 * k + 8]).unwrap_or(0))
}

/// The search of IQ2_XS and IQ2_S for one group of 16: 19 trial scales around max/5, each
/// octet snapped to the grid; the best trial's off-grid octets are then re-snapped at the
/// refined scale. Returns the scale (negative only if the fit was) with the levels in `l`.
fn search16(index: &GridIndex, xval: &[f32; 16], weight: &[f32; 16], waux: &[f32; 16], max: f32, l: &mut [i8; 16]) -> f32 {
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAX - 1) as f32;
    let mut on_grid = [true; 2];
    let mut laux = [0i8; 16];
    for is in -9..=9 {
        let id = ((2 * KMAX - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        let on_grid_aux: [bool; 2] = std::array::from_fn(|k| {
            let r = 8 * k..8 * k + 8;
            raw_levels(&xval[r.clone()], id, &mut laux[r.clone()]);
            let on = index.on_grid(&laux[r.clone()]).is_some();
            if !on {
                index.nearest(&mut laux[r.clone()], &xval[r.clone()], &waux[r], this_scale);
            }
            on
        });
        let (sumqx, sumq2) = weighted_sums(xval, weight, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            *l = laux;
            on_grid = on_grid_aux;
        }
    }
    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in (0..2).filter(|&k| !on_grid[k]) {
            snap_octet(index, k, id, scale, xval, waux, &mut l[..]);
        }
        let (sumqx, sumq2) = weighted_sums(xval, weight, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// The search of IQ2_XXS for one group of 32: make_qp_quants' scale, 13 trial scales around
/// it, then every octet re-snapped at the best scale. Returns the scale with the levels in `l`,
/// None for a group make_qp_quants gives no positive scale (ggml leaves it zero).
fn search32(index: &GridIndex, xval: &[f32; 32], weight: &[f32; 32], waux: &[f32; 32], l: &mut [i8; 32]) -> Option<f32> {
    let mut qp_levels = [0u8; 32];
    let mut scale = make_qp_quants(KMAX + 1, xval, &mut qp_levels, weight);
    // ggml keeps these uint8_t levels (negative ones wrapped) as the group's levels until a
    // trial replaces them; the final re-snap overwrites them whenever the scale is positive.
    *l = qp_levels.map(|v| v as i8);
    let eff_max = scale * KMAX as f32;
    if eff_max <= 0.0 {
        return None;
    }
    let mut best = 0.0f32;
    let mut laux = [0i8; 32];
    for is in -6..=6 {
        let id = ((2 * KMAX - 1) as f32 + is as f32 * 0.1) / eff_max;
        let this_scale = 1.0 / id;
        for k in 0..4 {
            snap_octet(index, k, id, this_scale, xval, waux, &mut laux[..]);
        }
        let (sumqx, sumq2) = weighted_sums(xval, weight, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            *l = laux;
        }
    }
    if scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..4 {
            snap_octet(index, k, id, scale, xval, waux, &mut l[..]);
        }
        let (sumqx, sumq2) = weighted_sums(xval, weight, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    Some(scale)
}

/// One group's weights qw·sqrt(σ² + x²) (or, without importance weights, σ²/4 + x²) and their
/// square roots (the neighbour search's weights).
fn group_weights<const N: usize>(x: &[f32], qw: Option<&[f32]>, sigma2: f32) -> ([f32; N], [f32; N]) {
    let weight: [f32; N] = match qw {
        Some(qw) => std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt()),
        None => std::array::from_fn(|i| 0.25 * sigma2 + x[i] * x[i]),
    };
    (weight, weight.map(f32::sqrt))
}

/// quantize_row_iq2_xxs_impl for one super-block: d | per 32 values a u32 of four grid indices
/// and a u32 of four 7-bit sign groups with the scale code in its top 4 bits.
fn iq2_xxs_block(index: &GridIndex, x: &[f32], qw: &[f32], y: &mut [u8]) {
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut q2 = [0u32; QK_K / 16];
    let mut scales = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 32 {
        let xb = &x[32 * ib..32 * ib + 32];
        let (weight, waux) = group_weights::<32>(xb, Some(&qw[32 * ib..32 * ib + 32]), sigma2);
        let mut xval = [0.0f32; 32];
        let mut signs = [0u8; 4];
        for k in 0..4 {
            signs[k] = split_signs(&xb[8 * k..], &weight[8 * k..], &mut xval[8 * k..8 * k + 8], true) & 127;
        }
        if max_of(&xval) < GROUP_MAX_EPS {
            continue;
        }
        let mut l = [0i8; 32];
        let Some(mut scale) = search32(index, &xval, &weight, &waux, &mut l) else { continue };
        if scale < 0.0 {
            scale = -scale;
            signs = signs.map(|s| !s & 127);
        }
        let grid: [usize; 4] = grid_indices(index, &l);
        for k in 0..4 {
            q2[2 * ib] |= (grid[k] as u32) << (8 * k);
            q2[2 * ib + 1] |= (signs[k] as u32) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    y.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    wr_f16(y, 0, d);
    let id = 1.0 / d;
    for ib in 0..QK_K / 32 {
        q2[2 * ib + 1] |= (scale_code(id, scales[ib]) as u32) << 28;
    }
    for (b, q) in y[2..].chunks_exact_mut(4).zip(q2) {
        b.copy_from_slice(&q.to_le_bytes());
    }
}

/// The magnitudes, sign bytes, weights and search weights of one group of 16.
struct Group16 {
    xval: [f32; 16],
    signs: [u8; 2],
    weight: [f32; 16],
    waux: [f32; 16],
}

impl Group16 {
    fn new(x: &[f32], qw: Option<&[f32]>, sigma2: f32, even_parity: bool) -> Group16 {
        let (weight, waux) = group_weights::<16>(x, qw, sigma2);
        let mut xval = [0.0f32; 16];
        let signs = std::array::from_fn(|k| split_signs(&x[8 * k..], &weight[8 * k..], &mut xval[8 * k..8 * k + 8], even_parity));
        Group16 { xval, signs, weight, waux }
    }

    /// The group's positive scale, its two grid indices and its sign bytes (`sign_mask`: the
    /// stored bits), None for a group of (near) zeros below `eps`.
    fn quantize(mut self, index: &GridIndex, eps: f32, sign_mask: u8) -> Option<(f32, [usize; 2], [u8; 2])> {
        let max = max_of(&self.xval);
        if max < eps {
            return None;
        }
        let mut l = [0i8; 16];
        let mut scale = search16(index, &self.xval, &self.weight, &self.waux, max, &mut l);
        if scale < 0.0 {
            scale = -scale;
            self.signs = self.signs.map(|s| !s & sign_mask);
        }
        Some((scale, grid_indices(index, &l), self.signs.map(|s| s & sign_mask)))
    }
}

/// The 16 groups of a super-block through `Group16::quantize`, each result handed to `put`
/// with its group number; returns the scales (0 for a skipped group) and their maximum.
fn groups16(index: &GridIndex, x: &[f32], qw: Option<&[f32]>, sigma2: f32, iq2_s: bool,
            mut put: impl FnMut(usize, [usize; 2], [u8; 2])) -> ([f32; QK_K / 16], f32) {
    let (eps, sign_mask) = if iq2_s { (GROUP_MAX_EPS_IQ2_S, 0xff) } else { (GROUP_MAX_EPS, 127) };
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let group = Group16::new(&x[16 * ib..16 * ib + 16], qw.map(|w| &w[16 * ib..16 * ib + 16]), sigma2, !iq2_s);
        if let Some((scale, grid, signs)) = group.quantize(index, eps, sign_mask) {
            put(ib, grid, signs);
            scales[ib] = scale;
            max_scale = if max_scale > scale { max_scale } else { scale };
        }
    }
    (scales, max_scale)
}

/// Two 4-bit scale codes per byte (even groups in the low nibble), ggml's IQ2_XS / IQ2_S layout.
fn pack_scale_codes(scales: &[f32; QK_K / 16], id: f32, out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(scales.chunks_exact(2)) {
        *o = scale_code(id, pair[0]) | scale_code(id, pair[1]) << 4;
    }
}

/// quantize_row_iq2_xs_impl for one super-block: d | per 8 values a u16 of the 9-bit grid
/// index and 7 sign bits | 8 bytes of scale codes.
fn iq2_xs_block(index: &GridIndex, x: &[f32], qw: &[f32], y: &mut [u8]) {
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut q2 = [0u16; QK_K / 8];
    let (scales, max_scale) = groups16(index, x, Some(qw), sigma2, false, |ib, grid, signs| {
        for k in 0..2 {
            q2[2 * ib + k] = grid[k] as u16 | (signs[k] as u16) << 9;
        }
    });
    y.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    wr_f16(y, 0, d);
    for (b, q) in y[2..66].chunks_exact_mut(2).zip(q2) {
        b.copy_from_slice(&q.to_le_bytes());
    }
    pack_scale_codes(&scales, 1.0 / d, &mut y[66..74]);
}

/// quantize_row_iq2_s_impl for one super-block: d | 32 low bytes of the 10-bit grid indices |
/// 32 sign bytes | 8 bytes of the indices' high 2 bits | 8 bytes of scale codes.
fn iq2_s_block(index: &GridIndex, x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    y.fill(0);
    let (scales, max_scale) = groups16(index, x, qw, sigma2, true, |ib, grid, signs| {
        for k in 0..2 {
            let i8 = 2 * ib + k;
            y[2 + i8] = grid[k] as u8;
            y[66 + i8 / 4] |= ((grid[k] >> 8) << (2 * (i8 % 4))) as u8;
            y[34 + i8] = signs[k];
        }
    });
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    wr_f16(y, 0, d * 0.9875);
    pack_scale_codes(&scales, 1.0 / d, &mut y[74..82]);
}
