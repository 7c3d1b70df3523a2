//! Replay (A9, seed 003 §12): a recorded task run again from its rollout, without a network
//! and without side effects, to see whether the same events and the same error class come
//! out.
//!
//! # Protocol
//! [`replay`] reads the task's [`Recording`] from its conversation's records (a task whose
//! records keep no content, or no end, is refused with what is missing), then runs it again
//! through the real pipeline: a Session of its own, in which the task's conversation is
//! restored from the records before the task (same id, same history, same turn number) and
//! sent the task's message. Its ports are replaced:
//! - the model answers each step with what the recording says it answered
//!   ([`playback::RecordedModel`]: streamed pieces, text and tool calls, or the error a failed
//!   step ended with, so that the same error class comes out);
//! - tool calls and dispatches take their recorded results ([`Effects::Recorded`]): a shell
//!   command, a patch, an MCP call or a dispatch to an agent (its approval too) is not run,
//!   and nobody is asked. What the task decides alone runs as usual: the routing of a call
//!   and its refusal, `update_plan`, the tool error policy, the supervisor's routing;
//! - the tools offered are those the recording shows the task reached (built-ins, MCP tools
//!   by name); no command runner, no MCP connection, no agent provider exists in the session;
//! - the rollout is the in-memory storage the caller gives: nothing is written to disk.
//!
//! The replay's events are then compared with the recorded ones ([`compare`]).
//!
//! # Guarantees
//! No model is called, no command runs, no file is written, no MCP server is reached, no
//! agent is dispatched to. The configuration the caller gives is the one the task is run
//! under (its tool error policy, its agents and router): a task replayed under another
//! configuration than it ran with may come out otherwise, which the report shows. The step
//! limit is taken from the recording (a task that stopped at `max_steps` made that many
//! steps).
//!
//! # Failure
//! A replay that cannot run (its session does not start, it takes longer than
//! [`REPLAY_TIMEOUT`]) is an error; a difference is a report, not an error.
//!
//! What is not replayed: a cancel that came from outside between two steps (the recording
//! shows where the task stopped, not who stopped it); a task an agent ran for a dispatch is
//! replayed as a message of its conversation (so a supervisor, if the configuration has one,
//! routes it).

pub mod compare;
pub mod metrics;
pub mod playback;
pub mod recording;
pub mod report;

pub use compare::{Comparison, Difference, compare};
pub use recording::{Recording, Refusal, RefusalReason};
pub use report::{PlayedBack, ReplayOutcome, ReplayReport, RunEnd};

use crate::SessionHandle;
use crate::agents::{AgentPorts, RouterMode};
use crate::history::{LocalSummarizer, SummaryMode};
use crate::ports::{ApproxTokens, Effects, McpPort};
use crate::rollout::RolloutRecord;
use crate::rollout::storage::RolloutStorage;
use crate::session::{SessionConfig, SessionPorts};
use playback::{NoBindings, RecordedEffects, RecordedMcp, RecordedModel};
use recording::RecordedEnd;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;
use troupe_proto::agent::RouteSource;
use troupe_proto::{
    AgentError, ConversationId, EventKind, OpenConversation, SessionId, StoragePolicy, TaskId,
    TaskStatus,
};

/// Longest a replay may run: nothing in it waits for anything outside the process.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(120);

/// What a replay needs.
pub struct ReplayRequest {
    pub task_id: TaskId,
    /// The session the task ran in.
    pub session_id: SessionId,
    /// The records of the task's conversation, in `seq` order (the task's and those before
    /// it; later ones are not read).
    pub records: Vec<RolloutRecord>,
    /// The session's configuration, as the task ran under it.
    pub config: SessionConfig,
    /// The configuration's agents (`None`: none): the supervisor routes again, dispatches
    /// are played back.
    pub agents: Option<AgentPorts>,
    /// An empty storage in memory: the replay's record.
    pub storage: Arc<dyn RolloutStorage>,
}

