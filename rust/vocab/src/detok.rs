//! Token to text: the per-token pieces (`token_to_piece`), `llama_detokenize` with its space
//! clean-up, and a streaming decoder.
//!
//! llama.cpp renders every piece when it loads a vocabulary and keeps them; here a piece is
//! rendered when asked for (a copy, or a short rewrite of the token text: about as fast as
//! copying it from a cache, and nothing to build or hold). Loading still renders the few
//! pieces that can fail, so that the same vocabularies fail to load ([`check_pieces`]).

use std::ops::Deref;

use crate::attr::TokenAttr;
use crate::{plamo2, rwkv, spm, unicode, Model, Token, VocabType, Vocab, VocabError};

/// `strtol(text.substr(3, 2), NULL, 16)` cast to a byte, as `token_to_byte` does.
fn token_to_byte(text: &[u8]) -> Option<u8> {
    let hex = text.get(3..)?;
    let hex = &hex[..hex.len().min(2)];
    let mut s = hex.iter().skip_while(|b| b.is_ascii_whitespace()).peekable();
    let negative = match s.peek() {
        Some(b'-') => { s.next(); true }
        Some(b'+') => { s.next(); false }
        _ => false,
    };
    let mut value: i64 = 0;
    for &b in s {
        match (b as char).to_digit(16) {
            Some(d) => value = value * 16 + d as i64,
            None => break,
        }
    }
    Some((if negative { -value } else { value }) as u8)
}

