//! Routing (A3): the supervisor's model decides with one `route` call (every decision, with
//! its confidence, in `route_decided`), the rules decide without a model, and a model agent
//! with agents in sight delegates through `dispatch_agent` during its turn.

use super::{Extras, Team, agent_kinds, model_agent, settings};
use serde_json::json;
use troupe_actors::agents::RouterMode;
use troupe_proto::agent::{AgentDefinition, PolicyReason, RouteDecision, RouteSource};
use troupe_proto::{AgentError, EventKind, TaskStatus};
use troupe_runtime::ScriptedReply;

fn route(args: serde_json::Value) -> ScriptedReply {
    ScriptedReply::tool("route", args)
}

fn decisions(events: &[EventKind]) -> Vec<(RouteDecision, Option<String>, f64, RouteSource)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::RouteDecided {
                decision,
                agent_id,
                confidence,
                source,
                ..
            } => Some((*decision, agent_id.clone(), *confidence, *source)),
            _ => None,
        })
        .collect()
}

async fn model_team(replies: Vec<ScriptedReply>) -> Team {
    Team::start_with(
        vec![
            model_agent("coder", "You write code.", &[]),
            model_agent("reviewer", "You review.", &[]),
        ],
        replies,
        settings(RouterMode::Model),
        |_| {},
    )
    .await
}

#[tokio::test]
async fn the_supervisors_route_call_dispatches_to_the_agent_it_names() {
    let team = model_team(vec![
        route(json!({"decision": "dispatch_agent", "agent_id": "coder", "input": "write fizzbuzz", "reason": "it is code", "confidence": 0.8})),
        ScriptedReply::text("fn fizzbuzz() {}"),
    ])
    .await;
    let reply = team.send("I need fizzbuzz").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "fn fizzbuzz() {}")
    );
    let sent = team.model.sent();
    assert_eq!(sent.len(), 2);
    // The routing step is offered the route tool alone, and told who is there.
    assert_eq!(sent[0].tools, ["route"]);
    assert!(
        sent[0]
            .instructions
            .contains("- coder (coder-role): does coder work")
            && sent[0]
                .instructions
                .contains("- reviewer (reviewer-role): does reviewer work"),
        "{}",
        sent[0].instructions
    );
    // The agent got the input the supervisor worded, under its own instructions.
    assert_eq!(sent[1].instructions, "You write code.");
    assert!(format!("{:?}", sent[1].prompt).contains("write fizzbuzz"));
    let events = team.events().await;
    assert_eq!(
        decisions(&events),
        [(
            RouteDecision::DispatchAgent,
            Some("coder".into()),
            0.8,
            RouteSource::Model
        )]
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::RouteDecided { reason, .. } if reason == "it is code")));
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
}

#[tokio::test]
async fn every_decision_of_the_supervisor_has_its_outcome() {
    let team = model_team(vec![
        route(json!({"decision": "direct_reply", "reply": "Hello!", "confidence": 1.0})),
        route(json!({"decision": "ask_human", "question": "Which file?", "confidence": 0.4})),
        route(json!({"decision": "reject", "reason": "Not something I do.", "confidence": 0.9})),
        route(json!({"decision": "dispatch_module", "module": "billing", "confidence": 0.7})),
        route(json!({"decision": "dispatch_agent", "agent_id": "ghost", "confidence": 0.7})),
        route(json!({"decision": "maybe", "confidence": 0.7})),
        ScriptedReply::text("I just answer."),
    ])
    .await;
    let hello = team.send("hi").await;
    assert_eq!(
        (hello.status, hello.text.as_str()),
        (TaskStatus::Ok, "Hello!")
    );
    let ask = team.send("fix it").await;
    assert_eq!(
        (ask.status, ask.text.as_str()),
        (TaskStatus::Ok, "Which file?")
    );
    let reject = team.send("book me a flight").await;
    assert_eq!(
        (reject.status, reject.text.as_str()),
        (TaskStatus::Ok, "Not something I do.")
    );
    let module = team.send("pay the bill").await;
    assert!(
        matches!(&module.error, Some(AgentError::PolicyRejected { reason: PolicyReason::UnknownModule, message, .. }) if message.contains("billing")),
        "{:?}",
        module.error
    );
    let ghost = team.send("ask the ghost").await;
    assert!(
        matches!(
            &ghost.error,
            Some(AgentError::PolicyRejected {
                reason: PolicyReason::UnknownAgent,
                ..
            })
        ),
        "{:?}",
        ghost.error
    );
    let malformed = team.send("whatever").await;
    assert_eq!(malformed.status, TaskStatus::Error);
    assert!(
        malformed
            .error
            .as_ref()
            .unwrap()
            .to_string()
            .contains("`maybe`"),
        "{:?}",
        malformed.error
    );
    // An answer without a route call is a direct reply of its text.
    let plain = team.send("just talk").await;
    assert_eq!(plain.text, "I just answer.");

    let events = team.events().await;
    let got: Vec<(RouteDecision, f64)> = decisions(&events)
        .into_iter()
        .map(|(d, _, c, s)| {
            assert_eq!(s, RouteSource::Model);
            (d, c)
        })
        .collect();
    assert_eq!(
        got,
        [
            (RouteDecision::DirectReply, 1.0),
            (RouteDecision::AskHuman, 0.4),
            (RouteDecision::Reject, 0.9),
            (RouteDecision::DispatchModule, 0.7),
            (RouteDecision::DispatchAgent, 0.7),
            (RouteDecision::DirectReply, 1.0),
        ]
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::AskHuman { question } if question == "Which file?")));
    let rejected: Vec<PolicyReason> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::PolicyRejected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejected,
        [PolicyReason::UnknownModule, PolicyReason::UnknownAgent]
    );
    // The exchanges the supervisor answered are in the conversation's history: the next
    // routing step sees them.
    let last = team.model.sent().pop().unwrap();
    let prompt = format!("{:?}", last.prompt);
    assert!(
        prompt.contains("Hello!") && prompt.contains("Which file?"),
        "{prompt}"
    );
}

