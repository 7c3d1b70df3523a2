use super::*;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::broadcast;
use troupe_actors::rollout::record_for;
use troupe_actors::rollout::storage::{RolloutSink, RolloutStorage, SweepReport};
use troupe_proto::{CloseOutcome, Json, TaskStats, ToolCall, Usage, WarningCode};

const SESSION: &str = "00000000-0000-7000-8000-000000000001";
const CONV_A: &str = "00000000-0000-7000-8000-0000000000a1";
const CONV_B: &str = "00000000-0000-7000-8000-0000000000b1";
const TASK_A1: &str = "00000000-0000-7000-8000-0000000000a2";
const TASK_B1: &str = "00000000-0000-7000-8000-0000000000b2";
const TASK_A2: &str = "00000000-0000-7000-8000-0000000000a3";
const APPROVAL: &str = "00000000-0000-7000-8000-0000000000c1";
/// 2026-01-01T00:00:00Z
const T0: u64 = 1_767_225_600_000;

fn id<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: fmt::Debug,
{
    s.parse().unwrap()
}

/// Builds envelopes with increasing `seq` and `ts_ms` (250 ms apart).
struct Events {
    seq: u64,
}

impl Events {
    fn new() -> Self {
        Self { seq: 0 }
    }

    fn env(&mut self, conv: Option<&str>, task: Option<&str>, event: EventKind) -> EventEnvelope {
        self.seq += 1;
        EventEnvelope {
            seq: self.seq,
            ts_ms: T0 + self.seq * 250,
            session_id: id(SESSION),
            conversation_id: conv.map(id),
            task_id: task.map(id),
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
        }
    }

    fn task(&mut self, conv: &str, task: &str, event: EventKind) -> EventEnvelope {
        self.env(Some(conv), Some(task), event)
    }
}

fn usage(input: u64, output: u64, cached: u64) -> Option<Usage> {
    Some(Usage {
        input_tokens: input,
        output_tokens: output,
        cached_tokens: cached,
        reasoning_tokens: 0,
    })
}

fn opened(ev: &mut Events, conv: &str, policy: StoragePolicy) -> EventEnvelope {
    ev.env(
        Some(conv),
        None,
        EventKind::ConversationOpened {
            storage_policy: policy,
            base_instructions: None,
            user_instructions: None,
        },
    )
}

