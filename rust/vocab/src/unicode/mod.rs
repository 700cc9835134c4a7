//! llama.cpp's Unicode layer (src/unicode.cpp): UTF-8 decoding with its replacement rules,
//! code point category flags, lower-casing, NFD first code points and GPT-2's byte mapping.

mod tables;

use std::sync::OnceLock;

use crate::hash::FastMap;

/// One past the largest code point.
pub const MAX_CODEPOINTS: u32 = 0x110000;

/// The replacement character llama.cpp substitutes for undecodable bytes.
pub const REPLACEMENT: u32 = 0xFFFD;

/// Bits of llama.cpp's `unicode_cpt_flags` (same values, same layout).
#[allow(missing_docs)]
pub mod flag {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const ACCENT_MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const MASK_CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100;
    pub const LOWERCASE: u16 = 0x0200;
    pub const UPPERCASE: u16 = 0x0400;
    pub const NFD: u16 = 0x0800;
}

/// The flags of one code point. `CptFlags(0)` is what llama.cpp's splitters use for
/// positions outside the current chunk (no flag at all, not even UNDEFINED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CptFlags(pub u16);

impl CptFlags {
    /// Unassigned code point (or beyond U+10FFFF).
    #[inline] pub fn is_undefined(self) -> bool { self.0 & flag::UNDEFINED != 0 }
    /// `\p{N}`.
    #[inline] pub fn is_number(self) -> bool { self.0 & flag::NUMBER != 0 }
    /// `\p{L}`.
    #[inline] pub fn is_letter(self) -> bool { self.0 & flag::LETTER != 0 }
    /// `\p{Z}`.
    #[inline] pub fn is_separator(self) -> bool { self.0 & flag::SEPARATOR != 0 }
    /// `\p{M}`.
    #[inline] pub fn is_accent_mark(self) -> bool { self.0 & flag::ACCENT_MARK != 0 }
    /// `\p{P}`.
    #[inline] pub fn is_punctuation(self) -> bool { self.0 & flag::PUNCTUATION != 0 }
    /// `\p{S}`.
    #[inline] pub fn is_symbol(self) -> bool { self.0 & flag::SYMBOL != 0 }
    /// `\p{C}`.
    #[inline] pub fn is_control(self) -> bool { self.0 & flag::CONTROL != 0 }
    /// White_Space (llama.cpp's `\s`).
    #[inline] pub fn is_whitespace(self) -> bool { self.0 & flag::WHITESPACE != 0 }
    /// All bits, as llama.cpp's `as_uint()`: non-zero for every in-range code point.
    #[inline] pub fn as_uint(self) -> u16 { self.0 }
    /// The category bits only (`category_flag()`).
    #[inline] pub fn category(self) -> u16 { self.0 & flag::MASK_CATEGORIES }
}

/// Code points per block of [`FlagTable`].
const BLOCK: usize = 128;

/// The per-code-point flags llama.cpp builds at start-up in one array
/// (`unicode_cpt_flags_array`), here in blocks of [`BLOCK`] code points, each distinct block
/// stored once: of the 8704 blocks about 500 differ (unassigned planes, long runs of one
/// script), so the table takes ~140 KiB instead of 2.2 MiB.
struct FlagTable {
    /// Which of `blocks` holds the flags of each block of code points.
    block_of: Box<[u16]>,
    /// The distinct blocks, end to end.
    blocks: Box<[u16]>,
}

fn flag_table() -> &'static FlagTable {
    static TABLE: OnceLock<FlagTable> = OnceLock::new();
    TABLE.get_or_init(build_flag_table)
}

