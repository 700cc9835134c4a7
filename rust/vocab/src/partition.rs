//! Special-token partitioning (`tokenizer_st_partition`): before any splitting, occurrences
//! of control / user-defined / unknown token texts become tokens, longest texts first, with
//! the LSTRIP / RSTRIP attributes eating adjacent whitespace.

use crate::attr::TokenAttr;
use crate::{Token, Vocab};

/// A piece of the input: raw text still to tokenize, or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text { start: usize, end: usize },
    Token(Token),
}

/// A byte trie over the special token texts, used only to learn which of them occur in a
/// text at all (a token absent from the whole text cannot occur in any fragment of it), so
/// that the exact sequential algorithm runs for those tokens only.
#[derive(Debug, Default)]
pub(crate) struct SpecialIndex {
    /// Children of each node: (byte, node), sorted by byte.
    children: Vec<Vec<(u8, u32)>>,
    /// Position in `special_cache` of the token ending at each node (u32::MAX: none).
    terminal: Vec<u32>,
}

impl SpecialIndex {
    fn new<'a>(texts: impl Iterator<Item = (usize, &'a [u8])>) -> SpecialIndex {
        let mut index = SpecialIndex { children: vec![Vec::new()], terminal: vec![u32::MAX] };
        for (pos, text) in texts {
            let mut node = 0usize;
            for &b in text.iter() {
                node = match index.children[node].binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => index.children[node][i].1 as usize,
                    Err(i) => {
                        let new = index.children.len();
                        index.children.push(Vec::new());
                        index.terminal.push(u32::MAX);
                        index.children[node].insert(i, (b, new as u32));
                        new
                    }
                };
            }
            index.terminal[node] = pos as u32;
        }
        index
    }

    /// Which special-cache positions occur somewhere in `text`.
    fn present(&self, text: &[u8], n: usize) -> Vec<bool> {
        let mut present = vec![false; n];
        if n == 0 {
            return present;
        }
        let root = &self.children[0];
        for start in 0..text.len() {
            let mut node = match root.binary_search_by_key(&text[start], |&(c, _)| c) {
                Ok(i) => root[i].1 as usize,
                Err(_) => continue,
            };
            let mut pos = start + 1;
            loop {
                if let Some(p) = present.get_mut(self.terminal[node] as usize) {
                    *p = true;
                }
                let Some(&b) = text.get(pos) else { break };
                match self.children[node].binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => node = self.children[node][i].1 as usize,
                    Err(_) => break,
                }
                pos += 1;
            }
        }
        present
    }
}

/// Builds the occurrence index once the special cache is final.
pub(crate) fn prepare(v: &mut Vocab) {
    let texts = v.special_cache.iter().enumerate().map(|(pos, &id)| (pos, v.text(id)));
    let index = SpecialIndex::new(texts);
    v.special_index = index;
}

/// `isspace` in the C locale.
fn is_c_space(b: u8) -> bool { b == b' ' || (0x09..=0x0D).contains(&b) }

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while from + needle.len() <= haystack.len() {
        let p = from + haystack[from..=haystack.len() - needle.len()].iter().position(|&b| b == first)?;
        if &haystack[p + 1..p + needle.len()] == rest {
            return Some(p);
        }
        from = p + 1;
    }
    None
}

/// Splits one raw fragment at every occurrence of `needle` (left to right, not overlapping).
fn split_fragment(raw: &[u8], start: usize, end: usize, id: Token, needle: &[u8], attr: TokenAttr, out: &mut Vec<Fragment>) {
    let (mut base, mut len) = (start, end - start);
    loop {
        let Some(m) = find(&raw[base..base + len], needle).map(|p| p + base) else {
            if len > 0 {
                out.push(Fragment::Text { start: base, end: base + len });
            }
            return;
        };
        if m > base {
            let mut left = m - base;
            if attr.intersects(TokenAttr::LSTRIP) {
                while left > 0 && is_c_space(raw[base + left - 1]) {
                    left -= 1;
                }
            }
            if left > 0 {
                out.push(Fragment::Text { start: base, end: base + left });
            }
        }
        out.push(Fragment::Token(id));
        let after = m + needle.len();
        if after >= base + len {
            return;
        }
        let (mut right, mut right_len) = (after, base + len - after);
        if attr.intersects(TokenAttr::RSTRIP) {
            while right_len > 0 && is_c_space(raw[right]) {
                right += 1;
                right_len -= 1;
            }
        }
        base = right;
        len = right_len;
    }
}

/// Partitions `text` into raw fragments and special tokens.
pub(crate) fn partition(v: &Vocab, text: &[u8], parse_special: bool) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text { start: 0, end: text.len() });
    let present = v.special_index.present(text, v.special_cache.len());
    let skipped = TokenAttr::CONTROL.with(TokenAttr::UNKNOWN);
    for (pos, &id) in v.special_cache.iter().enumerate() {
        let data = &v.tokens[id as usize];
        if !present[pos] || (!parse_special && data.attr.intersects(skipped)) {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for f in fragments {
            match f {
                Fragment::Token(_) => next.push(f),
                Fragment::Text { start, end } => split_fragment(text, start, end, id, v.text(id), data.attr, &mut next),
            }
        }
        fragments = next;
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_first_occurrence() {
        assert_eq!(find(b"abcabc", b"ca"), Some(2));
        assert_eq!(find(b"abc", b"abcd"), None);
        assert_eq!(find(b"aaab", b"ab"), Some(2));
        assert_eq!(find(b"", b"a"), None);
    }

    #[test]
    fn strips_around_matches() {
        let raw = b"a <x>  b<x>";
        let mut out = Vec::new();
        split_fragment(raw, 0, raw.len(), 7, b"<x>", TokenAttr::LSTRIP.with(TokenAttr::RSTRIP), &mut out);
        assert_eq!(out, vec![
            Fragment::Text { start: 0, end: 1 },
            Fragment::Token(7),
            Fragment::Text { start: 7, end: 8 },
            Fragment::Token(7),
        ]);
    }
}