/// Two conversations interleaved, a tool call with an approval, tokens before and after
/// their assistant message, a conversation warning. All content is escaping-worthy.
fn phase_one(ev: &mut Events) -> Vec<EventEnvelope> {
    let (a, b, a1, b1) = (CONV_A, CONV_B, TASK_A1, TASK_B1);
    vec![
        opened(ev, a, StoragePolicy::Full),
        opened(ev, b, StoragePolicy::Full),
        ev.env(
            Some(b),
            None,
            EventKind::Warning {
                code: WarningCode::PolicyClamped,
                message: "sandbox narrowed to read_only".into(),
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::TaskStarted {
                input: "list files & count <them>".into(),
            },
        ),
        ev.task(a, a1, EventKind::StepStarted { turn: 1, step: 1 }),
        ev.task(
            b,
            b1,
            EventKind::TaskStarted {
                input: "say \"hi\"".into(),
            },
        ),
        ev.task(b, b1, EventKind::StepStarted { turn: 1, step: 1 }),
        ev.task(
            a,
            a1,
            EventKind::AssistantChunk {
                delta: "I'll run ".into(),
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::AssistantChunk {
                delta: "ls.".into(),
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::AssistantMessage {
                text: "I'll run ls.".into(),
            },
        ),
        // Tokens after the message: the assistant line waits for them.
        ev.task(
            a,
            a1,
            EventKind::StepFinished {
                turn: 1,
                step: 1,
                estimated_prompt_tokens: 120,
                usage: usage(100, 20, 50),
                estimated_completion_tokens: None,
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::ToolCallStarted {
                call: ToolCall {
                    call_id: "call_1".into(),
                    name: "shell".into(),
                    arguments: Json(serde_json::json!({ "command": ["ls", "-1"] })),
                },
                agent_id: None,
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::ApprovalRequested {
                approval_id: id(APPROVAL),
                command: vec!["ls".into(), "-1".into()],
                reason: "shell needs approval".into(),
                subject: troupe_proto::ApprovalSubject::Command,
            },
        ),
        // Tokens before the message: attached at once.
        ev.task(
            b,
            b1,
            EventKind::StepFinished {
                turn: 1,
                step: 1,
                estimated_prompt_tokens: 30,
                usage: usage(25, 2, 0),
                estimated_completion_tokens: None,
            },
        ),
        ev.task(b, b1, EventKind::AssistantMessage { text: "hi".into() }),
        ev.task(
            a,
            a1,
            EventKind::ApprovalResolved {
                approval_id: id(APPROVAL),
                decision: ApprovalDecision::ApproveOnce,
            },
        ),
        ev.task(
            b,
            b1,
            EventKind::TaskFinished {
                status: TaskStatus::Ok,
                text: "hi".into(),
                stats: TaskStats {
                    usage: usage(25, 2, 0).unwrap_or_default(),
                    estimated_prompt_tokens: 30,
                    turn: 1,
                    steps: 1,
                    steps_with_usage: 1,
                    estimated_completion_tokens: 0,
                    tool_calls: 0,
                    duration_ms: 900,
                    trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                    mcp_calls: 0,
                    mcp_latency_ms: 0,
                },
                error: None,
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::ToolCallFinished {
                call_id: "call_1".into(),
                name: "shell".into(),
                output: "a.txt\nb <c>.txt\n".into(),
                is_error: false,
                duration_ms: 12,
                agent_id: None,
            },
        ),
        ev.task(a, a1, EventKind::StepStarted { turn: 1, step: 2 }),
        ev.task(
            a,
            a1,
            EventKind::AssistantMessage {
                text: "2 files: a.txt, 'b <c>.txt'".into(),
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::StepFinished {
                turn: 1,
                step: 2,
                estimated_prompt_tokens: 160,
                usage: usage(140, 15, 100),
                estimated_completion_tokens: None,
            },
        ),
        ev.task(
            a,
            a1,
            EventKind::TaskFinished {
                status: TaskStatus::Ok,
                text: "2 files: a.txt, 'b <c>.txt'".into(),
                stats: TaskStats {
                    usage: usage(240, 35, 150).unwrap_or_default(),
                    estimated_prompt_tokens: 280,
                    turn: 1,
                    steps: 2,
                    steps_with_usage: 2,
                    estimated_completion_tokens: 0,
                    tool_calls: 1,
                    duration_ms: 2300,
                    trace_id: String::new(),
                    mcp_calls: 0,
                    mcp_latency_ms: 0,
                },
                error: None,
            },
        ),
    ]
}

/// A turn whose first four events come before the feed's start (see `scripted_session`).
fn phase_two(ev: &mut Events) -> Vec<EventEnvelope> {
    let (a, a2) = (CONV_A, TASK_A2);
    let mut events = vec![
        ev.task(
            a,
            a2,
            EventKind::TaskStarted {
                input: "again".into(),
            },
        ),
        ev.task(a, a2, EventKind::StepStarted { turn: 1, step: 1 }),
    ];
    for i in 0..8 {
        events.push(ev.task(
            a,
            a2,
            EventKind::AssistantChunk {
                delta: format!("c{i} "),
            },
        ));
    }
    let error = AgentError::ModelError {
        message: "HTTP 429 <rate limited>".into(),
        retryable: true,
    };
    events.push(ev.task(
        a,
        a2,
        EventKind::Error {
            error: error.clone(),
        },
    ));
    events.push(ev.task(
        a,
        a2,
        EventKind::TaskFinished {
            status: TaskStatus::Error,
            text: String::new(),
            stats: TaskStats {
                usage: Usage::default(),
                estimated_prompt_tokens: 40,
                turn: 1,
                steps: 1,
                steps_with_usage: 0,
                estimated_completion_tokens: 0,
                tool_calls: 0,
                duration_ms: 300,
                trace_id: String::new(),
                mcp_calls: 0,
                mcp_latency_ms: 0,
            },
            error: Some(error),
        },
    ));
    events
}

/// A feed of the envelopes sent on `rx`, as the live records of a session's stream.
fn feed(rx: broadcast::Receiver<Arc<EventEnvelope>>) -> HistoryFeed {
    HistoryFeed::new(futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(env) => Some((Ok(RolloutRecord::live(&env)), rx)),
            Err(broadcast::error::RecvError::Lagged(n)) => panic!("the test feed lost {n}"),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }))
}

/// Waits until the log's receiver has taken every queued event (a mailbox barrier).
async fn drained(tx: &broadcast::Sender<Arc<EventEnvelope>>) {
    while !tx.is_empty() {
        tokio::task::yield_now().await;
    }
}

/// Writes the scripted session and returns the file's text.
async fn scripted_session(dir: &Path) -> (String, HistorySummary) {
    let (tx, rx) = broadcast::channel(64);
    let log = HistoryLog::start_with(
        dir,
        id(SESSION),
        feed(rx),
        HistoryLogOptions::default().with_session_meta("mode", "interactive"),
    )
    .await
    .unwrap();
    let mut ev = Events::new();
    for env in phase_one(&mut ev) {
        tx.send(Arc::new(env)).unwrap();
        drained(&tx).await;
    }
    // The second turn as a feed that starts inside it gives it (`HistoryFeed::of_session`
    // after a `seq` within the turn): its first four events are not in the feed. No await
    // between the sends: `finish` still writes what the feed holds.
    for env in phase_two(&mut ev).into_iter().skip(4) {
        tx.send(Arc::new(env)).unwrap();
    }
    let summary = log.finish().await.unwrap();
    let text = std::fs::read_to_string(&summary.path).unwrap();
    (text, summary)
}

/// Replaces ids by names and the wall-clock parts (times of session and gap lines, pid,
/// version) by placeholders.
fn redact(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line
            .replace(SESSION, "[session]")
            .replace(CONV_A, "[conv-a]")
            .replace(CONV_B, "[conv-b]")
            .replace(TASK_A1, "[task-a1]")
            .replace(TASK_B1, "[task-b1]")
            .replace(TASK_A2, "[task-a2]")
            .replace(APPROVAL, "[approval]")
            .replace(
                &format!("\"pid\":{}", std::process::id()),
                "\"pid\":\"[pid]\"",
            )
            .replace(
                &format!("\"version\":\"{}\"", env!("CARGO_PKG_VERSION")),
                "\"version\":\"[version]\"",
            );
        let wall_clock = line.contains("\"type\":\"session_")
            || line.contains("\"code\":\"gap\"")
            || line.starts_with("<session");
        if wall_clock {
            line = redact_value(&line, "\"ts\":\"");
            line = redact_value(&line, "started=\"");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Replaces the quoted value after `prefix` with `[time]`.
fn redact_value(line: &str, prefix: &str) -> String {
    let Some(start) = line.find(prefix).map(|i| i + prefix.len()) else {
        return line.to_owned();
    };
    let end = start + line[start..].find('"').unwrap();
    format!("{}[time]{}", &line[..start], &line[end..])
}

/// Top-level keys of a JSON object, in file order.
struct KeyOrder(Vec<String>);

impl<'de> Deserialize<'de> for KeyOrder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyOrder;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyOrder, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(KeyOrder(keys))
            }
        }
        d.deserialize_map(V)
    }
}

fn parse(text: &str) -> Vec<HistoryLine> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn session_file_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (text, summary) = scripted_session(dir.path()).await;
    assert_eq!(
        summary.path,
        dir.path().join(format!("{SESSION}.jsonl")),
        "one file per session, named by its id"
    );
    assert_eq!(summary.lines, text.lines().count() as u64);
    insta::assert_snapshot!(redact(&text));
}

#[tokio::test]
async fn every_line_has_the_eight_keys_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (text, _) = scripted_session(dir.path()).await;
    let expected = [
        "ts",
        "session_id",
        "turn",
        "step",
        "type",
        "content",
        "role",
        "meta",
    ];
    for (n, line) in text.lines().enumerate() {
        let KeyOrder(keys) = serde_json::from_str(line).unwrap();
        assert_eq!(keys, expected, "line {}", n + 1);
    }
    for line in parse(&text) {
        // RFC 3339 UTC with milliseconds.
        assert_eq!(
            line.ts.len(),
            "2026-01-01T00:00:00.250Z".len(),
            "{}",
            line.ts
        );
        assert!(line.ts.ends_with('Z'));
        assert_eq!(line.session_id, id(SESSION));
    }
    let first_event = parse(&text)
        .into_iter()
        .find(|l| l.kind != LineType::SessionStart)
        .unwrap();
    // The third event of the script, 750 ms after T0.
    assert_eq!(first_event.ts, "2026-01-01T00:00:00.750Z");
}

#[tokio::test]
async fn turns_count_per_session_and_steps_per_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (text, summary) = scripted_session(dir.path()).await;
    let lines = parse(&text);
    let turn_of = |task: &str| -> Vec<(u32, u32, LineType)> {
        lines
            .iter()
            .filter(|l| l.meta.task_id == Some(id(task)))
            .map(|l| (l.turn, l.step, l.kind))
            .collect()
    };
    use LineType::*;
    assert_eq!(
        turn_of(TASK_A1),
        [
            (1, 0, TurnStart),
            (1, 1, AssistantChunk),
            (1, 1, AssistantChunk),
            (1, 1, Assistant),
            (1, 1, Action),
            (1, 1, Approval),
            (1, 1, Approval),
            (1, 1, Observation),
            (1, 2, Assistant),
            (1, 2, Final),
            (1, 0, TurnEnd),
        ]
    );
    assert_eq!(
        turn_of(TASK_B1),
        [
            (2, 0, TurnStart),
            (2, 1, Assistant),
            (2, 1, Final),
            (2, 0, TurnEnd)
        ]
    );
    // The turn whose start and step came before the feed's start still gets the next number.
    let a2 = turn_of(TASK_A2);
    assert!(a2.iter().all(|(turn, _, _)| *turn == 3), "{a2:?}");
    assert_eq!(a2.first(), Some(&(3, 0, AssistantChunk)));
    assert_eq!(a2.last(), Some(&(3, 0, TurnEnd)));
    assert_eq!(summary.turns, 3);
    // Every line of a turn names its conversation.
    for line in lines.iter().filter(|l| l.turn > 0) {
        let expected = if line.meta.task_id == Some(id(TASK_B1)) {
            CONV_B
        } else {
            CONV_A
        };
        assert_eq!(line.meta.conversation_id, Some(id(expected)), "{line:?}");
    }
}

