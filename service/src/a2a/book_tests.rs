use super::*;
use crate::a2a::events::frame;
use crate::a2a::model::{PartContent, Role};
use crate::a2a::request::ListParams;
use crate::a2a::version::Version;
use proptest::prelude::*;
use troupe_proto::{ApprovalSubject, Json, SessionId, TaskStats, ToolCall};

const CONV: &str = "01930000-0000-7000-8000-000000000001";
const TROUPE_TASK: &str = "01930000-0000-7000-8000-0000000000aa";
const T0: u64 = 1_795_317_103_000;

fn conv() -> ConversationId {
    CONV.parse().unwrap()
}

fn troupe_task() -> TaskId {
    TROUPE_TASK.parse().unwrap()
}

fn user(text: &str) -> Message {
    Message {
        message_id: format!("msg-{text}"),
        context_id: None,
        task_id: None,
        role: Role::User,
        parts: vec![Part::text(text)],
        metadata: None,
        reference_task_ids: vec![],
        extensions: vec![],
    }
}

fn send_params(m: Message) -> SendParams {
    SendParams {
        message: m,
        accepted_output_modes: vec![],
        history_length: None,
        return_immediately: false,
        push_config: None,
        metadata: None,
    }
}

fn env(task: Option<TaskId>, event: EventKind) -> EventEnvelope {
    EventEnvelope {
        seq: 1,
        ts_ms: T0,
        session_id: SessionId::from_uuid(*conv().as_uuid()),
        conversation_id: Some(conv()),
        task_id: task,
        sub_id: None,
        trace_id: None,
        span_id: None,
        event,
    }
}

fn finished(status: TaskStatus, text: &str) -> EventKind {
    EventKind::TaskFinished {
        status,
        text: text.into(),
        stats: TaskStats::default(),
        error: None,
    }
}

/// A book with one context and one dispatched task `task-1`.
fn started_book() -> TaskBook {
    let mut b = TaskBook::new(100);
    b.add_context("ctx-1".into(), conv());
    b.create_task("task-1".into(), "ctx-1", user("hi"), "hi".into(), T0)
        .unwrap();
    assert!(b.next_dispatch("ctx-1").is_some());
    b
}

/// The events of a task that streams, calls a tool and completes.
fn streamed_task_events() -> Vec<StreamEvent> {
    let mut b = TaskBook::new(100);
    b.add_context("ctx-1".into(), conv());
    let task = b
        .create_task("task-1".into(), "ctx-1", user("hi"), "hi".into(), T0)
        .unwrap();
    let mut events = vec![StreamEvent::Task(task)];
    b.next_dispatch("ctx-1").unwrap();
    let t = Some(troupe_task());
    let chunk = |delta: &str| EventKind::AssistantChunk {
        delta: delta.into(),
    };
    let steps = [
        EventKind::TaskStarted { input: "hi".into() },
        EventKind::StepStarted { turn: 1, step: 1 },
        chunk("Let me look."),
        EventKind::ToolCallStarted {
            call: ToolCall {
                call_id: "call_0_0".into(),
                name: "shell".into(),
                arguments: Json(serde_json::json!({"command": ["ls"]})),
            },
        },
        chunk("Stream hello"),
        chunk(" from troupe"),
        finished(TaskStatus::Ok, "Stream hello from troupe"),
    ];
    for (i, kind) in steps.into_iter().enumerate() {
        let applied = b.apply(&env(t, kind), T0 + 10 * (i as u64 + 1));
        events.extend(applied.events.into_iter().map(|(_, e)| e));
    }
    events
}

fn frames(version: Version) -> Vec<serde_json::Value> {
    streamed_task_events()
        .iter()
        .map(|e| frame(version, &serde_json::json!(1), e).0)
        .collect()
}

#[test]
fn streamed_task_snapshot_v1() {
    // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
    // `preserve_order` feature, which the ACP crate turns on for builds that include it).
    let mut sorted = insta::Settings::clone_current();
    sorted.set_sort_maps(true);
    let _sorted = sorted.bind_to_scope();
    insta::assert_json_snapshot!("stream_v1", frames(Version::V1_0));
}

