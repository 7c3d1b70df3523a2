//! JSON-RPC envelopes: bytes → a single call or a batch, a JSON value → a valid call, and
//! the responses, as text. Pure.
//!
//! A call's `id` is kept as the exact text the client sent ([`RawValue`]) and written back
//! as is: an id such as `123456789012345678901234567890` comes back with every digit, not
//! as the nearest float.

use crate::error::RpcError;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// Calls a batch may hold.
pub const MAX_BATCH_CALLS: usize = 100;

/// A frame: one call or a batch, each member still unparsed.
#[derive(Debug)]
pub enum Frame<'a> {
    Single(&'a RawValue),
    Batch(Vec<&'a RawValue>),
}

/// Bytes → a frame; malformed JSON is a parse error (answered with `id: null`); an empty
/// batch, or one of more than [`MAX_BATCH_CALLS`] calls, an invalid request.
pub fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>, RpcError> {
    let parse = |e: serde_json::Error| RpcError::parse(format!("invalid JSON: {e}"));
    let raw: &RawValue = serde_json::from_slice(bytes).map_err(parse)?;
    if !raw.get().starts_with('[') {
        return Ok(Frame::Single(raw));
    }
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(parse)?;
    match items.len() {
        0 => Err(RpcError::invalid_request("empty batch")),
        n if n > MAX_BATCH_CALLS => Err(RpcError::invalid_request(format!(
            "a batch holds at most {MAX_BATCH_CALLS} calls; this one holds {n}"
        ))),
        _ => Ok(Frame::Batch(items)),
    }
}

/// The id a call is answered with: the client's own text, or `null`.
#[derive(Debug, Clone)]
pub struct Id(Option<Box<RawValue>>);

impl Id {
    pub const NULL: Self = Self(None);

    /// The id as JSON text.
    pub fn as_str(&self) -> &str {
        self.0.as_deref().map_or("null", RawValue::get)
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

/// `id` as sent: absent (`None`, a notification) or any JSON value, `null` included.
#[derive(Debug, Default)]
struct RawId(Option<Box<RawValue>>);

impl<'de> Deserialize<'de> for RawId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(|raw| Self(Some(raw)))
    }
}

/// The members of a call object troupe reads; others are ignored.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: RawId,
    #[serde(default)]
    jsonrpc: Option<Value>,
    #[serde(default)]
    method: Option<Value>,
    #[serde(default)]
    params: Option<Value>,
}

/// A valid call envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// `None` for a notification (no `id` member).
    pub id: Option<Id>,
    pub method: String,
    pub params: Option<Value>,
}

/// A JSON value → a call, or the invalid-request error and the id to answer it with.
pub fn parse_call(raw: &RawValue) -> Result<Call, (Id, RpcError)> {
    let invalid = |id: Id, message: &str| (id, RpcError::invalid_request(message));
    if !raw.get().starts_with('{') {
        return Err(invalid(Id::NULL, "a call is a JSON object"));
    }
    let envelope: Envelope = serde_json::from_str(raw.get())
        .map_err(|e| (Id::NULL, RpcError::invalid_request(format!("{e}"))))?;
    let id = match envelope.id.0 {
        None => None,
        Some(raw) if is_valid_id(raw.get()) => Some(Id(Some(raw))),
        Some(_) => {
            return Err(invalid(Id::NULL, "id must be a string, a number or null"));
        }
    };
    let answer_id = id.clone().unwrap_or(Id::NULL);
    if envelope.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(answer_id, "jsonrpc must be \"2.0\""));
    }
    let Some(Value::String(method)) = envelope.method else {
        return Err(invalid(answer_id, "method must be a string"));
    };
    if let Some(p) = &envelope.params
        && !(p.is_object() || p.is_array())
    {
        return Err(invalid(answer_id, "params must be an object or an array"));
    }
    Ok(Call {
        id,
        method,
        params: envelope.params,
    })
}

/// A string, a number or `null` (JSON text as a parser left it: no surrounding space).
fn is_valid_id(text: &str) -> bool {
    matches!(text.as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9')) || text == "null"
}

/// A success response, as text.
pub fn response(id: &Id, result: &RawValue) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
        id.as_str(),
        result.get()
    )
}

/// An error response, as text.
pub fn error_response(id: &Id, error: &RpcError) -> String {
    let error = serde_json::to_string(error)
        .unwrap_or_else(|_| r#"{"code":-32603,"message":"error not serialisable"}"#.to_owned());
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"error":{error}}}"#,
        id.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{INVALID_REQUEST, PARSE_ERROR};

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    fn call(text: &str) -> Result<Call, (Id, RpcError)> {
        parse_call(&raw(text))
    }

    #[test]
    fn envelopes() {
        assert_eq!(parse_frame(b"{").unwrap_err().code, PARSE_ERROR);
        assert_eq!(parse_frame(b"[]").unwrap_err().code, INVALID_REQUEST);
        assert_eq!(parse_frame(b" [ ] ").unwrap_err().code, INVALID_REQUEST);
        let (id, e) = call("1").unwrap_err();
        assert_eq!((id, e.code), (Id::NULL, INVALID_REQUEST));
        let (id, e) = call(r#"{"jsonrpc": "1.0", "id": 7, "method": "x"}"#).unwrap_err();
        assert_eq!((id.as_str(), e.code), ("7", INVALID_REQUEST));
        let (_, e) = call(r#"{"jsonrpc": "2.0", "id": {}, "method": "x"}"#).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) = call(r#"{"jsonrpc": "2.0", "id": true, "method": "x"}"#).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) =
            call(r#"{"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}"#).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) = call(r#"{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "x"}"#).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST, "a duplicate member");
        let c = call(r#"{"jsonrpc": "2.0", "method": "x"}"#).unwrap();
        assert_eq!(c.id, None, "a notification");
        let c = call(r#"{"jsonrpc": "2.0", "method": "x", "id": null}"#).unwrap();
        assert_eq!(
            c.id.map(|i| i.as_str().to_owned()),
            Some("null".into()),
            "id null is still a request"
        );
    }

    #[test]
    fn a_frame_is_a_single_call_or_a_bounded_batch() {
        assert!(matches!(parse_frame(b" {\"a\":1}"), Ok(Frame::Single(_))));
        assert!(matches!(parse_frame(b"[1, {}]"), Ok(Frame::Batch(b)) if b.len() == 2));
        let full = format!("[{}]", vec!["{}"; MAX_BATCH_CALLS].join(","));
        assert!(matches!(parse_frame(full.as_bytes()), Ok(Frame::Batch(_))));
        let over = format!("[{}]", vec!["{}"; MAX_BATCH_CALLS + 1].join(","));
        let e = parse_frame(over.as_bytes()).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        assert!(e.message.contains("at most 100"), "{}", e.message);
    }

    #[test]
    fn ids_are_echoed_exactly() {
        for id in [
            "123456789012345678901234567890",
            "-0.10000000000000000000001",
            r#""é\u00e9""#,
            "null",
        ] {
            let c = call(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#)).unwrap();
            let answer = response(&c.id.unwrap(), &raw("{}"));
            assert_eq!(
                answer,
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
            );
            let parsed: Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(parsed["result"], serde_json::json!({}));
        }
        let e = error_response(&Id::NULL, &RpcError::invalid_request("no"));
        let parsed: Value = serde_json::from_str(&e).unwrap();
        assert_eq!(parsed["id"], Value::Null);
        assert_eq!(parsed["error"]["code"], INVALID_REQUEST);
    }
}
