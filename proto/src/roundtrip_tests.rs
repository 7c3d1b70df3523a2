//! Every public wire type must survive both formats it travels in: JSON (the API, rollout
//! lines) and bincode 2 through serde (rollout frames, cluster messages). Proptest generates
//! every enum variant and both sides of every `Option`; a few plain tests pin the JSON shape
//! that clients depend on.

use crate::agent::{
    AgentUpdateKind, DispatchStatus, ExecutionChain, PolicyReason, ProviderKind, RouteDecision,
    RouteSource,
};
use crate::api::*;
use crate::approval::*;
use crate::error::{AgentError, ErrorKind};
use crate::event::{EventEnvelope, EventKind};
use crate::ids::{ApprovalId, ConversationId, DispatchId, SessionId, TaskId};
use crate::item::{HistoryItem, Role, Usage};
use crate::json::Json;
use crate::names::{EventName, WarningCode};
use crate::policy::{
    ApprovalPolicy, CommandKey, OverBudget, SandboxPolicy, StoragePolicy, ToolErrorPolicy,
};
use crate::task::*;
use crate::tool::{PlanStep, PlanStepStatus, ToolCall, ToolOutput, ToolSpec};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::fmt::Debug;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Round-trip checks

/// decode(encode(v)) == v in JSON and in bincode; returns the JSON value for further checks.
fn roundtrip<T>(v: &T) -> Result<Value, TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let text = serde_json::to_string(v).map_err(|e| TestCaseError::fail(format!("json: {e}")))?;
    let back: T = serde_json::from_str(&text)
        .map_err(|e| TestCaseError::fail(format!("json decode: {e}; text: {text}")))?;
    prop_assert_eq!(&back, v, "json text: {}", text);

    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(v, config)
        .map_err(|e| TestCaseError::fail(format!("bincode: {e}")))?;
    let (back, read): (T, usize) = bincode::serde::decode_from_slice(&bytes, config)
        .map_err(|e| TestCaseError::fail(format!("bincode decode: {e}")))?;
    prop_assert_eq!(&back, v);
    prop_assert_eq!(read, bytes.len(), "bincode left bytes unread");

    serde_json::to_value(v).map_err(|e| TestCaseError::fail(format!("json value: {e}")))
}

/// The id at `pointer` is its canonical string, not a byte array or a number.
fn id_at(value: &Value, pointer: &str, id: &impl ToString) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        value.pointer(pointer),
        Some(&Value::String(id.to_string())),
        "id at {} in {}",
        pointer,
        value
    );
    Ok(())
}

/// Like [`id_at`] for an optional id: a string when set, `null` when not.
fn opt_id_at(
    value: &Value,
    pointer: &str,
    id: Option<&impl ToString>,
) -> Result<(), TestCaseError> {
    match id {
        Some(id) => id_at(value, pointer, id),
        None => {
            prop_assert_eq!(value.pointer(pointer), Some(&Value::Null), "{}", pointer);
            Ok(())
        }
    }
}

/// The variant name as JSON shows it: the string of a unit variant, the single key of an
/// externally tagged one, or `kind` of an adjacently tagged one.
fn json_tag(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(map) => match map.get("kind") {
            Some(Value::String(kind)) if map.contains_key("payload") => kind.clone(),
            _ => map.keys().next().cloned().unwrap_or_default(),
        },
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies: leaves

fn uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

fn session_id() -> impl Strategy<Value = SessionId> {
    uuid().prop_map(SessionId::from_uuid)
}

fn conversation_id() -> impl Strategy<Value = ConversationId> {
    uuid().prop_map(ConversationId::from_uuid)
}

fn task_id() -> impl Strategy<Value = TaskId> {
    uuid().prop_map(TaskId::from_uuid)
}

fn approval_id() -> impl Strategy<Value = ApprovalId> {
    uuid().prop_map(ApprovalId::from_uuid)
}

/// Any string: arbitrary unicode (control characters, quotes, astral planes) or short ASCII.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z_]{0,12}",
        "[\\u{0}-\\u{7f}\"\\\\]{0,8}",
        "\\PC{0,16}",
    ]
}

fn strings() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..4)
}

// ---------------------------------------------------------------------------------------------
// Strategies: json

