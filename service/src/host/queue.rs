//! The durable queue: admitting a message, storing it, running it, storing its outcome, and
//! starting the next one of its conversation.

use super::{
    HostMsg, HostState, Liveness, Reply, Running, Waiting, now_ms, plan, spawn_traced,
    stored_content,
};
use crate::admission::{Admitted, Load, admit};
use crate::api::Sent;
use crate::metrics;
use ractor::ActorRef;
use std::time::Duration;
use troupe_actors::events::EventDraft;
use troupe_actors::governance::RequestGovernance;
use troupe_actors::task::StoredGate;
use troupe_proto::store::{
    ConversationState, FinishMessage, FinishedMessage, MessageKind, MessageRecord, MessageStatus,
    NewMessage, SessionStatus,
};
use troupe_proto::{
    AgentError, ConversationId, ErrorKind, EventKind, MessageReply, Role, StoragePolicy,
};

/// The pauses before a queue's store write that failed (a busy database, a dropped
/// connection) is tried again: so a message's row does not stay `queued` or `running` until
/// the next start because of a moment's failure. A write the store refused for what it holds
/// (a message already ended) is not tried again.
const WRITE_RETRIES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(800),
];

/// `write`, tried again after each pause of [`WRITE_RETRIES`] while it fails `Internal`.
async fn retried<T, F>(
    what: &'static str,
    message_id: u64,
    mut write: impl FnMut() -> F,
) -> Result<T, AgentError>
where
    F: std::future::Future<Output = Result<T, AgentError>>,
{
    let mut pauses = WRITE_RETRIES.iter();
    loop {
        match write().await {
            Err(e) if e.kind() == ErrorKind::Internal => {
                let Some(pause) = pauses.next() else {
                    return Err(e);
                };
                tracing::warn!(message_id, what, error = %e, "store write failed; trying again");
                tokio::time::sleep(*pause).await;
            }
            done => return done,
        }
    }
}

/// The request layer a stored message keeps in its metadata (none: it had none), and whether
/// a program sent it. A layer that cannot be read is an error: the message must not run
/// without the restrictions it was sent with.
pub(super) fn stored_governance(message: &MessageRecord) -> Result<RequestGovernance, AgentError> {
    let metadata = message.metadata.as_ref().map(|m| &m.0);
    let tools = match metadata.and_then(|m| m.get("tools")) {
        None => None,
        Some(tools) => serde_json::from_value(tools.clone()).map_err(|e| {
            AgentError::internal(format!(
                "the tool policy this message was sent with (its request layer) cannot be read ({e}); it is not run without it"
            ))
        })?,
    };
    let peer = metadata.is_some_and(|m| {
        m.get("module").is_some() || m.get("from_peer") == Some(&serde_json::Value::Bool(true))
    });
    Ok(RequestGovernance {
        tools,
        authorization: Vec::new(),
        peer,
    })
}

/// A message's metadata: its request layer of the tool policy (`tools`), the module it came
/// from (`module`) or that a peer sent it (`from_peer`), when it has them.
fn stored_metadata(
    governance: &RequestGovernance,
    module: Option<serde_json::Value>,
) -> Option<troupe_proto::Json> {
    let mut metadata = serde_json::Map::new();
    if let Some(tools) = &governance.tools {
        metadata.insert("tools".into(), serde_json::json!(tools));
    }
    if governance.peer && module.is_none() {
        metadata.insert("from_peer".into(), serde_json::Value::Bool(true));
    }
    if let Some(module) = module {
        metadata.insert("module".into(), module);
    }
    (!metadata.is_empty()).then(|| troupe_proto::Json(serde_json::Value::Object(metadata)))
}

