//! Configuration of models and chats: a TOML file, environment variables and command-line
//! flags, in that order of increasing precedence.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

mod telemetry;

pub use telemetry::{OTEL_ENV_VARS, OtlpProtocol, TelemetryConfig};

/// Which wire protocol a model endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// The built-in scripted model (no network).
    #[default]
    Scripted,
    /// OpenAI Responses API (`POST {base_url}/responses`, SSE).
    OpenaiResponses,
    /// OpenAI Chat Completions API (`POST {base_url}/chat/completions`, SSE), which most
    /// OpenAI-compatible servers (Ollama, vLLM, llama.cpp, LM Studio) speak.
    OpenaiChat,
}

/// How tools are offered to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ToolMode {
    /// The API's native tool calling.
    #[default]
    Native,
    /// The text dialect: `<action tool="NAME">JSON</action>` / `<final>…</final>`, for models
    /// without tool calling.
    Text,
}

/// A model endpoint.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub provider: Provider,
    /// e.g. `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1` (Ollama).
    pub base_url: String,
    /// Name of the environment variable holding the API key (none: no Authorization header).
    pub api_key_env: Option<String>,
    /// The API key itself; takes precedence over `api_key_env`. Meant for tests and embedding
    /// (a config file should name an environment variable instead). Never printed by `Debug`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    pub model: String,
    pub tool_mode: ToolMode,
    /// Extra HTTP headers sent with every request.
    pub headers: BTreeMap<String, String>,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Whole-request bound (streaming included).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest silence allowed between two stream events.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Retries after the first attempt on 429, 5xx and transport errors.
    pub max_retries: u32,
    /// First backoff; doubled each retry (with jitter), capped at `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// Most bytes of text and tool calls one response may bring; past it the step fails. One
    /// SSE event may hold this and 4 MiB more (the Responses API's last event repeats the
    /// whole output). Bounds what a broken or hostile server can make troupe hold.
    pub max_response_bytes: usize,
}

/// The default of [`ModelConfig::max_response_bytes`]: 16 MiB, some thirty times the longest
/// output any model is allowed today (128k tokens of about four bytes).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

// By hand so the key never reaches a log line.
impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("tool_mode", &self.tool_mode)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base", &self.retry_base)
            .field("retry_max", &self.retry_max)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            provider: Provider::Scripted,
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            api_key: None,
            model: "gpt-4o-mini".into(),
            tool_mode: ToolMode::Native,
            headers: BTreeMap::new(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            max_retries: 4,
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// Settings of the chat loop and its turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatConfig {
    /// Steps before a turn ends with `max_steps` (T2).
    pub max_steps: u32,
    /// Largest prompt sent, by the local estimate (T5).
    pub max_prompt_tokens: Option<u64>,
    /// A prompt above this is sent with a warning.
    pub warn_prompt_tokens: Option<u64>,
    /// `reject` or `trim` a prompt over `max_prompt_tokens`.
    pub over_budget: troupe_proto::OverBudget,
    /// Model whose tokenizer estimates prompts (default: the model's own); `approx` uses
    /// four bytes a token and loads no vocabulary.
    pub tokenizer_model: Option<String>,
    /// `skip`, `terminate` or `{retry = {attempts = N}}` (T6).
    pub tool_errors: troupe_proto::ToolErrorPolicy,
    pub approval_policy: troupe_proto::ApprovalPolicy,
    pub sandbox_policy: troupe_proto::SandboxPolicy,
    pub storage_policy: troupe_proto::StoragePolicy,
    /// How long a shell command may run when its call names no `timeout_ms`.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// The longest a shell command may run, whatever timeout its call asks for (the model
    /// chooses `timeout_ms`; this bounds it).
    #[serde(with = "humantime_serde")]
    pub max_command_timeout: Duration,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            max_steps: 100,
            max_prompt_tokens: None,
            warn_prompt_tokens: None,
            over_budget: troupe_proto::OverBudget::Reject,
            tokenizer_model: None,
            tool_errors: troupe_proto::ToolErrorPolicy::Skip,
            approval_policy: troupe_proto::ApprovalPolicy::Always,
            sandbox_policy: troupe_proto::SandboxPolicy::ReadOnly,
            storage_policy: troupe_proto::StoragePolicy::Full,
            command_timeout: Duration::from_secs(60),
            max_command_timeout: Duration::from_secs(600),
        }
    }
}

/// The whole configuration: a TOML file, then environment variables, then flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TroupeConfig {
    /// Rollouts and other durable data.
    pub data_dir: std::path::PathBuf,
    /// JSONL chat histories, `<log_dir>/<session_id>.jsonl` (T4).
    pub log_dir: std::path::PathBuf,
    /// How often `troupe serve` and a running `troupe chat` sweep content whose Ttl has passed
    /// (both also sweep once at start); zero: only at start.
    #[serde(with = "humantime_serde")]
    pub ttl_sweep_interval: Duration,
    pub model: ModelConfig,
    pub chat: ChatConfig,
    pub mcp: McpConfig,
    /// `troupe serve`: listen address, tokens, limits.
    pub server: ServerConfig,
    /// `[telemetry]`: OTLP span export (off by default) and content capture.
    pub telemetry: TelemetryConfig,
    /// What named the model endpoint (file, environment, flags), for [`Self::choose_provider`].
    #[serde(skip)]
    pub named: ModelNamed,
    /// `[history]`: bounds of a conversation's history and who writes its summary (S6).
    pub history: HistoryConfig,
    /// `[conversation]`: the close timeout and the approval timeout (S5, S9).
    pub conversation: ConversationConfig,
    /// `[sessions]`: how long an idle conversation stays in memory before it is passivated.
    pub sessions: SessionsConfig,
    /// `[agents]`: where agent definitions are read, who routes, the bounds of dispatches.
    pub agents: AgentsConfig,
    /// `[modules]`: where module definitions (I/O gateways, A10) are read.
    pub modules: ModulesConfig,
    /// `[tools]`: the global layer of every task's tool policy, and `[tools.roles.<role>]`
    /// the layer of the agents with that role (A5).
    pub tools: troupe_proto::governance::ToolPolicyConfig,
    /// `[capabilities]`: the capability registry's directory and context budget (A6).
    pub capabilities: CapabilitiesConfig,
    /// `[store]`: where `troupe serve` keeps sessions, messages and rollouts (SQLite in
    /// `data_dir`, or a PostgreSQL server).
    pub store: StoreConfig,
    /// `[cluster]`: this process as one node of several sharing a PostgreSQL database (off
    /// unless `node` is set).
    pub cluster: ClusterConfig,
    /// The file this configuration was read from (`None`: defaults and environment only):
    /// relative paths of `[agents]` are taken from its directory.
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
}

/// `[agents]`: the agents of a session (A1–A4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    /// The directory of definition files (`<id>.json` or `<id>.toml`). Default: `agents/`
    /// beside the configuration file (none without a file); a relative path is taken from
    /// the configuration file's directory.
    pub dir: Option<std::path::PathBuf>,
    /// The agent that routes the session's input (its model, instructions and workers).
    /// Default: the agent whose role is `supervisor`, else a built-in supervisor on the
    /// session's model that sees every agent.
    pub supervisor: Option<String>,
    /// How the supervisor decides: `model` (a `route` tool call) or `rules` (`@agent`
    /// mentions, else a direct reply). Default: `model` when a model endpoint or a script is
    /// configured, `rules` when nothing names a model.
    pub router: Option<RouterKind>,
    /// Most nested dispatches in one execution chain.
    pub max_depth: usize,
    /// How long a dispatch may run before its lease expires and the child is cancelled.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        Self {
            dir: None,
            supervisor: None,
            router: None,
            max_depth: troupe_proto::agent::DEFAULT_MAX_DEPTH,
            lease_ttl: Duration::from_secs(600),
        }
    }
}

/// `[capabilities]`: the capability registry (A6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilitiesConfig {
    /// The directory of capability folders. Default: `capabilities/` beside the
    /// configuration file (none without a file); a relative path is taken from the
    /// configuration file's directory.
    pub dir: Option<std::path::PathBuf>,
    /// Tokens the one-line summaries may take in the prompt, all together.
    pub prompt_tokens: usize,
    /// Tokens one `capability_inspect` answer may take.
    pub inspect_tokens: usize,
}

impl Default for CapabilitiesConfig {
    fn default() -> Self {
        let budget = troupe_proto::capability::CapabilityBudget::default();
        Self {
            dir: None,
            prompt_tokens: budget.prompt_tokens,
            inspect_tokens: budget.inspect_tokens,
        }
    }
}

impl CapabilitiesConfig {
    pub fn budget(&self) -> troupe_proto::capability::CapabilityBudget {
        troupe_proto::capability::CapabilityBudget {
            prompt_tokens: self.prompt_tokens,
            inspect_tokens: self.inspect_tokens,
        }
    }
}

/// `[modules]`: modules and I/O gateways (A10).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModulesConfig {
    /// The directory of modules: a folder per module holding `module.json`, or a file
    /// `<id>.json`. Default: `modules/` beside the configuration file (none without a file);
    /// a relative path is taken from the configuration file's directory.
    pub dir: Option<std::path::PathBuf>,
}

/// How a supervisor decides (`[agents] router`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterKind {
    Model,
    Rules,
}

impl TroupeConfig {
    /// The modules directory: `TROUPE_MODULES_DIR` (applied by [`Self::apply_env`] into
    /// `modules.dir`), else `[modules] dir` (relative to the configuration file), else
    /// `modules/` beside the configuration file; `None` without a file or a setting. The
    /// second value says whether it was named (a named directory must exist).
    pub fn modules_dir(&self) -> Option<(std::path::PathBuf, bool)> {
        self.dir_beside(self.modules.dir.as_ref(), "modules")
    }

