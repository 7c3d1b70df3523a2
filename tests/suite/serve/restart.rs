//! A session whose actor stops on its own is started again by its host under its ids,
//! with its conversations and their history; the API keeps answering for it.

use super::{Server, id};
use serde_json::json;
use std::time::Duration;
use troupe_runtime::ScriptedReply;
use troupe_service::auth::Scope;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stops_on_its_own_is_restarted_with_its_conversations() {
    let server = Server::start_with(|_| {}, vec![ScriptedReply::default(); 4]).await;
    let api = server.api();
    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    let root = id(&session, "root_conversation_id");
    let opened = api
        .call("conversation.open", json!({"session_id": sid}))
        .await;
    let other = opened["conversation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{opened}"))
        .to_owned();
    api.say(&sid, "before").await;
    let stats = |api: super::Api, sid: String, root: String| async move {
        api.call(
            "conversation.stats",
            json!({"session_id": sid, "conversation_id": root}),
        )
        .await
    };
    let items_before = stats(api.clone(), sid.clone(), root.clone()).await["history_items"].clone();
    assert!(items_before.as_u64().unwrap() >= 2, "{items_before}");

    let parsed = sid.parse().unwrap();
    let before = server
        .service
        .sessions
        .session(Scope::All, parsed)
        .await
        .unwrap();
    let old_actor = before.actor().get_id();
    before.actor().kill();

    // Its host notices and starts the session again under the same id.
    let t0 = std::time::Instant::now();
    let after = loop {
        if let Ok(h) = server.service.sessions.session(Scope::All, parsed).await
            && h.actor().get_id() != old_actor
        {
            break h;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not restarted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(after.root().await.unwrap().to_string(), root);
    let open: Vec<String> = after
        .list()
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(open.contains(&other), "{open:?} lacks {other}");
    // The root conversation's history came back from the rollout; the session works.
    let items_after = stats(api.clone(), sid.clone(), root.clone()).await["history_items"].clone();
    assert_eq!(items_after, items_before);
    let reply = api.say(&sid, "after").await;
    assert!(reply.to_string().contains("You said: after"), "{reply}");
    server.stop().await;
}
