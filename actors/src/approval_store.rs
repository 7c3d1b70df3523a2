//! ApprovalStore: approved command keys with scope and expiry, and pending requests (S9).
//!
//! One per session, spawned and supervised by the Session. A conversation that wants to run a
//! command its approval policy does not let through asks here; the answer comes at once when a
//! live key covers the command, otherwise when a human answers (API, CLI or web), or as a
//! denial when nobody answers in time.
//!
//! ```text
//! Conversation ──Request──────────▶ ApprovalStore ──approval_requested──▶ Rollout ──▶ humans
//!              ◀─Granted | ApprovalDenied──┘  ▲                                         │
//!                                             └───────────Respond(approval_id)───────────┘
//! ```
//!
//! # Keys
//! A [`CommandKey`] is the exact argv, a scope (one conversation, or `None` for every
//! conversation of the session) and an optional expiry in unix ms (from the session's
//! [`Clock`], so paused-time tests see it expire). A key covers a request when the argv is
//! identical, the scope matches and `now_ms < expires_at_ms`. What a decision leaves comes from
//! [`key_for`]: `ApproveOnce` remembers nothing, `ApproveForConversation` stores a scoped key,
//! `ApproveForSession` a session key; denials store nothing.
//!
//! # Mailbox protocol
//! - `Request`: answered `Ok(Granted::Remembered)` at once when a key covers the command. An
//!   identical request (same conversation and argv) already pending takes this caller too, so
//!   one human answer resolves both (and the caller shares its deadline). Otherwise a pending
//!   request opens with a fresh [`ApprovalId`], `approval_requested` is emitted and a one-shot
//!   `RequestTimedOut` timer is set.
//! - `Respond`: applies a human's decision: stores its key, answers every caller of the request
//!   (`Granted::Decided` or `ApprovalDenied` with the given reason, else "denied by user"),
//!   emits `approval_resolved`, and also grants (as `Remembered`) every other pending request
//!   the new key covers. `NotFound` for an unknown or already answered id.
//! - `RequestTimedOut` (timer): a still-pending request is denied with `TimedOut`; for an
//!   answered one it does nothing.
//! - `Sweep` (interval timer, started in `post_start`): frees expired keys. Correctness does not
//!   depend on it, since an expired key never covers anything.
//! - `IsApproved`, `ListPending` (oldest first), `ListKeys` (live only): observation.
//! - `ConversationClosed`: denies the conversation's pending requests ("conversation closed")
//!   and drops its scoped keys.
//! - `CallersGone`: a caller of the conversation stopped waiting (its task or call ended):
//!   pending requests of that conversation whose every caller has gone are withdrawn (denied
//!   as "withdrawn"), so humans are not left answering a question nobody asks any more.
//! - `TaskCancelled`: the conversation cancelled (or aborted) a task: its pending requests are
//!   withdrawn the same way, whoever still holds a reply port.
//! - `ConversationFailed`: the conversation failed (its task runner aborted with it) and is
//!   started again: every pending request of it is withdrawn the same way; its scoped keys
//!   stay, as the conversation goes on.
//!
//! A withdrawn request leaves the pending list and is announced by `approval_resolved` with a
//! `deny` decision whose reason starts with "withdrawn" (or is "conversation closed"). A late
//! answer to it is `Cancelled` saying it was withdrawn and why (the last
//! [`WITHDRAWN_REMEMBERED`] are remembered), not a bare `NotFound`.
//!
//! A caller that gave up (its reply port is closed) is skipped silently.
//!
//! # MCP requests
//! `RequestSubject` asks the same way for what is not a command: an MCP server's elicitation or
//! sampling request during a tool call ([`ApprovalSubject`]). A human sees it in
//! `approval_requested` and `ListPending` with its subject (the elicitation's message and
//! schema, the sampling request). Elicitations are never remembered nor shared between callers;
//! approving one resolves its content ([`elicitation::resolve_content`]: `ApproveWithContent`
//! over the schema's defaults, or the defaults alone) and a response the schema refuses is an
//! `InvalidInput` that leaves the request pending. Sampling approvals for a conversation or the
//! session are remembered per server under a key whose path starts with `"\0mcp"`, which no
//! argv can equal (argv strings hold no NUL), so a command key never covers an MCP request nor
//! the other way round. An MCP request nobody answers in time ends in `Timeout` (not
//! `ApprovalDenied`), so that an elicitation can be cancelled rather than declined.
//!
//! A remote agent's question during a dispatch (`AgentQuestion`, an A2A task in
//! `input-required`) is asked the same way and, like an elicitation, never remembered nor
//! shared: it is answered by `ApproveWithContent` with `{"answer": "<text>"}` (any other
//! approval is an `InvalidInput` that leaves it pending) or denied.
//!
//! # Children and failure
//! No child actors; only its own timers, aborted when it stops. If it fails (`InjectPanic`
//! makes it fail on demand, for tests and drills), the Session starts a new, empty one and
//! publishes it in the session's directory: approvals are deliberately not persisted. Pending
//! requests are lost with the old store, so their callers see a closed reply port; callers
//! that ask through [`ask_until_answered`] (tasks, the McpPool) then ask the new store again: a new
//! pending request with a new id, a new `approval_requested` event and a fresh timeout, never
//! a denial (`troupe_approval_reasked_total`). Keys are lost too, so the next request for a
//! remembered command asks a human again. An answer given to the old store after it failed
//! is `NotFound` at the new one.

mod decide;
pub mod elicitation;
pub mod metrics;

use self::metrics::Outcome;
use crate::clock::Clock;
use crate::directory::ServiceRef;
use crate::events::{EventDraft, EventSink};
use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::field::Empty;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ApprovalSubject, CommandKey, ConversationId,
    EventKind, PendingApproval, TaskId,
};

use decide::*;
pub use decide::{
    ApprovalCore, Ask, AskAdmission, Resolution, WITHDRAWN_REMEMBERED, covers, fit_decision,
    key_for, key_path,
};

/// Start-up arguments.
pub struct ApprovalStoreArgs {
    pub clock: Clock,
    /// How often expired keys are swept.
    pub sweep_interval: Duration,
    /// How long a request waits for a human before it is denied.
    pub request_timeout: Duration,
    /// Where `approval_requested` / `approval_resolved` events go.
    pub events: Option<EventSink>,
}

/// How a request was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// An existing key covered the command; no human was asked.
    Remembered,
    /// A human approved it now.
    Decided(ApprovalDecision),
}

/// Tells the ApprovalStore, when dropped before [`answered`](Self::answered), that a caller
/// of the conversation stopped waiting (`CallersGone`): its requests nobody waits for any more
/// are withdrawn, however the wait ended (cancelled, dropped with its caller). Make it before
/// the wait, so that it is dropped after the wait's reply port.
pub struct CallersGoneOnDrop<'a> {
    approvals: Option<&'a ServiceRef<ApprovalMsg>>,
    conversation_id: ConversationId,
}

impl<'a> CallersGoneOnDrop<'a> {
    pub fn new(approvals: &'a ServiceRef<ApprovalMsg>, conversation_id: ConversationId) -> Self {
        Self {
            approvals: Some(approvals),
            conversation_id,
        }
    }

    /// The wait got its answer: nothing to withdraw.
    pub fn answered(&mut self) {
        self.approvals = None;
    }
}

impl Drop for CallersGoneOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(approvals) = self.approvals.take() {
            let _ = approvals.get().cast(ApprovalMsg::CallersGone {
                conversation_id: self.conversation_id,
            });
        }
    }
}

