//! ggml's IQ3 quantizers (quantize_row_iq3_xxs_impl, quantize_row_iq3_s_impl) with their
//! grid index (iq3xs_init_impl), what `llama-quantize` writes for IQ3_XXS and IQ3_S, with
//! importance weights or without (then the weights are x²). Float operations are in
//! ggml's order so the bytes are ggml's.
//!
//! Each 32-value sub-block is quantized as magnitudes on a grid of 4-value points (levels
//! 0..=7 per value, stored as the odd numbers 2l+1) plus a sign per value; points of the
//! 4096 possible level quadruples that are not on the grid are replaced by their best
//! neighbour among the grid points nearest to them.

use std::sync::OnceLock;

use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::iquants::IqKind;
use super::kquants::QK_K;
use crate::util::{nearest_int, wr_f16};

/// The largest level of a value (levels are 0..=7, i.e. the odd magnitudes 1..=15).
const MAX_LEVEL: i32 = 7;
/// The largest magnitude, 2·7+1: candidate inverse scales are (15 + 0.2 s)/max.
const MAX_MAGNITUDE: f32 = 15.0;
/// Level quadruples: 3 bits per value.
const QUADS: usize = 1 << 12;
/// IQ3_XXS treats a sub-block whose largest magnitude is below this as zero.
const IQ3_XXS_GROUP_EPS: f32 = 1e-8;
const SUB: usize = 32;

/// One of ggml's two IQ3 grids with its map from level quadruples to grid points.
pub struct Iq3Index {
    /// Grid point i: four bytes 2l+1 (byte j is value j).
    pub grid: Vec<u32>,
    /// For each quadruple `u` (level of value j in bits 3j..3j+3): its grid index if it is on
    /// the grid, else -(o+1) with `neighbours[o]` the count of its neighbours, which follow.
    pub map: Vec<i32>,
    /// The neighbour lists of the quadruples off the grid: the grid points at the smallest
    /// two (IQ3_XXS) or three (IQ3_S) distinct squared distances, nearest first, ties by
    /// grid index.
    pub neighbours: Vec<u16>,
}

impl Iq3Index {
    /// The grid point's four byte values.
    #[inline(always)]
    fn point(&self, index: usize) -> [u8; 4] {
        self.grid[index].to_le_bytes()
    }

    /// The neighbours of the off-grid quadruple whose map entry is `m` (< 0).
    #[inline(always)]
    fn neighbours_of(&self, m: i32) -> &[u16] {
        let start = (-m - 1) as usize;
        let count = self.neighbours[start] as usize;
        &self.neighbours[start + 1..start + 1 + count]
    }
}

/// The quadruple index of four levels.
#[inline(always)]
fn quad_of(levels: &[i8]) -> usize {
    levels.iter().enumerate().fold(0, |u, (j, &l)| u | (l as usize) << (3 * j))
}

/// IQ3_XXS's 256-point grid: our dequantization table stores the magnitudes 4, 12, ..., 52,
/// 62 for the levels 0..=7; the quantizer's grid is the same points as 2l+1.
fn iq3_xxs_grid() -> Vec<u32> {
    const MAGNITUDES: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
    let level = |b: u8| MAGNITUDES.iter().position(|&m| m == b).expect("IQ3XXS_GRID holds only the eight magnitudes") as u8;
    IQ3XXS_GRID.iter().map(|&g| u32::from_le_bytes(g.to_le_bytes().map(|b| 2 * level(b) + 1))).collect()
}