#[tokio::test]
async fn token_totals_are_the_sums_of_their_parts() {
    let dir = tempfile::tempdir().unwrap();
    let (text, summary) = scripted_session(dir.path()).await;
    let lines = parse(&text);
    let mut session = Tokens::default();
    let mut with_steps = 0;
    for end in lines.iter().filter(|l| l.kind == LineType::TurnEnd) {
        let tokens = end.meta.tokens.as_ref().unwrap();
        if !tokens.steps.is_empty() {
            with_steps += 1;
            let mut sum = Tokens::default();
            for s in &tokens.steps {
                sum.add(&s.tokens);
            }
            assert_eq!(sum, tokens.totals, "turn {}", end.turn);
        }
        assert_eq!(
            tokens.totals.total,
            tokens.totals.input + tokens.totals.output
        );
        session.add(&tokens.totals);
    }
    assert_eq!(with_steps, 2);
    let end = lines.last().unwrap();
    assert_eq!(end.kind, LineType::SessionEnd);
    assert_eq!(end.meta.tokens.as_ref().unwrap().totals, session);
    assert_eq!(summary.tokens, session);
    // Each assistant line carries its own step's tokens.
    let assistant: Vec<_> = lines
        .iter()
        .filter(|l| l.kind == LineType::Assistant)
        .map(|l| {
            (
                l.turn,
                l.step,
                l.meta.tokens.as_ref().map(|t| t.totals.input),
            )
        })
        .collect();
    assert_eq!(
        assistant,
        [(1, 1, Some(100)), (2, 1, Some(25)), (1, 2, Some(140))]
    );
}

