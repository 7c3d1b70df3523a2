//! One tool call of a turn: where it goes ([`route_tool`], pure), running it (shell,
//! apply_patch, update_plan or an MCP tool), asking for approval, and the events and metrics
//! of the call.

use super::*;

/// What a tool call needs before it may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolRoute {
    /// Run the shell built-in (after approval, per policy), with its checked arguments.
    Shell {
        args: ShellArgs,
        needs_approval: bool,
    },
    /// The plan built-in, with its checked arguments: recorded, nothing executed.
    Plan(builtins::PlanArgs),
    /// The apply_patch built-in, with its parsed patch (checked against the sandbox and the
    /// workspace, then approved per policy).
    ApplyPatch { patch: Patch, needs_approval: bool },
    /// An external (MCP) tool.
    External,
    /// One of the capability registry's tools (A6): a capability's documents, or one of
    /// its commands run as the shell tool runs one.
    Capability,
    /// `dispatch_agent`: `input` to agent `agent_id`.
    DispatchAgent { agent_id: String, input: String },
    /// `dispatch_module`: `payload` to module `module`.
    DispatchModule {
        module: String,
        payload: serde_json::Value,
    },
    /// Refused before running, with the observation the model gets.
    Refuse(ToolFailure),
}

impl ToolRoute {
    /// Whether running it reaches outside the task: a command, a file, an MCP server (or a
    /// human, for its approval). A replay plays these back; a refusal and the plan are
    /// decided and recorded by the task alone, so they run in a replay too. A dispatch
    /// reaches another agent or a module, and plays itself back (the recorded answer).
    pub fn has_effects(&self) -> bool {
        match self {
            // An inspection may run a probe: played back as a command is.
            Self::Shell { .. } | Self::ApplyPatch { .. } | Self::External | Self::Capability => {
                true
            }
            Self::Plan(_)
            | Self::Refuse(_)
            | Self::DispatchAgent { .. }
            | Self::DispatchModule { .. } => false,
        }
    }
}

/// Decides how a call is handled. Pure: the tool list, the policies and the call decide.
/// Everything that can be checked before running is checked here (a tool that is not
/// offered, arguments of the wrong shape), so that a call refused for it spends no
/// authorization token.
pub fn route_tool(
    call: &ToolCall,
    tools: &[ToolSpec],
    approval: ApprovalPolicy,
    has_mcp: bool,
) -> ToolRoute {
    if !tools.iter().any(|t| t.name == call.name) {
        return ToolRoute::Refuse(ToolFailure::unknown_tool(&call.name));
    }
    match call.name.as_str() {
        "shell" => match shell_args(&call.arguments.0) {
            // `on-failure` runs it sandboxed first and asks only if the sandbox stopped it.
            Ok(args) => ToolRoute::Shell {
                args,
                needs_approval: approval == ApprovalPolicy::Always,
            },
            Err(e) => ToolRoute::Refuse(e.into()),
        },
        "update_plan" => match builtins::parse_plan(&call.arguments.0) {
            Ok(args) => ToolRoute::Plan(args),
            Err(e) => ToolRoute::Refuse(e.into()),
        },
        crate::capabilities::INSPECT | crate::capabilities::RUN => ToolRoute::Capability,
        crate::agents::route::DISPATCH_TOOL => {
            match crate::agents::route::parse_dispatch(&call.arguments.0) {
                Ok((agent_id, input)) => ToolRoute::DispatchAgent { agent_id, input },
                Err(message) => tool_error(call, message),
            }
        }
        crate::modules::DISPATCH_MODULE_TOOL => {
            match crate::modules::parse_dispatch_module(&call.arguments.0) {
                Ok((module, payload)) => ToolRoute::DispatchModule { module, payload },
                Err(message) => tool_error(call, message),
            }
        }
        "apply_patch" => match patch_input(&call.arguments.0) {
            Ok(patch) => ToolRoute::ApplyPatch {
                patch,
                needs_approval: approval != ApprovalPolicy::Never,
            },
            Err(e) => ToolRoute::Refuse(e.into()),
        },
        // What an MCP server takes: an object (`null`: none).
        _ if has_mcp => match &call.arguments.0 {
            serde_json::Value::Object(_) | serde_json::Value::Null => ToolRoute::External,
            _ => ToolRoute::Refuse(
                AgentError::invalid(format!(
                    "arguments of MCP tool `{}` must be a JSON object",
                    call.name
                ))
                .into(),
            ),
        },
        _ => tool_error(call, "no MCP servers are configured".into()),
    }
}

