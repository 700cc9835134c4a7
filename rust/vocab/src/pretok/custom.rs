//! llama.cpp's hand-written splitters (unicode.cpp `unicode_regex_split_custom_*`), used in
//! place of `std::regex` for the patterns they are registered for. They are reproduced
//! statement by statement, quirks included (e.g. the punctuation branch of the llama3 and
//! qwen2 splitters tests `flags` where `flags2` was meant; the AFMoE digit splitter glues the
//! text before a digit run to its first group).

use crate::unicode::{self, CptFlags};

/// Which hand-written splitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CustomSplit {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    KimiK2,
    /// `\p{AFMoE_digits}` and tiny_aya's digit grouping.
    AfmoeDigits,
    Newlines,
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

/// One chunk of the text being split, with llama.cpp's `_get_cpt` / `_get_flags` /
/// `_add_token` helpers.
struct Chunk<'a> {
    cpts: &'a [u32],
    flags: &'a [CptFlags],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Chunk<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end { self.cpts[pos] } else { OUT_OF_RANGE }
    }

    #[inline]
    fn flags(&self, pos: usize) -> CptFlags {
        if self.ini <= pos && pos < self.end { self.flags[pos] } else { CptFlags(0) }
    }

    #[inline]
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (optionally case-insensitive): the match length.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        let fold = |c: u32| if fold_case { unicode::to_lower(c) } else { c };
        if self.cpt(pos) != '\'' as u32 || pos + 1 >= self.end {
            return None;
        }
        let next = fold(self.cpt(pos + 1));
        if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
            return Some(2);
        }
        if pos + 2 < self.end {
            let pair = (next, fold(self.cpt(pos + 2)));
            let pairs = [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')];
            if pairs.iter().any(|&(a, b)| pair == (a as u32, b as u32)) {
                return Some(3);
            }
        }
        None
    }

    /// Whitespace run at `pos`: (length, end of its last \r or \n, 0 if none).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let (mut n, mut last_rn) = (0, 0);
        while self.flags(pos + n).is_whitespace() {
            let c = self.cpt(pos + n);
            if c == '\r' as u32 || c == '\n' as u32 {
                last_rn = pos + n + 1;
            }
            n += 1;
        }
        (n, last_rn)
    }

    /// The `\s*[\r\n]+|\s+(?!\S)|\s+` tail shared by the llama3-like splitters; returns the
    /// new position. `with_newlines` selects whether the `\s*[\r\n]+` branch exists.
    fn whitespace_tail(&mut self, mut pos: usize, with_newlines: bool) -> usize {
        let (n, last_rn) = self.whitespace_run(pos);
        if with_newlines && last_rn > 0 {
            pos = last_rn;
            self.add(pos);
            return pos;
        }
        if n > 1 && self.cpt(pos + n) != OUT_OF_RANGE {
            pos += n - 1;
            self.add(pos);
            return pos;
        }
        if n > 0 {
            pos += n;
            self.add(pos);
            return pos;
        }
        pos += 1;
        self.add(pos);
        pos
    }

    /// ` ?[^\s\p{L}\p{N}]+[\r\n]*` (plus \p{M} for qwen35) as the llama3-like splitters do
    /// it, testing `flags` (of `pos`) where the regex needs `flags2`.
    fn punct_run(&mut self, pos: usize, with_marks: bool) -> Option<usize> {
        let cpt = self.cpt(pos);
        let flags = self.flags(pos);
        let excluded = |f: CptFlags| f.is_whitespace() || f.is_letter() || f.is_number() || (with_marks && f.is_accent_mark());
        let mut flags2 = if cpt == ' ' as u32 { self.flags(pos + 1) } else { flags };
        if excluded(flags2) || flags.as_uint() == 0 {
            return None;
        }
        let mut pos = pos + (cpt == ' ' as u32) as usize;
        while !excluded(flags2) && flags2.as_uint() != 0 {
            pos += 1;
            flags2 = self.flags(pos);
        }
        let mut c2 = self.cpt(pos);
        while c2 == '\r' as u32 || c2 == '\n' as u32 {
            pos += 1;
            c2 = self.cpt(pos);
        }
        self.add(pos);
        Some(pos)
    }
}

