//! An http module: every delivery is a `POST` of its frame as JSON to the module's `url`
//! (with its `headers`), answered within its `timeout`. A 2xx answer acknowledges it; its
//! body (JSON, else text; nothing: null) is a dispatch's result. A module's url is a secret
//! (it often carries a token): no error, log line or warning ever shows it.

use super::Attempt;
use serde_json::Value;
use troupe_runtime::modules::ModuleDefinition;

/// One post of `frame`.
pub async fn post(http: &reqwest::Client, def: &ModuleDefinition, frame: &Value) -> Attempt {
    let Some(url) = &def.url else {
        return Attempt::Failed(format!("module `{}` has no url", def.id));
    };
    let mut request = http.post(url).timeout(def.timeout).json(frame);
    for (name, value) in &def.headers {
        request = request.header(name, value);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return Attempt::Timeout(format!(
                "module `{}` did not answer within {:?}",
                def.id, def.timeout
            ));
        }
        Err(e) => return Attempt::Failed(format!("module `{}`: {}", def.id, e.without_url())),
    };
    let status = response.status();
    let (body, cut) = match read_at_most(response, MAX_BODY).await {
        Ok(read) => read,
        Err(e) if e.is_timeout() => {
            return Attempt::Timeout(format!(
                "module `{}` did not answer within {:?}",
                def.id, def.timeout
            ));
        }
        Err(e) => return Attempt::Failed(format!("module `{}`: {}", def.id, e.without_url())),
    };
    if cut {
        // Not JSON any more: its text, saying it was cut.
        let mut text = String::from_utf8_lossy(&body).into_owned();
        text.push_str(&format!("\n[answer truncated at {MAX_BODY} bytes]"));
        if !status.is_success() {
            let text: String = text.chars().take(200).collect();
            return Attempt::Failed(format!("module `{}` answered {status}: {text}", def.id));
        }
        return Attempt::Done(Some(Value::String(text)));
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(200).collect();
        return Attempt::Failed(format!("module `{}` answered {status}: {text}", def.id));
    }
    if body.is_empty() {
        return Attempt::Done(None);
    }
    let result = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Attempt::Done(Some(result))
}

/// The most of an answer's body read; the rest is not.
pub const MAX_BODY: usize = super::gateway::MAX_LINE;

/// At most `max` bytes of the body, and whether there was more.
async fn read_at_most(
    mut response: reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            body.extend_from_slice(&chunk[..max - body.len()]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_post_never_shows_the_url() {
        // A port nothing listens on: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let def: ModuleDefinition = serde_json::from_value(serde_json::json!({
            "id": "hook",
            "direction": "output",
            "protocol": "http",
            "url": format!("http://127.0.0.1:{port}/hooks/s3cr3t-path?token=s3cr3t-query"),
        }))
        .unwrap();
        let attempt = post(&reqwest::Client::new(), &def, &serde_json::json!({})).await;
        let Attempt::Failed(message) = attempt else {
            panic!("a refused connection is a failure");
        };
        assert!(message.starts_with("module `hook`"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        assert!(!message.contains("hooks"), "{message}");
    }

    #[tokio::test]
    async fn an_answer_is_read_up_to_its_cap_and_says_it_was_cut() {
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|| async { "x".repeat(MAX_BODY + 4096) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let def: ModuleDefinition = serde_json::from_value(serde_json::json!({
            "id": "hook", "direction": "output", "protocol": "http", "url": url,
        }))
        .unwrap();
        let attempt = post(&reqwest::Client::new(), &def, &serde_json::json!({})).await;
        let Attempt::Done(Some(Value::String(text))) = attempt else {
            panic!("a 2xx answer acknowledges: {attempt:?}");
        };
        let marker = format!("\n[answer truncated at {MAX_BODY} bytes]");
        assert_eq!(text.len(), MAX_BODY + marker.len());
        assert!(text.ends_with(&marker));
    }
}
