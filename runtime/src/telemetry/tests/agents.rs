//! The spans of dispatches: `troupe.dispatch` is a child of the span that dispatched (the
//! turn for `/hub`, the `dispatch_agent` tool call for a delegation), names the agent, its
//! provider and provider session, and the agent's own task links to it.

use super::*;
use troupe_actors::agents::{AgentPorts, AgentSettings, RouterMode};
use troupe_proto::agent::{AgentBinding, AgentCatalog, AgentDefinition, ProviderSpec};

/// Bindings kept in memory for one test.
#[derive(Default)]
struct Bindings(Mutex<Vec<AgentBinding>>);

#[async_trait]
impl troupe_actors::ports::BindingStore for Bindings {
    async fn put_binding(&self, binding: AgentBinding) -> Result<(), AgentError> {
        let mut all = self.0.lock().unwrap();
        all.retain(|b| (b.session_id, &b.agent_id) != (binding.session_id, &binding.agent_id));
        all.push(binding);
        Ok(())
    }

    async fn bindings(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Vec<AgentBinding>, AgentError> {
        let all = self.0.lock().unwrap();
        Ok(all
            .iter()
            .filter(|b| session_id.is_none_or(|s| s == b.session_id))
            .cloned()
            .collect())
    }

    async fn remove_binding(
        &self,
        session_id: SessionId,
        agent_id: &str,
    ) -> Result<(), AgentError> {
        self.0
            .lock()
            .unwrap()
            .retain(|b| (b.session_id, b.agent_id.as_str()) != (session_id, agent_id));
        Ok(())
    }
}

/// A session's ports: the scripted model answering `replies`, the agents of `catalog` routed
/// by rules, bindings in memory.
fn ports_of(replies: Vec<ScriptedReply>, catalog: AgentCatalog) -> SessionPorts {
    SessionPorts {
        model: Arc::new(ScriptedModel::new(replies)),
        mcp: None,
        mcp_connector: None,
        exec: None,
        summarizer: Arc::new(troupe_actors::history::LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        effects: troupe_actors::ports::Effects::Live,
        agents: Some(AgentPorts {
            catalog: Arc::new(catalog),
            settings: AgentSettings {
                router: RouterMode::Rules,
                ..AgentSettings::default()
            },
            factories: Vec::new(),
            models: Default::default(),
            bindings: Arc::new(Bindings::default()),
            live: None,
        }),
    }
}

fn agent(id: &str, workers: &[&str]) -> AgentDefinition {
    AgentDefinition {
        id: id.into(),
        role: "worker".into(),
        description: None,
        provider: ProviderSpec::Model {
            model: None,
            provider: None,
            base_url: None,
            instructions: Some(format!("You are {id}.")),
        },
        session: Default::default(),
        tools: Default::default(),
        workers: workers.iter().map(|w| (*w).to_owned()).collect(),
        governance: None,
        output: None,
    }
}

#[tokio::test]
async fn a_dispatch_is_a_span_of_its_dispatcher_and_the_agents_task_links_to_it() {
    let traced = Traced::new();
    let dir = tempfile::tempdir().unwrap();
    let config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    let catalog = AgentCatalog {
        agents: [agent("lead", &["coder"]), agent("coder", &[])]
            .into_iter()
            .map(|d| (d.id.clone(), d))
            .collect(),
        ..AgentCatalog::default()
    };
    let replies = vec![
        ScriptedReply {
            tool_calls: vec![ScriptedCall {
                name: "dispatch_agent".into(),
                arguments: serde_json::json!({"agent_id": "coder", "input": "write it"}),
            }],
            ..ScriptedReply::default()
        },
        ScriptedReply::text("written"),
        ScriptedReply::text("the coder wrote it"),
    ];
    let ports = ports_of(replies, catalog);
    let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let root = session.root().await.unwrap();
    let reply = session.message(root, "/hub lead build it").await.unwrap();
    assert_eq!(reply.text, "the coder wrote it", "{reply:?}");
    session.shutdown().await.unwrap();
    let _ = join.await;
    let spans = traced.spans();

    let to_lead = one(&spans, "dispatch lead");
    let to_coder = one(&spans, "dispatch coder");
    for (span, agent_id, depth) in [(to_lead, "lead", "1"), (to_coder, "coder", "2")] {
        assert_eq!(span.span_kind, SpanKind::Internal);
        assert_eq!(attr(span, "agent_id").as_deref(), Some(agent_id));
        assert_eq!(
            attr(span, "gen_ai.operation.name").as_deref(),
            Some("invoke_agent")
        );
        assert_eq!(attr(span, "gen_ai.agent.name").as_deref(), Some(agent_id));
        assert_eq!(attr(span, "provider").as_deref(), Some("model"));
        assert_eq!(attr(span, "depth").as_deref(), Some(depth));
        assert!(attr(span, "dispatch_id").is_some());
        assert!(
            attr(span, "provider_session_id").is_some_and(|p| !p.is_empty()),
            "{span:?}"
        );
        assert_eq!(span.status, Status::Unset);
    }
    // `/hub` dispatches from the root task's turn; the lead's delegation from its tool call.
    let turns = named(&spans, "troupe.turn");
    assert!(
        turns
            .iter()
            .any(|t| t.span_context.span_id() == to_lead.parent_span_id),
        "the /hub dispatch is a child of the dispatching turn"
    );
    let call = one(&spans, "execute_tool dispatch_agent");
    assert_eq!(to_coder.parent_span_id, call.span_context.span_id());
    // Each agent's task is a trace of its own, linked to its dispatch.
    let tasks = named(&spans, "invoke_agent troupe");
    assert_eq!(tasks.len(), 3, "{:#?}", names(&spans));
    for dispatch in [to_lead, to_coder] {
        let linked: Vec<_> = tasks
            .iter()
            .filter(|t| {
                t.links
                    .links
                    .iter()
                    .any(|l| l.span_context.span_id() == dispatch.span_context.span_id())
            })
            .collect();
        assert_eq!(linked.len(), 1, "one task links to {}", dispatch.name);
        assert_eq!(linked[0].parent_span_id, SpanId::INVALID);
        assert_ne!(
            linked[0].span_context.trace_id(),
            dispatch.span_context.trace_id()
        );
    }
}

/// With `record_content`, a step whose answer an output guardrail holds back records no
/// messages: the invalid answer, the request to correct it and the raw text of the valid
/// one (with what masking drops) are in no span, as they are in no event or history.
#[tokio::test]
async fn content_is_not_recorded_on_a_step_held_for_the_guardrail() {
    const SECRET: &str = "123-45-6789";
    let traced = Traced::new();
    let dir = tempfile::tempdir().unwrap();
    let mut config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    config.conversation.record_content = true;
    let mut profiler = agent("profiler", &[]);
    profiler.output = Some(troupe_proto::agent::OutputSpec {
        schema: serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"]
        }),
        on_failure: Default::default(),
        max_retries: 2,
    });
    let catalog = AgentCatalog {
        agents: [(profiler.id.clone(), profiler)].into_iter().collect(),
        ..AgentCatalog::default()
    };
    let replies = vec![
        ScriptedReply::text(format!(
            r#"{{"name": "Ada", "age": "old", "ssn": "{SECRET}"}}"#
        )),
        ScriptedReply::text(format!(
            r#"{{"name": "Ada", "age": 36, "ssn": "{SECRET}"}}"#
        )),
    ];
    let ports = ports_of(replies, catalog);
    let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let root = session.root().await.unwrap();
    let reply = session
        .message(root, "/hub profiler who is she?")
        .await
        .unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&reply.text).unwrap(),
        serde_json::json!({"name": "Ada", "age": 36})
    );
    session.shutdown().await.unwrap();
    let _ = join.await;
    let spans = traced.spans();
    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.len(), 2, "{:#?}", names(&spans));
    for chat in &chats {
        // The operator's instructions may be recorded; the held messages are not.
        assert!(attr(chat, "gen_ai.system_instructions").is_some());
        assert_eq!(attr(chat, "gen_ai.input.messages"), None);
        assert_eq!(attr(chat, "gen_ai.output.messages"), None);
    }
    for span in &spans {
        for kv in &span.attributes {
            let value = kv.value.to_string();
            assert!(!value.contains(SECRET), "{}: {value}", kv.key);
            assert!(
                !value.contains("does not match the required JSON Schema"),
                "{}: {value}",
                kv.key
            );
        }
    }
}
