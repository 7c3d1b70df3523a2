//! Conversation context (C1–C7) as pure functions: which instructions a turn uses, how an MCP
//! allowlist is normalised, what the prompt cache key is, and how a history is rebuilt from a
//! rollout.

use crate::rollout::RolloutRecord;
use crate::tools::{ToolPrefs, is_valid_tool_name};
use sha2::{Digest, Sha256};
use troupe_proto::{
    AgentError, ConversationStats, EventKind, EventName, HistoryItem, OpenConversation, SetContext,
    TaskId, TaskStats, TaskStatus, ToolSpec,
};

/// The built-in system prompt, used when a conversation sets no base instructions (C3).
pub const DEFAULT_INSTRUCTIONS: &str = "You are a careful coding and chat assistant working for one user inside troupe. \
Answer directly when you can. When a tool helps, call it with well-formed arguments, read its \
observation, and continue until the request is done; then give a short final answer.";

/// Appended to the default prompt when no apply_patch tool is offered (C3).
pub const APPLY_PATCH_GUIDANCE: &str = "\n\nTo edit files, run a shell command that applies a \
patch in the `*** Begin Patch` / `*** End Patch` format; never rewrite a whole file to change a few lines.";

/// A conversation's context (C1), as changed by open and set-context (C6).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConversationContext {
    pub base_instructions: Option<String>,
    pub user_instructions: Option<String>,
    /// Normalised qualified names (`server__tool`); `None` = every tool.
    pub mcp_tool_allowlist: Option<Vec<String>>,
    pub prefs: ToolPrefs,
}

impl ConversationContext {
    /// Builds the context of `open`, normalising the allowlist. Returns the deprecation
    /// warnings to report.
    pub fn from_open(
        params: &OpenConversation,
        shell: bool,
    ) -> Result<(Self, Vec<String>), AgentError> {
        let (allowlist, warnings) = match &params.mcp_tool_allowlist {
            Some(list) => {
                let (names, warnings) = normalize_allowlist(list)?;
                (Some(names), warnings)
            }
            None => (None, Vec::new()),
        };
        Ok((
            Self {
                base_instructions: params.base_instructions.clone(),
                user_instructions: params.user_instructions.clone(),
                mcp_tool_allowlist: allowlist,
                prefs: ToolPrefs {
                    shell,
                    plan: params.include_plan_tool,
                    apply_patch: params.include_apply_patch_tool,
                    web_search: params.tools_web_search_request,
                },
            },
            warnings,
        ))
    }

    /// Applies a set-context request; history is not touched (C6). A field the request
    /// leaves out is unchanged; one it names as `null` goes back to what `open` gives when it
    /// is not named (the built-in instructions, no user instructions, every MCP tool, no plan,
    /// apply_patch or web-search tool).
    pub fn apply(&mut self, update: &SetContext) -> Result<Vec<String>, AgentError> {
        let mut warnings = Vec::new();
        match &update.mcp_tool_allowlist {
            Some(Some(list)) => {
                let (names, w) = normalize_allowlist(list)?;
                self.mcp_tool_allowlist = Some(names);
                warnings = w;
            }
            Some(None) => self.mcp_tool_allowlist = None,
            None => {}
        }
        if let Some(b) = &update.base_instructions {
            self.base_instructions.clone_from(b);
        }
        if let Some(u) = &update.user_instructions {
            self.user_instructions.clone_from(u);
        }
        let flag = |current: bool, patch: &Option<Option<bool>>| {
            troupe_proto::patched(current, patch.as_ref(), false)
        };
        self.prefs.plan = flag(self.prefs.plan, &update.include_plan_tool);
        self.prefs.apply_patch = flag(self.prefs.apply_patch, &update.include_apply_patch_tool);
        self.prefs.web_search = flag(self.prefs.web_search, &update.tools_web_search_request);
        Ok(warnings)
    }

    /// The user instructions as the earliest user message of the prompt (C4).
    pub fn pinned(&self) -> Option<HistoryItem> {
        self.user_instructions.as_ref().map(HistoryItem::user)
    }
}

/// Narrows a session policy by a conversation's request (C2): policies are ordered from
/// strictest to widest, and a conversation gets the stricter of the two. Returns the policy
/// and whether the request was wider than allowed (clamped).
pub fn narrow<T: Ord + Copy>(session: T, requested: Option<T>) -> (T, bool) {
    match requested {
        None => (session, false),
        Some(r) if r <= session => (r, false),
        Some(_) => (session, true),
    }
}

/// Normalises an allowlist (C5): `server/tool` becomes `server__tool` with a deprecation
/// warning; a name that is still illegal is an error naming every offender.
pub fn normalize_allowlist(list: &[String]) -> Result<(Vec<String>, Vec<String>), AgentError> {
    let mut names = Vec::with_capacity(list.len());
    let mut warnings = Vec::new();
    let mut illegal = Vec::new();
    for raw in list {
        let name = match raw.split_once('/') {
            Some((server, tool))
                if !server.is_empty() && !tool.is_empty() && !tool.contains('/') =>
            {
                let q = format!("{server}__{tool}");
                warnings.push(format!("allowlist entry `{raw}` is deprecated; use `{q}`"));
                q
            }
            _ => raw.clone(),
        };
        if !is_valid_tool_name(&name) || !name.contains("__") {
            illegal.push(raw.clone());
        } else if !names.contains(&name) {
            names.push(name);
        }
    }
    if illegal.is_empty() {
        Ok((names, warnings))
    } else {
        Err(AgentError::invalid(format!(
            "illegal MCP tool names in allowlist (expected `server__tool`, [a-zA-Z0-9_-]): {}",
            illegal.join(", ")
        )))
    }
}

/// The system prompt of one turn (C3): a one-turn override, else the conversation's base
/// instructions, else the built-in default (with apply_patch guidance when there is no
/// apply_patch tool). The override is never stored.
pub fn choose_instructions(
    turn_override: Option<&str>,
    base: Option<&str>,
    has_apply_patch_tool: bool,
) -> String {
    match (turn_override, base) {
        (Some(o), _) => o.to_owned(),
        (None, Some(b)) => b.to_owned(),
        (None, None) if has_apply_patch_tool => DEFAULT_INSTRUCTIONS.to_owned(),
        (None, None) => format!("{DEFAULT_INSTRUCTIONS}{APPLY_PATCH_GUIDANCE}"),
    }
}

/// The prompt cache key (C7): hash(instructions) + hash(tool names) + model family.
pub fn prompt_cache_key(instructions: &str, tools: &[ToolSpec], family: &str) -> String {
    let h1 = Sha256::digest(instructions.as_bytes());
    let mut tools_hash = Sha256::new();
    for t in tools {
        tools_hash.update(t.name.as_bytes());
        tools_hash.update([0]);
    }
    let h2 = tools_hash.finalize();
    format!("{}-{}-{family}", hex8(&h1), hex8(&h2))
}

