//! The ports a replay plugs into a session in place of the real ones: a model that answers
//! each step with what the recording says it answered ([`RecordedModel`]), the recorded
//! results of tool calls and dispatches ([`RecordedEffects`], the task's `Effects`), an MCP
//! port that lists the recorded tools and calls nothing ([`RecordedMcp`]), and a binding
//! store that keeps nothing ([`NoBindings`]). None of them reaches outside the process.
//!
//! Each hands out its recorded answers in order, once each, through atomics (a replay's task
//! is the only caller; no lock is needed).

use super::recording::{RecordedStep, RecordedToolResult};
use crate::agents::AgentOutput;
use crate::ports::{
    BindingStore, DeltaSink, McpPort, McpView, ModelClient, ModelInfo, ModelRequest, ModelResponse,
    Playback, ToolCallContext, ToolFailure,
};
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;
use troupe_proto::agent::AgentBinding;
use troupe_proto::{AgentError, ConversationId, Json, SessionId, ToolCall, ToolOutput, ToolSpec};

/// The model of a replay: step `n` of the task gets the recording's answer of step `n`
/// (its streamed pieces, then its text and calls, or its error).
pub struct RecordedModel {
    steps: Vec<RecordedStep>,
    next: AtomicUsize,
}

impl RecordedModel {
    pub fn new(steps: Vec<RecordedStep>) -> Self {
        Self {
            steps,
            next: AtomicUsize::new(0),
        }
    }

    /// Steps answered so far.
    pub fn answered(&self) -> usize {
        self.next.load(Ordering::SeqCst).min(self.steps.len())
    }
}

#[async_trait]
impl ModelClient for RecordedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "replay".into(),
            model: "replay".into(),
            family: "replay".into(),
        }
    }

    async fn step(
        &self,
        _request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        if cancel.is_cancelled() {
            return Err(AgentError::cancelled("cancelled"));
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(step) = self.steps.get(n) else {
            return Err(AgentError::ModelError {
                message: format!(
                    "the recording has no answer for step {} (it recorded {})",
                    n + 1,
                    self.steps.len()
                ),
                retryable: false,
            });
        };
        for chunk in &step.chunks {
            deltas.text_delta(chunk);
        }
        step.answer.clone()
    }
}

/// The recorded results of tool calls and dispatches, played back in place of running them.
pub struct RecordedEffects {
    tools: Vec<RecordedToolResult>,
    taken: Vec<AtomicBool>,
    dispatches: Vec<Result<AgentOutput, AgentError>>,
    next_dispatch: AtomicUsize,
    /// The recorded task's error, when it ended with one: what a route to a module that did
    /// not answer failed with.
    end_error: Option<AgentError>,
}

impl RecordedEffects {
    /// With the recorded task's end error (see [`Playback::module_route_failure`]).
    #[must_use]
    pub fn with_end_error(mut self, error: Option<AgentError>) -> Self {
        self.end_error = error;
        self
    }

    pub fn new(
        tools: Vec<RecordedToolResult>,
        dispatches: Vec<Result<AgentOutput, AgentError>>,
    ) -> Self {
        Self {
            taken: tools.iter().map(|_| AtomicBool::new(false)).collect(),
            tools,
            dispatches,
            next_dispatch: AtomicUsize::new(0),
            end_error: None,
        }
    }

    /// Tool results played back so far.
    pub fn tool_results_played(&self) -> usize {
        self.taken
            .iter()
            .filter(|t| t.load(Ordering::SeqCst))
            .count()
    }

    /// Dispatch answers played back so far.
    pub fn dispatches_played(&self) -> usize {
        self.next_dispatch
            .load(Ordering::SeqCst)
            .min(self.dispatches.len())
    }
}

