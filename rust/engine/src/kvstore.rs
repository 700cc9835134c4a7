//! K and V storage of the cache: for each layer, one row per cell and KV head, in the cache
//! type (`CACHE_TYPES`). Which cell holds what is the kv crate's business; this file only
//! stores, reads, re-rotates (K-shift) and moves rows.
//!
//! Layout, chosen for the attention kernel, which reads one KV head's rows per task:
//! - head-major: each KV head's rows are one block, so a task streams dense memory (rows of
//!   all heads interleaved would have each thread read every other line, which the hardware
//!   prefetchers follow poorly);
//! - K rows in cell order; V rows set-major (`attn::v_row`): the weighted sum adds cell j
//!   into accumulator set j % 64, and with this layout each set's walk over its cells reads
//!   consecutive rows instead of rows 64 cells apart.
//!
//! A cell's whole row (every head, as llama.cpp stores it) is what the session files hold:
//! `read_row` and `write_row` gather and scatter it.
//!
//! A latent cache (multi-head latent attention, `KvStore::latent`) keeps one K row per cell
//! and no V: each cell's value is the leading `head_dim_v` values of its key (the compressed
//! latent), read in place, as llama.cpp views V in K for these models. Its flags are the
//! store's (every layer of such a model is latent); the row shapes stay per layer.

use std::ops::Range;

use ferrollama_tensor::attn::{v_cols, v_row, V_SETS};
use ferrollama_tensor::{traits, GgmlType, TypeTraits};

use crate::error::{EngineError, Result};
use crate::ops::{hadamard_blocks, rope_apply, RopeParams};

/// The cache element types a user may choose: llama.cpp's (`-ctk`/`-ctv`), by name.
pub const CACHE_TYPES: [(&str, GgmlType); 9] = [
    ("f32", GgmlType::F32), ("f16", GgmlType::F16), ("bf16", GgmlType::BF16), ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0), ("q4_1", GgmlType::Q4_1), ("iq4_nl", GgmlType::IQ4_NL), ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
];

/// The cache element type of a name (CACHE_TYPES).
pub fn parse_cache_type(name: &str) -> Result<GgmlType> {
    let lower = name.to_ascii_lowercase();
    CACHE_TYPES.iter().find(|(n, _)| *n == lower).map(|&(_, t)| t).ok_or_else(|| {
        let names: Vec<&str> = CACHE_TYPES.iter().map(|(n, _)| *n).collect();
        EngineError::InvalidArgument(format!("cache type '{lower}' is not one of {}", names.join(", ")))
    })
}

pub struct LayerKv {
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    /// Cells of the layer.
    pub cells: usize,
    /// Rows per V set: cell j's V row is row `v_row(j, v_cols)` of its head's block.
    pub v_cols: usize,
    /// The layer's KV heads and head sizes (Gemma 4's sliding and full layers differ).
    pub geom: KvGeom,
}

/// The shape of one layer's cache rows: KV heads and the per-head sizes of K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeom {
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// The cells and row shape a layer's storage is sized for.
#[derive(Clone, Copy, Debug)]
pub struct LayerShape {
    pub cells: usize,
    pub geom: KvGeom,
}

impl LayerKv {
    /// Rows in each head's V block.
    fn v_rows(&self) -> usize {
        V_SETS * self.v_cols
    }
}

/// K or V.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Part {
    K,
    V,
}

pub struct KvStore {
    pub type_k: &'static TypeTraits,
    pub type_v: &'static TypeTraits,
    /// Values of each key head before its rotated part, which the K-shift rotates (DeepSeek's
    /// keys end with their RoPE part: llama.cpp's n_embd_nope); 0 for the others.
    pub rope_offset: usize,
    /// A latent cache: V is the leading head_dim_v values of each K row, nothing is stored
    /// for it (v_row_bytes is 0).
    pub v_in_k: bool,
    pub layers: Vec<LayerKv>,
    /// The recurrent layers' per-sequence states (none for an attention-only model).
    pub rs: crate::recurrent::RsStore,
    /// llama.cpp's attention rotation of a quantized cache (`rotation_block`): the order of
    /// the Hadamard blocks K and the queries are rotated by, and V and the attention's output;
    /// 0: none.
    pub rot_k: usize,
    pub rot_v: usize,
    /// A row being rotated before it is stored.
    rot_row: Vec<f32>,
}

