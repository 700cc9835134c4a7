//! Byte-level BPE (`llm_tokenizer_bpe_session`): pre-tokenize, then merge adjacent symbols
//! of each pre-token by merge rank (lowest rank first, leftmost on ties).
//!
//! llama.cpp works on GPT-2 byte-level *encoded* strings; since that encoding maps each raw
//! byte to one character and back without loss, this implementation keys the vocabulary and
//! the merges by the raw bytes they stand for and merges raw bytes directly: same decisions,
//! no re-encoding of the text.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ferrollama_gguf::Strings;

use crate::hash::FastMap;
use crate::partition::Fragment;
use crate::texts::{Inserted, TextTable, Texts};
use crate::pretok::{PreKind, PreTokenizer, Words};
use crate::unicode;
use crate::{spm, Token, Vocab, VocabError};

const NONE: u32 = u32::MAX;

/// Which session variant the tokenizer model selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session { Plain, HybridDna, Whitespace }

/// The BPE tables.
#[derive(Debug)]
pub(crate) struct Bpe {
    pub kind: PreKind,
    pre: PreTokenizer,
    session: Session,
    /// Number of tokens: keys below it are token ids.
    n_tokens: u32,
    /// Every token, keyed by the bytes BPE symbols hold (its text, decoded when byte-level
    /// encoded: then unindexed and empty when not decodable), and every other string a merge
    /// makes, numbered from `n_tokens` on. Byte-level vocabularies find their tokens by text
    /// through these keys ([`Bpe::find_token`]).
    keys: TextTable,
    /// Key of each single-byte symbol.
    byte_keys: [u32; 256],
    ranks: Ranks,
    /// Tokens whose text is exactly one byte (the byte-level fallback looks these up).
    single_byte: [Option<Token>; 256],
    /// `<0xXX>` tokens (the fallback of SPM-style BPE).
    hex_byte: [Option<Token>; 256],
}

/// The rank of each merge, found by what it makes: the key of the merged string and the
/// length of its left side. That pair names the two sides exactly (they are the merged
/// string cut at that length), so this is llama.cpp's (left, right) -> rank map; but it is
/// built without looking the sides up, and mostly without looking up anything (see
/// [`merge_ranks`]).
#[derive(Debug, Default)]
struct Ranks {
    /// Per key: (left length, rank) of the first merge making that key; left length 0 (no
    /// side is empty) where no merge makes it.
    first: Vec<(u32, u32)>,
    /// Merges making an already made key with another cut (the pair of which is again keyed
    /// by the key and the left length), for vocabularies that have them.
    other_cuts: FastMap<u64, u32>,
}

impl Ranks {
    fn cut_key(key: u32, left_len: u32) -> u64 { ((key as u64) << 32) | left_len as u64 }

    /// Records a merge; where the same two sides were merged before, the first rank stays.
    fn add(&mut self, key: u32, left_len: u32, rank: u32) {
        let k = key as usize;
        if k >= self.first.len() {
            self.first.resize(k + 1, (0, 0));
        }
        match self.first[k] {
            (0, _) => self.first[k] = (left_len, rank),
            (len, _) if len == left_len => {}
            _ => {
                self.other_cuts.entry(Self::cut_key(key, left_len)).or_insert(rank);
            }
        }
    }

    /// Rank of merging a symbol of `left_len` bytes with the next one into the string of `key`.
    #[inline]
    fn get(&self, key: u32, left_len: usize) -> Option<u32> {
        let &(len, rank) = self.first.get(key as usize)?;
        if len as usize == left_len {
            Some(rank)
        } else if len == 0 || self.other_cuts.is_empty() {
            None
        } else {
            self.other_cuts.get(&Self::cut_key(key, left_len as u32)).copied()
        }
    }
}

/// `text` as BPE symbols hold it, appended to `out`: decoded from the byte-level encoding when
/// `byte_encode` (false, with `out` unchanged, for a text that is not such an encoding: it
/// can never be produced from text).
fn append_key(text: &[u8], byte_encode: bool, out: &mut Vec<u8>) -> bool {
    if byte_encode {
        unicode::append_byte_decoded(text, out)
    } else {
        out.extend_from_slice(text);
        true
    }
}

