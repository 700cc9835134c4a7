//! The fixed rules llama.cpp's converter draws on (PRIMITIVE_RULES, STRING_FORMAT_RULES).

/// A built-in rule: its body and the built-in rules it refers to.
pub(crate) struct BuiltinRule {
    pub content: &'static str,
    pub deps: &'static [&'static str],
}

pub(crate) const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// The primitive JSON rules by name.
pub(crate) fn primitive(name: &str) -> Option<BuiltinRule> {
    let (content, deps): (&'static str, &'static [&'static str]) = match name {
        "boolean" => (r#"("true" | "false") space"#, &[]),
        "decimal-part" => ("[0-9]{1,16}", &[]),
        "integral-part" => ("[0] | [1-9] [0-9]{0,15}", &[]),
        "number" => (
            r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space"#,
            &["integral-part", "decimal-part"],
        ),
        "integer" => (r#"("-"? integral-part) space"#, &["integral-part"]),
        "value" => ("object | array | string | number | boolean | null", &["object", "array", "string", "number", "boolean", "null"]),
        "object" => (
            r#""{" space ( string ":" space value ("," space string ":" space value)* )? "}" space"#,
            &["string", "value"],
        ),
        "array" => (r#""[" space ( value ("," space value)* )? "]" space"#, &["value"]),
        "uuid" => (
            r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space"#,
            &[],
        ),
        "char" => (r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#, &[]),
        "string" => (r#""\"" char* "\"" space"#, &["char"]),
        "null" => (r#""null" space"#, &[]),
        _ => return None,
    };
    Some(BuiltinRule { content, deps })
}

/// The string-format rules by name.
pub(crate) fn string_format(name: &str) -> Option<BuiltinRule> {
    let (content, deps): (&'static str, &'static [&'static str]) = match name {
        "date" => (r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#, &[]),
        "time" => (
            r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
            &[],
        ),
        "date-time" => (r#"date "T" time"#, &["date", "time"]),
        "date-string" => (r#""\"" date "\"" space"#, &["date"]),
        "time-string" => (r#""\"" time "\"" space"#, &["time"]),
        "date-time-string" => (r#""\"" date-time "\"" space"#, &["date-time"]),
        _ => return None,
    };
    Some(BuiltinRule { content, deps })
}

/// Names a schema-derived rule may not take (they get a "-" suffix).
pub(crate) fn is_reserved_name(name: &str) -> bool {
    name == "root" || primitive(name).is_some() || string_format(name).is_some()
}
