//! The view of one micro-batch that the cache needs: each token's position and sequence ids.

use crate::{CellExt, KvError, Pos, SeqId};

/// One micro-batch as the cache sees it: per token, its position and its sequence ids in the
/// order the caller gave them. The first id of each token decides which cells it attends to
/// (llama.cpp's `ubatch->seq_id[i][0]`); all ids are stored in the token's cell.
///
/// `S` is anything that reads as a slice of ids: `Vec<SeqId>`, `[SeqId; 1]`, `&[SeqId]`.
#[derive(Debug)]
pub struct UBatchView<'a, S: AsRef<[SeqId]> = Vec<SeqId>> {
    /// Position of each token.
    pub pos: &'a [Pos],
    /// Sequence ids of each token.
    pub seq_ids: &'a [S],
    /// The 2-D position of each token, for a model with M-RoPE (llama.cpp's ubatch of
    /// n_pos >= 3: the cells keep them and the causal mask orders one position's cells by
    /// them); `None` for the others.
    pub ext: Option<&'a [CellExt]>,
}

// two shared slices: copyable whatever S is (a derive would require S: Copy)
impl<S: AsRef<[SeqId]>> Clone for UBatchView<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: AsRef<[SeqId]>> Copy for UBatchView<'_, S> {}

impl<'a, S: AsRef<[SeqId]>> UBatchView<'a, S> {
    /// A view over parallel arrays of positions and sequence-id lists.
    pub fn new(pos: &'a [Pos], seq_ids: &'a [S]) -> Self {
        UBatchView { pos, seq_ids, ext: None }
    }

    /// The same micro-batch with each token's 2-D position.
    pub fn with_ext(self, ext: &'a [CellExt]) -> Self {
        UBatchView { ext: Some(ext), ..self }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.pos.len()
    }

    /// Whether the micro-batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }

    /// The ids of token `i`.
    pub(crate) fn seqs(&self, i: usize) -> &[SeqId] {
        self.seq_ids[i].as_ref()
    }

    /// Checks shape, positions and that every id is in `0..n_seq_max`.
    pub(crate) fn validate(&self, n_seq_max: u32) -> Result<(), KvError> {
        if self.pos.len() != self.seq_ids.len() {
            return Err(KvError::UBatchShape {
                n_pos: self.pos.len(),
                n_seq: self.seq_ids.len(),
            });
        }
        if self.pos.is_empty() {
            return Err(KvError::EmptyUBatch);
        }
        if let Some(ext) = self.ext.filter(|e| e.len() != self.pos.len()) {
            return Err(KvError::ExtShape {
                n_pos: self.pos.len(),
                n_ext: ext.len(),
            });
        }
        for (token, (&pos, ids)) in self.pos.iter().zip(self.seq_ids).enumerate() {
            if pos < 0 {
                return Err(KvError::NegativePos { token, pos });
            }
            let ids = ids.as_ref();
            if ids.is_empty() {
                return Err(KvError::TokenWithoutSeq { token });
            }
            for &seq_id in ids {
                if seq_id < 0 || seq_id as u32 >= n_seq_max {
                    return Err(KvError::InvalidSeqId { seq_id, n_seq_max });
                }
            }
        }
        Ok(())
    }
}
