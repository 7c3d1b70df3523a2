//! Tool governance and the output guardrail, per call; prints a table.
//!
//!     cargo bench -p troupe-tests --bench governance
//!
//! - policy: the effective policy of a task (computed once per task) from four layers and a
//!   dispatcher's policy, and the decision for one tool call against it (allowed, denied by
//!   a blacklist, left out by a whitelist, needing a token), next to an open policy;
//! - tokens: one use counted by the token book over the in-memory store (the actor round
//!   trip and the compare-and-set), and over SQLite (a durable write per use);
//! - guardrail: compiling an output schema (once per task) and checking one answer (extract
//!   from prose, repair, validate, mask), valid and invalid.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::governance::guardrail::OutputGuard;
use troupe_actors::governance::{AgentLayer, ToolPolicy, task_policy, token_digest};
use troupe_actors::token_book::{self, ConsumeRequest};
use troupe_proto::agent::{GuardrailAction, OutputSpec, ToolRules};
use troupe_proto::governance::{IssueToken, TokenScope, ToolPolicyConfig};

fn rules(white: &[&str], black: &[&str], auth: &[&str]) -> ToolRules {
    let v = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
    ToolRules {
        whitelist: v(white),
        blacklist: v(black),
        authorization_required: v(auth),
    }
}

/// Median and p99 of `batches` timings of `per_batch` runs of `f`, per run.
fn measure(batches: usize, per_batch: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        times.push(t.elapsed() / u32::try_from(per_batch).unwrap());
    }
    times.sort();
    (times[batches / 2], times[(batches * 99) / 100])
}

fn row(what: &str, (p50, p99): (Duration, Duration), note: &str) {
    println!("| {what} | {p50:.2?} | {p99:.2?} | {note} |");
}

fn config() -> ToolPolicyConfig {
    ToolPolicyConfig {
        whitelist: Vec::new(),
        blacklist: vec![
            "files__delete_*".into(),
            "*__drop_*".into(),
            "git__push".into(),
        ],
        authorization_required: vec!["shell".into()],
        roles: [(
            "executor".to_owned(),
            rules(
                &[
                    "shell",
                    "apply_patch",
                    "update_plan",
                    "files__*",
                    "git__*",
                    "dispatch_agent",
                ],
                &["git__reset"],
                &[],
            ),
        )]
        .into(),
    }
}

fn main() {
    println!("| measure | p50 | p99 | note |");
    println!("|---|---:|---:|---|");
    let config = config();
    let agent_rules = rules(&[], &["apply_patch"], &["files__write_*"]);
    let request = rules(&["shell", "files__*", "update_plan"], &[], &[]);
    let parent = task_policy(&config, None, Some(&rules(&[], &["web_*"], &[])), None);
    let agent = AgentLayer {
        id: "coder",
        role: "executor",
        tools: &agent_rules,
    };
    row(
        "effective policy of a task",
        measure(200, 1_000, || {
            black_box(task_policy(
                black_box(&config),
                Some(agent),
                Some(&request),
                Some(&parent),
            ));
        }),
        "4 layers + a dispatcher's policy, 17 patterns; once per task",
    );
    let policy = task_policy(&config, Some(agent), Some(&request), Some(&parent));
    let open = ToolPolicy::open();
    for (tool, note) in [
        ("files__read_file", "allowed: every clause passes"),
        ("shell", "allowed, needs a token"),
        (
            "files__delete_file",
            "denied by the global blacklist (first clause)",
        ),
        ("apply_patch", "denied by the agent's blacklist"),
        ("github__create_issue", "left out by the role's whitelist"),
    ] {
        row(
            &format!("decide `{tool}`"),
            measure(200, 10_000, || {
                black_box(policy.decide(black_box(tool)));
            }),
            note,
        );
    }
    row(
        "decide, open policy",
        measure(200, 10_000, || {
            black_box(open.decide(black_box("files__read_file")));
        }),
        "no `[tools]`, no agent rules: the default",
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in [
        (
            "memory",
            Arc::new(troupe_store::memory::MemoryStore::new()) as Arc<dyn troupe_store::TokenStore>,
        ),
        (
            "sqlite",
            Arc::new(troupe_store::SqliteStore::open_in(dir.path()).unwrap())
                as Arc<dyn troupe_store::TokenStore>,
        ),
    ] {
        let uses = 5_000u32;
        let timings = runtime.block_on(async {
            let book = token_book::spawn(store).await.unwrap();
            let issued = token_book::issue(
                &book,
                IssueToken {
                    scope: TokenScope {
                        agent: "coder".into(),
                        tool: "shell".into(),
                        args: Some("git *".into()),
                        fields: Default::default(),
                    },
                    ttl_secs: 3600,
                    max_uses: uses,
                    issued_by: None,
                },
            )
            .await
            .unwrap();
            let request = ConsumeRequest {
                digests: vec![token_digest(&issued.token)],
                agent: Some("coder".into()),
                tool: "shell".into(),
                command: Some("git status -s".into()),
                arguments: serde_json::json!({"command": ["git", "status", "-s"]}),
            };
            let mut times = Vec::new();
            for _ in 0..uses {
                let t = Instant::now();
                token_book::consume(&book, request.clone()).await.unwrap();
                times.push(t.elapsed());
            }
            times.sort();
            (times[times.len() / 2], times[(times.len() * 99) / 100])
        });
        row(
            &format!("token use ({name} store)"),
            timings,
            "the book's round trip, the check, the counted use",
        );
    }

    let spec = OutputSpec {
        schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "email": {"type": "string", "format": "email"},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "string"}, "w": {"type": "number"}}, "required": ["t"]}},
                "lang": {"type": "string", "default": "en"}
            },
            "required": ["name", "age"]
        }),
        on_failure: GuardrailAction::Reject,
        max_retries: 2,
    };
    row(
        "compile an output schema",
        measure(100, 100, || {
            black_box(OutputGuard::compile(black_box(&spec)).unwrap());
        }),
        "5 properties, nested items; once per task",
    );
    let guard = OutputGuard::compile(&spec).unwrap();
    let valid = r#"Here is the profile you asked for:
```json
{"name": "Ada Lovelace", "age": "36", "email": "ada@example.com", "ssn": "123-45-6789",
 "tags": [{"t": "math", "w": 0.9, "x": 1}, {"t": "poetry"}]}
```
Let me know if you need more."#;
    let invalid = r#"{"name": "Ada", "age": "old", "tags": [{"w": "heavy"}]}"#;
    row(
        "check a valid answer",
        measure(200, 1_000, || {
            black_box(guard.check(black_box(valid)));
        }),
        "~250 B of prose around a fenced block: extract, repair (\"36\"), validate, mask",
    );
    row(
        "check an invalid answer",
        measure(200, 1_000, || {
            black_box(guard.check(black_box(invalid)));
        }),
        "3 problems collected",
    );
}
