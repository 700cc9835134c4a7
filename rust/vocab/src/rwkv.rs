//! RWKV's "world" tokenizer (`llm_tokenizer_rwkv`): escaped token texts, greedy longest match
//! over a byte trie.

use crate::partition::Fragment;
use crate::texts::Texts;
use crate::{Token, Vocab, VocabError};

/// `llama_unescape_rwkv_token`: `\t \n \r \xHH` and `\c` escapes.
pub(crate) fn unescape(escaped: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped.len());
    let (mut escaping, mut hex_remaining, mut hex_acc) = (false, 0u8, 0u8);
    for &c in escaped {
        if hex_remaining != 0 {
            let value = if c >= b'a' { c.wrapping_sub(b'a').wrapping_add(10) } else { c.wrapping_sub(b'0') };
            hex_acc = (hex_acc << 4).wrapping_add(value);
            hex_remaining -= 1;
            if hex_remaining == 0 {
                out.push(hex_acc);
                hex_acc = 0;
            }
            continue;
        }
        if escaping {
            match c {
                b't' => out.push(b'\t'),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b'x' => hex_remaining = 2,
                _ => out.push(c),
            }
            escaping = false;
            continue;
        }
        if c == b'\\' {
            escaping = true;
            continue;
        }
        out.push(c);
    }
    out
}

/// The trie of unescaped token texts.
#[derive(Debug)]
pub(crate) struct Rwkv {
    children: Vec<Vec<(u8, u32)>>,
    value: Vec<Option<Token>>,
}

impl Rwkv {
    pub fn new(texts: &Texts) -> Rwkv {
        let mut trie = Rwkv { children: vec![Vec::new()], value: vec![None] };
        for (id, text) in texts.iter().enumerate() {
            let mut node = 0;
            for b in unescape(text) {
                node = match trie.children[node].binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => trie.children[node][i].1 as usize,
                    Err(i) => {
                        trie.children.push(Vec::new());
                        trie.value.push(None);
                        let new = trie.children.len() - 1;
                        trie.children[node].insert(i, (b, new as u32));
                        new
                    }
                };
            }
            trie.value[node] = Some(id as Token);
        }
        trie
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        let c = &self.children[node];
        c.binary_search_by_key(&b, |&(x, _)| x).ok().map(|i| c[i].1 as usize)
    }

    /// Longest match at each position; a byte with no token becomes UNK.
    fn session(&self, v: &Vocab, text: &[u8], out: &mut Vec<Token>) -> Result<(), VocabError> {
        let mut position = 0;
        while position < text.len() {
            let Some(mut node) = self.child(0, text[position]) else {
                out.push(v.special.unk.ok_or_else(|| VocabError::Invalid("byte without token and no UNK".into()))?);
                position += 1;
                continue;
            };
            let (mut token, mut token_end) = (None, 0);
            loop {
                if let Some(id) = self.value[node] {
                    token = Some(id);
                    token_end = position + 1;
                }
                if position + 1 >= text.len() {
                    break;
                }
                position += 1;
                match self.child(node, text[position]) {
                    Some(n) => node = n,
                    None => break,
                }
            }
            // llama.cpp emits id 0 and restarts at 0 when no prefix is a token (an endless
            // loop there); refuse instead
            let id = token.ok_or_else(|| VocabError::Invalid("RWKV text has a prefix matching no token".into()))?;
            out.push(id);
            position = token_end;
        }
        Ok(())
    }

    /// The RWKV branch of `llama_vocab::impl::tokenize` (no BOS/EOS).
    pub fn tokenize(&self, v: &Vocab, raw: &[u8], fragments: &[Fragment], out: &mut Vec<Token>) -> Result<(), VocabError> {
        for f in fragments {
            match *f {
                Fragment::Text { start, end } => self.session(v, &raw[start..end], out)?,
                Fragment::Token(t) => out.push(t),
            }
        }
        Ok(())
    }
}