    /// `named`, relative to the configuration file's directory, else `default` there.
    fn dir_beside(
        &self,
        named: Option<&std::path::PathBuf>,
        default: &str,
    ) -> Option<(std::path::PathBuf, bool)> {
        let base = self
            .source
            .as_deref()
            .and_then(std::path::Path::parent)
            .map(std::path::Path::to_path_buf);
        match (named, base) {
            (Some(dir), _) if dir.is_absolute() => Some((dir.clone(), true)),
            (Some(dir), Some(base)) => Some((base.join(dir), true)),
            (Some(dir), None) => Some((dir.clone(), true)),
            (None, Some(base)) => Some((base.join(default), false)),
            (None, None) => None,
        }
    }

    /// The agents directory: `TROUPE_AGENTS_DIR` (applied by [`Self::apply_env`] into
    /// `agents.dir`), else `[agents] dir` (relative to the configuration file), else
    /// `agents/` beside the configuration file; `None` without a file or a setting.
    /// The second value says whether it was named (a named directory must exist).
    pub fn agents_dir(&self) -> Option<(std::path::PathBuf, bool)> {
        self.dir_beside(self.agents.dir.as_ref(), "agents")
    }

    /// The capabilities directory: `TROUPE_CAPABILITIES_DIR` or `--capabilities-dir` (into
    /// `capabilities.dir`), else `[capabilities] dir` (relative to the configuration file),
    /// else `capabilities/` beside the configuration file; `None` without a file or a
    /// setting. The second value says whether it was named (a named directory must exist).
    pub fn capabilities_dir(&self) -> Option<(std::path::PathBuf, bool)> {
        self.dir_beside(self.capabilities.dir.as_ref(), "capabilities")
    }

    /// Sets the capabilities directory from the environment or a flag: as given, relative
    /// to the working directory.
    pub fn set_capabilities_dir(&mut self, dir: &str) {
        let dir = std::path::PathBuf::from(dir);
        self.capabilities.dir = Some(if dir.is_absolute() {
            dir
        } else {
            std::env::current_dir().unwrap_or_default().join(dir)
        });
    }
}

/// `[history]`: a conversation's history bounds (S6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Most items a conversation's history holds, its summary included.
    pub max_items: usize,
    /// Most approximate tokens it holds, its summary included.
    pub max_tokens: usize,
    /// Who writes the summary of trimmed items: `local` or `model`.
    pub summarizer: SummarizerKind,
    /// How long a model summary may take before the local one stays.
    #[serde(with = "humantime_serde")]
    pub summary_timeout: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        let limits = troupe_actors::history::HistoryLimits::default();
        Self {
            max_items: limits.max_items,
            max_tokens: limits.max_tokens,
            summarizer: SummarizerKind::Local,
            summary_timeout: Duration::from_secs(60),
        }
    }
}

/// Who writes the summary of a conversation's trimmed history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SummarizerKind {
    /// A local digest (role and start of each item), written at once.
    Local,
    /// The conversation's model, asked outside its mailbox; the local digest stands in until
    /// it answers, and stays if it fails or times out.
    Model,
}

/// `[conversation]`: timeouts of every conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConversationConfig {
    /// How long a cancelled task (by close, cancel-all or `task.cancel`) may take to stop
    /// before it is aborted.
    #[serde(with = "humantime_serde")]
    pub close_timeout: Duration,
    /// How long an approval request waits for a human before it is denied.
    #[serde(with = "humantime_serde")]
    pub approval_timeout: Duration,
}

impl Default for ConversationConfig {
    fn default() -> Self {
        Self {
            close_timeout: Duration::from_secs(5),
            approval_timeout: Duration::from_secs(300),
        }
    }
}

/// `[sessions]`: what a session keeps in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// A conversation idle this long (no task running or queued, and so no approval pending)
    /// is passivated: stopped and kept only in the store, its session keeping a small index
    /// entry; its next request reactivates it with its history window. Zero (the default):
    /// never.
    #[serde(with = "humantime_serde")]
    pub passivate_after: Duration,
}

impl SessionsConfig {
    /// `passivate_after` as the conversations take it (`None`: never).
    pub fn passivation(&self) -> Option<Duration> {
        Some(self.passivate_after).filter(|d| !d.is_zero())
    }
}

/// The `troupe serve` flags of the history and conversation settings, as given (`None`: not
/// given). They win over the file and the environment ([`TroupeConfig::apply_conversation_flags`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConversationFlags {
    pub history_max_items: Option<String>,
    pub history_max_tokens: Option<String>,
    pub summarizer: Option<String>,
    pub close_timeout: Option<String>,
    pub approval_timeout: Option<String>,
    pub passivate_after: Option<String>,
}

/// Whether the provider, or an endpoint, was named somewhere, so that a base URL or an
/// `OPENAI_*` variable given without a provider picks an OpenAI-compatible server instead of
/// the scripted model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelNamed {
    /// `provider` in the file, `TROUPE_PROVIDER` or `--provider`.
    pub provider: bool,
    /// `base_url` in the file, `TROUPE_BASE_URL`, `OPENAI_BASE_URL`, `--base-url`, or a set
    /// `OPENAI_API_KEY`.
    pub endpoint: bool,
}

impl Default for TroupeConfig {
    fn default() -> Self {
        Self {
            data_dir: "data".into(),
            log_dir: "history".into(),
            ttl_sweep_interval: Duration::from_secs(60),
            model: ModelConfig::default(),
            chat: ChatConfig::default(),
            mcp: McpConfig::default(),
            server: ServerConfig::default(),
            telemetry: TelemetryConfig::default(),
            named: ModelNamed::default(),
            history: HistoryConfig::default(),
            conversation: ConversationConfig::default(),
            sessions: SessionsConfig::default(),
            agents: AgentsConfig::default(),
            modules: ModulesConfig::default(),
            tools: troupe_proto::governance::ToolPolicyConfig::default(),
            capabilities: CapabilitiesConfig::default(),
            store: StoreConfig::default(),
            cluster: ClusterConfig::default(),
            source: None,
        }
    }
}

/// Which database `troupe serve` keeps its state in (`[store] backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum StoreBackend {
    /// `<data_dir>/troupe.db` and `<data_dir>/rollout.db`, embedded: one node.
    #[default]
    Sqlite,
    /// A PostgreSQL server at `postgres_url`, which several nodes can share.
    Postgres,
}

/// `[store]`: where `troupe serve` keeps its durable state.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (the default) or `postgres`.
    pub backend: StoreBackend,
    /// The server of the `postgres` backend, as a connection URL
    /// (`postgresql://user:password@host:port/database`, libpq's key=value form works too).
    /// Never printed by `Debug`: it may hold a password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_url: Option<String>,
    /// Connections the store keeps to the server at most (the rollout has 4 more).
    pub postgres_pool_size: usize,
    /// SQLite: fsync the WAL at every commit of `troupe.db` and at every task's end in
    /// `rollout.db`, so that acknowledged work also survives a power loss or a crash of the
    /// machine. Off by default: every commit survives a crash of the process (`kill -9`,
    /// a panic, the OOM killer) without an fsync on the turn's path.
    pub power_loss_durable: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sqlite,
            postgres_url: None,
            postgres_pool_size: 8,
            power_loss_durable: false,
        }
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("backend", &self.backend)
            .field(
                "postgres_url",
                &self.postgres_url.as_ref().map(|_| "<redacted>"),
            )
            .field("postgres_pool_size", &self.postgres_pool_size)
            .field("power_loss_durable", &self.power_loss_durable)
            .finish()
    }
}

/// `[cluster]`: several `troupe serve` processes (nodes) sharing one PostgreSQL database.
/// Each session is owned by one node at a time through a lease with a fencing token; a node
/// that dies loses its leases after `lease_ttl` and another node takes its sessions over.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, unique among the nodes (`None`: one node alone, no cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// ip:port the node transport listens on (a build with the `cluster` feature): set, the
    /// node joins the others over ractor_cluster; unset, the nodes meet through PostgreSQL
    /// alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Other nodes' cluster addresses (host:port) to join at start.
    pub seeds: Vec<String>,
    /// The secret every node of the cluster shares. Never printed by `Debug`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// The shared database; defaults to `[store] postgres_url`. Never printed by `Debug`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_url: Option<String>,
    /// Where the other nodes reach this node's API (`http://host:port`), to forward calls for
    /// its sessions; default `http://` + the address `troupe serve` listens on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// How long a session's lease lasts without renewal (renewed three times per ttl): how
    /// long a dead node's sessions wait before another node takes them over.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How often the node looks for sessions with unfinished messages that no live node
    /// holds (a dead node's); unset: every `lease_ttl`. With the node transport, a node's
    /// departure or loss starts a scan of its own, so this is only the backstop.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub scan_every: Option<Duration>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            node: None,
            listen: None,
            seeds: Vec::new(),
            cookie: None,
            postgres_url: None,
            api_url: None,
            lease_ttl: Duration::from_secs(15),
            scan_every: None,
        }
    }
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("ClusterConfig")
            .field("node", &self.node)
            .field("listen", &self.listen)
            .field("seeds", &self.seeds)
            .field("cookie", &redacted(&self.cookie))
            .field("postgres_url", &redacted(&self.postgres_url))
            .field("api_url", &self.api_url)
            .field("lease_ttl", &self.lease_ttl)
            .field("scan_every", &self.scan_every)
            .finish()
    }
}

/// The `troupe serve` flags of `[cluster]`, as given (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFlags {
    pub node: Option<String>,
    pub listen: Option<String>,
    pub seeds: Option<String>,
    pub lease_ttl: Option<String>,
}

