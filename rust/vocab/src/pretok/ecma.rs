//! A backtracking matcher for the ECMAScript regex subset llama.cpp's pre-tokenizers use,
//! with the semantics of libstdc++'s `std::regex` / `std::wregex` (ECMAScript grammar,
//! classic "C" locale): ordered alternation, greedy quantifiers, atomic look-aheads,
//! ASCII-only `\s \d \w \b`, `$` at the end of the searched range.
//!
//! Text and pattern are sequences of code units (`u32`): collapsed bytes or code points.
//! The pattern is compiled to a small program run by an explicit-stack backtracker, so
//! long runs (`\s+` over megabytes) cannot overflow the call stack.

use std::fmt;

/// A pattern llama.cpp's regex engine would reject (or that this subset does not cover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegexError(pub String);

impl fmt::Display for RegexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(&self.0) }
}

/// Character-class escapes (`\d \s \w` and negations), ASCII-only as in the "C" locale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClassEscape { Digit, Space, Word }

impl ClassEscape {
    fn matches(self, unit: u32) -> bool {
        match self {
            ClassEscape::Digit => (b'0' as u32..=b'9' as u32).contains(&unit),
            // isspace() in the C locale: \t \n \v \f \r and space
            ClassEscape::Space => unit == 0x20 || (0x09..=0x0D).contains(&unit),
            ClassEscape::Word => is_word_unit(unit),
        }
    }
}

fn is_word_unit(unit: u32) -> bool {
    unit < 0x80 && ((unit as u8).is_ascii_alphanumeric() || unit == b'_' as u32)
}

/// A bracket expression (or a class escape outside brackets).
#[derive(Debug, Clone)]
struct Class {
    negated: bool,
    /// Membership of units 0..256, negation already applied.
    low: [u64; 4],
    /// Ranges and escapes, for units >= 256.
    ranges: Vec<(u32, u32)>,
    escapes: Vec<(ClassEscape, bool)>,
}

impl Class {
    fn new(negated: bool, ranges: Vec<(u32, u32)>, escapes: Vec<(ClassEscape, bool)>) -> Class {
        let mut class = Class { negated, low: [0; 4], ranges, escapes };
        for unit in 0..256u32 {
            if class.slow_matches(unit) {
                class.low[(unit >> 6) as usize] |= 1 << (unit & 63);
            }
        }
        class
    }

    fn slow_matches(&self, unit: u32) -> bool {
        let hit = self.ranges.iter().any(|&(lo, hi)| lo <= unit && unit <= hi)
            || self.escapes.iter().any(|&(esc, neg)| esc.matches(unit) != neg);
        hit != self.negated
    }

    #[inline]
    fn matches(&self, unit: u32) -> bool {
        if unit < 256 {
            self.low[(unit >> 6) as usize] >> (unit & 63) & 1 != 0
        } else {
            self.slow_matches(unit)
        }
    }
}

/// Parsed pattern.
#[derive(Debug, Clone)]
enum Node {
    Empty,
    Unit(u32),
    Any,
    Class(usize),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat { node: Box<Node>, min: u32, max: Option<u32>, greedy: bool },
    Look { node: Box<Node>, negate: bool },
    Begin,
    End,
    WordBoundary { negate: bool },
}

const MAX_REPEAT: u32 = 10_000;

struct Parser<'a> {
    pat: &'a [u32],
    pos: usize,
    classes: Vec<Class>,
}

fn unit(c: char) -> u32 { c as u32 }

impl<'a> Parser<'a> {
    fn err<T>(&self, what: &str) -> Result<T, RegexError> {
        Err(RegexError(format!("{what} at offset {}", self.pos)))
    }

