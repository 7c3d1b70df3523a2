//! What a running `troupe serve` reloads without a restart (A7): the agents directory and
//! the capabilities directory as their files change (watched with `notify`), and on
//! `SIGHUP` the configuration file's reloadable parts: `[tools]`, `[agents] dir` and
//! `[capabilities]`.
//!
//! One task owns the configuration in force and the watcher. A change is read once the
//! directories have been quiet for [`QUIET`](crate::live::QUIET) (at most [`MAX_DEBOUNCE`]
//! after it, however busy they stay), off the async workers; what it gives is published
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
            dirs: Vec::new(),
            watching: Vec::new(),
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
    /// The directories of the configuration in force, existing or not.
    dirs: Vec<(Dir, PathBuf)>,
    /// The paths watched now: each directory that exists, and the parent of each (where
    /// the directory is seen created, removed or replaced).
    watching: Vec<PathBuf>,
    settings: watch::Sender<Arc<Reloadable>>,
    agents: watch::Sender<Arc<AgentCatalog>>,
}

impl Owner {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Signal>) {
        while let Some(first) = rx.recv().await {
            let (work, barriers) =
                gather(&self.dirs, first, &mut rx, crate::live::QUIET, MAX_DEBOUNCE).await;
            if !work.is_empty() {
                // Directory reads and parsing are blocking work: off the async workers.
                self = match tokio::task::spawn_blocking(move || {
                    self.apply(work);
                    self
                })
                .await
                {
                    Ok(owner) => owner,
                    Err(error) => {
                        tracing::error!(%error, "configuration reload failed; no more reloads");
                        return;
                    }
                };
            }
            for done in barriers {
                let _ = done.send(());
            }
        }
    }

    fn apply(&mut self, work: Work) {
        let mut rejected = Vec::new();
        if work.reread {
            match self.reread() {
                // Applied: it watched again and read both directories.
                None => return,
                // The file did not load: the running configuration stays, and the directory
                // changes of this round are still read under it (they are not lost with it).
                Some(error) => rejected.push(error),
            }
        }
        if work.rewatch {
            self.rewatch();
        }
        if work.agents {
            self.read_agents();
        }
        if work.capabilities || !rejected.is_empty() {
            self.read_capabilities(rejected);
        }
    }

    /// Watches the directories of the configuration in force, afresh: each that exists, and
    /// the parent of each, so that a directory created after start, or removed and put back
    /// (`rm -r` then `mv`), is watched again when it appears.
    fn rewatch(&mut self) {
        self.dirs = [
            self.config.agents_dir().map(|(d, _)| (Dir::Agents, d)),
            self.config
                .capabilities_dir()
                .map(|(d, _)| (Dir::Capabilities, d)),
        ]
        .into_iter()
        .flatten()
        // Absolute, so that a directory named relative to the working directory (beside a
        // `troupe.toml` found there) has a parent to watch, and events name it as it is named.
        .map(|(kind, dir)| (kind, std::path::absolute(&dir).unwrap_or(dir)))
        .collect();
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        for path in std::mem::take(&mut self.watching) {
            let _ = watcher.unwatch(&path);
        }
        for (path, mode) in watches(&self.dirs) {
            if self.watching.contains(&path) {
                continue;
            }
            match watcher.watch(&path, mode) {
                Ok(()) => self.watching.push(path),
                Err(error) => tracing::warn!(dir = %path.display(), %error, "cannot watch"),
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

    /// SIGHUP: the configuration file again. A file that does not load changes nothing (its
    /// error is returned, and published); a change to what is not reloadable is reported and
    /// not applied.
    fn reread(&mut self) -> Option<AgentLoadError> {
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
                same.rejected = vec![error.clone()];
                self.settings.send_replace(Arc::new(same));
                metrics::reread(metrics::Outcome::Rejected);
                return Some(error);
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
        None
    }
}

fn same_file(config: &TroupeConfig) -> PathBuf {
    config
        .source
        .clone()
        .unwrap_or_else(|| "troupe.toml".into())
}

/// The longest a change waits to be read while its directory keeps changing: past it, what
/// changed so far is read (a SIGHUP among the changes is not held up longer either).
pub const MAX_DEBOUNCE: std::time::Duration = std::time::Duration::from_secs(2);

/// What is to be done after a round of signals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Work {
    agents: bool,
    capabilities: bool,
    reread: bool,
    /// A directory itself appeared, went or was replaced: watch afresh.
    rewatch: bool,
}

impl Work {
    fn is_empty(&self) -> bool {
        !(self.agents || self.capabilities || self.reread || self.rewatch)
    }
}

/// A round of signals starting with `first`: once there is work, the ones that follow
/// until the directories have been quiet for `quiet`, or `max` has passed since `first`.
async fn gather(
    dirs: &[(Dir, PathBuf)],
    first: Signal,
    rx: &mut mpsc::UnboundedReceiver<Signal>,
    quiet: std::time::Duration,
    max: std::time::Duration,
) -> (Work, Vec<tokio::sync::oneshot::Sender<()>>) {
    let mut work = Work::default();
    let mut barriers = Vec::new();
    note(dirs, first, &mut work, &mut barriers);
    if work.is_empty() {
        return (work, barriers);
    }
    let deadline = tokio::time::Instant::now() + max;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        match tokio::time::timeout_at((now + quiet).min(deadline), rx.recv()).await {
            Ok(Some(next)) => note(dirs, next, &mut work, &mut barriers),
            Ok(None) | Err(_) => break,
        }
    }
    (work, barriers)
}

