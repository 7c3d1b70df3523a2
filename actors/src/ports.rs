//! Ports: what the actors call and `troupe-runtime` (or a test) plugs in. The actors never
//! know whether a model speaks SSE or follows a script, or how a command is sandboxed.

use crate::history::PromptView;
use async_trait::async_trait;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_proto::{
    AgentError, ConversationId, SandboxPolicy, TaskId, ToolCall, ToolOutput, ToolSpec, Usage,
};

/// What a model client is, for logs, events and the prompt cache key (C7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// `scripted`, `openai-responses`, `openai-chat`, ...
    pub provider: String,
    pub model: String,
    /// Family used by the prompt cache key, e.g. `gpt-4o`.
    pub family: String,
}

/// One model call (a Step).
#[derive(Clone, Copy)]
pub struct ModelRequest<'a> {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// The system prompt chosen for this turn (C3).
    pub instructions: &'a str,
    /// History, pending input and this task's items, in order; borrowed, never copied.
    pub prompt: PromptView<'a>,
    pub tools: &'a [ToolSpec],
    pub prompt_cache_key: &'a str,
}

/// What one model call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelResponse {
    /// Assistant text (may be empty when the model only calls tools).
    pub text: String,
    /// Tool calls, in the order the model made them.
    pub tool_calls: Vec<ToolCall>,
    /// Provider-reported usage, when it reports any.
    pub usage: Option<Usage>,
    /// The provider's id of this completion (`gen_ai.response.id`).
    pub response_id: Option<String>,
    /// The model that actually answered, when the provider says (`gen_ai.response.model`).
    pub response_model: Option<String>,
}

/// Receives streamed text as it arrives.
pub trait DeltaSink: Send {
    fn text_delta(&mut self, delta: &str);
}

/// A model provider.
#[async_trait]
pub trait ModelClient: Send + Sync + 'static {
    fn info(&self) -> ModelInfo;

    /// The same client (provider, endpoint, connection pool) asking for another model, for a
    /// conversation that names its own (S1). `None`: this client serves one model only.
    fn with_model(&self, model: &str) -> Option<Arc<dyn ModelClient>> {
        let _ = model;
        None
    }

    /// Runs one step. Must stop promptly (with `AgentError::Cancelled`) once `cancel` fires;
    /// a client that does not is force-aborted after the close timeout (whoever cancelled:
    /// `close`, a cancel-all or `task.cancel`). It runs inside
    /// the step's `chat {model}` span (see `task::spans`): spans a client opens (an HTTP
    /// attempt) are its children.
    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError>;
}

/// Context of one external tool call.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallContext<'a> {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    pub cancel: &'a CancellationToken,
    /// The call's `execute_tool` span: the view and the connection record the MCP
    /// attributes on it, and it is the parent the server is given (`traceparent`).
    pub span: &'a tracing::Span,
    /// The task's scheduler slot, given back while a server's request waits for a human
    /// (`None`: kept).
    pub slot: Option<&'a crate::task::SlotLease>,
}

/// The session's MCP pool, as the Conversation sees it. Implemented by the McpPool actor's
/// handle; a session without MCP servers has none.
#[async_trait]
pub trait McpPort: Send + Sync + 'static {
    /// Opens a conversation's view: its allowlist (qualified `server__tool` names, `None` =
    /// every tool) is checked here, and unknown names are an error that names them.
    async fn open_view(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError>;

    /// Opens a view again for an allowlist accepted before (a restart, a reactivation, a
    /// refresh, a new pool): an entry of a server that is no longer configured, or of a tool
    /// its server no longer offers, is not an error (the view sees what is there, and a
    /// `warning` event names what is not), so a conversation is never lost to a change of its
    /// servers.
    async fn reopen_view(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        self.open_view(conversation_id, allowlist).await
    }
}