impl HostState {
    pub(super) async fn send(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: Option<ConversationId>,
        (text, wait, module): (String, bool, Option<serde_json::Value>),
        governance: RequestGovernance,
        accepted: Option<tokio::sync::oneshot::Sender<MessageRecord>>,
        reply: Reply<Sent>,
    ) {
        // A module's text is a program's, whatever its sender said.
        let governance = RequestGovernance {
            peer: governance.peer || module.is_some(),
            ..governance
        };
        let conversation_id = conversation_id.unwrap_or(self.record.root_conversation_id);
        let admitted = match &self.session {
            Liveness::Down(e) => Err(e.clone()),
            Liveness::Up(_) | Liveness::Restarting => self.admit(conversation_id),
        };
        let (admission, policy) = match admitted {
            Ok(a) => a,
            Err(e) => {
                metrics::message_refused(&e);
                let _ = reply.send(Err(e));
                return;
            }
        };
        // While the session restarts (or its run is being stopped), what would run now waits
        // for it instead.
        let admission = match (self.live_run(), admission) {
            (Some(_), a) => a,
            (None, _) => Admitted::Queue,
        };
        let status = match admission {
            Admitted::RunNow => MessageStatus::Running,
            Admitted::Queue => MessageStatus::Queued,
        };
        let (content, chars) = stored_content(policy, &text);
        let metadata = stored_metadata(&governance, module);
        // A message that runs now starts its task while its row is written: the write takes
        // about as long as the task's way to its model request. The task acts on nothing
        // before the row is stored ([`StoredGate`]). Its caller hears of it only once the row
        // is stored (below); a write that fails cancels the task, and nothing of the message
        // is run or stored. Its `running` update is emitted once the row is stored, so the
        // task's `task_started` may come before it.
        let (started, pending, signal) = match admission {
            Admitted::RunNow => {
                let (signal, gate) = StoredGate::new();
                let started = self.dispatch(
                    myself,
                    conversation_id,
                    None,
                    (text, governance),
                    None,
                    Some(gate),
                );
                (started, None, Some(signal))
            }
            Admitted::Queue => (false, Some((text, governance)), None),
        };
        let stored = self
            .store
            .append_message(NewMessage {
                session_id: self.record.session_id,
                conversation_id,
                task_id: None,
                role: Role::User,
                content,
                chars,
                created_ms: now_ms(),
                status: Some(status),
                kind: MessageKind::Text,
                // Its request layer, so that it still applies if the message waits through a
                // restart (a policy, not content; never a token), and the module it came from.
                metadata,
            })
            .await;
        if let Some(signal) = signal {
            signal.stored(stored.is_ok());
        }
        let message = match stored {
            Ok(m) => m,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        metrics::message_accepted(status);
        if let Some(accepted) = accepted {
            let _ = accepted.send(message.clone());
        }
        // Stored already running: its start is this (a queued one's is when it starts).
        if status == MessageStatus::Running {
            self.emit_update(&message);
        }
        // The store made the session active with the message (P1).
        self.record.status = SessionStatus::Active;
        let waiter = if wait {
            Some(reply)
        } else {
            let _ = reply.send(Ok(Sent {
                message: message.clone(),
                reply: None,
                assistant: None,
            }));
            None
        };
        let Some(slot) = self.conversations.get_mut(&conversation_id) else {
            return;
        };
        match pending {
            None => match &mut slot.running {
                Some(running) if started && running.message.is_none() => {
                    running.message = Some(message);
                    running.waiter = waiter;
                }
                _ => {
                    // Not reached: a message that runs now is up and its slot idle (`admit`).
                    // Stored running, it is ended rather than left so.
                    let e = AgentError::internal("its task could not be started");
                    let sent = self.finish(message, Err(e)).await;
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(sent);
                    }
                }
            },
            Some((text, governance)) => slot.queue.push_back(Waiting {
                message,
                text,
                governance,
                waiter,
                refused_starts: 0,
            }),
        }
    }

    /// The admission decision for a message to `conversation_id`, and its storage policy.
    pub(super) fn admit(
        &self,
        conversation_id: ConversationId,
    ) -> Result<(Admitted, StoragePolicy), AgentError> {
        let slot = self
            .conversations
            .get(&conversation_id)
            .filter(|c| c.record.state == ConversationState::Open && !c.closing)
            .ok_or_else(|| AgentError::not_found("conversation", conversation_id))?;
        let load = Load {
            draining: self.draining,
            conversation_pending: slot.pending(),
            busy_conversations: self
                .conversations
                .values()
                .filter(|c| c.pending() > 0)
                .count(),
        };
        let admitted = admit(self.limits, load)?;
        Ok((admitted, slot.record.params.storage_policy))
    }