    fn peek(&self) -> Option<u32> { self.pat.get(self.pos).copied() }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(unit(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn disjunction(&mut self) -> Result<Node, RegexError> {
        let mut alts = vec![self.alternative()?];
        while self.eat('|') {
            alts.push(self.alternative()?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Node::Empty) } else { Node::Alt(alts) })
    }

    fn alternative(&mut self) -> Result<Node, RegexError> {
        let mut seq = Vec::new();
        while let Some(c) = self.peek() {
            if c == unit('|') || c == unit(')') {
                break;
            }
            seq.push(self.term()?);
        }
        Ok(Node::Seq(seq))
    }

    fn term(&mut self) -> Result<Node, RegexError> {
        let atom = match self.peek() {
            Some(c) if c == unit('^') => { self.pos += 1; return Ok(Node::Begin); }
            Some(c) if c == unit('$') => { self.pos += 1; return Ok(Node::End); }
            Some(c) if c == unit('(') => self.group()?,
            Some(c) if c == unit('[') => { self.pos += 1; self.bracket()? }
            Some(c) if c == unit('.') => { self.pos += 1; Node::Any }
            Some(c) if c == unit('\\') => {
                self.pos += 1;
                match self.atom_escape()? {
                    node @ Node::WordBoundary { .. } => return Ok(node),
                    node => node,
                }
            }
            Some(c) if c == unit('*') || c == unit('+') || c == unit('?') => return self.err("nothing to repeat"),
            Some(c) => { self.pos += 1; Node::Unit(c) }
            None => return self.err("unexpected end"),
        };
        self.quantifier(atom)
    }

    fn group(&mut self) -> Result<Node, RegexError> {
        self.pos += 1; // '('
        let node = if self.eat('?') {
            if self.eat(':') {
                self.disjunction()?
            } else if self.eat('=') {
                Node::Look { node: Box::new(self.disjunction()?), negate: false }
            } else if self.eat('!') {
                Node::Look { node: Box::new(self.disjunction()?), negate: true }
            } else {
                return self.err("unsupported group syntax");
            }
        } else {
            self.disjunction()?
        };
        if !self.eat(')') {
            return self.err("missing ')'");
        }
        Ok(node)
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        let mut value: u32 = 0;
        while let Some(d) = self.peek().filter(|&c| (unit('0')..=unit('9')).contains(&c)) {
            value = value.saturating_mul(10).saturating_add(d - unit('0'));
            self.pos += 1;
        }
        (self.pos > start).then_some(value)
    }

    fn quantifier(&mut self, atom: Node) -> Result<Node, RegexError> {
        if matches!(atom, Node::Look { .. }) {
            return Ok(atom);
        }
        let (min, max) = match self.peek() {
            Some(c) if c == unit('*') => { self.pos += 1; (0, None) }
            Some(c) if c == unit('+') => { self.pos += 1; (1, None) }
            Some(c) if c == unit('?') => { self.pos += 1; (0, Some(1)) }
            Some(c) if c == unit('{') => {
                self.pos += 1;
                let min = match self.number() { Some(n) => n, None => return self.err("bad repeat") };
                let max = if self.eat(',') { self.number() } else { Some(min) };
                if !self.eat('}') {
                    return self.err("missing '}'");
                }
                if max.is_some_and(|m| m < min) || min > MAX_REPEAT || max.is_some_and(|m| m > MAX_REPEAT) {
                    return self.err("bad repeat bounds");
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        let greedy = !self.eat('?');
        Ok(Node::Repeat { node: Box::new(atom), min, max, greedy })
    }

    fn hex(&mut self, digits: usize) -> Result<u32, RegexError> {
        let mut value = 0;
        for _ in 0..digits {
            let d = self.peek().and_then(char::from_u32).and_then(|c| c.to_digit(16));
            match d {
                Some(d) => { value = value * 16 + d; self.pos += 1; }
                None => return self.err("bad hex escape"),
            }
        }
        Ok(value)
    }

    /// Escapes producing a single unit (shared by atoms and brackets); `None` for others.
    fn char_escape(&mut self, c: u32, in_bracket: bool) -> Result<Option<u32>, RegexError> {
        let ch = char::from_u32(c).unwrap_or('\0');
        Ok(Some(match ch {
            '0' => 0,
            'f' => 0x0C,
            'n' => 0x0A,
            'r' => 0x0D,
            't' => 0x09,
            'v' => 0x0B,
            'b' if in_bracket => 0x08,
            'x' => self.hex(2)?,
            'u' => self.hex(4)?,
            'c' => {
                let Some(letter) = self.peek() else { return self.err("bad control escape") };
                self.pos += 1;
                letter % 32
            }
            'd' | 'D' | 's' | 'S' | 'w' | 'W' | 'b' | 'B' => return Ok(None),
            '1'..='9' => return self.err("back-references are not supported"),
            _ => c,
        }))
    }

    fn class_escape(c: u32) -> Option<(ClassEscape, bool)> {
        match char::from_u32(c)? {
            'd' => Some((ClassEscape::Digit, false)),
            'D' => Some((ClassEscape::Digit, true)),
            's' => Some((ClassEscape::Space, false)),
            'S' => Some((ClassEscape::Space, true)),
            'w' => Some((ClassEscape::Word, false)),
            'W' => Some((ClassEscape::Word, true)),
            _ => None,
        }
    }

    /// After a backslash outside brackets: a unit, a class, or a word-boundary assertion.
    fn atom_escape(&mut self) -> Result<Node, RegexError> {
        let Some(c) = self.peek() else { return self.err("trailing backslash") };
        self.pos += 1;
        if let Some(u) = self.char_escape(c, false)? {
            return Ok(Node::Unit(u));
        }
        if let Some(esc) = Self::class_escape(c) {
            self.classes.push(Class::new(false, Vec::new(), vec![esc]));
            return Ok(Node::Class(self.classes.len() - 1));
        }
        Ok(Node::WordBoundary { negate: c == unit('B') })
    }

    /// One bracket atom: a unit, or a class escape.
    fn bracket_atom(&mut self) -> Result<Result<u32, (ClassEscape, bool)>, RegexError> {
        let Some(c) = self.peek() else { return self.err("missing ']'") };
        self.pos += 1;
        if c != unit('\\') {
            return Ok(Ok(c));
        }
        let Some(e) = self.peek() else { return self.err("missing ']'") };
        self.pos += 1;
        if let Some(u) = self.char_escape(e, true)? {
            return Ok(Ok(u));
        }
        match Self::class_escape(e) {
            Some(esc) => Ok(Err(esc)),
            None => Ok(Ok(e)),
        }
    }

    fn bracket(&mut self) -> Result<Node, RegexError> {
        let negated = self.eat('^');
        let (mut ranges, mut escapes) = (Vec::new(), Vec::new());
        let mut first = true;
        loop {
            match self.peek() {
                None => return self.err("missing ']'"),
                Some(c) if c == unit(']') && !first => { self.pos += 1; break; }
                _ => {}
            }
            first = false;
            match self.bracket_atom()? {
                Err(esc) => escapes.push(esc),
                Ok(lo) => {
                    let is_range = self.peek() == Some(unit('-'))
                        && self.pat.get(self.pos + 1).is_some_and(|&c| c != unit(']'));
                    if !is_range {
                        ranges.push((lo, lo));
                        continue;
                    }
                    self.pos += 1; // '-'
                    match self.bracket_atom()? {
                        Ok(hi) if hi >= lo => ranges.push((lo, hi)),
                        Ok(_) => return self.err("invalid range"),
                        Err(_) => return self.err("class escape in a range"),
                    }
                }
            }
        }
        self.classes.push(Class::new(negated, ranges, escapes));
        Ok(Node::Class(self.classes.len() - 1))
    }
}

/// Program instructions of the backtracker.
#[derive(Debug, Clone, Copy)]
enum Inst {
    Unit(u32),
    Class(usize),
    Any,
    /// Try the first target, on failure the second.
    Split(usize, usize),
    Jmp(usize),
    Begin,
    End,
    WordBoundary(bool),
    /// Run the look-ahead sub-program starting at `start`; continue if it matched != negate.
    Look { start: usize, negate: bool },
    /// Remember the position at loop entry (for loops whose body can match empty).
    Mark(usize),
    /// Fail if the loop body matched empty since the matching `Mark`.
    Progress(usize),
    Match,
}

/// A compiled pattern.
#[derive(Debug, Clone)]
pub struct Regex {
    prog: Vec<Inst>,
    classes: Vec<Class>,
    n_marks: usize,
    /// Units a match can start with, for skipping hopeless start positions.
    first: Option<FirstUnits>,
}

struct Compiler {
    prog: Vec<Inst>,
    n_marks: usize,
    /// Look-ahead bodies compiled after the main program: (node, index of the Look inst).
    pending_looks: Vec<(Node, usize)>,
}

fn nullable(node: &Node) -> bool {
    match node {
        Node::Empty | Node::Begin | Node::End | Node::WordBoundary { .. } | Node::Look { .. } => true,
        Node::Unit(_) | Node::Any | Node::Class(_) => false,
        Node::Seq(items) => items.iter().all(nullable),
        Node::Alt(items) => items.iter().any(nullable),
        Node::Repeat { node, min, .. } => *min == 0 || nullable(node),
    }
}

impl Compiler {
    fn emit(&mut self, inst: Inst) -> usize {
        self.prog.push(inst);
        self.prog.len() - 1
    }

    fn patch_split_second(&mut self, at: usize, target: usize) {
        if let Inst::Split(a, _) = self.prog[at] {
            self.prog[at] = Inst::Split(a, target);
        }
    }

    fn compile(&mut self, node: &Node) {
        match node {
            Node::Empty => {}
            Node::Unit(u) => { self.emit(Inst::Unit(*u)); }
            Node::Any => { self.emit(Inst::Any); }
            Node::Class(i) => { self.emit(Inst::Class(*i)); }
            Node::Begin => { self.emit(Inst::Begin); }
            Node::End => { self.emit(Inst::End); }
            Node::WordBoundary { negate } => { self.emit(Inst::WordBoundary(*negate)); }
            Node::Seq(items) => items.iter().for_each(|n| self.compile(n)),
            Node::Alt(alts) => self.compile_alt(alts),
            Node::Repeat { node, min, max, greedy } => self.compile_repeat(node, *min, *max, *greedy),
            Node::Look { node, negate } => {
                let at = self.emit(Inst::Look { start: 0, negate: *negate });
                self.pending_looks.push(((**node).clone(), at));
            }
        }
    }

    fn compile_alt(&mut self, alts: &[Node]) {
        let mut jumps = Vec::new();
        for (i, alt) in alts.iter().enumerate() {
            if i + 1 < alts.len() {
                let split = self.emit(Inst::Split(self.prog.len() + 1, 0));
                self.compile(alt);
                jumps.push(self.emit(Inst::Jmp(0)));
                let next = self.prog.len();
                self.patch_split_second(split, next);
            } else {
                self.compile(alt);
            }
        }
        let end = self.prog.len();
        for j in jumps {
            self.prog[j] = Inst::Jmp(end);
        }
    }

    /// A split preferring the body when greedy, the exit when lazy; the exit is patched later.
    fn emit_loop_split(&mut self, greedy: bool) -> usize {
        let here = self.prog.len();
        self.emit(if greedy { Inst::Split(here + 1, 0) } else { Inst::Split(0, here + 1) })
    }

    fn patch_exit(&mut self, split: usize, greedy: bool, exit: usize) {
        if let Inst::Split(a, b) = self.prog[split] {
            self.prog[split] = if greedy { Inst::Split(a, exit) } else { Inst::Split(exit, b) };
        }
    }

    fn compile_repeat(&mut self, node: &Node, min: u32, max: Option<u32>, greedy: bool) {
        for _ in 0..min {
            self.compile(node);
        }
        match max {
            None => {
                let guard = nullable(node).then(|| { self.n_marks += 1; self.n_marks - 1 });
                let top = self.emit_loop_split(greedy);
                if let Some(slot) = guard { self.emit(Inst::Mark(slot)); }
                self.compile(node);
                if let Some(slot) = guard { self.emit(Inst::Progress(slot)); }
                self.emit(Inst::Jmp(top));
                let exit = self.prog.len();
                self.patch_exit(top, greedy, exit);
            }
            Some(max) => {
                // nested optionals: (x(x(x)?)?)?
                let splits: Vec<usize> = (min..max)
                    .map(|_| {
                        let s = self.emit_loop_split(greedy);
                        self.compile(node);
                        s
                    })
                    .collect();
                let exit = self.prog.len();
                for s in splits {
                    self.patch_exit(s, greedy, exit);
                }
            }
        }
    }
}

/// Units a non-empty match can begin with: a bitmap for units below 256, and whether any
/// unit from 256 up might start a match.
#[derive(Debug, Clone)]
struct FirstUnits {
    low: [u64; 4],
    high: bool,
}

impl FirstUnits {
    #[inline]
    fn may_start(&self, unit: u32) -> bool {
        if unit < 256 { self.low[(unit >> 6) as usize] >> (unit & 63) & 1 != 0 } else { self.high }
    }

    /// `None` when a match can be empty or start with an assertion (no cheap filter then).
    fn of(node: &Node, classes: &[Class]) -> Option<FirstUnits> {
        fn collect(node: &Node, classes: &[Class], acc: &mut FirstUnits) -> bool {
            let mut add = |class: &Class| {
                for (l, w) in acc.low.iter_mut().zip(class.low.iter()) {
                    *l |= *w;
                }
                acc.high |= class.negated
                    || class.ranges.iter().any(|&(_, hi)| hi >= 256)
                    || class.escapes.iter().any(|&(_, neg)| neg);
            };
            match node {
                Node::Unit(u) => { add(&Class::new(false, vec![(*u, *u)], Vec::new())); true }
                Node::Class(i) => { add(&classes[*i]); true }
                Node::Seq(items) => match items.first() {
                    Some(first) if !nullable(first) => collect(first, classes, acc),
                    _ => false,
                },
                Node::Alt(alts) => alts.iter().all(|a| !nullable(a) && collect(a, classes, acc)),
                Node::Repeat { node, min, .. } if *min > 0 => collect(node, classes, acc),
                _ => false,
            }
        }
        if nullable(node) {
            return None;
        }
        let mut acc = FirstUnits { low: [0; 4], high: false };
        collect(node, classes, &mut acc).then_some(acc)
    }
}

/// Backtracking frames.
enum Frame {
    Alt { pc: usize, pos: usize },
    RestoreMark { slot: usize, value: usize },
}

/// Reusable scratch space for matching.
#[derive(Default)]
pub struct Scratch {
    stack: Vec<Frame>,
    marks: Vec<usize>,
}

impl Regex {
    /// Compiles a pattern given as code units.
    pub fn new(pattern: &[u32]) -> Result<Regex, RegexError> {
        let mut parser = Parser { pat: pattern, pos: 0, classes: Vec::new() };
        let node = parser.disjunction()?;
        if parser.pos != pattern.len() {
            return parser.err("unmatched ')'");
        }
        let classes = parser.classes;
        let first = FirstUnits::of(&node, &classes);
        let mut compiler = Compiler { prog: Vec::new(), n_marks: 0, pending_looks: Vec::new() };
        compiler.compile(&node);
        compiler.emit(Inst::Match);
        while let Some((body, at)) = compiler.pending_looks.pop() {
            let start = compiler.prog.len();
            compiler.compile(&body);
            compiler.emit(Inst::Match);
            if let Inst::Look { negate, .. } = compiler.prog[at] {
                compiler.prog[at] = Inst::Look { start, negate };
            }
        }
        let (prog, n_marks) = (compiler.prog, compiler.n_marks);
        Ok(Regex { prog, classes, n_marks, first })
    }

    /// Compiles a pattern written as a string (one unit per code point).
    pub fn from_str_units(pattern: &str) -> Result<Regex, RegexError> {
        let units: Vec<u32> = pattern.chars().map(|c| c as u32).collect();
        Regex::new(&units)
    }

    /// Matches anchored at `pos`; returns the end of the match. `not_null` rejects an empty
    /// match (libstdc++'s `match_not_null`, which it also applies inside look-aheads).
    pub fn match_at(&self, text: &[u32], pos: usize, not_null: bool, scratch: &mut Scratch) -> Option<usize> {
        scratch.stack.clear();
        scratch.marks.clear();
        scratch.marks.resize(self.n_marks, usize::MAX);
        self.run(0, text, pos, not_null, scratch)
    }

    /// Leftmost match starting at or after `from`: (start, end).
    pub fn search(&self, text: &[u32], from: usize, scratch: &mut Scratch) -> Option<(usize, usize)> {
        for start in from..=text.len() {
            if let Some(first) = &self.first {
                match text.get(start) {
                    Some(&u) if first.may_start(u) => {}
                    _ => continue,
                }
            }
            if let Some(end) = self.match_at(text, start, false, scratch) {
                return Some((start, end));
            }
        }
        None
    }

    fn step_unit(&self, inst: Inst, text: &[u32], pos: usize) -> bool {
        let Some(&u) = text.get(pos) else { return false };
        match inst {
            Inst::Unit(c) => u == c,
            Inst::Class(i) => self.classes[i].matches(u),
            // ECMAScript '.': anything but a line terminator (libstdc++ checks \n and \r)
            _ => u != 0x0A && u != 0x0D,
        }
    }

    fn run(&self, start_pc: usize, text: &[u32], start: usize, not_null: bool, s: &mut Scratch) -> Option<usize> {
        let base = s.stack.len();
        let (mut pc, mut pos) = (start_pc, start);
        loop {
            let ok = match self.prog[pc] {
                inst @ (Inst::Unit(_) | Inst::Class(_) | Inst::Any) => {
                    let hit = self.step_unit(inst, text, pos);
                    if hit { pos += 1; pc += 1; }
                    hit
                }
                Inst::Split(a, b) => { s.stack.push(Frame::Alt { pc: b, pos }); pc = a; true }
                Inst::Jmp(a) => { pc = a; true }
                Inst::Begin => { let hit = pos == 0; pc += 1; hit }
                Inst::End => { let hit = pos == text.len(); pc += 1; hit }
                Inst::WordBoundary(negate) => {
                    let left = pos > 0 && is_word_unit(text[pos - 1]);
                    let right = pos < text.len() && is_word_unit(text[pos]);
                    pc += 1;
                    (left != right) != negate
                }
                Inst::Look { start: sub, negate } => {
                    let matched = self.run(sub, text, pos, not_null, s).is_some();
                    pc += 1;
                    matched != negate
                }
                Inst::Mark(slot) => {
                    s.stack.push(Frame::RestoreMark { slot, value: s.marks[slot] });
                    s.marks[slot] = pos;
                    pc += 1;
                    true
                }
                Inst::Progress(slot) => { pc += 1; s.marks[slot] != pos }
                Inst::Match => {
                    if !(not_null && pos == start) {
                        self.unwind_to(base, s);
                        return Some(pos);
                    }
                    false
                }
            };
            if ok {
                continue;
            }
            // backtrack
            loop {
                if s.stack.len() == base {
                    return None;
                }
                match s.stack.pop() {
                    Some(Frame::Alt { pc: p, pos: q }) => { pc = p; pos = q; break; }
                    Some(Frame::RestoreMark { slot, value }) => s.marks[slot] = value,
                    None => return None,
                }
            }
        }
    }

    /// Drops the frames of a finished (atomic) sub-match, restoring marks it changed.
    fn unwind_to(&self, base: usize, s: &mut Scratch) {
        while s.stack.len() > base {
            if let Some(Frame::RestoreMark { slot, value }) = s.stack.pop() {
                s.marks[slot] = value;
            }
        }
    }
}

/// `unicode_regex_split_stl`: splits every chunk of `offsets` at the matches of `re`, the
/// text between matches becoming chunks of its own, with `std::regex_iterator`'s handling of
/// empty matches (retry non-empty at the same place, else move one unit on).
pub fn split_chunks(re: &Regex, units: &[u32], offsets: &[usize], scratch: &mut Scratch) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let chunk = &units[start..start + len];
        let mut start_idx = 0;
        let mut found = re.search(chunk, 0, scratch);
        while let Some((ms, me)) = found {
            if ms > start_idx {
                out.push(ms - start_idx);
            }
            out.push(me - ms);
            start_idx = me;
            found = if me > ms {
                re.search(chunk, me, scratch)
            } else if me == chunk.len() {
                None
            } else if let Some(e2) = re.match_at(chunk, me, true, scratch) {
                Some((me, e2))
            } else {
                re.search(chunk, me + 1, scratch)
            };
        }
        if start_idx < len {
            out.push(len - start_idx);
        }
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(s: &str) -> Vec<u32> { s.chars().map(|c| c as u32).collect() }

    fn find_all(pattern: &str, text: &str) -> Vec<String> {
        let re = Regex::from_str_units(pattern).unwrap();
        let t = units(text);
        let mut scratch = Scratch::default();
        let offsets = split_chunks(&re, &t, &[t.len()], &mut scratch);
        let mut out = Vec::new();
        let mut pos = 0;
        for len in offsets {
            out.push(t[pos..pos + len].iter().map(|&u| char::from_u32(u).unwrap()).collect());
            pos += len;
        }
        out
    }

    #[test]
    fn alternation_is_ordered_not_longest() {
        assert_eq!(find_all("a|ab", "ab"), vec!["a", "b"]);
        assert_eq!(find_all("ab|a", "ab"), vec!["ab"]);
    }

    #[test]
    fn greedy_quantifiers_backtrack() {
        assert_eq!(find_all(r"\s*[\r\n]+", "  \n\n x"), vec!["  \n\n", " x"]);
        assert_eq!(find_all(r"\s+(?!\S)", "a   b"), vec!["a", "  ", " b"]);
        assert_eq!(find_all(r"\d{1,3}", "12345"), vec!["123", "45"]);
        assert_eq!(find_all("x{2}", "xxxxx"), vec!["xx", "xx", "x"]);
    }

    #[test]
    fn classes_and_escapes() {
        assert_eq!(find_all(r"[^\s]+", "ab cd"), vec!["ab", " ", "cd"]);
        assert_eq!(find_all(r"[\[-\]]+", "a[\\]b"), vec!["a", "[\\]", "b"]);
        assert_eq!(find_all("[a-]+", "b-a-c"), vec!["b", "-a-", "c"]);
        assert_eq!(find_all(r"\S+", "é x"), vec!["é", " ", "x"]);
        // \s is ASCII only
        assert_eq!(find_all(r"\s", "\u{3000}"), vec!["\u{3000}"]);
    }

    #[test]
    fn empty_matches_follow_regex_iterator() {
        // zero-width look-ahead: splits digit runs into groups of three from the right
        assert_eq!(find_all(r"(?=(\d{3})+(?!\d))", "1234567"), vec!["1", "", "234", "", "567"]);
        assert_eq!(find_all(r"\s+$", "a  "), vec!["a", "  "]);
    }

    #[test]
    fn lookahead_classes() {
        let p = "((?=[a-zA-Z])([^a-z]))*((?=[a-zA-Z])([^A-Z]))+";
        assert_eq!(find_all(p, "HelloWorld"), vec!["Hello", "World"]);
    }

    #[test]
    fn word_boundary() {
        assert_eq!(find_all(r"\d{1,3}(?=(?:\d{3})*\b)", "1234567 x"), vec!["1", "234", "567", " x"]);
    }

    #[test]
    fn rejects_unsupported_syntax() {
        assert!(Regex::from_str_units("(?i:a)").is_err());
        assert!(Regex::from_str_units("a)").is_err());
        assert!(Regex::from_str_units("[a").is_err());
        assert!(Regex::from_str_units("*a").is_err());
    }

    #[test]
    fn long_runs_do_not_overflow() {
        let text = " ".repeat(200_000);
        assert_eq!(find_all(r"\s+", &text).len(), 1);
    }
}
