//! What a client reads of the book: one task trimmed to what it asked for, and `ListTasks`
//! (filtered, newest status first, paged by an opaque cursor).

use super::{Record, TaskBook};
use crate::a2a::error::A2aError;
use crate::a2a::model::{SendResult, Task, TaskPage};
use crate::a2a::request::{DEFAULT_PAGE_SIZE, ListParams};

impl TaskBook {
    /// A task as the client sees it: at most `history_length` recent messages (spec 3.2.4),
    /// artifacts only if asked.
    pub fn view(
        &self,
        task_id: &str,
        history_length: Option<u32>,
        include_artifacts: bool,
    ) -> Option<Task> {
        self.tasks
            .get(task_id)
            .map(|r| trim(&r.task, history_length, include_artifacts))
    }

    /// `ListTasks`: filtered, newest status first, paged by an opaque cursor.
    pub fn list(&self, q: &ListParams) -> Result<TaskPage, A2aError> {
        let cursor = match &q.page_token {
            Some(t) => Some(parse_cursor(t)?),
            None => None,
        };
        let mut matching: Vec<&Record> = self
            .tasks
            .values()
            .filter(|r| {
                q.context_id
                    .as_ref()
                    .is_none_or(|c| *c == r.task.context_id)
            })
            .filter(|r| q.status.is_none_or(|s| s == r.task.status.state))
            .filter(|r| {
                q.status_timestamp_after_ms
                    .is_none_or(|after| r.updated_ms() >= after)
            })
            .collect();
        matching.sort_by(|a, b| (b.updated_ms(), &b.task.id).cmp(&(a.updated_ms(), &a.task.id)));
        let total = matching.len();
        let start = match &cursor {
            None => 0,
            Some((ms, id)) => matching
                .iter()
                .position(|r| (r.updated_ms(), &r.task.id) < (*ms, id))
                .unwrap_or(total),
        };
        let size = q.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        let end = start.saturating_add(size as usize).min(total);
        let page = &matching[start..end];
        let next = match page.last() {
            Some(last) if end < total => format!("{}:{}", last.updated_ms(), last.task.id),
            _ => String::new(),
        };
        Ok(TaskPage {
            tasks: page
                .iter()
                .map(|r| trim(&r.task, q.history_length, q.include_artifacts))
                .collect(),
            next_page_token: next,
            page_size: size,
            total_size: u32::try_from(total).unwrap_or(u32::MAX),
        })
    }

    /// The reply of a blocking or non-blocking send.
    pub fn send_result(&self, task_id: &str, history_length: Option<u32>) -> Option<SendResult> {
        self.view(task_id, history_length, true)
            .map(SendResult::Task)
    }
}

fn trim(task: &Task, history_length: Option<u32>, include_artifacts: bool) -> Task {
    let mut t = task.clone();
    if let Some(n) = history_length {
        let keep = (n as usize).min(t.history.len());
        t.history.drain(..t.history.len() - keep);
    }
    if !include_artifacts {
        t.artifacts.clear();
    }
    t
}

fn parse_cursor(token: &str) -> Result<(u64, String), A2aError> {
    token
        .split_once(':')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_owned())))
        .ok_or_else(|| A2aError::InvalidParams("pageToken is not one this server gave".into()))
}
