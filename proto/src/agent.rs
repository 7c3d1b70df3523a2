//! Agents (A1–A4): what an agent definition file holds, a session's bindings of agents to
//! provider sessions, the execution chain every dispatch carries, and the vocabulary of the
//! routing, dispatch and binding events.
//!
//! A definition is one file per agent (`<id>.json`, or the same fields in `<id>.toml`):
//!
//! ```json
//! {
//!   "id": "executor-1",
//!   "role": "executor",
//!   "provider": {"type": "model", "model": "gpt-4.1", "instructions": "You run commands."},
//!   "session": {"bindingScope": "session", "resume": true},
//!   "tools": {"whitelist": ["shell"], "blacklist": ["apply_patch"], "authorizationRequired": ["shell"]},
//!   "workers": ["reviewer"]
//! }
//! ```
//!
//! Field names are the seed's camelCase (`bindingScope`, `authorizationRequired`); the
//! snake_case spellings (`binding_scope`, `authorization_required`, `base_url`, `token_env`)
//! are accepted too. Unknown fields are refused, so that a misspelt key is an error naming it
//! rather than a setting silently ignored.

use crate::error::AgentError;
use crate::ids::SessionId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The id of the built-in supervisor (the router when no agent is named as one): reserved,
/// no agent file may take it.
pub const BUILTIN_SUPERVISOR_ID: &str = "supervisor";

/// Longest agent id.
pub const MAX_AGENT_ID_LEN: usize = 64;

/// Default bound of nested dispatches (seed 003 §5.3).
pub const DEFAULT_MAX_DEPTH: usize = 4;

/// One agent, as its definition file says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// `[a-zA-Z0-9_-]{1,64}`; the file is named after it.
    pub id: String,
    /// What it is for (`executor`, `reviewer`, `supervisor`, ...): shown to the supervisor
    /// and in listings.
    #[serde(default)]
    pub role: String,
    /// One line saying when to use it, shown to the supervisor (default: its role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Who runs it.
    pub provider: ProviderSpec,
    /// How its provider sessions are bound.
    #[serde(default)]
    pub session: SessionSpec,
    /// What it may call (enforced by tool governance; parsed and checked here).
    #[serde(default)]
    pub tools: ToolRules,
    /// Agents it may dispatch to (a super-agent's workers). A model agent sees them through
    /// its `dispatch_agent` tool; nobody else is visible to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
    /// Provider-specific governance (seed 003 §7.3), kept as given for tool governance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governance: Option<serde_json::Value>,
    /// Its answers' shape (A8): a JSON Schema every answer is held to before anyone sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
}

/// `output`: the output guardrail of an agent (A8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// The JSON Schema of an answer. Only the properties it declares reach anyone.
    pub schema: serde_json::Value,
    /// What happens when the answer still does not match after the retries: `reject` (the
    /// task fails with `guardrail_failed`) or `ask_human` (the task asks a human instead).
    #[serde(default, rename = "onFailure", alias = "on_failure")]
    pub on_failure: GuardrailAction,
    /// How often the model is asked again with the validation errors (0 to 2, default 2).
    #[serde(default = "two", rename = "maxRetries", alias = "max_retries")]
    pub max_retries: u32,
}

fn two() -> u32 {
    2
}

/// Most retries an output guardrail may ask for.
pub const MAX_GUARDRAIL_RETRIES: u32 = 2;

/// What an output guardrail does once its retries are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailAction {
    /// The task fails with `guardrail_failed`.
    #[default]
    Reject,
    /// The task's answer is a question to a human (an `ask_human` event).
    AskHuman,
}

impl GuardrailAction {
    pub const ALL: [Self; 2] = [Self::Reject, Self::AskHuman];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::AskHuman => "ask_human",
        }
    }
}

