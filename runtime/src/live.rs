//! Live configuration (A7): the agents directory is watched (the `notify` crate) and read
//! again after each change, without a restart.
//!
//! A change is read once the directory has been quiet for [`QUIET`] (an editor's save is
//! several events). The new catalog is published to every session's agent hub, which uses
//! it from the next task on (a running task keeps what it started with). A file that no
//! longer loads keeps its last good version in force, and its error (file and field) is
//! published with the catalog, so that each hub reports it as a `config_rejected` warning.
//! Each definition carries its version (the start of its file's SHA-256): `troupe agents
//! list` and `agents.list` show the one in force.

use crate::agents;
use crate::config::TroupeConfig;
use notify::Watcher;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use troupe_proto::AgentError;
use troupe_proto::agent::AgentCatalog;

/// How long the directory must be quiet before it is read again.
pub const QUIET: Duration = Duration::from_millis(150);

/// A watched agents directory: the catalog in force, updated as its files change. Dropping
/// it stops the watching.
pub struct LiveAgents {
    catalog: watch::Receiver<Arc<AgentCatalog>>,
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LiveAgents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LiveAgents {
    /// The catalog in force, and its changes.
    pub fn subscribe(&self) -> watch::Receiver<Arc<AgentCatalog>> {
        self.catalog.clone()
    }
}

/// Watches the agents directory of `config`, starting from `initial` (what was read at
/// start); `None` when there is no agents directory to watch.
pub fn watch_agents(
    config: &TroupeConfig,
    initial: AgentCatalog,
) -> Result<Option<LiveAgents>, AgentError> {
    let Some((dir, _)) = config.agents_dir() else {
        return Ok(None);
    };
    if !dir.is_dir() {
        return Ok(None);
    }
    let (changed, mut changes) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = changed.send(());
        }
    })
    .map_err(|e| AgentError::internal(format!("cannot watch {}: {e}", dir.display())))?;
    watcher
        .watch(&dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| AgentError::internal(format!("cannot watch {}: {e}", dir.display())))?;
    let (publish, catalog) = watch::channel(Arc::new(initial));
    let config = config.clone();
    let task = tokio::spawn(async move {
        while changes.recv().await.is_some() {
            // Wait for the directory to be quiet.
            while let Ok(Some(())) = tokio::time::timeout(QUIET, changes.recv()).await {}
            let config = config.clone();
            let Ok(read) = tokio::task::spawn_blocking(move || agents::catalog(&config)).await
            else {
                continue;
            };
            let current = publish.borrow().clone();
            let next = keep_last_good(&current, read);
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
                publish.send_replace(Arc::new(next));
            }
        }
    });
    Ok(Some(LiveAgents {
        catalog,
        _watcher: watcher,
        task,
    }))
}

/// `next`, where every agent whose file no longer loads keeps the definition (and version)
/// `current` has of it. Pure.
pub fn keep_last_good(current: &AgentCatalog, mut next: AgentCatalog) -> AgentCatalog {
    // A broken file of a new directory (`[agents] dir` changed) is not the file of the same
    // name in the old one.
    if current.dir != next.dir {
        return next;
    }
    for error in &mut next.errors {
        let Some(id) = error.file.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if next.agents.contains_key(id) {
            continue;
        }
        if let Some(def) = current.agents.get(id) {
            next.agents.insert(id.to_owned(), def.clone());
            if let Some(version) = current.versions.get(id) {
                next.versions.insert(id.to_owned(), version.clone());
            }
            error
                .message
                .push_str(" (the last good version stays in force)");
        }
    }
    next
}

/// The capability gauges, from the catalog in force.
pub fn capability_metrics(catalog: &troupe_proto::capability::CapabilityCatalog) {
    troupe_actors::capabilities::metrics::loaded(catalog.capabilities.len(), catalog.errors.len());
}

pub mod metrics {
    //! Live configuration metrics: bounded labels only.

    use metrics::{Unit, counter, describe_counter};
    use troupe_proto::agent::AgentCatalog;

