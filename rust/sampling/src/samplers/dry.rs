//! DRY ("don't repeat yourself"): penalizes the tokens that would extend a sequence that
//! already occurred in the context, exponentially in the repeat length. Ported from
//! llama.cpp (which took it from koboldcpp).

use std::collections::{HashMap, VecDeque};

use crate::candidates::Candidates;
use crate::error::{check_not_nan, invalid, SamplingError};
use crate::pieces::TokenPieces;
use crate::sampler::Sampler;

/// Sequence breakers longer than this many bytes are cut (llama.cpp's MAX_CHAR_LEN).
const MAX_BREAKER_BYTES: usize = 40;
/// Tails of multi-token breakers are cut to this many tokens (MAX_SEQ_LEN).
const MAX_TAIL_TOKENS: usize = 20;
/// ln(f32::MAX), to keep base^exponent finite (llama.cpp's literal, 88.7228391f).
#[allow(clippy::excessive_precision)]
const FLOAT_MAX_LOG: f32 = 88.722_839_1;

/// `llama_sampler_init_dry(vocab, n_ctx_train, multiplier, base, allowed_length,
/// penalty_last_n, seq_breakers)`.
#[derive(Debug, Clone)]
pub struct Dry {
    total_context_size: i32,
    multiplier: f32,
    base: f32,
    allowed_length: i32,
    penalty_last_n: i32,
    /// head token → tails (empty tail: the head alone breaks sequences)
    breakers: HashMap<u32, Vec<Vec<u32>>>,
    capacity: usize,
    last_tokens: VecDeque<u32>,
}

