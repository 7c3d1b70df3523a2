//! A server's elicitation and sampling requests, answered on behalf of the task whose tool
//! call caused them (see `calls` for how that task is found).
//!
//! Both go through the session's ApprovalStore, as an approval request of that conversation
//! and task that a human answers like any other (`pending_approvals` / `respond_approval`):
//! - elicitation: approved → accept with the resolved content, denied → decline, no answer in
//!   time (or the call ended) → cancel;
//! - sampling: approved → the session's model (the conversation's `ModelClient`) answers the
//!   server's messages, with the server's system prompt and no tools; denied, timed out or
//!   failed → a JSON-RPC error to the server.
//!
//! Every wait also ends when the call that caused the request ends: nobody is left to use the
//! answer. And it is never given longer than the call has left before its timeout: the
//! approval's deadline is the call's when that is the earlier one.

use super::calls::InFlightCall;
use super::metrics::{self, RequestKind, RequestOutcome};
use crate::approval_store::{ApprovalMsg, Ask, AskTimeout, Granted, ask_until_answered};
use crate::directory::ServiceRef;
use crate::history::{HistoryLimits, HistoryStore, LocalSummarizer};
use crate::ports::{DeltaSink, ElicitOutcome, ModelClient, ModelRequest};
use serde_json::{Value, json};
use std::sync::Arc;
use tracing::Instrument;
use troupe_proto::{AgentError, ApprovalDecision, ApprovalSubject, HistoryItem, Json, Role};

/// Longest excerpt of a sampling request shown as the approval's reason.
const REASON_EXCERPT: usize = 200;

/// What answering one request needs: the call it belongs to and the session's services.
pub struct Requester {
    pub server: String,
    pub call: InFlightCall,
    pub approvals: Option<ServiceRef<ApprovalMsg>>,
    pub model: Option<Arc<dyn ModelClient>>,
}

impl Requester {
    fn span(&self, kind: RequestKind) -> tracing::Span {
        // The MCP conventions' server span: the client serves a request the server sent.
        let method = match kind {
            RequestKind::Elicitation => "elicitation/create",
            RequestKind::Sampling => "sampling/createMessage",
        };
        tracing::info_span!(
            parent: &self.call.span,
            "mcp_server_request",
            otel.name = method,
            otel.kind = "server",
            "mcp.method.name" = method,
            kind = kind.as_str(),
            mcp_server = %self.server,
            conversation_id = %self.call.conversation_id,
            task_id = %self.call.task_id,
        )
    }

    /// Asks a human through the session's ApprovalStore (the next one if it fails while the
    /// request waits); `Cancelled` when the call ends first, the store's answer otherwise
    /// (`Internal` if the session has no store any more). However the wait ends without an
    /// answer (the call ended, or the server withdrew its request and the client dropped this
    /// future), the request is withdrawn rather than left for a human to answer in vain.
    async fn ask(&self, ask: Ask) -> Result<Granted, AgentError> {
        let Some(approvals) = &self.approvals else {
            return Err(AgentError::ApprovalDenied {
                command: ask.command,
                reason: "this session has no approval path for MCP requests".into(),
            });
        };
        // A call already past its timeout asks nobody.
        if self.call.deadline <= tokio::time::Instant::now() {
            return Err(AgentError::cancelled(
                "the tool call that caused the request has timed out",
            ));
        }
        let mut gone =
            crate::approval_store::CallersGoneOnDrop::new(approvals, self.call.conversation_id);
        // No longer than the call has left: past its timeout the answer reaches nobody, and the
        // deadline shown with the pending request is the one that holds.
        let asked = ask_until_answered(
            approvals,
            ask,
            AskTimeout::Before(self.call.deadline),
            crate::approval_store::metrics::Asker::Mcp,
        );
        // The task computes nothing while a human decides: its slot goes back for the wait,
        // and the server's request goes on (the answer reaches it) only once it is back.
        let answer = match &self.call.slot {
            Some(slot) => slot
                .wait_for_human(
                    &self.call.cancel,
                    "the tool call that caused the request ended",
                    asked,
                )
                .await
                .ok(),
            None => tokio::select! {
                biased;
                () = self.call.cancel.cancelled() => None,
                answer = asked => Some(answer),
            },
        };
        match answer {
            Some(answer) => {
                gone.answered();
                answer.unwrap_or_else(|| {
                    Err(AgentError::internal("the session's approval store is gone"))
                })
            }
            // Our wait is over (its reply port is dropped): `gone` withdraws the request.
            None => Err(AgentError::cancelled(
                "the tool call that caused the request ended",
            )),
        }
    }
}

