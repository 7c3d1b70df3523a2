//! The A2A endpoint's writer: one tokio task that stores what the `A2aTasks` actor changed,
//! in the order it changed, so the actor never waits for the store in its mailbox.
//!
//! The actor queues a [`Write`] (with an optional callback for when it is stored); the
//! writer takes what is queued, keeps only the newest version of each task and context among
//! it (a record is stored whole, so an older version is useless once a newer one is queued;
//! its callback still runs, after the newer one is stored), and stores them one after the
//! other. A write that fails is logged and counted; the actor still holds the record, and the
//! next change of it stores it again. One writer serves every generation of the actor (the
//! supervisor restarts it over the same writer), so a new actor's [`Persister::barrier`] sees
//! everything the failed one queued stored before it reads the store. It ends once every
//! handle is dropped and its queue is empty.

use super::metrics;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use troupe_proto::AgentError;
use troupe_proto::store::{A2aContextRecord, A2aPushRecord, A2aTaskRecord};
use troupe_store::Store;

/// Writes taken together at most.
const MAX_BATCH: usize = 256;

/// One change to store.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Context(A2aContextRecord),
    Task(A2aTaskRecord),
    Push(A2aPushRecord),
    DeletePush {
        task_id: String,
        config_id: String,
    },
    /// Retention: keep this many finished tasks.
    Prune {
        keep_finished: usize,
    },
    /// Nothing: its callback runs once everything queued before it is stored.
    Barrier,
}

impl Write {
    /// The record a newer write of the same key replaces.
    fn key(&self) -> Option<(u8, &str)> {
        match self {
            Self::Context(c) => Some((0, &c.context_id)),
            Self::Task(t) => Some((1, &t.task_id)),
            _ => None,
        }
    }

    const fn label(&self) -> &'static str {
        match self {
            Self::Context(_) => "context",
            Self::Task(_) => "task",
            Self::Push(_) | Self::DeletePush { .. } => "push_config",
            Self::Prune { .. } => "prune",
            Self::Barrier => "barrier",
        }
    }
}

/// Runs when a write was stored (or failed).
pub type Done = Box<dyn FnOnce(Result<(), AgentError>) + Send>;

/// A handle on the writer. Cheap to clone.
#[derive(Clone)]
pub struct Persister {
    tx: mpsc::UnboundedSender<(Write, Option<Done>)>,
}

impl std::fmt::Debug for Persister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persister").finish_non_exhaustive()
    }
}

impl Persister {
    /// Starts the writer over `store`.
    pub fn start(store: Arc<dyn Store>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self { tx }
    }

    /// Queues a write; `done` runs once it is stored (or failed).
    pub fn write(&self, write: Write, done: Option<Done>) {
        if let Err(mpsc::error::SendError((_, Some(done)))) = self.tx.send((write, done)) {
            done(Err(AgentError::internal(
                "the A2A store writer has stopped",
            )));
        }
    }

    /// Answers once everything queued so far is stored.
    pub async fn barrier(&self) -> Result<(), AgentError> {
        let (tx, rx) = oneshot::channel();
        self.write(
            Write::Barrier,
            Some(Box::new(move |r| {
                let _ = tx.send(r);
            })),
        );
        rx.await
            .map_err(|_| AgentError::internal("the A2A store writer has stopped"))?
    }
}

/// Newest version of each record, in the order each key first appeared, with every callback
/// of the versions it replaced.
fn coalesce(batch: Vec<(Write, Option<Done>)>) -> Vec<(Write, Vec<Done>)> {
    let mut out: Vec<(Write, Vec<Done>)> = Vec::with_capacity(batch.len());
    let mut at: HashMap<(u8, String), usize> = HashMap::new();
    for (write, done) in batch {
        let key = write.key().map(|(k, id)| (k, id.to_owned()));
        match key.as_ref().and_then(|k| at.get(k)) {
            Some(&i) => {
                out[i].0 = write;
                out[i].1.extend(done);
            }
            None => {
                if let Some(k) = key {
                    at.insert(k, out.len());
                }
                out.push((write, done.into_iter().collect()));
            }
        }
    }
    out
}

