//! GBNF grammars with llama.cpp's syntax and semantics: the parser (`parse`), the compiled
//! rule set (`Grammar`) and the pushdown matcher (`matcher::Matcher`).
//!
//! Syntax: `name ::= alternatives` rules; string literals `"..."`; character classes
//! `[a-z]`, `[^...]`; `.` (any character); groups `( ... )`; repetition `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`; escapes `\x..`, `\u....`, `\U........`, `\t \r \n \\ \" \[ \] \-`;
//! comments from `#` to the end of the line; tokens `<[id]>` and their negation `!<[id]>`
//! (and `<piece>` when the vocabulary is known).

mod parser;
mod utf8;

pub mod matcher;

use std::collections::BTreeMap;

pub use parser::{parse_rules, parse_rules_with_pieces, ParsedRules};
pub use utf8::{decode_utf8, PartialUtf8};

/// The kinds of grammar elements (llama.cpp's `llama_gretype`, same order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// End of a rule definition.
    End,
    /// Start of another alternative of the rule.
    Alt,
    /// A reference to the rule whose id is the value.
    RuleRef,
    /// A character (code point); starts a character class.
    Char,
    /// An inverse character class starting with the code point.
    CharNot,
    /// Upper bound of a range whose lower bound is the previous element.
    CharRngUpper,
    /// Another character or range start of the current class.
    CharAlt,
    /// Any character (`.`).
    CharAny,
    /// A token id.
    Token,
    /// Any token but this id.
    TokenNot,
}

/// One grammar element: a kind and its value (code point, rule id or token id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Element {
    /// What the element is.
    pub kind: ElementType,
    /// Its code point, rule id or token id (0 for End and Alt).
    pub value: u32,
}

impl Element {
    pub(crate) const fn new(kind: ElementType, value: u32) -> Self {
        Element { kind, value }
    }

    pub(crate) fn is_end_of_sequence(&self) -> bool {
        matches!(self.kind, ElementType::End | ElementType::Alt)
    }
}

/// A grammar that failed to parse or to compile. `line` and `col` (1-based, columns in
/// characters) locate the problem; both are 0 when it concerns the whole grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grammar error at line {line}, column {col}: {msg}")]
pub struct GrammarError {
    /// 1-based line, 0 when the error has no position.
    pub line: usize,
    /// 1-based column in characters, 0 when the error has no position.
    pub col: usize,
    /// What is wrong.
    pub msg: String,
}

impl GrammarError {
    pub(crate) fn at(src: &[u8], offset: usize, msg: impl Into<String>) -> Self {
        let offset = offset.min(src.len());
        let before = &src[..offset];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        // count characters, not bytes: UTF-8 continuation bytes do not start one
        let col = 1 + before[line_start..].iter().filter(|&&b| (b & 0xC0) != 0x80).count();
        GrammarError { line, col, msg: msg.into() }
    }

    pub(crate) fn whole(msg: impl Into<String>) -> Self {
        GrammarError { line: 0, col: 0, msg: msg.into() }
    }
}

/// A compiled grammar: rules flattened into one element array, the root rule, and the
/// initial pushdown stacks. Immutable; matchers share it through an `Arc`.
#[derive(Debug, Clone)]
pub struct Grammar {
    pub(crate) elems: Vec<Element>,
    pub(crate) rule_start: Vec<u32>,
    symbol_ids: BTreeMap<String, u32>,
    root: u32,
    pub(crate) initial_stacks: Vec<Vec<u32>>,
}

/// Parses GBNF text and compiles it with `root` as the start rule (llama_grammar_init).
pub fn parse(gbnf: &str, root: &str) -> Result<Grammar, GrammarError> {
    Grammar::compile(parse_rules(gbnf)?, root, gbnf.as_bytes())
}