impl Dry {
    /// A DRY sampler whose sequence breakers are strings (llama.cpp's defaults are
    /// "\n", ":", "\"", "*"). `tokenize` turns the tail of a breaker that starts inside a
    /// token into tokens (the vocabulary's tokenizer without special tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pieces: &TokenPieces,
        tokenize: &dyn Fn(&[u8]) -> Vec<u32>,
        n_ctx_train: i32,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        penalty_last_n: i32,
        seq_breakers: &[&str],
    ) -> Result<Self, SamplingError> {
        let mut dry = Dry::with_token_breakers(n_ctx_train, multiplier, base, allowed_length, penalty_last_n, Vec::new())?;
        if dry.enabled() {
            for breaker in seq_breakers {
                let bytes = breaker.as_bytes();
                if bytes.is_empty() {
                    continue;
                }
                let cut = &bytes[..bytes.len().min(MAX_BREAKER_BYTES)];
                overlapping_token_sequences(pieces, tokenize, cut, &mut dry.breakers);
            }
        }
        Ok(dry)
    }

    /// A DRY sampler whose breakers are given as token sequences (head first), as
    /// llama.cpp's `llama_sampler_init_dry_testing`.
    pub fn with_token_breakers(
        n_ctx_train: i32,
        multiplier: f32,
        base: f32,
        allowed_length: i32,
        penalty_last_n: i32,
        seq_breakers: Vec<Vec<u32>>,
    ) -> Result<Self, SamplingError> {
        check_not_nan("multiplier", multiplier)?;
        check_not_nan("base", base)?;
        if n_ctx_train < 0 {
            return Err(invalid("n_ctx_train", n_ctx_train, "must not be negative"));
        }
        if penalty_last_n < -1 {
            return Err(invalid("penalty_last_n", penalty_last_n, "must be -1 (context size), 0 (off) or positive"));
        }
        let effective_last_n = if penalty_last_n == -1 { n_ctx_train } else { penalty_last_n.max(0) };
        let mut dry = Dry {
            total_context_size: n_ctx_train,
            multiplier,
            base,
            allowed_length,
            penalty_last_n,
            breakers: HashMap::new(),
            capacity: 0,
            last_tokens: VecDeque::new(),
        };
        if dry.enabled() {
            dry.capacity = effective_last_n as usize;
        }
        for breaker in seq_breakers {
            if let Some((&head, tail)) = breaker.split_first() {
                dry.breakers.entry(head).or_default().push(tail.to_vec());
            }
        }
        Ok(dry)
    }

    fn enabled(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.penalty_last_n != 0
    }

    /// The i-th token from the end of the history (0 = the last one).
    fn rat(&self, i: usize) -> u32 {
        self.last_tokens[self.last_tokens.len() - 1 - i]
    }

    /// Step 1: the repetition limit set by the most recent sequence breaker.
    fn repetition_limit(&self, last_n_repeat: usize) -> usize {
        for i in 0..last_n_repeat {
            let Some(tails) = self.breakers.get(&self.rat(i)) else { continue };
            let mut longest_match: isize = -1;
            for tail in tails {
                let seq_len = tail.len() as isize;
                if seq_len > longest_match && tail.len() <= i {
                    let matches = (0..tail.len()).all(|offset| tail[offset] == self.rat(i - offset - 1));
                    if matches {
                        longest_match = seq_len;
                    }
                }
            }
            if longest_match >= 0 {
                return i - longest_match as usize;
            }
        }
        last_n_repeat
    }

    /// Step 2: for each position, how long the suffix of the context repeats ending there
    /// (the Z-algorithm run backwards), capped at `rep_limit`.
    fn repeat_counts(&self, last_n_repeat: usize, rep_limit: usize) -> Vec<usize> {
        let mut counts = vec![0usize; last_n_repeat];
        let last = last_n_repeat - 1;
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..last_n_repeat {
            if k > rt {
                let mut n = 0;
                while n + k < last_n_repeat && self.rat(n) == self.rat(n + k) {
                    n += 1;
                }
                counts[last - k] = n.min(rep_limit);
                if n > 0 {
                    lt = k;
                    rt = k + n - 1;
                }
            } else {
                let p = k - lt;
                let right_part_len = rt - k + 1;
                if counts[last - p] < right_part_len {
                    counts[last - k] = counts[last - p].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < last_n_repeat && self.rat(i) == self.rat(i - k) {
                        i += 1;
                    }
                    counts[last - k] = (i - k).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }
        counts
    }

    fn is_single_token_breaker(&self, token: u32) -> bool {
        self.breakers.get(&token).is_some_and(|tails| tails.iter().any(Vec::is_empty))
    }
}

impl Sampler for Dry {
    fn name(&self) -> &'static str {
        "dry"
    }

    fn accept(&mut self, token: u32) {
        if !self.enabled() || self.capacity == 0 {
            return;
        }
        if self.last_tokens.len() == self.capacity {
            self.last_tokens.pop_front();
        }
        self.last_tokens.push_back(token);
    }

    fn apply(&mut self, c: &mut Candidates) {
        if !self.enabled() {
            return;
        }
        let effective_last_n = if self.penalty_last_n == -1 { self.total_context_size } else { self.penalty_last_n.max(0) };
        let last_n_repeat =
            (self.last_tokens.len() as i64).min(effective_last_n as i64).min(self.total_context_size as i64);
        if last_n_repeat <= self.allowed_length as i64 {
            return;
        }
        let last_n_repeat = last_n_repeat as usize;
        let rep_limit = self.repetition_limit(last_n_repeat);
        if (rep_limit as i64) < self.allowed_length as i64 {
            return;
        }
        let counts = self.repeat_counts(last_n_repeat, rep_limit);

        // Step 3: the longest repeat each next token would extend
        let mut max_token_repeat: HashMap<u32, usize> = HashMap::new();
        for (i, &repeat_len) in counts.iter().enumerate().take(last_n_repeat - 1) {
            if repeat_len as i64 >= self.allowed_length as i64 {
                let token = self.rat(last_n_repeat - 2 - i);
                let entry = max_token_repeat.entry(token).or_insert(repeat_len);
                if *entry < repeat_len {
                    *entry = repeat_len;
                }
            }
        }

        // Step 4: penalties, the exponent clamped to keep the power finite
        let max_exponent = if self.base > 1.000_001 { (FLOAT_MAX_LOG / self.base.ln()) as i32 } else { 0 };
        for t in c.data.iter_mut() {
            let Some(&repeat_len) = max_token_repeat.get(&t.id) else { continue };
            if self.is_single_token_breaker(t.id) {
                continue;
            }
            let mut repeat_exp = (repeat_len as i64 - self.allowed_length as i64) as i32;
            if max_exponent > 0 && repeat_exp > max_exponent {
                repeat_exp = max_exponent;
            }
            let penalty = (self.multiplier as f64 * (self.base as f64).powf(repeat_exp as f64)) as f32;
            t.logit -= penalty;
        }
        c.sorted = false;
    }

    fn reset(&mut self) {
        self.last_tokens.clear();
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }
}

/// llama.cpp's `get_overlapping_token_sequences`: every token whose piece contains the
/// breaker breaks alone; a token whose piece ends with a prefix of the breaker breaks
/// when followed by the tokens of the breaker's remaining tail.
fn overlapping_token_sequences(
    pieces: &TokenPieces,
    tokenize: &dyn Fn(&[u8]) -> Vec<u32>,
    breaker: &[u8],
    out: &mut HashMap<u32, Vec<Vec<u32>>>,
) {
    for (token, word) in pieces.pieces.iter().enumerate() {
        let token = token as u32;
        if contains(word, breaker) {
            out.entry(token).or_default().push(Vec::new());
            continue;
        }
        for pos in 0..word.len() {
            if word[pos] != breaker[0] {
                continue;
            }
            // the rest of the word must match the start of the breaker
            let mut i = 1;
            let mut matched = true;
            while i < breaker.len() && i + pos < word.len() {
                if word[pos + i] != breaker[i] {
                    matched = false;
                    break;
                }
                i += 1;
            }
            if !matched {
                continue;
            }
            let mut tail = tokenize(&breaker[i..]);
            tail.truncate(MAX_TAIL_TOKENS);
            let tails = out.entry(token).or_default();
            if !tails.contains(&tail) {
                tails.push(tail);
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}