/// The order of the Walsh-Hadamard blocks llama.cpp (llama_kv_cache: attn_rot_k, attn_rot_v)
/// multiplies a quantized cache's rows by before storing them, so that block quantization
/// spreads an outlier's error over the block instead of losing the small values beside it:
/// for the layers' one head size `dims` (every cached layer's; none if they differ) when it is
/// a multiple of 64, the largest power of two dividing it (K, whose queries are rotated alike)
/// or 64 (V, whose attention output is rotated back); 0 for a float cache type.
fn rotation_block(t: &TypeTraits, mut dims: impl Iterator<Item = usize>, largest: bool) -> usize {
    let Some(first) = dims.next() else { return 0 };
    if t.block_size == 1 || first % 64 != 0 || dims.any(|d| d != first) {
        return 0;
    }
    if largest { 1 << first.trailing_zeros() } else { 64 }
}

/// dst = `from`(src), src first rotated by Hadamard blocks of order `rot` (0: as it is) in
/// `scratch`.
fn store_row(from: fn(&[f32], &mut [u8]), src: &[f32], rot: usize, scratch: &mut Vec<f32>, dst: &mut [u8]) {
    if rot == 0 {
        return from(src, dst);
    }
    scratch.clear();
    scratch.extend_from_slice(src);
    hadamard_blocks(scratch, rot);
    from(scratch, dst);
}

impl KvStore {
    /// Storage for each layer's cells in its own row shape (an interleaved model's sliding
    /// layers have a smaller cache than its global ones, Gemma 4's other head sizes too; a
    /// layer of no cells stores nothing).
    pub fn new(type_k: GgmlType, type_v: GgmlType, shapes: &[LayerShape]) -> Result<KvStore> {
        let tk = traits(type_k).ok_or_else(|| EngineError::Unsupported(format!("cache type {type_k}")))?;
        let tv = traits(type_v).ok_or_else(|| EngineError::Unsupported(format!("cache type {type_v}")))?;
        for sh in shapes.iter().filter(|sh| sh.cells > 0) {
            for (t, hd) in [(tk, sh.geom.head_dim_k), (tv, sh.geom.head_dim_v)] {
                if hd % t.block_size != 0 {
                    return Err(EngineError::Unsupported(format!("cache type {} needs a head size multiple of {}, not {hd}", t.ty, t.block_size)));
                }
            }
        }
        let layers = shapes.iter()
            .map(|&LayerShape { cells, geom }| {
                let v_cols = v_cols(cells);
                let (k_row, v_row) = (geom.n_head_kv * geom.head_dim_k, geom.n_head_kv * geom.head_dim_v);
                LayerKv { k: vec![0; tk.row_bytes(k_row) * cells], v: vec![0; tv.row_bytes(v_row) * V_SETS * v_cols], cells, v_cols, geom }
            })
            .collect();
        let cached = || shapes.iter().filter(|sh| sh.cells > 0).map(|sh| sh.geom);
        let (rot_k, rot_v) = (rotation_block(tk, cached().map(|g| g.head_dim_k), true), rotation_block(tv, cached().map(|g| g.head_dim_v), false));
        Ok(KvStore { type_k: tk, type_v: tv, rope_offset: 0, v_in_k: false, layers, rs: Default::default(), rot_k, rot_v, rot_row: Vec::new() })
    }

