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
}

/// Receives streamed text as it arrives.
pub trait DeltaSink: Send {
    fn text_delta(&mut self, delta: &str);
}

/// A model provider.
#[async_trait]
pub trait ModelClient: Send + Sync + 'static {
    fn info(&self) -> ModelInfo;

    /// Runs one step. Must stop promptly (with `AgentError::Cancelled`) once `cancel` fires;
    /// a client that does not is force-aborted by `close` after its timeout.
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
    ) -> Result<ToolOutput, AgentError>;
    /// Gives the view's references back to the pool. Idempotent.
    async fn release(&self);
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
