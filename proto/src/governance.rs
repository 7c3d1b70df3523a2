//! Tool governance (A5): the layers of a tool policy as configuration and requests write
//! them, and the vocabulary of its decisions.
//!
//! A policy has four layers, from the lowest to the highest: **global** (`[tools]` in
//! `troupe.toml`), **role** (`[tools.roles.<role>]`), **agent** (the `tools` of an agent's
//! file) and **request** (the `tools` sent with one message). Each layer has the same three
//! lists as an agent file ([`ToolRules`]): a whitelist (empty: the layer restricts nothing),
//! a blacklist, and the tools that need an authorization token. A higher layer narrows what
//! the lower ones allow and never widens it: a tool runs only when no layer's blacklist
//! names it and every layer with a whitelist names it. So deny beats allow at every layer,
//! and the order the layers are combined in changes nothing.

use crate::agent::ToolRules;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A layer of a tool policy, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLayer {
    /// `[tools]` of the configuration: every task.
    Global,
    /// `[tools.roles.<role>]`: the tasks of agents with that role.
    Role,
    /// An agent file's `tools`: that agent's tasks.
    Agent,
    /// The `tools` sent with one message: that message's task and what it dispatches.
    Request,
}

impl PolicyLayer {
    pub const ALL: [Self; 4] = [Self::Global, Self::Role, Self::Agent, Self::Request];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Role => "role",
            Self::Agent => "agent",
            Self::Request => "request",
        }
    }
}

impl std::fmt::Display for PolicyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[tools]` of `troupe.toml`: the global layer, and a layer per agent role.
///
/// ```toml
/// [tools]
/// blacklist = ["files__delete_*"]
/// authorizationRequired = ["shell"]
///
/// [tools.roles.reviewer]
/// whitelist = ["files__read_*", "update_plan"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolPolicyConfig {
    pub whitelist: Vec<String>,
    pub blacklist: Vec<String>,
    #[serde(rename = "authorizationRequired", alias = "authorization_required")]
    pub authorization_required: Vec<String>,
    /// By role (an agent file's `role`).
    pub roles: BTreeMap<String, ToolRules>,
}

impl ToolPolicyConfig {
    /// The global layer's rules.
    pub fn global(&self) -> ToolRules {
        ToolRules {
            whitelist: self.whitelist.clone(),
            blacklist: self.blacklist.clone(),
            authorization_required: self.authorization_required.clone(),
        }
    }

    /// Whether it restricts nothing and asks for no token.
    pub fn is_empty(&self) -> bool {
        self.whitelist.is_empty()
            && self.blacklist.is_empty()
            && self.authorization_required.is_empty()
            && self.roles.values().all(ToolRules::is_empty)
    }

    /// Checks every pattern; the error names the key at fault (`roles.reviewer.whitelist[1]`).
    pub fn validate(&self) -> Result<(), crate::agent::FieldError> {
        self.global().validate("")?;
        for (role, rules) in &self.roles {
            rules.validate(&format!("roles.{role}."))?;
        }
        Ok(())
    }
}

/// What one message asks of tool governance besides its text: a request layer, and the
/// authorization tokens its sender presents. Both reach the agents it is dispatched to.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MessageOptions {
    /// The request layer of the task's tool policy (it can only narrow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolRules>,
    /// Authorization tokens (`tat_...`), for the tools that need one. Never recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authorization: Vec<String>,
}

/// Never prints a token: only how many were presented.
impl std::fmt::Debug for MessageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageOptions")
            .field("tools", &self.tools)
            .field(
                "authorization",
                &format_args!("[{} tokens]", self.authorization.len()),
            )
            .finish()
    }
}

impl MessageOptions {
    pub fn is_empty(&self) -> bool {
        self.tools.as_ref().is_none_or(ToolRules::is_empty) && self.authorization.is_empty()
    }
}

/// An authorization token as the store keeps it: its scope, bounds and use count, and the
/// SHA-256 of its secret (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthToken {
    /// Public id (a UUID): what lists, revocations and traces name.
    pub id: String,
    /// SHA-256 of the secret, in hex.
    pub digest: String,
    #[serde(flatten)]
    pub scope: TokenScope,
    /// Who issued it (free text: a person, `cli:<user>`).
    pub issued_by: String,
    pub issued_ms: u64,
    pub expires_ms: u64,
    pub max_uses: u32,
    pub uses: u32,
    /// When it was revoked, if it was.
    pub revoked_ms: Option<u64>,
}

/// What a token allows: one agent (or `*`), one tool (a pattern), optionally only calls
/// whose arguments match patterns: a shell call's command line, and named arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenScope {
    /// The agent whose calls it authorizes; `*`: any, the session's own conversation too.
    pub agent: String,
    /// The tool, a pattern as in a policy (`shell`, `files__*`).
    pub tool: String,
    /// For tool `shell` only: a pattern (`*` matches any run of characters but those that
    /// end or chain a command) the command line must match (`git status*`). `None`: any
    /// command. A token for another tool with one is refused: a whole call's arguments are
    /// scoped by [`fields`](Self::fields), never by one pattern over their JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    /// Patterns of named arguments (`{"path": "notes/*"}`): each names a top-level field of
    /// the call's arguments, which must be there and whose value must match (a string as
    /// it is, any other value as compact JSON). Empty: any arguments.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
}