/// The flags of every code point: its range's category flags (`RANGES_FLAGS`), with the
/// marks llama.cpp adds to single code points: whitespace, and the *targets* of the case
/// maps and of the NFD map.
fn build_flag_table() -> FlagTable {
    let mut marks: Vec<(u32, u16)> = Vec::new();
    marks.extend(tables::WHITESPACE.iter().map(|&cpt| (cpt, flag::WHITESPACE)));
    marks.extend(tables::LOWERCASE.iter().map(|&(_, lower)| (lower, flag::LOWERCASE)));
    marks.extend(tables::UPPERCASE.iter().map(|&(_, upper)| (upper, flag::UPPERCASE)));
    marks.extend(tables::NFD_RANGES.iter().map(|&(_, _, nfd)| (nfd, flag::NFD)));
    marks.sort_unstable_by_key(|&(cpt, _)| cpt);
    let mut marks = marks.into_iter().peekable();
    // (first, end, flags) of each range, in order
    let mut ranges = tables::RANGES_FLAGS.windows(2).map(|w| (w[0].0, w[1].0, w[0].1)).peekable();
    let n_blocks = MAX_CODEPOINTS as usize / BLOCK;
    let mut block_of = Vec::with_capacity(n_blocks);
    let mut blocks = Vec::new();
    let mut distinct: FastMap<[u16; BLOCK], u16> = FastMap::default();
    let mut block = [flag::UNDEFINED; BLOCK];
    for first in (0..MAX_CODEPOINTS).step_by(BLOCK) {
        let end = first + BLOCK as u32;
        let mut cpt = first;
        while cpt < end {
            while ranges.next_if(|&(_, range_end, _)| range_end <= cpt).is_some() {}
            let (until, flags) = match ranges.peek() {
                Some(&(start, range_end, flags)) if start <= cpt => (range_end.min(end), flags),
                Some(&(start, _, _)) => (start.min(end), flag::UNDEFINED),
                None => (end, flag::UNDEFINED),
            };
            block[(cpt - first) as usize..(until - first) as usize].fill(flags);
            cpt = until;
        }
        while let Some((cpt, mark)) = marks.next_if(|&(cpt, _)| cpt < end) {
            block[(cpt - first) as usize] |= mark;
        }
        let next_id = distinct.len() as u16;
        let id = *distinct.entry(block).or_insert_with(|| {
            blocks.extend_from_slice(&block);
            next_id
        });
        block_of.push(id);
    }
    FlagTable { block_of: block_of.into_boxed_slice(), blocks: blocks.into_boxed_slice() }
}

/// Flags of a code point (UNDEFINED beyond U+10FFFF), as `unicode_cpt_flags_from_cpt`.
#[inline]
pub fn flags(cpt: u32) -> CptFlags {
    let table = flag_table();
    match table.block_of.get(cpt as usize / BLOCK) {
        Some(&block) => CptFlags(table.blocks[block as usize * BLOCK + cpt as usize % BLOCK]),
        None => CptFlags(flag::UNDEFINED),
    }
}

/// Length of the UTF-8 sequence a lead byte announces (`unicode_len_utf8`): continuation
/// and invalid bytes count as 1.
#[inline]
pub fn len_utf8(lead: u8) -> usize {
    const LOOKUP: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize] as usize
}

