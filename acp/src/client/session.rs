//! The session operations over one [`Run`]: opening a session (new, loaded or resumed, as
//! [`open_plan`] decides from the agent's capabilities), and running a prompt turn while its
//! updates stream out as [`AcpEvent`]s and its permission requests go to the turn's handler.

use super::process::{Inbound, Run, wait_exit};
use super::{PermissionHandler, Replaced, SessionOpened, SessionOrigin, StopReason, Turn};
use crate::error::AcpError;
use crate::event::{AcpEvent, PermissionDecision, PermissionRequest, choose_option};
use crate::metrics;
use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema as acp;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a session is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenPlan {
    New,
    Load(String),
    Resume(String),
    /// The agent offers neither `session/load` nor `session/resume`: a new session replaces
    /// the previous one.
    Replace {
        previous: String,
        reason: String,
    },
}

/// `session/load` when the agent offers it (the brief's preference: the agent replays the
/// history, and troupe drops the replay), else `session/resume`, else a new session.
pub(crate) fn open_plan(caps: &acp::AgentCapabilities, previous: Option<&str>) -> OpenPlan {
    match previous {
        None => OpenPlan::New,
        Some(id) if caps.load_session => OpenPlan::Load(id.to_owned()),
        Some(id) if caps.session_capabilities.resume.is_some() => OpenPlan::Resume(id.to_owned()),
        Some(id) => OpenPlan::Replace {
            previous: id.to_owned(),
            reason: "the agent offers neither session/load nor session/resume".into(),
        },
    }
}

/// How long after a failed request troupe waits to learn whether the process died.
const EXIT_PROBE: Duration = Duration::from_millis(500);

/// A request's error: the process's exit when it died meanwhile, else the agent's refusal.
async fn request_error(
    run: &Run,
    method: &'static str,
    e: &agent_client_protocol::Error,
) -> AcpError {
    match tokio::time::timeout(EXIT_PROBE, wait_exit(run.exited.clone())).await {
        Ok(exit) => AcpError::Exited {
            during: method,
            status: exit.status,
            stderr: exit.stderr,
        },
        Err(_) => AcpError::refused(method, e),
    }
}

/// Drops what the agent sent outside a turn (the history a `session/load` replays);
/// a permission request nobody asked for is answered `cancelled`.
pub(crate) fn drain(run: &mut Run) {
    while let Ok(item) = run.inbound.try_recv() {
        if let Inbound::Permission { responder, .. } = item {
            let _ = responder.respond(cancelled());
        }
    }
}

/// Opens a session on `run` following `open_plan`; a load or resume the agent refuses is
/// replaced by a new session, and the result says why.
pub(crate) async fn open(
    run: &mut Run,
    cwd: &Path,
    previous: Option<&str>,
) -> Result<SessionOpened, AcpError> {
    let plan = open_plan(&run.init.agent_capabilities, previous);
    let replaced = match plan {
        OpenPlan::New => None,
        OpenPlan::Load(id) => {
            let request = acp::LoadSessionRequest::new(id.clone(), cwd);
            let answer = run.conn.send_request(request).block_task().await;
            // The replayed history was queued before the response: drop it.
            drain(run);
            match answer {
                Ok(_) => return Ok(opened(id, SessionOrigin::Loaded, None)),
                Err(e) => {
                    let error = request_error(run, "session/load", &e).await;
                    if matches!(error, AcpError::Exited { .. }) {
                        return Err(error);
                    }
                    Some(Replaced {
                        previous: id,
                        reason: error.to_string(),
                    })
                }
            }
        }
        OpenPlan::Resume(id) => {
            let request = acp::ResumeSessionRequest::new(id.clone(), cwd);
            match run.conn.send_request(request).block_task().await {
                Ok(_) => return Ok(opened(id, SessionOrigin::Resumed, None)),
                Err(e) => {
                    let error = request_error(run, "session/resume", &e).await;
                    if matches!(error, AcpError::Exited { .. }) {
                        return Err(error);
                    }
                    Some(Replaced {
                        previous: id,
                        reason: error.to_string(),
                    })
                }
            }
        }
        OpenPlan::Replace { previous, reason } => Some(Replaced { previous, reason }),
    };
    let created = run
        .conn
        .send_request(acp::NewSessionRequest::new(cwd))
        .block_task()
        .await;
    drain(run);
    match created {
        Ok(r) => Ok(opened(
            r.session_id.0.to_string(),
            SessionOrigin::New,
            replaced,
        )),
        Err(e) => Err(request_error(run, "session/new", &e).await),
    }
}