/// iq3xs_init_impl: the map and the neighbour lists of `grid` (`nwant` distinct distances).
fn build_index(grid: Vec<u32>, nwant: usize) -> Iq3Index {
    let mut map = vec![-1i32; QUADS];
    for (i, &g) in grid.iter().enumerate() {
        let levels = g.to_le_bytes().map(|b| ((b - 1) / 2) as i8);
        map[quad_of(&levels)] = i as i32;
    }
    let mut neighbours = Vec::new();
    let mut dist: Vec<(i32, u16)> = Vec::with_capacity(grid.len());
    for (u, m) in map.iter_mut().enumerate() {
        if *m >= 0 {
            continue;
        }
        let pos: [i32; 4] = std::array::from_fn(|j| 2 * ((u >> (3 * j)) & 7) as i32 + 1);
        dist.clear();
        dist.extend(grid.iter().enumerate().map(|(j, &g)| {
            let d2 = g.to_le_bytes().iter().zip(&pos).map(|(&b, &p)| (b as i32 - p) * (b as i32 - p)).sum::<i32>();
            (d2, j as u16)
        }));
        // ggml sorts (distance, index) pairs with a comparison of both: a total order, so
        // its unstable qsort gives this order too.
        dist.sort_unstable();
        *m = -(neighbours.len() as i32 + 1);
        let count_at = neighbours.len();
        neighbours.push(0);
        let (mut distinct, mut last) = (1, dist[0].0);
        for &(d2, j) in &dist {
            if d2 > last {
                if distinct == nwant {
                    break;
                }
                last = d2;
                distinct += 1;
            }
            neighbours.push(j);
        }
        neighbours[count_at] = (neighbours.len() - count_at - 1) as u16;
    }
    Iq3Index { grid, map, neighbours }
}

/// The index of IQ3_XXS's grid (256 points) or IQ3_S's (512 points), built once.
pub fn iq3_index(kind: IqKind) -> &'static Iq3Index {
    static XXS: OnceLock<Iq3Index> = OnceLock::new();
    static S: OnceLock<Iq3Index> = OnceLock::new();
    match kind {
        IqKind::Iq3S => S.get_or_init(|| build_index(IQ3S_GRID.to_vec(), 3)),
        _ => XXS.get_or_init(|| build_index(iq3_xxs_grid(), 2)),
    }
}

/// iq3_find_best_neighbour: the neighbour nearest to `xval` at `scale` under `weight`
/// (first one on ties); its levels go to `levels`.
fn best_neighbour(ix: &Iq3Index, m: i32, xval: &[f32], weight: &[f32], scale: f32, levels: &mut [i8]) -> u16 {
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &j in ix.neighbours_of(m) {
        let mut d2 = 0.0f32;
        for ((&b, &x), &w) in ix.point(j as usize).iter().zip(xval).zip(weight) {
            let diff = scale * b as f32 - x;
            d2 += w * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(j);
        }
    }
    // ggml aborts when no distance is below FLT_MAX (infinite or NaN input); the nearest in
    // list order, the first, is the answer for such values.
    let j = best.unwrap_or(ix.neighbours_of(m)[0]);
    set_levels(ix, j, levels);
    j
}

fn set_levels(ix: &Iq3Index, j: u16, levels: &mut [i8]) {
    for (l, b) in levels.iter_mut().zip(ix.point(j as usize)) {
        *l = ((b - 1) / 2) as i8;
    }
}

/// How a sub-block's scale search differs between IQ3_XXS and IQ3_S.
#[derive(Clone, Copy)]
struct Search {
    /// Candidate inverse scales (15 + 0.2 s)/max for s in -steps..=steps.
    steps: i32,
    /// IQ3_XXS: before any candidate is taken every quad counts as on the grid, and the
    /// refit only revisits quads that were off it; IQ3_S revisits all of them.
    xxs: bool,
}

/// A sub-block's working values: magnitudes (`xval`), weights, their square roots (the
/// weights of the neighbour search), and the chosen levels and grid indices.
struct SubBlock {
    xval: [f32; SUB],
    weight: [f32; SUB],
    waux: [f32; SUB],
    levels: [i8; SUB],
    grid: [u16; SUB / 4],
}

impl SubBlock {
    fn new() -> Self {
        SubBlock { xval: [0.0; SUB], weight: [0.0; SUB], waux: [0.0; SUB], levels: [0; SUB], grid: [0; SUB / 4] }
    }

