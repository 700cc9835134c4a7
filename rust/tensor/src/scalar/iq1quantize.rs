//! ggml's IQ1 quantizers (quantize_row_iq1_s_impl, quantize_row_iq1_m_impl): what
//! `llama-quantize` writes for IQ1_S (importance weights required) and IQ1_M (with them, or
//! with x² as weights). Float operations are in ggml's order so the bytes are ggml's.
//!
//! Each value is one of three levels -1, 0, 1 shifted by +δ or -δ (δ = 1/8, one shift per
//! group), times the group's scale. The best split of a group's values into the three levels
//! is found exactly: sorted by value, every pair of boundaries (i1, i2) is scored from prefix
//! sums. The levels of each 8 values must then be a point of the 2048-point IQ1 grid
//! (`iq_index`); those that are not become their best neighbour on it.
//!
//! Ties: ggml sorts the values with qsort and a comparison of the values alone. glibc's qsort
//! (the reference build's, 2.36) is a merge sort, stable, so equal values keep their order of
//! position; so does this sort (-0 and +0 are equal). The bytes depend on that order only
//! through equal values.

use super::iq3quantize::{importance_weights, sigma2};
use super::iq_index::{grid_index, levels_key, GridIndex, Iq2Grid};
use super::iquants::{IQ1_M_BYTES, IQ1_S_BYTES};
use super::kquants::QK_K;
use crate::util::{f32_to_f16, nearest_int, wr_f16};

/// ggml's IQ1S_DELTA and IQ1M_DELTA.
const DELTA: f32 = 0.125;
/// The three values under a +δ shift, by level 0, 1, 2 (ggml's x_p)...
const X_P: [f32; 3] = [-1.0 + DELTA, DELTA, 1.0 + DELTA];
/// ...and under a -δ shift (x_m).
const X_M: [f32; 3] = [-1.0 - DELTA, -DELTA, 1.0 - DELTA];
/// Groups below these largest magnitudes are zero (ggml's GROUP_MAX_EPS_IQ1_S / _IQ1_M).
const IQ1_S_EPS: f32 = 1e-12;
const IQ1_M_EPS: f32 = 1e-7;
const S_SUB: usize = 32;
const M_SUB: usize = 16;

/// The positions of `xb` in ascending order of value, equal values in position order (a
/// stable insertion sort under ggml's `<` comparison).
fn sorted_positions<const N: usize>(xb: &[f32]) -> [u8; N] {
    let mut order: [u8; N] = std::array::from_fn(|i| i as u8);
    for j in 1..N {
        let mut k = j;
        while k > 0 && xb[order[k] as usize] < xb[order[k - 1] as usize] {
            order.swap(k, k - 1);
            k -= 1;
        }
    }
    order
}

/// Levels from a split of the sorted positions: the first i1 level 0, up to i2 level 1, the
/// rest level 2; a negative scale mirrors them (2 - l).
fn split_levels(order: &[u8], i1: usize, i2: usize, mirrored: bool, levels: &mut [i8]) {
    for (j, &i) in order.iter().enumerate() {
        let l = if j < i1 { 0 } else if j < i2 { 1 } else { 2 };
        levels[i as usize] = if mirrored { 2 - l } else { l };
    }
}

/// The largest |x| of a group (ggml's MAX over fabsf).
fn max_abs(xb: &[f32]) -> f32 {
    xb[1..].iter().fold(xb[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// A grid point's three-valued levels (0, 1, 2).
#[inline(always)]
fn point_levels(ix: &GridIndex, j: usize) -> [usize; 8] {
    ix.grid[j].to_le_bytes().map(|b| ((b - 1) / 2) as usize)
}

/// iq1_find_best_neighbour2: among the neighbours of the off-grid levels with map entry `m`,
/// the point whose `values` at `scale` are nearest to `xb` under `weight` (first on ties).
/// ggml aborts when no distance is below FLT_MAX (infinite or NaN input); the first
/// neighbour is taken then.
fn best_neighbour(ix: &GridIndex, m: i32, xb: &[f32], weight: &[f32], scale: f32, values: &[f32; 3]) -> usize {
    let start = (-m - 1) as usize;
    let list = &ix.neighbours[start + 1..start + 1 + ix.neighbours[start] as usize];
    let mut best_d2 = f32::MAX;
    let mut best = list[0] as usize;
    for &j in list {
        let mut d2 = 0.0f32;
        for ((&l, &x), &w) in point_levels(ix, j as usize).iter().zip(xb).zip(weight) {
            let diff = scale * values[l] - x;
            d2 += w * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = j as usize;
        }
    }
    best
}

/// The grid index of each 8 levels of a group, their best neighbour where they are off the
/// grid; `values(k)` are the level values of 8-run k. Returns whether all were on the grid.
fn grid_indices(ix: &GridIndex, levels: &[i8], xb: &[f32], weight: &[f32], scale: f32, values: impl Fn(usize) -> &'static [f32; 3], out: &mut [u16]) -> bool {
    let mut all_on_grid = true;
    for (k, slot) in out.iter_mut().enumerate() {
        let run = 8 * k..8 * k + 8;
        let m = ix.map[levels_key(&levels[run.clone()])];
        *slot = if m >= 0 {
            m as u16
        } else {
            all_on_grid = false;
            best_neighbour(ix, m, &xb[run.clone()], &weight[run], scale, values(k)) as u16
        };
    }
    all_on_grid
}

/// The least-squares scale of the group's grid points (ggml keeps the old one unless both
/// sums are positive).
fn refit_scale(ix: &GridIndex, indices: &[u16], xb: &[f32], weight: &[f32], values: impl Fn(usize) -> &'static [f32; 3], scale: f32) -> f32 {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (k, &j) in indices.iter().enumerate() {
        for (i, &l) in point_levels(ix, j as usize).iter().enumerate() {
            let (w, q) = (weight[8 * k + i], values(k)[l]);
            sumqx += w * q * xb[8 * k + i];
            sumq2 += w * q * q;
        }
    }
    if sumqx > 0.0 && sumq2 > 0.0 { sumqx / sumq2 } else { scale }
}

/// The 3-bit code of a group scale under the super-block's inverse scale `id`.
#[inline(always)]
fn scale_code(id: f32, scale: f32) -> u16 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 7) as u16
}

