//! JSON-RPC methods: their names, and method + params → a typed [`Request`]. Pure.

use crate::api::{CreateSession, SendText};
use crate::error::RpcError;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use troupe_proto::{
    ApprovalDecision, ApprovalId, ConversationId, OpenConversation, SessionId, SetContext, TaskId,
};

/// Every method, as the method label of metrics takes it.
pub const METHODS: &[&str] = &[
    "session.create",
    "session.get",
    "session.list",
    "conversation.open",
    "conversation.message",
    "conversation.send",
    "conversation.close",
    "conversation.setContext",
    "conversation.list",
    "conversation.stats",
    "conversation.cancelAll",
    "conversation.compact",
    "task.cancel",
    "task.list",
    "approval.list",
    "approval.respond",
    "messages.list",
    "messages.get",
    "project.setCurrentSession",
    "project.currentSession",
    "events.subscribe",
    "events.unsubscribe",
    "agents.list",
    "modules.list",
    "tokens.issue",
    "tokens.list",
    "tokens.revoke",
];

/// The `&'static` name of a method for metric labels (`unknown` otherwise).
pub fn method_label(method: &str) -> &'static str {
    METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("unknown")
}

/// A decoded call.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    SessionCreate(CreateSession),
    SessionGet {
        session_id: SessionId,
    },
    SessionList {
        project_id: Option<String>,
    },
    ConversationOpen {
        session_id: SessionId,
        params: OpenConversation,
    },
    /// `conversation.message` (waits) and `conversation.send` (does not).
    ConversationMessage {
        session_id: SessionId,
        send: SendText,
    },
    ConversationClose {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    ConversationSetContext {
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
    },
    ConversationList {
        session_id: SessionId,
    },
    ConversationStats {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    /// `conversation.cancelAll`: the running task and the queued messages.
    ConversationCancelAll {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    /// `conversation.compact`: the history replaced by a summary the model writes.
    ConversationCompact {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    TaskCancel {
        session_id: SessionId,
        task_id: TaskId,
    },
    /// `agents.list`: the agents, as a session runs them when it is named.
    AgentsList {
        session_id: Option<SessionId>,
    },
    /// `modules.list`: the modules with their health.
    ModulesList,
    TaskList {
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
    },
    ApprovalList {
        session_id: SessionId,
    },
    ApprovalRespond {
        session_id: SessionId,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    },
    MessagesList {
        session_id: SessionId,
        limit: Option<usize>,
        before: Option<u64>,
    },
    MessagesGet {
        session_id: SessionId,
        message_id: u64,
    },
    ProjectSetCurrent {
        project_id: String,
        session_id: SessionId,
    },
    ProjectCurrent {
        project_id: String,
    },
    EventsSubscribe {
        session_id: SessionId,
        after: Option<u64>,
    },
    EventsUnsubscribe {
        subscription: u64,
    },
    /// `tokens.issue`: an authorization token for an agent and a tool (A5).
    TokensIssue(troupe_proto::governance::IssueToken),
    TokensList,
    TokensRevoke {
        id: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenIdParams {
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionParams {
    session_id: SessionId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectParams {
    #[serde(default)]
    project_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequiredProject {
    project_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageParams {
    session_id: SessionId,
    #[serde(default)]
    conversation_id: Option<ConversationId>,
    text: String,
    #[serde(default)]
    tools: Option<troupe_proto::agent::ToolRules>,
    #[serde(default)]
    authorization: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConversationParams {
    session_id: SessionId,
    conversation_id: ConversationId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskParams {
    session_id: SessionId,
    task_id: TaskId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsParams {
    #[serde(default)]
    session_id: Option<SessionId>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskListParams {
    session_id: SessionId,
    #[serde(default)]
    conversation_id: Option<ConversationId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondParams {
    session_id: SessionId,
    approval_id: ApprovalId,
    decision: ApprovalDecision,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesParams {
    session_id: SessionId,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    before: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageGetParams {
    session_id: SessionId,
    message_id: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCurrentParams {
    project_id: String,
    session_id: SessionId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeParams {
    session_id: SessionId,
    #[serde(default)]
    after: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeParams {
    subscription: u64,
}

/// The entries of the object `value` named in `keys`, and the others, as two objects: the
/// params of a method that are ids next to the fields of one struct are read in two strict
/// parts (serde's `flatten` would let a field neither part knows pass unnoticed).
fn split(value: Value, keys: &[&str]) -> (Value, Value) {
    let Value::Object(all) = value else {
        return (value, json!({}));
    };
    let (ids, rest): (serde_json::Map<_, _>, serde_json::Map<_, _>) = all
        .into_iter()
        .partition(|(k, _)| keys.contains(&k.as_str()));
    (Value::Object(ids), Value::Object(rest))
}

fn params<T: DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    serde_json::from_value(value).map_err(|e| RpcError::invalid_params(e.to_string()))
}

/// Method name and params → a typed request. Params are by name; a one-element array
/// holding the object is accepted too.
pub fn decode(method: &str, raw: Option<Value>) -> Result<Request, RpcError> {
    let value = match raw {
        None | Some(Value::Null) => json!({}),
        Some(Value::Array(mut items)) if items.len() == 1 && items[0].is_object() => {
            items.remove(0)
        }
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(RpcError::invalid_params(
                "params must be an object of named parameters",
            ));
        }
    };
    Ok(match method {
        "session.create" => Request::SessionCreate(params(value)?),
        "session.get" => Request::SessionGet {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "session.list" => Request::SessionList {
            project_id: params::<ProjectParams>(value)?.project_id,
        },
        "conversation.open" => {
            let (ids, rest) = split(value, &["session_id"]);
            Request::ConversationOpen {
                session_id: params::<SessionParams>(ids)?.session_id,
                params: params::<OpenConversation>(rest)?,
            }
        }
        "conversation.message" | "conversation.send" => {
            let p: MessageParams = params(value)?;
            Request::ConversationMessage {
                session_id: p.session_id,
                send: SendText {
                    conversation_id: p.conversation_id,
                    text: p.text,
                    wait: method == "conversation.message",
                    tools: p.tools,
                    authorization: p.authorization,
                },
            }
        }
        "conversation.close" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationClose {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "conversation.setContext" => {
            let (ids, rest) = split(value, &["session_id", "conversation_id"]);
            let ids = params::<ConversationParams>(ids)?;
            Request::ConversationSetContext {
                session_id: ids.session_id,
                conversation_id: ids.conversation_id,
                update: params::<SetContext>(rest)?,
            }
        }
        "conversation.list" => Request::ConversationList {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "conversation.stats" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationStats {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "conversation.cancelAll" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationCancelAll {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "conversation.compact" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationCompact {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "task.cancel" => {
            let p: TaskParams = params(value)?;
            Request::TaskCancel {
                session_id: p.session_id,
                task_id: p.task_id,
            }
        }
        "modules.list" => Request::ModulesList,
        "agents.list" => Request::AgentsList {
            session_id: params::<AgentsParams>(value)?.session_id,
        },
        "task.list" => {
            let p: TaskListParams = params(value)?;
            Request::TaskList {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "approval.list" => Request::ApprovalList {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "approval.respond" => {
            let p: RespondParams = params(value)?;
            Request::ApprovalRespond {
                session_id: p.session_id,
                approval_id: p.approval_id,
                decision: p.decision,
            }
        }
        "messages.list" => {
            let p: MessagesParams = params(value)?;
            Request::MessagesList {
                session_id: p.session_id,
                limit: p.limit,
                before: p.before,
            }
        }
        "messages.get" => {
            let p: MessageGetParams = params(value)?;
            Request::MessagesGet {
                session_id: p.session_id,
                message_id: p.message_id,
            }
        }
        "project.setCurrentSession" => {
            let p: SetCurrentParams = params(value)?;
            Request::ProjectSetCurrent {
                project_id: p.project_id,
                session_id: p.session_id,
            }
        }
        "project.currentSession" => Request::ProjectCurrent {
            project_id: params::<RequiredProject>(value)?.project_id,
        },
        "events.subscribe" => {
            let p: SubscribeParams = params(value)?;
            Request::EventsSubscribe {
                session_id: p.session_id,
                after: p.after,
            }
        }
        "events.unsubscribe" => Request::EventsUnsubscribe {
            subscription: params::<UnsubscribeParams>(value)?.subscription,
        },
        "tokens.issue" => Request::TokensIssue(params(value)?),
        "tokens.list" => {
            let NoParams {} = params(value)?;
            Request::TokensList
        }
        "tokens.revoke" => Request::TokensRevoke {
            id: params::<TokenIdParams>(value)?.id,
        },
        other => return Err(RpcError::method_not_found(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{INVALID_PARAMS, METHOD_NOT_FOUND};
    use proptest::prelude::*;

    #[test]
    fn methods_decode_to_typed_requests() {
        let sid = SessionId::new();
        let r = decode(
            "conversation.message",
            Some(json!({"session_id": sid, "text": "hi"})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationMessage {
                send: SendText { wait: true, .. },
                ..
            }
        ));
        let r = decode(
            "conversation.send",
            Some(json!([{"session_id": sid, "text": "hi"}])),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationMessage {
                send: SendText { wait: false, .. },
                ..
            }
        ));
        let r = decode(
            "conversation.open",
            Some(json!({"session_id": sid, "base_instructions": "be brief"})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationOpen { ref params, .. } if params.base_instructions.as_deref() == Some("be brief")
        ));
        let r = decode(
            "conversation.open",
            Some(json!({"session_id": sid, "model": "gpt-4.1", "provider": "openai-chat"})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationOpen { ref params, .. }
                if params.model.as_deref() == Some("gpt-4.1")
                    && params.provider.as_deref() == Some("openai-chat")
        ));
        let cid = ConversationId::new();
        let r = decode(
            "conversation.cancelAll",
            Some(json!({"session_id": sid, "conversation_id": cid})),
        )
        .unwrap();
        assert_eq!(
            r,
            Request::ConversationCancelAll {
                session_id: sid,
                conversation_id: cid
            }
        );
        // A field the method does not know is refused, also next to the ids: a misspelt
        // storage policy must not open a conversation under the default (`full`).
        let e = decode(
            "conversation.open",
            Some(json!({"session_id": sid, "storage_polcy": "none"})),
        )
        .unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(e.message.contains("storage_polcy"), "{}", e.message);
        let e = decode(
            "conversation.setContext",
            Some(json!({"session_id": sid, "conversation_id": cid, "modle": "gpt-4.1"})),
        )
        .unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(e.message.contains("modle"), "{}", e.message);
        let r = decode(
            "conversation.setContext",
            Some(json!({"session_id": sid, "conversation_id": cid, "model": null, "refreshMcp": true})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationSetContext { ref update, conversation_id, .. }
                if update.model == Some(None) && update.refresh_mcp && conversation_id == cid
        ));
        assert_eq!(
            decode("conversation.open", Some(json!({"model": "m"})))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        let e = decode(
            "session.create",
            Some(json!({"root": {"storage_polcy": "none"}})),
        )
        .unwrap_err();
        assert!(e.message.contains("storage_polcy"), "{}", e.message);
        assert_eq!(decode("nope", None).unwrap_err().code, METHOD_NOT_FOUND);
        assert_eq!(
            decode("session.get", None).unwrap_err().code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.get", Some(json!({"session_id": "not-a-uuid"})))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.get", Some(json!({"session_id": sid, "extra": 1})))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.list", Some(json!([1, 2])))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        for m in METHODS {
            // Every listed method is known to the decoder (it fails on params, not the name).
            let r = decode(m, Some(json!({"session_id": 5})));
            assert!(
                !matches!(r, Err(ref e) if e.code == METHOD_NOT_FOUND),
                "{m}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn arbitrary_params_are_invalid_params_or_ok(
            method in proptest::sample::select(METHODS.to_vec()),
            params in arb_json(),
        ) {
            match decode(method, Some(params)) {
                Ok(_) => {}
                Err(e) => prop_assert_eq!(e.code, INVALID_PARAMS),
            }
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z_]{0,12}".prop_map(Value::String),
            Just(json!(SessionId::new())),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("session_id".to_owned()),
                        Just("conversation_id".to_owned()),
                        Just("text".to_owned()),
                        Just("limit".to_owned()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
