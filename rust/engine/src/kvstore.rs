//! K and V storage of the cache: for each layer, one row per cell, in the cache type
//! (f32, f16 or q8_0). Which cell holds what is the kv crate's business; this file only
//! stores, reads, re-rotates (K-shift) and moves rows.
//!
//! K rows are in cell order. V rows are set-major (`attn::v_row`): the weighted sum adds
//! cell j into accumulator set j % 64, and with this layout each set's walk over its cells
//! reads consecutive rows instead of rows 64 cells apart.

use std::ops::Range;

use ferrollama_tensor::attn::{v_cols, v_row};
use ferrollama_tensor::{traits, GgmlType, TypeTraits};

use crate::error::{EngineError, Result};
use crate::ops::{rope_apply, RopeParams};

/// Cache element types a user may choose.
pub fn parse_cache_type(name: &str) -> Result<GgmlType> {
    match name.to_ascii_lowercase().as_str() {
        "f32" => Ok(GgmlType::F32),
        "f16" => Ok(GgmlType::F16),
        "q8_0" => Ok(GgmlType::Q8_0),
        other => Err(EngineError::InvalidArgument(format!("cache type '{other}' is not one of f32, f16, q8_0"))),
    }
}

pub struct LayerKv {
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    /// Rows per V set: cell j's V row is row `v_row(j, v_cols)`.
    pub v_cols: usize,
}

pub struct KvStore {
    pub type_k: &'static TypeTraits,
    pub type_v: &'static TypeTraits,
    /// Elements per cell row: n_head_kv × head size.
    pub k_row: usize,
    pub v_row: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub layers: Vec<LayerKv>,
}

impl KvStore {
    /// Storage for `cells_per_layer[il]` cells in each layer (an interleaved model's sliding
    /// layers have a smaller cache than its global ones).
    pub fn new(type_k: GgmlType, type_v: GgmlType, cells_per_layer: &[usize],
               n_head_kv: usize, head_dim_k: usize, head_dim_v: usize) -> Result<KvStore> {
        let tk = traits(type_k).ok_or_else(|| EngineError::Unsupported(format!("cache type {type_k}")))?;
        let tv = traits(type_v).ok_or_else(|| EngineError::Unsupported(format!("cache type {type_v}")))?;
        for (t, hd) in [(tk, head_dim_k), (tv, head_dim_v)] {
            if hd % t.block_size != 0 {
                return Err(EngineError::Unsupported(format!("cache type {} needs a head size multiple of {}, not {hd}", t.ty, t.block_size)));
            }
        }
        let (k_row, v_row) = (n_head_kv * head_dim_k, n_head_kv * head_dim_v);
        let layers = cells_per_layer.iter()
            .map(|&n| {
                let v_cols = v_cols(n);
                LayerKv { k: vec![0; tk.row_bytes(k_row) * n], v: vec![0; tv.row_bytes(v_row) * v_cols * ferrollama_tensor::attn::V_SETS], v_cols }
            })
            .collect();
        Ok(KvStore { type_k: tk, type_v: tv, k_row, v_row, head_dim_k, head_dim_v, layers })
    }

    pub fn k_row_bytes(&self) -> usize { self.type_k.row_bytes(self.k_row) }
    pub fn v_row_bytes(&self) -> usize { self.type_v.row_bytes(self.v_row) }
    pub fn bytes(&self) -> usize { self.layers.iter().map(|l| l.k.len() + l.v.len()).sum() }

    /// Stores one token's K and V rows (f32) into `cell` of `layer`.
    pub fn write(&mut self, layer: usize, cell: usize, k: &[f32], v: &[f32]) {
        let kb = self.k_row_bytes();
        let (from_k, from_v) = (self.type_k.from_f32.expect("cache types quantize"), self.type_v.from_f32.expect("cache types quantize"));
        let vr = self.v_bytes(&self.layers[layer], cell);
        let l = &mut self.layers[layer];
        from_k(k, &mut l.k[cell * kb..(cell + 1) * kb]);
        from_v(v, &mut l.v[vr]);
    }

    /// Where the V row of `cell` is in `layer.v`.
    pub fn v_bytes(&self, layer: &LayerKv, cell: usize) -> Range<usize> {
        let vb = self.v_row_bytes();
        let row = v_row(cell, layer.v_cols);
        row * vb..(row + 1) * vb
    }

    /// The bytes of KV head `h` of the K row of `cell`.
    pub fn k_head<'a>(&self, layer: &'a LayerKv, cell: usize, h: usize) -> &'a [u8] {
        let hb = self.type_k.row_bytes(self.head_dim_k);
        let start = cell * self.k_row_bytes() + h * hb;
        &layer.k[start..start + hb]
    }
    pub fn v_head<'a>(&self, layer: &'a LayerKv, cell: usize, h: usize) -> &'a [u8] {
        let hb = self.type_v.row_bytes(self.head_dim_v);
        let start = self.v_bytes(layer, cell).start + h * hb;
        &layer.v[start..start + hb]
    }

    /// Re-rotates the keys of `cell` by `delta` positions in the given layers (the K-shift),
    /// with `rope_for_layer` giving each layer's RoPE parameters.
    pub fn shift_cell(&mut self, cell: usize, delta: i32, layers: &[usize], rope_for_layer: impl Fn(usize) -> RopeParams,
                      scratch: &mut Vec<f32>) {
        let kb = self.k_row_bytes();
        let (to_f32, from_f32) = (self.type_k.to_f32, self.type_k.from_f32.expect("cache types quantize"));
        let mut cache = Vec::new();
        scratch.resize(self.k_row, 0.0);
        for &il in layers {
            let layer = &mut self.layers[il];
            let rope = rope_for_layer(il);
            cache.resize(rope.n_dims, 0.0);
            rope.fill_cache(delta as f32, &mut cache);
            let row = &mut layer.k[cell * kb..(cell + 1) * kb];
            to_f32(row, scratch);
            for head in scratch.chunks_exact_mut(self.head_dim_k) {
                rope_apply(head, &cache, &rope);
            }
            from_f32(scratch, row);
        }
    }

    /// Copies the rows of cell `src` to cell `dst` in the given layers (defragmentation).
    pub fn move_cell(&mut self, src: usize, dst: usize, layers: &[usize]) {
        let kb = self.k_row_bytes();
        for &il in layers {
            let (v_src, v_dst) = (self.v_bytes(&self.layers[il], src), self.v_bytes(&self.layers[il], dst).start);
            let l = &mut self.layers[il];
            l.k.copy_within(src * kb..(src + 1) * kb, dst * kb);
            l.v.copy_within(v_src, v_dst);
        }
    }
}
