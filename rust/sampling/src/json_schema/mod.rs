//! JSON Schema to GBNF, following llama.cpp's converter (common/json-schema-to-grammar.cpp)
//! rule for rule, so that the grammar text (rule names included) is the same.
//!
//! Handled: type (also lists of types), object properties (required ones first in their
//! order, then the optional ones in theirs), additionalProperties, arrays (items,
//! prefixItems tuples, minItems, maxItems), enum, const, string minLength/maxLength,
//! formats date, time, date-time and uuid, anchored `pattern`s, integer
//! minimum/maximum/exclusiveMinimum/exclusiveMaximum, `$ref` into the same document
//! (`#/$defs/...`, `#/definitions/...`, nested `$defs` hoisted), anyOf, oneOf, allOf.
//! Not handled (as in llama.cpp): remote `$ref`s, number ranges, uniqueItems.

mod dump;
mod int_range;
mod pattern;
mod rules;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value};

use crate::error::SamplingError;
use dump::dump;
use rules::{is_reserved_name, primitive, string_format, BuiltinRule, SPACE_RULE};

/// Converts a JSON schema to GBNF text whose start rule is `root`.
pub fn to_gbnf(schema: &Value) -> Result<String, SamplingError> {
    let mut converter = Converter::new(false);
    let mut copy = schema.clone();
    converter.resolve_refs(&mut copy, "");
    converter.visit(&copy, "");
    converter.check_errors()?;
    Ok(converter.format_grammar())
}

/// Parses a JSON schema (keeping its key order) and converts it to GBNF.
pub fn to_gbnf_str(schema: &str) -> Result<String, SamplingError> {
    let value: Value = serde_json::from_str(schema).map_err(|e| SamplingError::JsonSchema(format!("invalid JSON: {e}")))?;
    to_gbnf(&value)
}

/// The converter's state (llama.cpp's common_schema_converter).
pub(crate) struct Converter {
    dotall: bool,
    rules: BTreeMap<String, String>,
    refs: HashMap<String, Value>,
    refs_being_resolved: HashSet<String>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

/// `std::numeric_limits<int>::max()`, the "no maximum" of repetitions.
const NO_MAX: i32 = i32::MAX;

/// `item{min,max}` in the converter's notation, with an optional separator between items.
pub(crate) fn build_repetition(item_rule: &str, min_items: i32, max_items: i32, separator_rule: &str) -> String {
    let has_max = max_items != NO_MAX;
    if max_items == 0 {
        return String::new();
    }
    if min_items == 0 && max_items == 1 {
        return format!("{item_rule}?");
    }
    if separator_rule.is_empty() {
        if min_items == 1 && !has_max {
            return format!("{item_rule}+");
        }
        if min_items == 0 && !has_max {
            return format!("{item_rule}*");
        }
        let max = if has_max { max_items.to_string() } else { String::new() };
        return format!("{item_rule}{{{min_items},{max}}}");
    }
    let rest = build_repetition(
        &format!("({separator_rule} {item_rule})"),
        if min_items == 0 { 0 } else { min_items - 1 },
        if has_max { max_items - 1 } else { max_items },
        "",
    );
    let result = format!("{item_rule} {rest}");
    if min_items == 0 {
        format!("({result})?")
    } else {
        result
    }
}

/// Replaces each run of characters outside [a-zA-Z0-9-] by one "-".
fn sanitize_rule_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// A literal in double quotes with \r \n " \ escaped.
fn format_literal(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len() + 2);
    out.push('"');
    for c in literal.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn constant_rule(value: &Value) -> String {
    format_literal(&dump(value))
}

/// nlohmann's `empty()`: null, and empty objects and arrays.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn is_type(t: Option<&Value>, name: &str) -> bool {
    matches!(t, Some(Value::String(s)) if s == name)
}

fn is_untyped(t: Option<&Value>) -> bool {
    matches!(t, None | Some(Value::Null))
}

