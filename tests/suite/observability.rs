//! Operations (O2, O3): `/metrics` of a real `troupe serve` after a scripted workload over its
//! HTTP API passes `promtool check metrics`; a real Prometheus scraping it with the shipped
//! scrape configuration and alert rules finds a series for every dashboard query and evaluates
//! every rule; every metric a panel or a rule names is exported; the dashboards pass the
//! dashboard linter, the rules and the scrape configuration pass promtool; the sample
//! configuration parses and the systemd unit covers its directories.
//!
//! Needs `promtool` and `prometheus` (Debian's `prometheus` package; `scripts/test` installs
//! it), `node` and the reference MCP servers (`scripts/install-mcp-servers`). Everything
//! listens on 127.0.0.1.

use super::serve::{Api, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use troupe_runtime::config::TroupeConfig;
use troupe_test_support::mcp::server_entry;
use troupe_test_support::{ModelServer, Reply};
use troupe_tests::troupe_bin;

/// The operator's token of the workload; Prometheus gets its own, bound to no project.
const OPS_TOKEN: &str = "ops-token";
const PROMETHEUS_TOKEN: &str = "prometheus-token";

/// Metrics a panel names that a healthy workload cannot produce: storage failures. Their
/// panels add `or vector(0)`, so the queries still answer.
const NEVER_IN_A_HEALTHY_RUN: &[&str] = &[
    // A failed write of the rollout writer (a full disk, a broken database).
    "troupe_rollout_write_errors_total",
    // A failed store operation (the same; unknown ids are answers, not failures).
    "troupe_store_errors_total",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is inside the repository")
        .to_owned()
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("dashboards/grafana");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(out.len(), 9, "nine dashboards in {}", dir.display());
    out
}

/// Every (panel title, expression) of a dashboard, rows' nested panels included.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_default().to_owned();
                out.push((p["title"].as_str().unwrap_or("?").to_owned(), expr));
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// What Grafana would send for `$__rate_interval` and an "All" `$job`.
fn concrete(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m").replace("$job", ".*")
}

/// Metric names in PromQL or rule text: troupe's own and the GenAI client metrics (label
/// names never start with either prefix).
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    for prefix in ["troupe_", "gen_ai_client_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            let boundary = start == 0 || {
                let b = bytes[start - 1];
                !(b.is_ascii_alphanumeric() || b == b'_')
            };
            let end = text[start..]
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .map_or(text.len(), |n| start + n);
            if boundary {
                names.push(text[start..end].to_owned());
            }
            from = end;
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Sample names of a Prometheus text exposition.
fn exported(exposition: &str) -> std::collections::BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is missing: scripts/test installs it (Debian package prometheus)")
        })
}