/// A quantized group: its scale, its shift choice, and its 8-runs' grid indices.
struct Group<const R: usize> {
    scale: f32,
    shift: u8,
    indices: [u16; R],
}

// ---------------------------------------------------------------- IQ1_S

/// The exact best split of a 32-value group under one shift for the whole group: (i1, i2,
/// shift +1 as true) and the scale, None if no split has a positive Σw·q².
fn iq1_s_split(xb: &[f32], weight: &[f32], order: &[u8; S_SUB]) -> Option<(usize, usize, bool, f32)> {
    let (mut sumx, mut sumw) = ([0.0f32; S_SUB + 1], [0.0f32; S_SUB + 1]);
    for (j, &i) in order.iter().enumerate() {
        let i = i as usize;
        sumx[j + 1] = sumx[j] + weight[i] * xb[i];
        sumw[j + 1] = sumw[j] + weight[i];
    }
    let (mut best_score, mut best) = (-f32::MAX, None);
    for i1 in 0..=S_SUB {
        for i2 in i1..=S_SUB {
            for (plus, v) in [(true, &X_P), (false, &X_M)] {
                let sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[S_SUB] - sumx[i2]) * v[2];
                let sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] + (sumw[S_SUB] - sumw[i2]) * v[2] * v[2];
                if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                    let scale = sumqx / sumq2;
                    best_score = scale * sumqx;
                    best = Some((i1, i2, plus, scale));
                }
            }
        }
    }
    best
}

/// One IQ1_S group; None when it is stored as zero (scale 0, shift +δ).
fn iq1_s_group(ix: &GridIndex, xb: &[f32], weight: &[f32]) -> Option<Group<4>> {
    if max_abs(xb) < IQ1_S_EPS {
        return None;
    }
    let order = sorted_positions::<S_SUB>(xb);
    let (i1, i2, mut plus, mut scale) = iq1_s_split(xb, weight, &order)?;
    let mirrored = scale < 0.0;
    if mirrored {
        scale = -scale;
        plus = !plus;
    }
    let mut levels = [0i8; S_SUB];
    split_levels(&order, i1, i2, mirrored, &mut levels);
    let values: fn(usize) -> &'static [f32; 3] = if plus { |_| &X_P } else { |_| &X_M };
    let mut indices = [0u16; 4];
    if !grid_indices(ix, &levels, xb, weight, scale, values, &mut indices) {
        scale = refit_scale(ix, &indices, xb, weight, values, scale);
    }
    Some(Group { scale, shift: if plus { 0 } else { 1 }, indices })
}

