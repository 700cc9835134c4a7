//! A string array kept as one buffer: a vocabulary of 262 144 tokens is then two
//! allocations (its bytes and their end offsets), not one per token.

/// Byte strings stored end to end; string i is bytes[ends[i - 1]..ends[i]].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Strings {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Strings {
    pub fn with_capacity(n: usize, total_bytes: usize) -> Strings {
        Strings { bytes: Vec::with_capacity(total_bytes), ends: Vec::with_capacity(n) }
    }

    pub fn len(&self) -> usize { self.ends.len() }
    pub fn is_empty(&self) -> bool { self.ends.is_empty() }

    /// The bytes of all strings together.
    pub fn total_len(&self) -> usize { self.bytes.len() }

    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// Replaces string i (an edit that moves the later strings: for tests and tools, not
    /// for loops).
    pub fn set(&mut self, i: usize, s: &[u8]) {
        let (start, end) = (if i == 0 { 0 } else { self.ends[i - 1] }, self.ends[i]);
        self.bytes.splice(start..end, s.iter().copied());
        let delta = s.len() as isize - (end - start) as isize;
        for e in &mut self.ends[i..] {
            *e = e.wrapping_add_signed(delta);
        }
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below len"))
    }
}

impl std::ops::Index<usize> for Strings {
    type Output = [u8];
    fn index(&self, i: usize) -> &[u8] {
        self.get(i).unwrap_or_else(|| panic!("string {i} of {}", self.len()))
    }
}

impl<S: AsRef<[u8]>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Strings {
        let mut out = Strings::default();
        for s in iter {
            out.push(s.as_ref());
        }
        out
    }
}

impl std::fmt::Debug for Strings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(String::from_utf8_lossy)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Strings;

    #[test]
    fn strings_keep_their_order_and_edits_move_the_rest() {
        let mut s: Strings = ["ab", "", "cde"].into_iter().collect();
        assert_eq!((s.len(), s.total_len()), (3, 5));
        assert_eq!(s.iter().collect::<Vec<_>>(), [&b"ab"[..], b"", b"cde"]);
        assert_eq!(s.get(3), None);
        s.set(0, b"x");
        s.set(1, b"yy");
        assert_eq!(s.iter().collect::<Vec<_>>(), [&b"x"[..], b"yy", b"cde"]);
        assert_eq!(&s[2], b"cde");
    }
}
