//! The `acp` kind of agent in a session's AgentHub: an external process that speaks ACP,
//! behind troupe's one agent interface ([`AgentProvider`]).
//!
//! One process per provider session: a binding (`bindingScope = "session"`) keeps its process
//! for the life of the troupe session; a dispatch's own session (`"dispatch"`) is stopped when
//! its dispatch ends. Each process is an [`AcpAgent`], which restarts it with backoff after a
//! crash and loads its session again.
//!
//! - `initialize` starts a process and shakes hands with it, so that a command that cannot
//!   run fails the first dispatch clearly; that process serves the next session opened.
//! - `open_session` is `session/new`; `resume_session` is `session/load` (or
//!   `session/resume`) of the bound session in a new process. When the agent cannot take
//!   it up, the client has opened another session already: that one is answered as
//!   [`ResumeError::Replaced`], so the hub binds it and says why.
//! - `handle` is one `session/prompt` (after the session's previous turn, if one still
//!   runs). The agent's updates become `agent_update` events of
//!   the dispatching task as they come; its permission requests answer to the tool policy
//!   of its calls first ([`crate::client::governed`]: a denied tool is refused without
//!   asking, with `policy_rejected`), then become approvals of that task in the session's
//!   ApprovalStore ([`ApprovalStorePermissions`]); a tool call it ran outside troupe's word
//!   (a denied tool, or one that needs a token, without asking; any call it was refused) is
//!   an `ungoverned_tool_call` warning; a cancelled (or
//!   expired) dispatch sends `session/cancel`. A process that dies mid-turn fails the
//!   dispatch (`interrupted`); the next dispatch starts it again and loads the session
//!   (an `agent_update` with status `restarted` says so), or reports the session it had to
//!   open instead ([`AgentRunContext::session_replaced`]).
//! - `shutdown` stops every process (SIGTERM, then SIGKILL).

use crate::client::governed::{Asked, ungoverned};
use crate::client::{
    AcpAgent, AcpAgentSpec, AgentCommand, ApprovalStorePermissions, Governed, RestartPolicy,
    StopReason, Turn, command_of,
};
use crate::error::AcpError;
use crate::event::{AcpEvent, PermissionDecision};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use troupe_actors::agents::{
    AgentInput, AgentOutput, AgentProvider, AgentProviderFactory, AgentRunContext, ProviderEnv,
    ResumeError, SessionContext,
};
use troupe_actors::governance::TaskGovernance;
use troupe_proto::agent::{
    AgentDefinition, AgentHealth, AgentUpdateKind, BindingScope, ProviderKind, ProviderSpec,
};
use troupe_proto::{AgentError, EventKind, Json, WarningCode};

/// Builds the providers of `acp` agents.
#[derive(Debug, Clone)]
pub struct AcpFactory {
    /// The wait before a process is started again after a crash.
    pub restart: RestartPolicy,
    /// How long `initialize` may take.
    pub handshake_timeout: Duration,
    /// How long a process has after SIGTERM before SIGKILL.
    pub shutdown_grace: Duration,
}

impl Default for AcpFactory {
    fn default() -> Self {
        let spec = AcpAgentSpec::new("", AgentCommand::default());
        Self {
            restart: spec.restart,
            handshake_timeout: spec.handshake_timeout,
            shutdown_grace: spec.shutdown_grace,
        }
    }
}

impl AcpFactory {
    /// The process an agent's definition names.
    fn spec(&self, definition: &AgentDefinition) -> Result<AcpAgentSpec, AgentError> {
        let ProviderSpec::Acp {
            command,
            args,
            env,
            cwd,
        } = &definition.provider
        else {
            return Err(AgentError::invalid(format!(
                "agent `{}` is not an acp agent",
                definition.id
            )));
        };
        let mut spec = AcpAgentSpec::new(
            definition.id.clone(),
            AgentCommand {
                command: command.clone(),
                args: args.clone(),
                env: env.clone(),
                cwd: cwd.clone(),
            },
        );
        spec.restart = self.restart;
        spec.handshake_timeout = self.handshake_timeout;
        spec.shutdown_grace = self.shutdown_grace;
        Ok(spec)
    }
}