/// A float that prints and parses back to the same bits: a small integer over a small power
/// of two, so its decimal form has at most 13 significant digits. serde_json (without its
/// `float_roundtrip` feature) may misread the last bit of 16-17 digit forms such as
/// `-956.2384757995605`, so those are left out on purpose.
fn exact_f64() -> impl Strategy<Value = f64> {
    (any::<i16>(), 0u32..=12).prop_map(|(n, k)| f64::from(n) / f64::from(1u32 << k))
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        exact_f64().prop_map(Value::from),
        text().prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json() -> impl Strategy<Value = Json> {
    json_value().prop_map(Json)
}

// ---------------------------------------------------------------------------------------------
// Strategies: error, policy

fn error_kind() -> impl Strategy<Value = ErrorKind> {
    prop_oneof![
        Just(ErrorKind::Cancelled),
        Just(ErrorKind::Timeout),
        Just(ErrorKind::ApprovalDenied),
        Just(ErrorKind::SandboxError),
        Just(ErrorKind::McpError),
        Just(ErrorKind::ToolConflict),
        Just(ErrorKind::StoragePolicyViolation),
        Just(ErrorKind::Overloaded),
        Just(ErrorKind::NotFound),
        Just(ErrorKind::InvalidInput),
        Just(ErrorKind::ModelError),
        Just(ErrorKind::ToolError),
        Just(ErrorKind::Internal),
        Just(ErrorKind::Interrupted),
        Just(ErrorKind::PolicyRejected),
        Just(ErrorKind::GuardrailFailed),
    ]
}

fn agent_error() -> impl Strategy<Value = AgentError> {
    prop_oneof![
        text().prop_map(|reason| AgentError::Cancelled { reason }),
        (text(), any::<u64>()).prop_map(|(what, after_ms)| AgentError::Timeout { what, after_ms }),
        (strings(), text())
            .prop_map(|(command, reason)| AgentError::ApprovalDenied { command, reason }),
        text().prop_map(|message| AgentError::SandboxError { message }),
        (text(), text()).prop_map(|(server, message)| AgentError::McpError { server, message }),
        (text(), text()).prop_map(|(name, detail)| AgentError::ToolConflict { name, detail }),
        text().prop_map(|message| AgentError::StoragePolicyViolation { message }),
        (text(), any::<u32>())
            .prop_map(|(resource, limit)| AgentError::Overloaded { resource, limit }),
        (text(), text()).prop_map(|(what, id)| AgentError::NotFound { what, id }),
        text().prop_map(|message| AgentError::InvalidInput { message }),
        (text(), any::<bool>())
            .prop_map(|(message, retryable)| AgentError::ModelError { message, retryable }),
        (text(), text()).prop_map(|(name, message)| AgentError::ToolError { name, message }),
        text().prop_map(|message| AgentError::Internal { message }),
        text().prop_map(|reason| AgentError::Interrupted { reason }),
        (policy_reason(), strings(), text()).prop_map(|(reason, chain, message)| {
            AgentError::PolicyRejected {
                reason,
                chain,
                message,
            }
        }),
        (any::<u32>(), strings())
            .prop_map(|(attempts, problems)| AgentError::GuardrailFailed { attempts, problems }),
    ]
}

fn policy_reason() -> impl Strategy<Value = PolicyReason> {
    prop::sample::select(PolicyReason::ALL.to_vec())
}

fn provider_kind() -> impl Strategy<Value = ProviderKind> {
    prop::sample::select(ProviderKind::ALL.to_vec())
}

fn dispatch_id() -> impl Strategy<Value = DispatchId> {
    any::<u128>().prop_map(|n| DispatchId::from_uuid(Uuid::from_u128(n)))
}

fn chain() -> impl Strategy<Value = ExecutionChain> {
    strings().prop_map(ExecutionChain)
}

fn agent_update_kind() -> impl Strategy<Value = AgentUpdateKind> {
    prop::sample::select(vec![
        AgentUpdateKind::MessageChunk,
        AgentUpdateKind::ThoughtChunk,
        AgentUpdateKind::ToolCall,
        AgentUpdateKind::ToolCallUpdate,
        AgentUpdateKind::Plan,
        AgentUpdateKind::Status,
        AgentUpdateKind::Other,
    ])
}

/// The agent events (A1-A4).
fn agent_event_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        (
            text(),
            provider_kind(),
            text(),
            prop::option::of(dispatch_id())
        )
            .prop_map(|(agent_id, provider, provider_session_id, dispatch_id)| {
                EventKind::SessionCreated {
                    agent_id,
                    provider,
                    provider_session_id,
                    dispatch_id,
                }
            }),
        (
            text(),
            provider_kind(),
            text(),
            prop::option::of(text()),
            prop::option::of(dispatch_id())
        )
            .prop_map(
                |(agent_id, provider, provider_session_id, replaced, dispatch_id)| {
                    EventKind::SessionBound {
                        agent_id,
                        provider,
                        provider_session_id,
                        replaced,
                        dispatch_id,
                    }
                }
            ),
        (
            text(),
            provider_kind(),
            text(),
            prop::option::of(dispatch_id())
        )
            .prop_map(|(agent_id, provider, provider_session_id, dispatch_id)| {
                EventKind::SessionResumed {
                    agent_id,
                    provider,
                    provider_session_id,
                    dispatch_id,
                }
            }),
        (
            prop::sample::select(RouteDecision::ALL.to_vec()),
            prop::option::of(text()),
            prop::option::of(text()),
            0.0..=1.0f64,
            prop::sample::select(RouteSource::ALL.to_vec()),
            text()
        )
            .prop_map(|(decision, agent_id, module, confidence, source, reason)| {
                EventKind::RouteDecided {
                    decision,
                    agent_id,
                    module,
                    confidence,
                    source,
                    reason,
                }
            }),
        (
            dispatch_id(),
            text(),
            provider_kind(),
            prop::option::of(text()),
            chain(),
            any::<u64>(),
            text()
        )
            .prop_map(
                |(
                    dispatch_id,
                    agent_id,
                    provider,
                    provider_session_id,
                    chain,
                    lease_ttl_ms,
                    input,
                )| {
                    EventKind::DispatchSent {
                        dispatch_id,
                        agent_id,
                        provider,
                        provider_session_id,
                        chain,
                        lease_ttl_ms,
                        input,
                    }
                }
            ),
        (
            dispatch_id(),
            text(),
            prop::option::of(text()),
            prop::sample::select(DispatchStatus::ALL.to_vec()),
            text(),
            prop::option::of(agent_error()),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(
                |(
                    dispatch_id,
                    agent_id,
                    provider_session_id,
                    status,
                    text,
                    error,
                    duration_ms,
                    validated,
                )| {
                    EventKind::DispatchResult {
                        dispatch_id,
                        agent_id,
                        provider_session_id,
                        status,
                        text,
                        error,
                        duration_ms,
                        validated,
                    }
                }
            ),
        (text(), chain(), policy_reason(), text()).prop_map(
            |(agent_id, chain, reason, message)| {
                EventKind::PolicyRejected {
                    agent_id,
                    chain,
                    reason,
                    message,
                    tool: None,
                }
            }
        ),
        text().prop_map(|question| EventKind::AskHuman { question }),
        (
            proptest::option::of(text()),
            any::<u32>(),
            strings(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(agent_id, attempts, problems, ask, spent)| {
                EventKind::GuardrailFailed {
                    agent_id,
                    attempts,
                    problems,
                    status: if spent {
                        crate::GuardrailStatus::Exhausted
                    } else {
                        crate::GuardrailStatus::MaxSteps
                    },
                    action: if ask {
                        crate::agent::GuardrailAction::AskHuman
                    } else {
                        crate::agent::GuardrailAction::Reject
                    },
                }
            }),
        (
            dispatch_id(),
            text(),
            text(),
            agent_update_kind(),
            text(),
            // `data: null` and no `data` are one value on the wire (read back as `None`).
            prop::option::of(json().prop_filter("null is an absent value", |j| !j.0.is_null()))
        )
            .prop_map(
                |(dispatch_id, agent_id, provider_session_id, update, text, data)| {
                    EventKind::AgentUpdate {
                        dispatch_id,
                        agent_id,
                        provider_session_id,
                        update,
                        text,
                        data,
                    }
                }
            ),
    ]
}

fn storage_policy() -> impl Strategy<Value = StoragePolicy> {
    prop_oneof![
        Just(StoragePolicy::Full),
        Just(StoragePolicy::HeadersOnly),
        Just(StoragePolicy::None),
        any::<u64>().prop_map(|secs| StoragePolicy::Ttl { secs }),
    ]
}

fn over_budget() -> impl Strategy<Value = OverBudget> {
    prop_oneof![Just(OverBudget::Reject), Just(OverBudget::Trim)]
}

fn tool_error_policy() -> impl Strategy<Value = ToolErrorPolicy> {
    prop_oneof![
        Just(ToolErrorPolicy::Skip),
        Just(ToolErrorPolicy::Terminate),
        any::<u32>().prop_map(|attempts| ToolErrorPolicy::Retry { attempts }),
    ]
}

fn approval_policy() -> impl Strategy<Value = ApprovalPolicy> {
    prop_oneof![
        Just(ApprovalPolicy::Always),
        Just(ApprovalPolicy::OnFailure),
        Just(ApprovalPolicy::Never),
    ]
}

fn sandbox_policy() -> impl Strategy<Value = SandboxPolicy> {
    prop_oneof![
        Just(SandboxPolicy::ReadOnly),
        Just(SandboxPolicy::WorkspaceWrite),
        Just(SandboxPolicy::FullAccess),
    ]
}

fn command_key() -> impl Strategy<Value = CommandKey> {
    (
        strings(),
        prop::option::of(conversation_id()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(path, conversation, expires_at_ms)| CommandKey {
            path,
            conversation,
            expires_at_ms,
        })
}

// ---------------------------------------------------------------------------------------------
// Strategies: item, tool

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)]
}

