//! The backends the conformance suites run on: each test gets a store of its own, in a
//! temporary directory (SQLite) or in a schema of its own on the test process's PostgreSQL
//! server ([`troupe_test_postgres::server`], started on first use). A test on PostgreSQL
//! fails when no server can be started; it never skips.

use super::{PgRolloutStorage, PgStore, SqliteRolloutStorage, SqliteStore, Store, db_path};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tempfile::TempDir;
use troupe_actors::rollout::storage::RolloutStorage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
}

/// Where one test's store lives; it outlives every store opened on it.
pub(crate) struct Db {
    pub(crate) kind: Kind,
    /// The SQLite files (an empty directory for PostgreSQL).
    pub(crate) dir: TempDir,
    /// The PostgreSQL URL (its connections use the test's schema).
    pub(crate) url: Option<String>,
}

static SCHEMAS: AtomicU64 = AtomicU64::new(0);

impl Db {
    /// A new, empty home for a store.
    pub(crate) fn fresh(kind: Kind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = match kind {
            Kind::Sqlite => None,
            Kind::Postgres => {
                let server = troupe_test_postgres::server();
                let schema = format!("t{}", SCHEMAS.fetch_add(1, Ordering::Relaxed));
                server
                    .psql(&format!("CREATE SCHEMA {schema}"))
                    .unwrap_or_else(|e| panic!("create schema {schema}: {e}"));
                Some(server.schema_url(&schema))
            }
        };
        Self { kind, dir, url }
    }

    /// The PostgreSQL URL (panics for SQLite).
    pub(crate) fn url(&self) -> &str {
        self.url.as_deref().unwrap()
    }

    /// Opens (again) the store.
    pub(crate) async fn store(&self) -> Arc<dyn Store> {
        match self.kind {
            Kind::Sqlite => Arc::new(SqliteStore::open_in(self.dir.path()).unwrap()),
            Kind::Postgres => Arc::new(PgStore::connect(self.url()).await.unwrap()),
        }
    }

    /// Opens (again) the rollout storage, beside the store.
    pub(crate) fn rollout(&self) -> Arc<dyn RolloutStorage> {
        match self.kind {
            Kind::Sqlite => Arc::new(SqliteRolloutStorage::open(db_path(self.dir.path())).unwrap()),
            Kind::Postgres => Arc::new(PgRolloutStorage::connect(self.url()).unwrap()),
        }
    }

    /// Runs SQL on the store's database as its owner (the tests' way to corrupt rows).
    pub(crate) fn raw(&self, sql: &str) {
        match self.kind {
            Kind::Sqlite => {
                let raw = rusqlite::Connection::open(db_path(self.dir.path())).unwrap();
                raw.execute_batch(sql).unwrap();
            }
            Kind::Postgres => {
                let schema = self
                    .url()
                    .rsplit("search_path%3D")
                    .next()
                    .unwrap()
                    .to_owned();
                troupe_test_postgres::server()
                    .psql(&format!("SET search_path = {schema}; {sql}"))
                    .unwrap();
            }
        }
    }
}

/// Instantiates each named `async fn(Kind)` as a test per backend: `<module>::sqlite::<name>`
/// and `<module>::postgres::<name>`, on a runtime of two workers.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::backends::Kind::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::backends::Kind::Postgres).await
                }
            )*
        }
    };
}

pub(crate) use on_every_backend;