fn note(
    dirs: &[(Dir, PathBuf)],
    signal: Signal,
    work: &mut Work,
    barriers: &mut Vec<tokio::sync::oneshot::Sender<()>>,
) {
    match signal {
        Signal::Changed(paths) => {
            for path in paths {
                match which_dir(dirs, &path) {
                    Some((Dir::Agents, whole)) => {
                        work.agents = true;
                        work.rewatch |= whole;
                    }
                    Some((Dir::Capabilities, whole)) => {
                        work.capabilities = true;
                        work.rewatch |= whole;
                    }
                    None => {}
                }
            }
        }
        Signal::Reread => work.reread = true,
        Signal::Barrier(done) => barriers.push(done),
    }
}

/// What to watch for `dirs`: the parent of each (so that it is seen appearing or replaced
/// whole) and each that exists (a capabilities directory with its tree).
fn watches(dirs: &[(Dir, PathBuf)]) -> Vec<(PathBuf, notify::RecursiveMode)> {
    let mut wanted = Vec::new();
    for (kind, dir) in dirs {
        if let Some(parent) = dir.parent().filter(|p| p.is_dir()) {
            wanted.push((parent.to_owned(), notify::RecursiveMode::NonRecursive));
        }
        if dir.is_dir() {
            // Capability folders hold their files: the whole tree is watched.
            let mode = match kind {
                Dir::Agents => notify::RecursiveMode::NonRecursive,
                Dir::Capabilities => notify::RecursiveMode::Recursive,
            };
            wanted.push((dir.clone(), mode));
        }
    }
    wanted
}

/// The directory `path` is in, and whether it is that directory itself.
fn which_dir(dirs: &[(Dir, PathBuf)], path: &Path) -> Option<(Dir, bool)> {
    dirs.iter()
        .find(|(_, dir)| path.starts_with(dir))
        .map(|(kind, dir)| (*kind, path == dir))
}

