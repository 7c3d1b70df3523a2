use super::*;
use crate::a2a::events::frame;
use crate::a2a::model::{PartContent, Role};
use crate::a2a::model::{SendResult, TaskPage};
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

/// The context's next task, if it can go now.
fn dispatch(b: &mut TaskBook, context_id: &str) -> Option<Dispatch> {
    match b.next(context_id) {
        Next::Dispatch(d) => Some(d),
        _ => None,
    }
}

/// A book with one context and one dispatched task `task-1`.
fn started_book() -> TaskBook {
    let mut b = TaskBook::new();
    b.add_context("ctx-1".into(), conv(), SessionId::new(), T0);
    b.create_task("task-1".into(), "ctx-1", user("hi"), "hi".into(), T0)
        .unwrap();
    assert!(dispatch(&mut b, "ctx-1").is_some());
    b
}

/// The events of a task that streams, calls a tool and completes.
fn streamed_task_events() -> Vec<StreamEvent> {
    let mut b = TaskBook::new();
    b.add_context("ctx-1".into(), conv(), SessionId::new(), T0);
    let task = b
        .create_task("task-1".into(), "ctx-1", user("hi"), "hi".into(), T0)
        .unwrap();
    let mut events = vec![StreamEvent::Task(task)];
    dispatch(&mut b, "ctx-1").unwrap();
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
            agent_id: None,
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
    let mut b = TaskBook::new();
    b.add_context("c".into(), conv(), SessionId::new(), T0);
    b.create_task("a".into(), "c", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("b".into(), "c", user("2"), "2".into(), T0)
        .unwrap();
    let first = dispatch(&mut b, "c").unwrap();
    assert_eq!(first.task_id, "a");
    assert_eq!(first.conversation_id, conv());
    assert_eq!(dispatch(&mut b, "c"), None, "a is still running");
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "one".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
        item_times_ms: Vec::new(),
    });
    assert_eq!(b.finished("a", reply, T0 + 1), Finished::Deferred);
    let events = b.finish_due("a", T0 + 2);
    assert_eq!(events.len(), 2, "artifact, then COMPLETED");
    assert!(b.finish_due("a", T0 + 3).is_empty());
    assert_eq!(dispatch(&mut b, "c").unwrap().task_id, "b");
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
        item_times_ms: Vec::new(),
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
    let mut b = TaskBook::new();
    b.add_context("c".into(), conv(), SessionId::new(), T0);
    b.create_task("a".into(), "c", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("queued".into(), "c", user("2"), "2".into(), T0)
        .unwrap();
    dispatch(&mut b, "c").unwrap();
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
    assert_eq!(dispatch(&mut b, "c"), None, "the canceled task never runs");
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
                agent_id: None,
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

/// The started book's task starts and makes `calls` tool calls (a status message each).
fn calls_started(b: &mut TaskBook, calls: u64) {
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    for i in 0..calls {
        let call = ToolCall {
            call_id: format!("c{i}"),
            name: "shell".into(),
            arguments: Json(serde_json::json!({"i": i})),
        };
        let started = EventKind::ToolCallStarted {
            call,
            agent_id: None,
        };
        b.apply(&env(t, started), T0 + i);
    }
}

#[test]
fn history_length_keeps_the_newest_messages() {
    let mut b = started_book();
    calls_started(&mut b, 3);
    // The user message and two tool-call status messages moved into history.
    assert_eq!(b.view("task-1", None, true).unwrap().history.len(), 3);
    let two = b.view("task-1", Some(2), true).unwrap();
    assert_eq!(two.history.len(), 2);
    assert_eq!(two.history[1].message_id, "task-1-m2");
    assert!(b.view("task-1", Some(0), true).unwrap().history.is_empty());
}

#[test]
fn a_finished_task_leaves_memory_only_once_stored() {
    let mut b = TaskBook::new();
    b.add_context("c".into(), conv(), SessionId::new(), T0);
    b.create_task("t".into(), "c", user("x"), "x".into(), T0)
        .unwrap();
    let dirty = b.take_dirty();
    assert_eq!(dirty.contexts, ["c"]);
    assert_eq!(dirty.tasks, ["t"]);
    assert_eq!(b.forget_task("t"), None, "live: held");
    dispatch(&mut b, "c").unwrap();
    b.finished("t", Err(AgentError::cancelled("stop")), T0 + 1);
    assert_eq!(b.forget_task("t"), None, "changed since stored: held");
    assert!(b.take_dirty().tasks.contains(&"t".to_owned()));
    assert_eq!(b.forget_task("t").as_deref(), Some("c"));
    assert!(b.is_empty());
    assert!(b.view("t", None, false).is_none());
    // The context is open: it stays, though it holds no task.
    assert!(!b.forget_context("c"));
}

/// The book's tasks stored, then listed as `ListTasks` reads them: from the store.
fn list(b: &TaskBook, q: &ListParams) -> Result<TaskPage, A2aError> {
    use troupe_store::Store;
    let store = troupe_store::memory::MemoryStore::new();
    futures::executor::block_on(async {
        for id in b.context_ids() {
            let c = stored::context_record(&id, b.context(&id).unwrap());
            store.put_a2a_context(c).await.unwrap();
        }
        for id in b.tasks_in(Phase::Queued) {
            let r = stored::task_record(
                b.record(&id).unwrap(),
                troupe_proto::StoragePolicy::Full,
                T0,
            )
            .unwrap();
            store.put_a2a_task(r).await.unwrap();
        }
        let page = store.a2a_tasks(list_query(q)?).await.unwrap();
        stored_page(q, &page, |_| None)
    })
}

#[test]
fn list_filters_by_context_and_state() {
    let mut b = TaskBook::new();
    b.add_context("c1".into(), conv(), SessionId::new(), T0);
    b.add_context("c2".into(), ConversationId::new(), SessionId::new(), T0);
    b.create_task("a".into(), "c1", user("1"), "1".into(), T0)
        .unwrap();
    b.create_task("b".into(), "c2", user("2"), "2".into(), T0 + 5)
        .unwrap();
    let page = list(
        &b,
        &ListParams {
            context_id: Some("c1".into()),
            ..ListParams::default()
        },
    )
    .unwrap();
    assert_eq!(page.tasks.len(), 1);
    assert_eq!(page.total_size, 1);
    assert_eq!(page.next_page_token, "");
    assert!(page.tasks[0].artifacts.is_empty());
    let all = list(&b, &ListParams::default()).unwrap();
    assert_eq!(
        all.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["b", "a"],
        "newest first"
    );
    let working = list(
        &b,
        &ListParams {
            status: Some(TaskState::Working),
            ..ListParams::default()
        },
    )
    .unwrap();
    assert!(working.tasks.is_empty());
    assert_eq!(
        list(
            &b,
            &ListParams {
                page_token: Some("garbage".into()),
                ..ListParams::default()
            }
        )
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
        let mut b = TaskBook::new();
        b.add_context("c".into(), conv(), SessionId::new(), T0);
        for (i, s) in stamps.iter().enumerate() {
            b.create_task(format!("t{i:03}"), "c", user("x"), "x".into(), T0 + s).unwrap();
        }
        let mut seen = Vec::new();
        let mut token = None;
        loop {
            let page = list(&b, &ListParams {
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
            prop_assert!(!page.tasks.is_empty(), "no empty page before the last");
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
        item_times_ms: Vec::new(),
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

#[test]
fn an_idle_context_closes_and_a_queued_task_reopens_it() {
    let mut b = TaskBook::new();
    b.add_context("c".into(), conv(), SessionId::new(), T0);
    b.create_task("t".into(), "c", user("x"), "x".into(), T0)
        .unwrap();
    let d = dispatch(&mut b, "c").unwrap();
    // Busy: not idle, however long.
    assert!(b.idle_contexts(T0 + 1_000_000, 10).is_empty());
    b.finished(&d.task_id, Err(AgentError::cancelled("stop")), T0 + 5);
    // Idle since its task changed state (T0 + 5).
    assert!(
        b.idle_contexts(T0 + 10, 10).is_empty(),
        "not idle long enough"
    );
    assert_eq!(b.idle_contexts(T0 + 15, 10), vec![("c".to_owned(), conv())]);
    assert_eq!(b.context("c").unwrap().conv, Conv::Closing);
    assert!(b.idle_contexts(T0 + 100, 10).is_empty(), "asked once");
    // A task arrives while it closes: it waits; once closed, the context reopens.
    b.create_task("u".into(), "c", user("y"), "y".into(), T0 + 20)
        .unwrap();
    assert_eq!(b.next("c"), Next::Nothing, "closing: nothing goes");
    assert!(b.context_closed("c", true), "a task waits");
    assert_eq!(b.next("c"), Next::Reopen(conv()));
    assert_eq!(b.next("c"), Next::Nothing, "reopening once");
    assert!(b.context_reopened("c", None, T0 + 30));
    let d = dispatch(&mut b, "c").unwrap();
    assert_eq!((d.task_id.as_str(), d.conversation_id), ("u", conv()));
    // A close that fails leaves it open.
    b.finished("u", Err(AgentError::cancelled("stop")), T0 + 40);
    assert_eq!(b.idle_contexts(T0 + 100, 10).len(), 1);
    assert!(!b.context_closed("c", false));
    assert_eq!(b.context("c").unwrap().conv, Conv::Open);
}

#[test]
fn a_context_that_cannot_be_reopened_gets_a_new_conversation_or_fails_its_tasks() {
    let mut b = TaskBook::new();
    b.hydrate_context("c".into(), conv(), SessionId::new(), T0, T0, false);
    b.create_task("t".into(), "c", user("x"), "x".into(), T0)
        .unwrap();
    assert_eq!(b.next("c"), Next::Reopen(conv()));
    let new = ConversationId::new();
    assert!(b.context_reopened("c", Some(new), T0 + 1));
    let d = dispatch(&mut b, "c").unwrap();
    assert_eq!(d.conversation_id, new, "the replacement serves the context");
    // Events of the new conversation reach the task.
    let troupe = TaskId::new();
    let started = b.apply_event(
        Some(new),
        Some(troupe),
        &EventKind::TaskStarted { input: "x".into() },
        T0 + 2,
    );
    assert!(started.events.is_empty());
    assert_eq!(b.record("t").unwrap().troupe_task, Some(troupe));
    // When nothing can be opened, the queued tasks fail with the reason.
    let mut b = TaskBook::new();
    b.hydrate_context("c".into(), conv(), SessionId::new(), T0, T0, false);
    b.create_task("t".into(), "c", user("x"), "x".into(), T0)
        .unwrap();
    assert_eq!(b.next("c"), Next::Reopen(conv()));
    let failed = b.reopen_failed("c", &AgentError::internal("session down"), T0 + 1);
    assert_eq!(failed.len(), 1);
    assert_eq!(b.record("t").unwrap().task.status.state, TaskState::Failed);
}

#[test]
fn a_conversation_closed_behind_the_books_back_is_reopened_once() {
    let mut b = started_book();
    let gone = Err(AgentError::not_found("conversation", conv()));
    assert_eq!(
        b.finished("task-1", gone.clone(), T0 + 1),
        Finished::Requeued
    );
    assert_eq!(b.next("ctx-1"), Next::Reopen(conv()));
    b.context_reopened("ctx-1", None, T0 + 2);
    assert_eq!(dispatch(&mut b, "ctx-1").unwrap().task_id, "task-1");
    // A second NotFound fails it.
    let Finished::Done(events) = b.finished("task-1", gone, T0 + 3) else {
        panic!("failed")
    };
    assert_eq!(events.last().unwrap().state(), Some(TaskState::Failed));
}

#[test]
fn stored_tasks_read_back_whole_or_without_text() {
    use troupe_proto::StoragePolicy;
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    b.apply(&env(t, finished(TaskStatus::Ok, "the answer")), T0 + 1);
    let rec = b.record("task-1").unwrap();
    let without_text = |body: &Json| {
        let text = body.0.to_string();
        !text.contains("the answer") && !text.contains("\"hi\"")
    };
    let full = stored::task_record(rec, StoragePolicy::Full, T0 + 2).unwrap();
    assert_eq!(
        (full.state.as_str(), full.terminal, full.updated_ms),
        ("TASK_STATE_COMPLETED", true, T0 + 1)
    );
    assert_eq!((&full.redacted, full.expires_ms), (&None, None));
    let back = stored::record_of(&full).unwrap();
    assert_eq!(back.task, rec.task);
    assert_eq!(back.phase, Phase::Done);
    assert_eq!(back.troupe_task, Some(troupe_task()));

    let bare = stored::task_record(rec, StoragePolicy::HeadersOnly, T0 + 2).unwrap();
    assert!(without_text(&bare.body), "{}", bare.body.0);
    assert_eq!((&bare.redacted, bare.expires_ms), (&None, None));
    let back = stored::record_of(&bare).unwrap();
    assert_eq!(back.task.id, "task-1");
    assert_eq!(back.task.status.state, TaskState::Completed);

    // Under ttl: whole until a ttl after the task's creation, its text-less form beside it.
    let ttl = StoragePolicy::Ttl { secs: 60 };
    let kept = stored::task_record(rec, ttl, T0 + 2).unwrap();
    assert_eq!(kept.body, full.body);
    assert_eq!(kept.redacted.as_ref(), Some(&bare.body));
    assert_eq!(kept.expires_ms, Some(rec.created_ms + 60_000));
    // Written once that time has come: without its text at once.
    let late = stored::task_record(rec, ttl, rec.created_ms + 60_000).unwrap();
    assert_eq!(late.body, bare.body);
    assert_eq!((&late.redacted, late.expires_ms), (&None, None));
}

/// A task answered in the message form (`{"a2a": {"reply": "message", ...}}`) keeps that
/// message beside the task: stored without its text under `headers_only`, and in the
/// text-less form a ttl sweep puts in place.
#[test]
fn a_message_reply_is_stored_without_its_text_where_the_policy_says() {
    use troupe_proto::StoragePolicy;
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    b.apply(
        &env(
            t,
            finished(
                TaskStatus::Ok,
                r#"{"a2a": {"reply": "message", "text": "the secret reply"}}"#,
            ),
        ),
        T0 + 1,
    );
    let rec = b.record("task-1").unwrap();
    assert!(rec.reply_message.is_some(), "answered in the message form");
    let full = stored::task_record(rec, StoragePolicy::Full, T0 + 2).unwrap();
    assert!(full.body.0.to_string().contains("the secret reply"));
    let bare = stored::task_record(rec, StoragePolicy::HeadersOnly, T0 + 2).unwrap();
    assert!(
        !bare.body.0.to_string().contains("the secret reply"),
        "{}",
        bare.body.0
    );
    let kept = stored::task_record(rec, StoragePolicy::Ttl { secs: 60 }, T0 + 2).unwrap();
    let swept = kept.redacted.unwrap();
    assert!(
        !swept.0.to_string().contains("the secret reply"),
        "{}",
        swept.0
    );
}

/// `task-1` started; its task ends `ok` with `text`: the events.
fn ended_with(b: &mut TaskBook, text: &str) -> Vec<StreamEvent> {
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    b.apply(&env(t, finished(TaskStatus::Ok, text)), T0 + 1)
        .events
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

#[test]
fn a_json_answer_is_a_data_part() {
    let mut b = started_book();
    let events = ended_with(&mut b, r#"{"total": 3}"#);
    let StreamEvent::Artifact(a) = &events[0] else {
        panic!("the answer: {events:?}")
    };
    assert_eq!(
        a.artifact.parts[0].content,
        PartContent::Data(serde_json::json!({"total": 3}))
    );
    assert_eq!(events[1].state(), Some(TaskState::Completed));
}

/// An answer an agent's output schema validated is data, even when its only key is `a2a`
/// (an open schema lets it be): it does not change the task's state. The same text from an
/// agent without a schema is the reply form.
#[test]
fn a_validated_answer_is_data_whatever_its_keys() {
    let form = r#"{"a2a":{"state":"rejected","text":"no"}}"#;
    for validated in [true, false] {
        let mut b = started_book();
        let t = Some(troupe_task());
        b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
        b.apply(
            &env(
                t,
                EventKind::DispatchResult {
                    dispatch_id: troupe_proto::DispatchId::new(),
                    agent_id: "profiler".into(),
                    provider_session_id: None,
                    status: troupe_proto::agent::DispatchStatus::Ok,
                    text: form.into(),
                    error: None,
                    duration_ms: 1,
                    validated,
                },
            ),
            T0,
        );
        let events: Vec<StreamEvent> = b
            .apply(&env(t, finished(TaskStatus::Ok, form)), T0 + 1)
            .events
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        if validated {
            let StreamEvent::Artifact(a) = &events[0] else {
                panic!("the answer: {events:?}")
            };
            assert_eq!(
                a.artifact.parts[0].content,
                PartContent::Data(serde_json::from_str(form).unwrap())
            );
            assert_eq!(
                a.artifact.parts[0].media_type.as_deref(),
                Some("application/json")
            );
            assert_eq!(events[1].state(), Some(TaskState::Completed));
        } else {
            assert_eq!(events[0].state(), Some(TaskState::Rejected), "{events:?}");
        }
    }
}

#[test]
fn a_message_reply_answers_without_a_task() {
    let mut b = started_book();
    let events = ended_with(
        &mut b,
        r#"{"a2a": {"reply": "message", "text": "Hi there."}}"#,
    );
    let StreamEvent::Message(m) = &events[0] else {
        panic!("a message first (it ends a stream): {events:?}")
    };
    assert_eq!(m.parts, vec![Part::text("Hi there.")]);
    assert_eq!(m.role, Role::Agent);
    assert_eq!(events[1].state(), Some(TaskState::Completed));
    let rec = b.record("task-1").unwrap();
    assert!(rec.task.artifacts.is_empty(), "no artifact");
    assert_eq!(
        rec.task.status.message.as_ref(),
        Some(m),
        "and the status says it"
    );
    let SendResult::Message(reply) = send_result(rec, None) else {
        panic!("a blocking send answers the message")
    };
    assert_eq!(reply.task_id, None, "a plain message names no task");
    assert_eq!(reply.parts, m.parts);
    for v in [Version::V1_0, Version::V0_3] {
        assert!(
            frame(v, &serde_json::json!(1), &events[0]).1,
            "it closes a {v:?} stream"
        );
    }
}

#[test]
fn a_question_waits_for_the_clients_reply_which_runs_the_task_again() {
    let mut b = started_book();
    let events = ended_with(
        &mut b,
        r#"{"a2a": {"state": "input-required", "text": "Which city?"}}"#,
    );
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].state(), Some(TaskState::InputRequired));
    assert!(b.settled("task-1"));
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "ignored".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
        item_times_ms: Vec::new(),
    });
    assert_eq!(b.finished("task-1", reply, T0 + 2), Finished::Done(vec![]));
    // The context is free meanwhile; the client's answer continues the task.
    let mut m = user("Paris");
    m.task_id = Some("task-1".into());
    assert_eq!(
        b.plan_send(&send_params(m.clone())).unwrap(),
        SendPlan::Continue {
            task_id: "task-1".into()
        }
    );
    let events = b.continued("task-1", m, "Paris".into(), T0 + 3);
    assert_eq!(events[0].state(), Some(TaskState::Working));
    let d = dispatch(&mut b, "ctx-1").unwrap();
    assert_eq!((d.task_id.as_str(), d.input.as_str()), ("task-1", "Paris"));
    // A new troupe task runs it; its answer ends it.
    let second = TaskId::new();
    b.apply(
        &env(
            Some(second),
            EventKind::TaskStarted {
                input: "Paris".into(),
            },
        ),
        T0 + 4,
    );
    b.apply(
        &env(Some(second), finished(TaskStatus::Ok, "Sunny.")),
        T0 + 5,
    );
    let task = b.view("task-1", None, true).unwrap();
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.artifacts[0].parts, vec![Part::text("Sunny.")]);
    let texts: Vec<String> = task
        .history
        .iter()
        .filter_map(|m| match &m.parts[0].content {
            PartContent::Text(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["hi", "Which city?", "Paris"]);
}

/// The client answers a question before the first run's call has returned (its
/// `task_finished` came first, its reply comes after the answer): the second run is the
/// task's, its events reach it, and a late word of the first run does not end it.
#[test]
fn a_quick_answer_to_a_question_runs_the_task_again_tracked() {
    let mut b = started_book();
    let events = ended_with(
        &mut b,
        r#"{"a2a": {"state": "input-required", "text": "Which city?"}}"#,
    );
    assert_eq!(events[0].state(), Some(TaskState::InputRequired));
    let mut m = user("Paris");
    m.task_id = Some("task-1".into());
    b.continued("task-1", m, "Paris".into(), T0 + 2);
    // The context is still busy with the first run's call: nothing goes yet.
    assert!(dispatch(&mut b, "ctx-1").is_none());
    // That call returns now.
    let first = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "ignored".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
        item_times_ms: Vec::new(),
    });
    assert_eq!(b.finished("task-1", first, T0 + 3), Finished::Done(vec![]));
    let d = dispatch(&mut b, "ctx-1").unwrap();
    assert_eq!(d.input, "Paris");
    let second = TaskId::new();
    b.apply(
        &env(
            Some(second),
            EventKind::TaskStarted {
                input: "Paris".into(),
            },
        ),
        T0 + 4,
    );
    assert_eq!(b.record("task-1").unwrap().troupe_task, Some(second));
    // A late end of the first run is not the task's any more.
    let late = b.apply(
        &env(Some(troupe_task()), finished(TaskStatus::Ok, "Lyon?")),
        T0 + 5,
    );
    assert!(late.events.is_empty(), "{:?}", late.events);
    assert_eq!(
        b.view("task-1", None, true).unwrap().status.state,
        TaskState::Working
    );
    b.apply(
        &env(Some(second), finished(TaskStatus::Ok, "Sunny.")),
        T0 + 6,
    );
    let task = b.view("task-1", None, true).unwrap();
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.artifacts[0].parts, vec![Part::text("Sunny.")]);
}

#[test]
fn a_rejection_ends_the_task_rejected_with_its_reason() {
    let mut b = started_book();
    let events = ended_with(
        &mut b,
        r#"{"a2a": {"state": "rejected", "text": "I will not do that."}}"#,
    );
    assert_eq!(events.len(), 1);
    let StreamEvent::Status(s) = &events[0] else {
        panic!("a status")
    };
    assert_eq!(s.status.state, TaskState::Rejected);
    assert_eq!(
        s.status.message.as_ref().unwrap().parts,
        vec![Part::text("I will not do that.")]
    );
    assert!(b.terminal("task-1"));
}

#[test]
fn files_and_links_of_the_reply_form_are_parts_of_the_answer() {
    let mut b = started_book();
    ended_with(
        &mut b,
        r#"{"a2a": {"text": "Report:", "parts": [
            {"url": "https://example.com/r.pdf", "mediaType": "application/pdf", "filename": "r.pdf"},
            {"raw": "aGk=", "mediaType": "text/plain", "filename": "hi.txt"}]}}"#,
    );
    let task = b.view("task-1", None, true).unwrap();
    let parts = &task.artifacts[0].parts;
    assert_eq!(parts.len(), 3);
    assert_eq!(
        parts[1].content,
        PartContent::Url("https://example.com/r.pdf".into())
    );
    assert_eq!(parts[2].filename.as_deref(), Some("hi.txt"));
}