/// How a clustered node keeps its state: its name, the shared database, the lease ttl.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub node: String,
    pub postgres_url: String,
    pub lease_ttl: Duration,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("node", &self.node)
            .field("lease_ttl", &self.lease_ttl)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// Applies `[cluster]` flags or variables (`names`: node, listen, seeds, lease_ttl).
    fn apply(&mut self, given: &ClusterFlags, names: [&str; 4]) -> Result<(), ConfigError> {
        if let Some(v) = &given.node {
            self.node = Some(v.clone());
        }
        if let Some(v) = &given.listen {
            self.listen = Some(v.clone());
        }
        if let Some(v) = &given.seeds {
            self.seeds = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(v) = &given.lease_ttl {
            self.lease_ttl = parse_duration(names[3], v)?;
        }
        Ok(())
    }

    /// This node, when `[cluster] node` is set: `None` alone; an error when the cluster is
    /// configured but cannot work (no database, an empty name, a zero ttl).
    pub fn node(&self, store: &StoreConfig) -> Result<Option<ClusterNode>, ConfigError> {
        let Some(node) = &self.node else {
            return Ok(None);
        };
        let invalid = |message: String| ConfigError::Cluster { message };
        let node = node.trim();
        if node.is_empty() || node.len() > 64 {
            return Err(invalid(
                "node must be a name of 1 to 64 characters".to_owned(),
            ));
        }
        let postgres_url = self
            .postgres_url
            .clone()
            .or_else(|| store.postgres_url.clone())
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "a node needs the shared PostgreSQL database: set [cluster] postgres_url, \
                     [store] postgres_url or TROUPE_POSTGRES_URL"
                        .to_owned(),
                )
            })?;
        if self.lease_ttl < Duration::from_millis(100) {
            return Err(invalid("lease_ttl must be at least 100ms".to_owned()));
        }
        Ok(Some(ClusterNode {
            node: node.to_owned(),
            postgres_url,
            lease_ttl: self.lease_ttl,
        }))
    }
}

/// MCP servers of a session: one process (or connection) per server, shared by every
/// conversation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// `[[mcp.servers]]` tables: `name`, `type = "stdio"` with `command`, `args`, `env`,
    /// `cwd`, or `type = "streamable_http"` with `url`, `headers`.
    pub servers: Vec<troupe_actors::ports::McpServerConfig>,
    /// Workspace roots offered to servers (absolute paths).
    pub roots: Vec<String>,
    /// `[mcp.limits]`: bounds of the session's pool.
    pub limits: McpLimitsConfig,
}

/// `[mcp.limits]`; every key is optional and defaults to `McpLimits::default()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpLimitsConfig {
    /// How long a server nobody uses stays up.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// First restart delay of a dead server; doubles per failure up to `restart_backoff_max`.
    #[serde(with = "humantime_serde")]
    pub restart_backoff_base: Duration,
    /// The longest restart delay; a connection that stays up this long resets the delay.
    #[serde(with = "humantime_serde")]
    pub restart_backoff_max: Duration,
    /// Calls of one conversation in flight at once.
    pub per_conversation_concurrency: usize,
    /// Calls of one conversation per second (`0` = no rate limit), with a burst.
    pub per_conversation_rate: f64,
    pub per_conversation_burst: u32,
    /// Calls of the whole session in flight at once.
    pub session_concurrency: usize,
    /// How long a call waits for a slot or a rate token before `overloaded`.
    #[serde(with = "humantime_serde")]
    pub wait_bound: Duration,
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for McpLimitsConfig {
    fn default() -> Self {
        let d = troupe_actors::mcp_pool::McpLimits::default();
        let rate = d.per_conversation_rate;
        Self {
            idle_timeout: d.idle_timeout,
            restart_backoff_base: d.restart_backoff_base,
            restart_backoff_max: d.restart_backoff_max,
            per_conversation_concurrency: d.per_conversation_concurrency,
            per_conversation_rate: rate.map_or(0.0, |r| r.per_second),
            per_conversation_burst: rate.map_or(1, |r| r.burst),
            session_concurrency: d.session_concurrency,
            wait_bound: d.wait_bound,
            call_timeout: d.call_timeout,
            connect_timeout: d.connect_timeout,
        }
    }
}

impl McpLimitsConfig {
    /// The pool's limits (checked when the pool starts).
    pub fn limits(&self) -> troupe_actors::mcp_pool::McpLimits {
        troupe_actors::mcp_pool::McpLimits {
            idle_timeout: self.idle_timeout,
            restart_backoff_base: self.restart_backoff_base,
            restart_backoff_max: self.restart_backoff_max,
            per_conversation_concurrency: self.per_conversation_concurrency,
            per_conversation_rate: (self.per_conversation_rate != 0.0).then_some(
                troupe_actors::mcp_pool::Rate {
                    per_second: self.per_conversation_rate,
                    burst: self.per_conversation_burst,
                },
            ),
            session_concurrency: self.session_concurrency,
            wait_bound: self.wait_bound,
            call_timeout: self.call_timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// `[server]`: how `troupe serve` listens, whom it lets in, and its limits.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// `host:port`; port 0 picks a free one (the bound address is printed).
    pub listen: String,
    /// Bearer tokens and the projects each may touch. None: the API is open, and only a
    /// loopback address may be bound.
    pub tokens: Vec<ApiToken>,
    /// How long running tasks may take to finish after SIGTERM/SIGINT before they are
    /// cancelled.
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// Largest request body in bytes; a larger one is answered 413.
    pub body_limit: usize,
    /// Serve `/metrics` without a token (for a scraper on a trusted network).
    pub metrics_public: bool,
    /// Tasks that may run at once in one session (1 = single-flight).
    pub max_running_tasks: usize,
    /// Tasks of a session that may wait for a slot; one more is `Overloaded` at once.
    pub task_queue: usize,
    /// Messages that may wait behind a conversation's running task.
    pub conversation_queue: usize,
    /// Largest page of messages a listing returns.
    pub max_page: usize,
    /// Host names the service answers to besides its own address (`localhost`, and the
    /// loopback or bound IP address, with the port): `name` (any port) or `name:port`; `"*"`
    /// turns the Host check off (a proxy in front checks it). Another Host is refused 403.
    pub allowed_hosts: Vec<String>,
    /// Longest wait for a whole request head once its first byte arrived; then the
    /// connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest wait for a whole request body, from its head; then 408.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// How long a connection may wait for its next request (keep-alive) before it is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Connections open at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// Origins (`https://console.example.com`) whose web pages may send requests that change
    /// state or open WebSockets, besides the service's own (`http://` + an allowed host).
    pub allowed_origins: Vec<String>,
    /// The A2A endpoint (`[server.a2a]`).
    pub a2a: A2aServerConfig,
    /// The web console (`[server.console]`).
    pub console: ConsoleConfig,
}

/// `[server.console]`: the web console `troupe serve` serves at `/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console (its pages at `/` and `/sessions/{id}`, its assets, sign-in).
    pub enabled: bool,
    /// A link to a task's trace: a URL with `{trace_id}` where the trace id goes (a Jaeger
    /// or Grafana Tempo page); none: the trace id is shown without a link.
    pub trace_url: Option<String>,
    /// How long a console sign-in lasts (the cookie's lifetime).
    #[serde(with = "humantime_serde")]
    pub sign_in_ttl: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            trace_url: None,
            sign_in_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

/// `[server.a2a]`: the A2A protocol endpoint of `troupe serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aServerConfig {
    /// Serve the agent card and `POST /a2a`.
    pub enabled: bool,
    /// The project whose current session runs every A2A context (created on first start).
    /// Only tokens bound to this project (or `*`) may call the endpoint.
    pub project: String,
    /// The agent's name on its card.
    pub name: String,
    /// Absolute URL of the JSON-RPC endpoint written into the card (behind a proxy);
    /// default: from the request's Host header.
    pub public_url: Option<String>,
    /// A context's conversation closes after this long without activity and reopens, with
    /// its history, on the context's next message.
    #[serde(with = "humantime_serde")]
    pub idle_close: Duration,
    /// Finished A2A tasks kept in the store for GetTask and ListTasks; older ones are
    /// forgotten (with their push configs, and contexts left without a task).
    pub keep_finished: usize,
    /// The storage policy of every context's conversation (and so of the endpoint's task
    /// records); default: `chat.storage_policy`, as a session's root conversation.
    pub storage_policy: Option<troupe_proto::StoragePolicy>,
    /// Instructions of every context's conversation (the form of its replies, say).
    pub instructions: Option<String>,
}

impl A2aServerConfig {
    /// What every context's conversation is opened with: the chat conversation's tools
    /// (shell, plan) and `apply_patch` (whose patches become the task's files), the storage
    /// policy (this section's, else `chat`'s), the instructions.
    pub fn conversation(&self, chat: &ChatConfig) -> troupe_proto::OpenConversation {
        let mut open =
            crate::assembly::chat_conversation(self.storage_policy.unwrap_or(chat.storage_policy));
        open.include_apply_patch_tool = true;
        open.base_instructions.clone_from(&self.instructions);
        open
    }
}

impl Default for A2aServerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            project: "a2a".into(),
            name: "troupe".into(),
            public_url: None,
            idle_close: Duration::from_secs(600),
            keep_finished: 10_000,
            storage_policy: None,
            instructions: None,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7878".into(),
            tokens: Vec::new(),
            grace_period: Duration::from_secs(30),
            body_limit: 1024 * 1024,
            metrics_public: false,
            max_running_tasks: 1,
            task_queue: 64,
            conversation_queue: 16,
            max_page: 1000,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            a2a: A2aServerConfig::default(),
            console: ConsoleConfig::default(),
        }
    }
}

// By hand so tokens never reach a log line.
impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("tokens", &self.tokens)
            .field("grace_period", &self.grace_period)
            .field("body_limit", &self.body_limit)
            .field("metrics_public", &self.metrics_public)
            .field("max_running_tasks", &self.max_running_tasks)
            .field("task_queue", &self.task_queue)
            .field("conversation_queue", &self.conversation_queue)
            .field("max_page", &self.max_page)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .field("a2a", &self.a2a)
            .field("console", &self.console)
            .finish()
    }
}

/// One API token: the secret (inline or from an environment variable) and the projects it
/// may read and write. `"*"` among the projects lets it touch every project and sessions
/// outside any project.
#[derive(Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiToken {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Name of the environment variable holding the token.
    pub token_env: Option<String>,
    pub projects: Vec<String>,
}

impl ApiToken {
    /// The secret: `token`, else the variable `token_env` names (empty counts as unset).
    pub fn secret(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        self.token
            .clone()
            .or_else(|| self.token_env.as_deref().and_then(env))
            .filter(|t| !t.is_empty())
    }
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_env", &self.token_env)
            .field("projects", &self.projects)
            .finish()
    }
}