/// Runs a custom splitter over every chunk; returns the new chunk lengths.
pub fn split(kind: CustomSplit, cpts: &[u32], flags: &[CptFlags], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len().max(cpts.len() / 4));
    let mut start = 0;
    for &len in offsets {
        let mut chunk = Chunk { cpts, flags, ini: start, end: start + len, prev_end: start, out: &mut out };
        match kind {
            CustomSplit::Gpt2 => gpt2(&mut chunk),
            CustomSplit::Llama3 => llama3_like(&mut chunk, Digits::UpTo3, false),
            CustomSplit::Qwen2 => llama3_like(&mut chunk, Digits::One, false),
            CustomSplit::Qwen35 => llama3_like(&mut chunk, Digits::One, true),
            CustomSplit::KimiK2 => kimi_k2(&mut chunk),
            CustomSplit::AfmoeDigits => afmoe_digits(&mut chunk),
            CustomSplit::Newlines => newlines(&mut chunk),
        }
        start += len;
    }
    out
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn gpt2(c: &mut Chunk) {
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if let Some(n) = c.contraction(pos, false) {
            pos += c.add(pos + n);
            continue;
        }
        let space = (cpt == ' ' as u32) as usize;
        let mut flags2 = if space == 1 { c.flags(pos + 1) } else { flags };
        let runs: [fn(CptFlags) -> bool; 3] = [
            |f| f.is_letter(),
            |f| f.is_number(),
            |f| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.as_uint() != 0,
        ];
        if let Some(run) = runs.iter().find(|run| run(flags2)) {
            pos += space;
            while run(flags2) {
                pos += 1;
                flags2 = c.flags(pos);
            }
            c.add(pos);
            continue;
        }
        pos = c.whitespace_tail(pos, false);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Digits { One, UpTo3 }

/// The llama3 family: `(?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+`, with single digits for qwen2 and letters+marks for qwen35.
fn llama3_like(c: &mut Chunk, digits: Digits, with_marks: bool) {
    let is_word = |f: CptFlags| f.is_letter() || (with_marks && f.is_accent_mark());
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if let Some(n) = c.contraction(pos, true) {
            pos += c.add(pos + n);
            continue;
        }
        let is_rn = cpt == '\r' as u32 || cpt == '\n' as u32;
        if !(is_rn || flags.is_number()) && (is_word(flags) || is_word(c.flags(pos + 1))) {
            pos += 1;
            while is_word(c.flags(pos)) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        if flags.is_number() {
            match digits {
                Digits::One => {
                    pos += 1;
                    c.add(pos);
                }
                Digits::UpTo3 => {
                    let mut ini = pos;
                    while c.flags(pos).is_number() {
                        pos += 1;
                        if pos - ini >= 3 {
                            c.add(pos);
                            ini = pos;
                        }
                    }
                    c.add(pos);
                }
            }
            continue;
        }
        if let Some(p) = c.punct_run(pos, with_marks) {
            pos = p;
            continue;
        }
        pos = c.whitespace_tail(pos, true);
    }
}

/// Kimi-K2: Han runs, letter words without Han (with contractions), `\p{N}{1,3}`, then the
/// llama3 tail.
fn kimi_k2(c: &mut Chunk) {
    let letter_not_han = |c: &Chunk, p: usize| c.flags(p).is_letter() && !unicode::is_han(c.cpt(p));
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if unicode::is_han(cpt) {
            while unicode::is_han(c.cpt(pos)) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        let is_rn = cpt == '\r' as u32 || cpt == '\n' as u32;
        let can_lead = !(is_rn || flags.is_letter() || flags.is_number());
        let is_letter_pattern = (flags.is_letter() && !unicode::is_han(cpt)) || (can_lead && letter_not_han(c, pos + 1));
        if is_letter_pattern {
            let mut has_leading = false;
            if can_lead {
                has_leading = true;
                pos += 1;
            }
            let mut has_letters = false;
            while letter_not_han(c, pos) {
                has_letters = true;
                pos += 1;
            }
            if has_letters || (!has_leading && letter_not_han(c, pos)) {
                if !has_letters {
                    pos += 1;
                }
                while letter_not_han(c, pos) {
                    pos += 1;
                }
                if let Some(n) = c.contraction(pos, true) {
                    pos += n;
                }
                c.add(pos);
                continue;
            } else if has_leading {
                pos -= 1;
            }
        }
        if flags.is_number() {
            let mut ini = pos;
            while c.flags(pos).is_number() {
                pos += 1;
                if pos - ini >= 3 {
                    c.add(pos);
                    ini = pos;
                }
            }
            c.add(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`, here testing flags2 for both conditions
        let space = (cpt == ' ' as u32) as usize;
        let mut flags2 = if space == 1 { c.flags(pos + 1) } else { flags };
        let punct = |f: CptFlags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.as_uint() != 0;
        if punct(flags2) {
            pos += space;
            while punct(flags2) {
                pos += 1;
                flags2 = c.flags(pos);
            }
            let mut c2 = c.cpt(pos);
            while c2 == '\r' as u32 || c2 == '\n' as u32 {
                pos += 1;
                c2 = c.cpt(pos);
            }
            c.add(pos);
            continue;
        }
        pos = c.whitespace_tail(pos, true);
    }
}

/// Digit runs split into groups of three from the right; whatever precedes a run is glued to
/// its first group, and the rest of the chunk ends up as one piece.
fn afmoe_digits(c: &mut Chunk) {
    let mut pos = c.ini;
    while pos < c.end {
        if !c.flags(pos).is_number() {
            pos += 1;
            continue;
        }
        let digit_start = pos;
        while c.flags(pos).is_number() && pos < c.end {
            pos += 1;
        }
        let count = pos - digit_start;
        let mut current = digit_start;
        let remainder = count % 3;
        if remainder > 0 {
            c.add(current + remainder);
            current += remainder;
        }
        while current < digit_start + count {
            c.add(current + 3);
            current += 3;
        }
    }
    if c.prev_end < c.end {
        let end = c.end;
        c.add(end);
    }
}

/// `[^\n]+|[\n]+`: alternating runs of non-newlines and newlines.
fn newlines(c: &mut Chunk) {
    let mut pos = c.ini;
    while pos < c.end {
        let is_nl = c.cpts[pos] == '\n' as u32;
        let run_start = pos;
        while pos < c.end && (c.cpts[pos] == '\n' as u32) == is_nl {
            pos += 1;
        }
        c.out.push(pos - run_start);
    }
}