/// Replays one task (see the module doc) inside a `troupe.replay` span, and counts it.
pub async fn replay(request: ReplayRequest) -> Result<ReplayReport, AgentError> {
    let span = tracing::info_span!(
        "troupe.replay",
        otel.name = "replay",
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        task_id = %request.task_id,
        session_id = %request.session_id,
        conversation_id = tracing::field::Empty,
        replay_task_id = tracing::field::Empty,
        "troupe.replay.outcome" = tracing::field::Empty,
        "troupe.replay.differences" = tracing::field::Empty,
    );
    let result = run(request).instrument(span.clone()).await;
    match &result {
        Ok(report) => {
            metrics::replayed(report.outcome);
            span.record("troupe.replay.outcome", report.outcome.as_str());
            if let Some(events) = &report.events {
                span.record("troupe.replay.differences", events.difference_count);
            }
            span.in_scope(|| tracing::info!(outcome = report.outcome.as_str(), "replayed"));
        }
        Err(error) => {
            span.record("otel.status_code", "error");
            span.record("error.type", error.kind().as_str());
            span.in_scope(|| tracing::warn!(%error, "replay failed"));
        }
    }
    result
}

async fn run(request: ReplayRequest) -> Result<ReplayReport, AgentError> {
    let recording = match Recording::of_task(request.task_id, &request.records) {
        Ok(recording) => recording,
        Err(refusal) => return Ok(ReplayReport::refused(request.task_id, refusal)),
    };
    let conversation_id = recording.conversation_id;
    tracing::Span::current().record("conversation_id", tracing::field::display(conversation_id));
    let before: Vec<RolloutRecord> = request
        .records
        .into_iter()
        .filter(|r| r.conversation_id == Some(conversation_id) && r.seq < recording.first_seq)
        .collect();
    let config = replay_config(request.config, &recording, &before);
    seed(
        &request.storage,
        request.session_id,
        conversation_id,
        before,
    )
    .await?;

    let model = Arc::new(RecordedModel::new(recording.steps.clone()));
    let effects = Arc::new(
        RecordedEffects::new(recording.tool_results.clone(), recording.dispatches.clone())
            .with_end_error(recording.end.error.clone()),
    );
    let ports = SessionPorts {
        model: model.clone(),
        mcp: (!recording.external_tools.is_empty()).then(|| {
            Arc::new(RecordedMcp::new(recording.external_tools.iter().cloned())) as Arc<dyn McpPort>
        }),
        mcp_connector: None,
        exec: None,
        effects: Effects::Recorded(effects.clone()),
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(ApproxTokens),
        rollout_storage: Some(request.storage.clone()),
        agents: replay_agents(&recording, request.agents),
    };
    let (session, join) = SessionHandle::start(request.session_id, config, ports).await?;
    let sent = tokio::time::timeout(
        REPLAY_TIMEOUT,
        session.message(conversation_id, recording.input.clone()),
    )
    .await;
    let shutdown = session.shutdown().await;
    let _ = join.await;
    let reply = sent.map_err(|_| AgentError::timeout("the replay", REPLAY_TIMEOUT))??;
    shutdown?;
    tracing::Span::current().record("replay_task_id", tracing::field::display(reply.task_id));

    let storage = request.storage.clone();
    let session_id = request.session_id;
    let replayed =
        tokio::task::spawn_blocking(move || storage.read_conversation(session_id, conversation_id))
            .await
            .map_err(|e| {
                AgentError::internal(format!("reading the replay's record failed: {e}"))
            })??;
    let replayed: Vec<EventKind> = replayed
        .into_iter()
        .filter(|r| r.task_id == Some(reply.task_id))
        .filter_map(|r| r.event)
        .collect();

    let events = compare(&recording.events, &replayed);
    let recorded_end = RunEnd::new(
        recording.task_id,
        recording.end.status,
        recording.end.error.clone(),
    );
    let replayed_end = RunEnd::new(reply.task_id, reply.status, reply.error);
    let same_end = recorded_end.status == replayed_end.status
        && recorded_end.error_kind == replayed_end.error_kind;
    let outcome = if same_end && events.difference_count == 0 {
        ReplayOutcome::Identical
    } else {
        ReplayOutcome::Differs
    };
    Ok(ReplayReport {
        task_id: recording.task_id,
        outcome,
        refusal: None,
        session_id: Some(request.session_id),
        conversation_id: Some(conversation_id),
        recorded: Some(recorded_end),
        replayed: Some(replayed_end),
        same_end: Some(same_end),
        played_back: Some(PlayedBack {
            model_answers: model.answered(),
            tool_results: effects.tool_results_played(),
            dispatch_answers: effects.dispatches_played(),
        }),
        events: Some(events),
    })
}