/// A refusal of `call` as the tool's own error.
fn tool_error(call: &ToolCall, message: String) -> ToolRoute {
    ToolRoute::Refuse(
        AgentError::ToolError {
            name: call.name.clone(),
            message,
        }
        .into(),
    )
}

/// The patch of an apply_patch call: `{"input": "*** Begin Patch ..."}`.
pub(super) fn patch_input(args: &serde_json::Value) -> Result<Patch, AgentError> {
    let input = args
        .get("input")
        .and_then(|i| i.as_str())
        .ok_or_else(|| AgentError::invalid("apply_patch needs `input`: the patch text"))?;
    apply_patch::parse(input).map_err(|e| AgentError::invalid(e.to_string()))
}

/// The arguments of a shell call, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellArgs {
    /// The program and its arguments (never empty, no NUL).
    pub argv: Vec<String>,
    /// The directory the call named (no NUL), taken from the workspace root.
    pub workdir: Option<String>,
    /// The timeout the call asked for (at least 1 ms); the session's bounds apply on top.
    pub timeout: Option<Duration>,
}

/// The arguments of a shell call, `{"command": ["ls", "-l"], "workdir": "src",
/// "timeout_ms": 5000}`, held to the tool's schema: anything else, or a field of the wrong
/// type, is invalid input rather than ignored. No argument may hold a NUL: the kernel could
/// not pass it on, and approval keys use it to keep their kinds apart.
pub fn shell_args(args: &serde_json::Value) -> Result<ShellArgs, AgentError> {
    let invalid = |message: &str| AgentError::invalid(format!("shell: {message}"));
    let Some(fields) = args.as_object() else {
        return Err(invalid(
            "the arguments must be an object with `command`: an array of strings",
        ));
    };
    if let Some(other) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "command" | "workdir" | "timeout_ms"))
    {
        return Err(invalid(&format!(
            "unknown argument `{other}` (command, workdir, timeout_ms)"
        )));
    }
    let command = fields
        .get("command")
        .and_then(|c| c.as_array())
        .ok_or_else(|| invalid("needs `command`: an array of strings"))?;
    let argv: Option<Vec<String>> = command
        .iter()
        .map(|a| a.as_str().map(str::to_owned))
        .collect();
    let argv = match argv {
        Some(argv) if !argv.is_empty() => argv,
        _ => return Err(invalid("`command` must be a non-empty array of strings")),
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(invalid("`command` must not contain a NUL character"));
    }
    let workdir = match fields.get("workdir") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(dir)) if dir.contains('\0') => {
            return Err(invalid("`workdir` must not contain a NUL character"));
        }
        Some(serde_json::Value::String(dir)) => Some(dir.clone()),
        Some(_) => return Err(invalid("`workdir` must be a string")),
    };
    let timeout = match fields.get("timeout_ms") {
        None | Some(serde_json::Value::Null) => None,
        Some(ms) => match ms.as_u64() {
            Some(ms) if ms >= 1 => Some(Duration::from_millis(ms)),
            _ => {
                return Err(invalid(
                    "`timeout_ms` must be a whole number of milliseconds, at least 1",
                ));
            }
        },
    };
    Ok(ShellArgs {
        argv,
        workdir,
        timeout,
    })
}

/// How long a command may run: the call's own timeout, else the session's default, and
/// never more than the session's maximum.
pub fn command_timeout(asked: Option<Duration>, limits: &TaskLimits) -> Duration {
    asked
        .unwrap_or(limits.exec_timeout)
        .min(limits.exec_timeout_max)
}

