//! TaskRegistry: the session's index of live tasks (S4). One per session, supervised by the
//! Session.
//!
//! For every live task it keeps the conversation, the legacy `sub_id`, the start time, the
//! state and the task's `CancellationToken`, and nothing else: no reference to a conversation
//! or to the task's future, so the registry and the conversations never own each other. The
//! decisions live in [`RegistryCore`], a plain struct; the actor adds the mailbox, logs and
//! metrics.
//!
//! ```text
//!  conversation                          TaskRegistry
//!  Register{task, conv, sub_id, token, started_at} ─▶ entry (state Queued)
//!  StateChanged{task, state} ──────────▶ Queued → Running (Cancelling stays Cancelling)
//!  Deregister{task} ───────────────────▶ entry dropped (idempotent)
//!  ConversationGone{conv} ─────────────▶ its entries dropped, their tokens cancelled
//!  Reinstate{.., state} ───────────────▶ entry as it was before a registry restart
//!
//!  API / session                         TaskRegistry                         task
//!  Cancel{task, reply} ────────────────▶ token.cancel(), state Cancelling ──▶ token.cancelled()
//!                      ◀──────────────── Ok(TaskInfo) | Err(NotFound)
//!  CancelConversation{conv, reply} ────▶ the same for each task of conv; reply: how many
//!  List{conv?, reply} ─────────────────▶ TaskInfo sorted by started_at, then task id
//! ```
//!
//! Cancelling only fires the token: the task notices it, stops, and deregisters. A task whose
//! cancellation was asked stays `Cancelling` until then, whatever state it reports meanwhile.
//! Its conversation sees the token fire too, and aborts a task that has not ended within the
//! close timeout (see `conversation`), so a cancelled task always ends and frees its slot.
//! `CancelConversation` reaches the tasks registered here, the running ones; the
//! conversation's own `CancelAll` (what the API calls) also cancels its queued messages.
//!
//! Children: none. Failure: the Session supervises the registry and starts a new, empty one
//! in its place (`InjectPanic` fails it on demand, for tests and drills). Callers waiting on a
//! reply (`Cancel`, `CancelConversation`, `List`) see their reply port closed, an error the API
//! reports. No task is lost or cancelled by the restart, since the tokens belong to the tasks:
//! each conversation with a running task, once it sees the new registry in the session's
//! directory, sends `Reinstate` with the task's start time and state (counted in
//! `troupe_tasks_reinstated_total`). Until that message arrives, which is the moment it takes a
//! conversation to handle one message, the new registry does not know the task: `List` leaves
//! it out and `Cancel` answers `NotFound`.

pub mod metrics;

use self::metrics::{CancelScope, LiveTasks, StateCounts};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::{BTreeSet, HashMap};
use tokio_util::sync::CancellationToken;
use troupe_proto::{AgentError, ConversationId, TaskId, TaskInfo, TaskState};

/// Start-up arguments: none (start times come with each task, stamped by its conversation
/// on the session's clock, so that a re-registered task keeps its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskRegistryArgs;

/// The actor's state.
pub struct TaskRegistryState {
    core: RegistryCore,
    /// Last values pushed to the live-task gauges.
    live: LiveTasks,
}

/// The TaskRegistry's mailbox.
pub enum TaskRegistryMsg {
    /// Records a new task. The registry keeps only its cancellation token: no reference back to
    /// the conversation, so nothing forms a cycle.
    Register {
        task_id: TaskId,
        conversation_id: ConversationId,
        sub_id: String,
        cancel: CancellationToken,
        started_at_ms: u64,
    },
    /// Records a task registered with a registry this one replaced, as it stands now.
    Reinstate {
        task_id: TaskId,
        conversation_id: ConversationId,
        sub_id: String,
        cancel: CancellationToken,
        started_at_ms: u64,
        state: TaskState,
    },
    /// The task moved to another state (queued → running).
    StateChanged { task_id: TaskId, state: TaskState },
    /// The task is over. Idempotent.
    Deregister { task_id: TaskId },
    /// Cancels one task; `NotFound` if it is not registered.
    Cancel {
        task_id: TaskId,
        reply: RpcReplyPort<Result<TaskInfo, AgentError>>,
    },
    /// Cancels every task of a conversation; answers how many.
    CancelConversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<usize>,
    },
    /// Drops every entry of a conversation that is gone (it failed or closed).
    ConversationGone { conversation_id: ConversationId },
    /// Lists tasks, of one conversation or all, oldest first.
    List {
        conversation_id: Option<ConversationId>,
        reply: RpcReplyPort<Vec<TaskInfo>>,
    },
    /// Fault injection: panics inside `handle`, to exercise the Session's restart of the
    /// registry in tests and drills.
    InjectPanic,
}

