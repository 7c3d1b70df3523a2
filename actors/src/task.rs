//! The task runner: one user message → one Turn of Steps (T1). It runs as a tokio task owned
//! by its Conversation (aborted with it), holds a scheduler slot while it works, and reports
//! its outcome back as a `TaskFinished` message. Decisions (what a tool call needs, when the
//! loop ends) are pure functions below.

use crate::approval_store::{ApprovalMsg, Granted};
use crate::events::{EventDraft, EventSink};
use crate::history::HistorySnapshot;
use crate::ports::{
    CommandRunner, DeltaSink, ExecRequest, McpView, ModelClient, ModelRequest, ToolCallContext,
};
use crate::scheduler::SchedulerMsg;
use crate::task_registry::TaskRegistryMsg;
use ractor::{ActorCell, ActorRef};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_proto::{
    AgentError, ApprovalPolicy, ConversationId, EventKind, HistoryItem, SandboxPolicy, TaskId,
    TaskState, TaskStats, TaskStatus, ToolCall, ToolOutput, ToolSpec,
};

/// Everything a task needs, snapshotted from its conversation when it starts.
pub struct TaskContext {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    pub input: String,
    pub history: HistorySnapshot,
    /// The user instructions, always first in the prompt (C4).
    pub pinned: Option<HistoryItem>,
    /// Built-in tools of the conversation, in their fixed order.
    pub builtins: Vec<ToolSpec>,
    pub base_instructions: Option<String>,
    /// A one-turn system prompt (compaction); never stored (C3).
    pub turn_override: Option<String>,
    pub model: Arc<dyn ModelClient>,
    pub mcp: Option<Arc<dyn McpView>>,
    pub exec: Option<Arc<dyn CommandRunner>>,
    pub approvals: ActorRef<ApprovalMsg>,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub registry: ActorRef<TaskRegistryMsg>,
    pub events: EventSink,
    pub cancel: CancellationToken,
    /// The conversation actor: the scheduler monitors it as the slot's holder.
    pub holder: ActorCell,
    pub limits: TaskLimits,
    pub approval_policy: ApprovalPolicy,
    pub sandbox_policy: SandboxPolicy,
}

/// Bounds of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Steps (model calls) before the turn ends with `max_steps` (T2).
    pub max_steps: u32,
    /// Default timeout of a shell command.
    pub exec_timeout: Duration,
    /// Bytes of command output kept.
    pub exec_output_cap: usize,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            max_steps: 100,
            exec_timeout: Duration::from_secs(60),
            exec_output_cap: 64 * 1024,
        }
    }
}

/// What a task produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    pub status: TaskStatus,
    pub text: String,
    pub stats: TaskStats,
    pub error: Option<AgentError>,
    /// New history items, in order: the user message, then what the model and tools said.
    pub items: Vec<HistoryItem>,
}

/// Gives the scheduler slot back however the runner ends: completion, cancellation, abort
/// (the future is dropped) or panic (unwinding drops it). Releasing twice is harmless.
struct SlotGuard {
    task_id: TaskId,
    scheduler: ActorRef<SchedulerMsg>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let _ = self.scheduler.cast(SchedulerMsg::Release {
            task_id: self.task_id,
        });
    }
}

/// Runs the task to its end. Never panics on bad model output; every failure becomes an
/// outcome with status `error` or `cancelled`.
pub async fn run(ctx: TaskContext, span: tracing::Span) -> TaskOutcome {
    let started = Instant::now();
    let trace_id = {
        let _e = span.enter();
        crate::events::current_trace_ids()
            .0
            .unwrap_or_else(|| fallback_trace_id(ctx.task_id))
    };
    let mut outcome = run_inner(&ctx).instrument(span).await;
    outcome.stats.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    outcome.stats.trace_id = trace_id;
    outcome
}

/// The span of a task (GenAI `invoke_agent`); events of the task carry its ids.
pub fn task_span(conversation_id: ConversationId, task_id: TaskId) -> tracing::Span {
    tracing::info_span!(
        "task",
        conversation_id = %conversation_id,
        task_id = %task_id,
        gen_ai.operation.name = "invoke_agent",
    )
}

