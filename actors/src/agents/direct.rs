//! A dispatch to an in-process agent whose conversation the hub knows: sent straight to that
//! conversation (no worker, no Session in between), and answered straight from the agent's
//! task as it ends.
//!
//! ```text
//! hub ──ConversationMsg::Dispatch──► agent's conversation ──► task ──► TaskFinished
//!                                                              │            │
//! dispatcher ◄──── dispatch_result, then the answer ───────────┘            │
//!  hub ◄────────── AgentHubMsg::Finished (HubAnswer): lease returned ◄──────┘
//! ```
//!
//! A dispatch is answered once ([`DispatchReply`]): whoever claims it first answers, the
//! others stay silent. The agent's task claims it as it ends (its `TaskFinished` is sent to its
//! conversation first, so a next dispatch to the agent queues behind it), emits
//! `dispatch_result` in its dispatcher's task and answers; the hub hears the end afterwards
//! from the conversation and returns the lease. The hub claims it for everything else: a
//! refusal, a lease that expired, a dispatcher that was cancelled, an agent reached through its
//! worker, a conversation that stopped before its task ended.
//!
//! Nothing is lost on the way:
//! - a [`DirectDispatch`] that its conversation never took (it was passivated, it failed and
//!   was restarted, it stopped with the message still in its mailbox) is handed to the
//!   Session on drop (`SessionMsg::Dispatch`), which delivers it as any dispatch: it
//!   reactivates a passivated conversation, holds the message while one is being asked to
//!   passivate, refuses it for one that is gone;
//! - a [`HubAnswer`] dropped unanswered (the conversation stopped while the task was queued
//!   or running) reports `Interrupted` to the hub, as a dispatcher waiting on the Session's
//!   reply would have heard its port close; the hub answers then, unless the agent's task did;
//! - a dispatcher whose [`DispatchReply`] every holder dropped unanswered hears that too
//!   ([`DispatchWait::recv`] is `None`).

use super::hub::AgentHubMsg;
use super::model::agent_output;
use super::{AgentOutput, DispatchOrigin, DispatchParent};
use crate::events::{EventDraft, EventSink};
use crate::session::SessionMsg;
use ractor::ActorRef;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;
use tokio::time::Instant;
use troupe_proto::agent::DispatchStatus;
use troupe_proto::{AgentError, ConversationId, DispatchId, EventKind, MessageReply};

/// A dispatch's answer to its dispatcher, given once by whoever claims it first (see the
/// module doc). Cheap to clone: every holder may answer.
#[derive(Clone)]
pub struct DispatchReply {
    claimed: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<Result<AgentOutput, AgentError>>,
}

/// The dispatcher's end of a [`DispatchReply`].
pub struct DispatchWait(mpsc::UnboundedReceiver<Result<AgentOutput, AgentError>>);

/// The right to answer a dispatch, held by the one holder that claimed it.
pub struct Claimed(mpsc::UnboundedSender<Result<AgentOutput, AgentError>>);

impl DispatchReply {
    /// A reply and the dispatcher's wait for it.
    pub fn channel() -> (Self, DispatchWait) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reply = Self {
            claimed: Arc::new(AtomicBool::new(false)),
            tx,
        };
        (reply, DispatchWait(rx))
    }

    /// The right to answer: `Some` for exactly one claim among all the clones.
    pub fn claim(&self) -> Option<Claimed> {
        (!self.claimed.swap(true, Ordering::AcqRel)).then(|| Claimed(self.tx.clone()))
    }

    /// Claims and answers at once (a holder that emits nothing first); `false` if another
    /// holder had claimed it.
    pub fn answer(&self, result: Result<AgentOutput, AgentError>) -> bool {
        self.claim().map(|c| c.send(result)).is_some()
    }
}

