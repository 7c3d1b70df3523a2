//! The agent side: troupe served as an ACP agent, so that an editor that speaks ACP drives a
//! troupe session over stdio. Each ACP session is one troupe conversation (its id is the
//! conversation id).
//!
//! | ACP | troupe |
//! |---|---|
//! | `initialize` | protocol 1, `loadSession: true` |
//! | `session/new` | opens a conversation |
//! | `session/load` | restores a stored conversation (from the session's rollout), replays its messages as `user_message_chunk` / `agent_message_chunk` |
//! | `session/prompt` | a user message; `AssistantChunk` → `agent_message_chunk`, `ToolCallStarted` → `tool_call`, `ToolCallFinished` → `tool_call_update`, `PlanUpdated` → `plan`; the task's status → `stopReason` (`ok` → `end_turn`, `max_steps` → `max_turn_requests`, `cancelled` → `cancelled`, `error` → a JSON-RPC error) |
//! | `session/request_permission` (to the client) | a troupe approval (a shell command, a patch) of the conversation: `allow_once` → approve once, `allow_always` → approve for the conversation, `reject_once` or no answer → deny |
//! | `session/cancel` | cancels the conversation's running tasks |
//!
//! Prompts run in tasks of their own, so the connection keeps reading (a permission answer, a
//! cancel) while they run.

use crate::metrics;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use troupe_actors::SessionHandle;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_proto::{
    AgentError, ApprovalDecision, ConversationId, EventEnvelope, EventKind, OpenConversation,
    PlanStepStatus, SessionId, TaskStatus,
};

/// What `troupe acp` serves.
#[derive(Clone)]
pub struct Served {
    pub session: SessionHandle,
    pub session_id: SessionId,
    /// Where stored conversations are read from for `session/load` (none: only conversations
    /// open in this process can be loaded).
    pub rollout: Option<Arc<dyn RolloutStorage>>,
    /// How conversations are opened.
    pub conversation: OpenConversation,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

/// ACP's "resource not found".
const NOT_FOUND: i32 = -32002;

fn not_found(what: &str) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(NOT_FOUND, format!("no such session: {what}"))
}

fn troupe_error(e: &AgentError) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(-32603, e.to_string())
}

fn conversation_of(id: &acp::SessionId) -> Result<ConversationId, agent_client_protocol::Error> {
    ConversationId::from_str(&id.0).map_err(|_| not_found(&id.0))
}

