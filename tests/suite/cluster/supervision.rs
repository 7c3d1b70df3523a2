//! A node's lease keeper is supervised: when it fails, a new one renews the leases the node
//! holds (its sessions keep them past the ttl) and new sessions start again.

use crate::suite::serve::{Api, id};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::ports::ApproxTokens;
use troupe_runtime::config::TroupeConfig;
use troupe_runtime::{ScriptedModel, assembly};
use troupe_service::supervisor::SupervisorMsg;
use troupe_service::{ClusterStorage, Service, StartOptions};
use troupe_store::{PgOptions, PgRolloutStorage, PgStore, SessionLeases};

const TTL: Duration = Duration::from_secs(1);

/// Node `name` of a cluster on the database at `url`, in this process, serving on
/// 127.0.0.1:0: the service, its leases, its API base.
pub async fn in_process_node(
    dir: &std::path::Path,
    url: &str,
    name: &str,
    ttl: Duration,
) -> (Service, Arc<dyn SessionLeases>, String) {
    let mut config = TroupeConfig {
        data_dir: dir.join(format!("data-{name}")),
        ..TroupeConfig::default()
    };
    config.chat.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
    config.server.grace_period = Duration::from_secs(2);
    let store = Arc::new(
        PgStore::connect_with(
            url,
            PgOptions {
                node: Some(name.to_owned()),
                ..PgOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let rollout = {
        let (url, fencing) = (url.to_owned(), store.fencing());
        tokio::task::spawn_blocking(move || PgRolloutStorage::connect_fenced(&url, fencing))
            .await
            .unwrap()
            .unwrap()
    };
    let cluster = ClusterStorage {
        leases: store.clone(),
        lease_ttl: ttl,
    };
    let model = Arc::new(ScriptedModel::new(Vec::new()));
    let mut ports = assembly::session_ports(&config, model, Arc::new(ApproxTokens));
    ports.rollout_storage = Some(Arc::new(rollout));
    let service = Service::start_with(
        &config,
        store,
        ports,
        None,
        StartOptions {
            cluster: Some(cluster.clone()),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let s = service.clone();
    tokio::spawn(async move {
        let _ = s.serve_http(listener).await;
    });
    (service, cluster.leases, base)
}

async fn owner(leases: &Arc<dyn SessionLeases>, session: &str) -> Option<String> {
    leases
        .owner_of(
            session.parse().unwrap(),
            troupe_actors::clock::unix_now_ms(),
        )
        .await
        .unwrap()
        .map(|(node, _)| node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lease_keeper_is_replaced_and_the_node_keeps_its_leases() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (service, leases, base) = in_process_node(dir.path(), &url, "a", TTL).await;
    let api = Api::new(&base, None);
    let before = id(&api.session(None).await, "session_id");
    api.say(&before, "before").await;
    assert_eq!(owner(&leases, &before).await.as_deref(), Some("a"));

    let sessions = &service.sessions;
    let first = sessions.current_lease_keeper().unwrap().get_id();
    sessions
        .supervisor()
        .cast(SupervisorMsg::FailLeaseKeeper)
        .unwrap();
    let t0 = Instant::now();
    while sessions
        .current_lease_keeper()
        .is_none_or(|k| k.get_id() == first)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no new lease keeper"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Three ttls later the lease is still this node's: the new keeper renews it.
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(
        owner(&leases, &before).await.as_deref(),
        Some("a"),
        "the lease of a session held before the failure is renewed"
    );
    assert_eq!(
        api.say(&before, "again").await["reply"]["text"],
        "You said: again"
    );
    // A new session takes its lease through the new keeper.
    let after = id(&api.session(None).await, "session_id");
    assert_eq!(
        api.say(&after, "after").await["reply"]["text"],
        "You said: after"
    );
    assert_eq!(owner(&leases, &after).await.as_deref(), Some("a"));
    let (status, health) = api.get("/healthz").await;
    assert_eq!(
        (status.as_u16(), health["status"].as_str()),
        (200, Some("ok"))
    );
    service.shutdown_token().cancel();
}