fn usage() -> impl Strategy<Value = Usage> {
    any::<[u64; 4]>().prop_map(|[i, o, c, r]| Usage {
        input_tokens: i,
        output_tokens: o,
        cached_tokens: c,
        reasoning_tokens: r,
    })
}

fn tool_spec() -> impl Strategy<Value = ToolSpec> {
    (text(), text(), json()).prop_map(|(name, description, parameters)| ToolSpec {
        name,
        description,
        parameters,
    })
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    (text(), text(), json()).prop_map(|(call_id, name, arguments)| ToolCall {
        call_id,
        name,
        arguments,
    })
}

fn plan_step() -> impl Strategy<Value = PlanStep> {
    (
        text(),
        prop_oneof![
            Just(PlanStepStatus::Pending),
            Just(PlanStepStatus::InProgress),
            Just(PlanStepStatus::Completed),
        ],
    )
        .prop_map(|(step, status)| PlanStep { step, status })
}

fn tool_output() -> impl Strategy<Value = ToolOutput> {
    (text(), text(), any::<bool>()).prop_map(|(call_id, output, is_error)| ToolOutput {
        call_id,
        output,
        is_error,
    })
}

fn history_item() -> impl Strategy<Value = HistoryItem> {
    prop_oneof![
        (role(), text()).prop_map(|(role, text)| HistoryItem::Message { role, text }),
        tool_call().prop_map(HistoryItem::ToolCall),
        tool_output().prop_map(HistoryItem::ToolOutput),
        (text(), any::<u64>()).prop_map(|(text, replaced_items)| HistoryItem::Summary {
            text,
            replaced_items
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Strategies: api

fn open_conversation() -> impl Strategy<Value = OpenConversation> {
    (
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(strings()),
        any::<[bool; 3]>(),
        storage_policy(),
        prop::option::of(approval_policy()),
        prop::option::of(sandbox_policy()),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(
            |(
                base,
                user,
                allow,
                [plan, patch, web],
                storage,
                approval,
                sandbox,
                model,
                provider,
            )| {
                OpenConversation {
                    base_instructions: base,
                    user_instructions: user,
                    mcp_tool_allowlist: allow,
                    include_plan_tool: plan,
                    include_apply_patch_tool: patch,
                    tools_web_search_request: web,
                    storage_policy: storage,
                    approval_policy: approval,
                    sandbox_policy: sandbox,
                    model,
                    provider,
                }
            },
        )
}

fn opened() -> impl Strategy<Value = Opened> {
    conversation_id().prop_map(|conversation_id| Opened { conversation_id })
}

fn send_message() -> impl Strategy<Value = SendMessage> {
    (conversation_id(), text()).prop_map(|(conversation_id, text)| SendMessage {
        conversation_id,
        text,
    })
}

fn task_stats() -> impl Strategy<Value = TaskStats> {
    (
        usage(),
        any::<[u64; 3]>(),
        any::<[u32; 5]>(),
        any::<u64>(),
        text(),
    )
        .prop_map(
            |(
                usage,
                [estimated, estimated_completion, mcp_latency_ms],
                [turn, steps, steps_with_usage, tool_calls, mcp_calls],
                duration_ms,
                trace_id,
            )| TaskStats {
                mcp_calls,
                mcp_latency_ms,
                usage,
                estimated_prompt_tokens: estimated,
                estimated_completion_tokens: estimated_completion,
                steps_with_usage,
                turn,
                steps,
                tool_calls,
                duration_ms,
                trace_id,
            },
        )
}

fn warning_code() -> impl Strategy<Value = WarningCode> {
    proptest::sample::select(WarningCode::ALL)
}

fn task_status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Ok),
        Just(TaskStatus::Error),
        Just(TaskStatus::MaxSteps),
        Just(TaskStatus::Cancelled),
    ]
}

fn message_reply() -> impl Strategy<Value = MessageReply> {
    (
        conversation_id(),
        task_id(),
        task_status(),
        text(),
        task_stats(),
        prop::option::of(agent_error()),
    )
        .prop_map(
            |(conversation_id, task_id, status, text, stats, error)| MessageReply {
                conversation_id,
                task_id,
                status,
                text,
                stats,
                error,
                items: Vec::new(),
                item_times_ms: Vec::new(),
            },
        )
}

fn close_outcome() -> impl Strategy<Value = CloseOutcome> {
    prop_oneof![
        Just(CloseOutcome::Closed),
        Just(CloseOutcome::ForceAborted),
        Just(CloseOutcome::AlreadyClosed),
    ]
}

fn closed() -> impl Strategy<Value = Closed> {
    (conversation_id(), close_outcome()).prop_map(|(conversation_id, outcome)| Closed {
        conversation_id,
        outcome,
    })
}

/// A patch field: absent, `null` (back to the default) or a value.
fn patch<T: Debug + Clone>(
    value: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<Option<T>>> {
    prop::option::of(prop::option::of(value))
}

fn set_context() -> impl Strategy<Value = SetContext> {
    (
        patch(text()),
        patch(text()),
        patch(strings()),
        patch(any::<bool>()),
        patch(any::<bool>()),
        patch(any::<bool>()),
        patch(text()),
        any::<bool>(),
    )
        .prop_map(
            |(base, user, allow, plan, patch, web, model, refresh_mcp)| SetContext {
                base_instructions: base,
                user_instructions: user,
                mcp_tool_allowlist: allow,
                include_plan_tool: plan,
                include_apply_patch_tool: patch,
                tools_web_search_request: web,
                model,
                refresh_mcp,
            },
        )
}

fn approval_decision() -> impl Strategy<Value = ApprovalDecision> {
    prop_oneof![
        Just(ApprovalDecision::ApproveOnce),
        prop::option::of(any::<u64>())
            .prop_map(|ttl_secs| ApprovalDecision::ApproveForConversation { ttl_secs }),
        prop::option::of(any::<u64>())
            .prop_map(|ttl_secs| ApprovalDecision::ApproveForSession { ttl_secs }),
        prop::option::of(text()).prop_map(|reason| ApprovalDecision::Deny { reason }),
        Just(ApprovalDecision::TimedOut),
        json().prop_map(|content| ApprovalDecision::ApproveWithContent { content }),
    ]
}

fn approval_subject() -> impl Strategy<Value = ApprovalSubject> {
    prop_oneof![
        Just(ApprovalSubject::Command),
        Just(ApprovalSubject::CommandWithoutSandbox),
        Just(ApprovalSubject::Patch),
        (text(), text(), json()).prop_map(|(server, message, schema)| {
            ApprovalSubject::McpElicitation {
                server,
                message,
                schema,
            }
        }),
        (text(), json())
            .prop_map(|(server, request)| ApprovalSubject::McpSampling { server, request }),
        (text(), text())
            .prop_map(|(agent_id, question)| ApprovalSubject::AgentQuestion { agent_id, question }),
    ]
}

fn respond_approval() -> impl Strategy<Value = RespondApproval> {
    (approval_id(), approval_decision()).prop_map(|(approval_id, decision)| RespondApproval {
        approval_id,
        decision,
    })
}

fn pending_approval() -> impl Strategy<Value = PendingApproval> {
    (
        approval_id(),
        conversation_id(),
        prop::option::of(task_id()),
        strings(),
        text(),
        any::<[u64; 2]>(),
        approval_subject(),
        prop::option::of(text()),
    )
        .prop_map(
            |(
                approval_id,
                conversation_id,
                task_id,
                command,
                reason,
                [at, deadline],
                subject,
                workdir,
            )| {
                PendingApproval {
                    approval_id,
                    conversation_id,
                    task_id,
                    command,
                    reason,
                    requested_at_ms: at,
                    deadline_ms: deadline,
                    subject,
                    workdir,
                }
            },
        )
}

fn task_state() -> impl Strategy<Value = TaskState> {
    prop_oneof![
        Just(TaskState::Queued),
        Just(TaskState::Running),
        Just(TaskState::Cancelling),
    ]
}

fn task_info() -> impl Strategy<Value = TaskInfo> {
    (
        task_id(),
        conversation_id(),
        text(),
        any::<u64>(),
        task_state(),
    )
        .prop_map(
            |(task_id, conversation_id, sub_id, started_at_ms, state)| TaskInfo {
                task_id,
                conversation_id,
                sub_id,
                started_at_ms,
                state,
            },
        )
}

fn conversation_stats() -> impl Strategy<Value = ConversationStats> {
    (
        prop::option::of(conversation_id()),
        any::<[u64; 7]>(),
        usage(),
    )
        .prop_map(|(conversation_id, n, usage)| ConversationStats {
            conversation_id,
            tasks: n[0],
            tasks_failed: n[1],
            tasks_cancelled: n[2],
            usage,
            tool_calls: n[3],
            mcp_calls: n[4],
            mcp_latency_ms_total: n[5],
            history_items: n[6],
        })
}

// ---------------------------------------------------------------------------------------------
// Strategies: event

fn event_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        agent_event_kind(),
        (
            storage_policy(),
            prop::option::of(text()),
            prop::option::of(text())
        )
            .prop_map(|(storage_policy, base_instructions, user_instructions)| {
                EventKind::ConversationOpened {
                    storage_policy,
                    base_instructions,
                    user_instructions,
                }
            }),
        close_outcome().prop_map(|outcome| EventKind::ConversationClosed { outcome }),
        (text(), any::<u64>()).prop_map(|(reason, restored_items)| {
            EventKind::ConversationRestarted {
                reason,
                restored_items,
            }
        }),
        text().prop_map(|input| EventKind::TaskStarted { input }),
        (
            task_status(),
            text(),
            task_stats(),
            prop::option::of(agent_error())
        )
            .prop_map(|(status, text, stats, error)| EventKind::TaskFinished {
                status,
                text,
                stats,
                error,
            }),
        any::<u64>().prop_map(|waited_ms| EventKind::TaskAborted { waited_ms }),
        (any::<u32>(), any::<u32>()).prop_map(|(turn, step)| EventKind::StepStarted { turn, step }),
        text().prop_map(|delta| EventKind::AssistantChunk { delta }),
        text().prop_map(|text| EventKind::AssistantMessage { text }),
        tool_call().prop_map(|call| EventKind::ToolCallStarted {
            call,
            agent_id: None
        }),
        (text(), text(), text(), any::<bool>(), any::<u64>()).prop_map(
            |(call_id, name, output, is_error, duration_ms)| EventKind::ToolCallFinished {
                call_id,
                name,
                output,
                is_error,
                duration_ms,
                agent_id: None,
            }
        ),
        (approval_id(), strings(), text(), approval_subject()).prop_map(
            |(approval_id, command, reason, subject)| EventKind::ApprovalRequested {
                approval_id,
                command,
                reason,
                subject,
            }
        ),
        (approval_id(), approval_decision()).prop_map(|(approval_id, decision)| {
            EventKind::ApprovalResolved {
                approval_id,
                decision,
            }
        }),
        (any::<u64>(), text()).prop_map(|(removed_items, summary)| EventKind::HistoryTrimmed {
            removed_items,
            summary,
        }),
        (warning_code(), text()).prop_map(|(code, message)| EventKind::Warning { code, message }),
        agent_error().prop_map(|error| EventKind::Error { error }),
        Just(EventKind::CompactionStarted {}),
        (text(), any::<u64>()).prop_map(|(summary, replaced_items)| EventKind::Compacted {
            summary,
            replaced_items
        }),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(usage()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(
                |(turn, step, estimated_prompt_tokens, usage, estimated_completion_tokens)| {
                    EventKind::StepFinished {
                        turn,
                        step,
                        estimated_prompt_tokens,
                        usage,
                        estimated_completion_tokens,
                    }
                }
            ),
        (
            prop::option::of(text()),
            prop::collection::vec(plan_step(), 0..4)
        )
            .prop_map(|(explanation, plan)| EventKind::PlanUpdated { explanation, plan }),
        (
            text(),
            exact_f64(),
            prop::option::of(exact_f64()),
            prop::option::of(text())
        )
            .prop_map(
                |(call_id, progress, total, message)| EventKind::ToolProgress {
                    call_id,
                    progress,
                    total,
                    message,
                }
            ),
        (text(), any::<u32>())
            .prop_map(|(server, tools)| EventKind::McpServerReady { server, tools }),
        (
            any::<u64>(),
            prop::sample::select(crate::store::MessageStatus::ALL.to_vec()),
            prop::option::of(task_id()),
            prop::option::of(any::<u64>())
        )
            .prop_map(|(message_id, status, task_id, reply_message_id)| {
                EventKind::MessageUpdated {
                    message_id,
                    status,
                    task_id,
                    reply_message_id,
                }
            }),
        (
            prop::option::of(text()),
            any::<[u64; 2]>(),
            prop::option::of(task_id()),
            any::<u32>(),
            conversation_stats(),
        )
            .prop_map(
                |(summary, [replaced_items, skip_items], from_task, turns, stats)| {
                    EventKind::HistoryCheckpoint {
                        summary,
                        replaced_items,
                        from_task,
                        skip_items,
                        turns,
                        stats,
                    }
                }
            ),
    ]
}

fn event_envelope() -> impl Strategy<Value = EventEnvelope> {
    (
        any::<[u64; 2]>(),
        session_id(),
        prop::option::of(conversation_id()),
        prop::option::of(task_id()),
        prop::option::of(text()),
        prop::option::of("[0-9a-f]{32}"),
        prop::option::of("[0-9a-f]{16}"),
        event_kind(),
    )
        .prop_map(
            |(
                [seq, ts_ms],
                session_id,
                conversation_id,
                task_id,
                sub_id,
                trace_id,
                span_id,
                event,
            )| {
                EventEnvelope {
                    seq,
                    ts_ms,
                    session_id,
                    conversation_id,
                    task_id,
                    sub_id,
                    trace_id,
                    span_id,
                    event,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------
// Properties

/// Ids whose place in an `EventKind`'s JSON is known, checked alongside the round trip.
fn event_kind_ids(kind: &EventKind, value: &Value, prefix: &str) -> Result<(), TestCaseError> {
    match kind {
        EventKind::ApprovalRequested { approval_id, .. }
        | EventKind::ApprovalResolved { approval_id, .. } => {
            id_at(value, &format!("{prefix}/payload/approval_id"), approval_id)
        }
        _ => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // ids

    #[test]
    fn session_id_roundtrips(v in session_id()) {
        let value = roundtrip(&v)?;
        id_at(&value, "", &v)?;
    }

    #[test]
    fn conversation_id_roundtrips(v in conversation_id()) {
        let value = roundtrip(&v)?;
        id_at(&value, "", &v)?;
    }

    #[test]
    fn task_id_roundtrips(v in task_id()) {
        let value = roundtrip(&v)?;
        id_at(&value, "", &v)?;
    }

    #[test]
    fn approval_id_roundtrips(v in approval_id()) {
        let value = roundtrip(&v)?;
        id_at(&value, "", &v)?;
    }

    // error

    #[test]
    fn agent_error_roundtrips(v in agent_error()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(json_tag(&value), v.kind().as_str());
    }

    #[test]
    fn error_kind_roundtrips(v in error_kind()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(value, Value::String(v.as_str().to_owned()));
    }

    // policy

    #[test]
    fn storage_policy_roundtrips(v in storage_policy()) {
        roundtrip(&v)?;
    }

    #[test]
    fn approval_policy_roundtrips(v in approval_policy()) {
        roundtrip(&v)?;
    }

    #[test]
    fn over_budget_roundtrips(v in over_budget()) {
        roundtrip(&v)?;
    }

    #[test]
    fn tool_error_policy_roundtrips(v in tool_error_policy()) {
        roundtrip(&v)?;
    }

    #[test]
    fn sandbox_policy_roundtrips(v in sandbox_policy()) {
        roundtrip(&v)?;
    }

    #[test]
    fn command_key_roundtrips(v in command_key()) {
        let value = roundtrip(&v)?;
        opt_id_at(&value, "/conversation", v.conversation.as_ref())?;
    }

    // json

    #[test]
    fn json_roundtrips(v in json()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(value, v.0);
    }

    // item

    #[test]
    fn role_roundtrips(v in role()) {
        roundtrip(&v)?;
    }

    #[test]
    fn history_item_roundtrips(v in history_item()) {
        roundtrip(&v)?;
    }

    #[test]
    fn usage_roundtrips(v in usage()) {
        roundtrip(&v)?;
    }

    // tool

    #[test]
    fn tool_spec_roundtrips(v in tool_spec()) {
        let value = roundtrip(&v)?;
        // The schema is a JSON value in JSON, not its text.
        prop_assert_eq!(value.get("parameters"), Some(&v.parameters.0));
    }

    #[test]
    fn tool_call_roundtrips(v in tool_call()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(value.get("arguments"), Some(&v.arguments.0));
    }

    #[test]
    fn tool_output_roundtrips(v in tool_output()) {
        roundtrip(&v)?;
    }

    // event

    #[test]
    fn task_status_roundtrips(v in task_status()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(value, Value::String(v.as_str().to_owned()));
    }

    #[test]
    fn event_kind_roundtrips(v in event_kind()) {
        let value = roundtrip(&v)?;
        prop_assert_eq!(value.get("kind"), Some(&Value::String(v.name().as_str().to_owned())));
        event_kind_ids(&v, &value, "")?;
    }

    #[test]
    fn event_envelope_roundtrips(v in event_envelope()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/session_id", &v.session_id)?;
        opt_id_at(&value, "/conversation_id", v.conversation_id.as_ref())?;
        opt_id_at(&value, "/task_id", v.task_id.as_ref())?;
        event_kind_ids(&v.event, &value, "/event")?;
    }

    // api

    #[test]
    fn open_conversation_roundtrips(v in open_conversation()) {
        roundtrip(&v)?;
    }

    #[test]
    fn opened_roundtrips(v in opened()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
    }

    #[test]
    fn send_message_roundtrips(v in send_message()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
    }

    #[test]
    fn task_stats_roundtrips(v in task_stats()) {
        roundtrip(&v)?;
    }

    #[test]
    fn message_reply_roundtrips(v in message_reply()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
        id_at(&value, "/task_id", &v.task_id)?;
    }

    #[test]
    fn close_outcome_roundtrips(v in close_outcome()) {
        roundtrip(&v)?;
    }

    #[test]
    fn closed_roundtrips(v in closed()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
    }

    #[test]
    fn set_context_roundtrips(v in set_context()) {
        roundtrip(&v)?;
    }

    #[test]
    fn approval_decision_roundtrips(v in approval_decision()) {
        roundtrip(&v)?;
    }

    #[test]
    fn respond_approval_roundtrips(v in respond_approval()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/approval_id", &v.approval_id)?;
    }

    #[test]
    fn pending_approval_roundtrips(v in pending_approval()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/approval_id", &v.approval_id)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
        opt_id_at(&value, "/task_id", v.task_id.as_ref())?;
    }

    #[test]
    fn task_state_roundtrips(v in task_state()) {
        roundtrip(&v)?;
    }

    #[test]
    fn task_info_roundtrips(v in task_info()) {
        let value = roundtrip(&v)?;
        id_at(&value, "/task_id", &v.task_id)?;
        id_at(&value, "/conversation_id", &v.conversation_id)?;
    }

    #[test]
    fn conversation_stats_roundtrips(v in conversation_stats()) {
        let value = roundtrip(&v)?;
        opt_id_at(&value, "/conversation_id", v.conversation_id.as_ref())?;
    }
}

// ---------------------------------------------------------------------------------------------
// The strategies reach every variant

/// The JSON tags of many samples of `strategy`.
fn tags_of<T: Serialize + Debug>(strategy: impl Strategy<Value = T>) -> BTreeSet<String> {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..2_000)
        .map(|_| {
            let v = strategy.new_tree(&mut runner).unwrap().current();
            json_tag(&serde_json::to_value(&v).unwrap())
        })
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn strategies_cover_every_variant() {
    let kinds = [
        "cancelled",
        "timeout",
        "approval_denied",
        "sandbox_error",
        "mcp_error",
        "tool_conflict",
        "storage_policy_violation",
        "overloaded",
        "not_found",
        "invalid_input",
        "model_error",
        "tool_error",
        "internal",
        "interrupted",
        "policy_rejected",
        "guardrail_failed",
    ];
    assert_eq!(tags_of(error_kind()), set(&kinds));
    assert_eq!(tags_of(agent_error()), set(&kinds));
    assert_eq!(
        tags_of(event_kind()),
        set(&[
            "conversation_opened",
            "conversation_closed",
            "conversation_restarted",
            "task_started",
            "task_finished",
            "task_aborted",
            "step_started",
            "assistant_chunk",
            "assistant_message",
            "tool_call_started",
            "tool_call_finished",
            "approval_requested",
            "approval_resolved",
            "history_trimmed",
            "warning",
            "error",
            "step_finished",
            "compaction_started",
            "compacted",
            "plan_updated",
            "tool_progress",
            "mcp_server_ready",
            "message_updated",
            "history_checkpoint",
            "session_created",
            "session_bound",
            "session_resumed",
            "route_decided",
            "dispatch_sent",
            "dispatch_result",
            "policy_rejected",
            "ask_human",
            "agent_update",
            "guardrail_failed",
        ])
    );
    // One name per kind, each the kind's tag.
    assert_eq!(
        EventName::ALL
            .iter()
            .map(|n| n.as_str().to_owned())
            .collect::<BTreeSet<_>>(),
        tags_of(event_kind())
    );
    assert_eq!(
        tags_of(storage_policy()),
        set(&["full", "headers_only", "none", "ttl"])
    );
    assert_eq!(
        tags_of(approval_policy()),
        set(&["always", "on_failure", "never"])
    );
    assert_eq!(
        tags_of(sandbox_policy()),
        set(&["read_only", "workspace_write", "full_access"])
    );
    assert_eq!(tags_of(role()), set(&["system", "user", "assistant"]));
    assert_eq!(
        tags_of(history_item()),
        set(&["message", "tool_call", "tool_output", "summary"])
    );
    assert_eq!(
        tags_of(task_status()),
        set(&["ok", "error", "max_steps", "cancelled"])
    );
    assert_eq!(
        tags_of(close_outcome()),
        set(&["closed", "force_aborted", "already_closed"])
    );
    assert_eq!(
        tags_of(approval_decision()),
        set(&[
            "approve_once",
            "approve_for_conversation",
            "approve_for_session",
            "deny",
            "timed_out",
            "approve_with_content",
        ])
    );
    assert_eq!(
        tags_of(approval_subject()),
        set(&[
            "command",
            "command_without_sandbox",
            "patch",
            "mcp_elicitation",
            "mcp_sampling",
            "agent_question"
        ])
    );
    assert_eq!(
        tags_of(task_state()),
        set(&["queued", "running", "cancelling"])
    );
}

#[test]
fn strategies_cover_none_and_some() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut none, mut some) = (false, false);
    for _ in 0..200 {
        let v = event_envelope().new_tree(&mut runner).unwrap().current();
        none |= v.conversation_id.is_none();
        some |= v.conversation_id.is_some();
    }
    assert!(none && some);
}

// ---------------------------------------------------------------------------------------------
// Pinned JSON shapes

fn fixed_ids() -> (SessionId, ConversationId, TaskId) {
    (
        SessionId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001)),
        ConversationId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0002)),
        TaskId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0003)),
    )
}

