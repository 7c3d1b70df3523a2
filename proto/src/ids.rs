//! Strong ids (S2): UUID v7 newtypes, serialised as their canonical string in every format so
//! that a rollout line, a JSON-RPC reply and a bincode frame name an id the same way.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

macro_rules! strong_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id (UUID v7).
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
            /// Wraps an existing UUID (e.g. read back from a store).
            pub const fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }
            /// The UUID inside.
            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut buf = Uuid::encode_buffer();
                s.serialize_str(self.0.hyphenated().encode_lower(&mut buf))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Uuid::parse_str(&s).map(Self).map_err(serde::de::Error::custom)
            }
        }
    };
}

strong_id!(
    /// A Session: the unit that owns a scheduler, an approval store, a rollout and an MCP pool.
    SessionId
);
strong_id!(
    /// One isolated Conversation inside a session.
    ConversationId
);
strong_id!(
    /// One Task: the work that answers one user message.
    TaskId
);

strong_id!(
    /// One pending approval request.
    ApprovalId
);

strong_id!(
    /// One dispatch to an agent, and the id of the lease it holds while it runs (A4).
    DispatchId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_strings_on_the_wire() {
        let id = TaskId::new();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        let back: TaskId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn ids_are_time_ordered() {
        let a = ConversationId::new();
        let b = ConversationId::new();
        assert!(a < b);
        assert_eq!(a.as_uuid().get_version_num(), 7);
    }

    #[test]
    fn bad_id_is_an_error() {
        assert!(serde_json::from_str::<SessionId>("\"nope\"").is_err());
        assert!("nope".parse::<SessionId>().is_err());
    }
}
