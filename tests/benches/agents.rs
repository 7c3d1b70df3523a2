//! What dispatching to an in-process agent costs over a plain message; prints two tables.
//!
//!     cargo bench -p troupe-tests --bench agents
//!
//! Four ways to get an answer (no tools, storage policy Full), each 50 times per session,
//! sessions alternating between the four so that the machine's load falls on all alike, with
//! two models: the built-in scripted model (answers at once: what troupe itself costs) and
//! the `openai-responses` client against the loopback model server of `tests/support`
//! (`troupe-test-support`'s `ModelServer`, its default one-word reply streamed over HTTP):
//! - `plain`: a message to a session without agents (one task, one model call);
//! - `plain, agents defined`: the same in a session with an agent, routed by the rules (the
//!   task reads its view of the agents, `route_decided` says it is a direct reply, then its
//!   turn answers, the `dispatch_agent` tool offered);
//! - `/hub coder`: a message dispatched to an in-process agent: the user's task routes,
//!   the hub admits the dispatch, leases it and binds the agent's conversation (the first
//!   time), the agent's task answers, and the answer comes back (two tasks, one model call,
//!   five more events);
//! - `two plain messages`: two messages of the first kind back to back, timed as one: what
//!   the two tasks of a dispatch cost without the hub.
//!
//! Each model is measured with the two ways troupe keeps a session's record: as `troupe chat`
//! does (JSONL files under the data directory, each conversation's file fsynced at every
//! task's end) and as `troupe serve` does on its default store (`rollout.db` and `troupe.db`,
//! SQLite, no fsync unless `power_loss_durable`). `TROUPE_BENCH_STORAGE=files|sqlite` keeps
//! one of them.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::agents::{AgentPorts, AgentSettings, RouterMode};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::ports::{BindingStore, ModelClient};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::agent::{AgentCatalog, AgentDefinition};
use troupe_proto::{SessionId, StoragePolicy};
use troupe_runtime::config::{Provider, TroupeConfig};
use troupe_runtime::{ScriptedModel, ScriptedReply, assembly};
use troupe_store::memory::MemoryStore;
use troupe_store::{SqliteRolloutStorage, SqliteStore};
use troupe_test_support::ModelServer;

/// Messages per session, as the core benchmark sends per conversation.
const PER_SESSION: usize = 50;
/// Sessions of each kind measured, per model.
const SESSIONS: usize = 40;

/// Which model answers.
#[derive(Clone)]
enum Model {
    /// The scripted model: answers at once.
    Scripted,
    /// The `openai-responses` client against the loopback model server (one client, so one
    /// pool of keep-alive connections, for every session, as in `troupe serve`).
    Http(Arc<dyn ModelClient>),
}

