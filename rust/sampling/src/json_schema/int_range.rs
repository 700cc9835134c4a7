//! Integer ranges as grammar text (llama.cpp's build_min_max_int): decimal numbers
//! between bounds, built digit position by digit position.

/// Appends to `out` an expression matching the integers in [min_value, max_value];
/// i64::MIN / i64::MAX stand for "no bound".
pub(crate) fn build_min_max_int(min_value: i64, max_value: i64, out: &mut String, decimals_left: i32, top_level: bool) -> Result<(), String> {
    let has_min = min_value != i64::MIN;
    let has_max = max_value != i64::MAX;
    let neg = |v: i64| v.checked_neg().ok_or_else(|| format!("integer bound {v} out of range"));

    if has_min && has_max {
        let mut min_value = min_value;
        if min_value < 0 && max_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(neg(max_value)?, neg(min_value)?, out, decimals_left, true)?;
            out.push(')');
            return Ok(());
        }
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(0, neg(min_value)?, out, decimals_left, true)?;
            out.push_str(") | ");
            min_value = 0;
        }
        let mut min_s = min_value.to_string();
        let max_s = max_value.to_string();
        for digits in min_s.len()..max_s.len() {
            uniform_range(min_s.as_bytes(), "9".repeat(digits).as_bytes(), out);
            min_s = format!("1{}", "0".repeat(digits));
            out.push_str(" | ");
        }
        uniform_range(min_s.as_bytes(), max_s.as_bytes(), out);
        return Ok(());
    }

    let less_decimals = (decimals_left - 1).max(1);

    if has_min {
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(i64::MIN, neg(min_value)?, out, decimals_left, false)?;
            out.push_str(") | [0] | [1-9] ");
            more_digits(0, decimals_left - 1, out);
        } else if min_value == 0 {
            if top_level {
                out.push_str("[0] | [1-9] ");
                more_digits(0, less_decimals, out);
            } else {
                more_digits(1, decimals_left, out);
            }
        } else if min_value <= 9 {
            let c = b'0' + min_value as u8;
            let range_start = if top_level { b'1' } else { b'0' };
            if c > range_start {
                digit_range(range_start, c - 1, out);
                out.push(' ');
                more_digits(1, less_decimals, out);
                out.push_str(" | ");
            }
            digit_range(c, b'9', out);
            out.push(' ');
            more_digits(0, less_decimals, out);
        } else {
            let min_s = min_value.to_string();
            let len = min_s.len() as i32;
            let c = min_s.as_bytes()[0];
            if c > b'1' {
                digit_range(if top_level { b'1' } else { b'0' }, c - 1, out);
                out.push(' ');
                more_digits(len, less_decimals, out);
                out.push_str(" | ");
            }
            digit_range(c, c, out);
            out.push_str(" (");
            let rest: i64 = min_s[1..].parse().map_err(|_| format!("bad bound {min_s}"))?;
            build_min_max_int(rest, i64::MAX, out, less_decimals, false)?;
            out.push(')');
            if c < b'9' {
                out.push_str(" | ");
                digit_range(c + 1, b'9', out);
                out.push(' ');
                more_digits(len - 1, less_decimals, out);
            }
        }
        return Ok(());
    }

    if has_max {
        if max_value >= 0 {
            if top_level {
                out.push_str("\"-\" [1-9] ");
                more_digits(0, less_decimals, out);
                out.push_str(" | ");
            }
            build_min_max_int(0, max_value, out, decimals_left, true)?;
        } else {
            out.push_str("\"-\" (");
            build_min_max_int(neg(max_value)?, i64::MAX, out, decimals_left, false)?;
            out.push(')');
        }
        return Ok(());
    }

    Err("At least one of min_value or max_value must be set".to_string())
}

fn digit_range(from: u8, to: u8, out: &mut String) {
    out.push('[');
    out.push(from as char);
    if from != to {
        out.push('-');
        out.push(to as char);
    }
    out.push(']');
}

fn more_digits(min_digits: i32, max_digits: i32, out: &mut String) {
    out.push_str("[0-9]");
    if min_digits == max_digits && min_digits == 1 {
        return;
    }
    out.push('{');
    out.push_str(&min_digits.to_string());
    if max_digits != min_digits {
        out.push(',');
        if max_digits != i32::MAX {
            out.push_str(&max_digits.to_string());
        }
    }
    out.push('}');
}

/// Numbers of the same length between `from` and `to` (decimal digit strings).
fn uniform_range(from: &[u8], to: &[u8], out: &mut String) {
    let mut i = 0;
    while i < from.len() && i < to.len() && from[i] == to[i] {
        i += 1;
    }
    if i > 0 {
        out.push('"');
        out.push_str(&String::from_utf8_lossy(&from[..i]));
        out.push('"');
    }
    if i >= from.len() || i >= to.len() {
        return;
    }
    if i > 0 {
        out.push(' ');
    }
    let sub_len = from.len() - i - 1;
    if sub_len == 0 {
        out.push('[');
        out.push(from[i] as char);
        out.push('-');
        out.push(to[i] as char);
        out.push(']');
        return;
    }
    let from_sub = &from[i + 1..];
    let to_sub = &to[(i + 1).min(to.len())..];
    let sub_zeros = "0".repeat(sub_len);
    let sub_nines = "9".repeat(sub_len);
    let mut to_reached = false;
    out.push('(');
    if from_sub == sub_zeros.as_bytes() {
        digit_range(from[i], to[i].wrapping_sub(1), out);
        out.push(' ');
        more_digits(sub_len as i32, sub_len as i32, out);
    } else {
        out.push('[');
        out.push(from[i] as char);
        out.push_str("] (");
        uniform_range(from_sub, sub_nines.as_bytes(), out);
        out.push(')');
        if (from[i] as i32) < to[i] as i32 - 1 {
            out.push_str(" | ");
            if to_sub == sub_nines.as_bytes() {
                digit_range(from[i] + 1, to[i], out);
                to_reached = true;
            } else {
                digit_range(from[i] + 1, to[i] - 1, out);
            }
            out.push(' ');
            more_digits(sub_len as i32, sub_len as i32, out);
        }
    }
    if !to_reached {
        out.push_str(" | ");
        digit_range(to[i], to[i], out);
        out.push(' ');
        uniform_range(sub_zeros.as_bytes(), to_sub, out);
    }
    out.push(')');
}
