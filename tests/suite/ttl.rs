//! Ttl is a promise on disk (S10), end to end with the real binary: a canary written under a
//! `Ttl` policy is on disk until it is due, then a sweep planned from what is stored removes
//! it from every byte of every file under the data directory (databases, their WAL and
//! shared-memory files, rollout files, histories), while the headers stay. In `troupe serve`
//! the canary is in the conversation's instructions as well: they go with the rest. `troupe chat`
//! sweeps at the start of the next run; `troupe serve` sweeps at start-up and periodically
//! while it runs, for closed conversations too.

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RolloutRecord, read_records};
use troupe_proto::EventName;
use troupe_store::SqliteRolloutStorage;
use troupe_tests::{contains, troupe_bin};

use super::serve::{Api, id};

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The files under `dir` that hold `needle` anywhere in their bytes.
fn holding(dir: &Path, needle: &str) -> Vec<String> {
    files(dir)
        .into_iter()
        .filter(|p| std::fs::read(p).is_ok_and(|bytes| contains(&bytes, needle)))
        .map(|p| p.display().to_string())
        .collect()
}

/// Waits, at most `within`, until `now_ms()` reaches `due_ms` (times in the child processes
/// are real).
fn wait_until(due_ms: u64, within: Duration) {
    let started = Instant::now();
    while now_ms() < due_ms {
        assert!(
            started.elapsed() < within,
            "{due_ms} is not reached within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every record of every JSONL rollout file under `dir`.
fn jsonl_records(dir: &Path) -> Vec<RolloutRecord> {
    files(dir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .flat_map(|p| read_records(p).unwrap())
        .collect()
}

fn chat(dir: &Path, question: &str, policy: &str) {
    let data = dir.join("data");
    let out = Command::new(troupe_bin())
        .args(["chat", "--once", question, "--storage-policy", policy])
        .arg("--data-dir")
        .arg(&data)
        // The history goes under the data dir too, so the scan covers it.
        .arg("--log-dir")
        .arg(data.join("history"))
        .env_remove("TROUPE_SCRIPT")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("You said: {question}")
    );
}

#[test]
fn troupe_chat_ttl_content_is_gone_from_disk_after_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-CHAT-{}", now_ms());
    chat(dir.path(), &canary, "ttl:1");
    assert!(
        !holding(&data, &canary).is_empty(),
        "the canary must be on disk before its ttl passes"
    );
    let first = jsonl_records(&data.join("rollout"));
    let due = first
        .iter()
        .filter_map(|r| r.meta.expires_ms)
        .max()
        .expect("ttl records carry their expiry");
    assert!(
        first
            .iter()
            .filter(|r| r.level == RecordLevel::Full)
            .all(|r| r.meta.expires_ms.is_some()),
        "every Full record of a ttl run expires"
    );
    wait_until(due, Duration::from_secs(10));
    // Nothing swept it in between: nothing runs.
    assert!(!holding(&data, &canary).is_empty());

    // The next run sweeps what is due before it starts; its own content is not due for an hour.
    let later = format!("NOT-YET-DUE-{}", now_ms());
    chat(dir.path(), &later, "ttl:3600");
    let left = holding(&data, &canary);
    assert!(left.is_empty(), "the canary is still in {left:?}");
    assert!(
        !holding(&data, &later).is_empty(),
        "content not yet due stays"
    );

    // The first run's record keeps its headers: the same events, with sizes, no content.
    let after = jsonl_records(&data.join("rollout"));
    for record in &first {
        let now = after
            .iter()
            .find(|r| r.seq == record.seq && r.conversation_id == record.conversation_id)
            .unwrap_or_else(|| panic!("record {} ({}) is gone", record.seq, record.kind));
        assert_eq!(now.kind, record.kind);
        assert_ne!(now.level, RecordLevel::Full, "{}", now.kind);
        assert_eq!(now.meta.chars, record.meta.chars, "{}", now.kind);
    }
    let first_conversation = first
        .iter()
        .find(|r| r.kind == EventName::TaskFinished)
        .and_then(|r| r.conversation_id);
    let finished = after
        .iter()
        .find(|r| r.kind == EventName::TaskFinished && r.conversation_id == first_conversation)
        .unwrap();
    assert!(finished.event.is_none());
    assert_eq!(
        finished.meta.chars,
        Some(format!("You said: {canary}").len() as u64)
    );
}

/// `troupe acp` sweeps the data directory's rollout too before it serves: an editor that only
/// ever runs `troupe acp` does not keep `ttl` content past its expiry.
#[test]
fn troupe_acp_sweeps_due_content_before_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-ACP-{}", now_ms());
    chat(dir.path(), &canary, "ttl:1");
    let due = jsonl_records(&data.join("rollout"))
        .iter()
        .filter_map(|r| r.meta.expires_ms)
        .max()
        .expect("ttl records carry their expiry");
    wait_until(due, Duration::from_secs(10));
    assert!(!holding(&data, &canary).is_empty());
    // Its stdin closed at once: it starts, sweeps, serves nothing and ends.
    let out = Command::new(troupe_bin())
        .args(["acp", "--data-dir"])
        .arg(&data)
        .env_remove("TROUPE_SCRIPT")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let left = holding(&data, &canary);
    assert!(
        left.is_empty(),
        "the canary is still in {left:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `troupe serve` child over a persistent data dir.
struct Serve {
    child: Child,
    api: Api,
}

impl Serve {
    fn start(dir: &Path, sweep_interval: &str) -> Self {
        Self::start_with(dir, sweep_interval, &[])
    }

    fn start_with(dir: &Path, sweep_interval: &str, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(troupe_bin());
        command.envs(env.iter().copied());
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .env("TROUPE_TTL_SWEEP_INTERVAL", sweep_interval)
            .env_remove("TROUPE_API_TOKENS")
            .env_remove("TROUPE_SCRIPT")
            .env_remove("TROUPE_CONFIG")
            .current_dir(dir)
            .stderr(Stdio::null());
        let (child, base) = troupe_tests::spawn_serve(&mut command);
        Self {
            child,
            api: Api::new(&base, None),
        }
    }

    /// SIGTERM, then waits (boundedly) for a clean exit.
    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status:?}");
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "serve does not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens a `Ttl { secs }` conversation in a new session, with `text` in both its
/// instructions too, and says `text` in it; the session, the conversation, and when
/// everything written is due.
async fn say_in_ttl_conversation(api: &Api, secs: u64, text: &str) -> (String, String, u64) {
    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    let opened = api
        .call(
            "conversation.open",
            json!({
                "session_id": sid,
                "storage_policy": {"ttl": {"secs": secs}},
                "base_instructions": format!("base {text}"),
                "user_instructions": format!("user {text}"),
            }),
        )
        .await;
    let cid = id(&opened, "conversation_id");
    let (status, reply) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": text, "conversation_id": cid}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{reply}");
    assert_eq!(reply["reply"]["text"], format!("You said: {text}"));
    // The reply is stored last: everything of this turn was written at or before it.
    let created = reply["assistant"]["created_ms"].as_u64().unwrap();
    (sid, cid, created + secs * 1000)
}

async fn messages(api: &Api, sid: &str) -> Vec<Value> {
    let (status, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{page}");
    page["messages"].as_array().unwrap().clone()
}

/// Polls, at most `within`, until no file under `dir` holds `needle`.
async fn wait_gone(dir: &Path, needle: &str, within: Duration) {
    let started = Instant::now();
    loop {
        let left = holding(dir, needle);
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < within,
            "still in {left:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls, at most `within`, until some file under `dir` holds `needle`.
async fn wait_written(dir: &Path, needle: &str, within: Duration) {
    let started = Instant::now();
    while holding(dir, needle).is_empty() {
        assert!(started.elapsed() < within, "{needle} never reached disk");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_serve_sweeps_due_content_at_start_up_including_closed_conversations() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-SERVE-RESTART-{}", now_ms());
    // No periodic sweep within the test: only the start-up sweep can remove it.
    let serve = Serve::start(dir.path(), "1h");
    let (sid, cid, due) = say_in_ttl_conversation(&serve.api, 1, &canary).await;
    serve
        .api
        .call(
            "conversation.close",
            json!({"session_id": sid, "conversation_id": cid}),
        )
        .await;
    wait_written(&data, &canary, Duration::from_secs(10)).await;
    wait_until(due, Duration::from_secs(10));
    serve.stop();
    assert!(
        !holding(&data, &canary).is_empty(),
        "nothing swept it while serve ran: it must still be on disk"
    );

    let serve = Serve::start(dir.path(), "1h");
    let left = holding(&data, &canary);
    assert!(left.is_empty(), "the start-up sweep left it in {left:?}");
    let stored = messages(&serve.api, &sid).await;
    let ttl_messages: Vec<&Value> = stored
        .iter()
        .filter(|m| m["conversation_id"] == cid.as_str())
        .collect();
    assert_eq!(ttl_messages.len(), 2, "{stored:?}");
    for m in &ttl_messages {
        assert!(m["content"].is_null(), "{m}");
    }
    assert_eq!(ttl_messages[0]["chars"], canary.len());
    assert_eq!(
        ttl_messages[1]["chars"],
        format!("You said: {canary}").len()
    );
    serve.stop();

    // The rollout kept the events' headers.
    let rollout = SqliteRolloutStorage::open(data.join("rollout.db")).unwrap();
    let records = rollout
        .read_conversation(sid.parse().unwrap(), cid.parse().unwrap())
        .unwrap();
    let kinds: Vec<&str> = records.iter().map(|r| r.kind.as_str()).collect();
    for kind in ["task_started", "task_finished", "conversation_closed"] {
        assert!(kinds.contains(&kind), "{kinds:?}");
    }
    assert!(records.iter().all(|r| r.level == RecordLevel::Headers));
    let started = records
        .iter()
        .find(|r| r.kind == EventName::TaskStarted)
        .unwrap();
    assert_eq!(started.meta.chars, Some(canary.len() as u64));
}

/// A context changed after a running service swept a Ttl conversation's instructions writes
/// the conversation again without them: the service's own copy of its parameters does not
/// put dropped content back on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_changed_after_the_sweep_does_not_write_the_instructions_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-SERVE-CONTEXT-{}", now_ms());
    // Sweeps 2 s apart: the check below comes well within one interval of the change.
    let serve = Serve::start(dir.path(), "2s");
    let (sid, cid, due) = say_in_ttl_conversation(&serve.api, 1, &canary).await;
    wait_written(&data, &canary, Duration::from_secs(10)).await;
    wait_gone(&data, &canary, Duration::from_secs(20)).await;
    assert!(now_ms() >= due, "swept before it was due");
    serve
        .api
        .call(
            "conversation.setContext",
            json!({"session_id": sid, "conversation_id": cid, "include_plan_tool": true}),
        )
        .await;
    let left = holding(&data, &canary);
    assert!(
        left.is_empty(),
        "the changed context wrote it back to {left:?}"
    );
    let listed = serve
        .api
        .call("conversation.list", json!({"session_id": sid}))
        .await;
    let conversation = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation_id"] == cid.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        conversation["params"]["include_plan_tool"], true,
        "{conversation}"
    );
    assert!(
        conversation["params"]["base_instructions"].is_null(),
        "{conversation}"
    );
    serve.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_serve_sweeps_due_content_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-SERVE-LIVE-{}", now_ms());
    let serve = Serve::start(dir.path(), "200ms");
    let (sid, cid, due) = say_in_ttl_conversation(&serve.api, 5, &canary).await;
    // Until it is due it stays, whatever the sweeps that run meanwhile do.
    wait_written(&data, &canary, Duration::from_secs(4)).await;
    wait_gone(&data, &canary, Duration::from_secs(20)).await;
    assert!(now_ms() >= due, "swept before it was due");
    // The session and its conversation go on, with the headers of what was swept.
    let stored = messages(&serve.api, &sid).await;
    let swept: Vec<&Value> = stored
        .iter()
        .filter(|m| m["conversation_id"] == cid.as_str())
        .collect();
    assert_eq!(swept.len(), 2);
    assert!(
        swept
            .iter()
            .all(|m| m["content"].is_null() && m["chars"].as_u64() > Some(0))
    );
    let (status, reply) = serve
        .api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "still here", "conversation_id": cid}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{reply}");
    serve.stop();
}

/// A running `troupe chat` REPL sweeps every `ttl_sweep_interval`: its own session's content
/// goes once due while the REPL lives, and the session goes on writing to the swept file.
#[test]
fn a_running_troupe_chat_sweeps_its_own_due_content() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-REPL-{}", now_ms());
    let mut cmd = Command::new(troupe_bin());
    cmd.args(["chat", "--storage-policy", "ttl:3", "--data-dir"])
        .arg(&data)
        .arg("--log-dir")
        .arg(data.join("history"))
        .env("TROUPE_TTL_SWEEP_INTERVAL", "200ms")
        .env("TERM", "xterm")
        .env_remove("TROUPE_SCRIPT")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir.path());
    let mut p = rexpect::session::spawn_command(cmd, Some(20_000)).unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line(&canary).unwrap();
    p.exp_string(&format!("You said: {canary}")).unwrap();
    p.exp_string("[1]> ").unwrap();
    // The reply is shown from live events, published once committed: it is on disk now.
    assert!(
        !holding(&data, &canary).is_empty(),
        "the canary must be on disk before its ttl passes"
    );
    let due = jsonl_records(&data.join("rollout"))
        .iter()
        .filter_map(|r| r.meta.expires_ms)
        .max()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !holding(&data, &canary).is_empty() {
        assert!(Instant::now() < deadline, "the running chat never swept it");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(now_ms() >= due, "swept before it was due");
    // The session writes on after the sweep replaced its file.
    p.send_line("after the sweep").unwrap();
    p.exp_string("You said: after the sweep").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    let records = jsonl_records(&data.join("rollout"));
    let mut seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), records.len(), "no record twice");
    assert!(
        records.iter().any(|r| r
            .event
            .as_ref()
            .is_some_and(|e| format!("{e:?}").contains("after the sweep"))),
        "the line written after the sweep is in the file"
    );
}

