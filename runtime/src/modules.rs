//! The module registry (A10): modules and I/O gateways declared in the modules directory,
//! one folder per module holding `module.json` (or a file `<id>.json`).
//!
//! A module is a resident worker troupe starts and supervises (`protocol = "stdio"`: a child
//! process speaking line-delimited JSON on its stdin/stdout) or an endpoint it posts to
//! (`protocol = "http"`: a webhook). Its `direction` says what it does: an `input` gateway
//! feeds messages into a session, an `output` gateway receives replies (and module
//! dispatches), a `duplex` one does both. Its `mode` says how troupe delivers to it: `sync`
//! waits for its acknowledgement (a `{"type":"ack"}` line, a 2xx answer) within `timeout`;
//! `async` notifies and retries a failed delivery.
//!
//! A file that does not load is reported with its path and the field at fault; the others
//! still load.

use crate::config::TroupeConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use troupe_proto::agent::AgentLoadError;

/// What a module does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleDirection {
    /// Feeds messages into a session (a chat-channel bridge, a file watcher).
    Input,
    /// Receives replies and dispatches.
    Output,
    /// Both: the replies to what it fed go back to it.
    Duplex,
}

impl ModuleDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Output => "output",
            Self::Duplex => "duplex",
        }
    }

    /// Whether it feeds messages.
    pub fn feeds(self) -> bool {
        matches!(self, Self::Input | Self::Duplex)
    }

    /// Whether replies and dispatches may be delivered to it.
    pub fn receives(self) -> bool {
        matches!(self, Self::Output | Self::Duplex)
    }
}

/// How troupe delivers to a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// The delivery waits for the module's acknowledgement, within `timeout`.
    #[default]
    Sync,
    /// A notification: not waited for; a failed one is retried (`retries`, with backoff).
    Async,
}

impl DeliveryMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
        }
    }
}

/// How troupe talks to a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleProtocol {
    /// A resident child process: one JSON object per line on its stdin and stdout.
    Stdio,
    /// `POST` of a JSON body to `url`.
    Http,
    /// Declared by the contract, not run by this build (refused at load).
    Websocket,
}

/// The health probe of a stdio module: a `{"type":"ping"}` line every `interval`, to be
/// acknowledged within `timeout`; an unanswered probe restarts the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthProbe {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for HealthProbe {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
        }
    }
}

/// How a stdio module's process is restarted after it exits: after a backoff growing from
/// `backoff_min` to `backoff_max`, at most `max_restarts` times within `window`; past that
/// it stays down (its health says `failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestartPolicy {
    pub max_restarts: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_min: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            window: Duration::from_secs(60),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

/// One module's `module.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleDefinition {
    /// Letters, digits, `-` and `_`; its tool-policy name is `module__<id>`.
    pub id: String,
    /// What it is for: shown to a model that may dispatch to it.
    #[serde(default)]
    pub description: String,
    pub direction: ModuleDirection,
    #[serde(default)]
    pub mode: DeliveryMode,
    pub protocol: ModuleProtocol,
    /// stdio: the program (a relative path is taken from the module's folder when a file is
    /// there, else looked up on `PATH`).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// stdio: where it runs (relative: from the module's folder); default its folder.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// http: where deliveries are posted.
    #[serde(default)]
    pub url: Option<String>,
    /// http: extra headers of every post.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// stdio: the health probe; `None`: the process is only watched for its exit.
    #[serde(default)]
    pub health: Option<HealthProbe>,
    /// How long a delivery or a dispatch waits for the module's answer.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// async: how many times a failed delivery is tried again.
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default)]
    pub restart: RestartPolicy,
    /// output: the input gateways whose replies it receives (`"*"`: every one).
    #[serde(default)]
    pub sources: Vec<String>,
    /// input: the project whose current session its messages go to when they name none
    /// (default: the module's id).
    #[serde(default)]
    pub project: Option<String>,
    /// Where it was read from (its folder, or the directory of its file).
    #[serde(skip)]
    pub base: PathBuf,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_retries() -> u32 {
    3
}

impl ModuleDefinition {
    /// The tool-policy name of a dispatch to it.
    pub fn policy_name(&self) -> String {
        policy_name(&self.id)
    }

    /// The project of its messages' session.
    pub fn project(&self) -> &str {
        self.project.as_deref().unwrap_or(&self.id)
    }

    /// Whether it receives the replies to what `source` fed.
    pub fn receives_from(&self, source: &str) -> bool {
        self.direction.receives() && self.sources.iter().any(|s| s == "*" || s == source)
    }

