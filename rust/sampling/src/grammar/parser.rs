//! The GBNF parser, following llama.cpp's `llama_grammar_parser` element for element
//! (symbol ids, generated rule names and rewrites of repetitions are the same), with
//! errors that carry a line and column.

use std::collections::{BTreeMap, HashMap};

use super::{Element, ElementType as T, GrammarError};
use crate::pieces::TokenPieces;

/// Repetition counts above this are refused (llama.cpp's MAX_REPETITION_THRESHOLD).
const MAX_REPETITION_THRESHOLD: u64 = 2000;

/// The result of parsing: rule names to ids, and each rule's elements (ending with End).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedRules {
    /// Rule name → rule id (generated rules are named `parent_N`).
    pub symbol_ids: BTreeMap<String, u32>,
    /// The rules by id.
    pub rules: Vec<Vec<Element>>,
    /// Byte offset in the source where each rule was defined (for error positions).
    pub rule_offsets: Vec<usize>,
}

/// Parses GBNF text into rules. `<piece>` tokens cannot be resolved without a vocabulary
/// and are an error; `<[id]>` tokens need none.
pub fn parse_rules(gbnf: &str) -> Result<ParsedRules, GrammarError> {
    parse_rules_with_pieces(gbnf, None)
}

/// Parses GBNF text, resolving `<piece>` tokens to the one token whose piece is exactly
/// that text (the angle brackets included).
pub fn parse_rules_with_pieces(gbnf: &str, pieces: Option<&TokenPieces>) -> Result<ParsedRules, GrammarError> {
    let mut p = Parser { src: gbnf.as_bytes(), pieces, out: ParsedRules::default(), first_ref: HashMap::new() };
    p.parse().map_err(|e| GrammarError::at(p.src, e.offset, e.msg))?;
    Ok(p.out)
}

/// A parse failure at a byte offset.
struct Fail {
    offset: usize,
    msg: String,
}

type Res<X> = Result<X, Fail>;

fn fail<X>(offset: usize, msg: impl Into<String>) -> Res<X> {
    Err(Fail { offset, msg: msg.into() })
}

fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'-' || is_digit(c)
}

struct Parser<'a> {
    src: &'a [u8],
    pieces: Option<&'a TokenPieces>,
    out: ParsedRules,
    /// where each symbol was first referenced, to locate undefined rules
    first_ref: HashMap<u32, usize>,
}

/// The state of the sequence being parsed that a repetition operator rewrites.
struct Sequence {
    /// where the last item (the one a repetition applies to) starts in the rule
    last_sym_start: usize,
    /// how many rules that item stands for (a group counts the rules it generated)
    n_prev_rules: u64,
}

impl<'a> Parser<'a> {
    /// The byte at `i`, 0 past the end: the source reads like llama.cpp's C string
    /// (an embedded NUL also ends it).
    fn at(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    fn parse(&mut self) -> Res<()> {
        let mut pos = self.parse_space(0, true);
        while self.at(pos) != 0 {
            pos = self.parse_rule(pos)?;
        }
        self.check_all_defined()
    }

    /// Every rule id must have a definition and every reference a target.
    fn check_all_defined(&self) -> Res<()> {
        let undefined = |id: u32| -> Fail {
            let name = self.out.symbol_ids.iter().find(|(_, &v)| v == id).map_or("?", |(k, _)| k.as_str());
            Fail { offset: self.first_ref.get(&id).copied().unwrap_or(0), msg: format!("undefined rule identifier '{name}'") }
        };
        for (id, rule) in self.out.rules.iter().enumerate() {
            if rule.is_empty() {
                return Err(undefined(id as u32));
            }
        }
        for rule in &self.out.rules {
            for e in rule {
                if e.kind == T::RuleRef && (e.value as usize >= self.out.rules.len() || self.out.rules[e.value as usize].is_empty()) {
                    return Err(undefined(e.value));
                }
            }
        }
        Ok(())
    }

    fn parse_space(&self, mut pos: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(pos) {
                b' ' | b'\t' => pos += 1,
                b'\r' | b'\n' if newline_ok => pos += 1,
                b'#' => {
                    while !matches!(self.at(pos), 0 | b'\r' | b'\n') {
                        pos += 1;
                    }
                }
                _ => return pos,
            }
        }
    }

