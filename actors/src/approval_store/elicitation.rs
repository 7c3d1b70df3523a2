//! The content an approved MCP elicitation sends back: what the human typed
//! (`ApproveWithContent`) over the requested schema's defaults, checked against that schema.
//!
//! MCP restricts a requested schema to a flat object of primitive fields (string, number,
//! integer, boolean, and arrays of enum strings), so the checks here are that shallow on
//! purpose: unknown fields, wrong types, values outside an enum and missing required fields are
//! refused with a message the human can act on; formats and ranges are left to the server.

use serde_json::{Map, Value};
use troupe_proto::{ApprovalDecision, Json};

/// The content to accept an elicitation with, given the human's decision. An approval without
/// content sends the defaults; content is laid over them. `Err` tells the human what is wrong
/// (the request then stays pending, so they can answer again).
pub fn resolve_content(schema: &Json, decision: &ApprovalDecision) -> Result<Json, String> {
    let properties = schema
        .0
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut content: Map<String, Value> = properties
        .iter()
        .filter_map(|(name, field)| Some((name.clone(), field.get("default")?.clone())))
        .collect();
    if let ApprovalDecision::ApproveWithContent { content: given } = decision {
        let Value::Object(given) = &given.0 else {
            return Err("the content of an elicitation must be a JSON object".into());
        };
        let mut problems = Vec::new();
        for (name, value) in given {
            match properties.get(name) {
                None => problems.push(format!("`{name}` is not a field of the requested schema")),
                Some(field) => {
                    if let Err(problem) = check_field(name, field, value) {
                        problems.push(problem);
                    }
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        content.extend(given.clone());
    }
    let missing: Vec<&str> = schema
        .0
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| !content.contains_key(*name))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the elicitation requires {} with no default: approve with content",
            missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(Json(Value::Object(content)))
}

/// One field against its schema: its type, and its enum (`enum`, or `oneOf`/`anyOf` of
/// `const`s, for strings and for the items of an array).
fn check_field(name: &str, field: &Value, value: &Value) -> Result<(), String> {
    let wanted = field.get("type").and_then(Value::as_str).unwrap_or("");
    let fits = match wanted {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        // A schema without a (known) type: nothing to check.
        _ => true,
    };
    if !fits {
        return Err(format!("`{name}` must be of type {wanted}, not {value}"));
    }
    let allowed = |schema: &Value| -> Option<Vec<Value>> {
        if let Some(list) = schema.get("enum").and_then(Value::as_array) {
            return Some(list.clone());
        }
        let options = schema
            .get("oneOf")
            .or_else(|| schema.get("anyOf"))
            .and_then(Value::as_array)?;
        Some(
            options
                .iter()
                .filter_map(|o| o.get("const").cloned())
                .collect(),
        )
    };
    let outside = |v: &Value, schema: &Value| allowed(schema).is_some_and(|list| !list.contains(v));
    match value {
        Value::Array(items) => {
            let item_schema = field.get("items").cloned().unwrap_or(Value::Null);
            if let Some(bad) = items.iter().find(|item| outside(item, &item_schema)) {
                return Err(format!("`{name}` may not hold {bad}"));
            }
        }
        other if outside(other, field) => {
            return Err(format!("`{name}` may not be {other}"));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Json {
        Json(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "check": {"type": "boolean"},
                "first": {"type": "string", "default": "It was a dark and stormy night."},
                "integer": {"type": "integer", "default": 42},
                "number": {"type": "number", "default": 2.5},
                "friend": {"type": "string", "enum": ["Monica", "Ross"], "default": "Monica"},
                "hero": {"type": "string", "oneOf": [{"const": "hero-1"}, {"const": "hero-2"}]},
                "fish": {"type": "array", "items": {"anyOf": [{"const": "fish-1"}, {"const": "fish-2"}]}}
            },
            "required": ["name"]
        }))
    }

    fn with(content: serde_json::Value) -> ApprovalDecision {
        ApprovalDecision::ApproveWithContent {
            content: Json(content),
        }
    }

    #[test]
    fn content_is_laid_over_the_defaults() {
        let out = resolve_content(&schema(), &with(json!({"name": "Ada", "integer": 7}))).unwrap();
        assert_eq!(
            out.0,
            json!({
                "name": "Ada",
                "integer": 7,
                "first": "It was a dark and stormy night.",
                "number": 2.5,
                "friend": "Monica"
            })
        );
    }

    #[test]
    fn a_plain_approval_sends_the_defaults_unless_a_required_field_has_none() {
        let err = resolve_content(&schema(), &ApprovalDecision::ApproveOnce).unwrap_err();
        assert!(
            err.contains("`name`") && err.contains("approve with content"),
            "{err}"
        );
        let no_required = Json(json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "default": 1}, "s": {"type": "string"}}
        }));
        let out = resolve_content(&no_required, &ApprovalDecision::ApproveOnce).unwrap();
        assert_eq!(out.0, json!({"n": 1}));
    }

    #[test]
    fn wrong_content_is_refused_naming_every_problem() {
        let err = resolve_content(
            &schema(),
            &with(json!({
                "name": 5,
                "check": "yes",
                "integer": 1.5,
                "friend": "Joey",
                "hero": "hero-9",
                "fish": ["fish-1", "shark"],
                "extra": true
            })),
        )
        .unwrap_err();
        for needle in [
            "`name` must be of type string",
            "`check` must be of type boolean",
            "`integer` must be of type integer",
            "`friend` may not be \"Joey\"",
            "`hero` may not be \"hero-9\"",
            "`fish` may not hold \"shark\"",
            "`extra` is not a field",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
        let err = resolve_content(&schema(), &with(json!(["Ada"]))).unwrap_err();
        assert!(err.contains("JSON object"), "{err}");
    }
}
