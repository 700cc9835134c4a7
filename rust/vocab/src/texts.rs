//! Token texts kept in one buffer (one allocation for the whole vocabulary instead of one per
//! token), and a table from text to id built over that buffer.

use std::collections::VecDeque;

use crate::hash::{hash_bytes, IdIndex, Probe};
use crate::VocabError;

/// A list of byte strings stored end to end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Texts {
    bytes: Vec<u8>,
    /// End of each text in `bytes`; a text starts where the previous one ends.
    ends: Vec<u32>,
    /// Length of the longest text.
    longest: usize,
}

impl Texts {
    /// An empty list with room for `n` texts of `total_len` bytes together.
    pub fn with_capacity(n: usize, total_len: usize) -> Texts {
        Texts { bytes: Vec::with_capacity(total_len), ends: Vec::with_capacity(n), longest: 0 }
    }

    /// Number of texts.
    pub fn len(&self) -> usize { self.ends.len() }

    /// Length of the longest text (0 without texts).
    pub fn longest(&self) -> usize { self.longest }

    /// Length of all texts together.
    pub fn total_len(&self) -> usize { self.bytes.len() }

    /// Text `i` (panics when out of range).
    #[inline]
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    /// All texts, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ { (0..self.len()).map(|i| self.get(i)) }

    /// Appends a text; returns its index.
    pub fn push(&mut self, text: &[u8]) -> Result<u32, VocabError> {
        self.push_with(|bytes| {
            bytes.extend_from_slice(text);
            true
        })
        .map(|pushed| pushed.expect("an accepted text"))
    }

    /// Appends the text `write` appends to the buffer, unless it returns false (whatever it
    /// wrote is then taken back); returns the new text's index. Lets a text be decoded
    /// straight into the buffer.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>) -> bool) -> Result<Option<u32>, VocabError> {
        let start = self.bytes.len();
        if !write(&mut self.bytes) {
            self.bytes.truncate(start);
            return Ok(None);
        }
        let end = u32::try_from(self.bytes.len()).map_err(|_| VocabError::Invalid("token texts longer than 4 GiB together".into()))?;
        self.ends.push(end);
        self.longest = self.longest.max(self.bytes.len() - start);
        Ok(Some(self.ends.len() as u32 - 1))
    }

    /// Removes the last text.
    fn pop(&mut self) {
        self.ends.pop();
        self.bytes.truncate(self.ends.last().map_or(0, |&e| e as usize));
        self.longest = self.iter().map(|t| t.len()).max().unwrap_or(0); // rare: a repeat
    }
}

/// Texts numbered in order, each findable by its bytes (except those added unindexed).
#[derive(Debug, Clone, Default)]
pub(crate) struct TextTable {
    texts: Texts,
    index: IdIndex,
}

/// Where [`TextTable::insert`] put a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// A new text, with its id.
    New(u32),
    /// The text was there already, with this id (nothing was added).
    Existing(u32),
}

impl TextTable {
    /// A table of `texts` under their positions as ids, all indexed except those `indexed`
    /// rejects. `Err((earlier, id))` for the first text, in id order, equal to an earlier one.
    pub fn build(texts: Texts, indexed: impl Fn(u32) -> bool) -> Result<TextTable, (u32, u32)> {
        // The slots are read at random, a cache miss each once the index is larger than the
        // cache: the slots of the next AHEAD texts are fetched while this one is put in.
        const AHEAD: usize = 8;
        let ids = || (0..texts.len() as u32).filter(|&id| indexed(id));
        let mut index = IdIndex::with_capacity(ids().count());
        let mut upcoming = ids().map(|id| (id, hash_bytes(texts.get(id as usize))));
        let mut ahead = VecDeque::with_capacity(AHEAD);
        loop {
            while ahead.len() < AHEAD {
                let Some((id, hash)) = upcoming.next() else { break };
                index.prefetch(hash);
                ahead.push_back((id, hash));
            }
            let Some((id, hash)) = ahead.pop_front() else { break };
            let text = texts.get(id as usize);
            match index.find_or_slot(hash, |other| texts.get(other as usize) == text) {
                Probe::Found(earlier) => return Err((earlier, id)),
                Probe::Vacant(slot) => index.fill(slot, hash, id),
            }
        }
        Ok(TextTable { texts, index })
    }

    /// Number of texts (indexed or not).
    pub fn len(&self) -> usize { self.texts.len() }

    /// Text of an id (panics when out of range).
    #[inline]
    pub fn get(&self, id: u32) -> &[u8] { self.texts.get(id as usize) }

    /// The texts, in id order.
    pub fn texts(&self) -> &Texts { &self.texts }

