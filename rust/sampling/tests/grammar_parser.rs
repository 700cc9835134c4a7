//! Ported from llama.cpp's tests/test-grammar-parser.cpp: the symbol table and the rule
//! elements the parser produces, and the grammars it must refuse; plus the line/column
//! of errors.

use ferrollama_sampling::grammar::{parse, parse_rules, Element, ElementType as T};

fn e(kind: T, value: u32) -> Element {
    Element { kind, value }
}
fn ch(c: char) -> Element {
    e(T::Char, c as u32)
}
fn alt_ch(c: char) -> Element {
    e(T::CharAlt, c as u32)
}
fn upper(c: char) -> Element {
    e(T::CharRngUpper, c as u32)
}
fn not(c: char) -> Element {
    e(T::CharNot, c as u32)
}
fn rule_ref(id: u32) -> Element {
    e(T::RuleRef, id)
}
fn alt() -> Element {
    e(T::Alt, 0)
}
fn end() -> Element {
    e(T::End, 0)
}

/// The symbol table (sorted by name, as llama.cpp's std::map) and the rules concatenated
/// in id order must be exactly these.
fn verify_parsing(gbnf: &str, symbols: &[(&str, u32)], elements: &[Element]) {
    let parsed = parse_rules(gbnf).unwrap_or_else(|err| panic!("{gbnf}: {err}"));
    let got_symbols: Vec<(&str, u32)> = parsed.symbol_ids.iter().map(|(k, &v)| (k.as_str(), v)).collect();
    assert_eq!(got_symbols, symbols, "symbols of {gbnf}");
    let got: Vec<Element> = parsed.rules.iter().flatten().copied().collect();
    assert_eq!(got, elements, "rules of {gbnf}");
}

fn verify_failure(gbnf: &str) {
    assert!(parse_rules(gbnf).is_err(), "should have failed: {gbnf}");
}

#[test]
fn malformed_repetitions_fail() {
    verify_failure("\n        root ::= \"a\"{,}\"\n    ");
    verify_failure("\n        root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}\n    ");
    verify_failure("\n        root ::= \"a\"{,10}\"\n    ");
    verify_failure("\n        root ::= \"a\"{5000}\n    ");
    verify_failure("\n        root ::= \"a\"{5000,}\n    ");
    verify_failure("\n        root ::= \"a\"{5000,6000}\n    ");
}

#[test]
fn large_maximum_is_unbounded() {
    verify_parsing(
        "\n        root ::= \"a\"{0,5000}\n    ",
        &[("root", 0), ("root_1", 1)],
        &[rule_ref(1), end(), ch('a'), rule_ref(1), alt(), end()],
    );
    verify_parsing(
        "\n        root ::= \"a\"{3,5000}\n    ",
        &[("root", 0), ("root_1", 1)],
        &[ch('a'), ch('a'), ch('a'), rule_ref(1), end(), ch('a'), rule_ref(1), alt(), end()],
    );
}

#[test]
fn literals_and_classes() {
    verify_parsing("\n        root  ::= \"a\"\n    ", &[("root", 0)], &[ch('a'), end()]);
    verify_parsing(
        "\n        root  ::= \"a\" | [bdx-z] | [^1-3]\n    ",
        &[("root", 0)],
        &[ch('a'), alt(), ch('b'), alt_ch('d'), alt_ch('x'), upper('z'), alt(), not('1'), upper('3'), end()],
    );
}

#[test]
fn star_plus_question() {
    verify_parsing(
        "\n        root  ::= a+\n        a     ::= \"a\"\n    ",
        &[("a", 1), ("root", 0), ("root_2", 2)],
        &[rule_ref(1), rule_ref(2), end(), ch('a'), end(), rule_ref(1), rule_ref(2), alt(), end()],
    );
    verify_parsing(
        "\n        root  ::= \"a\"+\n    ",
        &[("root", 0), ("root_1", 1)],
        &[ch('a'), rule_ref(1), end(), ch('a'), rule_ref(1), alt(), end()],
    );
    verify_parsing(
        "\n        root  ::= a?\n        a     ::= \"a\"\n    ",
        &[("a", 1), ("root", 0), ("root_2", 2)],
        &[rule_ref(2), end(), ch('a'), end(), rule_ref(1), alt(), end()],
    );
    verify_parsing(
        "\n        root  ::= \"a\"?\n    ",
        &[("root", 0), ("root_1", 1)],
        &[rule_ref(1), end(), ch('a'), alt(), end()],
    );
    verify_parsing(
        "\n        root  ::= a*\n        a     ::= \"a\"\n    ",
        &[("a", 1), ("root", 0), ("root_2", 2)],
        &[rule_ref(2), end(), ch('a'), end(), rule_ref(1), rule_ref(2), alt(), end()],
    );
    verify_parsing(
        "\n        root  ::= \"a\"*\n    ",
        &[("root", 0), ("root_1", 1)],
        &[rule_ref(1), end(), ch('a'), rule_ref(1), alt(), end()],
    );
}

