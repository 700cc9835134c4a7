//! PLaMo-2's tokenizer (`llm_tokenizer_plamo2`): a table of every token suffix, sorted by
//! reversed text, drives a right-to-left dynamic program over code points that maximizes the
//! summed (scaled, rounded) scores; code points no token covers fall back to byte tokens.

use crate::attr::TokenAttr;
use crate::hash::{fast_map, FastMap};
use crate::partition::Fragment;
use crate::texts::{TextTable, Texts};
use crate::unicode;
use crate::{Token, TokenData, VocabError};

const INVALID_SCORE: i32 = -20_000_000;
const UNKNOWN_SCORE: i32 = -10_000_000;

/// One table row: piece length (code points), token id (-1: none), score, piece (suffix) id.
#[derive(Debug, Clone, Copy)]
struct Row { len: i32, token: i32, score: i32, piece: i32 }

/// The PLaMo-2 tables.
#[derive(Debug)]
pub(crate) struct Plamo2 {
    bytes: [Token; 256],
    to_suffix_id: FastMap<i64, i32>,
    table: Vec<Row>,
}

fn invalid(msg: String) -> VocabError { VocabError::Invalid(msg) }

fn utf8(cpts: &[u32]) -> Result<Vec<u8>, VocabError> {
    let mut out = Vec::with_capacity(cpts.len() * 2);
    for &c in cpts {
        unicode::push_utf8(c, &mut out).map_err(|e| invalid(format!("token text with code point 0x{:X}", e.0)))?;
    }
    Ok(out)
}