/// The byte-level decoding of every text, in order (an empty text where one does not decode),
/// and which ones decode. Decoding is one to one: the decoded texts are as distinct as the texts.
pub(crate) fn decode_texts(texts: &Texts) -> Result<(Texts, Vec<bool>), VocabError> {
    let mut decoded = Texts::with_capacity(texts.len(), texts.total_len());
    let mut decodes = vec![true; texts.len()];
    for (id, text) in texts.iter().enumerate() {
        if decoded.push_with(|out| unicode::append_byte_decoded(text, out))?.is_none() {
            decoded.push(b"")?;
            decodes[id] = false;
        }
    }
    Ok((decoded, decodes))
}

/// The ranks of the merges ("left right", in rank order). Strings merges make that are not
/// tokens get keys from `n_tokens` on.
///
/// A merge usually makes the token after the one the previous merge made (BPE training adds
/// a token per merge, and vocabularies list them in that order): that token is tried first,
/// on the texts as written, and only a miss costs decoding the sides and a lookup (a cache
/// miss per merge otherwise).
fn merge_ranks(texts: &TextTable, keys: &mut TextTable, merges: &Strings, byte_encode: bool) -> Result<Ranks, VocabError> {
    let mut ranks = Ranks { first: vec![(0, 0); keys.len()], other_cuts: FastMap::default() };
    let mut merged = Vec::new();
    let mut guess = 0;
    for (rank, merge) in merges.iter().enumerate() {
        // split at the first space after position 0; no space: never applicable
        let Some(p) = merge.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else { continue };
        let (left, right) = (&merge[..p], &merge[p + 1..]);
        let (key, left_len) = match merge_makes(texts, keys, guess, left, right, byte_encode) {
            Some(left_len) => (guess, left_len),
            None => {
                merged.clear();
                let left_ok = append_key(left, byte_encode, &mut merged);
                let left_len = merged.len();
                if !left_ok || left_len == 0 || !append_key(right, byte_encode, &mut merged) || merged.len() == left_len {
                    continue; // a side never produced from text, or empty: never applicable
                }
                (key_or_insert(keys, &merged)?, left_len)
            }
        };
        ranks.add(key, left_len as u32, rank as u32);
        guess = key + 1;
    }
    Ok(ranks)
}

/// Whether token `id` is what merging `left` and `right` (as the merges write them) makes,
/// and then the length of the left side as a key. So it is when the token's text is the two
/// sides end to end, cut between two characters, and the token has a key (its text decodes):
/// the sides then decode too, into the parts of that key.
fn merge_makes(texts: &TextTable, keys: &TextTable, id: u32, left: &[u8], right: &[u8], byte_encode: bool) -> Option<usize> {
    if id as usize >= texts.len() || right.is_empty() {
        return None;
    }
    let text = texts.get(id);
    let joined = text.len() == left.len() + right.len() && text.starts_with(left) && text.ends_with(right);
    // a continuation byte first would be the end of the left side's last character
    let between_characters = !unicode::is_continuation(right[0]);
    if !joined || !between_characters || keys.get(id).is_empty() {
        return None;
    }
    // decoding turns each character into one byte
    Some(if byte_encode { left.iter().filter(|&&b| !unicode::is_continuation(b)).count() } else { left.len() })
}

/// The key of `text`, added if new.
fn key_or_insert(keys: &mut TextTable, text: &[u8]) -> Result<u32, VocabError> {
    if let Some(key) = keys.find(text) {
        return Ok(key);
    }
    match keys.insert(text)? {
        Inserted::New(key) | Inserted::Existing(key) => Ok(key),
    }
}

impl Bpe {
    /// The tables of a vocabulary whose texts are `texts`, with `keys` as [`Bpe::keys`] holds
    /// them: the texts decoded ([`decode_texts`]) for a byte-level vocabulary, else the texts.
    pub fn new(model: &str, kind: PreKind, texts: &TextTable, mut keys: TextTable, merges: &Strings) -> Result<Bpe, VocabError> {
        let pre = PreTokenizer::new(kind)
            .map_err(|e| VocabError::Invalid(format!("pre-tokenizer regex {:?}: {}", e.regex, e.reason)))?;
        let byte_encode = pre.byte_encode();
        let n_tokens = texts.len() as u32;
        let ranks = merge_ranks(texts, &mut keys, merges, byte_encode)?;
        let byte_keys = std::array::from_fn(|b| keys.find(&[b as u8]).unwrap_or(NONE));
        let session = match model {
            "hybriddna" => Session::HybridDna,
            "whitespace" => Session::Whitespace,
            _ => Session::Plain,
        };
        let mut bpe = Bpe { kind, pre, session, n_tokens, keys, byte_keys, ranks, single_byte: [None; 256], hex_byte: [None; 256] };
        for b in 0..=255u8 {
            bpe.single_byte[b as usize] = bpe.find_token(&[b], texts);
            bpe.hex_byte[b as usize] = bpe.find_token(format!("<0x{b:02X}>").as_bytes(), texts);
        }
        Ok(bpe)
    }

