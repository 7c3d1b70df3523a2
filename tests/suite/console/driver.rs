//! A small WebDriver client (W3C, plus chromedriver's browser log) over reqwest, driving
//! Debian's headless Chromium through its chromedriver. No browser found is a failure, never
//! a skip: scripts/install-browser installs both.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Enter key, for `send_keys`.
pub const ENTER: &str = "\u{E007}";

/// A Chromium driven through chromedriver; both end when this is dropped.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    driver: Child,
    /// Where screenshots go.
    out: PathBuf,
    _profile: tempfile::TempDir,
    /// The WebDriver session was ended ([`Browser::quit`]).
    quit: bool,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A test that failed did not quit: end the browser before its driver (best effort).
        if !self.quit {
            let _ = std::process::Command::new("curl")
                .args(["-s", "-m", "5", "-X", "DELETE", &self.session])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A program on PATH (or in the environment variable `env`), or a failure saying how to
/// install it.
fn program(env: &str, names: &[&str]) -> PathBuf {
    if let Ok(p) = std::env::var(env) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "{} is not installed (nor named in ${env}): run scripts/install-browser \
         (scripts/test does)",
        names.join(" or ")
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (1280×900) with a fresh profile;
    /// screenshots go to `out`.
    pub async fn start(out: &Path) -> Self {
        let chromedriver = program("TROUPE_CHROMEDRIVER", &["chromedriver"]);
        let chromium = program("TROUPE_CHROMIUM", &["chromium", "chromium-browser"]);
        std::fs::create_dir_all(out).unwrap();
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", chromedriver.display()));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let t0 = Instant::now();
        loop {
            let ready = http
                .get(format!("{base}/status"))
                .send()
                .await
                .ok()
                .map(|r| r.status().is_success());
            if ready == Some(true) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,900", "--no-first-run", "--no-default-browser-check",
                    "--disable-extensions", "--disable-background-networking",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"))
            .to_owned();
        Self {
            http,
            session: format!("{base}/session/{id}"),
            driver,
            out: out.to_owned(),
            _profile: profile,
            quit: false,
        }
    }

    /// Ends the browser (then the driver, on drop).
    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.session).send().await;
        self.quit = true;
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut r = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            r = r.json(&b);
        } else if method == reqwest::Method::POST {
            r = r.json(&json!({}));
        }
        let response = r.send().await.unwrap();
        let status = response.status();
        let v: Value = response.json().await.unwrap();
        assert!(
            status.is_success(),
            "WebDriver {method} {path}: {status} {v}"
        );
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page; its return.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Waits (up to `within`) until `script` returns something truthy; that value.
    pub async fn wait_for(&self, what: &str, script: &str, within: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.js(script, vec![]).await;
            let truthy = match &v {
                Value::Null | Value::Bool(false) => false,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return v;
            }
            if t0.elapsed() > within {
                let body = self
                    .js(
                        "return document.body ? document.body.innerText : ''",
                        vec![],
                    )
                    .await;
                self.screenshot(&format!("timeout-{}", slug(what))).await;
                panic!(
                    "timed out waiting for {what}; the page says:\n{}",
                    body.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The first element matching `css` (waiting up to 10 s for it).
    pub async fn find(&self, css: &str) -> String {
        let t0 = Instant::now();
        loop {
            let found = self
                .http
                .post(format!("{}/element", self.session))
                .json(&json!({"using": "css selector", "value": css}))
                .send()
                .await
                .unwrap();
            if found.status().is_success() {
                let v: Value = found.json().await.unwrap();
                return v["value"][ELEMENT].as_str().unwrap().to_owned();
            }
            if t0.elapsed() > Duration::from_secs(10) {
                self.screenshot(&format!("missing-{}", slug(css))).await;
                panic!("no element matches {css}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{el}/click"), None)
            .await;
    }

    /// Types `text` into the element (focusing it first, as a user's click would).
    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Keys typed where the focus is (Tab, Enter, ...), as a keyboard user would.
    pub async fn keys(&self, text: &str) {
        let actions: Vec<Value> = text
            .chars()
            .flat_map(|c| {
                [
                    json!({"type": "keyDown", "value": c.to_string()}),
                    json!({"type": "keyUp", "value": c.to_string()}),
                ]
            })
            .collect();
        self.call(
            reqwest::Method::POST,
            "/actions",
            Some(json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})),
        )
        .await;
        self.call(reqwest::Method::DELETE, "/actions", None).await;
    }

    pub async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        self.call(reqwest::Method::GET, &format!("/element/{el}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn set_size(&self, width: u32, height: u32) {
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// Saves a PNG of the viewport as `<out>/<name>.png`; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .unwrap();
        let path = self.out.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// The browser's console entries since the last call (chromedriver's log).
    pub async fn log(&self) -> Vec<Value> {
        self.call(
            reqwest::Method::POST,
            "/se/log",
            Some(json!({"type": "browser"})),
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
    }

    /// Fails on any error or warning in the browser's console since the last look, except
    /// those `allowed` accepts.
    pub async fn assert_quiet_console(&self, allowed: impl Fn(&Value) -> bool) {
        let bad: Vec<Value> = self
            .log()
            .await
            .into_iter()
            .filter(|e| matches!(e["level"].as_str(), Some("SEVERE" | "WARNING")))
            .filter(|e| !allowed(e))
            .collect();
        assert!(bad.is_empty(), "the browser's console: {bad:#?}");
    }
}

fn slug(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect()
}
