//! What a running `troupe serve` reloads without a restart (A7): the agents directory and
//! the capabilities directory as their files change (watched with `notify`), and on
//! `SIGHUP` the configuration file's reloadable parts: `[tools]`, `[agents] dir` and
//! `[capabilities]`.
//!
//! One task owns the configuration in force and the watcher. A change is read once the
//! directories have been quiet for [`QUIET`](crate::live::QUIET); what it gives is published
//! on two watch channels: the agents catalog (for each session's agent hub) and the
//! [`Reloadable`] settings (each task takes them when it starts; a running task keeps
//! what it started with). A folder or file that no longer loads keeps its last good
//! version, and its error (file and field) is published with the rest so that each session
//! reports it as a `config_rejected` warning. A configuration file that no longer loads
//! keeps the running configuration in force and is reported the same way; a change to a
//! part that is not reloadable (the listen address, the store, the model...) is reported
//! as needing a restart and not applied.

use crate::config::TroupeConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use troupe_actors::conversation::Reloadable;
use troupe_proto::agent::{AgentCatalog, AgentLoadError};
use troupe_proto::capability::CapabilityCatalog;

/// Reads the configuration again, as the process first read it (file, environment, flags).
pub type Resolve = Box<dyn Fn() -> Result<TroupeConfig, String> + Send + Sync>;

/// The reloadable configuration of a running service. Dropping it stops the watching.
pub struct LiveConfig {
    settings: watch::Receiver<Arc<Reloadable>>,
    agents: watch::Receiver<Arc<AgentCatalog>>,
    signals: mpsc::UnboundedSender<Signal>,
    task: tokio::task::JoinHandle<()>,
    watch_error: Option<String>,
}

impl Drop for LiveConfig {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Signal {
    /// Something changed under these paths.
    Changed(Vec<PathBuf>),
    /// Read the configuration file again (SIGHUP).
    Reread,
    /// Answers once every signal before it has been handled.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// A file system watcher (notify's, or a stand-in in tests).
type BoxWatcher = Box<dyn notify::Watcher + Send>;

/// What a watcher calls with each file system event.
type Handler = Box<dyn FnMut(notify::Result<notify::Event>) + Send>;

impl LiveConfig {
    /// Starts from what the process read at start: `config`, its agents catalog and its
    /// capabilities; `resolve` reads the configuration again on [`Self::reread`]. When the
    /// directories cannot be watched (no inotify instance left...), that is logged and the
    /// rest works: `SIGHUP` ([`Self::reread`]) still reads everything again.
    pub fn start(
        config: TroupeConfig,
        agents: AgentCatalog,
        capabilities: CapabilityCatalog,
        resolve: Resolve,
    ) -> Self {
        Self::start_with(config, agents, capabilities, resolve, |handler| {
            notify::recommended_watcher(handler).map(|w| Box::new(w) as BoxWatcher)
        })
    }

    /// [`Self::start`] with the watcher `watcher` makes.
    fn start_with(
        config: TroupeConfig,
        agents: AgentCatalog,
        capabilities: CapabilityCatalog,
        resolve: Resolve,
        watcher: impl FnOnce(Handler) -> notify::Result<BoxWatcher>,
    ) -> Self {
        let (signals, rx) = mpsc::unbounded_channel();
        let events = signals.clone();
        let watcher = watcher(Box::new(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event
                && !event.kind.is_access()
            {
                let _ = events.send(Signal::Changed(event.paths));
            }
        }));
        let (watcher, watch_error) = match watcher {
            Ok(w) => (Some(w), None),
            Err(e) => {
                let why = format!(
                    "the agents and capabilities directories are not watched ({e}); SIGHUP reads them again"
                );
                tracing::warn!("{why}");
                (None, Some(why))
            }
        };
        let settings = Reloadable {
            tool_policy: Arc::new(config.tools.clone()),
            capability_budget: config.capabilities.budget(),
            capabilities: Arc::new(capabilities),
            rejected: Vec::new(),
        };
        crate::live::capability_metrics(&settings.capabilities);
        let (publish_settings, settings) = watch::channel(Arc::new(settings));
        let (publish_agents, agents) = watch::channel(Arc::new(agents));
        let mut owner = Owner {
            config,
            resolve,
            watcher,
            watched: Vec::new(),
            settings: publish_settings,
            agents: publish_agents,
        };
        owner.rewatch();
        let task = tokio::spawn(owner.run(rx));
        Self {
            settings,
            agents,
            signals,
            task,
            watch_error,
        }
    }

    /// Why the directories are not watched, when they are not.
    pub fn watch_error(&self) -> Option<&str> {
        self.watch_error.as_deref()
    }

