//! A model per conversation (S1, C1): two conversations of one session ask a real HTTP model
//! server for different models; set-context switches a conversation's model; a provider that
//! is not the session's, or a model the client cannot switch to, is refused at open.

use troupe_proto::{AgentError, OpenConversation, SetContext, TaskStatus};
use troupe_runtime::config::{Provider, TroupeConfig};
use troupe_runtime::{ScriptedReply, assembly};
use troupe_test_support::{ModelServer, Reply};
use troupe_tests::{TestSession, start_with_model};

/// The model names the server was asked for, in order.
fn asked(server: &ModelServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A `base_url` with a query (an Azure-style `?api-version=`, a key) keeps it on every
/// request, after the provider's path, with both providers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_urls_query_is_kept_after_the_path() {
    let server = ModelServer::start().await;
    for (provider, path) in [
        (Provider::OpenaiChat, "/v1/chat/completions"),
        (Provider::OpenaiResponses, "/v1/responses"),
    ] {
        let mut config = TroupeConfig::default();
        config.model.provider = provider;
        config.model.base_url = format!("{}/?api-version=2024-10-21", server.base_url());
        let model = assembly::build_model(&config, None).unwrap();
        let (session, _dir, join) = start_with_model(model, |_| {}, None).await;
        server.push(Reply::text(["ok"]));
        let root = session.root().await.unwrap();
        let reply = session.message(root, "hello").await.unwrap();
        assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
        let asked = server.requests().pop().unwrap();
        assert_eq!(asked.path, path);
        assert_eq!(asked.query.as_deref(), Some("api-version=2024-10-21"));
        session.shutdown().await.unwrap();
        let _ = join.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_of_one_session_ask_for_different_models() {
    let server = ModelServer::start().await;
    let mut config = TroupeConfig::default();
    config.model.provider = Provider::OpenaiChat;
    config.model.base_url = server.base_url();
    config.model.model = "session-model".into();
    config.model.api_key = Some("test-key".into());
    let model = assembly::build_model(&config, None).unwrap();
    let (session, _dir, join) = start_with_model(model, |_| {}, None).await;

    let plain = session.open(OpenConversation::default()).await.unwrap();
    let own = session
        .open(OpenConversation {
            model: Some("conversation-model".into()),
            provider: Some("openai-chat".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    for _ in 0..4 {
        server.push(Reply::text(["ok"]));
    }
    for c in [plain, own] {
        let reply = session.message(c, "hello").await.unwrap();
        assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    }
    assert_eq!(asked(&server), ["session-model", "conversation-model"]);

    // set-context switches the model of the next task; the other conversation keeps its own.
    session
        .set_context(
            plain,
            SetContext {
                model: Some(Some("switched-model".into())),
                ..SetContext::default()
            },
        )
        .await
        .unwrap();
    session.message(plain, "again").await.unwrap();
    session.message(own, "again").await.unwrap();
    assert_eq!(
        asked(&server)[2..],
        ["switched-model", "conversation-model"]
    );

    // `null` (C6) puts the session's model back; the other conversation keeps its own.
    let reset: SetContext = serde_json::from_value(serde_json::json!({"model": null})).unwrap();
    session.set_context(plain, reset).await.unwrap();
    session
        .set_context(own, SetContext::default())
        .await
        .unwrap();
    for _ in 0..2 {
        server.push(Reply::text(["ok"]));
    }
    session.message(plain, "once more").await.unwrap();
    session.message(own, "once more").await.unwrap();
    assert_eq!(
        asked(&server)[4..],
        ["session-model", "conversation-model"],
        "null: the default again; absent: unchanged"
    );

    // A provider that is not the session's is refused at open, saying which one is.
    let err = session
        .open(OpenConversation {
            provider: Some("anthropic".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap_err();
    match err {
        AgentError::InvalidInput { message } => {
            assert!(
                message.contains("unknown provider `anthropic`"),
                "{message}"
            );
            assert!(message.contains("openai-chat"), "{message}");
        }
        other => panic!("expected invalid input, got {other:?}"),
    }
    let err = session
        .set_context(
            own,
            SetContext {
                model: Some(Some(" ".into())),
                ..SetContext::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    session.shutdown().await.unwrap();
    let _ = join.await;
}

#[tokio::test(start_paused = true)]
async fn a_client_that_serves_one_model_refuses_another() {
    let t = TestSession::start(vec![ScriptedReply::text("hi")]).await;
    let err = t
        .session
        .open(OpenConversation {
            model: Some("gpt-5".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap_err();
    match err {
        AgentError::InvalidInput { message } => {
            assert!(message.contains("serves only `scripted`"), "{message}");
        }
        other => panic!("expected invalid input, got {other:?}"),
    }
    // Naming the session's own provider and model is the session's model.
    let c = t
        .session
        .open(OpenConversation {
            model: Some("scripted".into()),
            provider: Some("scripted".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    assert_eq!(t.session.message(c, "x").await.unwrap().text, "hi");
    t.stop().await;
}

/// A conversation with a model of its own counts its prompts with that model's tokenizer
/// (here `gpt-4o`'s o200k_base, where the session's `llama3.1:8b` is approximated with
/// cl100k_base); a tokenizer named in the configuration counts every conversation's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversations_own_model_counts_with_its_own_tokenizer() {
    for (tokenizer, want_plain, want_own) in [
        (None, "cl100k_base", "o200k_base"),
        (Some("p50k_base"), "p50k_base", "p50k_base"),
    ] {
        let server = ModelServer::start().await;
        let mut config = TroupeConfig::default();
        config.model.provider = Provider::OpenaiChat;
        config.model.base_url = server.base_url();
        config.model.model = "llama3.1:8b".into();
        config.model.api_key = Some("test-key".into());
        config.chat.tokenizer_model = tokenizer.map(str::to_owned);
        let dir = tempfile::tempdir().unwrap();
        let mut session_config = troupe_actors::SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        session_config.conversation.task.warn_prompt_tokens = Some(1);
        let ports = troupe_actors::SessionPorts {
            model: assembly::build_model(&config, None).unwrap(),
            mcp: None,
            mcp_connector: None,
            exec: None,
            effects: troupe_actors::ports::Effects::Live,
            summarizer: std::sync::Arc::new(troupe_actors::history::LocalSummarizer::default()),
            tokens: assembly::try_build_tokens(&config).unwrap(),
            rollout_storage: None,
            agents: None,
        };
        let (session, _join) = troupe_actors::SessionHandle::start(
            troupe_proto::SessionId::new(),
            session_config,
            ports,
        )
        .await
        .unwrap();
        let plain = session.open(OpenConversation::default()).await.unwrap();
        let own = session
            .open(OpenConversation {
                model: Some("gpt-4o".into()),
                ..OpenConversation::default()
            })
            .await
            .unwrap();
        server.push(Reply::text(["ok"]));
        server.push(Reply::text(["ok"]));
        session.message(plain, "hello").await.unwrap();
        session.message(own, "hello").await.unwrap();
        session.flush().await.unwrap();
        let records = session.events_after(0, 1000).await.unwrap();
        let warned = |c: troupe_proto::ConversationId| -> String {
            records
                .iter()
                .filter(|r| r.conversation_id == Some(c))
                .filter_map(|r| match &r.event {
                    Some(troupe_proto::EventKind::Warning { message, .. }) => Some(message.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(
            warned(plain).contains(want_plain),
            "{tokenizer:?}: {}",
            warned(plain)
        );
        assert!(
            warned(own).contains(want_own),
            "{tokenizer:?}: {}",
            warned(own)
        );
        session.shutdown().await.unwrap();
    }
}
