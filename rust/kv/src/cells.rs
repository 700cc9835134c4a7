//! The cell array and its indexes: every change to a cell goes through `write_cell`, which keeps
//! the used set and the per-sequence position multisets right and, while a journal is open,
//! remembers the old state so that `prepare` can undo a simulated placement exactly.

use std::collections::{BTreeMap, BTreeSet};

use crate::{KvError, Pos, SeqId, SeqSet, SwaParams, MAX_SEQ};

/// A cell's 2-D position (llama.cpp's `llama_kv_cell_ext`): the width (`x`) and height (`y`)
/// positions M-RoPE gives an image token; a text token's are its position. The causal mask
/// orders the cells of one position by them (an image's tokens all share one position).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CellExt {
    /// Width position.
    pub x: Pos,
    /// Height position.
    pub y: Pos,
}

impl CellExt {
    /// Whether this 2-D position comes after (`x`, `y`) in raster order (row by row).
    pub fn is_2d_gt(&self, x: Pos, y: Pos) -> bool {
        self.y > y || (self.y == y && self.x > x)
    }
}

/// The full state of one cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CellState {
    pub pos: Pos,
    pub shift: Pos,
    pub seqs: SeqSet,
    pub ext: CellExt,
}

impl CellState {
    pub const EMPTY: CellState = CellState {
        pos: -1,
        shift: 0,
        seqs: SeqSet::EMPTY,
        ext: CellExt { x: 0, y: 0 },
    };
}

/// Bookkeeping of a KV cache of `size` cells: positions, accumulated shifts, sequence sets,
/// the search head. See the crate documentation for the workflow.
#[derive(Clone, Debug)]
pub struct KvCells {
    /// Position of each cell, -1 when empty.
    pub(crate) pos: Vec<Pos>,
    /// Shift accumulated by each cell since the last `take_shifts`.
    pub(crate) shift: Vec<Pos>,
    /// Sequences holding each cell.
    pub(crate) seqs: Vec<SeqSet>,
    /// 2-D position of each cell (kept in a cache of 2-D positions only; default otherwise).
    pub(crate) ext: Vec<CellExt>,
    /// Whether the cells keep 2-D positions (a model with M-RoPE): the state carries them.
    pub(crate) pos_2d: bool,
    /// Indices of the non-empty cells (ordered: the last one gives the attention window).
    pub(crate) used: BTreeSet<u32>,
    /// Per sequence: multiset of the positions it holds (position -> number of cells).
    pub(crate) seq_pos: Vec<BTreeMap<Pos, u32>>,
    /// Where the next slot search starts.
    pub(crate) head: u32,
    /// Set by position changes, cleared by `take_shifts`.
    pub(crate) has_shift: bool,
    pub(crate) n_seq_max: u32,
    pub(crate) swa: SwaParams,
    /// Old cell states recorded while simulating a placement.
    journal: Option<Vec<(u32, CellState)>>,
}

impl KvCells {
    /// A cache of `size` empty cells for sequences `0..n_seq_max` without a sliding window.
    pub fn new(size: u32, n_seq_max: u32) -> Result<KvCells, KvError> {
        KvCells::with_swa(size, n_seq_max, SwaParams::NONE)
    }

    /// A cache whose cells may be reused once hidden by the sliding window `swa` (the SWA half
    /// of an interleaved cache), and whose masks apply that window.
    pub fn with_swa(size: u32, n_seq_max: u32, swa: SwaParams) -> Result<KvCells, KvError> {
        if size == 0 {
            return Err(KvError::ZeroSize);
        }
        if n_seq_max == 0 || n_seq_max > MAX_SEQ {
            return Err(KvError::InvalidSeqMax(n_seq_max));
        }
        let n = size as usize;
        Ok(KvCells {
            pos: vec![-1; n],
            shift: vec![0; n],
            seqs: vec![SeqSet::EMPTY; n],
            ext: vec![CellExt::default(); n],
            pos_2d: false,
            used: BTreeSet::new(),
            seq_pos: vec![BTreeMap::new(); n_seq_max as usize],
            head: 0,
            has_shift: false,
            n_seq_max,
            swa,
            journal: None,
        })
    }

    /// The same cache keeping each cell's 2-D position (`CellExt`), as llama.cpp's cache of a
    /// model with several positions per token (M-RoPE) does: micro-batches then carry them
    /// (`UBatchView::with_ext`) and saved states hold them.
    pub fn with_2d_positions(mut self) -> KvCells {
        self.pos_2d = true;
        self
    }

    /// Whether the cells keep 2-D positions.
    pub fn has_2d_positions(&self) -> bool {
        self.pos_2d
    }

    /// 2-D position of cell `idx` (the default when out of range).
    pub fn ext_of(&self, idx: u32) -> CellExt {
        self.ext.get(idx as usize).copied().unwrap_or_default()
    }

    /// Number of cells.
    pub fn size(&self) -> u32 {
        self.pos.len() as u32
    }

    /// Number of non-empty cells.
    pub fn used(&self) -> u32 {
        self.used.len() as u32
    }

    /// Index where the next slot search starts.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Sequences this cache accepts: ids `0..n_seq_max`.
    pub fn n_seq_max(&self) -> u32 {
        self.n_seq_max
    }

    /// The sliding window of this cache (`SwaParams::NONE` for a full cache).
    pub fn swa(&self) -> SwaParams {
        self.swa
    }

    /// Index of the last non-empty cell + 1 (0 when empty).
    pub fn used_max_p1(&self) -> u32 {
        self.used.iter().next_back().map_or(0, |&i| i + 1)
    }