/// A trace id derived from the task id when no OpenTelemetry layer is installed, so stats
/// and events still correlate.
fn fallback_trace_id(task_id: TaskId) -> String {
    task_id.as_uuid().simple().to_string()
}

/// What a task resolves once, before its first step.
struct Prepared {
    tools: Vec<ToolSpec>,
    instructions: String,
    cache_key: String,
}

/// The merged tool list (S8; conflicts become warnings), the turn's instructions (C3) and
/// the prompt cache key (C7).
async fn prepare(ctx: &TaskContext) -> Prepared {
    let external = match &ctx.mcp {
        Some(view) => match view.list_tools().await {
            Ok(tools) => tools,
            Err(error) => {
                ctx.events.emit(EventDraft::task(
                    ctx.conversation_id,
                    ctx.task_id,
                    EventKind::Warning {
                        code: "mcp_tools_unavailable".into(),
                        message: error.to_string(),
                    },
                ));
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let merged = crate::tools::merge_tools(ctx.builtins.clone(), external);
    for conflict in merged.conflicts {
        tracing::warn!(error = %conflict, "tool conflict");
        ctx.events.emit(EventDraft::task(
            ctx.conversation_id,
            ctx.task_id,
            EventKind::Warning {
                code: "tool_conflict".into(),
                message: conflict.to_string(),
            },
        ));
    }
    let has_apply_patch = merged.tools.iter().any(|t| t.name == "apply_patch");
    let instructions = crate::context::choose_instructions(
        ctx.turn_override.as_deref(),
        ctx.base_instructions.as_deref(),
        has_apply_patch,
    );
    let cache_key =
        crate::context::prompt_cache_key(&instructions, &merged.tools, &ctx.model.info().family);
    Prepared {
        tools: merged.tools,
        instructions,
        cache_key,
    }
}

async fn run_inner(ctx: &TaskContext) -> TaskOutcome {
    let mut loop_state = LoopState {
        items: vec![HistoryItem::user(ctx.input.clone())],
        stats: TaskStats {
            turns: 1,
            ..TaskStats::default()
        },
        last_text: String::new(),
    };

    // Wait for a slot, unless cancelled first.
    let acquire = async {
        ractor::call!(ctx.scheduler, |reply| SchedulerMsg::Acquire {
            task_id: ctx.task_id,
            conversation_id: ctx.conversation_id,
            holder: ctx.holder.clone(),
            reply,
        })
    };
    let _slot = SlotGuard {
        task_id: ctx.task_id,
        scheduler: ctx.scheduler.clone(),
    };
    let granted = tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => Err(AgentError::cancelled("cancelled while queued")),
        r = acquire => match r {
            Ok(inner) => inner,
            Err(e) => Err(AgentError::internal(format!("scheduler unavailable: {e}"))),
        },
    };
    if let Err(e) = granted {
        return loop_state.end(status_of(&e), Some(e));
    }
    let _ = ctx.registry.cast(TaskRegistryMsg::StateChanged {
        task_id: ctx.task_id,
        state: TaskState::Running,
    });
    let prepared = prepare(ctx).await;

    for step in 1..=ctx.limits.max_steps {
        if ctx.cancel.is_cancelled() {
            return loop_state.end(
                TaskStatus::Cancelled,
                Some(AgentError::cancelled("cancelled")),
            );
        }
        loop_state.stats.steps = step;
        ctx.events.emit(EventDraft::task(
            ctx.conversation_id,
            ctx.task_id,
            EventKind::StepStarted { turn: 1, step },
        ));
        let response = match model_step(ctx, &prepared, &loop_state.items).await {
            Ok((response, estimate)) => {
                loop_state.stats.estimated_prompt_tokens += estimate;
                response
            }
            Err(e) => {
                ctx.events.emit(EventDraft::task(
                    ctx.conversation_id,
                    ctx.task_id,
                    EventKind::Error { error: e.clone() },
                ));
                return loop_state.end(status_of(&e), Some(e));
            }
        };
        if let Some(usage) = response.usage {
            loop_state.stats.usage.add(&usage);
        }
        if !response.text.is_empty() {
            ctx.events.emit(EventDraft::task(
                ctx.conversation_id,
                ctx.task_id,
                EventKind::AssistantMessage {
                    text: response.text.clone(),
                },
            ));
            loop_state
                .items
                .push(HistoryItem::assistant(response.text.clone()));
            loop_state.last_text = response.text;
        }
        if response.tool_calls.is_empty() {
            return loop_state.end(TaskStatus::Ok, None);
        }
        for call in response.tool_calls {
            if ctx.cancel.is_cancelled() {
                return loop_state.end(
                    TaskStatus::Cancelled,
                    Some(AgentError::cancelled("cancelled")),
                );
            }
            loop_state.stats.tool_calls += 1;
            let output = run_tool(ctx, &prepared.tools, &call).await;
            loop_state.items.push(HistoryItem::ToolCall(call));
            loop_state.items.push(HistoryItem::ToolOutput(output));
        }
    }
    loop_state.end(TaskStatus::MaxSteps, None)
}

struct LoopState {
    items: Vec<HistoryItem>,
    stats: TaskStats,
    last_text: String,
}

impl LoopState {
    fn end(self, status: TaskStatus, error: Option<AgentError>) -> TaskOutcome {
        TaskOutcome {
            status,
            text: self.last_text,
            stats: self.stats,
            error,
            items: self.items,
        }
    }
}

/// The status a failure ends a task with.
pub fn status_of(error: &AgentError) -> TaskStatus {
    match error {
        AgentError::Cancelled { .. } => TaskStatus::Cancelled,
        _ => TaskStatus::Error,
    }
}

/// Forwards streamed text as `assistant_chunk` events.
struct ChunkEvents<'a> {
    ctx: &'a TaskContext,
}

impl DeltaSink for ChunkEvents<'_> {
    fn text_delta(&mut self, delta: &str) {
        self.ctx.events.emit(EventDraft::task(
            self.ctx.conversation_id,
            self.ctx.task_id,
            EventKind::AssistantChunk {
                delta: delta.to_owned(),
            },
        ));
    }
}

