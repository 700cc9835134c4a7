//! A fixed-size bitset of sequence ids (llama.cpp's `std::bitset<LLAMA_MAX_SEQ>`).

use crate::{SeqId, MAX_SEQ};

/// The set of sequences that occupy one cell: bit `s` is set when sequence `s` holds the cell.
///
/// Ids outside `0..MAX_SEQ` are never members; the cache validates ids before it stores them.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct SeqSet([u64; 4]);

impl SeqSet {
    /// The empty set.
    pub const EMPTY: SeqSet = SeqSet([0; 4]);

    /// A set holding only `seq` (empty when `seq` is out of range).
    pub fn single(seq: SeqId) -> SeqSet {
        let mut set = SeqSet::EMPTY;
        set.insert(seq);
        set
    }

    /// Whether `seq` is in the set.
    pub fn contains(&self, seq: SeqId) -> bool {
        match Self::word_bit(seq) {
            Some((w, b)) => self.0[w] & b != 0,
            None => false,
        }
    }

    /// Adds `seq`; returns false when it was already present or is out of range.
    pub fn insert(&mut self, seq: SeqId) -> bool {
        match Self::word_bit(seq) {
            Some((w, b)) if self.0[w] & b == 0 => {
                self.0[w] |= b;
                true
            }
            _ => false,
        }
    }

    /// Removes `seq`; returns false when it was not present.
    pub fn remove(&mut self, seq: SeqId) -> bool {
        match Self::word_bit(seq) {
            Some((w, b)) if self.0[w] & b != 0 => {
                self.0[w] &= !b;
                true
            }
            _ => false,
        }
    }

    /// Number of sequences in the set.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether no sequence is in the set.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// The smallest id in the set.
    pub fn first(&self) -> Option<SeqId> {
        self.iter().next()
    }

    /// The ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some((w as u32 * 64 + b) as SeqId)
            })
        })
    }

    fn word_bit(seq: SeqId) -> Option<(usize, u64)> {
        if seq < 0 || seq as u32 >= MAX_SEQ {
            return None;
        }
        let s = seq as usize;
        Some((s / 64, 1u64 << (s % 64)))
    }
}

impl FromIterator<SeqId> for SeqSet {
    fn from_iter<I: IntoIterator<Item = SeqId>>(iter: I) -> Self {
        let mut set = SeqSet::EMPTY;
        for s in iter {
            set.insert(s);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_iterate_across_words() {
        let mut s = SeqSet::EMPTY;
        assert!(s.is_empty());
        for id in [0, 63, 64, 130, 255] {
            assert!(s.insert(id));
        }
        assert!(!s.insert(64), "second insert reports presence");
        assert!(!s.insert(256), "out of range is refused");
        assert!(!s.insert(-1));
        assert_eq!(s.len(), 5);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 130, 255]);
        assert_eq!(s.first(), Some(0));
        assert!(s.remove(0));
        assert!(!s.remove(0));
        assert_eq!(s.first(), Some(63));
        assert!(s.contains(255) && !s.contains(256) && !s.contains(-5));
        assert_eq!(SeqSet::single(7).iter().collect::<Vec<_>>(), vec![7]);
        assert_eq!([3, 1, 3].into_iter().collect::<SeqSet>().len(), 2);
    }
}
