//! The pushdown matcher: a set of stacks of positions in the grammar, each ending at a
//! terminal, advanced by accepted characters and tokens (llama.cpp's llama_grammar
//! stacks, accept and reject_candidates).

use std::collections::HashSet;
use std::sync::Arc;

use super::utf8::{decode_utf8, PartialUtf8};
use super::{ElementType as T, Grammar};

/// A stack of positions (indices into the grammar's element array); the top is the last.
pub type Stack = Vec<u32>;

/// Expands a stack whose top may be a rule reference into the stacks whose tops are
/// terminals (characters or tokens), adding the ones not yet in `new_stacks`. An empty
/// stack (the grammar is complete) is kept as it is.
pub(crate) fn advance_stack(g: &Grammar, stack: Stack, new_stacks: &mut Vec<Stack>) {
    let mut todo = vec![stack];
    let mut seen: HashSet<Stack> = HashSet::new();
    while let Some(cur) = todo.pop() {
        if seen.contains(&cur) {
            continue;
        }
        seen.insert(cur.clone());
        let Some(&pos) = cur.last() else {
            if !new_stacks.contains(&cur) {
                new_stacks.push(cur);
            }
            continue;
        };
        let elem = g.elems[pos as usize];
        match elem.kind {
            T::RuleRef => {
                let mut sub = g.rule_start[elem.value as usize];
                loop {
                    let mut next: Stack = cur[..cur.len() - 1].to_vec();
                    if !g.elems[pos as usize + 1].is_end_of_sequence() {
                        next.push(pos + 1);
                    }
                    if !g.elems[sub as usize].is_end_of_sequence() {
                        next.push(sub);
                    }
                    todo.push(next);
                    while !g.elems[sub as usize].is_end_of_sequence() {
                        sub += 1;
                    }
                    if g.elems[sub as usize].kind == T::Alt {
                        sub += 1;
                    } else {
                        break;
                    }
                }
            }
            T::Char | T::CharNot | T::CharAny | T::Token | T::TokenNot => {
                if !new_stacks.contains(&cur) {
                    new_stacks.push(cur);
                }
            }
            // a stack never rests on End, Alt or the middle of a class
            T::End | T::Alt | T::CharRngUpper | T::CharAlt => {}
        }
    }
}

/// Whether `chr` satisfies the character class at `pos`, and the position after the class.
fn match_char(g: &Grammar, pos: u32, chr: u32) -> (bool, u32) {
    let first = g.elems[pos as usize];
    let is_positive = matches!(first.kind, T::Char | T::CharAny);
    let mut pos = pos as usize;
    let mut found = false;
    loop {
        if g.elems[pos + 1].kind == T::CharRngUpper {
            found = found || (g.elems[pos].value <= chr && chr <= g.elems[pos + 1].value);
            pos += 2;
        } else if g.elems[pos].kind == T::CharAny {
            found = true;
            pos += 1;
        } else {
            found = found || g.elems[pos].value == chr;
            pos += 1;
        }
        if g.elems[pos].kind != T::CharAlt {
            break;
        }
    }
    (found == is_positive, pos as u32)
}

/// Whether some completion of a partial UTF-8 sequence could satisfy the class at `pos`.
fn match_partial_char(g: &Grammar, pos: u32, partial: PartialUtf8) -> bool {
    let first = g.elems[pos as usize];
    let is_positive = matches!(first.kind, T::Char | T::CharAny);
    let n_remain = partial.n_remain;
    // invalid sequence, or a 7-bit character split over two bytes (overlong)
    if n_remain < 0 || (n_remain == 1 && partial.value < 2) {
        return false;
    }
    let mut low = partial.value << (n_remain * 6);
    let high = low | ((1u32 << (n_remain * 6)) - 1);
    if low == 0 {
        if n_remain == 2 {
            low = 1 << 11;
        } else if n_remain == 3 {
            low = 1 << 16;
        }
    }
    let mut pos = pos as usize;
    loop {
        if g.elems[pos + 1].kind == T::CharRngUpper {
            if g.elems[pos].value <= high && low <= g.elems[pos + 1].value {
                return is_positive;
            }
            pos += 2;
        } else if g.elems[pos].kind == T::CharAny {
            return true;
        } else {
            if low <= g.elems[pos].value && g.elems[pos].value <= high {
                return is_positive;
            }
            pos += 1;
        }
        if g.elems[pos].kind != T::CharAlt {
            break;
        }
    }
    !is_positive
}

fn match_token(g: &Grammar, pos: u32, token: u32) -> bool {
    let e = g.elems[pos as usize];
    match e.kind {
        T::Token => e.value == token,
        T::TokenNot => e.value != token,
        _ => false,
    }
}

fn is_token_element(g: &Grammar, pos: u32) -> bool {
    matches!(g.elems[pos as usize].kind, T::Token | T::TokenNot)
}

