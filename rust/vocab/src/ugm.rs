//! Unigram (`llm_tokenizer_ugm`, T5): SentencePiece normalization through the precompiled
//! charsmap (an XOR-compressed double array), then a Viterbi search for the best-scoring
//! segmentation, unknown code points scored at (lowest normal score - 10).

use ferrollama_gguf::{Array, GgufFile, Value};

use crate::attr::TokenAttr;
use crate::partition::Fragment;
use crate::unicode;
use crate::texts::Texts;
use crate::{spm, Token, TokenData, Vocab, VocabError};

fn invalid(msg: &str) -> VocabError { VocabError::Invalid(msg.into()) }

/// A byte trie (llama.cpp's `naive_trie`).
#[derive(Debug, Default)]
struct Trie {
    children: Vec<Vec<(u8, u32)>>,
    value: Vec<Option<Token>>,
}

impl Trie {
    fn new() -> Trie { Trie { children: vec![Vec::new()], value: vec![None] } }

    fn insert(&mut self, key: &[u8], value: Token) {
        let mut node = 0;
        for &b in key {
            node = match self.children[node].binary_search_by_key(&b, |&(c, _)| c) {
                Ok(i) => self.children[node][i].1 as usize,
                Err(i) => {
                    let new = self.children.len();
                    self.children.push(Vec::new());
                    self.value.push(None);
                    self.children[node].insert(i, (b, new as u32));
                    new
                }
            };
        }
        self.value[node] = Some(value);
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        let c = &self.children[node];
        c.binary_search_by_key(&b, |&(x, _)| x).ok().map(|i| c[i].1 as usize)
    }

    /// Depth of the longest trie path the key follows, terminal or not
    /// (`naive_trie::get_longest_prefix`).
    fn longest_path(&self, key: &[u8]) -> usize {
        let mut node = 0;
        for (depth, &b) in key.iter().enumerate() {
            match self.child(node, b) {
                Some(n) => node = n,
                None => return depth,
            }
        }
        key.len()
    }
}

/// The precompiled charsmap: XCDA entries and NUL-terminated replacement strings.
#[derive(Debug, Default)]
struct Charsmap {
    xcda: Vec<u32>,
    replacements: Vec<u8>,
}

impl Charsmap {
    fn node(&self, index: u32) -> Result<u32, VocabError> {
        self.xcda.get(index as usize).copied().ok_or_else(|| invalid("Index out of array bounds in XCDA array!"))
    }
    fn base(&self, index: u32) -> Result<u32, VocabError> {
        let packed = self.node(index)?;
        Ok((packed >> 10) << ((packed & (1 << 9)) >> 6))
    }
    fn lcheck(&self, index: u32) -> Result<u32, VocabError> { Ok(self.node(index)? & ((1 << 31) | 0xFF)) }
    fn leaf(&self, index: u32) -> Result<bool, VocabError> { Ok((self.node(index)? >> 8) & 1 == 1) }
    fn value(&self, index: u32) -> Result<u32, VocabError> { Ok(self.node(index)? & ((1 << 31) - 1)) }

    /// Longest normalized prefix of `input`: (bytes matched, replacement offset).
    fn longest_match(&self, input: &[u8]) -> Result<Option<(usize, u32)>, VocabError> {
        if self.xcda.is_empty() {
            return Ok(None);
        }
        let mut found = None;
        let mut node = self.base(0)?;
        for (i, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= c as u32;
            if self.lcheck(node)? != c as u32 {
                break;
            }
            let is_leaf = self.leaf(node)?;
            node ^= self.base(node)?;
            if is_leaf {
                found = Some((i + 1, self.value(node)?));
            }
        }
        Ok(found)
    }

    fn replacement(&self, offset: u32) -> Result<&[u8], VocabError> {
        let rest = self.replacements.get(offset as usize..).filter(|r| !r.is_empty())
            .ok_or_else(|| invalid("Index out of array bounds in precompiled charsmap!"))?;
        let len = rest.iter().position(|&b| b == 0).ok_or_else(|| invalid("Unterminated string in precompiled charsmap!"))?;
        Ok(&rest[..len])
    }
}

/// UGM tables.
#[derive(Debug)]
pub(crate) struct Ugm {
    charsmap: Charsmap,
    user_defined: Trie,
    tokens: Trie,
    unknown_score: f64,
}

fn read_charsmap(f: &GgufFile) -> Result<Charsmap, VocabError> {
    let bytes: Vec<u8> = match f.get("tokenizer.ggml.precompiled_charsmap") {
        None => return Ok(Charsmap::default()),
        Some(Value::Array(Array::U8(b))) => b.clone(),
        Some(Value::Array(Array::I8(b))) => b.iter().map(|&x| x as u8).collect(),
        Some(_) => return Err(invalid("invalid gguf type for tokenizer.ggml.precompiled_charsmap")),
    };
    if bytes.len() < 4 {
        return Err(invalid("precompiled_charsmap too small for xcda_blob_size header!"));
    }
    let blob = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if blob + 4 >= bytes.len() {
        return Err(invalid("Index out of array bounds in precompiled charsmap!"));
    }
    let xcda = bytes[4..4 + blob / 4 * 4].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Charsmap { xcda, replacements: bytes[4 + blob..].to_vec() })
}

