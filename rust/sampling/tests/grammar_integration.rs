//! Ported from llama.cpp's tests/test-grammar-integration.cpp: for each grammar (or JSON
//! schema, converted), the strings it must accept and those it must reject, fed to the
//! matcher one code point (or token) at a time as llama.cpp's test does.

use std::sync::Arc;

use ferrollama_sampling::grammar::matcher::Matcher;
use ferrollama_sampling::grammar::{parse, Grammar};
use ferrollama_sampling::json_schema::to_gbnf_str;

/// A token in a test string: 0xFF and the id in big-endian order, as llama.cpp's test encodes it.
fn token(id: u32) -> Vec<u8> {
    let mut v = vec![0xFF];
    v.extend_from_slice(&id.to_be_bytes());
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Splits a test string into (token, piece): encoded tokens, else one code point per
/// piece with token 0 (an invalid byte becomes U+FFFD).
fn parse_tokens(input: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < input.len() {
        if input[i] == 0xFF && i + 5 <= input.len() {
            let id = u32::from_be_bytes([input[i + 1], input[i + 2], input[i + 3], input[i + 4]]);
            out.push((id, format!("<[{id}]>").into_bytes()));
            i += 5;
            continue;
        }
        let len = match input[i] {
            b if b < 0x80 => 1,
            b if b >> 5 == 0b110 => 2,
            b if b >> 4 == 0b1110 => 3,
            b if b >> 3 == 0b11110 => 4,
            _ => 0,
        };
        match input.get(i..i + len.max(1)).and_then(|s| std::str::from_utf8(s).ok()).filter(|_| len > 0) {
            Some(s) => {
                out.push((0, s.as_bytes().to_vec()));
                i += len;
            }
            None => {
                out.push((0, "\u{FFFD}".as_bytes().to_vec()));
                i += 1;
            }
        }
    }
    out
}

fn match_string(grammar: &Arc<Grammar>, input: &[u8]) -> bool {
    let mut m = Matcher::new(Arc::clone(grammar));
    for (tok, piece) in parse_tokens(input) {
        if !m.accept_token(tok, &piece) {
            return false;
        }
    }
    m.is_complete()
}

fn check(desc: &str, grammar: &str, passing: &[Vec<u8>], failing: &[Vec<u8>]) {
    let g = Arc::new(parse(grammar, "root").unwrap_or_era(desc, grammar));
    for s in passing {
        assert!(match_string(&g, s), "{desc}: should accept {:?}\n{grammar}", String::from_utf8_lossy(s));
    }
    for s in failing {
        assert!(!match_string(&g, s), "{desc}: should reject {:?}\n{grammar}", String::from_utf8_lossy(s));
    }
}

trait UnwrapOrEra<T> {
    fn unwrap_or_era(self, desc: &str, grammar: &str) -> T;
}

impl<T, E: std::fmt::Display> UnwrapOrEra<T> for Result<T, E> {
    fn unwrap_or_era(self, desc: &str, grammar: &str) -> T {
        self.unwrap_or_else(|e| panic!("{desc}: {e}\n{grammar}"))
    }
}

fn strs(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn test_grammar(desc: &str, grammar: &str, passing: &[&str], failing: &[&str]) {
    check(desc, grammar, &strs(passing), &strs(failing));
}

fn test_schema(desc: &str, schema: &str, passing: &[&str], failing: &[&str]) {
    let gbnf = to_gbnf_str(schema).unwrap_or_else(|e| panic!("{desc}: {e}\n{schema}"));
    check(desc, &gbnf, &strs(passing), &strs(failing));
}

#[test]
fn integer_ranges() {
    test_schema(
        "min 0",
        r#"{"type": "integer", "minimum": 0}"#,
        &["0", "10", "12", "10000"],
        &["-1", "-10", "-10000", "-100000000000000000000000000000000", "100000000000000000000000000000000", "00", "01", "-0"],
    );
    test_schema(
        "min 2",
        r#"{"type": "integer", "minimum": 2}"#,
        &["2", "3", "4", "10", "20", "1234567890000000"],
        &["0", "1", "-1", "-100", "0", "1", "01", "02", "12345678900000000"],
    );
    test_schema(
        "min 456",
        r#"{"type": "integer", "minimum": 456}"#,
        &["456", "4560", "457", "460", "500"],
        &["455", "356", "50", "050", "-1", "-456"],
    );
    test_schema(
        "min -123",
        r#"{"type": "integer", "minimum": -123}"#,
        &["-123", "-122", "-11", "-1", "0", "1", "123", "1234", "2345"],
        &["-1234", "-124"],
    );
    test_schema("max 9999", r#"{"type": "integer", "maximum": 9999}"#, &["-99999", "0", "9999"], &["10000", "99991"]);
    test_schema("max -9999", r#"{"type": "integer", "maximum": -9999}"#, &["-10000", "-9999"], &["-9998", "0", "9999"]);
    test_schema(
        "min 5 max 30",
        r#"{"type": "integer", "minimum": 5, "maximum": 30}"#,
        &["5", "10", "30"],
        &["05", "4", "-1", "31", "123", "0123"],
    );
    test_schema(
        "min 1 max 900719925474091",
        r#"{"type": "integer", "exclusiveMinimum": 0, "maximum": 900719925474091}"#,
        &["1", "2", "10", "900719925474090", "900719925474091"],
        &["0", "01", "900719925474092", "9007199254740910"],
    );
    test_schema(
        "min -1 max 1",
        r#"{"type": "integer", "minimum": -1, "maximum": 1}"#,
        &["-1", "0", "1"],
        &["-11", "-10", "-2", "2", "10", "11"],
    );
    test_schema(
        "min -123 max 42",
        r#"{"type": "integer", "minimum": -123, "maximum": 42}"#,
        &["-123", "-122", "-13", "-11", "-2", "-1", "0", "1", "5", "10", "39", "40", "42"],
        &["-0123", "-124", "-1123", "-200", "43", "123", "0123"],
    );
    test_schema(
        "exclusive min / max",
        r#"{"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10000}"#,
        &["1", "9999"],
        &["0", "01", "10000", "99999"],
    );
}

#[test]
fn simple_grammar() {
    test_grammar(
        "simple grammar",
        "\n            root ::= expr\n            expr ::= term (\"+\" term)*\n            term ::= number\n            number ::= [0-9]+",
        &["42", "1+2+3+4+5", "123+456"],
        &["+", "/ 3", "1+2+3+4+5+", "12a45"],
    );
}

#[test]
fn simple_grammar_with_tokens() {
    let t = token;
    check(
        "simple grammar with tokens",
        "\n            root ::= <[10]> content <[11]>\n            content ::= (!<[11]>)*",
        &[
            cat(&[&t(10), b"hello world", &t(11)]),
            cat(&[&t(10), b"text with ", &t(12), b" other tokens ", &t(13), b" mixed in", &t(11)]),
            cat(&[&t(10), &t(11)]),
            cat(&[&t(10), &t(12), &t(13), &t(14), &t(15), &t(11)]),
            cat(&[&t(10), b"a", &t(11)]),
        ],
        &[
            cat(&[&t(10), b"missing end token"]),
            t(10),
            cat(&[b"missing start token", &t(11)]),
            cat(&[&t(10), &t(11), &t(11)]),
            cat(&[&t(11), b"wrong order", &t(10)]),
        ],
    );
}

#[test]
fn medium_complexity_grammar() {
    test_grammar(
        "medium complexity grammar",
        r#"
            root ::= expression
            expression ::= term ws (("+"|"-") ws term)*
            term ::= factor ws (("*"|"/") ws factor)*
            factor ::= number | variable | "(" expression ")" | function-call
            number ::= [0-9]+
            variable ::= [a-zA-Z_][a-zA-Z0-9_]*
            function-call ::= variable ws "(" (expression ("," ws expression)*)? ")"
            ws ::= [ \t\n\r]?"#,
        &[
            "42",
            "1*2*3*4*5",
            "x",
            "x+10",
            "x1+y2",
            "(a+b)*(c-d)",
            "func()",
            "func(x,y+2)",
            "a*(b+c)-d/e",
            "f(g(x),h(y,z))",
            "x + 10",
            "x1 + y2",
            "(a + b) * (c - d)",
            "func()",
            "func(x, y + 2)",
            "a * (b + c) - d / e",
            "f(g(x), h(y, z))",
            "123+456",
            "123*456*789-123/456+789*123",
            "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456",
        ],
        &[
            "+",
            "/ 3x",
            "x + + y",
            "a * / b",
            "func(,)",
            "func(x y)",
            "(a + b",
            "x + y)",
            "a + b * (c - d",
            "42 +",
            "x +",
            "x + 10 +",
            "(a + b) * (c - d",
            "func(",
            "func(x, y + 2",
            "a * (b + c) - d /",
            "f(g(x), h(y, z)",
            "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456/",
        ],
    );
}

#[test]
fn complex_grammar_with_tokens() {
    let t = token;
    check(
        "complex grammar with tokens",
        "\n            root ::= reasoning+ content tool-call*\n            reasoning ::= <[10]> (!<[11]>)* <[11]>\n            content ::= <[20]> (!<[21]>)* <[21]>\n            tool-call ::= <[12]> name <[13]> args <[14]>\n            name ::= (!<[13]>)+\n            args ::= (!<[14]>)*",
        &[
            cat(&[&t(10), b"I am thinking", &t(11), &t(20), b"hello world!", &t(21), &t(12), b"search", &t(13), b"query=test", &t(14)]),
            cat(&[&t(10), b"reasoning 1", &t(11), &t(10), b"reasoning 2", &t(11), &t(20), &t(21), &t(12), b"tool", &t(13), &t(14)]),
            cat(&[&t(10), &t(11), &t(20), b"content", &t(21)]),
            cat(&[
                &t(10), b"think", &t(12), b" nested", &t(11), &t(20), &t(10), b"more content", &t(21), &t(12), b"fn", &t(13),
                b"x=1,y=2", &t(14), &t(12), b"fn2", &t(13), &t(14),
            ]),
            cat(&[
                &t(10), b"reasoning", &t(11), &t(10), b"more", &t(11), &t(10), b"even more", &t(11), &t(20), b"text", &t(21),
                &t(12), b"a", &t(13), b"b", &t(14), &t(12), b"c", &t(13), b"d", &t(14),
            ]),
        ],
        &[
            cat(&[&t(20), b"content only", &t(21)]),
            cat(&[&t(10), b"no closing reasoning"]),
            cat(&[&t(10), &t(11), &t(20), b"no closing content"]),
            cat(&[&t(10), &t(11), &t(20), &t(21), &t(12), b"incomplete tool"]),
            cat(&[&t(10), &t(11), &t(11), &t(20), &t(21)]),
        ],
    );
}

#[test]
fn special_characters() {
    test_grammar(
        "special characters",
        "\n            root ::= ... \"abc\" ...\n            ",
        &["abcabcabc", "aaaabcccc", "🔵🟠✅abc❌🟠🔵"],
        &["aaabcccc", "aaaaabcccc", "aaaabccc", "aaaabccccc", "🔵🟠✅❌abc❌✅🟠🔵", "🔵🟠abc🟠🔵"],
    );
}

#[test]
fn quantifiers() {
    let many_a = "a".repeat(62);
    let many_a_b = format!("{}b", "a".repeat(62));
    test_grammar(
        "* quantifier",
        "root ::= \"a\"*",
        &["", "a", "aaaaa", "aaaaaaaaaaaaaaaaaa", &many_a],
        &["b", "ab", "aab", "ba", &many_a_b],
    );
    test_grammar(
        "+ quantifier",
        "root ::= \"a\"+",
        &["a", "aaaaa", "aaaaaaaaaaaaaaaaaa", &many_a],
        &["", "b", "ab", "aab", "ba", &many_a_b],
    );
    test_grammar("? quantifier", "root ::= \"a\"?", &["", "a"], &["b", "ab", "aa", "ba"]);
    test_grammar(
        "mixed quantifiers",
        "\n            root ::= cons+ vowel* cons? (vowel cons)*\n            vowel ::= [aeiouy]\n            cons ::= [bcdfghjklmnpqrstvwxyz]\n            ",
        &["yes", "no", "noyes", "crwth", "four", "bryyyy"],
        &["yess", "yesno", "forty", "catyyy"],
    );
    test_grammar("simple exact repetition", "\n            root ::= [ab]{4}\n        ", &["aaaa", "bbbb", "abab"], &["a", "b", "aaaaa"]);
    test_grammar(
        "simple min repetition",
        "\n            root ::= [ab]{4,}\n        ",
        &["aaaa", "aaaaab", "bbbb", "ababab"],
        &["", "aba"],
    );
    test_grammar("simple max repetition", "\n            root ::= [ab]{0,4}\n        ", &["", "a", "aa", "aaa", "aaab"], &["aaaaa"]);
    test_grammar(
        "min / max repetition",
        "\n            root ::= (\"0x\" [A-F0-9]{2} \" \"?){3,5}\n        ",
        &["0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"],
        &["", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"],
    );
    test_grammar("segfault", "\n            root ::= ( [x]* )*\n        ", &["", "x", "xx"], &["y", "yy"]);
}

#[test]
fn hang_grammar_is_refused() {
    // llama.cpp's "hang" case: too many rules; the parser refuses it instead of expanding it
    assert!(parse("\n            root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}\n        ", "root").is_err());
}

#[test]
fn missing_root() {
    let gbnf = "\n        rot ::= expr\n        expr ::= term (\"+\" term)*\n        term ::= number\n        number ::= [0-9]+";
    let parsed = ferrollama_sampling::grammar::parse_rules(gbnf).unwrap();
    assert!(!parsed.rules.is_empty());
    assert!(!parsed.symbol_ids.contains_key("root"));
    assert!(parse(gbnf, "root").is_err());
}

#[test]
fn missing_reference() {
    let gbnf = "root ::= expr\n        expr ::= term (\"+\" term)*\n        term ::= numero\n        number ::= [0-9]+";
    let err = ferrollama_sampling::grammar::parse_rules(gbnf).unwrap_err();
    assert!(err.msg.contains("'numero'"), "{}", err.msg);
    assert_eq!(err.line, 3);
}

#[test]
fn left_recursion() {
    for gbnf in [
        "root ::= \"a\" | root \"a\"",
        "\n        root ::= asdf\n        asdf ::= \"a\" | asdf \"a\"\n        ",
        "\n        root ::= asdf\n        asdf ::= \"a\" | foo \"b\"\n        foo ::= \"c\" | asdf \"d\" | \"e\"",
        "\n        root ::= asdf\n        asdf ::= \"a\" | foo \"b\"\n        foo ::= \"c\" | empty asdf \"d\" | \"e\"\n        empty ::= \"blah\" | ",
    ] {
        let err = parse(gbnf, "root").expect_err(gbnf);
        assert!(err.msg.contains("left recursion"), "{gbnf}: {}", err.msg);
    }
}

#[test]
fn json_schemas() {
    test_schema("empty schema (object)", "\n            {}\n        ", &["{}", r#"{"foo": "bar"}"#], &["", "[]", "null", r#""""#, "true"]);
    test_schema(
        "exotic formats (list)",
        r#"{
            "items": [
                { "format": "date" },
                { "format": "uuid" },
                { "format": "time" },
                { "format": "date-time" }
            ]
        }"#,
        &[r#"["2012-04-23", "12345678-1234-1234-1234-1234567890ab", "18:25:43.511Z", "2012-04-23T18:25:43.511Z"]"#],
        &[r#"["foo", "bar"]"#, r#"["12345678-1234-1234-1234-1234567890ab"]"#],
    );
    test_schema("string", r#"{"type": "string"}"#, &[r#""foo""#, r#""bar""#, r#""""#], &["{}", r#""foo": "bar""#]);
    test_schema(
        "string w/ min length 1",
        r#"{"type": "string", "minLength": 1}"#,
        &[r#""foo""#, r#""bar""#],
        &[r#""""#, "{}", r#""foo": "bar""#],
    );
    test_schema(
        "string w/ min length 3",
        r#"{"type": "string", "minLength": 3}"#,
        &[r#""foo""#, r#""bar""#, r#""foobar""#],
        &[r#""""#, r#""f""#, r#""fo""#],
    );
    test_schema(
        "string w/ max length",
        r#"{"type": "string", "maxLength": 3}"#,
        &[r#""foo""#, r#""bar""#, r#""""#, r#""f""#, r#""fo""#],
        &[r#""foobar""#],
    );
    test_schema(
        "string w/ min & max length",
        r#"{"type": "string", "minLength": 1, "maxLength": 4}"#,
        &[r#""foo""#, r#""bar""#, r#""f""#, r#""barf""#],
        &[r#""""#, r#""barfo""#, r#""foobar""#],
    );
    test_schema("boolean", r#"{"type": "boolean"}"#, &["true", "false"], &[r#""""#, r#""true""#, "True", "FALSE"]);
    test_schema("integer", r#"{"type": "integer"}"#, &["0", "12345", "1234567890123456"], &["", "01", "007", "12345678901234567  "]);
    test_schema("string const", r#"{"const": "foo"}"#, &[r#""foo""#], &["foo", r#""bar""#]);
    test_schema("non-string const", r#"{"const": true}"#, &["true"], &["", "foo", r#""true""#]);
    test_schema(
        "non-string enum",
        r#"{"enum": ["red", "amber", "green", null, 42, ["foo"]]}"#,
        &[r#""red""#, "null", "42", r#"["foo"]"#],
        &["", "420", "true", "foo"],
    );
    test_schema("simple pattern", r#"{"pattern": "^[a-zA-Z0-9_-]*$"}"#, &[r#""""#, r#""He_llo-12""#], &[r#""!""#, r#""Hello World""#]);
    test_schema(
        "pattern with escapes",
        r#"{"pattern": "^a\\^\\$\\.\\[\\]\\(\\)\\|\\{\\}\\*\\+\\?b$"}"#,
        &[r#""a^$.[]()|{}*+?b""#],
        &[r#""ab""#],
    );
    test_schema(
        "nullable array of strings",
        r#"{"type": ["array", "null"], "items": { "type": "string" }}"#,
        &["null", "[]", r#"["123"]"#, r#"["foo", "bar"]"#],
        &["", "[123]", r#""foo""#, r#"["foo", 42]"#],
    );
    test_schema(
        "min+max items",
        r#"{"items": {"type": ["number", "integer"]}, "minItems": 3, "maxItems": 5}"#,
        &["[1, 2, 3]", "[1, 2, 3, 4]", "[1, 2, 3, 4, 5]"],
        &["[1, 2]", "[1, 2, 3, 4, 5, 6]", "1"],
    );
}

const ADDRESS_PROPERTIES: &str = r#"
                "number": { "type": "number" },
                "street_name": { "type": "string" },
                "street_type": { "enum": ["Street", "Avenue", "Boulevard"] }"#;

#[test]
fn json_schema_objects() {
    test_schema(
        "object properties",
        &format!(r#"{{"type": "object", "properties": {{{ADDRESS_PROPERTIES}}}}}"#),
        &[
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue"}"#,
            r#"{ "street_name": "Pennsylvania" }"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania" }"#,
            "{}",
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }"#,
        ],
        &[
            r#"{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}"#,
            r#"{ "street_name": "Pennsylvania", "number": 1600 }"#,
            r#"{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}"#,
        ],
    );
    test_schema(
        "additional properties can't override other properties",
        r#"{"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": true}"#,
        &[r#"{"a": 42}"#, r#"{"c": ""}"#, r#"{"a": 42, "c": ""}"#, r#"{"a_": ""}"#],
        &["", r#"{"a": ""}"#, r#"{"a": "", "b": ""}"#],
    );
    test_schema(
        "object properties, additionalProperties: true",
        &format!(r#"{{"type": "object", "properties": {{{ADDRESS_PROPERTIES}}}, "additionalProperties": true}}"#),
        &[
            "{}",
            r#"{"number":1600,"street_name":"Pennsylvania","street_type":"Avenue"}"#,
            r#"{ "street_name": "Pennsylvania" }"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania" }"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }"#,
        ],
        &[
            r#"{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}"#,
            r#"{ "street_name": "Pennsylvania", "number": 1600, "street_type":"Avenue"}"#,
        ],
    );
    test_schema(
        "required + optional props each in original order (additionalProperties false)",
        &format!(r#"{{"type": "object", "properties": {{{ADDRESS_PROPERTIES}}}, "additionalProperties": false}}"#),
        &[
            r#"{ "street_name": "Pennsylvania" }"#,
            r#"{ "number": 1600, "street_type":"Avenue"}"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania" }"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue"}"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }"#,
        ],
        &[
            r#"{ "street_type": "Avenue", "number": 1600 }"#,
            r#"{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue", "direction": "NW" }"#,
        ],
    );
    test_schema(
        "required + optional props each in original order",
        r#"{"properties": {"b": {"type": "string"}, "a": {"type": "string"}, "d": {"type": "string"}, "c": {"type": "string"}},
            "required": ["a", "b"], "additionalProperties": false}"#,
        &[r#"{"b": "foo", "a": "bar"}"#, r#"{"b":"foo","a":"bar","d":"qux"}"#, r#"{"b":"foo", "a":"bar", "d":"qux", "c":"baz"}"#],
        &[r#"{"a": "foo", "b": "bar"}"#, r#"{"b": "bar"}"#, r#"{"a": "foo", "c": "baz"}"#, r#"{"a":"foo", "b":"bar", "c":"baz", "d":"qux"}"#],
    );
    test_schema(
        "required props",
        r#"{
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://example.com/product.schema.json",
            "title": "Product",
            "description": "A product from Acme's catalog",
            "type": "object",
            "properties": {
                "productId": {"description": "The unique identifier for a product", "type": "integer"},
                "productName": {"description": "Name of the product", "type": "string"},
                "price": {"description": "The price of the product", "type": "number", "exclusiveMinimum": 0},
                "tags": {"description": "Tags for the product", "type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": true},
                "dimensions": {
                    "type": "object",
                    "properties": {"length": {"type": "number"}, "width": {"type": "number"}, "height": {"type": "number"}},
                    "required": [ "length", "width", "height" ]
                }
            },
            "required": [ "productId", "productName", "price" ]
        }"#,
        &[
            r#"{"productId": 1, "productName": "A green door", "price": 12.50}"#,
            r#"{"productId": 1, "productName": "A green door", "price": 12.50, "tags": ["home", "green"]}"#,
            r#"{"productId": 1, "productName": "A green door", "price": 12.50, "tags": ["home", "green"], "dimensions": {"length": 785, "width": 250.5, "height": -0.359}}"#,
        ],
        &[
            "{}",
            r#"{"productName": "A green door", "price": 12.50, "productId": 1}"#,
            r#"{"productId": 1, "productName": "A green door"}"#,
            r#"{"productName": "A green door", "price": 12.50}"#,
            r#"{"productId": 1, "productName": "A green door", "price": 12.50, "tags": []}"#,
            r#"{"productId": 1, "productName": "A green door", "price": 12.50, "dimensions": {"length": 785, "width": 250.5, "height": -0.359}, "tags": ["home", "green"]}"#,
        ],
    );
}

/// Schemas beyond llama.cpp's test file: $defs/$ref, anyOf/oneOf/allOf, formats.
#[test]
fn json_schema_refs_and_combinators() {
    test_schema(
        "$defs and $ref",
        r##"{"type": "object", "properties": {"p": {"$ref": "#/$defs/point"}}, "required": ["p"],
             "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}}}"##,
        &[r#"{"p": {"x": 1, "y": -2}}"#],
        &[r#"{"p": {"y": 1, "x": 2}}"#, r#"{"p": {"x": 1}}"#, "{}"],
    );
    test_schema(
        "nested $defs are hoisted",
        r##"{"type": "object", "properties": {"a": {"$defs": {"n": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/n"}}, "required": ["a"]}"##,
        &[r#"{"a": 5}"#],
        &[r#"{"a": 0}"#, r#"{"a": "5"}"#],
    );
    test_schema(
        "oneOf",
        r#"{"oneOf": [{"type": "boolean"}, {"type": "string", "maxLength": 2}]}"#,
        &["true", r#""ab""#],
        &["1", r#""abc""#],
    );
    test_schema(
        "allOf merges properties",
        r#"{"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "boolean"}}}]}"#,
        &[r#"{"a": 1, "b": true}"#],
        &[r#"{"a": 1}"#, r#"{"b": true, "a": 1}"#],
    );
    test_schema(
        "date-time string",
        r#"{"type": "string", "format": "date-time"}"#,
        &[r#""2024-02-29T23:59:59Z""#, r#""2024-02-29T23:59:59.123+05:30""#],
        &[r#""2024-13-01T00:00:00Z""#, r#""2024-02-29""#],
    );
    test_schema(
        "recursive $ref",
        r##"{"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["next"]}},
             "$ref": "#/$defs/node"}"##,
        &[r#"{"next": null}"#, r#"{"next": {"next": {"next": null}}}"#],
        &[r#"{"next": {}}"#, r#"{}"#],
    );
}