/// Parses `TROUPE_API_TOKENS`: `secret=projA,projB;other=*`.
pub fn parse_tokens(name: &str, value: &str) -> Result<Vec<ApiToken>, ConfigError> {
    let bad = || ConfigError::Value {
        name: name.to_owned(),
        value: "<redacted>".to_owned(),
        expected: "token=project,project;token=*",
    };
    value
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let (token, projects) = entry.split_once('=').ok_or_else(bad)?;
            let projects: Vec<String> = projects
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect();
            if token.trim().is_empty() || projects.is_empty() {
                return Err(bad());
            }
            Ok(ApiToken {
                token: Some(token.trim().to_owned()),
                token_env: None,
                projects,
            })
        })
        .collect()
}

/// A configuration problem, with where it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The reason is in the message, not chained as a source: printed with its chain (as the
    /// CLI prints errors), it would appear twice.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        path: std::path::PathBuf,
        reason: std::io::Error,
    },
    #[error("bad config file {path}: {message}")]
    Parse {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("bad value for {name}: `{value}` ({expected})")]
    Value {
        name: String,
        value: String,
        expected: &'static str,
    },
    #[error("cannot export spans to {url}: {message}")]
    Telemetry { url: String, message: String },
    #[error("[cluster]: {message}")]
    Cluster { message: String },
}

/// The environment variables read, and what they set.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("TROUPE_DATA_DIR", "data_dir"),
    ("TROUPE_LOG_DIR", "log_dir"),
    ("TROUPE_TTL_SWEEP_INTERVAL", "ttl_sweep_interval"),
    ("TROUPE_PROVIDER", "model.provider"),
    ("TROUPE_BASE_URL", "model.base_url"),
    ("TROUPE_MODEL", "model.model"),
    ("TROUPE_API_KEY_ENV", "model.api_key_env"),
    ("TROUPE_TOOL_MODE", "model.tool_mode"),
    ("TROUPE_MAX_STEPS", "chat.max_steps"),
    ("TROUPE_MAX_PROMPT_TOKENS", "chat.max_prompt_tokens"),
    ("TROUPE_WARN_PROMPT_TOKENS", "chat.warn_prompt_tokens"),
    ("TROUPE_OVER_BUDGET", "chat.over_budget"),
    ("TROUPE_TOKENIZER_MODEL", "chat.tokenizer_model"),
    ("TROUPE_COMMAND_TIMEOUT", "chat.command_timeout"),
    ("TROUPE_MAX_COMMAND_TIMEOUT", "chat.max_command_timeout"),
    (
        "OPENAI_BASE_URL",
        "model.base_url when TROUPE_BASE_URL is unset; picks openai-chat unless a provider is named",
    ),
    (
        "OPENAI_API_KEY",
        "the default key; when set, picks openai-chat unless a provider is named",
    ),
    ("TROUPE_LISTEN", "server.listen"),
    (
        "TROUPE_API_TOKENS",
        "server.tokens (token=project,project;token=*)",
    ),
    ("TROUPE_GRACE_PERIOD", "server.grace_period"),
    ("TROUPE_BODY_LIMIT", "server.body_limit"),
    ("TROUPE_METRICS_PUBLIC", "server.metrics_public"),
    (
        "TROUPE_ALLOWED_HOSTS",
        "server.allowed_hosts (comma-separated)",
    ),
    (
        "TROUPE_ALLOWED_ORIGINS",
        "server.allowed_origins (comma-separated)",
    ),
    ("TROUPE_A2A", "server.a2a.enabled"),
    ("TROUPE_A2A_PROJECT", "server.a2a.project"),
    ("TROUPE_A2A_PUBLIC_URL", "server.a2a.public_url"),
    ("TROUPE_A2A_IDLE_CLOSE", "server.a2a.idle_close"),
    ("TROUPE_CONSOLE", "server.console.enabled"),
    ("TROUPE_CONSOLE_TRACE_URL", "server.console.trace_url"),
    ("TROUPE_HISTORY_MAX_ITEMS", "history.max_items"),
    ("TROUPE_HISTORY_MAX_TOKENS", "history.max_tokens"),
    ("TROUPE_SUMMARIZER", "history.summarizer"),
    ("TROUPE_SUMMARY_TIMEOUT", "history.summary_timeout"),
    ("TROUPE_CLOSE_TIMEOUT", "conversation.close_timeout"),
    ("TROUPE_APPROVAL_TIMEOUT", "conversation.approval_timeout"),
    ("TROUPE_PASSIVATE_AFTER", "sessions.passivate_after"),
    ("TROUPE_AGENTS_DIR", "agents.dir"),
    ("TROUPE_CAPABILITIES_DIR", "capabilities.dir"),
    ("TROUPE_MODULES_DIR", "modules.dir"),
    ("TROUPE_STORE_BACKEND", "store.backend (sqlite or postgres)"),
    ("TROUPE_POSTGRES_URL", "store.postgres_url"),
    ("TROUPE_NODE", "cluster.node"),
    ("TROUPE_CLUSTER_LISTEN", "cluster.listen"),
    ("TROUPE_CLUSTER_SEEDS", "cluster.seeds (comma-separated)"),
    ("TROUPE_CLUSTER_COOKIE", "cluster.cookie"),
    ("TROUPE_CLUSTER_POSTGRES_URL", "cluster.postgres_url"),
    ("TROUPE_LEASE_TTL", "cluster.lease_ttl"),
    ("TROUPE_CLUSTER_API_URL", "cluster.api_url"),
    ("TROUPE_CLUSTER_SCAN_EVERY", "cluster.scan_every"),
];

