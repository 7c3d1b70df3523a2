//! Agents (A1–A4): definitions, bindings, dispatch, routing and the bounds that keep
//! dispatches from locking themselves.

mod acp;
mod bounds;
mod cli;
mod dispatch;
mod hub_env;
mod routing;
mod surfaces;

use std::sync::Arc;
use std::time::Duration;
use troupe_actors::agents::{AgentPorts, AgentProviderFactory, AgentSettings, RouterMode};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::agent::{AgentCatalog, AgentDefinition, ProviderSpec};
use troupe_proto::{EventKind, MessageReply, SessionId};
use troupe_runtime::ScriptedReply;
use troupe_store::memory::MemoryStore;
use troupe_tests::RecordingModel;

/// An in-process agent.
pub(crate) fn model_agent(id: &str, instructions: &str, workers: &[&str]) -> AgentDefinition {
    AgentDefinition {
        id: id.into(),
        role: format!("{id}-role"),
        description: Some(format!("does {id} work")),
        provider: ProviderSpec::Model {
            model: None,
            provider: None,
            base_url: None,
            instructions: Some(instructions.into()),
        },
        session: Default::default(),
        tools: Default::default(),
        workers: workers.iter().map(|w| (*w).to_owned()).collect(),
        governance: None,
        output: None,
    }
}

/// An agent of an external kind (no provider of it is plugged in here).
pub(super) fn acp_agent(id: &str) -> AgentDefinition {
    AgentDefinition {
        provider: ProviderSpec::Acp {
            command: "codex-acp".into(),
            args: Vec::new(),
            env: Default::default(),
            cwd: None,
        },
        ..model_agent(id, "", &[])
    }
}

/// A session with agents around a recording scripted model, its bindings in a memory store
/// that outlives a restart of the session.
pub(crate) struct Team {
    pub session: SessionHandle,
    pub model: Arc<RecordingModel>,
    pub store: Arc<MemoryStore>,
    pub dir: Arc<tempfile::TempDir>,
    pub session_id: SessionId,
    defs: Vec<AgentDefinition>,
    settings: AgentSettings,
    tweak: fn(&mut SessionConfig),
    factories: Vec<Arc<dyn AgentProviderFactory>>,
    extras: Extras,
}

/// What a team is made of, kept for its restarts.
struct Plan {
    defs: Vec<AgentDefinition>,
    settings: AgentSettings,
    tweak: fn(&mut SessionConfig),
    factories: Vec<Arc<dyn AgentProviderFactory>>,
    extras: Extras,
}

/// What some teams have besides: a token book, a command runner.
#[derive(Clone, Default)]
pub(crate) struct Extras {
    pub token_book: Option<troupe_actors::token_book::TokenBookRef>,
    pub exec: bool,
    /// The catalog's `unloaded_supervisors` (files whose role is `supervisor` that did not load).
    pub unloaded_supervisors: Vec<String>,
    /// The definitions as a watched directory would give them (A7).
    pub live: Option<tokio::sync::watch::Receiver<Arc<AgentCatalog>>>,
}

pub(crate) fn settings(router: RouterMode) -> AgentSettings {
    AgentSettings {
        router,
        ..AgentSettings::default()
    }
}

impl Team {
    pub async fn start(defs: Vec<AgentDefinition>, replies: Vec<ScriptedReply>) -> Self {
        Self::start_with(defs, replies, settings(RouterMode::Rules), |_| {}).await
    }

    pub async fn start_with(
        defs: Vec<AgentDefinition>,
        replies: Vec<ScriptedReply>,
        settings: AgentSettings,
        tweak: fn(&mut SessionConfig),
    ) -> Self {
        Self::start_with_factories(defs, replies, settings, tweak, Vec::new()).await
    }

    /// Same, with providers of external kinds plugged in.
    pub async fn start_with_factories(
        defs: Vec<AgentDefinition>,
        replies: Vec<ScriptedReply>,
        settings: AgentSettings,
        tweak: fn(&mut SessionConfig),
        factories: Vec<Arc<dyn AgentProviderFactory>>,
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let store = Arc::new(MemoryStore::new());
        let model = Arc::new(RecordingModel::new(replies));
        let plan = Plan {
            defs,
            settings,
            tweak,
            factories,
            extras: Extras::default(),
        };
        Self::launch(SessionId::new(), plan, dir, store, model).await
    }