/// The ApprovalStore's mailbox.
pub enum ApprovalMsg {
    /// Runs `command` for `conversation_id`? Answered at once when a live key covers it;
    /// otherwise a pending request is opened, an `approval_requested` event emitted, and the
    /// answer comes with the human's decision, or `ApprovalDenied` when `timeout` (default:
    /// the store's) runs out.
    Request {
        conversation_id: ConversationId,
        task_id: Option<TaskId>,
        command: Vec<String>,
        reason: String,
        timeout: Option<Duration>,
        reply: RpcReplyPort<Result<Granted, AgentError>>,
    },
    /// Like `Request`, for anything `ask.subject` names (an MCP server's elicitation or
    /// sampling request); `ask.command` is what a human reads as the command.
    RequestSubject {
        ask: Ask,
        timeout: AskTimeout,
        reply: RpcReplyPort<Result<Granted, AgentError>>,
    },
    /// A human's decision on a pending request; `NotFound` if it is unknown or already over,
    /// `InvalidInput` (the request stays pending) if it does not fit the request.
    Respond {
        approval_id: ApprovalId,
        decision: ApprovalDecision,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Timer: a pending request ran out of time.
    RequestTimedOut { approval_id: ApprovalId },
    /// Timer: drops expired keys.
    Sweep,
    /// Whether a live key covers the command, without asking anyone.
    IsApproved {
        conversation_id: ConversationId,
        command: Vec<String>,
        reply: RpcReplyPort<bool>,
    },
    /// Pending requests, oldest first (optionally of one conversation).
    ListPending {
        conversation_id: Option<ConversationId>,
        reply: RpcReplyPort<Vec<PendingApproval>>,
    },
    /// Live keys, for observation.
    ListKeys {
        reply: RpcReplyPort<Vec<CommandKey>>,
    },
    /// The conversation closed: deny its pending requests and drop its scoped keys.
    ConversationClosed { conversation_id: ConversationId },
    /// A caller of the conversation gave up waiting: withdraw its requests nobody waits for.
    CallersGone { conversation_id: ConversationId },
    /// The conversation failed (its runner was aborted) and is being started again: withdraw
    /// its pending requests, whoever asked them; its scoped keys stay.
    ConversationFailed { conversation_id: ConversationId },
    /// A task was cancelled or aborted: withdraw its pending requests (`reason` says why).
    TaskCancelled {
        conversation_id: ConversationId,
        task_id: TaskId,
        reason: String,
    },
    /// Fault injection: panics inside `handle`, to exercise the Session's restart of the
    /// store in tests and drills.
    InjectPanic,
}

/// What a waiting caller is answered through.
type Reply = RpcReplyPort<Result<Granted, AgentError>>;

/// The actor's state: the pure core plus its timers and outputs.
pub struct ApprovalStoreState {
    /// Timestamps keys and requests; follows tokio's (possibly paused) clock.
    clock: Clock,
    request_timeout: Duration,
    sweep_interval: Duration,
    events: Option<EventSink>,
    core: ApprovalCore<Reply>,
    /// Timeout timers of pending requests, aborted when a human answers first.
    timers: HashMap<ApprovalId, JoinHandle<Result<(), MessagingErr<ApprovalMsg>>>>,
    /// The span each pending request was opened in (a child of its caller's wait): its
    /// resolution is announced there, in the asking task's trace, whoever answers.
    spans: HashMap<ApprovalId, tracing::Span>,
    /// The sweep interval timer, started in `post_start`.
    sweeper: Option<JoinHandle<()>>,
    gauges: metrics::Gauges,
}

/// The ApprovalStore actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApprovalStore;

#[ractor::async_trait]
impl Actor for ApprovalStore {
    type Msg = ApprovalMsg;
    type State = ApprovalStoreState;
    type Arguments = ApprovalStoreArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ApprovalStoreArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(ApprovalStoreState {
            clock: args.clock,
            request_timeout: args.request_timeout,
            sweep_interval: args.sweep_interval,
            events: args.events,
            core: ApprovalCore::new(),
            timers: HashMap::new(),
            spans: HashMap::new(),
            sweeper: None,
            gauges: metrics::Gauges::default(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // tokio's interval panics on a zero period; zero means "never sweep".
        if state.sweep_interval.is_zero() {
            tracing::warn!("approval key sweep disabled: zero interval");
        } else {
            state.sweeper = Some(myself.send_interval(state.sweep_interval, || ApprovalMsg::Sweep));
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(sweeper) = state.sweeper.take() {
            sweeper.abort();
        }
        for (_, timer) in state.timers.drain() {
            timer.abort();
        }
        // Pending callers' ports close when the state drops: they read it as a denial.
        state.gauges.clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let now_ms = state.clock.now_ms();
        match msg {
            ApprovalMsg::Request {
                conversation_id,
                task_id,
                command,
                reason,
                timeout,
                reply,
            } => {
                let ask = Ask {
                    conversation_id,
                    task_id,
                    command,
                    reason,
                    subject: ApprovalSubject::Command,
                    workdir: None,
                };
                state.on_request(&myself, ask, timeout.into(), reply, now_ms);
            }
            ApprovalMsg::RequestSubject {
                ask,
                timeout,
                reply,
            } => state.on_request(&myself, ask, timeout, reply, now_ms),
            ApprovalMsg::Respond {
                approval_id,
                decision,
                reply,
            } => {
                let _ = reply.send(state.on_respond(approval_id, decision, now_ms));
            }
            ApprovalMsg::RequestTimedOut { approval_id } => {
                state.on_timed_out(approval_id, now_ms);
            }
            ApprovalMsg::Sweep => {
                let removed = state.core.sweep(now_ms);
                if removed > 0 {
                    tracing::debug!(removed, "expired approval keys swept");
                }
            }
            ApprovalMsg::IsApproved {
                conversation_id,
                command,
                reply,
            } => {
                let _ = reply.send(state.core.is_approved(conversation_id, &command, now_ms));
            }
            ApprovalMsg::ListPending {
                conversation_id,
                reply,
            } => {
                let _ = reply.send(state.core.pending(conversation_id));
            }
            ApprovalMsg::ListKeys { reply } => {
                let _ = reply.send(state.core.live_keys(now_ms));
            }
            ApprovalMsg::ConversationClosed { conversation_id } => {
                state.on_conversation_closed(conversation_id, now_ms);
            }
            ApprovalMsg::CallersGone { conversation_id } => {
                let withdrawn = state
                    .core
                    .withdraw_abandoned(conversation_id, RpcReplyPort::is_closed);
                if !withdrawn.is_empty() {
                    tracing::info!(%conversation_id, withdrawn = withdrawn.len(), "approval requests withdrawn");
                }
                state.finish(withdrawn, now_ms);
            }
            ApprovalMsg::ConversationFailed { conversation_id } => {
                let withdrawn = state
                    .core
                    .withdraw_conversation(conversation_id, "its conversation failed");
                if !withdrawn.is_empty() {
                    tracing::info!(%conversation_id, withdrawn = withdrawn.len(), "approval requests of a failed conversation withdrawn");
                }
                state.finish(withdrawn, now_ms);
            }
            ApprovalMsg::TaskCancelled {
                conversation_id,
                task_id,
                reason,
            } => {
                let withdrawn = state.core.withdraw_task(conversation_id, task_id, &reason);
                if !withdrawn.is_empty() {
                    tracing::info!(%conversation_id, %task_id, withdrawn = withdrawn.len(), %reason, "approval requests of a cancelled task withdrawn");
                }
                state.finish(withdrawn, now_ms);
            }
            ApprovalMsg::InjectPanic => panic!("injected fault in the approval store"),
        }
        state
            .gauges
            .sync(state.core.pending_len(), state.core.keys_len());
        Ok(())
    }
}

impl ApprovalStoreState {
    fn on_request(
        &mut self,
        myself: &ActorRef<ApprovalMsg>,
        ask: Ask,
        timeout: AskTimeout,
        reply: Reply,
        now_ms: u64,
    ) {
        let span = tracing::info_span!(
            "approval.request",
            conversation_id = %ask.conversation_id,
            task_id = ask.task_id.map(tracing::field::display),
            approval_id = Empty,
        );
        let _entered = span.enter();
        let timeout = timeout.resolve(self.request_timeout, tokio::time::Instant::now());
        match self.core.request(ask, now_ms, duration_ms(timeout), reply) {
            AskAdmission::Remembered(reply) => {
                tracing::debug!("approval remembered");
                metrics::requested(metrics::AdmissionLabel::Remembered);
                metrics::answered(Outcome::Remembered, 1);
                let _ = reply.send(Ok(Granted::Remembered));
            }
            AskAdmission::Attached(approval_id) => {
                span.record("approval_id", tracing::field::display(approval_id));
                tracing::debug!("identical approval already pending; caller attached");
                metrics::requested(metrics::AdmissionLabel::Attached);
            }
            AskAdmission::Opened(request) => {
                let approval_id = request.approval_id;
                span.record("approval_id", tracing::field::display(approval_id));
                // The command is content: its length only (its text is in the event, where
                // the conversation's storage policy decides what is kept).
                tracing::info!(command_args = request.command.len(), "approval requested");
                metrics::requested(metrics::AdmissionLabel::Asked);
                self.emit(
                    &request,
                    EventKind::ApprovalRequested {
                        approval_id,
                        command: request.command.clone(),
                        reason: request.reason.clone(),
                        subject: request.subject.clone(),
                    },
                );
                let timer = myself.send_after(timeout, move || ApprovalMsg::RequestTimedOut {
                    approval_id,
                });
                self.timers.insert(approval_id, timer);
                self.spans.insert(approval_id, span.clone());
            }
        }
    }

    fn on_respond(
        &mut self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
        now_ms: u64,
    ) -> Result<(), AgentError> {
        let span = tracing::info_span!("approval.respond", %approval_id, conversation_id = Empty);
        let _entered = span.enter();
        match self.core.decide(approval_id, decision, now_ms) {
            Ok(resolutions) => {
                self.finish(resolutions, now_ms);
                Ok(())
            }
            Err(e) => {
                tracing::debug!("response to an unknown or finished approval");
                Err(e)
            }
        }
    }

    fn on_timed_out(&mut self, approval_id: ApprovalId, now_ms: u64) {
        let span = tracing::info_span!("approval.timed_out", %approval_id, conversation_id = Empty);
        let _entered = span.enter();
        self.timers.remove(&approval_id);
        if let Some(resolution) = self.core.time_out(approval_id) {
            self.finish(vec![resolution], now_ms);
        }
    }

    fn on_conversation_closed(&mut self, conversation_id: ConversationId, now_ms: u64) {
        let span = tracing::info_span!("approval.conversation_closed", %conversation_id);
        let _entered = span.enter();
        let resolutions = self.core.close_conversation(conversation_id);
        self.finish(resolutions, now_ms);
    }

    /// Answers, counts and announces resolved requests.
    fn finish(&mut self, resolutions: Vec<Resolution<Reply>>, now_ms: u64) {
        for resolution in resolutions {
            let request = &resolution.request;
            let outcome = resolution.outcome();
            tracing::info!(
                approval_id = %request.approval_id,
                conversation_id = %request.conversation_id,
                outcome = outcome.as_str(),
                callers = resolution.waiters.len(),
                "approval resolved"
            );
            if let Some(timer) = self.timers.remove(&request.approval_id) {
                timer.abort();
            }
            metrics::answered(outcome, resolution.waiters.len());
            metrics::waited(
                outcome,
                Duration::from_millis(now_ms.saturating_sub(request.requested_at_ms)),
            );
            let opened_in = self
                .spans
                .remove(&request.approval_id)
                .unwrap_or_else(tracing::Span::current);
            opened_in.in_scope(|| {
                self.emit(
                    request,
                    EventKind::ApprovalResolved {
                        approval_id: request.approval_id,
                        decision: resolution.decision.clone(),
                    },
                );
            });
            for reply in resolution.waiters {
                // A caller that gave up has nothing left to hear.
                let _ = reply.send(resolution.answer.clone());
            }
        }
    }

    fn emit(&self, request: &PendingApproval, event: EventKind) {
        let Some(events) = &self.events else {
            return;
        };
        let draft = match request.task_id {
            Some(task_id) => EventDraft::task(request.conversation_id, task_id, event),
            None => EventDraft::conversation(request.conversation_id, event),
        };
        events.emit(draft);
    }
}

/// How long a request waits for a human before it is taken as denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskTimeout {
    /// The store's own (`approval_timeout`).
    Store,
    /// This long, whatever the store's.
    Exactly(Duration),
    /// The store's, but ending no later than this instant: for a request whose answer is no
    /// use after a deadline of its own (an MCP server's request during a tool call that times
    /// out). Asked again of a store that replaced a failed one, it still ends then.
    Before(tokio::time::Instant),
}

impl AskTimeout {
    /// The wait, given the store's own timeout, asked at `now`.
    pub fn resolve(self, store: Duration, now: tokio::time::Instant) -> Duration {
        match self {
            Self::Store => store,
            Self::Exactly(d) => d,
            Self::Before(deadline) => deadline.saturating_duration_since(now).min(store),
        }
    }
}

impl From<Option<Duration>> for AskTimeout {
    fn from(timeout: Option<Duration>) -> Self {
        timeout.map_or(Self::Store, Self::Exactly)
    }
}

/// Asks the session's ApprovalStore and waits for its answer. If the store fails before it
/// answers, the same request is asked of the store that replaces it (a new pending request
/// with a fresh timeout): a restart is never taken for a denial. `None` when no store will
/// answer any more (the session is gone).
pub async fn ask_until_answered(
    store: &ServiceRef<ApprovalMsg>,
    ask: Ask,
    timeout: impl Into<AskTimeout>,
    asker: metrics::Asker,
) -> Option<Result<Granted, AgentError>> {
    let timeout = timeout.into();
    let mut actor = store.get();
    loop {
        let asked = ractor::call!(actor, |reply| ApprovalMsg::RequestSubject {
            ask: ask.clone(),
            timeout,
            reply,
        });
        match asked {
            Ok(answer) => return Some(answer),
            Err(error) => {
                tracing::info!(%error, "approval store stopped before answering; asking the next one");
                actor = store.replaced(actor.get_id()).await?;
                metrics::reasked(asker);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::RolloutMsg;
    use tokio::sync::{mpsc, oneshot};

    #[test]
    fn a_wait_before_a_deadline_is_what_is_left_of_it_when_asked_capped_by_the_stores() {
        let now = tokio::time::Instant::now();
        let store = Duration::from_secs(300);
        let deadline = now + Duration::from_secs(20);
        assert_eq!(
            AskTimeout::Before(deadline).resolve(store, now),
            Duration::from_secs(20)
        );
        // Asked again 15 s later (a store that replaced a failed one): 5 s are left.
        let later = now + Duration::from_secs(15);
        assert_eq!(
            AskTimeout::Before(deadline).resolve(store, later),
            Duration::from_secs(5)
        );
        assert_eq!(
            AskTimeout::Before(deadline).resolve(store, deadline),
            Duration::ZERO
        );
        let far = now + Duration::from_secs(3_600);
        assert_eq!(AskTimeout::Before(far).resolve(store, now), store);
        assert_eq!(AskTimeout::Store.resolve(store, now), store);
        assert_eq!(
            AskTimeout::from(Some(Duration::from_secs(9))).resolve(store, now),
            Duration::from_secs(9)
        );
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    fn key(
        path: &[&str],
        conversation: Option<ConversationId>,
        expires: Option<u64>,
    ) -> CommandKey {
        CommandKey {
            path: argv(path),
            conversation,
            expires_at_ms: expires,
        }
    }

    fn ask(conversation_id: ConversationId, command: &[&str]) -> Ask {
        Ask {
            conversation_id,
            task_id: None,
            command: argv(command),
            reason: "needs it".to_owned(),
            subject: ApprovalSubject::Command,
            workdir: None,
        }
    }

    /// Opens a request in `core` and returns its id.
    fn open(core: &mut ApprovalCore<u32>, ask: Ask, now_ms: u64, waiter: u32) -> ApprovalId {
        match core.request(ask, now_ms, 1_000, waiter) {
            AskAdmission::Opened(info) => info.approval_id,
            other => panic!("expected a new request, got {other:?}"),
        }
    }

    // ----- pure core -----

    #[test]
    fn running_a_command_without_the_sandbox_is_asked_and_remembered_apart() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let unsandboxed = |c| Ask {
            subject: ApprovalSubject::CommandWithoutSandbox,
            ..ask(c, &["make"])
        };
        let mut core = ApprovalCore::new();
        // Pending in the sandbox, the question about running it without one is another.
        let sandboxed = open(&mut core, ask(a, &["make"]), 0, 1);
        let escalation = open(&mut core, unsandboxed(a), 0, 2);
        assert_ne!(sandboxed, escalation);
        // Approved for the whole session in the sandbox: that does not answer the other.
        core.decide(
            sandboxed,
            ApprovalDecision::ApproveForSession { ttl_secs: None },
            1,
        )
        .unwrap();
        assert!(matches!(
            core.request(ask(b, &["make"]), 2, 1_000, 3),
            AskAdmission::Remembered(3)
        ));
        assert!(matches!(
            core.request(unsandboxed(b), 2, 1_000, 4),
            AskAdmission::Opened(_)
        ));
        // Approved for the session without the sandbox: remembered as that.
        core.decide(
            escalation,
            ApprovalDecision::ApproveForSession { ttl_secs: None },
            3,
        )
        .unwrap();
        assert!(matches!(
            core.request(unsandboxed(b), 4, 1_000, 5),
            AskAdmission::Remembered(5)
        ));
    }

    /// A patch and a command of the same words are two questions, remembered apart: an
    /// approved patch (`apply_patch`, `update a.rs`) never lets a command `apply_patch
    /// "update a.rs"` run, nor the reverse.
    #[test]
    fn a_patch_is_asked_and_remembered_apart_from_a_command_of_the_same_words() {
        let c = ConversationId::new();
        let patch = || Ask {
            subject: ApprovalSubject::Patch,
            ..ask(c, &["apply_patch", "update a.rs"])
        };
        let command = || ask(c, &["apply_patch", "update a.rs"]);
        let mut core = ApprovalCore::new();
        let asked_patch = open(&mut core, patch(), 0, 1);
        let asked_command = open(&mut core, command(), 0, 2);
        assert_ne!(asked_patch, asked_command, "not attached to each other");
        let resolved = core
            .decide(
                asked_patch,
                ApprovalDecision::ApproveForSession { ttl_secs: None },
                1,
            )
            .unwrap();
        assert_eq!(resolved.len(), 1, "the pending command is not answered");
        assert!(matches!(
            core.request(patch(), 2, 1_000, 3),
            AskAdmission::Remembered(3)
        ));
        assert!(matches!(
            core.request(command(), 2, 1_000, 4),
            AskAdmission::Attached(id) if id == asked_command
        ));
        core.decide(asked_command, ApprovalDecision::Deny { reason: None }, 3)
            .unwrap();
        assert!(matches!(
            core.request(command(), 4, 1_000, 5),
            AskAdmission::Opened(_)
        ));
    }

    /// A command whose words carry a NUL could spell the key of another kind of request
    /// (`"\0unsandboxed", "make"` is the key of running `make` without the sandbox): it is
    /// never remembered, and its approval answers nothing else.
    #[test]
    fn a_command_with_a_nul_is_never_remembered() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        for (spelled, workdir) in [
            (ask(c, &["\0unsandboxed", "make"]), None),
            (ask(c, &["\0cwd", "/", "rm", "-rf", "x"]), None),
            (ask(c, &["\0patch", "update a.rs"]), None),
            (ask(c, &["ls"]), Some("a\0b")),
        ] {
            let spelled = Ask {
                workdir: workdir.map(str::to_owned),
                ..spelled
            };
            let id = open(&mut core, spelled.clone(), 0, 1);
            core.decide(
                id,
                ApprovalDecision::ApproveForSession { ttl_secs: None },
                1,
            )
            .unwrap();
            assert!(core.live_keys(2).is_empty(), "{spelled:?} left a key");
            assert!(matches!(
                core.request(spelled, 2, 1_000, 2),
                AskAdmission::Opened(_)
            ));
        }
        let unsandboxed = Ask {
            subject: ApprovalSubject::CommandWithoutSandbox,
            ..ask(c, &["make"])
        };
        assert!(matches!(
            core.request(unsandboxed, 3, 1_000, 3),
            AskAdmission::Opened(_)
        ));
        let elsewhere = Ask {
            workdir: Some("/".into()),
            ..ask(c, &["rm", "-rf", "x"])
        };
        assert!(matches!(
            core.request(elsewhere, 3, 1_000, 4),
            AskAdmission::Opened(_)
        ));
    }

    /// A command run in a directory its call named is asked about and remembered with that
    /// directory: approving `rm -rf build` where it runs by default does not approve it in
    /// `/`, nor the other way round; the same directory is covered.
    #[test]
    fn a_command_in_a_named_directory_is_asked_and_remembered_with_it() {
        let c = ConversationId::new();
        let in_dir = |dir: Option<&str>| Ask {
            workdir: dir.map(str::to_owned),
            ..ask(c, &["rm", "-rf", "build"])
        };
        let mut core = ApprovalCore::new();
        let here = open(&mut core, in_dir(None), 0, 1);
        let root = open(&mut core, in_dir(Some("/")), 0, 2);
        assert_ne!(here, root, "two questions, not one");
        core.decide(
            here,
            ApprovalDecision::ApproveForConversation { ttl_secs: None },
            1,
        )
        .unwrap();
        assert!(matches!(
            core.request(in_dir(None), 2, 1_000, 3),
            AskAdmission::Remembered(3)
        ));
        assert!(
            core.pending(None).iter().any(|p| p.approval_id == root),
            "the run in / is still asked"
        );
        core.decide(
            root,
            ApprovalDecision::ApproveForConversation { ttl_secs: None },
            3,
        )
        .unwrap();
        assert!(matches!(
            core.request(in_dir(Some("/")), 4, 1_000, 5),
            AskAdmission::Remembered(5)
        ));
        assert!(matches!(
            core.request(in_dir(Some("/tmp")), 4, 1_000, 6),
            AskAdmission::Opened(ref p) if p.workdir.as_deref() == Some("/tmp")
        ));
    }

    #[test]
    fn covers_needs_the_exact_argv() {
        let c = ConversationId::new();
        let k = key(&["rm", "-rf", "build"], None, None);
        assert!(covers(&k, c, &argv(&["rm", "-rf", "build"]), 0));
        assert!(!covers(&k, c, &argv(&["rm", "-rf"]), 0));
        assert!(!covers(&k, c, &argv(&["rm", "-rf", "build", "/"]), 0));
        assert!(!covers(&k, c, &argv(&["rm", "-rf", "Build"]), 0));
    }

    #[test]
    fn covers_honours_scope() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let cmd = argv(&["make"]);
        let scoped = key(&["make"], Some(a), None);
        assert!(covers(&scoped, a, &cmd, 0));
        assert!(!covers(&scoped, b, &cmd, 0));
        let session = key(&["make"], None, None);
        assert!(covers(&session, a, &cmd, 0));
        assert!(covers(&session, b, &cmd, 0));
    }

    #[test]
    fn covers_stops_exactly_at_expiry() {
        let c = ConversationId::new();
        let k = key(&["make"], None, Some(60_000));
        assert!(covers(&k, c, &argv(&["make"]), 59_999));
        assert!(!covers(&k, c, &argv(&["make"]), 60_000));
        assert!(!covers(&k, c, &argv(&["make"]), 60_001));
    }

    #[test]
    fn key_for_each_decision() {
        let c = ConversationId::new();
        let cmd = argv(&["make"]);
        let once = key_for(&ApprovalDecision::ApproveOnce, c, &cmd, 10);
        assert_eq!(once, None);
        let conv = ApprovalDecision::ApproveForConversation { ttl_secs: Some(60) };
        assert_eq!(
            key_for(&conv, c, &cmd, 10),
            Some(key(&["make"], Some(c), Some(60_010)))
        );
        let conv_forever = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        assert_eq!(
            key_for(&conv_forever, c, &cmd, 10),
            Some(key(&["make"], Some(c), None))
        );
        let session = ApprovalDecision::ApproveForSession { ttl_secs: Some(1) };
        assert_eq!(
            key_for(&session, c, &cmd, 10),
            Some(key(&["make"], None, Some(1_010)))
        );
        let deny = ApprovalDecision::Deny { reason: None };
        assert_eq!(key_for(&deny, c, &cmd, 10), None);
        assert_eq!(key_for(&ApprovalDecision::TimedOut, c, &cmd, 10), None);
    }

    #[test]
    fn identical_requests_attach_and_others_open() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(a, &["make"]), 0, 1);
        assert!(
            matches!(core.request(ask(a, &["make"]), 5, 1_000, 2), AskAdmission::Attached(x) if x == id)
        );
        // Another conversation or another argv is another question.
        open(&mut core, ask(b, &["make"]), 6, 3);
        open(&mut core, ask(a, &["make", "test"]), 7, 4);
        assert_eq!(core.pending_len(), 3);
        let resolutions = core.decide(id, ApprovalDecision::ApproveOnce, 8).unwrap();
        assert_eq!(resolutions.len(), 1);
        assert_eq!(resolutions[0].waiters, vec![1, 2]);
        assert_eq!(
            resolutions[0].answer,
            Ok(Granted::Decided(ApprovalDecision::ApproveOnce))
        );
        assert_eq!(resolutions[0].outcome(), Outcome::Approved);
    }

    #[test]
    fn approve_once_remembers_nothing() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(c, &["make"]), 0, 1);
        core.decide(id, ApprovalDecision::ApproveOnce, 1).unwrap();
        assert_eq!(core.keys_len(), 0);
        open(&mut core, ask(c, &["make"]), 2, 2);
    }