/// `elicitation/create`: a human answers through the approval path.
pub async fn elicit(requester: &Requester, message: String, schema: Json) -> ElicitOutcome {
    let span = requester.span(RequestKind::Elicitation);
    let ask = Ask {
        conversation_id: requester.call.conversation_id,
        task_id: Some(requester.call.task_id),
        command: mcp_command(&requester.server, RequestKind::Elicitation),
        reason: message.clone(),
        subject: ApprovalSubject::McpElicitation {
            server: requester.server.clone(),
            message,
            schema,
        },
        workdir: None,
    };
    let answer = requester.ask(ask).instrument(span.clone()).await;
    let outcome = elicit_outcome(answer);
    let label = match &outcome {
        ElicitOutcome::Accept(_) => RequestOutcome::Accepted,
        ElicitOutcome::Decline => RequestOutcome::Declined,
        ElicitOutcome::Cancel => RequestOutcome::Cancelled,
    };
    metrics::server_request(RequestKind::Elicitation, label);
    span.in_scope(|| tracing::info!(outcome = label.as_str(), "MCP elicitation answered"));
    outcome
}

/// What the server hears of the store's answer to an elicitation.
pub fn elicit_outcome(answer: Result<Granted, AgentError>) -> ElicitOutcome {
    match answer {
        Ok(Granted::Decided(ApprovalDecision::ApproveWithContent { content })) => {
            ElicitOutcome::Accept(content)
        }
        // The store resolves every approval of an elicitation to its content; an empty
        // object stands in should another approval ever get through.
        Ok(_) => ElicitOutcome::Accept(Json::empty_object()),
        Err(AgentError::ApprovalDenied { .. }) => ElicitOutcome::Decline,
        // Nobody answered in time, the call ended, or the store went away.
        Err(_) => ElicitOutcome::Cancel,
    }
}

/// `sampling/createMessage`: a human approves, then the session's model answers.
pub async fn sample(requester: &Requester, request: Json) -> Result<Json, AgentError> {
    let span = requester.span(RequestKind::Sampling);
    let result = sample_inner(requester, request)
        .instrument(span.clone())
        .await;
    let label = match &result {
        Ok(_) => RequestOutcome::Accepted,
        Err(AgentError::ApprovalDenied { .. }) => RequestOutcome::Declined,
        Err(AgentError::Timeout { .. } | AgentError::Cancelled { .. }) => RequestOutcome::Cancelled,
        Err(_) => RequestOutcome::Failed,
    };
    metrics::server_request(RequestKind::Sampling, label);
    span.in_scope(|| match &result {
        Ok(_) => tracing::info!("MCP sampling answered by the model"),
        Err(error) => tracing::info!(%error, outcome = label.as_str(), "MCP sampling refused"),
    });
    result
}

async fn sample_inner(requester: &Requester, request: Json) -> Result<Json, AgentError> {
    let server = &requester.server;
    let prompt = SamplingPrompt::parse(&request.0).map_err(|message| AgentError::McpError {
        server: server.clone(),
        message,
    })?;
    let model = requester
        .model
        .clone()
        .ok_or_else(|| AgentError::McpError {
            server: server.clone(),
            message: "this session has no model to sample".into(),
        })?;
    let ask = Ask {
        conversation_id: requester.call.conversation_id,
        task_id: Some(requester.call.task_id),
        command: mcp_command(server, RequestKind::Sampling),
        reason: prompt.reason(server),
        subject: ApprovalSubject::McpSampling {
            server: server.clone(),
            request,
        },
        workdir: None,
    };
    requester.ask(ask).await?;
    // The model sees only what the server sent: an empty history, the server's messages.
    let history = HistoryStore::new(
        HistoryLimits::default(),
        Arc::new(LocalSummarizer::default()),
    )
    .snapshot();
    let cache_key = format!("mcp-sampling:{server}");
    let model_request = ModelRequest {
        conversation_id: requester.call.conversation_id,
        task_id: requester.call.task_id,
        instructions: prompt.system.as_deref().unwrap_or(""),
        prompt: history.view(None, &[], &prompt.items),
        tools: &[],
        prompt_cache_key: &cache_key,
    };
    let info = model.info();
    // Not a step of the task (step 0, no estimate), but a model call all the same.
    let chat = crate::task::spans::chat(
        requester.call.conversation_id,
        requester.call.task_id,
        &info.provider,
        &info.model,
        0,
        0,
    );
    let response = model
        .step(model_request, &mut Discard, &requester.call.cancel)
        .instrument(chat.clone())
        .await
        .inspect_err(|e| crate::task::spans::record_error(&chat, e))?;
    crate::task::spans::record_response(&chat, &response);
    Ok(sampling_result(&response.text, &info.model))
}

/// Streamed text of a sampling call goes nowhere: the server gets the whole answer.
struct Discard;

impl DeltaSink for Discard {
    fn text_delta(&mut self, _delta: &str) {}
}

