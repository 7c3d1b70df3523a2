//! The A2A endpoint's records (P5) kept in memory, for [`MemoryStore`](crate::memory::MemoryStore):
//! the same rules as the SQLite tables, over ordered maps.

use std::collections::BTreeMap;
use troupe_proto::AgentError;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
};

#[derive(Debug, Default)]
pub(crate) struct A2aData {
    contexts: BTreeMap<String, A2aContextRecord>,
    tasks: BTreeMap<String, A2aTaskRecord>,
    /// By (task, config); `seq` orders a task's configs as inserted.
    pushes: BTreeMap<(String, String), (u64, A2aPushRecord)>,
    seq: u64,
}

/// Newest first: (`updated_ms`, `task_id`) descending.
fn newest_first(a: &A2aTaskRecord, b: &A2aTaskRecord) -> std::cmp::Ordering {
    (b.updated_ms, &b.task_id).cmp(&(a.updated_ms, &a.task_id))
}

impl A2aData {
    pub(crate) fn put_context(&mut self, r: A2aContextRecord) {
        self.contexts.insert(r.context_id.clone(), r);
    }

    pub(crate) fn context(&self, context_id: &str) -> Option<A2aContextRecord> {
        self.contexts.get(context_id).cloned()
    }

    pub(crate) fn open_contexts(&self) -> Vec<A2aContextRecord> {
        let mut out: Vec<A2aContextRecord> =
            self.contexts.values().filter(|c| c.open).cloned().collect();
        out.sort_by(|a, b| (a.created_ms, &a.context_id).cmp(&(b.created_ms, &b.context_id)));
        out
    }

    pub(crate) fn put_task(&mut self, r: A2aTaskRecord) -> Result<(), AgentError> {
        if !self.contexts.contains_key(&r.context_id) {
            return Err(AgentError::not_found("a2a context", &r.context_id));
        }
        self.tasks.insert(r.task_id.clone(), r);
        Ok(())
    }

    /// Puts each due task's text-less body in place of its body; how many.
    pub(crate) fn sweep_due(&mut self, now_ms: u64) -> usize {
        let mut swept = 0;
        for t in self.tasks.values_mut() {
            if t.expires_ms.is_some_and(|e| e <= now_ms)
                && let Some(redacted) = t.redacted.take()
            {
                t.body = redacted;
                t.expires_ms = None;
                swept += 1;
            }
        }
        swept
    }

    pub(crate) fn task(&self, task_id: &str) -> Option<A2aTaskRecord> {
        self.tasks.get(task_id).cloned()
    }

    pub(crate) fn live_tasks(&self) -> Vec<A2aTaskRecord> {
        let mut out: Vec<A2aTaskRecord> = self
            .tasks
            .values()
            .filter(|t| !t.terminal)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.created_ms, &a.task_id).cmp(&(b.created_ms, &b.task_id)));
        out
    }

    pub(crate) fn tasks(&self, q: &A2aTaskQuery) -> A2aTaskPage {
        let mut matching: Vec<&A2aTaskRecord> = self
            .tasks
            .values()
            .filter(|t| q.context_id.as_ref().is_none_or(|c| *c == t.context_id))
            .filter(|t| q.state.as_ref().is_none_or(|s| *s == t.state))
            .filter(|t| q.updated_after_ms.is_none_or(|after| t.updated_ms >= after))
            .collect();
        matching.sort_by(|a, b| newest_first(a, b));
        let total = matching.len() as u64;
        let tasks = matching
            .into_iter()
            .filter(|t| {
                q.after
                    .as_ref()
                    .is_none_or(|(ms, id)| (t.updated_ms, &t.task_id) < (*ms, id))
            })
            .take(q.limit)
            .cloned()
            .collect();
        A2aTaskPage { tasks, total }
    }

    pub(crate) fn put_push(&mut self, r: A2aPushRecord) -> Result<(), AgentError> {
        if !self.tasks.contains_key(&r.task_id) {
            return Err(AgentError::not_found("a2a task", &r.task_id));
        }
        let key = (r.task_id.clone(), r.config_id.clone());
        match self.pushes.get_mut(&key) {
            // A replaced config keeps its place (and its creation time), as in SQLite.
            Some((_, old)) => old.body = r.body,
            None => {
                self.seq += 1;
                self.pushes.insert(key, (self.seq, r));
            }
        }
        Ok(())
    }

    pub(crate) fn delete_push(&mut self, task_id: &str, config_id: &str) -> bool {
        self.pushes
            .remove(&(task_id.to_owned(), config_id.to_owned()))
            .is_some()
    }

    pub(crate) fn pushes(&self, task_id: &str) -> Vec<A2aPushRecord> {
        let mut out: Vec<&(u64, A2aPushRecord)> = self
            .pushes
            .iter()
            .filter(|((t, _), _)| t == task_id)
            .map(|(_, v)| v)
            .collect();
        out.sort_by_key(|(seq, r)| (r.created_ms, *seq));
        out.into_iter().map(|(_, r)| r.clone()).collect()
    }

    pub(crate) fn prune(&mut self, keep_finished: usize) -> A2aPruned {
        let mut finished: Vec<&A2aTaskRecord> =
            self.tasks.values().filter(|t| t.terminal).collect();
        finished.sort_by(|a, b| newest_first(a, b));
        let cut_ms = match (keep_finished, finished.get(keep_finished.saturating_sub(1))) {
            (0, _) => u64::MAX,
            (_, Some(oldest_kept)) => oldest_kept.updated_ms,
            (_, None) => return A2aPruned::default(),
        };
        let doomed: Vec<String> = finished
            .iter()
            .skip(keep_finished)
            .map(|t| t.task_id.clone())
            .collect();
        for task_id in &doomed {
            self.tasks.remove(task_id);
            self.pushes.retain(|(t, _), _| t != task_id);
        }
        let tasks = &self.tasks;
        let before = self.contexts.len();
        self.contexts.retain(|id, c| {
            c.open || c.active_ms > cut_ms || tasks.values().any(|t| t.context_id == *id)
        });
        A2aPruned {
            tasks: doomed.len() as u64,
            contexts: (before - self.contexts.len()) as u64,
        }
    }
}
