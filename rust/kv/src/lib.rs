//! Bookkeeping of llama.cpp's unified KV cache, without tensors.
//!
//! The engine owns the K/V buffers (one row per cell and layer); this crate decides where each
//! token goes, what each token may attend to, which cells moved and by how much. It reproduces
//! `llama_kv_cache` / `llama_kv_cells` of llama.cpp build 0c1e570 (one stream, i.e.
//! `kv_unified = true`), with the sign of `seq_div`'s shift corrected (see [`KvCells::seq_div`]).
//!
//! # Workflow of one decode (as llama.cpp's `llama_context::decode`)
//! 1. Pending shifts first: if [`KvCells::has_shift`], [`KvCells::take_shifts`] lists
//!    `(cell, delta)`; re-rotate the cached K of each cell by `delta`. Optionally defragment
//!    ([`KvCells::needs_defrag`], [`KvCells::defrag_plan`], move the K/V rows,
//!    [`KvCells::apply_defrag`]).
//! 2. Split the batch into micro-batches (in batch order, `n_ubatch` tokens each) and call
//!    [`KvCells::prepare`]: all of them find room, or the call fails and nothing changed.
//! 3. For each micro-batch k: [`KvCells::apply_ubatch`]`(&slots[k], ..)`, write the new K/V
//!    rows of token i into cell `slots[k][i]`, take `n_kv = `[`KvCells::n_kv_window`], fill the
//!    mask with [`KvCells::fill_mask`] and attend over cells `0..n_kv`.
//!
//! # Sizes
//! llama.cpp pads the context to a multiple of 256 ([`padded_ctx_size`]): a context created
//! with `n_ctx = 16` has 256 cells. For Gemma 3's interleaved cache create a full cache of
//! `padded_ctx_size(n_ctx)` cells and a sliding one of [`swa_cache_size`] cells built with
//! [`KvCells::with_swa`]; run every placement and sequence operation on both. As
//! `llama_kv_cache_iswa` does: `seq_rm` returns the AND of both, `seq_pos_min/max` come from
//! the sliding cache, and K-shift is possible only when both caches have the same size.
//!
//! # Conventions
//! Ranges are `[p0, p1)` with `p0 < 0` meaning 0 and `p1 < 0` meaning no end. Sequence ids are
//! `0..n_seq_max` (at most [`MAX_SEQ`]); `seq_rm` also takes a negative id for "every
//! sequence". Bad arguments return [`KvError`]; nothing panics.

#![warn(missing_docs)]

mod cells;
mod defrag;
mod error;
mod mask;
mod recurrent;
mod seq_ops;
mod seqset;
mod shift;
mod slots;
mod state;
mod swa;
mod ubatch;

pub use cells::{CellExt, KvCells};
pub use defrag::{DefragMove, DEFRAG_MIN_N_KV};
pub use error::KvError;
pub use mask::{VisibleCells, N_KV_MIN_PAD};
pub use recurrent::{RsCells, RsPlacement, RsSeqGroup};
pub use seqset::SeqSet;
pub use state::{StateMeta, StateRead};
pub use swa::{padded_ctx_size, swa_cache_size, SwaParams, SwaType};
pub use ubatch::UBatchView;

/// A token position.
pub type Pos = i32;

/// A sequence id.
pub type SeqId = i32;

/// Most sequences a cache can track (llama.cpp's `LLAMA_MAX_SEQ`).
pub const MAX_SEQ: u32 = 256;

#[cfg(test)]
mod tests;
