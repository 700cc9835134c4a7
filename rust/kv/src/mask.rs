//! The attention window and the KQ mask of a micro-batch.

use crate::swa::pad_to;
use crate::{CellExt, KvCells, KvError, SeqId, SwaParams, SwaType, UBatchView};

/// llama.cpp pads the attention window to at least this many cells.
pub const N_KV_MIN_PAD: u32 = 256;

impl KvCells {
    /// Cells the attention of the next micro-batch spans, `0..n_kv`, as llama.cpp's `get_n_kv`
    /// computes it with the cache padding `n_pad = 1` its models use:
    /// `min(size, max(256, GGML_PAD(used_max_p1, 256)))`. Call it after `apply_ubatch`.
    pub fn n_kv_window(&self) -> u32 {
        self.n_kv_window_padded(1)
    }

    /// The window with another cache padding: the pad in force is `max(n_pad, 256)`.
    pub fn n_kv_window_padded(&self, n_pad: u32) -> u32 {
        let pad = n_pad.max(N_KV_MIN_PAD);
        self.size().min(pad.max(pad_to(self.used_max_p1(), pad)))
    }

    /// Fills `out` (row-major `[n_tokens][n_kv]`) with 0 where a token may attend to a cell and
    /// `-inf` elsewhere, using this cache's sliding window. Token `i` (first sequence id `s`,
    /// position `p`) sees cell `j < n_kv` when the cell is non-empty, holds `s`, and (if
    /// `causal`) has a position `<= p`, and the window does not hide it. With 2-D positions
    /// (a micro-batch `with_ext`, M-RoPE), a causal token also does not see the cells of its
    /// own position that come after it in raster order (`CellExt::is_2d_gt`).
    pub fn fill_mask<S: AsRef<[SeqId]>>(
        &self,
        ubatch: &UBatchView<'_, S>,
        n_kv: u32,
        causal: bool,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        self.fill_mask_with(ubatch, n_kv, causal, self.swa, out)
    }

    /// `fill_mask` with an explicit window (`SwaParams::NONE` for none) instead of the cache's.
    pub fn fill_mask_with<S: AsRef<[SeqId]>>(
        &self,
        ubatch: &UBatchView<'_, S>,
        n_kv: u32,
        causal: bool,
        swa: SwaParams,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        ubatch.validate(self.n_seq_max)?;
        if n_kv > self.size() {
            return Err(KvError::InvalidMask(format!(
                "n_kv {n_kv} > size {}",
                self.size()
            )));
        }
        let n_kv = n_kv as usize;
        let expected = ubatch.len().checked_mul(n_kv);
        if expected != Some(out.len()) {
            return Err(KvError::InvalidMask(format!(
                "buffer of {} floats for {} tokens x {} cells",
                out.len(),
                ubatch.len(),
                n_kv
            )));
        }
        if n_kv == 0 {
            return Ok(());
        }
        // per-cell position as seen by the current sequence (HIDDEN when it does not hold the
        // cell), rebuilt when the first sequence id changes from one token to the next
        let mut seen_pos = vec![HIDDEN; n_kv];
        let mut seen_seq = None;
        for (i, row) in out.chunks_exact_mut(n_kv).enumerate() {
            // llama.cpp masks by the token's first sequence id only
            let seq = ubatch.seqs(i)[0];
            if seen_seq != Some(seq) {
                self.positions_seen_by(seq, &mut seen_pos);
                seen_seq = Some(seq);
            }
            fill_row(row, &seen_pos, i64::from(ubatch.pos[i]), causal, swa);
            if let (true, Some(ext)) = (causal, ubatch.ext) {
                self.hide_later_2d(row, &seen_pos, i64::from(ubatch.pos[i]), ext[i]);
            }
        }
        Ok(())
    }

    /// llama.cpp's M-RoPE causal rule: of the cells at the token's own position (all of an
    /// image's tokens share one), those after the token in raster order are hidden.
    fn hide_later_2d(&self, row: &mut [f32], seen_pos: &[i64], p1: i64, at: CellExt) {
        for ((value, &q), e) in row.iter_mut().zip(seen_pos).zip(&self.ext) {
            if q == p1 && e.is_2d_gt(at.x, at.y) {
                *value = f32::NEG_INFINITY;
            }
        }
    }

    /// `out[j]` = position of cell j if `seq` holds it, else `HIDDEN`.
    fn positions_seen_by(&self, seq: SeqId, out: &mut [i64]) {
        for (j, q) in out.iter_mut().enumerate() {
            let p = self.pos[j];
            *q = if p != -1 && self.seqs[j].contains(seq) {
                i64::from(p)
            } else {
                HIDDEN
            };
        }
    }

