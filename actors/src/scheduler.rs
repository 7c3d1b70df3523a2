//! Scheduler: who may run a task now (S3). One per session, supervised by the Session.
//!
//! At most `limit` tasks of a session hold a slot at once (1 = single-flight, the default).
//! Further requests wait in a bounded queue, FIFO within a conversation and round-robin across
//! conversations, so a conversation with many waiting requests cannot starve another. Every
//! decision is made by [`SchedulerCore`], a plain struct; the actor only executes it (replies,
//! monitors, metrics, logs).
//!
//! ```text
//!  conversation (for its task)           Scheduler                          holder actor
//!  Acquire{task, conv, holder, reply} ─▶ monitor(holder) ─────────────────▶ (watched)
//!                                        slot free, nobody waits: reply Ok(())
//!                                        queue has room: queued (reply comes at its turn)
//!                                        queue full: reply Err(Overloaded) at once
//!  Release{task} ──────────────────────▶ running: free the slot, grant the next waiter
//!                                        waiting: withdraw, reply Err(Cancelled)
//!                                        unknown / already released: nothing (idempotent)
//!                                      ◀─ ActorTerminated / ActorFailed(holder)
//!                                        release the holder's grants, withdraw its
//!                                        requests, grant the next waiters, unmonitor it
//!  Reinstate{task, conv, holder} ──────▶ count a grant that outlived a scheduler restart
//!  Recovered{holder} ──────────────────▶ the holder has no such grant
//!  Snapshot{reply} ────────────────────▶ reply {running, waiting in grant order, limit, recovering}
//! ```
//!
//! A slot is never freed by a timeout: it goes back on `Release` or when its holder stops
//! (the scheduler monitors every holder that has a grant or a waiting request, and unmonitors
//! it when it has neither). A waiter whose caller stopped waiting (its reply port is closed) is
//! skipped when its turn comes, and a grant whose reply cannot be delivered is released at once.
//!
//! Children: none. Failure: the Session supervises the scheduler and starts a new one, naming
//! the holders (its conversations) that may still hold grants of the old one
//! ([`SchedulerStart::recover_from`]). The new scheduler grants nothing until each of them
//! has spoken (its grant re-declared with `Reinstate`, a new `Acquire` for a task that was
//! waiting, or `Recovered` when it has neither), has stopped, or `recovery_timeout` has
//! passed (logged and counted: a holder that did not answer in time may then run beside a
//! new grant). Meanwhile requests queue as usual. A reinstated grant counts as running, even
//! above the limit (nothing is preempted), and its later `Release` is honoured; a `Release`
//! the scheduler never heard of is a no-op. The old scheduler's waiting callers see their
//! reply ports close; conversations ask the new one again (see `conversation`), so a
//! restart may cost a waiting task its place in the queue, never its run.
//! `InjectPanic` fails the actor on demand (tests, drills).

mod decide;
pub mod metrics;

use self::metrics::{AcquireOutcome, Occupancy, OldestWait, ReleaseReason, WaitBoard};
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, ActorStatus, MessagingErr,
    RpcReplyPort, SupervisionEvent,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Span;
use troupe_proto::{AgentError, ConversationId, TaskId};

pub use decide::{Decision, Effects, QueueEntry, SchedulerCore, Waiter};

/// Start-up arguments.
#[derive(Debug, Clone)]
pub struct SchedulerArgs {
    /// Tasks that may run at once in the session; 1 = single-flight (the default). 0 is read
    /// as 1, since a scheduler that never grants would hang every caller.
    pub limit: usize,
    /// Requests that may wait for a slot; one more is answered `Overloaded` at once.
    pub queue_capacity: usize,
    /// How long a scheduler that replaces a failed one waits for the holders of the old one's
    /// grants before granting again.
    pub recovery_timeout: Duration,
    /// Where the scheduler leaves since when its oldest request has waited, for the
    /// oldest-wait gauge: the process's board (a test gives its own).
    pub wait_board: Arc<WaitBoard>,
}

impl Default for SchedulerArgs {
    fn default() -> Self {
        Self {
            limit: 1,
            queue_capacity: 1024,
            recovery_timeout: Duration::from_secs(5),
            wait_board: WaitBoard::process(),
        }
    }
}

/// What a scheduler starts with.
pub struct SchedulerStart {
    pub args: SchedulerArgs,
    /// Holders that may hold grants of a scheduler this one replaces: nothing is granted
    /// until each has re-declared its grant (or that it has none), or has stopped.
    pub recover_from: Vec<ActorCell>,
}

impl From<SchedulerArgs> for SchedulerStart {
    fn from(args: SchedulerArgs) -> Self {
        Self {
            args,
            recover_from: Vec::new(),
        }
    }
}

/// The actor's state: the decision core plus what it needs to execute decisions.
pub struct SchedulerState {
    core: SchedulerCore<PendingAcquire>,
    /// Cells of the holders being monitored, kept to unmonitor them once they hold nothing.
    holders: HashMap<ActorId, ActorCell>,
    /// Last values pushed to the running/waiting gauges.
    occupancy: Occupancy,
    /// Since when the oldest request has waited, as last left on the wait board.
    oldest_wait: OldestWait,
    recovery_timeout: Duration,
    /// The end of the wait for the old scheduler's holders, while it runs.
    recovery_timer: Option<JoinHandle<Result<(), MessagingErr<SchedulerMsg>>>>,
}

/// The Scheduler's mailbox.
pub enum SchedulerMsg {
    /// Asks for a slot for `task_id`. Answered `Ok(())` when granted (FIFO, fair across
    /// conversations), or at once with `Overloaded` when the wait queue is full. The grant is
    /// released by `Release`, or when `holder` dies (the scheduler monitors it).
    Acquire {
        task_id: TaskId,
        conversation_id: ConversationId,
        holder: ActorCell,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Gives a slot back, or withdraws a waiting request. Idempotent.
    Release { task_id: TaskId },
    /// Observation: running and waiting tasks.
    Snapshot {
        reply: RpcReplyPort<SchedulerSnapshot>,
    },
    /// Re-declares a grant that a task still holds from before a scheduler restart. It counts
    /// as running at once, even above the limit; new grants wait until the count drops below.
    Reinstate {
        task_id: TaskId,
        conversation_id: ConversationId,
        holder: ActorCell,
    },
    /// After a scheduler restart: `holder` holds no grant of the old scheduler.
    Recovered { holder: ActorCell },
    /// Timer: stop waiting for the holders of the old scheduler's grants.
    RecoveryTimedOut,
    /// Fault injection: panics inside `handle`, to exercise the Session's restart of the
    /// scheduler in tests and drills.
    InjectPanic,
}

/// What the scheduler holds, for observation and tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchedulerSnapshot {
    pub running: Vec<TaskId>,
    pub waiting: Vec<TaskId>,
    pub limit: usize,
    /// Holders of a failed scheduler's grants not heard from yet (nothing is granted while
    /// there are any).
    pub recovering: usize,
}

/// The Scheduler actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scheduler;

