//! The spans of a dispatch to a remote A2A agent: `troupe.a2a.dispatch` under the hub's
//! `troupe.dispatch` (agent id, contextId, protocol version), and a `troupe.a2a.client.call`
//! under it for each call (a client span naming the JSON-RPC method and the endpoint).

use super::{Hub, Peer, a2a_agent};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use troupe_proto::TaskStatus;
use troupe_store::BindingStore;

/// A span as opened: its name, its parent's name and its fields.
#[derive(Debug, Clone)]
struct Opened {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Opened>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent().map(|p| p.name().to_owned()));
        self.0.lock().unwrap().push(Opened {
            name: attrs.metadata().name().to_owned(),
            parent,
            fields,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_to_a_remote_agent_is_a_span_under_the_dispatch_with_a_client_span_per_call() {
    let recorder = Recorder::default();
    // nextest runs each test in a process of its own: the default is this test's alone.
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(recorder.clone())
            .with(tracing_subscriber::filter::LevelFilter::INFO),
    )
    .expect("no other subscriber in this process");
    let peer = Peer::python(&[]);
    let hub = Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await;
    let reply = hub.send("/hub remote echo traced").await;
    assert_eq!(reply.status, TaskStatus::Ok, "{:?}", reply.error);
    let context = hub.store.bindings(Some(hub.session_id)).await.unwrap()[0]
        .provider_session_id
        .clone();

    let spans = recorder.0.lock().unwrap().clone();
    let dispatch: Vec<&Opened> = spans
        .iter()
        .filter(|s| s.name == "troupe.a2a.dispatch")
        .collect();
    assert_eq!(dispatch.len(), 1, "{spans:#?}");
    assert_eq!(dispatch[0].parent.as_deref(), Some("troupe.dispatch"));
    assert_eq!(dispatch[0].fields["agent_id"], "remote");
    assert_eq!(dispatch[0].fields["context_id"], context);
    assert_eq!(dispatch[0].fields["version"], "1.0");
    let calls: Vec<&Opened> = spans
        .iter()
        .filter(|s| s.name == "troupe.a2a.client.call")
        .collect();
    let stream = calls
        .iter()
        .find(|c| c.fields["rpc.method"] == "SendStreamingMessage")
        .unwrap_or_else(|| panic!("{calls:#?}"));
    assert_eq!(stream.parent.as_deref(), Some("troupe.a2a.dispatch"));
    assert_eq!(stream.fields["otel.kind"], "client");
    assert_eq!(stream.fields["url.full"], peer.rpc());
    assert_eq!(stream.fields["operation"], "send_streaming_message");
}
