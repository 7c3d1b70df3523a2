//! Authorization tokens (A5): a tool listed `authorizationRequired` runs only with a valid
//! token a person issued, scoped to an agent, a tool and optionally its arguments, with a TTL
//! and a number of uses counted once each by the process's token book, in the store (a
//! restart gives no use back), revocable, and never written anywhere in clear.

use super::tool_refusals;
use crate::suite::agents::{Extras, Team, model_agent};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use troupe_actors::clock::WallClock;
use troupe_actors::token_book::{self, ConsumeRequest, TokenBookRef};
use troupe_proto::agent::{AgentDefinition, PolicyReason, ToolRules};
use troupe_proto::governance::{IssueToken, IssuedToken, MessageOptions, TokenRefusal, TokenScope};
use troupe_proto::{EventKind, MessageReply};
use troupe_runtime::ScriptedReply;
use troupe_store::TokenStore;
use troupe_store::memory::MemoryStore;

fn issue_for(
    agent: &str,
    tool: &str,
    args: Option<&str>,
    ttl_secs: u64,
    max_uses: u32,
) -> IssueToken {
    IssueToken {
        scope: TokenScope {
            agent: agent.into(),
            tool: tool.into(),
            args: args.map(str::to_owned),
            fields: Default::default(),
        },
        ttl_secs,
        max_uses,
        issued_by: Some("ann".into()),
    }
}

fn consume_for(secret: &str, agent: &str, tool: &str) -> ConsumeRequest {
    ConsumeRequest {
        digests: vec![troupe_actors::governance::token_digest(secret)],
        agent: Some(agent.into()),
        tool: tool.into(),
        command: (tool == "shell").then(|| "echo hi".to_owned()),
        arguments: json!({"command": ["echo", "hi"]}),
    }
}