#[ractor::async_trait]
impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerStart;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        start: SchedulerStart,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        let args = start.args;
        let mut state = SchedulerState {
            core: SchedulerCore::new(args.limit, args.queue_capacity),
            holders: HashMap::new(),
            occupancy: Occupancy::default(),
            oldest_wait: args.wait_board.join(),
            recovery_timeout: args.recovery_timeout,
            recovery_timer: None,
        };
        let me = myself.get_cell();
        let mut alive = Vec::new();
        for holder in start.recover_from {
            let id = holder.get_id();
            if state.watch(&me, holder) {
                alive.push(id);
            }
        }
        state.core.recover_from(alive);
        // Holders already gone need no watching.
        state.apply(&me, Effects::default(), Cause::Release);
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let waiting_for = state.core.recovering_len();
        if waiting_for > 0 {
            tracing::info!(
                holders = waiting_for,
                "scheduler: restarted; waiting for the holders of the old grants"
            );
            state.recovery_timer =
                Some(myself.send_after(state.recovery_timeout, || SchedulerMsg::RecoveryTimedOut));
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SchedulerMsg,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let me = myself.get_cell();
        match msg {
            SchedulerMsg::Acquire {
                task_id,
                conversation_id,
                holder,
                reply,
            } => state.acquire(&me, task_id, conversation_id, holder, reply),
            SchedulerMsg::Release { task_id } => {
                let fx = state.core.release(task_id);
                state.apply(&me, fx, Cause::Release);
            }
            SchedulerMsg::Snapshot { reply } => {
                let _ = reply.send(state.core.snapshot());
            }
            SchedulerMsg::Reinstate {
                task_id,
                conversation_id,
                holder,
            } => state.reinstate(&me, task_id, conversation_id, holder),
            SchedulerMsg::Recovered { holder } => {
                let fx = state.core.reported(holder.get_id());
                state.apply(&me, fx, Cause::Release);
                state.recovery_progress();
            }
            SchedulerMsg::RecoveryTimedOut => state.recovery_timed_out(&me),
            SchedulerMsg::InjectPanic => panic!("injected fault in the scheduler"),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        // The scheduler has no children: every event here comes from a monitored holder.
        match evt {
            SupervisionEvent::ActorTerminated(who, _, _)
            | SupervisionEvent::ActorFailed(who, _) => {
                state.holder_stopped(&myself.get_cell(), who.get_id());
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let me = myself.get_cell();
        for (_, holder) in state.holders.drain() {
            me.unmonitor(holder);
        }
        if let Some(timer) = state.recovery_timer.take() {
            timer.abort();
        }
        state.occupancy.publish(0, 0);
        state.oldest_wait.publish(None);
        Ok(())
    }
}

/// A caller waiting for its grant.
pub struct PendingAcquire {
    reply: RpcReplyPort<Result<(), AgentError>>,
    /// When the request arrived, to measure its queue wait.
    enqueued_at: Instant,
    /// The caller's span, so that the grant is logged where the caller's trace is.
    span: Span,
}

impl Waiter for PendingAcquire {
    fn caller_gone(&self) -> bool {
        self.reply.is_closed()
    }
}

/// What led to a set of effects; decides the metric reasons and the withdrawal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Release,
    HolderDied,
    CallerGone,
}

impl Cause {
    const fn released(self) -> ReleaseReason {
        match self {
            Self::Release => ReleaseReason::Released,
            Self::HolderDied => ReleaseReason::HolderDied,
            Self::CallerGone => ReleaseReason::CallerGone,
        }
    }

    const fn withdrawn(self) -> ReleaseReason {
        match self {
            Self::Release => ReleaseReason::Withdrawn,
            Self::HolderDied => ReleaseReason::HolderDied,
            Self::CallerGone => ReleaseReason::CallerGone,
        }
    }

    fn withdrawn_error(self) -> AgentError {
        let reason = match self {
            Self::Release => "the request for a scheduler slot was withdrawn",
            Self::HolderDied | Self::CallerGone => "the task's holder stopped",
        };
        AgentError::Cancelled {
            reason: reason.into(),
        }
    }
}

impl SchedulerState {
    fn acquire(
        &mut self,
        me: &ActorCell,
        task_id: TaskId,
        conversation_id: ConversationId,
        holder: ActorCell,
        reply: RpcReplyPort<Result<(), AgentError>>,
    ) {
        let holder_id = holder.get_id();
        if !self.watch(me, holder) {
            metrics::acquire(AcquireOutcome::Rejected);
            tracing::warn!(%task_id, %conversation_id, "scheduler: holder already stopped");
            let _ = reply.send(Err(AgentError::Cancelled {
                reason: "the task's holder stopped".into(),
            }));
            self.holder_stopped(me, holder_id);
            return;
        }
        let entry = QueueEntry {
            task_id,
            conversation_id,
            holder: holder_id,
            waiter: PendingAcquire {
                reply,
                enqueued_at: Instant::now(),
                // With span propagation on, the current span inside `handle` is the sender's.
                span: Span::current(),
            },
        };
        let (decision, mut fx) = self.core.request(entry);
        match decision {
            Decision::GrantNow(entry) => {
                metrics::acquire(AcquireOutcome::Granted);
                fx.granted.push(entry);
            }
            Decision::Queued => {
                metrics::acquire(AcquireOutcome::Queued);
                tracing::debug!(%task_id, %conversation_id, waiting = self.core.waiting_len(), "scheduler: queued");
            }
            Decision::Overloaded(entry) => {
                metrics::acquire(AcquireOutcome::Overloaded);
                tracing::warn!(%task_id, %conversation_id, capacity = self.core.queue_capacity(), "scheduler: queue full");
                let _ = entry.waiter.reply.send(Err(AgentError::Overloaded {
                    resource: "scheduler queue".into(),
                    limit: u32::try_from(self.core.queue_capacity()).unwrap_or(u32::MAX),
                }));
            }
            Decision::Duplicate(entry) => {
                metrics::acquire(AcquireOutcome::Rejected);
                tracing::warn!(%task_id, %conversation_id, "scheduler: task already holds or awaits a slot");
                let _ = entry.waiter.reply.send(Err(AgentError::InvalidInput {
                    message: format!("task {task_id} already holds or awaits a scheduler slot"),
                }));
            }
        }
        self.apply(me, fx, Cause::CallerGone);
        self.recovery_progress();
    }

    fn reinstate(
        &mut self,
        me: &ActorCell,
        task_id: TaskId,
        conversation_id: ConversationId,
        holder: ActorCell,
    ) {
        let holder_id = holder.get_id();
        if !self.watch(me, holder) {
            self.holder_stopped(me, holder_id);
            return;
        }
        let (reinstated, fx) = self.core.reinstate(task_id, holder_id);
        if reinstated {
            metrics::reinstated();
            tracing::info!(%task_id, %conversation_id, "scheduler: grant reinstated");
        }
        self.apply(me, fx, Cause::Release);
        self.recovery_progress();
    }

    /// Ends the recovery's timer once every holder was heard from.
    fn recovery_progress(&mut self) {
        if self.core.recovering_len() == 0
            && let Some(timer) = self.recovery_timer.take()
        {
            timer.abort();
            metrics::recovery(metrics::RecoveryOutcome::Complete);
            tracing::info!("scheduler: every holder of the old grants answered");
        }
    }

    fn recovery_timed_out(&mut self, me: &ActorCell) {
        self.recovery_timer = None;
        let (unheard, fx) = self.core.end_recovery();
        if unheard > 0 {
            metrics::recovery(metrics::RecoveryOutcome::TimedOut);
            tracing::warn!(
                holders = unheard,
                "scheduler: holders of the old grants did not answer in time; granting again"
            );
        }
        self.apply(me, fx, Cause::Release);
    }

    fn holder_stopped(&mut self, me: &ActorCell, holder: ActorId) {
        let fx = self.core.holder_died(holder);
        self.recovery_progress();
        if fx.released > 0 || !fx.withdrawn.is_empty() {
            tracing::info!(
                %holder,
                released = fx.released,
                withdrawn = fx.withdrawn.len(),
                "scheduler: holder stopped"
            );
        }
        self.apply(me, fx, Cause::HolderDied);
    }

    /// Monitors `holder`, then checks it is alive. In that order: a holder that stops after
    /// the monitor is set is reported to us; one that stopped before never would be.
    fn watch(&mut self, me: &ActorCell, holder: ActorCell) -> bool {
        me.monitor(holder.clone());
        let alive = holder.get_status() < ActorStatus::Stopping;
        self.holders.entry(holder.get_id()).or_insert(holder);
        alive
    }

    /// Executes effects: replies, metrics, logs; releases grants that could not be delivered
    /// (and executes what that frees in turn); unmonitors holders that hold nothing any more.
    fn apply(&mut self, me: &ActorCell, fx: Effects<PendingAcquire>, cause: Cause) {
        let mut fx = fx;
        let mut cause = cause;
        loop {
            metrics::release(cause.released(), fx.released);
            metrics::release(cause.withdrawn(), fx.withdrawn.len());
            metrics::release(ReleaseReason::CallerGone, fx.caller_gone.len());
            for e in fx.caller_gone {
                let task_id = e.task_id;
                e.waiter
                    .span
                    .in_scope(|| tracing::debug!(%task_id, "scheduler: caller gone, turn skipped"));
            }
            for e in fx.withdrawn {
                let _ = e.waiter.reply.send(Err(cause.withdrawn_error()));
            }
            let lost: Vec<TaskId> = fx.granted.into_iter().filter_map(deliver_grant).collect();
            if lost.is_empty() {
                break;
            }
            fx = Effects::default();
            for task_id in lost {
                fx.absorb(self.core.release(task_id));
            }
            cause = Cause::CallerGone;
        }
        let core = &self.core;
        self.holders.retain(|id, cell| {
            let keep = core.holds(id);
            if !keep {
                me.unmonitor(cell.clone());
            }
            keep
        });
        self.occupancy
            .publish(self.core.running_len(), self.core.waiting_len());
        self.oldest_wait.publish(waiting_since(&self.core));
    }
}

/// Since when the scheduler's oldest request has waited (`None`: none waits). Each
/// conversation's queue is in arrival order, so its head is its oldest.
fn waiting_since(core: &SchedulerCore<PendingAcquire>) -> Option<Instant> {
    core.queue_heads().map(|e| e.waiter.enqueued_at).min()
}

/// Answers a granted caller; returns the task id when the caller is gone, so that the slot is
/// released instead of held by nobody.
fn deliver_grant(entry: QueueEntry<PendingAcquire>) -> Option<TaskId> {
    let QueueEntry {
        task_id,
        conversation_id,
        waiter,
        ..
    } = entry;
    let waited = waiter.enqueued_at.elapsed();
    metrics::queue_wait(waited);
    waiter.span.in_scope(|| {
        tracing::info!(
            %task_id,
            %conversation_id,
            waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            "scheduler: slot granted"
        );
    });
    waiter.reply.send(Ok(())).is_err().then_some(task_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A waiter whose "caller left" flag the test flips.
    #[derive(Debug, Clone, Default)]
    struct W(Rc<Cell<bool>>);

    impl W {
        fn leave(&self) {
            self.0.set(true);
        }
    }

    impl Waiter for W {
        fn caller_gone(&self) -> bool {
            self.0.get()
        }
    }

    fn entry(task_id: TaskId, conversation_id: ConversationId, holder: u64) -> QueueEntry<W> {
        QueueEntry {
            task_id,
            conversation_id,
            holder: ActorId::Local(holder),
            waiter: W::default(),
        }
    }

    fn ids(fx: &[QueueEntry<W>]) -> Vec<TaskId> {
        fx.iter().map(|e| e.task_id).collect()
    }

    fn request(
        core: &mut SchedulerCore<W>,
        task: TaskId,
        conv: ConversationId,
        holder: u64,
    ) -> Decision<W> {
        core.request(entry(task, conv, holder)).0
    }

    #[test]
    fn grants_at_once_while_a_slot_is_free() {
        let mut core = SchedulerCore::<W>::new(2, 4);
        let c = ConversationId::new();
        let (t1, t2, t3) = (TaskId::new(), TaskId::new(), TaskId::new());
        assert!(matches!(
            request(&mut core, t1, c, 1),
            Decision::GrantNow(_)
        ));
        assert!(matches!(
            request(&mut core, t2, c, 1),
            Decision::GrantNow(_)
        ));
        assert!(matches!(request(&mut core, t3, c, 1), Decision::Queued));
        assert_eq!(core.snapshot().running, vec![t1, t2]);
        assert_eq!(core.snapshot().waiting, vec![t3]);
    }

    #[test]
    fn a_waiter_is_granted_when_the_slot_is_released() {
        let mut core = SchedulerCore::<W>::new(1, 4);
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let (t1, t2) = (TaskId::new(), TaskId::new());
        assert!(matches!(
            request(&mut core, t1, a, 1),
            Decision::GrantNow(_)
        ));
        assert!(matches!(request(&mut core, t2, b, 2), Decision::Queued));
        let fx = core.release(t1);
        assert_eq!(fx.released, 1);
        assert_eq!(ids(&fx.granted), vec![t2]);
        assert_eq!(core.snapshot().running, vec![t2]);
        assert!(core.snapshot().waiting.is_empty());
        assert!(!core.holds(&ActorId::Local(1)));
        assert!(core.holds(&ActorId::Local(2)));
    }

    #[test]
    fn fifo_within_a_conversation_round_robin_across() {
        let mut core = SchedulerCore::<W>::new(1, 16);
        let (a, b, c) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let first = TaskId::new();
        let _ = request(&mut core, first, a, 1);
        let a_tasks: Vec<TaskId> = (0..3).map(|_| TaskId::new()).collect();
        for t in &a_tasks {
            let _ = request(&mut core, *t, a, 1);
        }
        let b1 = TaskId::new();
        let _ = request(&mut core, b1, b, 2);
        let c1 = TaskId::new();
        let _ = request(&mut core, c1, c, 3);
        let expected = vec![a_tasks[0], b1, c1, a_tasks[1], a_tasks[2]];
        assert_eq!(core.snapshot().waiting, expected);

        let mut granted = Vec::new();
        let mut current = first;
        for _ in 0..expected.len() {
            let fx = core.release(current);
            assert_eq!(fx.granted.len(), 1);
            current = fx.granted[0].task_id;
            granted.push(current);
        }
        assert_eq!(granted, expected);
    }

    #[test]
    fn overloaded_exactly_when_the_queue_is_full() {
        let mut core = SchedulerCore::<W>::new(1, 2);
        let c = ConversationId::new();
        let _ = request(&mut core, TaskId::new(), c, 1);
        assert!(matches!(
            request(&mut core, TaskId::new(), c, 1),
            Decision::Queued
        ));
        assert!(matches!(
            request(&mut core, TaskId::new(), c, 1),
            Decision::Queued
        ));
        assert!(matches!(
            request(&mut core, TaskId::new(), c, 1),
            Decision::Overloaded(_)
        ));
        assert_eq!(core.waiting_len(), 2);
    }

    #[test]
    fn a_full_queue_makes_room_by_dropping_callers_that_left() {
        let mut core = SchedulerCore::<W>::new(1, 1);
        let c = ConversationId::new();
        let _ = request(&mut core, TaskId::new(), c, 1);
        let left = entry(TaskId::new(), c, 2);
        let flag = left.waiter.clone();
        let left_id = left.task_id;
        assert!(matches!(core.request(left).0, Decision::Queued));
        flag.leave();
        let fresh = TaskId::new();
        let (decision, fx) = core.request(entry(fresh, c, 3));
        assert!(matches!(decision, Decision::Queued));
        assert_eq!(ids(&fx.caller_gone), vec![left_id]);
        assert!(!core.holds(&ActorId::Local(2)));
        assert_eq!(core.snapshot().waiting, vec![fresh]);
    }

    #[test]
    fn release_is_idempotent_and_withdraws_a_waiter() {
        let mut core = SchedulerCore::<W>::new(1, 4);
        let c = ConversationId::new();
        let (t1, t2) = (TaskId::new(), TaskId::new());
        let _ = request(&mut core, t1, c, 1);
        let _ = request(&mut core, t2, c, 2);

        let fx = core.release(TaskId::new());
        assert_eq!(
            (fx.released, fx.granted.len(), fx.withdrawn.len()),
            (0, 0, 0)
        );

        let fx = core.release(t2);
        assert_eq!(ids(&fx.withdrawn), vec![t2]);
        assert_eq!(fx.released, 0);
        assert!(core.snapshot().waiting.is_empty());
        assert!(!core.holds(&ActorId::Local(2)));

        assert_eq!(core.release(t1).released, 1);
        let fx = core.release(t1);
        assert_eq!((fx.released, fx.granted.len()), (0, 0));
        assert_eq!(
            core.snapshot(),
            SchedulerSnapshot {
                running: vec![],
                waiting: vec![],
                limit: 1,
                recovering: 0,
            }
        );
    }

    #[test]
    fn a_caller_that_left_is_skipped_without_costing_its_conversation_the_turn() {
        let mut core = SchedulerCore::<W>::new(1, 8);
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let t0 = TaskId::new();
        let _ = request(&mut core, t0, b, 9);
        let gone = entry(TaskId::new(), a, 1);
        let flag = gone.waiter.clone();
        let gone_id = gone.task_id;
        let _ = core.request(gone);
        let a2 = TaskId::new();
        let _ = request(&mut core, a2, a, 1);
        let b2 = TaskId::new();
        let _ = request(&mut core, b2, b, 2);
        flag.leave();
        assert_eq!(core.snapshot().waiting, vec![a2, b2]);

        let fx = core.release(t0);
        assert_eq!(ids(&fx.caller_gone), vec![gone_id]);
        assert_eq!(ids(&fx.granted), vec![a2]);
        assert_eq!(core.waiting_len(), 1);
    }

    #[test]
    fn a_dead_holder_loses_its_grants_and_requests() {
        let mut core = SchedulerCore::<W>::new(2, 8);
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let (t1, t2, t3, t4) = (TaskId::new(), TaskId::new(), TaskId::new(), TaskId::new());
        let _ = request(&mut core, t1, a, 1);
        let _ = request(&mut core, t2, a, 1);
        let _ = request(&mut core, t3, a, 1);
        let _ = request(&mut core, t4, b, 2);
        let fx = core.holder_died(ActorId::Local(1));
        assert_eq!(fx.released, 2);
        assert_eq!(ids(&fx.withdrawn), vec![t3]);
        assert_eq!(ids(&fx.granted), vec![t4]);
        assert!(!core.holds(&ActorId::Local(1)));
        assert_eq!(core.snapshot().running, vec![t4]);
        // A second report of the same death changes nothing.
        let fx = core.holder_died(ActorId::Local(1));
        assert_eq!(
            (fx.released, fx.withdrawn.len(), fx.granted.len()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_task_cannot_ask_twice() {
        let mut core = SchedulerCore::<W>::new(1, 8);
        let c = ConversationId::new();
        let (t1, t2) = (TaskId::new(), TaskId::new());
        let _ = request(&mut core, t1, c, 1);
        let _ = request(&mut core, t2, c, 1);
        assert!(matches!(
            request(&mut core, t1, c, 1),
            Decision::Duplicate(_)
        ));
        assert!(matches!(
            request(&mut core, t2, c, 1),
            Decision::Duplicate(_)
        ));
        assert_eq!(core.waiting_len(), 1);
    }

    #[test]
    fn a_reinstated_grant_counts_even_above_the_limit() {
        let mut core = SchedulerCore::<W>::new(1, 8);
        let c = ConversationId::new();
        let (old1, old2, fresh) = (TaskId::new(), TaskId::new(), TaskId::new());
        assert!(core.reinstate(old1, ActorId::Local(1)).0);
        assert!(core.reinstate(old2, ActorId::Local(2)).0);
        assert!(!core.reinstate(old2, ActorId::Local(2)).0);
        assert!(matches!(request(&mut core, fresh, c, 3), Decision::Queued));
        assert!(core.release(old1).granted.is_empty());
        assert_eq!(ids(&core.release(old2).granted), vec![fresh]);
    }

    #[test]
    fn nothing_is_granted_until_every_holder_of_the_old_grants_is_heard() {
        let mut core = SchedulerCore::<W>::new(1, 8);
        let (b, c) = (ConversationId::new(), ConversationId::new());
        let (running, was_waiting, fresh) = (TaskId::new(), TaskId::new(), TaskId::new());
        core.recover_from([ActorId::Local(1), ActorId::Local(2)]);
        assert!(core.holds(&ActorId::Local(2)));
        // A new conversation asks first: it waits, although no slot is known to be taken.
        assert!(matches!(request(&mut core, fresh, c, 3), Decision::Queued));
        // The running task's holder re-declares it.
        let (added, fx) = core.reinstate(running, ActorId::Local(1));
        assert!(added && fx.granted.is_empty());
        // The other holder's task was waiting: it asks again, and is heard by asking.
        assert!(matches!(
            request(&mut core, was_waiting, b, 2),
            Decision::Queued
        ));
        assert_eq!(core.recovering_len(), 0);
        assert_eq!(core.snapshot().running, vec![running]);
        // Single-flight holds: the next runs only when the reinstated one is released.
        assert_eq!(ids(&core.release(running).granted), vec![fresh]);
        assert_eq!(ids(&core.release(fresh).granted), vec![was_waiting]);
    }

    #[test]
    fn a_recovery_ends_when_its_holders_stop_or_its_time_is_up() {
        let mut core = SchedulerCore::<W>::new(1, 8);
        let t = TaskId::new();
        core.recover_from([ActorId::Local(1), ActorId::Local(2)]);
        assert!(matches!(
            request(&mut core, t, ConversationId::new(), 3),
            Decision::Queued
        ));
        assert!(core.holder_died(ActorId::Local(1)).granted.is_empty());
        assert!(core.reported(ActorId::Local(7)).granted.is_empty());
        let (unheard, fx) = core.end_recovery();
        assert_eq!(unheard, 1);
        assert_eq!(ids(&fx.granted), vec![t]);
        assert!(!core.holds(&ActorId::Local(2)));
    }

    /// The scheduler's oldest wait is the oldest head of any conversation's queue, whatever
    /// the order in which the conversations are served.
    #[test]
    fn the_oldest_wait_is_the_oldest_head_of_any_conversation() {
        let start = Instant::now();
        let mut core = SchedulerCore::<PendingAcquire>::new(1, 8);
        let mut answers = Vec::new();
        let mut request = |core: &mut SchedulerCore<PendingAcquire>, conv, secs| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            answers.push(rx);
            let task_id = TaskId::new();
            let _ = core.request(QueueEntry {
                task_id,
                conversation_id: conv,
                holder: ActorId::Local(1),
                waiter: PendingAcquire {
                    reply: tx.into(),
                    enqueued_at: start + Duration::from_secs(secs),
                    span: Span::none(),
                },
            });
            task_id
        };
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let running = request(&mut core, a, 0);
        assert_eq!(waiting_since(&core), None, "granted at once");
        request(&mut core, a, 10);
        request(&mut core, b, 20);
        request(&mut core, a, 30);
        assert_eq!(waiting_since(&core), Some(start + Duration::from_secs(10)));
        // a's head is granted; a is served next again only after b, but b's is older.
        assert_eq!(core.release(running).granted.len(), 1);
        assert_eq!(waiting_since(&core), Some(start + Duration::from_secs(20)));
    }

    #[test]
    fn a_zero_limit_is_read_as_one() {
        let mut core = SchedulerCore::<W>::new(0, 8);
        assert_eq!(core.limit(), 1);
        assert!(matches!(
            request(&mut core, TaskId::new(), ConversationId::new(), 1),
            Decision::GrantNow(_)
        ));
    }

    mod actor {
        use super::*;
        use ractor::{call, call_t};
        use tokio::sync::oneshot;

        /// A stand-in for a conversation: holds grants, can be stopped or made to panic.
        struct Holder;

        enum HolderMsg {
            Panic,
        }
        crate::local_message!(HolderMsg);

        #[ractor::async_trait]
        impl Actor for Holder {
            type Msg = HolderMsg;
            type State = ();
            type Arguments = ();

            async fn pre_start(
                &self,
                _myself: ActorRef<HolderMsg>,
                _args: (),
            ) -> Result<(), ActorProcessingErr> {
                Ok(())
            }

            async fn handle(
                &self,
                _myself: ActorRef<HolderMsg>,
                msg: HolderMsg,
                _state: &mut (),
            ) -> Result<(), ActorProcessingErr> {
                match msg {
                    HolderMsg::Panic => panic!("holder fails on purpose"),
                }
            }
        }

        async fn scheduler(limit: usize, queue_capacity: usize) -> ActorRef<SchedulerMsg> {
            let (sched, _) = Actor::spawn(
                None,
                Scheduler,
                SchedulerStart::from(SchedulerArgs {
                    limit,
                    queue_capacity,
                    ..SchedulerArgs::default()
                }),
            )
            .await
            .unwrap();
            sched
        }

        async fn holder() -> (ActorRef<HolderMsg>, tokio::task::JoinHandle<()>) {
            Actor::spawn(None, Holder, ()).await.unwrap()
        }

        type Answer = oneshot::Receiver<Result<(), AgentError>>;

        /// Sends an Acquire without waiting for it, so the test decides when to look.
        fn acquire(
            sched: &ActorRef<SchedulerMsg>,
            task_id: TaskId,
            holder: &ActorRef<HolderMsg>,
        ) -> Answer {
            let (tx, rx) = oneshot::channel();
            sched
                .cast(SchedulerMsg::Acquire {
                    task_id,
                    conversation_id: ConversationId::new(),
                    holder: holder.get_cell(),
                    reply: tx.into(),
                })
                .unwrap();
            rx
        }

        async fn snapshot(sched: &ActorRef<SchedulerMsg>) -> SchedulerSnapshot {
            call!(sched, |reply| SchedulerMsg::Snapshot { reply }).unwrap()
        }

        fn still_waiting(rx: &mut Answer) -> bool {
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty))
        }

        #[tokio::test(start_paused = true)]
        async fn second_acquire_is_answered_only_after_release() {
            let sched = scheduler(1, 8).await;
            let (h, _) = holder().await;
            let (t1, t2) = (TaskId::new(), TaskId::new());
            acquire(&sched, t1, &h).await.unwrap().unwrap();
            let mut second = acquire(&sched, t2, &h);
            let snap = snapshot(&sched).await;
            assert_eq!(snap.running, vec![t1]);
            assert_eq!(snap.waiting, vec![t2]);
            assert!(still_waiting(&mut second));

            sched.cast(SchedulerMsg::Release { task_id: t1 }).unwrap();
            second.await.unwrap().unwrap();
            let snap = snapshot(&sched).await;
            assert_eq!(snap.running, vec![t2]);
            assert!(snap.waiting.is_empty());
        }

        #[tokio::test(start_paused = true)]
        async fn overloaded_at_once_when_the_queue_is_full() {
            let sched = scheduler(1, 1).await;
            let (h, _) = holder().await;
            acquire(&sched, TaskId::new(), &h).await.unwrap().unwrap();
            let mut queued = acquire(&sched, TaskId::new(), &h);
            let third = acquire(&sched, TaskId::new(), &h).await.unwrap();
            assert_eq!(
                third,
                Err(AgentError::Overloaded {
                    resource: "scheduler queue".into(),
                    limit: 1
                })
            );
            assert!(still_waiting(&mut queued));
        }

        #[tokio::test(start_paused = true)]
        async fn releasing_a_waiting_task_withdraws_it() {
            let sched = scheduler(1, 8).await;
            let (h, _) = holder().await;
            let (t1, t2) = (TaskId::new(), TaskId::new());
            acquire(&sched, t1, &h).await.unwrap().unwrap();
            let second = acquire(&sched, t2, &h);
            sched.cast(SchedulerMsg::Release { task_id: t2 }).unwrap();
            sched.cast(SchedulerMsg::Release { task_id: t2 }).unwrap();
            assert!(matches!(
                second.await.unwrap(),
                Err(AgentError::Cancelled { .. })
            ));
            assert_eq!(
                snapshot(&sched).await,
                SchedulerSnapshot {
                    running: vec![t1],
                    waiting: vec![],
                    limit: 1,
                    recovering: 0,
                }
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_stopped_holder_frees_its_slot() {
            let sched = scheduler(1, 8).await;
            let (a, a_done) = holder().await;
            let (b, _) = holder().await;
            let (t1, t2) = (TaskId::new(), TaskId::new());
            acquire(&sched, t1, &a).await.unwrap().unwrap();
            let second = acquire(&sched, t2, &b);
            assert_eq!(snapshot(&sched).await.waiting, vec![t2]);

            a.stop(None);
            a_done.await.unwrap();
            second.await.unwrap().unwrap();
            assert_eq!(snapshot(&sched).await.running, vec![t2]);
        }

        #[tokio::test(start_paused = true)]
        async fn a_panicking_holder_frees_its_slot_and_its_requests() {
            let sched = scheduler(1, 8).await;
            let (a, a_done) = holder().await;
            let (b, _) = holder().await;
            let (t1, t2, t3) = (TaskId::new(), TaskId::new(), TaskId::new());
            acquire(&sched, t1, &a).await.unwrap().unwrap();
            let of_the_dead = acquire(&sched, t2, &a);
            let next = acquire(&sched, t3, &b);
            assert_eq!(snapshot(&sched).await.waiting, vec![t2, t3]);

            a.cast(HolderMsg::Panic).unwrap();
            a_done.await.unwrap();
            assert!(matches!(
                of_the_dead.await.unwrap(),
                Err(AgentError::Cancelled { .. })
            ));
            next.await.unwrap().unwrap();
            assert_eq!(snapshot(&sched).await.running, vec![t3]);
        }

        #[tokio::test(start_paused = true)]
        async fn a_holder_already_stopped_gets_no_slot() {
            let sched = scheduler(1, 8).await;
            let (a, a_done) = holder().await;
            a.stop(None);
            a_done.await.unwrap();
            let answer = acquire(&sched, TaskId::new(), &a).await.unwrap();
            assert!(matches!(answer, Err(AgentError::Cancelled { .. })));
            assert_eq!(snapshot(&sched).await.running, Vec::<TaskId>::new());
        }

        #[tokio::test(start_paused = true)]
        async fn a_waiter_whose_caller_gave_up_does_not_keep_the_slot() {
            let sched = scheduler(1, 8).await;
            let (h, _) = holder().await;
            let (t1, t2, t3) = (TaskId::new(), TaskId::new(), TaskId::new());
            acquire(&sched, t1, &h).await.unwrap().unwrap();

            // The caller stops waiting: its call future is dropped by the timeout.
            let gave_up = call_t!(
                sched,
                |reply| SchedulerMsg::Acquire {
                    task_id: t2,
                    conversation_id: ConversationId::new(),
                    holder: h.get_cell(),
                    reply,
                },
                50
            );
            assert!(gave_up.is_err());
            let third = acquire(&sched, t3, &h);
            assert_eq!(snapshot(&sched).await.waiting, vec![t3]);

            sched.cast(SchedulerMsg::Release { task_id: t1 }).unwrap();
            third.await.unwrap().unwrap();
            assert_eq!(snapshot(&sched).await.running, vec![t3]);
        }

        #[tokio::test(start_paused = true)]
        async fn a_grant_nobody_receives_is_released() {
            let sched = scheduler(1, 8).await;
            let (h, _) = holder().await;
            let (t1, t2) = (TaskId::new(), TaskId::new());
            drop(acquire(&sched, t1, &h));
            acquire(&sched, t2, &h).await.unwrap().unwrap();
            assert_eq!(snapshot(&sched).await.running, vec![t2]);
        }

        #[tokio::test(start_paused = true)]
        async fn reinstated_grants_hold_new_ones_back() {
            let sched = scheduler(1, 8).await;
            let (h, _) = holder().await;
            let (old, fresh) = (TaskId::new(), TaskId::new());
            sched
                .cast(SchedulerMsg::Reinstate {
                    task_id: old,
                    conversation_id: ConversationId::new(),
                    holder: h.get_cell(),
                })
                .unwrap();
            let mut answer = acquire(&sched, fresh, &h);
            assert_eq!(snapshot(&sched).await.running, vec![old]);
            assert!(still_waiting(&mut answer));
            sched.cast(SchedulerMsg::Release { task_id: old }).unwrap();
            answer.await.unwrap().unwrap();
        }

        async fn replacing(recover_from: Vec<ActorCell>) -> ActorRef<SchedulerMsg> {
            let start = SchedulerStart {
                args: SchedulerArgs::default(),
                recover_from,
            };
            Actor::spawn(None, Scheduler, start).await.unwrap().0
        }

        #[tokio::test(start_paused = true)]
        async fn a_replacing_scheduler_keeps_single_flight_across_the_restart() {
            let (a, _) = holder().await;
            let (b, b_done) = holder().await;
            let (c, _) = holder().await;
            let sched = replacing(vec![a.get_cell(), b.get_cell()]).await;
            let (running, fresh) = (TaskId::new(), TaskId::new());
            let mut answer = acquire(&sched, fresh, &c);
            assert_eq!(snapshot(&sched).await.recovering, 2);
            sched
                .cast(SchedulerMsg::Reinstate {
                    task_id: running,
                    conversation_id: ConversationId::new(),
                    holder: a.get_cell(),
                })
                .unwrap();
            sched
                .cast(SchedulerMsg::Recovered {
                    holder: b.get_cell(),
                })
                .unwrap();
            let snap = snapshot(&sched).await;
            assert_eq!((snap.running, snap.recovering), (vec![running], 0));
            assert!(still_waiting(&mut answer));
            sched
                .cast(SchedulerMsg::Release { task_id: running })
                .unwrap();
            answer.await.unwrap().unwrap();
            // A holder heard from is not watched for the recovery any more.
            b.stop(None);
            b_done.await.unwrap();
            assert_eq!(snapshot(&sched).await.running, vec![fresh]);
        }

        #[tokio::test(start_paused = true)]
        async fn a_silent_holder_holds_grants_back_only_until_the_recovery_times_out() {
            let (silent, _) = holder().await;
            let (c, _) = holder().await;
            let sched = replacing(vec![silent.get_cell()]).await;
            let mut answer = acquire(&sched, TaskId::new(), &c);
            tokio::time::sleep(SchedulerArgs::default().recovery_timeout / 2).await;
            assert!(still_waiting(&mut answer));
            answer.await.unwrap().unwrap();
            assert_eq!(snapshot(&sched).await.recovering, 0);
        }

        #[tokio::test(start_paused = true)]
        async fn a_stopped_holder_is_not_waited_for() {
            let (gone, gone_done) = holder().await;
            gone.stop(None);
            gone_done.await.unwrap();
            let (alive, alive_done) = holder().await;
            let sched = replacing(vec![gone.get_cell(), alive.get_cell()]).await;
            assert_eq!(snapshot(&sched).await.recovering, 1);
            let (c, _) = holder().await;
            let mut answer = acquire(&sched, TaskId::new(), &c);
            assert!(still_waiting(&mut answer));
            alive.cast(HolderMsg::Panic).unwrap();
            alive_done.await.unwrap();
            answer.await.unwrap().unwrap();
        }

        /// The oldest wait grows while a request waits, with no event in the scheduler (it
        /// is read when the metrics are), follows the next oldest at a grant, and leaves
        /// with the scheduler.
        #[tokio::test(start_paused = true)]
        async fn the_oldest_wait_ages_without_events_and_follows_the_grants() {
            let board = Arc::new(WaitBoard::default());
            let (sched, sched_done) = Actor::spawn(
                None,
                Scheduler,
                SchedulerStart::from(SchedulerArgs {
                    wait_board: board.clone(),
                    ..SchedulerArgs::default()
                }),
            )
            .await
            .unwrap();
            let waited = || board.oldest_wait(Instant::now());
            let (h, _) = holder().await;
            let (t1, t2, t3) = (TaskId::new(), TaskId::new(), TaskId::new());
            acquire(&sched, t1, &h).await.unwrap().unwrap();
            assert_eq!(
                waited(),
                Duration::ZERO,
                "a grant at once waits for nothing"
            );

            let second = acquire(&sched, t2, &h);
            snapshot(&sched).await;
            tokio::time::advance(Duration::from_secs(600)).await;
            assert_eq!(waited(), Duration::from_secs(600));
            let third = acquire(&sched, t3, &h);
            snapshot(&sched).await;
            tokio::time::advance(Duration::from_secs(60)).await;
            assert_eq!(
                waited(),
                Duration::from_secs(660),
                "the oldest, not the newest"
            );

            sched.cast(SchedulerMsg::Release { task_id: t1 }).unwrap();
            second.await.unwrap().unwrap();
            snapshot(&sched).await;
            assert_eq!(waited(), Duration::from_secs(60), "the next oldest");

            sched.stop(None);
            sched_done.await.unwrap();
            assert!(third.await.is_err(), "its scheduler stopped");
            assert_eq!(
                waited(),
                Duration::ZERO,
                "a stopped scheduler leaves the board"
            );
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        const HOLDERS: u64 = 4;

        #[derive(Debug, Clone)]
        enum Op {
            Request { conv: usize, holder: u64 },
            ReleaseRunning(usize),
            ReleaseWaiting(usize),
            ReleaseUnknown,
            ReleaseAgain(usize),
            CallerLeaves(usize),
            HolderDies(u64),
        }

        fn op(convs: usize) -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0..convs, 0..HOLDERS).prop_map(|(conv, holder)| Op::Request { conv, holder }),
                3 => any::<usize>().prop_map(Op::ReleaseRunning),
                1 => any::<usize>().prop_map(Op::ReleaseWaiting),
                1 => Just(Op::ReleaseUnknown),
                1 => any::<usize>().prop_map(Op::ReleaseAgain),
                2 => any::<usize>().prop_map(Op::CallerLeaves),
                1 => (0..HOLDERS).prop_map(Op::HolderDies),
            ]
        }

        fn scenario() -> impl Strategy<Value = (usize, usize, Vec<Op>)> {
            (1usize..=8).prop_flat_map(|convs| {
                (
                    Just(convs),
                    0usize..6,
                    proptest::collection::vec(op(convs), 1..=40),
                )
            })
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum St {
            Waiting,
            Running,
            Done,
        }

        struct Req {
            task: TaskId,
            conv: usize,
            holder: u64,
            gone: W,
            st: St,
        }

        #[derive(Debug)]
        enum Ev {
            /// A grant to a conversation, with the other conversations that had a live waiter.
            Grant(usize, BTreeSet<usize>),
            /// A conversation stopped having live waiters (withdrawn, left, holder died).
            Emptied(usize),
        }

        /// The test's own account of every request, checked against the core after each op.
        struct Model {
            limit: usize,
            capacity: usize,
            convs: Vec<ConversationId>,
            reqs: Vec<Req>,
            events: Vec<Ev>,
            live_before: BTreeSet<usize>,
        }

        impl Model {
            fn live_convs(&self) -> BTreeSet<usize> {
                self.reqs
                    .iter()
                    .filter(|r| r.st == St::Waiting && !r.gone.caller_gone())
                    .map(|r| r.conv)
                    .collect()
            }

            fn note_emptied(&mut self) {
                let now = self.live_convs();
                for c in self.live_before.difference(&now) {
                    self.events.push(Ev::Emptied(*c));
                }
                self.live_before = now;
            }

            fn idx(&self, task: TaskId) -> usize {
                self.reqs.iter().position(|r| r.task == task).unwrap()
            }

            fn pick(&self, st: St, live_only: bool, n: usize) -> Option<usize> {
                let v: Vec<usize> = (0..self.reqs.len())
                    .filter(|i| self.reqs[*i].st == st)
                    .filter(|i| !live_only || !self.reqs[*i].gone.caller_gone())
                    .collect();
                (!v.is_empty()).then(|| v[n % v.len()])
            }

            fn count(&self, st: St, live_only: bool) -> usize {
                self.reqs
                    .iter()
                    .filter(|r| r.st == st && (!live_only || !r.gone.caller_gone()))
                    .count()
            }

            fn grant(&mut self, task: TaskId) -> Result<(), TestCaseError> {
                let i = self.idx(task);
                let conv = self.reqs[i].conv;
                prop_assert_eq!(self.reqs[i].st, St::Waiting);
                prop_assert!(
                    !self.reqs[i].gone.caller_gone(),
                    "granted a caller that left"
                );
                // FIFO: the oldest live waiter of its conversation.
                let oldest = self
                    .reqs
                    .iter()
                    .position(|r| r.conv == conv && r.st == St::Waiting && !r.gone.caller_gone());
                prop_assert_eq!(oldest, Some(i), "not the oldest waiter of its conversation");
                let mut others = self.live_convs();
                others.remove(&conv);
                self.events.push(Ev::Grant(conv, others));
                self.reqs[i].st = St::Running;
                self.note_emptied();
                Ok(())
            }

            fn absorb(&mut self, fx: Effects<W>) -> Result<(), TestCaseError> {
                for e in fx.withdrawn {
                    let i = self.idx(e.task_id);
                    prop_assert_eq!(self.reqs[i].st, St::Waiting);
                    self.reqs[i].st = St::Done;
                }
                self.note_emptied();
                for e in fx.caller_gone {
                    let i = self.idx(e.task_id);
                    prop_assert_eq!(self.reqs[i].st, St::Waiting);
                    prop_assert!(self.reqs[i].gone.caller_gone());
                    self.reqs[i].st = St::Done;
                }
                for e in fx.granted {
                    self.grant(e.task_id)?;
                }
                Ok(())
            }

            fn check(&self, core: &SchedulerCore<W>) -> Result<(), TestCaseError> {
                let snap = core.snapshot();
                prop_assert!(snap.running.len() <= self.limit, "more than limit running");
                let running: BTreeSet<TaskId> = snap.running.iter().copied().collect();
                let want: BTreeSet<TaskId> = self
                    .reqs
                    .iter()
                    .filter(|r| r.st == St::Running)
                    .map(|r| r.task)
                    .collect();
                prop_assert_eq!(running, want);
                let waiting: BTreeSet<TaskId> = snap.waiting.iter().copied().collect();
                let want: BTreeSet<TaskId> = self
                    .reqs
                    .iter()
                    .filter(|r| r.st == St::Waiting && !r.gone.caller_gone())
                    .map(|r| r.task)
                    .collect();
                prop_assert_eq!(waiting, want);
                prop_assert_eq!(core.waiting_len(), self.count(St::Waiting, false));
                if snap.running.len() < self.limit {
                    prop_assert_eq!(core.waiting_len(), 0, "a free slot while requests wait");
                }
                for h in 0..HOLDERS {
                    let has = self.reqs.iter().any(|r| r.holder == h && r.st != St::Done);
                    prop_assert_eq!(core.holds(&ActorId::Local(h)), has);
                }
                Ok(())
            }

            /// Between two consecutive grants to a conversation, each other conversation that
            /// had a live waiter at the first one was served or stopped waiting.
            fn check_fairness(&self) -> Result<(), TestCaseError> {
                for (i, ev) in self.events.iter().enumerate() {
                    let Ev::Grant(a, others) = ev else { continue };
                    let next = self.events[i + 1..]
                        .iter()
                        .position(|e| matches!(e, Ev::Grant(c, _) if c == a));
                    let Some(next) = next else { continue };
                    let between = &self.events[i + 1..i + 1 + next];
                    for b in others {
                        let served = between.iter().any(|e| match e {
                            Ev::Grant(c, _) | Ev::Emptied(c) => c == b,
                        });
                        prop_assert!(served, "conversation {} overtaken twice by {}", b, a);
                    }
                }
                Ok(())
            }
        }

        fn run(
            limit: usize,
            convs: usize,
            capacity: usize,
            ops: Vec<Op>,
        ) -> Result<(), TestCaseError> {
            let mut core = SchedulerCore::<W>::new(limit, capacity);
            let mut m = Model {
                limit,
                capacity,
                convs: (0..convs).map(|_| ConversationId::new()).collect(),
                reqs: Vec::new(),
                events: Vec::new(),
                live_before: BTreeSet::new(),
            };
            for op in ops {
                match op {
                    Op::Request { conv, holder } => {
                        let task = TaskId::new();
                        let gone = W::default();
                        let expect_now = m.count(St::Running, false) < m.limit;
                        let expect_over = !expect_now && m.count(St::Waiting, true) >= m.capacity;
                        m.reqs.push(Req {
                            task,
                            conv,
                            holder,
                            gone: gone.clone(),
                            st: St::Waiting,
                        });
                        let (decision, fx) = core.request(QueueEntry {
                            task_id: task,
                            conversation_id: m.convs[conv],
                            holder: ActorId::Local(holder),
                            waiter: gone,
                        });
                        // The new request is not in the queue yet: set it aside while absorbing.
                        let last = m.reqs.len() - 1;
                        m.reqs[last].st = St::Done;
                        m.absorb(fx)?;
                        match decision {
                            Decision::GrantNow(_) => {
                                prop_assert!(expect_now, "granted while no slot was free");
                                m.reqs[last].st = St::Waiting;
                                m.grant(task)?;
                            }
                            Decision::Queued => {
                                prop_assert!(!expect_now && !expect_over, "queued wrongly");
                                m.reqs[last].st = St::Waiting;
                            }
                            Decision::Overloaded(_) => {
                                prop_assert!(expect_over, "overloaded with room in the queue");
                            }
                            Decision::Duplicate(_) => {
                                prop_assert!(false, "fresh task seen as duplicate")
                            }
                        }
                        m.live_before = m.live_convs();
                    }
                    Op::ReleaseRunning(n) => {
                        if let Some(i) = m.pick(St::Running, false, n) {
                            m.reqs[i].st = St::Done;
                            let fx = core.release(m.reqs[i].task);
                            prop_assert_eq!(fx.released, 1);
                            m.absorb(fx)?;
                        }
                    }
                    Op::ReleaseWaiting(n) => {
                        if let Some(i) = m.pick(St::Waiting, false, n) {
                            let fx = core.release(m.reqs[i].task);
                            prop_assert_eq!(ids(&fx.withdrawn), vec![m.reqs[i].task]);
                            m.absorb(fx)?;
                        }
                    }
                    Op::ReleaseUnknown => {
                        let fx = core.release(TaskId::new());
                        prop_assert_eq!(
                            (fx.released, fx.granted.len(), fx.withdrawn.len()),
                            (0, 0, 0)
                        );
                    }
                    Op::ReleaseAgain(n) => {
                        if let Some(i) = m.pick(St::Done, false, n) {
                            let fx = core.release(m.reqs[i].task);
                            prop_assert_eq!(
                                (fx.released, fx.granted.len(), fx.withdrawn.len()),
                                (0, 0, 0)
                            );
                        }
                    }
                    Op::CallerLeaves(n) => {
                        if let Some(i) = m.pick(St::Waiting, true, n) {
                            m.reqs[i].gone.leave();
                            m.note_emptied();
                        }
                    }
                    Op::HolderDies(h) => {
                        let expect_released = m
                            .reqs
                            .iter()
                            .filter(|r| r.holder == h && r.st == St::Running)
                            .count();
                        for r in m
                            .reqs
                            .iter_mut()
                            .filter(|r| r.holder == h && r.st == St::Running)
                        {
                            r.st = St::Done;
                        }
                        let fx = core.holder_died(ActorId::Local(h));
                        prop_assert_eq!(fx.released, expect_released);
                        prop_assert!(fx.withdrawn.iter().all(|e| e.holder == ActorId::Local(h)));
                        m.absorb(fx)?;
                        prop_assert!(m.reqs.iter().all(|r| r.holder != h || r.st == St::Done));
                    }
                }
                m.check(&core)?;
            }
            m.check_fairness()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn invariants_hold_single_flight((convs, capacity, ops) in scenario()) {
                run(1, convs, capacity, ops)?;
            }

            #[test]
            fn invariants_hold_with_three_slots((convs, capacity, ops) in scenario()) {
                run(3, convs, capacity, ops)?;
            }
        }
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(SchedulerMsg);