/// The TaskRegistry actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskRegistry;

#[ractor::async_trait]
impl Actor for TaskRegistry {
    type Msg = TaskRegistryMsg;
    type State = TaskRegistryState;
    type Arguments = TaskRegistryArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: TaskRegistryArgs,
    ) -> Result<TaskRegistryState, ActorProcessingErr> {
        Ok(TaskRegistryState {
            core: RegistryCore::default(),
            live: LiveTasks::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: TaskRegistryMsg,
        state: &mut TaskRegistryState,
    ) -> Result<(), ActorProcessingErr> {
        let core = &mut state.core;
        match msg {
            TaskRegistryMsg::Register {
                task_id,
                conversation_id,
                sub_id,
                cancel,
                started_at_ms,
            } => {
                if !core.register(task_id, conversation_id, sub_id, cancel, started_at_ms) {
                    tracing::debug!(%task_id, %conversation_id, "task registry: task registered again");
                }
            }
            TaskRegistryMsg::Reinstate {
                task_id,
                conversation_id,
                sub_id,
                cancel,
                started_at_ms,
                state,
            } => {
                if core.reinstate(
                    task_id,
                    conversation_id,
                    sub_id,
                    cancel,
                    started_at_ms,
                    state,
                ) {
                    metrics::reinstated();
                    tracing::info!(%task_id, %conversation_id, ?state, "task registry: task reinstated");
                }
            }
            TaskRegistryMsg::StateChanged { task_id, state } => {
                if core.state_changed(task_id, state).is_none() {
                    tracing::debug!(%task_id, ?state, "task registry: state of an unknown task");
                }
            }
            TaskRegistryMsg::Deregister { task_id } => {
                core.deregister(task_id);
            }
            TaskRegistryMsg::Cancel { task_id, reply } => {
                let answer = core.cancel(task_id).map(|(info, newly)| {
                    metrics::cancelled(CancelScope::Task, usize::from(newly));
                    tracing::info!(%task_id, conversation_id = %info.conversation_id, "task registry: task cancelled");
                    info
                });
                let _ = reply.send(answer);
            }
            TaskRegistryMsg::CancelConversation {
                conversation_id,
                reply,
            } => {
                let (all, newly) = core.cancel_conversation(conversation_id);
                metrics::cancelled(CancelScope::Conversation, newly);
                tracing::info!(%conversation_id, tasks = all, "task registry: conversation's tasks cancelled");
                let _ = reply.send(all);
            }
            TaskRegistryMsg::ConversationGone { conversation_id } => {
                let dropped = core.conversation_gone(conversation_id);
                tracing::debug!(%conversation_id, dropped, "task registry: conversation gone");
            }
            TaskRegistryMsg::List {
                conversation_id,
                reply,
            } => {
                let _ = reply.send(core.list(conversation_id));
            }
            TaskRegistryMsg::InjectPanic => panic!("injected fault in the task registry"),
        }
        state.live.publish(state.core.counts());
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut TaskRegistryState,
    ) -> Result<(), ActorProcessingErr> {
        state.live.publish(StateCounts::default());
        Ok(())
    }
}

/// The state a task is in after it reports `reported`: a requested cancellation is not undone
/// by a late report of progress (a task queued when cancelled may still report `Running`).
pub fn next_state(current: TaskState, reported: TaskState) -> TaskState {
    match current {
        TaskState::Cancelling => TaskState::Cancelling,
        TaskState::Queued | TaskState::Running => reported,
    }
}

/// One live task.
#[derive(Debug)]
struct LiveTask {
    conversation_id: ConversationId,
    sub_id: String,
    started_at_ms: u64,
    state: TaskState,
    /// The task's own token; cancelling it is the only way the registry acts on a task.
    cancel: CancellationToken,
}

impl LiveTask {
    fn info(&self, task_id: TaskId) -> TaskInfo {
        TaskInfo {
            task_id,
            conversation_id: self.conversation_id,
            sub_id: self.sub_id.clone(),
            started_at_ms: self.started_at_ms,
            state: self.state,
        }
    }
}

/// The registry's decisions, free of actors and I/O.
#[derive(Debug, Default)]
pub struct RegistryCore {
    tasks: HashMap<TaskId, LiveTask>,
    /// Task ids per conversation, so that conversation-wide operations need not scan.
    by_conversation: HashMap<ConversationId, BTreeSet<TaskId>>,
    /// Live tasks per state, indexed as [`metrics::STATES`].
    counts: StateCounts,
}

impl RegistryCore {
    /// Records a task as `Queued`, started at `now_ms`. Registering a known task again (a
    /// caller's retry) keeps its start time and state and adopts the new token, cancelled at
    /// once if the task is already being cancelled. Returns whether the task was new.
    pub fn register(
        &mut self,
        task_id: TaskId,
        conversation_id: ConversationId,
        sub_id: String,
        cancel: CancellationToken,
        now_ms: u64,
    ) -> bool {
        if let Some(entry) = self.tasks.get_mut(&task_id) {
            if entry.state == TaskState::Cancelling {
                cancel.cancel();
            }
            let moved_from =
                (entry.conversation_id != conversation_id).then_some(entry.conversation_id);
            entry.conversation_id = conversation_id;
            entry.sub_id = sub_id;
            entry.cancel = cancel;
            if let Some(old) = moved_from {
                self.unindex(old, task_id);
                self.by_conversation
                    .entry(conversation_id)
                    .or_default()
                    .insert(task_id);
            }
            return false;
        }
        self.tasks.insert(
            task_id,
            LiveTask {
                conversation_id,
                sub_id,
                started_at_ms: now_ms,
                state: TaskState::Queued,
                cancel,
            },
        );
        self.by_conversation
            .entry(conversation_id)
            .or_default()
            .insert(task_id);
        self.counts[metrics::state_index(TaskState::Queued)] += 1;
        true
    }

    /// Records a task as it stood in a registry this one replaced: its start time and state.
    /// A task already known is registered again as by [`Self::register`]. Returns whether it
    /// was new.
    pub fn reinstate(
        &mut self,
        task_id: TaskId,
        conversation_id: ConversationId,
        sub_id: String,
        cancel: CancellationToken,
        started_at_ms: u64,
        state: TaskState,
    ) -> bool {
        if !self.register(task_id, conversation_id, sub_id, cancel, started_at_ms) {
            return false;
        }
        if let Some(entry) = self.tasks.get_mut(&task_id) {
            Self::shift(&mut self.counts, entry, state);
        }
        true
    }

    /// Applies a reported state (see [`next_state`]); `None` if the task is unknown.
    pub fn state_changed(&mut self, task_id: TaskId, reported: TaskState) -> Option<TaskState> {
        let entry = self.tasks.get_mut(&task_id)?;
        let next = next_state(entry.state, reported);
        Self::shift(&mut self.counts, entry, next);
        Some(next)
    }

    /// Forgets a task; false if it was not registered.
    pub fn deregister(&mut self, task_id: TaskId) -> bool {
        let Some(entry) = self.tasks.remove(&task_id) else {
            return false;
        };
        self.counts[metrics::state_index(entry.state)] -= 1;
        self.unindex(entry.conversation_id, task_id);
        true
    }

    /// Fires the task's token and marks it `Cancelling`. Returns its info and whether this is
    /// the first request to cancel it.
    pub fn cancel(&mut self, task_id: TaskId) -> Result<(TaskInfo, bool), AgentError> {
        let entry = self
            .tasks
            .get_mut(&task_id)
            .ok_or_else(|| AgentError::NotFound {
                what: "task".into(),
                id: task_id.to_string(),
            })?;
        let newly = Self::cancel_entry(&mut self.counts, entry);
        Ok((entry.info(task_id), newly))
    }

    /// Cancels every task of a conversation. Returns how many it has (all now `Cancelling`)
    /// and how many of those were not being cancelled already.
    pub fn cancel_conversation(&mut self, conversation_id: ConversationId) -> (usize, usize) {
        let Some(ids) = self.by_conversation.get(&conversation_id) else {
            return (0, 0);
        };
        let mut newly = 0;
        for task_id in ids {
            if let Some(entry) = self.tasks.get_mut(task_id)
                && Self::cancel_entry(&mut self.counts, entry)
            {
                newly += 1;
            }
        }
        (ids.len(), newly)
    }

    /// Drops every entry of a conversation, firing their tokens so that nothing of a gone
    /// conversation keeps running. Returns how many were dropped.
    pub fn conversation_gone(&mut self, conversation_id: ConversationId) -> usize {
        let Some(ids) = self.by_conversation.remove(&conversation_id) else {
            return 0;
        };
        for task_id in &ids {
            if let Some(entry) = self.tasks.remove(task_id) {
                entry.cancel.cancel();
                self.counts[metrics::state_index(entry.state)] -= 1;
            }
        }
        ids.len()
    }

    /// Tasks of one conversation (or all), sorted by start time, then task id.
    pub fn list(&self, conversation_id: Option<ConversationId>) -> Vec<TaskInfo> {
        let mut out: Vec<TaskInfo> = match conversation_id {
            Some(c) => self
                .by_conversation
                .get(&c)
                .into_iter()
                .flatten()
                .filter_map(|id| self.tasks.get(id).map(|e| e.info(*id)))
                .collect(),
            None => self.tasks.iter().map(|(id, e)| e.info(*id)).collect(),
        };
        out.sort_by_key(|a| (a.started_at_ms, a.task_id));
        out
    }

    /// Live tasks per state, indexed as [`metrics::STATES`].
    pub fn counts(&self) -> StateCounts {
        self.counts
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    fn cancel_entry(counts: &mut StateCounts, entry: &mut LiveTask) -> bool {
        entry.cancel.cancel();
        let newly = entry.state != TaskState::Cancelling;
        Self::shift(counts, entry, TaskState::Cancelling);
        newly
    }

    fn shift(counts: &mut StateCounts, entry: &mut LiveTask, next: TaskState) {
        counts[metrics::state_index(entry.state)] -= 1;
        counts[metrics::state_index(next)] += 1;
        entry.state = next;
    }

    fn unindex(&mut self, conversation_id: ConversationId, task_id: TaskId) {
        if let Some(ids) = self.by_conversation.get_mut(&conversation_id) {
            ids.remove(&task_id);
            if ids.is_empty() {
                self.by_conversation.remove(&conversation_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> CancellationToken {
        CancellationToken::new()
    }

    #[test]
    fn cancelling_is_sticky() {
        use TaskState::*;
        assert_eq!(next_state(Queued, Running), Running);
        assert_eq!(next_state(Running, Queued), Queued);
        assert_eq!(next_state(Cancelling, Running), Cancelling);
        assert_eq!(next_state(Cancelling, Queued), Cancelling);
    }

    #[test]
    fn register_change_state_deregister() {
        let mut core = RegistryCore::default();
        let (t, c) = (TaskId::new(), ConversationId::new());
        assert!(core.register(t, c, "s1".into(), token(), 10));
        assert_eq!(core.counts(), [1, 0, 0]);
        assert_eq!(
            core.state_changed(t, TaskState::Running),
            Some(TaskState::Running)
        );
        assert_eq!(core.counts(), [0, 1, 0]);
        assert_eq!(
            core.list(None),
            vec![TaskInfo {
                task_id: t,
                conversation_id: c,
                sub_id: "s1".into(),
                started_at_ms: 10,
                state: TaskState::Running
            }]
        );
        assert!(core.deregister(t));
        assert!(!core.deregister(t));
        assert!(core.is_empty());
        assert_eq!(core.counts(), [0, 0, 0]);
        assert_eq!(core.state_changed(t, TaskState::Running), None);
        assert!(core.list(Some(c)).is_empty());
    }

    #[test]
    fn cancel_fires_the_token_and_marks_the_task() {
        let mut core = RegistryCore::default();
        let (t, c) = (TaskId::new(), ConversationId::new());
        let tok = token();
        core.register(t, c, "s".into(), tok.clone(), 1);
        let (info, newly) = core.cancel(t).unwrap();
        assert!(newly);
        assert!(tok.is_cancelled());
        assert_eq!(info.state, TaskState::Cancelling);
        let (_, again) = core.cancel(t).unwrap();
        assert!(!again);
        // A late progress report does not undo the cancellation.
        assert_eq!(
            core.state_changed(t, TaskState::Running),
            Some(TaskState::Cancelling)
        );
        assert_eq!(core.counts(), [0, 0, 1]);
    }

    #[test]
    fn cancelling_an_unknown_task_is_not_found() {
        let mut core = RegistryCore::default();
        let t = TaskId::new();
        assert_eq!(
            core.cancel(t),
            Err(AgentError::NotFound {
                what: "task".into(),
                id: t.to_string()
            })
        );
    }

    #[test]
    fn registering_again_keeps_start_and_state_and_adopts_the_token() {
        let mut core = RegistryCore::default();
        let (t, c, d) = (TaskId::new(), ConversationId::new(), ConversationId::new());
        core.register(t, c, "s".into(), token(), 5);
        core.cancel(t).unwrap();
        let fresh = token();
        assert!(!core.register(t, d, "s2".into(), fresh.clone(), 99));
        assert!(fresh.is_cancelled());
        let info = &core.list(None)[0];
        assert_eq!((info.started_at_ms, info.state), (5, TaskState::Cancelling));
        assert!(core.list(Some(c)).is_empty());
        assert_eq!(core.list(Some(d)).len(), 1);
        assert_eq!(core.len(), 1);
    }

    #[test]
    fn a_reinstated_task_keeps_its_start_and_state() {
        let mut core = RegistryCore::default();
        let (t, c) = (TaskId::new(), ConversationId::new());
        assert!(core.reinstate(t, c, "s".into(), token(), 7, TaskState::Running));
        assert_eq!(
            core.list(None),
            vec![TaskInfo {
                task_id: t,
                conversation_id: c,
                sub_id: "s".into(),
                started_at_ms: 7,
                state: TaskState::Running
            }]
        );
        assert_eq!(core.counts(), [0, 1, 0]);
        // Known already: nothing moves.
        assert!(!core.reinstate(t, c, "s".into(), token(), 9, TaskState::Queued));
        assert_eq!(core.list(None)[0].started_at_ms, 7);
        assert_eq!(core.counts(), [0, 1, 0]);
        let tok = token();
        assert!(core.reinstate(TaskId::new(), c, "x".into(), tok, 8, TaskState::Cancelling));
        assert_eq!(core.counts(), [0, 1, 1]);
    }

    #[test]
    fn cancel_conversation_reaches_only_its_tasks() {
        let mut core = RegistryCore::default();
        let (c, d) = (ConversationId::new(), ConversationId::new());
        let toks: Vec<CancellationToken> = (0..3).map(|_| token()).collect();
        let other = token();
        let ids: Vec<TaskId> = (0..3).map(|_| TaskId::new()).collect();
        for (i, (id, tok)) in ids.iter().zip(&toks).enumerate() {
            core.register(*id, c, format!("s{i}"), tok.clone(), i as u64);
        }
        core.register(TaskId::new(), d, "o".into(), other.clone(), 0);
        core.cancel(ids[0]).unwrap();
        assert_eq!(core.cancel_conversation(c), (3, 2));
        assert!(toks.iter().all(CancellationToken::is_cancelled));
        assert!(!other.is_cancelled());
        assert_eq!(core.cancel_conversation(ConversationId::new()), (0, 0));
        assert_eq!(core.counts(), [1, 0, 3]);
    }

    #[test]
    fn a_gone_conversation_leaves_nothing_behind() {
        let mut core = RegistryCore::default();
        let (c, d) = (ConversationId::new(), ConversationId::new());
        let tok = token();
        core.register(TaskId::new(), c, "a".into(), tok.clone(), 1);
        core.register(TaskId::new(), c, "b".into(), token(), 2);
        let kept = TaskId::new();
        core.register(kept, d, "c".into(), token(), 3);
        assert_eq!(core.conversation_gone(c), 2);
        assert_eq!(core.conversation_gone(c), 0);
        assert!(tok.is_cancelled());
        assert_eq!(
            core.list(None)
                .iter()
                .map(|i| i.task_id)
                .collect::<Vec<_>>(),
            vec![kept]
        );
        assert_eq!(core.counts(), [1, 0, 0]);
    }

    #[test]
    fn list_is_sorted_by_start_then_id() {
        let mut core = RegistryCore::default();
        let c = ConversationId::new();
        let ids: Vec<TaskId> = (0..4).map(|_| TaskId::new()).collect();
        // Registered out of order; two share a start time.
        core.register(ids[3], c, "d".into(), token(), 20);
        core.register(ids[2], c, "c".into(), token(), 10);
        core.register(ids[0], c, "a".into(), token(), 10);
        core.register(ids[1], ConversationId::new(), "b".into(), token(), 15);
        let all: Vec<TaskId> = core.list(None).iter().map(|i| i.task_id).collect();
        assert_eq!(all, vec![ids[0], ids[2], ids[1], ids[3]]);
        let of_c: Vec<TaskId> = core.list(Some(c)).iter().map(|i| i.task_id).collect();
        assert_eq!(of_c, vec![ids[0], ids[2], ids[3]]);
    }

    mod actor {
        use super::*;
        use crate::clock::Clock;
        use ractor::call;
        use std::time::Duration;

        async fn registry() -> (ActorRef<TaskRegistryMsg>, Clock) {
            let clock = Clock::new();
            let (r, _) = Actor::spawn(None, TaskRegistry, TaskRegistryArgs)
                .await
                .unwrap();
            (r, clock)
        }

        /// Registers as a conversation does: stamped with the session's clock.
        fn register(
            r: &ActorRef<TaskRegistryMsg>,
            clock: &Clock,
            task_id: TaskId,
            conversation_id: ConversationId,
            cancel: &CancellationToken,
        ) {
            r.cast(TaskRegistryMsg::Register {
                task_id,
                conversation_id,
                sub_id: format!("sub-{task_id}"),
                cancel: cancel.clone(),
                started_at_ms: clock.now_ms(),
            })
            .unwrap();
        }

        async fn list(r: &ActorRef<TaskRegistryMsg>, c: Option<ConversationId>) -> Vec<TaskInfo> {
            call!(r, |reply| TaskRegistryMsg::List {
                conversation_id: c,
                reply
            })
            .unwrap()
        }

        #[tokio::test(start_paused = true)]
        async fn register_state_change_and_deregister() {
            let (r, clock) = registry().await;
            let (t, c) = (TaskId::new(), ConversationId::new());
            let started = clock.now_ms();
            register(&r, &clock, t, c, &token());
            r.cast(TaskRegistryMsg::StateChanged {
                task_id: t,
                state: TaskState::Running,
            })
            .unwrap();
            assert_eq!(
                list(&r, Some(c)).await,
                vec![TaskInfo {
                    task_id: t,
                    conversation_id: c,
                    sub_id: format!("sub-{t}"),
                    started_at_ms: started,
                    state: TaskState::Running
                }]
            );
            r.cast(TaskRegistryMsg::Deregister { task_id: t }).unwrap();
            r.cast(TaskRegistryMsg::Deregister { task_id: t }).unwrap();
            assert!(list(&r, None).await.is_empty());
        }

        #[tokio::test(start_paused = true)]
        async fn cancel_reaches_a_task_awaiting_its_token() {
            let (r, clock) = registry().await;
            let (t, c) = (TaskId::new(), ConversationId::new());
            let tok = token();
            register(&r, &clock, t, c, &tok);
            let task = tokio::spawn({
                let tok = tok.clone();
                async move {
                    tok.cancelled().await;
                    "stopped"
                }
            });
            let info = call!(r, |reply| TaskRegistryMsg::Cancel { task_id: t, reply })
                .unwrap()
                .unwrap();
            assert_eq!(info.state, TaskState::Cancelling);
            assert_eq!(info.task_id, t);
            let outcome = tokio::time::timeout(Duration::from_secs(1), task).await;
            assert_eq!(outcome.unwrap().unwrap(), "stopped");
            assert_eq!(list(&r, None).await[0].state, TaskState::Cancelling);
        }

        #[tokio::test(start_paused = true)]
        async fn cancel_of_an_unknown_task_is_not_found() {
            let (r, _) = registry().await;
            let t = TaskId::new();
            let answer = call!(r, |reply| TaskRegistryMsg::Cancel { task_id: t, reply }).unwrap();
            assert!(matches!(answer, Err(AgentError::NotFound { what, .. }) if what == "task"));
        }

        #[tokio::test(start_paused = true)]
        async fn cancel_conversation_counts_and_fires_its_tokens() {
            let (r, clock) = registry().await;
            let (c, d) = (ConversationId::new(), ConversationId::new());
            let (a, b, other) = (token(), token(), token());
            register(&r, &clock, TaskId::new(), c, &a);
            register(&r, &clock, TaskId::new(), c, &b);
            register(&r, &clock, TaskId::new(), d, &other);
            let n = call!(r, |reply| TaskRegistryMsg::CancelConversation {
                conversation_id: c,
                reply
            })
            .unwrap();
            assert_eq!(n, 2);
            assert!(a.is_cancelled() && b.is_cancelled());
            assert!(!other.is_cancelled());
            assert!(
                list(&r, Some(c))
                    .await
                    .iter()
                    .all(|i| i.state == TaskState::Cancelling)
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_gone_conversation_is_dropped() {
            let (r, clock) = registry().await;
            let (c, d) = (ConversationId::new(), ConversationId::new());
            register(&r, &clock, TaskId::new(), c, &token());
            let kept = TaskId::new();
            register(&r, &clock, kept, d, &token());
            r.cast(TaskRegistryMsg::ConversationGone { conversation_id: c })
                .unwrap();
            assert!(list(&r, Some(c)).await.is_empty());
            let all: Vec<TaskId> = list(&r, None).await.iter().map(|i| i.task_id).collect();
            assert_eq!(all, vec![kept]);
        }

        #[tokio::test(start_paused = true)]
        async fn list_is_oldest_first() {
            let (r, clock) = registry().await;
            let c = ConversationId::new();
            let (first, second) = (TaskId::new(), TaskId::new());
            register(&r, &clock, second, c, &token());
            // A barrier, so that the first registration is stamped before time moves on.
            let _ = list(&r, None).await;
            tokio::time::advance(Duration::from_millis(5)).await;
            register(&r, &clock, first, ConversationId::new(), &token());
            let listed = list(&r, None).await;
            let order: Vec<TaskId> = listed.iter().map(|i| i.task_id).collect();
            assert_eq!(order, vec![second, first]);
            assert_eq!(listed[1].started_at_ms - listed[0].started_at_ms, 5);
            assert!(listed[1].started_at_ms <= clock.now_ms());
        }
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(TaskRegistryMsg);