/// quantize_row_iq1_s_impl for one super-block: d | 32 low bytes of the grid indices | per
/// group a u16 of the indices' high 3 bits, the 3-bit scale and the shift's sign.
fn iq1_s_block(ix: &GridIndex, xbl: &[f32], qw: &[f32], y: &mut [u8]) {
    y.fill(0);
    let sigma2 = sigma2(xbl);
    let mut weight = [0.0f32; S_SUB];
    let mut groups: [Option<Group<4>>; QK_K / S_SUB] = Default::default();
    let mut max_scale = 0.0f32;
    for (ib, slot) in groups.iter_mut().enumerate() {
        let g = S_SUB * ib..S_SUB * ib + S_SUB;
        importance_weights(&xbl[g.clone()], Some(&qw[g.clone()]), sigma2, &mut weight);
        *slot = iq1_s_group(ix, &xbl[g], &weight);
        if let Some(group) = slot {
            let mut high = 0u16;
            for (k, &j) in group.indices.iter().enumerate() {
                y[2 + 4 * ib + k] = j as u8;
                high |= (j >> 8) << (3 * k);
            }
            y[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&high.to_le_bytes());
            max_scale = if max_scale > group.scale { max_scale } else { group.scale };
        }
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 15.0;
    wr_f16(y, 0, d * 1.125f32);
    let id = 1.0 / d;
    for (ib, group) in groups.iter().enumerate() {
        let (scale, minus) = group.as_ref().map_or((0.0, false), |g| (g.scale, g.shift == 1));
        let code = scale_code(id, scale) | if minus { 8 } else { 0 };
        y[35 + 2 * ib] |= (code << 4) as u8;
    }
}

// ---------------------------------------------------------------- IQ1_M

/// ggml's x_p/x_m choice of an IQ1_M 16-value group's 8-run k (0, 1) under shift code s:
/// 0 (+, +), 1 (+, -), 2 (-, +), 3 (-, -).
fn m_values(s: u8, k: usize) -> &'static [f32; 3] {
    let plus = if k == 0 { s < 2 } else { s.is_multiple_of(2) };
    if plus { &X_P } else { &X_M }
}

/// Prefix sums of w·x and w over the sorted positions, kept per 8-run (each run has its own
/// shift): ([run][j], [run][j]).
type HalfSums = ([[f32; M_SUB + 1]; 2], [[f32; M_SUB + 1]; 2]);

