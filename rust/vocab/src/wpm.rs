//! WordPiece (`llm_tokenizer_wpm_session`): BERT-style normalization and splitting, then
//! greedy longest-match of "▁word" against the vocabulary.

use crate::partition::Fragment;
use crate::unicode;
use crate::{spm, Token, Vocab, VocabError};

/// CJK ideographs that become single-character words (with the HF tokenizer's off-by-one
/// range 0x2B920, kept as llama.cpp keeps it).
fn is_chinese_char(cpt: u32) -> bool {
    matches!(cpt,
        0x04E00..=0x09FFF | 0x03400..=0x04DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F |
        0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0x0F900..=0x0FAFF | 0x2F800..=0x2FA1F)
}

fn bad_cpt(cpt: u32) -> VocabError { VocabError::Invalid(format!("code point 0x{cpt:X} beyond U+10FFFF in text")) }

/// Normalizes and splits a text into words (`preprocess`).
fn preprocess(text: &[u8], lowercase: bool, strip_accents: bool) -> Result<Vec<Vec<u8>>, VocabError> {
    let mut words: Vec<Vec<u8>> = vec![Vec::new()];
    for cpt in unicode::cpts_from_utf8(text) {
        let cpt = if strip_accents { unicode::nfd_first(cpt) } else { cpt };
        let flags = unicode::flags(cpt);
        if flags.is_whitespace() {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(Vec::new());
            }
            continue;
        }
        if cpt == 0 || cpt == unicode::REPLACEMENT || flags.is_control() {
            continue;
        }
        if strip_accents && flags.is_accent_mark() {
            continue;
        }
        let mut s = Vec::with_capacity(4);
        unicode::push_utf8(if lowercase { unicode::to_lower(cpt) } else { cpt }, &mut s).map_err(|e| bad_cpt(e.0))?;
        if flags.is_punctuation() || (cpt < 0x7F && flags.is_symbol()) || is_chinese_char(cpt) {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(Vec::new());
            }
            if let Some(last) = words.last_mut() {
                *last = s;
            }
            words.push(Vec::new());
        } else if let Some(last) = words.last_mut() {
            last.extend_from_slice(&s);
        }
    }
    if words.last().is_some_and(|w| w.is_empty()) {
        words.pop();
    }
    Ok(words)
}

/// Greedy longest match of each word; a word that cannot be covered becomes UNK.
fn session(v: &Vocab, text: &[u8], out: &mut Vec<Token>) -> Result<(), VocabError> {
    for word in preprocess(text, v.opts.lowercase, v.opts.strip_accents)? {
        if word.is_empty() {
            continue;
        }
        let mut word1 = spm::ESCAPED_SPACE.to_vec();
        word1.extend_from_slice(&word);
        let n = word1.len();
        let current = out.len();
        let mut i = 0;
        while i < n {
            let longest = (i + 1..=n.min(i + v.max_token_len + 1)).rev().find_map(|j| v.text_to_token(&word1[i..j]).map(|id| (id, j)));
            match longest {
                Some((id, j)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(current);
                    break;
                }
            }
        }
        if out.len() == current {
            out.push(v.special.unk.ok_or_else(|| VocabError::Invalid("unknown word but no UNK token".into()))?);
        }
    }
    Ok(())
}

/// The WPM branch of `llama_vocab::impl::tokenize`: BOS (CLS) and SEP around the text.
pub(crate) fn tokenize(v: &Vocab, raw: &[u8], fragments: &[Fragment], add_special: bool, out: &mut Vec<Token>) -> Result<(), VocabError> {
    if add_special {
        out.push(v.special.bos.ok_or_else(|| VocabError::Invalid("the vocabulary has no BOS (CLS)".into()))?);
    }
    for f in fragments {
        match *f {
            Fragment::Text { start, end } => session(v, &raw[start..end], out)?,
            Fragment::Token(t) => out.push(t),
        }
    }
    if add_special {
        out.push(v.special.sep.ok_or_else(|| VocabError::Invalid("the vocabulary has no SEP".into()))?);
    }
    Ok(())
}
