//! `troupe chat`: an interactive REPL (line editing, history, a spinner while the model
//! works, tool calls and observations as they happen, slash commands), or one turn with
//! `--once`, whose exit code reflects the turn's status.

use anyhow::Context;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use troupe_actors::SessionHandle;
use troupe_actors::mcp_pool::PoolSnapshot;
use troupe_actors::rollout::FileRolloutStorage;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalSubject, ConversationId, EventEnvelope, EventKind,
    MessageReply, SessionId, StoragePolicy, TaskId, TaskStatus, WarningCode,
};
use troupe_runtime::assembly;
use troupe_runtime::config::{TroupeConfig, parse_enum};
use troupe_runtime::history_log::{HistoryFeed, HistoryLog, HistoryLogHandle, HistoryLogOptions};
use troupe_store::{MemoryRolloutStorage, TtlSweeper};

use crate::spinner::Spinner;

#[derive(Debug, Default, clap::Args)]
pub struct ChatArgs {
    /// A first question; with --once, the only one.
    pub question: Option<String>,
    /// Run one turn, print the reply, exit (0 ok, 1 could not run, 2 error, 3 max_steps,
    /// 4 cancelled).
    #[arg(long)]
    pub once: bool,
    /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// scripted, openai-responses or openai-chat (default: openai-chat when a base URL or
    /// OPENAI_API_KEY is given, else scripted).
    #[arg(long)]
    pub provider: Option<String>,
    /// Model name sent to the endpoint.
    #[arg(long)]
    pub model: Option<String>,
    /// Endpoint base URL, e.g. http://127.0.0.1:11434/v1.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Environment variable that holds the API key.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// native (the API's tool calling) or text (<action>/<final> dialect).
    #[arg(long)]
    pub tool_mode: Option<String>,
    /// Steps before a turn ends with max_steps (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,
    /// Largest prompt sent, by the local tokenizer's estimate (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prompt_tokens: Option<u64>,
    /// Warn when a prompt is larger than this.
    #[arg(long)]
    pub warn_prompt_tokens: Option<u64>,
    /// reject or trim a prompt over --max-prompt-tokens.
    #[arg(long)]
    pub over_budget: Option<String>,
    /// Tokenizer that estimates prompts: an encoding (o200k_base, cl100k_base, p50k_base,
    /// r50k_base), an OpenAI model name (gpt-4o, ...), or `approx` (four bytes a token).
    #[arg(long)]
    pub tokenizer_model: Option<String>,
    /// Where JSONL histories go (history/<session_id>.jsonl by default).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Where sessions keep their rollout.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A JSON script for the built-in scripted model (`{"replies": [...]}`).
    #[arg(long, env = "TROUPE_SCRIPT")]
    pub script: Option<PathBuf>,
    /// What the rollout keeps: full, headers-only, none, or ttl:<seconds>.
    #[arg(long, value_parser = parse_policy)]
    pub storage_policy: Option<StoragePolicy>,
    /// always, on-failure or never ask before running a command.
    #[arg(long)]
    pub approval_policy: Option<String>,
    /// read-only, workspace-write or full-access.
    #[arg(long)]
    pub sandbox_policy: Option<String>,
    /// Print the reply and its statistics as JSON (with --once only).
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Write nothing to disk: the rollout in memory, no JSONL history.
    #[arg(long)]
    pub ephemeral: bool,
    /// Answer command (and MCP sampling) approvals without asking: deny or approve (once;
    /// under the on-failure approval policy, `approve` also lets a command the sandbox
    /// refused run again outside it). Default: ask at the terminal in the REPL; deny with
    /// --once or without a terminal.
    #[arg(long, value_enum)]
    pub approvals: Option<ApprovalAnswer>,
    /// Answer MCP elicitations without asking: decline, or accept with the schema's
    /// defaults. Default: ask at the terminal in the REPL; decline with --once or without a
    /// terminal.
    #[arg(long, value_enum)]
    pub elicitation: Option<ElicitationAnswer>,
    /// An authorization token for the tools that need one (repeatable): issued with
    /// `troupe tokens issue` into the same data directory, whose store counts its uses.
    #[arg(long = "auth-token", value_name = "TOKEN")]
    pub auth_tokens: Vec<String>,
    /// The request layer of every turn's tool policy: only these tools (repeatable,
    /// patterns). It can only narrow what the configuration and agent files allow.
    #[arg(long = "allow-tool", value_name = "PATTERN")]
    pub allow_tools: Vec<String>,
    /// The request layer: never these tools (repeatable, patterns).
    #[arg(long = "deny-tool", value_name = "PATTERN")]
    pub deny_tools: Vec<String>,
}

/// `--approvals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApprovalAnswer {
    Deny,
    Approve,
}

/// `--elicitation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ElicitationAnswer {
    Decline,
    Defaults,
}

/// Says so when a script is given but another model answers (a configured endpoint wins:
/// a user with `OPENAI_API_KEY` exported would otherwise call it without noticing).
pub(crate) fn warn_if_script_unused(config: &TroupeConfig, script: Option<&std::path::Path>) {
    if script.is_some() && config.model.provider != troupe_runtime::config::Provider::Scripted {
        eprintln!(
            "troupe: warning: --script (or TROUPE_SCRIPT) is for the scripted model; ignored: \
             a model endpoint is configured (--provider scripted to use the script)"
        );
    }
}

