//! The GGUF file format: header, metadata, tensor table and the memory map of tensor data.
//!
//! Parsing is strict and bounded: every count and length read from the file is checked
//! against the bytes that remain before it sizes an allocation, and every tensor's data
//! must lie inside the file. Tensor data is never copied: `tensor_data` returns a view.

mod pieces;
mod reader;
mod strings;
mod types;
mod value;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use pieces::PIECES_HEADER;
pub use types::GgmlType;
pub use strings::Strings;
pub use value::{Array, Value};

use reader::Reader;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

/// A malformed or unreadable file: which file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct GgufError {
    pub path: String,
    pub message: String,
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ne[0] (the row length) first, as stored.
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: usize,
    pub nbytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> usize { self.shape.iter().product() }
    /// Number of rows (every dimension but the first).
    pub fn n_rows(&self) -> usize { self.shape.iter().skip(1).product() }
    pub fn row_len(&self) -> usize { self.shape.first().copied().unwrap_or(1) }
}

/// The bytes of the file: mapped, or read into memory when mapping is not wanted.
enum Storage {
    Mapped(memmap2::Mmap),
    /// The pieces of a file, mapped side by side (pieces.rs).
    #[cfg(unix)]
    Pieces(pieces::PieceMap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            #[cfg(unix)]
            Storage::Pieces(m) => m.bytes(),
            Storage::Owned(v) => v,
        }
    }

    /// The pieces a list names: mapped when they can be, else read into memory.
    fn of_pieces(list: &Path, use_mmap: bool) -> Result<Storage, String> {
        let pieces = pieces::read_list(list)?;
        #[cfg(unix)]
        if use_mmap {
            if let Some(map) = pieces::PieceMap::map(&pieces)? {
                return Ok(Storage::Pieces(map));
            }
        }
        let _ = use_mmap;
        pieces::read_all(&pieces).map(Storage::Owned)
    }
}

/// Whether a file starts as a list of pieces does (read apart: the caller's file stays at 0).
fn starts_as_pieces_list(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; PIECES_HEADER.len()];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && pieces::is_pieces_list(&head)
}

/// A parsed GGUF file.
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub alignment: usize,
    /// Offset of the data section from the start of the file.
    pub data_offset: usize,
}

impl GgufFile {
    /// Opens and parses a file; `use_mmap = false` reads it into memory instead. The file may be
    /// a list of the pieces of a GGUF file (see pieces.rs): the pieces are read as one file.
    pub fn open(path: impl AsRef<Path>, use_mmap: bool) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let err = |message: String| GgufError { path: path.display().to_string(), message };
        let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        let storage = if starts_as_pieces_list(path) {
            Storage::of_pieces(path, use_mmap).map_err(err)?
        } else if use_mmap {
            // SAFETY: the map is read-only; a file changed underneath us by another process
            // is outside what any mmap-based loader (llama.cpp included) can defend against.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
            Storage::Mapped(map)
        } else {
            let mut bytes = Vec::new();
            use std::io::Read;
            (&file).read_to_end(&mut bytes).map_err(|e| err(format!("cannot read: {e}")))?;
            Storage::Owned(bytes)
        };
        Self::parse(path.to_path_buf(), storage)
    }

    /// Parses a file held in memory (tests, fuzzing).
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(name.into(), Storage::Owned(bytes))
    }

    fn parse(path: PathBuf, storage: Storage) -> Result<GgufFile, GgufError> {
        let header = parse_header(storage.bytes())
            .map_err(|message| GgufError { path: path.display().to_string(), message })?;
        let index = header.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let file = GgufFile {
            path,
            storage,
            version: header.version,
            metadata: header.metadata,
            index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        };
        // Everything before the tensor data was copied out by the parse: a vocabulary of
        // 262 144 tokens makes that 6 MiB of the process's memory otherwise.
        file.release(0, file.data_offset);
        Ok(file)
    }

    pub fn path(&self) -> &Path { &self.path }
    /// The whole file.
    pub fn bytes(&self) -> &[u8] { self.storage.bytes() }

    /// Lets the kernel take back the pages of bytes start..start + len (of a mapped file;
    /// nothing for a file read into memory). The bytes stay readable: a page touched again
    /// is read back from the file. For data the caller has copied (repacked weights), so
    /// that the process does not hold it twice.
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let Storage::Pieces(m) = &self.storage {
            m.release(start, len);
        }
        if let Storage::Mapped(m) = &self.storage {
            if start.checked_add(len).is_some_and(|end| end <= m.len()) {
                // SAFETY: the map is a read-only private mapping of a file, never written:
                // a dropped page is reloaded from the file with the same contents.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
            }
        }
    }
    pub fn is_mapped(&self) -> bool {
        match self.storage {
            Storage::Mapped(_) => true,
            #[cfg(unix)]
            Storage::Pieces(_) => true,
            Storage::Owned(_) => false,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> { self.index.get(key).map(|&i| &self.metadata[i].1) }
    pub fn get_str(&self, key: &str) -> Option<&str> { self.get(key).and_then(Value::as_str) }
    pub fn get_u64(&self, key: &str) -> Option<u64> { self.get(key).and_then(Value::as_u64) }
    pub fn get_f64(&self, key: &str) -> Option<f64> { self.get(key).and_then(Value::as_f64) }
    pub fn get_bool(&self, key: &str) -> Option<bool> { self.get(key).and_then(Value::as_bool) }
    pub fn get_array(&self, key: &str) -> Option<&Array> { self.get(key).and_then(Value::as_array) }

    /// Replaces (or adds) a metadata value: llama.cpp's kv_overrides. An override must be of
    /// the kind of the file's value (integer, float, bool or string), as llama.cpp requires;
    /// arrays cannot be overridden.
    pub fn override_metadata(&mut self, key: &str, value: Value) -> Result<(), GgufError> {
        if let Some(old) = self.get(key) {
            if value_kind(old) != value_kind(&value) {
                return Err(self.error(format!(
                    "bad metadata override for key '{key}': the file holds {}, the override is {}",
                    old.type_name(), value.type_name())));
            }
        }
        match self.index.get(key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.index.insert(key.to_string(), self.metadata.len());
                self.metadata.push((key.to_string(), value));
            }
        }
        Ok(())
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> { self.tensor_index.get(name).map(|&i| &self.tensors[i]) }
    /// The tensor's bytes, a view into the map (bounds were checked at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_offset + t.offset;
        &self.bytes()[start..start + t.nbytes]
    }

    /// An error about this file, for callers that find a problem after parsing
    /// (a missing key, a tensor of the wrong shape).
    pub fn error(&self, message: impl Into<String>) -> GgufError {
        GgufError { path: self.path.display().to_string(), message: message.into() }
    }
}

