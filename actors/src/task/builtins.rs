//! Pure decisions of the built-in tools that run inside the task: reading `update_plan`
//! arguments, whether the sandbox lets `apply_patch` write, and where a command runs.

use std::path::{Path, PathBuf};
use troupe_proto::{AgentError, PlanStep, PlanStepStatus, SandboxPolicy};

/// The arguments of `update_plan`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanArgs {
    #[serde(default)]
    pub explanation: Option<String>,
    pub plan: Vec<PlanStep>,
}

/// Reads and checks `update_plan` arguments: well-formed steps, none empty, at most one in
/// progress.
pub fn parse_plan(args: &serde_json::Value) -> Result<PlanArgs, AgentError> {
    let parsed: PlanArgs = serde_json::from_value(args.clone()).map_err(|e| {
        AgentError::invalid(format!(
            "update_plan needs {{\"plan\": [{{\"step\": \"...\", \"status\": \"pending|in_progress|completed\"}}]}}: {e}"
        ))
    })?;
    if parsed.plan.iter().any(|s| s.step.trim().is_empty()) {
        return Err(AgentError::invalid("update_plan: every step needs a text"));
    }
    let in_progress = parsed
        .plan
        .iter()
        .filter(|s| s.status == PlanStepStatus::InProgress)
        .count();
    if in_progress > 1 {
        return Err(AgentError::invalid(format!(
            "update_plan: at most one step may be in_progress ({in_progress} are)"
        )));
    }
    Ok(parsed)
}

/// The observation of a recorded plan.
pub fn plan_observation(plan: &[PlanStep]) -> String {
    let count = |status| plan.iter().filter(|s| s.status == status).count();
    format!(
        "plan updated: {} steps ({} completed, {} in progress, {} pending).",
        plan.len(),
        count(PlanStepStatus::Completed),
        count(PlanStepStatus::InProgress),
        count(PlanStepStatus::Pending)
    )
}

/// Whether `apply_patch` may write at all under the conversation's sandbox policy: writes
/// follow the same policy as a command's (the workspace check comes after).
pub fn patch_allowed(sandbox: SandboxPolicy) -> Result<(), AgentError> {
    match sandbox {
        SandboxPolicy::ReadOnly => Err(AgentError::SandboxError {
            message: "the read-only sandbox does not let apply_patch write files".into(),
        }),
        SandboxPolicy::WorkspaceWrite | SandboxPolicy::FullAccess => Ok(()),
    }
}

/// The conversation's workspace roots: the configured ones, or the process's working
/// directory when none are configured.
pub fn workspace_roots(configured: &[PathBuf]) -> Vec<PathBuf> {
    if configured.is_empty() {
        std::env::current_dir().into_iter().collect()
    } else {
        configured.to_vec()
    }
}

/// Where a command runs: its `workdir` argument (relative to the first root), else the first
/// root. The sandbox, not this choice, bounds what it may write.
pub fn shell_workdir(roots: &[PathBuf], requested: Option<&str>) -> Option<PathBuf> {
    match (roots.first(), requested) {
        (Some(root), Some(dir)) => Some(root.join(dir)),
        (None, Some(dir)) => Some(Path::new(dir).to_path_buf()),
        (Some(root), None) => Some(root.clone()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plans_are_checked() {
        let ok = parse_plan(&json!({
            "explanation": "start",
            "plan": [
                {"step": "read", "status": "completed"},
                {"step": "write", "status": "in_progress"},
                {"step": "test", "status": "pending"},
            ]
        }))
        .unwrap();
        assert_eq!(ok.explanation.as_deref(), Some("start"));
        assert_eq!(
            plan_observation(&ok.plan),
            "plan updated: 3 steps (1 completed, 1 in progress, 1 pending)."
        );
        for bad in [
            json!({}),
            json!({"plan": [{"step": "x", "status": "done"}]}),
            json!({"plan": [{"step": " ", "status": "pending"}]}),
            json!({"plan": [
                {"step": "a", "status": "in_progress"},
                {"step": "b", "status": "in_progress"}
            ]}),
            json!({"plan": [], "extra": 1}),
        ] {
            assert!(
                matches!(parse_plan(&bad), Err(AgentError::InvalidInput { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn read_only_refuses_patches() {
        assert!(matches!(
            patch_allowed(SandboxPolicy::ReadOnly),
            Err(AgentError::SandboxError { .. })
        ));
        assert!(patch_allowed(SandboxPolicy::WorkspaceWrite).is_ok());
        assert!(patch_allowed(SandboxPolicy::FullAccess).is_ok());
    }

    #[test]
    fn workdir_defaults_to_the_workspace() {
        let roots = [PathBuf::from("/ws")];
        assert_eq!(shell_workdir(&roots, None), Some(PathBuf::from("/ws")));
        assert_eq!(
            shell_workdir(&roots, Some("sub")),
            Some(PathBuf::from("/ws/sub"))
        );
        assert_eq!(
            shell_workdir(&roots, Some("/etc")),
            Some(PathBuf::from("/etc"))
        );
        assert_eq!(shell_workdir(&[], None), None);
        assert_eq!(workspace_roots(&roots), roots);
        assert_eq!(workspace_roots(&[]).len(), 1);
    }
}