    /// Position of every cell, -1 for empty ones (for ALiBi or any position-dependent input).
    pub fn positions(&self) -> &[Pos] {
        &self.pos
    }

    /// Position of cell `idx` (-1 when empty or out of range).
    pub fn pos_of(&self, idx: u32) -> Pos {
        self.pos.get(idx as usize).copied().unwrap_or(-1)
    }

    /// Sequence set of cell `idx` (empty when out of range).
    pub fn seqs_of(&self, idx: u32) -> SeqSet {
        self.seqs
            .get(idx as usize)
            .copied()
            .unwrap_or(SeqSet::EMPTY)
    }

    /// Every cell as (position, sequence ids); position -1 marks an empty cell.
    pub fn cells(&self) -> Vec<(Pos, Vec<SeqId>)> {
        self.pos
            .iter()
            .zip(&self.seqs)
            .map(|(&p, s)| (p, s.iter().collect()))
            .collect()
    }

    /// Checks `seq_id` is in `0..n_seq_max`.
    pub(crate) fn check_seq(&self, seq_id: SeqId) -> Result<(), KvError> {
        if seq_id < 0 || seq_id as u32 >= self.n_seq_max {
            return Err(KvError::InvalidSeqId {
                seq_id,
                n_seq_max: self.n_seq_max,
            });
        }
        Ok(())
    }

    pub(crate) fn is_empty_cell(&self, idx: usize) -> bool {
        self.pos[idx] == -1
    }

    pub(crate) fn state_of(&self, idx: usize) -> CellState {
        CellState {
            pos: self.pos[idx],
            shift: self.shift[idx],
            seqs: self.seqs[idx],
            ext: self.ext[idx],
        }
    }

    /// Replaces the state of cell `idx`, keeping the indexes right and journaling the old state.
    pub(crate) fn write_cell(&mut self, idx: usize, new: CellState) {
        let old = self.state_of(idx);
        if let Some(journal) = &mut self.journal {
            journal.push((idx as u32, old));
        }
        self.unindex(idx);
        self.pos[idx] = new.pos;
        self.shift[idx] = new.shift;
        self.seqs[idx] = new.seqs;
        self.ext[idx] = new.ext;
        self.index(idx);
    }

    fn unindex(&mut self, idx: usize) {
        let pos = self.pos[idx];
        if pos == -1 {
            return;
        }
        self.used.remove(&(idx as u32));
        for s in self.seqs[idx].iter() {
            let map = &mut self.seq_pos[s as usize];
            if let Some(count) = map.get_mut(&pos) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&pos);
                }
            }
        }
    }

    fn index(&mut self, idx: usize) {
        let pos = self.pos[idx];
        if pos == -1 {
            return;
        }
        self.used.insert(idx as u32);
        for s in self.seqs[idx].iter() {
            *self.seq_pos[s as usize].entry(pos).or_insert(0) += 1;
        }
    }

    /// Starts recording old cell states (for an exact undo).
    pub(crate) fn begin_journal(&mut self) {
        self.journal = Some(Vec::new());
    }

    /// Undoes every change since `begin_journal`, newest first, and stops recording.
    pub(crate) fn rollback(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        for &(idx, old) in journal.iter().rev() {
            self.write_cell(idx as usize, old);
        }
    }

    /// Keeps the changes made since `begin_journal` and stops recording.
    pub(crate) fn end_journal(&mut self) {
        self.journal = None;
    }

    /// Empties a cell.
    pub(crate) fn clear_cell(&mut self, idx: usize) {
        self.write_cell(idx, CellState::EMPTY);
    }

    /// Takes `seq` out of a cell; returns true when the cell became empty.
    pub(crate) fn remove_seq(&mut self, idx: usize, seq: SeqId) -> bool {
        let mut st = self.state_of(idx);
        st.seqs.remove(seq);
        let freed = st.seqs.is_empty();
        if freed {
            st = CellState::EMPTY;
        }
        self.write_cell(idx, st);
        freed
    }

    /// Adds `seq` to a non-empty cell that lacks it.
    pub(crate) fn add_seq(&mut self, idx: usize, seq: SeqId) {
        let mut st = self.state_of(idx);
        if st.seqs.insert(seq) {
            self.write_cell(idx, st);
        }
    }

    /// Smallest position held by `seq`, -1 when it holds none (seq already validated).
    pub(crate) fn pos_min_of(&self, seq: SeqId) -> Pos {
        self.seq_pos[seq as usize]
            .keys()
            .next()
            .copied()
            .unwrap_or(-1)
    }

    /// Largest position held by `seq`, -1 when it holds none (seq already validated).
    pub(crate) fn pos_max_of(&self, seq: SeqId) -> Pos {
        self.seq_pos[seq as usize]
            .keys()
            .next_back()
            .copied()
            .unwrap_or(-1)
    }

    /// Whether a non-empty cell is within [p0, p1) (llama.cpp's `pos_in`, true only for
    /// non-empty cells because p0 >= 0).
    pub(crate) fn pos_in(&self, idx: usize, p0: Pos, p1: Pos) -> bool {
        let p = self.pos[idx];
        p >= p0 && p < p1
    }
}

/// llama.cpp's range convention: p0 < 0 means 0, p1 < 0 means "no end".
pub(crate) fn normalize_range(p0: Pos, p1: Pos) -> (Pos, Pos) {
    (p0.max(0), if p1 < 0 { Pos::MAX } else { p1 })
}