    /// The weights (`importance_weights`) and their roots.
    fn set_weights(&mut self, xb: &[f32], qw: Option<&[f32]>, sigma2: f32) {
        importance_weights(xb, qw, sigma2, &mut self.weight);
        for (a, &w) in self.waux.iter_mut().zip(&self.weight) {
            *a = w.sqrt();
        }
    }

    fn max_xval(&self) -> f32 {
        self.xval[1..].iter().fold(self.xval[0], |m, &v| if m > v { m } else { v })
    }

    /// Σ w·x·q and Σ w·q² of `levels` (q = 2l+1).
    fn sums(&self, levels: &[i8; SUB]) -> (f32, f32) {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for ((&w, &x), &l) in self.weight.iter().zip(&self.xval).zip(levels) {
            let q = (2 * l as i32 + 1) as f32;
            sumqx += w * x * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    }

    /// Quad k's levels at inverse scale `id`, onto the grid: its grid index and whether the
    /// rounded levels were on it (else the best neighbour's levels replace them).
    fn quad_at(&self, ix: &Iq3Index, k: usize, id: f32, scale: f32, levels: &mut [i8; SUB]) -> (u16, bool) {
        let q = 4 * k..4 * k + 4;
        for i in q.clone() {
            levels[i] = nearest_int(0.5 * (id * self.xval[i] - 1.0)).clamp(0, MAX_LEVEL) as i8;
        }
        let m = ix.map[quad_of(&levels[q.clone()])];
        if m >= 0 {
            return (m as u16, true);
        }
        let j = best_neighbour(ix, m, &self.xval[q.clone()], &self.waux[q.clone()], scale, &mut levels[q]);
        (j, false)
    }

    /// The sub-block's scale (`max` its largest magnitude, > 0), with `levels` and `grid`
    /// set: the best of the candidate scales, then the off-grid quads refitted at it.
    fn fit(&mut self, ix: &Iq3Index, max: f32, search: Search) -> f32 {
        let mut best = 0.0f32;
        let mut scale = max / MAX_MAGNITUDE;
        let mut on_grid = [search.xxs; SUB / 4];
        self.levels = [0; SUB];
        self.grid = [ix.map[0] as u16; SUB / 4];
        let (mut levels, mut grid, mut on_grid_aux) = ([0i8; SUB], [0u16; SUB / 4], [false; SUB / 4]);
        for is in -search.steps..=search.steps {
            let id = (MAX_MAGNITUDE + is as f32 * 0.2f32) / max;
            let this_scale = 1.0 / id;
            for k in 0..SUB / 4 {
                (grid[k], on_grid_aux[k]) = self.quad_at(ix, k, id, this_scale, &mut levels);
            }
            let (sumqx, sumq2) = self.sums(&levels);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                self.levels = levels;
                self.grid = grid;
                on_grid = on_grid_aux;
            }
        }
        if on_grid.iter().any(|&g| !g) && scale > 0.0 {
            return self.refit(ix, scale, &on_grid, search.xxs);
        }
        scale
    }

    /// The quads rounded again at the chosen `scale` (IQ3_XXS: only those that were off the
    /// grid), then the least-squares scale of the result.
    fn refit(&mut self, ix: &Iq3Index, scale: f32, on_grid: &[bool; SUB / 4], only_off_grid: bool) -> f32 {
        let id = 1.0 / scale;
        let mut levels = self.levels;
        for k in 0..SUB / 4 {
            if only_off_grid && on_grid[k] {
                continue;
            }
            let (j, _) = self.quad_at(ix, k, id, scale, &mut levels);
            set_levels(ix, j, &mut levels[4 * k..4 * k + 4]);
            self.grid[k] = j;
        }
        self.levels = levels;
        let (sumqx, sumq2) = self.sums(&self.levels);
        if sumq2 > 0.0 { sumqx / sumq2 } else { scale }
    }
}

