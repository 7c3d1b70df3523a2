//! The conversation's decisions as pure functions of what it knows: which tasks a restored
//! rollout left unfinished, whether a message is admitted or queued, which scheduler answer
//! counts, and what a replaced Scheduler or TaskRegistry is told.

use super::*;

/// Tasks of a record that started and never ended (no `task_finished` or `task_aborted`), in
/// the order they started.
pub fn interrupted_tasks(records: &[RolloutRecord]) -> Vec<TaskId> {
    let mut started = Vec::new();
    let mut ended = std::collections::HashSet::new();
    for r in records {
        let Some(task_id) = r.task_id else { continue };
        match r.kind {
            EventName::TaskStarted | EventName::CompactionStarted
                if !started.contains(&task_id) =>
            {
                started.push(task_id);
            }
            EventName::TaskFinished | EventName::TaskAborted => {
                ended.insert(task_id);
            }
            _ => {}
        }
    }
    started.retain(|t| !ended.contains(t));
    started
}

/// What to do with a new message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageAdmission {
    StartNow,
    Enqueue,
    RejectClosing,
    RejectFull,
}

/// The `policy_clamped` warning (C2): what was asked, what the conversation got.
pub fn clamp_message(
    params: &OpenConversation,
    (approval_clamped, approval): (bool, ApprovalPolicy),
    (sandbox_clamped, sandbox): (bool, SandboxPolicy),
) -> String {
    let mut parts = Vec::new();
    if let (true, Some(asked)) = (approval_clamped, params.approval_policy) {
        parts.push(format!(
            "approval policy {asked:?} is wider than the session's; using {approval:?}"
        ));
    }
    if let (true, Some(asked)) = (sandbox_clamped, params.sandbox_policy) {
        parts.push(format!(
            "sandbox policy {asked:?} is wider than the session's; using {sandbox:?}"
        ));
    }
    format!(
        "a conversation may only narrow the session's policies: {}",
        parts.join("; ")
    )
}

/// Pure admission decision for a message.
pub fn admit(closing: bool, running: bool, queued: usize, max_queued: usize) -> MessageAdmission {
    match (closing, running) {
        (true, _) => MessageAdmission::RejectClosing,
        (false, false) => MessageAdmission::StartNow,
        (false, true) if queued < max_queued => MessageAdmission::Enqueue,
        (false, true) => MessageAdmission::RejectFull,
    }
}

/// Where a task stands with the scheduler, as its conversation knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// This scheduler was asked and has not answered.
    Asked(ActorId),
    /// This scheduler granted the slot.
    Held(ActorId),
    /// The task gave its slot back while it waits for a human (an approval, an MCP server's
    /// question); it asks again once answered.
    Yielded,
    /// An agent's task running on its dispatcher's slot (lent for the dispatch): the
    /// scheduler knows only the dispatcher's grant, and this task neither asks, gives back
    /// nor releases anything.
    Lent,
}

/// What a conversation tells a scheduler it has not dealt with yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// The scheduler already knows where the task stands.
    Nothing,
    /// No slot is held or asked for: say so (`Recovered`).
    Recovered,
    /// The task holds a grant of the scheduler it replaced: `Reinstate` it.
    Reinstate,
    /// The task waited at the scheduler it replaced: ask again.
    AskAgain,
}

/// What to tell the scheduler `current` about a task whose slot is `slot` (`None`: no task,
/// or a task that was refused a slot).
pub fn rejoin(slot: Option<SlotState>, current: ActorId) -> Rejoin {
    match slot {
        None | Some(SlotState::Yielded | SlotState::Lent) => Rejoin::Recovered,
        Some(SlotState::Asked(at) | SlotState::Held(at)) if at == current => Rejoin::Nothing,
        Some(SlotState::Asked(_)) => Rejoin::AskAgain,
        Some(SlotState::Held(_)) => Rejoin::Reinstate,
    }
}

/// What a scheduler's answer means for the task.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotAnswer {
    /// The slot is the task's: it runs.
    Granted,
    /// Refused (overloaded, withdrawn): the task ends with this error.
    Refused(AgentError),
    /// The scheduler stopped before answering: its successor is asked once published.
    Lost,
    /// From a scheduler the task no longer waits for (asked again elsewhere): ignored.
    Stale,
}

/// Judges the answer of scheduler `from` to a task whose slot is `slot`.
pub fn slot_answer(
    slot: Option<SlotState>,
    from: ActorId,
    answer: Option<Result<(), AgentError>>,
) -> SlotAnswer {
    match (slot, answer) {
        (Some(SlotState::Asked(at)), Some(Ok(()))) if at == from => SlotAnswer::Granted,
        (Some(SlotState::Asked(at)), Some(Err(error))) if at == from => SlotAnswer::Refused(error),
        (Some(SlotState::Asked(at)), None) if at == from => SlotAnswer::Lost,
        _ => SlotAnswer::Stale,
    }
}