impl AgentProviderFactory for AcpFactory {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Acp
    }

    /// The command is there and its working directory exists (nothing is started).
    fn probe(&self, definition: &AgentDefinition) -> AgentHealth {
        match self.spec(definition) {
            Ok(spec) => match runnable(&spec.command) {
                Ok(()) => AgentHealth::ok(),
                Err(why) => AgentHealth::unavailable(why),
            },
            Err(e) => AgentHealth::unavailable(e.to_string()),
        }
    }

    fn build(
        &self,
        definition: &AgentDefinition,
        _env: &ProviderEnv,
    ) -> Result<Arc<dyn AgentProvider>, AgentError> {
        Ok(Arc::new(AcpProvider {
            spec: self.spec(definition)?,
            per_dispatch: definition.session.binding_scope == BindingScope::Dispatch,
            processes: Mutex::new(Processes::default()),
        }))
    }
}

/// Whether `command` can be started: its program is a file (a path, or a name on `PATH`)
/// and its working directory exists. `Err` says what is missing.
pub fn runnable(command: &AgentCommand) -> Result<(), String> {
    if let Some(cwd) = &command.cwd
        && !cwd.is_dir()
    {
        return Err(format!(
            "its working directory {} does not exist",
            cwd.display()
        ));
    }
    let program = Path::new(&command.command);
    let found = if program.components().count() > 1 {
        let path = match &command.cwd {
            Some(cwd) if program.is_relative() => cwd.join(program),
            _ => program.to_path_buf(),
        };
        path.is_file()
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir: PathBuf| dir.join(program).is_file())
        })
    };
    if found {
        Ok(())
    } else {
        Err(format!("command `{}` is not found", command.command))
    }
}

/// The processes of one agent in one session. A plain mutex, held only to look up or move
/// an entry (never across an await): the provider is called from several dispatches at once.
#[derive(Default)]
struct Processes {
    /// By provider session id.
    sessions: BTreeMap<String, AcpAgent>,
    /// Started by `initialize`, not yet holding a session.
    spare: Option<AcpAgent>,
}

/// An `acp` agent of one session.
pub struct AcpProvider {
    spec: AcpAgentSpec,
    /// Sessions are the dispatches' own: each process stops with its dispatch.
    per_dispatch: bool,
    processes: Mutex<Processes>,
}

/// A process not yet in the map: stopped if the operation that started it is dropped (its
/// dispatch cancelled) or fails.
struct Unplaced(Option<AcpAgent>);

impl Unplaced {
    fn agent(&self) -> Result<&AcpAgent, AgentError> {
        self.0
            .as_ref()
            .ok_or_else(|| AgentError::internal("the ACP process was already placed"))
    }

    fn place(mut self) -> Option<AcpAgent> {
        self.0.take()
    }
}

impl Drop for Unplaced {
    fn drop(&mut self) {
        if let Some(agent) = self.0.take() {
            tokio::spawn(async move {
                agent.shutdown().await;
            });
        }
    }
}

impl AcpProvider {
    fn with<T>(&self, f: impl FnOnce(&mut Processes) -> T) -> T {
        let mut guard = self
            .processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// A started, initialized process: the spare one, or a new one.
    async fn process(&self) -> Result<Unplaced, AgentError> {
        if let Some(spare) = self.with(|p| p.spare.take()) {
            return Ok(Unplaced(Some(spare)));
        }
        let agent = Unplaced(Some(AcpAgent::spawn(self.spec.clone()).await?));
        agent.agent()?.initialize().await?;
        Ok(agent)
    }

    fn place(&self, session_id: &str, agent: Unplaced) {
        if let Some(agent) = agent.place() {
            self.with(|p| p.sessions.insert(session_id.to_owned(), agent));
        }
    }

    fn agent_of(&self, session_id: &str) -> Option<AcpAgent> {
        self.with(|p| p.sessions.get(session_id).cloned())
    }

    /// The process of `session_id`; a session no process holds (its process was stopped) is
    /// loaded again in a new one, or replaced (said through `ctx`).
    async fn agent_for(&self, ctx: &AgentRunContext<'_>) -> Result<(AcpAgent, String), AgentError> {
        let session_id = ctx.provider_session_id;
        if let Some(agent) = self.agent_of(session_id) {
            return Ok((agent, session_id.to_owned()));
        }
        let process = self.process().await?;
        let opened = process.agent()?.open_session(Some(session_id)).await?;
        let agent = process.agent()?.clone();
        self.place(&opened.session_id, process);
        if let Some(replaced) = &opened.replaced {
            ctx.session_replaced(&opened.session_id, &replaced.reason);
        }
        Ok((agent, opened.session_id))
    }

    /// Moves a session's process to the id it has now.
    fn rekey(&self, from: &str, to: &str) {
        self.with(|p| {
            if let Some(agent) = p.sessions.remove(from) {
                p.sessions.insert(to.to_owned(), agent);
            }
        });
    }

    async fn stop(&self, session_id: &str) {
        if let Some(agent) = self.with(|p| p.sessions.remove(session_id)) {
            agent.shutdown().await;
        }
    }
}

/// The process of a dispatch's own session (`bindingScope = "dispatch"`), stopped when the
/// dispatch's turn is dropped before it ended (its dispatch cancelled or its lease expired:
/// the worker drops `handle` mid-turn), so that it does not live on until the session ends.
struct DispatchProcess<'a> {
    provider: &'a AcpProvider,
    session_id: Option<String>,
}