    /// The token whose text is `text`. A byte-level vocabulary indexes only the `texts` that do
    /// not decode; the others are found by their keys.
    pub fn find_token(&self, text: &[u8], texts: &TextTable) -> Option<Token> {
        if !self.pre.byte_encode() {
            return texts.find(text);
        }
        let mut key = Vec::with_capacity(text.len());
        if unicode::append_byte_decoded(text, &mut key) {
            self.token_of(&key)
        } else {
            texts.find(text)
        }
    }

    /// The bytes a token stands for when the vocabulary is byte-level encoded and the token's
    /// text is such an encoding (its key).
    pub fn byte_decoded(&self, id: Token) -> Option<&[u8]> {
        if !self.pre.byte_encode() || id >= self.n_tokens {
            return None;
        }
        Some(self.keys.get(id)).filter(|key| !key.is_empty()) // undecodable tokens' keys are empty
    }

    /// The BPE branch of `llama_vocab::impl::tokenize`.
    pub fn tokenize(&self, v: &Vocab, raw: &[u8], fragments: &[Fragment], add_special: bool, out: &mut Vec<Token>) -> Result<(), VocabError> {
        if add_special && v.opts.add_bos {
            out.push(v.special.bos.ok_or_else(|| VocabError::Invalid("add_bos is set but the vocabulary has no BOS".into()))?);
        }
        let mut escaped = Vec::new();
        let mut scratch = Scratch::default();
        for f in fragments {
            match *f {
                Fragment::Text { start, end } => {
                    let text = &raw[start..end];
                    if v.opts.escape_whitespaces {
                        escaped.clear();
                        spm::escape_whitespace(text, &mut escaped);
                        self.session_tokenize(v, &escaped, &mut scratch, out)?;
                    } else {
                        self.session_tokenize(v, text, &mut scratch, out)?;
                    }
                }
                Fragment::Token(t) => out.push(t),
            }
        }
        if add_special && v.opts.add_eos {
            out.push(v.special.eos.ok_or_else(|| VocabError::Invalid("add_eos is set but the vocabulary has no EOS".into()))?);
        }
        Ok(())
    }

    fn session_tokenize(&self, v: &Vocab, text: &[u8], scratch: &mut Scratch, out: &mut Vec<Token>) -> Result<(), VocabError> {
        match self.session {
            Session::Plain => self.tokenize_text(text, v.opts.ignore_merges, scratch, out),
            Session::HybridDna => self.tokenize_dna(v, text, scratch, out),
            Session::Whitespace => self.tokenize_whitespace(v, text, scratch, out),
        }
    }

    /// `llm_tokenizer_bpe_session::tokenize`: pre-tokenize, then BPE each pre-token. Equal
    /// pre-tokens give equal tokens, so each distinct one is merged once per `tokenize` call.
    fn tokenize_text(&self, text: &[u8], ignore_merges: bool, scratch: &mut Scratch, out: &mut Vec<Token>) -> Result<(), VocabError> {
        let words: Words = self.pre.split(text).map_err(|e| {
            VocabError::Invalid(format!("code point 0x{:X} beyond U+10FFFF in text", e.0))
        })?;
        for word in words.iter() {
            if word.is_empty() {
                continue;
            }
            if let Some(&(s, e)) = scratch.cache.get(word) {
                out.extend_from_slice(&scratch.cached[s..e]);
                continue;
            }
            let start = out.len();
            self.encode_word(word, ignore_merges, &mut scratch.merger, out);
            if word.len() <= MAX_CACHED_WORD {
                let s = scratch.cached.len();
                scratch.cached.extend_from_slice(&out[start..]);
                scratch.cache.insert(word.into(), (s, scratch.cached.len()));
            }
        }
        Ok(())
    }