/// A storage that holds `records` for reading (what a finished session left behind).
struct Stored {
    records: Vec<RolloutRecord>,
    /// Reads fail.
    broken: bool,
}

impl RolloutStorage for Stored {
    fn open_sink(&self, _: SessionId) -> Result<Box<dyn RolloutSink>, AgentError> {
        Err(AgentError::internal("read only"))
    }
    fn last_seq(&self, _: SessionId) -> Result<u64, AgentError> {
        Ok(self.records.last().map_or(0, |r| r.seq))
    }
    fn read_conversation(
        &self,
        _: SessionId,
        _: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        Err(AgentError::internal("not read here"))
    }
    fn read_after(
        &self,
        _: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        if self.broken {
            return Err(AgentError::internal("disk on fire"));
        }
        Ok(self
            .records
            .iter()
            .filter(|r| r.seq > after_seq)
            .take(limit)
            .cloned()
            .collect())
    }
    fn sweep_due(&self, _: u64) -> Result<SweepReport, AgentError> {
        Ok(SweepReport::default())
    }
}

/// `n` chunks of one task, and the stream that delivers the first `delivered` of them, then
/// fails (as a stream that fell behind when its session ended does).
fn chunks(n: u64, delivered: usize) -> (Vec<RolloutRecord>, HistoryFeed) {
    let mut ev = Events::new();
    let records: Vec<RolloutRecord> = (0..n)
        .map(|i| {
            let env = ev.task(
                CONV_A,
                TASK_A1,
                EventKind::AssistantChunk {
                    delta: format!("d{i}"),
                },
            );
            record_for(StoragePolicy::Full, &env).unwrap()
        })
        .collect();
    let mut items: Vec<Result<RolloutRecord, AgentError>> =
        records.iter().take(delivered).cloned().map(Ok).collect();
    items.push(Err(AgentError::internal("rollout unavailable")));
    (records, HistoryFeed::new(futures::stream::iter(items)))
}

fn chunk_contents(lines: &[HistoryLine]) -> Vec<&str> {
    lines
        .iter()
        .filter(|l| l.kind == LineType::AssistantChunk)
        .map(|l| l.content.as_str())
        .collect()
}

#[tokio::test]
async fn a_stream_that_ends_early_is_caught_up_from_storage_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (records, feed) = chunks(600, 5);
    let storage = Arc::new(Stored {
        records,
        broken: false,
    });
    let options = HistoryLogOptions::default().with_policy(id(CONV_A), StoragePolicy::Full);
    let log = HistoryLog::start_with(dir.path(), id(SESSION), feed.with_storage(storage), options)
        .await
        .unwrap();
    let summary = log.finish().await.unwrap();
    let lines = parse(&std::fs::read_to_string(summary.path).unwrap());
    let expected: Vec<String> = (0..600).map(|i| format!("d{i}")).collect();
    assert_eq!(
        chunk_contents(&lines),
        expected,
        "every chunk, once, in order"
    );
    assert!(
        lines.iter().all(|l| l.kind != LineType::Warning),
        "nothing is missing: no gap"
    );
}

#[tokio::test]
async fn what_cannot_be_read_is_reported_as_a_gap() {
    for storage in [
        None,
        Some(Arc::new(Stored {
            records: Vec::new(),
            broken: true,
        })),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut feed) = chunks(10, 3);
        if let Some(storage) = storage {
            feed = feed.with_storage(storage);
        }
        let options = HistoryLogOptions::default().with_policy(id(CONV_A), StoragePolicy::Full);
        let log = HistoryLog::start_with(dir.path(), id(SESSION), feed, options)
            .await
            .unwrap();
        let summary = log.finish().await.unwrap();
        let lines = parse(&std::fs::read_to_string(summary.path).unwrap());
        assert_eq!(chunk_contents(&lines), ["d0", "d1", "d2"]);
        let gap = &lines[lines.len() - 2];
        assert_eq!(gap.kind, LineType::Warning);
        assert_eq!(gap.meta.code.as_deref(), Some("gap"));
        assert!(gap.content.contains("after seq 3"), "{}", gap.content);
        // The turn whose end never came is reported.
        assert_eq!(lines.last().unwrap().meta.unfinished, Some(1));
    }
}