    fn parse_name(&self, src: usize) -> Res<usize> {
        let mut pos = src;
        while is_word_char(self.at(pos)) {
            pos += 1;
        }
        if pos == src {
            return fail(src, "expecting name");
        }
        Ok(pos)
    }

    fn parse_int(&self, src: usize) -> Res<usize> {
        let mut pos = src;
        while is_digit(self.at(pos)) {
            pos += 1;
        }
        if pos == src {
            return fail(src, "expecting integer");
        }
        Ok(pos)
    }

    fn parse_u64(&self, start: usize, end: usize) -> Res<u64> {
        let digits = std::str::from_utf8(&self.src[start..end]).unwrap_or("");
        digits.parse::<u64>().or_else(|_| fail(start, "number too large"))
    }

    fn parse_hex(&self, src: usize, size: usize) -> Res<(u32, usize)> {
        let end = src + size;
        let mut pos = src;
        let mut value: u32 = 0;
        while pos < end && self.at(pos) != 0 {
            let c = self.at(pos);
            let digit = match c {
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                b'0'..=b'9' => c - b'0',
                _ => break,
            };
            value = (value << 4) + digit as u32;
            pos += 1;
        }
        if pos != end {
            return fail(src, format!("expecting {size} hex chars"));
        }
        Ok((value, pos))
    }

    /// One code point of a literal or class: an escape or a UTF-8 sequence.
    fn parse_char(&self, src: usize) -> Res<(u32, usize)> {
        if self.at(src) == b'\\' {
            return match self.at(src + 1) {
                b'x' => self.parse_hex(src + 2, 2),
                b'u' => self.parse_hex(src + 2, 4),
                b'U' => self.parse_hex(src + 2, 8),
                b't' => Ok((b'\t' as u32, src + 2)),
                b'r' => Ok((b'\r' as u32, src + 2)),
                b'n' => Ok((b'\n' as u32, src + 2)),
                c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((c as u32, src + 2)),
                _ => fail(src, "unknown escape"),
            };
        }
        if self.at(src) != 0 {
            return Ok(self.decode_utf8(src));
        }
        fail(src, "unexpected end of input")
    }

    /// llama.cpp's lenient decoder: the length comes from the first byte's high bits,
    /// continuation bytes are taken as they are.
    fn decode_utf8(&self, src: usize) -> (u32, usize) {
        const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
        let first = self.at(src);
        let len = LOOKUP[(first >> 4) as usize];
        let mask = (1u32 << (8 - len)) - 1;
        let mut value = first as u32 & mask;
        let end = src + len;
        let mut pos = src + 1;
        while pos < end && self.at(pos) != 0 {
            value = (value << 6) + (self.at(pos) as u32 & 0x3F);
            pos += 1;
        }
        (value, pos)
    }

    fn parse_token(&self, src: usize) -> Res<(u32, usize)> {
        let mut pos = src;
        if self.at(pos) != b'<' {
            return fail(pos, "expecting '<'");
        }
        pos += 1;
        if self.at(pos) == b'[' {
            pos += 1;
            let int_end = self.parse_int(pos)?;
            let id = self.parse_u64(pos, int_end)?;
            let id = u32::try_from(id).or_else(|_| fail(pos, "token id too large"))?;
            pos = int_end;
            if self.at(pos) != b']' {
                return fail(pos, "expecting ']'");
            }
            pos += 1;
            if self.at(pos) != b'>' {
                return fail(pos, "expecting '>'");
            }
            return Ok((id, pos + 1));
        }
        let Some(pieces) = self.pieces else {
            return fail(src, "no vocabulary to resolve the token (use <[id]>)");
        };
        while self.at(pos) != 0 && self.at(pos) != b'>' {
            pos += 1;
        }
        if self.at(pos) != b'>' {
            return fail(pos, "expecting '>'");
        }
        pos += 1;
        let text = &self.src[src..pos];
        match pieces.pieces.iter().position(|p| p.as_slice() == text) {
            Some(id) => Ok((id as u32, pos)),
            None => fail(src, format!("invalid token '{}'", String::from_utf8_lossy(text))),
        }
    }