#[test]
fn counted_repetitions() {
    verify_parsing("\n        root  ::= \"a\"{2}\n    ", &[("root", 0)], &[ch('a'), ch('a'), end()]);
    verify_parsing(
        "\n        root  ::= \"a\"{2,}\n    ",
        &[("root", 0), ("root_1", 1)],
        &[ch('a'), ch('a'), rule_ref(1), end(), ch('a'), rule_ref(1), alt(), end()],
    );
    verify_parsing("\n        root  ::= \"a\"{ 4}\n    ", &[("root", 0)], &[ch('a'), ch('a'), ch('a'), ch('a'), end()]);
    verify_parsing(
        "\n        root  ::= \"a\"{2,4}\n    ",
        &[("root", 0), ("root_1", 1), ("root_2", 2)],
        &[ch('a'), ch('a'), rule_ref(2), end(), ch('a'), alt(), end(), ch('a'), rule_ref(1), alt(), end()],
    );
}

#[test]
fn arithmetic_grammar() {
    verify_parsing(
        "\n        root  ::= (expr \"=\" term \"\\n\")+\n        expr  ::= term ([-+*/] term)*\n        term  ::= [0-9]+\n    ",
        &[("expr", 2), ("expr_5", 5), ("expr_6", 6), ("root", 0), ("root_1", 1), ("root_4", 4), ("term", 3), ("term_7", 7)],
        &[
            // root
            rule_ref(1),
            rule_ref(4),
            end(),
            // root_1
            rule_ref(2),
            ch('='),
            rule_ref(3),
            ch('\n'),
            end(),
            // expr
            rule_ref(3),
            rule_ref(6),
            end(),
            // term
            ch('0'),
            upper('9'),
            rule_ref(7),
            end(),
            // root_4
            rule_ref(1),
            rule_ref(4),
            alt(),
            end(),
            // expr_5
            ch('-'),
            alt_ch('+'),
            alt_ch('*'),
            alt_ch('/'),
            rule_ref(3),
            end(),
            // expr_6
            rule_ref(5),
            rule_ref(6),
            alt(),
            end(),
            // term_7
            ch('0'),
            upper('9'),
            rule_ref(7),
            alt(),
            end(),
        ],
    );
}

#[test]
fn grammar_with_whitespace_rules() {
    verify_parsing(
        "\n        root  ::= (expr \"=\" ws term \"\\n\")+\n        expr  ::= term ([-+*/] term)*\n        term  ::= ident | num | \"(\" ws expr \")\" ws\n        ident ::= [a-z] [a-z0-9_]* ws\n        num   ::= [0-9]+ ws\n        ws    ::= [ \\t\\n]*\n    ",
        &[
            ("expr", 2),
            ("expr_6", 6),
            ("expr_7", 7),
            ("ident", 8),
            ("ident_10", 10),
            ("num", 9),
            ("num_11", 11),
            ("root", 0),
            ("root_1", 1),
            ("root_5", 5),
            ("term", 4),
            ("ws", 3),
            ("ws_12", 12),
        ],
        &[
            // root
            rule_ref(1),
            rule_ref(5),
            end(),
            // root_1
            rule_ref(2),
            ch('='),
            rule_ref(3),
            rule_ref(4),
            ch('\n'),
            end(),
            // expr
            rule_ref(4),
            rule_ref(7),
            end(),
            // ws
            rule_ref(12),
            end(),
            // term
            rule_ref(8),
            alt(),
            rule_ref(9),
            alt(),
            ch('('),
            rule_ref(3),
            rule_ref(2),
            ch(')'),
            rule_ref(3),
            end(),
            // root_5
            rule_ref(1),
            rule_ref(5),
            alt(),
            end(),
            // expr_6
            ch('-'),
            alt_ch('+'),
            alt_ch('*'),
            alt_ch('/'),
            rule_ref(4),
            end(),
            // expr_7
            rule_ref(6),
            rule_ref(7),
            alt(),
            end(),
            // ident
            ch('a'),
            upper('z'),
            rule_ref(10),
            rule_ref(3),
            end(),
            // num
            ch('0'),
            upper('9'),
            rule_ref(11),
            rule_ref(3),
            end(),
            // ident_10
            ch('a'),
            upper('z'),
            alt_ch('0'),
            upper('9'),
            alt_ch('_'),
            rule_ref(10),
            alt(),
            end(),
            // num_11
            ch('0'),
            upper('9'),
            rule_ref(11),
            alt(),
            end(),
            // ws_12
            ch(' '),
            alt_ch('\t'),
            alt_ch('\n'),
            rule_ref(12),
            alt(),
            end(),
        ],
    );
}

