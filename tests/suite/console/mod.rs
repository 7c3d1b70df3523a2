//! The web console (P7), in a real browser: Debian's headless Chromium driven through
//! chromedriver ([`driver`]), against the real `troupe serve` binary with API tokens and the
//! test model server of `tests/support` as its model. One browser serves every scenario, one
//! after the other (its start is the slow part); each scenario saves a screenshot under
//! `target/tmp/console/`. The page without JavaScript is read with curl; [`pages`] reads
//! the pages over plain HTTP.

pub(super) mod driver;
mod pages;
mod tokens;

use driver::{Browser, ENTER};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use troupe_test_support::{ModelServer, Reply};
use troupe_tests::troupe_bin;

const TOKEN: &str = "console-token";
const WAIT: Duration = Duration::from_secs(20);
const TRACE_URL: &str = "http://traces.invalid/trace/{trace_id}";

/// `troupe serve` as a child process over a data directory that outlives it (restarts).
struct Troupe {
    child: Option<Child>,
    base: String,
    port: u16,
    data: PathBuf,
    model: String,
    dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Troupe {
    fn start(dir: &Path, model: &ModelServer) -> Self {
        Self::start_with(dir, model, &[])
    }

    /// With more environment variables.
    fn start_with(dir: &Path, model: &ModelServer, env: &[(&str, &str)]) -> Self {
        let mut t = Self {
            child: None,
            base: String::new(),
            port: 0,
            data: dir.join("data"),
            model: model.base_url(),
            dir: dir.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        let mut command = Command::new(troupe_bin());
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--provider", "openai-chat", "--base-url", &self.model])
            .args(["--grace-period", "2s"])
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TROUPE_API_TOKENS", format!("{TOKEN}=*"))
            .env("OPENAI_API_KEY", "test-key")
            .env("TROUPE_CONSOLE_TRACE_URL", TRACE_URL)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::null());
        let (child, base) = troupe_tests::spawn_serve(&mut command);
        self.port = base.rsplit(':').next().unwrap().parse().unwrap();
        self.base = base;
        self.child = Some(child);
    }

    /// SIGTERM, and wait for the exit.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let status = child.wait().unwrap();
            assert!(status.success(), "troupe serve exited {status}");
        }
    }

    /// A client of the API with the token.
    fn http(&self) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: self.base.clone(),
        }
    }
}

impl Drop for Troupe {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let response = r.send().await.unwrap();
        let status = response.status();
        let v: Value = response.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    async fn session(&self, title: &str) -> String {
        let s = self
            .send(
                reqwest::Method::POST,
                "/api/sessions",
                Some(json!({"project_id": "alpha", "title": title})),
            )
            .await;
        s["session_id"].as_str().unwrap().to_owned()
    }

    async fn say(&self, session: &str, text: &str) -> Value {
        self.send(
            reqwest::Method::POST,
            &format!("/api/sessions/{session}/messages"),
            Some(json!({ "text": text })),
        )
        .await
    }

    /// Every message of a session, oldest first.
    async fn all_messages(&self, session: &str) -> Vec<Value> {
        let page = self
            .send(
                reqwest::Method::GET,
                &format!("/api/sessions/{session}/messages?limit=1000"),
                None,
            )
            .await;
        assert!(page["next_before"].is_null(), "one page holds them all");
        page["messages"].as_array().unwrap().clone()
    }
}

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("console")
}