/// Stored headers (a `HeadersOnly` conversation's records read back by a stream that fell
/// behind) give the lines the live events give at that level, with the stored sizes; only
/// what the headers do not keep differs (approval lines, the warning code); call ids come
/// through.
#[test]
fn stored_headers_give_the_lines_of_the_live_events() {
    let mut ev = Events::new();
    let mut events = phase_one(&mut ev);
    events.extend(phase_two(&mut ev));
    let policy = StoragePolicy::HeadersOnly;
    let options = || {
        HistoryLogOptions::default()
            .with_policy(id(CONV_A), policy)
            .with_policy(id(CONV_B), policy)
    };
    let strip = |lines: Vec<HistoryLine>| -> Vec<HistoryLine> {
        lines
            .into_iter()
            .filter(|l| l.kind != LineType::Approval)
            .map(|mut l| {
                l.meta.trace_id = None;
                if l.kind == LineType::Warning {
                    l.meta.code = None;
                }
                // Prompt estimates are not in the headers.
                if let Some(t) = &mut l.meta.tokens {
                    t.totals.estimated_prompt = 0;
                    t.totals.source = None;
                    for s in &mut t.steps {
                        s.tokens.estimated_prompt = 0;
                    }
                }
                l
            })
            .collect()
    };
    let mut live = HistoryLog::new(id(SESSION), options(), 0);
    let mut stored = HistoryLog::new(id(SESSION), options(), 0);
    let (mut from_live, mut from_stored) = (Vec::new(), Vec::new());
    for env in &events {
        // Phase one opens its conversations as Full: here they are HeadersOnly throughout.
        if matches!(env.event, EventKind::ConversationOpened { .. }) {
            continue;
        }
        live.on_event(env, &mut from_live);
        if let Some(record) = record_for(policy, env) {
            stored.on_record(&record, &mut from_stored);
        }
    }
    assert!(from_live.len() > 10, "{from_live:?}");
    assert_eq!(strip(from_stored), strip(from_live));
}

#[tokio::test]
async fn storage_policies_keep_content_off_the_disk() {
    const HEADERS: &str = "00000000-0000-7000-8000-0000000000d1";
    const NONE: &str = "00000000-0000-7000-8000-0000000000e1";
    const UNKNOWN: &str = "00000000-0000-7000-8000-0000000000f1";
    const ROOT: &str = "00000000-0000-7000-8000-000000000011";
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = broadcast::channel(256);
    // The root conversation was opened before the log subscribed.
    let options = HistoryLogOptions::default().with_policy(id(ROOT), StoragePolicy::Full);
    let log = HistoryLog::start_with(dir.path(), id(SESSION), feed(rx), options)
        .await
        .unwrap();
    let mut ev = Events::new();
    let mut events = vec![
        opened(&mut ev, HEADERS, StoragePolicy::HeadersOnly),
        opened(&mut ev, NONE, StoragePolicy::None),
    ];
    let tasks = [
        (HEADERS, "00000000-0000-7000-8000-0000000000d2"),
        (NONE, "00000000-0000-7000-8000-0000000000e2"),
        (UNKNOWN, "00000000-0000-7000-8000-0000000000f2"),
        (ROOT, "00000000-0000-7000-8000-000000000012"),
    ];
    for (conv, task) in tasks {
        let secret = if conv == ROOT { "visible" } else { "SECRET" };
        let script = [
            EventKind::TaskStarted {
                input: secret.into(),
            },
            EventKind::StepStarted { turn: 1, step: 1 },
            EventKind::AssistantChunk {
                delta: secret.into(),
            },
            EventKind::AssistantMessage {
                text: secret.into(),
            },
            EventKind::ToolCallStarted {
                call: ToolCall {
                    call_id: "c".into(),
                    name: "shell".into(),
                    arguments: Json(serde_json::json!({ "command": [secret] })),
                },
                agent_id: None,
            },
            EventKind::ApprovalRequested {
                approval_id: id(APPROVAL),
                command: vec![secret.into()],
                reason: secret.into(),
                subject: troupe_proto::ApprovalSubject::Command,
            },
            EventKind::ApprovalResolved {
                approval_id: id(APPROVAL),
                decision: ApprovalDecision::Deny {
                    reason: Some(secret.into()),
                },
            },
            EventKind::ToolCallFinished {
                call_id: "c".into(),
                name: "shell".into(),
                output: secret.into(),
                is_error: true,
                duration_ms: 1,
                agent_id: None,
            },
            EventKind::Error {
                error: AgentError::invalid(secret),
            },
            EventKind::TaskFinished {
                status: TaskStatus::Error,
                text: secret.into(),
                stats: TaskStats::default(),
                error: Some(AgentError::invalid(secret)),
            },
        ];
        for event in script {
            events.push(ev.task(conv, task, event));
        }
    }
    events.push(ev.env(
        Some(HEADERS),
        None,
        EventKind::ConversationClosed {
            outcome: CloseOutcome::Closed,
        },
    ));
    for env in events {
        tx.send(Arc::new(env)).unwrap();
    }
    let summary = log.finish().await.unwrap();
    let text = std::fs::read_to_string(summary.path).unwrap();
    assert!(!text.contains("SECRET"), "{text}");
    assert!(text.contains("visible"));

    let lines = parse(&text);
    let kinds_of = |conv: &str| -> Vec<LineType> {
        lines
            .iter()
            .filter(|l| l.meta.conversation_id == Some(id(conv)))
            .map(|l| l.kind)
            .collect()
    };
    use LineType::*;
    let minimal = [TurnStart, Error, TurnEnd];
    assert_eq!(kinds_of(NONE), minimal);
    assert_eq!(
        kinds_of(UNKNOWN),
        minimal,
        "unknown conversations are strict"
    );
    assert_eq!(
        kinds_of(HEADERS),
        [
            TurnStart,
            Assistant,
            Action,
            Approval,
            Approval,
            Observation,
            Error,
            Final,
            TurnEnd
        ],
        "headers keep every line but chunks"
    );
    for line in lines
        .iter()
        .filter(|l| l.meta.conversation_id == Some(id(HEADERS)))
    {
        if line.kind != TurnEnd {
            assert!(line.content.is_empty(), "{line:?}");
            assert!(line.meta.chars.is_some(), "{line:?}");
        }
        assert_eq!(line.meta.reason, None);
    }
    assert_eq!(kinds_of(ROOT).len(), 10, "full keeps everything");
}