    #[test]
    fn a_remembered_request_hands_its_waiter_back() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(c, &["make"]), 0, 1);
        let decision = ApprovalDecision::ApproveForConversation { ttl_secs: Some(1) };
        core.decide(id, decision, 0).unwrap();
        assert!(matches!(
            core.request(ask(c, &["make"]), 999, 1_000, 7),
            AskAdmission::Remembered(7)
        ));
        open(&mut core, ask(c, &["make"]), 1_000, 8);
    }

    #[test]
    fn a_session_key_grants_other_covered_pending_requests() {
        let (a, b, c) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let mut core = ApprovalCore::new();
        let first = open(&mut core, ask(a, &["make"]), 0, 1);
        let second = open(&mut core, ask(b, &["make"]), 1, 2);
        let third = open(&mut core, ask(c, &["make"]), 2, 3);
        let other = open(&mut core, ask(b, &["make", "test"]), 3, 4);
        let decision = ApprovalDecision::ApproveForSession { ttl_secs: None };
        let resolutions = core.decide(first, decision.clone(), 10).unwrap();
        let ids: Vec<_> = resolutions.iter().map(|r| r.request.approval_id).collect();
        assert_eq!(ids, vec![first, second, third]);
        assert_eq!(resolutions[1].answer, Ok(Granted::Remembered));
        assert_eq!(resolutions[1].decision, decision);
        assert_eq!(resolutions[1].outcome(), Outcome::Remembered);
        let left: Vec<_> = core.pending(None).iter().map(|p| p.approval_id).collect();
        assert_eq!(left, vec![other]);
    }

    #[test]
    fn a_conversation_key_leaves_other_conversations_pending() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let mut core = ApprovalCore::new();
        let first = open(&mut core, ask(a, &["make"]), 0, 1);
        let second = open(&mut core, ask(b, &["make"]), 1, 2);
        let decision = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        assert_eq!(core.decide(first, decision, 2).unwrap().len(), 1);
        assert_eq!(core.pending(None)[0].approval_id, second);
        assert!(core.is_approved(a, &argv(&["make"]), 3));
        assert!(!core.is_approved(b, &argv(&["make"]), 3));
    }

    #[test]
    fn denials_carry_their_reason() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(c, &["make"]), 0, 1);
        let r = core
            .decide(id, ApprovalDecision::Deny { reason: None }, 1)
            .unwrap();
        assert_eq!(
            r[0].answer,
            Err(AgentError::ApprovalDenied {
                command: argv(&["make"]),
                reason: "denied by user".to_owned()
            })
        );
        assert_eq!(r[0].outcome(), Outcome::Denied);
        let id = open(&mut core, ask(c, &["make"]), 2, 2);
        let deny = ApprovalDecision::Deny {
            reason: Some("not on a Friday".to_owned()),
        };
        let r = core.decide(id, deny, 3).unwrap();
        assert!(
            matches!(&r[0].answer, Err(AgentError::ApprovalDenied { reason, .. }) if reason == "not on a Friday")
        );
        assert_eq!(core.keys_len(), 0);
    }

    #[test]
    fn deciding_twice_or_an_unknown_id_is_not_found() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(c, &["make"]), 0, 1);
        core.decide(id, ApprovalDecision::ApproveOnce, 1).unwrap();
        let again = core.decide(id, ApprovalDecision::ApproveOnce, 2);
        assert!(matches!(again, Err(AgentError::NotFound { ref what, .. }) if what == "approval"));
        let unknown = core.decide(ApprovalId::new(), ApprovalDecision::ApproveOnce, 2);
        assert!(matches!(unknown, Err(AgentError::NotFound { .. })));
    }

    #[test]
    fn time_out_denies_once() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = match core.request(ask(c, &["make"]), 100, 2_500, 1) {
            AskAdmission::Opened(info) => {
                assert_eq!(info.deadline_ms, 2_600);
                info.approval_id
            }
            other => panic!("{other:?}"),
        };
        let r = core.time_out(id).unwrap();
        assert_eq!(r.decision, ApprovalDecision::TimedOut);
        assert_eq!(r.outcome(), Outcome::TimedOut);
        assert!(
            matches!(&r.answer, Err(AgentError::ApprovalDenied { reason, .. }) if reason == "approval timed out after 2500 ms")
        );
        assert!(core.time_out(id).is_none());
    }

    #[test]
    fn closing_a_conversation_denies_its_requests_and_drops_its_keys() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(a, &["make"]), 0, 1);
        let scoped = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        core.decide(id, scoped, 0).unwrap();
        let id = open(&mut core, ask(a, &["ls"]), 0, 2);
        let session = ApprovalDecision::ApproveForSession { ttl_secs: None };
        core.decide(id, session, 0).unwrap();
        let mine = open(&mut core, ask(a, &["rm"]), 1, 3);
        let theirs = open(&mut core, ask(b, &["rm"]), 2, 4);
        let closed = core.close_conversation(a);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].request.approval_id, mine);
        assert!(
            matches!(&closed[0].answer, Err(AgentError::ApprovalDenied { reason, .. }) if reason == "conversation closed")
        );
        assert_eq!(core.pending(None)[0].approval_id, theirs);
        // The scoped key is gone; the session key stays.
        assert_eq!(core.live_keys(3), vec![key(&["ls"], None, None)]);
    }

    #[test]
    fn a_cancelled_task_withdraws_only_its_own_requests_and_a_late_answer_says_so() {
        let a = ConversationId::new();
        let (cancelled, other) = (TaskId::new(), TaskId::new());
        let mut core = ApprovalCore::new();
        let of_task = |task| Ask {
            task_id: Some(task),
            ..ask(a, &["make"])
        };
        let mine = open(&mut core, of_task(cancelled), 0, 1);
        let theirs = open(
            &mut core,
            Ask {
                task_id: Some(other),
                ..ask(a, &["ls"])
            },
            1,
            2,
        );
        let withdrawn = core.withdraw_task(a, cancelled, "its task was cancelled");
        assert_eq!(withdrawn.len(), 1);
        assert_eq!(withdrawn[0].request.approval_id, mine);
        assert_eq!(withdrawn[0].outcome(), Outcome::Withdrawn);
        assert_eq!(
            withdrawn[0].decision,
            ApprovalDecision::Deny {
                reason: Some("withdrawn: its task was cancelled".into())
            }
        );
        assert_eq!(core.pending(None)[0].approval_id, theirs);
        match core.decide(mine, ApprovalDecision::ApproveOnce, 2) {
            Err(AgentError::Cancelled { reason }) => {
                assert!(
                    reason.contains("withdrawn: its task was cancelled"),
                    "{reason}"
                );
            }
            other => panic!("a late answer is told the request was withdrawn: {other:?}"),
        }
        // An id that never was pending is still NotFound.
        assert!(matches!(
            core.decide(ApprovalId::new(), ApprovalDecision::ApproveOnce, 2),
            Err(AgentError::NotFound { .. })
        ));
        // Only the newest WITHDRAWN_REMEMBERED are remembered.
        for i in 0..WITHDRAWN_REMEMBERED {
            let id = open(&mut core, of_task(cancelled), 3, 10 + i as u32);
            assert_eq!(core.withdraw_task(a, cancelled, "again").len(), 1, "{id}");
        }
        assert!(matches!(
            core.decide(mine, ApprovalDecision::ApproveOnce, 4),
            Err(AgentError::NotFound { .. })
        ));
    }

    #[test]
    fn requests_nobody_waits_for_are_withdrawn() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let mut core = ApprovalCore::new();
        let gone = open(&mut core, ask(a, &["make"]), 0, 1);
        // Two waiters, one still there: it stays.
        let shared = open(&mut core, ask(a, &["ls"]), 1, 2);
        assert!(matches!(
            core.request(ask(a, &["ls"]), 2, 1_000, 3),
            AskAdmission::Attached(id) if id == shared
        ));
        open(&mut core, ask(b, &["make"]), 3, 4);
        let withdrawn = core.withdraw_abandoned(a, |w| *w == 1 || *w == 2);
        assert_eq!(withdrawn.len(), 1);
        assert_eq!(withdrawn[0].request.approval_id, gone);
        assert!(matches!(
            &withdrawn[0].answer,
            Err(AgentError::ApprovalDenied { reason, .. }) if reason.starts_with("withdrawn")
        ));
        assert_eq!(core.pending_len(), 2);
    }

    #[test]
    fn sweep_drops_only_expired_keys() {
        let c = ConversationId::new();
        let mut core: ApprovalCore<u32> = ApprovalCore::new();
        for (cmd, ttl) in [("a", Some(1)), ("b", Some(2)), ("c", None)] {
            let id = open(&mut core, ask(c, &[cmd]), 0, 0);
            core.decide(id, ApprovalDecision::ApproveForSession { ttl_secs: ttl }, 0)
                .unwrap();
        }
        assert_eq!(core.live_keys(1_000).len(), 2);
        assert_eq!(core.keys_len(), 3);
        assert_eq!(core.sweep(1_000), 1);
        assert_eq!(core.sweep(1_000), 0);
        assert_eq!(core.sweep(5_000), 1);
        assert_eq!(core.live_keys(5_000), vec![key(&["c"], None, None)]);
    }

    #[test]
    fn a_new_decision_replaces_an_expired_key() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, ask(c, &["make"]), 0, 1);
        core.decide(
            id,
            ApprovalDecision::ApproveForSession { ttl_secs: Some(1) },
            0,
        )
        .unwrap();
        let id = open(&mut core, ask(c, &["make"]), 1_000, 2);
        core.decide(
            id,
            ApprovalDecision::ApproveForSession { ttl_secs: Some(1) },
            1_000,
        )
        .unwrap();
        assert_eq!(core.keys_len(), 1);
        assert_eq!(
            core.live_keys(1_500),
            vec![key(&["make"], None, Some(2_000))]
        );
    }

    #[test]
    fn pending_lists_oldest_first_and_filters() {
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let mut core = ApprovalCore::new();
        // Same millisecond: admission order decides.
        let ids: Vec<_> = ["x", "y", "z"]
            .iter()
            .enumerate()
            .map(|(i, cmd)| open(&mut core, ask(if i == 1 { b } else { a }, &[cmd]), 7, 0))
            .collect();
        let all: Vec<_> = core.pending(None).iter().map(|p| p.approval_id).collect();
        assert_eq!(all, ids);
        let only_a: Vec<_> = core
            .pending(Some(a))
            .iter()
            .map(|p| p.approval_id)
            .collect();
        assert_eq!(only_a, vec![ids[0], ids[2]]);
    }

    // ----- the actor -----

    type Answer = Result<Granted, AgentError>;

    async fn spawn_store(events: Option<EventSink>) -> (ActorRef<ApprovalMsg>, Clock) {
        let clock = Clock::new();
        let args = ApprovalStoreArgs {
            clock,
            sweep_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(30),
            events,
        };
        let (store, _) = Actor::spawn(None, ApprovalStore, args).await.unwrap();
        (store, clock)
    }

    /// Enqueues a request without waiting for it: the mailbox keeps it ordered before any
    /// later RPC, so that RPC is a barrier.
    fn ask_store(
        store: &ActorRef<ApprovalMsg>,
        conversation_id: ConversationId,
        task_id: Option<TaskId>,
        command: &[&str],
    ) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        store
            .cast(ApprovalMsg::Request {
                conversation_id,
                task_id,
                command: argv(command),
                reason: "needs it".to_owned(),
                timeout: None,
                reply: tx.into(),
            })
            .unwrap();
        rx
    }

    /// Asks and waits for the answer (only for answers that come without a human).
    async fn request(store: &ActorRef<ApprovalMsg>, c: ConversationId, command: &[&str]) -> Answer {
        ask_store(store, c, None, command).await.unwrap()
    }

    async fn pending(
        store: &ActorRef<ApprovalMsg>,
        c: Option<ConversationId>,
    ) -> Vec<PendingApproval> {
        ractor::call!(store, |reply| ApprovalMsg::ListPending {
            conversation_id: c,
            reply
        })
        .unwrap()
    }

    async fn only_pending(store: &ActorRef<ApprovalMsg>) -> PendingApproval {
        let mut all = pending(store, None).await;
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    async fn respond(
        store: &ActorRef<ApprovalMsg>,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    ) -> Result<(), AgentError> {
        ractor::call!(store, |reply| ApprovalMsg::Respond {
            approval_id,
            decision,
            reply
        })
        .unwrap()
    }

    async fn is_approved(
        store: &ActorRef<ApprovalMsg>,
        c: ConversationId,
        command: &[&str],
    ) -> bool {
        ractor::call!(store, |reply| ApprovalMsg::IsApproved {
            conversation_id: c,
            command: argv(command),
            reply
        })
        .unwrap()
    }

    async fn keys(store: &ActorRef<ApprovalMsg>) -> Vec<CommandKey> {
        ractor::call!(store, |reply| ApprovalMsg::ListKeys { reply }).unwrap()
    }

    /// Asks a human-answered question and answers it with `decision`.
    async fn ask_and_answer(
        store: &ActorRef<ApprovalMsg>,
        c: ConversationId,
        command: &[&str],
        decision: ApprovalDecision,
    ) -> Answer {
        let rx = ask_store(store, c, None, command);
        let id = only_pending(store).await.approval_id;
        respond(store, id, decision).await.unwrap();
        rx.await.unwrap()
    }

    fn denied_reason(answer: &Answer) -> &str {
        match answer {
            Err(AgentError::ApprovalDenied { reason, .. }) => reason,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn key_expiry_is_exact_under_paused_time() {
        let (store, clock) = spawn_store(None).await;
        let c = ConversationId::new();
        let decision = ApprovalDecision::ApproveForConversation { ttl_secs: Some(60) };
        let answer = ask_and_answer(&store, c, &["make"], decision.clone()).await;
        assert_eq!(answer, Ok(Granted::Decided(decision)));
        let granted_at = clock.now_ms();
        assert_eq!(
            keys(&store).await[0].expires_at_ms,
            Some(granted_at + 60_000)
        );

        tokio::time::advance(Duration::from_millis(59_999)).await;
        assert!(is_approved(&store, c, &["make"]).await);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(clock.now_ms(), granted_at + 60_000);
        assert!(!is_approved(&store, c, &["make"]).await);
        assert!(keys(&store).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn conversation_keys_stay_in_scope_and_session_keys_are_shared() {
        let (store, _) = spawn_store(None).await;
        let (a, b, c) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let scoped = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        ask_and_answer(&store, a, &["make"], scoped).await.unwrap();
        assert!(is_approved(&store, a, &["make"]).await);
        assert!(!is_approved(&store, b, &["make"]).await);
        assert_eq!(request(&store, a, &["make"]).await, Ok(Granted::Remembered));

        let session = ApprovalDecision::ApproveForSession { ttl_secs: None };
        ask_and_answer(&store, b, &["make"], session).await.unwrap();
        for conversation in [a, b, c] {
            assert!(is_approved(&store, conversation, &["make"]).await);
            assert_eq!(
                request(&store, conversation, &["make"]).await,
                Ok(Granted::Remembered)
            );
        }
        assert!(!is_approved(&store, c, &["make", "install"]).await);
    }

    #[tokio::test(start_paused = true)]
    async fn approve_once_asks_again_next_time() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        let answer = ask_and_answer(&store, c, &["make"], ApprovalDecision::ApproveOnce).await;
        assert_eq!(answer, Ok(Granted::Decided(ApprovalDecision::ApproveOnce)));
        assert!(pending(&store, None).await.is_empty());

        let _rx = ask_store(&store, c, None, &["make"]);
        let again = only_pending(&store).await;
        assert_eq!(again.command, argv(&["make"]));
        assert!(keys(&store).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_conversation_approval_with_ttl_expires_and_asks_again() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        let decision = ApprovalDecision::ApproveForConversation { ttl_secs: Some(60) };
        ask_and_answer(&store, c, &["make"], decision)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(request(&store, c, &["make"]).await, Ok(Granted::Remembered));

        tokio::time::advance(Duration::from_secs(30)).await;
        let _rx = ask_store(&store, c, None, &["make"]);
        assert_eq!(only_pending(&store).await.conversation_id, c);
    }

    #[tokio::test(start_paused = true)]
    async fn deny_answers_approval_denied() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        let answer = ask_and_answer(
            &store,
            c,
            &["rm", "-rf", "/"],
            ApprovalDecision::Deny { reason: None },
        )
        .await;
        assert_eq!(
            answer,
            Err(AgentError::ApprovalDenied {
                command: argv(&["rm", "-rf", "/"]),
                reason: "denied by user".to_owned(),
            })
        );
        let deny = ApprovalDecision::Deny {
            reason: Some("no".to_owned()),
        };
        let answer = ask_and_answer(&store, c, &["rm", "-rf", "/"], deny).await;
        assert_eq!(denied_reason(&answer), "no");
        assert!(keys(&store).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_answering_times_out_into_a_denial() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        let started = tokio::time::Instant::now();
        // Paused time auto-advances to the timeout while the call waits.
        let answer = ractor::call!(store, |reply| ApprovalMsg::Request {
            conversation_id: c,
            task_id: None,
            command: argv(&["make"]),
            reason: "build".to_owned(),
            timeout: Some(Duration::from_secs(5)),
            reply,
        })
        .unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(denied_reason(&answer), "approval timed out after 5000 ms");
        assert!(pending(&store, None).await.is_empty());

        // Without a timeout of its own, the store's applies.
        let answer = request(&store, c, &["make"]).await;
        assert_eq!(denied_reason(&answer), "approval timed out after 30000 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn identical_concurrent_requests_share_one_answer() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        let first = ask_store(&store, c, None, &["make"]);
        let second = ask_store(&store, c, Some(TaskId::new()), &["make"]);
        let id = only_pending(&store).await.approval_id;
        respond(&store, id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        let granted = Ok(Granted::Decided(ApprovalDecision::ApproveOnce));
        assert_eq!(first.await.unwrap(), granted);
        assert_eq!(second.await.unwrap(), granted);
        // The answer is spent; a late duplicate answer finds nothing.
        let late = respond(&store, id, ApprovalDecision::ApproveOnce).await;
        assert!(matches!(late, Err(AgentError::NotFound { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_approval_grants_other_pending_conversations() {
        let (store, _) = spawn_store(None).await;
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let in_a = ask_store(&store, a, None, &["make"]);
        let in_b = ask_store(&store, b, None, &["make"]);
        let id = pending(&store, Some(a)).await[0].approval_id;
        let session = ApprovalDecision::ApproveForSession { ttl_secs: None };
        respond(&store, id, session.clone()).await.unwrap();
        assert_eq!(in_a.await.unwrap(), Ok(Granted::Decided(session)));
        assert_eq!(in_b.await.unwrap(), Ok(Granted::Remembered));
        assert!(pending(&store, None).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn closing_a_conversation_denies_its_pending_requests() {
        let (store, _) = spawn_store(None).await;
        let (a, b) = (ConversationId::new(), ConversationId::new());
        let scoped = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        ask_and_answer(&store, a, &["ls"], scoped).await.unwrap();
        let in_a = ask_store(&store, a, None, &["make"]);
        let in_b = ask_store(&store, b, None, &["make"]);
        store
            .cast(ApprovalMsg::ConversationClosed { conversation_id: a })
            .unwrap();
        assert_eq!(denied_reason(&in_a.await.unwrap()), "conversation closed");
        let left = only_pending(&store).await;
        assert_eq!(left.conversation_id, b);
        assert!(!is_approved(&store, a, &["ls"]).await);
        drop(in_b);
    }

    #[tokio::test(start_paused = true)]
    async fn responding_to_an_unknown_approval_is_not_found() {
        let (store, _) = spawn_store(None).await;
        let missing = ApprovalId::new();
        let err = respond(&store, missing, ApprovalDecision::ApproveOnce).await;
        assert_eq!(err, Err(AgentError::not_found("approval", missing)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gave_up_is_skipped() {
        let (store, _) = spawn_store(None).await;
        let c = ConversationId::new();
        drop(ask_store(&store, c, None, &["make"]));
        let id = only_pending(&store).await.approval_id;
        let session = ApprovalDecision::ApproveForSession { ttl_secs: None };
        respond(&store, id, session).await.unwrap();
        // The decision still stands for the next caller.
        assert_eq!(request(&store, c, &["make"]).await, Ok(Granted::Remembered));
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_closes_pending_callers_ports() {
        let (store, _) = spawn_store(None).await;
        let rx = ask_store(&store, ConversationId::new(), None, &["make"]);
        only_pending(&store).await;
        store.stop_and_wait(None, None).await.unwrap();
        assert!(rx.await.is_err());
    }

    /// Stands in for the Rollout: forwards every emitted draft to the test.
    struct Forward;

    #[ractor::async_trait]
    impl Actor for Forward {
        type Msg = RolloutMsg;
        type State = mpsc::UnboundedSender<EventDraft>;
        type Arguments = mpsc::UnboundedSender<EventDraft>;

        async fn pre_start(
            &self,
            _myself: ActorRef<Self::Msg>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle(
            &self,
            _myself: ActorRef<Self::Msg>,
            msg: Self::Msg,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let RolloutMsg::Emit { draft } = msg {
                let _ = tx.send(draft);
            }
            Ok(())
        }
    }

    async fn spawn_with_events() -> (ActorRef<ApprovalMsg>, mpsc::UnboundedReceiver<EventDraft>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (rollout, _) = Actor::spawn(None, Forward, tx).await.unwrap();
        let (store, _) = spawn_store(Some(EventSink::new(rollout))).await;
        (store, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn events_name_the_approval_its_conversation_and_task() {
        let (store, mut events) = spawn_with_events().await;
        let (c, t) = (ConversationId::new(), TaskId::new());
        let rx = ask_store(&store, c, Some(t), &["make"]);
        let id = only_pending(&store).await.approval_id;

        let requested = events.recv().await.unwrap();
        assert_eq!(requested.conversation_id, Some(c));
        assert_eq!(requested.task_id, Some(t));
        assert_eq!(requested.sub_id, Some(crate::events::sub_id(c, t)));
        assert_eq!(
            requested.event,
            EventKind::ApprovalRequested {
                approval_id: id,
                command: argv(&["make"]),
                reason: "needs it".to_owned(),
                subject: ApprovalSubject::Command,
            }
        );

        respond(&store, id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        rx.await.unwrap().unwrap();
        let resolved = events.recv().await.unwrap();
        assert_eq!(
            (resolved.conversation_id, resolved.task_id),
            (Some(c), Some(t))
        );
        assert_eq!(
            resolved.event,
            EventKind::ApprovalResolved {
                approval_id: id,
                decision: ApprovalDecision::ApproveOnce,
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_without_a_task_is_announced_on_the_conversation() {
        let (store, mut events) = spawn_with_events().await;
        let c = ConversationId::new();
        let answer = request(&store, c, &["make"]).await;
        assert!(answer.is_err());

        let requested = events.recv().await.unwrap();
        let EventKind::ApprovalRequested { approval_id, .. } = requested.event else {
            panic!("expected approval_requested, got {requested:?}");
        };
        assert_eq!(
            (requested.conversation_id, requested.task_id),
            (Some(c), None)
        );
        let resolved = events.recv().await.unwrap();
        assert_eq!(resolved.conversation_id, Some(c));
        assert_eq!(resolved.sub_id, None);
        assert_eq!(
            resolved.event,
            EventKind::ApprovalResolved {
                approval_id,
                decision: ApprovalDecision::TimedOut,
            }
        );
        // Exactly one request and one resolution.
        assert!(events.try_recv().is_err());
    }

    // ----- MCP requests -----

    fn elicitation(c: ConversationId) -> Ask {
        Ask {
            conversation_id: c,
            task_id: Some(TaskId::new()),
            command: argv(&["mcp", "everything", "elicitation"]),
            reason: "Your name?".to_owned(),
            subject: ApprovalSubject::McpElicitation {
                server: "everything".into(),
                message: "Your name?".into(),
                schema: troupe_proto::Json(serde_json::json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "tone": {"type": "string", "default": "polite"}
                    },
                    "required": ["name"]
                })),
            },
            workdir: None,
        }
    }

    fn sampling(c: ConversationId, server: &str) -> Ask {
        Ask {
            conversation_id: c,
            task_id: None,
            command: argv(&["mcp", server, "sampling"]),
            reason: "sample".to_owned(),
            subject: ApprovalSubject::McpSampling {
                server: server.into(),
                request: troupe_proto::Json(serde_json::json!({"messages": []})),
            },
            workdir: None,
        }
    }

    #[test]
    fn elicitations_are_never_remembered_nor_shared() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let first = open(&mut core, elicitation(c), 0, 1);
        // The same question again is a second request: each gets its own answer.
        open(&mut core, elicitation(c), 1, 2);
        let decision = ApprovalDecision::ApproveWithContent {
            content: troupe_proto::Json(serde_json::json!({"name": "Ada"})),
        };
        let resolved = core.decide(first, decision, 2).unwrap();
        assert_eq!(resolved.len(), 1);
        assert_eq!(core.keys_len(), 0);
        assert_eq!(core.pending_len(), 1);
        // Even "for the session" leaves no key behind.
        let second = core.pending(None)[0].approval_id;
        let session = ApprovalDecision::ApproveForSession { ttl_secs: None };
        core.decide(
            second,
            ApprovalDecision::ApproveWithContent {
                content: troupe_proto::Json(serde_json::json!({"name": "Bob"})),
            },
            3,
        )
        .unwrap();
        open(&mut core, elicitation(c), 4, 3);
        assert!(matches!(
            core.decide(core.pending(None)[0].approval_id, session, 5),
            Err(AgentError::InvalidInput { .. })
        ));
        assert_eq!(core.keys_len(), 0);
    }

    #[test]
    fn an_agent_question_takes_a_text_answer_and_is_never_remembered() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let question = || Ask {
            conversation_id: c,
            task_id: Some(TaskId::new()),
            command: argv(&["a2a", "remote", "question"]),
            reason: "Which branch?".to_owned(),
            subject: ApprovalSubject::AgentQuestion {
                agent_id: "remote".into(),
                question: "Which branch?".into(),
            },
            workdir: None,
        };
        let id = open(&mut core, question(), 0, 1);
        open(&mut core, question(), 1, 2);
        assert_eq!(
            core.pending_len(),
            2,
            "the same question twice is two requests"
        );
        for wrong in [
            ApprovalDecision::ApproveOnce,
            ApprovalDecision::ApproveForSession { ttl_secs: None },
            ApprovalDecision::ApproveWithContent {
                content: troupe_proto::Json(serde_json::json!({"answer": 3})),
            },
        ] {
            assert!(
                matches!(
                    core.decide(id, wrong, 2),
                    Err(AgentError::InvalidInput { .. })
                ),
                "an approval without a text answer is refused"
            );
        }
        assert_eq!(core.pending_len(), 2);
        let answer = troupe_proto::approval::agent_answer("main");
        let resolved = core.decide(id, answer.clone(), 3).unwrap();
        assert_eq!(resolved.len(), 1);
        assert!(matches!(&resolved[0].answer, Ok(Granted::Decided(d)) if *d == answer));
        assert_eq!(troupe_proto::approval::answer_text(&answer), Some("main"));
        assert_eq!(core.keys_len(), 0);
        let other = core.pending(None)[0].approval_id;
        core.decide(other, ApprovalDecision::Deny { reason: None }, 4)
            .unwrap();
        assert_eq!(core.pending_len(), 0);
    }

    #[test]
    fn an_elicitation_answer_is_resolved_and_a_bad_one_leaves_it_pending() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, elicitation(c), 0, 1);
        // No content, and `name` has no default: refused, still pending.
        let err = core
            .decide(id, ApprovalDecision::ApproveOnce, 1)
            .unwrap_err();
        assert!(err.to_string().contains("`name`"), "{err}");
        let err = core
            .decide(
                id,
                ApprovalDecision::ApproveWithContent {
                    content: troupe_proto::Json(serde_json::json!({"name": 7})),
                },
                1,
            )
            .unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
        assert_eq!(core.pending_len(), 1);
        let resolved = core
            .decide(
                id,
                ApprovalDecision::ApproveWithContent {
                    content: troupe_proto::Json(serde_json::json!({"name": "Ada"})),
                },
                2,
            )
            .unwrap();
        let content = troupe_proto::Json(serde_json::json!({"name": "Ada", "tone": "polite"}));
        assert_eq!(
            resolved[0].answer,
            Ok(Granted::Decided(ApprovalDecision::ApproveWithContent {
                content
            }))
        );
        // A denial declines: the caller reads `ApprovalDenied`.
        let id = open(&mut core, elicitation(c), 3, 2);
        let denied = core
            .decide(id, ApprovalDecision::Deny { reason: None }, 4)
            .unwrap();
        assert!(matches!(
            denied[0].answer,
            Err(AgentError::ApprovalDenied { .. })
        ));
    }

    #[test]
    fn content_answers_elicitations_only() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        for ask in [ask(c, &["make"]), sampling(c, "s")] {
            let id = open(&mut core, ask, 0, 1);
            let err = core
                .decide(
                    id,
                    ApprovalDecision::ApproveWithContent {
                        content: troupe_proto::Json::empty_object(),
                    },
                    1,
                )
                .unwrap_err();
            assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
            assert_eq!(core.pending(None)[0].approval_id, id);
            core.decide(id, ApprovalDecision::ApproveOnce, 2).unwrap();
        }
    }

    #[test]
    fn sampling_keys_are_per_server_and_never_cover_commands() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, sampling(c, "a"), 0, 1);
        let scoped = ApprovalDecision::ApproveForConversation { ttl_secs: None };
        core.decide(id, scoped, 1).unwrap();
        assert!(matches!(
            core.request(sampling(c, "a"), 2, 1_000, 2),
            AskAdmission::Remembered(2)
        ));
        open(&mut core, sampling(c, "b"), 3, 3);
        open(&mut core, sampling(ConversationId::new(), "a"), 3, 4);
        // A command that reads like the request is another question.
        open(&mut core, ask(c, &["mcp", "a", "sampling"]), 4, 5);
        assert_eq!(
            core.live_keys(5)[0].path,
            ["\0mcp", "a", "sampling"].map(str::to_owned)
        );
        // And a command key never answers a sampling request.
        let id = open(&mut core, ask(c, &["mcp", "b", "sampling"]), 5, 6);
        core.decide(
            id,
            ApprovalDecision::ApproveForSession { ttl_secs: None },
            6,
        )
        .unwrap();
        assert!(matches!(
            core.request(sampling(c, "b"), 7, 1_000, 7),
            AskAdmission::Attached(_)
        ));
    }

    #[test]
    fn an_unanswered_mcp_request_times_out_rather_than_being_denied() {
        let c = ConversationId::new();
        let mut core = ApprovalCore::new();
        let id = open(&mut core, elicitation(c), 0, 1);
        let r = core.time_out(id).unwrap();
        assert_eq!(r.decision, ApprovalDecision::TimedOut);
        assert_eq!(r.outcome(), Outcome::TimedOut);
        assert!(
            matches!(
                &r.answer,
                Err(AgentError::Timeout {
                    after_ms: 1_000,
                    ..
                })
            ),
            "{:?}",
            r.answer
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_elicitation_is_announced_with_its_subject_and_answered_with_content() {
        let (store, mut events) = spawn_with_events().await;
        let c = ConversationId::new();
        let ask = elicitation(c);
        let task_id = ask.task_id;
        let (tx, rx) = oneshot::channel();
        store
            .cast(ApprovalMsg::RequestSubject {
                ask,
                timeout: AskTimeout::Store,
                reply: tx.into(),
            })
            .unwrap();
        let listed = only_pending(&store).await;
        assert!(matches!(
            listed.subject,
            ApprovalSubject::McpElicitation { ref message, .. } if message == "Your name?"
        ));
        let requested = events.recv().await.unwrap();
        assert_eq!(requested.task_id, task_id);
        let EventKind::ApprovalRequested { subject, .. } = requested.event else {
            panic!("{requested:?}");
        };
        assert_eq!(subject, listed.subject);
        // A wrong answer is refused and the request waits on.
        let err = respond(&store, listed.approval_id, ApprovalDecision::ApproveOnce).await;
        assert!(
            matches!(err, Err(AgentError::InvalidInput { .. })),
            "{err:?}"
        );
        respond(
            &store,
            listed.approval_id,
            ApprovalDecision::ApproveWithContent {
                content: troupe_proto::Json(serde_json::json!({"name": "Ada"})),
            },
        )
        .await
        .unwrap();
        let Ok(Granted::Decided(ApprovalDecision::ApproveWithContent { content })) =
            rx.await.unwrap()
        else {
            panic!("not accepted");
        };
        assert_eq!(content.0["name"], "Ada");
        assert_eq!(content.0["tone"], "polite");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_pending_when_its_store_failed_is_asked_of_the_next_one() {
        let (first, _) = spawn_store(None).await;
        let (slot, live) = crate::directory::TestSlot::new(first.clone());
        let c = ConversationId::new();
        let asking = tokio::spawn({
            let live = live.clone();
            async move { ask_until_answered(&live, ask(c, &["make"]), None, metrics::Asker::Task).await }
        });
        let before = loop {
            if let Some(p) = pending(&first, None).await.pop() {
                break p;
            }
            tokio::task::yield_now().await;
        };
        first.cast(ApprovalMsg::InjectPanic).unwrap();
        let (second, _) = spawn_store(None).await;
        slot.replace(second.clone());
        let again = loop {
            if let Some(p) = pending(&second, None).await.pop() {
                break p;
            }
            tokio::task::yield_now().await;
        };
        assert_ne!(again.approval_id, before.approval_id);
        assert_eq!(again.command, before.command);
        respond(&second, again.approval_id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        assert_eq!(
            asking.await.unwrap(),
            Some(Ok(Granted::Decided(ApprovalDecision::ApproveOnce)))
        );
        // A store nobody replaces: no answer, rather than a denial.
        let fixed = ServiceRef::fixed(second.clone());
        second.cast(ApprovalMsg::InjectPanic).unwrap();
        let alone = ask_until_answered(&fixed, ask(c, &["make"]), None, metrics::Asker::Mcp);
        assert!(alone.await.is_none());
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(ApprovalMsg);
