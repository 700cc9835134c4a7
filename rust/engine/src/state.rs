//! Saving and restoring a context: the whole state (cells, K/V, the last outputs), one
//! sequence (into another id, another context), and session files (tokens + state).
//!
//! A blob is parsed and checked completely (magic, version, the model's fingerprint, cache
//! types, every length) before anything is written, so a truncated, foreign or corrupted blob
//! raises `EngineError::State` and leaves the context as it was.

use std::path::Path;

use crate::context::Context;
use crate::kvstore::Part;
use crate::error::{EngineError, Result};
use crate::model::Model;

const STATE_MAGIC: &[u8; 4] = b"FLST";
const SESSION_MAGIC: &[u8; 4] = b"FLSN";
const VERSION: u32 = 1;
const KIND_WHOLE: u8 = 0;
const KIND_SEQ: u8 = 1;
/// A sequence's recurrent states alone (llama.cpp's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY).
const KIND_SEQ_PARTIAL: u8 = 2;

/// A 64-bit fingerprint of what a state depends on: the architecture, sizes and tensor table.
pub fn model_fingerprint(model: &Model) -> u64 {
    let mut h = Fnv::new();
    let hp = &model.hparams;
    h.write(hp.arch.as_bytes());
    for v in [hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v] {
        h.write(&(v as u64).to_le_bytes());
    }
    for t in &model.file.tensors {
        h.write(t.name.as_bytes());
        h.write(&t.ggml_type.id().to_le_bytes());
        for &d in &t.shape {
            h.write(&(d as u64).to_le_bytes());
        }
    }
    h.0
}

struct Fnv(u64);
impl Fnv {
    fn new() -> Fnv { Fnv(0xcbf2_9ce4_8422_2325) }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn bad(msg: impl Into<String>) -> EngineError { EngineError::State(msg.into()) }

/// A bounds-checked reader over a blob.
pub(crate) struct BlobReader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> BlobReader<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.b.len() - self.at {
            return Err(bad(format!("the state is truncated ({what} needs {n} bytes at offset {}, {} left)", self.at, self.b.len() - self.at)));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> { Ok(self.take(1, what)?[0]) }
    fn u32(&mut self, what: &str) -> Result<u32> { Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap())) }
    fn u64(&mut self, what: &str) -> Result<u64> { Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap())) }
    /// A length that sizes `elem` bytes per item: checked against what is left.
    pub(crate) fn len(&mut self, elem: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(elem.max(1) as u64) > left {
            return Err(bad(format!("the state is truncated or corrupt ({what} = {n})")));
        }
        Ok(n as usize)
    }
}

/// What a blob holds for one cache, checked but not yet applied.
struct CacheBlob<'a> {
    meta: &'a [u8],
    /// For each layer of the cache (in order), the K rows then the V rows of every cell.
    rows: &'a [u8],
}

/// What a blob holds for the recurrent states, checked but not yet applied.
struct StatesBlob<'a> {
    /// Per saved cell: its position and sequence ids (none in a one-sequence blob).
    cells: Vec<(i32, Vec<i32>)>,
    /// Each cell's rows, as RsStore::read_cell writes them.
    rows: &'a [u8],
}

impl Context {
    fn header(&self, kind: u8) -> Vec<u8> {
        let mut out = STATE_MAGIC.to_vec();
        out.extend(VERSION.to_le_bytes());
        out.push(kind);
        out.extend(model_fingerprint(&self.model).to_le_bytes());
        out.extend(self.store.type_k.ty.id().to_le_bytes());
        out.extend(self.store.type_v.ty.id().to_le_bytes());
        out.extend((self.caches.len() as u32).to_le_bytes());
        out
    }