    /// Starts a compaction when the session may take it: it takes a scheduler place (or waits
    /// behind the conversation's running message) like a message, so it is admitted like one
    /// and counted until it ends; nothing is stored for it.
    pub(super) fn compact(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        reply: Reply<MessageReply>,
    ) {
        let admitted = self
            .admit(conversation_id)
            .and_then(|_| self.running().cloned());
        let handle = match admitted {
            Ok(handle) => handle,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if let Some(slot) = self.conversations.get_mut(&conversation_id) {
            slot.compactions = slot.compactions.saturating_add(1);
        }
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle.compact(conversation_id).await;
            let _ = myself.cast(HostMsg::CompactDone {
                conversation_id,
                result,
                reply,
            });
        });
    }

    /// A compaction ended: the conversation's next message may start.
    pub(super) async fn compact_done(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
    ) {
        if let Some(slot) = self.conversations.get_mut(&conversation_id) {
            slot.compactions = slot.compactions.saturating_sub(1);
        }
        self.run_next(myself, conversation_id).await;
        self.maybe_drained();
    }

    /// Starts a message's task: `message` is its row, stored `running` already, or `None`
    /// while it is being written ([`Self::send`]: the task then waits at `gate` for it).
    /// Whether it started: only an up session runs tasks.
    pub(super) fn dispatch(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        message: Option<MessageRecord>,
        (text, governance): (String, RequestGovernance),
        waiter: Option<Reply<Sent>>,
        gate: Option<StoredGate>,
    ) -> bool {
        let Some(slot) = self.conversations.get_mut(&conversation_id) else {
            return false;
        };
        let Liveness::Up(handle) = &self.session else {
            // Not reached: only an up session runs messages. Kept in line, not lost.
            if let Some(message) = message {
                slot.queue.push_front(Waiting {
                    message,
                    text,
                    governance,
                    waiter,
                    refused_starts: 0,
                });
            }
            return false;
        };
        let handle = handle.clone();
        self.dispatches += 1;
        let dispatch = self.dispatches;
        slot.running = Some(Box::new(Running {
            dispatch,
            message,
            waiter,
        }));
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle
                .message_stored_later(conversation_id, text, governance, gate)
                .await;
            if matches!(&result, Err(e) if e.kind() == ErrorKind::Interrupted) {
                // Interrupted by the run's end, perhaps: its conversations stop before it
                // does. The outcome then reaches the host after the run's end, so that its
                // update goes to the run that replaces it ([`HostState::emit_update`]). A run
                // that keeps going (only the conversation was restarted) delays it this long.
                let _ = handle.actor().get_cell().wait(Some(RUN_END_WAIT)).await;
            }
            let _ = myself.cast(HostMsg::TaskDone {
                conversation_id,
                dispatch,
                result,
            });
        });
        true
    }

    /// Starts the conversation's next queued message, if it is idle and may.
    pub(super) async fn run_next(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
    ) {
        loop {
            if self.draining || self.live_run().is_none() {
                return;
            }
            let Some(slot) = self.conversations.get_mut(&conversation_id) else {
                return;
            };
            if slot.running.is_some() || slot.closing || slot.compactions > 0 {
                return;
            }
            let Some(next) = slot.queue.pop_front() else {
                return;
            };
            let message_id = next.message.message_id;
            let store = &self.store;
            // A message kept after a refused start is tried once per retry (the retries are
            // the backoff) and never failed for it: its caller was told it would run.
            let started = if next.refused_starts == 0 {
                retried("start", message_id, || store.start_message(message_id)).await
            } else {
                store.start_message(message_id).await
            };
            let e = match started {
                Ok(message) => {
                    self.emit_update(&message);
                    self.dispatch(
                        myself,
                        conversation_id,
                        Some(message),
                        (next.text, next.governance),
                        next.waiter,
                        None,
                    );
                    return;
                }
                Err(e) => e,
            };
            tracing::error!(message_id, error = %e, "queued message could not start");
            let Waiting {
                message,
                text,
                governance,
                waiter,
                refused_starts,
            } = next;
            let stays = match plan::retried_start(refused_starts, e.kind()) {
                plan::RetriedStart::Fail => match self.fail_unstarted(message.clone(), e).await {
                    Ok(answer) => {
                        self.reply_failed(waiter, answer);
                        continue;
                    }
                    Err(e) => e,
                },
                plan::RetriedStart::Again => e,
                plan::RetriedStart::Gone => {
                    // Ended or removed meanwhile (cancelled by another node's host, say):
                    // nothing of it is left to run, and its caller was answered already.
                    tracing::warn!(message_id, error = %e, "a queued message kept after a refused start is no longer queued");
                    continue;
                }
            };
            // The store still holds it queued: it keeps its place, and its start is tried
            // again later.
            let Some(slot) = self.conversations.get_mut(&conversation_id) else {
                self.reply_failed(waiter, unstarted_stays_queued(message_id, &stays, None));
                return;
            };
            let delay = plan::start_retry_delay(refused_starts);
            slot.queue.push_front(Waiting {
                message,
                text,
                governance,
                waiter: None,
                refused_starts: refused_starts.saturating_add(1),
            });
            if !slot.retry_pending {
                slot.retry_pending = true;
                myself.send_after(delay, move || HostMsg::StartQueued { conversation_id });
            }
            self.reply_failed(
                waiter,
                unstarted_stays_queued(message_id, &stays, Some(delay)),
            );
            return;
        }
    }

    /// Ends a queued message whose start the store would not write `failed` with that error,
    /// so that it does not run after the next start either: `Ok` with what its caller hears
    /// (the start's error); `Err` with that error when the failure could not be written
    /// either and the store still holds the message `queued` (it stays queued, and
    /// [`Self::run_next`] keeps it first in line and tries its start again).
    async fn fail_unstarted(
        &mut self,
        message: MessageRecord,
        e: AgentError,
    ) -> Result<AgentError, AgentError> {
        let failed = Err(e.clone());
        let written = self.store_outcome(&message, &failed).await;
        match plan::unstarted(written.as_ref().map(drop).map_err(AgentError::kind)) {
            plan::Unstarted::Failed => {
                // Settled here only when this write ended it (not when it had ended before).
                if written.is_ok() {
                    self.outcome_settled(&message, &failed);
                }
                Ok(e)
            }
            plan::Unstarted::StaysQueued => Err(e),
        }
    }

    pub(super) async fn task_done(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        dispatch: u64,
        result: Result<MessageReply, AgentError>,
    ) {
        let running = self
            .conversations
            .get_mut(&conversation_id)
            .and_then(|slot| slot.running.take_if(|r| r.dispatch == dispatch));
        let Some(running) = running else {
            return;
        };
        let Running {
            message, waiter, ..
        } = *running;
        // A message whose row could not be written has nothing to settle: its caller was
        // told the write's error, and its task was cancelled before acting on anything. The
        // session's status no longer counts it.
        if let Some(message) = message {
            let finished = self.finish(message, result).await;
            if let Some(waiter) = waiter {
                let _ = waiter.send(finished);
            }
        } else {
            let status = self.status_after(None);
            self.set_status(status).await;
        }
        self.run_next(myself, conversation_id).await;
        self.forget_if_closed(conversation_id);
        self.maybe_drained();
    }

    /// Stores a message's outcome (and its reply, when its task answered), emits
    /// `message_updated`, and gives back what a waiting caller gets.
    pub(super) async fn finish(
        &mut self,
        message: MessageRecord,
        result: Result<MessageReply, AgentError>,
    ) -> Result<Sent, AgentError> {
        let stored = self.store_outcome(&message, &result).await;
        self.outcome_settled(&message, &result);
        let done = stored?;
        result.map(|r| Sent {
            message: done.message,
            reply: Some(r),
            assistant: done.reply,
        })
    }

    /// Writes a message's outcome (tried again while the store fails for a moment); once
    /// written, the session's status follows it and `message_updated` is emitted.
    async fn store_outcome(
        &mut self,
        message: &MessageRecord,
        result: &Result<MessageReply, AgentError>,
    ) -> Result<FinishedMessage, AgentError> {
        let status = plan::outcome(result);
        let policy = self
            .conversations
            .get(&message.conversation_id)
            .map_or(StoragePolicy::None, |c| c.record.params.storage_policy);
        let at = now_ms();
        let items = plan::exchange(message, result, status, policy, at);
        // Only an answer is a reply: a task that ended otherwise (cancelled, failed, out of
        // steps is an answer) leaves its text with the exchange and its status message.
        let reply = result
            .as_ref()
            .ok()
            .filter(|_| status == MessageStatus::Completed)
            .map(|r| {
                let (content, chars) = stored_content(policy, &r.text);
                NewMessage {
                    session_id: message.session_id,
                    conversation_id: message.conversation_id,
                    task_id: Some(r.task_id),
                    role: Role::Assistant,
                    content,
                    chars,
                    created_ms: at,
                    status: None,
                    kind: MessageKind::Text,
                    metadata: None,
                }
            });
        let finish = FinishMessage {
            message_id: message.message_id,
            status,
            task_id: result.as_ref().ok().map(|r| r.task_id),
            items,
            reply,
            session_status: Some(self.status_after(Some(status))),
        };
        let finish_status = finish.session_status;
        let store = &self.store;
        let stored = retried("finish", message.message_id, || {
            store.finish_message(finish.clone())
        })
        .await;
        match &stored {
            Ok(done) => {
                if let Some(s) = finish_status {
                    self.record.status = s;
                }
                self.emit_update(&done.message);
                tracing::debug!(
                    message_id = message.message_id,
                    status = status.as_str(),
                    "message ended"
                );
            }
            Err(e) => {
                tracing::error!(message_id = message.message_id, error = %e, "message outcome not stored");
            }
        }
        stored
    }

    /// What follows a message's end besides the store: a module's message has its reply go
    /// to the modules, however it ended (live, after a restart, or aborted by one), and the
    /// outcome is counted.
    fn outcome_settled(&self, message: &MessageRecord, result: &Result<MessageReply, AgentError>) {
        if let (Some(modules), Some(origin)) = (
            &self.template.modules,
            crate::modules::frame::ReplyOrigin::of(message),
        ) {
            modules.route_reply_later(origin, result.clone());
        }
        metrics::message_finished(plan::outcome(result));
    }

    /// The session's status once `ended` ended (P1, [`plan::session_status`]): the messages
    /// still held by the conversations (queued or running) keep it active.
    pub(super) fn status_after(&self, ended: Option<MessageStatus>) -> SessionStatus {
        let pending = self
            .conversations
            .values()
            .map(super::ConversationSlot::pending)
            .sum::<usize>();
        plan::session_status(pending, ended, self.record.status)
    }

    /// Stores `status` as the session's if it is not already.
    pub(super) async fn set_status(&mut self, status: SessionStatus) {
        if status == self.record.status {
            return;
        }
        let session_id = self.record.session_id;
        match self
            .store
            .set_session_status(session_id, status, now_ms())
            .await
        {
            Ok(()) => {
                tracing::debug!(%session_id, status = status.as_str(), "session status");
                self.record.status = status;
            }
            Err(e) => {
                tracing::warn!(%session_id, status = status.as_str(), error = %e, "session status not stored");
            }
        }
    }

    /// Publishes a message's status on the session's event stream; while the session is
    /// being started again, once it is up ([`Self::emit_deferred`]). So too when its run is
    /// stopping although the host has not heard yet ([`plan::takes_events`]): the outcome of
    /// a task a killed run ended waits for the run's end ([`RUN_END_WAIT`]), but past that wait
    /// it reaches the host first.
    pub(super) fn emit_update(&mut self, message: &MessageRecord) {
        match &self.session {
            Liveness::Up(handle) if plan::takes_events(handle.actor().get_status()) => {
                self.emit_now(message);
            }
            Liveness::Up(_) | Liveness::Restarting => self.deferred_updates.push(message.clone()),
            Liveness::Down(_) => {}
        }
    }

    /// Emits the updates deferred while the session was being started again, in order.
    pub(super) fn emit_deferred(&mut self) {
        for message in std::mem::take(&mut self.deferred_updates) {
            self.emit_now(&message);
        }
    }

    fn emit_now(&self, message: &MessageRecord) {
        let (Liveness::Up(handle), Some(status)) = (&self.session, message.status) else {
            return;
        };
        handle.emit(EventDraft::conversation(
            message.conversation_id,
            EventKind::MessageUpdated {
                message_id: message.message_id,
                status,
                task_id: message.task_id,
                reply_message_id: message.reply_message_id,
            },
        ));
    }

    pub(super) fn reply_failed(&self, waiter: Option<Reply<Sent>>, e: AgentError) {
        if let Some(w) = waiter {
            let _ = w.send(Err(e));
        }
    }

    /// Ends every queued message with `failed` (the session cannot run them).
    pub(super) async fn fail_queued(&mut self, e: &AgentError) {
        let queued: Vec<Waiting> = self
            .conversations
            .values_mut()
            .flat_map(|c| c.queue.drain(..))
            .collect();
        for w in queued {
            let sent = self.finish(w.message, Err(e.clone())).await;
            if let Some(waiter) = w.waiter {
                let _ = waiter.send(sent);
            }
        }
    }
}