#[test]
fn task_finished_envelope_json_shape() {
    let (session_id, conversation_id, task_id) = fixed_ids();
    let envelope = EventEnvelope {
        seq: 7,
        ts_ms: 1_700_000_000_000,
        session_id,
        conversation_id: Some(conversation_id),
        task_id: Some(task_id),
        sub_id: Some(format!("{conversation_id}/{task_id}")),
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        span_id: Some("00f067aa0ba902b7".into()),
        event: EventKind::TaskFinished {
            status: TaskStatus::Error,
            text: "partial".into(),
            stats: TaskStats {
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    cached_tokens: 0,
                    reasoning_tokens: 1,
                },
                estimated_prompt_tokens: 12,
                estimated_completion_tokens: 0,
                steps_with_usage: 2,
                turn: 1,
                steps: 2,
                tool_calls: 1,
                duration_ms: 250,
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                mcp_calls: 0,
                mcp_latency_ms: 0,
            },
            error: Some(AgentError::ModelError {
                message: "502".into(),
                retryable: true,
            }),
        },
    };
    let expected = json!({
        "seq": 7,
        "ts_ms": 1_700_000_000_000_u64,
        "session_id": "01900000-0000-7000-8000-000000000001",
        "conversation_id": "01900000-0000-7000-8000-000000000002",
        "task_id": "01900000-0000-7000-8000-000000000003",
        "sub_id": "01900000-0000-7000-8000-000000000002/01900000-0000-7000-8000-000000000003",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "event": {
            "kind": "task_finished",
            "payload": {
                "status": "error",
                "text": "partial",
                "stats": {
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 5,
                        "cached_tokens": 0,
                        "reasoning_tokens": 1
                    },
                    "estimated_prompt_tokens": 12,
                    "estimated_completion_tokens": 0,
                    "steps_with_usage": 2,
                    "turn": 1,
                    "steps": 2,
                    "tool_calls": 1,
                    "duration_ms": 250,
                    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                    "mcp_calls": 0,
                    "mcp_latency_ms": 0
                },
                "error": { "model_error": { "message": "502", "retryable": true } }
            }
        }
    });
    assert_eq!(serde_json::to_value(&envelope).unwrap(), expected);
    let back: EventEnvelope = serde_json::from_value(expected).unwrap();
    assert_eq!(back, envelope);
}