/// |x| and its sign bit as ggml decides it (`x >= 0` or not: NaN counts as negative).
#[inline(always)]
fn magnitude(x: f32) -> (f32, u8) {
    if x >= 0.0 { (x, 0) } else { (-x, 1) }
}

/// The i-quants' weights of the values `xb`: qw · sqrt(σ² + x²) under importance weights
/// `qw`, else x².
pub(super) fn importance_weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, out: &mut [f32]) {
    match qw {
        Some(qw) => {
            for ((w, &x), &q) in out.iter_mut().zip(xb).zip(qw) {
                *w = q * (sigma2 + x * x).sqrt();
            }
        }
        None => {
            for (w, &x) in out.iter_mut().zip(xb) {
                *w = x * x;
            }
        }
    }
}

/// Σx² of a super-block times 2/256: the σ² of the importance weighting.
pub(super) fn sigma2(xbl: &[f32]) -> f32 {
    let mut sumx2 = 0.0f32;
    for &v in xbl {
        sumx2 += v * v;
    }
    2.0 * sumx2 / QK_K as f32
}

/// IQ3_XXS's magnitudes and 7 stored sign bits per 8 values: the eighth sign is implied by
/// even parity, so with an odd count of negatives the value of least w·x² is flipped.
fn xxs_signs(sb: &mut SubBlock, xb: &[f32]) -> [u8; 4] {
    let mut signs = [0u8; 4];
    for (k, s) in signs.iter_mut().enumerate() {
        let mut nflip = 0;
        for i in 0..8 {
            let (v, negative) = magnitude(xb[8 * k + i]);
            sb.xval[8 * k + i] = v;
            nflip += negative;
            *s |= negative << i;
        }
        if nflip % 2 == 1 {
            let cost = |i: usize| sb.weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
            let mut imin = 0;
            let mut min = cost(0);
            for i in 1..8 {
                if cost(i) < min {
                    min = cost(i);
                    imin = i;
                }
            }
            sb.xval[8 * k + imin] = -sb.xval[8 * k + imin];
            *s ^= 1 << imin;
        }
        *s &= 127;
    }
    signs
}

/// The 4-bit code of a sub-block scale under the super-block's inverse scale `id`.
#[inline(always)]
fn scale_code(id: f32, scale: f32) -> u32 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u32
}

/// quantize_row_iq3_xxs_impl for one super-block: d | 64 grid indices | 8 words of four
/// 7-bit sign groups with the 4-bit scale on top.
fn iq3_xxs_block(ix: &Iq3Index, xbl: &[f32], qw: Option<&[f32]>, y: &mut [u8], sb: &mut SubBlock) {
    y.fill(0);
    let sigma2 = sigma2(xbl);
    let mut scales = [0.0f32; QK_K / SUB];
    let mut words = [0u32; QK_K / SUB];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / SUB {
        let xb = &xbl[SUB * ib..SUB * ib + SUB];
        sb.set_weights(xb, qw.map(|w| &w[SUB * ib..SUB * ib + SUB]), sigma2);
        let mut signs = xxs_signs(sb, xb);
        let max = sb.max_xval();
        if max < IQ3_XXS_GROUP_EPS {
            continue;
        }
        let mut scale = sb.fit(ix, max, Search { steps: 15, xxs: true });
        if scale < 0.0 {
            // Only possible through the flipped parity value: the scale is stored unsigned,
            // so the signs flip instead.
            scale = -scale;
            signs.iter_mut().for_each(|s| *s = !*s & 127);
        }
        y[2 + 8 * ib..2 + 8 * ib + 8].copy_from_slice(&sb.grid.map(|g| g as u8));
        words[ib] = signs.iter().enumerate().fold(0, |w, (k, &s)| w | (s as u32) << (7 * k));
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        y[2..].fill(0);
        return;
    }
    let d = max_scale / 31.0;
    wr_f16(y, 0, d * 1.0125f32);
    let id = 1.0 / d;
    for ib in 0..QK_K / SUB {
        let word = words[ib] | scale_code(id, scales[ib]) << 28;
        y[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&word.to_le_bytes());
    }
}

