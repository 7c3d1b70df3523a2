//! Tool policy in layers (A5): a tool the task's policy denies is not offered to the model,
//! and a call to it anyway (made up, from a sub-agent, an MCP tool it never saw) is refused
//! with `policy_rejected` before anything runs; a sub-agent gets no more than its dispatcher.

use super::tool_refusals;
use crate::suite::agents::{Team, model_agent, settings};
use serde_json::json;
use std::sync::Arc;
use troupe_actors::agents::RouterMode;
use troupe_proto::agent::{AgentDefinition, PolicyReason, ToolRules};
use troupe_proto::governance::{MessageOptions, ToolPolicyConfig};
use troupe_proto::{EventKind, TaskStatus};
use troupe_runtime::ScriptedReply;

fn rules(whitelist: &[&str], blacklist: &[&str]) -> ToolRules {
    ToolRules {
        whitelist: whitelist.iter().map(|s| (*s).to_owned()).collect(),
        blacklist: blacklist.iter().map(|s| (*s).to_owned()).collect(),
        authorization_required: Vec::new(),
    }
}

fn with_tools(mut def: AgentDefinition, tools: ToolRules) -> AgentDefinition {
    def.tools = tools;
    def
}

fn shell_call() -> ScriptedReply {
    ScriptedReply::tool("shell", json!({"command": ["ls"]}))
}

/// Every session offers the shell and the plan built-ins.
fn tools_on(config: &mut troupe_actors::SessionConfig) {
    config.conversation.shell_tool = true;
    config.root.include_plan_tool = true;
}

/// (name, agent, is_error, output) of every finished tool call.
fn finished(events: &[EventKind]) -> Vec<(String, Option<String>, bool, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::ToolCallFinished {
                name,
                agent_id,
                is_error,
                output,
                ..
            } => Some((name.clone(), agent_id.clone(), *is_error, output.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_denied_tool_is_not_offered_and_a_call_to_it_is_refused_before_it_runs() {
    let team = Team::start_with(
        vec![with_tools(
            model_agent("coder", "You write code.", &[]),
            rules(&[], &["shell"]),
        )],
        // The model calls the shell it was not offered anyway.
        vec![shell_call(), ScriptedReply::text("I may not run commands.")],
        settings(RouterMode::Rules),
        tools_on,
    )
    .await;
    let reply = team.send("/hub coder list the files").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "I may not run commands.")
    );
    let sent = team.model.sent();
    assert!(
        !sent[0].tools.iter().any(|t| t == "shell"),
        "{:?}",
        sent[0].tools
    );
    let events = team.events().await;
    let refusals = tool_refusals(&events);
    assert_eq!(
        refusals,
        [(
            "coder".to_owned(),
            "shell".to_owned(),
            PolicyReason::ToolDenied,
            "tool `shell` is denied by agent `coder`'s blacklist (`shell`)".to_owned()
        )]
    );
    let done = finished(&events);
    assert_eq!(done.len(), 1);
    let (name, agent, is_error, output) = &done[0];
    assert_eq!(
        (name.as_str(), agent.as_deref(), *is_error),
        ("shell", Some("coder"), true)
    );
    assert!(output.contains("policy rejected (tool_denied)"), "{output}");
    assert!(output.contains("agent `coder`'s blacklist"), "{output}");
    // The model read the refusal as the call's observation.
    assert!(format!("{:?}", sent[1].prompt).contains("policy rejected (tool_denied)"));
    // The call was announced with its agent too.
    assert!(events.iter().any(|e| matches!(
        e,
        EventKind::ToolCallStarted { call, agent_id: Some(a) } if call.name == "shell" && a == "coder"
    )));
}

/// The supervisor's dispatch (here its rules, `@coder`) is the `dispatch_agent` tool: a
/// layer that denies the tool refuses the route before any agent runs. A human's `/hub` is
/// the user's own choice and still goes.
#[tokio::test]
async fn a_denied_dispatch_tool_refuses_the_supervisors_route_but_not_a_hub_command() {
    let team = Team::start_with(
        vec![model_agent("coder", "You write code.", &[])],
        vec![ScriptedReply::text("coded")],
        settings(RouterMode::Rules),
        |config| {
            config.conversation.tool_policy = Arc::new(ToolPolicyConfig {
                blacklist: vec!["dispatch_agent".into()],
                ..ToolPolicyConfig::default()
            });
        },
    )
    .await;
    let refused = team.send("@coder write a parser").await;
    assert_eq!(refused.status, TaskStatus::Error, "{refused:?}");
    let events = team.events().await;
    let refusals = tool_refusals(&events);
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].1, "dispatch_agent");
    assert_eq!(refusals[0].2, PolicyReason::ToolDenied);
    assert!(
        team.model.sent().is_empty(),
        "no agent ran: {:?}",
        team.model.sent()
    );
    assert_eq!(team.send("/hub coder write a parser").await.text, "coded");

    // The same `/hub` in a text a program sent (an A2A peer, a module) is no person's choice:
    // it is governed as the supervisor's dispatch, and refused.
    let root = team.session.root().await.unwrap();
    let from_peer = troupe_actors::governance::RequestGovernance {
        peer: true,
        ..Default::default()
    };
    let refused = team
        .session
        .message_governed(root, "/hub coder write a parser", from_peer)
        .await
        .unwrap();
    assert_eq!(refused.status, TaskStatus::Error, "{refused:?}");
    let refusals = tool_refusals(&team.events().await);
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert_eq!(refusals[1].1, "dispatch_agent");
    assert_eq!(
        team.model.sent().len(),
        1,
        "only the person's /hub ran the agent"
    );
}

