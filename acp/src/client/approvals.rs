//! A [`PermissionHandler`] that asks troupe's ApprovalStore: an external agent's permission
//! request becomes a pending approval of the dispatching task (an `approval_requested`
//! event, answered by a human through the API, the CLI or `troupe acp`'s client), exactly as
//! a shell command of that task would.
//!
//! The command a human sees (and that a remembered approval is keyed by) is the tool call's
//! argv when the agent gives one (`rawInput.command` as a list), else its command line
//! (`rawInput.command` or `rawInput.cmd` as a string), else its title. troupe keeps the
//! memory of approvals: a request it approves is answered `allow_once` to the agent (so the
//! agent asks again next time and troupe's keys answer), a denial `reject_once`, and a
//! request nobody can answer any more (the dispatch cancelled, the session gone)
//! `cancelled`.
//!
//! Before anyone is asked, the request answers to tool governance (A5) when the handler has
//! it ([`Governed`]): a tool the policy denies is refused (`reject_once`) without asking a
//! human, with a `policy_rejected` event; one that needs an authorization token uses one of
//! the dispatcher's (refused `unauthorized` without one); see [`super::governed`].

use super::PermissionHandler;
use super::governed::{GovernedCall, PermissionVerdict, permission_verdict, refusal_message};
use crate::event::{PermissionDecision, PermissionRequest};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::approval_store::{ApprovalMsg, Ask, ask_until_answered, metrics::Asker};
use troupe_actors::directory::ServiceRef;
use troupe_actors::event_draft::EventDraft;
use troupe_actors::events::EventSink;
use troupe_actors::governance::{self, TaskGovernance, metrics::Decision};
use troupe_actors::token_book::{ConsumeRequest, TokenBookRef, consume};
use troupe_proto::agent::{ExecutionChain, PolicyReason};
use troupe_proto::governance::{PolicyLayer, TokenRefusal};
use troupe_proto::{AgentError, ApprovalSubject, ConversationId, EventKind, TaskId};

/// What a permission request answers to before anyone is asked: the policy of the agent's
/// calls, the tokens its dispatcher was given, and where a refusal is said.
#[derive(Clone)]
pub struct Governed {
    /// The agent's policy ([`troupe_actors::governance::external_agent`]).
    pub governance: Arc<TaskGovernance>,
    /// Where a token's use is counted (`None`: a call that needs one is refused).
    pub token_book: Option<TokenBookRef>,
    /// The session's events: `policy_rejected` goes there, as the dispatching task's.
    pub events: EventSink,
    /// The dispatch's chain (ending with the agent), named by a refusal.
    pub chain: ExecutionChain,
    /// The dispatch's span: the refusal's event is in its trace.
    pub span: tracing::Span,
    /// The first refusal of the turn, which its dispatch fails with when the agent ends the
    /// turn without an answer.
    pub refused: Arc<OnceLock<AgentError>>,
}

/// Asks the session's ApprovalStore on behalf of one task.
#[derive(Clone)]
pub struct ApprovalStorePermissions {
    /// The store, read at each request (it may be replaced while the task runs).
    pub approvals: ServiceRef<ApprovalMsg>,
    /// The task that dispatched to the agent: the approval is its.
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// The agent's id, named in the reason a human reads.
    pub agent_id: String,
    /// How long a human has (the session's approval timeout).
    pub timeout: Option<Duration>,
    /// The dispatch is over: stop asking.
    pub cancel: CancellationToken,
    /// Tool governance (A5), checked before anyone is asked (`None`: every request is
    /// asked, as for an agent run outside a dispatch).
    pub governed: Option<Governed>,
}

impl std::fmt::Debug for ApprovalStorePermissions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalStorePermissions")
            .field("conversation_id", &self.conversation_id)
            .field("task_id", &self.task_id)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// The command a human approves for this request: the one its input holds