/// One conversation's view onto the pool.
#[async_trait]
pub trait McpView: Send + Sync + 'static {
    /// The tools this view may call, qualified `server__tool`.
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, AgentError>;
    async fn call_tool(
        &self,
        call: &ToolCall,
        ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure>;
    /// Gives the view's references back to the pool. Idempotent.
    async fn release(&self);
    /// Asks the pool to read its view's tools again (C6 `refresh_mcp`): the tools of the
    /// view's ready servers are listed again, and servers waiting to restart start now. Does
    /// not wait for them: each server's `mcp_server_ready` event says when it is done. A
    /// port with nothing to refresh keeps the default.
    async fn refresh(&self) {}
    /// Whether the pool behind the view has stopped, so that its calls can only fail (a
    /// task then waits for the session's next pool). A port that never stops keeps the
    /// default.
    fn is_closed(&self) -> bool {
        false
    }
}

/// A tool call that failed: the error it ends with, and what kind of failure it is, set
/// where the failure is made (the runner decides on the kind whether to run the call again,
/// never on the error's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    pub error: AgentError,
    pub kind: ToolFailureKind,
}

/// What kind of failure a [`ToolFailure`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFailureKind {
    /// The call names a tool its caller may not call (never offered, hidden by an
    /// allowlist, or gone with its server): the same call is refused again.
    UnknownTool,
    /// Anything else; whether it could go better the next time follows the error's kind.
    Failed,
}

impl ToolFailure {
    /// The refusal of a call of `name`, a tool the caller may not call.
    pub fn unknown_tool(name: &str) -> Self {
        Self {
            error: AgentError::ToolError {
                name: name.to_owned(),
                message: format!("unknown tool `{name}`"),
            },
            kind: ToolFailureKind::UnknownTool,
        }
    }

    /// Whether running the same call again could help: refusals and denials will not
    /// change, and neither will a tool that is not there.
    pub fn retryable(&self) -> bool {
        self.kind != ToolFailureKind::UnknownTool
            && !matches!(
                self.error,
                AgentError::ApprovalDenied { .. }
                    | AgentError::SandboxError { .. }
                    | AgentError::InvalidInput { .. }
                    | AgentError::Cancelled { .. }
                    | AgentError::PolicyRejected { .. }
            )
    }
}

impl From<AgentError> for ToolFailure {
    /// An error made without a kind of its own is a plain `Failed`.
    fn from(error: AgentError) -> Self {
        Self {
            error,
            kind: ToolFailureKind::Failed,
        }
    }
}

/// Where the effects of a task's tool calls and dispatches come from (A9). A port with a
/// default: `Live` runs them (commands, patches, MCP calls, dispatches to agents, with their
/// approvals); `Recorded` plays back what a rollout recorded of them instead (`troupe
/// replay`), so that nothing runs, nothing is written and nobody is asked. What is decided
/// without an effect runs either way: a call's routing and refusal, `update_plan`, the tool
/// error policy, the supervisor's routing.
#[derive(Clone, Default)]
pub enum Effects {
    #[default]
    Live,
    Recorded(Arc<dyn Playback>),
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Live => "Live",
            Self::Recorded(_) => "Recorded",
        })
    }
}

/// Recorded results, played back in place of effects (see [`Effects`]). Each call takes the
/// next recorded result: a retried tool call gets its attempts one by one, in order.
pub trait Playback: Send + Sync + 'static {
    /// What `call` (a shell command, a patch, an MCP tool) did when it was recorded.
    fn tool_result(&self, call: &ToolCall) -> Result<ToolOutput, ToolFailure>;
    /// What the next dispatch, to `agent_id`, answered when it was recorded (its refusal,
    /// failure or expiry included).
    fn dispatch_result(&self, agent_id: &str) -> Result<crate::agents::AgentOutput, AgentError>;
    /// Whether `call`, a call of a tool that needs an authorization token, was authorized
    /// when it was recorded (no token is consumed by a replay).
    fn authorized(&self, call: &ToolCall) -> Result<(), AgentError> {
        let _ = call;
        Ok(())
    }
    /// How the supervisor's route to a module failed when it was recorded (the task's end
    /// error): a replay delivers nothing, so this stands for the module's failure, refusal or
    /// absence. `None`: it did not fail (its answer is the recorded reply).
    fn module_route_failure(&self) -> Option<AgentError> {
        None
    }
}

