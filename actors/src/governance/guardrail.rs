//! The output guardrail (A8): what an agent's answer must be before anyone sees it. Pure.
//!
//! An answer goes through, in order: **extract** its JSON (the whole text, a fenced block,
//! or the first JSON value in it), **repair** it where the schema says how (missing
//! properties that have a `default`; a string that holds the number or boolean the schema
//! asks for, a number or boolean where it asks for a string), **validate** it against the
//! schema (the `jsonschema` crate), and **mask** it to the properties the schema declares.
//! A failure gives the problems twice over: for the model, with everything the validator
//! says, so that it can correct itself; and for everyone else (events, errors), as paths and
//! keywords only, never a value of the answer (nor a key of it the schema does not name).
//!
//! Masking fails closed: `$ref`s are followed the way the validator follows them (`$id`s,
//! `$anchor`s, percent-encoded pointers, through the `referencing` crate), and where the
//! masker cannot follow the schema (a reference it cannot resolve, `$dynamicRef` or
//! `$recursiveRef`, a chain of references deeper than it goes, an answer nested deeper than
//! it goes) it keeps only what the parts it did follow declare.

use referencing::{Draft, Registry, Resolver};
use serde_json::{Map, Value};
use std::collections::HashSet;
use troupe_proto::agent::{GuardrailAction, OutputSpec};

