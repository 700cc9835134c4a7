//! The grid index of ggml's `iq2xs_init_impl`, which the IQ2 and IQ1 quantizers search: for a
//! grid of 8-dimensional points whose coordinates are levels 0..=3, it answers "which grid point
//! is this vector of levels" and, for a vector not on the grid, "which grid points are nearest".
//!
//! One index per grid ([`Iq2Grid`]), derived from the grids in `iq_grids` (the dequantizers' tables,
//! whose point order is the order of ggml's `kgrid_2bit_*` / `kgrid_1bit_2048`), built once on first
//! use and shared by all threads. The shape is ggml's `iq2_entry_t`:
//! - `grid[j]`: point j as 8 signed bytes `2·level + 1` (ggml's `kgrid_q2xs`), byte k = coordinate k;
//! - `map[u]` for `u = Σ level_k << 2k` (0 <= u < [`KMAP_SIZE`]): the grid index j >= 0 of the point
//!   with those levels, or `-(offset + 1)` where `neighbours[offset]` is the count n of that
//!   vector's neighbours and `neighbours[offset + 1 ..= offset + n]` are their grid indices
//!   (ggml's `kmap_q2xs` / `kneighbors_q2xs`);
//! - the neighbours of a vector are all grid points at the `nwant` smallest distinct squared
//!   distances from it (nwant = 2 for IQ2_XXS and IQ2_XS, 1 for IQ2_S, 3 for IQ1), in increasing
//!   (distance, grid index): ggml's qsort comparator orders by both keys, a total order, so its
//!   unstable sort has no ties to break and the lists are exactly ggml's.

use std::sync::OnceLock;

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

/// Entries in `map`: every level vector the quantizers form (levels 0..=2, so u <= 0xAAAA) and
/// every grid point fits below it (ggml's kmap_size).
pub const KMAP_SIZE: usize = 43692;

/// The grid index of one grid (see the module doc for the layout).
pub struct GridIndex {
    /// Point j as 8 bytes `2·level + 1`, little-endian packed (ggml's kgrid_q2xs).
    pub grid: Vec<u64>,
    /// Level vector -> grid index, or -(offset of its neighbour list + 1) (ggml's kmap_q2xs).
    pub map: Vec<i32>,
    /// The neighbour lists, each a count followed by that many grid indices (ggml's kneighbors_q2xs).
    pub neighbours: Vec<u16>,
}

/// The four grids ggml indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iq2Grid {
    /// IQ2_XXS: 256 points.
    Xxs,
    /// IQ2_XS: 512 points.
    Xs,
    /// IQ2_S: 1024 points.
    S,
    /// IQ1_S and IQ1_M: the 2048 points of iq1s_grid (values -1, 0, 1 as levels 0, 1, 2).
    Iq1,
}

/// The index of grid `g`, built on first use (thread-safe, once per process).
pub fn grid_index(g: Iq2Grid) -> &'static GridIndex {
    static INDICES: [OnceLock<GridIndex>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match g {
        Iq2Grid::Xxs => 0,
        Iq2Grid::Xs => 1,
        Iq2Grid::S => 2,
        Iq2Grid::Iq1 => 3,
    };
    INDICES[slot].get_or_init(|| GridIndex::build(g))
}

/// ggml's iq2_find_best_neighbour: among the grid points of `neighbours` (one list as stored in
/// [`GridIndex::neighbours`]: the count first), the one nearest to `xval` under weights `weight`
/// at `scale` (the first of equal distances wins); writes its levels into `levels[..8]` and
/// returns its grid index. Where no distance is below f32::MAX (non-finite input) ggml aborts;
/// this returns the first candidate.
pub fn find_best_neighbour(neighbours: &[u16], grid: &[u64], xval: &[f32], weight: &[f32], scale: f32, levels: &mut [i8]) -> usize {
    // Several candidates at once, one per lane, each lane summing its 8 terms in ggml's order:
    // the same floats as ggml's one-at-a-time loop without its chain of dependent additions.
    const LANES: usize = 8;
    let candidates = &neighbours[1..=neighbours[0] as usize];
    let (xval, weight) = (&xval[..8], &weight[..8]);
    let mut best_d2 = f32::MAX;
    let mut best = candidates[0] as usize;
    for chunk in candidates.chunks(LANES) {
        let mut q = [[0.0f32; LANES]; 8];
        for (lane, &j) in chunk.iter().enumerate() {
            for (i, b) in grid[j as usize].to_le_bytes().into_iter().enumerate() {
                q[i][lane] = SIGNED_BYTE_F32[b as usize];
            }
        }
        let mut d2 = [0.0f32; LANES];
        for i in 0..8 {
            for lane in 0..LANES {
                let diff = scale * q[i][lane] - xval[i];
                d2[lane] += weight[i] * diff * diff;
            }
        }
        for (&d, &j) in d2.iter().zip(chunk) {
            if d < best_d2 {
                best_d2 = d;
                best = j as usize;
            }
        }
    }
    write_levels(grid[best], levels);
    best
}

/// Each byte as the signed value it stores, as f32 (a table load is cheaper than a conversion).
static SIGNED_BYTE_F32: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = b as u8 as i8 as f32;
        b += 1;
    }
    t
};

