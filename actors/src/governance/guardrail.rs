//! The output guardrail (A8): what an agent's answer must be before anyone sees it. Pure.
//!
//! An answer goes through, in order: **extract** its JSON (the whole text, a fenced block,
//! or the first JSON value in it), **repair** it where the schema says how (missing
//! properties that have a `default`; a string that holds the number or boolean the schema
//! asks for, a number or boolean where it asks for a string), **validate** it against the
//! schema (the `jsonschema` crate), and **mask** it to the properties the schema declares.
//! A failure gives the problems twice over: for the model, with everything the validator
//! says, so that it can correct itself; and for everyone else (events, errors), as paths and
//! keywords only, never a value of the answer.

use serde_json::{Map, Value};
use troupe_proto::agent::{GuardrailAction, OutputSpec};

/// A compiled output schema.
pub struct OutputGuard {
    schema: Value,
    validator: jsonschema::Validator,
    pub max_retries: u32,
    pub on_failure: GuardrailAction,
}

impl std::fmt::Debug for OutputGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputGuard")
            .field("max_retries", &self.max_retries)
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

/// One way an answer fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// JSON pointer of the instance (`/age`; empty: the whole answer).
    pub path: String,
    /// The schema keyword that failed (`type`, `required`), or `json` when no JSON was found.
    pub keyword: String,
    /// The validator's sentence, which may quote the answer: for the model only.
    pub detail: String,
}

impl Problem {
    /// What may be told outside the model: `/age: type`.
    pub fn public(&self) -> String {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        format!("{path}: {}", self.keyword)
    }
}

/// The verdict on one answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Checked {
    /// Valid (after repair), masked to the declared properties.
    Valid(Value),
    Invalid(Vec<Problem>),
}

impl OutputGuard {
    /// Compiles `spec`'s schema; the error says why it is not one.
    pub fn compile(spec: &OutputSpec) -> Result<Self, String> {
        let validator = jsonschema::validator_for(&spec.schema).map_err(|e| e.to_string())?;
        Ok(Self {
            schema: spec.schema.clone(),
            validator,
            max_retries: spec
                .max_retries
                .min(troupe_proto::agent::MAX_GUARDRAIL_RETRIES),
            on_failure: spec.on_failure,
        })
    }

    /// Extracts, repairs, validates and masks `text`.
    pub fn check(&self, text: &str) -> Checked {
        let Some(mut value) = extract_json(text) else {
            return Checked::Invalid(vec![Problem {
                path: String::new(),
                keyword: "json".into(),
                detail: "the answer holds no JSON value".into(),
            }]);
        };
        repair(&self.schema, &self.schema, &mut value);
        let problems: Vec<Problem> = self
            .validator
            .iter_errors(&value)
            .map(|e| Problem {
                path: e.instance_path().to_string(),
                keyword: e.kind().keyword().to_owned(),
                detail: e.to_string(),
            })
            .collect();
        if problems.is_empty() {
            mask(&self.schema, &self.schema, &mut value);
            Checked::Valid(value)
        } else {
            Checked::Invalid(problems)
        }
    }
}

/// What the model is told after an invalid answer.
pub fn retry_request(problems: &[Problem], schema_hint: &Value) -> String {
    let mut text = String::from(
        "Your answer does not match the required JSON Schema. Answer again with only a JSON \
         value that matches it. Problems:\n",
    );
    for p in problems {
        let path = if p.path.is_empty() { "/" } else { &p.path };
        text.push_str(&format!("- at {path}: {}\n", p.detail));
    }
    text.push_str("The schema:\n");
    text.push_str(&schema_hint.to_string());
    text
}

impl OutputGuard {
    /// The schema, for the model's retry request.
    pub fn schema(&self) -> &Value {
        &self.schema
    }
}

/// The JSON of an answer: the whole text, else the first fenced block that parses, else the
/// first JSON object or array in it.
pub fn extract_json(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return Some(v);
    }
    let mut rest = trimmed;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let body_start = after.find('\n').map_or(0, |n| n + 1);
        let Some(end) = after[body_start..].find("```") else {
            break;
        };
        if let Ok(v) = serde_json::from_str::<Value>(after[body_start..body_start + end].trim()) {
            return Some(v);
        }
        rest = &after[body_start + end + 3..];
    }
    // The first `{` or `[` where a JSON value starts (a bounded number of tries).
    trimmed
        .char_indices()
        .filter(|(_, c)| matches!(c, '{' | '['))
        .take(32)
        .find_map(|(i, _)| {
            serde_json::Deserializer::from_str(&trimmed[i..])
                .into_iter::<Value>()
                .next()
                .and_then(Result::ok)
        })
}

