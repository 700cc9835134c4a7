//! A GGUF file stored as pieces: consecutive byte ranges of the file in files of their own (as PyPI
//! packages carry a model too large for one package), listed in a small text file:
//!
//! ```text
//! ferrollama-pieces 1
//! 63963136 /site-packages/model_part1/data/model.gguf.part00
//! 61223616 /site-packages/model_part2/data/model.gguf.part01
//! ```
//!
//! Each line is a piece's size in bytes and its path (relative paths are relative to the list).
//! On Unix, pieces whose sizes are whole pages (all but the last) are mapped side by side into one
//! range of addresses, so the model is read in place, with no copy on disk or in memory; otherwise
//! they are read into memory.

use std::path::{Path, PathBuf};

/// The first line of a list of pieces.
pub const PIECES_HEADER: &str = "ferrollama-pieces 1";

/// The longest list read (a list is a few lines; a bigger file is something else).
const MAX_LIST_BYTES: u64 = 1 << 20;

pub(crate) struct Piece {
    path: PathBuf,
    size: usize,
}

/// Whether the first bytes of a file are those of a list of pieces.
pub(crate) fn is_pieces_list(head: &[u8]) -> bool {
    head.starts_with(PIECES_HEADER.as_bytes())
}

/// The pieces a list names, each checked to exist with the size the list gives.
pub(crate) fn read_list(list: &Path) -> Result<Vec<Piece>, String> {
    let size = std::fs::metadata(list).map_err(|e| format!("cannot read the list of pieces: {e}"))?.len();
    if size > MAX_LIST_BYTES {
        return Err(format!("a list of pieces of {size} bytes is not one (at most {MAX_LIST_BYTES})"));
    }
    let text = std::fs::read_to_string(list).map_err(|e| format!("cannot read the list of pieces: {e}"))?;
    let dir = list.parent().unwrap_or(Path::new("."));
    let pieces = text.lines().skip(1).filter(|l| !l.trim().is_empty()).enumerate()
        .map(|(i, line)| piece_of_line(dir, i + 2, line))
        .collect::<Result<Vec<_>, _>>()?;
    if pieces.is_empty() {
        return Err("the list of pieces names none".to_string());
    }
    Ok(pieces)
}

fn piece_of_line(dir: &Path, line_no: usize, line: &str) -> Result<Piece, String> {
    let (size, path) = line.split_once(' ')
        .ok_or_else(|| format!("line {line_no} of the list of pieces is not 'SIZE PATH'"))?;
    let size: usize = size.parse()
        .map_err(|_| format!("line {line_no} of the list of pieces: {size:?} is not a size"))?;
    let path = dir.join(path);
    let actual = std::fs::metadata(&path).map_err(|e| format!("piece {}: {e}", path.display()))?.len();
    if actual != size as u64 {
        return Err(format!("piece {} has {actual} bytes, the list says {size}", path.display()));
    }
    Ok(Piece { path, size })
}

/// The pieces read one after the other into memory.
pub(crate) fn read_all(pieces: &[Piece]) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(pieces.iter().map(|p| p.size).sum());
    for p in pieces {
        use std::io::Read;
        let file = std::fs::File::open(&p.path).map_err(|e| format!("piece {}: {e}", p.path.display()))?;
        let n = file.take(p.size as u64).read_to_end(&mut bytes).map_err(|e| format!("piece {}: {e}", p.path.display()))?;
        if n != p.size {
            return Err(format!("piece {} changed while read ({n} bytes, not {})", p.path.display(), p.size));
        }
    }
    Ok(bytes)
}

/// The pieces mapped read-only, side by side, into one range of addresses.
#[cfg(unix)]
pub(crate) struct PieceMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the range is a read-only private mapping, never written after map() returns.
#[cfg(unix)]
unsafe impl Send for PieceMap {}
#[cfg(unix)]
unsafe impl Sync for PieceMap {}

#[cfg(unix)]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

#[cfg(unix)]
impl PieceMap {
    /// Maps the pieces; None when one but the last is not a whole number of pages (a file can
    /// only be mapped at a page boundary, so the next piece could not follow it directly).
    pub(crate) fn map(pieces: &[Piece]) -> Result<Option<PieceMap>, String> {
        let page = page_size();
        let len: usize = pieces.iter().map(|p| p.size).sum();
        if len == 0 || pieces[..pieces.len() - 1].iter().any(|p| p.size % page != 0) {
            return Ok(None);
        }
        // Reserve the whole range first, then map each piece over its part of it (MAP_FIXED
        // replaces the reservation's pages there), so no other mapping can come between them.
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(format!("cannot reserve {len} bytes of addresses: {}", std::io::Error::last_os_error()));
        }
        let map = PieceMap { ptr: base as *mut u8, len };
        let mut offset = 0;
        for p in pieces {
            map.map_piece(p, offset)?;
            offset += p.size;
        }
        Ok(Some(map))
    }

    fn map_piece(&self, p: &Piece, offset: usize) -> Result<(), String> {
        use std::os::unix::io::AsRawFd;
        let file = std::fs::File::open(&p.path).map_err(|e| format!("piece {}: {e}", p.path.display()))?;
        // SAFETY: the target lies inside our reservation (offset + size <= len) and offset is a
        // multiple of the page size; the mapping outlives the file descriptor, as mmap allows.
        let at = unsafe {
            libc::mmap(self.ptr.add(offset) as *mut libc::c_void, p.size, libc::PROT_READ,
                       libc::MAP_PRIVATE | libc::MAP_FIXED, file.as_raw_fd(), 0)
        };
        if at == libc::MAP_FAILED {
            return Err(format!("cannot map piece {}: {}", p.path.display(), std::io::Error::last_os_error()));
        }
        Ok(())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: len bytes from ptr are mapped readable for the map's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Lets the kernel take back the whole pages of start..start + len (reloaded from the
    /// pieces when touched again).
    pub(crate) fn release(&self, start: usize, len: usize) {
        let page = page_size();
        let (first, end) = (start.div_ceil(page) * page, (start.saturating_add(len)).min(self.len) / page * page);
        if first < end {
            // SAFETY: a page-aligned range inside our private, never-written file mappings.
            unsafe { libc::madvise(self.ptr.add(first) as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
        }
    }
}

#[cfg(unix)]
impl Drop for PieceMap {
    fn drop(&mut self) {
        // SAFETY: the range we mapped, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
