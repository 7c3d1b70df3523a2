//! Policies attached to a session or a conversation: storage (S10), approvals and sandbox (C2),
//! and the structured approval key (S9).

use crate::AgentError;
use crate::ids::ConversationId;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// What the rollout may keep of a conversation (S10).
///
/// Written as `"full"`, `"headers_only"`, `"none"` or `{"ttl": {"secs": N}}`. Read from those
/// and, in human-readable formats (JSON, TOML), from the command-line spellings too:
/// `"headers-only"` and `"ttl:<secs>"` (see [`FromStr`](std::str::FromStr)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoragePolicy {
    /// Everything: messages, tool arguments and outputs.
    #[default]
    Full,
    /// Metadata only: times, kinds, tool names, counts and sizes; no content.
    HeadersOnly,
    /// Only task start, task end and errors (by kind), no content at all.
    None,
    /// Full, then downgraded to headers-only by a sweep once older than `secs`.
    Ttl { secs: u64 },
}

impl StoragePolicy {
    /// Whether content (text, arguments, outputs) may be written now.
    pub const fn keeps_content(self) -> bool {
        matches!(self, Self::Full | Self::Ttl { .. })
    }

    /// Whether a record kept under `self` may hold something `other` forbids: more content,
    /// or content for longer (`full` > `ttl` (longer first) > `headers_only` > `none`).
    pub const fn keeps_more_than(self, other: Self) -> bool {
        const fn rank(p: StoragePolicy) -> (u8, u64) {
            match p {
                StoragePolicy::None => (0, 0),
                StoragePolicy::HeadersOnly => (1, 0),
                StoragePolicy::Ttl { secs } => (2, secs),
                StoragePolicy::Full => (3, 0),
            }
        }
        let (a, b) = (rank(self), rank(other));
        a.0 > b.0 || (a.0 == b.0 && a.1 > b.1)
    }
}

/// The written form, which every format reads.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum CanonicalStorage {
    Full,
    #[serde(alias = "headers-only")]
    HeadersOnly,
    None,
    Ttl {
        secs: u64,
    },
}

impl From<CanonicalStorage> for StoragePolicy {
    fn from(c: CanonicalStorage) -> Self {
        match c {
            CanonicalStorage::Full => Self::Full,
            CanonicalStorage::HeadersOnly => Self::HeadersOnly,
            CanonicalStorage::None => Self::None,
            CanonicalStorage::Ttl { secs } => Self::Ttl { secs },
        }
    }
}

/// `full`, `headers_only` or `headers-only`, `none`, `ttl:<secs>`, or the JSON form
/// `{"ttl": {"secs": N}}` (a flag or a variable may hold any of them).
impl std::str::FromStr for StoragePolicy {
    type Err = AgentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full" => Ok(Self::Full),
            "headers_only" | "headers-only" => Ok(Self::HeadersOnly),
            "none" => Ok(Self::None),
            json if json.trim_start().starts_with('{') => serde_json::from_str(json)
                .map_err(|e| AgentError::invalid(format!("bad storage policy `{json}`: {e}"))),
            other => match other.strip_prefix("ttl:").map(|n| n.trim().parse::<u64>()) {
                Some(Ok(secs)) => Ok(Self::Ttl { secs }),
                _ => Err(AgentError::invalid(format!(
                    "unknown storage policy `{other}` (full, headers_only, none, ttl:<seconds>, \
                     or {{\"ttl\": {{\"secs\": N}}}})"
                ))),
            },
        }
    }
}

impl<'de> Deserialize<'de> for StoragePolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(StorageVisitor)
        } else {
            CanonicalStorage::deserialize(d).map(Into::into)
        }
    }
}

struct StorageVisitor;

impl<'de> Visitor<'de> for StorageVisitor {
    type Value = StoragePolicy;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "a storage policy: \"full\", \"headers_only\", \"none\", \"ttl:<secs>\" or \
             {\"ttl\": {\"secs\": N}}",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        v.parse().map_err(|e: AgentError| E::custom(e))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        CanonicalStorage::deserialize(de::value::MapAccessDeserializer::new(map)).map(Into::into)
    }
}

/// When a command needs a human's approval. Ordered from the strictest to the widest (what
/// a conversation may narrow to): every command asked for; none asked for, none leaving the
/// sandbox; none asked for unless it would leave the sandbox, which it then may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Ask for every command that is not already approved. The strictest.
    #[default]
    Always,
    /// Never ask: run what the sandbox allows, refuse the rest.
    Never,
    /// Ask only when a command fails inside the sandbox and would need to leave it: the only
    /// policy under which a command may run outside the sandbox.
    #[serde(alias = "on-failure")]
    OnFailure,
}

/// What a command may touch. Written `read_only`, `workspace_write`, `full_access`; the
/// command-line spellings `read-only`, `workspace-write`, `full-access` are read too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxPolicy {
    /// Read anywhere, write nowhere. The strictest.
    #[default]
    #[serde(alias = "read-only")]
    ReadOnly,
    /// Write inside the conversation's workspace only.
    #[serde(alias = "workspace-write")]
    WorkspaceWrite,
    /// No restriction.
    #[serde(alias = "full-access")]
    FullAccess,
}