fn hex8(bytes: &[u8]) -> String {
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Rebuilds history items from a conversation's rollout, oldest first. Only records that
/// kept content contribute: a conversation whose policy keeps none restarts empty.
/// Checks that every (normalised) allowlist entry names one of the `configured` MCP servers,
/// for when no MCP pool runs to check it (C5): an unknown server is an error at open, whether
/// or not any server ever connected. The error names every bad entry.
pub fn check_allowlist_servers(list: &[String], configured: &[String]) -> Result<(), AgentError> {
    let unknown: Vec<String> = list
        .iter()
        .filter(|entry| {
            entry
                .split_once("__")
                .is_none_or(|(server, _)| !configured.iter().any(|c| c == server))
        })
        .map(|entry| format!("`{entry}`"))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(AgentError::invalid(format!(
        "MCP tool allowlist rejected: no configured MCP server for {}",
        unknown.join(", ")
    )))
}

/// Adds one finished task to its conversation's statistics (S11).
pub fn add_task_stats(into: &mut ConversationStats, stats: &TaskStats, status: TaskStatus) {
    into.tasks += 1;
    match status {
        TaskStatus::Error => into.tasks_failed += 1,
        TaskStatus::Cancelled => into.tasks_cancelled += 1,
        TaskStatus::Ok | TaskStatus::MaxSteps => {}
    }
    into.usage.add(&stats.usage);
    into.tool_calls += u64::from(stats.tool_calls);
    into.mcp_calls += u64::from(stats.mcp_calls);
    into.mcp_latency_ms_total += stats.mcp_latency_ms;
}

/// Counts a task that was aborted (it ignored its cancellation past the close timeout, or a
/// crash or restart interrupted it) as a cancelled task: what it used is not known.
pub fn add_aborted_task(into: &mut ConversationStats) {
    into.tasks += 1;
    into.tasks_cancelled += 1;
}

/// A restored conversation's statistics, rebuilt from its record (S11): every task end the
/// record holds, an aborted task counting as a cancelled one. Where the policy kept the whole
/// event (`Full`, `Ttl`) everything comes back, MCP calls included; from headers only, the
/// status, usage and tool calls the headers keep. `history_items` is left for the caller.
pub fn stats_from_records(records: &[RolloutRecord]) -> ConversationStats {
    let mut out = ConversationStats::default();
    let ends =
        |r: &&RolloutRecord| matches!(r.kind, EventName::TaskFinished | EventName::TaskAborted);
    for r in records.iter().filter(ends) {
        if r.kind == EventName::TaskAborted {
            add_aborted_task(&mut out);
            continue;
        }
        match &r.event {
            Some(EventKind::TaskFinished { status, stats, .. }) => {
                add_task_stats(&mut out, stats, *status);
            }
            _ => {
                let Some(status) = r.meta.status else {
                    continue;
                };
                let stats = TaskStats {
                    usage: r.meta.usage.unwrap_or_default(),
                    tool_calls: r.meta.tool_calls.unwrap_or_default(),
                    mcp_calls: r.meta.mcp_calls.unwrap_or_default(),
                    mcp_latency_ms: r.meta.mcp_latency_ms.unwrap_or_default(),
                    ..TaskStats::default()
                };
                add_task_stats(&mut out, &stats, status);
            }
        }
    }
    out
}

/// How many turns a conversation's record shows started (T1): the number of distinct tasks
/// that left a start, a step or an end (under every storage policy at least the start and end
/// of each task are kept, compactions included), or the highest turn number a step or an end
/// names if that is higher (a record read from a later point on). The next turn is this + 1,
/// so turn numbers stay unique after a restore, whatever compactions came before.
pub fn turns_started(records: &[RolloutRecord]) -> u32 {
    let mut tasks = std::collections::HashSet::new();
    let mut highest = 0;
    for r in records {
        if matches!(
            r.kind,
            EventName::TaskStarted
                | EventName::CompactionStarted
                | EventName::StepStarted
                | EventName::TaskFinished
                | EventName::TaskAborted
        ) {
            tasks.extend(r.task_id);
        }
        match &r.event {
            Some(EventKind::StepStarted { turn, .. }) => highest = highest.max(*turn),
            Some(EventKind::TaskFinished { stats, .. }) => highest = highest.max(stats.turn),
            _ => {}
        }
    }
    u32::try_from(tasks.len()).unwrap_or(u32::MAX).max(highest)
}

pub fn history_from_records(records: &[RolloutRecord]) -> Vec<HistoryItem> {
    history_with_owners(records).0
}

/// How the running task was routed, as its records show: a task its supervisor answered (a
/// dispatch, a question, a reply of its own) keeps its exchange without a model step, as the
/// live task does (`LoopState::routed`); one the supervisor left to the turn (a direct reply
/// without text) does not.
#[derive(Default)]
struct Routed {
    decided: Option<troupe_proto::agent::RouteDecision>,
    answered: bool,
}

impl Routed {
    fn kept(&self) -> bool {
        match self.decided {
            None => false,
            Some(troupe_proto::agent::RouteDecision::DirectReply) => self.answered,
            Some(_) => true,
        }
    }
}

/// [`history_from_records`], with the task each item came from (`None`: a compaction's
/// summary), item by item.
pub fn history_with_owners(records: &[RolloutRecord]) -> (Vec<HistoryItem>, Vec<Option<TaskId>>) {
    let mut items = Vec::new();
    let mut owners = Vec::new();
    // Compaction tasks' own items never entered history.
    let mut compactions = std::collections::HashSet::new();
    // Where the running task's items begin: a task that failed before its first model call
    // left no items in the live history either (unless its supervisor answered it: `routed`).
    let mut task_start = 0;
    // A task started and not ended (yet): where its items begin.
    let mut open: Option<usize> = None;
    let mut routed = Routed::default();
    // The running step's tool outputs by call id: a retried call's attempts each left a
    // start and an end; the live history kept the call once, with its last output.
    let mut outputs: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for r in records {
        // Known by their kind, so that an expired one (its content swept) still counts.
        match (r.kind, &r.event) {
            (EventName::CompactionStarted, _) => {
                compactions.extend(r.task_id);
                continue;
            }
            // A compaction whose summary expired still replaced what came before it.
            (EventName::Compacted, None) => {
                items.clear();
                owners.clear();
                outputs.clear();
                continue;
            }
            // A task whose start expired (its input swept) still began there: its later
            // items are its own, and they go if it never ended. (Its end expires after
            // everything it said, so an expired end leaves nothing of it to drop.)
            (EventName::TaskStarted, None) => {
                if let Some(start) = open.take() {
                    items.truncate(start);
                    owners.truncate(start);
                }
                task_start = items.len();
                open = Some(task_start);
                routed = Routed::default();
                outputs.clear();
                continue;
            }
            (EventName::TaskFinished, None) => {
                open = None;
                continue;
            }
            (EventName::TaskAborted, None) => {
                open = None;
                items.truncate(task_start);
                owners.truncate(task_start);
                continue;
            }
            _ => {}
        }
        let Some(event) = &r.event else { continue };
        if r.task_id.is_some_and(|t| compactions.contains(&t))
            && !matches!(event, EventKind::Compacted { .. })
        {
            continue;
        }
        match event {
            EventKind::Compacted {
                summary,
                replaced_items,
            } => {
                items.clear();
                owners.clear();
                outputs.clear();
                items.push(HistoryItem::Summary {
                    text: summary.clone(),
                    replaced_items: *replaced_items,
                });
                owners.push(None);
            }
            EventKind::TaskStarted { input } => {
                // One that started before and never ended was interrupted (its abort was not
                // recorded yet): it added nothing to the live history.
                if let Some(start) = open.take() {
                    items.truncate(start);
                    owners.truncate(start);
                }
                task_start = items.len();
                open = Some(task_start);
                routed = Routed::default();
                outputs.clear();
                items.push(HistoryItem::user(input.clone()));
                owners.push(r.task_id);
            }
            EventKind::RouteDecided { decision, .. } => {
                routed.decided = Some(*decision);
            }
            EventKind::StepStarted { .. } => outputs.clear(),
            EventKind::TaskFinished { stats, .. } if stats.steps == 0 && !routed.kept() => {
                open = None;
                items.truncate(task_start);
                owners.truncate(task_start);
            }
            EventKind::TaskFinished { .. } => open = None,
            // A task aborted (it ignored its cancel, or a crash interrupted it) added nothing
            // to the live history.
            EventKind::TaskAborted { .. } => {
                open = None;
                items.truncate(task_start);
                owners.truncate(task_start);
            }
            EventKind::AssistantMessage { text } => {
                routed.answered = true;
                items.push(HistoryItem::assistant(text.clone()));
                owners.push(r.task_id);
            }
            EventKind::ToolCallStarted { call, .. } => {
                if outputs.contains_key(&call.call_id) {
                    continue; // another attempt of a call already in history
                }
                items.push(HistoryItem::ToolCall(call.clone()));
                owners.push(r.task_id);
            }
            EventKind::ToolCallFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                let item = HistoryItem::ToolOutput(troupe_proto::ToolOutput {
                    call_id: call_id.clone(),
                    output: output.clone(),
                    is_error: *is_error,
                });
                match outputs.get(call_id) {
                    Some(&at) if at < items.len() => items[at] = item,
                    _ => {
                        outputs.insert(call_id.clone(), items.len());
                        items.push(item);
                        owners.push(r.task_id);
                    }
                }
            }
            _ => {}
        }
    }
    // The last task has no end: a crash interrupted it (a restore reads the records before
    // it records the abort), and it is not run again: nothing of it enters history.
    if let Some(start) = open {
        items.truncate(start);
        owners.truncate(start);
    }
    (items, owners)
}