/// A command to run for the shell tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub workdir: Option<PathBuf>,
    pub timeout: Duration,
    pub sandbox: SandboxPolicy,
    /// Bytes of stdout + stderr kept; the rest is dropped and reported.
    pub output_cap: usize,
    /// Directories a `workspace-write` command may change: the conversation's workspace
    /// roots. The runner adds a private temp dir; other policies ignore the list.
    pub writable_roots: Vec<PathBuf>,
    /// The conversation and task the command runs for, named on its span (`None` outside a
    /// task).
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub truncated: bool,
}

/// Runs commands as child processes, under a sandbox policy it must enforce or refuse.
#[async_trait]
pub trait CommandRunner: Send + Sync + 'static {
    async fn run(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> Result<ExecOutput, AgentError>;
}

/// Counts tokens the way a model's tokenizer does (T5). The runner estimates every prompt
/// with it before the model call.
pub trait TokenCounter: Send + Sync + 'static {
    /// Name of the encoding, for events and logs (`cl100k_base`, `o200k_base`, `approx`).
    fn encoding(&self) -> &str;

    /// Tokens of a piece of text.
    fn count(&self, text: &str) -> usize;

    /// The counter for another model than the one this counter was chosen for (a
    /// conversation's own `model`), when it follows the model; `None`: this one stands for
    /// every model (a tokenizer named in the configuration, the four-bytes estimate).
    fn of_model(&self, _model: &str) -> Option<Arc<dyn TokenCounter>> {
        None
    }

    /// Tokens of one history item as a chat format frames it.
    fn count_item(&self, item: &troupe_proto::HistoryItem) -> usize {
        use troupe_proto::HistoryItem as H;
        // Chat formats add a few tokens around every message.
        const FRAME: usize = 4;
        FRAME
            + match item {
                H::Message { text, .. } | H::Summary { text, .. } => self.count(text),
                H::ToolCall(c) => self.count(&c.name) + self.count(&c.arguments.0.to_string()),
                H::ToolOutput(o) => self.count(&o.output),
            }
    }
}

/// A tokenizer-free estimate: about four bytes a token. The default when no tokenizer is
/// plugged in (tests, the scripted model).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApproxTokens;

impl TokenCounter for ApproxTokens {
    fn encoding(&self) -> &str {
        "approx"
    }

    fn count(&self, text: &str) -> usize {
        text.len().div_ceil(4)
    }
}

// ---------------------------------------------------------------------------------------
// MCP: what the McpPool needs from a transport (implemented in troupe-runtime over rmcp).

/// How to reach one MCP server. Equal configurations share one connection per session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct McpServerConfig {
    /// Prefix of its tools' qualified names (`name__tool`): `[a-zA-Z0-9_-]+` without `__`.
    pub name: String,
    /// Flattened: a configuration file writes `type = "stdio"`, `command = ...` beside `name`.
    #[serde(flatten)]
    pub transport: McpTransport,
}

/// The transport of an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum McpTransport {
    /// A child process speaking JSON-RPC over stdin/stdout. It starts with a scrubbed
    /// environment: only `env` (no inherited variables).
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        cwd: Option<PathBuf>,
    },
    /// A remote server over streamable HTTP.
    StreamableHttp {
        url: String,
        #[serde(default)]
        headers: std::collections::BTreeMap<String, String>,
        /// OAuth 2.1 as the MCP authorization spec describes it: with this table the client
        /// sends a bearer token it obtained by `troupe mcp login` or by the client-credentials
        /// grant, and refreshes it. Without it, a server that answers 401 is not reached.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oauth: Option<McpOAuth>,
    },
}

