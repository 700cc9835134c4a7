//! Placing micro-batches: llama.cpp's `find_slot` (non-contiguous), `prepare` and `apply_ubatch`.

use crate::cells::CellState;
use crate::{KvCells, KvError, Pos, SeqId, SeqSet, UBatchView, MAX_SEQ};

impl KvCells {
    /// Cell indices for the tokens of `ubatch`, in token order, chosen as llama.cpp's
    /// `find_slot(ubatch, cont = false)` does, or `None` when they do not fit.
    ///
    /// The search starts at `head` (or at 0 when `head > used + 2 * n_tokens`) and walks the
    /// ring once, taking every usable cell until it has one per token. A cell is usable when it
    /// is empty, or when exactly one sequence holds it and the cache's sliding window hides it
    /// from that sequence's next position (`seq_pos_max + 1`).
    pub fn find_slot<S: AsRef<[SeqId]>>(
        &self,
        ubatch: &UBatchView<'_, S>,
    ) -> Result<Option<Vec<u32>>, KvError> {
        ubatch.validate(self.n_seq_max)?;
        Ok(self.search(ubatch.len()))
    }

    pub(crate) fn search(&self, n_tokens: usize) -> Option<Vec<u32>> {
        let size = self.pos.len();
        if n_tokens > size {
            return None;
        }
        let mut head_cur = self.head as usize;
        // enough unused cells before the head: start from the beginning, hoping to fill it
        if head_cur as u64 > self.used.len() as u64 + 2 * n_tokens as u64 {
            head_cur = 0;
        }
        let mut idxs = Vec::with_capacity(n_tokens);
        let mut n_tested = 0usize;
        loop {
            if head_cur >= size {
                head_cur = 0;
            }
            let idx = head_cur;
            head_cur += 1;
            n_tested += 1;
            if self.is_usable(idx) {
                idxs.push(idx as u32);
                if idxs.len() == n_tokens {
                    return Some(idxs);
                }
            }
            if n_tested >= size {
                return None;
            }
        }
    }

    /// Empty, or held by one sequence only and out of that sequence's window.
    fn is_usable(&self, idx: usize) -> bool {
        if self.is_empty_cell(idx) {
            return true;
        }
        let seqs = self.seqs[idx];
        if seqs.len() != 1 || !self.swa.is_active() {
            return false;
        }
        let Some(seq) = seqs.first() else {
            return false;
        };
        self.swa
            .is_masked(self.pos[idx], self.pos_max_of(seq).saturating_add(1))
    }

    /// Finds room for every micro-batch of one batch, all or none.
    ///
    /// Each micro-batch is searched for in the state left by placing the previous ones, as
    /// llama.cpp's `prepare` does; afterwards every cell and the head are restored exactly.
    /// Returns one slot list per micro-batch, to be passed to `apply_ubatch` in order, or
    /// `KvError::NoSlot` naming the first micro-batch that did not fit (the cache unchanged).
    ///
    /// Unlike llama.cpp, the restore also brings back cells that the simulated placements purged
    /// from a sliding window (llama.cpp restores only the cells it overwrote).
    pub fn prepare<S: AsRef<[SeqId]>>(
        &mut self,
        ubatches: &[UBatchView<'_, S>],
    ) -> Result<Vec<Vec<u32>>, KvError> {
        for ubatch in ubatches {
            ubatch.validate(self.n_seq_max)?;
        }
        let head_old = self.head;
        let has_shift_old = self.has_shift;
        self.begin_journal();
        let mut slots = Vec::with_capacity(ubatches.len());
        let mut failure = None;
        for (k, ubatch) in ubatches.iter().enumerate() {
            match self.search(ubatch.len()) {
                Some(idxs) => {
                    // the last placement cannot influence anything: skip simulating it
                    if k + 1 < ubatches.len() {
                        self.place(&idxs, ubatch);
                    }
                    slots.push(idxs);
                }
                None => {
                    failure = Some(KvError::NoSlot {
                        ubatch: k,
                        n_tokens: ubatch.len(),
                    });
                    break;
                }
            }
        }
        self.rollback();
        self.head = head_old;
        self.has_shift = has_shift_old;
        match failure {
            Some(err) => Err(err),
            None => Ok(slots),
        }
    }

    /// Commits one micro-batch into the cells `slots` (from `prepare` or `find_slot`): each
    /// cell gets its token's position and sequence ids; the head moves past the last cell.
    ///
    /// A reused (window-hidden) cell loses its old content; then, as llama.cpp does to keep
    /// each sequence's positions contiguous, every cell of that old sequence with a position
    /// in `[seq_pos_min, largest overwritten position]` is removed from the sequence.
    pub fn apply_ubatch<S: AsRef<[SeqId]>>(
        &mut self,
        slots: &[u32],
        ubatch: &UBatchView<'_, S>,
    ) -> Result<(), KvError> {
        ubatch.validate(self.n_seq_max)?;
        self.check_slots(slots, ubatch.len())?;
        self.place(slots, ubatch);
        Ok(())
    }

    fn check_slots(&self, slots: &[u32], n_tokens: usize) -> Result<(), KvError> {
        if slots.len() != n_tokens {
            return Err(KvError::InvalidSlots(format!(
                "{} cells for {} tokens",
                slots.len(),
                n_tokens
            )));
        }
        if slots.len() > 1 {
            let mut sorted = slots.to_vec();
            sorted.sort_unstable();
            if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return Err(KvError::InvalidSlots(format!(
                    "cell {} given twice",
                    pair[0]
                )));
            }
        }
        for &idx in slots {
            let i = idx as usize;
            if i >= self.pos.len() {
                return Err(KvError::InvalidSlots(format!(
                    "cell {idx} >= size {}",
                    self.size()
                )));
            }
            if !self.is_empty_cell(i) && self.seqs[i].len() != 1 {
                return Err(KvError::InvalidSlots(format!(
                    "cell {idx} is shared by {} sequences",
                    self.seqs[i].len()
                )));
            }
        }
        Ok(())
    }

    /// The placement itself (slots already checked).
    pub(crate) fn place<S: AsRef<[SeqId]>>(&mut self, slots: &[u32], ubatch: &UBatchView<'_, S>) {
        // the largest position overwritten per sequence (only a sliding cache overwrites)
        let mut max_rm: [Pos; MAX_SEQ as usize] = [-1; MAX_SEQ as usize];
        for (i, &idx) in slots.iter().enumerate() {
            let idx = idx as usize;
            if !self.is_empty_cell(idx) {
                if let Some(seq) = self.seqs[idx].first() {
                    let slot = &mut max_rm[seq as usize];
                    *slot = (*slot).max(self.pos[idx]);
                }
                self.clear_cell(idx);
            }
            let seqs: SeqSet = ubatch.seqs(i).iter().copied().collect();
            self.write_cell(
                idx,
                CellState {
                    pos: ubatch.pos[i],
                    shift: 0,
                    seqs,
                    ext: ubatch.ext.map_or_else(Default::default, |e| e[i]),
                },
            );
        }
        for (seq, &max_pos) in max_rm.iter().enumerate().take(self.n_seq_max as usize) {
            if max_pos == -1 {
                continue;
            }
            let seq = seq as SeqId;
            let min_pos = self.pos_min_of(seq);
            if min_pos <= max_pos {
                self.remove_seq_range(seq, min_pos, max_pos.saturating_add(1));
            }
        }
        if let Some(&last) = slots.last() {
            self.head = last + 1;
        }
    }
}