/// Runs one tool call; the output is what the model sees, the error (if any) what failed.
pub(super) async fn run_tool(
    ctx: &TaskContext,
    mcp: &mut TaskMcp,
    agents: Option<&super::agents::Agents>,
    gov: &Arc<TaskGovernance>,
    tools: &[ToolSpec],
    call: &ToolCall,
) -> (ToolOutput, Option<ToolFailure>) {
    let span = spans::execute_tool(ctx.conversation_id, ctx.task_id, call);
    if ctx.record_content {
        span.record(
            "gen_ai.tool.call.arguments",
            tracing::field::display(&call.arguments.0),
        );
    }
    let emit = |event: EventKind| {
        span.in_scope(|| {
            ctx.events
                .emit(EventDraft::task(ctx.conversation_id, ctx.task_id, event));
        });
    };
    let agent_id = super::govern::agent_of(ctx).map(str::to_owned);
    emit(EventKind::ToolCallStarted {
        call: call.clone(),
        agent_id: agent_id.clone(),
    });
    let started = Instant::now();
    let chain = agents.map(|a| &a.view.chain);
    let result = async {
        // The policy first (a denied call is refused as such, whatever its arguments), then
        // what can be checked before running: only a call that can run uses a token.
        let pending = span.in_scope(|| super::govern::decide(ctx, gov, chain, call))?;
        let route = route_tool(call, tools, ctx.approval_policy, mcp.offered);
        if let ToolRoute::Refuse(failure) = route {
            return Err(failure);
        }
        if let ToolRoute::Capability = route {
            super::capability::precheck(ctx, call).map_err(ToolFailure::from)?;
        }
        super::govern::settle(ctx, gov, chain, pending)
            .instrument(span.clone())
            .await?;
        execute(ctx, mcp, agents, gov, call, route, &span)
            .instrument(span.clone())
            .await
    }
    .await;
    let outcome =
        metrics::outcome_label(&result.as_ref().map(|o| o.is_error).map_err(|f| &f.error));
    match &result {
        Ok(output) => {
            if output.is_error {
                spans::record_error_type(&span, troupe_proto::ErrorKind::ToolError.as_str());
            }
            // The conventions record a result only when the call succeeded.
            if ctx.record_content && !output.is_error {
                span.record("gen_ai.tool.call.result", spans::tool_result(output));
            }
        }
        Err(failure) => spans::record_error(&span, &failure.error),
    }
    let (output, failure) = match result {
        Ok(output) => {
            let failure = output.is_error.then(|| {
                ToolFailure::from(AgentError::ToolError {
                    name: call.name.clone(),
                    message: output.output.clone(),
                })
            });
            (output, failure)
        }
        Err(failure) => {
            emit(EventKind::Error {
                error: failure.error.clone(),
            });
            let output = ToolOutput {
                call_id: call.call_id.clone(),
                output: failure.error.to_string(),
                is_error: true,
            };
            (output, Some(failure))
        }
    };
    emit(EventKind::ToolCallFinished {
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        output: output.output.clone(),
        is_error: output.is_error,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        agent_id,
    });
    let offered = tools.iter().any(|t| t.name == call.name);
    metrics::tool_finished(
        metrics::tool_label(&call.name, offered),
        outcome,
        started.elapsed(),
    );
    (output, failure)
}