/// Serves ACP on `input`/`output` (stdin/stdout) until the client closes its end.
pub async fn serve(
    served: Served,
    input: impl tokio::io::AsyncRead + Send + 'static,
    output: impl tokio::io::AsyncWrite + Send + 'static,
) -> Result<(), agent_client_protocol::Error> {
    let served = Arc::new(served);
    let (s_new, s_load, s_prompt, s_cancel) = (
        served.clone(),
        served.clone(),
        served.clone(),
        served.clone(),
    );
    Agent
        .v1()
        .name("troupe")
        .on_receive_request(
            async move |_: acp::InitializeRequest, responder, _cx| {
                responder.respond(
                    acp::InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(acp::AgentCapabilities::new().load_session(true))
                        .agent_info(acp::Implementation::new(
                            "troupe",
                            env!("CARGO_PKG_VERSION"),
                        )),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_: acp::NewSessionRequest, responder, _cx| match s_new
                .session
                .open(s_new.conversation.clone())
                .await
            {
                Ok(id) => {
                    tracing::info!(conversation = %id, "ACP session opened");
                    responder.respond(acp::NewSessionResponse::new(acp::SessionId::new(
                        id.to_string(),
                    )))
                }
                Err(e) => responder.respond_with_error(troupe_error(&e)),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::LoadSessionRequest, responder, cx| {
                load(&s_load, request, responder, &cx).await
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::PromptRequest, responder, cx: ConnectionTo<Client>| {
                let served = s_prompt.clone();
                let conn = cx.clone();
                cx.spawn(async move {
                    prompt(&served, request, responder, conn).await;
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: acp::CancelNotification, _cx| {
                let Ok(conversation) = conversation_of(&n.session_id) else {
                    return Ok(());
                };
                let session = s_cancel.session.clone();
                tokio::spawn(async move {
                    if let Ok(tasks) = session.tasks(Some(conversation)).await {
                        for t in tasks {
                            let _ = session.cancel_task(t.task_id).await;
                        }
                    }
                });
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(ByteStreams::new(output.compat_write(), input.compat()))
        .await
}

/// Opens the stored conversation (or finds it open) and replays its messages.
async fn load(
    served: &Served,
    request: acp::LoadSessionRequest,
    responder: Responder<acp::LoadSessionResponse>,
    cx: &ConnectionTo<Client>,
) -> Result<(), agent_client_protocol::Error> {
    let conversation = match conversation_of(&request.session_id) {
        Ok(c) => c,
        Err(e) => return responder.respond_with_error(e),
    };
    let records = match &served.rollout {
        Some(rollout) => {
            let rollout = rollout.clone();
            let session_id = served.session_id;
            tokio::task::spawn_blocking(move || rollout.read_conversation(session_id, conversation))
                .await
                .map_err(|e| AgentError::internal(e.to_string()))
                .and_then(|r| r)
        }
        None => Ok(Vec::new()),
    };
    let records = match records {
        Ok(r) => r,
        Err(e) => return responder.respond_with_error(troupe_error(&e)),
    };
    let open = served
        .session
        .list()
        .await
        .map(|ids| ids.contains(&conversation))
        .unwrap_or(false);
    if records.is_empty() && !open {
        return responder.respond_with_error(not_found(&request.session_id.0));
    }
    if !open
        && let Err(e) = served
            .session
            .restore(conversation, served.conversation.clone())
            .await
    {
        return responder.respond_with_error(troupe_error(&e));
    }
    // The history, as the protocol asks: the client rebuilds the conversation from it.
    for record in &records {
        let update = match &record.event {
            Some(EventKind::TaskStarted { input }) => acp::SessionUpdate::UserMessageChunk(
                acp::ContentChunk::new(acp::ContentBlock::from(input.clone())),
            ),
            Some(EventKind::AssistantMessage { text }) => acp::SessionUpdate::AgentMessageChunk(
                acp::ContentChunk::new(acp::ContentBlock::from(text.clone())),
            ),
            _ => continue,
        };
        cx.send_notification(acp::SessionNotification::new(
            request.session_id.clone(),
            update,
        ))?;
    }
    tracing::info!(%conversation, restored = !open, "ACP session loaded");
    responder.respond(acp::LoadSessionResponse::new())
}

fn kind_of(tool: &str) -> acp::ToolKind {
    match tool {
        "shell" => acp::ToolKind::Execute,
        "apply_patch" => acp::ToolKind::Edit,
        "update_plan" => acp::ToolKind::Think,
        _ => acp::ToolKind::Other,
    }
}

/// The `session/update` an event of the prompt's conversation becomes, if any.
fn update_of(event: &EventKind) -> Option<acp::SessionUpdate> {
    Some(match event {
        EventKind::AssistantChunk { delta } => acp::SessionUpdate::AgentMessageChunk(
            acp::ContentChunk::new(acp::ContentBlock::from(delta.clone())),
        ),
        EventKind::ToolCallStarted { call, .. } => acp::SessionUpdate::ToolCall(
            acp::ToolCall::new(
                call.call_id.clone(),
                format!("{} {}", call.name, call.arguments.0),
            )
            .kind(kind_of(&call.name))
            .status(acp::ToolCallStatus::InProgress)
            .raw_input(call.arguments.0.clone()),
        ),
        EventKind::ToolCallFinished {
            call_id,
            output,
            is_error,
            ..
        } => acp::SessionUpdate::ToolCallUpdate(acp::ToolCallUpdate::new(
            call_id.clone(),
            acp::ToolCallUpdateFields::new()
                .status(if *is_error {
                    acp::ToolCallStatus::Failed
                } else {
                    acp::ToolCallStatus::Completed
                })
                .content(vec![acp::ToolCallContent::from(output.clone())]),
        )),
        EventKind::PlanUpdated { plan, .. } => acp::SessionUpdate::Plan(acp::Plan::new(
            plan.iter()
                .map(|s| {
                    acp::PlanEntry::new(
                        s.step.clone(),
                        acp::PlanEntryPriority::Medium,
                        match s.status {
                            PlanStepStatus::Pending => acp::PlanEntryStatus::Pending,
                            PlanStepStatus::InProgress => acp::PlanEntryStatus::InProgress,
                            PlanStepStatus::Completed => acp::PlanEntryStatus::Completed,
                        },
                    )
                })
                .collect(),
        )),
        _ => return None,
    })
}

/// The troupe decision an ACP permission outcome stands for.
fn decision_of(outcome: &acp::RequestPermissionOutcome) -> ApprovalDecision {
    match outcome {
        acp::RequestPermissionOutcome::Selected(s) => match &*s.option_id.0 {
            ALLOW_ONCE => ApprovalDecision::ApproveOnce,
            ALLOW_ALWAYS => ApprovalDecision::ApproveForConversation { ttl_secs: None },
            _ => ApprovalDecision::Deny {
                reason: Some("rejected by the ACP client".into()),
            },
        },
        _ => ApprovalDecision::Deny {
            reason: Some("the ACP client cancelled the request".into()),
        },
    }
}

const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";

/// Asks the client about a troupe approval and hands its answer to the session.
fn ask_client(
    served: &Served,
    conn: &ConnectionTo<Client>,
    session_id: acp::SessionId,
    tool_call_id: Option<String>,
    approval_id: troupe_proto::ApprovalId,
    command: &[String],
    reason: &str,
) {
    let title = command.join(" ");
    let request = acp::RequestPermissionRequest::new(
        session_id,
        acp::ToolCallUpdate::new(
            tool_call_id.unwrap_or_else(|| approval_id.to_string()),
            acp::ToolCallUpdateFields::new()
                .title(title)
                .kind(acp::ToolKind::Execute)
                .raw_input(serde_json::json!({"command": command, "reason": reason})),
        ),
        vec![
            acp::PermissionOption::new(
                ALLOW_ONCE,
                "Allow once",
                acp::PermissionOptionKind::AllowOnce,
            ),
            acp::PermissionOption::new(
                ALLOW_ALWAYS,
                "Allow for this conversation",
                acp::PermissionOptionKind::AllowAlways,
            ),
            acp::PermissionOption::new(
                REJECT_ONCE,
                "Reject",
                acp::PermissionOptionKind::RejectOnce,
            ),
        ],
    );
    let sent = conn.send_request(request).block_task();
    let session = served.session.clone();
    tokio::spawn(async move {
        let decision = match sent.await {
            Ok(r) => decision_of(&r.outcome),
            Err(e) => ApprovalDecision::Deny {
                reason: Some(format!("the ACP client did not answer: {}", e.message)),
            },
        };
        tracing::info!(%approval_id, approves = decision.approves(), "ACP client answered an approval");
        let approves = decision.approves();
        // An approval already answered (withdrawn by a cancel, timed out) is not an error here.
        // One the answer does not fit (an agent's question, an MCP form whose required field
        // has no default: "allow" says nothing to fill them with) is denied rather than left
        // waiting for its timeout.
        if let Err(error) = session.respond_approval(approval_id, decision).await
            && approves
        {
            tracing::info!(%approval_id, %error, "an allow does not answer this request: denied");
            let _ = session
                .respond_approval(
                    approval_id,
                    ApprovalDecision::Deny {
                        reason: Some(format!("the ACP client's allow cannot answer it: {error}")),
                    },
                )
                .await;
        }
    });
}

/// How long after the reply the prompt waits for the task's last events.
const LAST_EVENTS: Duration = Duration::from_secs(2);

/// Runs one prompt: the user message's task, its events as session updates, its approvals
/// as permission requests; answers with the stop reason.
async fn prompt(
    served: &Served,
    request: acp::PromptRequest,
    responder: Responder<acp::PromptResponse>,
    conn: ConnectionTo<Client>,
) {
    let conversation = match conversation_of(&request.session_id) {
        Ok(c) => c,
        Err(e) => {
            let _ = responder.respond_with_error(e);
            return;
        }
    };
    let open = served
        .session
        .list()
        .await
        .is_ok_and(|ids| ids.contains(&conversation));
    if !open {
        let _ = responder.respond_with_error(not_found(&request.session_id.0));
        return;
    }
    let text: Vec<String> = request
        .prompt
        .iter()
        .filter_map(|b| match b {
            acp::ContentBlock::Text(t) => Some(t.text.clone()),
            acp::ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
            _ => None,
        })
        .collect();
    let text = text.join("\n");
    let span = tracing::info_span!("acp.serve.prompt", troupe.conversation.id = %conversation, acp.stop_reason = tracing::field::Empty);
    let _entered = span.clone();
    let mut events = match served.session.subscribe().await {
        Ok(rx) => rx,
        Err(e) => {
            let _ = responder.respond_with_error(troupe_error(&e));
            return;
        }
    };
    let session = served.session.clone();
    let reply = session.message(conversation, text);
    tokio::pin!(reply);
    let mut last_call: Option<String> = None;
    // Every approval asked of the client, once, whichever way it was learnt of.
    let mut asked = std::collections::HashSet::new();
    let sid = request.session_id.clone();
    let forward =
        |e: &EventEnvelope,
         last_call: &mut Option<String>,
         asked: &mut std::collections::HashSet<troupe_proto::ApprovalId>| {
            if e.conversation_id != Some(conversation) {
                return;
            }
            if let EventKind::ToolCallStarted { call, .. } = &e.event {
                *last_call = Some(call.call_id.clone());
            }
            if let EventKind::ApprovalRequested {
                approval_id,
                command,
                reason,
                ..
            } = &e.event
                && asked.insert(*approval_id)
            {
                ask_client(
                    served,
                    &conn,
                    sid.clone(),
                    last_call.clone(),
                    *approval_id,
                    command,
                    reason,
                );
            }
            if let Some(update) = update_of(&e.event) {
                let _ = conn.send_notification(acp::SessionNotification::new(sid.clone(), update));
            }
        };
    // The live channel may drop events (a slow reader) or end (the session's Rollout was
    // replaced): the approvals missed meanwhile are read from the approval store and asked,
    // so none waits for its timeout unseen.
    let catch_up = async |asked: &mut std::collections::HashSet<troupe_proto::ApprovalId>,
                          last_call: &Option<String>| {
        let Ok(pending) = served.session.pending_approvals().await else {
            return;
        };
        for p in pending {
            if p.conversation_id == conversation && asked.insert(p.approval_id) {
                ask_client(
                    served,
                    &conn,
                    sid.clone(),
                    last_call.clone(),
                    p.approval_id,
                    &p.command,
                    &p.reason,
                );
            }
        }
    };
    let done = loop {
        tokio::select! {
            r = &mut reply => break r,
            e = events.recv() => match e {
                Ok(e) => forward(&e, &mut last_call, &mut asked),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "ACP prompt fell behind the session's events");
                    catch_up(&mut asked, &last_call).await;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    // Subscribed again (to the new Rollout), what was missed asked for.
                    match served.session.subscribe().await {
                        Ok(rx) => events = rx,
                        Err(e) => {
                            tracing::warn!(error = %e, "ACP prompt lost the session's events");
                            break (&mut reply).await;
                        }
                    }
                    catch_up(&mut asked, &last_call).await;
                }
            },
        }
    };
    // The reply can overtake the task's last events: forward them up to its end.
    if let Ok(reply) = &done {
        let task = reply.task_id;
        let _ = tokio::time::timeout(LAST_EVENTS, async {
            while let Ok(e) = events.recv().await {
                forward(&e, &mut last_call, &mut asked);
                if e.task_id == Some(task) && matches!(e.event, EventKind::TaskFinished { .. }) {
                    break;
                }
            }
        })
        .await;
    }
    let stop = match &done {
        Ok(r) => match r.status {
            TaskStatus::Ok => Ok(acp::StopReason::EndTurn),
            TaskStatus::MaxSteps => Ok(acp::StopReason::MaxTurnRequests),
            TaskStatus::Cancelled => Ok(acp::StopReason::Cancelled),
            TaskStatus::Error => Err(r
                .error
                .clone()
                .unwrap_or_else(|| AgentError::internal("the task failed"))),
        },
        Err(e) => Err(e.clone()),
    };
    let label = match &stop {
        Ok(acp::StopReason::EndTurn) => "end_turn",
        Ok(acp::StopReason::MaxTurnRequests) => "max_turn_requests",
        Ok(acp::StopReason::Cancelled) => "cancelled",
        Ok(_) => "other",
        Err(_) => "error",
    };
    span.record("acp.stop_reason", label);
    metrics::prompt_served(label);
    let _ = match stop {
        Ok(reason) => responder.respond(acp::PromptResponse::new(reason)),
        Err(e) => responder.respond_with_error(troupe_error(&e)),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_answers_become_troupe_decisions() {
        let pick = |id: &str| {
            acp::RequestPermissionOutcome::Selected(acp::SelectedPermissionOutcome::new(
                id.to_owned(),
            ))
        };
        assert_eq!(
            decision_of(&pick(ALLOW_ONCE)),
            ApprovalDecision::ApproveOnce
        );
        assert_eq!(
            decision_of(&pick(ALLOW_ALWAYS)),
            ApprovalDecision::ApproveForConversation { ttl_secs: None }
        );
        assert!(!decision_of(&pick(REJECT_ONCE)).approves());
        assert!(!decision_of(&acp::RequestPermissionOutcome::Cancelled).approves());
    }
}