/// The message ids the page shows, in order.
async fn shown_ids(browser: &Browser) -> Vec<u64> {
    browser
        .js(
            "return [...document.querySelectorAll('#messages > li')].map(li => Number(li.dataset.messageId))",
            vec![],
        )
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn quiet(_: &Value) -> bool {
    false
}

/// One sub-agent, `coder`, on the service's model, routed by the rules (every message not a
/// `/hub` stays the conversation's own turn).
fn with_coder_agent(dir: &std::path::Path) {
    std::fs::create_dir(dir.join("agents")).unwrap();
    std::fs::write(
        dir.join("agents/coder.json"),
        r#"{"id": "coder", "role": "executor", "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("troupe.toml"),
        "[agents]\ndir = \"agents\"\nrouter = \"rules\"\n",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_chats_approves_survives_a_restart_and_pages_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    // One sub-agent, `coder`, on the same model; the rules router keeps every other message
    // the conversation's own turn, so the scripted replies below stay in order.
    with_coder_agent(dir.path());
    let mut troupe = Troupe::start(dir.path(), &model);
    let browser = Browser::start(&screenshots()).await;
    let api = troupe.http();

    // --- Sign in: the list answers the sign-in form, the token (typed, Enter) the cookie.
    browser.goto(&format!("{}/", troupe.base)).await;
    browser.find("#sign-in-form").await;
    browser.screenshot("01-sign-in").await;
    browser.type_into("#token", TOKEN).await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the session list",
            "return document.body.dataset.page === 'sessions'",
            WAIT,
        )
        .await;
    let cookie_visible = browser.js("return document.cookie", vec![]).await;
    assert_eq!(cookie_visible, json!(""), "the sign-in cookie is HttpOnly");
    browser.screenshot("02-sessions").await;
    browser.assert_quiet_console(quiet).await;

    // The list: searched as one types ("/" goes to the search box), and a project's current
    // session switched from it.
    let older = api.session("Older work").await;
    let newer = api.session("Newer work").await;
    browser.goto(&format!("{}/", troupe.base)).await;
    browser.find("#sessions").await;
    browser.keys("/").await;
    let focused = browser.js("return document.activeElement.id", vec![]).await;
    assert_eq!(focused, json!("q"));
    browser.keys("older").await;
    let visible = browser
        .js(
            "return [...document.querySelectorAll('#sessions tbody tr')].filter(tr => !tr.hidden).map(tr => tr.dataset.sessionId)",
            vec![],
        )
        .await;
    assert_eq!(visible, json!([older]));
    assert_eq!(browser.text("#count").await, "1 of 2 sessions match");
    browser.screenshot("02b-search").await;
    // Only the title, project, id and status are searched: not "… ago" nor a button's label.
    for word in ["ago", "current"] {
        browser.goto(&format!("{}/", troupe.base)).await;
        browser.find("#sessions").await;
        browser.keys("/").await;
        browser.keys(word).await;
        assert_eq!(
            browser.text("#count").await,
            "0 of 2 sessions match",
            "{word}"
        );
    }
    browser.goto(&format!("{}/", troupe.base)).await;
    browser
        .click(&format!("tr[data-session-id='{newer}'] .make-current"))
        .await;
    browser
        .wait_for(
            "the current session's mark",
            &format!(
                "const tr = document.querySelector(\"tr[data-session-id='{newer}']\"); return tr && tr.querySelector('.current')"
            ),
            WAIT,
        )
        .await;
    let current = api
        .send(
            reqwest::Method::GET,
            "/api/projects/alpha/current-session",
            None,
        )
        .await;
    assert_eq!(current["session"]["session_id"], json!(newer));
    browser.assert_quiet_console(quiet).await;

    // --- Create a session from the list; the browser goes to its live view.
    browser.click("#create summary").await;
    browser.type_into("#new-project", "alpha").await;
    browser.type_into("#new-title", "From the browser").await;
    browser.click("#create-form button[type=submit]").await;
    wait_live(&browser).await;
    let url = browser.url().await;
    let sid = url.rsplit('/').next().unwrap().to_owned();
    assert_eq!(browser.text("#title").await, "From the browser");
    let record = api
        .send(reqwest::Method::GET, &format!("/api/sessions/{sid}"), None)
        .await;
    assert_eq!(record["project_id"], "alpha");
    browser.screenshot("03-new-session").await;

    // --- Send a message; the reply streams into the page while the task runs, and the
    // task can be cancelled from the page.
    model.push(Reply::text(["Streaming ", "as it ", "arrives", " (never ends)"]).stall_after(3));
    browser.type_into("#text", "stream to me").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "streamed text of the running task",
            "const t = document.querySelector('.task-live .stream'); return t && t.textContent.includes('Streaming as it')",
            WAIT,
        )
        .await;
    let running = browser.text(".task-live .who .status").await;
    assert_eq!(running, "running");
    browser.screenshot("04-streaming").await;
    browser.click(".task-live .cancel-task").await;
    browser
        .wait_for(
            "the cancelled task's outcome",
            "return [...document.querySelectorAll('#messages .msg-status .status')].some(s => s.textContent === 'cancelled')",
            WAIT,
        )
        .await;

    // A reply that ends: the stored messages replace the live block.
    model.push(Reply::text(["The whole ", "reply."]));
    browser.type_into("#text", "and now finish").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the stored reply",
            "return [...document.querySelectorAll('#messages .role-assistant .text')].some(t => t.textContent === 'The whole reply.') && !document.querySelector('.task-live')",
            WAIT,
        )
        .await;
    // Each task's trace id links to the configured trace viewer.
    let href = browser
        .wait_for(
            "a trace link",
            "const a = [...document.querySelectorAll('#messages a.trace')].pop(); return a && a.href",
            WAIT,
        )
        .await;
    let href = href.as_str().unwrap();
    assert!(href.starts_with("http://traces.invalid/trace/"), "{href}");
    let trace_id = href.rsplit('/').next().unwrap();
    assert_eq!(trace_id.len(), 32, "a W3C trace id: {trace_id}");

    // Statistics follow: two tasks, one of them cancelled.
    browser
        .wait_for(
            "the statistics",
            "const t = document.querySelector('[data-stat=tasks]'); const c = document.querySelector('[data-stat=cancelled]'); return t && t.textContent === '2' && c.textContent === '1'",
            WAIT,
        )
        .await;
    browser.screenshot("05-reply").await;
    browser.assert_quiet_console(quiet).await;

    // --- Approvals: the model runs a command; it waits in the inbox until approved (with
    // the keyboard), then runs, and its result shows with its duration.
    model.push(Reply::tool_call(
        "shell",
        [r#"{"command": ["echo", "approved-in-the-browser"]}"#],
    ));
    model.push(Reply::text(["The command ran."]));
    browser.type_into("#text", "run a command").await;
    browser.keys(ENTER).await;
    let asked = browser
        .wait_for(
            "the approval in the inbox",
            "const a = document.querySelector('#approvals .approval .cmd'); return a && a.textContent",
            WAIT,
        )
        .await;
    assert_eq!(asked, json!("$ echo approved-in-the-browser"));
    assert_eq!(browser.text("#approvals-count").await, "1");
    browser.screenshot("06-approval").await;
    browser
        .js(
            "document.querySelector('#approvals .approve-once').focus()",
            vec![],
        )
        .await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the command's result and the reply",
            "const out = [...document.querySelectorAll('#messages .msg-tool_result')].find(m => m.textContent.includes('approved-in-the-browser')); \
             return out && out.querySelector('.duration') && [...document.querySelectorAll('#messages .role-assistant .text')].some(t => t.textContent === 'The command ran.') \
               && document.querySelectorAll('#approvals .approval').length === 0",
            WAIT,
        )
        .await;
    assert_eq!(browser.text("#approvals-count").await, "0");
    browser
        .js(
            "window.scrollTo(0, document.documentElement.scrollHeight)",
            vec![],
        )
        .await;
    browser.screenshot("07-approved").await;

    // Approved for the whole session, for an hour: the same command later runs unasked.
    for _ in 0..2 {
        model.push(Reply::tool_call(
            "shell",
            [r#"{"command": ["echo", "remembered"]}"#],
        ));
        model.push(Reply::text(["Ran it."]));
    }
    browser.type_into("#text", "run it once").await;
    browser.keys(ENTER).await;
    browser.find("#approvals .approval .ttl").await;
    browser
        .js(
            "document.querySelector('#approvals .approval .ttl').value = '3600'",
            vec![],
        )
        .await;
    browser.click("#approvals .approval .approve-session").await;
    let count_results = "return [...document.querySelectorAll('#messages .msg-tool_result')].filter(m => m.textContent.includes('remembered')).length";
    browser
        .wait_for(
            "the first run",
            &format!("{count_results} === 1 ? 1 : 0"),
            WAIT,
        )
        .await;
    browser.type_into("#text", "run it again").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the second run, not asked",
            &format!("{count_results} === 2 ? 1 : 0"),
            WAIT,
        )
        .await;
    let asked = browser
        .js(
            "return [...document.querySelectorAll('#events li[data-kind=approval_requested]')].length",
            vec![],
        )
        .await;
    assert_eq!(
        asked,
        json!(2),
        "once for echo approved-in-the-browser, once for echo remembered"
    );

    // Denied with a reason: the command does not run and the model is told why.
    model.push(Reply::tool_call(
        "shell",
        [r#"{"command": ["touch", "should-not-exist"]}"#],
    ));
    model.push(Reply::text(["Understood."]));
    browser.type_into("#text", "touch a file").await;
    browser.keys(ENTER).await;
    browser.find("#approvals .approval .deny-reason").await;
    browser
        .type_into("#approvals .approval .deny-reason", "not on this machine")
        .await;
    browser.click("#approvals .approval .deny").await;
    browser
        .wait_for(
            "the denial's observation",
            "return [...document.querySelectorAll('#messages .msg-tool_result')].some(m => m.textContent.includes('not on this machine'))",
            WAIT,
        )
        .await;
    assert!(!dir.path().join("should-not-exist").exists());
    browser.assert_quiet_console(quiet).await;

    // --- A second conversation, opened from the page; its messages say where they belong.
    browser.click("#new-conversation").await;
    browser
        .wait_for(
            "two conversations",
            "return document.querySelectorAll('#conversation option').length === 2 && document.querySelector('#conversation').selectedIndex === 1",
            WAIT,
        )
        .await;
    browser.type_into("#text", "in the second one").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the message in conversation 2",
            "return [...document.querySelectorAll('#messages .role-user')].some(m => m.textContent.includes('in the second one') && m.querySelector('.conv').textContent === 'conversation 2')",
            WAIT,
        )
        .await;
    let conversations = api
        .send(
            reqwest::Method::POST,
            "/rpc",
            Some(json!({"jsonrpc": "2.0", "id": 1, "method": "conversation.list", "params": {"session_id": sid}})),
        )
        .await;
    assert_eq!(conversations["result"].as_array().unwrap().len(), 2);

    // --- A real dispatch: `/hub coder ...` typed in the page goes straight to the sub-agent;
    // its reply streams back, and the Agents panel shows the dispatch and its binding live.
    model.push(Reply::text(["fn main() {}"]));
    browser.type_into("#text", "/hub coder write main").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the coder's reply",
            "return [...document.querySelectorAll('#messages .role-assistant')].some(m => m.textContent.includes('fn main() {}'))",
            WAIT,
        )
        .await;
    let live = browser
        .wait_for(
            "the real dispatch in the tree",
            "const li = document.querySelector('#agents .tree li'); return li && li.querySelector('.status-ok') && li.innerText",
            WAIT,
        )
        .await;
    let live = live.as_str().unwrap().to_owned();
    assert!(live.starts_with("coder"), "{live}");
    assert!(live.contains("bound to "), "{live}");
    let bindings = browser.text("#agents").await;
    assert!(bindings.contains("Bindings"), "{bindings}");
    let agents = api
        .send(
            reqwest::Method::GET,
            &format!("/api/sessions/{sid}/agents"),
            None,
        )
        .await;
    let bound = agents.to_string();
    assert!(bound.contains("coder"), "{bound}");
    browser.screenshot("07a-dispatch").await;
    browser.assert_quiet_console(quiet).await;

    // --- Routing decisions and the tree of dispatches, as the Agents panel draws them from
    // their events (route_decided, dispatch_sent, dispatch_result, session_bound); a deeper
    // chain than one message makes here.
    browser
        .js(
            r#"const a = window.troupeConsole.apply;
               a({seq: 1e9, kind: 'route_decided', data: {decision: 'dispatch_agent', agent_id: 'lead', confidence: 0.9, source: 'model', reason: 'needs a lead'}});
               a({seq: 1e9 + 1, kind: 'dispatch_sent', data: {dispatch_id: 'd1', agent_id: 'lead', chain: ['supervisor', 'lead'], input: 'x'}});
               a({seq: 1e9 + 2, kind: 'dispatch_sent', data: {dispatch_id: 'd2', agent_id: 'worker', chain: ['supervisor', 'lead', 'worker'], input: 'y'}});
               a({seq: 1e9 + 3, kind: 'session_bound', data: {agent_id: 'worker', provider: 'acp', provider_session_id: 'ps-7'}});
               a({seq: 1e9 + 4, kind: 'dispatch_result', data: {dispatch_id: 'd2', agent_id: 'worker', status: 'ok', duration_ms: 1200, provider_session_id: 'ps-7'}});"#,
            vec![],
        )
        .await;
    let tree = browser
        .wait_for(
            "the dispatch tree",
            "const t = document.querySelector('#agents .tree'); return t && t.innerText.includes('lead → worker') && t.innerText",
            WAIT,
        )
        .await;
    let tree = tree.as_str().unwrap();
    assert!(tree.contains("supervisor → lead → worker"), "{tree}");
    assert!(tree.contains("bound to ps-7"), "{tree}");
    assert!(
        browser
            .text("#agents")
            .await
            .contains("dispatch_agent → lead")
    );
    browser.screenshot("07b-agents").await;

    // --- A phone's width: one column, nothing wider than the screen.
    browser.set_size(390, 844).await;
    browser.goto(&url).await;
    wait_live(&browser).await;
    let overflow = browser
        .js(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
            vec![],
        )
        .await;
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "wider than a phone: {overflow}"
    );
    browser.screenshot("08-phone").await;
    browser.goto(&format!("{}/", troupe.base)).await;
    browser.find("#sessions").await;
    browser.screenshot("09-phone-sessions").await;
    browser.set_size(1280, 900).await;
    browser.assert_quiet_console(quiet).await;

    // --- A task that fails emits an `error` event: the page applies it and stays live (an
    // `error` event of the stream is not a lost connection).
    browser.goto(&url).await;
    wait_live(&browser).await;
    browser
        .js(
            "window.__connStates = []; new MutationObserver(() => \
             window.__connStates.push(document.querySelector('#conn').dataset.state)) \
             .observe(document.querySelector('#conn'), {attributes: true}); return true",
            vec![],
        )
        .await;
    // Its answer (an error) does not matter here, only its `error` event.
    let _ = api
        .http
        .post(format!("{}/api/sessions/{sid}/messages", api.base))
        .bearer_auth(TOKEN)
        .json(&json!({"text": "/hub nobody hello"}))
        .send()
        .await
        .unwrap();
    api.say(&sid, "after the failure").await;
    browser
        .wait_for(
            "the next message on the page",
            "return [...document.querySelectorAll('#messages .role-user .text')].some(t => t.textContent === 'after the failure')",
            WAIT,
        )
        .await;
    let states = browser.js("return window.__connStates", vec![]).await;
    assert!(
        !states.to_string().contains("reconnecting"),
        "an error event is not a lost stream: {states}"
    );

    // --- A restart of troupe serve: the page says it lost the stream, then catches up with
    // what happened meanwhile, nothing twice.
    browser.goto(&url).await;
    wait_live(&browser).await;
    troupe.stop();
    browser
        .wait_for(
            "the page to notice",
            "return document.querySelector('#conn').dataset.state === 'reconnecting'",
            WAIT,
        )
        .await;
    browser.screenshot("10-reconnecting").await;
    troupe.spawn();
    api.say(&sid, "while the page was away").await;
    let stored: Vec<u64> = api
        .all_messages(&sid)
        .await
        .iter()
        .map(|m| m["message_id"].as_u64().unwrap())
        .collect();
    let expected = stored.len();
    browser
        .wait_for(
            "the page to catch up",
            &format!(
                "return document.querySelector('#conn').dataset.state === 'live' && \
                 document.querySelectorAll('#messages > li').length === {expected} && \
                 [...document.querySelectorAll('#messages .role-user .text')].some(t => t.textContent === 'while the page was away')"
            ),
            WAIT,
        )
        .await;
    assert_eq!(
        shown_ids(&browser).await,
        stored,
        "every message once, in order"
    );
    let seqs: Vec<u64> = browser
        .js(
            "return [...document.querySelectorAll('#events > li')].map(li => Number(li.dataset.seq))",
            vec![],
        )
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "each event once, newest first: {seqs:?}"
    );
    browser.screenshot("11-caught-up").await;
    // The browser reports the refused connections while the service was down; nothing else.
    browser
        .assert_quiet_console(|e| {
            e["source"] == "network"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("/events") || m.contains("ERR_CONNECTION_REFUSED"))
        })
        .await;

    // --- 200 messages, paged back 50 at a time with the `before` cursor.
    let paged = api.session("Two hundred messages").await;
    for i in 0..100 {
        api.say(&paged, &format!("message {i}")).await;
    }
    let stored: Vec<u64> = api
        .all_messages(&paged)
        .await
        .iter()
        .map(|m| m["message_id"].as_u64().unwrap())
        .collect();
    assert_eq!(stored.len(), 200);
    browser
        .goto(&format!("{}/sessions/{paged}", troupe.base))
        .await;
    wait_live(&browser).await;
    // The page replays the session's last 1,000 events but shows its newest 50 messages: the
    // tasks that finished before it went live are settled (shown by their stored messages or
    // older than them), none drawn as a live block.
    wait_replayed(&browser).await;
    let stale = browser
        .js(
            "return [...document.querySelectorAll('#live .task-live')].map(b => b.innerText)",
            vec![],
        )
        .await;
    assert_eq!(stale, json!([]), "no finished task is drawn live");
    // What a page open for long keeps stays bounded: thousands of tasks (streamed text, tool
    // calls), routing decisions and dispatches, each event larger than an Events entry keeps.
    let kept = browser
        .js(
            r#"const S = window.troupeConsole, a = S.apply, big = 'x'.repeat(10000);
               for (let i = 0; i < 1200; i += 1) {
                 const task_id = `synthetic-${i}`, call_id = `call-${i}`, agent_id = `agent-${i}`;
                 a({seq: 0, kind: 'task_started', task_id, data: {input: big}});
                 a({seq: 0, kind: 'assistant_chunk', task_id, data: {delta: big}});
                 a({seq: 0, kind: 'tool_call_started', task_id, data: {call: {call_id, name: 'shell', arguments: {command: ['echo', big]}}}});
                 a({seq: 0, kind: 'tool_call_finished', task_id, data: {call_id, name: 'shell', output: big, is_error: false, duration_ms: 3}});
                 a({seq: 0, kind: 'task_finished', task_id, data: {status: 'ok', text: big, stats: {trace_id: '0af7651916cd43dd8448eb211c80319c'}}});
                 a({seq: 0, kind: 'route_decided', data: {decision: 'dispatch_agent', agent_id, confidence: 1, source: 'rules', reason: big}});
                 a({seq: 0, kind: 'dispatch_sent', data: {dispatch_id: `d-${i}`, agent_id, chain: [agent_id], input: big}});
                 a({seq: 0, kind: 'dispatch_result', data: {dispatch_id: `d-${i}`, agent_id, status: 'ok', duration_ms: 1, text: big}});
               }
               const tasks = [...S.tasks.values()];
               const entries = [...document.querySelectorAll('#events > li pre')].map(p => p.textContent.length);
               return {
                 tasks: tasks.length,
                 holding: tasks.filter(t => t.text !== '' || t.tools.size > 0).length,
                 durations: S.durations.size,
                 traces: S.traces.size,
                 routes: S.agents.routes.length,
                 dispatches: S.agents.dispatches.size,
                 dispatch_input: [...S.agents.dispatches.values()].some(d => 'input' in d),
                 events: entries.length,
                 longest_event: Math.max(...entries),
               };"#,
            vec![],
        )
        .await;
    let at_most = |key: &str, max: u64| {
        let n = kept[key].as_u64().unwrap();
        assert!(n <= max, "{key}: {n} > {max}: {kept}");
    };
    at_most("tasks", 200);
    at_most("holding", 0);
    at_most("durations", 200);
    at_most("traces", 200);
    at_most("routes", 20);
    at_most("dispatches", 200);
    at_most("events", 400);
    at_most("longest_event", 4096 + 40);
    assert_eq!(kept["dispatch_input"], json!(false), "{kept}");
    // Every kept Events entry that was cut says so.
    let cut = browser
        .js(
            "return [...document.querySelectorAll('#events > li pre')].every(p => p.textContent.length <= 4096 || / more characters\\)$/.test(p.textContent))",
            vec![],
        )
        .await;
    assert_eq!(cut, json!(true));
    browser
        .goto(&format!("{}/sessions/{paged}", troupe.base))
        .await;
    wait_live(&browser).await;
    assert_eq!(shown_ids(&browser).await, stored[150..]);
    for shown in [100, 150, 200] {
        browser.click("#older").await;
        browser
            .wait_for(
                &format!("{shown} messages"),
                &format!("return document.querySelectorAll('#messages > li').length === {shown}"),
                WAIT,
            )
            .await;
    }
    assert_eq!(
        shown_ids(&browser).await,
        stored,
        "all 200, once each, in order"
    );
    browser
        .wait_for(
            "the start of the session",
            "return !document.querySelector('#start').hidden && document.querySelector('#older').hidden",
            WAIT,
        )
        .await;
    browser.js("window.scrollTo(0, 0)", vec![]).await;
    browser.screenshot("12-paged-back").await;
    browser.assert_quiet_console(quiet).await;

    // A task that ends while the page is live: once its stored reply shows, its live block
    // goes and the page keeps none of its streamed text.
    model.push(Reply::text(["The last ", "reply."]));
    browser.type_into("#text", "one more").await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the stored last reply",
            "return [...document.querySelectorAll('#messages .role-assistant .text')].some(t => t.textContent === 'The last reply.') && !document.querySelector('.task-live')",
            WAIT,
        )
        .await;
    let holding = browser
        .js(
            "return [...window.troupeConsole.tasks.values()].filter(t => t.status !== 'running' && (t.text !== '' || t.tools.size > 0)).length",
            vec![],
        )
        .await;
    assert_eq!(holding, json!(0), "a settled task's text is dropped");

    // --- Signing out clears the cookie: the pages ask for the token again.
    browser.click(".sign-out button").await;
    browser
        .wait_for(
            "the sign-in form",
            "return document.body.dataset.page === 'sign-in'",
            WAIT,
        )
        .await;
    let status = browser
        .js(
            "return fetch('/api/sessions/' + arguments[0]).then(r => r.status)",
            vec![json!(paged)],
        )
        .await;
    assert_eq!(status, json!(401));

    browser.quit().await;
    troupe.stop();
}