    fn symbol_id(&mut self, name: &[u8]) -> u32 {
        let next_id = self.out.symbol_ids.len() as u32;
        let name = String::from_utf8_lossy(name).into_owned();
        *self.out.symbol_ids.entry(name).or_insert(next_id)
    }

    fn generate_symbol_id(&mut self, base_name: &str) -> u32 {
        let next_id = self.out.symbol_ids.len() as u32;
        self.out.symbol_ids.insert(format!("{base_name}_{next_id}"), next_id);
        next_id
    }

    fn add_rule(&mut self, rule_id: u32, rule: Vec<Element>, offset: usize) {
        let idx = rule_id as usize;
        if self.out.rules.len() <= idx {
            self.out.rules.resize(idx + 1, Vec::new());
            self.out.rule_offsets.resize(idx + 1, 0);
        }
        self.out.rules[idx] = rule;
        self.out.rule_offsets[idx] = offset;
    }

    fn parse_rule(&mut self, src: usize) -> Res<usize> {
        let name_end = self.parse_name(src)?;
        let mut pos = self.parse_space(name_end, false);
        let rule_id = self.symbol_id(&self.src[src..name_end]);
        let name = String::from_utf8_lossy(&self.src[src..name_end]).into_owned();
        if !(self.at(pos) == b':' && self.at(pos + 1) == b':' && self.at(pos + 2) == b'=') {
            return fail(pos, "expecting ::=");
        }
        pos = self.parse_space(pos + 3, true);
        pos = self.parse_alternates(pos, &name, rule_id, false, src)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return fail(pos, "expecting newline or end"),
        }
        Ok(self.parse_space(pos, true))
    }

    fn parse_alternates(&mut self, src: usize, rule_name: &str, rule_id: u32, is_nested: bool, def_offset: usize) -> Res<usize> {
        let mut rule = Vec::new();
        let mut pos = self.parse_sequence(src, rule_name, &mut rule, is_nested)?;
        while self.at(pos) == b'|' {
            rule.push(Element::new(T::Alt, 0));
            pos = self.parse_space(pos + 1, true);
            pos = self.parse_sequence(pos, rule_name, &mut rule, is_nested)?;
        }
        rule.push(Element::new(T::End, 0));
        self.add_rule(rule_id, rule, def_offset);
        Ok(pos)
    }

    fn parse_sequence(&mut self, src: usize, rule_name: &str, rule: &mut Vec<Element>, is_nested: bool) -> Res<usize> {
        let mut seq = Sequence { last_sym_start: rule.len(), n_prev_rules: 1 };
        let mut pos = src;
        while self.at(pos) != 0 {
            let c = self.at(pos);
            if c == b'"' {
                pos = self.parse_literal(pos, rule, &mut seq, is_nested)?;
            } else if c == b'[' {
                pos = self.parse_class(pos, rule, &mut seq, is_nested)?;
            } else if c == b'<' || c == b'!' {
                let kind = if c == b'!' { T::TokenNot } else { T::Token };
                if c == b'!' {
                    pos += 1;
                }
                let (id, end) = self.parse_token(pos)?;
                seq.last_sym_start = rule.len();
                seq.n_prev_rules = 1;
                rule.push(Element::new(kind, id));
                pos = self.parse_space(end, is_nested);
            } else if is_word_char(c) {
                let name_end = self.parse_name(pos)?;
                let ref_id = self.symbol_id(&self.src[pos..name_end]);
                self.first_ref.entry(ref_id).or_insert(pos);
                pos = self.parse_space(name_end, is_nested);
                seq.last_sym_start = rule.len();
                seq.n_prev_rules = 1;
                rule.push(Element::new(T::RuleRef, ref_id));
            } else if c == b'(' {
                pos = self.parse_group(pos, rule_name, rule, &mut seq, is_nested)?;
            } else if c == b'.' {
                seq.last_sym_start = rule.len();
                seq.n_prev_rules = 1;
                rule.push(Element::new(T::CharAny, 0));
                pos = self.parse_space(pos + 1, is_nested);
            } else if c == b'*' || c == b'+' || c == b'?' {
                let op = pos;
                pos = self.parse_space(pos + 1, is_nested);
                let (min, max) = match c {
                    b'*' => (0, None),
                    b'+' => (1, None),
                    _ => (0, Some(1)),
                };
                self.repeat(op, rule_name, rule, &mut seq, min, max)?;
            } else if c == b'{' {
                pos = self.parse_braces(pos, rule_name, rule, &mut seq, is_nested)?;
            } else {
                break;
            }
        }
        Ok(pos)
    }

    fn parse_literal(&mut self, src: usize, rule: &mut Vec<Element>, seq: &mut Sequence, is_nested: bool) -> Res<usize> {
        let mut pos = src + 1;
        seq.last_sym_start = rule.len();
        seq.n_prev_rules = 1;
        while self.at(pos) != b'"' {
            if self.at(pos) == 0 {
                return fail(src, "unterminated string literal (unexpected end of input)");
            }
            let (chr, next) = self.parse_char(pos)?;
            pos = next;
            rule.push(Element::new(T::Char, chr));
        }
        Ok(self.parse_space(pos + 1, is_nested))
    }

    fn parse_class(&mut self, src: usize, rule: &mut Vec<Element>, seq: &mut Sequence, is_nested: bool) -> Res<usize> {
        let mut pos = src + 1;
        let mut start_type = T::Char;
        if self.at(pos) == b'^' {
            pos += 1;
            start_type = T::CharNot;
        }
        seq.last_sym_start = rule.len();
        seq.n_prev_rules = 1;
        while self.at(pos) != b']' {
            if self.at(pos) == 0 {
                return fail(src, "unterminated character class (unexpected end of input)");
            }
            let (chr, next) = self.parse_char(pos)?;
            pos = next;
            let kind = if seq.last_sym_start < rule.len() { T::CharAlt } else { start_type };
            rule.push(Element::new(kind, chr));
            if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                if self.at(pos + 1) == 0 {
                    return fail(src, "unterminated character class (unexpected end of input)");
                }
                let (upper, next) = self.parse_char(pos + 1)?;
                pos = next;
                rule.push(Element::new(T::CharRngUpper, upper));
            }
        }
        Ok(self.parse_space(pos + 1, is_nested))
    }

    fn parse_group(&mut self, src: usize, rule_name: &str, rule: &mut Vec<Element>, seq: &mut Sequence, is_nested: bool) -> Res<usize> {
        let mut pos = self.parse_space(src + 1, true);
        let n_rules_before = self.out.symbol_ids.len() as u64;
        let sub_rule_id = self.generate_symbol_id(rule_name);
        pos = self.parse_alternates(pos, rule_name, sub_rule_id, true, src)?;
        seq.n_prev_rules = (self.out.symbol_ids.len() as u64 - n_rules_before).max(1);
        seq.last_sym_start = rule.len();
        rule.push(Element::new(T::RuleRef, sub_rule_id));
        if self.at(pos) != b')' {
            return fail(pos, "expecting ')'");
        }
        Ok(self.parse_space(pos + 1, is_nested))
    }

    /// `{m}`, `{m,}`, `{m,n}`.
    fn parse_braces(&mut self, src: usize, rule_name: &str, rule: &mut Vec<Element>, seq: &mut Sequence, is_nested: bool) -> Res<usize> {
        let mut pos = self.parse_space(src + 1, is_nested);
        if !is_digit(self.at(pos)) {
            return fail(pos, "expecting an int");
        }
        let int_end = self.parse_int(pos)?;
        let min_times = self.parse_u64(pos, int_end)?;
        pos = self.parse_space(int_end, is_nested);
        let mut max_times = None;
        if self.at(pos) == b'}' {
            max_times = Some(min_times);
            pos = self.parse_space(pos + 1, is_nested);
        } else if self.at(pos) == b',' {
            pos = self.parse_space(pos + 1, is_nested);
            if is_digit(self.at(pos)) {
                let int_end = self.parse_int(pos)?;
                max_times = Some(self.parse_u64(pos, int_end)?);
                pos = self.parse_space(int_end, is_nested);
            }
            if self.at(pos) != b'}' {
                return fail(pos, "expecting '}'");
            }
            pos = self.parse_space(pos + 1, is_nested);
        } else {
            return fail(pos, "expecting ','");
        }
        if min_times > MAX_REPETITION_THRESHOLD {
            return fail(src, "number of repetitions exceeds sane defaults, please reduce the number of repetitions");
        }
        if let Some(max) = max_times {
            if max < min_times {
                return fail(src, format!("repetition maximum {max} is below the minimum {min_times}"));
            }
            if max > MAX_REPETITION_THRESHOLD {
                // llama.cpp treats a huge maximum as none
                max_times = None;
            }
        }
        self.repeat(src, rule_name, rule, seq, min_times, max_times)?;
        Ok(pos)
    }

    /// Rewrites the last item S of the sequence for S{min,max} (max None: unbounded):
    /// S repeated min times, then a chain of optional rules
    /// (S{m,n} → S…S S'(n−m) with S'(x) ::= S S'(x−1) |, and S{m,} → S…S S' with S' ::= S S' |).
    fn repeat(&mut self, op: usize, rule_name: &str, rule: &mut Vec<Element>, seq: &mut Sequence, min_times: u64, max_times: Option<u64>) -> Res<()> {
        if seq.last_sym_start == rule.len() {
            return fail(op, "expecting preceding item to */+/?/{");
        }
        let prev_rule: Vec<Element> = rule[seq.last_sym_start..].to_vec();
        let total_rules = match max_times {
            Some(max) if max > 0 => max,
            _ if min_times > 0 => min_times,
            _ => 1,
        };
        if seq.n_prev_rules.saturating_mul(total_rules) >= MAX_REPETITION_THRESHOLD {
            return fail(op, "number of rules that are going to be repeated multiplied by the new repetition exceeds sane defaults, please reduce the number of repetitions or rule complexity");
        }
        if min_times == 0 {
            rule.truncate(seq.last_sym_start);
        } else {
            for _ in 1..min_times {
                rule.extend_from_slice(&prev_rule);
            }
        }
        let n_opt = match max_times {
            None => 1,
            Some(max) => max - min_times,
        };
        let mut last_rec_rule_id = 0;
        for i in 0..n_opt {
            let mut rec_rule = prev_rule.clone();
            let rec_rule_id = self.generate_symbol_id(rule_name);
            if i > 0 || max_times.is_none() {
                let target = if max_times.is_none() { rec_rule_id } else { last_rec_rule_id };
                rec_rule.push(Element::new(T::RuleRef, target));
            }
            rec_rule.push(Element::new(T::Alt, 0));
            rec_rule.push(Element::new(T::End, 0));
            self.add_rule(rec_rule_id, rec_rule, op);
            last_rec_rule_id = rec_rule_id;
        }
        if n_opt > 0 {
            rule.push(Element::new(T::RuleRef, last_rec_rule_id));
        }
        seq.n_prev_rules = seq.n_prev_rules.saturating_mul(total_rules);
        Ok(())
    }
}