/// A compiled output schema.
pub struct OutputGuard {
    schema: Value,
    validator: jsonschema::Validator,
    /// The schema as a registry of resources (its `$id`s and anchors): where the repairer and
    /// the masker follow `$ref`s.
    refs: SchemaRefs,
    /// Every property name the schema writes (`properties`, `required`): what a public
    /// problem path may show of the answer's keys.
    names: HashSet<String>,
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
    /// JSON pointer of the instance as it may be told outside the model: the answer's keys
    /// that the schema does not name are `*` (`/scores/*`); empty: the whole answer.
    pub path: String,
    /// The schema keyword that failed (`type`, `required`), or `json` when no JSON was found.
    pub keyword: String,
    /// The instance's JSON pointer as it is (it may hold the answer's own keys): for the
    /// model only.
    pub at: String,
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
        let refs = SchemaRefs::new(&spec.schema)?;
        let mut names = HashSet::new();
        declared_names(&spec.schema, &mut names);
        Ok(Self {
            schema: spec.schema.clone(),
            validator,
            refs,
            names,
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
                at: String::new(),
                detail: "the answer holds no JSON value".into(),
            }]);
        };
        let Some(root) = self.refs.root() else {
            // `compile` resolved the root already: not reached.
            return Checked::Invalid(vec![Problem {
                path: String::new(),
                keyword: "$ref".into(),
                at: String::new(),
                detail: "the schema's root cannot be resolved".into(),
            }]);
        };
        repair_at(&root, &mut value, 0);
        let problems: Vec<Problem> = self
            .validator
            .iter_errors(&value)
            .map(|e| {
                let at = e.instance_path().to_string();
                Problem {
                    path: public_path(&at, &value, &self.names),
                    keyword: e.kind().keyword().to_owned(),
                    at,
                    detail: e.to_string(),
                }
            })
            .collect();
        if problems.is_empty() {
            mask_at(&[root], false, &mut value, 0);
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
        let at = if p.at.is_empty() { "/" } else { &p.at };
        text.push_str(&format!("- at {at}: {}\n", p.detail));
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

/// The property names `schema` writes anywhere: the keys of its `properties` objects and
/// the names in its `required` lists (the operator's words, not the answer's).
fn declared_names(schema: &Value, out: &mut HashSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                out.extend(props.keys().cloned());
            }
            if let Some(Value::Array(required)) = map.get("required") {
                out.extend(required.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            map.values().for_each(|v| declared_names(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| declared_names(v, out)),
        _ => {}
    }
}

/// `pointer` (an instance path into `value`) as it may be told: array indices and the keys
/// `names` holds as they are, any other key of the answer as `*` (it is the model's text).
fn public_path(pointer: &str, value: &Value, names: &HashSet<String>) -> String {
    let mut out = String::new();
    let mut at = Some(value);
    for segment in pointer.split('/').skip(1) {
        let key = segment.replace("~1", "/").replace("~0", "~");
        let (shown, next) = match at {
            Some(Value::Array(items)) => match key.parse::<usize>() {
                Ok(i) => (true, items.get(i)),
                Err(_) => (false, None),
            },
            Some(Value::Object(map)) => (names.contains(&key), map.get(&key)),
            _ => (names.contains(&key), None),
        };
        out.push('/');
        out.push_str(if shown { segment } else { "*" });
        at = next;
    }
    out
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

/// How long a chain of `$ref`s and combinators is followed for one value.
const MAX_DEPTH: usize = 32;

/// How deep into an answer the repairer and the masker go: serde_json's own nesting limit,
/// so that no answer it parses is deeper. Past it, the masker keeps no key.
const MAX_NESTING: usize = 128;

/// The schema's resources, as the validator sees them: the root based at its `$id` (else
/// `json-schema:///`), every embedded `$id` and anchor indexed. Nothing is fetched.
struct SchemaRefs {
    registry: Registry<'static>,
    base: referencing::Uri<String>,
}

impl SchemaRefs {
    fn new(schema: &Value) -> Result<Self, String> {
        let draft = Draft::default().detect(schema);
        let base = match draft.create_resource_ref(schema).id() {
            Some(id) => referencing::uri::from_str(id),
            None => referencing::uri::from_str("json-schema:///"),
        }
        .map_err(|e| e.to_string())?;
        let registry = Registry::new()
            .draft(draft)
            .add(base.as_str(), schema.clone())
            .and_then(referencing::RegistryBuilder::prepare)
            .map_err(|e| e.to_string())?;
        let refs = Self { registry, base };
        if refs.root().is_none() {
            return Err("the schema's root cannot be resolved".into());
        }
        Ok(refs)
    }

    /// The root schema, where its references resolve.
    fn root(&self) -> Option<At<'_>> {
        let resolver = self.registry.resolver(self.base.clone());
        At::of(resolver.lookup("#").ok()?)
    }
}

/// A schema and the resolver of the resource it is in (its base URI).
#[derive(Clone)]
struct At<'r> {
    schema: &'r Value,
    resolver: Resolver<'r>,
    draft: Draft,
}

impl<'r> At<'r> {
    fn of(resolved: referencing::Resolved<'r>) -> Option<Self> {
        let (schema, resolver, draft) = resolved.into_inner();
        Some(Self {
            schema,
            resolver,
            draft,
        })
    }

    /// A subschema written inside this one (`properties/x`, `allOf/0`), based at its own
    /// `$id` when it has one; `None` when that `$id` does not read.
    fn sub(&self, schema: &'r Value) -> Option<Self> {
        let draft = self.draft.detect(schema);
        let resolver = self
            .resolver
            .in_subresource(draft.create_resource_ref(schema))
            .ok()?;
        Some(Self {
            schema,
            resolver,
            draft,
        })
    }

    /// Where this schema's `reference` points; `None` when it cannot be resolved here.
    fn follow(&self, reference: &str) -> Option<Self> {
        Self::of(self.resolver.lookup(reference).ok()?)
    }

    fn get(&self, key: &str) -> Option<&'r Value> {
        self.schema.get(key)
    }
}