impl Playback for RecordedEffects {
    fn tool_result(&self, call: &ToolCall) -> Result<ToolOutput, ToolFailure> {
        // The first attempt of this very call (id, tool and arguments) not played yet.
        let found = self
            .tools
            .iter()
            .zip(&self.taken)
            .find(|(recorded, taken)| {
                recorded.call == *call
                    && taken
                        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
            });
        match found {
            Some((recorded, _)) => recorded.result.clone(),
            None => Err(ToolFailure::from(AgentError::NotFound {
                what: "recorded result of the tool call".into(),
                id: format!("{} ({})", call.call_id, call.name),
            })),
        }
    }

    fn authorized(&self, call: &ToolCall) -> Result<(), AgentError> {
        // Refused then: its recorded end is the refusal for want of a valid token.
        let refused = self.tools.iter().zip(&self.taken).any(|(recorded, taken)| {
            recorded.call == *call
                && !taken.load(Ordering::SeqCst)
                && matches!(
                    &recorded.result,
                    Err(ToolFailure {
                        error: AgentError::PolicyRejected {
                            reason: troupe_proto::agent::PolicyReason::Unauthorized,
                            ..
                        },
                        ..
                    })
                )
        });
        if refused {
            Err(AgentError::invalid("the recorded call was not authorized"))
        } else {
            Ok(())
        }
    }

    fn module_route_failure(&self) -> Option<AgentError> {
        self.end_error.clone()
    }

    fn dispatch_result(&self, agent_id: &str) -> Result<AgentOutput, AgentError> {
        let n = self.next_dispatch.fetch_add(1, Ordering::SeqCst);
        self.dispatches.get(n).cloned().unwrap_or_else(|| {
            Err(AgentError::NotFound {
                what: "recorded answer of the dispatch".into(),
                id: agent_id.to_owned(),
            })
        })
    }
}

/// The MCP port of a replay: its views list the external tools the recording reached (so
/// that the task is offered them again) and call nothing (the task plays calls back before
/// it reaches a view).
pub struct RecordedMcp {
    tools: Vec<String>,
}

impl RecordedMcp {
    pub fn new(tools: impl IntoIterator<Item = String>) -> Self {
        Self {
            tools: tools.into_iter().collect(),
        }
    }
}

#[async_trait]
impl McpPort for RecordedMcp {
    async fn open_view(
        &self,
        _conversation_id: ConversationId,
        _allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        Ok(Arc::new(RecordedView {
            tools: self.tools.clone(),
        }))
    }
}

struct RecordedView {
    tools: Vec<String>,
}

#[async_trait]
impl McpView for RecordedView {
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, AgentError> {
        Ok(self
            .tools
            .iter()
            .map(|name| ToolSpec {
                name: name.clone(),
                description: String::new(),
                parameters: Json(serde_json::json!({"type": "object"})),
            })
            .collect())
    }

    async fn call_tool(
        &self,
        call: &ToolCall,
        _ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure> {
        Err(ToolFailure::from(AgentError::internal(format!(
            "a replay plays MCP calls back and calls no server (`{}`)",
            call.name
        ))))
    }

    async fn release(&self) {}
}

/// Bindings of a replay: none kept, none read (no agent is dispatched to).
pub struct NoBindings;

#[async_trait]
impl BindingStore for NoBindings {
    async fn put_binding(&self, _binding: AgentBinding) -> Result<(), AgentError> {
        Ok(())
    }

    async fn bindings(
        &self,
        _session_id: Option<SessionId>,
    ) -> Result<Vec<AgentBinding>, AgentError> {
        Ok(Vec::new())
    }

