//! The streamable HTTP transport: rmcp's client over reqwest, with every SSE event shown to
//! the [`TaskSupportTap`] on its way in, and the MCP session id noted for the calls' spans.

use super::oauth::Authorizer;
use super::tap::TaskSupportTap;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::Sse;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

type SseStream = BoxStream<'static, Result<Sse, SseError>>;

/// The `Mcp-Session-Id` the client last sent (`mcp.session.id` of the calls' spans).
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionSeen(Arc<Mutex<Option<Arc<str>>>>);

impl SessionSeen {
    fn observe(&self, session_id: Option<&Arc<str>>) {
        if let Some(id) = session_id {
            *self.lock() = Some(id.clone());
        }
    }

    /// The session requests go out in, once the server assigned one.
    pub(crate) fn get(&self) -> Option<Arc<str>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<str>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// reqwest's rmcp client, tapped, and with an OAuth bearer token when the server has one.
#[derive(Clone)]
pub(crate) struct TapHttpClient {
    inner: reqwest::Client,
    tap: TaskSupportTap,
    session: SessionSeen,
    /// Puts the token on every request and renews it (none: the configured headers only).
    auth: Option<Arc<Authorizer>>,
}

impl std::fmt::Debug for TapHttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapHttpClient")
            .field("oauth", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

impl TapHttpClient {
    fn tap_stream(&self, stream: SseStream) -> SseStream {
        let tap = self.tap.clone();
        stream
            .inspect(move |event| {
                if let Ok(Sse {
                    data: Some(data), ..
                }) = event
                {
                    tap.observe(data.as_bytes());
                }
            })
            .boxed()
    }

    fn tap_response(&self, response: StreamableHttpPostResponse) -> StreamableHttpPostResponse {
        match response {
            StreamableHttpPostResponse::Sse(stream, session) => {
                StreamableHttpPostResponse::Sse(self.tap_stream(stream), session)
            }
            // A plain JSON answer is already parsed; its tools keep `requires_task: false`.
            other => other,
        }
    }
}

impl StreamableHttpClient for TapHttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.session.observe(session_id.as_ref());
        let post = |token: Option<String>| {
            self.inner.post_message(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        };
        let response = match &self.auth {
            Some(auth) => auth.send(post).await?,
            None => post(auth_header).await?,
        };
        Ok(self.tap_response(response))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.session.observe(session_id.as_ref());
        let post = |token: Option<String>| {
            self.inner.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        };
        let response = match &self.auth {
            Some(auth) => auth.send(post).await?,
            None => post(auth_header).await?,
        };
        Ok(self.tap_response(response))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let delete = |token: Option<String>| {
            self.inner.delete_session(
                uri.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        };
        match &self.auth {
            Some(auth) => auth.send(delete).await,
            None => delete(auth_header).await,
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        let get = |token: Option<String>| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        };
        let stream = match &self.auth {
            Some(auth) => auth.send(get).await?,
            None => get(auth_header).await?,
        };
        Ok(self.tap_stream(stream))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        let get = |token: Option<String>| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        };
        let stream = match &self.auth {
            Some(auth) => auth.send(get).await?,
            None => get(auth_header).await?,
        };
        Ok(self.tap_stream(stream))
    }
}

/// The transport for `url` with the configured extra `headers` (and OAuth tokens from `auth`).
pub(crate) fn transport(
    url: &str,
    headers: &BTreeMap<String, String>,
    tap: TaskSupportTap,
    session: SessionSeen,
    auth: Option<Arc<Authorizer>>,
) -> Result<StreamableHttpClientTransport<TapHttpClient>, String> {
    let custom_headers = parse_headers(headers)?;
    let inner = reqwest::Client::builder()
        // Idle pooled connections stall ~40 ms on reuse when a body was left unread (rmcp's
        // own default client turns pooling off for the same reason).
        .pool_max_idle_per_host(0)
        // A redirected POST would lose its body or replay the session id elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom_headers);
    Ok(StreamableHttpClientTransport::with_client(
        TapHttpClient {
            inner,
            tap,
            session,
            auth,
        },
        config,
    ))
}

pub(crate) fn parse_headers(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    headers
        .iter()
        .map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid header name `{name}`"))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("invalid value for header `{name}`"))?;
            Ok((name, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked() {
        let ok = BTreeMap::from([("Authorization".to_owned(), "Bearer x".to_owned())]);
        let parsed = parse_headers(&ok).unwrap();
        assert_eq!(
            parsed[&HeaderName::from_static("authorization")],
            "Bearer x"
        );
        let bad_name = BTreeMap::from([("bad name".to_owned(), "v".to_owned())]);
        assert!(parse_headers(&bad_name).unwrap_err().contains("bad name"));
        let bad_value = BTreeMap::from([("x-a".to_owned(), "line\nbreak".to_owned())]);
        assert!(parse_headers(&bad_value).unwrap_err().contains("x-a"));
    }
}