/// How long the outcome of a task interrupted under a running session waits for that run
/// to end, if it is ending.
const RUN_END_WAIT: Duration = Duration::from_millis(200);

/// What the caller of queued message `message_id` hears when neither its start nor its
/// failure (`e`) could be written: the store still holds it `queued`, so its start is tried
/// again after `retry` (when its host still holds its conversation), and it runs when its
/// session next starts, as after a stop, if that comes first.
fn unstarted_stays_queued(
    message_id: u64,
    e: &AgentError,
    retry: Option<std::time::Duration>,
) -> AgentError {
    let when = match retry {
        Some(delay) => format!(
            "its start is tried again in {} s, and at the next start of its session",
            delay.as_secs()
        ),
        None => "it runs at the next start of its session".to_owned(),
    };
    AgentError::interrupted(format!(
        "message {message_id} could not be started and its failure could not be stored ({e}): \
         it stays queued in the store and {when} (read it for its outcome; do not send it \
         again)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use troupe_proto::Json;

    fn stored_with(metadata: Option<troupe_proto::Json>) -> MessageRecord {
        MessageRecord {
            message_id: 1,
            session_id: troupe_proto::SessionId::new(),
            conversation_id: ConversationId::new(),
            task_id: None,
            role: troupe_proto::Role::User,
            content: Some("/hub coder go".into()),
            chars: 13,
            created_ms: 0,
            status: None,
            reply_message_id: None,
            kind: Default::default(),
            metadata,
        }
    }

    /// A text a program sent (an A2A peer, a module) is still a program's after a restart,
    /// when its message runs from the store.
    #[test]
    fn a_peers_message_stays_a_peers_through_the_store() {
        let peer = RequestGovernance {
            peer: true,
            ..Default::default()
        };
        let kept = stored_governance(&stored_with(stored_metadata(&peer, None))).unwrap();
        assert!(kept.peer);
        let person = RequestGovernance::default();
        assert_eq!(stored_metadata(&person, None), None);
        assert!(!stored_governance(&stored_with(None)).unwrap().peer);
        let module = stored_metadata(&person, Some(serde_json::json!({"id": "slack"})));
        assert!(stored_governance(&stored_with(module)).unwrap().peer);
    }

    /// A stored request layer comes back as it was sent; one that cannot be read is an error
    /// (the message fails), never no layer at all (the message would run unrestricted).
    #[test]
    fn a_stored_request_layer_is_read_back_or_refused() {
        let with_metadata = |m: Option<serde_json::Value>| stored_with(m.map(Json));
        let none = stored_governance(&with_metadata(None)).unwrap();
        assert_eq!(none.tools, None);
        let other = stored_governance(&with_metadata(Some(json!({"module": "m"})))).unwrap();
        assert_eq!(other.tools, None);
        let kept = stored_governance(&with_metadata(Some(
            json!({"tools": {"blacklist": ["shell"]}}),
        )))
        .unwrap();
        assert_eq!(kept.tools.unwrap().blacklist, ["shell"]);
        for bad in [
            json!({"tools": {"blacklist": "shell"}}),
            json!({"tools": {"denylist": ["shell"]}}),
            json!({"tools": 5}),
        ] {
            let e = stored_governance(&with_metadata(Some(bad.clone()))).unwrap_err();
            assert!(e.to_string().contains("request layer"), "{bad}: {e}");
        }
    }
}
