//! JSON values rendered as nlohmann::json's `dump()` renders them (compact; control
//! characters as \u00xx; floats in shortest form with ".0" or "e+NN"), since the
//! converter embeds these renderings in the grammar.

use serde_json::Value;

/// `value.dump()`.
pub(crate) fn dump(value: &Value) -> String {
    let mut out = String::new();
    dump_into(value, &mut out);
    out
}

fn dump_into(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else {
                out.push_str(&dump_float(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => dump_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_into(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_string(k, out);
                out.push(':');
                dump_into(v, out);
            }
            out.push('}');
        }
    }
}

fn dump_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// nlohmann's to_chars: shortest round-trip digits, then fixed notation for decimal
/// exponents in (−4, 15] and scientific ("1.5e+20", "1e-05") otherwise.
fn dump_float(x: f64) -> String {
    if !x.is_finite() {
        return "null".to_string();
    }
    let mut out = String::new();
    let mut v = x;
    if v.is_sign_negative() {
        out.push('-');
        v = -v;
    }
    if v == 0.0 {
        out.push_str("0.0");
        return out;
    }
    // Rust's {:e} gives the shortest digits that round-trip: "d.ddde±X"
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let k = digits.len() as i32;
    let n = exp + 1; // the decimal point sits after n digits
    const MIN_EXP: i32 = -4;
    const MAX_EXP: i32 = 15;
    if k <= n && n <= MAX_EXP {
        out.push_str(&digits);
        out.push_str(&"0".repeat((n - k) as usize));
        out.push_str(".0");
    } else if 0 < n && n <= MAX_EXP {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if MIN_EXP < n && n <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        out.push('e');
        out.push(if e < 0 { '-' } else { '+' });
        let e = e.abs();
        if e < 10 {
            out.push('0');
        }
        out.push_str(&e.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_render_like_nlohmann() {
        assert_eq!(dump_float(1.0), "1.0");
        assert_eq!(dump_float(12.5), "12.5");
        assert_eq!(dump_float(0.001), "0.001");
        assert_eq!(dump_float(1e-5), "1e-05");
        assert_eq!(dump_float(1.5e20), "1.5e+20");
        assert_eq!(dump_float(-0.25), "-0.25");
        assert_eq!(dump_float(123456789012345.0), "123456789012345.0");
    }

    #[test]
    fn strings_escape_controls_in_lowercase_hex() {
        assert_eq!(dump(&Value::String("a\"b\\\u{1}é".into())), "\"a\\\"b\\\\\\u0001é\"");
    }
}
