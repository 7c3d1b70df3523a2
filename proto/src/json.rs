//! `Json`: an arbitrary JSON value that also survives non-self-describing formats.
//!
//! bincode cannot carry `serde_json::Value` (it needs `deserialize_any`), yet tool schemas and
//! arguments are free-form JSON. In human-readable formats this is the value itself; in binary
//! formats it is its compact text.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A JSON value carried as a value in JSON and as text in binary formats.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Json(pub serde_json::Value);

impl Json {
    /// `{}`
    pub fn empty_object() -> Self {
        Self(serde_json::Value::Object(serde_json::Map::new()))
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<serde_json::Value> for Json {
    fn from(v: serde_json::Value) -> Self {
        Self(v)
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            self.0.serialize(s)
        } else {
            s.serialize_str(&self.0.to_string())
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            serde_json::Value::deserialize(d).map(Self)
        } else {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text)
                .map(Self)
                .map_err(serde::de::Error::custom)
        }
    }
}
