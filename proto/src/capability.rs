//! The capability registry (A6): what an operator declares a model may run, as folders of a
//! capabilities directory, disclosed to the model a little at a time.
//!
//! A capability is a folder holding `module.json` (its id, a one-line description, its
//! commands as argv templates, the probe that checks its program is present, an optional
//! timeout), `README.md` (how to use it) and `cli.md` (the full detail). The model's prompt
//! carries one line per capability; `capability_inspect` gives the rest on demand, and
//! `capability_run` runs one of its commands as a governed command.

use crate::agent::AgentLoadError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One command of a capability: its argv, where `{name}` stands for an argument the model
/// gives (an element that is exactly `{name}` may take a list of several).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityCommand {
    pub name: String,
    pub argv: Vec<String>,
    pub description: String,
    /// The placeholders whose values may start with `-` (be read by the program as
    /// options), any such value. Any other placeholder before a literal `--` element refuses
    /// such a value, unless its `choices` list it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Placeholders that take only the values listed (each item of a list too), whether or
    /// not they start with `-`: the safe way to let the model pass chosen options.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub choices: std::collections::BTreeMap<String, Vec<String>>,
}

/// A capability as its `module.json` declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityModule {
    pub id: String,
    /// One line: what the model reads in its prompt.
    pub description: String,
    pub commands: Vec<CapabilityCommand>,
    /// The argv that shows the program is present (`["git", "--version"]`); its output is
    /// part of the full detail.
    pub probe: Vec<String>,
    /// How long one of its commands may run (`None`: the session's command timeout).
    pub timeout_ms: Option<u64>,
}

/// A capability as loaded: its declaration and its two documents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub module: CapabilityModule,
    /// `README.md`: usage.
    pub readme: String,
    /// `cli.md`: the full detail.
    pub cli: String,
    /// The start of the SHA-256 of its three files: which version is in force.
    pub version: String,
}

/// The capabilities of a configuration: every folder that loaded, and what did not (a file
/// and a field, as for agent files).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapabilityCatalog {
    /// By id, sorted.
    pub capabilities: BTreeMap<String, Capability>,
    pub errors: Vec<AgentLoadError>,
    /// Where they were read from (`None`: no capabilities directory).
    pub dir: Option<PathBuf>,
}

impl CapabilityCatalog {
    pub fn get(&self, id: &str) -> Option<&Capability> {
        self.capabilities.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.capabilities.is_empty()
    }
}

/// How much of the model's context the registry may take, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilityBudget {
    /// The one-line summaries in the prompt, all together.
    pub prompt_tokens: usize,
    /// One `capability_inspect` answer.
    pub inspect_tokens: usize,
}

impl Default for CapabilityBudget {
    fn default() -> Self {
        Self {
            prompt_tokens: 400,
            inspect_tokens: 2000,
        }
    }
}
