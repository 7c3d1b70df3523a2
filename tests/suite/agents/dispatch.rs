//! Dispatch to an in-process agent and its binding (A1, A2): `/hub` straight to the agent,
//! the binding made, stored, reused, resumed by the next run, replaced when it cannot be; a
//! dispatch that cannot run is refused with its reason, never dropped.

use super::{Team, acp_agent, agent_kinds, model_agent};
use troupe_proto::agent::{
    AgentBinding, DispatchStatus, PolicyReason, ProviderKind, RouteDecision, RouteSource,
};
use troupe_proto::{
    AgentError, ConversationId, ErrorKind, EventKind, HistoryItem, TaskStatus, WarningCode,
};
use troupe_runtime::ScriptedReply;
use troupe_store::BindingStore;

fn user_texts(prompt: &[HistoryItem]) -> Vec<String> {
    prompt
        .iter()
        .filter_map(|i| match i {
            HistoryItem::Message {
                role: troupe_proto::Role::User,
                text,
            } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn hub_goes_straight_to_the_agent_and_binds_its_conversation() {
    let team = Team::start(
        vec![model_agent("coder", "You write code.", &[])],
        vec![ScriptedReply::text("patched")],
    )
    .await;
    let reply = team.send("/hub coder fix the bug").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "patched")
    );
    let sent = team.model.sent();
    assert_eq!(sent.len(), 1, "only the agent called the model");
    assert_eq!(sent[0].instructions, "You write code.");
    assert_eq!(user_texts(&sent[0].prompt), ["fix the bug"]);

    let events = team.events().await;
    assert_eq!(
        agent_kinds(&events),
        [
            "route_decided",
            "dispatch_sent",
            "session_created",
            "session_bound",
            "dispatch_result"
        ]
    );
    let route = events
        .iter()
        .find_map(|e| match e {
            EventKind::RouteDecided {
                decision,
                agent_id,
                confidence,
                source,
                ..
            } => Some((*decision, agent_id.clone(), *confidence, *source)),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        route,
        (
            RouteDecision::DispatchAgent,
            Some("coder".into()),
            1.0,
            RouteSource::Hub
        )
    );
    let (psid, status, text) = events
        .iter()
        .find_map(|e| match e {
            EventKind::DispatchResult {
                provider_session_id,
                status,
                text,
                agent_id,
                ..
            } if agent_id == "coder" => Some((provider_session_id.clone()?, *status, text.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!((status, text.as_str()), (DispatchStatus::Ok, "patched"));
    assert!(events.iter().any(|e| matches!(e,
        EventKind::SessionBound { agent_id, provider: ProviderKind::Model, provider_session_id, replaced: None, .. }
            if agent_id == "coder" && *provider_session_id == psid)));
    // The provider session is the agent's conversation, open in the session.
    let conversation: ConversationId = psid.parse().unwrap();
    assert!(
        team.session
            .conversation_actor(conversation)
            .await
            .unwrap()
            .is_some()
    );
    let stored = team.store.bindings(Some(team.session_id)).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (
            stored[0].agent_id.as_str(),
            stored[0].provider,
            stored[0].provider_session_id.as_str()
        ),
        ("coder", ProviderKind::Model, psid.as_str())
    );

    // The next dispatch reuses the binding: no new provider session, the agent remembers.
    let again = team.send("/hub coder and the test").await;
    assert_eq!(again.text, "You said: and the test");
    let events = team.events().await;
    assert_eq!(
        agent_kinds(&events)[5..],
        ["route_decided", "dispatch_sent", "dispatch_result"]
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::DispatchSent { provider_session_id: Some(p), .. } if *p == psid)));
    let results: Vec<Option<String>> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchResult {
                provider_session_id,
                ..
            } => Some(provider_session_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results, [Some(psid.clone()), Some(psid.clone())]);
    let sent = team.model.sent();
    assert_eq!(user_texts(&sent[1].prompt), ["fix the bug", "and the test"]);
}

#[tokio::test]
async fn the_next_run_resumes_the_binding_with_the_agents_history() {
    let team = Team::start(
        vec![model_agent("coder", "You write code.", &[])],
        vec![ScriptedReply::text("noted")],
    )
    .await;
    team.send("/hub coder remember the number 42").await;
    let first: AgentBinding = team.store.bindings(None).await.unwrap().remove(0);

    let team = team.restart(vec![ScriptedReply::text("it was 42")]).await;
    let reply = team.send("/hub coder which number?").await;
    assert_eq!(reply.text, "it was 42");
    let events = team.events().await;
    let resumed: Vec<&EventKind> = events
        .iter()
        .filter(|e| matches!(e, EventKind::SessionResumed { .. }))
        .collect();
    assert_eq!(resumed.len(), 1, "{:?}", agent_kinds(&events));
    assert!(matches!(resumed[0],
        EventKind::SessionResumed { agent_id, provider_session_id, .. }
            if agent_id == "coder" && *provider_session_id == first.provider_session_id));
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, EventKind::SessionCreated { .. }))
            .count(),
        1,
        "the second run created nothing"
    );
    // Rebuilt from the rollout: the agent's conversation still holds the first exchange.
    let sent = team.model.sent();
    assert_eq!(
        user_texts(&sent[0].prompt),
        ["remember the number 42", "which number?"]
    );
    let now = team.store.bindings(None).await.unwrap().remove(0);
    assert_eq!(now.provider_session_id, first.provider_session_id);
    assert_eq!(now.created_ms, first.created_ms);
    assert!(now.updated_ms >= first.updated_ms);
}