async fn run(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<(Write, Option<Done>)>) {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        for (write, dones) in coalesce(std::mem::take(&mut batch)) {
            let label = write.label();
            let result = apply(store.as_ref(), write).await;
            if let Err(e) = &result {
                tracing::warn!(record = label, error = %e, "a2a record not stored");
            }
            if label != "barrier" {
                metrics::stored(label, result.is_ok());
            }
            for done in dones {
                done(result.clone());
            }
        }
    }
}

async fn apply(store: &dyn Store, write: Write) -> Result<(), AgentError> {
    match write {
        Write::Context(c) => store.put_a2a_context(c).await,
        Write::Task(t) => store.put_a2a_task(t).await,
        Write::Push(p) => store.put_a2a_push(p).await,
        Write::DeletePush { task_id, config_id } => {
            store.delete_a2a_push(&task_id, &config_id).await.map(drop)
        }
        Write::Prune { keep_finished } => {
            let pruned = store.prune_a2a(keep_finished).await?;
            if pruned.tasks > 0 || pruned.contexts > 0 {
                tracing::info!(
                    tasks = pruned.tasks,
                    contexts = pruned.contexts,
                    keep_finished,
                    "a2a retention forgot old records"
                );
            }
            metrics::pruned(pruned.tasks, pruned.contexts);
            Ok(())
        }
        Write::Barrier => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use troupe_proto::{ConversationId, Json, SessionId};

    fn ctx(id: &str, active_ms: u64) -> Write {
        Write::Context(A2aContextRecord {
            context_id: id.into(),
            session_id: SessionId::new(),
            conversation_id: ConversationId::new(),
            created_ms: 1,
            active_ms,
            open: true,
        })
    }

    #[test]
    fn the_newest_version_of_a_record_is_stored_in_the_first_ones_place() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let note = |n: u32| -> Option<Done> {
            let calls = calls.clone();
            Some(Box::new(move |_| calls.lock().unwrap().push(n)))
        };
        let batch = vec![
            (ctx("a", 1), note(1)),
            (ctx("b", 1), None),
            (Write::Barrier, note(2)),
            (ctx("a", 2), note(3)),
        ];
        let out = coalesce(batch);
        assert_eq!(out.len(), 3);
        let Write::Context(a) = &out[0].0 else {
            panic!("a context first")
        };
        assert_eq!(
            (a.context_id.as_str(), a.active_ms),
            ("a", 2),
            "a's newest, in a's first place"
        );
        assert_eq!(out[0].1.len(), 2, "both of a's callbacks");
        assert_eq!(out[2].0, Write::Barrier);
        for (_, dones) in out {
            for d in dones {
                d(Ok(()));
            }
        }
        assert_eq!(*calls.lock().unwrap(), vec![1, 3, 2]);
    }

    #[tokio::test]
    async fn writes_are_stored_in_order_and_a_barrier_waits_for_them() {
        let store = Arc::new(troupe_store::memory::MemoryStore::new());
        let p = Persister::start(store.clone());
        p.write(ctx("c", 1), None);
        p.write(
            Write::Task(A2aTaskRecord {
                task_id: "t".into(),
                context_id: "c".into(),
                state: "TASK_STATE_WORKING".into(),
                terminal: false,
                created_ms: 1,
                updated_ms: 1,
                body: Json(serde_json::json!({})),
                redacted: None,
                expires_ms: None,
            }),
            None,
        );
        p.barrier().await.unwrap();
        assert!(store.a2a_task("t").await.unwrap().is_some());
        // A failed write reaches its callback.
        let (tx, rx) = oneshot::channel();
        p.write(
            Write::Push(A2aPushRecord {
                task_id: "nope".into(),
                config_id: "x".into(),
                created_ms: 1,
                body: Json(serde_json::json!({})),
            }),
            Some(Box::new(move |r| {
                let _ = tx.send(r);
            })),
        );
        assert!(rx.await.unwrap().is_err());
    }
}