#[test]
fn tool_results_become_file_artifacts_and_json_is_not_streamed_in_pieces() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    let call = |id: &str, name: &str, args: serde_json::Value| EventKind::ToolCallStarted {
        call: ToolCall {
            call_id: id.into(),
            name: name.into(),
            arguments: Json(args),
        },
        agent_id: None,
    };
    let done = |id: &str, name: &str, output: &str, is_error: bool| EventKind::ToolCallFinished {
        call_id: id.into(),
        name: name.into(),
        output: output.into(),
        is_error,
        duration_ms: 1,
        agent_id: None,
    };
    b.apply(
        &env(
            t,
            call("c1", "shell", serde_json::json!({"command": ["ls"]})),
        ),
        T0,
    );
    let file = b
        .apply(&env(t, done("c1", "shell", "a.txt\n", false)), T0)
        .events;
    let StreamEvent::Artifact(a) = &file[0].1 else {
        panic!("a file artifact: {file:?}")
    };
    assert_eq!(a.artifact.artifact_id, "task-1-file-1");
    assert_eq!(a.artifact.parts[0].filename.as_deref(), Some("shell-1.txt"));
    assert!(a.last_chunk);
    // A failed call makes no file.
    b.apply(
        &env(
            t,
            call("c2", "shell", serde_json::json!({"command": ["false"]})),
        ),
        T0,
    );
    assert!(
        b.apply(&env(t, done("c2", "shell", "", true)), T0)
            .events
            .is_empty()
    );
    // JSON pieces are held back; the end sends the data whole.
    let piece = |b: &mut TaskBook, d: &str| {
        b.apply(&env(t, EventKind::AssistantChunk { delta: d.into() }), T0)
            .events
    };
    assert!(piece(&mut b, "\n").is_empty());
    assert!(piece(&mut b, "{\"k\"").is_empty());
    assert!(piece(&mut b, ": 1}").is_empty());
    let end = b.apply(&env(t, finished(TaskStatus::Ok, "{\"k\": 1}")), T0 + 1);
    let StreamEvent::Artifact(answer) = &end.events[0].1 else {
        panic!("the answer")
    };
    assert_eq!(
        answer.artifact.parts[0].content,
        PartContent::Data(serde_json::json!({"k": 1}))
    );
    let task = b.view("task-1", None, true).unwrap();
    assert_eq!(task.artifacts.len(), 2, "the file and the answer");
}