/// The byte of a `<0xHH>` byte token.
pub(crate) fn byte_of(text: &[u8]) -> Option<u8> {
    if text.len() != 6 || !text.starts_with(b"<0x") || text[5] != b'>' {
        return None;
    }
    let hex = std::str::from_utf8(&text[3..5]).ok()?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Plamo2 {
    pub fn new(tokens: &[TokenData], texts: &Texts, text_to_id: &TextTable) -> Result<Plamo2, VocabError> {
        let mut bytes = [0 as Token; 256];
        // text -> score; suffixes that are not tokens get NaN
        let mut suffix_score: FastMap<Vec<u8>, f32> = fast_map(tokens.len() * 4);
        for (id, (t, text)) in tokens.iter().zip(texts.iter()).enumerate() {
            if t.attr.intersects(TokenAttr::BYTE) {
                if let Some(b) = byte_of(text) {
                    bytes[b as usize] = id as Token;
                }
                continue;
            }
            suffix_score.insert(text.to_vec(), t.score);
            let cpts = unicode::cpts_from_utf8(text);
            for i in 1..cpts.len() {
                suffix_score.entry(utf8(&cpts[i..])?).or_insert(f32::NAN);
            }
        }
        if let Some(b) = bytes.iter().position(|&id| id == 0) {
            return Err(invalid(format!("Byte token for <0x{b}> is not set")));
        }
        let mut suffixes: Vec<Vec<u8>> = suffix_score.keys().cloned().collect();
        suffixes.push(Vec::new());
        suffixes.sort_unstable_by(|a, b| a.iter().rev().cmp(b.iter().rev()));

        let mut suffix_id: FastMap<&[u8], i32> = fast_map(suffixes.len());
        let mut to_suffix_id = fast_map(suffixes.len());
        let mut n_pieces: i32 = 0;
        let mut split = Vec::with_capacity(suffixes.len());
        for suffix in &suffixes {
            suffix_id.insert(suffix, n_pieces);
            let cpts = unicode::cpts_from_utf8(suffix);
            if cpts.is_empty() {
                n_pieces += 1; // the empty suffix: a sentinel row only
                split.push(cpts);
                continue;
            }
            let remaining = utf8(&cpts[1..])?;
            let rest_id = suffix_id.get(remaining.as_slice()).copied().unwrap_or(0);
            to_suffix_id.insert(((cpts[0] as i64) << 32) | rest_id as i64, n_pieces);
            let mut rows = 1;
            for len in (1..=cpts.len()).rev() {
                if suffix_score.contains_key(&utf8(&cpts[..len])?) {
                    rows += 1;
                }
            }
            n_pieces += rows;
            split.push(cpts);
        }
        let mut table = Vec::with_capacity(n_pieces.max(0) as usize);
        for cpts in &split {
            for len in (1..=cpts.len()).rev() {
                let piece = utf8(&cpts[..len])?;
                let Some(&score) = suffix_score.get(&piece) else { continue };
                let token = text_to_id.find(&piece).map_or(-1, |id| id as i32);
                let score = if score.is_finite() { (score as f64 * 1e4).round() as i32 } else { INVALID_SCORE };
                let piece_id = suffix_id.get(piece.as_slice()).copied().unwrap_or(0);
                table.push(Row { len: len as i32, token, score, piece: piece_id });
            }
            table.push(Row { len: 1, token: -1, score: UNKNOWN_SCORE, piece: 0 });
        }
        Ok(Plamo2 { bytes, to_suffix_id, table })
    }

    /// `encode`: the best-scoring segmentation, right to left.
    fn encode(&self, text: &[u8], out: &mut Vec<Token>) -> Result<(), VocabError> {
        let mut cpts = unicode::cpts_from_utf8(text);
        if cpts.first() == Some(&0xFEFF) {
            cpts.remove(0);
        }
        let n = cpts.len();
        if n == 0 {
            return Ok(());
        }
        let mut scores = vec![1i64 << 60; n + 1];
        scores[n] = 0;
        // per position: (piece length, token id, number of tokens)
        let mut path = vec![(0i32, 0i32, 0i32); n + 1];
        let mut suffix_id: i32 = 0;
        for i in (0..n).rev() {
            let c = cpts[i];
            for row in self.table.iter().skip(suffix_id.max(0) as usize) {
                let code = ((c as i64) << 32) | row.piece as i64;
                suffix_id = self.to_suffix_id.get(&code).copied().unwrap_or(0);
                if suffix_id > 0 || row.score == UNKNOWN_SCORE {
                    break;
                }
            }
            for row in self.table.iter().skip(suffix_id.max(0) as usize) {
                if row.score > INVALID_SCORE {
                    let next = i + row.len as usize;
                    if next <= n {
                        let s = scores[next] - row.score as i64;
                        if s < scores[i] {
                            scores[i] = s;
                            let extra = if row.score == UNKNOWN_SCORE { (c >= 0x80) as i32 + (c >= 0x800) as i32 + (c >= 0x10000) as i32 } else { 0 };
                            path[i] = (row.len, row.token, path[next].2 + 1 + extra);
                        }
                    }
                }
                if row.score == UNKNOWN_SCORE {
                    break;
                }
            }
        }
        let mut pos = 0;
        while pos < n {
            let (len, token, _) = path[pos];
            if token >= 0 {
                out.push(token as Token);
            } else {
                self.push_bytes(cpts[pos], out);
            }
            if len <= 0 {
                return Err(invalid("PLaMo-2 table left a position uncovered".into()));
            }
            pos += len as usize;
        }
        Ok(())
    }

    /// Byte-token fallback of one code point (its UTF-8 bytes, as llama.cpp computes them).
    fn push_bytes(&self, c: u32, out: &mut Vec<Token>) {
        let s = 1 + (c >= 0x80) as u32 + (c >= 0x800) as u32 + (c >= 0x10000) as u32;
        for i in 0..s {
            let lead = if s == 1 { c } else if i == 0 { (0xF00 >> s) & 0xFF } else { 0x80 };
            let b = (lead | ((c >> ((s - i - 1) * 6)) & 0x3F)) & 0xFF;
            out.push(self.bytes[b as usize]);
        }
    }

    /// The PLaMo-2 branch of `llama_vocab::impl::tokenize` (no BOS/EOS).
    pub fn tokenize(&self, raw: &[u8], fragments: &[Fragment], out: &mut Vec<Token>) -> Result<(), VocabError> {
        for f in fragments {
            match *f {
                Fragment::Text { start, end } => self.encode(&raw[start..end], out)?,
                Fragment::Token(t) => out.push(t),
            }
        }
        Ok(())
    }
}