/// The session configuration of a replay: the caller's, with the task's conversation as its
/// root (restored from `before`, kept whole in memory), the tools the recording reached, the
/// step limit the recording shows, and nothing that reaches outside (no MCP servers to
/// connect, the local summarizer).
pub fn replay_config(
    mut config: SessionConfig,
    recording: &Recording,
    before: &[RolloutRecord],
) -> SessionConfig {
    let (base_instructions, user_instructions) = before
        .iter()
        .rev()
        .find_map(|r| match &r.event {
            Some(EventKind::ConversationOpened {
                base_instructions,
                user_instructions,
                ..
            }) => Some((base_instructions.clone(), user_instructions.clone())),
            _ => None,
        })
        .unwrap_or_default();
    config.root_id = Some(recording.conversation_id);
    config.root = OpenConversation {
        base_instructions,
        user_instructions,
        include_plan_tool: recording.builtins.plan,
        include_apply_patch_tool: recording.builtins.apply_patch,
        storage_policy: StoragePolicy::Full,
        ..OpenConversation::default()
    };
    config.mcp_servers = Vec::new();
    let conversation = &mut config.conversation;
    conversation.shell_tool = recording.builtins.shell;
    conversation.summary = SummaryMode::Local;
    conversation.record_content = false;
    conversation.task.max_steps = max_steps_for(&recording.end, conversation.task.max_steps);
    config
}

/// The step limit of a replay: the steps made, when the task stopped at its limit; else the
/// configured limit, raised to the steps made if it is lower (the task ran under a higher one).
pub fn max_steps_for(end: &RecordedEnd, configured: u32) -> u32 {
    match end.status {
        TaskStatus::MaxSteps => end.steps.max(1),
        _ => configured.max(end.steps).max(1),
    }
}

/// The agents of a replay: the configuration's when the recording shows them at work (a
/// route decided, a `dispatch_agent` call), so that the supervisor routes again, the way the
/// recording shows it routed (its model, or the rules); with no provider, no model of their
/// own (the replay's model answers the routing step) and no bindings, since no dispatch
/// leaves the task.
pub fn replay_agents(recording: &Recording, agents: Option<AgentPorts>) -> Option<AgentPorts> {
    let at_work = recording.routed_by.is_some()
        || recording
            .tool_results
            .iter()
            .any(|t| t.call.name == crate::agents::route::DISPATCH_TOOL);
    let mut agents = agents.filter(|_| at_work)?;
    match recording.routed_by {
        Some(RouteSource::Model) => agents.settings.router = RouterMode::Model,
        Some(RouteSource::Rules) => agents.settings.router = RouterMode::Rules,
        Some(RouteSource::Hub) | None => {}
    }
    Some(AgentPorts {
        factories: Vec::new(),
        models: std::collections::BTreeMap::new(),
        bindings: Arc::new(NoBindings),
        ..agents
    })
}

/// The report of a task that cannot be replayed before anything is read (no rollout holds
/// it), counted and traced like any replay.
pub fn refused(task_id: TaskId, refusal: Refusal) -> ReplayReport {
    let span = tracing::info_span!("troupe.replay", otel.name = "replay", task_id = %task_id, "troupe.replay.outcome" = ReplayOutcome::Refused.as_str());
    span.in_scope(|| tracing::info!(message = %refusal.message, "not replayed"));
    metrics::replayed(ReplayOutcome::Refused);
    ReplayReport::refused(task_id, refusal)
}