impl DispatchProcess<'_> {
    /// The turn ended: its process is stopped by the caller, awaited.
    fn ended(mut self) -> Option<String> {
        self.session_id.take()
    }
}

impl Drop for DispatchProcess<'_> {
    fn drop(&mut self) {
        let Some(session_id) = self.session_id.take() else {
            return;
        };
        if let Some(agent) = self.provider.with(|p| p.sessions.remove(&session_id)) {
            tracing::debug!(agent_id = %self.provider.spec.agent_id, %session_id, "a dispatch's ACP process stops with its dropped turn");
            tokio::spawn(async move {
                agent.shutdown().await;
            });
        }
    }
}

#[async_trait]
impl AgentProvider for AcpProvider {
    async fn initialize(&self) -> Result<(), AgentError> {
        let process = self.process().await?;
        if let Some(agent) = process.place() {
            let old = self.with(|p| p.spare.replace(agent));
            if let Some(old) = old {
                old.shutdown().await;
            }
        }
        Ok(())
    }

    async fn open_session(&self, _ctx: &SessionContext<'_>) -> Result<String, AgentError> {
        let process = self.process().await?;
        let opened = process.agent()?.open_session(None).await?;
        self.place(&opened.session_id, process);
        Ok(opened.session_id)
    }

    async fn resume_session(
        &self,
        provider_session_id: &str,
        _ctx: &SessionContext<'_>,
    ) -> Result<(), ResumeError> {
        if self.agent_of(provider_session_id).is_some() {
            return Ok(());
        }
        let failed = |e: AgentError| ResumeError::Failed(e);
        let process = self.process().await.map_err(failed)?;
        let opened = process
            .agent()
            .map_err(failed)?
            .open_session(Some(provider_session_id))
            .await
            .map_err(|e| failed(e.into()))?;
        self.place(&opened.session_id, process);
        match opened.replaced {
            Some(replaced) => Err(ResumeError::Replaced {
                provider_session_id: opened.session_id,
                reason: replaced.reason,
            }),
            None => Ok(()),
        }
    }

    async fn handle(
        &self,
        input: AgentInput,
        ctx: &AgentRunContext<'_>,
    ) -> Result<AgentOutput, AgentError> {
        // Made before the first await: the session `open_session` placed is the dispatch's.
        let mut own = self.per_dispatch.then(|| DispatchProcess {
            provider: self,
            session_id: Some(ctx.provider_session_id.to_owned()),
        });
        let (agent, session_id) = self.agent_for(ctx).await?;
        if let Some(own) = &mut own {
            own.session_id = Some(session_id.clone());
        }
        let result = turn(&agent, &session_id, input, ctx).await;
        if let Ok((outcome, _)) = &result
            && outcome.session_id != session_id
        {
            self.rekey(&session_id, &outcome.session_id);
        }
        if let Some(own) = own {
            own.ended();
            let now = result
                .as_ref()
                .map_or(session_id.as_str(), |(o, _)| o.session_id.as_str());
            self.stop(now).await;
        }
        let (outcome, denied) = result?;
        if ctx.cancel.is_cancelled() {
            return Err(AgentError::cancelled("the dispatch was cancelled"));
        }
        if outcome.stop_reason == StopReason::Cancelled {
            return Err(denied.unwrap_or_else(|| AgentError::ToolError {
                name: "acp_agent".into(),
                message: format!(
                    "`{}` ended its turn without an answer (stop reason: cancelled)",
                    self.spec.agent_id
                ),
            }));
        }
        Ok(AgentOutput {
            text: outcome.text,
            usage: None,
        })
    }