/// The state a task is declared in to a new TaskRegistry.
pub fn registry_state(cancelled: bool, slot: Option<SlotState>) -> TaskState {
    match (cancelled, slot) {
        (true, _) => TaskState::Cancelling,
        // A task waiting for a human without its slot has run, and goes on once answered.
        (false, Some(SlotState::Held(_) | SlotState::Yielded | SlotState::Lent)) => {
            TaskState::Running
        }
        (false, _) => TaskState::Queued,
    }
}

/// What a task's request to give its slot back while it waits for a human does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YieldPlan {
    /// Release the slot to the scheduler; the task holds none until it asks again.
    Release,
    /// Nothing to give back (not granted, already given back, lent by a dispatcher, or not
    /// this task).
    Nothing,
}

/// Judges a yield of the running task whose slot is `slot`.
pub fn yield_plan(slot: Option<SlotState>) -> YieldPlan {
    match slot {
        Some(SlotState::Held(_)) => YieldPlan::Release,
        _ => YieldPlan::Nothing,
    }
}

/// What a task's request for its slot back (after a human answered) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimPlan {
    /// Ask the scheduler; the runner waits for the grant like a new task.
    Ask,
    /// The task still holds its slot (it never gave it back): go on at once.
    AlreadyHeld,
    /// Asked already (a reclaim in flight): the runner waits for that answer.
    Pending,
}

/// Judges a reclaim of the running task whose slot is `slot`.
pub fn reclaim_plan(slot: Option<SlotState>) -> ReclaimPlan {
    match slot {
        Some(SlotState::Yielded) | None => ReclaimPlan::Ask,
        Some(SlotState::Held(_) | SlotState::Lent) => ReclaimPlan::AlreadyHeld,
        Some(SlotState::Asked(_)) => ReclaimPlan::Pending,
    }
}

/// Whether a cancelled task's abort timer must start: it still runs, and none is armed (close
/// and the token's report both ask; the first one arms it).
pub fn abort_timer_needed(task_runs: bool, armed: bool) -> bool {
    task_runs && !armed
}

/// Which model a conversation asks (S1, C1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// The session's model.
    Session,
    /// Another model of the session's provider, on the same endpoint.
    Named(String),
}

/// Checks what an open (or set-context) request names against the session's model: a
/// provider must be the session's (a session has one endpoint), a model name must not be
/// empty; naming the session's own model is the session's model.
pub fn choose_model(
    session: &crate::ports::ModelInfo,
    provider: Option<&str>,
    model: Option<&str>,
) -> Result<ModelChoice, AgentError> {
    if let Some(p) = provider.map(str::trim)
        && p != session.provider
    {
        return Err(AgentError::invalid(format!(
            "unknown provider `{p}`: this session's provider is `{}` (a conversation may name \
             another model of it with `model`)",
            session.provider
        )));
    }
    match model {
        None => Ok(ModelChoice::Session),
        Some(m) if m.trim().is_empty() || m.chars().any(char::is_control) => Err(
            AgentError::invalid("a model name must be non-empty text without control characters"),
        ),
        Some(m) if m == session.model => Ok(ModelChoice::Session),
        Some(m) => Ok(ModelChoice::Named(m.to_owned())),
    }
}

/// Whether a conversation is idle: no task runs or waits in it, it is not closing, and no
/// model summary of its history is being written. (A pending approval or elicitation always
/// belongs to a running task; event subscribers listen to the session's Rollout, which stays.)
pub fn is_idle(running: bool, queued: usize, closing: bool, summarizing: bool) -> bool {
    !running && queued == 0 && !closing && !summarizing
}

/// How long a conversation waits idle before it offers to be passivated: `after` when its
/// storage policy keeps every record a restore rebuilds it from (`Full`: a `Ttl` sweep, or a
/// policy without content, would bring it back with less history than it had), and it has
/// no model client of its own (an in-process agent's, which only its hub can give again).
pub fn passivation_allowed(
    after: Option<Duration>,
    policy: troupe_proto::StoragePolicy,
    own_model: bool,
) -> Option<Duration> {
    after.filter(|_| policy == troupe_proto::StoragePolicy::Full && !own_model)
}

/// Whether to arm the idle timer: passivation is on, the conversation is idle, and no timer
/// is armed for its latest activity.
pub fn idle_timer_needed(
    after: Option<Duration>,
    idle: bool,
    armed: Option<u64>,
    activity: u64,
) -> bool {
    after.is_some() && idle && armed != Some(activity)
}

/// Whether an idle timer that fired counts: nothing happened since it was armed and the
/// conversation is still idle.
pub fn passivation_due(idle: bool, timer_epoch: u64, activity: u64) -> bool {
    idle && timer_epoch == activity
}

/// Whether a task whose slot is `slot` releases a grant when it ends: a lent slot is its
/// dispatcher's, who goes on with it.
pub fn releases_at_end(slot: Option<SlotState>) -> bool {
    slot != Some(SlotState::Lent)
}