/// The agent's conversation's standing in the session.
async fn standing(team: &Team, c: ConversationId) -> Option<troupe_actors::session::Standing> {
    team.session.standing(c).await.unwrap()
}

#[tokio::test]
async fn an_agents_conversation_passivated_between_dispatches_is_reactivated_with_its_history() {
    const IDLE: std::time::Duration = std::time::Duration::from_secs(600);
    let team = Team::start_with(
        vec![model_agent("coder", "You write code.", &[])],
        Vec::new(),
        super::settings(troupe_actors::agents::RouterMode::Rules),
        |config| config.conversation.passivate_after = Some(IDLE),
    )
    .await;
    // The first dispatch binds the conversation; the next ones go straight to it.
    for text in ["one", "two", "three"] {
        let reply = team.send(&format!("/hub coder {text}")).await;
        assert_eq!(reply.text, format!("You said: {text}"), "{reply:?}");
    }
    let psid = team
        .store
        .bindings(None)
        .await
        .unwrap()
        .remove(0)
        .provider_session_id;
    let coder: ConversationId = psid.parse().unwrap();
    let live = team
        .session
        .conversation_actor(coder)
        .await
        .unwrap()
        .unwrap();

    // Idle for the passivation period (paused clock): the agent's conversation stops.
    tokio::time::pause();
    tokio::time::advance(IDLE + std::time::Duration::from_secs(1)).await;
    for _ in 0..1000 {
        if standing(&team, coder).await == Some(troupe_actors::session::Standing::Passivated) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::resume();
    assert_eq!(
        standing(&team, coder).await,
        Some(troupe_actors::session::Standing::Passivated)
    );
    assert_eq!(live.get_status(), ractor::ActorStatus::Stopped);

    // The next dispatches reactivate it, with the exchanges so far, and reach its new actor.
    for text in ["four", "five"] {
        let reply = team.send(&format!("/hub coder {text}")).await;
        assert_eq!(reply.text, format!("You said: {text}"), "{reply:?}");
    }
    let sent = team.model.sent();
    assert_eq!(
        user_texts(&sent.last().unwrap().prompt),
        ["one", "two", "three", "four", "five"]
    );
    let events = team.events().await;
    let results: Vec<(DispatchStatus, Option<String>)> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchResult {
                status,
                provider_session_id,
                ..
            } => Some((*status, provider_session_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results, vec![(DispatchStatus::Ok, Some(psid.clone())); 5]);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, EventKind::SessionCreated { .. }))
            .count(),
        1,
        "bound once"
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::ConversationRestarted { reason, .. } if reason.contains("passivation"))));
    let again = team
        .session
        .conversation_actor(coder)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(again.get_id(), live.get_id(), "a new actor");
}

