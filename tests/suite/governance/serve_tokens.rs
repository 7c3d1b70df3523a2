//! Authorization tokens through the real `troupe serve`: issued over REST, presented with
//! messages, counted in the data directory's store across a restart of the process, and
//! never written to the store, the rollout or the logs in clear.

use crate::suite::serve::{Api, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use troupe_tests::troupe_bin;

/// A `troupe serve` child over `dir` (its stderr in `dir/serve-<n>.log`), killed when dropped.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, run: u32, replies: Value) -> (Serving, Api) {
    let script = dir.join(format!("script-{run}.json"));
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
    let log = std::fs::File::create(dir.join(format!("serve-{run}.log"))).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("troupe.toml"))
        .arg("--script")
        .arg(&script)
        .current_dir(dir)
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .env("RUST_LOG", "debug")
        .stderr(Stdio::from(log));
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    (Serving(child), Api::new(&base, None))
}

/// Every shell call runs `echo`, then the model says `done`.
fn echo_then_done(times: usize) -> Value {
    let one = [
        json!({"tool_calls": [{"name": "shell", "arguments": {"command": ["echo", "ran"]}}]}),
        json!({"text": "done"}),
    ];
    Value::Array(one.iter().cloned().cycle().take(2 * times).collect())
}

async fn say(api: &Api, session: &str, token: &str) -> Value {
    let (status, reply) = api
        .post(
            &format!("/api/sessions/{session}/messages"),
            json!({"text": "run it", "authorization": [token]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply
}

/// (output, is_error) of the session's shell calls so far, from its event stream.
async fn shell_results(api: &Api, session: &str, at_least: usize) -> Vec<(String, bool)> {
    let events = api
        .sse(session, None, |seen| {
            seen.iter()
                .filter(|e| e["kind"] == "tool_call_finished")
                .count()
                >= at_least
        })
        .await;
    events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            let p = &e["data"];
            (
                p["output"].as_str().unwrap_or_default().to_owned(),
                p["is_error"].as_bool().unwrap_or_default(),
            )
        })
        .collect()
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_two_uses_allows_exactly_two_calls_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n\n[chat]\napproval_policy = \"never\"\nsandbox_policy = \"full-access\"\n\n[tools]\nauthorizationRequired = [\"shell\"]\n",
            dir.path().join("data"),
            dir.path().join("history")
        ),
    )
    .unwrap();

    let (first, api) = serve(dir.path(), 1, echo_then_done(1));
    // Every token series is there at 0 before anything happened.
    let metrics = api
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"troupe_auth_tokens_total{event="used"} 0"#,
        r#"troupe_auth_token_refusals_total{reason="exhausted"} 0"#,
        r#"troupe_tool_policy_decisions_total{outcome="authorized"} 0"#,
        r#"troupe_tool_policy_denials_total{layer="request"} 0"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics");
    }
    let (status, issued) = api
        .post(
            "/api/tokens",
            json!({"agent": "*", "tool": "shell", "ttl_secs": 3600, "max_uses": 2, "issued_by": "ann"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let token = issued["token"].as_str().unwrap().to_owned();
    let token_id = issued["info"]["id"].as_str().unwrap().to_owned();
    assert!(token.starts_with("tat_"));
    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    assert_eq!(say(&api, &sid, &token).await["reply"]["text"], "done");
    let results = shell_results(&api, &sid, 1).await;
    assert_eq!(results, [("exit code 0\nran\n".to_owned(), false)]);
    drop(first);

    // Another process over the same data directory: the use counted before stays counted.
    let (_second, api) = serve(dir.path(), 2, echo_then_done(2));
    assert_eq!(say(&api, &sid, &token).await["reply"]["text"], "done");
    assert_eq!(say(&api, &sid, &token).await["reply"]["text"], "done");
    let results = shell_results(&api, &sid, 3).await;
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[1], ("exit code 0\nran\n".to_owned(), false));
    assert!(results[2].1, "the third call is refused: {results:?}");
    assert!(
        results[2].0.contains("policy rejected (unauthorized)") && results[2].0.contains("spent"),
        "{results:?}"
    );
    let (status, listed) = api.get("/api/tokens").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed[0]["id"], token_id.as_str());
    assert_eq!(
        (listed[0]["uses"].as_u64(), listed[0]["max_uses"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(
        listed.to_string().find("tat_").is_none(),
        "no secret in a listing"
    );

    // JSON-RPC: revoke, and the listing says so.
    let revoked = api.call("tokens.revoke", json!({"id": token_id})).await;
    assert!(revoked["revoked_ms"].is_u64(), "{revoked}");
    assert_eq!(
        api.call("tokens.list", json!({})).await[0]["revoked_ms"],
        revoked["revoked_ms"]
    );
    let refused = api
        .rpc(
            "tokens.issue",
            json!({"agent": "*", "tool": "shell", "ttl_secs": 60, "max_uses": 0}),
        )
        .await;
    assert!(
        refused["error"]["data"]["invalid_input"].is_object(),
        "{refused}"
    );
    drop(_second);

    // The secret is nowhere on disk (store, rollout) nor in the logs.
    let mut files = Vec::new();
    files_under(dir.path(), &mut files);
    for name in ["troupe.db", "rollout.db"] {
        assert!(
            files.iter().any(|f| f.ends_with(name)),
            "{name} in {files:?}"
        );
    }
    assert!(files.iter().any(|f| f.ends_with("serve-2.log")));
    for file in files {
        if file.extension().is_some_and(|e| e == "json") {
            continue; // the test's own scripts
        }
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !troupe_tests::contains(&bytes, &token),
            "the token is in {}",
            file.display()
        );
    }
}

/// `troupe tokens` on a configuration whose store is on PostgreSQL issues, lists and revokes
/// there, as `troupe serve` on that configuration reads them: no `troupe.db` appears in the
/// data directory, and the token is in the server's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_tokens_keeps_tokens_where_the_store_is() {
    use troupe_store::TokenStore;
    let dir = tempfile::tempdir().unwrap();
    let url = troupe_test_postgres::server().fresh_database();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!(
            "data_dir = \"data\"\n\n[store]\nbackend = \"postgres\"\npostgres_url = \"{url}\"\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(troupe_bin())
            .arg("tokens")
            .args(args)
            .args(["--config", "troupe.toml"])
            .current_dir(dir.path())
            .env_remove("TROUPE_CONFIG")
            .env_remove("TROUPE_STORE_BACKEND")
            .env_remove("TROUPE_POSTGRES_URL")
            .output()
            .unwrap()
    };
    let tokens = |args: &[&str]| {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "troupe tokens {args:?}: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    };
    let issued: Value = serde_json::from_str(&tokens(&[
        "issue",
        "--agent",
        "coder",
        "--tool",
        "shell",
        "--ttl",
        "1h",
        "--max-uses",
        "2",
        "--json",
    ]))
    .unwrap();
    let token_id = issued["info"]["id"].as_str().unwrap().to_owned();
    // Another tool's arguments are scoped by name; a command-line pattern for it is refused.
    let scoped: Value = serde_json::from_str(&tokens(&[
        "issue",
        "--agent",
        "*",
        "--tool",
        "files__write",
        "--field",
        "path=notes/*",
        "--field",
        "mode=a=b",
        "--ttl",
        "1h",
        "--max-uses",
        "1",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        scoped["info"]["fields"],
        serde_json::json!({"path": "notes/*", "mode": "a=b"})
    );
    for bad in [
        &["--args", r#"*"path":"notes/*"#][..],
        &["--field", "path"][..],
        &["--field", "path=a", "--field", "path=b"][..],
    ] {
        let out = run(&[
            &["issue", "--agent", "*", "--tool", "files__write"][..],
            bad,
            &["--ttl", "1h", "--max-uses", "1"][..],
        ]
        .concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} was issued");
        assert!(
            stderr.contains("--field")
                || stderr.contains("NAME=PATTERN")
                || stderr.contains("two patterns"),
            "{bad:?}: {stderr}"
        );
    }
    let listed: Value = serde_json::from_str(&tokens(&["list", "--json"])).unwrap();
    assert!(listed.to_string().contains(&token_id), "{listed}");
    let table = tokens(&["list"]);
    assert!(
        table.contains("files__write (mode=a=b, path=notes/*)"),
        "{table}"
    );
    assert!(
        !dir.path().join("data/troupe.db").exists(),
        "tokens went to a SQLite file instead of the configured store"
    );
    let store = troupe_store::PgStore::connect(&url).await.unwrap();
    let held = store.tokens().await.unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().any(|t| t.id == token_id));
    tokens(&["revoke", &token_id]);
    assert!(
        store
            .tokens()
            .await
            .unwrap()
            .iter()
            .any(|t| t.id == token_id && t.revoked_ms.is_some())
    );
}