/// Who runs an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderSpec {
    /// In process: a conversation of the session with its own instructions, model and tools.
    Model {
        /// The model it asks (default: the session's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// `openai-responses`, `openai-chat` or `scripted` (default: the session's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider: Option<String>,
        /// Its own endpoint (default: the session's).
        #[serde(default, alias = "baseUrl", skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
        /// Its system prompt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
    },
    /// An external agent process speaking the Agent Client Protocol on stdio.
    Acp {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
    },
    /// A remote agent over A2A.
    A2a {
        url: String,
        /// The environment variable holding its bearer token.
        #[serde(default, alias = "tokenEnv", skip_serializing_if = "Option::is_none")]
        token_env: Option<String>,
    },
}

impl ProviderSpec {
    pub const fn kind(&self) -> ProviderKind {
        match self {
            Self::Model { .. } => ProviderKind::Model,
            Self::Acp { .. } => ProviderKind::Acp,
            Self::A2a { .. } => ProviderKind::A2a,
        }
    }
}

/// The kind of provider: a bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Model,
    Acp,
    A2a,
}

impl ProviderKind {
    pub const ALL: [Self; 3] = [Self::Model, Self::Acp, Self::A2a];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Acp => "acp",
            Self::A2a => "a2a",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `session`: how an agent's provider sessions are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    #[serde(default, rename = "bindingScope", alias = "binding_scope")]
    pub binding_scope: BindingScope,
    /// Whether a binding made before (an earlier run of the session) is resumed; `false`
    /// opens a new provider session at the first dispatch of each run and binds it instead.
    #[serde(default = "yes")]
    pub resume: bool,
}

fn yes() -> bool {
    true
}

impl Default for SessionSpec {
    fn default() -> Self {
        Self {
            binding_scope: BindingScope::Session,
            resume: true,
        }
    }
}

/// What a binding is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingScope {
    /// One provider session per (session, agent), kept and resumed (the seed's
    /// `finger+agent`).
    #[default]
    #[serde(alias = "finger+agent", alias = "session+agent")]
    Session,
    /// A new provider session for every dispatch; nothing is bound.
    Dispatch,
}

impl BindingScope {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Dispatch => "dispatch",
        }
    }
}

/// `tools`: what an agent may call (seed 003 §6). Names are troupe tool names (`shell`,
/// `server__tool`) or the seed's dotted ones (`shell.exec`); `*` matches any run of
/// characters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRules {
    #[serde(default)]
    pub whitelist: Vec<String>,
    #[serde(default)]
    pub blacklist: Vec<String>,
    #[serde(
        default,
        rename = "authorizationRequired",
        alias = "authorization_required"
    )]
    pub authorization_required: Vec<String>,
}

impl ToolRules {
    /// Whether it restricts nothing and asks for no token.
    pub fn is_empty(&self) -> bool {
        self.whitelist.is_empty()
            && self.blacklist.is_empty()
            && self.authorization_required.is_empty()
    }