/// Runs a command to its end (at most a minute); its exit status and output.
fn run(cmd: &mut Command, stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The workload's configuration: the model server, the `everything` MCP server and one that
/// cannot start, approvals asked for every command, one task at a time, quick retries.
fn troupe_config(model: &ModelServer, data: &Path) -> String {
    let everything = server_entry("server-everything");
    format!(
        r#"
data_dir = "{data}"
log_dir = "{data}/history"

[model]
provider = "openai-chat"
base_url = "{base}"
api_key_env = ""
model = "gpt-4o-mini"
max_retries = 1
retry_base = "10ms"
retry_max = "50ms"

[chat]
approval_policy = "always"
sandbox_policy = "full_access"

[server]
listen = "127.0.0.1:0"
grace_period = "2s"
max_running_tasks = 1

[[server.tokens]]
token = "{OPS_TOKEN}"
projects = ["*"]

[[server.tokens]]
token = "{PROMETHEUS_TOKEN}"
projects = []

[[mcp.servers]]
name = "everything"
type = "stdio"
command = "node"
args = ["{everything}", "stdio"]

[[mcp.servers]]
name = "broken"
type = "stdio"
command = "false"

[mcp.limits]
restart_backoff_base = "200ms"
restart_backoff_max = "1s"
"#,
        data = data.display(),
        base = model.base_url(),
        everything = everything.display(),
    )
}

/// `troupe serve` with `config` (and no module: the module series exist all the same); its
/// base URL.
fn spawn_troupe(dir: &Path, config: &str) -> (Killed, String) {
    let path = dir.join("troupe.toml");
    std::fs::write(&path, config).unwrap();
    assert!(!dir.join("modules").exists());
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .env_remove("TROUPE_CONFIG")
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    (Killed(child), base)
}

/// The shipped scrape configuration and rules, pointed at `target` every second.
fn prometheus_config(dir: &Path, target: &str) -> PathBuf {
    let shipped = repo().join("dashboards/prometheus");
    let token = dir.join("troupe.token");
    std::fs::write(&token, PROMETHEUS_TOKEN).unwrap();
    let rules = shipped.join("alerts.yml");
    let mut text = std::fs::read_to_string(shipped.join("prometheus.yml")).unwrap();
    for (from, to) in [
        ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
        (
            "evaluation_interval: 15s",
            "evaluation_interval: 1s".to_owned(),
        ),
        ("- alerts.yml", format!("- {}", rules.display())),
        ("/etc/prometheus/troupe.token", token.display().to_string()),
        ("\"127.0.0.1:7878\"", format!("\"{target}\"")),
    ] {
        assert!(text.contains(from), "prometheus.yml has `{from}`");
        text = text.replace(from, &to);
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, text).unwrap();
    path
}

fn spawn_prometheus(dir: &Path, config: &Path, port: u16) -> Killed {
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Killed(child)
}

/// A Prometheus HTTP API client.
struct Prom {
    http: reqwest::Client,
    base: String,
}

impl Prom {
    async fn ready(&self, within: Duration) {
        let t0 = Instant::now();
        loop {
            let ok = self
                .http
                .get(format!("{}/-/ready", self.base))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            if ok {
                return;
            }
            assert!(t0.elapsed() < within, "prometheus is not ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An instant query's result vector.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let v: Value = self
            .http
            .get(
                reqwest::Url::parse_with_params(
                    &format!("{}/api/v1/query", self.base),
                    [("query", expr)],
                )
                .unwrap(),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["status"], "success", "{expr}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The newest scrape's time of the troupe target (unix seconds).
    async fn last_scrape(&self) -> f64 {
        self.query("timestamp(up{job=\"troupe\"} == 1)")
            .await
            .first()
            .and_then(|s| s["value"][1].as_str()?.parse().ok())
            .unwrap_or(0.0)
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The metrics text, with Prometheus's own token.
async fn scrape(base: &str) -> String {
    let r = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(PROMETHEUS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

/// Polls `/metrics` until a line starts with `sample` (a name, its labels and its value).
async fn wait_metric(base: &str, sample: &str, within: Duration) {
    let t0 = Instant::now();
    loop {
        let text = scrape(base).await;
        if text.lines().any(|l| l.starts_with(sample)) {
            return;
        }
        assert!(t0.elapsed() < within, "no `{sample}` in\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn first_pending_approval(api: &Api, sid: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let pending = api.call("approval.list", json!({"session_id": sid})).await;
        if let Some(first) = pending.as_array().and_then(|a| a.first()) {
            return first.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "no approval came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_running(api: &Api, sid: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let tasks = api.call("task.list", json!({"session_id": sid})).await;
        if let Some(t) = tasks
            .as_array()
            .and_then(|t| t.iter().find(|t| t["state"] == "running"))
        {
            return t.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "no task runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A message answered in the background (root conversation unless `conversation` names
/// one): the whole JSON-RPC response.
fn say(
    api: &Api,
    sid: &str,
    conversation: Option<&str>,
    text: &str,
) -> tokio::task::JoinHandle<Value> {
    let params = json!({"session_id": sid, "conversation_id": conversation, "text": text});
    let api = api.clone();
    tokio::spawn(async move { api.rpc("conversation.message", params).await })
}

/// How a `conversation.message` ended: the reply's status, or `rpc_error` when the call
/// itself failed (the error then stands for the task's failure or cancellation).
fn status(response: &Value) -> &str {
    response["result"]["reply"]["status"]
        .as_str()
        .unwrap_or(if response["error"].is_object() {
            "rpc_error"
        } else {
            "?"
        })
}

/// A command the model asks for, approved or denied by the test.
async fn shell_turn(
    api: &Api,
    model: &ModelServer,
    sid: &str,
    argv: &[&str],
    decision: Value,
) -> Value {
    let args = json!({ "command": argv }).to_string();
    model.push(Reply::tool_call("shell", [args]).with_usage(60, 8, 0, 0));
    model.push(Reply::text(["noted"]).with_usage(70, 2, 60, 0));
    let reply = say(api, sid, None, "run it");
    let pending = first_pending_approval(api, sid).await;
    api.call(
        "approval.respond",
        json!({"session_id": sid, "approval_id": pending["approval_id"], "decision": decision}),
    )
    .await;
    reply.await.unwrap()
}

/// Drives every path the dashboards show: plain turns, approved, failing and denied commands,
/// an MCP call, a model error after a retry, a cancellation, a clamped policy, a task waiting
/// for the scheduler, an error answer and a live event stream.
async fn workload(api: &Api, model: &ModelServer, base: &str) {
    let sid = id(&api.session(None).await, "session_id");
    // A live subscriber for the whole run.
    let sse = api
        .request(reqwest::Method::GET, &format!("/api/sessions/{sid}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);

    // An A2A call (an unknown task: no model call).
    let a2a: Value = api
        .request(reqwest::Method::POST, "/a2a")
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "none"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(a2a["error"]["code"], -32001, "{a2a}");

    // A plain turn with usage (input, output, cached, reasoning tokens).
    model.push(Reply::text(["Hello", " there"]).with_usage(100, 10, 40, 5));
    let r = api.say(&sid, "hello").await;
    assert_eq!(r["reply"]["status"], "ok", "{r}");

    // Commands: approved for the conversation (a key is kept) and fine, approved and
    // failing, denied.
    let for_conversation = json!({"approve_for_conversation": {"ttl_secs": null}});
    let r = shell_turn(api, model, &sid, &["echo", "hi"], for_conversation).await;
    assert_eq!(status(&r), "ok", "{r}");
    let r = shell_turn(api, model, &sid, &["false"], json!("approve_once")).await;
    assert_eq!(status(&r), "ok", "{r}");
    let r = shell_turn(
        api,
        model,
        &sid,
        &["rm", "-rf", "/nonexistent"],
        json!({"deny": {"reason": "not today"}}),
    )
    .await;
    assert_eq!(status(&r), "ok", "{r}");

    // An MCP call, once the server is up (the broken one keeps restarting meanwhile).
    wait_metric(
        base,
        "troupe_mcp_connections{server=\"everything\"} 1",
        Duration::from_secs(30),
    )
    .await;
    model.push(Reply::tool_call(
        "everything__echo",
        [r#"{"message": "hi"}"#],
    ));
    model.push(Reply::text(["echoed"]));
    let r = api.say(&sid, "echo via mcp").await;
    assert_eq!(r["reply"]["status"], "ok", "{r}");
    assert_eq!(r["reply"]["stats"]["tool_calls"], 1, "{r}");

    // The endpoint fails, is retried once, fails again: the task ends with status error.
    model.push(Reply::error(500, "overloaded upstream"));
    model.push(Reply::error(500, "overloaded upstream"));
    let r = say(api, &sid, None, "fail").await.unwrap();
    assert!(matches!(status(&r), "error" | "rpc_error"), "{r}");

    // A cancellation while the model is slow.
    model.push(Reply::text(["too late"]).delayed(Duration::from_secs(10)));
    let pending = say(api, &sid, None, "slow");
    let task = wait_running(api, &sid).await;
    api.call(
        "task.cancel",
        json!({"session_id": sid, "task_id": task["task_id"]}),
    )
    .await;
    let r = pending.await.unwrap();
    assert!(matches!(status(&r), "cancelled" | "rpc_error"), "{r}");

    // A second conversation that asks for a wider approval policy (clamped), whose task waits
    // for the single slot while the root's slow task holds it.
    let other = api
        .call(
            "conversation.open",
            json!({"session_id": sid, "approval_policy": "never"}),
        )
        .await;
    let other = id(&other, "conversation_id");
    model.push(Reply::text(["first"]).delayed(Duration::from_millis(1500)));
    model.push(Reply::text(["second"]));
    let first = say(api, &sid, None, "hold the slot");
    wait_running(api, &sid).await;
    let second = say(api, &sid, Some(&other), "wait");
    assert_eq!(status(&first.await.unwrap()), "ok");
    assert_eq!(status(&second.await.unwrap()), "ok");

    // An error answer of the API.
    let (code, _) = api
        .get("/api/sessions/0190a4d2-0000-7000-8000-000000000000")
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    drop(sse);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_every_dashboard_series_and_evaluates_every_rule() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let (_troupe, base) =
        spawn_troupe(dir.path(), &troupe_config(&model, &dir.path().join("data")));
    let port = free_port();
    let prom_config = prometheus_config(dir.path(), base.trim_start_matches("http://"));
    let _prometheus = spawn_prometheus(dir.path(), &prom_config, port);
    let prom = Prom {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{port}"),
    };
    prom.ready(Duration::from_secs(30)).await;
    // Targets reach the scrape loop a few seconds after start: wait for the first scrape.
    let t0 = Instant::now();
    while prom.last_scrape().await == 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "troupe is never scraped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let api = Api::new(&base, Some(OPS_TOKEN));
    tokio::time::timeout(Duration::from_secs(120), workload(&api, &model, &base))
        .await
        .expect("the workload ends in time");

    // Two scrapes after the workload at least, so that every series has two points in a
    // one-minute window.
    let done = unix_now();
    let t0 = Instant::now();
    while prom.last_scrape().await < done + 2.0 {
        let log = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no scrape after the workload:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The exposition passes promtool's checks.
    let text = scrape(&base).await;
    let (ok, out) = run(
        Command::new(tool("promtool")).args(["check", "metrics"]),
        Some(&text),
    );
    assert!(ok, "promtool check metrics:\n{out}\n---\n{text}");
    assert!(!text.contains("quantile="), "histograms, never summaries");

    // Every metric a panel or a rule names is exported.
    let names = exported(&text);
    let rules = std::fs::read_to_string(repo().join("dashboards/prometheus/alerts.yml")).unwrap();
    let mut missing = Vec::new();
    let mut named = metric_names(&rules);
    for (_, board) in dashboards() {
        for (_, expr) in queries(&board) {
            named.extend(metric_names(&expr));
        }
    }
    named.sort();
    named.dedup();
    for name in &named {
        if !names.contains(name) && !NEVER_IN_A_HEALTHY_RUN.contains(&name.as_str()) {
            missing.push(name.clone());
        }
    }
    assert!(missing.is_empty(), "named but not exported: {missing:?}");
    assert!(named.len() > 40, "{named:?}");

    // Every dashboard query answers with at least one series.
    let mut empty = Vec::new();
    for (file, board) in dashboards() {
        for (title, expr) in queries(&board) {
            if prom.query(&concrete(&expr)).await.is_empty() {
                empty.push(format!("{file} / {title}: {expr}"));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "empty dashboard queries:\n{}",
        empty.join("\n")
    );

    // The rules are loaded and evaluate without error.
    let v: Value = prom
        .http
        .get(format!("{}/api/v1/rules", prom.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let loaded: Vec<&Value> = v["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(loaded.len(), rules.matches("- alert:").count(), "{v}");
    for rule in loaded {
        assert_eq!(rule["health"], "ok", "{rule}");
    }

    // The troupe target itself was scraped with Prometheus's token.
    let up = prom.query("up{job=\"troupe\"}").await;
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
}

#[test]
fn dashboards_rules_and_scrape_config_pass_their_linters() {
    let promtool = tool("promtool");
    let lint = repo().join("scripts/dashboard_lint.py");
    let provisioned =
        std::fs::read_to_string(repo().join("dashboards/provisioning/datasources/troupe.yaml"))
            .unwrap();
    assert!(
        provisioned.contains("uid: troupe-prometheus"),
        "{provisioned}"
    );
    let mut uids = Vec::new();
    for (file, board) in dashboards() {
        let path = repo().join("dashboards/grafana").join(&file);
        let (ok, out) = run(
            Command::new("python3").arg(&lint).arg(&path).arg(&promtool),
            None,
        );
        assert!(ok, "{file}: {out}");
        // The datasource variable defaults to the provisioned datasource.
        let variables = board["templating"]["list"].as_array().unwrap();
        let ds = variables
            .iter()
            .find(|v| v["type"] == "datasource")
            .unwrap();
        assert_eq!(ds["name"], "datasource", "{file}");
        assert_eq!(ds["current"]["value"], "troupe-prometheus", "{file}");
        uids.push(board["uid"].as_str().unwrap().to_owned());
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 9, "dashboard uids are distinct");

    let prometheus = repo().join("dashboards/prometheus");
    let (ok, out) = run(
        Command::new(&promtool)
            .args(["check", "rules"])
            .arg(prometheus.join("alerts.yml")),
        None,
    );
    assert!(ok, "{out}");
    // The scrape configuration, with a token file that exists here.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(prometheus.join("alerts.yml"), dir.path().join("alerts.yml")).unwrap();
    std::fs::write(dir.path().join("token"), "t").unwrap();
    let config = std::fs::read_to_string(prometheus.join("prometheus.yml"))
        .unwrap()
        .replace(
            "/etc/prometheus/troupe.token",
            &dir.path().join("token").display().to_string(),
        );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let (ok, out) = run(
        Command::new(&promtool)
            .args(["check", "config"])
            .arg(dir.path().join("prometheus.yml")),
        None,
    );
    assert!(ok, "{out}");
}

#[test]
fn the_sample_configuration_parses_and_the_unit_can_write_its_directories() {
    let config = TroupeConfig::from_file(&repo().join("deploy/troupe.toml")).unwrap();
    assert_eq!(config.server.listen, "127.0.0.1:7878");
    assert!(!config.server.metrics_public);
    assert_eq!(config.server.tokens.len(), 2);
    assert!(
        config.server.tokens.iter().all(|t| t.token.is_none()),
        "secrets come from the environment"
    );
    assert!(config.mcp.limits.limits().validate().is_ok());

    let unit = std::fs::read_to_string(repo().join("deploy/troupe.service")).unwrap();
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .flat_map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    };
    for (key, want) in [
        ("Restart", "on-failure"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
    ] {
        assert_eq!(values(key), [want], "{key}");
    }
    assert!(
        values("ExecStart")
            .join(" ")
            .contains("serve --config /etc/troupe/troupe.toml"),
        "{:?}",
        values("ExecStart")
    );
    // The unit sets the log filter the binary reads.
    let env = values("Environment");
    assert!(
        env.iter()
            .any(|e| e.starts_with(&format!("{}=", troupe_runtime::telemetry::LOG_ENV))),
        "{env:?}"
    );
    assert!(!env.iter().any(|e| e.starts_with("RUST_LOG=")), "{env:?}");
    // ProtectSystem=strict: the service may write only what ReadWritePaths lists.
    let writable = values("ReadWritePaths");
    for dir in [&config.data_dir, &config.log_dir] {
        assert!(
            writable.iter().any(|w| dir.starts_with(w)),
            "{} is not under ReadWritePaths {writable:?}",
            dir.display()
        );
    }
    for root in &config.mcp.roots {
        assert!(
            writable.iter().any(|w| Path::new(root).starts_with(w)),
            "{root}"
        );
    }
    // The workspace (what sandboxed commands and the MCP roots may change) holds neither the
    // store nor the history.
    let workspace = values("WorkingDirectory");
    let workspace = Path::new(&workspace[0]);
    for dir in [&config.data_dir, &config.log_dir] {
        assert!(
            !dir.starts_with(workspace),
            "{} is in the workspace",
            dir.display()
        );
    }
    for root in &config.mcp.roots {
        assert!(Path::new(root).starts_with(workspace), "{root}");
    }
    // Stop waits for the grace period and what follows it.
    let stop: u64 = values("TimeoutStopSec")[0]
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(stop >= config.server.grace_period.as_secs() + 40, "{stop}");
}

/// Each configured MCP server's series exist as soon as the service listens, before any
/// session started a pool: the restart alert's `increase()` and the Tools & MCP panels have
/// their series at 0 after every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_server_mcp_series_exist_before_any_session() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let (_troupe, base) =
        spawn_troupe(dir.path(), &troupe_config(&model, &dir.path().join("data")));
    let exposition = scrape(&base).await;
    for server in ["everything", "broken"] {
        for series in [
            "troupe_mcp_connections",
            "troupe_mcp_calls_in_flight",
            "troupe_mcp_server_restarts_total",
        ] {
            let line = format!("{series}{{server=\"{server}\"}} 0");
            assert!(
                exposition.lines().any(|l| l == line),
                "{line} is not on /metrics"
            );
        }
    }
}

/// The value of the unlabelled series `name` on `/metrics`.
async fn sample(base: &str, name: &str) -> f64 {
    let text = scrape(base).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

/// The oldest wait for a scheduler slot (the series `TroupeSchedulerStuck` reads) grows while
/// a task waits, with nothing happening in its session: it is taken when `/metrics` is read.
/// It drops to 0 once the task has its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_wait_grows_while_a_task_waits_for_a_slot() {
    const OLDEST: &str = "troupe_scheduler_oldest_wait_seconds";
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let (_troupe, base) =
        spawn_troupe(dir.path(), &troupe_config(&model, &dir.path().join("data")));
    let api = Api::new(&base, Some(OPS_TOKEN));
    assert_eq!(sample(&base, OLDEST).await, 0.0);
    let sid = id(&api.session(None).await, "session_id");
    let other = api
        .call("conversation.open", json!({"session_id": sid}))
        .await;
    let other = id(&other, "conversation_id");
    // The root's task holds the single slot for 4 s; the other conversation's waits for it.
    model.push(Reply::text(["first"]).delayed(Duration::from_secs(4)));
    model.push(Reply::text(["second"]));
    let first = say(&api, &sid, None, "hold the slot");
    wait_running(&api, &sid).await;
    let second = say(&api, &sid, Some(&other), "wait");
    let t0 = Instant::now();
    let mut waited = 0.0;
    while waited < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{OLDEST} is {waited}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited = sample(&base, OLDEST).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = sample(&base, OLDEST).await;
    assert!(later >= waited + 0.4, "{later} after {waited}");

    assert_eq!(status(&first.await.unwrap()), "ok");
    assert_eq!(status(&second.await.unwrap()), "ok");
    assert_eq!(sample(&base, OLDEST).await, 0.0);
}

/// Every series a dashboard panel or an alert rule names exists on `/metrics` right after
/// start and one plain turn, error counters and storage failures included: each component
/// registers its series with their known label values at 0, so a panel never shows "No data"
/// and `rate()` sees an error counter's first increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_series_exists_after_start_and_one_turn() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let (_troupe, base) =
        spawn_troupe(dir.path(), &troupe_config(&model, &dir.path().join("data")));
    let api = Api::new(&base, Some(OPS_TOKEN));
    let sid = id(&api.session(None).await, "session_id");
    model.push(Reply::text(["Hello"]).with_usage(10, 2, 0, 0));
    let r = api.say(&sid, "hello").await;
    assert_eq!(r["reply"]["status"], "ok", "{r}");

    let names = exported(&scrape(&base).await);
    let rules = std::fs::read_to_string(repo().join("dashboards/prometheus/alerts.yml")).unwrap();
    let mut named = metric_names(&rules);
    for (_, board) in dashboards() {
        for (_, expr) in queries(&board) {
            named.extend(metric_names(&expr));
        }
    }
    named.sort();
    named.dedup();
    let missing: Vec<&String> = named.iter().filter(|n| !names.contains(*n)).collect();
    assert!(missing.is_empty(), "named but not on /metrics: {missing:?}");
    assert!(named.len() > 40, "{named:?}");
}