/// `get<int>()` of a JSON number (floats truncate, as nlohmann converts them).
fn as_int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_u64().map(|u| u.min(i64::MAX as u64) as i64)).or_else(|| v.as_f64().map(|f| f as i64))
}

/// The leading decimal digits of a string as an index (`std::stoull`), if any.
fn leading_index(s: &str) -> Option<usize> {
    let digits: String = s.trim_start().chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

impl Converter {
    fn new(dotall: bool) -> Self {
        let mut rules = BTreeMap::new();
        rules.insert("space".to_string(), SPACE_RULE.to_string());
        Converter { dotall, rules, refs: HashMap::new(), refs_being_resolved: HashSet::new(), errors: Vec::new(), warnings: Vec::new() }
    }

    /// Adds a rule under a sanitized name; the same body under the same name is shared,
    /// a different body gets a numbered name.
    pub(crate) fn add_rule(&mut self, name: &str, rule: &str) -> String {
        let esc_name = sanitize_rule_name(name);
        match self.rules.get(&esc_name) {
            None => {
                self.rules.insert(esc_name.clone(), rule.to_string());
                return esc_name;
            }
            Some(existing) if existing == rule => return esc_name,
            Some(_) => {}
        }
        let mut i = 0;
        loop {
            let key = format!("{esc_name}{i}");
            match self.rules.get(&key) {
                Some(existing) if existing != rule => i += 1,
                _ => {
                    self.rules.insert(key.clone(), rule.to_string());
                    return key;
                }
            }
        }
    }

    fn add_primitive(&mut self, name: &str, rule: &BuiltinRule) -> String {
        let n = self.add_rule(name, rule.content);
        for &dep in rule.deps {
            let Some(dep_rule) = primitive(dep).or_else(|| string_format(dep)) else {
                self.errors.push(format!("Rule {dep} not known"));
                continue;
            };
            if !self.rules.contains_key(dep) {
                self.add_primitive(dep, &dep_rule);
            }
        }
        n
    }

    fn add_builtin(&mut self, name: &str, builtin: &str) -> String {
        match primitive(builtin) {
            Some(rule) => self.add_primitive(name, &rule),
            None => String::new(),
        }
    }

    fn check_errors(&self) -> Result<(), SamplingError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(SamplingError::JsonSchema(self.errors.join("\n")))
        }
    }

    fn format_grammar(&self) -> String {
        let mut out = String::new();
        for (name, rule) in &self.rules {
            out.push_str(name);
            out.push_str(" ::= ");
            out.push_str(rule);
            out.push('\n');
        }
        out
    }

    /// Records every `$ref` of the schema with the subschema it points to (refs into the
    /// same document only), after moving nested `$defs` to the root.
    fn resolve_refs(&mut self, schema: &mut Value, url: &str) {
        hoist_defs_to_root(schema);
        let root = schema.clone();
        self.visit_refs(schema, &root, url);
    }

    fn visit_refs(&mut self, node: &mut Value, root: &Value, url: &str) {
        match node {
            Value::Array(items) => {
                for item in items {
                    self.visit_refs(item, root, url);
                }
            }
            Value::Object(map) => {
                if let Some(r) = map.get("$ref") {
                    let Some(reference) = r.as_str().map(str::to_string) else {
                        self.errors.push(format!("$ref must be a string: {}", dump(r)));
                        return;
                    };
                    if self.refs.contains_key(&reference) {
                        return;
                    }
                    if reference.starts_with("https://") {
                        self.errors.push(format!("Unsupported ref (remote schemas are not fetched): {reference}"));
                        return;
                    }
                    if !reference.starts_with("#/") {
                        self.errors.push(format!("Unsupported ref: {reference}"));
                        return;
                    }
                    let full = format!("{url}{reference}");
                    map.insert("$ref".to_string(), Value::String(full.clone()));
                    if let Some(target) = self.follow_pointer(root, &full) {
                        self.refs.insert(full, target);
                    }
                } else {
                    for (_, v) in map.iter_mut() {
                        self.visit_refs(v, root, url);
                    }
                }
            }
            _ => {}
        }
    }

    /// The value a `#/a/b/0` reference designates in `root`.
    fn follow_pointer(&mut self, root: &Value, reference: &str) -> Option<Value> {
        let pointer = reference.split_once('#').map_or("", |(_, p)| p);
        let mut target = root;
        for sel in pointer.split('/').skip(1) {
            let next = match target {
                Value::Object(m) if m.contains_key(sel) => m.get(sel),
                Value::Array(a) => leading_index(sel).and_then(|i| a.get(i)),
                _ => None,
            };
            match next {
                Some(t) => target = t,
                None => {
                    self.errors.push(format!("Error resolving ref {reference}: {sel} not in {}", dump(target)));
                    return None;
                }
            }
        }
        Some(target.clone())
    }

    fn resolve_ref(&mut self, reference: &str) -> String {
        let fragment = reference.split_once('#').map_or(reference, |(_, f)| f);
        let mut ref_name = format!("ref{}", sanitize_rule_name(fragment));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(reference) {
            self.refs_being_resolved.insert(reference.to_string());
            let resolved = self.refs.entry(reference.to_string()).or_insert(Value::Null).clone();
            ref_name = self.visit(&resolved, &ref_name);
            self.refs_being_resolved.remove(reference);
        }
        ref_name
    }

    fn generate_union_rule(&mut self, name: &str, alt_schemas: &[Value]) -> String {
        let sep = if name.is_empty() { "alternative-" } else { "-" };
        let rules: Vec<String> = alt_schemas.iter().enumerate().map(|(i, s)| self.visit(s, &format!("{name}{sep}{i}"))).collect();
        rules.join(" | ")
    }

    /// The rule for a schema, named after `name` ("" is the root); returns the rule's name
    /// (or, for some schemas, an expression).
    pub(crate) fn visit(&mut self, schema: &Value, name: &str) -> String {
        let obj = schema.as_object();
        let get = |key: &str| obj.and_then(|m| m.get(key));
        let has = |key: &str| obj.is_some_and(|m| m.contains_key(key));
        let schema_type = get("type");
        let schema_format = match get("format") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                self.errors.push(format!("format must be a string: {}", dump(other)));
                return String::new();
            }
        };
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };

        if let Some(r) = get("$ref") {
            let Some(reference) = r.as_str() else {
                self.errors.push(format!("$ref must be a string: {}", dump(r)));
                return String::new();
            };
            let target = self.resolve_ref(reference);
            return self.add_rule(&rule_name, &target);
        }
        if let Some(alts) = get("oneOf").or_else(|| get("anyOf")) {
            let key = if has("oneOf") { "oneOf" } else { "anyOf" };
            let Some(alts) = alts.as_array() else {
                self.errors.push(format!("{key} must be an array"));
                return String::new();
            };
            let union = self.generate_union_rule(name, alts);
            return self.add_rule(&rule_name, &union);
        }
        if let (Some(Value::Array(types)), Some(m)) = (schema_type, obj) {
            let alts: Vec<Value> = types
                .iter()
                .map(|t| {
                    let mut copy = m.clone();
                    copy.insert("type".to_string(), t.clone());
                    Value::Object(copy)
                })
                .collect();
            let union = self.generate_union_rule(name, &alts);
            return self.add_rule(&rule_name, &union);
        }
        if let Some(c) = get("const") {
            return self.add_rule(&rule_name, &format!("{} space", constant_rule(c)));
        }
        if let Some(e) = get("enum") {
            let values: Vec<String> = match e.as_array() {
                Some(items) => items.iter().map(constant_rule).collect(),
                None => vec![constant_rule(e)],
            };
            return self.add_rule(&rule_name, &format!("({}) space", values.join(" | ")));
        }
        let additional = get("additionalProperties");
        if (is_untyped(schema_type) || is_type(schema_type, "object"))
            && (has("properties") || additional.is_some_and(|a| a != &Value::Bool(true)))
        {
            return self.visit_object(obj, name, &rule_name);
        }
        if (is_untyped(schema_type) || is_type(schema_type, "object") || is_type(schema_type, "string")) && has("allOf") {
            return self.visit_all_of(get("allOf"), name, &rule_name);
        }
        if (is_untyped(schema_type) || is_type(schema_type, "array")) && (has("items") || has("prefixItems")) {
            return self.visit_array(obj, name, &rule_name);
        }
        if (is_untyped(schema_type) || is_type(schema_type, "string")) && has("pattern") {
            return match get("pattern") {
                Some(Value::String(p)) => {
                    let p = p.clone();
                    self.visit_pattern(&p, &rule_name)
                }
                _ => {
                    self.errors.push("pattern must be a string".to_string());
                    String::new()
                }
            };
        }
        if (is_untyped(schema_type) || is_type(schema_type, "string")) && is_uuid_format(&schema_format) {
            let prim_name = if rule_name == "root" { "root".to_string() } else { schema_format.clone() };
            return self.add_builtin(&prim_name, "uuid");
        }
        let format_rule = format!("{schema_format}-string");
        if (is_untyped(schema_type) || is_type(schema_type, "string")) && string_format(&format_rule).is_some() {
            let rule = string_format(&format_rule).expect("checked above");
            let prim = self.add_primitive(&format_rule, &rule);
            return self.add_rule(&rule_name, &prim);
        }
        if is_type(schema_type, "string") && (has("minLength") || has("maxLength")) {
            let char_rule = self.add_builtin("char", "char");
            let min_len = get("minLength").and_then(as_int).unwrap_or(0).clamp(0, i32::MAX as i64) as i32;
            let max_len = get("maxLength").and_then(as_int).unwrap_or(NO_MAX as i64).clamp(0, i32::MAX as i64) as i32;
            let rule = format!("\"\\\"\" {} \"\\\"\" space", build_repetition(&char_rule, min_len, max_len, ""));
            return self.add_rule(&rule_name, &rule);
        }
        if is_type(schema_type, "integer")
            && (has("minimum") || has("exclusiveMinimum") || has("maximum") || has("exclusiveMaximum"))
        {
            return self.visit_integer_range(obj, &rule_name);
        }
        if is_empty(schema) || is_type(schema_type, "object") {
            let object = self.add_builtin("object", "object");
            return self.add_rule(&rule_name, &object);
        }
        if is_untyped(schema_type) && obj.is_some() {
            // only annotations (e.g. a description): any value
            let value = self.add_builtin("value", "value");
            return self.add_rule(&rule_name, &value);
        }
        let type_name = match schema_type {
            Some(Value::String(t)) if primitive(t).is_some() => t.clone(),
            _ => {
                self.errors.push(format!("Unrecognized schema: {}", dump(schema)));
                return String::new();
            }
        };
        let prim_name = if rule_name == "root" { "root".to_string() } else { type_name.clone() };
        self.add_builtin(&prim_name, &type_name)
    }

    fn visit_object(&mut self, obj: Option<&Map<String, Value>>, name: &str, rule_name: &str) -> String {
        let Some(m) = obj else { return String::new() };
        let required: HashSet<String> = m
            .get("required")
            .and_then(Value::as_array)
            .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let properties: Vec<(String, Value)> = match m.get("properties") {
            Some(Value::Object(props)) => props.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            _ => Vec::new(),
        };
        let additional = m.get("additionalProperties").cloned().unwrap_or(Value::Null);
        let rule = self.build_object_rule(&properties, &required, name, &additional);
        self.add_rule(rule_name, &rule)
    }

    fn visit_all_of(&mut self, all_of: Option<&Value>, name: &str, rule_name: &str) -> String {
        let Some(components) = all_of.and_then(Value::as_array) else {
            self.errors.push("allOf must be an array".to_string());
            return String::new();
        };
        let mut required = HashSet::new();
        let mut properties = Vec::new();
        let mut enum_values: BTreeMap<String, usize> = BTreeMap::new();
        for t in components {
            match t.get("anyOf").and_then(Value::as_array) {
                Some(alts) => {
                    for tt in alts {
                        self.add_component(tt, false, &mut required, &mut properties, &mut enum_values);
                    }
                }
                None => self.add_component(t, true, &mut required, &mut properties, &mut enum_values),
            }
        }
        if !enum_values.is_empty() {
            let intersection: Vec<&str> =
                enum_values.iter().filter(|(_, &n)| n == components.len()).map(|(rule, _)| rule.as_str()).collect();
            if !intersection.is_empty() {
                let rule = format!("({}) space", intersection.join(" | "));
                return self.add_rule(rule_name, &rule);
            }
        }
        let rule = self.build_object_rule(&properties, &required, name, &Value::Null);
        self.add_rule(rule_name, &rule)
    }

    fn add_component(
        &mut self,
        comp: &Value,
        is_required: bool,
        required: &mut HashSet<String>,
        properties: &mut Vec<(String, Value)>,
        enum_values: &mut BTreeMap<String, usize>,
    ) {
        if let Some(r) = comp.get("$ref") {
            let key = r.as_str().unwrap_or_default().to_string();
            let target = self.refs.entry(key).or_insert(Value::Null).clone();
            self.add_component(&target, is_required, required, properties, enum_values);
        } else if let Some(props) = comp.get("properties") {
            if let Some(props) = props.as_object() {
                for (k, v) in props {
                    properties.push((k.clone(), v.clone()));
                    if is_required {
                        required.insert(k.clone());
                    }
                }
            }
        } else if let Some(values) = comp.get("enum").and_then(Value::as_array) {
            for v in values {
                *enum_values.entry(constant_rule(v)).or_insert(0) += 1;
            }
        }
    }

    fn visit_array(&mut self, obj: Option<&Map<String, Value>>, name: &str, rule_name: &str) -> String {
        let Some(m) = obj else { return String::new() };
        let sep = if name.is_empty() { "" } else { "-" };
        let items = m.get("items").or_else(|| m.get("prefixItems")).cloned().unwrap_or(Value::Null);
        if let Value::Array(tuple) = &items {
            let mut rule = "\"[\" space ".to_string();
            for (i, item) in tuple.iter().enumerate() {
                if i > 0 {
                    rule.push_str(" \",\" space ");
                }
                let item_rule = self.visit(item, &format!("{name}{sep}tuple-{i}"));
                rule.push_str(&item_rule);
            }
            rule.push_str(" \"]\" space");
            return self.add_rule(rule_name, &rule);
        }
        let item_rule_name = self.visit(&items, &format!("{name}{sep}item"));
        let min_items = m.get("minItems").and_then(as_int).unwrap_or(0).clamp(0, i32::MAX as i64) as i32;
        let max_items = match m.get("maxItems") {
            Some(v) if v.is_i64() || v.is_u64() => as_int(v).unwrap_or(0).clamp(0, i32::MAX as i64) as i32,
            _ => NO_MAX,
        };
        let rule = format!("\"[\" space {} \"]\" space", build_repetition(&item_rule_name, min_items, max_items, "\",\" space"));
        self.add_rule(rule_name, &rule)
    }

    fn visit_integer_range(&mut self, obj: Option<&Map<String, Value>>, rule_name: &str) -> String {
        let Some(m) = obj else { return String::new() };
        let bound = |key: &str| m.get(key).and_then(as_int);
        let mut min_value = i64::MIN;
        let mut max_value = i64::MAX;
        if let Some(v) = bound("minimum") {
            min_value = v;
        } else if let Some(v) = bound("exclusiveMinimum") {
            min_value = v.saturating_add(1);
        }
        if let Some(v) = bound("maximum") {
            max_value = v;
        } else if let Some(v) = bound("exclusiveMaximum") {
            max_value = v.saturating_sub(1);
        }
        let mut out = "(".to_string();
        if let Err(e) = int_range::build_min_max_int(min_value, max_value, &mut out, 16, true) {
            self.errors.push(e);
            return String::new();
        }
        out.push_str(") space");
        self.add_rule(rule_name, &out)
    }

    fn build_object_rule(&mut self, properties: &[(String, Value)], required: &HashSet<String>, name: &str, additional: &Value) -> String {
        let sep = if name.is_empty() { "" } else { "-" };
        let mut required_props = Vec::new();
        let mut optional_props = Vec::new();
        let mut kv_rule_names: HashMap<String, String> = HashMap::new();
        let mut prop_names = Vec::new();
        for (prop_name, prop_schema) in properties {
            let prop_rule_name = self.visit(prop_schema, &format!("{name}{sep}{prop_name}"));
            let kv_body = format!("{} space \":\" space {}", format_literal(&dump(&Value::String(prop_name.clone()))), prop_rule_name);
            let kv = self.add_rule(&format!("{name}{sep}{prop_name}-kv"), &kv_body);
            kv_rule_names.insert(prop_name.clone(), kv);
            if required.contains(prop_name) {
                required_props.push(prop_name.clone());
            } else {
                optional_props.push(prop_name.clone());
            }
            prop_names.push(prop_name.clone());
        }
        if additional == &Value::Bool(true) || additional.is_object() {
            let sub_name = format!("{name}{sep}additional");
            let value_rule = if additional.is_object() {
                self.visit(additional, &format!("{sub_name}-value"))
            } else {
                self.add_builtin("value", "value")
            };
            let key_rule = if prop_names.is_empty() {
                self.add_builtin("string", "string")
            } else {
                let body = self.not_strings(&prop_names);
                self.add_rule(&format!("{sub_name}-k"), &body)
            };
            let kv = self.add_rule(&format!("{sub_name}-kv"), &format!("{key_rule} \":\" space {value_rule}"));
            kv_rule_names.insert("*".to_string(), kv);
            optional_props.push("*".to_string());
        }

        let mut rule = "\"{\" space ".to_string();
        let required_kvs: Vec<&str> = required_props.iter().map(|p| kv_rule_names[p].as_str()).collect();
        rule.push_str(&required_kvs.join(" \",\" space "));
        if !optional_props.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            let alternatives: Vec<String> = (0..optional_props.len())
                .map(|i| self.recursive_refs(&optional_props[i..], false, name, &kv_rule_names))
                .collect();
            rule.push_str(&alternatives.join(" | "));
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" \"}\" space");
        rule
    }

    /// The optional properties from the first of `ks` on, each further one optional in turn.
    fn recursive_refs(&mut self, ks: &[String], first_is_optional: bool, name: &str, kv_rule_names: &HashMap<String, String>) -> String {
        let Some(k) = ks.first() else { return String::new() };
        let kv_rule_name = &kv_rule_names[k];
        let comma_ref = format!("( \",\" space {kv_rule_name} )");
        let mut res = if first_is_optional {
            format!("{comma_ref}{}", if k == "*" { "*" } else { "?" })
        } else if k == "*" {
            format!("{kv_rule_name} {comma_ref}*")
        } else {
            kv_rule_name.clone()
        };
        if ks.len() > 1 {
            let sep = if name.is_empty() { "" } else { "-" };
            let rest = self.recursive_refs(&ks[1..], true, name, kv_rule_names);
            let rest_name = self.add_rule(&format!("{name}{sep}{k}-rest"), &rest);
            res.push(' ');
            res.push_str(&rest_name);
        }
        res
    }

    /// A JSON string that is none of `strings` (a trie of their bytes).
    fn not_strings(&mut self, strings: &[String]) -> String {
        let mut trie = TrieNode::default();
        for s in strings {
            trie.insert(s.as_bytes());
        }
        let char_rule = self.add_builtin("char", "char");
        let mut out: Vec<u8> = b"[\"] ( ".to_vec();
        trie.write_alternatives(&char_rule, &mut out);
        out.extend_from_slice(b" )");
        if !trie.is_end_of_string {
            out.push(b'?');
        }
        out.extend_from_slice(b" [\"] space");
        String::from_utf8_lossy(&out).into_owned()
    }
}