    /// The checks serde cannot make: `(field, message)` of the first failure.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, message: String| Err((field.to_owned(), message));
        if self.id.is_empty()
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad(
                "id",
                format!(
                    "`{}` is not a module id (letters, digits, `-` and `_`)",
                    self.id
                ),
            );
        }
        if self.id.contains("__") {
            return bad("id", "a module id may not contain `__`".into());
        }
        // One project: `*` (every project, as a token may say) would let the module write
        // to every session.
        if let Some(project) = &self.project
            && (project.trim().is_empty() || project == "*")
        {
            return bad(
                "project",
                format!("`{project}` is not a project (a module belongs to one project)"),
            );
        }
        match self.protocol {
            ModuleProtocol::Stdio => {
                if self.command.as_deref().is_none_or(|c| c.trim().is_empty()) {
                    return bad(
                        "command",
                        "a stdio module needs the program to start".into(),
                    );
                }
                if self.url.is_some() {
                    return bad("url", "a stdio module has no url (it is started)".into());
                }
            }
            ModuleProtocol::Http => {
                let Some(url) = &self.url else {
                    return bad("url", "an http module needs the url to post to".into());
                };
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return bad("url", format!("`{url}` is not an http(s) URL"));
                }
                if self.direction.feeds() {
                    return bad(
                        "direction",
                        "an http module only receives (output); an input gateway over HTTP \
                         posts to troupe's API instead"
                            .into(),
                    );
                }
                if self.command.is_some() {
                    return bad("command", "an http module is not started".into());
                }
                if self.health.is_some() {
                    return bad("health", "the health probe is for stdio modules".into());
                }
            }
            ModuleProtocol::Websocket => {
                return bad(
                    "protocol",
                    "`websocket` modules are not supported yet (use stdio or http)".into(),
                );
            }
        }
        if !self.sources.is_empty() && !self.direction.receives() {
            return bad(
                "sources",
                "only an output or duplex module receives replies".into(),
            );
        }
        if self.timeout.is_zero() {
            return bad("timeout", "must be more than zero".into());
        }
        if let Some(h) = &self.health
            && (h.interval.is_zero() || h.timeout.is_zero())
        {
            return bad(
                "health",
                "interval and timeout must be more than zero".into(),
            );
        }
        if self.restart.backoff_min > self.restart.backoff_max {
            return bad(
                "restart.backoff_min",
                "must not exceed restart.backoff_max".into(),
            );
        }
        Ok(())
    }

    /// The program to start: a path relative to the module's folder when it names a file
    /// there, else as given (looked up on `PATH`).
    pub fn program(&self) -> Option<PathBuf> {
        let command = self.command.as_deref()?;
        let local = self.base.join(command);
        if command.contains('/') && local.is_file() {
            return Some(local);
        }
        Some(PathBuf::from(command))
    }

    /// Where the process runs.
    pub fn workdir(&self) -> PathBuf {
        match &self.cwd {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => self.base.join(dir),
            None => self.base.clone(),
        }
    }
}

pub use troupe_actors::modules::policy_name;

/// The modules of a directory, and the files that did not load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModuleCatalog {
    /// By id, sorted.
    pub modules: BTreeMap<String, ModuleDefinition>,
    pub errors: Vec<AgentLoadError>,
    pub dir: Option<PathBuf>,
}

/// The modules of a configuration (see [`TroupeConfig::modules_dir`]); empty without a
/// directory.
pub fn catalog(config: &TroupeConfig) -> ModuleCatalog {
    match config.modules_dir() {
        Some((dir, named)) => load(&dir, named),
        None => ModuleCatalog::default(),
    }
}

/// Reads every module of `dir`: a folder with a `module.json`, or a `<id>.json` file.
/// Anything else (a README, hidden files, a folder without `module.json`) is ignored.
pub fn load(dir: &Path, named: bool) -> ModuleCatalog {
    let mut catalog = ModuleCatalog {
        dir: Some(dir.to_owned()),
        ..ModuleCatalog::default()
    };
    let entries = match crate::config_dir_entries(dir, named, "modules") {
        Ok(Some(entries)) => entries,
        Ok(None) => return catalog,
        Err(error) => {
            catalog.errors.push(error);
            return catalog;
        }
    };
    let mut files: Vec<(PathBuf, Option<String>)> = entries
        .into_iter()
        .filter_map(|p| {
            if p.is_dir() {
                let file = p.join("module.json");
                let name = p.file_name()?.to_str()?.to_owned();
                file.is_file().then_some((file, Some(name)))
            } else if p.extension().and_then(|e| e.to_str()) == Some("json") {
                let stem = p.file_stem()?.to_str()?.to_owned();
                Some((p, Some(stem)))
            } else {
                None
            }
        })
        .collect();
    files.sort();
    for (file, expected) in files {
        match load_file(&file, expected.as_deref()) {
            Ok(def) => {
                if let Some(other) = catalog.modules.get(&def.id) {
                    catalog.errors.push(AgentLoadError {
                        file: file.clone(),
                        field: Some("id".into()),
                        message: format!(
                            "`{}` is already defined in {}",
                            def.id,
                            other.base.display()
                        ),
                    });
                } else {
                    catalog.modules.insert(def.id.clone(), def);
                }
            }
            Err(e) => catalog.errors.push(e),
        }
    }
    catalog
}