impl std::fmt::Debug for DispatchReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchReply")
            .field("claimed", &self.claimed.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl Claimed {
    /// Answers the dispatcher (who may have stopped waiting).
    pub fn send(self, result: Result<AgentOutput, AgentError>) {
        let _ = self.0.send(result);
    }
}

impl DispatchWait {
    /// The answer; `None` when every holder dropped the reply unanswered.
    pub async fn recv(mut self) -> Option<Result<AgentOutput, AgentError>> {
        self.0.recv().await
    }
}

/// `dispatch_result` of a dispatch that ended with `result` after `took`: its status and the
/// event, whoever ends it (the hub, or the agent's task of a direct dispatch).
pub fn result_event(
    dispatch_id: DispatchId,
    agent_id: String,
    provider_session_id: Option<String>,
    result: &Result<AgentOutput, AgentError>,
    status: DispatchStatus,
    took: std::time::Duration,
) -> EventKind {
    EventKind::DispatchResult {
        dispatch_id,
        agent_id,
        provider_session_id,
        status,
        text: result.as_ref().map(|o| o.text.clone()).unwrap_or_default(),
        error: result.as_ref().err().cloned(),
        duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
    }
}

/// The status of a dispatch that its agent ended with `result`.
pub fn status_of(result: &Result<AgentOutput, AgentError>) -> DispatchStatus {
    match result {
        Ok(_) => DispatchStatus::Ok,
        Err(e) => DispatchStatus::of_error(e),
    }
}

/// What an agent's task of a direct dispatch needs to answer its dispatcher itself.
#[derive(Debug, Clone)]
pub struct DirectEnd {
    pub reply: DispatchReply,
    /// The dispatcher's task: `dispatch_result` is one of its events.
    pub parent: DispatchParent,
    /// The agent's conversation.
    pub provider_session_id: String,
    /// When the hub admitted the dispatch (`duration_ms`).
    pub started: Instant,
}

/// Ends a direct dispatch with its agent's task's `result`, unless the hub ended it first (a
/// lease that expired, a dispatcher that was cancelled): `dispatch_result` in the dispatcher's
/// task, then the answer. `false` when the hub had ended it.
pub fn end_direct(
    origin: &DispatchOrigin,
    events: &EventSink,
    result: Result<AgentOutput, AgentError>,
) -> bool {
    let Some(end) = &origin.direct else {
        return false;
    };
    let Some(claimed) = end.reply.claim() else {
        return false;
    };
    let event = result_event(
        origin.dispatch_id,
        origin.agent_id.clone(),
        Some(end.provider_session_id.clone()),
        &result,
        status_of(&result),
        end.started.elapsed(),
    );
    origin.span.in_scope(|| {
        events.emit(EventDraft::task(
            end.parent.conversation_id,
            end.parent.task_id,
            event,
        ));
    });
    claimed.send(result);
    true
}

/// Where an agent's task's end goes when its dispatch came from the hub directly.
pub struct HubAnswer {
    hub: ActorRef<AgentHubMsg>,
    dispatch_id: DispatchId,
    sent: bool,
}

impl HubAnswer {
    pub fn new(hub: ActorRef<AgentHubMsg>, dispatch_id: DispatchId) -> Self {
        Self {
            hub,
            dispatch_id,
            sent: false,
        }
    }

    /// Reports the task's end to the hub (`Finished`); `false` if the hub is gone.
    pub fn send(mut self, reply: Result<MessageReply, AgentError>) -> bool {
        self.sent = true;
        self.hub
            .cast(AgentHubMsg::Finished {
                dispatch_id: self.dispatch_id,
                result: reply.and_then(agent_output),
            })
            .is_ok()
    }
}

impl Drop for HubAnswer {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.hub.cast(AgentHubMsg::Finished {
                dispatch_id: self.dispatch_id,
                result: Err(AgentError::interrupted(
                    "the agent's conversation stopped before answering",
                )),
            });
        }
    }
}

/// A dispatch on its way to its agent's conversation.
pub struct DirectDispatch {
    inner: Option<Parts>,
}

/// What the conversation runs: a task for `text`, carrying its dispatch.
pub struct Parts {
    /// Where it goes if its conversation does not take it.
    session: ActorRef<SessionMsg>,
    conversation_id: ConversationId,
    pub text: String,
    pub origin: DispatchOrigin,
    pub answer: HubAnswer,
}

impl DirectDispatch {
    pub fn new(
        session: ActorRef<SessionMsg>,
        conversation_id: ConversationId,
        text: String,
        origin: DispatchOrigin,
        answer: HubAnswer,
    ) -> Self {
        Self {
            inner: Some(Parts {
                session,
                conversation_id,
                text,
                origin,
                answer,
            }),
        }
    }

    /// Taken by its conversation: from now on its end is the task's.
    pub fn take(mut self) -> Option<Parts> {
        self.inner.take()
    }
}