/// quantize_row_iq3_s_impl (block size 32) for one super-block: d | 64 low bytes of the
/// grid indices | 8 bytes of their 9th bits | 32 sign bytes | 4 bytes of two 4-bit scales.
///
/// As in ggml, a sub-block below the threshold (all zero) does not advance the positions
/// its grid bytes and signs would have taken: the following sub-blocks' bytes move up.
fn iq3_s_block(ix: &Iq3Index, xbl: &[f32], qw: Option<&[f32]>, y: &mut [u8], sb: &mut SubBlock) {
    y.fill(0);
    let sigma2 = sigma2(xbl);
    let mut scales = [0.0f32; QK_K / SUB];
    let mut max_scale = 0.0f32;
    let (mut qs_at, mut signs_at) = (2, 74);
    for ib in 0..QK_K / SUB {
        let xb = &xbl[SUB * ib..SUB * ib + SUB];
        sb.set_weights(xb, qw.map(|w| &w[SUB * ib..SUB * ib + SUB]), sigma2);
        let mut signs = [0u8; 4];
        for (i, &x) in xb.iter().enumerate() {
            let (v, negative) = magnitude(x);
            sb.xval[i] = v;
            signs[i / 8] |= negative << (i % 8);
        }
        let max = sb.max_xval();
        if max == 0.0 {
            continue;
        }
        let mut scale = sb.fit(ix, max, Search { steps: 9, xxs: false });
        if scale < 0.0 {
            scale = -scale;
            signs.iter_mut().for_each(|s| *s = !*s);
        }
        for (k, &g) in sb.grid.iter().enumerate() {
            y[qs_at + k] = g as u8;
            y[66 + ib] |= ((g >> 8) as u8) << k;
        }
        qs_at += SUB / 4;
        y[signs_at..signs_at + 4].copy_from_slice(&signs);
        signs_at += 4;
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    wr_f16(y, 0, d * 1.033f32);
    let id = 1.0 / d;
    for (pair, b) in scales.chunks_exact(2).zip(&mut y[106..110]) {
        *b = (scale_code(id, pair[0]) | scale_code(id, pair[1]) << 4) as u8;
    }
}

type BlockFn = fn(&Iq3Index, &[f32], Option<&[f32]>, &mut [u8], &mut SubBlock);

fn per_block(kind: IqKind, block: BlockFn, x: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let ix = iq3_index(kind);
    let mut sb = SubBlock::new();
    for (ibl, (xbl, y)) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(kind.bytes())).enumerate() {
        block(ix, xbl, qw.map(|w| &w[QK_K * ibl..QK_K * ibl + QK_K]), y, &mut sb);
    }
}

/// IQ3_XXS of whole super-blocks, under importance weights `qw` (one per value) or x².
pub fn quantize_iq3_xxs_weighted(x: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    per_block(IqKind::Iq3Xxs, iq3_xxs_block, x, qw, dst);
}

/// IQ3_S of whole super-blocks, under importance weights `qw` (one per value) or x².
pub fn quantize_iq3_s_weighted(x: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    per_block(IqKind::Iq3S, iq3_s_block, x, qw, dst);
}

/// IQ3_XXS without importance weights (quantize_row_iq3_xxs_ref).
pub fn quantize_iq3_xxs(src: &[f32], dst: &mut [u8]) {
    quantize_iq3_xxs_weighted(src, None, dst);
}

/// IQ3_S without importance weights (quantize_row_iq3_s_ref).
pub fn quantize_iq3_s(src: &[f32], dst: &mut [u8]) {
    quantize_iq3_s_weighted(src, None, dst);
}
