//! Which tasks' records hold the items a conversation's history keeps (S6), so that a
//! `history_checkpoint` can name where a restore starts reading: the task of the oldest kept
//! item, and how many of that task's items were trimmed.
//!
//! The history holds the items of finished message tasks, oldest first, behind the summary;
//! trims remove the oldest. So the kept items are the newest `held` items appended, and
//! counting items per task is enough to find the oldest one's task. Items not tied to a task
//! (a compaction summary that a restore without checkpoint put among the items) are always
//! the oldest, so they are trimmed first and never counted here.

use crate::history::HistoryStore;
use std::collections::{HashMap, VecDeque};
use troupe_proto::TaskId;

/// Items a history holds after its summary.
pub fn held_items(history: &HistoryStore) -> u64 {
    (history.len() - usize::from(history.summary().is_some())) as u64
}

/// The time of the oldest content in a summary once content written no earlier than
/// `oldest` (unknown: `None`, taken as 0, the earliest there is) is folded into it.
pub fn since_with(summary_since: Option<u64>, oldest: Option<u64>) -> Option<u64> {
    let oldest = oldest.unwrap_or(0);
    Some(summary_since.map_or(oldest, |s| s.min(oldest)))
}

/// The tasks whose items are kept, oldest first, with how many of their items are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptTasks {
    tasks: VecDeque<(TaskId, u64)>,
    /// Items of the oldest task that were trimmed.
    skipped: u64,
    /// When each kept task started (unix ms), where known: its items were written no
    /// earlier, so what a trim folds into the summary is no older than its oldest task's.
    started_ms: HashMap<TaskId, u64>,
}

impl KeptTasks {
    /// From the owners of restored items, oldest first (`None`: not tied to a task), of which
    /// `skipped` items of the first task were trimmed before.
    pub fn from_owners(owners: &[Option<TaskId>], skipped: u64) -> Self {
        let mut kept = Self::default();
        for task in owners.iter().flatten() {
            kept.appended(*task, 1);
        }
        kept.skipped = if kept.tasks.is_empty() { 0 } else { skipped };
        kept
    }

    /// `count` items of `task_id`, which started at `started_ms`, were appended.
    pub fn appended_at(&mut self, task_id: TaskId, count: u64, started_ms: u64) {
        if count > 0 {
            self.started_ms.entry(task_id).or_insert(started_ms);
        }
        self.appended(task_id, count);
    }

    /// When the oldest kept task started, if known.
    pub fn oldest_started_ms(&self) -> Option<u64> {
        let (task, _) = self.tasks.front()?;
        self.started_ms.get(task).copied()
    }

    /// Records when tasks started (a restore reads it from their records).
    pub fn started_at(&mut self, times: &HashMap<TaskId, u64>) {
        for (task, _) in &self.tasks {
            if let Some(ms) = times.get(task) {
                self.started_ms.insert(*task, *ms);
            }
        }
    }

    /// `count` items of `task_id` were appended to the history.
    pub fn appended(&mut self, task_id: TaskId, count: u64) {
        if count == 0 {
            return;
        }
        match self.tasks.back_mut() {
            Some((last, n)) if *last == task_id => *n += count,
            _ => self.tasks.push_back((task_id, count)),
        }
    }

    /// The history now holds `held` items (its summary excluded): what was trimmed from the
    /// oldest end is forgotten.
    pub fn keep(&mut self, held: u64) {
        let total: u64 = self.tasks.iter().map(|(_, n)| n).sum();
        let mut excess = total.saturating_sub(held);
        while let Some((_, n)) = self.tasks.front_mut() {
            if *n > excess {
                *n -= excess;
                self.skipped += excess;
                return;
            }
            excess -= *n;
            if let Some((task, _)) = self.tasks.pop_front() {
                self.started_ms.remove(&task);
            }
            self.skipped = 0;
        }
    }

    /// Nothing is kept (a compaction replaced the whole history).
    pub fn clear(&mut self) {
        self.tasks.clear();
        self.skipped = 0;
        self.started_ms.clear();
    }

    /// Where a restore starts: the task of the oldest kept item and how many of its items
    /// were trimmed; `None` when no item is kept.
    pub fn anchor(&self) -> Option<(TaskId, u64)> {
        self.tasks.front().map(|(task, _)| (*task, self.skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_anchor_is_the_task_of_the_oldest_kept_item() {
        let (a, b, c) = (TaskId::new(), TaskId::new(), TaskId::new());
        let mut kept = KeptTasks::default();
        assert_eq!(kept.anchor(), None);
        kept.appended(a, 3);
        kept.appended(b, 2);
        kept.keep(5);
        assert_eq!(kept.anchor(), Some((a, 0)));
        kept.keep(4);
        assert_eq!(kept.anchor(), Some((a, 1)), "one of a's items trimmed");
        kept.appended(c, 4);
        kept.keep(6);
        assert_eq!(kept.anchor(), Some((b, 0)), "a is gone");
        kept.keep(3);
        assert_eq!(kept.anchor(), Some((c, 1)));
        kept.clear();
        assert_eq!(kept.anchor(), None);
    }

    #[test]
    fn the_oldest_kept_tasks_start_follows_trims() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut kept = KeptTasks::default();
        kept.appended_at(a, 2, 100);
        kept.appended_at(b, 2, 200);
        assert_eq!(kept.oldest_started_ms(), Some(100));
        kept.keep(2);
        assert_eq!(kept.oldest_started_ms(), Some(200), "a is gone");
        assert_eq!(since_with(None, Some(200)), Some(200));
        assert_eq!(since_with(Some(150), Some(200)), Some(150));
        assert_eq!(
            since_with(Some(150), None),
            Some(0),
            "unknown: as old as can be"
        );
        kept.clear();
        assert_eq!(kept.oldest_started_ms(), None);
    }

    #[test]
    fn items_without_a_task_are_not_counted() {
        let a = TaskId::new();
        let kept = KeptTasks::from_owners(&[None, Some(a), Some(a)], 5);
        assert_eq!(kept.anchor(), Some((a, 5)));
        assert_eq!(KeptTasks::from_owners(&[None], 5).anchor(), None);
    }

    proptest! {
        /// Against a plain list of every item's task: the anchor is always the oldest kept
        /// item's task, and the skip counts that task's items before it.
        #[test]
        fn the_anchor_matches_a_list_of_every_item(
            ops in proptest::collection::vec((1u64..6, 0u64..8), 1..40),
        ) {
            let mut kept = KeptTasks::default();
            let mut items: Vec<TaskId> = Vec::new();
            let mut first_kept = 0usize;
            for (count, trim) in ops {
                let task = TaskId::new();
                kept.appended(task, count);
                items.extend(std::iter::repeat_n(task, usize::try_from(count).unwrap()));
                let held = (items.len() - first_kept) as u64;
                let held = held.saturating_sub(trim);
                first_kept = items.len() - usize::try_from(held).unwrap();
                kept.keep(held);
                let expected = items.get(first_kept).map(|t| {
                    let skip = items[..first_kept].iter().filter(|x| *x == t).count();
                    (*t, skip as u64)
                });
                prop_assert_eq!(kept.anchor(), expected);
            }
        }
    }
}