fn opened(session_id: String, origin: SessionOrigin, replaced: Option<Replaced>) -> SessionOpened {
    SessionOpened {
        session_id,
        origin,
        replaced,
    }
}

fn cancelled() -> acp::RequestPermissionResponse {
    acp::RequestPermissionResponse::new(acp::RequestPermissionOutcome::Cancelled)
}

/// What a turn ended with, before the supervisor adds what it knows.
pub(crate) struct TurnEnd {
    pub stop_reason: StopReason,
    pub text: String,
}

/// A permission request being decided: its key in the turn's table, and the decision.
type Deciding = std::pin::Pin<Box<dyn Future<Output = (u64, PermissionDecision)> + Send>>;

/// The permission requests of a turn that wait for their handler's decision.
#[derive(Default)]
struct Undecided {
    next: u64,
    waiting: HashMap<u64, (PermissionRequest, Responder<acp::RequestPermissionResponse>)>,
    deciding: FuturesUnordered<Deciding>,
}

/// Runs one `session/prompt` on `session_id`: streams its updates to `turn.events`, asks
/// `turn.permissions` about each permission request (several may be decided at once), and
/// on `cancel` sends `session/cancel` and answers the undecided requests `cancelled`, as the
/// protocol asks. Ends with the prompt's result; a process that dies meanwhile is
/// `Exited { during: "session/prompt" }`.
pub(crate) async fn prompt(
    run: &mut Run,
    agent_id: &str,
    session_id: &str,
    turn: &Turn,
    cancel: &CancellationToken,
) -> Result<TurnEnd, AcpError> {
    let request = acp::PromptRequest::new(
        acp::SessionId::new(session_id),
        vec![acp::ContentBlock::Text(acp::TextContent::new(
            turn.text.clone(),
        ))],
    );
    let response = run.conn.send_request(request).block_task();
    tokio::pin!(response);
    let exited = wait_exit(run.exited.clone());
    tokio::pin!(exited);
    let mut text = String::new();
    let mut undecided = Undecided::default();
    let mut cancel_sent = false;
    let ended = loop {
        tokio::select! {
            // Updates before the response: they were queued before it arrived.
            biased;
            Some(item) = run.inbound.recv() => {
                match item {
                    Inbound::Update(n) => {
                        if let Some(event) = AcpEvent::from_update(&n.update) {
                            if let AcpEvent::MessageChunk { text: t } = &event {
                                text.push_str(t);
                            }
                            emit(turn, event).await;
                        }
                    }
                    Inbound::Permission { request, responder } => {
                        let ask = PermissionRequest::from_acp(&request);
                        if cancel_sent {
                            answer(turn, agent_id, ask, responder, PermissionDecision::Cancelled).await;
                            continue;
                        }
                        tracing::info!(tool_call = %ask.tool_call_id, "ACP agent asks permission");
                        emit(turn, AcpEvent::PermissionRequested(ask.clone())).await;
                        let handler: Arc<dyn PermissionHandler> = turn.permissions.clone();
                        let cancel = cancel.clone();
                        let key = undecided.next;
                        undecided.next += 1;
                        undecided.waiting.insert(key, (ask.clone(), responder));
                        undecided.deciding.push(Box::pin(async move {
                            let decision = tokio::select! {
                                d = handler.decide(&ask) => d,
                                () = cancel.cancelled() => PermissionDecision::Cancelled,
                            };
                            (key, decision)
                        }));
                    }
                }
            }
            Some((key, decision)) = undecided.deciding.next() => {
                if let Some((ask, responder)) = undecided.waiting.remove(&key) {
                    answer(turn, agent_id, ask, responder, decision).await;
                }
            }
            () = cancel.cancelled(), if !cancel_sent => {
                cancel_sent = true;
                let _ = run.conn.send_notification(acp::CancelNotification::new(
                    acp::SessionId::new(session_id),
                ));
                tracing::info!("session/cancel sent");
            }
            r = &mut response => break r,
            exit = &mut exited => {
                // Nobody is left to answer: the requests' responders go with the turn.
                return Err(AcpError::Exited { during: "session/prompt", status: exit.status, stderr: exit.stderr });
            }
        }
    };
    // Whatever came in with the response.
    while let Ok(item) = run.inbound.try_recv() {
        match item {
            Inbound::Update(n) => {
                if let Some(event) = AcpEvent::from_update(&n.update) {
                    if let AcpEvent::MessageChunk { text: t } = &event {
                        text.push_str(t);
                    }
                    emit(turn, event).await;
                }
            }
            Inbound::Permission { request, responder } => {
                let ask = PermissionRequest::from_acp(&request);
                answer(
                    turn,
                    agent_id,
                    ask,
                    responder,
                    PermissionDecision::Cancelled,
                )
                .await;
            }
        }
    }
    // Requests still undecided when the turn is over have nobody to act on them.
    for (_, (ask, responder)) in std::mem::take(&mut undecided.waiting) {
        answer(
            turn,
            agent_id,
            ask,
            responder,
            PermissionDecision::Cancelled,
        )
        .await;
    }
    match ended {
        Ok(r) => Ok(TurnEnd {
            stop_reason: StopReason::from_acp(r.stop_reason),
            text,
        }),
        Err(e) => Err(request_error(run, "session/prompt", &e).await),
    }
}