/// How deep `$ref`s and combinators are followed (a cycle of references stops there).
const MAX_DEPTH: usize = 32;

/// Where a schema's local `$ref` points (`#`, or a JSON pointer `#/...` into the root
/// document; a reference to another document is not fetched: `None`).
fn target<'a>(root: &'a Value, schema: &Value) -> Option<&'a Value> {
    match schema.get("$ref").and_then(Value::as_str)? {
        "#" => Some(root),
        r => r
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer)),
    }
}

/// The facets of `schema` that all apply to a value: itself, what its local `$ref` points
/// to, and its `allOf` members (each followed the same way). With `branches`, the members of
/// `anyOf` and `oneOf` too: any of them may be the one the value matches.
fn facets<'a>(root: &'a Value, schema: &'a Value, branches: bool, out: &mut Vec<&'a Value>) {
    fn walk<'a>(
        root: &'a Value,
        schema: &'a Value,
        branches: bool,
        depth: usize,
        out: &mut Vec<&'a Value>,
    ) {
        if depth > MAX_DEPTH || !schema.is_object() {
            return;
        }
        out.push(schema);
        if let Some(t) = target(root, schema) {
            walk(root, t, branches, depth + 1, out);
        }
        let mut keys = vec!["allOf"];
        if branches {
            keys.extend(["anyOf", "oneOf"]);
        }
        for key in keys {
            if let Some(Value::Array(members)) = schema.get(key) {
                for m in members {
                    walk(root, m, branches, depth + 1, out);
                }
            }
        }
    }
    walk(root, schema, branches, 0, out);
}

/// The `type`s a schema allows (one, or a list), empty when it does not say.
fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Defaults and coercions the schema allows, in place. `root` is the whole schema, where
/// local `$ref`s point; what every value must be (`$ref`, `allOf`) is followed, not the
/// alternatives of `anyOf`/`oneOf` (which one applies is not known before validation).
pub fn repair(root: &Value, schema: &Value, value: &mut Value) {
    repair_at(root, schema, value, 0);
}

