//! Serialization of the cell metadata, in the layout of llama.cpp's `state_write_meta`
//! (little-endian): `u32 n_stream (= 1)`, `u32 cell_count`, then per cell `i32 pos`,
//! `u32 n_seq_id`, in a cache of 2-D positions (M-RoPE) `i32 x, i32 y` (the part of
//! llama.cpp's `llama_kv_cell_ext` these models use), `n_seq_id x i32 seq_id`. The engine appends the K/V rows of the listed
//! cells (in the same order) after these bytes, as llama.cpp's `state_write_data` does.
//! Shifts are not stored: apply pending shifts (`take_shifts`) before saving.

use crate::cells::CellState;
use crate::{CellExt, KvCells, KvError, Pos, SeqId, SeqSet, UBatchView};

/// Serialized metadata and the cells it describes, in the order their K/V rows follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMeta {
    /// The metadata bytes.
    pub bytes: Vec<u8>,
    /// Index of each written cell, in order.
    pub cells: Vec<u32>,
}

/// What `state_read` restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateRead {
    /// The cell that received each serialized cell, in order: read the K/V rows into these.
    pub cells: Vec<u32>,
    /// Bytes of metadata consumed (the K/V data starts there).
    pub consumed: usize,
}

/// One parsed cell.
struct SavedCell {
    pos: Pos,
    seqs: Vec<SeqId>,
    ext: CellExt,
}