/// `llama_decode_text`: byte-level code points back to bytes; characters outside the byte map
/// become "[UNK_BYTE_0x..<text>]" as in llama.cpp.
fn decode_byte_level(text: &[u8], out: &mut Vec<u8>) -> Result<(), VocabError> {
    if unicode::append_byte_decoded(text, out) {
        return Ok(()); // every character in the map (almost every token)
    }
    for cpt in unicode::cpts_from_utf8(text) {
        match unicode::cpt_to_byte(cpt) {
            Some(b) => out.push(b),
            None => {
                let mut utf8 = Vec::new();
                unicode::push_utf8(cpt, &mut utf8)
                    .map_err(|_| VocabError::Invalid(format!("token text with code point 0x{cpt:X} beyond U+10FFFF")))?;
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in utf8 {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    Ok(())
}

/// Replaces U+2581 by a space (`llama_unescape_whitespace`).
fn unescape_whitespace(text: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(spm::ESCAPED_SPACE) {
            out.push(b' ');
            i += spm::ESCAPED_SPACE.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
}

/// The bytes a byte-level BPE token stands for, as its BPE key holds them (None when not
/// byte-level, or not decodable).
fn byte_decoded(v: &Vocab, id: usize) -> Option<&[u8]> {
    match &v.model {
        Model::Bpe(bpe) => bpe.byte_decoded(id as Token),
        _ => None,
    }
}

/// Appends the piece of one token with `special = true` (what llama.cpp caches at load).
fn render(v: &Vocab, id: usize, out: &mut Vec<u8>) -> Result<(), VocabError> {
    let t = v.tokens[id];
    let text = v.text(id as Token);
    let shown_raw = TokenAttr::UNKNOWN.with(TokenAttr::CONTROL).with(TokenAttr::USER_DEFINED);
    let byte = |out: &mut Vec<u8>| -> Result<(), VocabError> {
        match v.vocab_type {
            VocabType::Wpm => Err(VocabError::Invalid("byte token in a WPM vocabulary".into())),
            _ => {
                let b = token_to_byte(text).ok_or_else(|| VocabError::Invalid("malformed byte token".into()))?;
                out.push(b);
                Ok(())
            }
        }
    };
    match v.vocab_type {
        VocabType::Rwkv => out.extend_from_slice(&rwkv::unescape(text)),
        VocabType::Plamo2 => match plamo2::byte_of(text).filter(|_| t.attr.intersects(TokenAttr::BYTE)) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(text),
        },
        _ if t.attr.intersects(shown_raw) => out.extend_from_slice(text),
        VocabType::Bpe if t.attr.intersects(TokenAttr::NORMAL) => {
            if v.opts.escape_whitespaces {
                unescape_whitespace(text, out);
            } else if let Some(bytes) = byte_decoded(v, id) {
                out.extend_from_slice(bytes);
            } else {
                decode_byte_level(text, out)?;
            }
        }
        _ if t.attr.intersects(TokenAttr::NORMAL) => unescape_whitespace(text, out),
        _ if t.attr.intersects(TokenAttr::BYTE) => byte(out)?,
        _ => {}
    }
    Ok(())
}

/// Whether rendering a token's piece can fail: byte tokens (malformed, or in a WPM
/// vocabulary) and byte-level BPE texts outside the byte map (with a code point beyond
/// U+10FFFF).
fn may_fail(v: &Vocab, id: usize) -> bool {
    let attr = v.tokens[id].attr;
    let byte_level_text = v.vocab_type == VocabType::Bpe && attr.intersects(TokenAttr::NORMAL) && !v.opts.escape_whitespaces;
    attr.intersects(TokenAttr::BYTE) || (byte_level_text && byte_decoded(v, id).is_none())
}

/// Renders, once the attributes are final, the pieces that can fail: llama.cpp fails to
/// load a vocabulary with such a token when it caches the pieces.
pub(crate) fn check_pieces(v: &Vocab) -> Result<(), VocabError> {
    let mut piece = Vec::new();
    for id in (0..v.tokens.len()).filter(|&id| may_fail(v, id)) {
        piece.clear();
        render(v, id, &mut piece)?;
    }
    Ok(())
}

/// Appends `token_to_piece(token, lstrip, special)`: control and unknown tokens are empty
/// unless `special`; `lstrip` removes one leading space.
pub(crate) fn append_piece(v: &Vocab, t: Token, special: bool, lstrip: bool, out: &mut Vec<u8>) {
    let id = t as usize;
    if id >= v.tokens.len() {
        return;
    }
    if !special && v.tokens[id].attr.intersects(TokenAttr::UNKNOWN.with(TokenAttr::CONTROL)) {
        return;
    }
    let start = out.len();
    let rendered = render(v, id, out);
    // check_pieces rendered every piece that can fail when the vocabulary was loaded
    debug_assert!(rendered.is_ok());
    if lstrip && out.get(start) == Some(&b' ') {
        out.remove(start);
    }
}

/// `llama_detokenize`.
pub(crate) fn detokenize(v: &Vocab, tokens: &[Token], remove_special: bool, unparse_special: bool) -> Vec<u8> {
    let mut tokens = tokens;
    let mut remove_space = v.opts.add_space_prefix;
    if remove_special && v.opts.add_bos && !tokens.is_empty() && Some(tokens[0]) == v.special.bos {
        remove_space = false;
        tokens = &tokens[1..];
    }
    if remove_special && v.opts.add_eos && tokens.last().is_some_and(|&t| Some(t) == v.special.eos) {
        tokens = &tokens[..tokens.len() - 1];
    }
    let mut text = Vec::with_capacity(tokens.len() * 4);
    for &t in tokens {
        append_piece(v, t, unparse_special, remove_space, &mut text);
        remove_space = false;
    }
    if v.opts.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// The three in-place passes of llama.cpp's clean-up, reproduced on the same buffer so that
/// their quirks (reads of bytes already rewritten) come out the same.
fn clean_spaces(text: &mut Vec<u8>) {
    // first pass: " ?", " !", " .", " ," lose the space
    let total1 = text.len();
    let mut total = if total1 > 0 { 1 } else { 0 };
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // second pass: a lone apostrophe between spaces loses both spaces
    let total2 = total;
    total = if total2 > 0 { 1 } else { 0 };
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // third pass: " 's", " 'm", " 're", " 've" lose the space
    let total3 = total;
    total = if total3 > 0 { 1 } else { 0 };
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < total3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Incremental detokenizer for generation: [`StreamDecoder::push`] returns the text completed
/// by a token, holding back the bytes of a character split across tokens, so every string
/// it returns is whole UTF-8. Undecodable bytes become U+FFFD.
///
/// Output rule: the concatenation of everything `push` and `flush` return is the lossy UTF-8
/// of the concatenated pieces `token_to_piece(t, special)` (llama.cpp's per-token streaming;
/// no SPM leading-space removal and no clean-up, which are whole-text operations).
pub struct StreamDecoder<V: Deref<Target = Vocab>> {
    vocab: V,
    special: bool,
    pending: Vec<u8>,
}

/// How many bytes a UTF-8 sequence starting with `lead` announces (0 if not a lead byte).
fn sequence_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7F => 1,
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 0,
    }
}

/// Length of the tail of `bytes` that is the beginning of a character still incomplete.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(3) {
        let lead = bytes[n - back];
        if lead & 0xC0 == 0x80 {
            continue; // continuation: look further back
        }
        let need = sequence_len(lead);
        if need > back && std::str::from_utf8(&bytes[n - back..]).is_err_and(|e| e.error_len().is_none()) {
            return back;
        }
        return 0;
    }
    0
}

impl<V: Deref<Target = Vocab>> StreamDecoder<V> {
    /// A decoder rendering control tokens when `special`.
    pub fn new(vocab: V, special: bool) -> Self { StreamDecoder { vocab, special, pending: Vec::new() } }

    /// Adds a token; returns the characters it completes.
    pub fn push(&mut self, token: Token) -> String {
        append_piece(&self.vocab, token, self.special, false, &mut self.pending);
        let keep = incomplete_tail(&self.pending);
        let ready: Vec<u8> = self.pending.drain(..self.pending.len() - keep).collect();
        String::from_utf8_lossy(&ready).into_owned()
    }

    /// Returns whatever is held back (as U+FFFD where incomplete) and resets.
    pub fn flush(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up_passes() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(clean("it 's we 're I 'm they 've"), "it's we're I'm they've");
        assert_eq!(clean("don 't you 'll"), "don 't you 'll");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }

    #[test]
    fn byte_tokens() {
        assert_eq!(token_to_byte(b"<0x0A>"), Some(10));
        assert_eq!(token_to_byte(b"<0xFF>"), Some(255));
        assert_eq!(token_to_byte(b"<0x"), Some(0));
        assert_eq!(token_to_byte(b"<0"), None);
    }

    #[test]
    fn incomplete_tails() {
        assert_eq!(incomplete_tail(b"ab"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail(b"a\xFF"), 0);
        assert_eq!(incomplete_tail(b"a\xE2\x28"), 0);
    }
}
