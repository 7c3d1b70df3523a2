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
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) if e.is_timeout() => {
            return Attempt::Timeout(format!(
                "module `{}` did not answer within {:?}",
                def.id, def.timeout
            ));
        }
        Err(e) => return Attempt::Failed(format!("module `{}`: {}", def.id, e.without_url())),
    };
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
}