    /// Checks every pattern; `prefix` goes before the field's name in the error
    /// (`tools.` gives `tools.whitelist[2]`).
    pub fn validate(&self, prefix: &str) -> Result<(), FieldError> {
        for (field, list) in [
            ("whitelist", &self.whitelist),
            ("blacklist", &self.blacklist),
            ("authorizationRequired", &self.authorization_required),
        ] {
            for (i, name) in list.iter().enumerate() {
                if !is_valid_tool_pattern(name) {
                    return Err(FieldError::new(
                        format!("{prefix}{field}[{i}]"),
                        format!("`{name}` is not a tool name ([a-zA-Z0-9_.*-])"),
                    ));
                }
                if list[..i].contains(name) {
                    return Err(FieldError::new(
                        format!("{prefix}{field}[{i}]"),
                        format!("`{name}` is listed twice"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `id` is a valid agent id: `[a-zA-Z0-9_-]{1,64}`.
pub fn is_valid_agent_id(id: &str) -> bool {
    (1..=MAX_AGENT_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` may stand in a tool rule: `[a-zA-Z0-9_.*-]{1,128}`.
pub fn is_valid_tool_pattern(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'*'))
}

/// A problem with one field of a definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field (`provider.command`, `tools.whitelist[2]`).
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl AgentDefinition {
    /// Checks what parsing cannot: ids, tool names, required strings, workers that name
    /// this agent itself. Workers naming agents that do not exist are checked by the catalog.
    pub fn validate(&self) -> Result<(), FieldError> {
        if !is_valid_agent_id(&self.id) {
            return Err(FieldError::new(
                "id",
                format!(
                    "`{}` is not a valid agent id ([a-zA-Z0-9_-], 1 to {MAX_AGENT_ID_LEN} characters)",
                    self.id
                ),
            ));
        }
        if self.id == BUILTIN_SUPERVISOR_ID {
            return Err(FieldError::new(
                "id",
                format!(
                    "`{BUILTIN_SUPERVISOR_ID}` names the built-in supervisor; give the agent another id"
                ),
            ));
        }
        match &self.provider {
            ProviderSpec::Acp { command, .. } if command.trim().is_empty() => {
                return Err(FieldError::new("provider.command", "must not be empty"));
            }
            ProviderSpec::A2a { url, .. }
                if !(url.starts_with("http://") || url.starts_with("https://")) =>
            {
                return Err(FieldError::new(
                    "provider.url",
                    format!("`{url}` is not an http(s) URL"),
                ));
            }
            ProviderSpec::Model {
                provider: Some(p), ..
            } if !matches!(p.as_str(), "openai-responses" | "openai-chat" | "scripted") => {
                return Err(FieldError::new(
                    "provider.provider",
                    format!("`{p}` is not one of openai-responses, openai-chat, scripted"),
                ));
            }
            ProviderSpec::Model {
                base_url: Some(u), ..
            } if !(u.starts_with("http://") || u.starts_with("https://")) => {
                return Err(FieldError::new(
                    "provider.base_url",
                    format!("`{u}` is not an http(s) URL"),
                ));
            }
            _ => {}
        }
        self.tools.validate("tools.")?;
        if let Some(output) = &self.output {
            // The guardrail holds the answers of a model troupe runs; an external agent's
            // answer is its own (refused rather than accepted and never checked).
            if !matches!(self.provider, ProviderSpec::Model { .. }) {
                return Err(FieldError::new(
                    "output",
                    "an output schema holds a `model` agent's answers; an `acp` or `a2a` \
                     agent's answers are its own",
                ));
            }
            if !output.schema.is_object() && !output.schema.is_boolean() {
                return Err(FieldError::new(
                    "output.schema",
                    "must be a JSON Schema (an object)",
                ));
            }
            if output.max_retries > MAX_GUARDRAIL_RETRIES {
                return Err(FieldError::new(
                    "output.maxRetries",
                    format!("at most {MAX_GUARDRAIL_RETRIES}"),
                ));
            }
        }
        for (i, worker) in self.workers.iter().enumerate() {
            if worker == &self.id {
                return Err(FieldError::new(
                    format!("workers[{i}]"),
                    "an agent cannot be its own worker",
                ));
            }
            if !is_valid_agent_id(worker) {
                return Err(FieldError::new(
                    format!("workers[{i}]"),
                    format!("`{worker}` is not a valid agent id"),
                ));
            }
        }
        Ok(())
    }

    /// What the supervisor reads about it: its description, else its role.
    pub fn summary(&self) -> &str {
        self.description
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(&self.role)
    }
}

/// A definition file that could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLoadError {
    pub file: PathBuf,
    /// The field at fault (`provider.type`), when one is.
    pub field: Option<String>,
    pub message: String,
}

impl std::fmt::Display for AgentLoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(
                f,
                "{}: field `{field}`: {}",
                self.file.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// The agents of a configuration: every definition that loaded, and what did not.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentCatalog {
    /// By id, sorted.
    pub agents: BTreeMap<String, AgentDefinition>,
    pub errors: Vec<AgentLoadError>,
    /// Where they were read from (`None`: no agents directory).
    pub dir: Option<PathBuf>,
    /// By id: the version of the definition in force, the start of its file's SHA-256.
    pub versions: BTreeMap<String, String>,
    /// The ids of definition files whose `role` is `supervisor` that did not load (their id,
    /// else the file's name without its extension), sorted: without `[agents] supervisor`,
    /// such a file may be the supervisor the session was meant to have.
    pub unloaded_supervisors: Vec<String>,
}

impl AgentCatalog {
    pub fn get(&self, id: &str) -> Option<&AgentDefinition> {
        self.agents.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

/// A session's binding of one agent to a provider session (A1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentBinding {
    pub session_id: SessionId,
    pub agent_id: String,
    /// The kind of provider the provider session belongs to: a binding made by another kind
    /// (the definition changed) is not resumed.
    pub provider: ProviderKind,
    /// The provider's own id: a conversation id (model), an ACP session id, an A2A context.
    pub provider_session_id: String,
    pub created_ms: u64,
    /// Unix ms of its last bind or resume.
    pub updated_ms: u64,
}

/// The agents a dispatch went through, outermost first: its origin (the supervisor, or
/// `user` when no supervisor routes) then every agent dispatched to. A dispatch to an agent
/// already in it is a cycle; its depth is the number of agents after the origin.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecutionChain(pub Vec<String>);

impl ExecutionChain {
    /// A chain that starts at `origin`.
    pub fn start(origin: impl Into<String>) -> Self {
        Self(vec![origin.into()])
    }

    /// Dispatches so far (the origin is not one).
    pub fn depth(&self) -> usize {
        self.0.len().saturating_sub(1)
    }

    pub fn contains(&self, agent_id: &str) -> bool {
        self.0.iter().any(|a| a == agent_id)
    }

    /// The chain one dispatch further.
    #[must_use]
    pub fn then(&self, agent_id: &str) -> Self {
        let mut next = self.0.clone();
        next.push(agent_id.to_owned());
        Self(next)
    }

    /// The agent at its end (the one dispatching now).
    pub fn current(&self) -> Option<&str> {
        self.0.last().map(String::as_str)
    }
}

impl std::fmt::Display for ExecutionChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(" → "))
    }
}

/// What the supervisor decided to do with an input (A3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteDecision {
    DirectReply,
    DispatchAgent,
    DispatchModule,
    AskHuman,
    Reject,
}

impl RouteDecision {
    pub const ALL: [Self; 5] = [
        Self::DirectReply,
        Self::DispatchAgent,
        Self::DispatchModule,
        Self::AskHuman,
        Self::Reject,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DirectReply => "direct_reply",
            Self::DispatchAgent => "dispatch_agent",
            Self::DispatchModule => "dispatch_module",
            Self::AskHuman => "ask_human",
            Self::Reject => "reject",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// Who made a route decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteSource {
    /// The supervisor's model, through its `route` tool call.
    Model,
    /// The rules (no model configured for routing, or `[agents] router = "rules"`).
    Rules,
    /// `/hub <agent_id> <text>`: straight to the agent, no supervisor.
    Hub,
}

impl RouteSource {
    pub const ALL: [Self; 3] = [Self::Model, Self::Rules, Self::Hub];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Rules => "rules",
            Self::Hub => "hub",
        }
    }
}

/// How a dispatch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchStatus {
    Ok,
    Error,
    Cancelled,
    /// Its lease expired: the child was cancelled and the lease reclaimed.
    Expired,
}

impl DispatchStatus {
    pub const ALL: [Self; 4] = [Self::Ok, Self::Error, Self::Cancelled, Self::Expired];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
        }
    }

    /// The status an error ends a dispatch with.
    pub fn of_error(error: &AgentError) -> Self {
        match error {
            AgentError::Cancelled { .. } => Self::Cancelled,
            _ => Self::Error,
        }
    }
}

/// Why a dispatch was refused before it ran (`policy_rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyReason {
    /// The agent is already in the execution chain.
    Cycle,
    /// The agent waits, through dispatches in flight, for the dispatcher: running it would
    /// deadlock.
    WaitCycle,
    /// The chain would be deeper than `[agents] max_depth`.
    Depth,
    /// No agent has that id.
    UnknownAgent,
    /// The dispatcher may not see that agent (not among its workers).
    NotVisible,
    /// No provider of the agent's kind is plugged in.
    ProviderUnavailable,
    /// No module registry knows that module.
    UnknownModule,
    /// Tool governance: the task's tool policy denies the tool (a blacklist names it, or a
    /// whitelist leaves it out).
    ToolDenied,
    /// Tool governance: the tool needs an authorization token and none presented was valid.
    Unauthorized,
    /// The in-process agent's conversation keeps more than the dispatcher's storage policy
    /// allows (its record follows the session's root policy): the input would be kept
    /// against the dispatching conversation's policy.
    StoragePolicy,
}

impl PolicyReason {
    pub const ALL: [Self; 10] = [
        Self::Cycle,
        Self::WaitCycle,
        Self::Depth,
        Self::UnknownAgent,
        Self::NotVisible,
        Self::ProviderUnavailable,
        Self::UnknownModule,
        Self::ToolDenied,
        Self::Unauthorized,
        Self::StoragePolicy,
    ];

    /// The reasons a dispatch is refused for (the rest are tool governance's).
    pub const DISPATCH: [Self; 8] = [
        Self::Cycle,
        Self::WaitCycle,
        Self::Depth,
        Self::UnknownAgent,
        Self::NotVisible,
        Self::ProviderUnavailable,
        Self::UnknownModule,
        Self::StoragePolicy,
    ];

    /// Tool governance's reasons.
    pub const TOOL: [Self; 2] = [Self::ToolDenied, Self::Unauthorized];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cycle => "cycle",
            Self::WaitCycle => "wait_cycle",
            Self::Depth => "depth",
            Self::UnknownAgent => "unknown_agent",
            Self::NotVisible => "not_visible",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::UnknownModule => "unknown_module",
            Self::ToolDenied => "tool_denied",
            Self::Unauthorized => "unauthorized",
            Self::StoragePolicy => "storage_policy",
        }
    }
}

/// What an [`AgentUpdate`](crate::EventKind::AgentUpdate) is (ACP's `session/update`
/// kinds, and A2A's status updates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentUpdateKind {
    /// A piece of the agent's answer.
    MessageChunk,
    /// A piece of its reasoning.
    ThoughtChunk,
    /// It started a tool call.
    ToolCall,
    /// A tool call progressed or ended.
    ToolCallUpdate,
    /// Its plan.
    Plan,
    /// Its state changed (A2A task status).
    Status,
    /// Anything else.
    Other,
}

/// An agent's health, as its provider reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// Ready to take dispatches.
    Ok,
    /// Works, with a problem worth saying (restarting, slow).
    Degraded,
    /// Cannot take dispatches (no provider of its kind, its process cannot start).
    Unavailable,
}

impl HealthStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Degraded => "degraded",
            Self::Unavailable => "unavailable",
        }
    }
}

/// An agent's health and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHealth {
    pub status: HealthStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AgentHealth {
    pub const fn ok() -> Self {
        Self {
            status: HealthStatus::Ok,
            detail: None,
        }
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self {
            status: HealthStatus::Unavailable,
            detail: Some(detail.into()),
        }
    }

    pub fn degraded(detail: impl Into<String>) -> Self {
        Self {
            status: HealthStatus::Degraded,
            detail: Some(detail.into()),
        }
    }
}

/// One line of `troupe agents list` / `agents.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub id: String,
    pub role: String,
    pub provider: ProviderKind,
    pub health: AgentHealth,
    /// Its bindings (of one session when the listing names one, else of every session).
    pub bindings: Vec<AgentBinding>,
    /// Agents it may dispatch to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
    /// Whether it routes the session's input.
    #[serde(default)]
    pub supervisor: bool,
    /// The version of its definition in force (the start of its file's SHA-256), when it
    /// was read from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `agents.list`: the agents and the definition files that did not load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentListing {
    pub agents: Vec<AgentInfo>,
    pub errors: Vec<AgentLoadError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(json: &str) -> Result<AgentDefinition, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn the_seed_shape_parses_with_its_camel_case() {
        let d = def(r#"{
            "id": "executor-1", "role": "executor",
            "provider": {"type": "model", "model": "gpt-5.3-codex"},
            "session": {"bindingScope": "finger+agent", "resume": true},
            "tools": {"whitelist": ["shell.exec", "capability.bd"], "blacklist": ["file.delete"],
                      "authorizationRequired": ["shell.exec"]},
            "governance": {"iflow": {"approvalMode": "default"}}
        }"#)
        .unwrap();
        assert_eq!(d.session.binding_scope, BindingScope::Session);
        assert_eq!(d.tools.authorization_required, ["shell.exec"]);
        assert_eq!(d.provider.kind(), ProviderKind::Model);
        d.validate().unwrap();
    }

    #[test]
    fn every_provider_kind_parses_and_unknown_fields_are_refused() {
        let acp = def(r#"{"id":"a","provider":{"type":"acp","command":"codex-acp","args":["-x"],"env":{"K":"v"}}}"#).unwrap();
        assert_eq!(acp.provider.kind(), ProviderKind::Acp);
        let a2a = def(r#"{"id":"b","provider":{"type":"a2a","url":"http://127.0.0.1:1/a2a","token_env":"T"}}"#).unwrap();
        assert_eq!(a2a.provider.kind(), ProviderKind::A2a);
        assert!(def(r#"{"id":"c","provider":{"type":"iflow"}}"#).is_err());
        assert!(def(r#"{"id":"c","provider":{"type":"acp","command":"x","comand":"y"}}"#).is_err());
        assert!(def(r#"{"id":"c","provider":{"type":"model"},"sesion":{}}"#).is_err());
        assert!(
            def(r#"{"id":"c","provider":{"type":"model"},"session":{"bindingScope":"forever"}}"#)
                .is_err()
        );
    }

    #[test]
    fn validation_names_the_field() {
        let mut d = def(r#"{"id":"ok","provider":{"type":"acp","command":" "}}"#).unwrap();
        assert_eq!(d.validate().unwrap_err().field, "provider.command");
        d.provider = ProviderSpec::A2a {
            url: "ftp://x".into(),
            token_env: None,
        };
        assert_eq!(d.validate().unwrap_err().field, "provider.url");
        d.provider = ProviderSpec::Model {
            model: None,
            provider: None,
            base_url: None,
            instructions: None,
        };
        d.tools.whitelist = vec!["shell".into(), "bad name".into()];
        assert_eq!(d.validate().unwrap_err().field, "tools.whitelist[1]");
        d.tools.whitelist = vec!["shell".into(), "shell".into()];
        assert_eq!(d.validate().unwrap_err().field, "tools.whitelist[1]");
        d.tools.whitelist.clear();
        d.workers = vec!["ok".into()];
        assert_eq!(d.validate().unwrap_err().field, "workers[0]");
        d.workers.clear();
        d.id = "no spaces".into();
        assert_eq!(d.validate().unwrap_err().field, "id");
    }

    #[test]
    fn a_chain_knows_its_depth_and_cycles() {
        let c = ExecutionChain::start("supervisor").then("a").then("b");
        assert_eq!(c.depth(), 2);
        assert!(c.contains("a"));
        assert!(!c.contains("c"));
        assert_eq!(c.current(), Some("b"));
        assert_eq!(c.to_string(), "supervisor → a → b");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"["supervisor","a","b"]"#
        );
    }
}