/// Runs `call` by its `route` (the policy had its word).
pub(super) async fn execute(
    ctx: &TaskContext,
    mcp: &mut TaskMcp,
    agents: Option<&super::agents::Agents>,
    gov: &Arc<TaskGovernance>,
    call: &ToolCall,
    route: ToolRoute,
    span: &tracing::Span,
) -> Result<ToolOutput, ToolFailure> {
    let ok = |output: String| ToolOutput {
        call_id: call.call_id.clone(),
        output,
        is_error: false,
    };
    match route {
        ToolRoute::External => {
            span.record("gen_ai.tool.type", spans::TOOL_TYPE_EXTENSION);
            span.record("mcp.method.name", "tools/call");
        }
        // A refused call ran nothing: it has no type.
        ToolRoute::Refuse(_) => {}
        _ => {
            span.record("gen_ai.tool.type", spans::TOOL_TYPE_FUNCTION);
        }
    }
    if let Effects::Recorded(playback) = &ctx.effects
        && route.has_effects()
    {
        return playback.tool_result(call);
    }
    match route {
        ToolRoute::Refuse(e) => Err(e),
        ToolRoute::DispatchAgent { agent_id, input } => {
            super::agents::dispatch_call(ctx, agents, gov, call, &agent_id, &input).await
        }
        ToolRoute::DispatchModule { module, payload } => {
            super::modules::dispatch_call(ctx, call, &module, payload).await
        }
        ToolRoute::Plan(args) => {
            let observation = builtins::plan_observation(&args.plan);
            tracing::info!(steps = args.plan.len(), "plan updated");
            metrics::plan_updated();
            ctx.emit(EventKind::PlanUpdated {
                explanation: args.explanation,
                plan: args.plan,
            });
            Ok(ok(observation))
        }
        ToolRoute::ApplyPatch {
            patch,
            needs_approval,
        } => Ok(ok(run_patch(ctx, call, patch, needs_approval).await?)),
        ToolRoute::External => {
            let view = mcp.view(ctx).await?;
            let result = view
                .call_tool(
                    call,
                    ToolCallContext {
                        conversation_id: ctx.conversation_id,
                        task_id: ctx.task_id,
                        cancel: &ctx.cancel,
                        span,
                        slot: Some(&ctx.slot),
                    },
                )
                .await;
            // A server's question to a human gave the slot back: the task goes on with it.
            if ctx.slot.is_out() {
                ctx.slot
                    .take_back(&ctx.cancel)
                    .instrument(spans::scheduler_wait(ctx.conversation_id, ctx.task_id))
                    .await?;
            }
            result
        }
        ToolRoute::Shell {
            args,
            needs_approval,
        } => {
            let (out, sandbox) = run_command(
                ctx,
                &args.argv,
                needs_approval,
                args.workdir.as_deref(),
                args.timeout,
                "the model wants to run a command".into(),
            )
            .await?;
            if let Some(why) = sandbox_failure(&out, sandbox) {
                // The sandbox stopped it: the same call would be stopped again, so a retry
                // policy does not run it again (the model still sees what it printed).
                return Err(AgentError::SandboxError {
                    message: format!(
                        "the {} sandbox stopped the command ({why}):\n{}",
                        sandbox_name(sandbox),
                        render_exec(&out)
                    ),
                }
                .into());
            }
            Ok(ToolOutput {
                call_id: call.call_id.clone(),
                output: render_exec(&out),
                is_error: out.exit_code != Some(0),
            })
        }
        ToolRoute::Capability => super::capability::call(ctx, gov, call).await,
    }
}