/// `tokens.issue`: what a person asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueToken {
    #[serde(flatten)]
    pub scope: TokenScope,
    /// How long it is valid, in seconds.
    pub ttl_secs: u64,
    /// How many calls it authorizes.
    pub max_uses: u32,
    #[serde(default)]
    pub issued_by: Option<String>,
}

/// What lists show of a token: everything but its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    #[serde(flatten)]
    pub scope: TokenScope,
    pub issued_by: String,
    pub issued_ms: u64,
    pub expires_ms: u64,
    pub max_uses: u32,
    pub uses: u32,
    pub revoked_ms: Option<u64>,
}

impl From<&AuthToken> for TokenInfo {
    fn from(t: &AuthToken) -> Self {
        Self {
            id: t.id.clone(),
            scope: t.scope.clone(),
            issued_by: t.issued_by.clone(),
            issued_ms: t.issued_ms,
            expires_ms: t.expires_ms,
            max_uses: t.max_uses,
            uses: t.uses,
            revoked_ms: t.revoked_ms,
        }
    }
}

/// The answer to `tokens.issue`: the secret, shown this once, and the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedToken {
    pub token: String,
    pub info: TokenInfo,
}

/// Why a presented token did not authorize a call: a bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenRefusal {
    /// No token was presented.
    Missing,
    /// No token has that secret.
    Unknown,
    /// Its TTL has passed.
    Expired,
    /// Its uses are spent.
    Exhausted,
    Revoked,
    /// It is for another agent, tool or arguments.
    OutOfScope,
    /// It scopes another tool than `shell` by one pattern over the call's whole arguments
    /// (as tokens once could): no longer honoured, never read as a wider scope.
    Obsolete,
    /// The token book could not be asked.
    Unavailable,
}

impl TokenRefusal {
    pub const ALL: [Self; 8] = [
        Self::Missing,
        Self::Unknown,
        Self::Expired,
        Self::Exhausted,
        Self::Revoked,
        Self::OutOfScope,
        Self::Obsolete,
        Self::Unavailable,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
            Self::Exhausted => "exhausted",
            Self::Revoked => "revoked",
            Self::OutOfScope => "out_of_scope",
            Self::Obsolete => "obsolete",
            Self::Unavailable => "unavailable",
        }
    }

    /// A sentence for the refusal.
    pub const fn explain(self) -> &'static str {
        match self {
            Self::Missing => "no token was presented",
            Self::Unknown => "no token presented is known",
            Self::Expired => "the token has expired",
            Self::Exhausted => "the token's uses are spent",
            Self::Revoked => "the token was revoked",
            Self::OutOfScope => "no token presented covers this agent, tool and arguments",
            Self::Obsolete => {
                "the token scopes a tool's arguments by one pattern over their whole JSON, which is no longer honoured: issue a new one that names the arguments (`--field NAME=PATTERN`)"
            }
            Self::Unavailable => "the token book is unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_request_carries_its_field_patterns() {
        let request: IssueToken = serde_json::from_str(
            r#"{"agent": "*", "tool": "files__write", "fields": {"path": "notes/*"},
                "ttl_secs": 60, "max_uses": 1}"#,
        )
        .unwrap();
        assert_eq!(request.scope.fields["path"], "notes/*");
        assert_eq!(request.scope.args, None);
        let info = serde_json::to_value(TokenInfo {
            id: "t".into(),
            scope: request.scope,
            issued_by: "ann".into(),
            issued_ms: 0,
            expires_ms: 1,
            max_uses: 1,
            uses: 0,
            revoked_ms: None,
        })
        .unwrap();
        assert_eq!(info["fields"], serde_json::json!({"path": "notes/*"}));
        assert!(info.get("args").is_none(), "{info}");
    }

    #[test]
    fn the_tools_section_parses_with_roles_and_names_a_bad_pattern() {
        let config: ToolPolicyConfig = toml::from_str(
            r#"
            blacklist = ["files__delete_*"]
            authorizationRequired = ["shell"]
            [roles.reviewer]
            whitelist = ["files__read_*", "update_plan"]
            "#,
        )
        .unwrap();
        assert_eq!(config.global().blacklist, ["files__delete_*"]);
        assert_eq!(config.roles["reviewer"].whitelist.len(), 2);
        config.validate().unwrap();
        let mut bad = config;
        bad.roles
            .get_mut("reviewer")
            .unwrap()
            .whitelist
            .push("no spaces".into());
        assert_eq!(
            bad.validate().unwrap_err().field,
            "roles.reviewer.whitelist[2]"
        );
        assert!(toml::from_str::<ToolPolicyConfig>("alow = []").is_err());
    }
}