async fn model_step(
    ctx: &TaskContext,
    prepared: &Prepared,
    items: &[HistoryItem],
) -> Result<(crate::ports::ModelResponse, u64), AgentError> {
    let prompt = ctx.history.view(ctx.pinned.as_ref(), &[], items);
    let estimate = u64::try_from(prompt.approx_tokens()).unwrap_or(u64::MAX);
    let request = ModelRequest {
        conversation_id: ctx.conversation_id,
        task_id: ctx.task_id,
        instructions: &prepared.instructions,
        prompt,
        tools: &prepared.tools,
        prompt_cache_key: &prepared.cache_key,
    };
    let info = ctx.model.info();
    let span = tracing::info_span!(
        "model_call",
        gen_ai.operation.name = "chat",
        gen_ai.system = %info.provider,
        gen_ai.request.model = %info.model,
        conversation_id = %ctx.conversation_id,
        task_id = %ctx.task_id,
    );
    let mut sink = ChunkEvents { ctx };
    let response = ctx
        .model
        .step(request, &mut sink, &ctx.cancel)
        .instrument(span)
        .await?;
    Ok((response, estimate))
}

/// What a tool call needs before it may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolRoute {
    /// Run the shell built-in (after approval, per policy).
    Shell {
        argv: Vec<String>,
        needs_approval: bool,
    },
    /// The plan built-in: recorded, nothing executed.
    Plan,
    /// An external (MCP) tool.
    External,
    /// Refused before running, with the observation the model gets.
    Refuse(AgentError),
}