    /// A latent cache (see the module documentation): one K head of head_dim_k values per
    /// cell (the latent, then the `rope_offset`.. rotated part), whose leading head_dim_v
    /// values are the cell's value; the V cache type does not apply.
    pub fn latent(type_k: GgmlType, cells_per_layer: &[usize], head_dim_k: usize, head_dim_v: usize, rope_offset: usize)
                  -> Result<KvStore> {
        if head_dim_v > head_dim_k || rope_offset > head_dim_k {
            return Err(EngineError::Unsupported(format!(
                "a latent cache of keys of {head_dim_k} values with values of {head_dim_v} and a rotated part from {rope_offset}")));
        }
        let geom = KvGeom { n_head_kv: 1, head_dim_k, head_dim_v };
        // one cell checks both head sizes against the cache type's blocks
        let mut store = KvStore::new(type_k, type_k, &[LayerShape { cells: 1, geom }])?;
        if store.rot_k > 0 {
            // llama.cpp rotates such a cache's latent keys, which are also its values, and never
            // rotates the values' output back: refused rather than copied.
            return Err(EngineError::Unsupported(format!(
                "cache type {} with latent attention (llama.cpp rotates the latent cache it quantizes; use f16, bf16 or f32)",
                store.type_k.ty)));
        }
        store.layers = cells_per_layer.iter()
            .map(|&cells| LayerKv { k: vec![0; store.type_k.row_bytes(head_dim_k) * cells], v: Vec::new(), cells, v_cols: 0, geom })
            .collect();
        (store.rope_offset, store.v_in_k) = (rope_offset, true);
        Ok(store)
    }