    /// The reloadable settings in force, and their changes.
    pub fn settings(&self) -> watch::Receiver<Arc<Reloadable>> {
        self.settings.clone()
    }

    /// The agents catalog in force, and its changes.
    pub fn agents(&self) -> watch::Receiver<Arc<AgentCatalog>> {
        self.agents.clone()
    }

    /// Reads the configuration file again (what `SIGHUP` does).
    pub fn reread(&self) {
        let _ = self.signals.send(Signal::Reread);
    }

    /// Waits until every change signalled before the call has been handled (tests).
    pub async fn settled(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.signals.send(Signal::Barrier(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

/// Which directory a watched path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Agents,
    Capabilities,
}

struct Owner {
    config: TroupeConfig,
    resolve: Resolve,
    /// `None`: watching could not be set up.
    watcher: Option<BoxWatcher>,
    /// What is watched now.
    watched: Vec<(Dir, PathBuf)>,
    settings: watch::Sender<Arc<Reloadable>>,
    agents: watch::Sender<Arc<AgentCatalog>>,
}

impl Owner {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Signal>) {
        while let Some(first) = rx.recv().await {
            let mut work = Work::default();
            let mut barriers = Vec::new();
            self.note(first, &mut work, &mut barriers);
            // Wait for the directories to be quiet (an editor's save is several events).
            if !work.is_empty() {
                while let Ok(Some(next)) = tokio::time::timeout(crate::live::QUIET, rx.recv()).await
                {
                    self.note(next, &mut work, &mut barriers);
                }
            }
            if work.reread {
                self.reread();
            }
            if work.agents {
                self.read_agents();
            }
            if work.capabilities {
                self.read_capabilities(Vec::new());
            }
            for done in barriers {
                let _ = done.send(());
            }
        }
    }

    fn note(
        &self,
        signal: Signal,
        work: &mut Work,
        barriers: &mut Vec<tokio::sync::oneshot::Sender<()>>,
    ) {
        match signal {
            Signal::Changed(paths) => {
                for path in paths {
                    match which_dir(&self.watched, &path) {
                        Some(Dir::Agents) => work.agents = true,
                        Some(Dir::Capabilities) => work.capabilities = true,
                        None => {}
                    }
                }
            }
            Signal::Reread => work.reread = true,
            Signal::Barrier(done) => barriers.push(done),
        }
    }

    /// Watches the directories of the configuration in force (those that exist).
    fn rewatch(&mut self) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let wanted: Vec<(Dir, PathBuf)> = [
            self.config.agents_dir().map(|(d, _)| (Dir::Agents, d)),
            self.config
                .capabilities_dir()
                .map(|(d, _)| (Dir::Capabilities, d)),
        ]
        .into_iter()
        .flatten()
        .filter(|(_, d)| d.is_dir())
        .collect();
        if wanted == self.watched {
            return;
        }
        for (_, dir) in std::mem::take(&mut self.watched) {
            let _ = watcher.unwatch(&dir);
        }
        for (kind, dir) in wanted {
            // Capability folders hold their files: the whole tree is watched.
            let mode = match kind {
                Dir::Agents => notify::RecursiveMode::NonRecursive,
                Dir::Capabilities => notify::RecursiveMode::Recursive,
            };
            match watcher.watch(&dir, mode) {
                Ok(()) => self.watched.push((kind, dir)),
                Err(error) => tracing::warn!(dir = %dir.display(), %error, "cannot watch"),
            }
        }
    }

    fn read_agents(&mut self) {
        let read = crate::agents::catalog(&self.config);
        let current = self.agents.borrow().clone();
        let next = crate::live::keep_last_good(&current, read);
        if next != *current {
            for error in next.errors.iter().filter(|e| !current.errors.contains(e)) {
                tracing::warn!(%error, "agent definition not loaded");
            }
            crate::live::metrics::reloaded(&next);
            tracing::info!(
                agents = next.agents.len(),
                errors = next.errors.len(),
                "agents directory read again"
            );
            self.agents.send_replace(Arc::new(next));
        }
    }

    /// Reads the capabilities again and publishes the settings, with `rejected` (what the
    /// configuration file's last reading said).
    fn read_capabilities(&mut self, rejected: Vec<AgentLoadError>) {
        let read = crate::capabilities::catalog(&self.config);
        let current = self.settings.borrow().clone();
        let capabilities = keep_last_good(&current.capabilities, read);
        let next = Reloadable {
            tool_policy: Arc::new(self.config.tools.clone()),
            capability_budget: self.config.capabilities.budget(),
            capabilities: Arc::new(capabilities),
            rejected,
        };
        if next != *current {
            for error in next
                .capabilities
                .errors
                .iter()
                .filter(|e| !current.capabilities.errors.contains(e))
            {
                tracing::warn!(%error, "capability not loaded");
            }
            tracing::info!(
                capabilities = next.capabilities.capabilities.len(),
                errors = next.capabilities.errors.len(),
                "capabilities read again"
            );
            let next = Arc::new(next);
            self.settings.send_replace(next.clone());
            // After the publication: whoever sees the gauge move finds the new catalog.
            crate::live::capability_metrics(&next.capabilities);
        }
    }

    /// SIGHUP: the configuration file again. A file that does not load changes nothing; a
    /// change to what is not reloadable is reported and not applied.
    fn reread(&mut self) {
        let next = match (self.resolve)() {
            Ok(next) => next,
            Err(message) => {
                let error = AgentLoadError {
                    file: self.config.source.clone().unwrap_or_default(),
                    field: None,
                    message: format!("{message} (the running configuration stays in force)"),
                };
                tracing::error!(%error, "configuration not reloaded");
                let mut same = (**self.settings.borrow()).clone();
                same.rejected = vec![error];
                self.settings.send_replace(Arc::new(same));
                metrics::reread(metrics::Outcome::Rejected);
                return;
            }
        };
        let restart = restart_needed(&self.config, &next);
        let file = same_file(&next);
        let rejected: Vec<AgentLoadError> = restart
            .iter()
            .map(|field| AgentLoadError {
                file: file.clone(),
                field: Some(field.clone()),
                message: "changed; troupe serve needs a restart to apply it".into(),
            })
            .collect();
        for error in &rejected {
            tracing::warn!(%error, "configuration change not applied");
        }
        // What is reloaded; the rest stays as the process started with it.
        self.config.tools = next.tools;
        self.config.capabilities = next.capabilities;
        self.config.agents.dir = next.agents.dir;
        self.rewatch();
        let outcome = if rejected.is_empty() {
            metrics::Outcome::Ok
        } else {
            metrics::Outcome::RestartNeeded
        };
        tracing::info!(
            restart_needed = rejected.len(),
            "configuration file read again"
        );
        self.read_agents();
        self.read_capabilities(rejected);
        // After the publication: whoever sees the count move finds the new settings.
        metrics::reread(outcome);
    }
}

fn same_file(config: &TroupeConfig) -> PathBuf {
    config
        .source
        .clone()
        .unwrap_or_else(|| "troupe.toml".into())
}

#[derive(Default)]
struct Work {
    agents: bool,
    capabilities: bool,
    reread: bool,
}

impl Work {
    fn is_empty(&self) -> bool {
        !(self.agents || self.capabilities || self.reread)
    }
}

fn which_dir(watched: &[(Dir, PathBuf)], path: &Path) -> Option<Dir> {
    watched
        .iter()
        .find(|(_, dir)| path.starts_with(dir))
        .map(|(kind, _)| *kind)
}

/// `next`, where every capability whose folder no longer loads keeps the version `current`
/// has of it. Pure.
pub fn keep_last_good(
    current: &CapabilityCatalog,
    mut next: CapabilityCatalog,
) -> CapabilityCatalog {
    let Some(dir) = next.dir.clone() else {
        return next;
    };
    for error in &mut next.errors {
        // `<dir>/<id>/module.json`, `<dir>/<id>/README.md`...
        let Some(id) = error
            .file
            .strip_prefix(&dir)
            .ok()
            .and_then(|rest| rest.components().next())
            .and_then(|c| c.as_os_str().to_str())
        else {
            continue;
        };
        if next.capabilities.contains_key(id) {
            continue;
        }
        if let Some(capability) = current.capabilities.get(id) {
            next.capabilities.insert(id.to_owned(), capability.clone());
            error
                .message
                .push_str(" (the last good version stays in force)");
        }
    }
    next
}

/// The settings of `next` that differ from `current` and need a restart: every key but
/// `[tools]`, `[capabilities]` and `[agents] dir`, by its dotted name (`server.listen`).
/// Pure.
pub fn restart_needed(current: &TroupeConfig, next: &TroupeConfig) -> Vec<String> {
    let as_json = |c: &TroupeConfig| {
        let mut value = serde_json::to_value(c).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("tools");
            map.remove("capabilities");
            if let Some(agents) = map.get_mut("agents").and_then(|a| a.as_object_mut()) {
                agents.remove("dir");
            }
        }
        value
    };
    let (a, b) = (as_json(current), as_json(next));
    let mut changed = Vec::new();
    let empty = serde_json::Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(serde_json::Value::Object(x)), Some(serde_json::Value::Object(y))) => {
                let mut inner: Vec<&String> = x.keys().chain(y.keys()).collect();
                inner.sort();
                inner.dedup();
                for sub in inner {
                    if x.get(sub) != y.get(sub) {
                        changed.push(format!("{key}.{sub}"));
                    }
                }
            }
            _ => changed.push(key.clone()),
        }
    }
    changed
}

