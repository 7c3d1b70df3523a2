//! Loading agent definitions (A2): one file per agent in the agents directory, `<id>.json`
//! in the seed's `agent.json` shape or `<id>.toml` with the same fields.
//!
//! A file that does not load is reported with its path and the field at fault (`provider.type`,
//! `tools.whitelist[1]`); every other file still loads. After each file is checked alone, the
//! catalog checks what spans files: two files with one id, and workers that name no loaded
//! agent (repeated until nothing changes, since dropping an agent can orphan its dispatchers).
//! Other files in the directory (a README, hidden files) are ignored.

use crate::config::TroupeConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use troupe_actors::agents::AgentProviderFactory;
use troupe_proto::agent::{
    AgentCatalog, AgentDefinition, AgentHealth, AgentLoadError, ProviderKind,
};

/// The agents of a configuration: every definition of its agents directory (see
/// [`TroupeConfig::agents_dir`]), with `[agents] supervisor` checked (a supervisor that is not
/// a loaded model agent is an error of the configuration file). Empty without a directory.
pub fn catalog(config: &TroupeConfig) -> AgentCatalog {
    let Some((path, named)) = config.agents_dir() else {
        return AgentCatalog::default();
    };
    let mut catalog = load(&AgentsDir {
        path: path.clone(),
        named,
    });
    let configured = config.agents.supervisor.as_deref();
    if let Err(unusable) = troupe_actors::agents::listing::supervisor_of(&catalog, configured) {
        if troupe_actors::agents::listing::refused_for_output(&catalog, &unusable) {
            // The supervisor's `output` is an error of its own file.
            catalog.errors.push(AgentLoadError {
                file: definition_file(&path, &unusable.id),
                field: Some("output".into()),
                message: unusable.why,
            });
        } else if configured.is_some() || catalog.get(&unusable.id).is_some() {
            // A role-chosen supervisor that did not load has its own file's error already.
            catalog.errors.push(AgentLoadError {
                file: config.source.clone().unwrap_or_default(),
                field: Some("agents.supervisor".into()),
                message: unusable.why,
            });
        }
    }
    catalog
}

/// The file of the loaded agent `id` in `dir`: `<id>.json`, else `<id>.toml`.
fn definition_file(dir: &Path, id: &str) -> PathBuf {
    let json = dir.join(format!("{id}.json"));
    if json.is_file() {
        json
    } else {
        dir.join(format!("{id}.toml"))
    }
}

/// The kinds of external agents this build runs, one factory each. The in-process kind
/// (`model`) needs none: the session's hub runs it.
pub fn factories() -> Vec<Arc<dyn AgentProviderFactory>> {
    vec![
        Arc::new(troupe_acp::AcpFactory::default()),
        Arc::new(troupe_a2a::A2aProviderFactory::default()),
    ]
}

/// An agent's health without a session: a model agent is ready (its endpoint is reached at
/// its first dispatch); another kind is what its factory's probe says, and unavailable when
/// this build has no provider of that kind.
pub fn probe(
    definition: &AgentDefinition,
    factories: &[Arc<dyn AgentProviderFactory>],
) -> AgentHealth {
    let kind = definition.provider.kind();
    if kind == ProviderKind::Model {
        return AgentHealth::ok();
    }
    match factories.iter().find(|f| f.kind() == kind) {
        Some(factory) => factory.probe(definition),
        None => AgentHealth::unavailable(format!("no {kind} provider is plugged in")),
    }
}

/// Which agents directory to read, from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentsDir {
    pub path: PathBuf,
    /// Named in the configuration (then it must exist); the default may be absent.
    pub named: bool,
}