/// The kinds of value an override may replace one with.
fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::F32(_) | Value::F64(_) => "float",
        Value::Bool(_) => "bool",
        Value::Str(_) => "string",
        Value::Array(_) => "array",
        _ => "integer",
    }
}

struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: usize,
    data_offset: usize,
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let mut r = Reader::new(bytes);
    if bytes.len() < 4 || &bytes[..4] != MAGIC {
        // The four bytes as text (b"PK\x03\x04" for a zip), which says what the file is.
        let magic = bytes[..bytes.len().min(4)].escape_ascii();
        return Err(format!("not a GGUF file (it starts with \"{magic}\", not \"GGUF\")"));
    }
    r.u32("magic")?;
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(format!("unsupported GGUF version {version} (2 and 3 are read)"));
    }
    // A tensor entry takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes,
    // a metadata entry at least 8 (key length) + 4 (type) + 1 (smallest value).
    let n_tensors = r.count("tensor count", 24)?;
    let n_kv = r.count("metadata count", 13)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut seen = HashMap::new();
    for i in 0..n_kv {
        let key = String::from_utf8_lossy(&r.string(&format!("key of metadata entry {i}"))?).into_owned();
        let type_id = r.u32(&format!("type of '{key}'"))?;
        let value = r.value(type_id, &format!("value of '{key}'"))?;
        if seen.insert(key.clone(), i).is_some() {
            return Err(format!("duplicate metadata key '{key}'"));
        }
        metadata.push((key, value));
    }

    let alignment = match seen.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => *a as usize,
        Some(v) => return Err(format!("general.alignment must be a power of two u32, found {v:?}")),
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashMap::new();
    for i in 0..n_tensors {
        let t = parse_tensor_info(&mut r, i)?;
        if names.insert(t.name.clone(), i).is_some() {
            return Err(format!("duplicate tensor name '{}'", t.name));
        }
        tensors.push(t);
    }

    let data_offset = r.pos().div_ceil(alignment) * alignment;
    let data_len = bytes.len().saturating_sub(data_offset);
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(format!("tensor '{}' has offset {} not aligned to {alignment}", t.name, t.offset));
        }
        let end = t.offset.checked_add(t.nbytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(format!(
                "tensor '{}' data [{}, +{}) lies outside the file's data section of {data_len} bytes",
                t.name, t.offset, t.nbytes
            ));
        }
    }
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

fn parse_tensor_info(r: &mut Reader, i: usize) -> Result<TensorInfo, String> {
    let name = String::from_utf8_lossy(&r.string(&format!("name of tensor {i}"))?).into_owned();
    let n_dims = r.u32(&format!("dimension count of '{name}'"))? as usize;
    if n_dims > MAX_DIMS {
        return Err(format!("tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})"));
    }
    let mut shape = Vec::with_capacity(n_dims);
    for d in 0..n_dims {
        let ne = r.u64(&format!("dimension {d} of '{name}'"))?;
        let ne = usize::try_from(ne).ok().filter(|&n| n as u64 <= i64::MAX as u64);
        shape.push(ne.ok_or_else(|| format!("tensor '{name}' dimension {d} is too large"))?);
    }
    let type_id = r.u32(&format!("type of '{name}'"))?;
    let ggml_type = GgmlType::from_id(type_id)
        .ok_or_else(|| format!("tensor '{name}' has unknown type id {type_id}"))?;
    let offset = r.u64(&format!("offset of '{name}'"))?;
    let offset = usize::try_from(offset).map_err(|_| format!("tensor '{name}' offset {offset} is too large"))?;
    let n_elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let n_elements = n_elements.ok_or_else(|| format!("tensor '{name}' shape {shape:?} overflows"))?;
    let row = shape.first().copied().unwrap_or(1);
    if row % ggml_type.block_size() != 0 {
        return Err(format!(
            "tensor '{name}' row of {row} elements is not a multiple of {ggml_type}'s block size {}",
            ggml_type.block_size()
        ));
    }
    let nbytes = (n_elements / ggml_type.block_size())
        .checked_mul(ggml_type.type_size())
        .ok_or_else(|| format!("tensor '{name}' byte size overflows"))?;
    Ok(TensorInfo { name, shape, ggml_type, offset, nbytes })
}

#[cfg(test)]
mod tests;