/// Whether a record of this kind, with its content, puts an item in the history.
fn yields_item(kind: EventName) -> bool {
    matches!(
        kind,
        EventName::TaskStarted
            | EventName::AssistantMessage
            | EventName::ToolCallStarted
            | EventName::ToolCallFinished
    )
}

/// How many of `task`'s history items `records` held whose content has expired (`Ttl`): a
/// tool call's attempts are one call and one output, as [`history_with_owners`] keeps them,
/// and count only when no attempt's record of the same side is left (by the call id the
/// headers keep; each record without one counts).
fn expired_items(records: &[RolloutRecord], task: Option<TaskId>) -> usize {
    // Per step (the history tells a step's calls apart by id): (start?, call id) of the
    // expired records and of the kept ones.
    let mut expired = std::collections::HashSet::new();
    let mut kept = std::collections::HashSet::new();
    let mut count = 0;
    for r in records
        .iter()
        .filter(|r| r.task_id.is_some() && r.task_id == task)
    {
        if r.kind == EventName::StepStarted {
            count += expired.difference(&kept).count();
            expired.clear();
            kept.clear();
        }
        match &r.event {
            // A start after a kept end of the same call made no item (another attempt).
            Some(EventKind::ToolCallStarted { call, .. })
                if !kept.contains(&(false, call.call_id.clone())) =>
            {
                kept.insert((true, call.call_id.clone()));
            }
            Some(EventKind::ToolCallFinished { call_id, .. }) => {
                kept.insert((false, call_id.clone()));
            }
            Some(_) => {}
            None if !yields_item(r.kind) => {}
            None => match (r.kind, &r.meta.call_id) {
                (EventName::ToolCallStarted, Some(id)) => {
                    expired.insert((true, id.clone()));
                }
                (EventName::ToolCallFinished, Some(id)) => {
                    expired.insert((false, id.clone()));
                }
                _ => count += 1,
            },
        }
    }
    count + expired.difference(&kept).count()
}

/// What a restore rebuilds of a conversation (S6), from all its records or from its window
/// (what [`crate::rollout::storage::RolloutStorage::read_conversation_window`] returns).
#[derive(Debug, Default)]
pub struct Restored {
    /// The newest checkpoint's summary and the items it stands for.
    pub summary: Option<(String, u64)>,
    /// The history after the summary, oldest first.
    pub items: Vec<HistoryItem>,
    /// The task of each item (`None`: not tied to one).
    pub owners: Vec<Option<TaskId>>,
    /// Items of the first item's task that were trimmed before.
    pub skipped: u64,
    /// Turns started so far (T1): the next turn is this + 1.
    pub turns: u32,
    /// Statistics of every task that ended (S11); `history_items` is left for the caller.
    pub stats: ConversationStats,
    /// When each task of the records read started (unix ms).
    pub task_started_ms: std::collections::HashMap<TaskId, u64>,
    /// When the record holding the summary is due, if it is (`Ttl`).
    pub summary_expires_ms: Option<u64>,
}

/// When the oldest content of a restored summary was written: under `Ttl`, the summary's
/// record is due no later than that content's ttl after it, so the time is its due time less
/// the ttl; not known otherwise (0: as old as can be). `None` without a summary.
pub fn summary_since(
    has_summary: bool,
    expires_ms: Option<u64>,
    policy: troupe_proto::StoragePolicy,
) -> Option<u64> {
    if !has_summary {
        return None;
    }
    match (policy, expires_ms) {
        (troupe_proto::StoragePolicy::Ttl { secs }, Some(due)) => {
            Some(due.saturating_sub(secs.saturating_mul(1000)))
        }
        _ => Some(0),
    }
}