/// The levels (0..=3) of a packed grid point into `levels[..8]`.
#[inline]
pub fn write_levels(point: u64, levels: &mut [i8]) {
    for (l, b) in levels[..8].iter_mut().zip(point.to_le_bytes()) {
        *l = (b as i8 - 1) / 2;
    }
}

/// The map key of 8 levels (0..=3, only their 2 low bits count): level k in bits 2k, 2k+1.
#[inline]
pub fn levels_key(levels: &[i8]) -> usize {
    levels[..8].iter().enumerate().fold(0usize, |u, (k, &l)| u | (((l & 3) as usize) << (2 * k)))
}

impl GridIndex {
    /// The grid index of the point whose levels (0..=2: every key of those is in the map) are
    /// `levels[..8]` if it is on the grid;
    /// otherwise the nearest neighbour by [`find_best_neighbour`], whose levels then replace
    /// `levels[..8]`. This is the lookup every IQ2 quantizer does per group of 8.
    #[inline]
    pub fn nearest(&self, levels: &mut [i8], xval: &[f32], weight: &[f32], scale: f32) -> usize {
        let m = self.map[levels_key(levels)];
        if m >= 0 {
            return m as usize;
        }
        find_best_neighbour(&self.neighbours[(-m - 1) as usize..], &self.grid, xval, weight, scale, levels)
    }

    /// The grid index of `levels[..8]`, None if that point is not on the grid.
    #[inline]
    pub fn on_grid(&self, levels: &[i8]) -> Option<usize> {
        self.map.get(levels_key(levels)).and_then(|&m| usize::try_from(m).ok())
    }

    fn build(g: Iq2Grid) -> GridIndex {
        let (grid, nwant) = match g {
            Iq2Grid::Xxs => (pack_grid(&IQ2XXS_GRID, magnitude_level), 2),
            Iq2Grid::Xs => (pack_grid(&IQ2XS_GRID, magnitude_level), 2),
            Iq2Grid::S => (pack_grid(&IQ2S_GRID, magnitude_level), 1),
            Iq2Grid::Iq1 => (pack_grid(&IQ1S_GRID, ternary_level), 3),
        };
        let mut map = vec![-1i32; KMAP_SIZE];
        for (j, &point) in grid.iter().enumerate() {
            let mut levels = [0i8; 8];
            write_levels(point, &mut levels);
            map[levels_key(&levels)] = j as i32;
        }
        let neighbours = neighbour_lists(&grid, &mut map, nwant);
        GridIndex { grid, map, neighbours }
    }
}

/// Level of an IQ2 grid magnitude byte (8, 25, 43, 62).
fn magnitude_level(b: u8) -> u8 {
    match b {
        0x08 => 0,
        0x19 => 1,
        0x2b => 2,
        _ => 3,
    }
}

/// Level of an iq1s grid byte (-1, 0, 1 as signed bytes).
fn ternary_level(b: u8) -> u8 {
    (b as i8 + 1) as u8
}

/// Each point of a dequantizer grid as 8 bytes 2·level + 1.
fn pack_grid(points: &[u64], level: fn(u8) -> u8) -> Vec<u64> {
    points.iter().map(|&p| u64::from_le_bytes(p.to_le_bytes().map(|b| 2 * level(b) + 1))).collect()
}

/// The neighbour lists of every key not on the grid, in increasing key order, each recorded in
/// `map` as -(offset + 1).
fn neighbour_lists(grid: &[u64], map: &mut [i32], nwant: usize) -> Vec<u16> {
    // Squared distances between odd coordinates 1..=7 are at most 8·6².
    const MAX_D2: usize = 8 * 36;
    let points: Vec<[u8; 8]> = grid.iter().map(|p| p.to_le_bytes()).collect();
    let mut d2 = vec![0u16; grid.len()];
    let mut neighbours = Vec::new();
    for (u, m) in map.iter_mut().enumerate() {
        if *m >= 0 {
            continue;
        }
        let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((u >> (2 * k)) & 3) as i32 + 1);
        let mut present = [false; MAX_D2 + 1];
        for (d, p) in d2.iter_mut().zip(&points) {
            let s: i32 = (0..8).map(|k| (p[k] as i32 - pos[k]) * (p[k] as i32 - pos[k])).sum();
            *d = s as u16;
            present[s as usize] = true;
        }
        *m = -(neighbours.len() as i32 + 1);
        let head = neighbours.len();
        neighbours.push(0);
        for dist in (0..=MAX_D2).filter(|&d| present[d]).take(nwant) {
            neighbours.extend((0..grid.len()).filter(|&j| d2[j] as usize == dist).map(|j| j as u16));
        }
        neighbours[head] = (neighbours.len() - head - 1) as u16;
    }
    neighbours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grid_point_maps_to_itself() {
        for g in [Iq2Grid::Xxs, Iq2Grid::Xs, Iq2Grid::S, Iq2Grid::Iq1] {
            let index = grid_index(g);
            for (j, &p) in index.grid.iter().enumerate() {
                let mut levels = [0i8; 8];
                write_levels(p, &mut levels);
                assert_eq!(index.on_grid(&levels), Some(j), "{g:?} point {j}");
            }
        }
    }
}