impl KvCells {
    /// Serializes every non-empty cell with all its sequences (`seq_id = None`), or the cells of
    /// one sequence with only that id, skipping cells its sliding window already hides from its
    /// last position (llama.cpp's `state_write` with a seq_id).
    pub fn state_write(&self, seq_id: Option<SeqId>) -> Result<StateMeta, KvError> {
        if let Some(s) = seq_id {
            self.check_seq(s)?;
        }
        let cells: Vec<u32> = (0..self.size())
            .filter(|&i| self.is_saved(i as usize, seq_id))
            .collect();
        let mut bytes = Vec::with_capacity(8 + cells.len() * 12);
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&(cells.len() as u32).to_le_bytes());
        for &i in &cells {
            let i = i as usize;
            let ids: Vec<SeqId> = match seq_id {
                Some(s) => vec![s],
                None => self.seqs[i].iter().collect(),
            };
            bytes.extend_from_slice(&self.pos[i].to_le_bytes());
            bytes.extend_from_slice(&(ids.len() as u32).to_le_bytes());
            if self.pos_2d {
                bytes.extend_from_slice(&self.ext[i].x.to_le_bytes());
                bytes.extend_from_slice(&self.ext[i].y.to_le_bytes());
            }
            for id in ids {
                bytes.extend_from_slice(&id.to_le_bytes());
            }
        }
        Ok(StateMeta { bytes, cells })
    }

    fn is_saved(&self, i: usize, seq_id: Option<SeqId>) -> bool {
        if self.is_empty_cell(i) {
            return false;
        }
        match seq_id {
            None => true,
            Some(s) => {
                self.seqs[i].contains(s) && !self.swa.is_masked(self.pos[i], self.pos_max_of(s))
            }
        }
    }

    /// Restores metadata written by `state_write`.
    ///
    /// `dest = None`: the whole cache is replaced; cell k of the input goes to cell k, the head
    /// to 0. `dest = Some(d)`: the input must hold one id per cell; sequence `d` is removed and
    /// its saved positions are placed as a micro-batch of sequence `d` (slot search as for a
    /// decode), so a sequence can be restored under another id. An input of zero cells leaves
    /// `d` untouched, as in llama.cpp. Any malformed input or lack of room returns an error and
    /// leaves the cache unchanged (llama.cpp would clear the cache or the sequence).
    pub fn state_read(&mut self, bytes: &[u8], dest: Option<SeqId>) -> Result<StateRead, KvError> {
        if let Some(d) = dest {
            self.check_seq(d)?;
        }
        let (saved, consumed) = self.parse_state(bytes)?;
        let cells = match dest {
            None => self.restore_all(&saved),
            Some(d) => self.restore_seq(&saved, d)?,
        };
        Ok(StateRead { cells, consumed })
    }

    fn parse_state(&self, bytes: &[u8]) -> Result<(Vec<SavedCell>, usize), KvError> {
        let mut rd = Reader { bytes, at: 0 };
        let n_stream = rd.u32()?;
        if n_stream != 1 {
            return Err(KvError::InvalidState(format!(
                "n_stream {n_stream}, expected 1"
            )));
        }
        let cell_count = rd.u32()?;
        if cell_count > self.size() {
            return Err(KvError::InvalidState(format!(
                "{cell_count} cells do not fit in {}",
                self.size()
            )));
        }
        let mut saved = Vec::with_capacity(cell_count as usize);
        for k in 0..cell_count {
            saved.push(self.parse_cell(&mut rd, k)?);
        }
        Ok((saved, rd.at))
    }

    fn parse_cell(&self, rd: &mut Reader<'_>, k: u32) -> Result<SavedCell, KvError> {
        let pos = rd.i32()?;
        if pos < 0 {
            return Err(KvError::InvalidState(format!(
                "cell {k}: negative position {pos}"
            )));
        }
        let n_seq_id = rd.u32()?;
        if n_seq_id > self.n_seq_max {
            return Err(KvError::InvalidState(format!(
                "cell {k}: {n_seq_id} sequence ids"
            )));
        }
        let ext = if self.pos_2d {
            CellExt { x: rd.i32()?, y: rd.i32()? }
        } else {
            CellExt::default()
        };
        let mut seqs = Vec::with_capacity(n_seq_id as usize);
        let mut set = SeqSet::EMPTY;
        for _ in 0..n_seq_id {
            let s = rd.i32()?;
            if s < 0 || s as u32 >= self.n_seq_max {
                return Err(KvError::InvalidState(format!(
                    "cell {k}: sequence id {s} out of range [0, {})",
                    self.n_seq_max
                )));
            }
            if !set.insert(s) {
                return Err(KvError::InvalidState(format!(
                    "cell {k}: sequence id {s} twice"
                )));
            }
            seqs.push(s);
        }
        Ok(SavedCell { pos, seqs, ext })
    }

    fn restore_all(&mut self, saved: &[SavedCell]) -> Vec<u32> {
        self.clear();
        for (k, cell) in saved.iter().enumerate() {
            let seqs = cell.seqs.iter().copied().collect();
            self.write_cell(
                k,
                CellState {
                    pos: cell.pos,
                    shift: 0,
                    seqs,
                    ext: cell.ext,
                },
            );
        }
        self.head = 0;
        (0..saved.len() as u32).collect()
    }

    fn restore_seq(&mut self, saved: &[SavedCell], dest: SeqId) -> Result<Vec<u32>, KvError> {
        if saved.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(k) = saved.iter().position(|c| c.seqs.len() != 1) {
            return Err(KvError::InvalidState(format!(
                "cell {k}: a sequence state holds one id per cell"
            )));
        }
        let pos: Vec<Pos> = saved.iter().map(|c| c.pos).collect();
        let ids = vec![[dest]; saved.len()];
        let ext: Vec<CellExt> = saved.iter().map(|c| c.ext).collect();
        let ubatch = UBatchView::new(&pos, &ids).with_ext(&ext);
        // try under a journal so that a failed search leaves the sequence in place
        let head_old = self.head;
        self.begin_journal();
        self.remove_seq_range(dest, 0, Pos::MAX);
        match self.search(saved.len()) {
            Some(slots) => {
                self.place(&slots, &ubatch);
                self.end_journal();
                Ok(slots)
            }
            None => {
                self.rollback();
                self.head = head_old;
                Err(KvError::NoSlot {
                    ubatch: 0,
                    n_tokens: saved.len(),
                })
            }
        }
    }
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take4(&mut self) -> Result<[u8; 4], KvError> {
        let end = self
            .at
            .checked_add(4)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                KvError::InvalidState(format!(
                    "truncated at byte {} of {}",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.bytes[self.at..end]);
        self.at = end;
        Ok(word)
    }

    fn u32(&mut self) -> Result<u32, KvError> {
        Ok(u32::from_le_bytes(self.take4()?))
    }

    fn i32(&mut self) -> Result<i32, KvError> {
        Ok(i32::from_le_bytes(self.take4()?))
    }
}