/// `oauth` of a streamable-HTTP MCP server: how troupe obtains its tokens. Secrets are never
/// written here, only the names of the environment variables that hold them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpOAuth {
    /// `authorization_code` (a person logs in once with `troupe mcp login`) or
    /// `client_credentials` (headless: the client's own id and secret).
    pub grant: McpOAuthGrant,
    /// A client id registered beforehand with the authorization server. Without one (and
    /// without `client_id_env`), `troupe mcp login` registers a client dynamically (RFC 7591).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The environment variable holding the client id (instead of `client_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id_env: Option<String>,
    /// The environment variable holding the client secret (confidential clients, and the
    /// client-credentials grant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    /// Scopes to ask for; empty: those the server names (its challenge, then its protected
    /// resource metadata), or none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The HTTPS URL of a client ID metadata document describing troupe (SEP-991), hosted by
    /// whoever runs it: used as the client id by authorization servers that accept such
    /// documents, before dynamic registration is tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// The port of the loopback redirect `http://127.0.0.1:PORT/callback` that
    /// `troupe mcp login` listens on; 0 picks a free one (fine with dynamic registration; a
    /// pre-registered client needs the port it was registered with).
    pub redirect_port: u16,
}

/// The OAuth grant troupe uses for an MCP server.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum McpOAuthGrant {
    /// Authorization code with PKCE, from an interactive `troupe mcp login`; refreshed with
    /// the refresh token.
    #[default]
    AuthorizationCode,
    /// Client credentials (no person involved), asked for again when the token expires.
    ClientCredentials,
}

impl McpOAuthGrant {
    pub const ALL: [Self; 2] = [Self::AuthorizationCode, Self::ClientCredentials];

    /// The grant's OAuth name (a bounded metric label).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AuthorizationCode => "authorization_code",
            Self::ClientCredentials => "client_credentials",
        }
    }
}

/// A tool as its server lists it (unqualified name).
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: troupe_proto::Json,
    /// The tool requires MCP task augmentation (`execution.taskSupport: "required"`).
    pub requires_task: bool,
}

/// Something a server told its client, outside any reply.
#[derive(Debug, Clone, PartialEq)]
pub enum McpNotice {
    /// `notifications/tools/list_changed`: list the tools again.
    ToolsChanged,
    /// `notifications/progress` of a call.
    Progress {
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    /// The connection ended (the process exited, the stream closed).
    Closed { reason: String },
}

/// How the user answered an elicitation (MCP's `accept`, `decline`, `cancel`).
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitOutcome {
    /// The user gave this content (an object matching the requested schema).
    Accept(troupe_proto::Json),
    /// The user refused.
    Decline,
    /// Nobody answered (the dialog was dismissed, timed out or its call was cancelled).
    Cancel,
}

/// Answers a server's requests to its client (roots, elicitation, sampling).
#[async_trait]
pub trait McpClientHandler: Send + Sync + 'static {
    /// `roots/list`: `file://` URIs the server may use.
    async fn list_roots(&self) -> Vec<String>;
    /// `elicitation/create`: the user's answer (an object matching `schema`); an error
    /// declines.
    async fn elicit(
        &self,
        message: String,
        schema: troupe_proto::Json,
    ) -> Result<troupe_proto::Json, AgentError>;
    /// `elicitation/create` with all three answers; what a connection calls. By default
    /// `elicit`: its content accepts, any error declines.
    async fn elicit_outcome(&self, message: String, schema: troupe_proto::Json) -> ElicitOutcome {
        match self.elicit(message, schema).await {
            Ok(content) => ElicitOutcome::Accept(content),
            Err(_) => ElicitOutcome::Decline,
        }
    }
    /// `sampling/createMessage`: the result object; an error refuses.
    async fn sample(&self, request: troupe_proto::Json) -> Result<troupe_proto::Json, AgentError>;
}