#[tokio::test]
async fn a_sub_agent_gets_the_intersection_of_its_rights_and_its_dispatchers() {
    let team = Team::start_with(
        vec![
            with_tools(
                model_agent("lead", "You lead.", &["worker"]),
                rules(&[], &["shell"]),
            ),
            model_agent("worker", "You work.", &[]),
        ],
        vec![
            // lead delegates; worker tries the shell its dispatcher may not use.
            ScriptedReply::tool(
                "dispatch_agent",
                json!({"agent_id": "worker", "input": "run ls"}),
            ),
            shell_call(),
            ScriptedReply::text("the shell was refused"),
            ScriptedReply::text("done"),
            // The worker on its own (straight from the user) has its shell.
            ScriptedReply::text("alone"),
        ],
        settings(RouterMode::Rules),
        tools_on,
    )
    .await;
    assert_eq!(team.send("/hub lead list the files").await.text, "done");
    let events = team.events().await;
    let refusals = tool_refusals(&events);
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(
        (
            refusals[0].0.as_str(),
            refusals[0].1.as_str(),
            refusals[0].2
        ),
        ("worker", "shell", PolicyReason::ToolDenied)
    );
    assert!(
        refusals[0].3.contains("agent `lead`'s blacklist"),
        "the refusal names the inherited layer: {}",
        refusals[0].3
    );
    let sent = team.model.sent();
    assert_eq!(sent[1].instructions, "You work.");
    assert!(
        !sent[1].tools.iter().any(|t| t == "shell"),
        "{:?}",
        sent[1].tools
    );
    // The restriction came from the dispatcher: the worker alone is offered the shell.
    assert_eq!(team.send("/hub worker hello").await.text, "alone");
    let sent = team.model.sent();
    assert!(sent.last().unwrap().tools.iter().any(|t| t == "shell"));
}

#[tokio::test]
async fn global_role_and_request_layers_only_narrow_and_patterns_cover_tools_not_yet_seen() {
    let team = Team::start_with(
        vec![model_agent("coder", "You write code.", &[])],
        vec![
            // The root conversation's turn (the rules router answers plain text itself):
            // an MCP tool it never saw, which the global blacklist covers by pattern;
            ScriptedReply::tool("files__delete_file", json!({"path": "a"})),
            // a tool the request's whitelist leaves out, though every other layer allows it;
            shell_call(),
            ScriptedReply::text("nothing ran"),
            // the coder, whose role may only plan.
            shell_call(),
            ScriptedReply::text("coder refused"),
        ],
        settings(RouterMode::Rules),
        |config| {
            tools_on(config);
            config.conversation.tool_policy = Arc::new(ToolPolicyConfig {
                blacklist: vec!["files__delete_*".into()],
                roles: [("coder-role".to_owned(), rules(&["update_plan"], &[]))].into(),
                ..ToolPolicyConfig::default()
            });
        },
    )
    .await;
    let root = team.session.root().await.unwrap();
    let options = MessageOptions {
        // It asks for the shell, which the global layer does not forbid, but not for more.
        tools: Some(rules(&["update_plan", "files__*"], &[])),
        authorization: Vec::new(),
    };
    let reply = team
        .session
        .message_with(root, "tidy up", options)
        .await
        .unwrap();
    assert_eq!(reply.text, "nothing ran");
    let sent = team.model.sent();
    assert_eq!(
        sent[0].tools,
        ["update_plan"],
        "only what every layer allows is offered"
    );
    assert_eq!(team.send("/hub coder run ls").await.text, "coder refused");
    let sent = team.model.sent();
    assert!(
        !sent[3].tools.iter().any(|t| t == "shell"),
        "{:?}",
        sent[3].tools
    );

    let events = team.events().await;
    let got: Vec<(String, String, String)> = tool_refusals(&events)
        .into_iter()
        .map(|(agent, tool, _, message)| (agent, tool, message))
        .collect();
    assert_eq!(
        got,
        [
            (
                String::new(),
                "files__delete_file".to_owned(),
                "tool `files__delete_file` is denied by the global blacklist (`files__delete_*`)"
                    .to_owned()
            ),
            (
                String::new(),
                "shell".to_owned(),
                "tool `shell` is not in the request whitelist".to_owned()
            ),
            (
                "coder".to_owned(),
                "shell".to_owned(),
                "tool `shell` is not in role `coder-role`'s whitelist".to_owned()
            ),
        ]
    );
    // Not an unknown tool: the policy refused it, and nothing ran.
    assert!(
        finished(&events)
            .iter()
            .all(|(_, _, is_error, output)| *is_error && output.contains("policy rejected"))
    );
}