#[test]
fn streamed_task_snapshot_v03() {
    // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
    // `preserve_order` feature, which the ACP crate turns on for builds that include it).
    let mut sorted = insta::Settings::clone_current();
    sorted.set_sort_maps(true);
    let _sorted = sorted.bind_to_scope();
    insta::assert_json_snapshot!("stream_v03", frames(Version::V0_3));
}

#[test]
fn only_the_last_frame_closes_the_stream() {
    for v in [Version::V1_0, Version::V0_3] {
        let closes: Vec<bool> = streamed_task_events()
            .iter()
            .map(|e| frame(v, &serde_json::json!(1), e).1)
            .collect();
        let mut want = vec![false; closes.len() - 1];
        want.push(true);
        assert_eq!(closes, want, "{v:?}");
    }
}

#[test]
fn a_context_runs_its_tasks_one_at_a_time() {
    let mut b = TaskBook::new(100);
    b.add_context("c".into(), conv());
    b.create_task("a".into(), "c", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("b".into(), "c", user("2"), "2".into(), T0)
        .unwrap();
    let first = b.next_dispatch("c").unwrap();
    assert_eq!(first.task_id, "a");
    assert_eq!(first.conversation_id, conv());
    assert_eq!(b.next_dispatch("c"), None, "a is still running");
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "one".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
    });
    assert_eq!(b.finished("a", reply, T0 + 1), Finished::Deferred);
    let events = b.finish_due("a", T0 + 2);
    assert_eq!(events.len(), 2, "artifact, then COMPLETED");
    assert!(b.finish_due("a", T0 + 3).is_empty());
    assert_eq!(b.next_dispatch("c").unwrap().task_id, "b");
    let a = b.view("a", None, true).unwrap();
    assert_eq!(a.status.state, TaskState::Completed);
    assert_eq!(a.metadata.unwrap()["troupe"]["taskId"], TROUPE_TASK);
}

#[test]
fn the_end_is_reported_once() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    let first = b.apply(&env(t, finished(TaskStatus::Ok, "x")), T0 + 1);
    assert_eq!(first.events.len(), 2);
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "x".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
    });
    assert_eq!(b.finished("task-1", reply, T0 + 2), Finished::Done(vec![]));
    assert!(b.record("task-1").unwrap().task.status.state.is_terminal());
}

#[test]
fn states_follow_troupe_outcomes() {
    for (status, want) in [
        (TaskStatus::Ok, TaskState::Completed),
        (TaskStatus::Error, TaskState::Failed),
        (TaskStatus::MaxSteps, TaskState::Failed),
        (TaskStatus::Cancelled, TaskState::Canceled),
    ] {
        let mut b = started_book();
        let t = Some(troupe_task());
        b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
        b.apply(&env(t, finished(status, "partial")), T0 + 1);
        let task = b.view("task-1", None, true).unwrap();
        assert_eq!(task.status.state, want, "{status:?}");
        assert_eq!(
            task.artifacts.is_empty(),
            status == TaskStatus::Cancelled,
            "{status:?}"
        );
    }
    let mut b = started_book();
    b.finished("task-1", Err(AgentError::internal("boom")), T0);
    let task = b.view("task-1", None, true).unwrap();
    assert_eq!(task.status.state, TaskState::Failed);
    let note = &task.status.message.unwrap().parts[0].content;
    assert_eq!(note, &PartContent::Text("internal error: boom".into()));
}