    async fn health(&self) -> AgentHealth {
        let agents: Vec<AcpAgent> = self.with(|p| {
            p.sessions
                .values()
                .cloned()
                .chain(p.spare.clone())
                .collect()
        });
        let mut details = Vec::new();
        let mut failing = None;
        for agent in agents {
            let h = agent.health().await;
            details.push(format!(
                "pid {} {}",
                h.pid.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                serde_json::to_value(h.phase)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ));
            if !h.ok {
                failing = Some(h.last_error.unwrap_or_else(|| "not running".into()));
            }
        }
        match failing {
            Some(why) => AgentHealth::degraded(format!("{why} ({})", details.join(", "))),
            None if details.is_empty() => AgentHealth::ok(),
            None => AgentHealth {
                detail: Some(details.join(", ")),
                ..AgentHealth::ok()
            },
        }
    }

    async fn shutdown(&self) {
        let agents: Vec<AcpAgent> = self.with(|p| {
            std::mem::take(&mut p.sessions)
                .into_values()
                .chain(p.spare.take())
                .collect()
        });
        futures::future::join_all(agents.iter().map(AcpAgent::shutdown)).await;
    }
}

/// Sends `session/cancel` when the dispatch is cancelled, until dropped (the turn ended). It
/// runs on its own: the dispatch's worker drops `handle` at once when cancelled.
fn cancel_on(agent: &AcpAgent, cancel: &CancellationToken) -> DropGuard {
    let done = CancellationToken::new();
    let guard = done.clone().drop_guard();
    let (agent, cancel) = (agent.clone(), cancel.clone());
    tokio::spawn(async move {
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                let _ = agent.cancel().await;
            }
            () = done.cancelled() => {}
        }
    });
    guard
}

/// How often a dispatch looks again whether its session's previous turn has ended.
const BUSY_POLL: Duration = Duration::from_millis(50);

/// Sends `turn` once the session runs no other: an ACP session takes one prompt at a time,
/// and a turn cancelled a moment ago may still be winding down, so a dispatch to a busy
/// session waits for it (its lease bounds the wait) instead of failing.
async fn prompt_when_free(
    agent: &AcpAgent,
    turn: Turn,
    cancel: &CancellationToken,
) -> Result<crate::TurnOutcome, AcpError> {
    loop {
        match agent.prompt(turn.clone()).await {
            Err(AcpError::Busy) => {
                tokio::select! {
                    () = cancel.cancelled() => {
                        return Err(AcpError::Cancelled {
                            reason: "the dispatch was cancelled while its session was busy".into(),
                        });
                    }
                    () = tokio::time::sleep(BUSY_POLL) => {}
                }
            }
            other => return other,
        }
    }
}