fn repair_at(root: &Value, schema: &Value, value: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let mut all = Vec::new();
    facets(root, schema, false, &mut all);
    if let Some(allowed) = all.iter().map(|f| types(f)).find(|t| !t.is_empty())
        && !allowed.iter().any(|t| fits(t, value))
        && let Some(coerced) = allowed.iter().find_map(|t| coerce(t, value))
    {
        *value = coerced;
    }
    match value {
        Value::Object(map) => {
            for facet in &all {
                let Some(Value::Object(props)) = facet.get("properties") else {
                    continue;
                };
                for (name, prop) in props {
                    match map.get_mut(name) {
                        Some(inner) => repair_at(root, prop, inner, depth + 1),
                        None => {
                            let mut of_prop = Vec::new();
                            facets(root, prop, false, &mut of_prop);
                            if let Some(default) = of_prop.iter().find_map(|f| f.get("default")) {
                                map.insert(name.clone(), default.clone());
                            }
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            for facet in &all {
                if let Some(item_schema) = facet.get("items").filter(|s| s.is_object()) {
                    for item in items.iter_mut() {
                        repair_at(root, item_schema, item, depth + 1);
                    }
                }
            }
        }
        _ => {}
    }
}

fn fits(t: &str, v: &Value) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// `v` as type `t`, when it says the same thing: `"42"` as an integer, `true` as a string.
fn coerce(t: &str, v: &Value) -> Option<Value> {
    match (t, v) {
        ("integer", Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
        ("integer", Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
            .map(|f| Value::from(f as i64)),
        ("number", Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number)),
        ("boolean", Value::String(s)) => match s.trim() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        ("string", Value::Number(n)) => Some(Value::String(n.to_string())),
        ("string", Value::Bool(b)) => Some(Value::String(b.to_string())),
        _ => None,
    }
}

/// Keeps only what the schema declares: an object's `properties` (and the keys its
/// `patternProperties` match, and every key where `additionalProperties` is a schema or
/// `true`), an array's `items` and `prefixItems`, recursively, following local `$ref`s and
/// `allOf`/`anyOf`/`oneOf` (a key any of them declares is kept). An object schema that
/// declares none of these keeps what it has. `root` is the whole schema.
pub fn mask(root: &Value, schema: &Value, value: &mut Value) {
    mask_at(root, &[schema], value, 0);
}

fn mask_at(root: &Value, schemas: &[&Value], value: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let mut all = Vec::new();
    for s in schemas {
        facets(root, s, true, &mut all);
    }
    match value {
        Value::Object(map) => {
            let declares = all.iter().any(|f| {
                f.get("properties").is_some()
                    || f.get("patternProperties").is_some()
                    || f.get("additionalProperties").is_some()
            });
            let kept: Map<String, Value> = std::mem::take(map)
                .into_iter()
                .filter_map(|(k, mut v)| {
                    let mut subs: Vec<&Value> = Vec::new();
                    let mut open = !declares;
                    for f in &all {
                        let mut named = false;
                        if let Some(prop) = f.get("properties").and_then(|p| p.get(&k)) {
                            subs.push(prop);
                            named = true;
                        }
                        if let Some(Value::Object(patterns)) = f.get("patternProperties") {
                            for (pattern, sub) in patterns {
                                if fancy_regex::Regex::new(pattern)
                                    .ok()
                                    .and_then(|re| re.is_match(&k).ok())
                                    .unwrap_or(false)
                                {
                                    subs.push(sub);
                                    named = true;
                                }
                            }
                        }
                        match f.get("additionalProperties") {
                            Some(Value::Bool(true)) if !named => open = true,
                            Some(extra @ Value::Object(_)) if !named => subs.push(extra),
                            _ => {}
                        }
                    }
                    if subs.is_empty() && !open {
                        return None;
                    }
                    if !open {
                        mask_at(root, &subs, &mut v, depth + 1);
                    }
                    Some((k, v))
                })
                .collect();
            *map = kept;
        }
        Value::Array(items) => {
            for (n, item) in items.iter_mut().enumerate() {
                let mut subs: Vec<&Value> = Vec::new();
                for f in &all {
                    let prefix = f.get("prefixItems").and_then(Value::as_array);
                    match (prefix.and_then(|p| p.get(n)), f.get("items")) {
                        (Some(positional), _) => subs.push(positional),
                        // Drafts before 2020-12: `items` as a list is positional.
                        (None, Some(Value::Array(tuple))) => subs.extend(tuple.get(n)),
                        (None, Some(each @ Value::Object(_))) => subs.push(each),
                        _ => {}
                    }
                }
                if !subs.is_empty() {
                    mask_at(root, &subs, item, depth + 1);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn guard() -> OutputGuard {
        OutputGuard::compile(&OutputSpec {
            schema: json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer", "minimum": 0},
                    "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "string"}}}},
                    "lang": {"type": "string", "default": "en"}
                },
                "required": ["name", "age"]
            }),
            on_failure: GuardrailAction::Reject,
            max_retries: 2,
        })
        .unwrap()
    }

    #[test]
    fn json_is_found_in_prose_fences_or_alone() {
        assert_eq!(extract_json(r#" {"a": 1} "#), Some(json!({"a": 1})));
        assert_eq!(
            extract_json("Here:\n```json\n{\"a\": 2}\n```\nDone."),
            Some(json!({"a": 2}))
        );
        assert_eq!(
            extract_json("The answer is {\"a\": 3} as asked {not json}"),
            Some(json!({"a": 3}))
        );
        assert_eq!(extract_json("no json at all"), None);
        assert_eq!(extract_json("[1, 2] trailing"), Some(json!([1, 2])));
    }

    #[test]
    fn an_answer_is_repaired_validated_and_masked() {
        let g = guard();
        let checked = g.check(
            r#"Sure! {"name": "Ada", "age": "36", "ssn": "123-45-6789", "tags": [{"t": "x", "secret": 1}]}"#,
        );
        assert_eq!(
            checked,
            Checked::Valid(json!({"name": "Ada", "age": 36, "tags": [{"t": "x"}], "lang": "en"}))
        );
    }

    #[test]
    fn problems_name_paths_and_keywords_and_only_the_model_sees_values() {
        let g = guard();
        let Checked::Invalid(problems) = g.check(r#"{"name": "Ada", "age": "very secret"}"#) else {
            panic!("invalid")
        };
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].public(), "/age: type");
        assert!(problems[0].detail.contains("very secret"));
        assert!(!problems[0].public().contains("very secret"));
        let Checked::Invalid(problems) = g.check("I refuse.") else {
            panic!("invalid")
        };
        assert_eq!(problems[0].public(), "/: json");
        let Checked::Invalid(problems) = g.check(r#"{"age": -1}"#) else {
            panic!("invalid")
        };
        let mut public: Vec<String> = problems.iter().map(Problem::public).collect();
        public.sort();
        assert_eq!(public, ["/: required", "/age: minimum"]);
        assert!(retry_request(&problems, g.schema()).contains("\"required\""));
    }

    fn checked(schema: serde_json::Value, answer: &str) -> Checked {
        OutputGuard::compile(&OutputSpec {
            schema,
            on_failure: GuardrailAction::Reject,
            max_retries: 2,
        })
        .unwrap()
        .check(answer)
    }

    /// Schemas written with `$defs`/`$ref` and combinators are repaired and masked through
    /// them: what no part of the schema declares does not get out (an undeclared `ssn` under a
    /// `$ref` did).
    #[test]
    fn references_and_combinators_are_followed_when_repairing_and_masking() {
        let person = json!({
            "$defs": {"P": {"type": "object", "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "lang": {"type": "string", "default": "en"}
            }, "required": ["name"]}},
            "type": "object",
            "properties": {"person": {"$ref": "#/$defs/P"}}
        });
        assert_eq!(
            checked(
                person,
                r#"{"person": {"name": "Ada", "age": "36", "ssn": "123-45-6789"}, "extra": 1}"#
            ),
            Checked::Valid(json!({"person": {"name": "Ada", "age": 36, "lang": "en"}}))
        );
        let combined = json!({
            "allOf": [
                {"type": "object", "properties": {"id": {"type": "integer"}}},
                {"anyOf": [
                    {"properties": {"kind": {"const": "a"}, "a": {"type": "string"}}},
                    {"properties": {"kind": {"const": "b"}, "b": {"type": "string"}}}
                ]}
            ]
        });
        assert_eq!(
            checked(
                combined,
                r#"{"id": "7", "kind": "a", "a": "x", "secret": true}"#
            ),
            Checked::Valid(json!({"id": 7, "kind": "a", "a": "x"}))
        );
        let maps = json!({
            "type": "object",
            "properties": {
                "scores": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"v": {"type": "number"}}
                }},
                "labels": {"type": "object", "patternProperties": {"^l_": {"type": "string"}}},
                "pair": {"type": "array", "prefixItems": [
                    {"type": "object", "properties": {"x": {"type": "integer"}}}
                ], "items": {"type": "object", "properties": {"y": {"type": "integer"}}}},
                "free": {"type": "object"}
            }
        });
        assert_eq!(
            checked(
                maps,
                r#"{"scores": {"ann": {"v": 1, "why": "hidden"}},
                    "labels": {"l_a": "kept", "other": "dropped"},
                    "pair": [{"x": 1, "y": 2}, {"x": 3, "y": 4}],
                    "free": {"anything": 1}}"#
            ),
            Checked::Valid(json!({
                "scores": {"ann": {"v": 1}},
                "labels": {"l_a": "kept"},
                "pair": [{"x": 1}, {"y": 4}],
                "free": {"anything": 1}
            }))
        );
        // A reference cycle ends (the validator decides; masking stops at its depth).
        let tree = json!({
            "$defs": {"N": {"type": "object", "properties": {
                "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}
            }}},
            "$ref": "#/$defs/N"
        });
        assert_eq!(
            checked(
                tree,
                r#"{"v": 1, "kids": [{"v": 2, "kids": [], "x": 0}], "y": 0}"#
            ),
            Checked::Valid(json!({"v": 1, "kids": [{"v": 2, "kids": []}]}))
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused() {
        let bad = OutputSpec {
            schema: json!({"type": "no-such-type"}),
            on_failure: GuardrailAction::Reject,
            max_retries: 2,
        };
        assert!(OutputGuard::compile(&bad).is_err());
    }
}
