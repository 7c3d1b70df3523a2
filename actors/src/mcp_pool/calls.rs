//! Which conversation a server's request belongs to. MCP gives a stdio server's
//! `elicitation/create` or `sampling/createMessage` no link to the tool call that caused it,
//! but a server only asks while it runs a call: the pool records every call in flight per
//! server (views report each start; a call has ended once its `cancel` token fired, which the
//! view does when the call returns; the pool watches the token and forgets the call then, so
//! that an ended call keeps neither its task's span, and so its trace, open nor its slot
//! lease), and a request is attributed to the one task
//! running calls on that server. With none, nobody is there to answer; with calls of several
//! tasks at once, the request could belong to any of them, so it is refused rather than shown
//! to the wrong conversation.

use std::collections::HashMap;
use tokio_util::sync::CancellationToken;
use troupe_proto::{ConversationId, TaskId};

/// A tool call a view is running on a server.
#[derive(Debug, Clone)]
pub struct InFlightCall {
    /// Unique within the process (see [`next_key`]).
    pub key: u64,
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// Fires when the call ends, however it ends (answered, cancelled, timed out, its
    /// connection died): whatever a request is waiting for on its behalf stops waiting, and
    /// the registry forgets the call.
    pub cancel: CancellationToken,
    /// The call's `execute_tool` span: a server request it causes is traced under it, in the
    /// task's trace, although it arrives on the connection's own task.
    pub span: tracing::Span,
    /// The task's scheduler slot, given back while a request of this call waits for a human.
    pub slot: Option<crate::task::SlotLease>,
    /// When the call times out (`call_timeout` after it was sent): a human is not given longer
    /// than this to answer a request of the call, since the answer would reach nobody.
    pub deadline: tokio::time::Instant,
}

/// The outcome of attributing a server's request.
#[derive(Debug, Clone)]
pub enum Attribution {
    /// The request belongs to this call's task (its latest call on the server).
    Call(InFlightCall),
    /// No call runs on the server: nobody caused the request.
    NoCall,
    /// Calls of several tasks run on the server.
    Ambiguous { tasks: usize },
}

/// Calls in flight, per server.
#[derive(Debug, Default)]
pub struct CallRegistry {
    by_server: HashMap<String, Vec<InFlightCall>>,
}

impl CallRegistry {
    pub fn started(&mut self, server: &str, call: InFlightCall) {
        let calls = self.by_server.entry(server.to_owned()).or_default();
        calls.retain(|c| !c.cancel.is_cancelled());
        calls.push(call);
    }

    /// Forgets call `key` of `server` (it ended).
    pub fn ended(&mut self, server: &str, key: u64) {
        if let Some(calls) = self.by_server.get_mut(server) {
            calls.retain(|c| c.key != key);
            if calls.is_empty() {
                self.by_server.remove(server);
            }
        }
    }

    /// Calls held, ended ones included until they are forgotten.
    pub fn held(&self) -> usize {
        self.by_server.values().map(Vec::len).sum()
    }

    /// Forgets the calls of `server` that ended.
    fn prune(&mut self, server: &str) {
        if let Some(calls) = self.by_server.get_mut(server) {
            calls.retain(|c| !c.cancel.is_cancelled());
            if calls.is_empty() {
                self.by_server.remove(server);
            }
        }
    }

    /// Who a request of `server` comes from.
    pub fn attribute(&mut self, server: &str) -> Attribution {
        self.prune(server);
        let calls = self.by_server.get(server).map(Vec::as_slice).unwrap_or(&[]);
        let Some(latest) = calls.last() else {
            return Attribution::NoCall;
        };
        let mut tasks: Vec<(ConversationId, TaskId)> = calls
            .iter()
            .map(|c| (c.conversation_id, c.task_id))
            .collect();
        tasks.sort();
        tasks.dedup();
        if tasks.len() == 1 {
            Attribution::Call(latest.clone())
        } else {
            Attribution::Ambiguous { tasks: tasks.len() }
        }
    }

    /// Calls in flight on every server.
    pub fn len(&self) -> usize {
        self.by_server
            .values()
            .flatten()
            .filter(|c| !c.cancel.is_cancelled())
            .count()
    }
}

/// A fresh call key.
pub fn next_key() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(conversation_id: ConversationId, task_id: TaskId) -> InFlightCall {
        InFlightCall {
            key: next_key(),
            conversation_id,
            task_id,
            cancel: CancellationToken::new(),
            span: tracing::Span::none(),
            slot: None,
            deadline: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn a_request_belongs_to_the_one_task_running_calls_on_its_server() {
        let mut calls = CallRegistry::default();
        assert!(matches!(calls.attribute("a"), Attribution::NoCall));
        let (c, t) = (ConversationId::new(), TaskId::new());
        let first = call(c, t);
        let second = call(c, t);
        calls.started("a", first.clone());
        calls.started("a", second.clone());
        // Another server's calls do not matter.
        calls.started("b", call(ConversationId::new(), TaskId::new()));
        match calls.attribute("a") {
            Attribution::Call(found) => assert_eq!(found.key, second.key),
            other => panic!("{other:?}"),
        }
        second.cancel.cancel();
        match calls.attribute("a") {
            Attribution::Call(found) => assert_eq!(found.key, first.key),
            other => panic!("{other:?}"),
        }
        first.cancel.cancel();
        assert!(matches!(calls.attribute("a"), Attribution::NoCall));
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn calls_of_several_tasks_make_a_request_ambiguous() {
        let mut calls = CallRegistry::default();
        let c = ConversationId::new();
        let mine = call(c, TaskId::new());
        calls.started("a", mine.clone());
        calls.started("a", call(ConversationId::new(), TaskId::new()));
        calls.started("a", call(c, TaskId::new()));
        assert!(matches!(
            calls.attribute("a"),
            Attribution::Ambiguous { tasks: 3 }
        ));
        assert_eq!(calls.len(), 3);
        // Once the other tasks' calls end, the request is this task's again.
        let mut others = calls.by_server["a"].clone();
        others.retain(|c| c.key != mine.key);
        for c in others {
            c.cancel.cancel();
        }
        assert!(matches!(calls.attribute("a"), Attribution::Call(ref c) if c.key == mine.key));
        assert_eq!(calls.len(), 1);
    }
}