/// One prompt, its events forwarded as they come; answers the outcome and, when the agent
/// ended the turn after a refused permission, that refusal.
async fn turn(
    agent: &AcpAgent,
    session_id: &str,
    input: AgentInput,
    ctx: &AgentRunContext<'_>,
) -> Result<(crate::TurnOutcome, Option<AgentError>), AgentError> {
    let refused = Arc::new(std::sync::OnceLock::new());
    let permissions = Arc::new(ApprovalStorePermissions {
        approvals: ctx.approvals.clone(),
        conversation_id: ctx.parent.conversation_id,
        task_id: ctx.parent.task_id,
        agent_id: ctx.agent_id.to_owned(),
        timeout: Some(ctx.approval_timeout),
        cancel: ctx.cancel.clone(),
        governed: Some(Governed {
            governance: ctx.governance.clone(),
            token_book: ctx.token_book.cloned(),
            events: ctx.events.clone(),
            chain: ctx.chain.clone(),
            span: ctx.span.clone(),
            refused: refused.clone(),
        }),
    });
    let (tx, mut rx) = mpsc::channel(256);
    let _cancel = cancel_on(agent, ctx.cancel);
    let prompt = prompt_when_free(
        agent,
        Turn {
            text: input.text,
            events: Some(tx),
            permissions,
        },
        ctx.cancel,
    );
    tokio::pin!(prompt);
    let mut forward = Forward {
        session_id: session_id.to_owned(),
        governance: ctx.governance.clone(),
        asked: BTreeMap::new(),
        calls: BTreeMap::new(),
        warned: BTreeSet::new(),
        denied: None,
    };
    let result = loop {
        tokio::select! {
            Some(event) = rx.recv() => forward.event(ctx, event),
            r = &mut prompt => break r,
        }
    };
    while let Ok(event) = rx.try_recv() {
        forward.event(ctx, event);
    }
    let outcome = result.map_err(|e| match e {
        AcpError::Exited { .. } => AgentError::interrupted(format!(
            "`{}`: {e}; the next dispatch starts it again",
            ctx.agent_id
        )),
        other => other.into(),
    })?;
    if let Some(reopened) = &outcome.reopened {
        let (text, replaced) = match &reopened.replaced {
            Some(r) => (
                format!(
                    "the agent's process was started again and could not take session {} up ({}): it runs in {} now",
                    r.previous, r.reason, reopened.session_id
                ),
                Some(r.reason.clone()),
            ),
            None => (
                format!(
                    "the agent's process was started again; session {} goes on",
                    reopened.session_id
                ),
                None,
            ),
        };
        forward.emit(ctx, AgentUpdateKind::Status, text, None);
        if let Some(reason) = replaced {
            ctx.session_replaced(&reopened.session_id, &reason);
        }
    }
    // A refusal by policy says more than the agent's word that it was refused.
    let denied = refused.get().cloned().or(forward.denied);
    Ok((outcome, denied))
}

/// Turns a turn's [`AcpEvent`]s into `agent_update` events.
struct Forward {
    session_id: String,
    /// The policy the agent's tool calls answer to.
    governance: Arc<TaskGovernance>,
    /// Permission requests by tool call: the command (for a refusal's), and the answer.
    asked: BTreeMap<String, (Vec<String>, Asked)>,
    /// The kind and input of each tool call, as its updates change them.
    calls: BTreeMap<String, (Option<String>, Option<serde_json::Value>)>,
    /// Tool calls already reported as ungoverned.
    warned: BTreeSet<String>,
    denied: Option<AgentError>,
}

impl Forward {
    fn emit(
        &self,
        ctx: &AgentRunContext<'_>,
        update: AgentUpdateKind,
        text: String,
        data: Option<serde_json::Value>,
    ) {
        ctx.emit(EventKind::AgentUpdate {
            dispatch_id: ctx.dispatch_id,
            agent_id: ctx.agent_id.to_owned(),
            provider_session_id: self.session_id.clone(),
            update,
            text,
            data: data.map(Json),
        });
    }

    /// A tool call that runs outside troupe's word: a warning, once per call (troupe could
    /// not stop it; see [`ungoverned`]).
    fn watch(&mut self, ctx: &AgentRunContext<'_>, id: &str, title: &str, status: Option<&str>) {
        if self.warned.contains(id) {
            return;
        }
        let (kind, raw_input) = self
            .calls
            .get(id)
            .map_or((None, None), |(k, i)| (k.as_deref(), i.as_ref()));
        let asked = self.asked.get(id).map_or(Asked::Never, |(_, a)| *a);
        let Some(why) = ungoverned(&self.governance.policy, (kind, raw_input), status, asked)
        else {
            return;
        };
        self.warned.insert(id.to_owned());
        let message = format!(
            "ACP agent `{}` ran a tool call troupe did not allow, and troupe could not stop it: {why} (tool call `{id}`, kind `{}`: {title}); set the agent's own approval policy so that it asks and abides by the answer",
            ctx.agent_id,
            kind.unwrap_or("other"),
        );
        tracing::warn!(agent_id = %ctx.agent_id, tool_call_id = %id, %message, "ungoverned ACP tool call");
        ctx.emit(EventKind::Warning {
            code: WarningCode::UngovernedToolCall,
            message,
        });
    }