#[tokio::test]
async fn reopening_appends_and_continues_turn_numbers() {
    let dir = tempfile::tempdir().unwrap();
    for run in 0..2 {
        let (tx, rx) = broadcast::channel(16);
        let options = HistoryLogOptions::default().with_policy(id(CONV_A), StoragePolicy::Full);
        let log = HistoryLog::start_with(dir.path(), id(SESSION), feed(rx), options)
            .await
            .unwrap();
        let task = if run == 0 { TASK_A1 } else { TASK_A2 };
        let mut ev = Events::new();
        let env = ev.task(
            CONV_A,
            task,
            EventKind::TaskStarted {
                input: format!("run {run}"),
            },
        );
        tx.send(Arc::new(env)).unwrap();
        // The channel closing ends the log on its own; finish still answers.
        drop(tx);
        log.finish().await.unwrap();
    }
    let path = dir.path().join(format!("{SESSION}.jsonl"));
    let lines = parse(&std::fs::read_to_string(path).unwrap());
    let kinds: Vec<_> = lines.iter().map(|l| (l.kind, l.turn)).collect();
    use LineType::*;
    assert_eq!(
        kinds,
        [
            (SessionStart, 0),
            (TurnStart, 1),
            (SessionEnd, 0),
            (SessionStart, 0),
            (TurnStart, 2),
            (SessionEnd, 0),
        ]
    );
}

#[tokio::test]
async fn a_torn_last_line_is_ended_before_appending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{SESSION}.jsonl"));
    std::fs::write(
        &path,
        "{\"ts\":\"2026-01-01T00:00:00.000Z\",\"turn\":7,\"ty",
    )
    .unwrap();
    let (_tx, rx) = broadcast::channel(1);
    let log = HistoryLog::start(dir.path(), id(SESSION), feed(rx))
        .await
        .unwrap();
    log.finish().await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().ends_with("\"ty"));
    for line in lines {
        let _: HistoryLine = serde_json::from_str(line).unwrap();
    }
}

/// The pure mapping: an assistant line waits for its step's tokens, but not past the task's
/// next event.
#[test]
fn assistant_lines_wait_for_their_tokens_only_until_the_next_event() {
    let options = HistoryLogOptions::default().with_policy(id(CONV_A), StoragePolicy::Full);
    let mut log = HistoryLog::new(id(SESSION), options, 0);
    let mut ev = Events::new();
    let mut out = Vec::new();
    let mut feed = |log: &mut HistoryLog, event| {
        out.clear();
        log.on_event(&ev.task(CONV_A, TASK_A1, event), &mut out);
        out.iter().map(|l| (l.kind, l.step)).collect::<Vec<_>>()
    };
    use LineType::*;
    assert_eq!(
        feed(&mut log, EventKind::TaskStarted { input: "q".into() }),
        [(TurnStart, 0)]
    );
    feed(&mut log, EventKind::StepStarted { turn: 1, step: 1 });
    let message = || EventKind::AssistantMessage { text: "a".into() };
    assert_eq!(feed(&mut log, message()), [], "held for the tokens");
    let finished = |step| EventKind::StepFinished {
        turn: 1,
        step,
        estimated_prompt_tokens: 9,
        usage: None,
        estimated_completion_tokens: None,
    };
    assert_eq!(feed(&mut log, finished(1)), [(Assistant, 1)]);
    feed(&mut log, EventKind::StepStarted { turn: 1, step: 2 });
    assert_eq!(feed(&mut log, message()), []);
    // The next event comes before the tokens: the line goes out without them, first.
    let lines = feed(
        &mut log,
        EventKind::ToolCallStarted {
            call: ToolCall {
                call_id: "c".into(),
                name: "shell".into(),
                arguments: Json::empty_object(),
            },
            agent_id: None,
        },
    );
    assert_eq!(lines, [(Assistant, 2), (Action, 2)]);
    assert_eq!(feed(&mut log, finished(2)), []);
    let mut end = Vec::new();
    log.session_end(T0, &mut end);
    assert_eq!(end.len(), 1);
    assert_eq!(end[0].meta.unfinished, Some(1));
    assert_eq!(log.turns_started(), 1);
}

#[tokio::test]
async fn xml_export_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (_, summary) = scripted_session(dir.path()).await;
    let xml = export_xml(&summary.path).unwrap();
    assert!(!xml.contains("c0 "), "chunks are left out");
    insta::assert_snapshot!(redact(&xml));
}

