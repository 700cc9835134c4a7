//! Tokenizers built from a GGUF vocabulary, reproducing llama.cpp's (src/llama-vocab.cpp,
//! src/unicode.cpp at 0c1e570) token for token: SPM (`llama`), BPE (`gpt2` and its
//! variants, with every `tokenizer.ggml.pre` pre-tokenizer), WPM (`bert`), UGM (`t5`) and
//! RWKV (`rwkv`); special-token parsing, detokenization and a streaming decoder.
//!
//! Text input is bytes. Invalid UTF-8 is handled as llama.cpp handles it: the SPM tokenizer
//! works on raw bytes (byte fallback), the others decode with `unicode_cpts_from_utf8`, where
//! every undecodable byte becomes U+FFFD. A 4-byte sequence decoding beyond U+10FFFF, which
//! makes llama.cpp throw, is reported as [`VocabError::Invalid`].

mod attr;
mod bpe;
mod detok;
mod hash;
mod load;
mod partition;
mod plamo2;
pub mod pretok;
mod rwkv;
mod spm;
mod stdlib;
mod texts;
mod ugm;
pub mod unicode;
mod wpm;

pub use attr::TokenAttr;
pub use detok::StreamDecoder;
pub use load::Phases as LoadPhases;

/// A token id.
pub type Token = u32;

/// Why a vocabulary cannot be loaded or a text cannot be tokenized.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum VocabError {
    /// A tokenizer model or pre-tokenizer llama.cpp knows but this crate does not handle, or
    /// one llama.cpp does not know either (the message names it).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Malformed vocabulary data, or input llama.cpp would fail on.
    #[error("invalid: {0}")]
    Invalid(String),
}

/// The tokenizer algorithm (llama.cpp's `llama_vocab_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabType {
    /// SentencePiece BPE with byte fallback (`llama`).
    Spm,
    /// Byte-level BPE (`gpt2`, `gemma4`, `hybriddna`, `whitespace`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
    /// Unigram (`t5`).
    Ugm,
    /// RWKV greedy trie (`rwkv`).
    Rwkv,
    /// PLaMo-2's suffix-table unigram (`plamo2`).
    Plamo2,
}

/// One vocabulary entry (its text is in [`Vocab::texts`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenData {
    pub score: f32,
    pub attr: TokenAttr,
}

/// Ids of the special tokens (None where the vocabulary has none), resolved as llama.cpp
/// resolves them: per-model defaults, then the GGUF keys, then detection by token text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence (CLS for BERT).
    pub bos: Option<Token>,
    /// End of sequence.
    pub eos: Option<Token>,
    /// End of turn ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", ...).
    pub eot: Option<Token>,
    /// End of message ("<|eom_id|>").
    pub eom: Option<Token>,
    /// Unknown.
    pub unk: Option<Token>,
    /// Separator.
    pub sep: Option<Token>,
    /// Padding.
    pub pad: Option<Token>,
    /// Mask.
    pub mask: Option<Token>,
    /// Newline.
    pub nl: Option<Token>,
    /// Fill-in-the-middle prefix.
    pub fim_pre: Option<Token>,
    /// Fill-in-the-middle suffix.
    pub fim_suf: Option<Token>,
    /// Fill-in-the-middle middle.
    pub fim_mid: Option<Token>,
    /// Fill-in-the-middle padding.
    pub fim_pad: Option<Token>,
    /// Fill-in-the-middle repository name.
    pub fim_rep: Option<Token>,
    /// Fill-in-the-middle file separator.
    pub fim_sep: Option<Token>,
}

/// Tokenizer options llama.cpp keeps next to the vocabulary.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    pub add_space_prefix: bool,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub treat_whitespace_as_suffix: bool,
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// Per-algorithm data.
#[derive(Debug)]
pub(crate) enum Model {
    Spm,
    Bpe(Box<bpe::Bpe>),
    Wpm,
    Ugm(Box<ugm::Ugm>),
    Rwkv(rwkv::Rwkv),
    Plamo2(Box<plamo2::Plamo2>),
}

