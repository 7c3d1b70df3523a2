//! Output guardrail (A8): an agent's answer is extracted, repaired, validated against its
//! file's `output.schema` and masked to the declared fields before anyone sees it; an invalid
//! one is asked for again with the errors, at most twice; then `guardrail_failed` (exhausted)
//! and a refusal or a question to a human. Nothing unvalidated reaches an event, a stream or
//! a stored record.

use crate::suite::agents::{Team, model_agent};
use serde_json::json;
use troupe_proto::agent::{AgentDefinition, GuardrailAction, OutputSpec};
use troupe_proto::{AgentError, EventKind, GuardrailStatus, TaskStatus, WarningCode};
use troupe_runtime::ScriptedReply;

/// The value of a field the schema does not declare: it must never be seen.
const SECRET: &str = "123-45-6789";

fn shaped(action: GuardrailAction) -> AgentDefinition {
    let mut def = model_agent("profiler", "You answer with JSON.", &[]);
    def.output = Some(OutputSpec {
        schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "lang": {"type": "string", "default": "en"}
            },
            "required": ["name", "age"]
        }),
        on_failure: action,
        max_retries: 2,
    });
    def
}

/// A streamed answer (in small chunks, as a real model's).
fn streamed(text: String) -> ScriptedReply {
    ScriptedReply {
        chunk_chars: 4,
        ..ScriptedReply::text(text)
    }
}

fn invalid() -> ScriptedReply {
    streamed(format!(
        r#"Here it is: {{"name": "Ada", "age": "old", "ssn": "{SECRET}"}}"#
    ))
}

fn files_contain(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if troupe_tests::contains(&std::fs::read(&path).unwrap(), needle) {
                hits.push(path);
            }
        }
    }
    hits
}

#[tokio::test]
async fn invalid_twice_then_valid_succeeds_with_the_masked_repaired_answer_only() {
    let team = Team::start(
        vec![shaped(GuardrailAction::Reject)],
        vec![
            streamed(format!("I think her name is Ada. SSN {SECRET}.")),
            invalid(),
            streamed(format!(
                r#"```json
{{"name": "Ada", "age": "36", "ssn": "{SECRET}"}}
```"#
            )),
        ],
    )
    .await;
    let reply = team.send("/hub profiler who is she?").await;
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    let answer: serde_json::Value = serde_json::from_str(&reply.text).unwrap();
    assert_eq!(answer, json!({"name": "Ada", "age": 36, "lang": "en"}));

    // The model was asked again twice, with what was wrong.
    let sent = team.model.sent();
    assert_eq!(sent.len(), 3);
    for retry in &sent[1..] {
        let prompt = format!("{:?}", retry.prompt);
        assert!(
            prompt.contains("does not match the required JSON Schema"),
            "{prompt}"
        );
    }
    let events = team.events().await;
    let retries: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::Warning {
                code: WarningCode::GuardrailRetry,
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries[0].contains("/: json"), "{}", retries[0]);
    assert!(retries[1].contains("/age: type"), "{}", retries[1]);
    // Nothing unvalidated went out: no chunk of the agent's text, and the masked field in no
    // event and in no stored record.
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::AssistantChunk { .. })),
        "raw chunks were streamed"
    );
    assert!(!format!("{events:?}").contains(SECRET));
    assert!(!format!("{events:?}").contains("ssn"));
    team.session.flush().await.unwrap();
    assert_eq!(
        files_contain(team.dir.path(), SECRET),
        Vec::<std::path::PathBuf>::new()
    );
}

#[tokio::test]
async fn three_invalid_answers_end_in_guardrail_failed_exhausted() {
    let team = Team::start(
        vec![shaped(GuardrailAction::Reject)],
        vec![
            invalid(),
            invalid(),
            invalid(),
            ScriptedReply::text("never asked"),
        ],
    )
    .await;
    let reply = team.send("/hub profiler who is she?").await;
    assert_eq!(reply.status, TaskStatus::Error);
    assert!(
        matches!(
            &reply.error,
            Some(AgentError::GuardrailFailed { attempts: 3, problems }) if problems == &["/age: type"]
        ),
        "{reply:?}"
    );
    assert_eq!(team.model.sent().len(), 3, "asked again at most twice");
    let events = team.events().await;
    let failed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::GuardrailFailed {
                agent_id,
                attempts,
                status,
                action,
                ..
            } => Some((agent_id.clone(), *attempts, *status, *action)),
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [(
            Some("profiler".to_owned()),
            3,
            GuardrailStatus::Exhausted,
            GuardrailAction::Reject
        )]
    );
    assert!(!format!("{events:?}").contains(SECRET));
    assert!(!format!("{reply:?}").contains(SECRET));
}

#[tokio::test]
async fn when_configured_the_exhausted_guardrail_asks_a_human_instead() {
    let team = Team::start(
        vec![shaped(GuardrailAction::AskHuman)],
        vec![invalid(), invalid(), invalid()],
    )
    .await;
    let reply = team.send("/hub profiler who is she?").await;
    assert_eq!(reply.status, TaskStatus::Ok);
    assert!(
        reply
            .text
            .contains("could not give an answer that matches its output schema in 3 attempts"),
        "{}",
        reply.text
    );
    let events = team.events().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::AskHuman { question } if question == &reply.text))
    );
    assert!(events.iter().any(|e| matches!(
        e,
        EventKind::GuardrailFailed {
            action: GuardrailAction::AskHuman,
            status: GuardrailStatus::Exhausted,
            ..
        }
    )));
    assert!(!format!("{events:?}").contains(SECRET));
}

/// A guarded task that runs out of steps (an invalid answer still to be asked for again)
/// does not answer its dispatcher with an empty "successful" text: it ends through the
/// guardrail, `guardrail_failed` with `status = max_steps`, and fails as `onFailure` says.
#[tokio::test]
async fn running_out_of_steps_before_a_valid_answer_is_a_guardrail_failure() {
    let team = Team::start_with(
        vec![shaped(GuardrailAction::Reject)],
        vec![invalid(), invalid(), ScriptedReply::text("never asked")],
        crate::suite::agents::settings(troupe_actors::agents::RouterMode::Rules),
        |c| c.conversation.task.max_steps = 2,
    )
    .await;
    let reply = team.send("/hub profiler who is she?").await;
    assert_eq!(reply.status, TaskStatus::Error, "{reply:?}");
    assert!(
        matches!(
            &reply.error,
            Some(AgentError::GuardrailFailed { attempts: 2, problems })
                if problems == &["/age: type", "/: max_steps"]
        ),
        "{reply:?}"
    );
    assert_eq!(team.model.sent().len(), 2);
    let events = team.events().await;
    assert!(
        events.iter().any(|e| matches!(
            e,
            EventKind::GuardrailFailed {
                status: GuardrailStatus::MaxSteps,
                action: GuardrailAction::Reject,
                attempts: 2,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(!format!("{events:?}").contains(SECRET));
}