    /// Times the agents directory was read again after a change, by outcome (`ok`, or
    /// `rejected` when a file did not load and its last good version stayed).
    pub const RELOADS_TOTAL: &str = "troupe_config_reloads_total";

    pub fn describe() {
        describe_counter!(
            RELOADS_TOTAL,
            Unit::Count,
            "Agent directory reloads after a change, by outcome (ok, rejected: a file did not load and its last good version stayed)"
        );
        for outcome in ["ok", "rejected"] {
            counter!(RELOADS_TOTAL, "outcome" => outcome).increment(0);
        }
    }

    pub fn reloaded(catalog: &AgentCatalog) {
        let outcome = if catalog.errors.is_empty() {
            "ok"
        } else {
            "rejected"
        };
        counter!(RELOADS_TOTAL, "outcome" => outcome).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::agent::{AgentDefinition, AgentLoadError};

    fn def(id: &str, role: &str) -> AgentDefinition {
        serde_json::from_value(serde_json::json!({
            "id": id, "role": role, "provider": {"type": "model"}
        }))
        .unwrap()
    }

    #[test]
    fn a_file_that_no_longer_loads_keeps_its_last_good_version() {
        let mut current = AgentCatalog::default();
        current.agents.insert("coder".into(), def("coder", "old"));
        current.versions.insert("coder".into(), "v1".into());
        let mut next = AgentCatalog::default();
        next.agents.insert("new".into(), def("new", "r"));
        next.errors.push(AgentLoadError {
            file: "agents/coder.json".into(),
            field: Some("provider.type".into()),
            message: "unknown variant".into(),
        });
        next.errors.push(AgentLoadError {
            file: "agents/other.json".into(),
            field: None,
            message: "bad".into(),
        });
        let merged = keep_last_good(&current, next.clone());
        assert_eq!(merged.agents["coder"].role, "old");
        assert_eq!(merged.versions["coder"], "v1");
        assert!(merged.agents.contains_key("new"));
        assert_eq!(merged.errors.len(), 2);
        assert!(merged.errors[0].message.ends_with("stays in force)"));
        assert_eq!(merged.errors[1].message, "bad");

        // `[agents] dir` changed: the new directory's broken `coder.json` does not keep the
        // old directory's `coder`.
        current.dir = Some("old-agents".into());
        let moved = keep_last_good(&current, next);
        assert!(!moved.agents.contains_key("coder"), "{moved:?}");
        assert_eq!(moved.errors[0].message, "unknown variant");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edit_is_read_again_and_a_broken_one_keeps_the_last_good_version() {
        let dir = tempfile::tempdir().unwrap();
        let agents_dir = dir.path().join("agents");
        std::fs::create_dir(&agents_dir).unwrap();
        let file = agents_dir.join("coder.json");
        std::fs::write(
            &file,
            r#"{"id":"coder","role":"one","provider":{"type":"model"}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("troupe.toml"), "").unwrap();
        let config = TroupeConfig {
            source: Some(dir.path().join("troupe.toml")),
            ..TroupeConfig::default()
        };
        let initial = agents::catalog(&config);
        let live = watch_agents(&config, initial).unwrap().unwrap();
        let mut rx = live.subscribe();
        let v1 = rx.borrow().versions["coder"].clone();
        std::fs::write(
            &file,
            r#"{"id":"coder","role":"two","provider":{"type":"model"}}"#,
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let edited = rx.borrow_and_update().clone();
        assert_eq!(edited.agents["coder"].role, "two");
        assert_ne!(edited.versions["coder"], v1);
        std::fs::write(
            &file,
            r#"{"id":"coder","role":"three","provider":{"type":"pigeon"}}"#,
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let broken = rx.borrow_and_update().clone();
        assert_eq!(
            broken.agents["coder"].role, "two",
            "the last good version stays"
        );
        assert_eq!(broken.versions["coder"], edited.versions["coder"]);
        assert_eq!(broken.errors[0].field.as_deref(), Some("provider.type"));
        assert!(broken.errors[0].file.ends_with("coder.json"));
    }
}
