//! The console's HTML, rendered on the server: whole pages that read without JavaScript
//! (curl and text browsers get the session list, a session's header and its latest
//! messages), which the console's script then takes over. Pure functions of their inputs.

use troupe_proto::Role;
use troupe_proto::store::{MessageKind, MessageRecord, SessionRecord};

/// Longest message text a page shows inline; the script loads the whole message.
const INLINE_CHARS: usize = 2_000;

/// Escapes text for an HTML element or a quoted attribute.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON for a `<script type="application/json">` block: no `<` can end the element early.
pub fn script_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// A unix-ms time as an HTTP date (`Tue, 24 Nov 2026 10:00:03 GMT`), in a `<time>` the
/// script turns into "3 min ago".
fn time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    format!(
        r#"<time data-ms="{ms}">{}</time>"#,
        httpdate::fmt_http_date(at)
    )
}

/// Whether a session matches a search: every word of `q` occurs (case-insensitively) in
/// its title, project, id or status.
pub fn matches(record: &SessionRecord, q: &str) -> bool {
    let hay = format!(
        "{} {} {} {}",
        record.title.as_deref().unwrap_or_default(),
        record.project_id.as_deref().unwrap_or_default(),
        record.session_id,
        record.status.as_str(),
    )
    .to_lowercase();
    q.split_whitespace()
        .all(|word| hay.contains(&word.to_lowercase()))
}

/// The frame of every page: `page` names it for the script (`sessions`, `session`,
/// `sign-in`, `not-found`); `boot` is what the script starts from.
pub fn layout(title: &str, page: &str, body: &str, boot: Option<&serde_json::Value>) -> String {
    let boot = boot.map_or_else(String::new, |b| {
        format!(
            r#"<script type="application/json" id="boot">{}</script>"#,
            script_json(b)
        )
    });
    format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · troupe</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css">
<script type="module" src="/console/console.js"></script>
</head>
<body data-page="{page}">
<a class="skip" href="#main">Skip to content</a>
{body}
{boot}
</body>
</html>
"##,
        title = esc(title),
        page = esc(page),
    )
}

/// The top bar; `signed_in`: a sign-in cookie holds (so signing out means something).
fn top(signed_in: bool) -> String {
    let sign_out = if signed_in {
        r#"<form method="post" action="/console/sign-out" class="sign-out"><button type="submit">Sign out</button></form>"#
    } else {
        ""
    };
    format!(
        r#"<header class="top"><a class="brand" href="/">troupe</a><nav aria-label="Main"><a href="/">Sessions</a> <a href="/tokens">Tokens</a></nav><span id="conn" class="conn" role="status" aria-live="polite"></span>{sign_out}</header>"#
    )
}

/// The sign-in page: a form that posts the token once (the answer sets the cookie and goes
/// to `next`).
pub fn sign_in(next: &str, error: Option<&str>) -> String {
    let error = error.map_or_else(String::new, |e| {
        format!(r#"<p class="error" role="alert">{}</p>"#, esc(e))
    });
    let body = format!(
        r#"<main id="main" class="sign-in">
<h1>Sign in to troupe</h1>
<form method="post" action="/console/sign-in" id="sign-in-form">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="off" autocapitalize="off" spellcheck="false" required autofocus>
<input type="hidden" name="next" value="{next}">
<button type="submit">Sign in</button>
{error}<p class="error" id="sign-in-error" role="alert" hidden></p>
</form>
<p class="muted">The token is sent once; the browser keeps a sign-in cookie (HttpOnly, SameSite=Strict) and never the token itself.</p>
</main>"#,
        next = esc(next),
    );
    layout("Sign in", "sign-in", &body, None)
}

/// A page for what is not there (or not visible to the caller).
pub fn not_found(what: &str, signed_in: bool) -> String {
    let body = format!(
        r#"{top}<main id="main"><h1>Not found</h1><p>{what}</p><p><a href="/">All sessions</a></p></main>"#,
        top = top(signed_in),
        what = esc(what),
    );
    layout("Not found", "not-found", &body, None)
}

/// One row of the session list.
#[derive(Debug, Clone, Copy)]
pub struct SessionRow<'a> {
    pub record: &'a SessionRecord,
    /// The current session of its project.
    pub current: bool,
}