/// Advances one stack by one character into `new_stacks` (nothing if it does not match;
/// stacks waiting for a token drop out).
fn accept_chr(g: &Grammar, stack: &Stack, chr: u32, new_stacks: &mut Vec<Stack>) {
    let Some(&pos) = stack.last() else { return };
    if is_token_element(g, pos) {
        return;
    }
    let (matched, after) = match_char(g, pos, chr);
    if matched {
        let mut next: Stack = stack[..stack.len() - 1].to_vec();
        if !g.elems[after as usize].is_end_of_sequence() {
            next.push(after);
        }
        advance_stack(g, next, new_stacks);
    }
}

/// A candidate token on its way through `reject`: `cp` indexes its remaining code points
/// (0-terminated) in a shared buffer; `index` is its place in the candidate array.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrammarCandidate {
    pub index: u32,
    pub cp: u32,
    pub partial: PartialUtf8,
    pub id: u32,
}

/// Candidate lists reused across the recursion and across calls: constraining 150k
/// candidates would otherwise allocate (and fault in) megabytes per level.
#[derive(Debug, Default)]
pub(crate) struct RejectScratch {
    pool: Vec<Vec<GrammarCandidate>>,
}

impl RejectScratch {
    fn take(&mut self) -> Vec<GrammarCandidate> {
        self.pool.pop().unwrap_or_default()
    }

    pub(crate) fn give(&mut self, mut v: Vec<GrammarCandidate>) {
        v.clear();
        self.pool.push(v);
    }
}

/// The state of a grammar match: the live stacks and an unfinished UTF-8 sequence.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    stacks: Vec<Stack>,
    partial: PartialUtf8,
}

impl Matcher {
    /// A matcher at the start of the grammar.
    pub fn new(grammar: Arc<Grammar>) -> Self {
        let stacks = grammar.initial_stacks.clone();
        Matcher { grammar, stacks, partial: PartialUtf8::default() }
    }

    /// Back to the start of the grammar.
    pub fn reset(&mut self) {
        self.stacks = self.grammar.initial_stacks.clone();
        self.partial = PartialUtf8::default();
    }

    /// The grammar being matched.
    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// The live stacks.
    pub fn stacks(&self) -> &[Stack] {
        &self.stacks
    }

    /// The unfinished UTF-8 sequence carried over from the last piece.
    pub fn partial_utf8(&self) -> PartialUtf8 {
        self.partial
    }

    /// Whether the input so far is a complete sentence of the grammar (some stack is empty),
    /// so that an end-of-generation token is allowed.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(Vec::is_empty)
    }

    /// Whether no continuation is possible.
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Accepts a token with its piece (llama_grammar_accept_token): stacks waiting for a
    /// token match the id, the others consume the piece's characters. Returns false, and
    /// leaves the state unchanged, when no stack survives.
    pub fn accept_token(&mut self, token: u32, piece: &[u8]) -> bool {
        let g = Arc::clone(&self.grammar);
        let mut code_points = Vec::with_capacity(piece.len() + 1);
        let partial = decode_utf8(piece, self.partial, &mut code_points);
        let chars = &code_points[..code_points.len() - 1];
        let mut stacks_new: Vec<Stack> = Vec::with_capacity(self.stacks.len());
        for stack in &self.stacks {
            let Some(&pos) = stack.last() else { continue };
            if is_token_element(&g, pos) {
                if match_token(&g, pos, token) {
                    let mut next: Stack = stack[..stack.len() - 1].to_vec();
                    if !g.elems[pos as usize + 1].is_end_of_sequence() {
                        next.push(pos + 1);
                    }
                    advance_stack(&g, next, &mut stacks_new);
                }
                continue;
            }
            let mut current = vec![stack.clone()];
            for &chr in chars {
                let mut next_stacks = Vec::new();
                for s in &current {
                    accept_chr(&g, s, chr, &mut next_stacks);
                }
                current = next_stacks;
                if current.is_empty() {
                    break;
                }
            }
            for s in current {
                if !stacks_new.contains(&s) {
                    stacks_new.push(s);
                }
            }
        }
        if stacks_new.is_empty() {
            return false;
        }
        self.stacks = stacks_new;
        self.partial = partial;
        true
    }

    /// Accepts text character by character (llama_grammar_accept_str): stacks waiting for
    /// a token drop out. Returns false, leaving the state unchanged, when no stack survives.
    pub fn accept_text(&mut self, text: &[u8]) -> bool {
        let g = Arc::clone(&self.grammar);
        let mut code_points = Vec::with_capacity(text.len() + 1);
        let partial = decode_utf8(text, self.partial, &mut code_points);
        let mut stacks = self.stacks.clone();
        for &chr in &code_points[..code_points.len() - 1] {
            let mut next = Vec::with_capacity(stacks.len());
            for s in &stacks {
                accept_chr(&g, s, chr, &mut next);
            }
            stacks = next;
        }
        if stacks.is_empty() {
            return false;
        }
        self.stacks = stacks;
        self.partial = partial;
        true
    }

    /// The candidates (of `cands`, whose code points are in `cps`) that no stack allows.
    /// The returned list comes from `scratch`; give it back when done.
    pub(crate) fn reject(&self, cands: &[GrammarCandidate], cps: &[u32], scratch: &mut RejectScratch) -> Vec<GrammarCandidate> {
        reject_candidates(&self.grammar, &self.stacks, cands, cps, scratch)
    }
}