#[test]
fn cancel_depends_on_where_the_task_is() {
    let mut b = TaskBook::new(100);
    b.add_context("c".into(), conv());
    b.create_task("a".into(), "c", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("queued".into(), "c", user("2"), "2".into(), T0)
        .unwrap();
    b.next_dispatch("c").unwrap();
    // Waiting behind "a": canceled on the spot.
    let CancelPlan::Canceled(events) = b.cancel("queued", T0).unwrap() else {
        panic!("a queued task cancels at once")
    };
    assert_eq!(events.last().unwrap().state(), Some(TaskState::Canceled));
    // Dispatched, not started in troupe yet: deferred, then forwarded when it starts.
    assert_eq!(b.cancel("a", T0).unwrap(), CancelPlan::Deferred);
    let applied = b.apply(
        &env(
            Some(troupe_task()),
            EventKind::TaskStarted { input: "1".into() },
        ),
        T0,
    );
    assert_eq!(applied.cancel, Some(troupe_task()));
    assert_eq!(
        b.cancel("a", T0).unwrap(),
        CancelPlan::Forward(troupe_task())
    );
    b.apply(
        &env(Some(troupe_task()), finished(TaskStatus::Cancelled, "")),
        T0,
    );
    assert_eq!(b.cancel("a", T0).unwrap_err().code(), -32002);
    assert_eq!(b.cancel("nope", T0).unwrap_err().code(), -32001);
    assert_eq!(b.next_dispatch("c"), None, "the canceled task never runs");
}

#[test]
fn a_send_to_an_existing_task_is_checked() {
    let mut b = started_book();
    let mut m = user("more");
    m.task_id = Some("nope".into());
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap_err().code(),
        -32001
    );
    m.task_id = Some("task-1".into());
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap_err().code(),
        -32004,
        "working: takes no message"
    );
    m.context_id = Some("other".into());
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap_err().code(),
        -32602
    );
    m.context_id = None;
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    let approval_id = ApprovalId::new();
    let a = b.apply(
        &env(
            t,
            EventKind::ApprovalRequested {
                approval_id,
                command: vec!["rm".into(), "-rf".into(), "x".into()],
                reason: "writes".into(),
                subject: ApprovalSubject::Command,
            },
        ),
        T0,
    );
    assert_eq!(a.events[0].1.state(), Some(TaskState::InputRequired));
    assert!(b.settled("task-1"));
    m.parts = vec![Part::text("Approve.")];
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap(),
        SendPlan::Answer {
            task_id: "task-1".into(),
            approval_id,
            decision: ApprovalDecision::ApproveOnce
        }
    );
    m.parts = vec![Part::text("no, too risky")];
    let SendPlan::Answer { decision, .. } = b.plan_send(&send_params(m.clone())).unwrap() else {
        panic!("an answer")
    };
    assert_eq!(
        decision,
        ApprovalDecision::Deny {
            reason: Some("no, too risky".into())
        }
    );
    let before = b.record("task-1").unwrap().task.history.len();
    assert_eq!(
        b.answered("task-1", m.clone(), T0)[0].state(),
        Some(TaskState::Working)
    );
    assert!(!b.settled("task-1"));
    // The question and the client's answer are both in the history, in that order.
    let history = &b.record("task-1").unwrap().task.history;
    assert_eq!(history.len(), before + 2, "{history:?}");
    assert_eq!(history[before].role, Role::Agent);
    assert_eq!(history[before + 1].role, Role::User);
    assert_eq!(history[before + 1].parts, m.parts);
    assert_eq!(history[before + 1].task_id.as_deref(), Some("task-1"));
    b.apply(&env(t, finished(TaskStatus::Ok, "done")), T0);
    assert_eq!(b.plan_send(&send_params(m)).unwrap_err().code(), -32004);
}

