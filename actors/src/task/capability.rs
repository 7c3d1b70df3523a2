//! The capability registry's tools at a call (A6): `capability_inspect` answers from the
//! catalog the task started with (level 3 also runs the capability's probe, read-only and
//! without approval: its argv is the operator's, not the model's); `capability_run` fills a
//! command's template and runs it as the shell tool runs a command (approval per policy,
//! the conversation's sandbox). The tool policy already had its word on the capability's
//! qualified name ([`super::govern::check_call`]).

use super::*;
use crate::capabilities::{self as caps, InspectRequest, Level, metrics::RunOutcome};
use troupe_proto::capability::Capability;

/// Longest a probe may run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn call(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    call: &ToolCall,
) -> Result<ToolOutput, ToolFailure> {
    let output = if call.name == caps::INSPECT {
        inspect(ctx, gov, call).await?
    } else {
        return run(ctx, call).await;
    };
    Ok(ToolOutput {
        call_id: call.call_id.clone(),
        output,
        is_error: false,
    })
}

/// What can be checked of a capability call before it runs (so before a token use is
/// spent on it): its arguments read, the capability it names is in the catalog, and a run's
/// arguments fill the command's template.
pub(super) fn precheck(ctx: &TaskContext, call: &ToolCall) -> Result<(), AgentError> {
    if call.name == caps::INSPECT {
        return match caps::inspect_request(&call.arguments.0).map_err(AgentError::invalid)? {
            InspectRequest::List => Ok(()),
            InspectRequest::One { id, .. } => find(ctx, &id).map(drop),
        };
    }
    run_plan_of(ctx, call).map(drop).inspect_err(|_| {
        caps::metrics::ran(RunOutcome::NotRun, Duration::ZERO);
    })
}

/// The capability a `capability_run` call names and its command filled in.
fn run_plan_of(ctx: &TaskContext, call: &ToolCall) -> Result<caps::RunPlan, AgentError> {
    let id = call
        .arguments
        .0
        .get("id")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| AgentError::invalid(format!("{} needs `id`", caps::RUN)))?;
    let capability = find(ctx, id)?;
    caps::run_plan(capability, &call.arguments.0).map_err(AgentError::invalid)
}

fn count(ctx: &TaskContext) -> impl Fn(&str) -> usize + '_ {
    |text: &str| ctx.tokens.count(text)
}

fn find<'a>(ctx: &'a TaskContext, id: &str) -> Result<&'a Capability, AgentError> {
    ctx.capabilities.get(id).ok_or_else(|| {
        AgentError::invalid(format!(
            "no capability `{id}`; {} without an id lists them",
            caps::INSPECT
        ))
    })
}

async fn inspect(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    call: &ToolCall,
) -> Result<String, AgentError> {
    let request = caps::inspect_request(&call.arguments.0).map_err(AgentError::invalid)?;
    let budget = ctx.capability_budget.inspect_tokens;
    let (id, level) = match request {
        InspectRequest::List => {
            caps::metrics::inspected(None);
            let visible = caps::visible(&ctx.capabilities, &gov.policy);
            return Ok(caps::list(&visible, budget, &count(ctx)));
        }
        InspectRequest::One { id, level } => (id, level),
    };
    let span = tracing::info_span!(
        "troupe.capability.inspect",
        "troupe.capability.id" = %id,
        "troupe.capability.level" = level as u8,
        conversation_id = %ctx.conversation_id,
        task_id = %ctx.task_id,
    );
    let capability = find(ctx, &id)?;
    let probe = if level == Level::Full {
        Some(probe(ctx, capability).instrument(span.clone()).await)
    } else {
        None
    };
    caps::metrics::inspected(Some(level));
    Ok(span.in_scope(|| caps::inspect(capability, level, probe.as_deref(), budget, &count(ctx))))
}

/// The probe's output, or why there is none.
async fn probe(ctx: &TaskContext, capability: &Capability) -> String {
    let Some(exec) = ctx.exec.as_ref() else {
        return "(not run: no command runner is configured for this session)".into();
    };
    let roots = builtins::workspace_roots(&ctx.workspace_roots);
    let request = ExecRequest {
        argv: capability.module.probe.clone(),
        workdir: builtins::shell_workdir(&roots, None),
        timeout: capability
            .module
            .timeout_ms
            .map_or(PROBE_TIMEOUT, Duration::from_millis)
            .min(PROBE_TIMEOUT),
        sandbox: SandboxPolicy::ReadOnly,
        output_cap: ctx.limits.exec_output_cap,
        writable_roots: Vec::new(),
        conversation_id: Some(ctx.conversation_id),
        task_id: Some(ctx.task_id),
    };
    match exec.run(request, &ctx.cancel).await {
        Ok(out) => render_exec(&out),
        Err(error) => format!("(could not run: {error})\n"),
    }
}

async fn run(ctx: &TaskContext, call: &ToolCall) -> Result<ToolOutput, ToolFailure> {
    let started = Instant::now();
    let result = run_inner(ctx, call).await;
    let outcome = match &result {
        Ok(output) if !output.is_error => RunOutcome::Ok,
        Ok(_) => RunOutcome::Error,
        Err(_) => RunOutcome::NotRun,
    };
    caps::metrics::ran(outcome, started.elapsed());
    result.map_err(ToolFailure::from)
}

async fn run_inner(ctx: &TaskContext, call: &ToolCall) -> Result<ToolOutput, AgentError> {
    let plan = run_plan_of(ctx, call)?;
    let span = tracing::info_span!(
        "troupe.capability.run",
        "troupe.capability.id" = %plan.id,
        "troupe.capability.command" = %plan.command,
        "process.exit.code" = tracing::field::Empty,
        conversation_id = %ctx.conversation_id,
        task_id = %ctx.task_id,
    );
    let (out, _sandbox) = run_command(
        ctx,
        &plan.argv,
        ctx.approval_policy == ApprovalPolicy::Always,
        None,
        plan.timeout_ms.map(Duration::from_millis),
        format!(
            "the model wants to run the `{}` command of capability `{}`",
            plan.command, plan.id
        ),
    )
    .instrument(span.clone())
    .await?;
    if let Some(code) = out.exit_code {
        span.record("process.exit.code", code);
    }
    Ok(ToolOutput {
        call_id: call.call_id.clone(),
        output: render_exec(&out),
        is_error: out.exit_code != Some(0),
    })
}