#[test]
fn a_task_whose_end_came_before_its_reply_stays_until_the_reply_frees_its_context() {
    let mut b = started_book();
    let t = Some(troupe_task());
    b.apply(&env(t, EventKind::TaskStarted { input: "hi".into() }), T0);
    b.apply(&env(t, finished(TaskStatus::Ok, "done")), T0 + 1);
    b.take_dirty();
    // Stored, but the context still waits for the message call: held.
    assert_eq!(b.forget_task("task-1"), None);
    let reply = Ok(MessageReply {
        conversation_id: conv(),
        task_id: troupe_task(),
        status: TaskStatus::Ok,
        text: "done".into(),
        stats: TaskStats::default(),
        error: None,
        items: Vec::new(),
        item_times_ms: Vec::new(),
    });
    assert_eq!(b.finished("task-1", reply, T0 + 2), Finished::Done(vec![]));
    assert!(b.context("ctx-1").unwrap().idle(), "the context is free");
    // Stored once more, then it goes; the context can close when idle.
    assert_eq!(b.take_dirty().tasks, ["task-1"]);
    assert_eq!(b.forget_task("task-1").as_deref(), Some("ctx-1"));
    assert_eq!(b.idle_contexts(T0 + 1_000, 10).len(), 1);
}

#[test]
fn a_long_task_keeps_its_history_within_the_cap_and_counts_what_went() {
    let mut b = started_book();
    let calls = MAX_HISTORY as u64 + 50;
    calls_started(&mut b, calls);
    let task = b.view("task-1", None, true).unwrap();
    assert_eq!(task.history.len(), MAX_HISTORY);
    // The client's request is kept; the oldest tool-call messages went.
    assert_eq!(task.history[0].role, Role::User);
    // calls - 1 status messages moved into history, besides the request: 50 too many.
    assert_eq!(task.history[1].message_id, "task-1-m51");
    let dropped = calls - MAX_HISTORY as u64;
    assert_eq!(task.metadata.unwrap()["troupe"]["historyDropped"], dropped);
}

