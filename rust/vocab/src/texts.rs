//! Token texts kept in one buffer (one allocation for the whole vocabulary instead of one per
//! token), and a table from text to id built over that buffer.

use crate::hash::{hash_bytes, IdIndex, Probe};
use crate::VocabError;

/// A list of byte strings stored end to end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Texts {
    bytes: Vec<u8>,
    /// End of each text in `bytes`; a text starts where the previous one ends.
    ends: Vec<u32>,
}

impl Texts {
    /// An empty list with room for `n` texts of `total_len` bytes together.
    pub fn with_capacity(n: usize, total_len: usize) -> Texts {
        Texts { bytes: Vec::with_capacity(total_len), ends: Vec::with_capacity(n) }
    }

    /// Number of texts.
    pub fn len(&self) -> usize { self.ends.len() }

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
        Ok(Some(self.ends.len() as u32 - 1))
    }

    /// Removes the last text.
    fn pop(&mut self) {
        self.ends.pop();
        self.bytes.truncate(self.ends.last().map_or(0, |&e| e as usize));
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
    /// An empty table with room for `n` texts of `total_len` bytes together.
    pub fn with_capacity(n: usize, total_len: usize) -> TextTable {
        TextTable { texts: Texts::with_capacity(n, total_len), index: IdIndex::with_capacity(n) }
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

    /// Adds a text under the next id without indexing it ([`TextTable::find`] will not see it).
    pub fn push_unindexed(&mut self, text: &[u8]) -> Result<u32, VocabError> { self.texts.push(text) }
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
    }

    #[test]
    fn table_finds_every_text_and_rejects_duplicates() {
        // start small so that the index grows several times
        let mut table = TextTable::with_capacity(1, 0);
        let words: Vec<Vec<u8>> = (0..5000u32).map(|i| format!("w{}", i * 7919 % 10007).into_bytes()).collect();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(table.insert(w).unwrap(), Inserted::New(i as u32));
        }
        let hidden = table.push_unindexed(b"hidden").unwrap();
        assert_eq!(table.insert(&words[17]).unwrap(), Inserted::Existing(17));
        assert_eq!(table.len(), words.len() + 1);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(table.find(w), Some(i as u32));
            assert_eq!(table.get(i as u32), w.as_slice());
        }
        assert_eq!(table.get(hidden), b"hidden");
        assert_eq!(table.find(b"hidden"), None);
        assert_eq!(table.find(b"w"), None);
        assert_eq!(table.find(b""), None);
        assert_eq!(table.insert(b"").unwrap(), Inserted::New(hidden + 1));
        assert_eq!(table.find(b""), Some(hidden + 1));
    }
}
