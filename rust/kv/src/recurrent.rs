//! Bookkeeping of llama.cpp's recurrent memory (`llama_memory_recurrent`), without tensors.
//!
//! A recurrent layer (Mamba-2, gated delta-net, a short convolution) keeps one state per
//! sequence, not one row per token: the cells here hold whole states. Cell `i` doubles as the
//! metadata of sequence `i` (`tail`: the cell holding that sequence's latest state), as in
//! llama.cpp. Sequences share a cell after `seq_cp` until one of them decodes again, which
//! gives it a cell of its own with a copy of the shared state (copy on write).
//!
//! The engine owns the state rows (one per cell and recurrent layer). A decode places each
//! micro-batch with [`RsCells::place`], which says where every state of cells
//! `head..head + n` must come from ([`RsPlacement::copies`]) and which row to zero first
//! ([`RsPlacement::zero`], the state a new sequence starts from); sequence `s` of the
//! micro-batch then reads and writes the state of cell `head + s`.
//!
//! A recurrent state cannot be rewound: `seq_rm` of a sequence's tail (other than the whole
//! sequence) is refused with `false`, as llama.cpp refuses it.

use crate::{KvError, Pos, SeqId, SeqSet};

#[derive(Clone, Debug)]
struct RsCell {
    /// Position of the last token whose state the cell holds (-1: empty).
    pos: Pos,
    /// Where this cell's state currently lives (-1: nowhere, a new state starts from zero).
    src: i32,
    /// Staged `src` of the last placement: the row this cell's state is copied from.
    src0: i32,
    /// As the metadata of sequence `i`: the cell holding its latest state (-1: none).
    tail: i32,
    seqs: SeqSet,
    /// How many tokens back the engine kept this cell's states after its last micro-batch
    /// (rollback snapshots, at most the context's n_rs_seq).
    snapshots: u32,
}

impl RsCell {
    const EMPTY: RsCell = RsCell { pos: -1, src: -1, src0: -1, tail: -1, seqs: SeqSet::EMPTY, snapshots: 0 };
    fn is_empty(&self) -> bool { self.seqs.is_empty() }
}

/// One sequence set of a micro-batch, as the recurrent memory sees it: the ids of its tokens
/// (the first one decides whose state it continues) and the position of its last token.
#[derive(Clone, Copy, Debug)]
pub struct RsSeqGroup<'a> {
    /// The sequence ids of the group's tokens.
    pub ids: &'a [SeqId],
    /// The position of the group's last token in the micro-batch.
    pub last_pos: Pos,
}

/// Where a placed micro-batch's states are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsPlacement {
    /// The first cell of the range the micro-batch uses; its sequence `s` uses cell `head + s`.
    pub head: u32,
    /// For each cell `head + i` of the range, the row its state is copied from before the
    /// forward pass (`head + i` itself when it stays).
    pub copies: Vec<u32>,
    /// A row to set to zeros before the copies (a new sequence's initial state), if any.
    pub zero: Option<u32>,
}

/// llama.cpp's recurrent cells: `size` cells (one per sequence), each holding a whole state.
#[derive(Clone, Debug)]
pub struct RsCells {
    cells: Vec<RsCell>,
    head: u32,
    used: u32,
    n_seq_max: u32,
    /// A rollback seq_rm accepted and the engine has not applied yet: (cell, tokens back).
    rollback: Option<(u32, u32)>,
}

impl RsCells {
    /// `n_seq_max` cells (llama.cpp sizes the recurrent memory at max(1, n_seq_max)).
    pub fn new(n_seq_max: u32) -> Result<RsCells, KvError> {
        if n_seq_max == 0 || n_seq_max > crate::MAX_SEQ {
            return Err(KvError::InvalidSeqMax(n_seq_max));
        }
        Ok(RsCells { cells: vec![RsCell::EMPTY; n_seq_max as usize], head: 0, used: 0, n_seq_max, rollback: None })
    }

    /// Number of cells.
    pub fn size(&self) -> u32 { self.cells.len() as u32 }

    /// Number of cells holding a state.
    pub fn used(&self) -> u32 { self.used }