impl TroupeConfig {
    /// Reads a TOML file (every key optional).
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.to_owned(),
            reason,
        })?;
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        };
        let table: toml::Table = toml::from_str(&text).map_err(parse_error)?;
        let model = table.get("model").and_then(toml::Value::as_table);
        let has = |key: &str| model.is_some_and(|m| m.contains_key(key));
        let named = ModelNamed {
            provider: has("provider"),
            endpoint: has("base_url"),
        };
        let mut config: Self = toml::from_str(&text).map_err(parse_error)?;
        config.tools.validate().map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: format!("tools.{}: {}", e.field, e.message),
        })?;
        if config.model.max_response_bytes == 0 {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: "model.max_response_bytes must be at least 1 (no response fits in 0)"
                    .to_owned(),
            });
        }
        if config.chat.max_steps == 0 {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: "chat.max_steps must be at least 1 (a turn of no step answers nothing)"
                    .to_owned(),
            });
        }
        if config.chat.max_prompt_tokens == Some(0) {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: format!("chat.max_prompt_tokens must be {MAX_PROMPT_TOKENS_EXPECTED}"),
            });
        }
        if config.conversation.approval_timeout.is_zero() {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: "conversation.approval_timeout must be longer than 0s (a request \
                          nobody can answer in time is denied)"
                    .to_owned(),
            });
        }
        for (key, value) in [
            ("chat.command_timeout", config.chat.command_timeout),
            ("chat.max_command_timeout", config.chat.max_command_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Parse {
                    path: path.to_owned(),
                    message: format!("{key} must be longer than 0s (no command could run)"),
                });
            }
        }
        // Like the agents, modules and capabilities directories, a relative `data_dir` or
        // `log_dir` the file names is taken from the file's directory, wherever troupe is
        // started from (the defaults, named nowhere, stay relative to the working directory).
        let base = path.parent().unwrap_or(std::path::Path::new(""));
        for (key, dir) in [
            ("data_dir", &mut config.data_dir),
            ("log_dir", &mut config.log_dir),
        ] {
            if table.contains_key(key) && dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        config.named = named;
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// The file to read: `explicit`, else `$TROUPE_CONFIG`, else `./troupe.toml` if present.
    pub fn locate(
        explicit: Option<&std::path::Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<std::path::PathBuf> {
        if let Some(p) = explicit {
            return Some(p.to_owned());
        }
        if let Some(p) = env("TROUPE_CONFIG").filter(|p| !p.is_empty()) {
            return Some(p.into());
        }
        let local = std::path::Path::new("troupe.toml");
        local.exists().then(|| local.to_owned())
    }

    /// Applies the `TROUPE_*` variables (see [`ENV_VARS`]) and the standard `OTEL_*` ones
    /// (see [`OTEL_ENV_VARS`]) over the file's values.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let get = |name: &str| env(name).filter(|v| !v.is_empty());
        if let Some(v) = get("TROUPE_DATA_DIR") {
            self.data_dir = v.into();
        }
        if let Some(v) = get("TROUPE_LOG_DIR") {
            self.log_dir = v.into();
        }
        if let Some(v) = get("TROUPE_TTL_SWEEP_INTERVAL") {
            self.ttl_sweep_interval = parse_duration("TROUPE_TTL_SWEEP_INTERVAL", &v)?;
        }
        if let Some(v) = get("TROUPE_PROVIDER") {
            self.model.provider = parse_enum(
                "TROUPE_PROVIDER",
                &v,
                "scripted, openai-responses or openai-chat",
            )?;
            self.named.provider = true;
        }
        if let Some(v) = get("TROUPE_BASE_URL").or_else(|| get("OPENAI_BASE_URL")) {
            self.model.base_url = v;
            self.named.endpoint = true;
        }
        if get("OPENAI_API_KEY").is_some() {
            self.named.endpoint = true;
        }
        if let Some(v) = get("TROUPE_MODEL") {
            self.model.model = v;
        }
        if let Some(v) = get("TROUPE_API_KEY_ENV") {
            self.model.api_key_env = Some(v);
        }
        if let Some(v) = get("TROUPE_TOOL_MODE") {
            self.model.tool_mode = parse_enum("TROUPE_TOOL_MODE", &v, "native or text")?;
        }
        if let Some(v) = get("TROUPE_MAX_STEPS") {
            self.chat.max_steps = parse_steps("TROUPE_MAX_STEPS", &v)?;
        }
        if let Some(v) = get("TROUPE_MAX_PROMPT_TOKENS") {
            let tokens: u64 = parse_num("TROUPE_MAX_PROMPT_TOKENS", &v)?;
            if tokens == 0 {
                return Err(ConfigError::Value {
                    name: "TROUPE_MAX_PROMPT_TOKENS".to_owned(),
                    value: v,
                    expected: MAX_PROMPT_TOKENS_EXPECTED,
                });
            }
            self.chat.max_prompt_tokens = Some(tokens);
        }
        if let Some(v) = get("TROUPE_WARN_PROMPT_TOKENS") {
            self.chat.warn_prompt_tokens = Some(parse_num("TROUPE_WARN_PROMPT_TOKENS", &v)?);
        }
        if let Some(v) = get("TROUPE_OVER_BUDGET") {
            self.chat.over_budget = parse_enum("TROUPE_OVER_BUDGET", &v, "reject or trim")?;
        }
        if let Some(v) = get("TROUPE_TOKENIZER_MODEL") {
            self.chat.tokenizer_model = Some(v);
        }
        if let Some(v) = get("TROUPE_COMMAND_TIMEOUT") {
            self.chat.command_timeout = parse_positive_duration("TROUPE_COMMAND_TIMEOUT", &v)?;
        }
        if let Some(v) = get("TROUPE_MAX_COMMAND_TIMEOUT") {
            self.chat.max_command_timeout =
                parse_positive_duration("TROUPE_MAX_COMMAND_TIMEOUT", &v)?;
        }
        if let Some(v) = get("TROUPE_LISTEN") {
            self.server.listen = v;
        }
        if let Some(v) = get("TROUPE_API_TOKENS") {
            self.server.tokens = parse_tokens("TROUPE_API_TOKENS", &v)?;
        }
        if let Some(v) = get("TROUPE_GRACE_PERIOD") {
            self.server.grace_period = parse_duration("TROUPE_GRACE_PERIOD", &v)?;
        }
        if let Some(v) = get("TROUPE_BODY_LIMIT") {
            self.server.body_limit = parse_num("TROUPE_BODY_LIMIT", &v)?;
        }
        if let Some(v) = get("TROUPE_METRICS_PUBLIC") {
            self.server.metrics_public = parse_bool("TROUPE_METRICS_PUBLIC", &v)?;
        }
        if let Some(v) = get("TROUPE_ALLOWED_HOSTS") {
            self.server.allowed_hosts = split_list(&v);
        }
        if let Some(v) = get("TROUPE_ALLOWED_ORIGINS") {
            self.server.allowed_origins = split_list(&v);
        }
        if let Some(v) = get("TROUPE_A2A") {
            self.server.a2a.enabled = parse_bool("TROUPE_A2A", &v)?;
        }
        if let Some(v) = get("TROUPE_A2A_PROJECT") {
            self.server.a2a.project = v;
        }
        if let Some(v) = get("TROUPE_A2A_PUBLIC_URL") {
            self.server.a2a.public_url = Some(v);
        }
        if let Some(v) = get("TROUPE_A2A_IDLE_CLOSE") {
            self.server.a2a.idle_close = parse_duration("TROUPE_A2A_IDLE_CLOSE", &v)?;
        }
        if let Some(v) = get("TROUPE_CONSOLE") {
            self.server.console.enabled = parse_bool("TROUPE_CONSOLE", &v)?;
        }
        if let Some(v) = get("TROUPE_CONSOLE_TRACE_URL") {
            self.server.console.trace_url = Some(v).filter(|v| !v.trim().is_empty());
        }
        if let Some(v) = get("TROUPE_AGENTS_DIR") {
            // From the environment: as given (relative to the working directory).
            let dir = std::path::PathBuf::from(v);
            self.agents.dir = Some(if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().unwrap_or_default().join(dir)
            });
        }
        if let Some(v) = get("TROUPE_CAPABILITIES_DIR") {
            self.set_capabilities_dir(&v);
        }
        if let Some(v) = get("TROUPE_MODULES_DIR") {
            // From the environment: as given (relative to the working directory).
            let dir = std::path::PathBuf::from(v);
            self.modules.dir = Some(if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().unwrap_or_default().join(dir)
            });
        }
        if let Some(v) = get("TROUPE_STORE_BACKEND") {
            self.store.backend = parse_enum("TROUPE_STORE_BACKEND", &v, "sqlite or postgres")?;
        }
        if let Some(v) = get("TROUPE_POSTGRES_URL") {
            self.store.postgres_url = Some(v);
        }
        self.cluster.apply(
            &ClusterFlags {
                node: get("TROUPE_NODE"),
                listen: get("TROUPE_CLUSTER_LISTEN"),
                seeds: get("TROUPE_CLUSTER_SEEDS"),
                lease_ttl: get("TROUPE_LEASE_TTL"),
            },
            [
                "TROUPE_NODE",
                "TROUPE_CLUSTER_LISTEN",
                "TROUPE_CLUSTER_SEEDS",
                "TROUPE_LEASE_TTL",
            ],
        )?;
        if let Some(v) = get("TROUPE_CLUSTER_COOKIE") {
            self.cluster.cookie = Some(v);
        }
        if let Some(v) = get("TROUPE_CLUSTER_POSTGRES_URL") {
            self.cluster.postgres_url = Some(v);
        }
        if let Some(v) = get("TROUPE_CLUSTER_API_URL") {
            self.cluster.api_url = Some(v);
        }
        if let Some(v) = get("TROUPE_CLUSTER_SCAN_EVERY") {
            self.cluster.scan_every = Some(parse_duration("TROUPE_CLUSTER_SCAN_EVERY", &v)?);
        }
        self.telemetry.apply_env(env)?;
        self.apply_conversation_env(&get)?;
        Ok(())
    }

    /// The `[history]` and `[conversation]` variables.
    fn apply_conversation_env(
        &mut self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let flags = ConversationFlags {
            history_max_items: get("TROUPE_HISTORY_MAX_ITEMS"),
            history_max_tokens: get("TROUPE_HISTORY_MAX_TOKENS"),
            summarizer: get("TROUPE_SUMMARIZER"),
            close_timeout: get("TROUPE_CLOSE_TIMEOUT"),
            approval_timeout: get("TROUPE_APPROVAL_TIMEOUT"),
            passivate_after: get("TROUPE_PASSIVATE_AFTER"),
        };
        self.apply_conversation_settings(&flags, &ENV_NAMES)?;
        if let Some(v) = get("TROUPE_SUMMARY_TIMEOUT") {
            self.history.summary_timeout = parse_duration("TROUPE_SUMMARY_TIMEOUT", &v)?;
        }
        Ok(())
    }

    /// Applies the `troupe serve` flags of the history and conversation settings: called after
    /// [`load`](Self::load), so a flag wins over the environment, which wins over the file.
    pub fn apply_conversation_flags(
        &mut self,
        flags: &ConversationFlags,
    ) -> Result<(), ConfigError> {
        self.apply_conversation_settings(flags, &FLAG_NAMES)
    }

    fn apply_conversation_settings(
        &mut self,
        given: &ConversationFlags,
        names: &[&str; 6],
    ) -> Result<(), ConfigError> {
        if let Some(v) = &given.history_max_items {
            self.history.max_items = parse_num(names[0], v)?;
        }
        if let Some(v) = &given.history_max_tokens {
            self.history.max_tokens = parse_num(names[1], v)?;
        }
        if let Some(v) = &given.summarizer {
            self.history.summarizer = parse_enum(names[2], v, "local or model")?;
        }
        if let Some(v) = &given.close_timeout {
            self.conversation.close_timeout = parse_duration(names[3], v)?;
        }
        if let Some(v) = &given.approval_timeout {
            // Zero would deny every request before anyone could see it.
            self.conversation.approval_timeout = parse_positive_duration(names[4], v)?;
        }
        if let Some(v) = &given.passivate_after {
            self.sessions.passivate_after = parse_duration(names[5], v)?;
        }
        Ok(())
    }

    /// Applies the `troupe serve` flags of `[cluster]` (after [`load`](Self::load): a flag
    /// wins over the environment, which wins over the file).
    pub fn apply_cluster_flags(&mut self, flags: &ClusterFlags) -> Result<(), ConfigError> {
        self.cluster.apply(
            flags,
            ["--node", "--cluster-listen", "--seeds", "--lease-ttl"],
        )
    }

    /// The provider once the flags are applied: the one named (file < environment < flags),
    /// else `openai-chat` when an endpoint is named (a base URL, `OPENAI_BASE_URL`,
    /// `OPENAI_API_KEY`), else the scripted model. Bins record their `--provider` and
    /// `--base-url` flags in [`Self::named`] before calling this.
    pub fn choose_provider(&mut self) {
        self.model.provider = choose_provider(self.model.provider, self.named);
    }

    /// One line for stderr saying which model answers: provider, base URL (without
    /// credentials or query, which may carry keys) and model, or the scripted model.
    pub fn model_line(&self) -> String {
        match self.model.provider {
            // Chosen (`provider = "scripted"`, `--provider scripted`), or fallen back to.
            Provider::Scripted if self.named.provider => {
                "model: the built-in scripted model (provider = scripted)".to_owned()
            }
            Provider::Scripted => {
                "no model endpoint configured; using the built-in scripted model".to_owned()
            }
            p => format!(
                "model: {} at {}, model {}",
                provider_name(p),
                reqwest::Url::parse(&self.model.base_url).map_or_else(
                    |_| "an invalid base URL".to_owned(),
                    |url| crate::openai::shown_url(&url)
                ),
                self.model.model
            ),
        }
    }

    /// A warning when requests to a remote model server will carry no API key because the
    /// variable `api_key_env` names is unset (`env` reads the environment): the server's 401
    /// would otherwise be the first sign. A server on this machine often needs none, and
    /// `api_key_env = ""` says none is wanted.
    pub fn key_notice(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        let model = &self.model;
        if model.provider == Provider::Scripted
            || model.api_key.as_ref().is_some_and(|k| !k.is_empty())
        {
            return None;
        }
        let name = model
            .api_key_env
            .as_deref()
            .filter(|n| !n.trim().is_empty())?;
        let local = reqwest::Url::parse(&model.base_url)
            .ok()
            .and_then(|url| url.host_str().map(crate::openai::is_loopback))
            .unwrap_or(false);
        let unset = env(name).is_none_or(|v| v.trim().is_empty());
        (unset && !local).then(|| {
            format!(
                "{name} is not set: requests to the model carry no API key (set it, or api_key_env = \"\" if the server wants none)"
            )
        })
    }

    /// Loads the file (if any) and applies the environment: everything but the flags.
    pub fn load(
        explicit: Option<&std::path::Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = match Self::locate(explicit, env) {
            Some(path) => Self::from_file(&path)?,
            None => Self::default(),
        };
        config.apply_env(env)?;
        Ok(config)
    }
}