/// Requests that take content are answered in the inbox with it: an MCP server's form
/// (elicitation) shows one field per property of its schema, filled with its defaults; the
/// required one is typed in, and what the server receives is what was typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_answers_an_mcp_servers_form() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let entry = troupe_test_support::mcp::server_entry("server-everything");
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ntype = \"stdio\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\n",
            entry.display().to_string()
        ),
    )
    .unwrap();
    let mut troupe = Troupe::start(dir.path(), &model);
    let browser = Browser::start(&screenshots()).await;
    let api = troupe.http();
    let sid = api.session("Forms").await;
    open_signed_in(&browser, &troupe.base, &sid).await;
    browser
        .wait_for(
            "the MCP server",
            "return document.querySelector('#events li[data-kind=mcp_server_ready]') !== null",
            WAIT,
        )
        .await;

    model.push(Reply::tool_call(
        "everything__trigger-elicitation-request",
        ["{}"],
    ));
    model.push(Reply::text(["Thanks for the form."]));
    browser.type_into("#text", "fill in a form").await;
    browser.keys(ENTER).await;
    let asked = browser
        .wait_for(
            "the form in the inbox",
            "const a = document.querySelector('#approvals .approval .cmd'); return document.querySelector('#approvals .approval form.answer') && a.textContent",
            WAIT,
        )
        .await;
    assert!(
        asked.as_str().unwrap().starts_with("everything asks: "),
        "{asked}"
    );
    // A form is answered, never remembered: no approval for the conversation or session.
    let remember = browser
        .js(
            "return document.querySelectorAll('#approvals .approve-session, #approvals .approve-conversation, #approvals .ttl').length",
            vec![],
        )
        .await;
    assert_eq!(remember, json!(0));
    let fields = browser
        .js(
            "return [...document.querySelectorAll('#approvals form.answer [data-field]')].map(f => f.dataset.field)",
            vec![],
        )
        .await;
    let fields: Vec<&str> = fields
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(fields.contains(&"name"), "{fields:?}");
    assert!(fields.contains(&"check"), "{fields:?}");
    assert!(fields.contains(&"integer"), "{fields:?}");
    // Several choices at once (an array of an enum, or of titled constants) are a multiple
    // select with the schema's default chosen.
    let many = browser
        .js(
            "const s = document.querySelector('#approvals form.answer [data-field=titledMultipleSelectEnum]'); return s.multiple && [...s.selectedOptions].map(o => o.value + '=' + o.textContent)",
            vec![],
        )
        .await;
    assert_eq!(many, json!(["fish-1=Tuna"]));
    browser.screenshot("20-form").await;
    // `name` is required: the browser will not send the form without it.
    browser.click("#approvals form.answer .answer-send").await;
    assert_eq!(
        browser
            .js(
                "return document.querySelectorAll('#approvals .approval').length",
                vec![]
            )
            .await,
        json!(1)
    );
    browser
        .type_into("#approvals form.answer [data-field=name]", "Ada Lovelace")
        .await;
    browser
        .js(
            "const i = document.querySelector('#approvals form.answer [data-field=integer]'); i.value = '7';",
            vec![],
        )
        .await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the answer at the server and the reply",
            "return document.querySelectorAll('#approvals .approval').length === 0 \
               && [...document.querySelectorAll('#messages .msg-tool_result')].some(m => m.textContent.includes('Ada Lovelace')) \
               && [...document.querySelectorAll('#messages .role-assistant .text')].some(t => t.textContent === 'Thanks for the form.')",
            WAIT,
        )
        .await;
    let result = browser
        .js(
            "return [...document.querySelectorAll('#messages .msg-tool_result')].map(m => m.textContent).join('\\n')",
            vec![],
        )
        .await;
    let result = result.as_str().unwrap();
    assert!(result.contains("Favorite Integer: 7"), "{result}");
    assert!(result.contains("Agreed to terms: false"), "{result}");
    // What the model got back is what the server answered with the typed content.
    let second = model.requests()[1].body.to_string();
    assert!(second.contains("Ada Lovelace"), "{second}");
    browser.screenshot("21-form-answered").await;
    browser.assert_quiet_console(quiet).await;
    browser.quit().await;
    troupe.stop();
}

