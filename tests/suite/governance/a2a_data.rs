//! The output guardrail's validated object reaches an A2A client as a data part: `troupe
//! serve`'s A2A endpoint answers with the object an agent's schema checked (repaired and
//! masked), never with the raw text the model wrote.

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use troupe_tests::troupe_bin;

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn profile() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "lang": {"type": "string", "default": "en"}
        },
        "required": ["name", "age"]
    })
}

fn serve(dir: &Path, replies: Value) -> (Serving, String) {
    serve_with(dir, profile(), replies)
}

fn serve_with(dir: &Path, schema: Value, replies: Value) -> (Serving, String) {
    serve_configured(dir, schema, replies, "")
}

/// As [`serve_with`], with `extra` appended to troupe.toml.
fn serve_configured(dir: &Path, schema: Value, replies: Value, extra: &str) -> (Serving, String) {
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    std::fs::write(
        dir.join("agents/profiler.json"),
        json!({
            "id": "profiler",
            "role": "executor",
            "provider": {"type": "model", "instructions": "You answer with JSON."},
            "output": {"schema": schema},
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n\n[agents]\nrouter = \"rules\"\n{extra}",
            dir.join("data"),
            dir.join("history")
        ),
    )
    .unwrap();
    let script = dir.join("script.json");
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
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
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    (Serving(child), base)
}

/// An A2A 1.0 `SendMessage` of one text part; the JSON-RPC answer.
async fn send_message(base: &str, text: &str) -> Value {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {
            "messageId": "m-1", "role": "ROLE_USER",
            "parts": [{"text": text}],
        }},
    });
    reqwest::Client::new()
        .post(format!("{base}/a2a"))
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_client_gets_the_validated_object_as_a_data_part() {
    let dir = tempfile::tempdir().unwrap();
    let (_serving, base) = serve(
        dir.path(),
        json!([{"text": "Here it is: {\"name\": \"Ada\", \"age\": \"36\", \"ssn\": \"123-45-6789\"}"}]),
    );
    let sent = send_message(&base, "@profiler who wrote the first program?").await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    let parts = &task["artifacts"][0]["parts"];
    assert_eq!(parts.as_array().map(Vec::len), Some(1), "{sent}");
    // Repaired (`"36"` → 36, the default `lang`), masked (no `ssn`), as data.
    assert_eq!(
        parts[0]["data"],
        json!({"name": "Ada", "age": 36, "lang": "en"}),
        "{sent}"
    );
    assert_eq!(parts[0]["mediaType"], "application/json", "{sent}");
    assert!(!sent.to_string().contains("123-45-6789"), "{sent}");
}

/// Under a schema that lets any object through, an answer whose only key is `a2a` (A2A's
/// reply form) is still the validated object: sent as data, it does not end the task
/// rejected or ask the client a question.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validated_answer_shaped_like_the_reply_form_is_still_data() {
    let dir = tempfile::tempdir().unwrap();
    let form = json!({"a2a": {"state": "rejected", "text": "no"}});
    let (_serving, base) = serve_with(
        dir.path(),
        json!({"type": "object"}),
        json!([{"text": form.to_string()}]),
    );
    let sent = send_message(&base, "@profiler who wrote the first program?").await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    let parts = &task["artifacts"][0]["parts"];
    assert_eq!(parts[0]["data"], form, "{sent}");
    assert_eq!(parts[0]["mediaType"], "application/json", "{sent}");
}

/// A `/hub` in an A2A peer's message is no person's choice: under a policy that denies
/// `dispatch_agent`, it is refused as the supervisor's dispatch would be, where the same
/// `/hub` typed into the API reaches the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_command_from_an_a2a_peer_is_governed_as_a_dispatch() {
    let dir = tempfile::tempdir().unwrap();
    let (_serving, base) = serve_configured(
        dir.path(),
        json!({"type": "object"}),
        json!([{"text": "{\"by\": \"a person\"}"}]),
        "\n[tools]\nblacklist = [\"dispatch_agent\"]\n",
    );
    let sent = send_message(&base, "/hub profiler tell me").await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{sent}");
    assert!(sent.to_string().contains("dispatch_agent"), "{sent}");

    // A person's `/hub`, over the API, is theirs to make.
    let api = crate::suite::serve::Api::new(&base, None);
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let said = api.say(&sid, "/hub profiler tell me").await;
    assert_eq!(said["reply"]["status"], "ok", "{said}");
}
