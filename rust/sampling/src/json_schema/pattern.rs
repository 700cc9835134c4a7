//! Regular-expression `pattern`s (anchored with ^ and $) turned into grammar rules, as
//! llama.cpp's `_visit_pattern` does: literals, `.`, groups (also `(?:`), classes,
//! alternation, `* + ?` and `{m,n}`.

use std::collections::HashMap;

use super::Converter;

const NON_LITERAL: &[u8] = b"|.()[]{}*+?";
const ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS: &[u8] = b"^$.[](){}|*+?";

/// A piece of the translated sequence: grammar text, and whether it is a bare literal
/// (to be quoted, and merged with neighbouring literals).
type Piece = (Vec<u8>, bool);

fn to_rule(piece: &Piece) -> Vec<u8> {
    if piece.1 {
        let mut out = Vec::with_capacity(piece.0.len() + 2);
        out.push(b'"');
        out.extend_from_slice(&piece.0);
        out.push(b'"');
        out
    } else {
        piece.0.clone()
    }
}

/// `std::stoi`: optional leading spaces and sign, then at least one digit.
fn stoi(s: &str) -> Option<i32> {
    let t = s.trim_start();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'-') => (-1i64, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    let v: i64 = digits.parse().ok()?;
    i32::try_from(sign * v).ok()
}

struct PatternParser<'c> {
    conv: &'c mut Converter,
    name: String,
    sub: Vec<u8>,
    i: usize,
    sub_rule_ids: HashMap<Vec<u8>, String>,
}

impl Converter {
    /// `_visit_pattern(pattern, name)`.
    pub(crate) fn visit_pattern(&mut self, pattern: &str, name: &str) -> String {
        let bytes = pattern.as_bytes();
        if !(bytes.first() == Some(&b'^') && bytes.last() == Some(&b'$')) || bytes.len() < 2 {
            self.errors.push("Pattern must start with '^' and end with '$'".to_string());
            return String::new();
        }
        let sub = bytes[1..bytes.len() - 1].to_vec();
        let mut p = PatternParser { conv: self, name: name.to_string(), sub, i: 0, sub_rule_ids: HashMap::new() };
        let body = p.transform();
        let rule = format!("\"\\\"\" ({}) \"\\\"\" space", String::from_utf8_lossy(&to_rule(&body)));
        self.add_rule(name, &rule)
    }
}