/// Runs `argv` as the shell tool does: approved first when `needs_approval`, under the
/// conversation's sandbox, and under `on-failure` asked again without the sandbox when the
/// sandbox stopped it. `workdir` is taken inside the workspace; `timeout` defaults to the
/// session's command timeout and is held to its maximum ([`command_timeout`]). Returns the output and the sandbox its last run had.
pub(super) async fn run_command(
    ctx: &TaskContext,
    argv: &[String],
    needs_approval: bool,
    workdir: Option<&str>,
    timeout: Option<Duration>,
    why: String,
) -> Result<(crate::ports::ExecOutput, SandboxPolicy), AgentError> {
    let roots = builtins::workspace_roots(&ctx.workspace_roots);
    // A directory the call named is asked about, and remembered, with the command.
    let named_dir = workdir
        .and_then(|_| builtins::shell_workdir(&roots, workdir))
        .map(|dir| dir.display().to_string());
    if needs_approval {
        approve_as(
            ctx,
            argv,
            in_dir(why, named_dir.as_deref()),
            ApprovalSubject::Command,
            named_dir.clone(),
        )
        .await?;
    }
    let exec = ctx.exec.as_ref().ok_or_else(|| AgentError::SandboxError {
        message: "no command runner is configured for this session".into(),
    })?;
    let workdir = builtins::shell_workdir(&roots, workdir);
    let timeout = command_timeout(timeout, &ctx.limits);
    let request = |sandbox| ExecRequest {
        argv: argv.to_vec(),
        workdir: workdir.clone(),
        timeout,
        sandbox,
        output_cap: ctx.limits.exec_output_cap,
        writable_roots: roots.clone(),
        conversation_id: Some(ctx.conversation_id),
        task_id: Some(ctx.task_id),
    };
    let mut sandbox = ctx.sandbox_policy;
    let mut out = exec.run(request(sandbox), &ctx.cancel).await?;
    if ctx.approval_policy == ApprovalPolicy::OnFailure
        && let Some(why) = sandbox_failure(&out, ctx.sandbox_policy)
    {
        tracing::info!(policy = ?ctx.sandbox_policy, why, "command failed in the sandbox; asking to run it without");
        let reason = format!(
            "the command failed in the {} sandbox ({why}); run it again without the sandbox?",
            sandbox_name(ctx.sandbox_policy)
        );
        let granted = approve_as(
            ctx,
            argv,
            in_dir(reason, named_dir.as_deref()),
            ApprovalSubject::CommandWithoutSandbox,
            named_dir.clone(),
        )
        .await;
        metrics::sandbox_retry(granted.is_ok());
        granted?;
        sandbox = SandboxPolicy::FullAccess;
        out = exec.run(request(sandbox), &ctx.cancel).await?;
    }
    Ok((out, sandbox))
}

/// apply_patch: the sandbox must allow writes, every path must be inside the workspace, a
/// human must approve (per policy); then the files change. Checks come before the approval
/// so nobody is asked about a patch that would be refused anyway.
pub(super) async fn run_patch(
    ctx: &TaskContext,
    call: &ToolCall,
    patch: Patch,
    needs_approval: bool,
) -> Result<String, AgentError> {
    builtins::patch_allowed(ctx.sandbox_policy)?;
    let roots = builtins::workspace_roots(&ctx.workspace_roots);
    let check = {
        let (patch, roots) = (patch.clone(), roots.clone());
        move || {
            patch
                .ops
                .iter()
                .flat_map(|op| match op {
                    apply_patch::FileOp::Update {
                        path,
                        move_to: Some(to),
                        ..
                    } => vec![path.clone(), to.clone()],
                    other => vec![other.path().to_owned()],
                })
                .try_for_each(|path| apply_patch::resolve_in_workspace(&roots, &path).map(drop))
        }
    };
    blocking(check).await?.map_err(patch_error)?;
    if needs_approval {
        let input = call
            .arguments
            .0
            .get("input")
            .and_then(|i| i.as_str())
            .unwrap_or_default();
        approve_as(
            ctx,
            &apply_patch::approval_command(&patch),
            format!("the model wants to apply a patch:\n{input}"),
            ApprovalSubject::Patch,
            None,
        )
        .await?;
    }
    let applied = blocking(move || apply_patch::apply(&patch, &roots))
        .await?
        .map_err(patch_error)?;
    for a in &applied {
        metrics::patch_file(a.op());
    }
    tracing::info!(files = applied.len(), "patch applied");
    Ok(apply_patch::summary(&applied))
}

/// A path outside the workspace is a sandbox refusal; a patch that does not fit is the
/// tool's own error.
pub(super) fn patch_error(error: PatchError) -> AgentError {
    match error {
        PatchError::OutsideWorkspace(message) => AgentError::SandboxError { message },
        PatchError::Parse { .. } => AgentError::invalid(error.to_string()),
        PatchError::Apply(message) => AgentError::ToolError {
            name: crate::tools::APPLY_PATCH.into(),
            message,
        },
    }
}