    fn read_header(&self, r: &mut BlobReader, kind: u8) -> Result<()> {
        if r.take(4, "magic")? != STATE_MAGIC {
            return Err(bad("not a ferrollama state (wrong magic)"));
        }
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(bad(format!("state version {version} is not supported (this build reads {VERSION})")));
        }
        let k = r.u8("kind")?;
        if k != kind {
            let name = |k| match k {
                KIND_WHOLE => "a whole-context state",
                KIND_SEQ => "a sequence state",
                _ => "a sequence's recurrent states",
            };
            return Err(bad(format!("the blob is {}, expected {}", name(k), name(kind))));
        }
        if r.u64("fingerprint")? != model_fingerprint(&self.model) {
            return Err(bad("the state was saved with another model"));
        }
        let (tk, tv) = (r.u32("type_k")?, r.u32("type_v")?);
        if tk != self.store.type_k.ty.id() || tv != self.store.type_v.ty.id() {
            return Err(bad("the state was saved with other KV cache types"));
        }
        if r.u32("cache count")? as usize != self.caches.len() {
            return Err(bad("the state was saved with another cache layout"));
        }
        Ok(())
    }

    /// Serializes the caches' cells (`seq`: one sequence, or all) and their K/V rows.
    fn write_caches(&mut self, seq: Option<i32>, out: &mut Vec<u8>) -> Result<()> {
        self.apply_pending_shifts();
        for cache in &self.caches {
            let meta = cache.cells.state_write(seq).map_err(|e| bad(e.to_string()))?;
            out.extend((meta.bytes.len() as u64).to_le_bytes());
            out.extend(&meta.bytes);
            let rows_len = meta.cells.len() * self.cache_row_bytes(&cache.layers);
            out.extend((rows_len as u64).to_le_bytes());
            for &il in &cache.layers {
                for part in [Part::K, Part::V] {
                    for &c in &meta.cells {
                        self.store.read_row(part, il, c as usize, out);
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes of one cell's K and V rows over a cache's layers (each layer in its own shape).
    fn cache_row_bytes(&self, layers: &[usize]) -> usize {
        layers.iter().map(|&il| self.store.k_row_bytes(il) + self.store.v_row_bytes(il)).sum()
    }

    fn read_caches<'a>(&self, r: &mut BlobReader<'a>) -> Result<Vec<CacheBlob<'a>>> {
        (0..self.caches.len()).map(|_| {
            let n = r.len(1, "metadata length")?;
            let meta = r.take(n, "cell metadata")?;
            let n = r.len(1, "K/V length")?;
            Ok(CacheBlob { meta, rows: r.take(n, "K/V rows")? })
        }).collect()
    }

    /// Restores cache metadata on copies, checks the K/V sizes, then commits everything.
    fn apply_caches(&mut self, blobs: &[CacheBlob], dst: Option<i32>) -> Result<()> {
        let mut restored = Vec::with_capacity(blobs.len());
        for (cache, blob) in self.caches.iter().zip(blobs) {
            let mut cells = cache.cells.clone();
            if dst.is_none() {
                cells.clear();
            }
            let read = cells.state_read(blob.meta, dst).map_err(|e| bad(e.to_string()))?;
            if read.consumed != blob.meta.len() {
                return Err(bad("the cell metadata has trailing bytes"));
            }
            if blob.rows.len() != read.cells.len() * self.cache_row_bytes(&cache.layers) {
                return Err(bad("the K/V data does not match the cells"));
            }
            restored.push((cells, read.cells));
        }
        for ((cache, blob), (cells, slots)) in self.caches.iter_mut().zip(blobs).zip(restored) {
            cache.cells = cells;
            let mut rows = blob.rows;
            for &il in &cache.layers {
                for (part, n) in [(Part::K, self.store.k_row_bytes(il)), (Part::V, self.store.v_row_bytes(il))] {
                    for &c in &slots {
                        self.store.write_row(part, il, c as usize, &rows[..n]);
                        rows = &rows[n..];
                    }
                }
            }
        }
        Ok(())
    }

    /// Serializes the recurrent state cells (`seq`: the one holding that sequence's state,
    /// or all) and their rows: count, then per cell its position and sequence ids (none for
    /// one sequence), then the rows (nothing for a model without recurrent layers).
    fn write_states(&self, seq: Option<i32>, out: &mut Vec<u8>) {
        let Some(rs) = &self.rs else { return };
        let cells = rs.state_cells(seq);
        out.extend((cells.len() as u64).to_le_bytes());
        for (_, pos, seqs) in &cells {
            out.extend(pos.to_le_bytes());
            out.extend((seqs.len() as u32).to_le_bytes());
            seqs.iter().for_each(|s| out.extend(s.to_le_bytes()));
        }
        out.extend(((cells.len() * self.store.rs.cell_bytes()) as u64).to_le_bytes());
        for (cell, _, _) in &cells {
            self.store.rs.read_cell(*cell as usize, out);
        }
    }

    fn read_states<'a>(&self, r: &mut BlobReader<'a>) -> Result<Option<StatesBlob<'a>>> {
        if self.rs.is_none() {
            return Ok(None);
        }
        let n = r.len(8, "recurrent cell count")?;
        let mut cells = Vec::with_capacity(n);
        for _ in 0..n {
            let pos = r.u32("recurrent cell position")? as i32;
            let k = r.u32("recurrent cell sequence count")? as usize;
            if k > crate::context::MAX_SEQ {
                return Err(bad("the recurrent cell metadata is corrupt"));
            }
            let seqs = (0..k).map(|_| r.u32("sequence id").map(|s| s as i32)).collect::<Result<Vec<_>>>()?;
            cells.push((pos, seqs));
        }
        let len = r.len(1, "recurrent state length")?;
        if len != n * self.store.rs.cell_bytes() {
            return Err(bad("the recurrent state data does not match its cells"));
        }
        Ok(Some(StatesBlob { cells, rows: r.take(len, "recurrent states")? }))
    }

    /// The recurrent cells a blob restores, computed on a copy (nothing changes): the cells
    /// and the cell each saved state goes to.
    fn restore_states(&self, blob: &StatesBlob, dst: Option<i32>) -> Result<(ferrollama_kv::RsCells, Vec<u32>)> {
        let mut cells = self.rs.clone().expect("read_states gave a blob");
        let placed = match dst {
            None => {
                cells.restore_all(&blob.cells).map_err(|e| bad(e.to_string()))?;
                (0..blob.cells.len() as u32).collect()
            }
            Some(dst) => match blob.cells.as_slice() {
                [] => {
                    cells.seq_rm(dst, -1, -1).map_err(|e| bad(e.to_string()))?;
                    Vec::new()
                }
                [(pos, seqs)] if seqs.is_empty() => vec![cells.restore_seq(dst, *pos).map_err(|e| bad(e.to_string()))?],
                _ => return Err(bad("a sequence state holds one recurrent cell")),
            },
        };
        Ok((cells, placed))
    }

    fn commit_states(&mut self, blob: &StatesBlob, cells: ferrollama_kv::RsCells, placed: &[u32]) {
        let per_cell = self.store.rs.cell_bytes();
        for (k, &cell) in placed.iter().enumerate() {
            self.store.rs.write_cell(cell as usize, &blob.rows[k * per_cell..(k + 1) * per_cell]);
        }
        self.rs = Some(cells);
    }

    /// The whole context: every cache and the outputs of the last decode.
    pub fn state_get(&mut self) -> Result<Vec<u8>> {
        let mut out = self.header(KIND_WHOLE);
        self.write_outputs(&mut out);
        self.write_caches(None, &mut out)?;
        self.write_states(None, &mut out);
        Ok(out)
    }

    pub fn state_set(&mut self, blob: &[u8]) -> Result<()> {
        let mut r = BlobReader { b: blob, at: 0 };
        self.read_header(&mut r, KIND_WHOLE)?;
        let outputs = self.read_outputs(&mut r)?;
        let caches = self.read_caches(&mut r)?;
        let states = self.read_states(&mut r)?;
        if r.at != blob.len() {
            return Err(bad("the state has trailing bytes"));
        }
        let restored = states.as_ref().map(|s| self.restore_states(s, None)).transpose()?;
        self.apply_caches(&caches, None)?;
        if let (Some(s), Some((cells, placed))) = (&states, restored) {
            self.store.rs.clear();
            self.commit_states(s, cells, &placed);
        }
        self.set_outputs(outputs);
        Ok(())
    }

    /// One sequence's cells and K/V, restorable under another id or in another context.
    pub fn seq_state_get(&mut self, seq: i32) -> Result<Vec<u8>> {
        let mut out = self.header(KIND_SEQ);
        self.write_caches(Some(seq), &mut out)?;
        self.write_states(Some(seq), &mut out);
        Ok(out)
    }

    /// One sequence's recurrent states alone (a hybrid model's KV cells stay where they are:
    /// restoring a checkpoint of the states, then seq_rm of the positions after it, rewinds
    /// the sequence; llama.cpp's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY).
    pub fn seq_state_get_partial(&mut self, seq: i32) -> Result<Vec<u8>> {
        if self.rs.is_none() {
            return Err(EngineError::InvalidArgument("the model has no recurrent states (partial states are of recurrent models)".into()));
        }
        let mut out = self.header(KIND_SEQ_PARTIAL);
        self.write_states(Some(seq), &mut out);
        Ok(out)
    }

    /// Restores a seq_state_get_partial blob as `dst`'s recurrent states.
    pub fn seq_state_set_partial(&mut self, blob: &[u8], dst: i32) -> Result<()> {
        if dst < 0 || dst as usize >= self.params.n_seq_max {
            return Err(EngineError::InvalidArgument(format!("sequence id {dst} is out of range (n_seq_max = {})", self.params.n_seq_max)));
        }
        let mut r = BlobReader { b: blob, at: 0 };
        self.read_header(&mut r, KIND_SEQ_PARTIAL)?;
        let states = self.read_states(&mut r)?.ok_or_else(|| bad("the model has no recurrent states"))?;
        if r.at != blob.len() {
            return Err(bad("the state has trailing bytes"));
        }
        let (cells, placed) = self.restore_states(&states, Some(dst))?;
        self.commit_states(&states, cells, &placed);
        Ok(())
    }

    pub fn seq_state_set(&mut self, blob: &[u8], dst: i32) -> Result<()> {
        if dst < 0 || dst as usize >= self.params.n_seq_max {
            return Err(EngineError::InvalidArgument(format!("sequence id {dst} is out of range (n_seq_max = {})", self.params.n_seq_max)));
        }
        let mut r = BlobReader { b: blob, at: 0 };
        self.read_header(&mut r, KIND_SEQ)?;
        let caches = self.read_caches(&mut r)?;
        let states = self.read_states(&mut r)?;
        if r.at != blob.len() {
            return Err(bad("the state has trailing bytes"));
        }
        let restored = states.as_ref().map(|s| self.restore_states(s, Some(dst))).transpose()?;
        self.apply_caches(&caches, Some(dst))?;
        if let (Some(s), Some((cells, placed))) = (&states, restored) {
            self.commit_states(s, cells, &placed);
        }
        Ok(())
    }

    /// Writes a session file: the tokens the cache holds and the whole state.
    pub fn state_save(&mut self, path: &Path, tokens: &[u32]) -> Result<()> {
        let mut out = SESSION_MAGIC.to_vec();
        out.extend(VERSION.to_le_bytes());
        out.extend((tokens.len() as u64).to_le_bytes());
        for t in tokens {
            out.extend(t.to_le_bytes());
        }
        out.extend(self.state_get()?);
        let tmp = path.with_extension("partial");
        std::fs::write(&tmp, &out).and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))
    }

    /// Reads a session file, restores its state and returns its tokens.
    pub fn state_load(&mut self, path: &Path) -> Result<Vec<u32>> {
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
        let mut r = BlobReader { b: &bytes, at: 0 };
        if r.take(4, "magic").map_err(|_| bad("not a ferrollama session file"))? != SESSION_MAGIC {
            return Err(bad(format!("{} is not a ferrollama session file", path.display())));
        }
        let version = r.u32("version")?;
        if version != VERSION {
            return Err(bad(format!("session version {version} is not supported (this build reads {VERSION})")));
        }
        let n = r.len(4, "token count")?;
        let raw = r.take(n * 4, "tokens")?;
        let tokens: Vec<u32> = raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let n_vocab = self.model.hparams.n_vocab as u32;
        if tokens.iter().any(|&t| t >= n_vocab) {
            return Err(bad("the session holds tokens outside the vocabulary"));
        }
        self.state_set(&bytes[r.at..])?;
        Ok(tokens)
    }
}