    /// BPE over one pre-token.
    fn encode_word(&self, word: &[u8], ignore_merges: bool, m: &mut Merger, out: &mut Vec<Token>) {
        let byte_encode = self.pre.byte_encode();
        m.symbols.clear();
        m.queue.clear();
        let word_token = self.token_of(word);
        let whole = word_token.is_some()
            && (ignore_merges || (self.kind == PreKind::Gemma4 && word.iter().all(|&b| b == b'\n')));
        if whole {
            m.symbols.push(Sym { start: 0, len: word.len(), prev: -1, next: -1, key: self.key_of(word) });
        } else {
            let mut offset = 0;
            while offset < word.len() {
                let len = if byte_encode { 1 } else { unicode::len_utf8(word[offset]).min(word.len() - offset) };
                let index = m.symbols.len() as isize;
                let next = if offset + len == word.len() { -1 } else { index + 1 };
                let key = if byte_encode { self.byte_keys[word[offset] as usize] } else { self.key_of(&word[offset..offset + len]) };
                m.symbols.push(Sym { start: offset, len, prev: index - 1, next, key });
                offset += len;
            }
            for i in 1..m.symbols.len() as isize {
                self.add_bigram(word, m, i - 1, i);
            }
            self.merge(word, m);
        }
        let mut i = if m.symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = m.symbols[i as usize];
            if s.len > 0 {
                self.emit_symbol(&word[s.start..s.start + s.len], s.key, out);
            }
            i = s.next;
        }
    }

    fn key_of(&self, bytes: &[u8]) -> u32 { self.keys.find(bytes).unwrap_or(NONE) }

    /// The token whose (decoded) text is `bytes`.
    fn token_of(&self, bytes: &[u8]) -> Option<Token> { self.keys.find(bytes).filter(|&k| k < self.n_tokens) }

    /// Queues the merge of symbols `left` and `right` if there is one.
    fn add_bigram(&self, word: &[u8], m: &mut Merger, left: isize, right: isize) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (m.symbols[left as usize], m.symbols[right as usize]);
        let size = l.len + r.len;
        let key = self.key_of(&word[l.start..l.start + size]);
        if key == NONE {
            return;
        }
        if let Some(rank) = self.ranks.get(key, l.len) {
            m.queue.push(Reverse(Candidate { rank, left: left as usize, right: right as usize, size, key }));
        }
    }

    fn merge(&self, word: &[u8], m: &mut Merger) {
        while let Some(Reverse(Candidate { left, right, size, key, .. })) = m.queue.pop() {
            let (l, r) = (m.symbols[left], m.symbols[right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != size {
                continue; // outdated: a side was merged since
            }
            let merged = &mut m.symbols[left];
            merged.len += r.len;
            merged.next = r.next;
            merged.key = key;
            let (prev, next) = (merged.prev, merged.next);
            m.symbols[right].len = 0;
            if next >= 0 {
                m.symbols[next as usize].prev = left as isize;
            }
            self.add_bigram(word, m, prev, left as isize);
            self.add_bigram(word, m, left as isize, next);
        }
    }

    /// A final symbol: its token, else the per-byte fallback llama.cpp uses (single-byte
    /// tokens of the encoded text, or `<0xXX>` without byte-level encoding); bytes without a
    /// fallback token are dropped, as there.
    fn emit_symbol(&self, bytes: &[u8], key: u32, out: &mut Vec<Token>) {
        if key < self.n_tokens {
            out.push(key);
            return;
        }
        if self.pre.byte_encode() {
            let mut encoded = Vec::with_capacity(2);
            for &b in bytes {
                encoded.clear();
                unicode::push_byte_encoded(b, &mut encoded);
                out.extend(encoded.iter().filter_map(|&e| self.single_byte[e as usize]));
            }
        } else {
            out.extend(bytes.iter().filter_map(|&b| self.hex_byte[b as usize]));
        }
    }

    /// hybriddna: `<dna>...</dna>` spans become 6-mer tokens, the rest plain BPE.
    fn tokenize_dna(&self, v: &Vocab, text: &[u8], scratch: &mut Scratch, out: &mut Vec<Token>) -> Result<(), VocabError> {
        const OPEN: &[u8] = b"<dna>";
        const CLOSE: &[u8] = b"</dna>";
        let ids = (v.text_to_token(OPEN), v.text_to_token(CLOSE), v.text_to_token(b"<oov>"));
        let (Some(begin_id), Some(end_id), Some(oov_id)) = ids else {
            return self.tokenize_text(text, v.opts.ignore_merges, scratch, out);
        };
        let find = |hay: &[u8], needle: &[u8], from: usize| {
            hay.get(from..).and_then(|h| h.windows(needle.len()).position(|w| w == needle)).map(|p| p + from)
        };
        let mut pos = 0;
        while pos < text.len() {
            let Some(start) = find(text, OPEN, pos) else {
                self.tokenize_text(&text[pos..], v.opts.ignore_merges, scratch, out)?;
                break;
            };
            if start > pos {
                self.tokenize_text(&text[pos..start], v.opts.ignore_merges, scratch, out)?;
            }
            out.push(begin_id);
            let content_start = start + OPEN.len();
            let end = find(text, CLOSE, content_start);
            let content_end = end.unwrap_or(text.len());
            emit_kmers(v, &text[content_start..content_end], oov_id, out);
            let Some(end) = end else { break };
            out.push(end_id);
            pos = end + CLOSE.len();
        }
        Ok(())
    }

    /// whitespace: whitespace-separated segments (optionally lower-cased), each BPE'd.
    fn tokenize_whitespace(&self, v: &Vocab, text: &[u8], scratch: &mut Scratch, out: &mut Vec<Token>) -> Result<(), VocabError> {
        let mut segment = Vec::new();
        for cpt in unicode::cpts_from_utf8(text) {
            if unicode::flags(cpt).is_whitespace() {
                if !segment.is_empty() {
                    self.tokenize_text(&segment, v.opts.ignore_merges, scratch, out)?;
                    segment.clear();
                }
            } else {
                let c = if v.opts.lowercase { unicode::to_lower(cpt) } else { cpt };
                unicode::push_utf8(c, &mut segment)
                    .map_err(|e| VocabError::Invalid(format!("code point 0x{:X} beyond U+10FFFF in text", e.0)))?;
            }
        }
        if !segment.is_empty() {
            self.tokenize_text(&segment, v.opts.ignore_merges, scratch, out)?;
        }
        Ok(())
    }
}

/// k-mers of 6 upper-cased bases (the last one padded with 'A'), each the token of the k-mer
/// text plus the U+E000 marker, or `<oov>`.
fn emit_kmers(v: &Vocab, raw: &[u8], oov: Token, out: &mut Vec<Token>) {
    const K: usize = 6;
    const MARKER: &str = "\u{E000}";
    let seq: Vec<u8> = raw.iter().map(|b| b.to_ascii_uppercase()).collect();
    let kmer_token = |kmer: &[u8]| {
        let mut key = kmer.to_vec();
        key.extend_from_slice(MARKER.as_bytes());
        v.text_to_token(&key).unwrap_or(oov)
    };
    let mut i = 0;
    while i + K <= seq.len() {
        out.push(kmer_token(&seq[i..i + K]));
        i += K;
    }
    if i < seq.len() {
        let mut kmer = seq[i..].to_vec();
        kmer.resize(K, b'A');
        out.push(kmer_token(&kmer));
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
    /// Key of the symbol's bytes: a token id, the number of a string merges make, or NONE.
    key: u32,
}

/// Pre-tokens longer than this are not cached (rarely repeated, costly to keep).
const MAX_CACHED_WORD: usize = 64;

/// Per-call state: the merge scratch space and the tokens of every pre-token seen so far.
#[derive(Default)]
struct Scratch {
    merger: Merger,
    cache: FastMap<Box<[u8]>, (usize, usize)>,
    cached: Vec<Token>,
}

/// A merge of two adjacent symbols, ordered by rank, then position (the fields after follow
/// from those).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    /// Length of the merged symbol (a side merged since makes the candidate outdated).
    size: usize,
    /// Key of the merged symbol's bytes.
    key: u32,
}

/// Scratch space reused across pre-tokens.
#[derive(Default)]
struct Merger {
    symbols: Vec<Sym>,
    /// Candidate merges, the lowest rank first, then the leftmost.
    queue: BinaryHeap<Reverse<Candidate>>,
}