#[tokio::test]
async fn a_direct_reply_without_text_is_the_turn_which_may_delegate() {
    let team = model_team(vec![
        route(json!({"decision": "direct_reply", "confidence": 0.6})),
        ScriptedReply::tool(
            "dispatch_agent",
            json!({"agent_id": "reviewer", "input": "review this diff"}),
        ),
        ScriptedReply::text("looks good"),
        ScriptedReply::text("The reviewer says it looks good."),
    ])
    .await;
    let reply = team.send("is my diff fine?").await;
    assert_eq!(reply.text, "The reviewer says it looks good.");
    let sent = team.model.sent();
    assert_eq!(sent.len(), 4);
    // The turn after routing has its tools, delegation among them.
    assert!(
        sent[1].tools.iter().any(|t| t == "dispatch_agent"),
        "{:?}",
        sent[1].tools
    );
    assert!(!sent[1].tools.iter().any(|t| t == "route"));
    assert_eq!(sent[2].instructions, "You review.");
    // The agent's answer is the tool call's observation.
    assert!(format!("{:?}", sent[3].prompt).contains("looks good"));
    // An agent without workers has nobody to delegate to: no dispatch_agent tool.
    assert!(!sent[2].tools.iter().any(|t| t == "dispatch_agent"));
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
}

#[tokio::test]
async fn without_a_model_the_rules_route_mentions_and_answer_the_rest() {
    let team = Team::start(
        vec![model_agent("coder", "You write code.", &[])],
        vec![
            ScriptedReply::text("done by coder"),
            ScriptedReply::text("answered here"),
        ],
    )
    .await;
    let mention = team.send("@coder rename the function").await;
    assert_eq!(mention.text, "done by coder");
    let plain = team.send("what time is it?").await;
    assert_eq!(plain.text, "answered here");
    let sent = team.model.sent();
    assert!(format!("{:?}", sent[0].prompt).contains("rename the function"));
    assert!(!format!("{:?}", sent[0].prompt).contains("@coder"));
    let events = team.events().await;
    let got: Vec<(RouteDecision, Option<String>, RouteSource)> = decisions(&events)
        .into_iter()
        .map(|(d, a, _, s)| (d, a, s))
        .collect();
    assert_eq!(
        got,
        [
            (
                RouteDecision::DispatchAgent,
                Some("coder".into()),
                RouteSource::Rules
            ),
            (RouteDecision::DirectReply, None, RouteSource::Rules)
        ]
    );
}

#[tokio::test]
async fn a_defined_supervisor_routes_with_its_instructions_among_its_workers() {
    let mut boss = model_agent("boss", "Route carefully.", &["coder"]);
    boss.role = "supervisor".into();
    let team = Team::start_with(
        vec![
            boss,
            model_agent("coder", "You write code.", &[]),
            model_agent("reviewer", "You review.", &[]),
        ],
        vec![
            route(json!({"decision": "dispatch_agent", "agent_id": "reviewer", "confidence": 0.9})),
            route(json!({"decision": "dispatch_agent", "agent_id": "coder", "confidence": 0.9})),
            ScriptedReply::text("coded"),
        ],
        settings(RouterMode::Model),
        |_| {},
    )
    .await;
    // Only its workers are in sight: a route to another agent is refused.
    let refused = team.send("review this").await;
    assert!(
        matches!(
            &refused.error,
            Some(AgentError::PolicyRejected {
                reason: PolicyReason::NotVisible,
                chain,
                ..
            }) if chain == &["boss", "reviewer"]
        ),
        "{:?}",
        refused.error
    );
    let coded = team.send("write it").await;
    assert_eq!(coded.text, "coded");
    let sent = team.model.sent();
    assert!(
        sent[0].instructions.starts_with("Route carefully.")
            && sent[0].instructions.contains("- coder (coder-role)")
            && !sent[0].instructions.contains("- reviewer"),
        "{}",
        sent[0].instructions
    );
}