/// No instruction text is stored against the policy: conversations opened under `none` and
/// `headers_only` with a canary in both instruction fields run a turn, and once the service
/// stopped no byte of any file under its directory (store, WAL, rollout, histories) holds
/// their canaries, while the canaries of a `full` conversation are there (the scan sees
/// them). Restarted, the `none` conversation is open again without its instructions and
/// still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_serve_stores_no_instructions_under_none_or_headers_only() {
    let dir = tempfile::tempdir().unwrap();
    let stamp = now_ms();
    let serve = Serve::start(dir.path(), "1h");
    let sid = id(&serve.api.session(None).await, "session_id");
    let mut opened = Vec::new();
    for policy in ["none", "headers_only", "full"] {
        let base = format!("CANARY-BASE-{policy}-{stamp}");
        let user = format!("CANARY-USER-{policy}-{stamp}");
        let c = serve
            .api
            .call(
                "conversation.open",
                json!({
                    "session_id": sid,
                    "storage_policy": policy,
                    "base_instructions": base,
                    "user_instructions": user,
                }),
            )
            .await;
        let cid = id(&c, "conversation_id");
        let (status, reply) = serve
            .api
            .post(
                &format!("/api/sessions/{sid}/messages"),
                json!({"text": format!("hello {policy}"), "conversation_id": cid}),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::OK, "{reply}");
        assert_eq!(reply["reply"]["status"], "ok", "{reply}");
        opened.push((policy, cid, base, user));
    }
    serve.stop();

    for (policy, _, base, user) in &opened {
        for canary in [base, user] {
            let found = holding(dir.path(), canary);
            if *policy == "full" {
                assert!(!found.is_empty(), "{canary} must be on disk under full");
            } else {
                assert!(found.is_empty(), "{canary} is in {found:?}");
            }
        }
    }

    let serve = Serve::start(dir.path(), "1h");
    let (_, none_cid, _, _) = &opened[0];
    let listed = serve
        .api
        .call("conversation.list", json!({"session_id": sid}))
        .await;
    let none = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation_id"] == *none_cid)
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(none["state"], "open", "{none}");
    assert_eq!(none["params"]["base_instructions"], Value::Null, "{none}");
    assert_eq!(none["params"]["user_instructions"], Value::Null, "{none}");
    let (status, reply) = serve
        .api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "again", "conversation_id": none_cid}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{reply}");
    assert_eq!(reply["reply"]["text"], "You said: again", "{reply}");
    serve.stop();
}