async fn book_rules(store: Arc<dyn TokenStore>) {
    let book = token_book::spawn(store.clone()).await.unwrap();
    let issued = token_book::issue(&book, issue_for("coder", "shell", None, 60, 3))
        .await
        .unwrap();
    let kept = store.tokens().await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_ne!(kept[0].digest, issued.token, "only the digest is kept");
    assert!(!format!("{kept:?}").contains(&issued.token));
    // Ten calls at once, three uses: exactly three go through.
    let asks =
        (0..10).map(|_| token_book::consume(&book, consume_for(&issued.token, "coder", "shell")));
    let answers = futures::future::join_all(asks).await;
    assert_eq!(
        answers.iter().filter(|a| a.is_ok()).count(),
        3,
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .filter_map(|a| a.as_ref().err())
            .all(|r| *r == TokenRefusal::Exhausted)
    );
    assert_eq!(store.tokens().await.unwrap()[0].uses, 3);
    assert_eq!(
        token_book::consume(&book, consume_for("tat_nothing", "coder", "shell")).await,
        Err(TokenRefusal::Unknown)
    );
    // Revoked: nothing more.
    let other = token_book::issue(&book, issue_for("*", "files__*", None, 60, 5))
        .await
        .unwrap();
    assert!(
        token_book::consume(&book, consume_for(&other.token, "x", "files__read"))
            .await
            .is_ok()
    );
    assert_eq!(
        token_book::consume(&book, consume_for(&other.token, "x", "shell")).await,
        Err(TokenRefusal::OutOfScope)
    );
    let revoked = token_book::revoke(&book, other.info.id.clone())
        .await
        .unwrap();
    assert!(revoked.revoked_ms.is_some());
    assert_eq!(
        token_book::consume(&book, consume_for(&other.token, "x", "files__read")).await,
        Err(TokenRefusal::Revoked)
    );
    // Another tool's arguments are scoped field by field: the right text elsewhere in them
    // covers nothing.
    let mut scoped = issue_for("*", "files__write", None, 60, 5);
    scoped.scope.fields = [("path".to_owned(), "notes/*".to_owned())].into();
    let scoped = token_book::issue(&book, scoped).await.unwrap();
    let write = |arguments: serde_json::Value| ConsumeRequest {
        arguments,
        command: None,
        ..consume_for(&scoped.token, "x", "files__write")
    };
    assert!(
        token_book::consume(&book, write(json!({"path": "notes/a.md"})))
            .await
            .is_ok()
    );
    for outside in [
        json!({"path": "/home/u/.bashrc", "x": {"path": "notes/"}}),
        json!({"path": "notes/../../.bashrc"}),
        json!({"content": "\"path\":\"notes/x"}),
    ] {
        assert_eq!(
            token_book::consume(&book, write(outside.clone())).await,
            Err(TokenRefusal::OutOfScope),
            "{outside}"
        );
    }
    // A token stored with a pattern over another tool's whole arguments (the old form) is
    // refused for what it is, never read as covering any arguments.
    let mut old = store
        .token_by_digest(&troupe_actors::governance::token_digest(&scoped.token))
        .await
        .unwrap()
        .unwrap();
    old.id = "old".into();
    old.digest = troupe_actors::governance::token_digest("tat_old");
    old.scope.fields.clear();
    old.scope.args = Some(r#"*"path":"notes/*"#.into());
    store.insert_token(old).await.unwrap();
    let old_call = ConsumeRequest {
        arguments: json!({"path": "notes/a.md"}),
        command: None,
        ..consume_for("tat_old", "x", "files__write")
    };
    assert_eq!(
        token_book::consume(&book, old_call).await,
        Err(TokenRefusal::Obsolete)
    );
    // Bad requests are refused with what is wrong.
    for bad in [
        issue_for("*", "files__write", Some(r#"*"path":"notes/*"#), 60, 1),
        issue_for("*", "*", Some("git status*"), 60, 1),
        issue_for("no spaces", "shell", None, 60, 1),
        issue_for("a", "shell", None, 60, 0),
        issue_for("a", "a b", None, 60, 1),
        issue_for("a", "shell", None, 0, 1),
    ] {
        let answer = token_book::issue(&book, bad.clone()).await;
        assert!(
            matches!(answer, Err(troupe_proto::AgentError::InvalidInput { .. })),
            "{bad:?}: {answer:?}"
        );
    }
    assert!(
        token_book::revoke(&book, "no-such-token".into())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn the_book_counts_each_use_once_in_memory() {
    book_rules(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn the_book_counts_each_use_once_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    book_rules(Arc::new(
        troupe_store::SqliteStore::open_in(dir.path()).unwrap(),
    ))
    .await;
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    let now = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
    let clock = {
        let now = now.clone();
        WallClock::from_fn(move || now.load(std::sync::atomic::Ordering::SeqCst))
    };
    let book = token_book::spawn_with_clock(Arc::new(MemoryStore::new()), clock)
        .await
        .unwrap();
    let issued = token_book::issue(&book, issue_for("coder", "shell", None, 60, 5))
        .await
        .unwrap();
    assert!(
        token_book::consume(&book, consume_for(&issued.token, "coder", "shell"))
            .await
            .is_ok()
    );
    now.fetch_add(60_000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        token_book::consume(&book, consume_for(&issued.token, "coder", "shell")).await,
        Err(TokenRefusal::Expired)
    );
}

/// A token's TTL is a date: the book reads the wall clock, not tokio's monotonic one (which
/// stops while the machine is suspended, and here moves while the wall does not).
#[tokio::test(start_paused = true)]
async fn a_tokens_expiry_follows_the_wall_clock() {
    let book = token_book::spawn(Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let issued = token_book::issue(&book, issue_for("coder", "shell", None, 60, 5))
        .await
        .unwrap();
    let wall = troupe_actors::clock::unix_now_ms();
    assert!(
        issued.info.expires_ms.abs_diff(wall + 60_000) < 5_000,
        "{} vs {wall}",
        issued.info.expires_ms
    );
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(
        token_book::consume(&book, consume_for(&issued.token, "coder", "shell"))
            .await
            .is_ok(),
        "an hour of tokio's time is not an hour of the wall's"
    );
}

fn guarded(mut def: AgentDefinition) -> AgentDefinition {
    def.tools = ToolRules {
        authorization_required: vec!["shell".into()],
        ..ToolRules::default()
    };
    def
}

fn echo(word: &str) -> ScriptedReply {
    ScriptedReply::tool("shell", json!({"command": ["echo", word]}))
}

/// Commands run for real, without asking.
fn runs_commands(config: &mut troupe_actors::SessionConfig) {
    config.conversation.shell_tool = true;
    config.conversation.approval_policy = troupe_proto::ApprovalPolicy::Never;
    config.conversation.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
}

async fn send(team: &Team, text: &str, tokens: &[&str]) -> MessageReply {
    let root = team.session.root().await.unwrap();
    let options = MessageOptions {
        tools: None,
        authorization: tokens.iter().map(|t| (*t).to_owned()).collect(),
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        team.session.message_with(root, text, options),
    )
    .await
    .unwrap()
    .unwrap()
}

/// Outputs of finished shell calls.
fn shell_outputs(events: &[EventKind]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::ToolCallFinished { name, output, .. } if name == "shell" => {
                Some(output.clone())
            }
            _ => None,
        })
        .collect()
}

async fn team_with_book(
    defs: Vec<AgentDefinition>,
    replies: Vec<ScriptedReply>,
) -> (Team, TokenBookRef) {
    team_with_book_and(defs, replies, runs_commands).await
}

/// A team whose session runs commands and has a token book, its configuration set by `tweak`.
async fn team_with_book_and(
    defs: Vec<AgentDefinition>,
    replies: Vec<ScriptedReply>,
    tweak: fn(&mut troupe_actors::SessionConfig),
) -> (Team, TokenBookRef) {
    let book = token_book::spawn(Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let team = Team::start_extra(
        defs,
        replies,
        tweak,
        Extras {
            token_book: Some(book.clone()),
            exec: true,
            ..Default::default()
        },
    )
    .await;
    (team, book)
}

#[tokio::test]
async fn a_tool_that_needs_a_token_runs_only_with_a_valid_one_for_its_agent_tool_and_arguments() {
    let (team, book) = team_with_book(
        vec![guarded(model_agent("coder", "You run commands.", &[]))],
        vec![
            echo("first"),
            ScriptedReply::text("one"),
            echo("second"),
            ScriptedReply::text("two"),
            echo("third"),
            ScriptedReply::text("three"),
            ScriptedReply::tool("shell", json!({"command": ["rm", "-rf", "x"]})),
            ScriptedReply::text("four"),
        ],
    )
    .await;
    let IssuedToken { token, .. } =
        token_book::issue(&book, issue_for("coder", "shell", Some("echo *"), 600, 1))
            .await
            .unwrap();
    let second = token_book::issue(&book, issue_for("coder", "shell", Some("echo *"), 600, 5))
        .await
        .unwrap()
        .token;
    // Without a token: refused, nothing ran.
    assert_eq!(send(&team, "/hub coder say first", &[]).await.text, "one");
    // With one: it runs, and the one use is spent.
    assert_eq!(
        send(&team, "/hub coder say second", &[&token]).await.text,
        "two"
    );
    assert_eq!(
        send(&team, "/hub coder say third", &[&token]).await.text,
        "three"
    );
    // Another token, but for other arguments.
    assert_eq!(
        send(&team, "/hub coder clean", &[&second]).await.text,
        "four"
    );

    let events = team.events().await;
    let outputs = shell_outputs(&events);
    assert_eq!(outputs.len(), 4, "{outputs:?}");
    assert!(outputs[1].contains("second"), "it ran: {outputs:?}");
    let refusals = tool_refusals(&events);
    let got: Vec<(&str, PolicyReason, bool)> = refusals
        .iter()
        .map(|(agent, tool, reason, message)| {
            assert_eq!((agent.as_str(), tool.as_str()), ("coder", "shell"));
            (
                message.as_str(),
                *reason,
                message.contains("the agent layer requires one"),
            )
        })
        .map(|(m, r, layer)| {
            let why = if m.contains("no token was presented") {
                "missing"
            } else if m.contains("spent") {
                "spent"
            } else if m.contains("covers this agent, tool and arguments") {
                "scope"
            } else {
                m
            };
            (why, r, layer)
        })
        .collect();
    assert_eq!(
        got,
        [
            ("missing", PolicyReason::Unauthorized, true),
            ("spent", PolicyReason::Unauthorized, true),
            ("scope", PolicyReason::Unauthorized, true),
        ]
    );
    for output in [&outputs[0], &outputs[2], &outputs[3]] {
        assert!(
            output.contains("policy rejected (unauthorized)"),
            "{output}"
        );
    }
    // The token appears in no event.
    let all = format!("{events:?}");
    assert!(!all.contains(&token) && !all.contains(&second));
}

#[tokio::test]
async fn a_token_presented_to_the_dispatcher_authorizes_its_sub_agents_call() {
    let (team, book) = team_with_book(
        vec![
            model_agent("lead", "You lead.", &["coder"]),
            guarded(model_agent("coder", "You run commands.", &[])),
        ],
        vec![
            ScriptedReply::tool(
                "dispatch_agent",
                json!({"agent_id": "coder", "input": "say hi"}),
            ),
            echo("delegated"),
            ScriptedReply::text("said it"),
            ScriptedReply::text("done"),
        ],
    )
    .await;
    let token = token_book::issue(&book, issue_for("coder", "shell", None, 600, 1))
        .await
        .unwrap()
        .token;
    assert_eq!(send(&team, "/hub lead go", &[&token]).await.text, "done");
    let events = team.events().await;
    assert!(
        tool_refusals(&events).is_empty(),
        "{:?}",
        tool_refusals(&events)
    );
    assert!(shell_outputs(&events)[0].contains("delegated"));
    let listed = token_book::list(&book).await.unwrap();
    assert_eq!(listed[0].uses, 1);
}

/// Commands run for real once a human approves each.
fn asks_for_commands(config: &mut troupe_actors::SessionConfig) {
    config.conversation.shell_tool = true;
    config.conversation.approval_policy = troupe_proto::ApprovalPolicy::Always;
    config.conversation.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
}

#[tokio::test]
async fn a_use_is_spent_when_governance_lets_the_call_through_even_if_a_human_then_denies_it() {
    let (team, book) = team_with_book_and(
        vec![guarded(model_agent("coder", "You run commands.", &[]))],
        vec![echo("asked"), ScriptedReply::text("denied it")],
        asks_for_commands,
    )
    .await;
    let token = token_book::issue(&book, issue_for("coder", "shell", None, 600, 2))
        .await
        .unwrap()
        .token;
    let session = team.session.clone();
    let root = session.root().await.unwrap();
    let options = MessageOptions {
        tools: None,
        authorization: vec![token.clone()],
    };
    let task = tokio::spawn(async move {
        session
            .message_with(root, "/hub coder say asked", options)
            .await
    });
    let pending = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(p) = team
                .session
                .pending_approvals()
                .await
                .unwrap()
                .into_iter()
                .next()
            {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the command waits for a human");
    assert_eq!(pending.command, ["echo", "asked"]);
    team.session
        .respond_approval(
            pending.approval_id,
            troupe_proto::ApprovalDecision::Deny { reason: None },
        )
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.text, "denied it");
    // One of the two uses went to the denied call: one is left.
    assert!(
        token_book::consume(&book, consume_for(&token, "coder", "shell"))
            .await
            .is_ok()
    );
    assert_eq!(
        token_book::consume(&book, consume_for(&token, "coder", "shell")).await,
        Err(TokenRefusal::Exhausted)
    );
    let outputs = shell_outputs(&team.events().await);
    assert!(
        outputs.iter().all(|o| !o.contains("asked\n")),
        "nothing ran: {outputs:?}"
    );
}

/// Of the tokens a message presents, the first (in the order presented) that covers a call
/// is the one whose use is spent: a narrow single-use token listed second is kept for later.
#[tokio::test]
async fn the_first_presented_token_that_covers_a_call_is_spent() {
    let (team, book) = team_with_book(
        vec![guarded(model_agent("coder", "You run commands.", &[]))],
        vec![
            echo("one"),
            ScriptedReply::text("one"),
            echo("two"),
            ScriptedReply::text("two"),
        ],
    )
    .await;
    let a = token_book::issue(&book, issue_for("coder", "shell", Some("echo *"), 600, 5))
        .await
        .unwrap();
    let b = token_book::issue(&book, issue_for("coder", "shell", Some("echo *"), 600, 5))
        .await
        .unwrap();
    let uses = || async {
        let listed = token_book::list(&book).await.unwrap();
        let of = |id: &str| listed.iter().find(|t| t.id == id).unwrap().uses;
        (of(&a.info.id), of(&b.info.id))
    };
    assert_eq!(
        send(&team, "/hub coder say one", &[&b.token, &a.token])
            .await
            .text,
        "one"
    );
    assert_eq!(uses().await, (0, 1), "b was presented first");
    assert_eq!(
        send(&team, "/hub coder say two", &[&a.token, &b.token])
            .await
            .text,
        "two"
    );
    assert_eq!(uses().await, (1, 1), "then a");
}

/// A call that cannot run (a tool nobody offered, a shell command that is not an array of
/// strings) is refused before any token is used: only the call that runs spends one.
#[tokio::test]
async fn a_call_refused_for_its_name_or_arguments_spends_no_use() {
    let mut coder = model_agent("coder", "You run commands.", &[]);
    coder.tools = ToolRules {
        authorization_required: vec!["*".into()],
        ..ToolRules::default()
    };
    let (team, book) = team_with_book(
        vec![coder],
        vec![
            ScriptedReply::tool("shell", json!({"command": "echo as a string"})),
            ScriptedReply::tool("made_up", json!({})),
            echo("ran"),
            ScriptedReply::text("done"),
        ],
    )
    .await;
    let issued = token_book::issue(&book, issue_for("coder", "*", None, 600, 2))
        .await
        .unwrap();
    assert_eq!(
        send(&team, "/hub coder go", &[&issued.token]).await.text,
        "done"
    );
    let outputs = shell_outputs(&team.events().await);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(outputs[0].contains("array of strings"), "{outputs:?}");
    assert!(outputs[1].contains("ran"), "it ran: {outputs:?}");
    let listed = token_book::list(&book).await.unwrap();
    assert_eq!(listed[0].uses, 1, "only the call that ran used the token");
}

fn runs_commands_with_a_capability(config: &mut troupe_actors::SessionConfig) {
    runs_commands(config);
    let capability = troupe_proto::capability::Capability {
        module: troupe_proto::capability::CapabilityModule {
            id: "greet".into(),
            description: "says hello".into(),
            commands: vec![troupe_proto::capability::CapabilityCommand {
                name: "hello".into(),
                argv: vec!["echo".into(), "hello".into(), "{name}".into()],
                description: "greets {name}".into(),
                options: Vec::new(),
                choices: Default::default(),
            }],
            probe: vec!["echo".into(), "1".into()],
            timeout_ms: None,
        },
        readme: String::new(),
        cli: String::new(),
        version: "v1".into(),
    };
    config.conversation.capabilities = Arc::new(troupe_proto::capability::CapabilityCatalog {
        capabilities: [("greet".to_owned(), capability)].into_iter().collect(),
        ..Default::default()
    });
}

/// A capability call that cannot run (a capability that does not exist, a command it does
/// not have) is refused before a token use is spent on it; the one that runs spends one.
#[tokio::test]
async fn a_capability_call_that_cannot_run_spends_no_use() {
    let mut coder = model_agent("coder", "You run commands.", &[]);
    coder.tools = ToolRules {
        authorization_required: vec!["*".into()],
        ..ToolRules::default()
    };
    let (team, book) = team_with_book_and(
        vec![coder],
        vec![
            ScriptedReply::tool("capability_run", json!({"id": "ghost", "command": "hello"})),
            ScriptedReply::tool("capability_run", json!({"id": "greet", "command": "shout"})),
            ScriptedReply::tool(
                "capability_run",
                json!({"id": "greet", "command": "hello", "args": {"name": "Ada"}}),
            ),
            ScriptedReply::text("done"),
        ],
        runs_commands_with_a_capability,
    )
    .await;
    let issued = token_book::issue(&book, issue_for("coder", "*", None, 600, 1))
        .await
        .unwrap();
    assert_eq!(
        send(&team, "/hub coder go", &[&issued.token]).await.text,
        "done"
    );
    let outputs: Vec<String> = team
        .events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            EventKind::ToolCallFinished { output, .. } => Some(output),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    assert!(outputs[0].contains("no capability `ghost`"), "{outputs:?}");
    assert!(
        outputs[2].contains("hello Ada"),
        "the one use ran it: {outputs:?}"
    );
    let listed = token_book::list(&book).await.unwrap();
    assert_eq!(listed[0].uses, 1, "only the call that ran used the token");
}

/// The shell tool's `bash -lc SCRIPT` is matched as the script it runs (as an ACP agent's
/// command is): an `echo *` token covers `["bash", "-lc", "echo hi"]`, not a script that
/// chains another command, and the refusal says which line it matched.
#[tokio::test]
async fn a_shell_script_is_covered_as_the_command_it_runs() {
    let (team, book) = team_with_book(
        vec![guarded(model_agent("coder", "You run commands.", &[]))],
        vec![
            ScriptedReply::tool("shell", json!({"command": ["bash", "-lc", "echo hi"]})),
            ScriptedReply::tool(
                "shell",
                json!({"command": ["bash", "-lc", "echo hi; echo chained"]}),
            ),
            ScriptedReply::text("done"),
        ],
    )
    .await;
    let issued = token_book::issue(&book, issue_for("coder", "shell", Some("echo *"), 600, 5))
        .await
        .unwrap();
    assert_eq!(
        send(&team, "/hub coder go", &[&issued.token]).await.text,
        "done"
    );
    let outputs = shell_outputs(&team.events().await);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(
        outputs[0].contains("exit code 0\nhi"),
        "it ran: {outputs:?}"
    );
    assert!(
        outputs[1].contains(r#"(the command line matched: "echo hi; echo chained")"#),
        "{outputs:?}"
    );
    assert_eq!(token_book::list(&book).await.unwrap()[0].uses, 1);
}

/// A store where another process counts a use of the token just before this one does, the
/// first `steals` times: this process's compare-and-set loses each of those.
struct Contended {
    inner: MemoryStore,
    steals: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl TokenStore for Contended {
    async fn insert_token(
        &self,
        token: troupe_proto::governance::AuthToken,
    ) -> Result<(), troupe_proto::AgentError> {
        self.inner.insert_token(token).await
    }

    async fn token_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, troupe_proto::AgentError> {
        self.inner.token_by_digest(digest).await
    }

    async fn use_token(
        &self,
        id: &str,
        uses: u32,
        now_ms: u64,
    ) -> Result<bool, troupe_proto::AgentError> {
        let steal = self
            .steals
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if steal {
            assert!(self.inner.use_token(id, uses, now_ms).await?);
        }
        self.inner.use_token(id, uses, now_ms).await
    }

    async fn revoke_token(
        &self,
        id: &str,
        at_ms: u64,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, troupe_proto::AgentError> {
        self.inner.revoke_token(id, at_ms).await
    }

    async fn tokens(
        &self,
    ) -> Result<Vec<troupe_proto::governance::AuthToken>, troupe_proto::AgentError> {
        self.inner.tokens().await
    }
}

/// Uses lost to another process on the same store are read and decided again: the call gets
/// the next use, or is refused for what the token has become (spent), never as if no token
/// had been presented; a store that keeps refusing makes it `unavailable`.
#[tokio::test]
async fn a_use_lost_to_another_process_is_decided_again() {
    for (max_uses, steals, answer) in [
        (5, 2, Ok(3)),
        (2, 2, Err(TokenRefusal::Exhausted)),
        (1_000, 1_000, Err(TokenRefusal::Unavailable)),
    ] {
        let store = Arc::new(Contended {
            inner: MemoryStore::new(),
            steals: steals.into(),
        });
        let book = token_book::spawn(store).await.unwrap();
        let issued = token_book::issue(&book, issue_for("coder", "shell", None, 60, max_uses))
            .await
            .unwrap();
        let got = token_book::consume(&book, consume_for(&issued.token, "coder", "shell"))
            .await
            .map(|consumed| consumed.uses);
        assert_eq!(got, answer, "max_uses {max_uses}");
    }
}