/// Decides how a call is handled. Pure: the tool list, the policies and the call decide.
pub fn route_tool(
    call: &ToolCall,
    tools: &[ToolSpec],
    approval: ApprovalPolicy,
    has_mcp: bool,
) -> ToolRoute {
    if !tools.iter().any(|t| t.name == call.name) {
        return ToolRoute::Refuse(AgentError::ToolError {
            name: call.name.clone(),
            message: format!("unknown tool `{}`", call.name),
        });
    }
    match call.name.as_str() {
        "shell" => match shell_argv(&call.arguments.0) {
            Ok(argv) => ToolRoute::Shell {
                argv,
                needs_approval: approval != ApprovalPolicy::Never,
            },
            Err(message) => ToolRoute::Refuse(AgentError::ToolError {
                name: call.name.clone(),
                message,
            }),
        },
        "update_plan" => ToolRoute::Plan,
        "apply_patch" | "web_search" => ToolRoute::Refuse(AgentError::ToolError {
            name: call.name.clone(),
            message: format!("`{}` is not available in this session", call.name),
        }),
        _ if has_mcp => ToolRoute::External,
        _ => ToolRoute::Refuse(AgentError::ToolError {
            name: call.name.clone(),
            message: "no MCP servers are configured".into(),
        }),
    }
}

/// argv of a shell call: `{"command": ["ls", "-l"]}`.
fn shell_argv(args: &serde_json::Value) -> Result<Vec<String>, String> {
    let command = args
        .get("command")
        .and_then(|c| c.as_array())
        .ok_or_else(|| "shell needs `command`: an array of strings".to_owned())?;
    let argv: Option<Vec<String>> = command
        .iter()
        .map(|a| a.as_str().map(str::to_owned))
        .collect();
    match argv {
        Some(argv) if !argv.is_empty() => Ok(argv),
        _ => Err("shell `command` must be a non-empty array of strings".to_owned()),
    }
}

async fn run_tool(ctx: &TaskContext, tools: &[ToolSpec], call: &ToolCall) -> ToolOutput {
    let span = tracing::info_span!(
        "tool_call",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.call_id,
        conversation_id = %ctx.conversation_id,
        task_id = %ctx.task_id,
    );
    let emit = |event: EventKind| {
        span.in_scope(|| {
            ctx.events
                .emit(EventDraft::task(ctx.conversation_id, ctx.task_id, event));
        });
    };
    emit(EventKind::ToolCallStarted { call: call.clone() });
    let started = Instant::now();
    let result = execute(ctx, tools, call).instrument(span.clone()).await;
    let output = match result {
        Ok(output) => output,
        Err(error) => {
            emit(EventKind::Error {
                error: error.clone(),
            });
            ToolOutput {
                call_id: call.call_id.clone(),
                output: error.to_string(),
                is_error: true,
            }
        }
    };
    emit(EventKind::ToolCallFinished {
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        output: output.output.clone(),
        is_error: output.is_error,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    });
    output
}

async fn execute(
    ctx: &TaskContext,
    tools: &[ToolSpec],
    call: &ToolCall,
) -> Result<ToolOutput, AgentError> {
    let has_mcp = ctx.mcp.is_some();
    match route_tool(call, tools, ctx.approval_policy, has_mcp) {
        ToolRoute::Refuse(e) => Err(e),
        ToolRoute::Plan => Ok(ToolOutput {
            call_id: call.call_id.clone(),
            output: "plan updated".into(),
            is_error: false,
        }),
        ToolRoute::External => match &ctx.mcp {
            Some(view) => {
                view.call_tool(
                    call,
                    ToolCallContext {
                        conversation_id: ctx.conversation_id,
                        task_id: ctx.task_id,
                        cancel: &ctx.cancel,
                    },
                )
                .await
            }
            None => Err(AgentError::internal("external tool routed without a view")),
        },
        ToolRoute::Shell {
            argv,
            needs_approval,
        } => {
            if needs_approval {
                approve(ctx, &argv).await?;
            }
            let exec = ctx.exec.as_ref().ok_or_else(|| AgentError::SandboxError {
                message: "no command runner is configured for this session".into(),
            })?;
            let workdir = call
                .arguments
                .0
                .get("workdir")
                .and_then(|w| w.as_str())
                .map(std::path::PathBuf::from);
            let timeout = call
                .arguments
                .0
                .get("timeout_ms")
                .and_then(serde_json::Value::as_u64)
                .map_or(ctx.limits.exec_timeout, Duration::from_millis);
            let out = exec
                .run(
                    ExecRequest {
                        argv,
                        workdir,
                        timeout,
                        sandbox: ctx.sandbox_policy,
                        output_cap: ctx.limits.exec_output_cap,
                    },
                    &ctx.cancel,
                )
                .await?;
            Ok(ToolOutput {
                call_id: call.call_id.clone(),
                output: render_exec(&out),
                is_error: out.exit_code != Some(0),
            })
        }
    }
}

