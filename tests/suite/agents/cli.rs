//! `troupe agents list` as a person runs it: definitions beside the configuration file, a bad
//! one named with its field while the others still list.

use std::process::Command;
use troupe_tests::troupe_bin;

/// A configuration directory with `troupe.toml` and three definitions, one of them bad.
fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!("data_dir = {:?}\n", dir.path().join("data")),
    )
    .unwrap();
    std::fs::write(
        agents.join("coder.json"),
        r#"{"id": "coder", "role": "executor",
            "provider": {"type": "model", "instructions": "You write code."},
            "session": {"bindingScope": "session", "resume": true},
            "tools": {"whitelist": ["shell"], "blacklist": ["apply_patch"], "authorizationRequired": ["shell"]}}"#,
    )
    .unwrap();
    std::fs::write(
        agents.join("reviewer.toml"),
        "id = \"reviewer\"\nrole = \"reviewer\"\n[provider]\ntype = \"acp\"\ncommand = \"codex-acp\"\n",
    )
    .unwrap();
    std::fs::write(
        agents.join("broken.json"),
        r#"{"id": "broken", "provider": {"type": "model"}, "session": {"bindingScope": "forever"}}"#,
    )
    .unwrap();
    dir
}

#[test]
fn list_shows_every_agent_that_loaded_and_names_the_file_and_field_that_did_not() {
    let dir = config_dir();
    let out = Command::new(troupe_bin())
        .args(["agents", "list", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .env_remove("TROUPE_AGENTS_DIR")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a file did not load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("HEALTH"));
    assert!(lines[1].starts_with("coder") && lines[1].contains("model") && lines[1].contains("ok"));
    assert!(lines[2].starts_with("reviewer") && lines[2].contains("acp"));
    assert!(
        lines[2].contains("unavailable: command `codex-acp` is not found"),
        "the probe looks for the program without starting it: {stdout}"
    );
    assert!(
        stderr.contains("broken.json: field `session.bindingScope`") && stderr.contains("forever"),
        "{stderr}"
    );
}

#[test]
fn list_json_holds_agents_and_errors() {
    let dir = config_dir();
    let out = Command::new(troupe_bin())
        .args(["agents", "list", "--json", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .env_remove("TROUPE_AGENTS_DIR")
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = listing["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 2);
    assert_eq!(agents[0]["id"], "coder");
    assert_eq!(agents[0]["role"], "executor");
    assert_eq!(agents[0]["provider"], "model");
    assert_eq!(agents[0]["health"]["status"], "ok");
    assert_eq!(agents[0]["bindings"], serde_json::json!([]));
    assert_eq!(agents[1]["provider"], "acp");
    assert_eq!(listing["errors"][0]["field"], "session.bindingScope");
    assert!(
        listing["errors"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("broken.json")
    );
}

#[test]
fn without_a_configuration_there_are_no_agents() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(troupe_bin())
        .args(["agents", "list"])
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no agents directory"));
}

#[tokio::test]
async fn list_shows_the_bindings_the_store_holds() {
    use troupe_store::BindingStore;
    let dir = config_dir();
    let session_id = troupe_proto::SessionId::new();
    {
        let store = troupe_store::SqliteStore::open_in(dir.path().join("data")).unwrap();
        store
            .put_binding(troupe_proto::agent::AgentBinding {
                session_id,
                agent_id: "coder".into(),
                provider: troupe_proto::agent::ProviderKind::Model,
                provider_session_id: "conv-1".into(),
                created_ms: 1,
                updated_ms: 2,
            })
            .await
            .unwrap();
    }
    let out = Command::new(troupe_bin())
        .args(["agents", "list", "--json", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .env_remove("TROUPE_AGENTS_DIR")
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let coder = &listing["agents"][0];
    assert_eq!(coder["id"], "coder");
    assert_eq!(coder["bindings"][0]["provider_session_id"], "conv-1");
    assert_eq!(coder["bindings"][0]["session_id"], session_id.to_string());
    assert_eq!(listing["agents"][1]["bindings"], serde_json::json!([]));
    let table = Command::new(troupe_bin())
        .args(["agents", "list", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .env_remove("TROUPE_AGENTS_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&table.stdout);
    let coder_line = stdout.lines().find(|l| l.starts_with("coder")).unwrap();
    assert!(coder_line.contains("  1  "), "one binding: {stdout}");
}
