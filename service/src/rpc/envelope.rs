//! JSON-RPC envelopes: bytes → a single call or a batch, a JSON value → a valid call, and
//! the responses. Pure.

use crate::error::RpcError;
use serde_json::{Value, json};

/// A frame: one call or a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Single(Value),
    Batch(Vec<Value>),
}

/// Bytes → a frame; malformed JSON is a parse error (answered with `id: null`).
pub fn parse_frame(bytes: &[u8]) -> Result<Frame, RpcError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(items)) if items.is_empty() => {
            Err(RpcError::invalid_request("empty batch"))
        }
        Ok(Value::Array(items)) => Ok(Frame::Batch(items)),
        Ok(v) => Ok(Frame::Single(v)),
        Err(e) => Err(RpcError::parse(format!("invalid JSON: {e}"))),
    }
}

/// A valid call envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// `None` for a notification (no `id` member).
    pub id: Option<Value>,
    pub method: String,
    pub params: Option<Value>,
}

/// A JSON value → a call, or the invalid-request error and the id to answer it with.
pub fn parse_call(value: Value) -> Result<Call, (Value, RpcError)> {
    let Value::Object(mut obj) = value else {
        return Err((
            Value::Null,
            RpcError::invalid_request("a call is a JSON object"),
        ));
    };
    let id = obj.remove("id");
    let answer_id = match &id {
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => v.clone(),
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request("id must be a string, a number or null"),
            ));
        }
        None => Value::Null,
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            answer_id,
            RpcError::invalid_request("jsonrpc must be \"2.0\""),
        ));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => {
            return Err((
                answer_id,
                RpcError::invalid_request("method must be a string"),
            ));
        }
    };
    let params = obj.remove("params");
    if let Some(p) = &params
        && !(p.is_object() || p.is_array())
    {
        return Err((
            answer_id,
            RpcError::invalid_request("params must be an object or an array"),
        ));
    }
    Ok(Call { id, method, params })
}

/// A success response.
pub fn response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response.
pub fn error_response(id: Value, error: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{INVALID_REQUEST, PARSE_ERROR};

    #[test]
    fn envelopes() {
        assert_eq!(parse_frame(b"{").unwrap_err().code, PARSE_ERROR);
        assert_eq!(parse_frame(b"[]").unwrap_err().code, INVALID_REQUEST);
        let (id, e) = parse_call(json!(1)).unwrap_err();
        assert_eq!((id, e.code), (Value::Null, INVALID_REQUEST));
        let (id, e) = parse_call(json!({"jsonrpc": "1.0", "id": 7, "method": "x"})).unwrap_err();
        assert_eq!((id, e.code), (json!(7), INVALID_REQUEST));
        let (_, e) = parse_call(json!({"jsonrpc": "2.0", "id": {}, "method": "x"})).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) =
            parse_call(json!({"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3})).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let c = parse_call(json!({"jsonrpc": "2.0", "method": "x"})).unwrap();
        assert_eq!(c.id, None, "a notification");
        let c = parse_call(json!({"jsonrpc": "2.0", "method": "x", "id": null})).unwrap();
        assert_eq!(c.id, Some(Value::Null), "id null is still a request");
    }
}
