//! Errors of the cache bookkeeping. Every invalid argument becomes one of these; nothing panics.

use crate::{Pos, SeqId};

/// What went wrong in a cache operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The cache was asked for zero cells.
    #[error("a KV cache needs at least one cell")]
    ZeroSize,
    /// n_seq_max outside 1..=256.
    #[error("n_seq_max = {0} is outside 1..=256")]
    InvalidSeqMax(u32),
    /// A sequence id outside `0..n_seq_max` (or a negative id where only -1/"all" is allowed).
    #[error("sequence id {seq_id} is out of range [0, {n_seq_max})")]
    InvalidSeqId {
        /// The id given.
        seq_id: SeqId,
        /// The cache's bound.
        n_seq_max: u32,
    },
    /// seq_div by zero or a negative divisor.
    #[error("seq_div divisor must be positive, got {0}")]
    InvalidDivisor(i32),
    /// A position change would leave the i32 range.
    #[error("position {pos} + {delta} overflows")]
    PositionOverflow {
        /// The position of the cell.
        pos: Pos,
        /// The shift asked for.
        delta: Pos,
    },
    /// A micro-batch with no tokens.
    #[error("a micro-batch must hold at least one token")]
    EmptyUBatch,
    /// The micro-batch's arrays disagree in length.
    #[error("micro-batch has {n_pos} positions but {n_seq} sequence lists")]
    UBatchShape {
        /// Number of positions.
        n_pos: usize,
        /// Number of sequence-id lists.
        n_seq: usize,
    },
    /// The micro-batch's 2-D positions are not one per token.
    #[error("micro-batch has {n_pos} positions but {n_ext} 2-D positions")]
    ExtShape {
        /// Number of positions.
        n_pos: usize,
        /// Number of 2-D positions.
        n_ext: usize,
    },
    /// A token of the micro-batch belongs to no sequence.
    #[error("token {token} of the micro-batch has no sequence id")]
    TokenWithoutSeq {
        /// Index of the token in the micro-batch.
        token: usize,
    },
    /// A token with a negative position.
    #[error("token {token} has negative position {pos}")]
    NegativePos {
        /// Index of the token in the micro-batch.
        token: usize,
        /// Its position.
        pos: Pos,
    },
    /// Micro-batch `ubatch` (of `n_tokens`) found no room; the cache is unchanged.
    #[error("no room in the KV cache for micro-batch {ubatch} ({n_tokens} tokens)")]
    NoSlot {
        /// Index of the micro-batch in the batch.
        ubatch: usize,
        /// Its number of tokens.
        n_tokens: usize,
    },
    /// apply_ubatch was given cell indices that do not fit the micro-batch or the cache.
    #[error("invalid slots: {0}")]
    InvalidSlots(String),
    /// A mask buffer or window of the wrong size.
    #[error("mask: {0}")]
    InvalidMask(String),
    /// A defragmentation plan that does not match the cells.
    #[error("invalid defrag plan: {0}")]
    InvalidDefrag(String),
    /// A recurrent micro-batch of `needed` sequence groups found no free state cell (there
    /// are `size`, one per sequence).
    #[error("no free recurrent state cell for {needed} sequences ({size} cells)")]
    NoStateCell {
        /// Sequence groups of the micro-batch.
        needed: u32,
        /// Cells of the recurrent memory.
        size: u32,
    },
    /// Serialized cell metadata that cannot be read back.
    #[error("invalid KV state: {0}")]
    InvalidState(String),
}