/// The command a human reads for an MCP request: `mcp <server> elicitation|sampling`.
pub fn mcp_command(server: &str, kind: RequestKind) -> Vec<String> {
    vec![
        "mcp".to_owned(),
        server.to_owned(),
        kind.as_str().to_owned(),
    ]
}

/// A sampling request as a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPrompt {
    pub system: Option<String>,
    /// The server's messages, in order.
    pub items: Vec<HistoryItem>,
}

impl SamplingPrompt {
    /// Reads `messages` (text content kept; other content as a short placeholder) and
    /// `systemPrompt`.
    pub fn parse(request: &Value) -> Result<Self, String> {
        let messages = request
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("a sampling request needs `messages`")?;
        let mut items = Vec::with_capacity(messages.len());
        for message in messages {
            let role = match message.get("role").and_then(Value::as_str) {
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                other => return Err(format!("a sampling message has role {other:?}")),
            };
            let text = match message.get("content") {
                Some(Value::Array(parts)) => parts.iter().map(content_text).collect::<Vec<_>>(),
                Some(part) => vec![content_text(part)],
                None => Vec::new(),
            }
            .join("\n");
            items.push(HistoryItem::Message { role, text });
        }
        if items.is_empty() {
            return Err("a sampling request needs at least one message".into());
        }
        let system = request
            .get("systemPrompt")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Self { system, items })
    }

    /// What the approval says: the server and the start of its last message.
    pub fn reason(&self, server: &str) -> String {
        let last = self
            .items
            .last()
            .map(|item| match item {
                HistoryItem::Message { text, .. } => text.as_str(),
                _ => "",
            })
            .unwrap_or("");
        let excerpt: String = last.chars().take(REASON_EXCERPT).collect();
        let more = if excerpt.len() < last.len() {
            "…"
        } else {
            ""
        };
        format!(
            "MCP server `{server}` asks to sample the model ({} message{}): {excerpt}{more}",
            self.items.len(),
            if self.items.len() == 1 { "" } else { "s" }
        )
    }
}

fn content_text(part: &Value) -> String {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => part
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        Some(other) => format!("[{other} content]"),
        None => "[content]".to_owned(),
    }
}

/// The `CreateMessageResult` of a model's answer.
pub fn sampling_result(text: &str, model: &str) -> Json {
    Json(json!({
        "role": "assistant",
        "content": {"type": "text", "text": text},
        "model": model,
        "stopReason": "endTurn",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampling_request_becomes_a_prompt() {
        let request = json!({
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "name three actors"}},
                {"role": "assistant", "content": [{"type": "text", "text": "Ada"}, {"type": "image", "data": "x"}]}
            ],
            "systemPrompt": "You are a helpful test server.",
            "maxTokens": 50
        });
        let prompt = SamplingPrompt::parse(&request).unwrap();
        assert_eq!(
            prompt.system.as_deref(),
            Some("You are a helpful test server.")
        );
        assert_eq!(
            prompt.items,
            vec![
                HistoryItem::user("name three actors"),
                HistoryItem::assistant("Ada\n[image content]"),
            ]
        );
        assert_eq!(
            prompt.reason("everything"),
            "MCP server `everything` asks to sample the model (2 messages): Ada\n[image content]"
        );
        for bad in [
            json!({}),
            json!({"messages": []}),
            json!({"messages": [{"role": "system", "content": {"type": "text", "text": "x"}}]}),
        ] {
            assert!(SamplingPrompt::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_long_message_is_cut_in_the_reason() {
        let long = "é".repeat(500);
        let prompt = SamplingPrompt::parse(&json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": long}}]
        }))
        .unwrap();
        let reason = prompt.reason("s");
        assert!(reason.ends_with('…'), "{reason}");
        assert_eq!(reason.matches('é').count(), REASON_EXCERPT);
    }

    #[test]
    fn the_result_is_a_create_message_result() {
        assert_eq!(
            sampling_result("hi", "gpt").0,
            json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "gpt", "stopReason": "endTurn"})
        );
    }

    #[test]
    fn the_store_s_answer_decides_the_elicitation_outcome() {
        let content = Json(json!({"name": "Ada"}));
        assert_eq!(
            elicit_outcome(Ok(Granted::Decided(ApprovalDecision::ApproveWithContent {
                content: content.clone()
            }))),
            ElicitOutcome::Accept(content)
        );
        let denied = AgentError::ApprovalDenied {
            command: Vec::new(),
            reason: "no".into(),
        };
        assert_eq!(elicit_outcome(Err(denied)), ElicitOutcome::Decline);
        let late = AgentError::Timeout {
            what: "a human".into(),
            after_ms: 1,
        };
        assert_eq!(elicit_outcome(Err(late)), ElicitOutcome::Cancel);
        assert_eq!(
            elicit_outcome(Err(AgentError::cancelled("call ended"))),
            ElicitOutcome::Cancel
        );
    }
}