/// Asks the ApprovalStore; a denial (or a store that went away) is `ApprovalDenied`.
async fn approve(ctx: &TaskContext, argv: &[String]) -> Result<Granted, AgentError> {
    let span = tracing::info_span!("approval_wait", conversation_id = %ctx.conversation_id, task_id = %ctx.task_id);
    let asked = async {
        ractor::call!(ctx.approvals, |reply| ApprovalMsg::Request {
            conversation_id: ctx.conversation_id,
            task_id: Some(ctx.task_id),
            command: argv.to_vec(),
            reason: "the model wants to run a command".into(),
            timeout: None,
            reply,
        })
    };
    let answer = tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => return Err(AgentError::cancelled("cancelled while waiting for approval")),
        r = asked.instrument(span) => r,
    };
    match answer {
        Ok(r) => r,
        Err(e) => Err(AgentError::ApprovalDenied {
            command: argv.to_vec(),
            reason: format!("approval store unavailable: {e}"),
        }),
    }
}

/// The observation a command leaves for the model.
pub fn render_exec(out: &crate::ports::ExecOutput) -> String {
    let mut s = String::new();
    match (out.exit_code, out.timed_out) {
        (_, true) => s.push_str("timed out\n"),
        (Some(code), _) => s.push_str(&format!("exit code {code}\n")),
        (None, _) => s.push_str("killed by a signal\n"),
    }
    if !out.stdout.is_empty() {
        s.push_str(&out.stdout);
        if !out.stdout.ends_with('\n') {
            s.push('\n');
        }
    }
    if !out.stderr.is_empty() {
        s.push_str("stderr:\n");
        s.push_str(&out.stderr);
    }
    if out.truncated {
        s.push_str("\n[output truncated]");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::Json;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: Json::empty_object(),
        }
    }

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall {
            call_id: "c1".into(),
            name: name.into(),
            arguments: Json(args),
        }
    }

    #[test]
    fn unknown_tool_is_refused() {
        let r = route_tool(
            &call("nope", serde_json::json!({})),
            &[spec("shell")],
            ApprovalPolicy::Always,
            true,
        );
        assert!(matches!(r, ToolRoute::Refuse(AgentError::ToolError { .. })));
    }

    #[test]
    fn shell_needs_approval_unless_never() {
        let tools = [spec("shell")];
        let c = call("shell", serde_json::json!({"command": ["echo", "hi"]}));
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Always, false),
            ToolRoute::Shell {
                argv: vec!["echo".into(), "hi".into()],
                needs_approval: true
            }
        );
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Never, false),
            ToolRoute::Shell {
                argv: vec!["echo".into(), "hi".into()],
                needs_approval: false
            }
        );
    }

    #[test]
    fn malformed_shell_args_are_refused() {
        let tools = [spec("shell")];
        for args in [
            serde_json::json!({}),
            serde_json::json!({"command": []}),
            serde_json::json!({"command": [1]}),
        ] {
            assert!(matches!(
                route_tool(&call("shell", args), &tools, ApprovalPolicy::Always, false),
                ToolRoute::Refuse(_)
            ));
        }
    }

    #[test]
    fn external_tools_need_a_view() {
        let tools = [spec("srv__echo")];
        let c = call("srv__echo", serde_json::json!({}));
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Always, true),
            ToolRoute::External
        );
        assert!(matches!(
            route_tool(&c, &tools, ApprovalPolicy::Always, false),
            ToolRoute::Refuse(_)
        ));
    }
}