/// The facets of `schemas` that apply to a value: each schema, what its `$ref` points to,
/// and its `allOf` members (each followed the same way). With `branches`, also what may
/// apply: the members of `anyOf` and `oneOf`, `if`/`then`/`else`, `dependentSchemas` (and
/// the schemas of draft-7 `dependencies`). The flag says whether some part could not be
/// followed: a reference that does not resolve, `$dynamicRef`/`$recursiveRef`, or a chain
/// longer than [`MAX_DEPTH`].
fn facets<'r>(schemas: &[At<'r>], branches: bool) -> (Vec<At<'r>>, bool) {
    fn walk<'r>(at: At<'r>, branches: bool, depth: usize, out: &mut Vec<At<'r>>, lost: &mut bool) {
        if depth > MAX_DEPTH {
            *lost = true;
            return;
        }
        // `true` and `false` declare nothing.
        let Some(schema) = at.schema.as_object() else {
            return;
        };
        if out.iter().any(|f| std::ptr::eq(f.schema, at.schema)) {
            return;
        }
        out.push(at.clone());
        if let Some(reference) = schema.get("$ref") {
            match reference.as_str().and_then(|r| at.follow(r)) {
                Some(target) => walk(target, branches, depth + 1, out, lost),
                None => *lost = true,
            }
        }
        if schema.contains_key("$dynamicRef") || schema.contains_key("$recursiveRef") {
            *lost = true;
        }
        let mut members: Vec<&'r Value> = Vec::new();
        let mut keys = vec!["allOf"];
        if branches {
            keys.extend(["anyOf", "oneOf"]);
        }
        for key in keys {
            if let Some(Value::Array(list)) = at.get(key) {
                members.extend(list);
            }
        }
        if branches {
            for key in ["if", "then", "else"] {
                members.extend(at.get(key));
            }
            for key in ["dependentSchemas", "dependencies"] {
                if let Some(Value::Object(map)) = at.get(key) {
                    members.extend(map.values().filter(|v| v.is_object()));
                }
            }
        }
        for member in members {
            match at.sub(member) {
                Some(sub) => walk(sub, branches, depth + 1, out, lost),
                None => *lost = true,
            }
        }
    }
    let mut out = Vec::new();
    let mut lost = false;
    for at in schemas {
        walk(at.clone(), branches, 0, &mut out, &mut lost);
    }
    (out, lost)
}

