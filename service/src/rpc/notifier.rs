//! A streaming connection's side of `events.subscribe`: where its notifications go, and its
//! subscriptions, each a task forwarding one session's events until it is removed or the
//! connection ends.

use super::outbox::Outbox;
use crate::error::RpcError;
use crate::stream::{StreamEvent, Subscriber};
use futures::{Stream, StreamExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;
use troupe_proto::AgentError;

/// Where a streaming connection's notifications go, and its subscriptions.
pub struct Notifier {
    out: Outbox,
    /// Cancelled when the connection ends; every subscription is a child of it.
    closed: CancellationToken,
    next: AtomicU64,
    subscriptions: Mutex<HashMap<u64, CancellationToken>>,
    transport: &'static str,
}

impl Notifier {
    pub fn new(out: Outbox, closed: CancellationToken, transport: &'static str) -> Self {
        Self {
            out,
            closed,
            next: AtomicU64::new(1),
            subscriptions: Mutex::new(HashMap::new()),
            transport,
        }
    }

    fn add(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = self.closed.child_token();
        if let Ok(mut subs) = self.subscriptions.lock() {
            subs.insert(id, token.clone());
        }
        (id, token)
    }

    /// Ends a subscription; whether there was one with this id.
    pub fn remove(&self, id: u64) -> bool {
        let token = self
            .subscriptions
            .lock()
            .ok()
            .and_then(|mut subs| subs.remove(&id));
        token.map(|t| t.cancel()).is_some()
    }

    /// Forwards `events` as `events.event` notifications under a new subscription, until
    /// it is removed, the connection ends or the stream does; an error goes out as
    /// `events.error` and ends it. Returns the subscription's id.
    pub fn forward(
        &self,
        events: impl Stream<Item = Result<StreamEvent, AgentError>> + Send + 'static,
    ) -> u64 {
        let (id, cancel) = self.add();
        let out = self.out.clone();
        let transport = self.transport;
        tokio::spawn(async move {
            let _gauge = Subscriber::new(transport);
            let mut events = std::pin::pin!(events);
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => break,
                    n = events.next() => n,
                };
                let note = match next {
                    Some(Ok(e)) => json!({
                        "jsonrpc": "2.0",
                        "method": "events.event",
                        "params": {"subscription": id, "event": e},
                    }),
                    Some(Err(e)) => json!({
                        "jsonrpc": "2.0",
                        "method": "events.error",
                        "params": {"subscription": id, "error": RpcError::from(e)},
                    }),
                    None => break,
                };
                let last = note["method"] == "events.error";
                if !out.push(note.to_string()).await || last {
                    break;
                }
            }
        });
        id
    }
}