#[test]
fn streamed_text_grows_the_answer_and_the_end_sends_it_whole() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    let mut updates = Vec::new();
    let chunk = |b: &mut TaskBook, delta: &str| -> Vec<ArtifactUpdate> {
        let kind = EventKind::AssistantChunk {
            delta: delta.into(),
        };
        b.apply(&env(t, kind), T0)
            .events
            .into_iter()
            .map(|(_, e)| match e {
                StreamEvent::Artifact(u) => u,
                e => panic!("an artifact update: {e:?}"),
            })
            .collect()
    };
    updates.extend(chunk(&mut b, "Checking"));
    let answer = |b: &TaskBook| {
        let task = &b.record("task-1").unwrap().task;
        assert_eq!(task.artifacts.len(), 1, "one answer artifact");
        match &task.artifacts[0].parts[0].content {
            PartContent::Text(t) => t.clone(),
            other => panic!("text: {other:?}"),
        }
    };
    assert_eq!(answer(&b), "Checking");
    // A tool call: the next step's text replaces the answer.
    b.apply(
        &env(
            t,
            EventKind::ToolCallStarted {
                call: ToolCall {
                    call_id: "c".into(),
                    name: "shell".into(),
                    arguments: Json(serde_json::json!({})),
                },
            },
        ),
        T0,
    );
    updates.extend(chunk(&mut b, "It is"));
    updates.extend(chunk(&mut b, ""));
    updates.extend(chunk(&mut b, " 42."));
    assert_eq!(
        answer(&b),
        "It is 42.",
        "a GetTask while it runs sees the text so far"
    );
    let flags: Vec<(bool, bool)> = updates.iter().map(|u| (u.append, u.last_chunk)).collect();
    assert_eq!(flags, [(false, false), (false, false), (true, false)]);
    assert!(
        updates
            .iter()
            .all(|u| u.artifact.artifact_id == "task-1-answer")
    );
    // The end sends the whole answer once more, replacing the streamed pieces.
    let end = b
        .apply(&env(t, finished(TaskStatus::Ok, "It is 42.")), T0)
        .events;
    let StreamEvent::Artifact(last) = &end[0].1 else {
        panic!("the answer first: {end:?}")
    };
    assert_eq!((last.append, last.last_chunk), (false, true));
    assert_eq!(answer(&b), "It is 42.");
    // After the end, nothing more is streamed.
    updates.extend(chunk(&mut b, "late"));
    assert_eq!(updates.len(), 3);
}

#[test]
fn unknown_and_known_contexts() {
    let b = started_book();
    let mut m = user("x");
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap(),
        SendPlan::NewContext { context_id: None }
    );
    m.context_id = Some("ctx-1".into());
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap(),
        SendPlan::NewTask {
            context_id: "ctx-1".into()
        }
    );
    m.context_id = Some("x".repeat(MAX_CONTEXT_ID + 1));
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap_err().code(),
        -32602
    );
    m.context_id = Some("client-made".into());
    assert_eq!(
        b.plan_send(&send_params(m)).unwrap(),
        SendPlan::NewContext {
            context_id: Some("client-made".into())
        }
    );
}

#[test]
fn history_length_keeps_the_newest_messages() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    for i in 0..3 {
        let call = ToolCall {
            call_id: format!("c{i}"),
            name: "shell".into(),
            arguments: Json(serde_json::json!({})),
        };
        b.apply(&env(t, EventKind::ToolCallStarted { call }), T0 + i);
    }
    // The user message and two tool-call status messages moved into history.
    assert_eq!(b.view("task-1", None, true).unwrap().history.len(), 3);
    let two = b.view("task-1", Some(2), true).unwrap();
    assert_eq!(two.history.len(), 2);
    assert_eq!(two.history[1].message_id, "task-1-m2");
    assert!(b.view("task-1", Some(0), true).unwrap().history.is_empty());
}

#[test]
fn finished_tasks_past_the_limit_are_forgotten() {
    let mut b = TaskBook::new(2);
    b.add_context("c".into(), conv());
    for i in 0..4 {
        let id = format!("t{i}");
        b.create_task(id.clone(), "c", user("x"), "x".into(), T0 + i)
            .unwrap();
        b.next_dispatch("c").unwrap();
        b.finished(&id, Err(AgentError::cancelled("stop")), T0 + i);
    }
    assert_eq!(b.evict(), vec!["t0".to_owned(), "t1".to_owned()]);
    assert_eq!(b.len(), 2);
    assert!(b.view("t3", None, false).is_some());
}