fn half_prefix_sums(xb: &[f32], weight: &[f32], order: &[u8; M_SUB]) -> HalfSums {
    let (mut px, mut pw) = ([[0.0f32; M_SUB + 1]; 2], [[0.0f32; M_SUB + 1]; 2]);
    for (j, &i) in order.iter().enumerate() {
        let i = i as usize;
        let h = usize::from(i >= M_SUB / 2);
        px[h][j + 1] = px[h][j] + weight[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + weight[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    (px, pw)
}

/// The exact best split of a 16-value group with a shift per 8-run: (i1, i2, shift code 0..4)
/// and the scale. With v0 - v1 = v1 - v2 = -1 the sums of a split reduce to the run's totals
/// times v2 less the prefix sums at the boundaries (ggml's formulation, kept for its floats).
fn iq1_m_split(xb: &[f32], weight: &[f32], order: &[u8; M_SUB]) -> Option<(usize, usize, u8, f32)> {
    let (px, pw) = half_prefix_sums(xb, weight, order);
    let (txs, tws) = ([px[0][M_SUB], px[1][M_SUB]], [pw[0][M_SUB], pw[1][M_SUB]]);
    let (p2, m2) = (X_P[2], X_M[2]);
    let (cp1, cp2) = (X_P[0] * X_P[0] - X_P[1] * X_P[1], X_P[1] * X_P[1] - X_P[2] * X_P[2]);
    let (cm1, cm2) = (X_M[0] * X_M[0] - X_M[1] * X_M[1], X_M[1] * X_M[1] - X_M[2] * X_M[2]);
    let (mut best_score, mut best) = (-f32::MAX, None);
    for i1 in 0..=M_SUB {
        for i2 in i1..=M_SUB {
            // [run][0: +δ, 1: -δ]
            let (mut qx, mut q2) = ([[0.0f32; 2]; 2], [[0.0f32; 2]; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx[h] = [txs[h] * p2 - sx, txs[h] * m2 - sx];
                q2[h] = [tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2, tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2];
            }
            for s in 0..4u8 {
                let (a, b) = (usize::from(s >= 2), usize::from(!s.is_multiple_of(2)));
                let (sumqx, sumq2) = (qx[0][a] + qx[1][b], q2[0][a] + q2[1][b]);
                if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                    let scale = sumqx / sumq2;
                    best_score = scale * sumqx;
                    best = Some((i1, i2, s, scale));
                }
            }
        }
    }
    best
}

/// One IQ1_M group; None when it is stored as zero (scale 0, shift code 0).
fn iq1_m_group(ix: &GridIndex, xb: &[f32], weight: &[f32]) -> Option<Group<2>> {
    if max_abs(xb) < IQ1_M_EPS {
        return None;
    }
    let order = sorted_positions::<M_SUB>(xb);
    let (i1, i2, mut shift, mut scale) = iq1_m_split(xb, weight, &order)?;
    let mirrored = scale < 0.0;
    if mirrored {
        scale = -scale;
        shift = 3 - shift;
    }
    let mut levels = [0i8; M_SUB];
    split_levels(&order, i1, i2, mirrored, &mut levels);
    let values = |k| m_values(shift, k);
    let mut indices = [0u16; 2];
    if !grid_indices(ix, &levels, xb, weight, scale, values, &mut indices) {
        scale = refit_scale(ix, &indices, xb, weight, values, scale);
    }
    Some(Group { scale, shift, indices })
}

/// quantize_row_iq1_m_impl for one super-block: 32 low bytes of the grid indices | per group
/// a byte of the two indices' high 3 bits and shift signs | four u16 of 3-bit scales whose top
/// nibbles hold the f16 super-scale.
fn iq1_m_block(ix: &GridIndex, xbl: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    y.fill(0);
    let sigma2 = sigma2(xbl);
    let mut weight = [0.0f32; QK_K];
    importance_weights(xbl, qw, sigma2, &mut weight);
    let mut groups: [Option<Group<2>>; QK_K / M_SUB] = Default::default();
    let mut max_scale = 0.0f32;
    for (ib, slot) in groups.iter_mut().enumerate() {
        let g = M_SUB * ib..M_SUB * ib + M_SUB;
        *slot = iq1_m_group(ix, &xbl[g.clone()], &weight[g]);
        if let Some(group) = slot {
            let [j0, j1] = group.indices;
            y[2 * ib] = j0 as u8;
            y[2 * ib + 1] = j1 as u8;
            y[32 + ib] = ((j0 >> 8) | ((j1 >> 8) << 4)) as u8;
            max_scale = if max_scale > group.scale { max_scale } else { group.scale };
        }
    }
    if max_scale == 0.0 {
        return;
    }
    let mut sc = [0u16; 4];
    let d = iq1_m_scales_and_d(ix, xbl, &weight, &groups, max_scale, y, &mut sc);
    let bits = f32_to_f16(d * 1.1125f32);
    sc[0] |= (bits & 0x000f) << 12;
    sc[1] |= (bits & 0x00f0) << 8;
    sc[2] |= (bits & 0x0f00) << 4;
    sc[3] |= bits & 0xf000;
    for (k, s) in sc.iter().enumerate() {
        y[48 + 2 * k..50 + 2 * k].copy_from_slice(&s.to_le_bytes());
    }
}

/// IQ1_M's group scale codes (into `sc`) and shift bits (into the block's qh bytes), then
/// the super-scale refitted by least squares over every value as stored.
fn iq1_m_scales_and_d(ix: &GridIndex, xbl: &[f32], weight: &[f32], groups: &[Option<Group<2>>], max_scale: f32, y: &mut [u8], sc: &mut [u16; 4]) -> f32 {
    const SHIFT_BITS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (ib, group) in groups.iter().enumerate() {
        let (scale, shift) = group.as_ref().map_or((0.0, 0), |g| (g.scale, g.shift));
        let l = scale_code(id, scale);
        sc[ib / 4] |= l << (3 * (ib % 4));
        y[32 + ib] |= SHIFT_BITS[shift as usize];
        let qh = y[32 + ib] as usize;
        for k in 0..2 {
            let j = y[2 * ib + k] as usize + ((qh << (8 - 4 * k)) & 0x700);
            let values = m_values(shift, k);
            for (i, &lv) in point_levels(ix, j).iter().enumerate() {
                let at = M_SUB * ib + 8 * k + i;
                let (w, q) = (weight[at], values[lv] * (2 * l + 1) as f32);
                sumqx += w * q * xbl[at];
                sumq2 += w * q * q;
            }
        }
    }
    if sumq2 > 0.0 { sumqx / sumq2 } else { d }
}

// ---------------------------------------------------------------- entry points

/// IQ1_S of whole super-blocks under importance weights `qw` (one per value; ggml has no
/// IQ1_S without them).
pub fn quantize_iq1_s_weighted(x: &[f32], qw: &[f32], dst: &mut [u8]) {
    let ix = grid_index(Iq2Grid::Iq1);
    for ((xbl, w), y) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(dst.chunks_exact_mut(IQ1_S_BYTES)) {
        iq1_s_block(ix, xbl, w, y);
    }
}

/// IQ1_M of whole super-blocks under importance weights `qw` (one per value) or x².
pub fn quantize_iq1_m_weighted(x: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let ix = grid_index(Iq2Grid::Iq1);
    for (ibl, (xbl, y)) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(IQ1_M_BYTES)).enumerate() {
        iq1_m_block(ix, xbl, qw.map(|w| &w[QK_K * ibl..QK_K * ibl + QK_K]), y);
    }
}

/// IQ1_M without importance weights (ggml_quantize_chunk with none).
pub fn quantize_iq1_m(src: &[f32], dst: &mut [u8]) {
    quantize_iq1_m_weighted(src, None, dst);
}
