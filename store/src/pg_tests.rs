//! What only the PostgreSQL store has: its schema's version and the migration lock, its
//! query plans, its connections (a broken one is replaced), its metrics.

use super::backends::{Db, Kind};
use super::{PgStore, Store};
use troupe_proto::SessionId;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_migrates_to_the_current_version_once() {
    let db = Db::fresh(Kind::Postgres);
    let store = PgStore::connect(db.url()).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        super::postgres::schema::VERSION
    );
    let tables = || {
        troupe_test_postgres::server()
            .psql(&format!(
                "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = '{}'",
                schema_of(&db)
            ))
            .unwrap()
    };
    let before = tables();
    assert!(
        before.contains("messages") && before.contains("rollout_events"),
        "{before}"
    );
    drop(store);
    let again = PgStore::connect(db.url()).await.unwrap();
    assert_eq!(tables(), before, "a second connect changes nothing");
    again.ping().await.unwrap();
}

fn schema_of(db: &Db) -> String {
    db.url().rsplit("search_path%3D").next().unwrap().to_owned()
}

/// Nodes starting at once on an empty database: the advisory lock lets one migrate, the
/// others find the schema done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_at_once_migrate_once() {
    let db = Db::fresh(Kind::Postgres);
    let url = db.url().to_owned();
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::connect(&url).await })
        })
        .collect();
    for start in starts {
        let store = start.await.unwrap().unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            super::postgres::schema::VERSION
        );
    }
}

#[test]
fn a_newer_schema_is_refused() {
    let db = Db::fresh(Kind::Postgres);
    runtime().block_on(async {
        drop(PgStore::connect(db.url()).await.unwrap());
    });
    db.raw("UPDATE troupe_schema SET version = version + 1");
    let err = runtime()
        .block_on(PgStore::connect(db.url()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn a_bad_url_is_invalid_input_and_no_server_an_error() {
    let rt = runtime();
    let err = rt
        .block_on(PgStore::connect("mysql://nowhere"))
        .err()
        .unwrap();
    assert_eq!(err.kind(), troupe_proto::ErrorKind::InvalidInput, "{err}");
    // A port nothing listens on: the connect fails at once with what it tried.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = rt
        .block_on(PgStore::connect(&format!(
            "postgresql://troupe@127.0.0.1:{port}/postgres"
        )))
        .err()
        .unwrap();
    assert!(err.to_string().contains("postgres connection"), "{err}");
}

/// The reads a start-up, a page and the sweeps run can be served from their indexes, in
/// their order (the planner of an empty table is told not to prefer scanning it).
#[test]
fn the_query_plans_use_the_indexes() {
    let db = Db::fresh(Kind::Postgres);
    runtime().block_on(async {
        drop(PgStore::connect(db.url()).await.unwrap());
    });
    let plan = |sql: &str| -> String {
        troupe_test_postgres::server()
            .psql(&format!(
                "SET search_path = {}; SET enable_seqscan = off; SET enable_bitmapscan = off; EXPLAIN {sql}",
                schema_of(&db)
            ))
            .unwrap()
    };
    for (sql, index) in [
        (
            "SELECT message_id, octet_length(content) FROM messages WHERE session_id = 'x' AND message_id < 5 ORDER BY message_id DESC LIMIT 11",
            "messages_by_session",
        ),
        (
            "SELECT * FROM messages WHERE session_id = 'x' AND status IN ('queued', 'running') ORDER BY message_id",
            "messages_pending",
        ),
        (
            "UPDATE messages SET content = NULL, expires_ms = NULL WHERE expires_ms <= 5",
            "messages_by_expiry",
        ),
        (
            "SELECT seq, record FROM rollout_events WHERE session_id = 'x' AND conversation_id = 'c' ORDER BY seq",
            "rollout_events_by_conversation",
        ),
        (
            "SELECT seq FROM rollout_events WHERE expires_ms <= 5 LIMIT 9",
            "rollout_events_by_expiry",
        ),
        (
            "SELECT * FROM conversations WHERE session_id = 'x' AND state = 'open' ORDER BY created_ms, row_id",
            "conversations_open",
        ),
        (
            "SELECT * FROM a2a_tasks WHERE NOT terminal ORDER BY created_ms, task_id",
            "a2a_tasks_live",
        ),
        (
            "SELECT * FROM sessions WHERE project_id = 'p' ORDER BY created_ms DESC, row_id DESC",
            "sessions_by_project",
        ),
    ] {
        let p = plan(sql);
        assert!(p.contains(index) && !p.contains("Sort "), "{sql}:\n{p}");
    }
}

/// A connection the server dropped is replaced: the store answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_replaced() {
    let db = Db::fresh(Kind::Postgres);
    let store = db.store().await;
    store.ping().await.unwrap();
    troupe_test_postgres::server()
        .psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'troupe' AND pid <> pg_backend_pid()",
        )
        .unwrap();
    // The operation that meets the dead connection may fail; the next one has a new one.
    let mut answered = false;
    for _ in 0..3 {
        if store.get_session(SessionId::new()).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered, "the store never reconnected");
}

/// The pool's gauges and the error counter exist at 0 before any connection, and move.
#[test]
fn the_pool_and_its_errors_are_measured() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let db = Db::fresh(Kind::Postgres);
    metrics::with_local_recorder(&recorder, || {
        super::metrics::describe();
        let gauge = |snapshot: &[(String, String, f64)], pool: &str, state: &str| {
            snapshot
                .iter()
                .find(|(k, _, _)| {
                    k.contains(&format!("pool={pool}")) && k.contains(&format!("state={state}"))
                })
                .map(|(_, _, v)| *v)
        };
        let read = || -> Vec<(String, String, f64)> {
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let k = key.key();
                    let labels: Vec<String> = k
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    let v = match value {
                        DebugValue::Gauge(g) => g.into_inner(),
                        DebugValue::Counter(c) => c as f64,
                        DebugValue::Histogram(_) => -1.0,
                    };
                    (
                        format!("{} {}", k.name(), labels.join(",")),
                        k.name().to_owned(),
                        v,
                    )
                })
                .collect()
        };
        let at_start = read();
        assert_eq!(gauge(&at_start, "store", "open"), Some(0.0));
        assert_eq!(gauge(&at_start, "rollout", "max"), Some(0.0));
        for class in ["connection", "constraint", "conflict", "query"] {
            assert!(
                at_start
                    .iter()
                    .any(|(k, _, v)| k.starts_with(super::metrics::PG_ERRORS)
                        && k.contains(&format!("class={class}"))
                        && *v == 0.0),
                "{class}"
            );
        }
        runtime().block_on(async {
            let store = PgStore::connect(db.url()).await.unwrap();
            store.ping().await.unwrap();
        });
        let after = read();
        assert_eq!(gauge(&after, "store", "max"), Some(8.0));
        assert!(gauge(&after, "store", "open").unwrap() >= 1.0);
        db.raw("DROP TABLE sessions CASCADE");
        runtime().block_on(async {
            let store = PgStore::connect(db.url()).await.unwrap();
            assert!(store.all_sessions().await.is_err());
        });
        let failed = read();
        assert!(
            failed
                .iter()
                .any(|(k, _, v)| k.starts_with(super::metrics::PG_ERRORS)
                    && k.contains("class=query")
                    && *v >= 1.0),
            "{failed:?}"
        );
    });
}