    /// The mask by its definition, cell by cell (the specification `fill_mask` is tested against).
    #[cfg(test)]
    pub(crate) fn mask_value(
        &self,
        j: usize,
        seq: SeqId,
        p1: crate::Pos,
        causal: bool,
        swa: SwaParams,
    ) -> f32 {
        let p0 = self.pos[j];
        let visible = p0 != -1
            && self.seqs[j].contains(seq)
            && !(causal && p0 > p1)
            && !swa.is_masked(p0, p1);
        if visible {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// Each token's visible cells in position order (the order batch-invariant attention sums
/// them in, whatever cache slots hold them): token i sees `cells[ranges[i].0..ranges[i].1]`.
/// Tokens of one sequence share that sequence's list (their windows are ranges of it).
#[derive(Debug, Default, Clone)]
pub struct VisibleCells {
    /// The lists, one after another.
    pub cells: Vec<u32>,
    /// Each token's list: a range of `cells`.
    pub ranges: Vec<(u32, u32)>,
}

impl VisibleCells {
    /// Token i's visible cells in position order.
    pub fn of(&self, i: usize) -> &[u32] {
        let (a, b) = self.ranges[i];
        &self.cells[a as usize..b as usize]
    }
}

impl KvCells {
    /// The visible cells of each token of `ubatch` by the mask `fill_mask` wrote (`mask`:
    /// row-major `[n_tokens][n_kv]`), in order of (position, its 2-D position, cell index).
    pub fn visible_cells<S: AsRef<[SeqId]>>(&self, ubatch: &UBatchView<'_, S>, mask: &[f32], n_kv: u32, out: &mut VisibleCells) {
        let n_kv = n_kv as usize;
        out.cells.clear();
        out.ranges.clear();
        let mut seq_list: Option<(SeqId, usize, usize)> = None;
        for (i, row) in mask.chunks_exact(n_kv).take(ubatch.len()).enumerate() {
            let seq = ubatch.seqs(i)[0];
            let (base, end) = match seq_list {
                Some((s, base, end)) if s == seq => (base, end),
                _ => {
                    let base = out.cells.len();
                    self.append_cells_by_position(seq, n_kv, &mut out.cells);
                    seq_list = Some((seq, base, out.cells.len()));
                    (base, out.cells.len())
                }
            };
            let range = visible_range(&out.cells[base..end], row).map(|(a, b)| ((base + a) as u32, (base + b) as u32));
            let range = range.unwrap_or_else(|| {
                // not a run of the sequence's list (a mask rule beyond positions): its own list
                let own = out.cells.len();
                let visible: Vec<u32> = out.cells[base..end].iter().copied().filter(|&j| row[j as usize] != f32::NEG_INFINITY).collect();
                out.cells.extend(visible);
                (own as u32, out.cells.len() as u32)
            });
            out.ranges.push(range);
        }
    }

    /// Appends the cells below `n_kv` that `seq` holds, ordered by position (cells of one
    /// position, an M-RoPE image's, by their 2-D position, row by row), then index.
    fn append_cells_by_position(&self, seq: SeqId, n_kv: usize, out: &mut Vec<u32>) {
        let start = out.len();
        out.extend((0..n_kv as u32).filter(|&j| self.pos[j as usize] != -1 && self.seqs[j as usize].contains(seq)));
        out[start..].sort_by_key(|&j| {
            let ext = self.ext[j as usize];
            (self.pos[j as usize], ext.y, ext.x, j)
        });
    }
}

/// The run [a, b) of `list` whose cells the mask row shows, if they form one run (an empty
/// run when none is visible); None when visible and hidden cells alternate.
fn visible_range(list: &[u32], row: &[f32]) -> Option<(usize, usize)> {
    let visible = |k: usize| row[list[k] as usize] != f32::NEG_INFINITY;
    let Some(a) = (0..list.len()).find(|&k| visible(k)) else { return Some((0, 0)) };
    let b = (a..list.len()).find(|&k| !visible(k)).unwrap_or(list.len());
    (b..list.len()).all(|k| !visible(k)).then_some((a, b))
}

/// Marks a cell the token's sequence does not hold.
const HIDDEN: i64 = i64::MAX;

/// One mask row for a token at `p1`: visible cells are those with `lo < q <= hi`, where the
/// causal rule gives `hi` and a standard window gives `lo`; other windows ask `is_masked`.
fn fill_row(row: &mut [f32], seen_pos: &[i64], p1: i64, causal: bool, swa: SwaParams) {
    let hi = if causal { p1 } else { HIDDEN - 1 };
    let lo = match swa.kind {
        SwaType::None => i64::MIN,
        SwaType::Standard => p1 - i64::from(swa.n_swa),
        SwaType::Chunked | SwaType::Symmetric => {
            for (value, &q) in row.iter_mut().zip(seen_pos) {
                let visible = q <= hi && !swa.is_masked(q as crate::Pos, p1 as crate::Pos);
                *value = if visible { 0.0 } else { f32::NEG_INFINITY };
            }
            return;
        }
    };
    for (value, &q) in row.iter_mut().zip(seen_pos) {
        *value = if q > lo && q <= hi {
            0.0
        } else {
            f32::NEG_INFINITY
        };
    }
}
