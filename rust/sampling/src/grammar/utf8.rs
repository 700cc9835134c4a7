//! Decoding token pieces into code points the way llama.cpp's grammar does: a piece may
//! end inside a UTF-8 sequence, which the next piece completes.

/// An unfinished UTF-8 sequence: the bits decoded so far and how many continuation bytes
/// are still expected (−1: the bytes were invalid).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PartialUtf8 {
    /// The bits of the code point decoded so far.
    pub value: u32,
    /// Continuation bytes still expected; −1 after an invalid sequence.
    pub n_remain: i32,
}

/// Decodes `src` (up to its first NUL byte, as llama.cpp reads a C string), continuing
/// `start`. Appends the complete code points and a terminating 0 to `out`, and returns
/// the unfinished sequence at the end. On an invalid sequence only a 0 is appended (what
/// was decoded of this piece is dropped) and n_remain is −1.
pub fn decode_utf8(src: &[u8], start: PartialUtf8, out: &mut Vec<u32>) -> PartialUtf8 {
    const LOOKUP: [i32; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];
    let base = out.len();
    let at = |i: usize| src.get(i).copied().unwrap_or(0);
    let mut pos = 0;
    let mut value = start.value;
    let mut n_remain = start.n_remain;

    // finish the previous sequence
    while at(pos) != 0 && n_remain > 0 {
        let next = at(pos);
        if next >> 6 != 2 {
            out.truncate(base);
            out.push(0);
            return PartialUtf8 { value: 0, n_remain: -1 };
        }
        value = (value << 6) + (next as u32 & 0x3F);
        pos += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        out.push(value);
    }

    while at(pos) != 0 {
        let first = at(pos);
        n_remain = LOOKUP[(first >> 4) as usize] - 1;
        if n_remain < 0 {
            out.truncate(base);
            out.push(0);
            return PartialUtf8 { value: 0, n_remain };
        }
        let mask = (1u32 << (7 - n_remain)) - 1;
        value = first as u32 & mask;
        pos += 1;
        while at(pos) != 0 && n_remain > 0 {
            value = (value << 6) + (at(pos) as u32 & 0x3F);
            pos += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            out.push(value);
        }
    }
    out.push(0);
    PartialUtf8 { value, n_remain }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_sequence_completes_in_the_next_piece() {
        let euro = "€".as_bytes();
        let mut out = Vec::new();
        let partial = decode_utf8(&euro[..1], PartialUtf8::default(), &mut out);
        assert_eq!(out, vec![0]);
        assert_eq!(partial.n_remain, 2);
        out.clear();
        let partial = decode_utf8(&euro[1..], partial, &mut out);
        assert_eq!(out, vec!['€' as u32, 0]);
        assert_eq!(partial.n_remain, 0);
    }

    #[test]
    fn a_stray_continuation_byte_is_invalid() {
        let mut out = vec![7];
        let partial = decode_utf8(&[b'a', 0x80], PartialUtf8::default(), &mut out);
        assert_eq!(out, vec![7, 0]);
        assert_eq!(partial.n_remain, -1);
    }
}
