//! Ported from llama.cpp's tests/test-json-schema-to-grammar.cpp (the C++ converter's
//! cases; schemas reformatted onto one line in tests/data/json_schema_cases.txt): the
//! converted grammar must equal llama.cpp's expected text, rule names included; the
//! expected grammars must parse; the FAILURE schemas must be refused.

use ferrollama_sampling::grammar::parse;
use ferrollama_sampling::json_schema::{to_gbnf, to_gbnf_str};

const CASES: &str = include_str!("data/json_schema_cases.txt");

struct Case {
    name: String,
    success: bool,
    schema: String,
    expected: String,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for block in CASES.split("=== ").filter(|b| !b.trim().is_empty()) {
        let (header, body) = block.split_once('\n').expect("a header line");
        let (status, name) = header.split_once(' ').expect("STATUS name");
        let (schema, expected) = body.split_once("\n---\n").unwrap_or((body, ""));
        out.push(Case { name: name.to_string(), success: status == "SUCCESS", schema: schema.trim().to_string(), expected: expected.to_string() });
    }
    out
}

/// llama.cpp's trim: outer whitespace, and the indentation of every line.
fn trim(s: &str) -> String {
    s.trim_matches(|c| " \n\r\t".contains(c)).lines().map(|l| l.trim_start_matches([' ', '\t'])).collect::<Vec<_>>().join("\n")
}

#[test]
fn converter_output_matches_llama_cpp_text() {
    let all = cases();
    assert_eq!(all.len(), 75);
    let mut failures = Vec::new();
    for case in &all {
        let result = to_gbnf_str(&case.schema);
        match (case.success, result) {
            (true, Ok(gbnf)) => {
                if trim(&gbnf) != trim(&case.expected) {
                    failures.push(format!("{}:\n# EXPECTED:\n{}\n# ACTUAL:\n{}", case.name, trim(&case.expected), trim(&gbnf)));
                }
            }
            (true, Err(e)) => failures.push(format!("{}: conversion failed: {e}", case.name)),
            (false, Ok(gbnf)) => failures.push(format!("{}: should have failed, gave\n{gbnf}", case.name)),
            (false, Err(_)) => {}
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), all.len(), failures.join("\n\n"));
}

#[test]
fn expected_grammars_parse() {
    for case in cases().iter().filter(|c| c.success) {
        if let Err(e) = parse(&case.expected, "root") {
            panic!("{}: {e}\n{}", case.name, case.expected);
        }
    }
}

#[test]
fn schema_values_keep_their_key_order() {
    let schema: serde_json::Value =
        serde_json::from_str(r#"{"properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["z", "a"]}"#).unwrap();
    let gbnf = to_gbnf(&schema).unwrap();
    assert!(gbnf.contains(r#"root ::= "{" space z-kv "," space a-kv "}" space"#), "{gbnf}");
}

#[test]
fn bad_schemas_are_errors() {
    for bad in [
        r#"{"type": "string", "pattern": "abc"}"#,
        r##"{"$ref": "https://example.com/schema.json"}"##,
        r##"{"$ref": "#/definitions/missing"}"##,
        r#"{"type": "string", "format": 3}"#,
        "not json",
    ] {
        assert!(to_gbnf_str(bad).is_err(), "{bad}");
    }
}
