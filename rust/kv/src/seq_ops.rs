//! Sequence operations (llama.cpp's `llama_memory_seq_*`). Ranges are `[p0, p1)`; `p0 < 0`
//! means 0 and `p1 < 0` means no end. Positions belong to cells, so moving a cell shared by
//! several sequences moves it for all of them, as in llama.cpp.

use crate::cells::{normalize_range, CellState};
use crate::{KvCells, KvError, Pos, SeqId};

impl KvCells {
    /// Removes the positions `[p0, p1)` of sequence `seq_id`, or of every sequence when
    /// `seq_id < 0` (then the cells in range are emptied whatever holds them). A cell shared
    /// with another sequence only loses the id. Always returns `Ok(true)` for this cache, as
    /// llama.cpp's KV cache does (only recurrent memories refuse partial removals).
    pub fn seq_rm(&mut self, seq_id: SeqId, p0: Pos, p1: Pos) -> Result<bool, KvError> {
        let (p0, p1) = normalize_range(p0, p1);
        if seq_id >= 0 {
            self.check_seq(seq_id)?;
            self.remove_seq_range(seq_id, p0, p1);
        } else {
            let mut new_head = None;
            for i in 0..self.pos.len() {
                if self.pos_in(i, p0, p1) {
                    self.clear_cell(i);
                    new_head.get_or_insert(i as u32);
                }
            }
            self.lower_head(new_head);
        }
        Ok(true)
    }

    /// seq_rm for one valid sequence and a normalized range.
    pub(crate) fn remove_seq_range(&mut self, seq: SeqId, p0: Pos, p1: Pos) {
        let mut new_head = None;
        for i in 0..self.pos.len() {
            if self.pos_in(i, p0, p1) && self.seqs[i].contains(seq) && self.remove_seq(i, seq) {
                new_head.get_or_insert(i as u32);
            }
        }
        self.lower_head(new_head);
    }

    /// If a cell was freed before the head, the next search starts there.
    fn lower_head(&mut self, freed: Option<u32>) {
        if let Some(first) = freed {
            if first < self.head {
                self.head = first;
            }
        }
    }

    /// Adds sequence `dst` to every cell of `src` with a position in `[p0, p1)`.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Result<(), KvError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        let (p0, p1) = normalize_range(p0, p1);
        for i in 0..self.pos.len() {
            if self.pos_in(i, p0, p1) && self.seqs[i].contains(src) {
                self.add_seq(i, dst);
            }
        }
        Ok(())
    }

    /// Keeps only sequence `seq_id`: cells without it are emptied, cells with it hold only it.
    pub fn seq_keep(&mut self, seq_id: SeqId) -> Result<(), KvError> {
        self.check_seq(seq_id)?;
        let mut new_head = None;
        for i in 0..self.pos.len() {
            let seqs = self.seqs[i];
            if seqs.contains(seq_id) {
                if seqs.len() > 1 {
                    let st = CellState {
                        seqs: crate::SeqSet::single(seq_id),
                        ..self.state_of(i)
                    };
                    self.write_cell(i, st);
                }
            } else if !seqs.is_empty() {
                self.clear_cell(i);
                new_head.get_or_insert(i as u32);
            }
        }
        self.lower_head(new_head);
        Ok(())
    }

    /// Adds `delta` to the positions in `[p0, p1)` of sequence `seq_id`, accumulating the shift
    /// for the K re-rotation. A cell whose position falls below 0 is freed. As in llama.cpp, the
    /// head moves to the first freed cell, or to 0 when none was freed; `delta == 0` and an
    /// empty range (`p0 == p1` after normalization) change nothing, not even the head.
    pub fn seq_add(&mut self, seq_id: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), KvError> {
        self.check_seq(seq_id)?;
        if delta == 0 {
            return Ok(());
        }
        let (p0, p1) = normalize_range(p0, p1);
        if p0 == p1 {
            return Ok(());
        }
        self.check_add_overflow(seq_id, p0, p1, delta)?;
        let mut new_head = None;
        for i in 0..self.pos.len() {
            if self.pos_in(i, p0, p1) && self.seqs[i].contains(seq_id) && self.pos_add(i, delta) {
                new_head.get_or_insert(i as u32);
            }
        }
        self.head = new_head.unwrap_or(0);
        Ok(())
    }

    fn check_add_overflow(&self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), KvError> {
        for i in 0..self.pos.len() {
            if self.pos_in(i, p0, p1)
                && self.seqs[i].contains(seq)
                && self.pos[i].checked_add(delta).is_none()
            {
                return Err(KvError::PositionOverflow {
                    pos: self.pos[i],
                    delta,
                });
            }
        }
        Ok(())
    }

    /// pos += d on a non-empty cell; returns true when the cell was freed (position < 0).
    fn pos_add(&mut self, idx: usize, d: Pos) -> bool {
        self.has_shift = true;
        let st = self.state_of(idx);
        let new_pos = i64::from(st.pos) + i64::from(d);
        if new_pos < 0 {
            self.clear_cell(idx);
            return true;
        }
        // shift = current position - position at the last take_shifts: fits in i32
        let new_shift = i64::from(st.shift) + i64::from(d);
        self.write_cell(
            idx,
            CellState {
                pos: new_pos as Pos,
                shift: new_shift as Pos,
                ..st
            },
        );
        false
    }

    /// Divides (truncating) the positions in `[p0, p1)` of sequence `seq_id` by `d`. The shift
    /// accumulates `new - old` (llama.cpp at 0c1e570 adds `old - new`, rotating keys the wrong
    /// way; this is the corrected sign its reference records were made with). `d == 1` and an
    /// empty range do nothing; `d <= 0` is an error.
    pub fn seq_div(&mut self, seq_id: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), KvError> {
        self.check_seq(seq_id)?;
        if d <= 0 {
            return Err(KvError::InvalidDivisor(d));
        }
        if d == 1 {
            return Ok(());
        }
        let (p0, p1) = normalize_range(p0, p1);
        if p0 == p1 {
            return Ok(());
        }
        for i in 0..self.pos.len() {
            if self.pos_in(i, p0, p1) && self.seqs[i].contains(seq_id) {
                let st = self.state_of(i);
                let new_pos = st.pos / d;
                let shift = i64::from(st.shift) + i64::from(new_pos) - i64::from(st.pos);
                self.write_cell(
                    i,
                    CellState {
                        pos: new_pos,
                        shift: shift as Pos,
                        ..st
                    },
                );
                self.has_shift = true;
            }
        }
        Ok(())
    }

    /// Smallest position held by `seq_id`, -1 when it holds none.
    pub fn seq_pos_min(&self, seq_id: SeqId) -> Result<Pos, KvError> {
        self.check_seq(seq_id)?;
        Ok(self.pos_min_of(seq_id))
    }

    /// Largest position held by `seq_id`, -1 when it holds none.
    pub fn seq_pos_max(&self, seq_id: SeqId) -> Result<Pos, KvError> {
        self.check_seq(seq_id)?;
        Ok(self.pos_max_of(seq_id))
    }

    /// Empties every cell, forgets pending shifts and puts the head at 0.
    pub fn clear(&mut self) {
        for i in 0..self.pos.len() {
            if !self.is_empty_cell(i) {
                self.clear_cell(i);
            }
        }
        self.has_shift = false;
        self.head = 0;
    }
}