/// `/hub` may name the defined supervisor itself: it runs as an agent, dispatching from its
/// own chain (it was refused as a cycle, the message's chain starting from it).
#[tokio::test]
async fn a_human_may_name_the_defined_supervisor_with_hub() {
    let mut boss = model_agent("boss", "Route carefully.", &["coder"]);
    boss.role = "supervisor".into();
    let team = Team::start_with(
        vec![boss, model_agent("coder", "You write code.", &[])],
        vec![ScriptedReply::text("boss here")],
        settings(RouterMode::Model),
        |_| {},
    )
    .await;
    let reply = team.send("/hub boss hello").await;
    assert_eq!(reply.status, TaskStatus::Ok, "{:?}", reply.error);
    assert_eq!(reply.text, "boss here");
    let sent = team.model.sent();
    assert!(
        sent[0].instructions.starts_with("Route carefully."),
        "{}",
        sent[0].instructions
    );
}

/// A configured supervisor that did not load (its file, or one of its workers', is broken)
/// does not widen routing into the built-in supervisor, which sees every agent: a mention of
/// an agent it was never meant to see is not dispatched.
#[tokio::test]
async fn a_supervisor_that_did_not_load_routes_to_no_agent() {
    let mut routing = settings(RouterMode::Rules);
    routing.supervisor = Some("boss".into());
    let team = Team::start_with(
        vec![model_agent("deployer", "You deploy.", &[])],
        vec![ScriptedReply::text("deployed")],
        routing,
        |_| {},
    )
    .await;
    // The session's own turn answers (the script's reply), no agent is dispatched to.
    team.send("@deployer ship it").await;
    let events = team.events().await;
    assert_no_dispatch(&events);
}

/// The same for a supervisor chosen by its role (no `[agents] supervisor`): a file whose role
/// is `supervisor` that the loader dropped (a worker it names is not defined) leaves no
/// built-in supervisor seeing every agent in its place.
#[tokio::test]
async fn a_supervisor_by_role_that_did_not_load_routes_to_no_agent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("boss.json"),
        r#"{"id":"boss","role":"supervisor","provider":{"type":"model"},"workers":["ghost"]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("deployer.json"),
        r#"{"id":"deployer","role":"executor","provider":{"type":"model","instructions":"You deploy."}}"#,
    )
    .unwrap();
    let catalog = troupe_runtime::agents::load(&troupe_runtime::agents::AgentsDir {
        path: dir.path().to_owned(),
        named: true,
    });
    assert_eq!(catalog.agents.keys().collect::<Vec<_>>(), ["deployer"]);
    let team = Team::start_with_factories_extra(
        catalog.agents.values().cloned().collect(),
        Vec::new(),
        Extras {
            unloaded_supervisors: catalog.unloaded_supervisors.clone(),
            ..Extras::default()
        },
    )
    .await;
    team.send("@deployer ship it").await;
    let events = team.events().await;
    assert_no_dispatch(&events);
    // The route was decided (a direct reply), so the message did reach routing.
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::RouteDecided { .. })),
        "{:?}",
        agent_kinds(&events)
    );
}

/// A supervisor by role that loaded but is not a model agent keeps its own view (its
/// workers): the session's model routes, among them only.
#[tokio::test]
async fn a_supervisor_of_another_kind_keeps_its_view() {
    let boss = AgentDefinition {
        role: "supervisor".into(),
        workers: vec!["coder".into()],
        ..super::acp_agent("boss")
    };
    let team = Team::start(
        vec![
            boss,
            model_agent("coder", "You write code.", &[]),
            model_agent("deployer", "You deploy.", &[]),
        ],
        vec![ScriptedReply::text("coded"), ScriptedReply::text("direct")],
    )
    .await;
    let reply = team.send("@coder write it").await;
    assert_eq!(reply.text, "coded", "{reply:?}");
    team.send("@deployer ship it").await;
    let sent = team
        .events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            EventKind::DispatchSent { agent_id, .. } => Some(agent_id),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(sent, ["coder"]);
}

/// A message whose routing call failed was not answered: it leaves nothing in the history
/// (the next routing prompt does not carry it).
#[tokio::test]
async fn a_message_whose_routing_call_failed_leaves_no_history() {
    let team = model_team(vec![
        ScriptedReply::error("the model is down"),
        ScriptedReply::text("hello again"),
    ])
    .await;
    let failed = team.send("forget me").await;
    assert_eq!(failed.status, TaskStatus::Error, "{failed:?}");
    assert_eq!(failed.stats.steps, 0);
    let reply = team.send("hi").await;
    assert_eq!(reply.text, "hello again", "{reply:?}");
    let sent = team.model.sent();
    let prompt = format!("{:?}", sent.last().unwrap().prompt);
    assert!(prompt.contains("hi"), "{prompt}");
    assert!(!prompt.contains("forget me"), "{prompt}");
}

/// No agent was dispatched to.
fn assert_no_dispatch(events: &[EventKind]) {
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::DispatchSent { .. })),
        "{:?}",
        agent_kinds(events)
    );
}
