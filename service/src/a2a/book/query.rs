//! What a client reads: one task trimmed to what it asked for, and `ListTasks` (filtered,
//! newest status first, paged by an opaque cursor), which reads the store: it holds every
//! task, the book only the live ones.

use super::{Record, TaskBook};
use crate::a2a::error::A2aError;
use crate::a2a::model::{SendResult, Task, TaskPage};
use crate::a2a::request::{DEFAULT_PAGE_SIZE, ListParams};
use troupe_proto::store::{A2aTaskPage, A2aTaskQuery};

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
}

/// What a blocking send answers for a settled task: the agent's plain Message reply when it
/// gave one (without a task id: no task is needed to read it), else the task.
pub fn send_result(r: &Record, history_length: Option<u32>) -> SendResult {
    match &r.reply_message {
        Some(m) => {
            let mut m = m.clone();
            m.task_id = None;
            SendResult::Message(m)
        }
        None => SendResult::Task(trim(&r.task, history_length, true)),
    }
}

/// A task trimmed: at most `history_length` newest messages, artifacts only if asked.
pub fn trim(task: &Task, history_length: Option<u32>, include_artifacts: bool) -> Task {
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

/// The store query of a `ListTasks`: one task more than the page, to know whether another
/// page follows.
pub fn list_query(q: &ListParams) -> Result<A2aTaskQuery, A2aError> {
    let after = match &q.page_token {
        Some(t) => Some(parse_cursor(t)?),
        None => None,
    };
    Ok(A2aTaskQuery {
        context_id: q.context_id.clone(),
        state: q.status.map(|s| s.v1_name().to_owned()),
        updated_after_ms: q.status_timestamp_after_ms,
        after,
        limit: q.page_size.unwrap_or(DEFAULT_PAGE_SIZE) as usize + 1,
    })
}

/// A `ListTasks` page from the store's page: each task decoded (and replaced by `fresher`'s
/// version when it has one: a live task the book holds), trimmed as asked; the cursor names
/// the last task when more remain.
pub fn stored_page(
    q: &ListParams,
    page: &A2aTaskPage,
    fresher: impl Fn(&str) -> Option<Task>,
) -> Result<TaskPage, A2aError> {
    let size = q.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    let shown = &page.tasks[..page.tasks.len().min(size as usize)];
    let more = page.tasks.len() > shown.len();
    let mut tasks = Vec::with_capacity(shown.len());
    for stored in shown {
        let task = match fresher(&stored.task_id) {
            Some(t) => t,
            None => super::stored::task_of(stored)?,
        };
        tasks.push(trim(&task, q.history_length, q.include_artifacts));
    }
    let next = match shown.last() {
        Some(last) if more => format!("{}:{}", last.updated_ms, last.task_id),
        _ => String::new(),
    };
    Ok(TaskPage {
        tasks,
        next_page_token: next,
        page_size: size,
        total_size: u32::try_from(page.total).unwrap_or(u32::MAX),
    })
}

fn parse_cursor(token: &str) -> Result<(u64, String), A2aError> {
    token
        .split_once(':')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_owned())))
        .ok_or_else(|| A2aError::InvalidParams("pageToken is not one this server gave".into()))
}
