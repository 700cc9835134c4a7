//! The vocabulary as the samplers need it: bytes per token and which tokens end generation.

/// For every token id, its detokenized piece (bytes, as `token_to_piece` renders it), and
/// the end-of-generation token ids. The bindings build it from the tokenizer and share it
/// (`Arc<TokenPieces>`) between the grammar, DRY and infill samplers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenPieces {
    /// `pieces[id]` is the text of token `id`.
    pub pieces: Vec<Vec<u8>>,
    /// The tokens that end generation (EOS, EOT, ...).
    pub eog: Vec<u32>,
}

impl TokenPieces {
    /// The number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    /// The piece of a token; empty for an id outside the vocabulary.
    pub fn piece(&self, token: u32) -> &[u8] {
        self.pieces.get(token as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// A per-token flag table of the end-of-generation tokens (ids outside the vocabulary
    /// are ignored).
    pub(crate) fn eog_flags(&self) -> Vec<bool> {
        let mut flags = vec![false; self.pieces.len()];
        for &t in &self.eog {
            if let Some(f) = flags.get_mut(t as usize) {
                *f = true;
            }
        }
        flags
    }
}
