//! Running statements: prepared once per connection (deadpool's statement cache), errors
//! turned into `AgentError`s naming what failed and counted by class.

use super::pg_err;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use troupe_proto::AgentError;

pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Runs a statement; the rows it changed.
pub(super) async fn exec(
    c: &impl GenericClient,
    what: &'static str,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, AgentError> {
    let st = c.prepare_cached(sql).await.map_err(pg_err(what))?;
    c.execute(&st, params).await.map_err(pg_err(what))
}

/// Every row of a query.
pub(super) async fn rows(
    c: &impl GenericClient,
    what: &'static str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, AgentError> {
    let st = c.prepare_cached(sql).await.map_err(pg_err(what))?;
    c.query(&st, params).await.map_err(pg_err(what))
}

/// The row of a query that returns at most one.
pub(super) async fn row(
    c: &impl GenericClient,
    what: &'static str,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, AgentError> {
    let st = c.prepare_cached(sql).await.map_err(pg_err(what))?;
    c.query_opt(&st, params).await.map_err(pg_err(what))
}

/// Every row of a query, decoded.
pub(super) async fn decoded<T>(
    c: &impl GenericClient,
    what: &'static str,
    sql: &str,
    params: Params<'_>,
    decode: impl Fn(&Row) -> Result<T, AgentError>,
) -> Result<Vec<T>, AgentError> {
    rows(c, what, sql, params)
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// A column of a row the store wrote itself (a count, a key), as an internal error if not.
pub(super) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
    what: &'static str,
) -> Result<T, AgentError> {
    row.try_get(index).map_err(pg_err(what))
}
