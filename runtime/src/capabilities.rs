//! Loading the capability registry (A6): one folder per capability in the capabilities
//! directory, holding `module.json`, `README.md` and `cli.md`.
//!
//! ```json
//! {
//!   "id": "git",
//!   "description": "Read the workspace's git history and status.",
//!   "commands": [
//!     {"name": "status", "argv": ["git", "status", "--short"], "description": "Changed files."},
//!     {"name": "log", "argv": ["git", "log", "--oneline", "-n", "{count}"], "description": "Recent commits."},
//!     {"name": "grep", "argv": ["git", "grep", "{flags}", "-e", "{pattern}"],
//!      "choices": {"flags": ["-i", "-w", "--count"]}, "description": "Search tracked files."}
//!   ],
//!   "probe": ["git", "--version"],
//!   "timeout": "20s"
//! }
//! ```
//!
//! A folder that does not load is reported with its file and the field at fault
//! (`commands[1].argv`); every other folder still loads. Files and hidden folders in the
//! directory are ignored.

use crate::config::TroupeConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use troupe_proto::agent::AgentLoadError;
use troupe_proto::capability::{
    Capability, CapabilityCatalog, CapabilityCommand, CapabilityModule,
};

/// The capabilities of a configuration (see [`TroupeConfig::capabilities_dir`]); empty
/// without a directory.
pub fn catalog(config: &TroupeConfig) -> CapabilityCatalog {
    match config.capabilities_dir() {
        Some((path, named)) => load(&path, named),
        None => CapabilityCatalog::default(),
    }
}

/// Reads every capability folder in `dir`. A missing directory is an empty catalog, with an
/// error when it was `named` in the configuration.
pub fn load(dir: &Path, named: bool) -> CapabilityCatalog {
    let mut catalog = CapabilityCatalog {
        dir: Some(dir.to_owned()),
        ..CapabilityCatalog::default()
    };
    let folders: Vec<PathBuf> = match crate::config_dir_entries(dir, named, "capabilities") {
        Ok(Some(entries)) => entries.into_iter().filter(|p| p.is_dir()).collect(),
        Ok(None) => return catalog,
        Err(error) => {
            catalog.errors.push(error);
            return catalog;
        }
    };
    for folder in folders {
        match load_folder(&folder) {
            Ok(capability) => {
                catalog
                    .capabilities
                    .insert(capability.module.id.clone(), capability);
            }
            Err(error) => catalog.errors.push(error),
        }
    }
    catalog
}

/// `module.json` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModuleFile {
    id: String,
    description: String,
    commands: Vec<CommandFile>,
    probe: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<std::time::Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandFile {
    name: String,
    argv: Vec<String>,
    description: String,
    #[serde(default)]
    options: Vec<String>,
    #[serde(default)]
    choices: std::collections::BTreeMap<String, Vec<String>>,
}

/// Loads and checks one capability folder: the folder is named after its id.
pub fn load_folder(folder: &Path) -> Result<Capability, AgentLoadError> {
    let module_path = folder.join("module.json");
    let error = |file: &Path, field: Option<String>, message: String| AgentLoadError {
        file: file.to_owned(),
        field,
        message,
    };
    let read = |file: &Path| {
        std::fs::read(file).map_err(|e| error(file, None, format!("cannot read: {e}")))
    };
    let bytes = read(&module_path)?;
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let module: ModuleFile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let message = match message.rfind(" at line ") {
            Some(i) => message[..i].to_owned(),
            None => message,
        };
        error(&module_path, (path != ".").then_some(path), message)
    })?;
    let module =
        check(module).map_err(|(field, message)| error(&module_path, Some(field), message))?;
    let name = folder
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name != module.id {
        return Err(error(
            &module_path,
            Some("id".into()),
            format!(
                "capability `{}` must be in a folder named `{}`",
                module.id, module.id
            ),
        ));
    }
    let text = |file: &str| {
        let path = folder.join(file);
        read(&path).and_then(|bytes| {
            String::from_utf8(bytes).map_err(|_| error(&path, None, "not UTF-8 text".into()))
        })
    };
    let readme = text("README.md")?;
    let cli = text("cli.md")?;
    let version = {
        let mut all = bytes.clone();
        all.extend_from_slice(readme.as_bytes());
        all.extend_from_slice(cli.as_bytes());
        crate::agents::version_of(&all)
    };
    Ok(Capability {
        module,
        readme,
        cli,
        version,
    })
}