pub mod metrics {
    //! Configuration file rereads (SIGHUP): bounded labels only.

    use metrics::{Unit, counter, describe_counter};

    /// Times `troupe serve` read its configuration file again, by outcome.
    pub const REREADS_TOTAL: &str = "troupe_config_file_reloads_total";

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Outcome {
        /// Applied.
        Ok,
        /// Its reloadable parts applied; other changes wait for a restart.
        RestartNeeded,
        /// It did not load: the running configuration stays.
        Rejected,
    }

    impl Outcome {
        pub const ALL: [Self; 3] = [Self::Ok, Self::RestartNeeded, Self::Rejected];

        pub const fn as_str(self) -> &'static str {
            match self {
                Self::Ok => "ok",
                Self::RestartNeeded => "restart_needed",
                Self::Rejected => "rejected",
            }
        }
    }

    pub fn describe() {
        describe_counter!(
            REREADS_TOTAL,
            Unit::Count,
            "Configuration file reloads on SIGHUP, by outcome (ok, restart_needed: some changes wait for a restart, rejected: the file did not load)"
        );
        for outcome in Outcome::ALL {
            counter!(REREADS_TOTAL, "outcome" => outcome.as_str()).increment(0);
        }
    }

    pub fn reread(outcome: Outcome) {
        counter!(REREADS_TOTAL, "outcome" => outcome.as_str()).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::capability::{Capability, CapabilityModule};

    fn capability(id: &str, description: &str) -> Capability {
        Capability {
            module: CapabilityModule {
                id: id.into(),
                description: description.into(),
                commands: Vec::new(),
                probe: vec!["true".into()],
                timeout_ms: None,
            },
            readme: String::new(),
            cli: String::new(),
            version: description.into(),
        }
    }

    #[test]
    fn a_folder_that_no_longer_loads_keeps_its_last_good_version() {
        let mut current = CapabilityCatalog::default();
        current
            .capabilities
            .insert("git".into(), capability("git", "old"));
        let mut next = CapabilityCatalog {
            dir: Some("/caps".into()),
            ..CapabilityCatalog::default()
        };
        next.capabilities
            .insert("jq".into(), capability("jq", "new"));
        next.errors.push(AgentLoadError {
            file: "/caps/git/module.json".into(),
            field: Some("commands[0].argv".into()),
            message: "must name a program".into(),
        });
        next.errors.push(AgentLoadError {
            file: "/caps/other/module.json".into(),
            field: None,
            message: "bad".into(),
        });
        let merged = keep_last_good(&current, next);
        assert_eq!(merged.capabilities["git"].module.description, "old");
        assert!(merged.capabilities.contains_key("jq"));
        assert!(merged.errors[0].message.ends_with("stays in force)"));
        assert_eq!(merged.errors[1].message, "bad");
    }

    #[tokio::test]
    async fn without_a_watcher_it_starts_and_sighup_still_reloads() {
        let config = TroupeConfig::default();
        let mut next = config.clone();
        next.tools.blacklist = vec!["shell".into()];
        let live = LiveConfig::start_with(
            config,
            AgentCatalog::default(),
            CapabilityCatalog::default(),
            Box::new(move || Ok(next.clone())),
            |_| Err(notify::Error::generic("no inotify instance left")),
        );
        assert!(
            live.watch_error()
                .is_some_and(|w| w.contains("no inotify instance left")),
            "{:?}",
            live.watch_error()
        );
        live.reread();
        live.settled().await;
        assert_eq!(live.settings().borrow().tool_policy.blacklist, ["shell"]);
    }

    #[test]
    fn only_what_is_not_reloadable_needs_a_restart() {
        let current = TroupeConfig::default();
        let mut next = current.clone();
        next.tools.blacklist = vec!["shell".into()];
        next.capabilities.prompt_tokens = 9;
        next.agents.dir = Some("elsewhere".into());
        assert!(restart_needed(&current, &next).is_empty());
        next.server.listen = "127.0.0.1:1".into();
        next.agents.max_depth = 9;
        next.data_dir = "other".into();
        assert_eq!(
            restart_needed(&current, &next),
            ["agents.max_depth", "data_dir", "server.listen"]
        );
    }
}