#[test]
fn token_elements() {
    verify_parsing(
        "\n        root  ::= <[1000]> !<[1001]> <[1001]>\n    ",
        &[("root", 0)],
        &[e(T::Token, 1000), e(T::TokenNot, 1001), e(T::Token, 1001), end()],
    );
}

#[test]
fn escapes_and_comments() {
    verify_parsing(
        "# a comment\nroot ::= \"\\x41\\u00e9\\U0001F600\\t\\\\\" [\\]\\-] # trailing\n",
        &[("root", 0)],
        &[ch('A'), ch('é'), ch('😀'), ch('\t'), ch('\\'), ch(']'), alt_ch('-'), end()],
    );
    verify_parsing("root ::= .", &[("root", 0)], &[e(T::CharAny, 0), end()]);
}

/// Malformed grammars: each error names the problem and points at it.
#[test]
fn errors_have_line_and_column() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("root ::= \"abc", 1, 10, "unterminated string"),
        ("root ::= [a-z", 1, 10, "unterminated character class"),
        ("root ::= foo\nfoo ::= (\"x\" | \"y\"", 2, 19, "expecting ')'"),
        ("root ::= \"a\"\n  bad rule", 2, 7, "expecting ::="),
        ("root ::= \"\\q\"", 1, 11, "unknown escape"),
        ("root ::= \"\\x4\"", 1, 13, "expecting 2 hex chars"),
        ("root ::= *", 1, 10, "expecting preceding item"),
        ("root ::= \"a\"{2", 1, 15, "expecting ','"),
        ("root ::= \"a\"{2,3", 1, 17, "expecting '}'"),
        ("root ::= \"a\"{3,2}", 1, 13, "below the minimum"),
        ("root ::= \"a\" ; \"b\"", 1, 14, "expecting newline or end"),
        ("root ::= \"a\"\nx ::= missing", 2, 7, "undefined rule identifier 'missing'"),
        ("root ::= <[12", 1, 14, "expecting ']'"),
        ("root ::= <eos>", 1, 10, "no vocabulary"),
        ("::= \"a\"", 1, 1, "expecting name"),
        ("root ::= \"é\" ]", 1, 14, "expecting newline or end"),
    ];
    for &(gbnf, line, col, msg) in cases {
        let err = parse_rules(gbnf).expect_err(gbnf);
        assert!(err.msg.contains(msg), "{gbnf}: message {:?} should contain {msg:?}", err.msg);
        assert_eq!((err.line, err.col), (line, col), "{gbnf}: {}", err.msg);
    }
}

#[test]
fn compile_errors() {
    let err = parse("rot ::= \"a\"", "root").unwrap_err();
    assert!(err.msg.contains("does not contain a 'root' symbol"), "{}", err.msg);
    let err = parse("root ::= \"a\"\nasdf ::= asdf \"b\" | \"c\"", "root").unwrap_err();
    assert!(err.msg.contains("left recursion in rule 'asdf'"), "{}", err.msg);
    assert_eq!(err.line, 2);
    assert!(parse("", "root").is_err());
}
