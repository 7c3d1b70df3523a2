//! Modules and I/O gateways (A10) through the real `troupe serve`: a stdio gateway written
//! for the tests (`gateway.py`, run with the system's python3) and HTTP output modules
//! received by a webhook server in the test.

mod dispatch;
mod replies;
mod stdio;
mod webhook;

use crate::suite::serve::Api;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use troupe_tests::troupe_bin;

/// The test gateway program.
pub fn gateway_py() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/suite/modules/gateway.py"
    ))
}

/// A `troupe serve` child (its stderr in `dir/serve.log`), killed when dropped.
pub struct Serving {
    pub child: Child,
    pub api: Api,
    pub base: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serving {
    /// SIGTERM, then waits for the process to exit 0.
    pub fn terminate(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }
}

/// `troupe serve` over `dir` (its `troupe.toml` written with `extra` appended, modules in
/// `dir/modules`), the scripted model following `replies`.
pub fn serve(dir: &Path, extra: &str, replies: Value) -> Serving {
    std::fs::write(
        dir.join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n{extra}\n",
            dir.join("data"),
            dir.join("history"),
        ),
    )
    .unwrap();
    let script = dir.join("script.json");
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("troupe.toml"))
        .arg("--script")
        .arg(&script)
        .current_dir(dir)
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_MODULES_DIR")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .env("TROUPE_LOG", "info")
        .stderr(Stdio::from(log));
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    Serving {
        child,
        api: Api::new(&base, None),
        base,
    }
}

/// Writes `dir/modules/<id>/module.json`.
pub fn module(dir: &Path, id: &str, definition: Value) {
    let folder = dir.join("modules").join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("module.json"), definition.to_string()).unwrap();
}

/// A stdio module running the test gateway, logging what it receives to `dir/<id>.log`.
pub fn gateway_module(dir: &Path, id: &str, direction: &str, mode: &str, env: Value) -> Value {
    let mut env = env;
    env["GATEWAY_LOG"] = json!(dir.join(format!("{id}.log")));
    env["GATEWAY_PID"] = json!(dir.join(format!("{id}.pid")));
    json!({
        "id": id,
        "description": format!("the test gateway {id}"),
        "direction": direction,
        "mode": mode,
        "protocol": "stdio",
        "command": "python3",
        "args": [gateway_py()],
        "env": env,
    })
}

/// The frames a test gateway received so far.
pub fn received(dir: &Path, id: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(format!("{id}.log")))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Polls `check` every 20 ms until it gives a value, for at most `within`.
pub async fn eventually<T>(within: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the `/metrics` sample whose name and labels start with `prefix`.
pub async fn metric(base: &str, prefix: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until the sample `prefix` reads at least `at_least`.
pub async fn metric_reaches(base: &str, prefix: &str, at_least: f64) {
    eventually(Duration::from_secs(10), async || {
        metric(base, prefix).await.filter(|v| *v >= at_least)
    })
    .await;
}