#[test]
fn xml_escapes_text_and_attributes() {
    let mut out = String::new();
    xml::escape("a & b < c > d \"e\" 'f'", &mut out);
    assert_eq!(out, "a &amp; b &lt; c &gt; d &quot;e&quot; &apos;f&apos;");
    out.clear();
    xml::escape("red\u{1b}[31m\r\n\ttab", &mut out);
    assert_eq!(out, "red\u{FFFD}[31m&#13;\n\ttab");

    let line = |turn: u32, kind: &str, content: &str, meta: serde_json::Value| {
        serde_json::json!({
            "ts": "2026-01-01T00:00:00.000Z", "session_id": SESSION, "turn": turn, "step": 1,
            "type": kind, "content": content, "role": "tool", "meta": meta,
        })
        .to_string()
    };
    let jsonl = [
        line(
            1,
            "action",
            "{\"a\":\"<&>\"}",
            serde_json::json!({ "tool": "x\"y" }),
        ),
        line(
            1,
            "observation",
            "</observation><evil/>",
            serde_json::json!({ "tool": "t", "is_error": true }),
        ),
    ]
    .join("\n");
    let xml = export_xml_from_lines(jsonl.as_bytes()).unwrap();
    assert!(
        xml.contains(
            r#"<action tool="x&quot;y">{&quot;a&quot;:&quot;&lt;&amp;&gt;&quot;}</action>"#
        ),
        "{xml}"
    );
    assert!(
        xml.contains(
            r#"<observation tool="t" error="true">&lt;/observation&gt;&lt;evil/&gt;</observation>"#
        ),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<turn index="1" status="incomplete">"#),
        "{xml}"
    );
}