    /// Id of an indexed text.
    #[inline]
    pub fn find(&self, text: &[u8]) -> Option<u32> {
        self.index.find(hash_bytes(text), |id| self.texts.get(id as usize) == text)
    }

    /// Adds a text under the next id unless it is there already.
    pub fn insert(&mut self, text: &[u8]) -> Result<Inserted, VocabError> {
        self.insert_with(|bytes| {
            bytes.extend_from_slice(text);
            true
        })
        .map(|inserted| inserted.expect("an accepted text"))
    }

    /// [`TextTable::insert`] of the text `write` appends to the buffer (none if it returns
    /// false, as [`Texts::push_with`]).
    pub fn insert_with(&mut self, write: impl FnOnce(&mut Vec<u8>) -> bool) -> Result<Option<Inserted>, VocabError> {
        let Some(id) = self.texts.push_with(write)? else { return Ok(None) };
        let hash = hash_bytes(self.texts.get(id as usize));
        if !self.index.has_room() {
            let texts = &self.texts;
            self.index = self.index.regrown(self.index.len() * 2, |i| hash_bytes(texts.get(i as usize)));
        }
        let text = self.texts.get(id as usize);
        match self.index.find_or_slot(hash, |other| self.texts.get(other as usize) == text) {
            Probe::Found(existing) => {
                self.texts.pop();
                Ok(Some(Inserted::Existing(existing)))
            }
            Probe::Vacant(slot) => {
                self.index.fill(slot, hash, id);
                Ok(Some(Inserted::New(id)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_round_trip() {
        let mut t = Texts::with_capacity(0, 0);
        for s in ["", "a", "", "hello", "\u{E000}"] {
            t.push(s.as_bytes()).unwrap();
        }
        let back: Vec<&[u8]> = t.iter().collect();
        assert_eq!(back, [b"".as_slice(), b"a", b"", b"hello", "\u{E000}".as_bytes()]);
        assert_eq!(t.push_with(|b| { b.push(b'x'); false }).unwrap(), None);
        assert_eq!(t.len(), 5);
        assert_eq!(t.get(4), "\u{E000}".as_bytes());
        assert_eq!(t.longest(), 5);
    }

    #[test]
    fn table_finds_every_text_and_rejects_duplicates() {
        // start empty so that the index grows several times
        let mut table = TextTable::default();
        assert_eq!(table.find(b"w"), None);
        let words: Vec<Vec<u8>> = (0..5000u32).map(|i| format!("w{}", i * 7919 % 10007).into_bytes()).collect();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(table.insert(w).unwrap(), Inserted::New(i as u32));
        }
        assert_eq!(table.insert(&words[17]).unwrap(), Inserted::Existing(17));
        assert_eq!(table.len(), words.len());
        assert_eq!(table.texts().longest(), words.iter().map(|w| w.len()).max().unwrap());
        for (i, w) in words.iter().enumerate() {
            assert_eq!(table.find(w), Some(i as u32));
            assert_eq!(table.get(i as u32), w.as_slice());
        }
        assert_eq!(table.find(b"w"), None);
        assert_eq!(table.find(b""), None);
        assert_eq!(table.insert(b"").unwrap(), Inserted::New(5000));
        assert_eq!(table.find(b""), Some(5000));
    }

    #[test]
    fn built_table_matches_one_by_one() {
        let mut texts = Texts::with_capacity(0, 0);
        for i in 0..20000u32 {
            texts.push(format!("t{}", i * 7919 % 20011).as_bytes()).unwrap();
        }
        let skipped = |id: u32| id % 1000 == 3;
        let mut table = TextTable::build(texts.clone(), |id| !skipped(id)).unwrap();
        for (id, text) in texts.iter().enumerate() {
            let expected = if skipped(id as u32) { None } else { Some(id as u32) };
            assert_eq!(table.find(text), expected);
        }
        assert_eq!(table.find(b"t"), None);
        // the table grows after being built
        let extra = table.insert(b"extra").unwrap();
        assert_eq!(extra, Inserted::New(20000));
        assert_eq!(table.find(b"extra"), Some(20000));
        assert_eq!(table.insert(b"t0").unwrap(), Inserted::Existing(0));
    }

    #[test]
    fn built_table_reports_the_first_repeat() {
        let mut texts = Texts::with_capacity(0, 0);
        for s in ["a", "b", "c", "b", "a", "c", "c"] {
            texts.push(s.as_bytes()).unwrap();
        }
        assert_eq!(TextTable::build(texts.clone(), |_| true).unwrap_err(), (1, 3));
        // a repeat of an unindexed text is none
        assert_eq!(TextTable::build(texts, |id| id != 1).unwrap_err(), (0, 4));
    }
}