    /// Layer `layer`'s V storage as the kernels read it: the bytes, the distance between
    /// rows, where KV head h's block starts, and the rows per set (0: rows in cell order).
    pub fn v_view<'a>(&self, layer: &'a LayerKv, h: usize) -> (&'a [u8], usize, usize, usize) {
        if self.v_in_k {
            (&layer.k, self.k_head_bytes(layer), self.k_block(layer, h), 0)
        } else {
            (&layer.v, self.v_head_bytes(layer), self.v_block(layer, h), layer.v_cols)
        }
    }

    /// Bytes of one cell's whole row (every KV head) in layer il.
    pub fn k_row_bytes(&self, il: usize) -> usize { let g = self.layers[il].geom; self.type_k.row_bytes(g.n_head_kv * g.head_dim_k) }
    /// (0 for a latent cache, which stores no V.)
    pub fn v_row_bytes(&self, il: usize) -> usize {
        if self.v_in_k {
            return 0;
        }
        let g = self.layers[il].geom;
        self.type_v.row_bytes(g.n_head_kv * g.head_dim_v)
    }
    /// Bytes of one head's row in `layer`.
    pub fn k_head_bytes(&self, layer: &LayerKv) -> usize { self.type_k.row_bytes(layer.geom.head_dim_k) }
    pub fn v_head_bytes(&self, layer: &LayerKv) -> usize { self.type_v.row_bytes(layer.geom.head_dim_v) }
    pub fn bytes(&self) -> usize { self.layers.iter().map(|l| l.k.len() + l.v.len()).sum::<usize>() + self.rs.bytes() }

    /// Where KV head h's block starts in `layer.k` / `layer.v`.
    pub fn k_block(&self, layer: &LayerKv, h: usize) -> usize { h * layer.cells * self.k_head_bytes(layer) }
    pub fn v_block(&self, layer: &LayerKv, h: usize) -> usize { h * layer.v_rows() * self.v_head_bytes(layer) }

    /// Where head h of `cell`'s row is, in `layer.k` or `layer.v` (in `layer.k` for the V
    /// of a latent cache).
    pub fn at(&self, part: Part, layer: &LayerKv, cell: usize, h: usize) -> Range<usize> {
        let (start, hb) = match part {
            Part::K => (self.k_block(layer, h) + cell * self.k_head_bytes(layer), self.k_head_bytes(layer)),
            Part::V if self.v_in_k => (self.k_block(layer, h) + cell * self.k_head_bytes(layer), self.v_head_bytes(layer)),
            Part::V => (self.v_block(layer, h) + v_row(cell, layer.v_cols) * self.v_head_bytes(layer), self.v_head_bytes(layer)),
        };
        start..start + hb
    }

    /// Stores one token's K and V rows (f32) into `cell` of `layer` (a latent cache stores
    /// K only: `v` is not read).
    pub fn write(&mut self, layer: usize, cell: usize, k: &[f32], v: &[f32]) {
        let (from_k, from_v) = (self.type_k.from_f32.expect("cache types quantize"), self.type_v.from_f32.expect("cache types quantize"));
        let g = self.layers[layer].geom;
        for h in 0..g.n_head_kv {
            let kr = self.at(Part::K, &self.layers[layer], cell, h);
            store_row(from_k, &k[h * g.head_dim_k..(h + 1) * g.head_dim_k], self.rot_k, &mut self.rot_row, &mut self.layers[layer].k[kr]);
            if !self.v_in_k {
                let vr = self.at(Part::V, &self.layers[layer], cell, h);
                store_row(from_v, &v[h * g.head_dim_v..(h + 1) * g.head_dim_v], self.rot_v, &mut self.rot_row,
                          &mut self.layers[layer].v[vr]);
            }
        }
    }

    /// The bytes of KV head `h` of the K row of `cell`.
    pub fn k_head<'a>(&self, layer: &'a LayerKv, cell: usize, h: usize) -> &'a [u8] {
        &layer.k[self.at(Part::K, layer, cell, h)]
    }
    pub fn v_head<'a>(&self, layer: &'a LayerKv, cell: usize, h: usize) -> &'a [u8] {
        let data = if self.v_in_k { &layer.k } else { &layer.v };
        &data[self.at(Part::V, layer, cell, h)]
    }

    /// Appends the whole K or V row of `cell` (every head, in head order) to `out` (nothing
    /// for the V of a latent cache, which has none of its own).
    pub fn read_row(&self, part: Part, layer: usize, cell: usize, out: &mut Vec<u8>) {
        if part == Part::V && self.v_in_k {
            return;
        }
        let l = &self.layers[layer];
        let data = if part == Part::K { &l.k } else { &l.v };
        for h in 0..l.geom.n_head_kv {
            out.extend_from_slice(&data[self.at(part, l, cell, h)]);
        }
    }

    /// Stores a whole K or V row of `cell` (as `read_row` gives it).
    pub fn write_row(&mut self, part: Part, layer: usize, cell: usize, row: &[u8]) {
        if part == Part::V && self.v_in_k {
            return;
        }
        let l = &self.layers[layer];
        let hb = if part == Part::K { self.k_head_bytes(l) } else { self.v_head_bytes(l) };
        for h in 0..l.geom.n_head_kv {
            let at = self.at(part, &self.layers[layer], cell, h);
            let l = &mut self.layers[layer];
            let data = if part == Part::K { &mut l.k } else { &mut l.v };
            data[at].copy_from_slice(&row[h * hb..(h + 1) * hb]);
        }
    }

    /// Re-rotates the keys of `cell` by `delta` positions in the given layers (the K-shift),
    /// with `rope_for_layer` giving each layer's RoPE parameters and frequency factors.
    pub fn shift_cell<'f>(&mut self, cell: usize, delta: i32, layers: &[usize],
                          rope_for_layer: impl Fn(usize) -> (RopeParams, Option<&'f [f32]>), scratch: &mut Vec<f32>) {
        let (to_f32, from_f32) = (self.type_k.to_f32, self.type_k.from_f32.expect("cache types quantize"));
        let mut cache = Vec::new();
        for &il in layers {
            let (rope, factors) = rope_for_layer(il);
            let g = self.layers[il].geom;
            scratch.resize(g.head_dim_k, 0.0);
            cache.resize(rope.n_dims, 0.0);
            rope.fill_cache(delta as f32, factors, &mut cache);
            for h in 0..g.n_head_kv {
                let at = self.at(Part::K, &self.layers[il], cell, h);
                let row = &mut self.layers[il].k[at];
                to_f32(row, scratch);
                // a rotated cache's keys are rotated back for RoPE, then again (llama.cpp's build_rope_shift)
                if self.rot_k > 0 {
                    hadamard_blocks(scratch, self.rot_k);
                }
                rope_apply(&mut scratch[self.rope_offset..], &cache, &rope);
                if self.rot_k > 0 {
                    hadamard_blocks(scratch, self.rot_k);
                }
                from_f32(scratch, row);
            }
        }
    }

    /// Copies the rows of cell `src` to cell `dst` in the given layers (defragmentation).
    pub fn move_cell(&mut self, src: usize, dst: usize, layers: &[usize]) {
        for &il in layers {
            for h in 0..self.layers[il].geom.n_head_kv {
                let l = &self.layers[il];
                let (ks, kd) = (self.at(Part::K, l, src, h), self.at(Part::K, l, dst, h).start);
                let (vs, vd) = (self.at(Part::V, l, src, h), self.at(Part::V, l, dst, h).start);
                let l = &mut self.layers[il];
                l.k.copy_within(ks, kd);
                if !self.v_in_k {
                    l.v.copy_within(vs, vd);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::RopeParams;

    fn latent() -> KvStore {
        // keys of 6 values: a latent of 4 (the value), then 2 rotated
        KvStore::latent(GgmlType::F32, &[8], 6, 4, 4).expect("a latent store")
    }

    #[test]
    fn a_latent_cache_reads_its_values_in_its_keys_and_stores_no_v() {
        let mut kv = latent();
        let k: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        kv.write(0, 3, &k, &[]);
        let layer = &kv.layers[0];
        assert!(layer.v.is_empty() && kv.v_row_bytes(0) == 0);
        let v: Vec<f32> = kv.v_head(layer, 3, 0).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(v, [1.0, 2.0, 3.0, 4.0]);
        let (data, stride, offset, cols) = kv.v_view(layer, 0);
        assert_eq!((data.len(), stride, offset, cols), (8 * 24, 24, 0, 0));
        let (mut k_row, mut v_row) = (Vec::new(), Vec::new());
        kv.read_row(Part::K, 0, 3, &mut k_row);
        kv.read_row(Part::V, 0, 3, &mut v_row);
        assert_eq!((k_row.len(), v_row.len()), (24, 0));
        assert_eq!(kv.bytes(), 8 * 24);
    }

    #[test]
    fn the_k_shift_rotates_only_the_rope_part_of_a_latent_key() {
        let mut kv = latent();
        kv.write(0, 0, &[1.0, 2.0, 3.0, 4.0, 1.0, 0.0], &[]);
        let rope = RopeParams { n_dims: 2, neox: false, freq_base: 10000.0, freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0,
                                beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 };
        let mut scratch = Vec::new();
        kv.shift_cell(0, 1, &[0], |_| (rope, None), &mut scratch);
        let k: Vec<f32> = kv.k_head(&kv.layers[0], 0, 0).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(&k[..4], &[1.0, 2.0, 3.0, 4.0]);
        assert!((k[4] - 1f32.cos()).abs() < 1e-6 && (k[5] - 1f32.sin()).abs() < 1e-6, "{k:?}");
    }

    #[test]
    fn layers_of_different_row_shapes_keep_their_own_rows() {
        let g = |hd| KvGeom { n_head_kv: 2, head_dim_k: hd, head_dim_v: hd };
        let shapes = [LayerShape { cells: 4, geom: g(64) }, LayerShape { cells: 8, geom: g(128) }, LayerShape { cells: 0, geom: g(128) }];
        let mut kv = KvStore::new(GgmlType::F32, GgmlType::F32, &shapes).unwrap();
        assert!(kv.layers[2].k.is_empty() && kv.layers[2].v.is_empty(), "a layer of no cells stores nothing");
        let row = |n: usize, base: f32| (0..n).map(|i| base + i as f32).collect::<Vec<f32>>();
        kv.write(0, 3, &row(128, 0.0), &row(128, 1000.0));
        kv.write(1, 7, &row(256, 0.0), &row(256, 2000.0));
        assert_eq!((kv.k_row_bytes(0), kv.v_row_bytes(1)), (128 * 4, 256 * 4));
        for (il, cell, n, vbase) in [(0, 3, 128, 1000.0), (1, 7, 256, 2000.0)] {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            kv.read_row(Part::K, il, cell, &mut k);
            kv.read_row(Part::V, il, cell, &mut v);
            let f = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<f32>>();
            assert_eq!(f(&k), row(n, 0.0));
            assert_eq!(f(&v), row(n, vbase));
        }
    }
}
