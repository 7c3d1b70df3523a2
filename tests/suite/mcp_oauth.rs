//! OAuth for remote MCP servers through the real binary: `troupe mcp login` (the test plays
//! the browser by following the authorization URL's redirect to the loopback listener),
//! `status` and `logout`; `chat --once` calling a tool of the protected server, before the
//! login (a clear error naming the command) and after it (including a refresh); `troupe serve`
//! with the client-credentials grant and nobody at a terminal. The MCP server is the npm
//! server-everything behind the test authorization server and its protecting proxy.

use super::serve::Api;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use troupe_test_support::mcp::EverythingHttp;
use troupe_test_support::oauth::{OAuthOptions, ProtectedMcp};
use troupe_test_support::{ModelServer, Reply};
use troupe_tests::{spawn_serve, troupe_bin};

/// Variables that would choose the model or the configuration for the child.
const MODEL_ENV: [&str; 7] = [
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "TROUPE_CONFIG",
    "TROUPE_PROVIDER",
    "TROUPE_BASE_URL",
    "TROUPE_SCRIPT",
    "BROWSER",
];

fn troupe(cwd: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(troupe_bin());
    for k in MODEL_ENV {
        cmd.env_remove(k);
    }
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("troupe did not finish in time")
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `troupe.toml` in `dir` with the protected server as `remote` (and `oauth` as given).
fn config(dir: &Path, url: &str, oauth: &str) {
    std::fs::write(
        dir.join("troupe.toml"),
        format!(
            "data_dir = \"data\"\n\
             [[mcp.servers]]\nname = \"remote\"\ntype = \"streamable_http\"\nurl = \"{url}\"\n\
             oauth = {oauth}\n"
        ),
    )
    .unwrap();
}

fn token_file(dir: &Path) -> PathBuf {
    dir.join("data/mcp-auth/remote.json")
}

/// The access and refresh tokens stored for `remote`.
fn stored_tokens(dir: &Path) -> Vec<String> {
    let login: Value = serde_json::from_slice(&std::fs::read(token_file(dir)).unwrap()).unwrap();
    let response = &login["credentials"]["token_response"];
    ["access_token", "refresh_token"]
        .iter()
        .filter_map(|k| response[k].as_str().map(str::to_owned))
        .collect()
}

/// Every file under `dir` except the token files, as bytes.
fn everything_but_tokens(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                if !p.ends_with("mcp-auth") {
                    stack.push(p);
                }
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out
}

/// `troupe mcp login remote`, with this test as the browser: reads the authorization URL
/// the command prints and follows it (the authorization server approves at once and
/// redirects to the command's loopback listener).
async fn login(dir: &Path) -> (Output, u16) {
    let mut cmd = troupe(dir);
    cmd.args(["mcp", "login", "remote", "--timeout", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("no authorization URL")
    .unwrap();
    let url = line.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "not a URL: {url:?}");
    let status = reqwest::get(&url).await.unwrap().status().as_u16();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the login did not end")
        .unwrap();
    (out, status)
}

/// `chat --once` (with `extra` flags) against `model`, whose first reply calls `remote__echo`.
async fn once(dir: &Path, model: &ModelServer, message: &str, extra: &[&str]) -> Output {
    model.push(Reply::tool_call(
        "remote__echo",
        [json!({ "message": message }).to_string()],
    ));
    model.push(Reply::text(["done"]));
    let mut cmd = troupe(dir);
    cmd.args(["chat", "--once", "--base-url", &model.base_url()])
        .args(extra)
        .arg("go");
    output(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_status_chat_refresh_and_logout_through_the_binary() {
    let everything = EverythingHttp::start().await;
    let protected = ProtectedMcp::start(&everything.url(), OAuthOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    config(dir, &protected.url, "{}");

    let mut status = troupe(dir);
    status.args(["mcp", "status"]);
    let out = output(status).await;
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("remote: ")
            && text(&out.stdout).contains("not logged in: run `troupe mcp login remote`"),
        "{}",
        text(&out.stdout)
    );

    // Before a login: the turn goes on without the server, and stderr says what to run.
    let model = ModelServer::start().await;
    let out = once(dir, &model, "too early", &[]).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("MCP server `remote`") && stderr.contains("troupe mcp login remote"),
        "{stderr}"
    );
    assert_eq!(protected.stats().proxied, 0);

    // The login.
    let (out, page) = login(dir).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(page, 200);
    assert!(stderr.contains("Logged in to `remote`"), "{stderr}");
    assert!(stderr.contains("registered just now"), "{stderr}");
    let tokens = stored_tokens(dir);
    assert_eq!(tokens.len(), 2, "an access and a refresh token");

    let mut status = troupe(dir);
    status.args(["mcp", "status"]);
    let out = output(status).await;
    let shown = text(&out.stdout);
    assert!(shown.contains("logged in as client"), "{shown}");
    assert!(shown.contains("refresh token: yes"), "{shown}");
    assert!(
        tokens.iter().all(|t| !shown.contains(t.as_str())),
        "{shown}"
    );

    // A turn calls the protected server's tool.
    let model = ModelServer::start().await;
    let out = once(dir, &model, "with a login", &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let second = model.requests()[1].body.to_string();
    assert!(second.contains("Echo: with a login"), "{second}");

    // The server stops taking the token: the next run refreshes it and goes on (an
    // ephemeral run too: the login is a credential, not part of its session).
    protected.revoke_access_tokens();
    let model = ModelServer::start().await;
    let out = once(dir, &model, "after a refresh", &["--ephemeral"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        model.requests()[1]
            .body
            .to_string()
            .contains("Echo: after a refresh")
    );
    assert_eq!(protected.stats().refreshes, 1);

    // No token reached the rollout, the history or a log file.
    let mut all_tokens = tokens;
    all_tokens.extend(stored_tokens(dir));
    for (path, bytes) in everything_but_tokens(dir) {
        let content = String::from_utf8_lossy(&bytes);
        for token in &all_tokens {
            assert!(
                !content.contains(token.as_str()),
                "{} holds a token",
                path.display()
            );
        }
    }

    let mut logout = troupe(dir);
    logout.args(["mcp", "logout", "remote"]);
    let out = output(logout).await;
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("Forgot the login to `remote`"));
    assert!(!token_file(dir).exists());

    // With $BROWSER set, the login opens the URL itself.
    let browser = dir.join("browser.py");
    std::fs::write(
        &browser,
        "#!/usr/bin/env python3\nimport sys, urllib.request\n\
         urllib.request.urlopen(sys.argv[1], timeout=20).read()\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut login = troupe(dir);
    login
        .args(["mcp", "login", "remote", "--timeout", "30s"])
        .env("BROWSER", &browser);
    let out = output(login).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(token_file(dir).exists());
    assert_eq!(protected.stats().authorizations, 2);

    // An unknown server is named, with the configured ones.
    let mut unknown = troupe(dir);
    unknown.args(["mcp", "login", "nope"]);
    let out = output(unknown).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no MCP server `nope`; the configured ones are remote"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_uses_the_client_credentials_grant_headless() {
    let everything = EverythingHttp::start().await;
    let protected = ProtectedMcp::start(
        &everything.url(),
        OAuthOptions {
            clients: vec![("svc".into(), Some("svc-secret".into()))],
            ..OAuthOptions::default()
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    config(
        dir,
        &protected.url,
        "{ grant = \"client_credentials\", client_id = \"svc\", client_secret_env = \"SVC_SECRET\" }",
    );
    // A second server that needs a login nobody did: reported, not waited for.
    let mut toml = std::fs::read_to_string(dir.join("troupe.toml")).unwrap();
    toml.push_str(&format!(
        "[[mcp.servers]]\nname = \"locked\"\ntype = \"streamable_http\"\nurl = \"{}\"\noauth = {{}}\n",
        protected.url
    ));
    std::fs::write(dir.join("troupe.toml"), toml).unwrap();
    std::fs::write(
        dir.join("script.json"),
        json!({"replies": [
            {"tool_calls": [{"name": "remote__echo", "arguments": {"message": "from serve"}}]}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(troupe_bin());
    for k in MODEL_ENV {
        cmd.env_remove(k);
    }
    cmd.current_dir(dir)
        .env("SVC_SECRET", "svc-secret")
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--script",
            "script.json",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let (mut child, base) = spawn_serve(&mut cmd);
    let api = Api::new(&base, None);
    let session = api.session(None).await;
    let sid = session["session_id"].as_str().unwrap().to_owned();
    let ready = |e: &Value| e["kind"] == "mcp_server_ready" && e["data"]["server"] == "remote";
    let locked = |e: &Value| {
        e["kind"] == "warning"
            && e["data"]["code"] == "mcp_server_failed"
            && e["data"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("run `troupe mcp login locked`"))
    };
    let events = api
        .sse(&sid, None, |events| {
            events.iter().any(ready) && events.iter().any(locked)
        })
        .await;
    assert!(events.iter().any(ready), "{events:?}");
    assert!(events.iter().any(locked), "{events:?}");
    let reply = api.say(&sid, "echo it").await;
    assert!(reply.to_string().contains("Echo: from serve"), "{reply}");
    let stats = protected.stats();
    assert_eq!(stats.client_credentials, 1);
    assert_eq!(stats.authorizations, 0, "nobody was asked to log in");
    assert!(
        token_file(dir).exists(),
        "the token is kept for the next start"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}