/// Loads and checks one `module.json`; `expected`: the id its folder or file name gives.
pub fn load_file(file: &Path, expected: Option<&str>) -> Result<ModuleDefinition, AgentLoadError> {
    let error = |field: Option<String>, message: String| AgentLoadError {
        file: file.to_owned(),
        field,
        message,
    };
    let text =
        std::fs::read_to_string(file).map_err(|e| error(None, format!("cannot read: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(&text);
    let mut def: ModuleDefinition = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let message = match message.rfind(" at line ") {
            Some(i) => message[..i].to_owned(),
            None => message,
        };
        error((path != ".").then_some(path), message)
    })?;
    def.base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    def.validate()
        .map_err(|(field, message)| error(Some(field), message))?;
    if let Some(expected) = expected
        && expected != def.id
    {
        return Err(error(
            Some("id".into()),
            format!(
                "module `{}` must be in a folder `{}/` or a file `{}.json`, not `{expected}`",
                def.id, def.id, def.id
            ),
        ));
    }
    Ok(def)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn folders_and_files_load_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "bridge/module.json",
            r#"{"id":"bridge","direction":"duplex","protocol":"stdio","command":"python3","args":["g.py"],
                "health":{"interval":"2s","timeout":"1s"}}"#,
        );
        write(
            d,
            "hook.json",
            r#"{"id":"hook","direction":"output","mode":"async","protocol":"http","url":"http://127.0.0.1:9/x","sources":["*"]}"#,
        );
        write(
            d,
            "ws.json",
            r#"{"id":"ws","direction":"output","protocol":"websocket","url":"ws://x"}"#,
        );
        write(
            d,
            "typo.json",
            r#"{"id":"typo","direction":"sideways","protocol":"stdio","command":"x"}"#,
        );
        write(
            d,
            "nocmd/module.json",
            r#"{"id":"nocmd","direction":"input","protocol":"stdio"}"#,
        );
        write(
            d,
            "other.json",
            r#"{"id":"renamed","direction":"input","protocol":"stdio","command":"x"}"#,
        );
        write(d, "README.md", "not a module");
        write(d, "empty/notes.txt", "no module.json here");
        let catalog = load(d, true);
        assert_eq!(
            catalog.modules.keys().collect::<Vec<_>>(),
            ["bridge", "hook"]
        );
        let bridge = &catalog.modules["bridge"];
        assert_eq!(bridge.mode, DeliveryMode::Sync);
        assert_eq!(bridge.timeout, Duration::from_secs(10));
        assert_eq!(bridge.workdir(), d.join("bridge"));
        assert_eq!(bridge.policy_name(), "module__bridge");
        assert!(catalog.modules["hook"].receives_from("bridge"));
        assert!(!bridge.receives_from("bridge"));
        let errors: Vec<(String, Option<String>)> = catalog
            .errors
            .iter()
            .map(|e| {
                (
                    e.file.strip_prefix(d).unwrap().display().to_string(),
                    e.field.clone(),
                )
            })
            .collect();
        assert_eq!(
            errors,
            [
                ("nocmd/module.json".to_owned(), Some("command".to_owned())),
                ("other.json".to_owned(), Some("id".to_owned())),
                ("typo.json".to_owned(), Some("direction".to_owned())),
                ("ws.json".to_owned(), Some("protocol".to_owned())),
            ]
        );
        let ws = catalog
            .errors
            .iter()
            .find(|e| e.file.ends_with("ws.json"))
            .unwrap();
        assert!(ws.to_string().contains("not supported yet"), "{ws}");
    }

    #[test]
    fn a_missing_directory_is_empty_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(load(&missing, false).errors.is_empty());
        assert_eq!(load(&missing, true).errors.len(), 1);
    }

    #[test]
    fn a_module_belongs_to_one_project() {
        let def = |project: &str| -> Result<(), (String, String)> {
            let d: ModuleDefinition = serde_json::from_value(serde_json::json!({
                "id": "m", "direction": "input", "protocol": "stdio", "command": "true",
                "project": project
            }))
            .unwrap();
            d.validate()
        };
        assert_eq!(def("*").unwrap_err().0, "project");
        assert_eq!(def("").unwrap_err().0, "project");
        assert!(def("alpha").is_ok());
    }

    #[test]
    fn http_modules_only_receive() {
        let def = |json: &str| -> Result<ModuleDefinition, (String, String)> {
            let d: ModuleDefinition = serde_json::from_str(json).unwrap();
            d.validate().map(|()| d)
        };
        assert_eq!(
            def(r#"{"id":"h","direction":"input","protocol":"http","url":"http://x"}"#)
                .unwrap_err()
                .0,
            "direction"
        );
        assert_eq!(
            def(r#"{"id":"h","direction":"output","protocol":"http","url":"ftp://x"}"#)
                .unwrap_err()
                .0,
            "url"
        );
        assert_eq!(
            def(r#"{"id":"a__b","direction":"output","protocol":"http","url":"http://x"}"#)
                .unwrap_err()
                .0,
            "id"
        );
        assert!(
            def(r#"{"id":"h","direction":"output","protocol":"http","url":"http://x"}"#).is_ok()
        );
    }
}