/// The `type`s a schema allows (one, or a list), empty when it does not say.
fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Defaults and coercions the schema allows, in place. What every value must be (`$ref`,
/// `allOf`) is followed, not the alternatives of `anyOf`/`oneOf` (which one applies is not
/// known before validation).
pub fn repair(schema: &Value, value: &mut Value) -> Result<(), String> {
    let refs = SchemaRefs::new(schema)?;
    if let Some(root) = refs.root() {
        repair_at(&root, value, 0);
    }
    Ok(())
}

fn repair_at(at: &At<'_>, value: &mut Value, depth: usize) {
    if depth > MAX_NESTING {
        return;
    }
    let (all, _) = facets(std::slice::from_ref(at), false);
    if let Some(allowed) = all.iter().map(|f| types(f.schema)).find(|t| !t.is_empty())
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
                    let Some(prop) = facet.sub(prop) else {
                        continue;
                    };
                    match map.get_mut(name) {
                        Some(inner) => repair_at(&prop, inner, depth + 1),
                        None => {
                            let (of_prop, _) = facets(std::slice::from_ref(&prop), false);
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
                if let Some(item_schema) = facet
                    .get("items")
                    .filter(|s| s.is_object())
                    .and_then(|s| facet.sub(s))
                {
                    for item in items.iter_mut() {
                        repair_at(&item_schema, item, depth + 1);
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
/// `patternProperties` match, and every key where `additionalProperties` or
/// `unevaluatedProperties` is a schema or `true`), an array's `items`, `prefixItems` and
/// `additionalItems`, recursively, following `$ref`s, `allOf`/`anyOf`/`oneOf`,
/// `if`/`then`/`else` and `dependentSchemas` (a key any of them declares is kept). An object
/// schema that declares none of these keeps what it has, unless some part of the schema
/// could not be followed (see [`facets`]): then, there and below, only what the followed
/// parts declare is kept.
pub fn mask(schema: &Value, value: &mut Value) -> Result<(), String> {
    let refs = SchemaRefs::new(schema)?;
    let root = refs.root().ok_or("the schema's root cannot be resolved")?;
    mask_at(&[root], false, value, 0);
    Ok(())
}

/// Whether a facet says which keys an object may have.
fn declares_keys(f: &At<'_>) -> bool {
    [
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|k| f.get(k).is_some())
}

/// `closed`: a part of the schema above could not be followed, so nothing is kept for
/// declaring nothing.
fn mask_at(schemas: &[At<'_>], closed: bool, value: &mut Value, depth: usize) {
    if depth > MAX_NESTING {
        match value {
            Value::Object(map) => map.clear(),
            Value::Array(items) => items.retain(|v| !v.is_object() && !v.is_array()),
            _ => {}
        }
        return;
    }
    let (all, lost) = facets(schemas, true);
    let closed = closed || lost;
    match value {
        Value::Object(map) => {
            let open = !closed && !all.iter().any(declares_keys);
            if open {
                return;
            }
            let kept: Map<String, Value> = std::mem::take(map)
                .into_iter()
                .filter_map(|(k, mut v)| {
                    let mut subs: Vec<At<'_>> = Vec::new();
                    // A facet lets the key hold anything (`additionalProperties: true`).
                    let mut any = false;
                    // A declared schema of the key could not be read where it is.
                    let mut lost = false;
                    for f in &all {
                        let mut named = Vec::new();
                        if let Some(prop) = f.get("properties").and_then(|p| p.get(&k)) {
                            named.push(prop);
                        }
                        if let Some(Value::Object(patterns)) = f.get("patternProperties") {
                            for (pattern, sub) in patterns {
                                if fancy_regex::Regex::new(pattern)
                                    .ok()
                                    .and_then(|re| re.is_match(&k).ok())
                                    .unwrap_or(false)
                                {
                                    named.push(sub);
                                }
                            }
                        }
                        if named.is_empty() {
                            for key in ["additionalProperties", "unevaluatedProperties"] {
                                match f.get(key) {
                                    Some(Value::Bool(true)) => any = true,
                                    Some(extra @ Value::Object(_)) => named.push(extra),
                                    _ => {}
                                }
                            }
                        }
                        for sub in named {
                            match f.sub(sub) {
                                Some(at) => subs.push(at),
                                None => lost = true,
                            }
                        }
                    }
                    if subs.is_empty() && !any && !lost {
                        return None;
                    }
                    // A key that may hold anything keeps it, unless a part of the schema
                    // above was not followed.
                    if !any || closed {
                        mask_at(&subs, closed || lost, &mut v, depth + 1);
                    }
                    Some((k, v))
                })
                .collect();
            *map = kept;
        }
        Value::Array(items) => {
            for (n, item) in items.iter_mut().enumerate() {
                let mut subs: Vec<At<'_>> = Vec::new();
                let mut lost = false;
                for f in &all {
                    let prefix = f.get("prefixItems").and_then(Value::as_array);
                    let positional = match (prefix.and_then(|p| p.get(n)), f.get("items")) {
                        (Some(positional), _) => Some(positional),
                        // Drafts before 2020-12: `items` as a list is positional, and
                        // `additionalItems` is for the items after it.
                        (None, Some(Value::Array(tuple))) => tuple
                            .get(n)
                            .or_else(|| f.get("additionalItems").filter(|s| s.is_object())),
                        (None, Some(each @ Value::Object(_))) => Some(each),
                        _ => None,
                    };
                    let extra = f.get("unevaluatedItems").filter(|s| s.is_object());
                    for sub in positional.into_iter().chain(extra) {
                        match f.sub(sub) {
                            Some(at) => subs.push(at),
                            None => lost = true,
                        }
                    }
                }
                if !subs.is_empty() || closed || lost {
                    mask_at(&subs, closed || lost, item, depth + 1);
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

    /// What the masker cannot follow does not open the answer: references are resolved the
    /// way the validator resolves them (an `$anchor`, an absolute `$id`, a percent-encoded
    /// pointer), properties under `if`/`then`/`else` are declared ones, and below a
    /// `$dynamicRef` or `$recursiveRef` (not followed) only what other parts declare stays.
    #[test]
    fn masking_fails_closed_where_the_schema_is_not_followed() {
        let secret = r#""ssn": "123-45-6789""#;
        // `$ref` to an `$anchor`.
        let anchored = json!({
            "$defs": {"P": {"$anchor": "person", "type": "object",
                "properties": {"name": {"type": "string"}}}},
            "type": "object",
            "properties": {"p": {"$ref": "#person"}}
        });
        assert_eq!(
            checked(
                anchored,
                &format!(r#"{{"p": {{"name": "Ada", {secret}}}}}"#)
            ),
            Checked::Valid(json!({"p": {"name": "Ada"}}))
        );
        // A reference through an absolute `$id`, and one relative to an embedded `$id`.
        let identified = json!({
            "$id": "https://example.com/root.json",
            "$defs": {
                "P": {"$id": "https://example.com/person.json", "type": "object",
                    "properties": {"name": {"type": "string"}}},
                "Q": {"$id": "q.json", "type": "object", "properties": {"q": {"type": "integer"}}}
            },
            "type": "object",
            "properties": {
                "p": {"$ref": "https://example.com/person.json"},
                "r": {"$ref": "https://example.com/root.json#/$defs/P"},
                "q": {"$ref": "q.json"}
            }
        });
        assert_eq!(
            checked(
                identified,
                &format!(
                    r#"{{"p": {{"name": "A", {secret}}}, "r": {{"name": "B", {secret}}}, "q": {{"q": 1, {secret}}}}}"#
                )
            ),
            Checked::Valid(json!({"p": {"name": "A"}, "r": {"name": "B"}, "q": {"q": 1}}))
        );
        // A percent-encoded pointer (and an escaped one).
        let encoded = json!({
            "$defs": {"a person": {"type": "object", "properties": {"name": {"type": "string"}}},
                      "a/b": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/a%20person"}, "o": {"$ref": "#/$defs/a~1b"}}
        });
        assert_eq!(
            checked(
                encoded,
                &format!(r#"{{"p": {{"name": "Ada", {secret}}}, "o": {{"x": 1, {secret}}}}}"#)
            ),
            Checked::Valid(json!({"p": {"name": "Ada"}, "o": {"x": 1}}))
        );
        // Properties declared only under `if`/`then`/`else`.
        let conditional = json!({
            "type": "object",
            "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            "then": {"properties": {"a": {"type": "string"}}},
            "else": {"properties": {"b": {"type": "string"}}}
        });
        assert_eq!(
            checked(
                conditional,
                &format!(r#"{{"kind": "a", "a": "x", {secret}}}"#)
            ),
            Checked::Valid(json!({"kind": "a", "a": "x"}))
        );
        // `$dynamicRef` is not followed: what it would declare is not kept.
        let dynamic = json!({
            "$defs": {"node": {"$dynamicAnchor": "node", "type": "object",
                "properties": {"v": {"type": "integer"},
                               "kids": {"type": "array", "items": {"$dynamicRef": "#node"}}}}},
            "$ref": "#/$defs/node"
        });
        assert_eq!(
            checked(
                dynamic,
                &format!(r#"{{"v": 1, "kids": [{{"v": 2, {secret}}}], {secret}}}"#)
            ),
            Checked::Valid(json!({"v": 1, "kids": [{}]}))
        );
        // Draft 2019-09's `$recursiveRef` the same.
        let recursive = json!({
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "$recursiveAnchor": true,
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kid": {"$recursiveRef": "#"}}
        });
        assert_eq!(
            checked(
                recursive,
                &format!(r#"{{"v": 1, "kid": {{"v": 2, {secret}}}}}"#)
            ),
            Checked::Valid(json!({"v": 1, "kid": {}}))
        );
        // Draft 7's `items` list with `additionalItems` for the items after it.
        let tuple = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "array",
            "items": [{"type": "object", "properties": {"x": {"type": "integer"}}}],
            "additionalItems": {"type": "object", "properties": {"y": {"type": "integer"}}}
        });
        assert_eq!(
            checked(
                tuple,
                &format!(r#"[{{"x": 1, {secret}}}, {{"y": 2, {secret}}}]"#)
            ),
            Checked::Valid(json!([{"x": 1}, {"y": 2}]))
        );
    }

    /// A reference that does not resolve, and an answer nested deeper than the masker goes,
    /// keep no undeclared key; a deep recursive tree within that is masked all the way down.
    #[test]
    fn unresolved_references_and_the_depth_limit_keep_nothing_undeclared() {
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "p": {"$ref": "#/$defs/missing"}},
            "allOf": [{"$ref": "#elsewhere"}]
        });
        let mut value = json!({"name": "Ada", "p": {"ssn": 1}, "ssn": 2});
        mask(&schema, &mut value).unwrap();
        assert_eq!(value, json!({"name": "Ada", "p": {}}));
        let mut whole = json!({"ssn": 2, "n": [{"ssn": 3}, 4]});
        mask(&json!({"$ref": "#/nowhere"}), &mut whole).unwrap();
        assert_eq!(whole, json!({}));
        let mut list = json!([{"ssn": 3}, 4, [{"ssn": 5}]]);
        mask(
            &json!({"type": "array", "items": {"$ref": "#/nowhere"}}),
            &mut list,
        )
        .unwrap();
        assert_eq!(list, json!([{}, 4, [{}]]));

        let tree = json!({
            "$defs": {"N": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/N"}}}},
            "$ref": "#/$defs/N"
        });
        let deep = |levels: usize| {
            let mut v = json!({"ssn": "123-45-6789"});
            for _ in 0..levels {
                v = json!({"kid": v, "ssn": "123-45-6789"});
            }
            v
        };
        // Deeper than the old limit of 32, within serde_json's: masked all the way.
        let Checked::Valid(masked) = checked(tree.clone(), &deep(60).to_string()) else {
            panic!("valid")
        };
        assert!(!masked.to_string().contains("ssn"), "{masked}");
        // Deeper than any answer that parses: past the limit, nothing is kept.
        let mut deeper = deep(MAX_NESTING + 10);
        mask(&tree, &mut deeper).unwrap();
        assert!(!deeper.to_string().contains("ssn"));
    }

    /// The public problem paths show the schema's names and array indices, never a key the
    /// answer made up (the model's text); the model still gets the path as it is.
    #[test]
    fn public_problem_paths_hide_the_answers_own_keys() {
        let g = OutputGuard::compile(&OutputSpec {
            schema: json!({
                "type": "object",
                "properties": {
                    "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "list": {"type": "array", "items": {
                        "type": "object", "patternProperties": {"^x": {"type": "integer"}}
                    }}
                }
            }),
            on_failure: GuardrailAction::Reject,
            max_retries: 2,
        })
        .unwrap();
        let Checked::Invalid(problems) = g.check(
            r#"{"scores": {"Ada Lovelace SSN 123-45-6789": "high"},
                "list": [{"x1": 1}, {"x secret 42": "no"}]}"#,
        ) else {
            panic!("invalid")
        };
        let mut public: Vec<String> = problems.iter().map(Problem::public).collect();
        public.sort();
        assert_eq!(public, ["/list/1/*: type", "/scores/*: type"]);
        let retry = retry_request(&problems, g.schema());
        assert!(
            retry.contains("/scores/Ada Lovelace SSN 123-45-6789"),
            "{retry}"
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