/// The session list, newest activity first: a table that reads without the script, a
/// search form (`GET /?q=`) and, for the script, the form that creates a session.
pub fn sessions(rows: &[SessionRow<'_>], q: &str, total: usize, signed_in: bool) -> String {
    let mut body = top(signed_in);
    body.push_str(&format!(
        r#"<main id="main">
<div class="head"><h1>Sessions</h1></div>
<form class="search" method="get" action="/" role="search">
<label for="q">Search sessions</label>
<input id="q" name="q" type="search" value="{q}" placeholder="title, project, id or status" accesskey="s">
<button type="submit">Search</button>
</form>
<details class="create" id="create" hidden>
<summary>New session</summary>
<form id="create-form">
<label for="new-project">Project</label><input id="new-project" name="project" autocomplete="off" placeholder="none">
<label for="new-title">Title</label><input id="new-title" name="title" autocomplete="off">
<button type="submit">Create session</button>
<p class="error" id="create-error" role="alert" hidden></p>
</form>
</details>
"#,
        q = esc(q)
    ));
    body.push_str(
        r#"<table id="sessions" class="sessions"><thead><tr><th scope="col">Session</th><th scope="col">Project</th><th scope="col">Status</th><th scope="col">Last activity</th><th scope="col">Current</th></tr></thead><tbody>"#,
    );
    for row in rows {
        body.push_str(&session_row(row));
    }
    body.push_str("</tbody></table>");
    let plural = |n: usize| if n == 1 { "session" } else { "sessions" };
    let count = if q.trim().is_empty() {
        format!("{total} {}", plural(total))
    } else {
        format!("{} of {total} {} match", rows.len(), plural(total))
    };
    body.push_str(&format!(
        r#"<p class="count muted" id="count">{}</p></main>"#,
        esc(&count)
    ));
    layout("Sessions", "sessions", &body, None)
}

fn session_row(row: &SessionRow<'_>) -> String {
    let r = row.record;
    let id = r.session_id.to_string();
    let title = r.title.as_deref().filter(|t| !t.trim().is_empty());
    let project = r.project_id.as_deref();
    let current = match (row.current, project) {
        (true, _) => {
            r#"<span class="current" title="the project's current session">★ current</span>"#
                .to_owned()
        }
        (false, Some(_)) => {
            r#"<button type="button" class="make-current" hidden>Make current</button>"#.to_owned()
        }
        (false, None) => String::new(),
    };
    format!(
        r#"<tr data-session-id="{id}" data-project="{project_attr}"><td><a href="/sessions/{id}">{title}</a><div class="muted mono">{id}</div></td><td>{project}</td><td><span class="status status-{status}">{status}</span></td><td>{updated}</td><td>{current}</td></tr>"#,
        id = esc(&id),
        project_attr = esc(project.unwrap_or_default()),
        title = esc(title.unwrap_or("(untitled)")),
        project = project.map_or_else(|| "—".to_owned(), esc),
        status = r.status.as_str(),
        updated = time(r.updated_ms.max(r.created_ms)),
    )
}

/// A session's live view: its header and its latest messages (for reading without the
/// script; the script renders them again, live).
pub fn session(
    record: &SessionRecord,
    messages: &[MessageRecord],
    boot: &serde_json::Value,
    signed_in: bool,
) -> String {
    let id = record.session_id.to_string();
    let title = record
        .title
        .as_deref()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or("(untitled)");
    let mut static_messages = String::new();
    for m in messages {
        static_messages.push_str(&static_message(m));
    }
    let body = format!(
        r#"{top}<main id="main" class="session">
<div class="head">
<h1 id="title">{title}</h1>
<p class="meta muted"><span>project <b id="project">{project}</b></span> · <span>status <span id="status" class="status status-{status}">{status}</span></span> · <span class="mono">{id}</span></p>
</div>
<div class="layout">
<section class="chat" aria-label="Messages">
<button type="button" id="older" class="older" hidden>Load older messages</button>
<p id="start" class="muted" hidden>The start of the session.</p>
<ol id="messages" class="messages">{static_messages}</ol>
<div id="live" class="live" aria-live="polite"></div>
<form id="composer" class="composer" hidden>
<label for="conversation">Conversation</label><select id="conversation"></select>
<label for="text" class="sr-only">Message</label>
<textarea id="text" rows="3" placeholder="Message (Enter sends, Shift+Enter for a new line)"></textarea>
<button type="submit" id="send">Send</button>
<p class="error" id="send-error" role="alert" hidden></p>
</form>
</section>
<aside class="side" aria-label="Session">
<section id="approvals-panel" aria-labelledby="approvals-h"><h2 id="approvals-h">Approvals <span id="approvals-count" class="badge">0</span></h2><ul id="approvals" class="approvals"></ul><p id="approvals-empty" class="muted">Nothing waits for you.</p></section>
<section aria-labelledby="tasks-h"><h2 id="tasks-h">Tasks</h2><ul id="tasks" class="tasks"></ul><p id="tasks-empty" class="muted">Nothing runs.</p></section>
<section aria-labelledby="convs-h"><h2 id="convs-h">Conversations</h2><ul id="conversations" class="conversations"></ul><button type="button" id="new-conversation" hidden>New conversation</button></section>
<section aria-labelledby="stats-h"><h2 id="stats-h">Statistics</h2><dl id="stats" class="stats"></dl></section>
<section aria-labelledby="agents-h"><h2 id="agents-h">Agents</h2><div id="agents"><p class="muted">No routing or dispatch yet.</p></div></section>
<section aria-labelledby="events-h"><h2 id="events-h">Events</h2><ol id="events" class="events" reversed></ol></section>
</aside>
</div>
</main>"#,
        top = top(signed_in),
        title = esc(title),
        project = esc(record.project_id.as_deref().unwrap_or("—")),
        status = record.status.as_str(),
        id = esc(&id),
    );
    layout(title, "session", &body, Some(boot))
}

/// A message as the page shows it before the script runs.
fn static_message(m: &MessageRecord) -> String {
    let who = match (m.kind, m.role) {
        (MessageKind::ToolCall, _) => "tool call",
        (MessageKind::ToolResult, _) => "tool result",
        (MessageKind::Status, _) => "status",
        (_, Role::User) => "user",
        (_, Role::Assistant) => "assistant",
        (_, Role::System) => "system",
    };
    let text = match &m.content {
        Some(c) if c.chars().count() > INLINE_CHARS => {
            let cut: String = c.chars().take(INLINE_CHARS).collect();
            format!("{cut}…")
        }
        Some(c) => c.clone(),
        None => format!("({} characters, not stored)", m.chars),
    };
    let status = m.status.map_or_else(String::new, |s| {
        format!(
            r#" <span class="status status-{s}">{s}</span>"#,
            s = s.as_str()
        )
    });
    format!(
        r#"<li class="msg msg-{kind} role-{role}" data-message-id="{id}"><div class="who">{who}{status}</div><div class="text">{text}</div></li>"#,
        kind = m.kind.as_str(),
        role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
        },
        id = m.message_id,
        text = esc(&text),
    )
}