/// SIGINT (Ctrl-C), listened to from its creation on: one that comes between two polls is
/// not lost.
struct Interrupts {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Interrupts {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            let signal =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
            Self { signal }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next SIGINT (never, when no listener could be set up).
    async fn next(&mut self) {
        #[cfg(unix)]
        match &mut self.signal {
            Some(signal) => {
                if signal.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How approvals are answered when nobody is asked at the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unattended {
    approvals: Option<ApprovalAnswer>,
    elicitation: Option<ElicitationAnswer>,
}

impl Unattended {
    /// The answer the flags give to a request about `subject`; `None`: no flag covers it.
    fn decision(&self, subject: &ApprovalSubject) -> Option<ApprovalDecision> {
        match subject {
            ApprovalSubject::McpElicitation { .. } => self.elicitation.map(|a| match a {
                // The approval store fills in the schema's defaults.
                ElicitationAnswer::Defaults => ApprovalDecision::ApproveOnce,
                ElicitationAnswer::Decline => ApprovalDecision::Deny {
                    reason: Some("declined (--elicitation decline)".into()),
                },
            }),
            // A question needs words no flag gives.
            ApprovalSubject::AgentQuestion { .. } => None,
            ApprovalSubject::Command
            | ApprovalSubject::CommandWithoutSandbox
            | ApprovalSubject::Patch
            | ApprovalSubject::McpSampling { .. } => self.approvals.map(|a| match a {
                ApprovalAnswer::Approve => ApprovalDecision::ApproveOnce,
                ApprovalAnswer::Deny => ApprovalDecision::Deny {
                    reason: Some("denied (--approvals deny)".into()),
                },
            }),
        }
    }
}

/// The safe answer when nobody can be asked and no flag says otherwise.
fn safe_decision() -> ApprovalDecision {
    ApprovalDecision::Deny {
        reason: Some("no terminal to ask (troupe chat --once)".into()),
    }
}

fn parse_policy(s: &str) -> Result<StoragePolicy, String> {
    s.parse()
        .map_err(|e: troupe_proto::AgentError| e.to_string())
}

/// Defaults < config file < environment < flags; the provider as
/// [`TroupeConfig::choose_provider`] picks it.
pub(crate) fn resolve(args: &ChatArgs) -> anyhow::Result<TroupeConfig> {
    let env = |k: &str| std::env::var(k).ok();
    let mut c = TroupeConfig::load(args.config.as_deref(), &env)?;
    let snake = |s: &str| s.replace('-', "_");
    if let Some(v) = &args.provider {
        c.model.provider =
            parse_enum("--provider", v, "scripted, openai-responses or openai-chat")?;
        c.named.provider = true;
    }
    if let Some(v) = &args.model {
        c.model.model.clone_from(v);
    }
    if let Some(v) = &args.base_url {
        c.model.base_url.clone_from(v);
        c.named.endpoint = true;
    }
    if let Some(v) = &args.api_key_env {
        c.model.api_key_env = Some(v.clone());
    }
    if let Some(v) = &args.tool_mode {
        c.model.tool_mode = parse_enum("--tool-mode", v, "native or text")?;
    }
    if let Some(v) = args.max_steps {
        c.chat.max_steps = v;
    }
    if let Some(v) = args.max_prompt_tokens {
        c.chat.max_prompt_tokens = Some(v);
    }
    if let Some(v) = args.warn_prompt_tokens {
        c.chat.warn_prompt_tokens = Some(v);
    }
    if let Some(v) = &args.over_budget {
        c.chat.over_budget = parse_enum("--over-budget", v, "reject or trim")?;
    }
    if let Some(v) = &args.tokenizer_model {
        c.chat.tokenizer_model = Some(v.clone());
    }
    if let Some(v) = &args.log_dir {
        c.log_dir.clone_from(v);
    }
    if let Some(v) = &args.data_dir {
        c.data_dir.clone_from(v);
    }
    if let Some(v) = args.storage_policy {
        c.chat.storage_policy = v;
    }
    if let Some(v) = &args.approval_policy {
        c.chat.approval_policy = parse_enum(
            "--approval-policy",
            &snake(v),
            "always, on-failure or never",
        )?;
    }
    if let Some(v) = &args.sandbox_policy {
        c.chat.sandbox_policy = parse_enum(
            "--sandbox-policy",
            &snake(v),
            "read-only, workspace-write or full-access",
        )?;
    }
    c.choose_provider();
    Ok(c)
}

/// The agents of the configuration (said on stderr, with the files that did not load); a
/// chat run's bindings last as long as the run.
fn agents(
    config: &TroupeConfig,
    script: bool,
) -> anyhow::Result<Option<troupe_actors::agents::AgentPorts>> {
    let catalog = troupe_runtime::agents::catalog(config);
    for error in &catalog.errors {
        eprintln!("troupe: {error}");
    }
    if !catalog.is_empty() {
        let ids: Vec<&str> = catalog.agents.keys().map(String::as_str).collect();
        eprintln!(
            "troupe: agents: {} (/hub <agent> <text> goes straight to one)",
            ids.join(", ")
        );
    }
    Ok(assembly::agent_ports(
        config,
        catalog,
        script,
        Arc::new(troupe_store::memory::MemoryStore::new()),
    )?)
}

/// Everything one chat process holds.
struct Chat {
    session: SessionHandle,
    events: broadcast::Receiver<Arc<EventEnvelope>>,
    conversations: Vec<ConversationId>,
    current: usize,
    storage_policy: StoragePolicy,
    /// Ask approvals at the terminal; without one, answer as `unattended` says.
    interactive: bool,
    /// The `--approvals` / `--elicitation` answers.
    unattended: Unattended,
    /// The safe default was announced on stderr.
    told_safe_default: bool,
    /// Stream text and tool activity to the terminal (the REPL), or print only the reply.
    live: bool,
    /// What every turn asks of tool governance (`--allow-tool`, `--deny-tool`,
    /// `--auth-token`).
    options: troupe_proto::governance::MessageOptions,
}

pub async fn run(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let config = resolve(&args)?;
    let telemetry = troupe_runtime::telemetry::install(&config.telemetry)?;
    let result = run_with(args, config).await;
    // Last: the session's spans have ended, the exporter flushes them (off this thread, which
    // is the only one a `--once` runtime has).
    telemetry.shutdown().await;
    result
}

async fn run_with(args: ChatArgs, config: TroupeConfig) -> anyhow::Result<ExitCode> {
    if args.once && args.question.is_none() {
        anyhow::bail!("--once needs a question: troupe chat --once \"...\"");
    }
    // Checked before anything starts or is written.
    let turn_options = message_options(&args)?;
    let tokens = assembly::try_build_tokens(&config)?;
    let tokenizer = tokens.encoding().to_owned();
    eprintln!("troupe: {}", config.model_line());
    if let Some(notice) = config.key_notice(&|name| std::env::var(name).ok()) {
        eprintln!("troupe: warning: {notice}");
    }
    warn_if_script_unused(&config, args.script.as_deref());
    let model = assembly::build_model(&config, args.script.as_deref())?;
    let info = model.info();
    let (model_name, provider_name) = (info.model, info.provider);
    let mut ports = assembly::session_ports(&config, model, tokens);
    ports.agents = agents(&config, args.script.is_some())?;
    // The directories it writes, checked before anything starts: a data directory that is a
    // file is said as such, not as a session that failed to start.
    if !args.ephemeral {
        for (what, dir) in [
            ("history", config.log_dir.clone()),
            ("data", config.data_dir.join("rollout")),
        ] {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create the {what} directory {}", dir.display()))?;
        }
    }
    // Every run's rollout is under the data dir (in memory with --ephemeral). Ttl content
    // earlier runs left there is swept before this one starts, and the sweeper goes on while
    // this run lives (this session's content included).
    let rollout: Arc<dyn RolloutStorage> = if args.ephemeral {
        Arc::new(MemoryRolloutStorage::new())
    } else {
        Arc::new(FileRolloutStorage::new(config.data_dir.join("rollout")))
    };
    ports.rollout_storage = Some(rollout.clone());
    let sweeper = TtlSweeper::new(None, rollout.clone());
    sweeper.sweep().await;
    let mut session_config = assembly::session_config(&config);
    if !args.auth_tokens.is_empty() {
        if args.ephemeral {
            anyhow::bail!(
                "--auth-token uses a token issued with `troupe tokens`, counted in the data \
                 directory's store, and --ephemeral writes nothing: use one or the other"
            );
        }
        // Tokens live in the store `troupe tokens` issues them to (as `troupe serve` has it).
        let store = troupe_service::open_token_store(&config).await?;
        session_config.conversation.token_book =
            Some(troupe_actors::token_book::spawn(store).await?);
    }
    let mode = if args.once { "once" } else { "interactive" };
    let meta = session_meta(
        &config,
        &session_config,
        mode,
        &model_name,
        &provider_name,
        &tokenizer,
    );
    let stop_sweeping = CancellationToken::new();
    let sweeping = sweeper.spawn(session_config.ttl_sweep_interval, stop_sweeping.clone());
    let session_id = SessionId::new();
    let (session, join) = SessionHandle::start(session_id, session_config, ports).await?;
    let events = session.subscribe().await?;
    let root = session.root().await?;
    let mut options = HistoryLogOptions::default().with_policy(root, config.chat.storage_policy);
    for (key, value) in meta {
        options = options.with_session_meta(key, value);
    }
    let log = if args.ephemeral {
        None
    } else {
        // From the session's first event, and never skipping one: the rollout's stream
        // refills from storage when the log falls behind, and what it has not delivered
        // when the session ends is read from storage at `finish`.
        let feed = HistoryFeed::of_session(&session, 0)
            .await?
            .with_storage(rollout.clone());
        Some(
            HistoryLog::start_with(&config.log_dir, session_id, feed, options)
                .await
                .with_context(|| {
                    format!("cannot write history under {}", config.log_dir.display())
                })?,
        )
    };
    let mut chat = Chat {
        session: session.clone(),
        events,
        conversations: vec![root],
        current: 0,
        storage_policy: config.chat.storage_policy,
        interactive: std::io::stdin().is_terminal(),
        unattended: Unattended {
            approvals: args.approvals,
            elicitation: args.elicitation,
        },
        told_safe_default: false,
        live: !args.once,
        options: turn_options,
    };
    let result = if args.once {
        let question = args.question.clone().unwrap_or_default();
        chat.wait_for_mcp(&config).await;
        once(&mut chat, question, args.json).await
    } else {
        repl(&mut chat, args.question.clone()).await
    };
    stop_sweeping.cancel();
    if let Some(sweeping) = sweeping {
        let _ = sweeping.await;
    }
    finish(session, join, log).await;
    result
}

/// The `session_start` meta of the JSONL history (T4): how this run was started and
/// configured. Names and switches only: no key, no header value, no endpoint URL (it may
/// carry credentials).
fn session_meta(
    config: &TroupeConfig,
    session: &troupe_actors::SessionConfig,
    mode: &str,
    model: &str,
    provider: &str,
    tokenizer: &str,
) -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    let root = &session.root;
    let conv = &session.conversation;
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let servers: Vec<&str> = config.mcp.servers.iter().map(|s| s.name.as_str()).collect();
    vec![
        ("mode", json!(mode)),
        ("model", json!(model)),
        ("provider", json!(provider)),
        // troupe sends no temperature: the provider's default applies.
        ("temperature", serde_json::Value::Null),
        ("tool_mode", json!(config.model.tool_mode)),
        (
            "tools",
            json!({
                "shell": conv.shell_tool,
                "plan": root.include_plan_tool,
                "apply_patch": root.include_apply_patch_tool,
                "web_search": root.tools_web_search_request,
                "mcp_servers": servers,
            }),
        ),
        ("approval_policy", json!(conv.approval_policy)),
        ("sandbox_policy", json!(conv.sandbox_policy)),
        ("storage_policy", json!(root.storage_policy)),
        ("max_steps", json!(conv.task.max_steps)),
        ("tokenizer", json!(tokenizer)),
        ("cwd", json!(cwd)),
    ]
}

/// `--allow-tool`, `--deny-tool` and `--auth-token` as a message's options.
fn message_options(args: &ChatArgs) -> anyhow::Result<troupe_proto::governance::MessageOptions> {
    let tools = troupe_proto::agent::ToolRules {
        whitelist: args.allow_tools.clone(),
        blacklist: args.deny_tools.clone(),
        authorization_required: Vec::new(),
    };
    if let Err(e) = tools.validate("--") {
        anyhow::bail!(
            "{}: {}",
            e.field
                .replace("whitelist", "allow-tool")
                .replace("blacklist", "deny-tool"),
            e.message
        );
    }
    Ok(troupe_proto::governance::MessageOptions {
        tools: (!tools.is_empty()).then_some(tools),
        authorization: args.auth_tokens.clone(),
    })
}

async fn finish(
    session: SessionHandle,
    join: tokio::task::JoinHandle<()>,
    log: Option<HistoryLogHandle>,
) {
    if let Err(e) = session.shutdown().await {
        eprintln!("troupe: shutdown: {e}");
    }
    let _ = join.await;
    if let Some(log) = log
        && let Err(e) = log.finish().await
    {
        eprintln!("troupe: history: {e}");
    }
}

async fn once(chat: &mut Chat, question: String, json: bool) -> anyhow::Result<ExitCode> {
    let reply = match chat.turn(question).await {
        Ok(reply) => reply,
        // Aborted because its task ignored the cancellation: cancelled all the same.
        Err(AgentError::Cancelled { reason }) => {
            if json {
                let error = AgentError::Cancelled {
                    reason: reason.clone(),
                };
                println!(
                    "{}",
                    serde_json::json!({"status": TaskStatus::Cancelled, "error": error})
                );
            }
            eprintln!("troupe: turn ended with cancelled: {reason}");
            return Ok(exit_code(TaskStatus::Cancelled));
        }
        Err(error) => return Err(error.into()),
    };
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else if !reply.text.is_empty() || reply.status == TaskStatus::Ok {
        // A turn that failed before any text prints nothing, not an empty line.
        println!("{}", reply.text);
    }
    if let Some(why) = ended_early(&reply) {
        eprintln!("troupe: turn ended with {}: {why}", reply.status.as_str());
    }
    Ok(exit_code(reply.status))
}

/// Why a turn did not end `ok`, for stderr: its error, or for a turn stopped by the step limit
/// (which carries none), how many steps it took and where the limit is set.
fn ended_early(reply: &MessageReply) -> Option<String> {
    match (&reply.error, reply.status) {
        // "cancelled: cancelled during …" said once.
        (Some(AgentError::Cancelled { reason }), TaskStatus::Cancelled) => Some(reason.clone()),
        (Some(e), _) => Some(e.to_string()),
        (None, TaskStatus::MaxSteps) => Some(format!(
            "stopped after {} step{} without a final answer (raise --max-steps, \
             TROUPE_MAX_STEPS or [chat] max_steps)",
            reply.stats.steps,
            if reply.stats.steps == 1 { "" } else { "s" }
        )),
        (None, _) => None,
    }
}

fn exit_code(status: TaskStatus) -> ExitCode {
    match status {
        TaskStatus::Ok => ExitCode::SUCCESS,
        TaskStatus::Error => ExitCode::from(2),
        TaskStatus::MaxSteps => ExitCode::from(3),
        TaskStatus::Cancelled => ExitCode::from(4),
    }
}

const HELP: &str = "\
commands:
  /help                         this list
  /new                          open a new conversation and switch to it
  /list                         list conversations (* = current)
  /switch N|ID                  switch to conversation N (from /list) or an id prefix
  /approve [N] [once|conversation|session]   answer a pending approval (default: the oldest, once)
  /deny [N]                     refuse a pending approval
  /compact                      replace this conversation's history by a summary
  /hub AGENT TEXT               send TEXT straight to an agent (no routing)
  /agents                       list the agents, their health and bindings
  /exit                         leave (also Ctrl-D)
anything else is sent to the model.";

async fn repl(chat: &mut Chat, first: Option<String>) -> anyhow::Result<ExitCode> {
    let mut editor = DefaultEditor::new()?;
    eprintln!("troupe chat — /help for commands, /exit or Ctrl-D to leave");
    if let Some(q) = first {
        chat.say(q, &mut editor).await;
    }
    loop {
        let prompt = format!("[{}]> ", chat.current + 1);
        let line = tokio::task::block_in_place(|| editor.readline(&prompt));
        let line = match line {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let line = line.trim().to_owned();
        if line.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line.as_str());
        match chat.command(&line, &mut editor).await {
            Ok(Flow::Continue) => {}
            Ok(Flow::Exit) => break,
            Err(e) => println!("! {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

enum Flow {
    Continue,
    Exit,
}

impl Chat {
    fn current_id(&self) -> ConversationId {
        self.conversations[self.current]
    }

    /// Before a `--once` turn: waits until every configured MCP server is connected or has
    /// failed, at most the pool's connect timeout (and a moment for the pool to report), so
    /// that the one turn sees their tools. A server that fails, or is not connected in time,
    /// is reported on stderr and the turn goes on without it.
    async fn wait_for_mcp(&mut self, config: &TroupeConfig) {
        if config.mcp.servers.is_empty() {
            return;
        }
        let pool = match self.session.mcp_pool().await {
            Ok(Some(pool)) => pool,
            Ok(None) => return,
            Err(e) => {
                eprintln!("troupe: MCP servers: {e}");
                return;
            }
        };
        let timeout = config.mcp.limits.connect_timeout;
        let deadline = tokio::time::Instant::now() + timeout + MCP_REPORT_GRACE;
        let mut warnings = Vec::new();
        let progress = loop {
            let progress = match pool.snapshot().await {
                Ok(snapshot) => McpProgress::of(&snapshot),
                Err(e) => {
                    eprintln!("troupe: MCP servers: {e}");
                    return;
                }
            };
            if progress.pending.is_empty() {
                break progress;
            }
            tokio::select! {
                e = self.events.recv() => match e {
                    Ok(e) => {
                        if let EventKind::Warning { code: WarningCode::McpServerFailed, message } =
                            &e.event
                        {
                            warnings.push(message.clone());
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break progress,
                },
                () = tokio::time::sleep_until(deadline) => break progress,
            }
        };
        for server in &progress.failed {
            let named = format!("`{server}`");
            match warnings.iter().find(|w| w.contains(&named)) {
                Some(w) => eprintln!("troupe: {w}; this turn goes on without it"),
                None => eprintln!(
                    "troupe: MCP server {named} failed to connect; this turn goes on without it"
                ),
            }
        }
        for server in &progress.pending {
            eprintln!(
                "troupe: MCP server `{server}` did not connect within {timeout:?}; this turn \
                 goes on without it"
            );
        }
    }

    async fn command(&mut self, line: &str, editor: &mut DefaultEditor) -> anyhow::Result<Flow> {
        let mut words = line.split_whitespace();
        let Some(head) = words.next().filter(|w| w.starts_with('/')) else {
            self.say(line.to_owned(), editor).await;
            return Ok(Flow::Continue);
        };
        let rest: Vec<&str> = words.collect();
        match head {
            "/exit" | "/quit" => return Ok(Flow::Exit),
            "/help" => println!("{HELP}"),
            "/new" => {
                let id = self
                    .session
                    .open(assembly::chat_conversation(self.storage_policy))
                    .await?;
                self.conversations.push(id);
                self.current = self.conversations.len() - 1;
                println!("conversation {} ({id})", self.current + 1);
            }
            "/list" => {
                for (i, id) in self.conversations.iter().enumerate() {
                    let mark = if i == self.current { '*' } else { ' ' };
                    println!("{mark} {} {id}", i + 1);
                }
            }
            "/switch" => {
                let which = rest.first().context("usage: /switch N|ID")?;
                self.current = self.find(which)?;
                println!("conversation {} ({})", self.current + 1, self.current_id());
            }
            "/approve" | "/deny" => self.answer_pending(head == "/approve", &rest).await?,
            // The session routes it: straight to the agent named.
            "/hub" => self.say(line.to_owned(), editor).await,
            "/agents" => {
                let agents = self.session.agents().await?;
                if agents.is_empty() {
                    println!("no agents (see [agents] dir in the configuration)");
                }
                for a in agents {
                    let health = match &a.health.detail {
                        Some(d) => format!("{}: {d}", a.health.status.as_str()),
                        None => a.health.status.as_str().to_owned(),
                    };
                    let bound: Vec<&str> = a
                        .bindings
                        .iter()
                        .map(|b| b.provider_session_id.as_str())
                        .collect();
                    println!(
                        "{}{} ({}, {}) {health}{}",
                        a.id,
                        if a.supervisor { " [supervisor]" } else { "" },
                        a.role,
                        a.provider.as_str(),
                        if bound.is_empty() {
                            String::new()
                        } else {
                            format!(" bound to {}", bound.join(", "))
                        }
                    );
                }
            }
            "/compact" => {
                let spinner = Spinner::start("compacting");
                let reply = self.session.compact(self.current_id()).await;
                spinner.stop();
                match reply {
                    Ok(r) if r.status == TaskStatus::Ok => {
                        println!("history compacted into a summary of {} chars", r.text.len())
                    }
                    Ok(r) => println!(
                        "! compaction failed ({}): {}",
                        r.status.as_str(),
                        r.error.map(|e| e.to_string()).unwrap_or_default()
                    ),
                    Err(e) => println!("! {e}"),
                }
            }
            other => println!("unknown command {other}; /help lists them"),
        }
        Ok(Flow::Continue)
    }

    fn find(&self, which: &str) -> anyhow::Result<usize> {
        if let Ok(n) = which.parse::<usize>()
            && (1..=self.conversations.len()).contains(&n)
        {
            return Ok(n - 1);
        }
        let hits: Vec<usize> = self
            .conversations
            .iter()
            .enumerate()
            .filter(|(_, id)| id.to_string().starts_with(which))
            .map(|(i, _)| i)
            .collect();
        match hits.as_slice() {
            [one] => Ok(*one),
            [] => anyhow::bail!("no conversation {which}; /list shows them"),
            _ => anyhow::bail!("`{which}` matches several conversations"),
        }
    }

    async fn answer_pending(&self, approve: bool, rest: &[&str]) -> anyhow::Result<()> {
        let pending = self.session.pending_approvals().await?;
        if pending.is_empty() {
            println!("nothing is waiting for approval");
            return Ok(());
        }
        let index = match rest.first().and_then(|w| w.parse::<usize>().ok()) {
            Some(n) if (1..=pending.len()).contains(&n) => n - 1,
            Some(n) => anyhow::bail!("no pending approval {n}"),
            None => 0,
        };
        let scope = rest.iter().find(|w| w.parse::<usize>().is_err()).copied();
        let decision = if approve {
            match scope.unwrap_or("once") {
                "once" => ApprovalDecision::ApproveOnce,
                "conversation" => ApprovalDecision::ApproveForConversation { ttl_secs: None },
                "session" => ApprovalDecision::ApproveForSession { ttl_secs: None },
                other => anyhow::bail!("`{other}`: once, conversation or session"),
            }
        } else {
            ApprovalDecision::Deny {
                reason: Some("denied at the terminal".into()),
            }
        };
        let p = &pending[index];
        self.session
            .respond_approval(p.approval_id, decision)
            .await?;
        println!(
            "{} `{}`",
            if approve { "approved" } else { "denied" },
            p.command.join(" ")
        );
        Ok(())
    }

    /// Sends a message from the REPL and shows the turn as it happens.
    async fn say(&mut self, text: String, editor: &mut DefaultEditor) {
        match self.turn_with(text, Some(editor)).await {
            Ok(reply) => {
                let s = &reply.stats;
                let status = match &reply.error {
                    Some(e) => format!("{}: {e}", reply.status.as_str()),
                    None => reply.status.as_str().to_owned(),
                };
                eprintln!(
                    "({status} · {} step{} · {} tool call{} · {} tokens in, {} out · {} ms)",
                    s.steps,
                    if s.steps == 1 { "" } else { "s" },
                    s.tool_calls,
                    if s.tool_calls == 1 { "" } else { "s" },
                    s.usage.input_tokens,
                    s.usage.output_tokens,
                    s.duration_ms
                );
            }
            Err(e) => println!("! {e}"),
        }
    }

    async fn turn(&mut self, text: String) -> Result<MessageReply, AgentError> {
        self.turn_with(text, None).await
    }

    /// Runs one turn, printing its events as they arrive and answering approvals.
    async fn turn_with(
        &mut self,
        text: String,
        mut editor: Option<&mut DefaultEditor>,
    ) -> Result<MessageReply, AgentError> {
        // Events of earlier turns are not this turn's.
        while self.events.try_recv().is_ok() {}
        let conversation = self.current_id();
        let session = self.session.clone();
        let options = self.options.clone();
        let mut reply =
            Box::pin(async move { session.message_with(conversation, text, options).await });
        let mut spinner = self.live.then(|| Spinner::start("thinking"));
        let mut view = TurnView::default();
        let mut interrupted = false;
        // One listener for the whole turn: a Ctrl-C that comes while an event is being shown
        // is kept for the next poll (a listener made anew each time around would miss it).
        let mut sigint = Interrupts::listen();
        let done = loop {
            tokio::select! {
                r = &mut reply => break r,
                // Ctrl-C cancels the turn, not the program (a second one is not special:
                // the turn is already being cancelled).
                () = sigint.next(), if !interrupted => {
                    interrupted = true;
                    if let Some(s) = spinner.take() {
                        s.stop();
                    }
                    eprintln!("^C cancelling the turn");
                    // Through the conversation, which knows its running task from the moment
                    // it starts it (the task registry may not have it listed yet).
                    if !matches!(self.session.cancel_conversation(conversation).await, Ok(n) if n > 0) {
                        // Nothing was running yet: the next Ctrl-C tries again.
                        interrupted = false;
                    }
                }
                e = self.events.recv() => match e {
                    Ok(e) if e.conversation_id == Some(conversation) => {
                        if let Some(ask) = self.show(&e, &mut view, &mut spinner) {
                            self.ask(ask, editor.as_deref_mut()).await;
                        }
                    }
                    // An in-process agent the turn dispatched to runs in a conversation of
                    // its own: its approvals are asked (or answered by the flags) here too.
                    Ok(e) if matches!(e.event, EventKind::ApprovalRequested { .. }) => {
                        if let Some(ask) = self.show(&e, &mut view, &mut spinner) {
                            self.ask(ask, editor.as_deref_mut()).await;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => eprintln!("(missed {n} events)"),
                    Err(broadcast::error::RecvError::Closed) => {}
                },
            }
        };
        // The reply can overtake the last events; show them up to this task's end.
        if let Ok(reply) = &done {
            let until = reply.task_id;
            let seen_end = view.finished.contains(&until);
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                if seen_end {
                    return;
                }
                while let Ok(e) = self.events.recv().await {
                    if e.conversation_id == Some(conversation) {
                        let _ = self.show(&e, &mut view, &mut spinner);
                    }
                    if e.task_id == Some(until) && matches!(e.event, EventKind::TaskFinished { .. })
                    {
                        break;
                    }
                }
            })
            .await;
            if self.live && !view.streamed.contains(&until) && !reply.text.is_empty() {
                println!("{}", reply.text);
            }
        }
        if let Some(s) = spinner.take() {
            s.stop();
        }
        done
    }

    /// Prints one event of the current turn; returns an approval to ask about.
    fn show(
        &self,
        e: &EventEnvelope,
        view: &mut TurnView,
        spinner: &mut Option<Spinner>,
    ) -> Option<Ask> {
        let quiet = !self.live;
        if let (EventKind::TaskFinished { .. }, Some(t)) = (&e.event, e.task_id) {
            view.finished.insert(t);
        }
        let mut stop_spinner = || {
            if let Some(s) = spinner.take() {
                s.stop();
            }
        };
        match &e.event {
            EventKind::AssistantChunk { delta } if !quiet => {
                stop_spinner();
                print!("{delta}");
                let _ = std::io::stdout().flush();
                view.open_line = true;
                if let Some(t) = e.task_id {
                    view.streamed.insert(t);
                }
            }
            EventKind::AssistantMessage { .. } if !quiet && view.open_line => {
                println!();
                view.open_line = false;
            }
            EventKind::ToolCallStarted { call, .. } if !quiet => {
                stop_spinner();
                println!("  → {} {}", call.name, call.arguments.0);
                *spinner = Some(Spinner::start("running"));
            }
            EventKind::ToolCallFinished {
                output, is_error, ..
            } if !quiet => {
                stop_spinner();
                let mark = if *is_error { "✗" } else { "←" };
                println!("  {mark} {}", clip(output, 400));
                *spinner = Some(Spinner::start("thinking"));
            }
            // Shown in a `--once` turn too (on stderr, which leaves its stdout to the reply):
            // a trimmed prompt or a tool that could not be offered changes the answer.
            EventKind::Warning { message, .. } => {
                stop_spinner();
                if quiet {
                    eprintln!("troupe: warning: {message}");
                } else {
                    eprintln!("  warning: {message}");
                }
            }
            EventKind::PlanUpdated { plan, .. } if !quiet => {
                stop_spinner();
                println!("  plan:");
                for step in plan {
                    let mark = match step.status {
                        troupe_proto::PlanStepStatus::Completed => "[x]",
                        troupe_proto::PlanStepStatus::InProgress => "[>]",
                        troupe_proto::PlanStepStatus::Pending => "[ ]",
                    };
                    println!("    {mark} {}", step.step);
                }
            }
            EventKind::ApprovalRequested {
                approval_id,
                command,
                reason,
                subject,
            } => {
                stop_spinner();
                return Some(Ask {
                    approval_id: *approval_id,
                    command: command.join(" "),
                    reason: reason.clone(),
                    subject: subject.clone(),
                });
            }
            _ => {}
        }
        None
    }

    /// Answers as `--approvals` / `--elicitation` say; else asks a human at the terminal;
    /// without one, denies (declines an elicitation), saying so once.
    async fn ask(&mut self, ask: Ask, editor: Option<&mut DefaultEditor>) {
        let elicitation = matches!(ask.subject, ApprovalSubject::McpElicitation { .. });
        let decision = match (
            self.unattended.decision(&ask.subject),
            editor,
            self.interactive,
        ) {
            (Some(decision), _, _) => {
                let verb = if decision.approves() {
                    if elicitation {
                        "accepted with the schema's defaults"
                    } else {
                        "approved"
                    }
                } else if elicitation {
                    "declined"
                } else {
                    "denied"
                };
                eprintln!("troupe: `{}` {verb}", ask.command);
                decision
            }
            (None, Some(editor), true) if ask.question().is_some() => {
                let (agent, question) = ask.question().unwrap_or_default();
                println!("  ? agent `{agent}` asks: {question}");
                let answer = tokio::task::block_in_place(|| {
                    editor.readline("    your answer (empty: refuse) > ")
                })
                .unwrap_or_default();
                match answer.trim() {
                    "" => ApprovalDecision::Deny {
                        reason: Some("no answer at the terminal".into()),
                    },
                    text => troupe_proto::approval::agent_answer(text),
                }
            }
            (None, Some(editor), true) => {
                println!("  ? approval needed: `{}` ({})", ask.command, ask.reason);
                let answer = tokio::task::block_in_place(|| {
                    editor.readline(
                        "    [y] once  [c] this conversation  [s] this session  [n] deny > ",
                    )
                })
                .unwrap_or_default();
                match answer.trim() {
                    "y" | "yes" => ApprovalDecision::ApproveOnce,
                    "c" => ApprovalDecision::ApproveForConversation { ttl_secs: None },
                    "s" => ApprovalDecision::ApproveForSession { ttl_secs: None },
                    _ => ApprovalDecision::Deny {
                        reason: Some("denied at the terminal".into()),
                    },
                }
            }
            (None, _, _) => {
                if !self.told_safe_default {
                    self.told_safe_default = true;
                    eprintln!(
                        "troupe: nobody can be asked here: approvals are denied and MCP \
                         elicitations declined (--approvals, --elicitation answer them)"
                    );
                }
                eprintln!(
                    "troupe: `{}` needs an answer; {}",
                    ask.command,
                    if elicitation { "declined" } else { "denied" }
                );
                safe_decision()
            }
        };
        let approved = decision.approves();
        if let Err(e) = self
            .session
            .respond_approval(ask.approval_id, decision)
            .await
        {
            eprintln!("troupe: approval: {e}");
            // Defaults the schema lacks: decline rather than leave the request waiting.
            if approved && elicitation {
                let _ = self
                    .session
                    .respond_approval(ask.approval_id, safe_decision())
                    .await;
            }
        }
    }
}

/// How long past the connect timeout `--once` waits for the pool to report a server.
const MCP_REPORT_GRACE: Duration = Duration::from_millis(500);

/// Where the configured MCP servers stand.
#[derive(Debug, Default, PartialEq, Eq)]
struct McpProgress {
    /// Failed at least once and not connected now.
    failed: Vec<String>,
    /// Neither connected nor failed yet.
    pending: Vec<String>,
}

impl McpProgress {
    fn of(snapshot: &PoolSnapshot) -> Self {
        let mut progress = Self::default();
        for server in &snapshot.servers {
            match server.phase {
                "ready" => {}
                "backoff" => progress.failed.push(server.name.clone()),
                _ if server.failures > 0 => progress.failed.push(server.name.clone()),
                _ => progress.pending.push(server.name.clone()),
            }
        }
        progress
    }
}

/// A pending approval seen during a turn.
struct Ask {
    approval_id: troupe_proto::ApprovalId,
    command: String,
    reason: String,
    subject: ApprovalSubject,
}

impl Ask {
    /// The agent and its question, when a remote agent asks one.
    fn question(&self) -> Option<(&str, &str)> {
        match &self.subject {
            ApprovalSubject::AgentQuestion { agent_id, question } => {
                Some((agent_id.as_str(), question.as_str()))
            }
            _ => None,
        }
    }
}

/// What the terminal shows of the current turn.
#[derive(Default)]
struct TurnView {
    /// A chunk left the cursor mid-line.
    open_line: bool,
    /// Tasks whose text was streamed (so the final text is not printed twice).
    streamed: std::collections::HashSet<TaskId>,
    /// Tasks whose end was seen.
    finished: std::collections::HashSet<TaskId>,
}

fn clip(s: &str, max: usize) -> String {
    let one_line = s.trim().replace('\n', " ⏎ ");
    match one_line.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_actors::mcp_pool::ServerSnapshot;

    fn server(name: &str, phase: &'static str, failures: u32) -> ServerSnapshot {
        ServerSnapshot {
            name: name.to_owned(),
            phase,
            refs: 1,
            tools: Vec::new(),
            failures,
            process_id: None,
        }
    }

    #[test]
    fn servers_are_ready_failed_or_pending() {
        let snapshot = PoolSnapshot {
            servers: vec![
                server("up", "ready", 0),
                server("back", "ready", 2),
                server("down", "backoff", 1),
                server("retrying", "connecting", 1),
                server("starting", "connecting", 0),
                server("unused", "idle", 0),
            ],
            views: 1,
            calls_held: 0,
        };
        assert_eq!(
            McpProgress::of(&snapshot),
            McpProgress {
                failed: vec!["down".into(), "retrying".into()],
                pending: vec!["starting".into(), "unused".into()],
            }
        );
    }

    #[test]
    fn flags_answer_what_they_name_and_nothing_else() {
        let elicit = ApprovalSubject::McpElicitation {
            server: "s".into(),
            message: "name?".into(),
            schema: troupe_proto::Json::empty_object(),
        };
        let sampling = ApprovalSubject::McpSampling {
            server: "s".into(),
            request: troupe_proto::Json::empty_object(),
        };
        let none = Unattended {
            approvals: None,
            elicitation: None,
        };
        let question = ApprovalSubject::AgentQuestion {
            agent_id: "remote".into(),
            question: "which branch?".into(),
        };
        for subject in [&ApprovalSubject::Command, &elicit, &sampling, &question] {
            assert_eq!(none.decision(subject), None);
        }
        let yes = Unattended {
            approvals: Some(ApprovalAnswer::Approve),
            elicitation: Some(ElicitationAnswer::Defaults),
        };
        assert_eq!(
            yes.decision(&ApprovalSubject::Command),
            Some(ApprovalDecision::ApproveOnce)
        );
        assert_eq!(yes.decision(&sampling), Some(ApprovalDecision::ApproveOnce));
        assert_eq!(yes.decision(&elicit), Some(ApprovalDecision::ApproveOnce));
        assert_eq!(yes.decision(&question), None, "no flag answers a question");
        let only_commands = Unattended {
            approvals: Some(ApprovalAnswer::Approve),
            elicitation: None,
        };
        assert_eq!(only_commands.decision(&elicit), None);
        let no = Unattended {
            approvals: Some(ApprovalAnswer::Deny),
            elicitation: Some(ElicitationAnswer::Decline),
        };
        assert!(
            !no.decision(&ApprovalSubject::Command)
                .is_some_and(|d| d.approves())
        );
        assert!(no.decision(&elicit).is_some_and(|d| !d.approves()));
        assert!(!safe_decision().approves());
    }
}