/// `next`, where every capability whose folder no longer loads keeps the version `current`
/// has of it. Only when both were read from the same directory: a broken folder of a new
/// directory is not the folder of the same name in the old one. Pure.
pub fn keep_last_good(
    current: &CapabilityCatalog,
    mut next: CapabilityCatalog,
) -> CapabilityCatalog {
    let Some(dir) = next.dir.clone() else {
        return next;
    };
    if current.dir.as_ref() != Some(&dir) {
        return next;
    }
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
    use std::time::Duration;
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
        let mut current = CapabilityCatalog {
            dir: Some("/caps".into()),
            ..CapabilityCatalog::default()
        };
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
        let merged = keep_last_good(&current, next.clone());
        assert_eq!(merged.capabilities["git"].module.description, "old");
        assert!(merged.capabilities.contains_key("jq"));
        assert!(merged.errors[0].message.ends_with("stays in force)"));
        assert_eq!(merged.errors[1].message, "bad");

        // `[capabilities] dir` changed: a broken `git/` of the new directory does not keep
        // the old directory's `git`.
        current.dir = Some("/old-caps".into());
        let moved = keep_last_good(&current, next);
        assert!(!moved.capabilities.contains_key("git"), "{moved:?}");
        assert!(moved.capabilities.contains_key("jq"));
        assert_eq!(moved.errors[0].message, "must name a program");
    }

    /// A round that holds a SIGHUP whose file does not load and a change of the agents
    /// directory: the file changes nothing, and the directory is still read (under the
    /// configuration in force), its error reported.
    #[test]
    fn a_broken_file_does_not_lose_the_directory_changes_read_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("agents");
        std::fs::create_dir(&agents).unwrap();
        let mut config = TroupeConfig::default();
        config.agents.dir = Some(agents.clone());
        let (settings, settings_rx) = watch::channel(Arc::new(Reloadable::default()));
        let (agents_tx, agents_rx) = watch::channel(Arc::new(AgentCatalog::default()));
        let mut owner = Owner {
            config,
            resolve: Box::new(|| Err("troupe.toml: expected `=`".into())),
            watcher: None,
            dirs: Vec::new(),
            watching: Vec::new(),
            settings,
            agents: agents_tx,
        };
        std::fs::write(
            agents.join("coder.json"),
            r#"{"id": "coder", "role": "executor", "provider": {"type": "model"}}"#,
        )
        .unwrap();
        owner.apply(Work {
            agents: true,
            reread: true,
            ..Work::default()
        });
        assert!(agents_rx.borrow().agents.contains_key("coder"));
        let rejected = settings_rx.borrow().rejected.clone();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(rejected[0].message.contains("expected `=`"), "{rejected:?}");
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

    #[tokio::test(start_paused = true)]
    async fn a_directory_that_keeps_changing_is_read_within_the_maximum_delay() {
        use crate::live::QUIET;
        let dirs = vec![(Dir::Capabilities, PathBuf::from("/caps"))];
        let (tx, mut rx) = mpsc::unbounded_channel();
        // A change every half quiet period, for ever.
        let busy = tokio::spawn(async move {
            loop {
                tokio::time::sleep(QUIET / 2).await;
                let change = Signal::Changed(vec!["/caps/x/module.json".into()]);
                if tx.send(change).is_err() {
                    return;
                }
            }
        });
        let t0 = tokio::time::Instant::now();
        let first = Signal::Changed(vec!["/caps/x/README.md".into()]);
        let (work, _) = tokio::time::timeout(
            Duration::from_secs(60),
            gather(&dirs, first, &mut rx, QUIET, MAX_DEBOUNCE),
        )
        .await
        .expect("read within its maximum delay");
        assert!(t0.elapsed() <= MAX_DEBOUNCE + QUIET, "{:?}", t0.elapsed());
        assert!(
            work.capabilities && !work.rewatch && !work.agents,
            "{work:?}"
        );
        busy.abort();
        // The directory itself (created, removed, replaced): watched afresh.
        let (work, _) = gather(
            &dirs,
            Signal::Changed(vec!["/caps".into()]),
            &mut rx,
            QUIET,
            MAX_DEBOUNCE,
        )
        .await;
        assert!(work.capabilities && work.rewatch, "{work:?}");
    }

    fn capability_folder(dir: &Path, id: &str) {
        let folder = dir.join(id);
        std::fs::create_dir_all(&folder).unwrap();
        let module = serde_json::json!({
            "id": id,
            "description": format!("The {id} one."),
            "commands": [{"name": "hi", "argv": ["echo", "hi"], "description": "Says hi."}],
            "probe": ["true"],
        });
        std::fs::write(folder.join("module.json"), module.to_string()).unwrap();
        std::fs::write(folder.join("README.md"), "# usage\n").unwrap();
        std::fs::write(folder.join("cli.md"), "# detail\n").unwrap();
    }

    /// Waits (10 s at most) until the capabilities in force satisfy `check`.
    async fn until(live: &LiveConfig, what: &str, check: impl Fn(&CapabilityCatalog) -> bool) {
        let mut settings = live.settings();
        let seen = async {
            loop {
                if check(&settings.borrow_and_update().capabilities) {
                    return;
                }
                settings.changed().await.unwrap();
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), seen)
            .await
            .is_err()
        {
            panic!(
                "{what}: not read: {:?}",
                live.settings().borrow().capabilities
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_capabilities_directory_created_after_start_or_replaced_is_watched() {
        let root = tempfile::tempdir().unwrap();
        created_or_replaced_is_watched(root.path(), root.path().join("troupe.toml")).await;
    }

    /// The same with the configuration named relative to the working directory, as `troupe
    /// serve` finds `troupe.toml` by default (the directory's parent was then not watched).
    /// Changes this process's working directory: the suite runs each test in a process of
    /// its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_directory_beside_a_relative_configuration_is_watched_too() {
        let root = tempfile::tempdir().unwrap();
        std::env::set_current_dir(root.path()).unwrap();
        created_or_replaced_is_watched(root.path(), PathBuf::from("troupe.toml")).await;
    }

    async fn created_or_replaced_is_watched(root: &Path, source: PathBuf) {
        let config = TroupeConfig {
            source: Some(source),
            ..TroupeConfig::default()
        };
        let start = crate::capabilities::catalog(&config);
        assert!(start.capabilities.is_empty() && start.errors.is_empty());
        let again = config.clone();
        let live = LiveConfig::start(
            config,
            AgentCatalog::default(),
            start,
            Box::new(move || Ok(again.clone())),
        );
        assert_eq!(live.watch_error(), None);
        let caps = root.join("capabilities");
        capability_folder(&caps, "first");
        until(&live, "a directory created after start", |c| {
            c.capabilities.contains_key("first")
        })
        .await;
        capability_folder(&caps, "second");
        until(&live, "a folder added to it", |c| {
            c.capabilities.contains_key("second")
        })
        .await;
        // Replaced: a new directory prepared beside it, the old one removed, the new one
        // moved in its place.
        let next = root.join("capabilities.next");
        capability_folder(&next, "third");
        std::fs::remove_dir_all(&caps).unwrap();
        std::fs::rename(&next, &caps).unwrap();
        until(&live, "the replaced directory", |c| {
            c.capabilities.keys().eq(["third"])
        })
        .await;
        capability_folder(&caps, "fourth");
        until(&live, "a folder added to the replaced directory", |c| {
            c.capabilities.contains_key("fourth")
        })
        .await;
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
        next.modules.dir = Some("gateways".into());
        assert_eq!(
            restart_needed(&current, &next),
            [
                "agents.max_depth",
                "data_dir",
                "modules.dir",
                "server.listen"
            ]
        );
    }
}