    /// A team with external kinds plugged in and extras (a token book).
    pub async fn start_with_factories_extra(
        defs: Vec<AgentDefinition>,
        factories: Vec<Arc<dyn AgentProviderFactory>>,
        extras: Extras,
    ) -> Self {
        let plan = Plan {
            defs,
            settings: settings(RouterMode::Rules),
            tweak: |_| {},
            factories,
            extras,
        };
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let store = Arc::new(MemoryStore::new());
        let model = Arc::new(RecordingModel::new(Vec::new()));
        Self::launch(SessionId::new(), plan, dir, store, model).await
    }

    /// A team with extras (a token book, a command runner).
    pub async fn start_extra(
        defs: Vec<AgentDefinition>,
        replies: Vec<ScriptedReply>,
        tweak: fn(&mut SessionConfig),
        extras: Extras,
    ) -> Self {
        let plan = Plan {
            defs,
            settings: settings(RouterMode::Rules),
            tweak,
            factories: Vec::new(),
            extras,
        };
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let store = Arc::new(MemoryStore::new());
        let model = Arc::new(RecordingModel::new(replies));
        Self::launch(SessionId::new(), plan, dir, store, model).await
    }

    async fn launch(
        session_id: SessionId,
        plan: Plan,
        dir: Arc<tempfile::TempDir>,
        store: Arc<MemoryStore>,
        model: Arc<RecordingModel>,
    ) -> Self {
        let Plan {
            defs,
            settings,
            tweak,
            factories,
            extras,
        } = plan;
        let mut config = SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        tweak(&mut config);
        config
            .conversation
            .token_book
            .clone_from(&extras.token_book);
        let catalog = AgentCatalog {
            agents: defs.iter().map(|d| (d.id.clone(), d.clone())).collect(),
            unloaded_supervisors: extras.unloaded_supervisors.clone(),
            ..AgentCatalog::default()
        };
        let ports = SessionPorts {
            model: model.clone(),
            mcp: None,
            mcp_connector: None,
            exec: extras.exec.then(|| {
                Arc::new(troupe_tests::process_runner())
                    as Arc<dyn troupe_actors::ports::CommandRunner>
            }),
            effects: troupe_actors::ports::Effects::Live,
            summarizer: Arc::new(LocalSummarizer::default()),
            tokens: Arc::new(troupe_actors::ports::ApproxTokens),
            rollout_storage: None,
            agents: Some(AgentPorts {
                catalog: Arc::new(catalog),
                settings: settings.clone(),
                factories: factories.clone(),
                models: Default::default(),
                bindings: store.clone(),
                live: extras.live.clone(),
            }),
        };
        let (session, _join) = SessionHandle::start(session_id, config, ports)
            .await
            .unwrap();
        Self {
            session,
            model,
            store,
            dir,
            session_id,
            defs,
            settings,
            tweak,
            factories,
            extras,
        }
    }

    /// The same session started again (another run): same id, store and data directory.
    pub async fn restart(self, replies: Vec<ScriptedReply>) -> Self {
        self.session.shutdown().await.unwrap();
        let model = Arc::new(RecordingModel::new(replies));
        let plan = Plan {
            defs: self.defs,
            settings: self.settings,
            tweak: self.tweak,
            factories: self.factories,
            extras: self.extras,
        };
        Self::launch(self.session_id, plan, self.dir, self.store, model).await
    }

    /// A message to the root conversation, answered.
    pub async fn send(&self, text: &str) -> MessageReply {
        let root = self.session.root().await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.session.message(root, text))
            .await
            .expect("answered in time")
            .unwrap()
    }

    /// Every event recorded so far, in order.
    pub async fn events(&self) -> Vec<EventKind> {
        self.session.flush().await.unwrap();
        self.session
            .events_after(0, 100_000)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|r| r.event)
            .collect()
    }
}

/// The kind names of `events` that are about agents, in order.
pub(crate) fn agent_kinds(events: &[EventKind]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| e.name().as_str())
        .filter(|n| {
            matches!(
                *n,
                "session_created"
                    | "session_bound"
                    | "session_resumed"
                    | "route_decided"
                    | "dispatch_sent"
                    | "dispatch_result"
                    | "policy_rejected"
                    | "ask_human"
            )
        })
        .collect()
}