/// The provider: `current` when one was named, else `openai-chat` when an endpoint was named,
/// else the scripted model.
pub fn choose_provider(current: Provider, named: ModelNamed) -> Provider {
    match (named.provider, named.endpoint) {
        (true, _) => current,
        (false, true) => Provider::OpenaiChat,
        (false, false) => Provider::Scripted,
    }
}

/// The provider's name as the configuration spells it.
pub const fn provider_name(provider: Provider) -> &'static str {
    match provider {
        Provider::Scripted => "scripted",
        Provider::OpenaiResponses => "openai-responses",
        Provider::OpenaiChat => "openai-chat",
    }
}
/// The names errors give for the [`ConversationFlags`] fields, read from the environment...
const ENV_NAMES: [&str; 6] = [
    "TROUPE_HISTORY_MAX_ITEMS",
    "TROUPE_HISTORY_MAX_TOKENS",
    "TROUPE_SUMMARIZER",
    "TROUPE_CLOSE_TIMEOUT",
    "TROUPE_APPROVAL_TIMEOUT",
    "TROUPE_PASSIVATE_AFTER",
];

/// ...and given as flags.
const FLAG_NAMES: [&str; 6] = [
    "--history-max-items",
    "--history-max-tokens",
    "--summarizer",
    "--close-timeout",
    "--approval-timeout",
    "--passivate-after",
];

/// A comma-separated list, trimmed, without empty items.
fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses a unit-variant enum from its serde name (`openai-chat`, `trim`, ...).
pub fn parse_enum<T: serde::de::DeserializeOwned>(
    name: &str,
    value: &str,
    expected: &'static str,
) -> Result<T, ConfigError> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(value))
        .map_err(|_| ConfigError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            expected,
        })
}

/// What a prompt bound must be: no prompt fits in zero tokens.
const MAX_PROMPT_TOKENS_EXPECTED: &str =
    "a whole number of tokens, at least 1 (no prompt fits in 0)";

/// A duration longer than zero.
fn parse_positive_duration(name: &str, value: &str) -> Result<Duration, ConfigError> {
    match parse_duration(name, value)? {
        d if d.is_zero() => Err(ConfigError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: "a duration longer than 0s",
        }),
        d => Ok(d),
    }
}

/// A humantime duration (`30s`, `2m`).
pub fn parse_duration(name: &str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value).map_err(|_| ConfigError::Value {
        name: name.to_owned(),
        value: value.to_owned(),
        expected: "a duration such as 30s or 2m",
    })
}

fn parse_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(ConfigError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: "true or false",
        }),
    }
}

/// A step limit: a whole number of at least 1 (a turn of no step answers nothing).
fn parse_steps(name: &str, value: &str) -> Result<u32, ConfigError> {
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ConfigError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: "a whole number of at least 1",
        }),
    }
}

fn parse_num<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ConfigError> {
    value.parse().map_err(|_| ConfigError::Value {
        name: name.to_owned(),
        value: value.to_owned(),
        expected: "a whole number",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn command_timeouts_come_from_the_file_then_the_environment() {
        let c = TroupeConfig::default();
        assert_eq!(c.chat.command_timeout, Duration::from_secs(60));
        assert_eq!(c.chat.max_command_timeout, Duration::from_secs(600));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            "[chat]\ncommand_timeout = \"2m\"\nmax_command_timeout = \"30m\"\n",
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.chat.command_timeout, Duration::from_secs(120));
        assert_eq!(c.chat.max_command_timeout, Duration::from_secs(1800));
        let c = TroupeConfig::load(
            Some(&path),
            &env(&[
                ("TROUPE_COMMAND_TIMEOUT", "90s"),
                ("TROUPE_MAX_COMMAND_TIMEOUT", "5m"),
            ]),
        )
        .unwrap();
        assert_eq!(c.chat.command_timeout, Duration::from_secs(90));
        assert_eq!(c.chat.max_command_timeout, Duration::from_secs(300));
        for bad in [
            ("TROUPE_COMMAND_TIMEOUT", "0s"),
            ("TROUPE_MAX_COMMAND_TIMEOUT", "soon"),
        ] {
            assert!(
                TroupeConfig::load(Some(&path), &env(&[bad])).is_err(),
                "{bad:?}"
            );
        }
        std::fs::write(&path, "[chat]\nmax_command_timeout = \"0s\"\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[])).unwrap_err();
        assert!(
            e.to_string()
                .contains("chat.max_command_timeout must be longer than 0s"),
            "{e}"
        );
    }

    #[test]
    fn file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
log_dir = "logs"
[model]
provider = "openai-chat"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3.2"
idle_timeout = "45s"
[chat]
max_steps = 7
max_prompt_tokens = 9000
over_budget = "trim"
tool_errors = { retry = { attempts = 2 } }
"#,
        )
        .unwrap();
        let c = TroupeConfig::load(
            Some(&path),
            &env(&[("TROUPE_MODEL", "qwen2.5"), ("TROUPE_MAX_STEPS", "3")]),
        )
        .unwrap();
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        assert_eq!(c.model.model, "qwen2.5", "env beats the file");
        assert_eq!(c.chat.max_steps, 3);
        assert_eq!(
            c.chat.max_prompt_tokens,
            Some(9000),
            "the file beats the default"
        );
        assert_eq!(c.chat.over_budget, troupe_proto::OverBudget::Trim);
        assert_eq!(
            c.chat.tool_errors,
            troupe_proto::ToolErrorPolicy::Retry { attempts: 2 }
        );
        assert_eq!(c.model.idle_timeout, Duration::from_secs(45));
        assert_eq!(c.log_dir, dir.path().join("logs"), "beside the file");
        assert_eq!(
            c.data_dir,
            std::path::PathBuf::from("data"),
            "a default stays relative to the working directory"
        );
    }

    /// A relative `data_dir` or `log_dir` in the file is taken from the file's directory, as
    /// the agents and modules directories are; an absolute one, and the environment's, as
    /// given.
    #[test]
    fn the_files_relative_directories_are_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            "data_dir = \"state/data\"\nlog_dir = \"/var/log/t\"\n",
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.data_dir, dir.path().join("state/data"));
        assert_eq!(c.log_dir, std::path::PathBuf::from("/var/log/t"));
        let c = TroupeConfig::load(Some(&path), &env(&[("TROUPE_DATA_DIR", "here")])).unwrap();
        assert_eq!(c.data_dir, std::path::PathBuf::from("here"));
    }

    #[test]
    fn the_store_section_and_its_variables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[store]