    /// Every cell as (position, sequence ids); empty cells as (-1, []).
    pub fn cells(&self) -> Vec<(Pos, Vec<SeqId>)> {
        self.cells.iter().map(|c| (c.pos, c.seqs.iter().collect())).collect()
    }

    /// The cell holding the latest state of `seq`, if any.
    pub fn tail(&self, seq: SeqId) -> Option<u32> {
        let t = self.cells.get(usize::try_from(seq).ok()?)?.tail;
        (t >= 0).then_some(t as u32)
    }

    /// Forgets every state.
    pub fn clear(&mut self) {
        self.cells.fill(RsCell::EMPTY);
        self.head = 0;
        self.used = 0;
        self.rollback = None;
    }

    /// The rollback the last seq_rm accepted, for the engine to apply (the state `back`
    /// tokens back becomes the cell's state), once.
    pub fn take_rollback(&mut self) -> Option<(u32, u32)> { self.rollback.take() }

    /// After a micro-batch: the engine kept the states up to `n` tokens back in `cell`.
    pub fn set_snapshots(&mut self, cell: u32, n: u32) {
        if let Some(c) = self.cells.get_mut(cell as usize) {
            c.snapshots = n;
        }
    }

    fn check_seq(&self, seq: SeqId) -> Result<usize, KvError> {
        if seq < 0 || seq as u32 >= self.n_seq_max {
            return Err(KvError::InvalidSeqId { seq_id: seq, n_seq_max: self.n_seq_max });
        }
        Ok(seq as usize)
    }

    /// Empties cell `i` if no sequence holds it any more.
    fn release_if_empty(&mut self, i: usize) {
        let c = &mut self.cells[i];
        if c.is_empty() {
            if c.pos >= 0 {
                self.used -= 1;
            }
            c.pos = -1;
            c.src = -1;
        }
    }

    /// llama_memory_recurrent::seq_rm: removes the positions `[p0, p1)` of `seq` (every
    /// sequence when negative). A state holds all of a sequence's past at once, so removing a
    /// tail that starts after position 0 is refused (false, nothing changed) unless the state
    /// that many tokens back was kept (a rollback snapshot of the cell's last micro-batch, on
    /// a cell the sequence holds alone: see [`RsCells::take_rollback`]); a range that does not
    /// reach the state's position changes nothing and succeeds.
    pub fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, KvError> {
        let p0 = p0.max(0);
        let p1 = if p1 < 0 { Pos::MAX } else { p1 };
        if seq >= 0 {
            let s = self.check_seq(seq)?;
            let tail = self.cells[s].tail;
            if tail >= 0 {
                let pos = self.cells[tail as usize].pos;
                if 0 < p0 && p0 <= pos && p1 > pos {
                    let back = (pos - (p0 - 1)) as u32;
                    let cell = &mut self.cells[tail as usize];
                    if back > cell.snapshots || cell.seqs.len() != 1 || self.rollback.is_some() {
                        return Ok(false);
                    }
                    cell.pos = p0 - 1;
                    cell.snapshots = 0;
                    self.rollback = Some((tail as u32, back));
                    return Ok(true);
                }
                if p0 <= pos && pos < p1 {
                    self.cells[s].tail = -1;
                }
            }
        } else if p0 != p1 && (p0 != 0 || p1 != Pos::MAX) {
            return Ok(false);
        }
        let mut new_head = self.size();
        for i in 0..self.cells.len() {
            let c = &mut self.cells[i];
            if c.pos < p0 || c.pos >= p1 {
                continue;
            }
            if seq < 0 {
                c.seqs = SeqSet::EMPTY;
            } else if !c.seqs.remove(seq) {
                continue;
            }
            if c.is_empty() {
                self.release_if_empty(i);
                new_head = new_head.min(i as u32);
            }
        }
        if new_head < self.head {
            self.head = new_head;
        }
        Ok(true)
    }