/// A loaded vocabulary with its tokenizer.
#[derive(Debug)]
pub struct Vocab {
    pub(crate) model_name: String,
    pub(crate) pre_name: String,
    pub(crate) vocab_type: VocabType,
    pub(crate) tokens: Vec<TokenData>,
    /// Token texts by id, findable by text as in llama.cpp's `token_to_id`: all indexed, but
    /// for byte-level BPE only those that do not decode, the others being found by their BPE
    /// keys. Look texts up with [`Vocab::text_to_token`].
    pub(crate) texts: texts::TextTable,
    /// Token texts changed after `texts` was indexed (hybriddna drops a marker from its
    /// k-mers, but looks them up with it); None when they are those of `texts`.
    pub(crate) changed_texts: Option<texts::Texts>,
    pub(crate) special: SpecialTokens,
    pub(crate) opts: Options,
    pub(crate) max_token_len: usize,
    /// End-of-generation ids, sorted.
    pub(crate) eog: Vec<Token>,
    /// Control, user-defined and unknown tokens, longest text first (partition order).
    pub(crate) special_cache: Vec<Token>,
    /// Which special texts occur in a text (a prefilter for the partition).
    pub(crate) special_index: partition::SpecialIndex,
    pub(crate) suppress: Vec<Token>,
    pub(crate) model: Model,
}

impl Vocab {
    /// Text of a token id in range.
    #[inline]
    pub(crate) fn text(&self, t: Token) -> &[u8] {
        match &self.changed_texts {
            Some(texts) => texts.get(t as usize),
            None => self.texts.get(t),
        }
    }

    /// The token texts, in id order.
    pub(crate) fn token_texts(&self) -> &texts::Texts { self.changed_texts.as_ref().unwrap_or(self.texts.texts()) }

    /// Loads the vocabulary of a GGUF file as llama.cpp's `llama_vocab::impl::load` does.
    pub fn from_gguf(f: &ferrollama_gguf::GgufFile) -> Result<Vocab, VocabError> {
        load::load(f)
    }

    /// [`Vocab::from_gguf`], also returning how long each loading step took (for profiling).
    pub fn from_gguf_timed(f: &ferrollama_gguf::GgufFile) -> Result<(Vocab, LoadPhases), VocabError> {
        let mut phases = LoadPhases::new();
        let vocab = load::load_timed(f, Some(&mut phases))?;
        Ok((vocab, phases))
    }

    /// Number of tokens.
    pub fn n_tokens(&self) -> usize { self.tokens.len() }
    /// `tokenizer.ggml.model`: "llama", "gpt2", "bert", "t5", "rwkv", ...
    pub fn model_kind(&self) -> &str { &self.model_name }
    /// `tokenizer.ggml.pre` as llama.cpp resolved it ("default" where absent).
    pub fn pre(&self) -> &str { &self.pre_name }
    /// The tokenizer algorithm.
    pub fn vocab_type(&self) -> VocabType { self.vocab_type }