/// One tool call on a connection.
pub struct McpCall<'a> {
    /// Unqualified tool name.
    pub tool: &'a str,
    pub arguments: &'a troupe_proto::Json,
    /// Firing it sends `notifications/cancelled` and returns `Cancelled` at once.
    pub cancel: &'a CancellationToken,
    /// Where this call's progress notifications go (a progress token is sent when set).
    pub progress: Option<tokio::sync::mpsc::UnboundedSender<McpNotice>>,
    /// W3C `traceparent`, sent in `params._meta`: the context of `span`.
    pub traceparent: Option<String>,
    pub timeout: Duration,
    /// The tool call's span (`execute_tool`), on which the connection records the MCP
    /// attributes it alone knows (`jsonrpc.request.id`, `mcp.session.id`, ...). A disabled
    /// span (`Span::none()`) records nothing.
    pub span: tracing::Span,
}

/// A live connection to one MCP server, shared by every view that uses it.
#[async_trait]
pub trait McpConnection: Send + Sync + 'static {
    async fn list_tools(&self) -> Result<Vec<McpTool>, AgentError>;
    /// The tool's result as text (content joined); `is_error` from the result. The returned
    /// `call_id` is empty: the caller sets it.
    async fn call_tool(&self, call: McpCall<'_>) -> Result<ToolOutput, AgentError>;
    /// The child's process id (stdio), for observation and tests.
    fn process_id(&self) -> Option<u32>;
    /// Ends the connection (and the child process). Idempotent.
    async fn close(&self);
}

/// Opens connections.
#[async_trait]
pub trait McpConnector: Send + Sync + 'static {
    /// Connects and completes the MCP handshake. Server requests go to `handler`,
    /// notifications to `notices` (including `Closed` when the connection ends).
    async fn connect(
        &self,
        config: &McpServerConfig,
        handler: Arc<dyn McpClientHandler>,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<dyn McpConnection>, AgentError>;
}

// ---------------------------------------------------------------------------------------
// Agents: where a session's bindings of agents to provider sessions are kept (A1).

/// Keeps the bindings `(session, agent) -> provider session` (implemented by the service's
/// store, SQLite or in memory). A binding written here survives what the store survives, so
/// the next run of the session resumes it.
#[async_trait]
pub trait BindingStore: Send + Sync + 'static {
    /// Inserts the binding of `(binding.session_id, binding.agent_id)`, or replaces it.
    async fn put_binding(
        &self,
        binding: troupe_proto::agent::AgentBinding,
    ) -> Result<(), AgentError>;

    /// The bindings of one session (`None`: of every session), ordered by session, then
    /// agent id.
    async fn bindings(
        &self,
        session_id: Option<troupe_proto::SessionId>,
    ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError>;

    /// Forgets the binding of `(session_id, agent_id)`; forgetting one that is not there is
    /// not an error.
    async fn remove_binding(
        &self,
        session_id: troupe_proto::SessionId,
        agent_id: &str,
    ) -> Result<(), AgentError>;
}

/// Keeps authorization tokens (A5): implemented by the service's store (SQLite or in
/// memory). A use counted here survives what the store survives, so a restart does not give
/// a token its uses back.
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Adds a new token.
    async fn insert_token(
        &self,
        token: troupe_proto::governance::AuthToken,
    ) -> Result<(), AgentError>;

    /// The token whose secret has this digest.
    async fn token_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError>;

    /// Counts one use of token `id` if it has exactly `uses` so far (compare and set, so that
    /// two processes on one store never both count the last use), is not revoked and has
    /// not expired at `now_ms` (wall time): `true` when counted.
    async fn use_token(&self, id: &str, uses: u32, now_ms: u64) -> Result<bool, AgentError>;

    /// Revokes token `id` at `at_ms` (a revoked one keeps its first revocation); the token
    /// after it, `None` when there is no such token.
    async fn revoke_token(
        &self,
        id: &str,
        at_ms: u64,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError>;

    /// Every token, newest first.
    async fn tokens(&self) -> Result<Vec<troupe_proto::governance::AuthToken>, AgentError>;
}