impl Drop for DirectDispatch {
    fn drop(&mut self) {
        if let Some(parts) = self.inner.take() {
            tracing::debug!(conversation_id = %parts.conversation_id, dispatch_id = %parts.origin.dispatch_id, "dispatch not taken by its conversation: delivered through the session");
            // A Session that is gone drops it in turn: the answer reports `Interrupted`.
            let _ = parts.session.cast(SessionMsg::Dispatch {
                conversation_id: parts.conversation_id,
                text: parts.text,
                origin: parts.origin,
                reply: crate::conversation::Answer::Hub(parts.answer),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::time::Duration;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;
    use troupe_proto::agent::ExecutionChain;
    use troupe_proto::{TaskId, TaskStats, TaskStatus};

    /// An actor that passes whatever it receives on to a channel.
    struct Probe<M>(std::marker::PhantomData<fn() -> M>);

    #[ractor::async_trait]
    impl<M: ractor::Message> Actor for Probe<M> {
        type Msg = M;
        type State = mpsc::UnboundedSender<M>;
        type Arguments = mpsc::UnboundedSender<M>;

        async fn pre_start(
            &self,
            _myself: ActorRef<M>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle(
            &self,
            _myself: ActorRef<M>,
            msg: M,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let _ = tx.send(msg);
            Ok(())
        }
    }

    async fn probe<M: ractor::Message>() -> (ActorRef<M>, mpsc::UnboundedReceiver<M>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (actor, _) = Actor::spawn(None, Probe(std::marker::PhantomData), tx)
            .await
            .unwrap();
        (actor, rx)
    }

    async fn next<M>(rx: &mut mpsc::UnboundedReceiver<M>) -> M {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a message in time")
            .expect("a message")
    }

    fn origin(dispatch_id: DispatchId) -> DispatchOrigin {
        DispatchOrigin {
            dispatch_id,
            agent_id: "coder".into(),
            chain: ExecutionChain::start("supervisor").then("coder"),
            cancel: CancellationToken::new(),
            span: tracing::Span::none(),
            governance: Arc::new(crate::governance::TaskGovernance::default()),
            slot_lent: true,
            direct: None,
        }
    }

    fn finished(msg: AgentHubMsg) -> (DispatchId, Result<AgentOutput, AgentError>) {
        match msg {
            AgentHubMsg::Finished {
                dispatch_id,
                result,
            } => (dispatch_id, result),
            _ => panic!("not a Finished"),
        }
    }

    #[tokio::test]
    async fn a_dispatch_its_conversation_did_not_take_goes_through_the_session() {
        let (hub, mut hub_rx) = probe::<AgentHubMsg>().await;
        let (session, mut session_rx) = probe::<SessionMsg>().await;
        let (conversation, _conversation_rx) =
            probe::<crate::conversation::ConversationMsg>().await;
        // Its actor stopped (passivated) after the hub looked at it.
        conversation.stop(None);
        while conversation.get_status() != ractor::ActorStatus::Stopped {
            tokio::task::yield_now().await;
        }
        let (id, dispatch_id) = (ConversationId::new(), DispatchId::new());
        let direct = DirectDispatch::new(
            session.clone(),
            id,
            "fix it".into(),
            origin(dispatch_id),
            HubAnswer::new(hub.clone(), dispatch_id),
        );
        let _ = conversation.cast(crate::conversation::ConversationMsg::Dispatch(direct));
        let SessionMsg::Dispatch {
            conversation_id,
            text,
            origin,
            reply,
        } = next(&mut session_rx).await
        else {
            panic!("not a Dispatch");
        };
        assert_eq!((conversation_id, text.as_str()), (id, "fix it"));
        assert_eq!(origin.dispatch_id, dispatch_id);
        assert!(hub_rx.try_recv().is_err(), "nothing told the hub yet");
        // The Session's answer is the hub's: the task's end reaches it.
        let reply = crate::conversation::Answer::Hub(match reply {
            crate::conversation::Answer::Hub(answer) => answer,
            crate::conversation::Answer::Port(_) => panic!("the hub's answer was lost"),
        });
        assert!(reply.send(Ok(MessageReply {
            conversation_id: id,
            task_id: TaskId::new(),
            status: TaskStatus::Ok,
            text: "fixed".into(),
            stats: TaskStats::default(),
            error: None,
            items: Vec::new(),
        })));
        let (at, result) = finished(next(&mut hub_rx).await);
        assert_eq!(at, dispatch_id);
        assert_eq!(result.expect("an answer").text, "fixed");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(hub_rx.try_recv().is_err(), "answered once");
    }

    #[tokio::test]
    async fn an_answer_dropped_unsent_tells_the_hub_its_dispatch_was_interrupted() {
        let (hub, mut hub_rx) = probe::<AgentHubMsg>().await;
        let (session, _session_rx) = probe::<SessionMsg>().await;
        // The Session is gone too: the dispatch it cannot take ends interrupted.
        session.stop(None);
        while session.get_status() != ractor::ActorStatus::Stopped {
            tokio::task::yield_now().await;
        }
        let dispatch_id = DispatchId::new();
        drop(DirectDispatch::new(
            session,
            ConversationId::new(),
            "fix it".into(),
            origin(dispatch_id),
            HubAnswer::new(hub.clone(), dispatch_id),
        ));
        let (at, result) = finished(next(&mut hub_rx).await);
        assert_eq!(at, dispatch_id);
        assert!(
            matches!(result, Err(AgentError::Interrupted { .. })),
            "{result:?}"
        );

        // Taken by its conversation, which stops before the task ends.
        let dispatch_id = DispatchId::new();
        let parts = DirectDispatch::new(
            hub_session().await,
            ConversationId::new(),
            "fix it".into(),
            origin(dispatch_id),
            HubAnswer::new(hub, dispatch_id),
        )
        .take()
        .expect("its parts");
        drop(parts);
        let (at, result) = finished(next(&mut hub_rx).await);
        assert_eq!(at, dispatch_id);
        assert!(
            matches!(result, Err(AgentError::Interrupted { .. })),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_dispatch_is_answered_once_by_whoever_claims_it_first() {
        let output = |text: &str| AgentOutput {
            text: text.into(),
            usage: None,
        };
        let (hub, wait) = DispatchReply::channel();
        let agent = hub.clone();
        assert!(agent.answer(Ok(output("from the agent"))));
        assert!(hub.claim().is_none(), "claimed already");
        assert!(!hub.answer(Ok(output("from the hub"))));
        drop((hub, agent));
        let answer = wait.recv().await.expect("an answer");
        assert_eq!(answer.expect("ok").text, "from the agent");

        // Nobody answered: the dispatcher hears it when the last holder is gone.
        let (hub, wait) = DispatchReply::channel();
        let agent = hub.clone();
        drop(hub);
        let waiting = tokio::spawn(wait.recv());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one holder left: still waiting");
        drop(agent);
        assert!(waiting.await.unwrap().is_none());
    }

    fn direct_origin(
        dispatch_id: DispatchId,
        reply: &DispatchReply,
    ) -> (DispatchOrigin, DispatchParent) {
        let parent = DispatchParent {
            conversation_id: ConversationId::new(),
            task_id: TaskId::new(),
        };
        let mut origin = origin(dispatch_id);
        origin.direct = Some(DirectEnd {
            reply: reply.clone(),
            parent,
            provider_session_id: "agent-conversation".into(),
            started: Instant::now(),
        });
        (origin, parent)
    }

    #[tokio::test]
    async fn an_agents_task_ends_its_direct_dispatch_result_first_then_answer() {
        let (rollout, mut rollout_rx) = probe::<crate::rollout::RolloutMsg>().await;
        let events = EventSink::new(rollout);
        let dispatch_id = DispatchId::new();
        let (reply, wait) = DispatchReply::channel();
        let (ends, parent) = direct_origin(dispatch_id, &reply);
        assert!(end_direct(
            &ends,
            &events,
            Ok(AgentOutput {
                text: "fixed".into(),
                usage: None
            })
        ));
        let crate::rollout::RolloutMsg::Emit { draft } = next(&mut rollout_rx).await else {
            panic!("not an event");
        };
        // The dispatcher's task's event, naming the agent's conversation.
        assert_eq!(
            (draft.conversation_id, draft.task_id),
            (Some(parent.conversation_id), Some(parent.task_id))
        );
        match draft.event {
            EventKind::DispatchResult {
                dispatch_id: id,
                agent_id,
                provider_session_id,
                status,
                text,
                error,
                ..
            } => {
                assert_eq!((id, agent_id.as_str()), (dispatch_id, "coder"));
                assert_eq!(provider_session_id.as_deref(), Some("agent-conversation"));
                assert_eq!(
                    (status, text.as_str(), error),
                    (DispatchStatus::Ok, "fixed", None)
                );
            }
            other => panic!("not a dispatch_result: {other:?}"),
        }
        drop((ends, reply));
        assert_eq!(wait.recv().await.unwrap().unwrap().text, "fixed");

        // The hub ended it first (its lease expired): the task's end says nothing.
        let (reply, wait) = DispatchReply::channel();
        let (late, _) = direct_origin(DispatchId::new(), &reply);
        assert!(reply.answer(Err(AgentError::cancelled("expired"))));
        assert!(!end_direct(
            &late,
            &events,
            Ok(AgentOutput {
                text: "late".into(),
                usage: None
            })
        ));
        drop((late, reply));
        assert!(matches!(
            wait.recv().await,
            Some(Err(AgentError::Cancelled { .. }))
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(rollout_rx.try_recv().is_err(), "no second dispatch_result");

        // A dispatch the hub answers (through its worker) is not the task's to end.
        let (reply, _wait) = DispatchReply::channel();
        assert!(!end_direct(
            &origin(DispatchId::new()),
            &events,
            Err(AgentError::cancelled("x"))
        ));
        assert!(reply.claim().is_some());
    }

    async fn hub_session() -> ActorRef<SessionMsg> {
        probe::<SessionMsg>().await.0
    }
}