/// The authorization tokens page (A5): every token, newest first, each with a revoke button
/// while it is in force; the form that issues one; and, right after an issue, its secret,
/// shown this once. Reads and works without the script (plain forms).
pub fn tokens(
    list: &[troupe_proto::governance::TokenInfo],
    issued: Option<&troupe_proto::governance::IssuedToken>,
    error: Option<&str>,
    now_ms: u64,
    signed_in: bool,
) -> String {
    let mut body = top(signed_in);
    body.push_str(r#"<main id="main"><div class="head"><h1>Authorization tokens</h1></div>"#);
    if let Some(issued) = issued {
        body.push_str(&format!(
            r#"<section class="issued" role="status"><h2>Token issued</h2><p>Give this token to whoever sends the message; it is shown this once and is not kept in clear anywhere.</p><p><code id="issued-secret">{}</code></p><p class="muted">id {}</p></section>"#,
            esc(&issued.token),
            esc(&issued.info.id)
        ));
    }
    if let Some(error) = error {
        body.push_str(&format!(
            r#"<p class="error" role="alert">{}</p>"#,
            esc(error)
        ));
    }
    body.push_str(
        r#"<form method="post" action="/console/tokens" id="issue-form" class="issue">
<fieldset><legend>Issue a token</legend>
<label for="agent">Agent</label><input id="agent" name="agent" value="*" required>
<label for="tool">Tool (a pattern: <code>shell</code>, <code>files__*</code>)</label><input id="tool" name="tool" required>
<label for="args">Command-line pattern (tool <code>shell</code> only, optional, e.g. <code>git status*</code>)</label><input id="args" name="args">
<label for="fields">Argument patterns (optional, one <code>NAME=PATTERN</code> a line, e.g. <code>path=notes/*</code>)</label><textarea id="fields" name="fields" rows="2"></textarea>
<label for="ttl_secs">Valid for (seconds)</label><input id="ttl_secs" name="ttl_secs" type="number" min="1" value="3600" required>
<label for="max_uses">Uses</label><input id="max_uses" name="max_uses" type="number" min="1" value="1" required>
<button type="submit">Issue</button>
</fieldset>
</form>
"#,
    );
    if list.is_empty() {
        body.push_str(r#"<p class="muted" id="no-tokens">No tokens yet.</p>"#);
    } else {
        body.push_str(r#"<table class="tokens" id="tokens"><thead><tr><th>id</th><th>agent</th><th>tool</th><th>arguments</th><th>uses</th><th>expires</th><th>state</th><th></th></tr></thead><tbody>"#);
        for t in list {
            let state = if t.revoked_ms.is_some() {
                "revoked"
            } else if t.expires_ms <= now_ms {
                "expired"
            } else if t.uses >= t.max_uses {
                "used up"
            } else {
                "in force"
            };
            let revoke = if state == "in force" {
                format!(
                    r#"<form method="post" action="/console/tokens/{id}/revoke"><button type="submit">Revoke</button></form>"#,
                    id = esc(&t.id)
                )
            } else {
                String::new()
            };
            body.push_str(&format!(
                r#"<tr data-token="{id}"><td><code>{id}</code></td><td>{agent}</td><td><code>{tool}</code></td><td>{args}</td><td>{uses} / {max}</td><td>{expires}</td><td class="state">{state}</td><td>{revoke}</td></tr>"#,
                id = esc(&t.id),
                agent = esc(&t.scope.agent),
                tool = esc(&t.scope.tool),
                args = t.scope.args.iter().cloned().chain(t.scope.fields.iter().map(|(k, v)| format!("{k}={v}"))).map(|a| format!("<code>{}</code>", esc(&a))).collect::<Vec<_>>().join(" "),
                uses = t.uses,
                max = t.max_uses,
                expires = time(t.expires_ms),
            ));
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("</main>");
    layout("Tokens", "tokens", &body, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::store::SessionStatus;
    use troupe_proto::{ConversationId, Json, SessionId};

    fn record(title: Option<&str>, project: Option<&str>) -> SessionRecord {
        SessionRecord {
            session_id: SessionId::new(),
            project_id: project.map(str::to_owned),
            title: title.map(str::to_owned),
            created_ms: 1_700_000_000_000,
            root_conversation_id: ConversationId::new(),
            settings: Json(serde_json::json!({})),
            status: SessionStatus::Completed,
            updated_ms: 1_700_000_100_000,
        }
    }

    #[test]
    fn text_is_escaped_everywhere() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        let evil = record(Some("<script>alert(1)</script>"), Some("p\"><b>"));
        let page = sessions(
            &[SessionRow {
                record: &evil,
                current: false,
            }],
            "</title><script>",
            1,
            true,
        );
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(!page.contains("p\"><b>"));
        assert!(!page.contains("</title><script>"));
        let boot = serde_json::json!({"title": "</script><script>alert(1)</script>"});
        let page = session(&evil, &[], &boot, false);
        assert_eq!(page.matches("</script>").count(), 2, "{page}");
    }

    #[test]
    fn the_list_reads_without_script() {
        let a = record(Some("Refactor the parser"), Some("alpha"));
        let b = record(None, None);
        let page = sessions(
            &[
                SessionRow {
                    record: &a,
                    current: true,
                },
                SessionRow {
                    record: &b,
                    current: false,
                },
            ],
            "",
            2,
            false,
        );
        assert!(page.contains(&format!(
            r#"<a href="/sessions/{}">Refactor the parser</a>"#,
            a.session_id
        )));
        assert!(page.contains("★ current"));
        assert!(page.contains("(untitled)"));
        assert!(page.contains("completed"));
        assert!(page.contains("2 sessions"));
        assert!(page.contains("GMT</time>"));
        assert!(!page.contains("Sign out"));
    }

    #[test]
    fn the_sign_in_field_asks_no_password_manager_to_keep_the_token() {
        let page = sign_in("/sessions/x", None);
        let field = page
            .lines()
            .find(|l| l.contains(r#"id="token""#))
            .expect("the token field");
        for attr in [
            r#"type="password""#,
            r#"autocomplete="off""#,
            r#"autocapitalize="off""#,
            r#"spellcheck="false""#,
        ] {
            assert!(field.contains(attr), "{attr} in {field}");
        }
        assert!(!field.contains("current-password"), "{field}");
    }

    #[test]
    fn search_needs_every_word() {
        let a = record(Some("Refactor the Parser"), Some("alpha"));
        assert!(matches(&a, ""));
        assert!(matches(&a, "parser ALPHA"));
        assert!(matches(&a, "completed"));
        assert!(matches(&a, &a.session_id.to_string()[..8]));
        assert!(!matches(&a, "parser beta"));
    }

    #[test]
    fn long_and_unstored_messages_are_shown_as_such() {
        let base = MessageRecord {
            message_id: 7,
            session_id: SessionId::new(),
            conversation_id: ConversationId::new(),
            task_id: None,
            role: Role::User,
            content: Some("x".repeat(INLINE_CHARS + 5)),
            chars: (INLINE_CHARS + 5) as u64,
            created_ms: 0,
            status: None,
            reply_message_id: None,
            kind: MessageKind::Text,
            metadata: None,
        };
        let long = static_message(&base);
        assert!(long.contains('…'));
        assert!(!long.contains(&"x".repeat(INLINE_CHARS + 1)));
        let none = static_message(&MessageRecord {
            content: None,
            chars: 12,
            ..base
        });
        assert!(none.contains("(12 characters, not stored)"));
    }
}