fn reject_candidates(
    g: &Grammar,
    stacks: &[Stack],
    cands: &[GrammarCandidate],
    cps: &[u32],
    scratch: &mut RejectScratch,
) -> Vec<GrammarCandidate> {
    let mut rejects = scratch.take();
    if cands.is_empty() {
        return rejects;
    }
    let Some((first, rest)) = stacks.split_first() else {
        rejects.extend_from_slice(cands);
        return rejects;
    };
    reject_for_stack(g, first, cands, cps, scratch, &mut rejects);
    for stack in rest {
        if rejects.is_empty() {
            break;
        }
        let mut next = scratch.take();
        reject_for_stack(g, stack, &rejects, cps, scratch, &mut next);
        scratch.give(std::mem::replace(&mut rejects, next));
    }
    rejects
}

/// Appends to `rejects` the candidates that `stack` does not allow.
fn reject_for_stack(
    g: &Grammar,
    stack: &Stack,
    cands: &[GrammarCandidate],
    cps: &[u32],
    scratch: &mut RejectScratch,
    rejects: &mut Vec<GrammarCandidate>,
) {
    let Some(&pos) = stack.last() else {
        // a complete stack allows only what is itself complete
        rejects.extend(cands.iter().filter(|t| cps[t.cp as usize] != 0 || t.partial.n_remain != 0));
        return;
    };
    if is_token_element(g, pos) {
        for t in cands {
            if cps[t.cp as usize] == 0 {
                if t.partial.n_remain != 0 {
                    rejects.push(*t);
                }
            } else if !match_token(g, pos, t.id) {
                rejects.push(*t);
            }
        }
        return;
    }
    let mut next_cands = scratch.take();
    for t in cands {
        let chr = cps[t.cp as usize];
        if chr == 0 {
            if t.partial.n_remain != 0 && !match_partial_char(g, pos, t.partial) {
                rejects.push(*t);
            }
        } else if match_char(g, pos, chr).0 {
            next_cands.push(GrammarCandidate { cp: t.cp + 1, ..*t });
        } else {
            rejects.push(*t);
        }
    }
    if !next_cands.is_empty() {
        let after = match_char(g, pos, 0).1;
        let mut stack_after: Stack = stack[..stack.len() - 1].to_vec();
        if !g.elems[after as usize].is_end_of_sequence() {
            stack_after.push(after);
        }
        let mut next_stacks = Vec::new();
        advance_stack(g, stack_after, &mut next_stacks);
        let next_rejects = reject_candidates(g, &next_stacks, &next_cands, cps, scratch);
        rejects.extend(next_rejects.iter().map(|t| GrammarCandidate { cp: t.cp - 1, ..*t }));
        scratch.give(next_rejects);
    }
    scratch.give(next_cands);
}

/// Every token's piece decoded once (from a clean UTF-8 state), so that constraining a
/// large vocabulary does not decode 150k pieces per step.
#[derive(Debug)]
pub(crate) struct DecodedVocab {
    pub cps: Vec<u32>,
    pub start: Vec<u32>,
    pub partial: Vec<PartialUtf8>,
}

impl DecodedVocab {
    pub(crate) fn new(pieces: &[Vec<u8>]) -> Self {
        let mut cps = Vec::with_capacity(pieces.iter().map(|p| p.len() + 1).sum());
        let mut start = Vec::with_capacity(pieces.len());
        let mut partial = Vec::with_capacity(pieces.len());
        for piece in pieces {
            start.push(cps.len() as u32);
            partial.push(decode_utf8(piece, PartialUtf8::default(), &mut cps));
        }
        DecodedVocab { cps, start, partial }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::parse;

    fn matches(gbnf: &str, text: &str) -> bool {
        let mut m = Matcher::new(Arc::new(parse(gbnf, "root").unwrap()));
        text.chars().all(|c| m.accept_token(0, c.to_string().as_bytes())) && m.is_complete()
    }

    #[test]
    fn literal_and_class() {
        assert!(matches("root ::= \"a\" [0-9]+", "a123"));
        assert!(!matches("root ::= \"a\" [0-9]+", "a"));
        assert!(!matches("root ::= \"a\" [0-9]+", "b1"));
    }

    #[test]
    fn rejected_input_leaves_the_state_unchanged() {
        let mut m = Matcher::new(Arc::new(parse("root ::= \"ab\"", "root").unwrap()));
        assert!(m.accept_text(b"a"));
        assert!(!m.accept_text(b"x"));
        assert!(m.accept_text(b"b"));
        assert!(m.is_complete());
    }
}