fn is_uuid_format(format: &str) -> bool {
    match format.strip_prefix("uuid") {
        Some("") => true,
        Some(rest) => rest.len() == 1 && (b'1'..=b'5').contains(&rest.as_bytes()[0]),
        None => false,
    }
}

/// Moves every nested `$defs` entry to the root's `$defs` (first definition wins), as
/// llama.cpp does for schemas whose `$ref`s point at `#/$defs/...` from inside properties.
fn hoist_defs_to_root(schema: &mut Value) {
    if !schema.is_object() {
        return;
    }
    let mut collected: Map<String, Value> = Map::new();
    collect_defs(schema, &mut collected);
    if collected.is_empty() {
        return;
    }
    let Some(root) = schema.as_object_mut() else { return };
    let defs = root.entry("$defs").or_insert_with(|| Value::Object(Map::new()));
    if let Some(defs) = defs.as_object_mut() {
        for (k, v) in collected {
            defs.entry(k).or_insert(v);
        }
    }
}

fn collect_defs(node: &mut Value, collected: &mut Map<String, Value>) {
    let Some(map) = node.as_object_mut() else { return };
    if map.get("$defs").is_some_and(Value::is_object) {
        if let Some(Value::Object(defs)) = map.shift_remove("$defs") {
            for (k, v) in defs {
                collected.entry(k).or_insert(v);
            }
        }
    }
    for (_, value) in map.iter_mut() {
        match value {
            Value::Object(_) => collect_defs(value, collected),
            Value::Array(items) => {
                for item in items.iter_mut().filter(|i| i.is_object()) {
                    collect_defs(item, collected);
                }
            }
            _ => {}
        }
    }
}