async fn emit(turn: &Turn, event: AcpEvent) {
    if let Some(events) = &turn.events {
        // A caller that stopped listening does not stop the turn.
        let _ = events.send(event).await;
    }
}

async fn answer(
    turn: &Turn,
    agent_id: &str,
    ask: PermissionRequest,
    responder: Responder<acp::RequestPermissionResponse>,
    decision: PermissionDecision,
) {
    let outcome = match choose_option(&ask.options, decision) {
        Some(id) => acp::RequestPermissionOutcome::Selected(acp::SelectedPermissionOutcome::new(
            id.to_owned(),
        )),
        None => acp::RequestPermissionOutcome::Cancelled,
    };
    let _ = responder.respond(acp::RequestPermissionResponse::new(outcome));
    metrics::permission_answered(decision);
    tracing::info!(agent = agent_id, tool_call = %ask.tool_call_id, decision = decision.as_str(), "ACP permission answered");
    emit(
        turn,
        AcpEvent::PermissionAnswered {
            tool_call_id: ask.tool_call_id,
            decision,
        },
    )
    .await;
}

/// The span of one prompt turn.
pub(crate) fn prompt_span(agent_id: &str, session_id: &str) -> tracing::Span {
    tracing::info_span!(
        "acp.prompt",
        otel.kind = "client",
        troupe.agent.id = agent_id,
        acp.session.id = session_id,
        acp.stop_reason = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn caps(v: serde_json::Value) -> acp::AgentCapabilities {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_previous_session_is_loaded_resumed_or_replaced() {
        let both = caps(json!({"loadSession": true, "sessionCapabilities": {"resume": {}}}));
        let resume = caps(json!({"sessionCapabilities": {"resume": {}}}));
        let neither = caps(json!({}));
        assert_eq!(open_plan(&both, None), OpenPlan::New);
        assert_eq!(open_plan(&both, Some("s1")), OpenPlan::Load("s1".into()));
        assert_eq!(
            open_plan(&resume, Some("s1")),
            OpenPlan::Resume("s1".into())
        );
        assert!(matches!(
            open_plan(&neither, Some("s1")),
            OpenPlan::Replace { previous, .. } if previous == "s1"
        ));
    }
}
