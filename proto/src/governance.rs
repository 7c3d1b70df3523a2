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
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MessageOptions {
    /// The request layer of the task's tool policy (it can only narrow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolRules>,
    /// Authorization tokens (`tat_...`), for the tools that need one. Never recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authorization: Vec<String>,
}

impl MessageOptions {
    pub fn is_empty(&self) -> bool {
        self.tools.as_ref().is_none_or(ToolRules::is_empty) && self.authorization.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