/// ([`command_in_input`]), else its title (or its id), which tells the human what the agent
/// says it would run.
pub fn command_of(request: &PermissionRequest) -> Vec<String> {
    command_in_input(request.raw_input.as_ref()).unwrap_or_else(|| {
        vec![
            request
                .title
                .clone()
                .unwrap_or_else(|| request.tool_call_id.clone()),
        ]
    })
}

/// The command a tool call's `rawInput` holds: `command` as an array of strings, or
/// `command`/`cmd` as one string (`None`: none that can be read).
pub fn command_in_input(input: Option<&Value>) -> Option<Vec<String>> {
    let field = |name: &str| input.and_then(|v| v.get(name));
    if let Some(Value::Array(items)) = field("command") {
        let argv: Vec<String> = items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        if !argv.is_empty() && argv.len() == items.len() {
            return Some(argv);
        }
    }
    ["command", "cmd"]
        .into_iter()
        .find_map(|name| match field(name) {
            Some(Value::String(line)) => Some(vec![line.clone()]),
            _ => None,
        })
}

/// The agent's answer for the store's.
pub fn decision_of(
    answer: Option<Result<troupe_actors::approval_store::Granted, AgentError>>,
) -> PermissionDecision {
    match answer {
        Some(Ok(_)) => PermissionDecision::AllowOnce,
        Some(Err(AgentError::Cancelled { .. } | AgentError::Interrupted { .. })) | None => {
            PermissionDecision::Cancelled
        }
        Some(Err(_)) => PermissionDecision::RejectOnce,
    }
}

#[async_trait::async_trait]
impl PermissionHandler for ApprovalStorePermissions {
    async fn decide(&self, request: &PermissionRequest) -> PermissionDecision {
        if let Some(governed) = &self.governed
            && let Err(refusal) = self.govern(governed, request).await
        {
            return refusal;
        }
        let title = request.title.clone().unwrap_or_default();
        let ask = Ask {
            conversation_id: self.conversation_id,
            task_id: Some(self.task_id),
            command: command_of(request),
            reason: format!("ACP agent `{}` asks to run: {title}", self.agent_id),
            subject: ApprovalSubject::Command,
            workdir: None,
        };
        let asked = ask_until_answered(&self.approvals, ask, self.timeout, Asker::Task);
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => PermissionDecision::Cancelled,
            answer = asked => decision_of(answer),
        }
    }
}

impl ApprovalStorePermissions {
    /// The policy's word on `request`: `Ok` goes on to ask; a refusal is said (event,
    /// metrics, log) and answered `reject_once`.
    async fn govern(
        &self,
        governed: &Governed,
        request: &PermissionRequest,
    ) -> Result<(), PermissionDecision> {
        let call = GovernedCall::of(request);
        let (reason, why) = match permission_verdict(&governed.governance.policy, &call) {
            PermissionVerdict::Ask => {
                governance::metrics::decided(Decision::Allowed);
                return Ok(());
            }
            PermissionVerdict::NeedsToken(layer) => {
                match self.authorize(governed, &call, layer).await {
                    Ok(()) => {
                        governance::metrics::decided(Decision::Authorized);
                        return Ok(());
                    }
                    Err(why) => {
                        governance::metrics::decided(Decision::Unauthorized);
                        (PolicyReason::Unauthorized, why)
                    }
                }
            }
            PermissionVerdict::Refuse(denial) => {
                governance::metrics::decided(Decision::Denied);
                governance::metrics::denied(denial.layer);
                (PolicyReason::ToolDenied, denial.message)
            }
        };
        let message = refusal_message(&self.agent_id, request, &why);
        governed.span.in_scope(|| {
            tracing::info!(
                agent_id = %self.agent_id,
                tool = %call.tool,
                reason = reason.as_str(),
                "ACP permission request refused by policy"
            );
            governed.events.emit(EventDraft::task(
                self.conversation_id,
                self.task_id,
                EventKind::PolicyRejected {
                    agent_id: self.agent_id.clone(),
                    chain: governed.chain.clone(),
                    reason,
                    message: message.clone(),
                    tool: Some(call.tool.clone()),
                },
            ));
        });
        let _ = governed.refused.set(AgentError::PolicyRejected {
            reason,
            chain: governed.chain.0.clone(),
            message,
        });
        Err(PermissionDecision::RejectOnce)
    }