backend = "postgres"
postgres_url = "postgresql://troupe:secret@db.internal:5432/troupe"
postgres_pool_size = 3
power_loss_durable = true
"#,
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.store.backend, StoreBackend::Postgres);
        assert_eq!(c.store.postgres_pool_size, 3);
        assert!(c.store.power_loss_durable);
        assert!(!TroupeConfig::default().store.power_loss_durable);
        assert!(!format!("{c:?}").contains("secret"), "the URL is redacted");
        let c = TroupeConfig::load(
            Some(&path),
            &env(&[
                ("TROUPE_POSTGRES_URL", "postgresql://other/db"),
                ("TROUPE_STORE_BACKEND", "sqlite"),
            ]),
        )
        .unwrap();
        assert_eq!(c.store.backend, StoreBackend::Sqlite, "env beats the file");
        assert_eq!(
            c.store.postgres_url.as_deref(),
            Some("postgresql://other/db")
        );
        assert_eq!(TroupeConfig::default().store.backend, StoreBackend::Sqlite);
        let err = TroupeConfig::load(None, &env(&[("TROUPE_STORE_BACKEND", "mysql")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TROUPE_STORE_BACKEND") && err.contains("sqlite or postgres"),
            "{err}"
        );
    }

    #[test]
    fn the_cluster_section_its_variables_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[store]
postgres_url = "postgresql://troupe:secret@db.internal:5432/troupe"

[cluster]
node = "a"
listen = "10.0.0.1:4697"
seeds = ["10.0.0.2:4697"]
cookie = "sesame"
lease_ttl = "5s"
"#,
        )
        .unwrap();
        let mut c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.cluster.listen.as_deref(), Some("10.0.0.1:4697"));
        assert_eq!(c.cluster.seeds, vec!["10.0.0.2:4697".to_owned()]);
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("sesame") && !debug.contains("secret"),
            "{debug}"
        );
        let node = c.cluster.node(&c.store).unwrap().unwrap();
        assert_eq!(node.node, "a");
        assert_eq!(node.lease_ttl, Duration::from_secs(5));
        assert!(node.postgres_url.contains("db.internal"), "the store's URL");
        let c2 = TroupeConfig::load(
            Some(&path),
            &env(&[
                ("TROUPE_NODE", "b"),
                ("TROUPE_CLUSTER_SEEDS", "x:1, y:2"),
                ("TROUPE_CLUSTER_POSTGRES_URL", "postgresql://shared/db"),
            ]),
        )
        .unwrap();
        let node = c2.cluster.node(&c2.store).unwrap().unwrap();
        assert_eq!(
            (node.node.as_str(), node.postgres_url.as_str()),
            ("b", "postgresql://shared/db")
        );
        assert_eq!(c2.cluster.seeds, vec!["x:1".to_owned(), "y:2".to_owned()]);
        c.apply_cluster_flags(&ClusterFlags {
            node: Some("c".into()),
            lease_ttl: Some("2s".into()),
            ..ClusterFlags::default()
        })
        .unwrap();
        let node = c.cluster.node(&c.store).unwrap().unwrap();
        assert_eq!(
            (node.node.as_str(), node.lease_ttl),
            ("c", Duration::from_secs(2))
        );
        let err = c
            .apply_cluster_flags(&ClusterFlags {
                lease_ttl: Some("soon".into()),
                ..ClusterFlags::default()
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("--lease-ttl"), "{err}");
        assert_eq!(
            TroupeConfig::default()
                .cluster
                .node(&StoreConfig::default())
                .unwrap(),
            None
        );
        let mut lonely = ClusterConfig {
            node: Some("a".into()),
            ..ClusterConfig::default()
        };
        let err = lonely
            .node(&StoreConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("postgres_url"), "{err}");
        lonely.node = Some(" ".into());
        assert!(lonely.node(&StoreConfig::default()).is_err());
    }

    #[test]
    fn a_remote_server_without_its_key_is_warned_about() {
        let mut c = TroupeConfig::default();
        assert_eq!(
            c.key_notice(&env(&[])),
            None,
            "the scripted model needs none"
        );
        c.model.provider = Provider::OpenaiChat;
        c.model.base_url = "https://api.example.com/v1".into();
        let notice = c.key_notice(&env(&[])).unwrap();
        assert!(notice.starts_with("OPENAI_API_KEY is not set"), "{notice}");
        assert_eq!(c.key_notice(&env(&[("OPENAI_API_KEY", "k")])), None);
        c.model.api_key_env = Some("MY_KEY".into());
        assert!(
            c.key_notice(&env(&[("MY_KEY", " ")]))
                .unwrap()
                .starts_with("MY_KEY")
        );
        c.model.api_key_env = Some(String::new());
        assert_eq!(
            c.key_notice(&env(&[])),
            None,
            "api_key_env = \"\" wants none"
        );
        c.model.api_key_env = Some("MY_KEY".into());
        c.model.api_key = Some("inline".into());
        assert_eq!(c.key_notice(&env(&[])), None);
        c.model.api_key = None;
        c.model.base_url = "http://127.0.0.1:11434/v1".into();
        assert_eq!(
            c.key_notice(&env(&[])),
            None,
            "a local server often needs none"
        );
    }

    #[test]
    fn the_model_line_says_whether_the_scripted_model_was_chosen() {
        let mut c = TroupeConfig::default();
        assert!(c.model_line().starts_with("no model endpoint configured"));
        c.named.provider = true;
        c.choose_provider();
        assert_eq!(
            c.model_line(),
            "model: the built-in scripted model (provider = scripted)"
        );
    }

    #[test]
    fn a_prompt_bound_of_zero_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(&path, "[chat]\nmax_prompt_tokens = 0\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("chat.max_prompt_tokens must be"), "{e}");
        let e = TroupeConfig::load(None, &env(&[("TROUPE_MAX_PROMPT_TOKENS", "0")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TROUPE_MAX_PROMPT_TOKENS") && e.contains("at least 1"),
            "{e}"
        );
        let c = TroupeConfig::load(None, &env(&[("TROUPE_MAX_PROMPT_TOKENS", "1")])).unwrap();
        assert_eq!(c.chat.max_prompt_tokens, Some(1));
    }

    #[test]
    fn an_approval_timeout_of_zero_is_refused_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(&path, "[conversation]\napproval_timeout = \"0s\"\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("conversation.approval_timeout must be"), "{e}");
        let e = TroupeConfig::load(None, &env(&[("TROUPE_APPROVAL_TIMEOUT", "0ms")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TROUPE_APPROVAL_TIMEOUT") && e.contains("longer than 0s"),
            "{e}"
        );
        let mut c = TroupeConfig::default();
        let e = c
            .apply_conversation_flags(&ConversationFlags {
                approval_timeout: Some("0s".into()),
                ..ConversationFlags::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 0s"), "{e}");
        assert_eq!(c.conversation.approval_timeout, Duration::from_secs(300));
        c.apply_conversation_flags(&ConversationFlags {
            approval_timeout: Some("1s".into()),
            ..ConversationFlags::default()
        })
        .unwrap();
        assert_eq!(c.conversation.approval_timeout, Duration::from_secs(1));
    }

    #[test]
    fn history_and_timeouts_flags_beat_env_beat_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[history]
max_items = 100
max_tokens = 5000
summarizer = "model"
summary_timeout = "20s"
[conversation]
close_timeout = "7s"
approval_timeout = "2m"
[sessions]
passivate_after = "10m"
"#,
        )
        .unwrap();
        let file_only = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(file_only.history.max_items, 100);
        assert_eq!(file_only.history.max_tokens, 5000);
        assert_eq!(file_only.history.summarizer, SummarizerKind::Model);
        assert_eq!(file_only.history.summary_timeout, Duration::from_secs(20));
        assert_eq!(file_only.conversation.close_timeout, Duration::from_secs(7));
        assert_eq!(
            file_only.conversation.approval_timeout,
            Duration::from_secs(120)
        );
        assert_eq!(
            file_only.sessions.passivation(),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            TroupeConfig::default().sessions.passivation(),
            None,
            "off by default"
        );
        let mut c = TroupeConfig::load(
            Some(&path),
            &env(&[
                ("TROUPE_HISTORY_MAX_ITEMS", "50"),
                ("TROUPE_HISTORY_MAX_TOKENS", "4000"),
                ("TROUPE_SUMMARIZER", "local"),
                ("TROUPE_CLOSE_TIMEOUT", "3s"),
                ("TROUPE_APPROVAL_TIMEOUT", "90s"),
                ("TROUPE_SUMMARY_TIMEOUT", "5s"),
                ("TROUPE_PASSIVATE_AFTER", "5m"),
            ]),
        )
        .unwrap();
        assert_eq!(c.history.max_items, 50, "env beats the file");
        assert_eq!(c.history.summarizer, SummarizerKind::Local);
        assert_eq!(c.history.summary_timeout, Duration::from_secs(5));
        assert_eq!(c.conversation.close_timeout, Duration::from_secs(3));
        assert_eq!(c.sessions.passivate_after, Duration::from_secs(300));
        c.apply_conversation_flags(&ConversationFlags {
            history_max_items: Some("20".into()),
            passivate_after: Some("0s".into()),
            summarizer: Some("model".into()),
            close_timeout: Some("1s".into()),
            ..ConversationFlags::default()
        })
        .unwrap();
        assert_eq!(c.history.max_items, 20, "a flag beats the env");
        assert_eq!(c.history.summarizer, SummarizerKind::Model);
        assert_eq!(c.conversation.close_timeout, Duration::from_secs(1));
        assert_eq!(c.history.max_tokens, 4000, "no flag: the env's stays");
        assert_eq!(c.conversation.approval_timeout, Duration::from_secs(90));
        assert_eq!(
            c.sessions.passivation(),
            None,
            "a flag of zero turns it off"
        );
        let bad = c
            .apply_conversation_flags(&ConversationFlags {
                summarizer: Some("oracle".into()),
                ..ConversationFlags::default()
            })
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("--summarizer") && bad.contains("local or model"),
            "{bad}"
        );
        let bad = TroupeConfig::load(None, &env(&[("TROUPE_CLOSE_TIMEOUT", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("TROUPE_CLOSE_TIMEOUT"), "{bad}");
        let bad = TroupeConfig::load(None, &env(&[("TROUPE_PASSIVATE_AFTER", "idle")]))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("TROUPE_PASSIVATE_AFTER"), "{bad}");
    }

    #[test]
    fn mcp_servers_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[mcp]
roots = ["/srv/work"]
[[mcp.servers]]
name = "everything"
type = "stdio"
command = "node"
args = ["server-everything/dist/index.js", "stdio"]
env = { GREETING = "hi" }
[[mcp.servers]]
name = "remote"
type = "streamable_http"
url = "http://127.0.0.1:3001/mcp"
"#,
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.mcp.servers.len(), 2);
        assert_eq!(c.mcp.servers[0].name, "everything");
        assert!(matches!(
            &c.mcp.servers[1].transport,
            troupe_actors::ports::McpTransport::StreamableHttp { url, .. } if url.ends_with("/mcp")
        ));
        assert_eq!(c.mcp.roots, vec!["/srv/work"]);
        assert_eq!(
            c.mcp.limits.limits(),
            troupe_actors::mcp_pool::McpLimits::default()
        );
    }

    #[test]
    fn an_oauth_table_on_a_remote_server() {
        use troupe_actors::ports::{McpOAuth, McpOAuthGrant, McpTransport};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[[mcp.servers]]
name = "remote"
type = "streamable_http"
url = "https://mcp.example.com/mcp"
[mcp.servers.oauth]
scopes = ["files:read"]
redirect_port = 8765

[[mcp.servers]]
name = "service"
type = "streamable_http"
url = "https://api.example.com/mcp"
oauth = { grant = "client_credentials", client_id_env = "SVC_ID", client_secret_env = "SVC_SECRET" }
"#,
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        let oauth = |i: usize| match &c.mcp.servers[i].transport {
            McpTransport::StreamableHttp { oauth, .. } => oauth.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            oauth(0),
            Some(McpOAuth {
                scopes: vec!["files:read".into()],
                redirect_port: 8765,
                ..McpOAuth::default()
            })
        );
        let service = oauth(1).unwrap();
        assert_eq!(service.grant, McpOAuthGrant::ClientCredentials);
        assert_eq!(service.client_secret_env.as_deref(), Some("SVC_SECRET"));
        // A misspelt key is refused, not ignored.
        std::fs::write(
            &path,
            "[[mcp.servers]]\nname = \"r\"\ntype = \"streamable_http\"\nurl = \"http://x/mcp\"\n\
             oauth = { client_secret = \"inline\" }\n",
        )
        .unwrap();
        let bad = TroupeConfig::load(Some(&path), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("client_secret"), "{bad}");
    }

    #[test]
    fn mcp_limits_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[mcp.limits]
idle_timeout = "5m"
per_conversation_concurrency = 2
per_conversation_rate = 0.5
per_conversation_burst = 3
wait_bound = "1500ms"
"#,
        )
        .unwrap();
        let limits = TroupeConfig::load(Some(&path), &env(&[]))
            .unwrap()
            .mcp
            .limits
            .limits();
        assert_eq!(limits.idle_timeout, Duration::from_secs(300));
        assert_eq!(limits.per_conversation_concurrency, 2);
        assert_eq!(
            limits.per_conversation_rate,
            Some(troupe_actors::mcp_pool::Rate {
                per_second: 0.5,
                burst: 3
            })
        );
        assert_eq!(limits.wait_bound, Duration::from_millis(1500));
        let defaults = troupe_actors::mcp_pool::McpLimits::default();
        assert_eq!(limits.call_timeout, defaults.call_timeout);
        assert!(limits.validate().is_ok());
        // A rate of 0 turns the rate limit off.
        let off = McpLimitsConfig {
            per_conversation_rate: 0.0,
            ..McpLimitsConfig::default()
        };
        assert_eq!(off.limits().per_conversation_rate, None);
    }

    #[test]
    fn server_section_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(
            &path,
            r#"
[server]
listen = "0.0.0.0:9000"
grace_period = "5s"
body_limit = 4096
allowed_hosts = ["troupe.internal:9000"]
header_timeout = "2s"
max_connections = 50
[[server.tokens]]
token = "s3cret"
projects = ["alpha"]
[[server.tokens]]
token_env = "OPS_TOKEN"
projects = ["*"]
[server.a2a]
project = "agents"
public_url = "https://agents.example.com/a2a"
"#,
        )
        .unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[("TROUPE_BODY_LIMIT", "100")])).unwrap();
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.server.grace_period, Duration::from_secs(5));
        assert_eq!(c.server.body_limit, 100, "env beats the file");
        assert_eq!(c.server.a2a.project, "agents");
        assert!(c.server.a2a.enabled, "on unless turned off");
        assert_eq!(
            c.server.a2a.public_url.as_deref(),
            Some("https://agents.example.com/a2a")
        );
        assert_eq!(c.server.allowed_hosts, vec!["troupe.internal:9000"]);
        assert_eq!(c.server.header_timeout, Duration::from_secs(2));
        assert_eq!(
            c.server.idle_timeout,
            Duration::from_secs(60),
            "the default"
        );
        assert_eq!(c.server.max_connections, 50);
        assert!(c.server.allowed_origins.is_empty());
        let off = TroupeConfig::load(
            Some(&path),
            &env(&[
                ("TROUPE_A2A", "false"),
                (
                    "TROUPE_ALLOWED_ORIGINS",
                    "https://a.example, ,https://b.example",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(
            off.server.allowed_origins,
            vec!["https://a.example", "https://b.example"]
        );
        assert!(!off.server.a2a.enabled);
        assert_eq!(c.server.tokens.len(), 2);
        let ops = env(&[("OPS_TOKEN", "ops")]);
        assert_eq!(c.server.tokens[1].secret(&ops).as_deref(), Some("ops"));
        assert!(!format!("{c:?}").contains("s3cret"), "tokens are redacted");

        let c = TroupeConfig::load(
            None,
            &env(&[
                ("TROUPE_API_TOKENS", "a=p1,p2; b=*"),
                ("TROUPE_GRACE_PERIOD", "1m"),
            ]),
        )
        .unwrap();
        assert_eq!(c.server.tokens[0].projects, vec!["p1", "p2"]);
        assert_eq!(c.server.tokens[1].token.as_deref(), Some("b"));
        assert_eq!(c.server.grace_period, Duration::from_secs(60));
        let e = TroupeConfig::load(None, &env(&[("TROUPE_API_TOKENS", "nope")])).unwrap_err();
        assert!(
            !e.to_string().contains("nope"),
            "the secret is not echoed: {e}"
        );
    }

    #[test]
    fn config_file_from_env_var() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.toml");
        std::fs::write(&path, "[chat]\nmax_steps = 5\n").unwrap();
        let p = path.to_string_lossy().into_owned();
        let c = TroupeConfig::load(None, &env(&[("TROUPE_CONFIG", &p)])).unwrap();
        assert_eq!(c.chat.max_steps, 5);
    }

    /// Applies what a bin's `--provider` / `--base-url` flags would, then chooses.
    fn chosen(c: &mut TroupeConfig, provider: Option<Provider>, base_url: Option<&str>) {
        if let Some(p) = provider {
            c.model.provider = p;
            c.named.provider = true;
        }
        if let Some(u) = base_url {
            c.model.base_url = u.to_owned();
            c.named.endpoint = true;
        }
        c.choose_provider();
    }

    #[test]
    fn an_endpoint_without_a_provider_picks_chat_completions() {
        // Nothing named: the scripted model.
        let mut c = TroupeConfig::load(None, &env(&[])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::Scripted);
        assert!(c.model_line().contains("scripted model"));
        // A base URL flag.
        let mut c = TroupeConfig::load(None, &env(&[])).unwrap();
        chosen(&mut c, None, Some("http://127.0.0.1:9/v1"));
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        assert_eq!(
            c.model_line(),
            "model: openai-chat at http://127.0.0.1:9/v1, model gpt-4o-mini"
        );
        // Credentials and a query in the URL are not shown.
        let mut c = TroupeConfig::load(None, &env(&[])).unwrap();
        chosen(
            &mut c,
            None,
            Some("https://user:s3cret@proxy.internal/v1?api-key=k3y"),
        );
        assert_eq!(
            c.model_line(),
            "model: openai-chat at https://proxy.internal/v1, model gpt-4o-mini"
        );
        // OPENAI_BASE_URL, below TROUPE_BASE_URL.
        let mut c =
            TroupeConfig::load(None, &env(&[("OPENAI_BASE_URL", "http://a:1/v1")])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        assert_eq!(c.model.base_url, "http://a:1/v1");
        let c = TroupeConfig::load(
            None,
            &env(&[
                ("OPENAI_BASE_URL", "http://a:1/v1"),
                ("TROUPE_BASE_URL", "http://b:2/v1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.model.base_url, "http://b:2/v1");
        // OPENAI_API_KEY alone: OpenAI's own endpoint.
        let mut c = TroupeConfig::load(None, &env(&[("OPENAI_API_KEY", "sk-x")])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        assert_eq!(c.model.base_url, "https://api.openai.com/v1");
        // An empty variable names nothing.
        let mut c = TroupeConfig::load(None, &env(&[("OPENAI_API_KEY", "")])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::Scripted);
    }

    #[test]
    fn a_named_provider_wins_flags_over_env_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("troupe.toml");
        std::fs::write(&path, "[model]\nprovider = \"openai-responses\"\n").unwrap();
        // The file names the provider: a base URL from the environment keeps it.
        let mut c =
            TroupeConfig::load(Some(&path), &env(&[("OPENAI_BASE_URL", "http://a:1/v1")])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::OpenaiResponses);
        assert_eq!(c.model.base_url, "http://a:1/v1", "env beats the file");
        // The environment beats the file, the flag beats both.
        let mut c =
            TroupeConfig::load(Some(&path), &env(&[("TROUPE_PROVIDER", "openai-chat")])).unwrap();
        chosen(&mut c, None, Some("http://c:3/v1"));
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        chosen(&mut c, Some(Provider::Scripted), None);
        assert_eq!(c.model.provider, Provider::Scripted);
        // A file that names only a base URL picks Chat Completions.
        std::fs::write(&path, "[model]\nbase_url = \"http://d:4/v1\"\n").unwrap();
        let mut c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::OpenaiChat);
        // A file that says scripted keeps it whatever the environment holds.
        std::fs::write(&path, "[model]\nprovider = \"scripted\"\n").unwrap();
        let mut c = TroupeConfig::load(Some(&path), &env(&[("OPENAI_API_KEY", "sk-x")])).unwrap();
        chosen(&mut c, None, None);
        assert_eq!(c.model.provider, Provider::Scripted);
    }

    #[test]
    fn bad_values_are_named() {
        let e = TroupeConfig::load(None, &env(&[("TROUPE_MAX_STEPS", "many")])).unwrap_err();
        assert!(e.to_string().contains("TROUPE_MAX_STEPS"), "{e}");
        let e = TroupeConfig::load(None, &env(&[("TROUPE_PROVIDER", "gemini")])).unwrap_err();
        assert!(e.to_string().contains("openai-chat"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[model]\nprovidr = 1\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[])).unwrap_err();
        assert!(e.to_string().contains("providr"), "{e}");
    }

    #[test]
    fn a_step_limit_of_zero_is_refused_from_the_file_and_the_environment() {
        let e = TroupeConfig::load(None, &env(&[("TROUPE_MAX_STEPS", "0")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad value for TROUPE_MAX_STEPS: `0` (a whole number of at least 1)"
        );
        let ok = TroupeConfig::load(None, &env(&[("TROUPE_MAX_STEPS", "1")])).unwrap();
        assert_eq!(ok.chat.max_steps, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zero.toml");
        std::fs::write(&path, "[chat]\nmax_steps = 0\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[])).unwrap_err();
        assert!(
            e.to_string().contains("chat.max_steps must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn the_response_bound_is_read_from_the_file_and_zero_is_refused() {
        assert_eq!(
            ModelConfig::default().max_response_bytes,
            DEFAULT_MAX_RESPONSE_BYTES
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bound.toml");
        std::fs::write(&path, "[model]\nmax_response_bytes = 1048576\n").unwrap();
        let c = TroupeConfig::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(c.model.max_response_bytes, 1 << 20);
        std::fs::write(&path, "[model]\nmax_response_bytes = 0\n").unwrap();
        let e = TroupeConfig::load(Some(&path), &env(&[])).unwrap_err();
        assert!(
            e.to_string()
                .contains("model.max_response_bytes must be at least 1"),
            "{e}"
        );
    }
}