#[test]
fn xml_export_names_the_unparseable_line() {
    let ok = r#"{"ts":"2026-01-01T00:00:00.000Z","session_id":"s","turn":0,"step":0,"type":"session_start","content":"","role":"system","meta":{}}"#;
    let missing_meta = r#"{"ts":"x","session_id":"s","turn":1,"step":0,"type":"turn_start","content":"","role":"user"}"#;
    for (bad, number) in [("not json", 2), (missing_meta, 2), ("{}", 2)] {
        let text = format!("{ok}\n{bad}\n{ok}\n");
        let err = export_xml_from_lines(text.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        assert!(err.to_string().contains(&format!("line {number}")), "{err}");
    }
    let err = export_xml_from_lines(&b""[..]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = export_xml(Path::new("/nonexistent/history.jsonl")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

/// A dispatch's events as the task of the supervisor's conversation emits them.
fn dispatch_events(ev: &mut Events) -> Vec<EventEnvelope> {
    use troupe_proto::agent::{
        DispatchStatus, ExecutionChain, ProviderKind, RouteDecision, RouteSource,
    };
    let dispatch_id: troupe_proto::DispatchId = id("00000000-0000-7000-8000-0000000000d1");
    let chain = ExecutionChain::start("supervisor").then("coder");
    let psid = "00000000-0000-7000-8000-0000000000e1".to_owned();
    vec![
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::TaskStarted {
                input: "/hub coder fix".into(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::RouteDecided {
                decision: RouteDecision::DispatchAgent,
                agent_id: Some("coder".into()),
                module: None,
                confidence: 1.0,
                source: RouteSource::Hub,
                reason: "/hub names `coder`".into(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::DispatchSent {
                dispatch_id,
                agent_id: "coder".into(),
                provider: ProviderKind::Model,
                provider_session_id: None,
                chain,
                lease_ttl_ms: 600_000,
                input: "fix".into(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::SessionCreated {
                agent_id: "coder".into(),
                provider: ProviderKind::Model,
                provider_session_id: psid.clone(),
                dispatch_id: Some(dispatch_id),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::SessionBound {
                agent_id: "coder".into(),
                provider: ProviderKind::Model,
                provider_session_id: psid.clone(),
                replaced: None,
                dispatch_id: Some(dispatch_id),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::DispatchResult {
                dispatch_id,
                agent_id: "coder".into(),
                provider_session_id: Some(psid),
                status: DispatchStatus::Ok,
                text: "fixed".into(),
                error: None,
                duration_ms: 12,
                validated: false,
            },
        ),
    ]
}

#[test]
fn agent_events_are_lines_of_their_own_with_the_agent_and_its_provider_session() {
    let mut ev = Events::new();
    let events = dispatch_events(&mut ev);
    let options = HistoryLogOptions::default().with_policy(id(CONV_A), StoragePolicy::Full);
    let mut log = HistoryLog::new(id(SESSION), options, 0);
    let mut out = Vec::new();
    for env in &events {
        log.on_event(env, &mut out);
    }
    let kinds: Vec<LineType> = out.iter().map(|l| l.kind).collect();
    use LineType::*;
    assert_eq!(
        kinds,
        [
            TurnStart,
            RouteDecided,
            DispatchSent,
            SessionCreated,
            SessionBound,
            DispatchResult
        ]
    );
    let psid = "00000000-0000-7000-8000-0000000000e1";
    for line in &out[1..] {
        assert_eq!(line.meta.agent_id.as_deref(), Some("coder"), "{line:?}");
        assert_eq!(line.meta.task_id, Some(id(TASK_A1)));
        assert_eq!(line.turn, 1);
    }
    for line in &out[3..] {
        assert_eq!(
            line.meta.provider_session_id.as_deref(),
            Some(psid),
            "{line:?}"
        );
    }
    assert_eq!(out[1].meta.decision.as_deref(), Some("dispatch_agent"));
    assert_eq!(out[1].meta.source.as_deref(), Some("hub"));
    assert_eq!(out[1].meta.confidence, Some(1.0));
    assert_eq!(
        out[2].meta.chain.as_deref(),
        Some(&["supervisor".to_owned(), "coder".to_owned()][..])
    );
    assert_eq!(out[2].content, "fix");
    assert_eq!(out[5].content, "fixed");
    assert_eq!(out[5].meta.outcome.as_deref(), Some("ok"));
    let json = serde_json::to_value(&out[5]).unwrap();
    assert_eq!(json["type"], "dispatch_result");
    assert_eq!(json["meta"]["agent_id"], "coder");
    assert_eq!(json["meta"]["provider_session_id"], psid);

    // Headers only: the same lines without their content, from the live events and from
    // the stored headers alike.
    let policy = StoragePolicy::HeadersOnly;
    let options = || HistoryLogOptions::default().with_policy(id(CONV_A), policy);
    let (mut live, mut stored) = (
        HistoryLog::new(id(SESSION), options(), 0),
        HistoryLog::new(id(SESSION), options(), 0),
    );
    let (mut from_live, mut from_stored) = (Vec::new(), Vec::new());
    for env in &events {
        live.on_event(env, &mut from_live);
        if let Some(record) = record_for(policy, env) {
            stored.on_record(&record, &mut from_stored);
        }
    }
    // What the headers do not keep: the chain and lease of a dispatch.
    let strip = |lines: Vec<HistoryLine>| -> Vec<HistoryLine> {
        lines
            .into_iter()
            .map(|mut l| {
                l.meta.chain = None;
                l.meta.extra.remove("lease_ttl_ms");
                l
            })
            .collect()
    };
    assert_eq!(from_live.len(), 6);
    assert_eq!(strip(from_stored), strip(from_live.clone()));
    assert!(
        from_live.iter().all(|l| !l.content.contains("fix")),
        "no content: {from_live:?}"
    );
}

/// An agent's tool calls: one refused by its policy, one that ran and failed.
fn governed_tool_events(ev: &mut Events) -> Vec<EventEnvelope> {
    use troupe_proto::agent::{ExecutionChain, PolicyReason};
    let call = |id: &str, name: &str| ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments: Json(serde_json::json!({"command": ["ls"]})),
    };
    let coder = Some("coder".to_owned());
    vec![
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::TaskStarted { input: "go".into() },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::ToolCallStarted {
                call: call("c1", "shell"),
                agent_id: coder.clone(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::PolicyRejected {
                agent_id: "coder".into(),
                chain: ExecutionChain::start("supervisor").then("coder"),
                reason: PolicyReason::ToolDenied,
                message: "tool `shell` is denied by agent `coder`'s blacklist (`shell`)".into(),
                tool: Some("shell".into()),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::ToolCallFinished {
                call_id: "c1".into(),
                name: "shell".into(),
                output: "policy rejected".into(),
                is_error: true,
                duration_ms: 0,
                agent_id: coder.clone(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::ToolCallStarted {
                call: call("c2", "update_plan"),
                agent_id: coder.clone(),
            },
        ),
        ev.task(
            CONV_A,
            TASK_A1,
            EventKind::ToolCallFinished {
                call_id: "c2".into(),
                name: "update_plan".into(),
                output: "ok".into(),
                is_error: false,
                duration_ms: 1,
                agent_id: coder,
            },
        ),
    ]
}

#[test]
fn tool_lines_carry_the_agent_and_the_seed_event_names() {
    let mut ev = Events::new();
    let events = governed_tool_events(&mut ev);
    for policy in [StoragePolicy::Full, StoragePolicy::HeadersOnly] {
        let options = || HistoryLogOptions::default().with_policy(id(CONV_A), policy);
        let (mut live, mut stored) = (
            HistoryLog::new(id(SESSION), options(), 0),
            HistoryLog::new(id(SESSION), options(), 0),
        );
        let (mut from_live, mut from_stored) = (Vec::new(), Vec::new());
        for env in &events {
            live.on_event(env, &mut from_live);
            if let Some(record) = record_for(policy, env) {
                stored.on_record(&record, &mut from_stored);
            }
        }
        for out in [&from_live, &from_stored] {
            let lines: Vec<serde_json::Value> = out
                .iter()
                .map(|l| serde_json::to_value(l).unwrap())
                .collect();
            let seen: Vec<(&str, &str, &str, &str)> = lines[1..]
                .iter()
                .map(|l| {
                    (
                        l["type"].as_str().unwrap(),
                        l["meta"]["event"].as_str().unwrap_or(""),
                        l["meta"]["agent_id"].as_str().unwrap(),
                        l["meta"]["tool"].as_str().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                seen,
                [
                    ("action", "tool_call", "coder", "shell"),
                    ("policy_rejected", "", "coder", "shell"),
                    ("observation", "tool_error", "coder", "shell"),
                    ("action", "tool_call", "coder", "update_plan"),
                    ("observation", "tool_result", "coder", "update_plan"),
                ],
                "{policy:?}"
            );
            for line in &lines[1..] {
                assert_eq!(line["meta"]["conversation_id"], CONV_A);
                assert_eq!(line["meta"]["task_id"], TASK_A1);
            }
            assert_eq!(lines[2]["meta"]["code"], "tool_denied");
        }
    }
}