#[test]
fn list_filters_by_context_and_state() {
    let mut b = TaskBook::new(100);
    b.add_context("c1".into(), conv());
    b.add_context("c2".into(), ConversationId::new());
    b.create_task("a".into(), "c1", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("b".into(), "c2", user("2"), "2".into(), T0 + 5)
        .unwrap();
    let page = b
        .list(&ListParams {
            context_id: Some("c1".into()),
            ..ListParams::default()
        })
        .unwrap();
    assert_eq!(page.tasks.len(), 1);
    assert_eq!(page.total_size, 1);
    assert_eq!(page.next_page_token, "");
    let all = b.list(&ListParams::default()).unwrap();
    assert_eq!(
        all.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["b", "a"],
        "newest first"
    );
    let working = b
        .list(&ListParams {
            status: Some(TaskState::Working),
            ..ListParams::default()
        })
        .unwrap();
    assert!(working.tasks.is_empty());
    assert_eq!(
        b.list(&ListParams {
            page_token: Some("garbage".into()),
            ..ListParams::default()
        })
        .unwrap_err()
        .code(),
        -32602
    );
}

proptest! {
    /// Walking every page returns each matching task once, newest first (P6's pagination
    /// property, for ListTasks).
    #[test]
    fn pages_cover_every_task_once(
        stamps in proptest::collection::vec(0u64..50, 0..60),
        size in 1u32..12,
    ) {
        let mut b = TaskBook::new(1000);
        b.add_context("c".into(), conv());
        for (i, s) in stamps.iter().enumerate() {
            b.create_task(format!("t{i:03}"), "c", user("x"), "x".into(), T0 + s).unwrap();
        }
        let mut seen = Vec::new();
        let mut token = None;
        loop {
            let page = b.list(&ListParams {
                page_size: Some(size),
                page_token: token.clone(),
                ..ListParams::default()
            }).unwrap();
            prop_assert!(page.tasks.len() <= size as usize);
            prop_assert_eq!(page.total_size as usize, stamps.len());
            seen.extend(page.tasks.iter().map(|t| (t.status.timestamp_ms, t.id.clone())));
            if page.next_page_token.is_empty() {
                break;
            }
            token = Some(page.next_page_token);
        }
        prop_assert_eq!(seen.len(), stamps.len());
        let mut sorted = seen.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        prop_assert_eq!(seen, sorted);
    }
}

#[test]
fn a_reply_that_beats_the_events_waits_for_them() {
    let mut b = started_book();
    let t = Some(troupe_task());
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "late".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
    });
    assert_eq!(b.finished("task-1", reply, T0), Finished::Deferred);
    // The events still arrive in troupe's order and end the task.
    let started = b.apply(
        &env(t, EventKind::TaskStarted { input: "hi".into() }),
        T0 + 1,
    );
    assert!(
        started.events.is_empty(),
        "started, maybe waiting for a slot"
    );
    let step = b.apply(&env(t, EventKind::StepStarted { turn: 1, step: 1 }), T0 + 1);
    assert_eq!(step.events[0].1.state(), Some(TaskState::Working));
    // Later steps change nothing more.
    let again = b.apply(&env(t, EventKind::StepStarted { turn: 1, step: 2 }), T0 + 1);
    assert!(again.events.is_empty());
    let done = b.apply(&env(t, finished(TaskStatus::Ok, "late")), T0 + 2);
    assert_eq!(done.events.len(), 2);
    assert!(b.finish_due("task-1", T0 + 3).is_empty(), "ended once");
}

#[test]
fn an_elicitation_is_answered_with_a_data_part() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    let approval_id = ApprovalId::new();
    let asked = b.apply(
        &env(
            t,
            EventKind::ApprovalRequested {
                approval_id,
                command: vec!["mcp".into(), "everything".into(), "elicitation".into()],
                reason: "input".into(),
                subject: ApprovalSubject::McpElicitation {
                    server: "everything".into(),
                    message: "Your name?".into(),
                    schema: Json(serde_json::json!({"type": "object"})),
                },
            },
        ),
        T0,
    );
    let StreamEvent::Status(s) = &asked.events[0].1 else {
        panic!("a status")
    };
    let ask = &s.status.message.as_ref().unwrap().parts[1].content;
    let PartContent::Data(d) = ask else {
        panic!("data")
    };
    assert_eq!(d["approvalRequest"]["kind"], "elicitation");
    let mut m = user("x");
    m.task_id = Some("task-1".into());
    m.parts = vec![Part::data(serde_json::json!({"name": "Ada"}))];
    let SendPlan::Answer { decision, .. } = b.plan_send(&send_params(m)).unwrap() else {
        panic!("an answer")
    };
    assert_eq!(
        decision,
        ApprovalDecision::ApproveWithContent {
            content: Json(serde_json::json!({"name": "Ada"}))
        }
    );
}
