//! C functions for libraries that call llama.cpp's C API through a function pointer rather than
//! through Python: llguidance takes `llama_tokenize`'s address (llama_cpp.llama_cpp._lib) and
//! calls it from its own threads, without the GIL, with the vocabulary pointer that
//! `llama_model_get_vocab` gave (ferrollama.Model.vocab_ptr: the model's `Vocab`, alive as long
//! as the model).

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ferrollama_vocab::Vocab;

/// What llama.cpp returns when the tokens cannot be given (its result does not fit an int32);
/// here also for a null pointer, a negative length, a tokenizer error or a panic.
const TOKENIZE_FAILED: i32 = i32::MIN;

/// llama.cpp's `llama_tokenize`: the tokens of `text[..text_len]` into `tokens`; their number,
/// or minus it when `n_tokens_max` is too small (nothing written then).
///
/// # Safety
/// `vocab` is a `Model.vocab_ptr` of a live model, `text` points at `text_len` bytes and `tokens`
/// at `n_tokens_max` int32s, as llama.cpp requires of its callers.
#[no_mangle]
pub unsafe extern "C" fn ferrollama_llama_tokenize(vocab: *const c_void, text: *const c_char, text_len: i32,
                                                   tokens: *mut i32, n_tokens_max: i32, add_special: bool,
                                                   parse_special: bool) -> i32 {
    if vocab.is_null() || text_len < 0 || (text.is_null() && text_len > 0) {
        return TOKENIZE_FAILED;
    }
    // no panic may unwind into the C caller
    catch_unwind(AssertUnwindSafe(|| {
        let vocab = &*(vocab as *const Vocab);
        let bytes: &[u8] = if text_len == 0 { &[] } else { std::slice::from_raw_parts(text as *const u8, text_len as usize) };
        let Ok(ids) = vocab.tokenize(bytes, add_special, parse_special) else { return TOKENIZE_FAILED };
        let Ok(n) = i32::try_from(ids.len()) else { return TOKENIZE_FAILED };
        if n > n_tokens_max {
            return -n;
        }
        if n > 0 {
            if tokens.is_null() {
                return TOKENIZE_FAILED;
            }
            let out = std::slice::from_raw_parts_mut(tokens, ids.len());
            for (slot, id) in out.iter_mut().zip(ids) {
                *slot = id as i32;
            }
        }
        n
    }))
    .unwrap_or(TOKENIZE_FAILED)
}