#[test]
fn agent_error_timeout_json_shape() {
    let error = AgentError::timeout("model call", std::time::Duration::from_secs(30));
    let expected = json!({ "timeout": { "what": "model call", "after_ms": 30_000 } });
    assert_eq!(serde_json::to_value(&error).unwrap(), expected);
    assert_eq!(
        serde_json::from_value::<AgentError>(expected).unwrap(),
        error
    );
}

#[test]
fn storage_policy_json_shape() {
    let ttl = StoragePolicy::Ttl { secs: 3_600 };
    let expected = json!({ "ttl": { "secs": 3_600 } });
    assert_eq!(serde_json::to_value(ttl).unwrap(), expected);
    assert_eq!(
        serde_json::from_value::<StoragePolicy>(expected).unwrap(),
        ttl
    );
    // Unit variants are bare strings.
    assert_eq!(
        serde_json::to_value(StoragePolicy::HeadersOnly).unwrap(),
        json!("headers_only")
    );
}

#[test]
fn approve_for_conversation_json_shape() {
    let with_ttl = ApprovalDecision::ApproveForConversation {
        ttl_secs: Some(600),
    };
    let expected = json!({ "approve_for_conversation": { "ttl_secs": 600 } });
    assert_eq!(serde_json::to_value(&with_ttl).unwrap(), expected);
    assert_eq!(
        serde_json::from_value::<ApprovalDecision>(expected).unwrap(),
        with_ttl
    );

    // No TTL is an explicit null, and a missing field reads as no TTL.
    let forever = ApprovalDecision::ApproveForConversation { ttl_secs: None };
    assert_eq!(
        serde_json::to_value(&forever).unwrap(),
        json!({ "approve_for_conversation": { "ttl_secs": null } })
    );
    assert_eq!(
        serde_json::from_value::<ApprovalDecision>(json!({ "approve_for_conversation": {} }))
            .unwrap(),
        forever
    );
}