    /// Uses one use of a token of the dispatcher's that covers `call` (scoped to this
    /// agent, or to any); `Err` says why none did.
    async fn authorize(
        &self,
        governed: &Governed,
        call: &GovernedCall,
        layer: PolicyLayer,
    ) -> Result<(), String> {
        let refused = |refusal: TokenRefusal| {
            troupe_actors::governance::tokens::refusal_message(
                &call.tool,
                layer,
                refusal,
                call.command.as_deref(),
            )
        };
        if governed.governance.authorization.is_empty() {
            return Err(refused(TokenRefusal::Missing));
        }
        let Some(book) = &governed.token_book else {
            return Err(refused(TokenRefusal::Unavailable));
        };
        let request = ConsumeRequest {
            digests: governed.governance.authorization.clone(),
            agent: Some(self.agent_id.clone()),
            tool: call.tool.clone(),
            command: call.command.clone(),
            arguments: call.arguments.clone(),
        };
        match consume(book, request).await {
            Ok(consumed) => {
                tracing::info!(
                    token_id = %consumed.token_id,
                    uses = consumed.uses,
                    max_uses = consumed.max_uses,
                    agent_id = %self.agent_id,
                    "ACP tool call authorized"
                );
                Ok(())
            }
            Err(refusal) => Err(refused(refusal)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(raw_input: Option<Value>, title: Option<&str>) -> PermissionRequest {
        PermissionRequest {
            session_id: "s".into(),
            tool_call_id: "c1".into(),
            title: title.map(str::to_owned),
            kind: Some("execute".into()),
            raw_input,
            options: Vec::new(),
        }
    }

    #[test]
    fn the_command_is_the_argv_else_the_line_else_the_title() {
        let argv = request(Some(json!({"command": ["touch", "x"]})), Some("t"));
        assert_eq!(command_of(&argv), ["touch", "x"]);
        let line = request(Some(json!({"cmd": "touch x"})), Some("t"));
        assert_eq!(command_of(&line), ["touch x"]);
        let titled = request(Some(json!({"other": 1})), Some("Run touch x"));
        assert_eq!(command_of(&titled), ["Run touch x"]);
        assert_eq!(command_of(&request(None, None)), ["c1"]);
    }

    /// Forwards what it is sent (the kind of each message, an emitted event) to a channel.
    struct Probe;

    #[async_trait::async_trait]
    impl ractor::Actor for Probe {
        type Msg = troupe_actors::rollout::RolloutMsg;
        type State = tokio::sync::mpsc::UnboundedSender<EventKind>;
        type Arguments = Self::State;
        async fn pre_start(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            tx: Self::State,
        ) -> Result<Self::State, ractor::ActorProcessingErr> {
            Ok(tx)
        }
        async fn handle(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            msg: Self::Msg,
            tx: &mut Self::State,
        ) -> Result<(), ractor::ActorProcessingErr> {
            if let troupe_actors::rollout::RolloutMsg::Emit { draft } = msg {
                let _ = tx.send(draft.event);
            }
            Ok(())
        }
    }

    /// Counts what it is asked.
    struct Approvals;

    #[async_trait::async_trait]
    impl ractor::Actor for Approvals {
        type Msg = ApprovalMsg;
        type State = tokio::sync::mpsc::UnboundedSender<()>;
        type Arguments = Self::State;
        async fn pre_start(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            tx: Self::State,
        ) -> Result<Self::State, ractor::ActorProcessingErr> {
            Ok(tx)
        }
        async fn handle(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            _: Self::Msg,
            tx: &mut Self::State,
        ) -> Result<(), ractor::ActorProcessingErr> {
            let _ = tx.send(());
            Ok(())
        }
    }

    #[test]
    fn a_denied_tool_is_refused_without_asking_said_and_counted() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        use troupe_actors::governance::{metrics::DECISIONS_TOTAL, task_policy};
        use troupe_proto::agent::ToolRules;
        use troupe_proto::governance::ToolPolicyConfig;
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (events, asked) = metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
                let (atx, mut arx) = tokio::sync::mpsc::unbounded_channel();
                let (rollout, _) = ractor::Actor::spawn(None, Probe, etx).await.unwrap();
                let (approvals, _) = ractor::Actor::spawn(None, Approvals, atx).await.unwrap();
                let rules = ToolRules {
                    blacklist: vec!["shell".into()],
                    ..ToolRules::default()
                };
                let policy = task_policy(&ToolPolicyConfig::default(), None, Some(&rules), None);
                let refused = Arc::new(OnceLock::new());
                let handler = ApprovalStorePermissions {
                    approvals: ServiceRef::fixed(approvals.clone()),
                    conversation_id: ConversationId::new(),
                    task_id: TaskId::new(),
                    agent_id: "codex".into(),
                    timeout: Some(Duration::from_millis(50)),
                    cancel: CancellationToken::new(),
                    governed: Some(Governed {
                        governance: Arc::new(TaskGovernance {
                            policy,
                            ..TaskGovernance::default()
                        }),
                        token_book: None,
                        events: EventSink::new(rollout.clone()),
                        chain: ExecutionChain::start("codex"),
                        span: tracing::Span::none(),
                        refused: refused.clone(),
                    }),
                };
                let mut denied = request(Some(json!({"command": ["touch", "x"]})), Some("t"));
                denied.kind = Some("execute".into());
                assert_eq!(
                    handler.decide(&denied).await,
                    PermissionDecision::RejectOnce
                );
                assert!(matches!(
                    refused.get(),
                    Some(AgentError::PolicyRejected {
                        reason: PolicyReason::ToolDenied,
                        ..
                    })
                ));
                let mut allowed = denied.clone();
                allowed.kind = Some("read".into());
                // Allowed: asked (the store answers nothing here: the ask times out).
                let _ = handler.decide(&allowed).await;
                tokio::task::yield_now().await;
                let mut events = Vec::new();
                while let Ok(e) = erx.try_recv() {
                    events.push(e);
                }
                let mut asked = 0;
                while arx.try_recv().is_ok() {
                    asked += 1;
                }
                rollout.stop(None);
                approvals.stop(None);
                (events, asked)
            })
        });
        assert_eq!(asked, 1, "only the allowed request was asked");
        assert!(
            matches!(&events[..], [EventKind::PolicyRejected { agent_id, tool, reason, message, .. }]
                if agent_id == "codex" && tool.as_deref() == Some("shell")
                    && *reason == PolicyReason::ToolDenied
                    && message.contains("request")),
            "{events:?}"
        );
        let counted: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == DECISIONS_TOTAL)
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) => Some((
                    key.key()
                        .labels()
                        .map(|l| l.value().to_owned())
                        .collect::<String>(),
                    n,
                )),
                _ => None,
            })
            .collect();
        assert!(counted.contains(&("denied".to_owned(), 1)), "{counted:?}");
        assert!(counted.contains(&("allowed".to_owned(), 1)), "{counted:?}");
    }

    #[test]
    fn approvals_allow_once_denials_reject_and_silence_cancels() {
        use troupe_actors::approval_store::Granted;
        assert_eq!(
            decision_of(Some(Ok(Granted::Remembered))),
            PermissionDecision::AllowOnce
        );
        let denied = AgentError::ApprovalDenied {
            command: vec![],
            reason: "no".into(),
        };
        assert_eq!(
            decision_of(Some(Err(denied))),
            PermissionDecision::RejectOnce
        );
        assert_eq!(decision_of(None), PermissionDecision::Cancelled);
    }
}