/// The structured key of an approval (S9): a command path, optionally scoped to one
/// conversation (none = shared by the session) and optionally expiring.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CommandKey {
    /// argv of the command (or the qualified tool name and its arguments).
    pub path: Vec<String>,
    /// `None`: every conversation of the session may reuse the approval.
    pub conversation: Option<ConversationId>,
    /// Unix milliseconds after which the approval no longer holds.
    pub expires_at_ms: Option<u64>,
}

/// What a turn does when its prompt is over `max-prompt-tokens` (T5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverBudget {
    /// End the turn with an error; nothing is sent.
    #[default]
    Reject,
    /// Leave out the oldest history items (never the instructions, the summary or this
    /// turn's items) until the prompt fits; reject if it still does not.
    Trim,
}

/// What a turn does when a tool call fails (T6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorPolicy {
    /// Give the error to the model as the observation and go on.
    #[default]
    Skip,
    /// End the turn with status `error`.
    Terminate,
    /// Run the call again, up to `attempts` more times, then go on as `skip`.
    Retry { attempts: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_ordered_by_what_they_keep() {
        use StoragePolicy::*;
        let ordered = [
            None,
            HeadersOnly,
            Ttl { secs: 60 },
            Ttl { secs: 3600 },
            Full,
        ];
        for (i, a) in ordered.iter().enumerate() {
            for (j, b) in ordered.iter().enumerate() {
                assert_eq!(a.keeps_more_than(*b), i > j, "{a:?} vs {b:?}");
            }
        }
    }
    use serde_json::json;

    #[test]
    fn a_flags_storage_policy_may_be_the_json_form_its_error_offers() {
        let e = "forever".parse::<StoragePolicy>().unwrap_err().to_string();
        let offered = r#"{"ttl": {"secs": N}}"#;
        assert!(e.contains(offered), "{e}");
        assert_eq!(
            offered.replace('N', "60").parse::<StoragePolicy>().unwrap(),
            StoragePolicy::Ttl { secs: 60 }
        );
        let e = r#"{"ttl": {"secs": -1}}"#.parse::<StoragePolicy>().unwrap_err();
        assert!(e.to_string().contains("bad storage policy"), "{e}");
    }

    #[test]
    fn storage_policies_read_both_spellings_and_write_one() {
        for (text, policy) in [
            (json!("full"), StoragePolicy::Full),
            (json!("headers_only"), StoragePolicy::HeadersOnly),
            (json!("headers-only"), StoragePolicy::HeadersOnly),
            (json!("none"), StoragePolicy::None),
            (json!("ttl:60"), StoragePolicy::Ttl { secs: 60 }),
            (
                json!({"ttl": {"secs": 60}}),
                StoragePolicy::Ttl { secs: 60 },
            ),
        ] {
            assert_eq!(
                serde_json::from_value::<StoragePolicy>(text.clone()).unwrap(),
                policy,
                "{text}"
            );
        }
        assert_eq!(
            serde_json::to_value(StoragePolicy::Ttl { secs: 60 }).unwrap(),
            json!({"ttl": {"secs": 60}})
        );
        assert_eq!(
            serde_json::to_value(StoragePolicy::HeadersOnly).unwrap(),
            json!("headers_only")
        );
        for bad in [
            json!("ttl:"),
            json!("ttl:-1"),
            json!("headers"),
            json!(5),
            json!({"ttl": 5}),
        ] {
            let e = serde_json::from_value::<StoragePolicy>(bad.clone()).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        let e = serde_json::from_value::<StoragePolicy>(json!("forever")).unwrap_err();
        assert!(e.to_string().contains("ttl:<seconds>"), "{e}");
        #[derive(Deserialize)]
        struct Chat {
            storage_policy: StoragePolicy,
        }
        let toml: Chat = toml::from_str("storage_policy = \"ttl:30\"").unwrap();
        assert_eq!(toml.storage_policy, StoragePolicy::Ttl { secs: 30 });
        let toml: Chat = toml::from_str("storage_policy = { ttl = { secs = 30 } }").unwrap();
        assert_eq!(toml.storage_policy, StoragePolicy::Ttl { secs: 30 });
        assert_eq!(
            "headers-only".parse::<StoragePolicy>().unwrap(),
            StoragePolicy::HeadersOnly
        );
    }

    #[test]
    fn sandbox_and_approval_policies_read_both_spellings() {
        for (text, policy) in [
            ("read_only", SandboxPolicy::ReadOnly),
            ("read-only", SandboxPolicy::ReadOnly),
            ("workspace-write", SandboxPolicy::WorkspaceWrite),
            ("full_access", SandboxPolicy::FullAccess),
            ("full-access", SandboxPolicy::FullAccess),
        ] {
            assert_eq!(
                serde_json::from_value::<SandboxPolicy>(json!(text)).unwrap(),
                policy
            );
        }
        assert_eq!(
            serde_json::to_value(SandboxPolicy::FullAccess).unwrap(),
            json!("full_access")
        );
        assert_eq!(
            serde_json::from_value::<ApprovalPolicy>(json!("on-failure")).unwrap(),
            ApprovalPolicy::OnFailure
        );
    }
}