#[test]
fn the_cap_keeps_the_request_and_the_newest_stretch_of_the_exchange() {
    let msg = |id: &str, role: Role| Message {
        message_id: id.to_owned(),
        role,
        ..user(id)
    };
    let ids = |h: &[Message]| -> Vec<String> { h.iter().map(|m| m.message_id.clone()).collect() };
    let mut h = vec![
        msg("u1", Role::User),
        msg("a1", Role::Agent),
        msg("u2", Role::User),
        msg("a2", Role::Agent),
        msg("u3", Role::User),
    ];
    assert_eq!(cap_history(&mut h, 5), 0);
    // A question and the answer to it go together (the oldest after the request), never the
    // question alone while its answer stays.
    assert_eq!(cap_history(&mut h, 3), 2);
    assert_eq!(ids(&h), ["u1", "a2", "u3"]);
    // A history that does not start with the client's message keeps only the newest.
    let mut h = vec![
        msg("a1", Role::Agent),
        msg("u1", Role::User),
        msg("a2", Role::Agent),
    ];
    assert_eq!(cap_history(&mut h, 2), 1);
    assert_eq!(ids(&h), ["u1", "a2"]);
    let mut h = vec![msg("u1", Role::User), msg("u2", Role::User)];
    assert_eq!(cap_history(&mut h, 0), 2);
    assert!(h.is_empty());
}