/// Reads every definition in `dir`. A missing directory is an empty catalog, with an error
/// when it was named.
pub fn load(dir: &AgentsDir) -> AgentCatalog {
    let mut catalog = AgentCatalog {
        dir: Some(dir.path.clone()),
        ..AgentCatalog::default()
    };
    let entries = match std::fs::read_dir(&dir.path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.named => return catalog,
        Err(e) => {
            catalog.errors.push(AgentLoadError {
                file: dir.path.clone(),
                field: None,
                message: format!("cannot read the agents directory: {e}"),
            });
            return catalog;
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| definition_format(p).is_some())
        .collect();
    files.sort();
    let mut loaded: Vec<(PathBuf, AgentDefinition)> = Vec::new();
    for file in files {
        match load_file(&file) {
            Ok(def) => {
                if let Some((other, _)) = loaded.iter().find(|(_, d)| d.id == def.id) {
                    catalog.errors.push(AgentLoadError {
                        file: file.clone(),
                        field: Some("id".into()),
                        message: format!("`{}` is already defined by {}", def.id, other.display()),
                    });
                } else {
                    // The version of the file in force, not of a duplicate refused after it.
                    if let Ok(bytes) = std::fs::read(&file) {
                        catalog.versions.insert(def.id.clone(), version_of(&bytes));
                    }
                    loaded.push((file, def));
                }
            }
            Err(e) => {
                catalog
                    .unloaded_supervisors
                    .extend(claimed_supervisor(&file));
                catalog.errors.push(e);
            }
        }
    }
    for dropped in drop_orphans(&mut loaded, &mut catalog.errors) {
        if dropped.role == "supervisor" {
            catalog.unloaded_supervisors.push(dropped.id);
        }
    }
    catalog.agents = loaded.into_iter().map(|(_, d)| (d.id.clone(), d)).collect();
    let kept = &catalog.agents;
    catalog.versions.retain(|id, _| kept.contains_key(id));
    catalog.unloaded_supervisors.sort();
    catalog.unloaded_supervisors.dedup();
    catalog
}

/// The id a definition file that did not load claims when its `role` reads `supervisor`
/// (read leniently, since the file is broken somewhere): its `id`, else its name without the
/// extension. `None` when the role cannot be read or is another.
fn claimed_supervisor(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let value: serde_json::Value = match definition_format(file)? {
        Format::Json => serde_json::from_str(&text).ok()?,
        Format::Toml => serde_json::to_value(toml::from_str::<toml::Table>(&text).ok()?).ok()?,
    };
    if value.get("role")?.as_str()? != "supervisor" {
        return None;
    }
    value
        .get("id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .or_else(|| file.file_stem()?.to_str().map(str::to_owned))
}

/// A definition's version: the first 12 hex digits of its file's SHA-256.
pub fn version_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The format of a definition file, by its extension; `None`: not a definition.
fn definition_format(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?;
    if name.starts_with('.') || !path.is_file() {
        return None;
    }
    match path.extension()?.to_str()? {
        "json" => Some(Format::Json),
        "toml" => Some(Format::Toml),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Toml,
}

/// Loads and checks one definition file.
pub fn load_file(file: &Path) -> Result<AgentDefinition, AgentLoadError> {
    let error = |field: Option<String>, message: String| AgentLoadError {
        file: file.to_owned(),
        field,
        message,
    };
    let format =
        definition_format(file).ok_or_else(|| error(None, "not a .json or .toml file".into()))?;
    let text =
        std::fs::read_to_string(file).map_err(|e| error(None, format!("cannot read: {e}")))?;
    let def = parse(&text, format).map_err(|(field, message)| error(field, message))?;
    def.validate()
        .map_err(|e| error(Some(e.field), e.message))?;
    if let Some(output) = &def.output {
        troupe_actors::governance::guardrail::OutputGuard::compile(output)
            .map_err(|e| error(Some("output.schema".into()), e))?;
    }
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if stem != def.id {
        return Err(error(
            Some("id".into()),
            format!(
                "the file of agent `{}` must be named `{}.{}`",
                def.id,
                def.id,
                match format {
                    Format::Json => "json",
                    Format::Toml => "toml",
                }
            ),
        ));
    }
    Ok(def)
}

/// Parses a definition; on failure the field at fault (when the error is about one) and
/// what is wrong with it.
fn parse(text: &str, format: Format) -> Result<AgentDefinition, (Option<String>, String)> {
    match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let message = strip_position(&e.inner().to_string());
                (field_of(e.path()), message)
            })
        }
        Format::Toml => {
            let de = toml::Deserializer::parse(text)
                .map_err(|e| (None, format!("not valid TOML: {}", e.message())))?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let message = e.inner().message().to_owned();
                (field_of(e.path()), message)
            })
        }
    }
}