/// Checks what serde cannot: ids and names the tool policy and the model can use, argv
/// templates whose program is fixed, a one-line description. Pure.
fn check(module: ModuleFile) -> Result<CapabilityModule, (String, String)> {
    use troupe_actors::capabilities::{PREFIX, is_key, placeholders};
    let id_ok = |id: &str| {
        !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if !id_ok(&module.id)
        || !troupe_actors::tools::is_valid_tool_name(&format!("{PREFIX}{}", module.id))
    {
        return Err((
            "id".into(),
            format!(
                "`{}` is not a usable id: letters, digits, `_` and `-`, at most {} characters",
                module.id,
                troupe_actors::tools::MAX_TOOL_NAME_LEN - PREFIX.len()
            ),
        ));
    }
    let description = module.description.trim();
    if description.is_empty() || description.contains('\n') {
        return Err((
            "description".into(),
            "must be one line of text (the model reads it in its prompt)".into(),
        ));
    }
    if module.commands.is_empty() {
        return Err((
            "commands".into(),
            "a capability needs at least one command".into(),
        ));
    }
    let mut commands: Vec<CapabilityCommand> = Vec::with_capacity(module.commands.len());
    for (i, command) in module.commands.into_iter().enumerate() {
        let field = |name: &str| format!("commands[{i}].{name}");
        if !is_key(&command.name) {
            return Err((
                field("name"),
                format!(
                    "`{}` is not a command name: letters, digits, `_` and `-`, starting with a letter",
                    command.name
                ),
            ));
        }
        if commands.iter().any(|c| c.name == command.name) {
            return Err((field("name"), format!("`{}` is named twice", command.name)));
        }
        match command.argv.first() {
            None => return Err((field("argv"), "must name a program".into())),
            Some(program)
                if program.is_empty()
                    || !placeholders(std::slice::from_ref(program)).is_empty() =>
            {
                return Err((
                    field("argv"),
                    "its first element is the program: fixed, not a {placeholder}".into(),
                ));
            }
            Some(_) => {}
        }
        let keys = placeholders(&command.argv);
        if let Some(unknown) = command.options.iter().find(|o| !keys.contains(o)) {
            return Err((
                field("options"),
                format!(
                    "`{unknown}` is not a placeholder of its argv (it has: {})",
                    if keys.is_empty() {
                        "none".to_owned()
                    } else {
                        keys.join(", ")
                    }
                ),
            ));
        }
        for (key, allowed) in &command.choices {
            let at = field(&format!("choices.{key}"));
            if !keys.contains(key) {
                return Err((
                    at,
                    format!("`{key}` is not a placeholder of its argv (it has: {})", {
                        if keys.is_empty() {
                            "none".to_owned()
                        } else {
                            keys.join(", ")
                        }
                    }),
                ));
            }
            if allowed.is_empty() {
                return Err((at, "must list at least one value".into()));
            }
            if command.options.contains(key) {
                return Err((
                    at,
                    format!(
                        "`{key}` is also in `options`, which would let it take any option: \
                         list it in one of the two"
                    ),
                ));
            }
        }
        commands.push(CapabilityCommand {
            name: command.name,
            argv: command.argv,
            description: command.description,
            options: command.options,
            choices: command.choices,
        });
    }
    if module.probe.first().is_none_or(String::is_empty) {
        return Err((
            "probe".into(),
            "must name a program and its arguments, e.g. [\"git\", \"--version\"]".into(),
        ));
    }
    Ok(CapabilityModule {
        id: module.id,
        description: description.to_owned(),
        commands,
        probe: module.probe,
        timeout_ms: module
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIT: &str = r#"{
        "id": "git",
        "description": "Read the workspace's git history.",
        "commands": [
            {"name": "status", "argv": ["git", "status", "--short"], "description": "Changed files."},
            {"name": "log", "argv": ["git", "log", "-n", "{count}"], "description": "Recent commits."}
        ],
        "probe": ["git", "--version"],
        "timeout": "20s"
    }"#;

    fn folder(dir: &Path, name: &str, module: &str) -> PathBuf {
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("module.json"), module).unwrap();
        std::fs::write(folder.join("README.md"), "# usage\n").unwrap();
        std::fs::write(folder.join("cli.md"), "# detail\n").unwrap();
        folder
    }

    #[test]
    fn a_folder_loads_with_its_documents() {
        let dir = tempfile::tempdir().unwrap();
        folder(dir.path(), "git", GIT);
        let catalog = load(dir.path(), true);
        assert!(catalog.errors.is_empty(), "{:?}", catalog.errors);
        let git = &catalog.capabilities["git"];
        assert_eq!(git.module.commands.len(), 2);
        assert!(git.module.commands[1].options.is_empty());
        assert!(git.module.commands[1].choices.is_empty());
        let listed = GIT.replace(
            r#""description": "Recent commits.""#,
            r#""description": "Recent commits.", "choices": {"count": ["1", "-5"]}"#,
        );
        folder(dir.path(), "git", &listed);
        let catalog = load(dir.path(), true);
        assert!(catalog.errors.is_empty(), "{:?}", catalog.errors);
        assert_eq!(
            catalog.capabilities["git"].module.commands[1].choices["count"],
            ["1", "-5"]
        );
        assert_eq!(git.module.timeout_ms, Some(20_000));
        assert_eq!(git.readme, "# usage\n");
        assert_eq!(git.cli, "# detail\n");
        assert_eq!(git.version.len(), 12);
    }

    #[test]
    fn a_bad_folder_is_reported_with_its_file_and_field_and_the_others_load() {
        let dir = tempfile::tempdir().unwrap();
        folder(dir.path(), "git", GIT);
        let cases = [
            (
                "a",
                GIT.replace(r#""id": "git""#, r#""id": "a""#)
                    .replace("\"20s\"", "\"soon\""),
                "timeout",
            ),
            (
                "b",
                GIT.replace(r#""id": "git""#, r#""id": "b""#)
                    .replace(r#"["git", "log""#, r#"["{prog}", "log""#),
                "commands[1].argv",
            ),
            (
                "c",
                GIT.replace(r#""id": "git""#, r#""id": "c""#)
                    .replace(r#""name": "log""#, r#""name": "status""#),
                "commands[1].name",
            ),
            (
                "d",
                GIT.replace(r#""id": "git""#, r#""id": "d""#)
                    .replace(r#""probe""#, r#""probes""#),
                "probes",
            ),
            ("e", GIT.replace(r#""id": "git""#, r#""id": "x y""#), "id"),
            ("f", GIT.replace(r#""id": "git""#, r#""id": "other""#), "id"),
            (
                "g",
                GIT.replace(r#""id": "git""#, r#""id": "g""#)
                    .replace("[\"git\", \"--version\"]", "[]"),
                "probe",
            ),
            (
                "h",
                GIT.replace(r#""id": "git""#, r#""id": "h""#)
                    .replace(r#""description": "Changed files.""#, r#""description": 3"#),
                "commands[0].description",
            ),
            (
                "i",
                GIT.replace(r#""id": "git""#, r#""id": "i""#)
                    .replace("Read the workspace's git history.", "two\\nlines"),
                "description",
            ),
            (
                "j",
                GIT.replace(r#""id": "git""#, r#""id": "j""#).replace(
                    r#""description": "Recent commits.""#,
                    r#""description": "Recent commits.", "options": ["counts"]"#,
                ),
                "commands[1].options",
            ),
            (
                "k",
                GIT.replace(r#""id": "git""#, r#""id": "k""#).replace(
                    r#""description": "Recent commits.""#,
                    r#""description": "Recent commits.", "choices": {"counts": ["1"]}"#,
                ),
                "commands[1].choices.counts",
            ),
            (
                "l",
                GIT.replace(r#""id": "git""#, r#""id": "l""#).replace(
                    r#""description": "Recent commits.""#,
                    r#""description": "Recent commits.", "choices": {"count": []}"#,
                ),
                "commands[1].choices.count",
            ),
            (
                "m",
                GIT.replace(r#""id": "git""#, r#""id": "m""#).replace(
                    r#""description": "Recent commits.""#,
                    r#""description": "Recent commits.", "options": ["count"], "choices": {"count": ["-1"]}"#,
                ),
                "commands[1].choices.count",
            ),
        ];
        for (name, text, _) in &cases {
            folder(dir.path(), name, text);
        }
        std::fs::write(dir.path().join("notes.txt"), "not a folder").unwrap();
        std::fs::create_dir(dir.path().join(".hidden")).unwrap();
        let catalog = load(dir.path(), true);
        assert_eq!(catalog.capabilities.keys().collect::<Vec<_>>(), ["git"]);
        assert_eq!(catalog.errors.len(), cases.len(), "{:#?}", catalog.errors);
        for ((name, _, field), error) in cases.iter().zip(&catalog.errors) {
            assert!(
                error.file.ends_with(format!("{name}/module.json")),
                "{error}"
            );
            assert_eq!(error.field.as_deref(), Some(*field), "{error}");
        }
    }

    #[test]
    fn missing_documents_and_directories_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let git = folder(dir.path(), "git", GIT);
        std::fs::remove_file(git.join("cli.md")).unwrap();
        let catalog = load(dir.path(), true);
        assert!(
            catalog.errors[0].file.ends_with("git/cli.md"),
            "{:?}",
            catalog.errors
        );
        let absent = dir.path().join("absent");
        assert!(load(&absent, false).errors.is_empty());
        assert!(
            load(&absent, true).errors[0]
                .message
                .contains("cannot read the capabilities directory")
        );
    }
}