/// When each task of `records` started: its `task_started` (or `compaction_started`) time.
fn task_starts(records: &[RolloutRecord]) -> std::collections::HashMap<TaskId, u64> {
    records
        .iter()
        .filter(|r| {
            matches!(
                r.kind,
                EventName::TaskStarted | EventName::CompactionStarted
            )
        })
        .filter_map(|r| r.task_id.map(|t| (t, r.ts_ms)))
        .collect()
}

/// Rebuilds a conversation from its records: without a `history_checkpoint`, from all of
/// them (as [`history_from_records`], [`turns_started`] and [`stats_from_records`] do); with
/// one, from the newest: its summary, the items of the records from the first record of the
/// task it names on (minus the items of that task it says were trimmed), its turns and
/// statistics plus what the records after it add. The records before the named task's first
/// one are not needed, so a storage may leave them out.
pub fn restore_from_records(records: &[RolloutRecord]) -> Restored {
    let checkpoint = records
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, r)| match &r.event {
            Some(EventKind::HistoryCheckpoint {
                summary,
                replaced_items,
                from_task,
                skip_items,
                turns,
                stats,
            }) => Some((
                i,
                (
                    summary,
                    *replaced_items,
                    *from_task,
                    *skip_items,
                    *turns,
                    stats,
                ),
            )),
            _ => None,
        });
    let Some((at, (summary, replaced, from_task, skip, turns, stats))) = checkpoint else {
        let (items, owners) = history_with_owners(records);
        return Restored {
            summary: None,
            items,
            owners,
            skipped: 0,
            turns: turns_started(records),
            stats: stats_from_records(records),
            task_started_ms: task_starts(records),
            summary_expires_ms: None,
        };
    };
    let after = &records[at + 1..];
    // The named task's first record; without it (not kept), only what follows the checkpoint.
    let (from, skip) = from_task
        .and_then(|task| {
            records[..at]
                .iter()
                .rposition(|r| r.task_id == Some(task) && r.kind == EventName::TaskStarted)
        })
        .map_or((at + 1, 0), |i| (i, skip));
    let (mut items, mut owners) = history_with_owners(&records[from..]);
    // `skip` counts the named task's oldest items, trimmed into the summary. Those whose
    // records have lost their content since (a `Ttl` expiry, oldest first) left no item to
    // skip; and only that task's items are skipped, never a later task's.
    let expired = expired_items(&records[from..], from_task);
    let anchored = owners
        .iter()
        .take_while(|o| o.is_some() && **o == from_task)
        .count();
    let skip_now = usize::try_from(skip)
        .unwrap_or(usize::MAX)
        .saturating_sub(expired)
        .min(anchored);
    items.drain(..skip_now);
    owners.drain(..skip_now);
    let started_after: std::collections::HashSet<TaskId> = after
        .iter()
        .filter(|r| {
            matches!(
                r.kind,
                EventName::TaskStarted | EventName::CompactionStarted
            )
        })
        .filter_map(|r| r.task_id)
        .collect();
    let turns_after = u32::try_from(started_after.len()).unwrap_or(u32::MAX);
    let mut total = stats.clone();
    let later = stats_from_records(after);
    total.tasks += later.tasks;
    total.tasks_failed += later.tasks_failed;
    total.tasks_cancelled += later.tasks_cancelled;
    total.usage.add(&later.usage);
    total.tool_calls += later.tool_calls;
    total.mcp_calls += later.mcp_calls;
    total.mcp_latency_ms_total += later.mcp_latency_ms_total;
    Restored {
        summary: summary.clone().map(|text| (text, replaced)),
        items,
        owners,
        // Of the first item's task: the named one's items before its first one restored,
        // trimmed or expired; none when nothing of it is left.
        skipped: if anchored > 0 {
            skip.max(expired as u64)
        } else {
            0
        },
        turns: turns
            .saturating_add(turns_after)
            .max(turns_started(&records[from.min(at)..])),
        stats: total,
        task_started_ms: task_starts(&records[from.min(at)..]),
        summary_expires_ms: records[at].meta.expires_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_context_leaves_absent_fields_resets_null_ones_and_sets_values() {
        let open = OpenConversation {
            base_instructions: Some("base".into()),
            user_instructions: Some("user".into()),
            mcp_tool_allowlist: Some(vec!["srv__tool".into()]),
            include_plan_tool: true,
            include_apply_patch_tool: true,
            tools_web_search_request: true,
            ..OpenConversation::default()
        };
        let (opened, _) = ConversationContext::from_open(&open, true).unwrap();
        let mut ctx = opened.clone();
        ctx.apply(&SetContext::default()).unwrap();
        assert_eq!(ctx, opened, "absent: unchanged");

        ctx.apply(&SetContext {
            base_instructions: Some(None),
            mcp_tool_allowlist: Some(None),
            include_plan_tool: Some(None),
            ..SetContext::default()
        })
        .unwrap();
        let (defaults, _) =
            ConversationContext::from_open(&OpenConversation::default(), true).unwrap();
        assert_eq!(ctx.base_instructions, defaults.base_instructions);
        assert_eq!(ctx.mcp_tool_allowlist, None, "null: every tool again");
        assert_eq!(ctx.prefs.plan, defaults.prefs.plan);
        assert_eq!(ctx.user_instructions.as_deref(), Some("user"), "not named");
        assert!(ctx.prefs.apply_patch && ctx.prefs.web_search && ctx.prefs.shell);

        let warnings = ctx
            .apply(&SetContext {
                mcp_tool_allowlist: Some(Some(vec!["srv/other".into()])),
                user_instructions: Some(Some("new".into())),
                ..SetContext::default()
            })
            .unwrap();
        assert_eq!(ctx.mcp_tool_allowlist, Some(vec!["srv__other".into()]));
        assert_eq!(ctx.user_instructions.as_deref(), Some("new"));
        assert_eq!(
            warnings.len(),
            1,
            "the deprecated spelling is still reported"
        );
    }
    use troupe_proto::{Json, TaskId};

    fn record(task_id: TaskId, kind: EventName, event: Option<EventKind>) -> RolloutRecord {
        RolloutRecord {
            seq: 0,
            ts_ms: 0,
            conversation_id: None,
            task_id: Some(task_id),
            kind,
            level: crate::rollout::RecordLevel::Minimal,
            event,
            meta: crate::rollout::RecordMeta::default(),
        }
    }

    fn finished(task_id: TaskId, turn: u32) -> RolloutRecord {
        let stats = TaskStats {
            turn,
            ..TaskStats::default()
        };
        let event = EventKind::TaskFinished {
            status: TaskStatus::Ok,
            text: String::new(),
            stats,
            error: None,
        };
        record(task_id, EventName::TaskFinished, Some(event))
    }

    fn event(task_id: Option<TaskId>, event: EventKind) -> RolloutRecord {
        RolloutRecord {
            task_id,
            kind: event.name(),
            event: Some(event),
            ..record(TaskId::new(), EventName::Unknown, None)
        }
    }

    /// `event` of `task_id` recorded as the rollout records a live event (its headers too).
    fn live(task_id: TaskId, event: EventKind) -> RolloutRecord {
        RolloutRecord::live(&troupe_proto::EventEnvelope {
            seq: 0,
            ts_ms: 0,
            session_id: troupe_proto::SessionId::new(),
            conversation_id: None,
            task_id: Some(task_id),
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
        })
    }

    /// `r` as a `Ttl` sweep leaves it: headers, its content gone.
    fn expired(mut r: RolloutRecord) -> RolloutRecord {
        r.event = None;
        r.level = crate::rollout::RecordLevel::Headers;
        r
    }

    /// The end of a task that made one model call.
    fn done(task_id: TaskId, turn: u32) -> RolloutRecord {
        let mut r = finished(task_id, turn);
        if let Some(EventKind::TaskFinished { stats, .. }) = &mut r.event {
            stats.steps = 1;
        }
        r
    }

    #[test]
    fn a_restored_summary_is_as_old_as_its_due_time_says() {
        use troupe_proto::StoragePolicy;
        let ttl = StoragePolicy::Ttl { secs: 5 };
        assert_eq!(summary_since(false, Some(20_000), ttl), None, "no summary");
        assert_eq!(summary_since(true, Some(20_000), ttl), Some(15_000));
        // Not known (written without ttl): as old as can be.
        assert_eq!(summary_since(true, None, ttl), Some(0));
        assert_eq!(summary_since(true, None, StoragePolicy::Full), Some(0));
    }

    #[test]
    fn an_aborted_task_counts_as_cancelled_whatever_the_record_kept_of_it() {
        let (a, b, c) = (TaskId::new(), TaskId::new(), TaskId::new());
        let aborted = event(Some(b), EventKind::TaskAborted { waited_ms: 5 });
        // A record kept under policy `None` has no event, only the kind.
        let bare = record(c, EventName::TaskAborted, None);
        let stats = stats_from_records(&[done(a, 1), aborted, bare]);
        assert_eq!((stats.tasks, stats.tasks_cancelled), (3, 2), "{stats:?}");
    }

    /// Three turns: the second trimmed the first's user message and wrote a checkpoint; the
    /// third was interrupted.
    fn checkpointed(t: [TaskId; 3]) -> Vec<RolloutRecord> {
        let text = |s: &str| EventKind::AssistantMessage { text: s.into() };
        let start = |s: &str| EventKind::TaskStarted { input: s.into() };
        let mut finished_2 = done(t[1], 2);
        if let Some(EventKind::TaskFinished { stats, .. }) = &mut finished_2.event {
            stats.steps = 1;
            stats.tool_calls = 4;
        }
        let mut records = vec![
            event(Some(t[0]), start("a")),
            event(Some(t[0]), EventKind::StepStarted { turn: 1, step: 1 }),
            event(Some(t[0]), text("A")),
            done(t[0], 1),
            event(Some(t[1]), start("b")),
            event(Some(t[1]), text("B")),
            event(
                None,
                EventKind::HistoryTrimmed {
                    removed_items: 1,
                    summary: "S".into(),
                },
            ),
            event(
                None,
                EventKind::HistoryCheckpoint {
                    summary: Some("S".into()),
                    replaced_items: 1,
                    from_task: Some(t[0]),
                    skip_items: 1,
                    turns: 2,
                    stats: ConversationStats {
                        tasks: 1,
                        tool_calls: 3,
                        ..ConversationStats::default()
                    },
                },
            ),
            finished_2,
            event(Some(t[2]), start("c")),
        ];
        for (seq, r) in records.iter_mut().enumerate() {
            r.seq = seq as u64 + 1;
        }
        records
    }

    #[test]
    fn a_checkpoint_restores_its_summary_the_kept_items_turns_and_stats() {
        let t = [TaskId::new(), TaskId::new(), TaskId::new()];
        let records = checkpointed(t);
        let r = restore_from_records(&records);
        assert_eq!(r.summary, Some(("S".to_owned(), 1)));
        assert_eq!(
            r.items,
            [
                HistoryItem::assistant("A"),
                HistoryItem::user("b"),
                HistoryItem::assistant("B"),
            ],
            "the first task's trimmed item is skipped (the last, never ended, adds nothing)"
        );
        assert_eq!(r.owners, [Some(t[0]), Some(t[1]), Some(t[1])]);
        assert_eq!(r.skipped, 1);
        assert_eq!(
            r.turns, 3,
            "two before the checkpoint, one started after it"
        );
        assert_eq!(
            r.stats.tasks, 2,
            "the checkpoint's one and the task that ended after it"
        );
        assert_eq!(r.stats.tool_calls, 7);
        assert_eq!(
            crate::rollout::window_start(&records),
            0,
            "the first task is still kept: its records are in the window"
        );
    }

    #[test]
    fn a_checkpoint_whose_task_expired_skips_no_later_tasks_items() {
        let t = [TaskId::new(), TaskId::new(), TaskId::new()];
        // The first task's user message (the one the checkpoint says was trimmed) expired.
        let mut records = checkpointed(t);
        records[0] = expired(records[0].clone());
        let r = restore_from_records(&records);
        assert_eq!(
            r.items,
            [
                HistoryItem::assistant("A"),
                HistoryItem::user("b"),
                HistoryItem::assistant("B"),
            ]
        );
        // The whole first task expired: nothing of it, everything of the next ones.
        records[2] = expired(records[2].clone());
        let r = restore_from_records(&records);
        assert_eq!(
            r.items,
            [HistoryItem::user("b"), HistoryItem::assistant("B"),]
        );
        assert_eq!(r.owners, [Some(t[1]), Some(t[1])]);
        assert_eq!(r.skipped, 0, "none of the next task's items was trimmed");
    }

    #[test]
    fn an_expired_compaction_still_replaces_what_came_before_it() {
        let (t0, c, t1) = (TaskId::new(), TaskId::new(), TaskId::new());
        let bare = |task_id, kind| record(task_id, kind, None);
        let records = vec![
            event(Some(t0), EventKind::TaskStarted { input: "a".into() }),
            event(Some(t0), EventKind::AssistantMessage { text: "A".into() }),
            done(t0, 1),
            // The compaction's records lost their content (its start and its summary).
            bare(c, EventName::CompactionStarted),
            event(Some(c), EventKind::AssistantMessage { text: "S".into() }),
            bare(c, EventName::Compacted),
            event(Some(t1), EventKind::TaskStarted { input: "b".into() }),
            done(t1, 1),
        ];
        let (items, _) = history_with_owners(&records);
        assert_eq!(
            items,
            [HistoryItem::user("b")],
            "nor the compaction's own answer"
        );
    }

    #[test]
    fn more_expired_than_trimmed_items_of_the_checkpoints_task_count_as_skipped() {
        let (t0, t1) = (TaskId::new(), TaskId::new());
        let text = |s: &str| EventKind::AssistantMessage { text: s.into() };
        let records = vec![
            expired(event(
                Some(t0),
                EventKind::TaskStarted { input: "a".into() },
            )),
            expired(event(Some(t0), text("A1"))),
            event(Some(t0), text("A2")),
            done(t0, 1),
            event(
                None,
                EventKind::HistoryCheckpoint {
                    summary: Some("S".into()),
                    replaced_items: 1,
                    from_task: Some(t0),
                    skip_items: 1,
                    turns: 1,
                    stats: ConversationStats::default(),
                },
            ),
            event(Some(t1), EventKind::TaskStarted { input: "b".into() }),
            done(t1, 1),
        ];
        let r = restore_from_records(&records);
        assert_eq!(
            r.items,
            [HistoryItem::assistant("A2"), HistoryItem::user("b")]
        );
        assert_eq!(r.skipped, 2, "two of the task's items come before A2");
    }

    #[test]
    fn an_expired_retried_tool_call_counts_as_the_two_items_the_history_kept_of_it() {
        let (t0, t1) = (TaskId::new(), TaskId::new());
        let call = troupe_proto::ToolCall {
            call_id: "call-1".into(),
            name: "shell".into(),
            arguments: troupe_proto::Json(serde_json::json!({"command": ["ls"]})),
        };
        let finished = |output: &str| EventKind::ToolCallFinished {
            call_id: "call-1".into(),
            name: "shell".into(),
            output: output.into(),
            is_error: false,
            duration_ms: 1,
            agent_id: None,
        };
        let started = EventKind::ToolCallStarted {
            call: call.clone(),
            agent_id: None,
        };
        // As the rollout writes them (the headers carry the call's id), and sweeps them.
        let real = |event: EventKind| live(t0, event);
        // A task whose call was tried twice (two starts, two ends: one call and one output in
        // the history), then answered; all of it but the answer expired. The checkpoint
        // trimmed the user message, the call and its output (3 items).
        let records = vec![
            expired(real(EventKind::TaskStarted { input: "a".into() })),
            expired(real(EventKind::StepStarted { turn: 1, step: 1 })),
            expired(real(started.clone())),
            expired(real(finished("failed once"))),
            expired(real(started)),
            expired(real(finished("ok"))),
            real(EventKind::AssistantMessage { text: "A".into() }),
            done(t0, 1),
            event(
                None,
                EventKind::HistoryCheckpoint {
                    summary: Some("S".into()),
                    replaced_items: 3,
                    from_task: Some(t0),
                    skip_items: 3,
                    turns: 1,
                    stats: ConversationStats::default(),
                },
            ),
            event(Some(t1), EventKind::TaskStarted { input: "b".into() }),
            done(t1, 1),
        ];
        assert_eq!(expired_items(&records, Some(t0)), 3);
        let r = restore_from_records(&records);
        // Counting each attempt's records (5) would have said five items came before "A".
        assert_eq!(r.skipped, 3);
        assert_eq!(
            r.items,
            [HistoryItem::assistant("A"), HistoryItem::user("b")]
        );
    }

    #[test]
    fn an_expired_attempt_of_a_call_whose_later_attempt_is_kept_counts_nothing() {
        let t0 = TaskId::new();
        let call = troupe_proto::ToolCall {
            call_id: "call-1".into(),
            name: "shell".into(),
            arguments: troupe_proto::Json(serde_json::json!({})),
        };
        let started = EventKind::ToolCallStarted {
            call,
            agent_id: None,
        };
        let finished = EventKind::ToolCallFinished {
            call_id: "call-1".into(),
            name: "shell".into(),
            output: "o".into(),
            is_error: false,
            duration_ms: 1,
            agent_id: None,
        };
        let real = |event: EventKind| live(t0, event);
        let records = vec![
            expired(real(started.clone())),
            expired(real(finished.clone())),
            real(started),
            real(finished),
        ];
        assert_eq!(expired_items(&records, Some(t0)), 0);
        // The sweep stopped inside an attempt: its start expired, its end kept. The kept
        // start of the next attempt made no item (the call already had its output), so the
        // call item is gone: one expired.
        let inside = vec![
            records[0].clone(),
            records[3].clone(),
            records[2].clone(),
            records[3].clone(),
        ];
        assert_eq!(expired_items(&inside, Some(t0)), 1);
        let (items, _) = history_with_owners(&inside);
        assert_eq!(items.len(), 1, "only the output: {items:?}");
        // Without the id in the headers (records written before it), each record counts.
        let mut old = records.clone();
        old[0].meta.call_id = None;
        old[1].meta.call_id = None;
        assert_eq!(expired_items(&old, Some(t0)), 2);
    }

    #[test]
    fn the_window_restores_what_the_whole_record_does() {
        let t = [TaskId::new(), TaskId::new(), TaskId::new()];
        // Older turns before the window: a long conversation's head.
        let mut records: Vec<RolloutRecord> = (0..50)
            .flat_map(|i| {
                let task = TaskId::new();
                [
                    event(
                        Some(task),
                        EventKind::TaskStarted {
                            input: format!("old {i}"),
                        },
                    ),
                    done(task, 0),
                ]
            })
            .collect();
        let tail = checkpointed(t);
        records.extend(tail);
        for (seq, r) in records.iter_mut().enumerate() {
            r.seq = seq as u64 + 1;
        }
        let whole = restore_from_records(&records);
        let start = crate::rollout::window_start(&records);
        assert_eq!(start, 100, "the window starts at the named task");
        let window = restore_from_records(&records[start..]);
        assert_eq!(window.summary, whole.summary);
        assert_eq!(window.items, whole.items);
        assert_eq!(window.owners, whole.owners);
        assert_eq!(window.turns, whole.turns);
        assert_eq!(window.stats, whole.stats);
        assert_eq!(interrupted_tasks_of(&records[start..]), [t[2]]);
    }

    fn interrupted_tasks_of(records: &[RolloutRecord]) -> Vec<TaskId> {
        crate::conversation::interrupted_tasks(records)
    }

    #[test]
    fn a_routed_task_keeps_its_exchange_without_a_model_step() {
        use troupe_proto::agent::{RouteDecision, RouteSource};
        let route = |decision| EventKind::RouteDecided {
            decision,
            agent_id: Some("coder".into()),
            module: None,
            confidence: 1.0,
            source: RouteSource::Hub,
            reason: String::new(),
        };
        let mut failed = finished(TaskId::new(), 1);
        let (a, b, c) = (TaskId::new(), TaskId::new(), TaskId::new());
        failed.task_id = Some(c);
        let records = vec![
            event(
                Some(a),
                EventKind::TaskStarted {
                    input: "/hub coder x".into(),
                },
            ),
            event(Some(a), route(RouteDecision::DispatchAgent)),
            event(
                Some(a),
                EventKind::AssistantMessage {
                    text: "done".into(),
                },
            ),
            finished(a, 1),
            // A dispatch that failed: the question stays, as live.
            event(
                Some(b),
                EventKind::TaskStarted {
                    input: "/hub coder y".into(),
                },
            ),
            event(Some(b), route(RouteDecision::DispatchAgent)),
            finished(b, 2),
            // Left to the turn, whose model call failed: nothing stays.
            event(
                Some(c),
                EventKind::TaskStarted {
                    input: "hello".into(),
                },
            ),
            event(Some(c), route(RouteDecision::DirectReply)),
            failed,
        ];
        assert_eq!(
            history_from_records(&records),
            [
                HistoryItem::user("/hub coder x"),
                HistoryItem::assistant("done"),
                HistoryItem::user("/hub coder y"),
            ]
        );
    }

    #[test]
    fn a_retried_call_is_kept_once_with_its_last_output_and_an_aborted_task_not_at_all() {
        let (t, aborted) = (TaskId::new(), TaskId::new());
        let call = troupe_proto::ToolCall {
            call_id: "c1".into(),
            name: "shell".into(),
            arguments: troupe_proto::Json(serde_json::json!({})),
        };
        let started = || EventKind::ToolCallStarted {
            call: call.clone(),
            agent_id: None,
        };
        let ended = |output: &str, is_error| EventKind::ToolCallFinished {
            call_id: "c1".into(),
            name: "shell".into(),
            output: output.into(),
            is_error,
            duration_ms: 1,
            agent_id: None,
        };
        let records = vec![
            event(Some(t), EventKind::TaskStarted { input: "x".into() }),
            event(Some(t), EventKind::StepStarted { turn: 1, step: 1 }),
            event(Some(t), started()),
            event(Some(t), ended("busy", true)),
            event(Some(t), started()),
            event(Some(t), ended("ok", false)),
            event(Some(t), EventKind::StepStarted { turn: 1, step: 2 }),
            // The next step's call may reuse the id: it is a call of its own.
            event(Some(t), started()),
            event(Some(t), ended("again", false)),
            event(Some(t), EventKind::AssistantMessage { text: "y".into() }),
            done(t, 1),
            event(
                Some(aborted),
                EventKind::TaskStarted {
                    input: "hangs".into(),
                },
            ),
            event(Some(aborted), EventKind::StepStarted { turn: 2, step: 1 }),
            event(Some(aborted), started()),
            event(Some(aborted), EventKind::TaskAborted { waited_ms: 5000 }),
        ];
        let output = |text: &str| {
            HistoryItem::ToolOutput(troupe_proto::ToolOutput {
                call_id: "c1".into(),
                output: text.into(),
                is_error: false,
            })
        };
        assert_eq!(
            history_from_records(&records),
            [
                HistoryItem::user("x"),
                HistoryItem::ToolCall(call.clone()),
                output("ok"),
                HistoryItem::ToolCall(call.clone()),
                output("again"),
                HistoryItem::assistant("y"),
            ]
        );
    }

    /// A task a crash interrupted has a start and no end until the restore that follows
    /// records its abort: it adds nothing to the rebuilt history either way, so the prompt
    /// is the same after the first restart as after the next (it carried the unanswered
    /// request once, as if it were to be acted on).
    #[test]
    fn a_task_without_an_end_adds_nothing_to_history() {
        let (done_task, cut, later) = (TaskId::new(), TaskId::new(), TaskId::new());
        let cut_short = vec![
            event(
                Some(cut),
                EventKind::TaskStarted {
                    input: "rm it".into(),
                },
            ),
            event(Some(cut), EventKind::StepStarted { turn: 2, step: 1 }),
            event(
                Some(cut),
                EventKind::AssistantMessage {
                    text: "on it".into(),
                },
            ),
        ];
        let mut records = vec![
            event(
                Some(done_task),
                EventKind::TaskStarted { input: "x".into() },
            ),
            event(
                Some(done_task),
                EventKind::AssistantMessage { text: "y".into() },
            ),
            done(done_task, 1),
        ];
        records.extend(cut_short.clone());
        let kept = [HistoryItem::user("x"), HistoryItem::assistant("y")];
        assert_eq!(
            history_from_records(&records),
            kept,
            "the last task has no end"
        );
        let mut aborted = records.clone();
        aborted.push(event(Some(cut), EventKind::TaskAborted { waited_ms: 0 }));
        assert_eq!(history_from_records(&aborted), kept, "its abort recorded");
        // A task after it: the interrupted one is still left out.
        records.push(event(
            Some(later),
            EventKind::TaskStarted { input: "z".into() },
        ));
        records.push(event(
            Some(later),
            EventKind::AssistantMessage { text: "w".into() },
        ));
        records.push(done(later, 1));
        assert_eq!(
            history_from_records(&records),
            [
                HistoryItem::user("x"),
                HistoryItem::assistant("y"),
                HistoryItem::user("z"),
                HistoryItem::assistant("w"),
            ]
        );
    }

    #[test]
    fn an_interrupted_task_whose_start_expired_adds_nothing_to_history() {
        let (done_task, cut) = (TaskId::new(), TaskId::new());
        let mut records = vec![
            event(
                Some(done_task),
                EventKind::TaskStarted { input: "x".into() },
            ),
            event(
                Some(done_task),
                EventKind::AssistantMessage { text: "y".into() },
            ),
            done(done_task, 1),
            // Its start swept (ttl), its later items not yet; no end (a crash).
            expired(event(
                Some(cut),
                EventKind::TaskStarted {
                    input: "long job".into(),
                },
            )),
            event(
                Some(cut),
                EventKind::AssistantMessage {
                    text: "working".into(),
                },
            ),
            event(
                Some(cut),
                EventKind::ToolCallStarted {
                    call: troupe_proto::ToolCall {
                        call_id: "c1".into(),
                        name: "shell".into(),
                        arguments: troupe_proto::Json(serde_json::json!({})),
                    },
                    agent_id: None,
                },
            ),
        ];
        let kept = [HistoryItem::user("x"), HistoryItem::assistant("y")];
        assert_eq!(history_from_records(&records), kept);
        // Its abort recorded, then a later task: still nothing of it.
        records.push(event(Some(cut), EventKind::TaskAborted { waited_ms: 0 }));
        assert_eq!(history_from_records(&records), kept);
        // One that ended keeps what it said after its expired start.
        let whole = TaskId::new();
        records.push(expired(event(
            Some(whole),
            EventKind::TaskStarted { input: "q".into() },
        )));
        records.push(event(
            Some(whole),
            EventKind::AssistantMessage { text: "a".into() },
        ));
        records.push(done(whole, 3));
        assert_eq!(
            history_from_records(&records),
            [
                HistoryItem::user("x"),
                HistoryItem::assistant("y"),
                HistoryItem::assistant("a"),
            ]
        );
    }

    #[test]
    fn without_a_checkpoint_everything_is_replayed() {
        let t = TaskId::new();
        let records = vec![
            event(Some(t), EventKind::TaskStarted { input: "x".into() }),
            event(Some(t), EventKind::AssistantMessage { text: "y".into() }),
            done(t, 1),
        ];
        let r = restore_from_records(&records);
        assert_eq!(r.summary, None);
        assert_eq!(r.items, history_from_records(&records));
        assert_eq!(r.owners, [Some(t), Some(t)]);
        assert_eq!(r.turns, 1);
        assert_eq!(r.stats.tasks, 1);
    }

    #[test]
    fn without_a_pool_an_allowlist_is_checked_against_the_configured_servers() {
        let configured = ["fs".to_owned(), "git".to_owned()];
        let ok = ["fs__read".to_owned(), "git__log".to_owned()];
        assert!(check_allowlist_servers(&ok, &configured).is_ok());
        assert!(check_allowlist_servers(&[], &[]).is_ok());
        let bad = [
            "fs__read".to_owned(),
            "web__search".to_owned(),
            "x__y".to_owned(),
        ];
        let err = check_allowlist_servers(&bad, &configured).unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("`web__search`") && msg.contains("`x__y`"),
            "{msg}"
        );
        assert!(!msg.contains("fs__read"), "{msg}");
        // No server configured: any entry is unknown.
        assert!(check_allowlist_servers(&ok, &[]).is_err());
    }

    #[test]
    fn stats_are_rebuilt_from_task_ends_whole_or_headers_only() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut whole = finished(a, 1);
        if let Some(EventKind::TaskFinished { stats, .. }) = &mut whole.event {
            stats.tool_calls = 3;
            stats.mcp_calls = 2;
            stats.mcp_latency_ms = 40;
            stats.usage.output_tokens = 7;
        }
        let mut headers = record(b, EventName::TaskFinished, None);
        headers.meta.status = Some(TaskStatus::Error);
        headers.meta.tool_calls = Some(1);
        let started = record(b, EventName::TaskStarted, None);
        let stats = stats_from_records(&[whole, started, headers]);
        assert_eq!((stats.tasks, stats.tasks_failed), (2, 1));
        assert_eq!((stats.tool_calls, stats.mcp_calls), (4, 2));
        assert_eq!(stats.mcp_latency_ms_total, 40);
        assert_eq!(stats.usage.output_tokens, 7);
    }

    #[test]
    fn compactions_count_as_turns_when_restored() {
        let (a, compact, b) = (TaskId::new(), TaskId::new(), TaskId::new());
        // Headers only (no events): a message, a compaction (its start is a
        // `compaction_started`), another message that never ended.
        let records = vec![
            record(a, EventName::TaskStarted, None),
            record(a, EventName::StepStarted, None),
            record(a, EventName::TaskFinished, None),
            record(compact, EventName::CompactionStarted, None),
            record(compact, EventName::TaskFinished, None),
            record(b, EventName::TaskStarted, None),
        ];
        assert_eq!(turns_started(&records), 3);
        // Policy `none` keeps no compaction start, but the compaction's end.
        let minimal = vec![
            record(a, EventName::TaskStarted, None),
            record(a, EventName::TaskFinished, None),
            record(compact, EventName::TaskFinished, None),
        ];
        assert_eq!(turns_started(&minimal), 2);
        assert_eq!(turns_started(&[]), 0);
    }

    #[test]
    fn a_record_read_from_later_on_continues_from_the_turn_it_names() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let step = EventKind::StepStarted { turn: 7, step: 1 };
        let records = vec![
            finished(a, 6),
            record(b, EventName::StepStarted, Some(step)),
        ];
        assert_eq!(turns_started(&records), 7);
    }

    #[test]
    fn slash_names_are_normalised_with_a_warning() {
        let (names, warnings) =
            normalize_allowlist(&["fs/read_file".into(), "mem__create".into()]).unwrap();
        assert_eq!(names, vec!["fs__read_file", "mem__create"]);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("deprecated"));
    }

    #[test]
    fn illegal_names_are_rejected_by_name() {
        let err =
            normalize_allowlist(&["bad name".into(), "ok__x".into(), "x".into()]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("bad name") && msg.contains(", x"), "{msg}");
    }

    #[test]
    fn policies_only_narrow() {
        use troupe_proto::{ApprovalPolicy as A, SandboxPolicy as S};
        assert_eq!(
            narrow(S::WorkspaceWrite, Some(S::ReadOnly)),
            (S::ReadOnly, false)
        );
        assert_eq!(
            narrow(S::WorkspaceWrite, Some(S::FullAccess)),
            (S::WorkspaceWrite, true)
        );
        assert_eq!(narrow(S::WorkspaceWrite, None), (S::WorkspaceWrite, false));
        // `on_failure` is the widest: only under it may a command leave the sandbox.
        assert_eq!(narrow(A::Never, Some(A::OnFailure)), (A::Never, true));
        assert_eq!(narrow(A::Always, Some(A::OnFailure)), (A::Always, true));
        assert_eq!(narrow(A::Always, Some(A::Never)), (A::Always, true));
        assert_eq!(narrow(A::OnFailure, Some(A::Never)), (A::Never, false));
        assert_eq!(narrow(A::OnFailure, Some(A::Always)), (A::Always, false));
        assert_eq!(narrow(A::Never, Some(A::Always)), (A::Always, false));
    }

    #[test]
    fn instruction_priority() {
        assert_eq!(choose_instructions(Some("o"), Some("b"), false), "o");
        assert_eq!(choose_instructions(None, Some("b"), false), "b");
        assert!(choose_instructions(None, None, false).ends_with(APPLY_PATCH_GUIDANCE));
        assert_eq!(choose_instructions(None, None, true), DEFAULT_INSTRUCTIONS);
    }

    #[test]
    fn cache_key_changes_with_tools_and_instructions() {
        let t = |n: &str| ToolSpec {
            name: n.into(),
            description: String::new(),
            parameters: Json::empty_object(),
        };
        let a = prompt_cache_key("x", &[t("a")], "f");
        assert_eq!(a, prompt_cache_key("x", &[t("a")], "f"));
        assert_ne!(a, prompt_cache_key("y", &[t("a")], "f"));
        assert_ne!(a, prompt_cache_key("x", &[t("b")], "f"));
        assert!(a.ends_with("-f"));
    }
}
