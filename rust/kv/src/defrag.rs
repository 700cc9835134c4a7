//! Defragmentation: llama.cpp's former `defrag_prepare` (before it was removed upstream), which
//! fills the holes below `used` with the last cells of the cache.

use crate::cells::CellState;
use crate::{KvCells, KvError};

/// Copy `len` consecutive cells starting at `src` to the cells starting at `dst`
/// (K and V rows alike). Sources are non-empty and destinations empty before the plan runs,
/// so the moves of one plan may be carried out in any order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefragMove {
    /// First source cell.
    pub src: u32,
    /// First destination cell.
    pub dst: u32,
    /// Number of cells.
    pub len: u32,
}

/// llama.cpp's old rule does not defragment windows shorter than this.
pub const DEFRAG_MIN_N_KV: u32 = 2048;

impl KvCells {
    /// Wasted fraction of the attention window by llama.cpp's old formula:
    /// `max(0, 1 - (used + n_pad) / used_max_p1)` when `used_max_p1 >= 2048`, else 0
    /// (`n_pad` was the cache padding, 32 or 256 in those builds).
    pub fn fragmentation(&self, n_pad: u32) -> f32 {
        let n_kv = self.used_max_p1();
        if n_kv < DEFRAG_MIN_N_KV {
            return 0.0;
        }
        (1.0 - (self.used() as f32 + n_pad as f32) / n_kv as f32).max(0.0)
    }

    /// Whether llama.cpp's old rule would defragment: `defrag_thold > 0` and the fragmentation
    /// passes it.
    pub fn needs_defrag(&self, defrag_thold: f32, n_pad: u32) -> bool {
        defrag_thold > 0.0 && self.fragmentation(n_pad) > defrag_thold
    }

    /// The moves that close the holes below `used`, taking cells from the end, at most
    /// `max_moves` contiguous runs (llama.cpp limited them by its graph size; pass `u32::MAX`
    /// for no limit). Empty when there is nothing to do. The cells are not changed: carry out
    /// the moves on K/V, then call `apply_defrag` with the same plan.
    pub fn defrag_plan(&self, max_moves: u32) -> Vec<DefragMove> {
        let ids = self.defrag_ids(max_moves);
        group_moves(&ids)
    }

    /// llama.cpp's `ids`: the destination of every cell below `used_max_p1`, `n_kv` for "stays".
    fn defrag_ids(&self, max_moves: u32) -> Vec<u32> {
        let n_kv = self.used_max_p1();
        let n_used = self.used();
        let mut ids = vec![n_kv; n_kv as usize];
        let empty = |i: u32| self.is_empty_cell(i as usize);
        let mut n_moves = 0u32;
        let mut i0 = 0u32;
        while i0 < n_used {
            if !empty(i0) {
                ids[i0 as usize] = i0;
                i0 += 1;
                continue;
            }
            // a hole of nh cells
            let mut nh = 1;
            while i0 + nh < n_used && empty(i0 + nh) {
                nh += 1;
            }
            // from the end, find nh non-empty cells not yet moved
            let mut nf = 0;
            let mut is = n_kv - 1;
            while is > i0 {
                if !empty(is) && ids[is as usize] == n_kv {
                    nf += 1;
                    if nf == nh {
                        break;
                    }
                }
                is -= 1;
            }
            if nf != nh {
                // cannot happen while `used` is exact; keep what was planned so far
                break;
            }
            let (stop, moved) = assign_hole(&mut ids, &empty, is, i0, nh, max_moves, n_moves);
            n_moves = moved;
            if stop || n_moves == max_moves {
                break;
            }
            i0 += nh;
        }
        ids
    }

    /// Carries out a plan on the cell metadata (positions, shifts and sequences move with
    /// their cells) and puts the head at 0. Checks first that every source is non-empty and
    /// every destination empty; on error nothing changes.
    pub fn apply_defrag(&mut self, plan: &[DefragMove]) -> Result<(), KvError> {
        let size = u64::from(self.size());
        for m in plan {
            if u64::from(m.src) + u64::from(m.len) > size
                || u64::from(m.dst) + u64::from(m.len) > size
            {
                return Err(KvError::InvalidDefrag(format!(
                    "{m:?} exceeds {size} cells"
                )));
            }
            for k in 0..m.len {
                if self.is_empty_cell((m.src + k) as usize) {
                    return Err(KvError::InvalidDefrag(format!(
                        "source cell {} is empty",
                        m.src + k
                    )));
                }
                if !self.is_empty_cell((m.dst + k) as usize) {
                    return Err(KvError::InvalidDefrag(format!(
                        "destination cell {} is used",
                        m.dst + k
                    )));
                }
            }
        }
        if has_duplicate(plan.iter().flat_map(|m| m.dst..m.dst + m.len)) {
            return Err(KvError::InvalidDefrag(
                "two moves share a destination".into(),
            ));
        }
        if has_duplicate(plan.iter().flat_map(|m| m.src..m.src + m.len)) {
            return Err(KvError::InvalidDefrag("two moves share a source".into()));
        }
        for m in plan {
            for k in 0..m.len {
                let (src, dst) = ((m.src + k) as usize, (m.dst + k) as usize);
                let st = self.state_of(src);
                self.write_cell(src, CellState::EMPTY);
                self.write_cell(dst, st);
            }
        }
        self.head = 0;
        Ok(())
    }
}

/// Sends the non-empty, unmoved cells from `is` upwards into the hole `[i0, i0 + nh)`,
/// counting a move per contiguous run. Returns (stop, n_moves).
fn assign_hole(
    ids: &mut [u32],
    empty: &dyn Fn(u32) -> bool,
    is: u32,
    i0: u32,
    nh: u32,
    max_moves: u32,
    mut n_moves: u32,
) -> (bool, u32) {
    let n_kv = ids.len() as u32;
    let mut nf = 0;
    let mut cont = false;
    let mut i1 = is;
    while i1 < n_kv {
        if empty(i1) || ids[i1 as usize] != n_kv {
            if n_moves == max_moves {
                return (true, n_moves);
            }
            cont = false;
            i1 += 1;
            continue;
        }
        ids[i1 as usize] = i0 + nf;
        if !cont {
            n_moves += 1;
            cont = true;
        }
        nf += 1;
        if nf == nh {
            break;
        }
        i1 += 1;
    }
    (false, n_moves)
}

/// Runs of consecutive cells going to consecutive destinations (llama.cpp's
/// `build_graph_defrag` grouping).
fn group_moves(ids: &[u32]) -> Vec<DefragMove> {
    let n_kv = ids.len() as u32;
    let mut moves = Vec::new();
    let mut i = 0u32;
    while i < n_kv {
        let id = ids[i as usize];
        if id == i || id == n_kv {
            i += 1;
            continue;
        }
        let mut len = 1;
        while i + len < n_kv && ids[(i + len) as usize] == id + len {
            len += 1;
        }
        moves.push(DefragMove {
            src: i,
            dst: id,
            len,
        });
        i += len;
    }
    moves
}

fn has_duplicate(cells: impl Iterator<Item = u32>) -> bool {
    let mut all: Vec<u32> = cells.collect();
    all.sort_unstable();
    all.windows(2).any(|w| w[0] == w[1])
}