/// A serde path as a field name (`provider.type`, `tools.whitelist[1]`); `None` at the root.
fn field_of(path: &serde_path_to_error::Path) -> Option<String> {
    let text = path.to_string();
    (text != ".").then_some(text)
}

/// serde_json appends ` at line L column C`; the field names the place better.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Drops agents whose workers name no loaded agent, with an error each, until every worker
/// left names a loaded agent.
fn drop_orphans(
    loaded: &mut Vec<(PathBuf, AgentDefinition)>,
    errors: &mut Vec<AgentLoadError>,
) -> Vec<AgentDefinition> {
    let mut dropped = Vec::new();
    loop {
        let ids: Vec<String> = loaded.iter().map(|(_, d)| d.id.clone()).collect();
        let bad = loaded
            .iter()
            .position(|(_, d)| d.workers.iter().any(|w| !ids.contains(w)));
        let Some(index) = bad else {
            return dropped;
        };
        let (file, def) = loaded.remove(index);
        let (i, worker) = def
            .workers
            .iter()
            .enumerate()
            .find(|(_, w)| !ids.contains(w))
            .map(|(i, w)| (i, w.clone()))
            .unwrap_or_default();
        errors.push(AgentLoadError {
            file,
            field: Some(format!("workers[{i}]")),
            message: format!("no agent `{worker}` is defined"),
        });
        dropped.push(def);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn load_all(dir: &Path) -> AgentCatalog {
        load(&AgentsDir {
            path: dir.to_owned(),
            named: true,
        })
    }

    #[test]
    fn json_and_toml_definitions_load_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "coder.json",
            r#"{"id":"coder","role":"executor","provider":{"type":"model","instructions":"Write code."},
               "tools":{"whitelist":["shell"],"authorizationRequired":["shell"]}}"#,
        );
        write(
            dir.path(),
            "reviewer.toml",
            r#"id = "reviewer"
role = "reviewer"
workers = ["coder"]
[provider]
type = "acp"
command = "codex-acp"
args = ["--x"]
[session]
bindingScope = "session"
resume = false
"#,
        );
        write(dir.path(), "README.md", "not a definition");
        let c = load_all(dir.path());
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), ["coder", "reviewer"]);
        assert!(!c.agents["reviewer"].session.resume);
        assert_eq!(c.agents["reviewer"].workers, ["coder"]);
    }

    #[test]
    fn an_output_schema_is_compiled_when_the_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "shaped.json",
            r#"{"id":"shaped","provider":{"type":"model"},
               "output":{"schema":{"type":"object","properties":{"a":{"type":"integer"}}},"onFailure":"ask_human"}}"#,
        );
        write(
            dir.path(),
            "broken.json",
            r#"{"id":"broken","provider":{"type":"model"},"output":{"schema":{"type":"nonsense"}}}"#,
        );
        write(
            dir.path(),
            "greedy.json",
            r#"{"id":"greedy","provider":{"type":"model"},"output":{"schema":{},"maxRetries":5}}"#,
        );
        write(
            dir.path(),
            "reserved.json",
            r#"{"id":"supervisor","provider":{"type":"model"}}"#,
        );
        write(
            dir.path(),
            "remote.json",
            r#"{"id":"remote","provider":{"type":"a2a","url":"http://127.0.0.1:9/a2a"},"output":{"schema":{}}}"#,
        );
        let c = load_all(dir.path());
        let output = c.agents["shaped"].output.as_ref().unwrap();
        assert_eq!(
            output.on_failure,
            troupe_proto::agent::GuardrailAction::AskHuman
        );
        assert_eq!(output.max_retries, 2);
        let mut fields: Vec<(String, Option<String>)> = c
            .errors
            .iter()
            .map(|e| {
                (
                    e.file.file_name().unwrap().to_string_lossy().into_owned(),
                    e.field.clone(),
                )
            })
            .collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                ("broken.json".to_owned(), Some("output.schema".to_owned())),
                (
                    "greedy.json".to_owned(),
                    Some("output.maxRetries".to_owned())
                ),
                ("remote.json".to_owned(), Some("output".to_owned())),
                ("reserved.json".to_owned(), Some("id".to_owned())),
            ]
        );
    }

    #[test]
    fn a_bad_file_names_itself_and_its_field_and_the_others_load() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "good.json",
            r#"{"id":"good","provider":{"type":"model"}}"#,
        );
        write(
            dir.path(),
            "kind.json",
            r#"{"id":"kind","provider":{"type":"iflow"}}"#,
        );
        write(
            dir.path(),
            "scope.toml",
            "id = \"scope\"\n[provider]\ntype = \"model\"\n[session]\nbindingScope = \"forever\"\n",
        );
        write(
            dir.path(),
            "tools.json",
            r#"{"id":"tools","provider":{"type":"model"},"tools":{"whitelist":[1]}}"#,
        );
        write(
            dir.path(),
            "typo.json",
            r#"{"id":"typo","provider":{"type":"model"},"rol":"x"}"#,
        );
        write(
            dir.path(),
            "named.json",
            r#"{"id":"other","provider":{"type":"model"}}"#,
        );
        write(dir.path(), "broken.json", r#"{"id": "#);
        write(
            dir.path(),
            "cmd.json",
            r#"{"id":"cmd","provider":{"type":"acp","command":""}}"#,
        );
        let c = load_all(dir.path());
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), ["good"]);
        let by_file = |name: &str| {
            c.errors
                .iter()
                .find(|e| e.file.file_name().unwrap() == name)
                .unwrap_or_else(|| panic!("no error for {name}: {:?}", c.errors))
                .clone()
        };
        let kind = by_file("kind.json");
        assert_eq!(kind.field.as_deref(), Some("provider.type"), "{kind}");
        assert!(kind.message.contains("iflow"), "{kind}");
        assert!(
            kind.message.contains("acp"),
            "names the expected kinds: {kind}"
        );
        let scope = by_file("scope.toml");
        assert_eq!(
            scope.field.as_deref(),
            Some("session.bindingScope"),
            "{scope}"
        );
        assert!(scope.message.contains("forever"), "{scope}");
        assert_eq!(
            by_file("tools.json").field.as_deref(),
            Some("tools.whitelist[0]")
        );
        let typo = by_file("typo.json");
        assert!(typo.message.contains("rol"), "{typo}");
        assert_eq!(by_file("named.json").field.as_deref(), Some("id"));
        let broken = by_file("broken.json");
        assert!(broken.message.contains("EOF"), "{broken}");
        assert_eq!(
            by_file("cmd.json").field.as_deref(),
            Some("provider.command")
        );
        let shown = by_file("kind.json").to_string();
        assert!(
            shown.contains("kind.json: field `provider.type`"),
            "{shown}"
        );
    }

    #[test]
    fn duplicate_ids_and_orphaned_workers_are_errors_of_their_file() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "a.json",
            r#"{"id":"a","provider":{"type":"model"},"workers":["b"]}"#,
        );
        write(
            dir.path(),
            "b.json",
            r#"{"id":"b","provider":{"type":"model"},"workers":["ghost"]}"#,
        );
        write(
            dir.path(),
            "c.json",
            r#"{"id":"c","provider":{"type":"model"}}"#,
        );
        write(
            dir.path(),
            "c.toml",
            "id = \"c\"\n[provider]\ntype = \"model\"\n",
        );
        let c = load_all(dir.path());
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), ["c"]);
        assert_eq!(c.errors.len(), 3, "{:?}", c.errors);
        // Its version is the file in force's, not the refused duplicate's.
        let in_force = std::fs::read(dir.path().join("c.json")).unwrap();
        assert_eq!(c.versions["c"], version_of(&in_force));
        let b = c
            .errors
            .iter()
            .find(|e| e.file.ends_with("b.json"))
            .unwrap();
        assert_eq!(b.field.as_deref(), Some("workers[0]"));
        assert!(b.message.contains("ghost"));
        let a = c
            .errors
            .iter()
            .find(|e| e.file.ends_with("a.json"))
            .unwrap();
        assert!(a.message.contains("`b`"), "{a}");
        assert!(c.errors.iter().any(|e| e.file.ends_with("c.toml")));
    }

    #[test]
    fn files_whose_role_is_supervisor_that_did_not_load_are_named() {
        let dir = tempfile::tempdir().unwrap();
        // Dropped for a worker that is not defined.
        write(
            dir.path(),
            "boss.json",
            r#"{"id":"boss","role":"supervisor","provider":{"type":"model"},"workers":["ghost"]}"#,
        );
        // Broken in itself (an unknown provider type), in TOML, its role still readable.
        write(
            dir.path(),
            "chief.toml",
            "id = \"chief\"\nrole = \"supervisor\"\n[provider]\ntype = \"carrier-pigeon\"\n",
        );
        // Broken, another role: not a supervisor.
        write(
            dir.path(),
            "helper.json",
            r#"{"id":"helper","role":"executor","provider":{"type":"nope"}}"#,
        );
        write(
            dir.path(),
            "coder.json",
            r#"{"id":"coder","role":"executor","provider":{"type":"model"}}"#,
        );
        let c = load_all(dir.path());
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), ["coder"]);
        assert_eq!(c.unloaded_supervisors, ["boss", "chief"]);
        // The built-in supervisor does not stand in for them.
        let unusable = troupe_actors::agents::listing::supervisor_of(&c, None).unwrap_err();
        assert_eq!(unusable.id, "boss");
        // And a configuration without `[agents] supervisor` gets no error of its own for it:
        // the files' errors say what is wrong.
        assert_eq!(c.errors.len(), 3, "{:?}", c.errors);
    }

    /// An `output` schema on the agent chosen as supervisor (by role or by `[agents]
    /// supervisor`) is refused as an error of its file, field `output`: it would never be
    /// applied to the supervisor's routing and direct replies.
    #[test]
    fn a_supervisor_with_an_output_schema_is_an_error_of_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let output =
            r#""output":{"schema":{"type":"object","properties":{"a":{"type":"string"}}}}"#;
        write(
            dir.path(),
            "boss.json",
            &format!(
                r#"{{"id":"boss","role":"supervisor","provider":{{"type":"model"}},{output}}}"#
            ),
        );
        write(
            dir.path(),
            "profiler.json",
            &format!(
                r#"{{"id":"profiler","role":"executor","provider":{{"type":"model"}},{output}}}"#
            ),
        );
        let mut config = TroupeConfig::default();
        config.agents.dir = Some(dir.path().to_owned());
        let by_role = catalog(&config);
        assert_eq!(by_role.errors.len(), 1, "{:?}", by_role.errors);
        assert_eq!(by_role.errors[0].file, dir.path().join("boss.json"));
        assert_eq!(by_role.errors[0].field.as_deref(), Some("output"));
        assert!(
            by_role.errors[0].message.contains("must not have `output`"),
            "{}",
            by_role.errors[0]
        );
        // Named in the configuration: the same, for its file.
        config.agents.supervisor = Some("profiler".into());
        let named = catalog(&config);
        assert_eq!(named.errors.len(), 1, "{:?}", named.errors);
        assert_eq!(named.errors[0].file, dir.path().join("profiler.json"));
        assert_eq!(named.errors[0].field.as_deref(), Some("output"));
        // As a worker, an agent with `output` loads without error.
        config.agents.supervisor = None;
        std::fs::remove_file(dir.path().join("boss.json")).unwrap();
        assert!(catalog(&config).errors.is_empty());
    }

    #[test]
    fn a_missing_directory_is_an_error_only_when_named() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("nowhere");
        let default = load(&AgentsDir {
            path: gone.clone(),
            named: false,
        });
        assert!(default.agents.is_empty() && default.errors.is_empty());
        let named = load(&AgentsDir {
            path: gone,
            named: true,
        });
        assert_eq!(named.errors.len(), 1);
    }
}