    fn event(&mut self, ctx: &AgentRunContext<'_>, event: AcpEvent) {
        match &event {
            AcpEvent::ToolCall {
                tool_call_id,
                title,
                kind,
                status,
                raw_input,
            } => {
                self.calls.insert(
                    tool_call_id.clone(),
                    (Some(kind.clone()), raw_input.clone()),
                );
                self.watch(ctx, tool_call_id, title, Some(status));
            }
            AcpEvent::ToolCallUpdate {
                tool_call_id,
                status,
                title,
                kind,
                raw_input,
                ..
            } => {
                let seen = self.calls.entry(tool_call_id.clone()).or_default();
                if kind.is_some() {
                    seen.0.clone_from(kind);
                }
                if raw_input.is_some() {
                    seen.1.clone_from(raw_input);
                }
                let title = title.clone().unwrap_or_default();
                self.watch(ctx, tool_call_id, &title, status.as_deref());
            }
            _ => {}
        }
        let data = serde_json::to_value(&event).ok();
        let (update, text) = match &event {
            AcpEvent::MessageChunk { text } => (AgentUpdateKind::MessageChunk, text.clone()),
            AcpEvent::ThoughtChunk { text } => (AgentUpdateKind::ThoughtChunk, text.clone()),
            AcpEvent::ToolCall { title, .. } => (AgentUpdateKind::ToolCall, title.clone()),
            AcpEvent::ToolCallUpdate {
                status,
                output,
                title,
                ..
            } => (
                AgentUpdateKind::ToolCallUpdate,
                output
                    .clone()
                    .or_else(|| title.clone())
                    .or_else(|| status.clone())
                    .unwrap_or_default(),
            ),
            AcpEvent::Plan { entries } => (
                AgentUpdateKind::Plan,
                entries
                    .iter()
                    .map(|e| format!("[{}] {}", e.status, e.content))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            AcpEvent::PermissionRequested(request) => {
                self.asked.insert(
                    request.tool_call_id.clone(),
                    (command_of(request), Asked::Pending),
                );
                // The request's kind and input count for the call when its own said nothing.
                let seen = self.calls.entry(request.tool_call_id.clone()).or_default();
                if seen.0.is_none() {
                    seen.0.clone_from(&request.kind);
                }
                if seen.1.is_none() {
                    seen.1.clone_from(&request.raw_input);
                }
                (
                    AgentUpdateKind::Other,
                    request.title.clone().unwrap_or_default(),
                )
            }
            AcpEvent::PermissionAnswered {
                tool_call_id,
                decision,
            } => {
                let allowed = matches!(
                    decision,
                    PermissionDecision::AllowOnce | PermissionDecision::AllowAlways
                );
                if let Some((_, asked)) = self.asked.get_mut(tool_call_id) {
                    *asked = if allowed {
                        Asked::Allowed
                    } else {
                        Asked::Refused
                    };
                }
                if matches!(
                    decision,
                    PermissionDecision::RejectOnce | PermissionDecision::RejectAlways
                ) {
                    self.denied = Some(AgentError::ApprovalDenied {
                        command: self
                            .asked
                            .get(tool_call_id)
                            .map(|(c, _)| c.clone())
                            .unwrap_or_default(),
                        reason: format!(
                            "`{}` asked for a permission that was refused, and ended its turn",
                            ctx.agent_id
                        ),
                    });
                }
                (AgentUpdateKind::Other, decision.as_str().to_owned())
            }
            _ => (AgentUpdateKind::Other, String::new()),
        };
        self.emit(ctx, update, text, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(program: &str, cwd: Option<&Path>) -> AgentCommand {
        AgentCommand {
            command: program.into(),
            cwd: cwd.map(Path::to_path_buf),
            ..AgentCommand::default()
        }
    }

    #[test]
    fn a_command_is_runnable_when_its_program_and_directory_are_there() {
        assert_eq!(runnable(&command("sh", None)), Ok(()));
        assert_eq!(runnable(&command("/bin/sh", None)), Ok(()));
        let missing = runnable(&command("no-such-agent-program", None)).unwrap_err();
        assert!(missing.contains("`no-such-agent-program`"), "{missing}");
        let dir = runnable(&command("sh", Some(Path::new("/no/such/dir")))).unwrap_err();
        assert!(dir.contains("/no/such/dir"), "{dir}");
        assert!(runnable(&command("./bin/x", Some(Path::new("/")))).is_err());
    }
}