#[tokio::test]
async fn a_binding_that_cannot_be_resumed_is_replaced_with_an_alert() {
    let team = Team::start(vec![model_agent("coder", "x", &[])], Vec::new()).await;
    team.store
        .put_binding(AgentBinding {
            session_id: team.session_id,
            agent_id: "coder".into(),
            provider: ProviderKind::Model,
            provider_session_id: "gone-long-ago".into(),
            created_ms: 1,
            updated_ms: 1,
        })
        .await
        .unwrap();
    let team = team.restart(Vec::new()).await;
    let reply = team.send("/hub coder hello").await;
    assert_eq!(reply.text, "You said: hello");
    let events = team.events().await;
    let warning = events
        .iter()
        .find_map(|e| match e {
            EventKind::Warning {
                code: WarningCode::BindingReplaced,
                message,
            } => Some(message.clone()),
            _ => None,
        })
        .expect("an alert says the binding was replaced");
    assert!(
        warning.contains("coder") && warning.contains("gone-long-ago"),
        "{warning}"
    );
    let bound = events
        .iter()
        .find_map(|e| match e {
            EventKind::SessionBound {
                provider_session_id,
                replaced,
                ..
            } => Some((provider_session_id.clone(), replaced.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(bound.1.as_deref(), Some("gone-long-ago"));
    assert!(bound.0.parse::<ConversationId>().is_ok());
    let stored = team.store.bindings(None).await.unwrap();
    assert_eq!(stored[0].provider_session_id, bound.0);
}

#[tokio::test]
async fn a_dispatch_that_cannot_run_is_refused_with_its_reason() {
    let team = Team::start(
        vec![model_agent("coder", "x", &[]), acp_agent("external")],
        Vec::new(),
    )
    .await;
    for (text, reason) in [
        ("/hub ghost do it", PolicyReason::UnknownAgent),
        ("/hub external do it", PolicyReason::ProviderUnavailable),
    ] {
        let reply = team.send(text).await;
        assert_eq!(reply.status, TaskStatus::Error, "{text}");
        match reply.error {
            Some(AgentError::PolicyRejected {
                reason: r, chain, ..
            }) => {
                assert_eq!(r, reason);
                assert_eq!(chain.first().map(String::as_str), Some("supervisor"));
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let events = team.events().await;
    let rejected: Vec<PolicyReason> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::PolicyRejected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejected,
        [
            PolicyReason::UnknownAgent,
            PolicyReason::ProviderUnavailable
        ]
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::DispatchSent { .. })),
        "nothing was sent"
    );
    let usage = team.send("/hub coder").await;
    assert_eq!(usage.error.map(|e| e.kind()), Some(ErrorKind::InvalidInput));
    assert!(team.model.sent().is_empty());
}

/// The conversation an in-process agent is bound to was closed (a client closed it by its
/// id): the next dispatch to the agent still answers, in the agent's conversation reopened
/// with its history, instead of failing for as long as the session runs.
#[tokio::test]
async fn an_agent_whose_conversation_was_closed_answers_the_next_dispatch() {
    let team = Team::start(
        vec![model_agent("coder", "You write code.", &[])],
        vec![ScriptedReply::text("patched")],
    )
    .await;
    let first = team.send("/hub coder fix the bug").await;
    assert_eq!(first.status, TaskStatus::Ok, "{first:?}");
    let psid = team.store.bindings(Some(team.session_id)).await.unwrap()[0]
        .provider_session_id
        .clone();
    let conversation: ConversationId = psid.parse().unwrap();
    team.session.close(conversation).await.unwrap();

    let again = team.send("/hub coder and the test").await;
    assert_eq!(
        (again.status, again.text.as_str()),
        (TaskStatus::Ok, "You said: and the test"),
        "{:?}",
        again.error
    );
    let sent = team.model.sent();
    assert_eq!(
        user_texts(&sent[1].prompt),
        ["fix the bug", "and the test"],
        "the agent's history came back with its conversation"
    );
}

/// An agent that a later run does not define at first, and a reload of the definitions
/// defines again, resumes the binding its earlier run stored instead of opening a new one.
#[tokio::test]
async fn an_agent_a_reload_defines_again_resumes_its_stored_binding() {
    let coder = model_agent("coder", "You write code.", &[]);
    let mut team = Team::start(vec![coder.clone()], vec![ScriptedReply::text("noted")]).await;
    team.send("/hub coder remember the number 42").await;
    let first: AgentBinding = team.store.bindings(None).await.unwrap().remove(0);

    let other = model_agent("other", "You do other work.", &[]);
    team.defs = vec![other.clone()];
    let team = team.restart(vec![ScriptedReply::text("it was 42")]).await;
    let hub = team.session.services().await.unwrap().agents.unwrap();
    let catalog = troupe_proto::agent::AgentCatalog {
        agents: [other, coder]
            .into_iter()
            .map(|d| (d.id.clone(), d))
            .collect(),
        ..Default::default()
    };
    hub.cast(troupe_actors::agents::hub::AgentHubMsg::CatalogChanged {
        catalog: std::sync::Arc::new(catalog),
    })
    .unwrap();

    let reply = team.send("/hub coder which number?").await;
    assert_eq!(reply.text, "it was 42", "{:?}", reply.error);
    let events = team.events().await;
    assert!(
        events.iter().any(|e| matches!(e,
            EventKind::SessionResumed { agent_id, provider_session_id, .. }
                if agent_id == "coder" && *provider_session_id == first.provider_session_id)),
        "{:?}",
        agent_kinds(&events)
    );
    let sent = team.model.sent();
    assert_eq!(
        user_texts(&sent[0].prompt),
        ["remember the number 42", "which number?"]
    );
}

/// A turn answered through `/hub` keeps its exchange in the dispatcher's history, and a
/// restore of that conversation (it failed and was started again from its record) brings the
/// exchange back as it was.
#[tokio::test]
async fn a_routed_turn_comes_back_with_a_restored_conversation() {
    let run = |restart: bool| async move {
        let team = Team::start(
            vec![model_agent("coder", "You write code.", &[])],
            vec![ScriptedReply::text("patched")],
        )
        .await;
        team.send("/hub coder fix the bug").await;
        let root = team.session.root().await.unwrap();
        if restart {
            troupe_tests::restart_conversation(&team.session, root).await;
        }
        team.send("and then?").await;
        team.model.sent().pop().unwrap().prompt
    };
    let live = run(false).await;
    assert_eq!(
        user_texts(&live),
        ["/hub coder fix the bug", "and then?"],
        "{live:?}"
    );
    assert_eq!(run(true).await, live);
}

/// A changed agent file reaches the agent's conversation that is already open (A7): its
/// next task runs under the new instructions, and without any once they are removed (it
/// kept the instructions it was opened with until the service restarted).
#[tokio::test]
async fn a_changed_definition_reaches_the_open_conversation_of_the_agent() {
    let coder = model_agent("coder", "You write code.", &[]);
    let team = Team::start(
        vec![coder.clone()],
        vec![
            ScriptedReply::text("one"),
            ScriptedReply::text("two"),
            ScriptedReply::text("three"),
        ],
    )
    .await;
    team.send("/hub coder first").await;
    let hub = team.session.services().await.unwrap().agents.unwrap();
    let reload = |instructions: Option<&str>| {
        let mut def = coder.clone();
        if let troupe_proto::agent::ProviderSpec::Model {
            instructions: i, ..
        } = &mut def.provider
        {
            *i = instructions.map(str::to_owned);
        }
        troupe_actors::agents::hub::AgentHubMsg::CatalogChanged {
            catalog: std::sync::Arc::new(troupe_proto::agent::AgentCatalog {
                agents: [(def.id.clone(), def)].into_iter().collect(),
                ..Default::default()
            }),
        }
    };
    hub.cast(reload(Some("You review code."))).unwrap();
    assert_eq!(team.send("/hub coder second").await.text, "two");
    hub.cast(reload(None)).unwrap();
    assert_eq!(team.send("/hub coder third").await.text, "three");
    let sent: Vec<String> = team
        .model
        .sent()
        .into_iter()
        .map(|r| r.instructions)
        .collect();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent[0].contains("You write code."), "{}", sent[0]);
    assert!(sent[1].contains("You review code."), "{}", sent[1]);
    assert!(
        !sent[2].contains("You write code.") && !sent[2].contains("You review code."),
        "{}",
        sent[2]
    );
    let agents: Vec<String> = team
        .store
        .bindings(None)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.provider_session_id)
        .collect();
    assert_eq!(agents.len(), 1, "one binding, one conversation throughout");
}

/// An agent that does not resume (`resume = false`) gets a new provider session in the next
/// run, and its `dispatch_sent` names none rather than the stored one it replaces; one that
/// resumes names the stored one it will use.
#[tokio::test]
async fn dispatch_sent_names_the_provider_session_the_dispatch_uses() {
    let mut fresh = model_agent("coder", "You write code.", &[]);
    fresh.session.resume = false;
    let team = Team::start(vec![fresh], vec![ScriptedReply::text("noted")]).await;
    team.send("/hub coder remember the number 42").await;
    let first: AgentBinding = team.store.bindings(None).await.unwrap().remove(0);
    let team = team
        .restart(vec![ScriptedReply::text("a new session")])
        .await;
    team.send("/hub coder which number?").await;
    let events = team.events().await;
    let sent: Vec<Option<String>> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchSent {
                provider_session_id,
                ..
            } => Some(provider_session_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 2, "{:?}", agent_kinds(&events));
    assert_eq!(
        sent[1], None,
        "not the stored {}",
        first.provider_session_id
    );
}

/// An in-process agent's conversation is recorded under the session's root policy. A
/// conversation whose own policy keeps less (here `none` against the root's `full`) is refused
/// the dispatch, with its reason, before the agent hears the input; a conversation kept as
/// fully as the agent dispatches to it.
#[tokio::test]
async fn a_dispatch_is_refused_where_the_agent_would_keep_more_than_its_dispatcher_allows() {
    let team = Team::start(
        vec![model_agent("coder", "x", &[])],
        vec![ScriptedReply::text("done")],
    )
    .await;
    for policy in [
        troupe_proto::StoragePolicy::None,
        troupe_proto::StoragePolicy::HeadersOnly,
        troupe_proto::StoragePolicy::Ttl { secs: 60 },
    ] {
        let private = team
            .session
            .open(troupe_proto::OpenConversation {
                storage_policy: policy,
                ..Default::default()
            })
            .await
            .unwrap();
        let reply = team
            .session
            .message(private, "/hub coder my card is 4111 1111 1111 1111")
            .await
            .unwrap();
        assert_eq!(reply.status, TaskStatus::Error, "{policy:?}: {reply:?}");
        match reply.error {
            Some(AgentError::PolicyRejected {
                reason, message, ..
            }) => {
                assert_eq!(reason, PolicyReason::StoragePolicy, "{policy:?}");
                assert!(message.contains("storage policy (full)"), "{message}");
            }
            other => panic!("{policy:?}: {other:?}"),
        }
    }
    assert!(team.model.sent().is_empty(), "the agent heard nothing");

    let reply = team.send("/hub coder do it").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "done")
    );
}
