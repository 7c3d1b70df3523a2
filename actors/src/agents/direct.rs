//! A dispatch to an in-process agent whose conversation the hub knows: sent straight to that
//! conversation (no worker, no Session in between), and its task's end reported straight to
//! the hub.
//!
//! ```text
//! hub ──ConversationMsg::Dispatch──► agent's conversation ──► task ──► TaskFinished
//!  ▲                                                                        │
//!  └──────────────── AgentHubMsg::Finished (HubAnswer) ─────────────────────┘
//! ```
//!
//! Nothing is lost on the way:
//! - a [`DirectDispatch`] that its conversation never took (it was passivated, it failed and
//!   was restarted, it stopped with the message still in its mailbox) is handed to the
//!   Session on drop (`SessionMsg::Dispatch`), which delivers it as any dispatch: it
//!   reactivates a passivated conversation, holds the message while one is being asked to
//!   passivate, refuses it for one that is gone;
//! - a [`HubAnswer`] dropped unanswered (the conversation stopped while the task was queued
//!   or running) reports `Interrupted` to the hub, as a dispatcher waiting on the Session's
//!   reply would have heard its port close.

use super::DispatchOrigin;
use super::hub::AgentHubMsg;
use super::model::agent_output;
use crate::session::SessionMsg;
use ractor::ActorRef;
use troupe_proto::{AgentError, ConversationId, DispatchId, MessageReply};

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
    use crate::agents::AgentOutput;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::Arc;
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
            item_times_ms: Vec::new(),
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

    async fn hub_session() -> ActorRef<SessionMsg> {
        probe::<SessionMsg>().await.0
    }
}