/// A trie of byte strings; children ordered as C++'s `std::map<char, …>` orders them
/// (char is signed: bytes ≥ 0x80 come first).
#[derive(Default)]
struct TrieNode {
    children: BTreeMap<i8, TrieNode>,
    is_end_of_string: bool,
}

impl TrieNode {
    fn insert(&mut self, s: &[u8]) {
        let mut node = self;
        for &b in s {
            node = node.children.entry(b as i8).or_default();
        }
        node.is_end_of_string = true;
    }

    fn write_alternatives(&self, char_rule: &str, out: &mut Vec<u8>) {
        let mut rejects = Vec::new();
        let mut first = true;
        for (&c, child) in &self.children {
            let c = c as u8;
            rejects.push(c);
            if first {
                first = false;
            } else {
                out.extend_from_slice(b" | ");
            }
            out.push(b'[');
            out.push(c);
            out.push(b']');
            if !child.children.is_empty() {
                out.extend_from_slice(b" (");
                child.write_alternatives(char_rule, out);
                out.push(b')');
            } else if child.is_end_of_string {
                out.push(b' ');
                out.extend_from_slice(char_rule.as_bytes());
                out.push(b'+');
            }
        }
        if !self.children.is_empty() {
            if !first {
                out.extend_from_slice(b" | ");
            }
            out.extend_from_slice(b"[^\"");
            out.extend_from_slice(&rejects);
            out.extend_from_slice(b"] ");
            out.extend_from_slice(char_rule.as_bytes());
            out.push(b'*');
        }
    }
}