/// A history summary carries excerpts of the messages it replaced, so under `ttl` its records
/// are due when the oldest of those messages is, not a ttl after the summary was written:
/// the canary's turn is trimmed into the summary two seconds after it was said, and the
/// summary's records are due with the canary's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_of_ttl_content_is_due_with_that_content() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let canary = format!("CANARY-SUMMARY-{}", now_ms());
    let serve = Serve::start_with(
        dir.path(),
        "200ms",
        &[
            ("TROUPE_HISTORY_MAX_ITEMS", "2"),
            ("TROUPE_SUMMARIZER", "local"),
        ],
    );
    let (sid, cid, due) = say_in_ttl_conversation(&serve.api, 6, &canary).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, reply) = serve
        .api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "later", "conversation_id": cid}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{reply}");

    let rollout = SqliteRolloutStorage::open(data.join("rollout.db")).unwrap();
    let t0 = Instant::now();
    let summaries = loop {
        let records = rollout
            .read_conversation(sid.parse().unwrap(), cid.parse().unwrap())
            .unwrap();
        let summaries: Vec<RolloutRecord> = records
            .into_iter()
            .filter(|r| {
                matches!(
                    r.kind,
                    EventName::HistoryTrimmed | EventName::HistoryCheckpoint
                )
            })
            .filter(|r| serde_json::to_string(&r.event).unwrap().contains(&canary))
            .collect();
        if summaries.len() >= 2 {
            break summaries;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no summary of the canary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for r in &summaries {
        let expires = r.meta.expires_ms.unwrap();
        assert!(r.ts_ms + 6000 > due + 1000, "written well after the canary");
        assert!(
            expires <= due,
            "{:?} due at {expires}, the canary at {due}",
            r.kind
        );
    }
    // And the sweep takes it from every file once due.
    wait_gone(&data, &canary, Duration::from_secs(30)).await;
    assert!(now_ms() >= due, "swept before it was due");
    serve.stop();
}