#[test]
fn approval_requested_without_a_subject_reads_as_a_command() {
    // Records written before MCP requests were approvable have no `subject`.
    let id = ApprovalId::new();
    let old = json!({
        "kind": "approval_requested",
        "payload": { "approval_id": id.to_string(), "command": ["ls"], "reason": "r" }
    });
    assert_eq!(
        serde_json::from_value::<EventKind>(old).unwrap(),
        EventKind::ApprovalRequested {
            approval_id: id,
            command: vec!["ls".into()],
            reason: "r".into(),
            subject: ApprovalSubject::Command,
        }
    );
}

#[test]
fn elicitation_subject_json_shape() {
    let subject = ApprovalSubject::McpElicitation {
        server: "everything".into(),
        message: "your name?".into(),
        schema: Json(json!({"type": "object"})),
    };
    let expected = json!({ "mcp_elicitation": {
        "server": "everything", "message": "your name?", "schema": {"type": "object"}
    }});
    assert_eq!(serde_json::to_value(&subject).unwrap(), expected);
    assert_eq!(
        serde_json::to_value(ApprovalSubject::Command).unwrap(),
        json!("command")
    );
    let decision = ApprovalDecision::ApproveWithContent {
        content: Json(json!({"name": "Ada"})),
    };
    assert_eq!(
        serde_json::to_value(&decision).unwrap(),
        json!({ "approve_with_content": { "content": {"name": "Ada"} } })
    );
}