/// Writes the conversation's earlier records into the replay's storage, so that the
/// conversation is restored from them as they were.
async fn seed(
    storage: &Arc<dyn RolloutStorage>,
    session_id: SessionId,
    conversation_id: ConversationId,
    before: Vec<RolloutRecord>,
) -> Result<(), AgentError> {
    if before.is_empty() {
        return Ok(());
    }
    let storage = storage.clone();
    tokio::task::spawn_blocking(move || {
        let mut sink = storage.open_sink(session_id)?;
        let high_water = before.last().map_or(0, |r| r.seq);
        let write = |e: crate::rollout::storage::SinkError| {
            AgentError::internal(format!("seeding the replay's record: {e}"))
        };
        for record in &before {
            sink.append(Some(conversation_id), record).map_err(write)?;
        }
        sink.commit(false, high_water).map_err(write)
    })
    .await
    .map_err(|e| AgentError::internal(format!("seeding the replay's record failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::AgentSettings;
    use troupe_proto::agent::AgentCatalog;

    fn end(status: TaskStatus, steps: u32) -> RecordedEnd {
        RecordedEnd {
            status,
            error: None,
            steps,
        }
    }

    #[test]
    fn the_step_limit_follows_the_recording() {
        assert_eq!(max_steps_for(&end(TaskStatus::MaxSteps, 3), 100), 3);
        assert_eq!(max_steps_for(&end(TaskStatus::Ok, 3), 100), 100);
        // Ran under a higher limit than configured now: at least its steps.
        assert_eq!(max_steps_for(&end(TaskStatus::Ok, 12), 10), 12);
        assert_eq!(max_steps_for(&end(TaskStatus::Error, 0), 0), 1);
    }

    fn recording(routed_by: Option<RouteSource>, dispatch_call: bool) -> Recording {
        let call = |name: &str| troupe_proto::ToolCall {
            call_id: "c".into(),
            name: name.into(),
            arguments: troupe_proto::Json(serde_json::json!({})),
        };
        Recording {
            task_id: TaskId::new(),
            conversation_id: ConversationId::new(),
            input: String::new(),
            steps: Vec::new(),
            tool_results: vec![recording::RecordedToolResult {
                call: call(if dispatch_call {
                    crate::agents::route::DISPATCH_TOOL
                } else {
                    "shell"
                }),
                result: Err(crate::ports::ToolFailure::from(AgentError::internal("x"))),
            }],
            dispatches: Vec::new(),
            builtins: Default::default(),
            external_tools: Default::default(),
            routed_by,
            end: end(TaskStatus::Ok, 1),
            events: Vec::new(),
            first_seq: 1,
        }
    }

    #[test]
    fn agents_take_part_only_when_the_recording_shows_them_and_never_run() {
        let ports = || AgentPorts {
            catalog: Arc::new(AgentCatalog::default()),
            settings: AgentSettings::default(),
            factories: Vec::new(),
            models: std::collections::BTreeMap::from([(
                "sup".to_owned(),
                Arc::new(RecordedModel::new(Vec::new())) as Arc<dyn crate::ports::ModelClient>,
            )]),
            bindings: Arc::new(NoBindings),
            live: None,
        };
        let model = Some(RouteSource::Model);
        assert!(replay_agents(&recording(None, false), Some(ports())).is_none());
        assert!(replay_agents(&recording(model, false), None).is_none());
        let routed = replay_agents(&recording(model, false), Some(ports())).unwrap();
        assert!(routed.models.is_empty(), "the replay's model routes");
        assert!(routed.factories.is_empty());
        // Routed as recorded: the configuration's default here is the rules.
        assert_eq!(routed.settings.router, RouterMode::Model);
        let ruled = replay_agents(&recording(Some(RouteSource::Rules), false), Some(ports()));
        assert_eq!(ruled.unwrap().settings.router, RouterMode::Rules);
        assert!(replay_agents(&recording(None, true), Some(ports())).is_some());
    }

    #[test]
    fn the_replayed_conversation_offers_what_was_reached_and_keeps_everything() {
        let mut r = recording(None, false);
        r.builtins.shell = true;
        r.builtins.apply_patch = true;
        r.end = end(TaskStatus::MaxSteps, 4);
        let mut configured = SessionConfig {
            mcp_servers: vec![crate::ports::McpServerConfig {
                name: "srv".into(),
                transport: crate::ports::McpTransport::StreamableHttp {
                    url: "http://127.0.0.1:1/mcp".into(),
                    headers: Default::default(),
                    oauth: None,
                },
            }],
            ..SessionConfig::default()
        };
        configured.conversation.summary = SummaryMode::Model {
            timeout: Duration::from_secs(1),
        };
        let opened = RolloutRecord {
            seq: 0,
            ts_ms: 0,
            conversation_id: Some(r.conversation_id),
            task_id: None,
            kind: troupe_proto::EventName::ConversationOpened,
            level: crate::rollout::RecordLevel::Full,
            event: Some(EventKind::ConversationOpened {
                storage_policy: StoragePolicy::Ttl { secs: 5 },
                base_instructions: Some("be brief".into()),
                user_instructions: None,
            }),
            meta: Default::default(),
        };
        let c = replay_config(configured, &r, &[opened]);
        assert_eq!(c.root_id, Some(r.conversation_id));
        assert_eq!(c.root.storage_policy, StoragePolicy::Full);
        assert_eq!(c.root.base_instructions.as_deref(), Some("be brief"));
        assert!(c.root.include_apply_patch_tool && !c.root.include_plan_tool);
        assert!(c.conversation.shell_tool);
        assert!(c.mcp_servers.is_empty());
        assert_eq!(c.conversation.summary, SummaryMode::Local);
        assert_eq!(c.conversation.task.max_steps, 4);
    }
}