    async fn remove_binding(
        &self,
        _session_id: SessionId,
        _agent_id: &str,
    ) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ToolFailureKind;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            call_id: id.into(),
            name: name.into(),
            arguments: Json(serde_json::json!({"command": ["ls"]})),
        }
    }

    fn output(id: &str, text: &str) -> ToolOutput {
        ToolOutput {
            call_id: id.into(),
            output: text.into(),
            is_error: false,
        }
    }

    #[test]
    fn each_attempt_of_a_call_gets_its_own_result_once() {
        let failed = ToolFailure::from(AgentError::ToolError {
            name: "shell".into(),
            message: "flaky".into(),
        });
        let effects = RecordedEffects::new(
            vec![
                RecordedToolResult {
                    call: call("c1", "shell"),
                    result: Err(failed.clone()),
                },
                RecordedToolResult {
                    call: call("c2", "srv__echo"),
                    result: Ok(output("c2", "echo")),
                },
                RecordedToolResult {
                    call: call("c1", "shell"),
                    result: Ok(output("c1", "second try")),
                },
            ],
            vec![],
        );
        assert_eq!(
            effects.tool_result(&call("c2", "srv__echo")),
            Ok(output("c2", "echo"))
        );
        assert_eq!(effects.tool_result(&call("c1", "shell")), Err(failed));
        assert_eq!(
            effects.tool_result(&call("c1", "shell")),
            Ok(output("c1", "second try"))
        );
        assert_eq!(effects.tool_results_played(), 3);
        // Nothing recorded for a third attempt, nor for a call the recording never saw.
        for c in [call("c1", "shell"), call("c1", "apply_patch")] {
            let missing = effects.tool_result(&c).unwrap_err();
            assert_eq!(missing.kind, ToolFailureKind::Failed);
            assert_eq!(missing.error.kind(), troupe_proto::ErrorKind::NotFound);
        }
    }

    #[test]
    fn dispatches_are_answered_in_order_then_not_found() {
        let effects = RecordedEffects::new(
            vec![],
            vec![
                Ok(AgentOutput {
                    text: "done".into(),
                    usage: None,
                }),
                Err(AgentError::timeout(
                    "lease",
                    std::time::Duration::from_secs(1),
                )),
            ],
        );
        assert_eq!(effects.dispatch_result("a").unwrap().text, "done");
        assert_eq!(
            effects.dispatch_result("b").unwrap_err().kind(),
            troupe_proto::ErrorKind::Timeout
        );
        assert_eq!(
            effects.dispatch_result("c").unwrap_err().kind(),
            troupe_proto::ErrorKind::NotFound
        );
        assert_eq!(effects.dispatches_played(), 2);
    }

    struct Sink(Vec<String>);
    impl DeltaSink for Sink {
        fn text_delta(&mut self, delta: &str) {
            self.0.push(delta.to_owned());
        }
    }

    #[tokio::test]
    async fn the_model_streams_each_recorded_step_then_has_no_more() {
        let model = RecordedModel::new(vec![
            RecordedStep {
                chunks: vec!["he".into(), "llo".into()],
                answer: Ok(ModelResponse {
                    text: "hello".into(),
                    ..ModelResponse::default()
                }),
            },
            RecordedStep {
                chunks: vec![],
                answer: Err(AgentError::ModelError {
                    message: "503".into(),
                    retryable: true,
                }),
            },
        ]);
        let history = crate::history::HistoryStore::new(
            Default::default(),
            Arc::new(crate::history::LocalSummarizer::default()),
        );
        let snapshot = history.snapshot();
        let request = ModelRequest {
            conversation_id: ConversationId::new(),
            task_id: troupe_proto::TaskId::new(),
            instructions: "",
            prompt: snapshot.view(None, &[], &[]),
            tools: &[],
            prompt_cache_key: "",
        };
        let cancel = CancellationToken::new();
        let mut sink = Sink(Vec::new());
        let first = model.step(request, &mut sink, &cancel).await.unwrap();
        assert_eq!(first.text, "hello");
        assert_eq!(sink.0, ["he", "llo"]);
        let second = model.step(request, &mut sink, &cancel).await.unwrap_err();
        assert_eq!(second.kind(), troupe_proto::ErrorKind::ModelError);
        let third = model.step(request, &mut sink, &cancel).await.unwrap_err();
        assert!(
            third.to_string().contains("no answer for step 3"),
            "{third}"
        );
        assert_eq!(model.answered(), 2);
    }
}