    /// llama_memory_recurrent::seq_cp: `dst` shares `src`'s state (the range is ignored: a
    /// state is all or nothing); `dst`'s own state is dropped first.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId) -> Result<(), KvError> {
        let (s, d) = (self.check_seq(src)?, self.check_seq(dst)?);
        if s == d {
            return Ok(());
        }
        let dst_tail = self.cells[d].tail;
        if dst_tail >= 0 {
            self.cells[dst_tail as usize].seqs.remove(dst);
            self.cells[d].tail = -1;
            if self.cells[dst_tail as usize].is_empty() {
                let c = &mut self.cells[dst_tail as usize];
                c.pos = -1;
                c.src = -1;
                self.used -= 1;
            }
        }
        let src_tail = self.cells[s].tail;
        if src_tail >= 0 {
            self.cells[src_tail as usize].seqs.insert(dst);
            self.cells[d].tail = src_tail;
        }
        Ok(())
    }

    /// llama_memory_recurrent::seq_keep: only `seq`'s state remains.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.check_seq(seq)?;
        let mut new_head = self.size();
        for i in 0..self.cells.len() {
            if i as SeqId != seq {
                self.cells[i].tail = -1;
            }
            let c = &mut self.cells[i];
            if c.seqs.contains(seq) {
                c.seqs = SeqSet::single(seq);
                continue;
            }
            if c.pos >= 0 {
                self.used -= 1;
            }
            *c = RsCell { tail: c.tail, ..RsCell::EMPTY };
            new_head = new_head.min(i as u32);
        }
        if new_head < self.head {
            self.head = new_head;
        }
        Ok(())
    }

    /// llama_memory_recurrent::seq_add / seq_div: only the state's position moves (when it
    /// lies in `[p0, p1)`); `f` maps the old position to the new.
    fn seq_move(&mut self, seq: SeqId, p0: Pos, p1: Pos, f: impl Fn(Pos) -> Pos) -> Result<(), KvError> {
        let s = self.check_seq(seq)?;
        let (p0, p1) = (p0.max(0), if p1 < 0 { Pos::MAX } else { p1 });
        let tail = self.cells[s].tail;
        if p0 == p1 || tail < 0 {
            return Ok(());
        }
        let c = &mut self.cells[tail as usize];
        if c.seqs.contains(seq) && p0 <= c.pos && c.pos < p1 {
            c.pos = f(c.pos);
        }
        Ok(())
    }

    /// Adds `delta` to the state's position when it lies in `[p0, p1)`.
    pub fn seq_add(&mut self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), KvError> {
        if delta == 0 {
            return Ok(());
        }
        self.seq_move(seq, p0, p1, |p| p + delta)
    }

    /// Divides the state's position by `d` when it lies in `[p0, p1)`.
    pub fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), KvError> {
        if d <= 0 {
            return Err(KvError::InvalidDivisor(d));
        }
        if d == 1 {
            return Ok(());
        }
        self.seq_move(seq, p0, p1, |p| p / d)
    }

    /// The smallest position of the states `seq` holds (-1: none).
    pub fn seq_pos_min(&self, seq: SeqId) -> Pos {
        self.cells.iter().filter(|c| c.seqs.contains(seq)).map(|c| c.pos).min().unwrap_or(-1)
    }

    /// The largest position of the states `seq` holds (-1: none).
    pub fn seq_pos_max(&self, seq: SeqId) -> Pos {
        self.cells.iter().filter(|c| c.seqs.contains(seq)).map(|c| c.pos).max().unwrap_or(-1)
    }

    /// Whether every micro-batch (each a list of sequence groups of equal length) finds its
    /// cells, placed one after the other; nothing changes.
    pub fn prepare(&self, ubatches: &[Vec<RsSeqGroup>]) -> bool {
        let mut trial = self.clone();
        ubatches.iter().all(|groups| trial.place(groups).is_ok())
    }

    /// llama_memory_recurrent::find_slot: gives each sequence group a cell it owns alone
    /// (copying a shared state into a free cell), gathers the groups' cells into one range
    /// `head..head + n_groups` in group order, records each group's last position, and says
    /// which rows the states come from.
    pub fn place(&mut self, groups: &[RsSeqGroup]) -> Result<RsPlacement, KvError> {
        let n_seqs = groups.len() as u32;
        if n_seqs == 0 || n_seqs > self.size() {
            return Err(KvError::NoStateCell { needed: n_seqs, size: self.size() });
        }
        if self.head > self.used + 2 * n_seqs {
            self.head = 0;
        }
        self.unshare_coupled(groups)?;
        let (min, max) = self.give_each_group_a_cell(groups)?;
        self.gather_in_group_order(groups, min);
        self.record_positions(groups, min);
        let zero = self.stage_sources(min, max);
        // the rows of the range move: what they kept of earlier states no longer applies
        (min..=max).for_each(|i| self.cells[i as usize].snapshots = 0);
        self.head = min;
        self.used = self.cells.iter().filter(|c| !c.is_empty()).count() as u32;
        let copies = (min..=max).map(|i| self.cells[i as usize].src0 as u32).collect();
        Ok(RsPlacement { head: min, copies, zero })
    }

    /// A sequence that appears as a second id of a token loses its own state: the group's
    /// state becomes its (llama.cpp clears such tails first).
    fn unshare_coupled(&mut self, groups: &[RsSeqGroup]) -> Result<(), KvError> {
        for g in groups {
            for (j, &seq) in g.ids.iter().enumerate() {
                let s = self.check_seq(seq)?;
                let tail = self.cells[s].tail;
                if j == 0 || tail < 0 {
                    continue;
                }
                let c = &mut self.cells[tail as usize];
                c.seqs.remove(seq);
                self.cells[s].tail = -1;
                if self.cells[tail as usize].is_empty() {
                    let c = &mut self.cells[tail as usize];
                    c.pos = -1;
                    c.src = -1;
                    self.used -= 1;
                }
            }
        }
        Ok(())
    }

    fn next_empty_from(&self, start: u32) -> u32 {
        let size = self.size();
        let mut i = start % size;
        for _ in 0..size {
            if self.cells[i as usize].is_empty() {
                break;
            }
            i = (i + 1) % size;
        }
        i
    }

    /// The tail of each group's first sequence becomes a cell it owns alone; returns the
    /// smallest and largest of those cells.
    fn give_each_group_a_cell(&mut self, groups: &[RsSeqGroup]) -> Result<(u32, u32), KvError> {
        let mut next_empty = self.next_empty_from(self.head);
        let (mut min, mut max) = (self.size() - 1, 0);
        for (s, g) in groups.iter().enumerate() {
            let seq = g.ids[0] as usize;
            let tail = self.cells[seq].tail;
            let owns = tail >= 0 && self.cells[tail as usize].seqs.len() == 1;
            if !owns {
                if !self.cells[next_empty as usize].is_empty() {
                    return Err(KvError::NoStateCell { needed: groups.len() as u32, size: self.size() });
                }
                if tail >= 0 {
                    // copy on write: the new cell starts from the shared state
                    let orig = self.cells[tail as usize].clone();
                    let e = &mut self.cells[next_empty as usize];
                    e.pos = orig.pos;
                    e.src = orig.src;
                    e.seqs.insert(seq as SeqId);
                    self.cells[tail as usize].seqs.remove(seq as SeqId);
                }
                self.cells[seq].tail = next_empty as i32;
                if s + 1 < groups.len() {
                    next_empty = self.next_empty_from(next_empty + 1);
                }
            }
            let t = self.cells[seq].tail as u32;
            min = min.min(t);
            max = max.max(t);
        }
        Ok((min, max))
    }

    /// Swaps cells so that group s's cell is `min + s` (states move with their metadata: a
    /// cell's `src` says where its state is until the copies are done).
    fn gather_in_group_order(&mut self, groups: &[RsSeqGroup], min: u32) {
        for (s, g) in groups.iter().enumerate() {
            let dst = min as i32 + s as i32;
            let src = self.cells[g.ids[0] as usize].tail;
            if dst == src {
                continue;
            }
            let (a, b) = (dst as usize, src as usize);
            let (pa, sa, qa) = (self.cells[a].pos, self.cells[a].src, self.cells[a].seqs);
            self.cells[a].pos = self.cells[b].pos;
            self.cells[a].src = self.cells[b].src;
            self.cells[a].seqs = self.cells[b].seqs;
            self.cells[b].pos = pa;
            self.cells[b].src = sa;
            self.cells[b].seqs = qa;
            for c in &mut self.cells {
                if c.tail == src {
                    c.tail = dst;
                } else if c.tail == dst {
                    c.tail = src;
                }
            }
        }
    }

    fn record_positions(&mut self, groups: &[RsSeqGroup], min: u32) {
        for (s, g) in groups.iter().enumerate() {
            let cell = min as usize + s;
            self.cells[cell].pos = g.last_pos;
            self.cells[cell].seqs = g.ids.iter().copied().collect();
            for &seq in g.ids {
                self.cells[seq as usize].tail = cell as i32;
            }
        }
    }

    /// Stages each cell's source row (`src0`) and makes it its own source; the first cell of
    /// the range no state is read from is the zero state of new sequences.
    fn stage_sources(&mut self, min: u32, max: u32) -> Option<u32> {
        let mut refs = vec![0u32; self.cells.len()];
        for c in &self.cells {
            if c.src >= 0 {
                refs[c.src as usize] += 1;
            }
        }
        let zero = (min..=max).find(|&i| refs[i as usize] == 0);
        for i in min..=max {
            let c = &mut self.cells[i as usize];
            c.src0 = if c.src < 0 { zero.expect("a cell without a source leaves a row unreferenced") as i32 } else { c.src };
            c.src = i as i32;
        }
        zero
    }

    /// The metadata of a saved state: for each cell of `seq` (every non-empty cell when None)
    /// its position and, for a whole save, its sequences; the cells' indices in order.
    pub fn state_cells(&self, seq: Option<SeqId>) -> Vec<(u32, Pos, Vec<SeqId>)> {
        self.cells.iter().enumerate()
            .filter(|(_, c)| match seq { None => !c.is_empty(), Some(s) => c.seqs.contains(s) })
            .map(|(i, c)| (i as u32, c.pos, if seq.is_none() { c.seqs.iter().collect() } else { Vec::new() }))
            .collect()
    }

    /// Restores a whole save: `cells` as `state_cells(None)` gave them (positions and
    /// sequences), into cells `0..n`. Fails, unchanged, on ids out of range or a sequence in
    /// two cells.
    pub fn restore_all(&mut self, cells: &[(Pos, Vec<SeqId>)]) -> Result<(), KvError> {
        if cells.len() > self.cells.len() {
            return Err(KvError::NoStateCell { needed: cells.len() as u32, size: self.size() });
        }
        let mut restored = RsCells::new(self.n_seq_max)?;
        for (i, (pos, seqs)) in cells.iter().enumerate() {
            let c = &mut restored.cells[i];
            c.pos = *pos;
            c.src = i as i32;
            for &s in seqs {
                let si = restored.check_seq(s)?;
                if restored.cells[si].tail != -1 {
                    return Err(KvError::InvalidState(format!("sequence {s} holds two recurrent states")));
                }
                restored.cells[i].seqs.insert(s);
                restored.cells[si].tail = i as i32;
            }
        }
        restored.used = cells.len() as u32;
        *self = restored;
        Ok(())
    }

    /// Restores one sequence's state (saved at position `pos`) as `dst`'s: drops `dst`'s
    /// state and places it in a cell of its own; returns that cell.
    pub fn restore_seq(&mut self, dst: SeqId, pos: Pos) -> Result<u32, KvError> {
        self.check_seq(dst)?;
        let mut trial = self.clone();
        trial.seq_rm(dst, -1, -1)?;
        let ids = [dst];
        let placed = trial.place(&[RsSeqGroup { ids: &ids, last_pos: pos }])?;
        trial.cells[placed.head as usize].src = placed.head as i32;
        *self = trial;
        Ok(placed.head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(ids: &[SeqId], last_pos: Pos) -> RsSeqGroup<'_> { RsSeqGroup { ids, last_pos } }

    #[test]
    fn a_new_sequence_starts_from_the_zero_row_and_keeps_its_cell() {
        let mut rs = RsCells::new(2).unwrap();
        let p = rs.place(&[group(&[0], 4)]).unwrap();
        assert_eq!(p, RsPlacement { head: 0, copies: vec![0], zero: Some(0) });
        assert_eq!((rs.seq_pos_min(0), rs.seq_pos_max(0), rs.used()), (4, 4, 1));
        let p = rs.place(&[group(&[0], 5)]).unwrap();
        assert_eq!(p, RsPlacement { head: 0, copies: vec![0], zero: None });
    }

    #[test]
    fn seq_cp_shares_the_state_until_the_copy_decodes() {
        let mut rs = RsCells::new(3).unwrap();
        rs.place(&[group(&[0], 9)]).unwrap();
        rs.seq_cp(0, 1).unwrap();
        assert_eq!(rs.cells()[0], (9, vec![0, 1]));
        assert_eq!(rs.used(), 1);
        // seq 1 decodes: it gets cell 1, whose state is copied from cell 0
        let p = rs.place(&[group(&[1], 10)]).unwrap();
        assert_eq!((p.head, p.copies.clone()), (1, vec![0]));
        assert_eq!(rs.cells()[0], (9, vec![0]));
        assert_eq!(rs.cells()[1], (10, vec![1]));
        assert_eq!(rs.used(), 2);
    }

    #[test]
    fn a_partial_removal_of_the_tail_is_refused_and_changes_nothing() {
        let mut rs = RsCells::new(1).unwrap();
        rs.place(&[group(&[0], 9)]).unwrap();
        assert!(!rs.seq_rm(0, 5, -1).unwrap());
        assert_eq!(rs.seq_pos_max(0), 9);
        // a range before the state's position removes nothing and succeeds
        assert!(rs.seq_rm(0, 0, 5).unwrap());
        assert_eq!(rs.seq_pos_max(0), 9);
        assert!(rs.seq_rm(0, 0, -1).unwrap());
        assert_eq!((rs.seq_pos_max(0), rs.used()), (-1, 0));
        assert!(!rs.seq_rm(-1, 3, -1).unwrap());
    }

    #[test]
    fn groups_are_gathered_into_one_range_in_group_order() {
        let mut rs = RsCells::new(3).unwrap();
        rs.place(&[group(&[2], 0)]).unwrap();
        rs.place(&[group(&[0], 0)]).unwrap();
        let p = rs.place(&[group(&[0], 1), group(&[2], 1)]).unwrap();
        assert_eq!(p.head, 0);
        assert_eq!(rs.tail(0), Some(0));
        assert_eq!(rs.tail(2), Some(1));
        // each state still comes from the row it was in
        assert_eq!(p.copies, vec![1, 0]);
    }

    #[test]
    fn more_groups_than_cells_fail_and_prepare_changes_nothing() {
        let mut rs = RsCells::new(1).unwrap();
        assert!(rs.place(&[group(&[0], 0), group(&[0], 0)]).is_err());
        assert!(!rs.prepare(&[vec![group(&[0], 0)], vec![group(&[1], 0)]]));
        assert_eq!(rs.used(), 0);
    }

    #[test]
    fn restore_seq_places_the_state_under_the_new_id() {
        let mut rs = RsCells::new(2).unwrap();
        rs.place(&[group(&[0], 3)]).unwrap();
        let cell = rs.restore_seq(1, 3).unwrap();
        assert_eq!(cell, 1);
        assert_eq!(rs.cells()[1], (3, vec![1]));
    }
}

#[cfg(test)]
mod rollback_tests {
    use super::*;

    #[test]
    fn a_tail_within_the_kept_snapshots_rolls_back_once() {
        let mut rs = RsCells::new(2).unwrap();
        let ids = [0];
        rs.place(&[RsSeqGroup { ids: &ids, last_pos: 9 }]).unwrap();
        rs.set_snapshots(0, 3);
        assert!(!rs.seq_rm(0, 6, -1).unwrap(), "4 tokens back, 3 kept");
        assert!(rs.seq_rm(0, 8, -1).unwrap());
        assert_eq!(rs.take_rollback(), Some((0, 2)));
        assert_eq!(rs.seq_pos_max(0), 7);
        assert!(!rs.seq_rm(0, 7, -1).unwrap(), "the snapshots are spent");
    }
}