impl Model {
    fn client(&self) -> Arc<dyn ModelClient> {
        match self {
            Self::Scripted => Arc::new(ScriptedModel::new(
                (0..2 * PER_SESSION)
                    .map(|_| ScriptedReply::text("ok"))
                    .collect(),
            )),
            Self::Http(client) => client.clone(),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Where a session's record goes: its rollout, and the store its agent bindings are kept in.
#[derive(Clone)]
struct Storage {
    /// `None`: the session's default, JSONL files under its data directory.
    rollout: Option<Arc<dyn RolloutStorage>>,
    bindings: Arc<dyn BindingStore>,
}

impl Storage {
    /// As `troupe chat` keeps it: JSONL rollout files (fsynced at each task's end), bindings in
    /// memory (the chat has no store).
    fn files() -> Self {
        Self {
            rollout: None,
            bindings: Arc::new(MemoryStore::new()),
        }
    }

    /// As `troupe serve` keeps it on its default store: `rollout.db` and `troupe.db` in `dir`.
    fn sqlite(dir: &std::path::Path) -> Self {
        let rollout =
            SqliteRolloutStorage::open_with(SqliteRolloutStorage::path_in(dir).unwrap(), false)
                .unwrap();
        Self {
            rollout: Some(Arc::new(rollout)),
            bindings: Arc::new(SqliteStore::open_in(dir).unwrap()),
        }
    }

    /// The two, named, as `TROUPE_BENCH_STORAGE` keeps them (both when unset).
    fn chosen(dir: &std::path::Path) -> Vec<(&'static str, Self)> {
        let only = std::env::var("TROUPE_BENCH_STORAGE").ok();
        assert!(
            only.as_deref()
                .is_none_or(|o| o == "files" || o == "sqlite"),
            "TROUPE_BENCH_STORAGE is `files` or `sqlite`, not {only:?}"
        );
        let mut out = Vec::new();
        if only.as_deref().is_none_or(|o| o == "files") {
            out.push(("JSONL rollout files, as `troupe chat`", Self::files()));
        }
        if only.as_deref().is_none_or(|o| o == "sqlite") {
            out.push((
                "SQLite rollout and store, as `troupe serve`",
                Self::sqlite(dir),
            ));
        }
        out
    }
}

fn row(name: &str, value: String, note: &str) {
    println!("| {name:<40} | {value:>10} | {note} |");
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    PlainWithAgents,
    Dispatch,
    /// Two plain messages back to back, timed as one: what two tasks cost, the floor of a
    /// dispatch (the user's task and the agent's).
    TwoPlain,
}

fn ports(kind: Kind, model: &Model, storage: &Storage) -> SessionPorts {
    let agents = matches!(kind, Kind::PlainWithAgents | Kind::Dispatch).then(|| {
        let coder: AgentDefinition = serde_json::from_value(serde_json::json!({
            "id": "coder", "role": "executor",
            "provider": {"type": "model", "instructions": "You write code."}
        }))
        .unwrap();
        AgentPorts {
            catalog: Arc::new(AgentCatalog {
                agents: [(coder.id.clone(), coder)].into_iter().collect(),
                ..AgentCatalog::default()
            }),
            settings: AgentSettings {
                router: RouterMode::Rules,
                ..AgentSettings::default()
            },
            factories: Vec::new(),
            models: Default::default(),
            bindings: storage.bindings.clone(),
            live: None,
        }
    });
    SessionPorts {
        model: model.client(),
        mcp: None,
        mcp_connector: None,
        exec: None,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: storage.rollout.clone(),
        agents,
        effects: troupe_actors::ports::Effects::Live,
    }
}

/// One session of `kind`: `PER_SESSION` answers, each timed.
async fn batch(
    kind: Kind,
    model: &Model,
    dir: &std::path::Path,
    storage: &Storage,
) -> Vec<Duration> {
    let mut config = SessionConfig {
        data_dir: dir.to_path_buf(),
        ..SessionConfig::default()
    };
    config.root.storage_policy = StoragePolicy::Full;
    let (session, join) =
        SessionHandle::start(SessionId::new(), config, ports(kind, model, storage))
            .await
            .unwrap();
    let root = session.root().await.unwrap();
    let text = match kind {
        Kind::Dispatch => "/hub coder hello",
        Kind::Plain | Kind::PlainWithAgents | Kind::TwoPlain => "hello",
    };
    let mut lat = Vec::with_capacity(PER_SESSION);
    for _ in 0..PER_SESSION {
        let t = Instant::now();
        let mut reply = session.message(root, text).await.unwrap();
        if kind == Kind::TwoPlain {
            reply = session.message(root, text).await.unwrap();
        }
        lat.push(t.elapsed());
        assert_eq!(reply.text, "ok", "{reply:?}");
    }
    session.shutdown().await.unwrap();
    let _ = join.await;
    lat
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // On a worker thread, as actors and their callers run in the service.
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    let server = ModelServer::start().await;
    let mut config = TroupeConfig::default();
    config.model.provider = Provider::OpenaiResponses;
    config.model.base_url = server.base_url();
    let http = assembly::build_model(&config, None).unwrap();
    // For profiling: `TROUPE_BENCH_PROFILE=<kind index>` runs only that kind, scripted.
    if let Some(k) = std::env::var("TROUPE_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let kinds = [
            Kind::Plain,
            Kind::PlainWithAgents,
            Kind::Dispatch,
            Kind::TwoPlain,
        ];
        let dir = tempfile::tempdir().unwrap();
        let (_, storage) = Storage::chosen(dir.path()).remove(0);
        for _ in 0..400 {
            batch(kinds[k], &Model::Scripted, dir.path(), &storage).await;
        }
        return;
    }
    for (model_name, model) in [
        ("scripted model", Model::Scripted),
        (
            "openai-responses over HTTP to the loopback model server",
            Model::Http(http),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        for (storage_name, storage) in Storage::chosen(dir.path()) {
            measure(&format!("{model_name}, {storage_name}"), &model, &storage).await;
            println!();
        }
    }
}

async fn measure(title: &str, model: &Model, storage: &Storage) {
    let dir = tempfile::tempdir().unwrap();
    let kinds = [
        Kind::Plain,
        Kind::PlainWithAgents,
        Kind::Dispatch,
        Kind::TwoPlain,
    ];
    // Warm up: one session of each.
    for kind in kinds {
        batch(kind, model, dir.path(), storage).await;
    }
    let mut lat: [Vec<Duration>; 4] = Default::default();
    for _ in 0..SESSIONS {
        for (i, kind) in kinds.into_iter().enumerate() {
            lat[i].extend(batch(kind, model, dir.path(), storage).await);
        }
    }
    for l in &mut lat {
        l.sort();
    }
    let n = SESSIONS * PER_SESSION;
    println!("{title}:\n");
    println!("| measure | value | note |");
    println!("|---|---:|---|");
    let names = [
        "plain",
        "plain, agents defined",
        "/hub coder",
        "two plain messages",
    ];
    for (name, l) in names.iter().zip(&lat) {
        row(
            &format!("{name} p50"),
            format!("{:.1?}", percentile(l, 0.5)),
            &format!("{n} messages, {PER_SESSION} per session"),
        );
        row(
            &format!("{name} p99"),
            format!("{:.1?}", percentile(l, 0.99)),
            "",
        );
    }
    let p50 = |i: usize| percentile(&lat[i], 0.5).as_secs_f64();
    row(
        "/hub coder p50 / plain p50",
        format!("{:.2}x", p50(2) / p50(0)),
        "target < 2x",
    );
    row(
        "/hub coder p50 / two plain messages p50",
        format!("{:.2}x", p50(2) / p50(3)),
        "a dispatch against the two tasks it runs",
    );
    row(
        "plain, agents defined p50 / plain p50",
        format!("{:.2}x", p50(1) / p50(0)),
        "what defining agents costs a message that goes to no agent",
    );
}