impl Ugm {
    pub fn new(f: &GgufFile, tokens: &[TokenData], texts: &Texts) -> Result<Ugm, VocabError> {
        let charsmap = read_charsmap(f)?;
        let (mut user_defined, mut matcher) = (Trie::new(), Trie::new());
        let mut min_score = f32::MAX;
        for (id, (t, text)) in tokens.iter().zip(texts.iter()).enumerate() {
            if t.attr.intersects(TokenAttr::NORMAL) {
                min_score = min_score.min(t.score);
            }
            if t.attr.intersects(TokenAttr::NORMAL.with(TokenAttr::USER_DEFINED).with(TokenAttr::UNUSED)) {
                matcher.insert(text, id as Token);
            }
            if t.attr.intersects(TokenAttr::USER_DEFINED) {
                user_defined.insert(text, 0);
            }
        }
        Ok(Ugm { charsmap, user_defined, tokens: matcher, unknown_score: (min_score - 10.0) as f64 })
    }

    /// One normalization step at the start of `input`: (replacement bytes, bytes consumed).
    fn normalize_prefix<'a>(&'a self, input: &'a [u8]) -> Result<(&'a [u8], usize), VocabError> {
        let user = self.user_defined.longest_path(input);
        if user > 0 {
            return Ok((&input[..user], user));
        }
        if let Some((len, offset)) = self.charsmap.longest_match(input)? {
            return Ok((self.charsmap.replacement(offset)?, len));
        }
        Ok(match unicode::decode_one(input, 0) {
            Some((_, n)) => (&input[..n], n),
            None => ("\u{FFFD}".as_bytes(), 1),
        })
    }

    fn normalize(&self, v: &Vocab, input: &[u8]) -> Result<Vec<u8>, VocabError> {
        let space: &[u8] = if v.opts.escape_whitespaces { spm::ESCAPED_SPACE } else { b" " };
        let prepend = !v.opts.treat_whitespace_as_suffix && v.opts.add_space_prefix;
        let append = v.opts.treat_whitespace_as_suffix && v.opts.add_space_prefix;
        let merge = v.opts.remove_extra_whitespaces;
        let mut out = Vec::with_capacity(input.len() * 3);
        let (mut space_prepended, mut in_word) = (false, false);
        let mut offset = 0;
        while offset < input.len() {
            let (normalized, consumed) = self.normalize_prefix(&input[offset..])?;
            for &c in normalized {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prepend && !space_prepended) || merge {
                            out.extend_from_slice(space);
                            space_prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            offset += consumed;
        }
        if append {
            out.extend_from_slice(space);
        }
        Ok(out)
    }

    /// Viterbi over the normalized text; consecutive unknowns collapse into one.
    fn session(&self, v: &Vocab, text: &[u8], out: &mut Vec<Token>) -> Result<(), VocabError> {
        #[derive(Clone, Copy)]
        struct Best { token: Option<Token>, from: usize, score: f64 }
        let norm = self.normalize(v, text)?;
        let n = norm.len();
        if n == 0 {
            return Ok(());
        }
        let unk = v.special.unk;
        let mut best = vec![Best { token: unk, from: 0, score: -f64::MAX }; n + 1];
        best[0] = Best { token: unk, from: 0, score: 0.0 };
        let mut offset = 0;
        while offset < n {
            let char_len = unicode::len_utf8(norm[offset]).min(n - offset);
            let current = best[offset];
            let mut whole_char_found = false;
            let mut node = self.tokens.child(0, norm[offset]);
            let mut end = offset + 1;
            while let Some(nd) = node {
                if let Some(id) = self.tokens.value[nd] {
                    whole_char_found |= end - offset == char_len;
                    let data = &v.tokens[id as usize];
                    let token_score = if data.attr.intersects(TokenAttr::USER_DEFINED) { 0.0 } else { data.score as f64 };
                    let challenger = current.score + token_score;
                    if challenger > best[end].score {
                        best[end] = Best { token: Some(id), from: offset, score: challenger };
                    }
                }
                if end >= n {
                    break;
                }
                node = self.tokens.child(nd, norm[end]);
                end += 1;
            }
            if !whole_char_found {
                let challenger = current.score + self.unknown_score;
                let end = offset + char_len;
                if challenger > best[end].score {
                    best[end] = Best { token: unk, from: offset, score: challenger };
                }
            }
            offset += char_len;
        }
        let start = out.len();
        let mut prev_unknown = false;
        let mut at = best[n];
        loop {
            let unknown = at.token == unk;
            if !(prev_unknown && unknown) {
                out.push(at.token.ok_or_else(|| invalid("unknown piece but the vocabulary has no UNK"))?);
            }
            if at.from == 0 {
                break;
            }
            prev_unknown = unknown;
            at = best[at.from];
        }
        out[start..].reverse();
        Ok(())
    }

    /// The UGM branch of `llama_vocab::impl::tokenize`.
    pub fn tokenize(&self, v: &Vocab, raw: &[u8], fragments: &[Fragment], add_special: bool, out: &mut Vec<Token>) -> Result<(), VocabError> {
        if add_special && v.opts.add_bos {
            out.push(v.special.bos.ok_or_else(|| invalid("add_bos is set but the vocabulary has no BOS"))?);
        }
        for f in fragments {
            match *f {
                Fragment::Text { start, end } => self.session(v, &raw[start..end], out)?,
                Fragment::Token(t) => out.push(t),
            }
        }
        if add_special && v.opts.add_eos {
            out.push(v.special.eos.ok_or_else(|| invalid("add_eos is set but the vocabulary has no EOS"))?);
        }
        Ok(())
    }
}
