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