impl PatternParser<'_> {
    fn at(&self, i: usize) -> u8 {
        self.sub[i]
    }

    fn dot(&mut self) -> Vec<u8> {
        let rule = if self.conv.dotall { "[\\U00000000-\\U0010FFFF]" } else { "[^\\x0A\\x0D]" };
        self.conv.add_rule("dot", rule).into_bytes()
    }

    /// Joins the sequence, merging consecutive literals.
    fn join_seq(seq: &[Piece]) -> Piece {
        let mut merged: Vec<Piece> = Vec::new();
        let mut literal: Vec<u8> = Vec::new();
        for item in seq {
            if item.1 {
                literal.extend_from_slice(&item.0);
            } else {
                if !literal.is_empty() {
                    merged.push((std::mem::take(&mut literal), true));
                }
                merged.push(item.clone());
            }
        }
        if !literal.is_empty() {
            merged.push((literal, true));
        }
        let parts: Vec<Vec<u8>> = merged.iter().map(to_rule).collect();
        (parts.join(&b' '), false)
    }

    fn transform(&mut self) -> Piece {
        let start = self.i;
        let length = self.sub.len();
        let mut seq: Vec<Piece> = Vec::new();
        while self.i < length {
            let c = self.at(self.i);
            match c {
                b'.' => {
                    let d = self.dot();
                    seq.push((d, false));
                    self.i += 1;
                }
                b'(' => {
                    self.i += 1;
                    if self.i < length && self.at(self.i) == b'?' {
                        if self.i + 1 < length && self.at(self.i + 1) == b':' {
                            self.i += 2;
                        } else {
                            // lookaround is not supported: skip the group
                            self.skip_group();
                            continue;
                        }
                    }
                    let inner = self.transform();
                    let mut group = b"(".to_vec();
                    group.extend_from_slice(&to_rule(&inner));
                    group.push(b')');
                    seq.push((group, false));
                }
                b')' => {
                    self.i += 1;
                    let opened_by_paren = start > 0 && self.at(start - 1) == b'(';
                    let opened_by_noncapture = start >= 2 && self.at(start - 2) == b'?' && self.at(start - 1) == b':';
                    if !opened_by_paren && !opened_by_noncapture {
                        self.conv.errors.push("Unbalanced parentheses".to_string());
                    }
                    return Self::join_seq(&seq);
                }
                b'[' => {
                    let class = self.class();
                    seq.push((class, false));
                }
                b'|' => {
                    seq.push((b"|".to_vec(), false));
                    self.i += 1;
                }
                b'*' | b'+' | b'?' => {
                    self.i += 1;
                    let Some(last) = seq.last_mut() else {
                        self.conv.errors.push(format!("Quantifier '{}' without a preceding item", c as char));
                        continue;
                    };
                    let mut rule = to_rule(last);
                    rule.push(c);
                    *last = (rule, false);
                }
                b'{' => {
                    if !self.braces(&mut seq) {
                        return (Vec::new(), false);
                    }
                }
                _ => {
                    let literal = self.literal();
                    if literal.is_empty() {
                        // a stray ']' or '}': llama.cpp would loop forever here
                        self.conv.errors.push(format!("Unexpected '{}' in pattern", c as char));
                        self.i += 1;
                    } else {
                        seq.push((literal, true));
                    }
                }
            }
        }
        Self::join_seq(&seq)
    }

    fn skip_group(&mut self) {
        self.conv.warnings.push("Unsupported pattern syntax".to_string());
        let length = self.sub.len();
        let mut depth = 1;
        while self.i < length && depth > 0 {
            if self.at(self.i) == b'\\' && self.i + 1 < length {
                self.i += 2;
            } else {
                if self.at(self.i) == b'(' {
                    depth += 1;
                } else if self.at(self.i) == b')' {
                    depth -= 1;
                }
                self.i += 1;
            }
        }
    }

    fn class(&mut self) -> Vec<u8> {
        let length = self.sub.len();
        let mut out = vec![b'['];
        self.i += 1;
        while self.i < length && self.at(self.i) != b']' {
            if self.at(self.i) == b'\\' {
                let end = (self.i + 2).min(length);
                out.extend_from_slice(&self.sub[self.i..end]);
                self.i += 2;
            } else {
                out.push(self.at(self.i));
                self.i += 1;
            }
        }
        if self.i >= length {
            self.conv.errors.push("Unbalanced square brackets".to_string());
        }
        out.push(b']');
        self.i += 1;
        out
    }

    /// `{m}`, `{m,}`, `{,n}`, `{m,n}` applied to the last item; false when the numbers
    /// are invalid (the whole transform then gives up, as llama.cpp's does).
    fn braces(&mut self, seq: &mut [Piece]) -> bool {
        let length = self.sub.len();
        let mut inner = Vec::new();
        self.i += 1;
        while self.i < length && self.at(self.i) != b'}' {
            inner.push(self.at(self.i));
            self.i += 1;
        }
        if self.i >= length {
            self.conv.errors.push("Unbalanced curly brackets".to_string());
        }
        self.i += 1;
        let inner = String::from_utf8_lossy(&inner).into_owned();
        let nums: Vec<&str> = inner.split(',').collect();
        let mut min_times = 0;
        let mut max_times = i32::MAX;
        if nums.len() == 1 {
            let Some(n) = stoi(nums[0]) else {
                self.conv.errors.push("Invalid number in curly brackets".to_string());
                return false;
            };
            min_times = n;
            max_times = n;
        } else if nums.len() != 2 {
            self.conv.errors.push("Wrong number of values in curly brackets".to_string());
        } else {
            for (k, slot) in [(0, &mut min_times), (1, &mut max_times)] {
                if !nums[k].is_empty() {
                    let Some(n) = stoi(nums[k]) else {
                        self.conv.errors.push("Invalid number in curly brackets".to_string());
                        return false;
                    };
                    *slot = n;
                }
            }
        }
        let Some(last) = seq.last_mut() else {
            self.conv.errors.push("Repetition without a preceding item".to_string());
            return true;
        };
        let (sub, sub_is_literal) = last.clone();
        let item = if sub_is_literal {
            let mut q = vec![b'"'];
            q.extend_from_slice(&sub);
            q.push(b'"');
            String::from_utf8_lossy(&q).into_owned()
        } else {
            let known = self.sub_rule_ids.get(&sub).cloned();
            match known {
                Some(id) => id,
                None => {
                    let n = self.sub_rule_ids.len() + 1;
                    let id = self.conv.add_rule(&format!("{}-{}", self.name, n), &String::from_utf8_lossy(&sub));
                    self.sub_rule_ids.insert(sub.clone(), id.clone());
                    id
                }
            }
        };
        *last = (super::build_repetition(&item, min_times, max_times, "").into_bytes(), false);
        true
    }

    fn literal(&mut self) -> Vec<u8> {
        let length = self.sub.len();
        let is_non_literal = |c: u8| NON_LITERAL.contains(&c);
        let mut literal = Vec::new();
        while self.i < length {
            let c = self.at(self.i);
            if c == b'\\' && self.i < length - 1 {
                let next = self.at(self.i + 1);
                if ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS.contains(&next) {
                    literal.push(next);
                } else {
                    literal.extend_from_slice(&[c, next]);
                }
                self.i += 2;
            } else if c == b'"' {
                literal.extend_from_slice(b"\\\"");
                self.i += 1;
            } else if !is_non_literal(c)
                && (self.i == length - 1 || literal.is_empty() || self.at(self.i + 1) == b'.' || !is_non_literal(self.at(self.i + 1)))
            {
                literal.push(c);
                self.i += 1;
            } else {
                break;
            }
        }
        literal
    }
}