impl Grammar {
    /// Compiles parsed rules: checks the root exists and that no rule is left-recursive,
    /// then builds the initial stacks.
    pub fn compile(parsed: ParsedRules, root: &str, src: &[u8]) -> Result<Grammar, GrammarError> {
        if parsed.rules.is_empty() {
            return Err(GrammarError::whole("the grammar has no rules"));
        }
        let Some(&root_id) = parsed.symbol_ids.get(root) else {
            return Err(GrammarError::whole(format!("grammar does not contain a '{root}' symbol")));
        };
        let mut elems = Vec::new();
        let mut rule_start = Vec::with_capacity(parsed.rules.len());
        for rule in &parsed.rules {
            rule_start.push(elems.len() as u32);
            elems.extend_from_slice(rule);
        }
        let mut grammar = Grammar { elems, rule_start, symbol_ids: parsed.symbol_ids, root: root_id, initial_stacks: Vec::new() };
        if let Some(rule) = grammar.left_recursive_rule() {
            let name = grammar.rule_name(rule).unwrap_or("?").to_string();
            let offset = parsed.rule_offsets.get(rule as usize).copied().unwrap_or(0);
            return Err(GrammarError::at(src, offset, format!("unsupported grammar: left recursion in rule '{name}'")));
        }
        grammar.initial_stacks = grammar.start_stacks();
        Ok(grammar)
    }

    /// The rule names and their ids (generated rules are named `parent_N`).
    pub fn symbol_ids(&self) -> &BTreeMap<String, u32> {
        &self.symbol_ids
    }

    /// The id of the start rule.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// The number of rules.
    pub fn n_rules(&self) -> usize {
        self.rule_start.len()
    }

    /// The elements of rule `id`, ending with `End`.
    pub fn rule(&self, id: u32) -> &[Element] {
        let start = self.rule_start[id as usize] as usize;
        let end = self.rule_start.get(id as usize + 1).map_or(self.elems.len(), |&e| e as usize);
        &self.elems[start..end]
    }

    /// The name of rule `id`.
    pub fn rule_name(&self, id: u32) -> Option<&str> {
        self.symbol_ids.iter().find(|(_, &v)| v == id).map(|(k, _)| k.as_str())
    }

    /// The stacks the matcher starts from: one per alternative of the root rule, advanced
    /// to their first terminals.
    fn start_stacks(&self) -> Vec<Vec<u32>> {
        let mut stacks = Vec::new();
        let mut pos = self.rule_start[self.root as usize];
        loop {
            let mut stack = Vec::new();
            if !self.elems[pos as usize].is_end_of_sequence() {
                stack.push(pos);
            }
            matcher::advance_stack(self, stack, &mut stacks);
            while !self.elems[pos as usize].is_end_of_sequence() {
                pos += 1;
            }
            if self.elems[pos as usize].kind == ElementType::Alt {
                pos += 1;
            } else {
                break;
            }
        }
        stacks
    }

    /// The first rule found to be left-recursive, if any (llama_grammar_detect_left_recursion,
    /// with rules already proven free of it not explored again).
    fn left_recursive_rule(&self) -> Option<u32> {
        let n = self.n_rules();
        let mut state = LeftRecursion { visited: vec![false; n], in_progress: vec![false; n], may_be_empty: vec![false; n] };
        (0..n as u32).find(|&i| !state.visited[i as usize] && state.detect(self, i))
    }
}

struct LeftRecursion {
    visited: Vec<bool>,
    in_progress: Vec<bool>,
    may_be_empty: Vec<bool>,
}

impl LeftRecursion {
    fn detect(&mut self, g: &Grammar, rule_id: u32) -> bool {
        let idx = rule_id as usize;
        if self.in_progress[idx] {
            return true;
        }
        if self.visited[idx] {
            return false;
        }
        self.in_progress[idx] = true;
        let rule = g.rule(rule_id);
        // can some alternative derive the empty string at once?
        let mut at_rule_start = true;
        for e in rule {
            if e.is_end_of_sequence() {
                if at_rule_start {
                    self.may_be_empty[idx] = true;
                    break;
                }
                at_rule_start = true;
            } else {
                at_rule_start = false;
            }
        }
        // recurse into leftmost nonterminals (and the next ones while those may be empty)
        let mut recurse = true;
        for e in rule {
            if e.kind == ElementType::RuleRef && recurse {
                if (e.value as usize) >= self.visited.len() || self.detect(g, e.value) {
                    return true;
                }
                if !self.may_be_empty[e.value as usize] {
                    recurse = false;
                }
            } else {
                recurse = e.is_end_of_sequence();
            }
        }
        self.in_progress[idx] = false;
        self.visited[idx] = true;
        false
    }
}