/// Decodes one code point at `offset` as `unicode_cpt_from_utf8`: `None` where llama.cpp
/// throws. Overlong forms, surrogates and values up to 0x1FFFFF are accepted, as there.
#[inline]
pub fn decode_one(bytes: &[u8], offset: usize) -> Option<(u32, usize)> {
    let b0 = bytes[offset] as u32;
    let cont = |i: usize| bytes.get(offset + i).filter(|&&b| b & 0xC0 == 0x80).map(|&b| (b & 0x3F) as u32);
    if b0 & 0x80 == 0 {
        return Some((b0, 1));
    }
    if b0 & 0x40 == 0 {
        return None;
    }
    if b0 & 0x20 == 0 {
        let c1 = cont(1)?;
        return Some((((b0 & 0x1F) << 6) | c1, 2));
    }
    if b0 & 0x10 == 0 {
        let (c1, c2) = (cont(1)?, cont(2)?);
        return Some((((b0 & 0x0F) << 12) | (c1 << 6) | c2, 3));
    }
    if b0 & 0x08 == 0 {
        let (c1, c2, c3) = (cont(1)?, cont(2)?, cont(3)?);
        return Some((((b0 & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3, 4));
    }
    None
}

/// `unicode_cpts_from_utf8`: every undecodable byte becomes one U+FFFD.
pub fn cpts_from_utf8(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut offset = 0;
    while offset < bytes.len() {
        match decode_one(bytes, offset) {
            Some((cpt, len)) => {
                out.push(cpt);
                offset += len;
            }
            None => {
                out.push(REPLACEMENT);
                offset += 1;
            }
        }
    }
    out
}

/// A code point llama.cpp's `unicode_cpt_to_utf8` refuses (it throws for > U+10FFFF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidCodepoint(pub u32);

/// Appends the UTF-8 encoding of `cpt` (surrogates included, as llama.cpp does).
#[inline]
pub fn push_utf8(cpt: u32, out: &mut Vec<u8>) -> Result<(), InvalidCodepoint> {
    match cpt {
        0..=0x7F => out.push(cpt as u8),
        0x80..=0x7FF => out.extend_from_slice(&[0xC0 | (cpt >> 6) as u8, 0x80 | (cpt & 0x3F) as u8]),
        0x800..=0xFFFF => out.extend_from_slice(&[
            0xE0 | (cpt >> 12) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
        0x10000..=0x10FFFF => out.extend_from_slice(&[
            0xF0 | (cpt >> 18) as u8,
            0x80 | ((cpt >> 12) & 0x3F) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]),
        _ => return Err(InvalidCodepoint(cpt)),
    }
    Ok(())
}

/// Simple lowercase mapping (`unicode_tolower`).
pub fn to_lower(cpt: u32) -> u32 {
    match tables::LOWERCASE.binary_search_by_key(&cpt, |&(c, _)| c) {
        Ok(i) => tables::LOWERCASE[i].1,
        Err(_) => cpt,
    }
}

/// First code point of the canonical decomposition (`unicode_cpts_normalize_nfd`, per code point).
pub fn nfd_first(cpt: u32) -> u32 {
    let idx = tables::NFD_RANGES.partition_point(|&(first, _, _)| first <= cpt);
    // The table starts with (0, 0, 0), so idx >= 1.
    let (first, last, nfd) = tables::NFD_RANGES[idx - 1];
    if first <= cpt && cpt <= last { nfd } else { cpt }
}

/// Han ideographs as llama.cpp's `unicode_cpt_is_han` lists them.
pub fn is_han(cpt: u32) -> bool {
    matches!(cpt,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F |
        0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF |
        0x2F800..=0x2FA1F)
}

/// Bytes GPT-2's byte-level encoding maps to the code point of the same value.
const fn byte_is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Whether a byte continues a UTF-8 sequence (0b10xxxxxx).
#[inline]
pub fn is_continuation(byte: u8) -> bool { byte & 0xC0 == 0x80 }

/// GPT-2's `bytes_to_unicode` as a table: printable bytes stand for themselves, the others
/// for 256, 257, ... in byte order.
const CPT_OF_BYTE: [u16; 256] = {
    let mut map = [0u16; 256];
    let (mut b, mut n) = (0usize, 0u16);
    while b < 256 {
        map[b] = if byte_is_printable(b as u8) {
            b as u16
        } else {
            n += 1;
            255 + n
        };
        b += 1;
    }
    map
};

/// Number of code points the byte map uses (all below 256 + 68).
const MAPPED_CPTS: usize = 324;

/// The inverse of [`CPT_OF_BYTE`]; `u16::MAX` for code points outside the map.
const BYTE_OF_CPT: [u16; MAPPED_CPTS] = {
    let mut map = [u16::MAX; MAPPED_CPTS];
    let mut b = 0;
    while b < 256 {
        map[CPT_OF_BYTE[b] as usize] = b as u16;
        b += 1;
    }
    map
};

/// GPT-2's `bytes_to_unicode`: the code point standing for a raw byte.
#[inline]
pub fn byte_to_cpt(byte: u8) -> u32 { CPT_OF_BYTE[byte as usize] as u32 }

/// Inverse of [`byte_to_cpt`] (`unicode_utf8_to_byte`); `None` for code points outside the map.
#[inline]
pub fn cpt_to_byte(cpt: u32) -> Option<u8> {
    BYTE_OF_CPT.get(cpt as usize).copied().filter(|&b| b != u16::MAX).map(|b| b as u8)
}

/// Appends the raw bytes a byte-level encoded text stands for and returns true, if every
/// character of it is in the byte map; otherwise returns false with `out` as it was. The
/// map's code points are all below U+0144, so only 1- and 2-byte UTF-8 sequences qualify.
pub fn append_byte_decoded(text: &[u8], out: &mut Vec<u8>) -> bool {
    let len_before = out.len();
    out.reserve(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        let cpt = if b < 0x80 {
            i += 1;
            b as u32
        } else if b & 0xE0 == 0xC0 && b >= 0xC2 && text.get(i + 1).is_some_and(|&c| is_continuation(c)) {
            let c = ((b as u32 & 0x1F) << 6) | (text[i + 1] as u32 & 0x3F);
            i += 2;
            c
        } else {
            out.truncate(len_before);
            return false;
        };
        match cpt_to_byte(cpt) {
            Some(byte) => out.push(byte),
            None => {
                out.truncate(len_before);
                return false;
            }
        }
    }
    true
}

/// Appends the UTF-8 of the byte-level code point of `byte` (`unicode_byte_to_utf8`).
#[inline]
pub fn push_byte_encoded(byte: u8, out: &mut Vec<u8>) {
    // byte_to_cpt is always <= 0x143, never invalid.
    let _ = push_utf8(byte_to_cpt(byte), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_known_code_points() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('5' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace() && flags(' ' as u32).is_separator());
        assert!(flags(0x0B).is_whitespace() && flags(0x0B).is_control());
        assert!(!flags(0x1C).is_whitespace());
        assert!(flags('~' as u32).is_symbol());
        assert!(flags(0x0301).is_accent_mark());
        assert!(flags(0x2EBF0).is_letter(), "Unicode 15.1 CJK Extension I");
        assert!(flags(0x0378).is_undefined());
        assert_eq!(flags(0x110000), CptFlags(flag::UNDEFINED));
        assert!(flags('a' as u32).0 & flag::LOWERCASE != 0);
    }

    #[test]
    fn decoding_replaces_like_llama_cpp() {
        assert_eq!(cpts_from_utf8(b"a\xC3\xA9"), vec![0x61, 0xE9]);
        assert_eq!(cpts_from_utf8(b"\x80a"), vec![REPLACEMENT, 0x61]);
        // truncated sequence: the lead byte is replaced, the rest decoded on its own
        assert_eq!(cpts_from_utf8(b"\xE2\x82"), vec![REPLACEMENT, REPLACEMENT]);
        // overlong and out-of-range forms are accepted by llama.cpp's decoder
        assert_eq!(cpts_from_utf8(b"\xC0\x80"), vec![0]);
        assert_eq!(cpts_from_utf8(b"\xF7\xBF\xBF\xBF"), vec![0x1FFFFF]);
        assert_eq!(cpts_from_utf8(b"\xF8"), vec![REPLACEMENT]);
    }

    #[test]
    fn encoding_matches_std_and_refuses_beyond_unicode() {
        for cpt in [0u32, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF] {
            let mut out = Vec::new();
            push_utf8(cpt, &mut out).unwrap();
            assert_eq!(out, char::from_u32(cpt).unwrap().to_string().into_bytes());
        }
        assert_eq!(push_utf8(0x110000, &mut Vec::new()), Err(InvalidCodepoint(0x110000)));
    }

    #[test]
    fn byte_map_is_gpt2() {
        assert_eq!(byte_to_cpt(b' '), 0x120); // 'Ġ'
        assert_eq!(byte_to_cpt(b'\n'), 0x10A); // 'Ċ'
        assert_eq!(byte_to_cpt(b'a'), 'a' as u32);
        assert_eq!(byte_to_cpt(0xAD), 0x143);
        for b in 0..=255u8 {
            assert_eq!(cpt_to_byte(byte_to_cpt(b)), Some(b));
        }
        assert_eq!(cpt_to_byte(0x20), None);
    }

    #[test]
    fn flag_blocks_are_the_flat_table() {
        // the flat array, built as llama.cpp builds it
        let mut flat = vec![flag::UNDEFINED; MAX_CODEPOINTS as usize];
        for pair in tables::RANGES_FLAGS.windows(2) {
            flat[pair[0].0 as usize..pair[1].0 as usize].fill(pair[0].1);
        }
        for &cpt in tables::WHITESPACE {
            flat[cpt as usize] |= flag::WHITESPACE;
        }
        for &(_, lower) in tables::LOWERCASE {
            flat[lower as usize] |= flag::LOWERCASE;
        }
        for &(_, upper) in tables::UPPERCASE {
            flat[upper as usize] |= flag::UPPERCASE;
        }
        for &(_, _, nfd) in tables::NFD_RANGES {
            flat[nfd as usize] |= flag::NFD;
        }
        for (cpt, &expected) in flat.iter().enumerate() {
            assert_eq!(flags(cpt as u32).as_uint(), expected, "U+{cpt:04X}");
        }
        assert_eq!(flags(MAX_CODEPOINTS).as_uint(), flag::UNDEFINED);
        assert_eq!(flags(u32::MAX).as_uint(), flag::UNDEFINED);
        assert!(flag_table().blocks.len() < 200_000);
    }

    #[test]
    fn byte_level_decoding() {
        let mut out = b"x".to_vec();
        let mut encoded = Vec::new();
        for b in 0..=255u8 {
            push_byte_encoded(b, &mut encoded);
        }
        assert!(append_byte_decoded(&encoded, &mut out));
        assert_eq!(out[0], b'x');
        assert_eq!(&out[1..], (0..=255u8).collect::<Vec<_>>().as_slice());
        for bad in [" ".as_bytes(), "a b".as_bytes(), "\u{2581}".as_bytes(), b"\xC4", b"\xC0\x80", "Ġ\u{144}".as_bytes()] {
            assert!(!append_byte_decoded(bad, &mut out), "{bad:?}");
            assert_eq!(out.len(), 257);
        }
        assert!(append_byte_decoded("Ġa".as_bytes(), &mut out));
        assert_eq!(&out[257..], b" a");
    }

    #[test]
    fn case_and_nfd() {
        assert_eq!(to_lower('A' as u32), 'a' as u32);
        assert_eq!(to_lower(0x130), 'i' as u32);
        assert_eq!(nfd_first(0xE9), 'e' as u32);
        assert_eq!(nfd_first(0xAC00), 0x1100);
        assert_eq!(nfd_first('x' as u32), 'x' as u32);
    }
}
