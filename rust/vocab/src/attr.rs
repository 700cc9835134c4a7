//! Token attributes (llama.cpp's `llama_token_attr` bit set).

/// The attribute bits of a token, with llama.cpp's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    /// No attribute (token type UNDEFINED).
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token.
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// A reserved, unused token.
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// An ordinary token.
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// A control token (BOS, EOS, chat markers...).
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// A user-defined (added) token, matched in text even without special parsing.
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// A byte-fallback token `<0xXX>`.
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Normalized (unused by llama.cpp's tokenizers).
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    /// Whitespace before the token is removed when it is parsed from text.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Whitespace after the token is removed when it is parsed from text.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    /// Single word (unused by llama.cpp's tokenizers).
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    /// Whether any bit of `other` is set.
    #[inline]
    pub fn intersects(self, other: TokenAttr) -> bool { self.0 & other.0 != 0 }
    /// Adds the bits of `other`.
    #[inline]
    pub fn with(self, other: TokenAttr) -> TokenAttr { TokenAttr(self.0 | other.0) }
    /// Removes the bits of `other`.
    #[inline]
    pub fn without(self, other: TokenAttr) -> TokenAttr { TokenAttr(self.0 & !other.0) }

    /// Attribute of a GGUF `tokenizer.ggml.token_type` value (llama_token_type).
    pub fn from_token_type(token_type: i64) -> TokenAttr {
        match token_type {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }
}