/// Runs file I/O on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| AgentError::internal(format!("file work failed: {e}")))
}

/// `reason`, saying where the command runs when its call named a directory.
fn in_dir(reason: String, dir: Option<&str>) -> String {
    match dir {
        Some(dir) => format!("{reason} (in {dir})"),
        None => reason,
    }
}

/// Asks the session's ApprovalStore (the next one, if it fails while the task waits) about
/// `subject` (a command, a command to run without the sandbox, a patch); a denial, or a
/// session without a store any more, is `ApprovalDenied`.
async fn approve_as(
    ctx: &TaskContext,
    argv: &[String],
    reason: String,
    subject: ApprovalSubject,
    workdir: Option<String>,
) -> Result<Granted, AgentError> {
    let span = spans::approval_wait(ctx.conversation_id, ctx.task_id);
    let ask = Ask {
        conversation_id: ctx.conversation_id,
        task_id: Some(ctx.task_id),
        command: argv.to_vec(),
        reason,
        subject,
        workdir,
    };
    let store = ctx.services.approvals();
    let asked = ask_until_answered(
        &store,
        ask,
        None,
        crate::approval_store::metrics::Asker::Task,
    );
    // Nothing is computed while a human decides: the slot goes back for the wait.
    let answer = ctx
        .slot
        .wait_for_human(
            &ctx.cancel,
            "cancelled while waiting for approval",
            asked.instrument(span.clone()),
        )
        .await?;
    let granted = answer.unwrap_or_else(|| {
        Err(AgentError::ApprovalDenied {
            command: argv.to_vec(),
            reason: "the session's approval store is gone".into(),
        })
    });
    span.in_scope(|| match &granted {
        Ok(how) => tracing::info!(?how, "approved"),
        // Not the error's text: it quotes the command and the human's reason.
        Err(error) => tracing::info!(error_kind = error.kind().as_str(), "not approved"),
    });
    match &granted {
        Ok(_) => span.record("troupe.approval.outcome", "approved"),
        Err(error) => {
            spans::record_error(&span, error);
            span.record("troupe.approval.outcome", "not_approved")
        }
    };
    granted
}

/// Whether a command's failure is the sandbox's doing, as far as its output tells (what
/// `approval_policy = on-failure` asks a human about): it ran confined (not `full-access`),
/// exited with a non-zero code (not a timeout, not a signal), and its stderr carries the
/// kernel's refusal of an access: `Permission denied` (EACCES, what Landlock answers),
/// `Operation not permitted` (EPERM) or `Read-only file system` (EROFS). Any other failure is
/// the command's own and goes to the model as it is.
pub fn sandbox_failure(
    out: &crate::ports::ExecOutput,
    policy: SandboxPolicy,
) -> Option<&'static str> {
    const REFUSALS: [&str; 4] = [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
        // EXDEV: Landlock's refusal of a link or rename that would move a file across its
        // rules (`ln`, `mv` within the workspace from outside it).
        "Invalid cross-device link",
    ];
    if policy == SandboxPolicy::FullAccess
        || out.timed_out
        || matches!(out.exit_code, Some(0) | None)
    {
        return None;
    }
    REFUSALS.into_iter().find(|r| out.stderr.contains(r))
}

/// The policy as the configuration writes it.
fn sandbox_name(policy: SandboxPolicy) -> &'static str {
    match policy {
        SandboxPolicy::ReadOnly => "read-only",
        SandboxPolicy::WorkspaceWrite => "workspace-write",
        SandboxPolicy::FullAccess => "full-access",
    }
}

/// The observation a command leaves for the model.
pub fn render_exec(out: &crate::ports::ExecOutput) -> String {
    let mut s = String::new();
    match (out.exit_code, out.timed_out) {
        // Killed at its timeout: what it wrote until then follows, cut off there.
        (_, true) => s.push_str("timed out (killed; its output below is cut off there)\n"),
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