#[test]
fn set_context_tells_absent_from_null_from_a_value_in_json() {
    let update: SetContext = serde_json::from_value(json!({
        "model": null,
        "base_instructions": "be brief",
        "refreshMcp": true,
    }))
    .unwrap();
    assert_eq!(update.model, Some(None), "null: back to the default");
    assert_eq!(update.base_instructions, Some(Some("be brief".into())));
    assert_eq!(update.user_instructions, None, "absent: unchanged");
    assert!(update.refresh_mcp);
    assert_eq!(
        serde_json::to_value(&update).unwrap(),
        json!({"model": null, "base_instructions": "be brief", "refresh_mcp": true}),
        "written back the same way: absent stays absent"
    );
    let empty: SetContext = serde_json::from_value(json!({})).unwrap();
    assert_eq!(empty, SetContext::default());
}

#[test]
fn set_context_patches_each_field_absent_null_or_value() {
    assert_eq!(patched(3, None, 0), 3, "absent: unchanged");
    assert_eq!(patched(3, Some(&None), 0), 0, "null: the default");
    assert_eq!(patched(3, Some(&Some(7)), 0), 7, "a value: set");

    let opened = OpenConversation {
        base_instructions: Some("base".into()),
        user_instructions: Some("user".into()),
        mcp_tool_allowlist: Some(vec!["a__b".into()]),
        include_plan_tool: true,
        include_apply_patch_tool: true,
        tools_web_search_request: true,
        model: Some("m1".into()),
        ..OpenConversation::default()
    };
    let mut unchanged = opened.clone();
    unchanged.apply(&SetContext::default());
    assert_eq!(unchanged, opened);

    let mut reset = opened.clone();
    reset.apply(&SetContext {
        base_instructions: Some(None),
        user_instructions: Some(None),
        mcp_tool_allowlist: Some(None),
        include_plan_tool: Some(None),
        include_apply_patch_tool: Some(None),
        tools_web_search_request: Some(None),
        model: Some(None),
        refresh_mcp: false,
    });
    assert_eq!(
        reset,
        OpenConversation {
            storage_policy: opened.storage_policy,
            ..OpenConversation::default()
        },
        "every field back to what open gives when it is not named"
    );

    let mut set = reset.clone();
    set.apply(&SetContext {
        model: Some(Some("m2".into())),
        include_plan_tool: Some(Some(true)),
        ..SetContext::default()
    });
    assert_eq!(set.model.as_deref(), Some("m2"));
    assert!(set.include_plan_tool);
    assert_eq!(set.base_instructions, None, "untouched");
}