    /// Tokenizes `text`. `add_special` adds BOS/EOS (SEP for WPM) as the vocabulary says;
    /// `parse_special` lets control tokens written in the text become tokens (user-defined
    /// tokens always do).
    pub fn tokenize(&self, text: &[u8], add_special: bool, parse_special: bool) -> Result<Vec<Token>, VocabError> {
        let fragments = partition::partition(self, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        match &self.model {
            Model::Spm => spm::tokenize(self, text, &fragments, add_special, &mut out)?,
            Model::Bpe(bpe) => bpe.tokenize(self, text, &fragments, add_special, &mut out)?,
            Model::Wpm => wpm::tokenize(self, text, &fragments, add_special, &mut out)?,
            Model::Ugm(ugm) => ugm.tokenize(self, text, &fragments, add_special, &mut out)?,
            Model::Rwkv(rwkv) => rwkv.tokenize(self, text, &fragments, &mut out)?,
            Model::Plamo2(plamo2) => plamo2.tokenize(text, &fragments, &mut out)?,
        }
        Ok(out)
    }

    /// The text a token stands for (`llama_token_to_piece` with lstrip 0). Control and
    /// unknown tokens render only when `special`; out-of-range ids give an empty piece.
    pub fn token_to_piece(&self, t: Token, special: bool) -> Vec<u8> {
        let mut piece = Vec::new();
        detok::append_piece(self, t, special, false, &mut piece);
        piece
    }

    /// Concatenated pieces with llama.cpp's `llama_detokenize` rules: the SPM leading space
    /// of the first piece is removed, `remove_special` drops a leading BOS / trailing EOS the
    /// vocabulary adds, `unparse_special` renders control tokens, and vocabularies with
    /// `clean_spaces` get the clean-up of " ." " ," " '" etc.
    pub fn detokenize(&self, tokens: &[Token], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        detok::detokenize(self, tokens, remove_special, unparse_special)
    }

    /// Raw vocabulary text of a token (empty when out of range).
    pub fn token_text(&self, t: Token) -> &[u8] {
        if (t as usize) < self.tokens.len() { self.text(t) } else { &[] }
    }
    /// Score of a token (0 when out of range).
    pub fn token_score(&self, t: Token) -> f32 {
        self.tokens.get(t as usize).map_or(0.0, |d| d.score)
    }
    /// Attributes of a token (UNDEFINED when out of range).
    pub fn token_attr(&self, t: Token) -> TokenAttr {
        self.tokens.get(t as usize).map_or(TokenAttr::UNDEFINED, |d| d.attr)
    }
    /// Id of a vocabulary text, if it is one.
    pub fn text_to_token(&self, text: &[u8]) -> Option<Token> {
        match &self.model {
            Model::Bpe(bpe) => bpe.find_token(text, &self.texts),
            _ => self.texts.find(text),
        }
    }

    /// Beginning of sequence.
    pub fn bos(&self) -> Option<Token> { self.special.bos }
    /// End of sequence.
    pub fn eos(&self) -> Option<Token> { self.special.eos }
    /// End of turn.
    pub fn eot(&self) -> Option<Token> { self.special.eot }
    /// End of message.
    pub fn eom(&self) -> Option<Token> { self.special.eom }
    /// Padding.
    pub fn pad(&self) -> Option<Token> { self.special.pad }
    /// Newline.
    pub fn nl(&self) -> Option<Token> { self.special.nl }
    /// Separator.
    pub fn sep(&self) -> Option<Token> { self.special.sep }
    /// Unknown token.
    pub fn unk(&self) -> Option<Token> { self.special.unk }
    /// Mask token.
    pub fn mask(&self) -> Option<Token> { self.special.mask }
    /// Fill-in-the-middle prefix.
    pub fn fim_pre(&self) -> Option<Token> { self.special.fim_pre }
    /// Fill-in-the-middle suffix.
    pub fn fim_suf(&self) -> Option<Token> { self.special.fim_suf }
    /// Fill-in-the-middle middle.
    pub fn fim_mid(&self) -> Option<Token> { self.special.fim_mid }
    /// Fill-in-the-middle padding.
    pub fn fim_pad(&self) -> Option<Token> { self.special.fim_pad }
    /// Fill-in-the-middle repository name.
    pub fn fim_rep(&self) -> Option<Token> { self.special.fim_rep }
    /// Fill-in-the-middle file separator.
    pub fn fim_sep(&self) -> Option<Token> { self.special.fim_sep }
    /// All special ids at once.
    pub fn special_tokens(&self) -> SpecialTokens { self.special }

    /// Whether `add_special` adds BOS.
    pub fn add_bos(&self) -> bool { self.opts.add_bos }
    /// Whether `add_special` adds EOS.
    pub fn add_eos(&self) -> bool { self.opts.add_eos }
    /// Whether the vocabulary asks for SEP (WPM always appends it with `add_special`).
    pub fn add_sep(&self) -> bool { self.opts.add_sep }
    /// Whether SPM text gets a leading space.
    pub fn add_space_prefix(&self) -> bool { self.opts.add_space_prefix }
    /// Whether detokenization cleans up spaces before punctuation.
    pub fn clean_spaces(&self) -> bool { self.opts.clean_spaces }

    /// End of generation: EOS, EOT, EOM and the tokens llama.cpp adds by their text.
    pub fn is_eog(&self, t: Token) -> bool { self.eog.binary_search(&t).is_ok() }
    /// The end-of-generation ids, sorted.
    pub fn eog_tokens(&self) -> &[Token] { &self.eog }
    /// Whether a token has the CONTROL attribute.
    pub fn is_control(&self, t: Token) -> bool { self.token_attr(t).intersects(TokenAttr::CONTROL) }
    /// Token ids listed in `tokenizer.ggml.suppress_tokens` (in range).
    pub fn suppress_tokens(&self) -> &[Token] { &self.suppress }
}

#[cfg(test)]
mod tests {
    #[test]
    fn vocab_is_shareable_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::Vocab>();
        shareable::<super::StreamDecoder<std::sync::Arc<super::Vocab>>>();
    }
}
