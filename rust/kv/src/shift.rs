//! Pending K-shifts: what the engine must re-rotate before the next decode.

use crate::{KvCells, Pos};

impl KvCells {
    /// Whether seq_add/seq_div changed positions since the last `take_shifts` (llama.cpp's
    /// `get_has_shift`; it may be set while every remaining shift is 0, e.g. after a shift
    /// that freed cells).
    pub fn has_shift(&self) -> bool {
        self.has_shift
    }

    /// Accumulated shift of every cell (0 for empty cells), the input of llama.cpp's K-shift
    /// graph (`set_input_k_shift`). Positions already hold the new values.
    pub fn shifts(&self) -> &[Pos] {
        &self.shift
    }

    /// The cells with a nonzero accumulated shift as (cell index, delta), in index order; then
    /// zeroes every shift and clears `has_shift`. The engine re-rotates the cached K of each
    /// listed cell by its delta (RoPE at `delta`), as llama.cpp's update does before a decode.
    pub fn take_shifts(&mut self) -> Vec<(u32, Pos)> {
        let taken = self
            .shift
            .iter()
            .enumerate()
            .filter(|(_, &d)| d != 0)
            .map(|(i, &d)| (i as u32, d))
            .collect();
        self.shift.iter_mut().for_each(|d| *d = 0);
        self.has_shift = false;
        taken
    }
}
