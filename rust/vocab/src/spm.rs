//! SentencePiece-style BPE over scores (`llm_tokenizer_spm_session`): characters are merged
//! pairwise, best-scoring vocabulary entry first (leftmost on ties); what never becomes a
//! token falls back to byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::partition::Fragment;
use crate::unicode;
use crate::{Token, Vocab, VocabError};

/// U+2581, SentencePiece's visible space.
pub(crate) const ESCAPED_SPACE: &[u8] = "\u{2581}".as_bytes();

/// The token standing for a raw byte: `<0xXX>`, else the one-byte text itself.
pub(crate) fn byte_to_token(v: &Vocab, byte: u8) -> Option<Token> {
    let hex = format!("<0x{byte:02X}>");
    v.text_to_token(hex.as_bytes()).or_else(|| v.text_to_token(&[byte]))
}

/// Appends `text` with every space replaced by U+2581.
pub(crate) fn escape_whitespace(text: &[u8], out: &mut Vec<u8>) {
    for &b in text {
        if b == b' ' {
            out.extend_from_slice(ESCAPED_SPACE);
        } else {
            out.push(b);
        }
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
}

/// A candidate merge; the heap's greatest is the best score, then the leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // equal scores (including +0 vs -0) tie, and then the smaller left index wins
        let by_score = self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.left.cmp(&self.left)).then_with(|| other.right.cmp(&self.right))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> { Some(self.cmp(other)) }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool { self.cmp(other) == Ordering::Equal }
}
impl Eq for Bigram {}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a [u8],
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Session<'_> {
    fn try_add_bigram(&mut self, left: isize, right: isize) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let size = l.len + r.len;
        if let Some(id) = self.vocab.text_to_token(&self.text[l.start..l.start + size]) {
            let score = self.vocab.tokens[id as usize].score;
            self.queue.push(Bigram { score, left: left as usize, right: right as usize, size });
        }
    }

    fn run(&mut self) {
        let mut offs = 0;
        while offs < self.text.len() {
            let len = unicode::len_utf8(self.text[offs]).min(self.text.len() - offs);
            let index = self.symbols.len() as isize;
            let next = if offs + len == self.text.len() { -1 } else { index + 1 };
            self.symbols.push(Symbol { start: offs, len, prev: index - 1, next });
            offs += len;
        }
        for i in 1..self.symbols.len() as isize {
            self.try_add_bigram(i - 1, i);
        }
        while let Some(b) = self.queue.pop() {
            let (l, r) = (self.symbols[b.left], self.symbols[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue; // one side already merged elsewhere
            }
            self.symbols[b.left].len += r.len;
            self.symbols[b.right].len = 0;
            self.symbols[b.left].next = r.next;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = b.left as isize;
            }
            let left = self.symbols[b.left];
            self.try_add_bigram(left.prev, b.left as isize);
            self.try_add_bigram(b.left as isize, left.next);
        }
    }

    fn output(&self, out: &mut Vec<Token>) -> Result<(), VocabError> {
        let mut i = if self.symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = self.symbols[i as usize];
            let text = &self.text[s.start..s.start + s.len];
            match self.vocab.text_to_token(text) {
                Some(id) => out.push(id),
                None => {
                    for &byte in text {
                        let id = byte_to_token(self.vocab, byte)
                            .ok_or_else(|| VocabError::Invalid(format!("no token for byte 0x{byte:02X}")))?;
                        out.push(id);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }
}

/// Tokenizes an already escaped text, appending to `out`.
pub(crate) fn tokenize_escaped(v: &Vocab, text: &[u8], out: &mut Vec<Token>) -> Result<(), VocabError> {
    let mut session = Session { vocab: v, text, symbols: Vec::with_capacity(text.len()), queue: BinaryHeap::new() };
    session.run();
    session.output(out)
}

/// The SPM branch of `llama_vocab::impl::tokenize`.
pub(crate) fn tokenize(v: &Vocab, raw: &[u8], fragments: &[Fragment], add_special: bool, out: &mut Vec<Token>) -> Result<(), VocabError> {
    let mut is_prev_special = true; // a leading space for the first fragment
    if add_special && v.opts.add_bos {
        out.push(v.special.bos.ok_or_else(|| VocabError::Invalid("add_bos is set but the vocabulary has no BOS".into()))?);
    }
    let mut text = Vec::new();
    for f in fragments {
        match *f {
            Fragment::Text { start, end } => {
                text.clear();
                if v.opts.add_space_prefix && is_prev_special {
                    text.extend_from_slice(ESCAPED_SPACE);
                }
                escape_whitespace(&raw[start..end], &mut text);
                tokenize_escaped(v, &text, out)?;
                is_prev_special = false;
            }
            Fragment::Token(t) => {
                out.push(t);
                is_prev_special = true;
            }
        }
    }
    if add_special && v.opts.add_eos {
        out.push(v.special.eos.ok_or_else(|| VocabError::Invalid("add_eos is set but the vocabulary has no EOS".into()))?);
    }
    Ok(())
}