/// A conversation whose policy keeps headers only, read back by a page opened later: a
/// running task's tools are named from their headers (it showed `→ undefined`); the Agents
/// panel names the agent a `/hub` routed to and how its dispatch ended (the agent was
/// dropped, the outcome `undefined`); each task's reply links to its trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headers_only_conversation_reads_back_its_tools_agents_and_traces() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    with_coder_agent(dir.path());
    let mut troupe = Troupe::start(dir.path(), &model);
    let api = troupe.http();
    let created = api
        .send(
            reqwest::Method::POST,
            "/api/sessions",
            Some(json!({"project_id": "alpha", "title": "Headers",
                        "root": {"storage_policy": "headers_only"}})),
        )
        .await;
    let sid = created["session_id"].as_str().unwrap().to_owned();

    // A task that calls a tool, then stalls: still running when the page opens, after its
    // tool call was recorded.
    model.push(Reply::tool_call("no_such_tool", ["{}"]));
    model.push(Reply::text(["thinking", " on"]).stall_after(1));
    api.send(
        reqwest::Method::POST,
        "/rpc",
        Some(
            json!({"jsonrpc": "2.0", "id": 1, "method": "conversation.send",
                    "params": {"session_id": sid, "text": "call something"}}),
        ),
    )
    .await;
    let asked = std::time::Instant::now();
    while model.requests().len() < 2 {
        assert!(asked.elapsed() < WAIT, "the model was not asked twice");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let browser = Browser::start(&screenshots()).await;
    open_signed_in(&browser, &troupe.base, &sid).await;
    let tools = browser
        .wait_for(
            "the running task's tool",
            "const t = [...document.querySelectorAll('.task-live .tool .who b')].map(b => b.textContent); return t.length > 0 && t.join(',')",
            WAIT,
        )
        .await;
    assert_eq!(tools, json!("→ no_such_tool"));
    let started = browser
        .js(
            "return document.querySelector('#events li[data-kind=tool_call_started] pre').textContent",
            vec![],
        )
        .await;
    let started = started.as_str().unwrap();
    assert!(
        started.contains(r#""tool": "no_such_tool""#) && !started.contains(r#""call":"#),
        "read back as headers: {started}"
    );
    browser.click(".task-live .cancel-task").await;
    browser
        .wait_for(
            "the cancelled task",
            "return [...window.troupeConsole.tasks.values()].every(t => t.status !== 'running')",
            WAIT,
        )
        .await;

    // A dispatch: `/hub coder ...` routes straight to the sub-agent.
    model.push(Reply::text(["fn main() {}"]));
    api.say(&sid, "/hub coder write main").await;

    // Opened again, the page reads all of it back as headers.
    browser
        .goto(&format!("{}/sessions/{sid}", troupe.base))
        .await;
    wait_live(&browser).await;
    wait_replayed(&browser).await;
    let routes = browser
        .wait_for(
            "the routing decision",
            "const r = document.querySelector('#agents .routes'); return r && r.innerText",
            WAIT,
        )
        .await;
    let routes = routes.as_str().unwrap();
    assert!(routes.contains("dispatch_agent → coder"), "{routes}");
    assert!(routes.contains("by hub"), "{routes}");
    let dispatch = browser
        .wait_for(
            "the dispatch",
            "const li = document.querySelector('#agents .tree li'); return li && [li.querySelector('b').textContent, li.querySelector('.status').textContent]",
            WAIT,
        )
        .await;
    assert_eq!(dispatch, json!(["coder", "ok"]));
    // The tasks' replies link to their traces: a trace id is no content, their ends keep it.
    let traces = browser
        .wait_for(
            "the trace links",
            "const a = [...document.querySelectorAll('#messages a.trace')].map(a => a.href); return a.length > 0 && a",
            WAIT,
        )
        .await;
    for href in traces.as_array().unwrap() {
        let href = href.as_str().unwrap();
        let trace_id = href
            .strip_prefix("http://traces.invalid/trace/")
            .unwrap_or_else(|| panic!("{href}"));
        assert!(
            trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{href}"
        );
    }
    browser.screenshot("22-headers").await;
    browser.assert_quiet_console(quiet).await;
    browser.quit().await;
    troupe.stop();
}

/// Signs in at `base` with the token, then opens session `sid` and waits for its live stream.
async fn open_signed_in(browser: &Browser, base: &str, sid: &str) {
    browser.goto(&format!("{base}/")).await;
    browser.type_into("#token", TOKEN).await;
    browser.keys(ENTER).await;
    browser
        .wait_for(
            "the session list",
            "return document.body.dataset.page === 'sessions'",
            WAIT,
        )
        .await;
    browser.goto(&format!("{base}/sessions/{sid}")).await;
    wait_live(browser).await;
}

/// Waits until the page has applied the events it replays on opening (up to the seq it went
/// live at) and drawn them.
async fn wait_replayed(browser: &Browser) {
    browser
        .wait_for(
            "the replayed events",
            "const S = window.troupeConsole; return S && S.lastSeq >= S.liveFrom",
            WAIT,
        )
        .await;
    browser
        .js(
            "return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))",
            vec![],
        )
        .await;
}

async fn wait_live(browser: &Browser) {
    browser
        .wait_for(
            "the live stream",
            "return document.body.dataset.page === 'session' && document.querySelector('#conn').dataset.state === 'live'",
            WAIT,
        )
        .await;
}

/// `GET /` without JavaScript: curl sees the sessions as an HTML table (with the token), or
/// the sign-in form (without).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reads_the_session_list_without_javascript() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let mut troupe = Troupe::start(dir.path(), &model);
    let api = troupe.http();
    let a = api.session("Parser <refactor>").await;
    let b = api.session("Second one").await;
    api.say(&b, "hello").await;

    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "-S", "--max-time", "10"])
            .args(args)
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "curl {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let auth = format!("Authorization: Bearer {TOKEN}");
    let page = curl(&["-H", &auth, &format!("{}/", troupe.base)]);
    assert!(page.contains(r#"<table id="sessions""#), "{page}");
    assert!(page.contains(&format!(
        r#"<a href="/sessions/{a}">Parser &lt;refactor&gt;</a>"#
    )));
    assert!(page.contains(&format!(r#"<a href="/sessions/{b}">Second one</a>"#)));
    assert!(page.contains("alpha"));
    assert!(page.contains("status-completed"), "b's message completed");
    assert!(page.contains("2 sessions"));
    // The newest activity first.
    assert!(page.find(&b).unwrap() < page.find(&a).unwrap());
    // A search without JavaScript: the form's GET.
    let found = curl(&["-H", &auth, &format!("{}/?q=parser", troupe.base)]);
    assert!(found.contains(&a) && !found.contains(&b), "{found}");
    assert!(found.contains("1 of 2 sessions match"));
    // A session's page shows its latest messages as HTML too.
    let session = curl(&["-H", &auth, &format!("{}/sessions/{b}", troupe.base)]);
    assert!(session.contains(">hello</div>"), "{session}");
    // Without a token: the sign-in form, and no session.
    let anonymous = curl(&[&format!("{}/", troupe.base)]);
    assert!(anonymous.contains(r#"action="/console/sign-in""#));
    assert!(!anonymous.contains(&a));
    // A form sign-in (no JavaScript): 303 with an HttpOnly, SameSite=Strict cookie.
    let headers = curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "--data-urlencode",
        &format!("token={TOKEN}"),
        "--data-urlencode",
        &format!("next=/sessions/{a}"),
        &format!("{}/console/sign-in", troupe.base),
    ]);
    assert!(headers.starts_with("HTTP/1.1 303"), "{headers}");
    assert!(headers.contains(&format!("location: /sessions/{a}")));
    let cookie_line = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap();
    assert!(cookie_line.contains("HttpOnly") && cookie_line.contains("SameSite=Strict"));
    assert!(
        !cookie_line.contains(TOKEN),
        "the token is not in the cookie"
    );
    let cookie = cookie_line
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let with_cookie = curl(&["-b", &cookie, &format!("{}/", troupe.base)]);
    assert!(with_cookie.contains(&a), "the cookie signs in");
    assert!(with_cookie.contains("Sign out"));
    // The cookie reads the API; it changes nothing without an Origin (not a browser page).
    let read = curl(&[
        "-b",
        &cookie,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("{}/api/sessions/{a}", troupe.base),
    ]);
    assert_eq!(read, "200");
    let write = curl(&[
        "-b",
        &cookie,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "Content-Type: application/json",
        "-d",
        "{}",
        &format!("{}/api/sessions", troupe.base),
    ]);
    assert_eq!(write, "403");
    // A wrong token signs nothing in.
    let refused = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"token": "wrong"}"#,
        &format!("{}/console/sign-in", troupe.base),
    ]);
    assert_eq!(refused, "401");
    // Behind a proxy that says the console was reached over HTTPS, the cookie is Secure.
    let proxied = curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "X-Forwarded-Proto: https",
        "-H",
        "Content-Type: application/json",
        "-d",
        &format!(r#"{{"token": "{TOKEN}"}}"#),
        &format!("{}/console/sign-in", troupe.base),
    ]);
    assert!(proxied.starts_with("HTTP/1.1 204"), "{proxied}");
    assert!(proxied.contains("; Secure"), "{proxied}");
    let metrics = curl(&["-H", &auth, &format!("{}/metrics", troupe.base)]);
    for line in [
        "troupe_console_sign_ins_total{outcome=\"ok\"} 2",
        "troupe_console_sign_ins_total{outcome=\"refused\"} 1",
        "troupe_console_sign_ins_total{outcome=\"open\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    troupe.stop();

    // Turned off, the console is not there at all.
    let off_dir = tempfile::tempdir().unwrap();
    let mut off = Troupe::start_with(off_dir.path(), &model, &[("TROUPE_CONSOLE", "false")]);
    for path in ["/", &format!("/sessions/{a}"), "/console/console.js"] {
        let code = curl(&[
            "-H",
            &auth,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{}{path}", off.base),
        ]);
        assert_eq!(code, "404", "{path}");
    }
    off.stop();
}
