//! Opening and configuring the database's connections, and the pool of reader connections.
//!
//! Every connection: foreign keys on, `synchronous = NORMAL` (in WAL mode a commit is written
//! to the WAL before it returns, so it survives a crash of the process; the WAL is fsynced at
//! checkpoints), `secure_delete` on (space that deleted or overwritten content leaves is
//! zeroed, so content a Ttl sweep drops is not left in free pages; see [`truncate_wal`] for the
//! WAL), and a busy handler that retries for [`BUSY_BUDGET`] with short sleeps. The
//! store's writer and the rollout's writer are two connections that take turns on the one
//! write lock; SQLite's stock handler sleeps whole milliseconds, far longer than the
//! transactions it waits for.

use crossbeam_channel::{Receiver, Sender};
use rusqlite::Connection;
use std::fmt::Display;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};
use troupe_proto::AgentError;

/// How long a connection waits for the write lock before the operation fails.
pub const BUSY_BUDGET: Duration = Duration::from_secs(5);
/// How long a reader waits for a free connection of the pool.
const CHECKOUT_WAIT: Duration = Duration::from_secs(30);
/// First and longest sleep of the busy handler.
const BUSY_SLEEP_MIN: Duration = Duration::from_micros(20);
const BUSY_SLEEP_MAX: Duration = Duration::from_millis(5);
/// Prepared statements kept per connection (the store has about twenty).
const STATEMENT_CACHE: usize = 64;
/// How often the checkpointer copies the WAL into the database.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);
/// WAL pages after which a writer checkpoints by itself: only reached if the checkpointer
/// falls far behind (about 64 MiB).
const WRITER_AUTOCHECKPOINT: u32 = 16_384;
/// The WAL is truncated to this size when it is reset after a checkpoint.
const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sets WAL mode; may write; leaves checkpoints to the checkpointer.
    Writer,
    /// Copies the WAL into the database file.
    Checkpointer,
    /// `query_only`: a bug that writes through it fails instead of taking the write lock.
    Reader,
}

/// An `Internal` error naming what failed.
pub fn internal(what: impl Display, e: impl Display) -> AgentError {
    AgentError::internal(format!("{what}: {e}"))
}

/// Opens `path` (creating the file for a writer) and configures the connection.
pub fn open(path: &Path, role: Role) -> Result<Connection, AgentError> {
    let what = || format!("sqlite open {}", path.display());
    let mut conn = Connection::open(path).map_err(|e| internal(what(), e))?;
    let mut started = Instant::now();
    conn.busy_handler(Some(move |count: i32| {
        if !WAIT_WHEN_BUSY.get() {
            return false;
        }
        if count == 0 {
            started = Instant::now();
        }
        if started.elapsed() >= BUSY_BUDGET {
            return false;
        }
        let shift = u32::try_from(count).unwrap_or(0).min(10);
        std::thread::sleep((BUSY_SLEEP_MIN * 2u32.pow(shift)).min(BUSY_SLEEP_MAX));
        true
    }))
    .map_err(|e| internal(what(), e))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    if role == Role::Writer {
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
            .map_err(|e| internal(what(), e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(internal(what(), format!("journal_mode is {mode}, not wal")));
        }
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {WRITER_AUTOCHECKPOINT};
             PRAGMA journal_size_limit = {WAL_SIZE_LIMIT};"
        ))
        .map_err(|e| internal(what(), e))?;
    }
    conn.execute_batch(
        "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL; PRAGMA secure_delete = ON;",
    )
    .map_err(|e| internal(what(), e))?;
    if role == Role::Reader {
        conn.execute_batch("PRAGMA query_only = ON;")
            .map_err(|e| internal(what(), e))?;
    }
    Ok(conn)
}

/// Locks the writing connection, waiting for a caller writing on the fast path.
pub fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    match conn.lock() {
        Ok(guard) => guard,
        Err(poisoned) => recovered(conn, poisoned.into_inner()),
    }
}

/// Locks the writing connection if it is free at once.
pub fn try_lock(conn: &Mutex<Connection>) -> Option<MutexGuard<'_, Connection>> {
    match conn.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Poisoned(poisoned)) => Some(recovered(conn, poisoned.into_inner())),
    }
}

/// A connection whose holder panicked: its transaction, if it left one open, is rolled back,
/// so the next write begins on a clean connection.
fn recovered<'a>(
    conn: &'a Mutex<Connection>,
    guard: MutexGuard<'a, Connection>,
) -> MutexGuard<'a, Connection> {
    conn.clear_poison();
    if !guard.is_autocommit() {
        let _ = guard.execute_batch("ROLLBACK");
    }
    guard
}

thread_local! {
    /// Cleared while this thread must not wait for the write lock another connection holds
    /// ([`try_begin_immediate`]).
    static WAIT_WHEN_BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Begins a write transaction if no other connection holds the write lock, without waiting
/// for it: `Ok(false)` when one does. A write on a runtime thread begins so, and leaves the
/// wait to its writer thread: the busy handler sleeps the thread it runs on, and another
/// process (a `troupe` command on the same data directory, a backup) can hold the lock for
/// seconds.
pub fn try_begin_immediate(conn: &Connection) -> rusqlite::Result<bool> {
    WAIT_WHEN_BUSY.set(false);
    let began = exec_cached(conn, "BEGIN IMMEDIATE");
    WAIT_WHEN_BUSY.set(true);
    match began {
        Ok(()) => Ok(true),
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::DatabaseBusy =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Runs a statement without parameters or rows (transaction control, a pragma) from the
/// connection's statement cache: parsed once per connection, not at every write.
pub fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Applies `apply` to every item in one `BEGIN IMMEDIATE` transaction, each in a savepoint of
/// its own (a write that fails is undone alone; the others commit); one result per item.
/// `Err` when the transaction could not begin or commit: then nothing of it is stored.
/// `sql_error` names what failed (`begin`, `savepoint`, `commit`; a lone item's failed
/// `ROLLBACK` is reported as `commit`). The transaction-control statements come from the
/// statement cache ([`exec_cached`]).
///
/// A lone item needs no savepoint: if it fails, the whole transaction is rolled back, which
/// undoes the same changes (and saves the copy of every page it touches into the savepoint's
/// journal: a turn's writes are mostly alone in their transaction).
pub fn write_batch<I, T, E>(
    conn: &Connection,
    items: impl IntoIterator<Item = I>,
    apply: impl FnMut(&Connection, I) -> Result<T, E>,
    sql_error: impl Fn(&'static str, rusqlite::Error) -> E,
) -> Result<Vec<Result<T, E>>, E> {
    exec_cached(conn, "BEGIN IMMEDIATE").map_err(|e| sql_error("begin", e))?;
    write_begun(conn, items, apply, sql_error)
}

/// [`write_batch`] in a transaction already begun ([`try_begin_immediate`]).
pub fn write_begun<I, T, E>(
    conn: &Connection,
    items: impl IntoIterator<Item = I>,
    mut apply: impl FnMut(&Connection, I) -> Result<T, E>,
    sql_error: impl Fn(&'static str, rusqlite::Error) -> E,
) -> Result<Vec<Result<T, E>>, E> {
    let mut items = items.into_iter().peekable();
    let first = items.next();
    let lone = items.peek().is_none();
    let first = match first {
        Some(item) if lone => {
            let result = apply(conn, item);
            if result.is_err() {
                // Undone alone, as a savepoint would: there is nothing else to keep.
                return match exec_cached(conn, "ROLLBACK") {
                    Ok(()) => Ok(vec![result]),
                    Err(e) => Err(sql_error("commit", e)),
                };
            }
            if let Err(e) = exec_cached(conn, "COMMIT") {
                let _ = exec_cached(conn, "ROLLBACK");
                return Err(sql_error("commit", e));
            }
            return Ok(vec![result]);
        }
        first => first,
    };
    let results = first
        .into_iter()
        .chain(items)
        .map(|item| in_savepoint(conn, |c| apply(c, item), &sql_error))
        .collect();
    if let Err(e) = exec_cached(conn, "COMMIT") {
        // Not committed: end the transaction, and every write with it.
        let _ = exec_cached(conn, "ROLLBACK");
        return Err(sql_error("commit", e));
    }
    Ok(results)
}

/// `f` inside a savepoint: released when `f` succeeds, rolled back (only `f`'s changes) when it
/// fails.
fn in_savepoint<T, E>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, E>,
    sql_error: &impl Fn(&'static str, rusqlite::Error) -> E,
) -> Result<T, E> {
    exec_cached(conn, "SAVEPOINT write").map_err(|e| sql_error("savepoint", e))?;
    let result = f(conn).and_then(|out| {
        exec_cached(conn, "RELEASE write")
            .map(|()| out)
            .map_err(|e| sql_error("savepoint", e))
    });
    if result.is_err() {
        let _ = exec_cached(conn, "ROLLBACK TO write");
        let _ = exec_cached(conn, "RELEASE write");
    }
    result
}

/// A thread that checkpoints the WAL every [`CHECKPOINT_INTERVAL`] (`PASSIVE`: it never
/// blocks writers or readers), so that a commit never waits for a checkpoint's copying and
/// fsyncs, which SQLite would otherwise run on the committing thread. Stops when dropped.
pub struct Checkpointer {
    _stop: Sender<()>,
}

impl Checkpointer {
    pub fn spawn(path: &Path) -> Result<Self, AgentError> {
        let conn = open(path, Role::Checkpointer)?;
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        std::thread::Builder::new()
            .name("troupe-db-checkpoint".into())
            .spawn(move || {
                // Disconnected (every handle dropped) ends the loop; nothing is ever sent.
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_INTERVAL)
                {
                    checkpoint(&conn);
                }
                checkpoint(&conn);
            })
            .map_err(|e| internal("spawn checkpointer", e))?;
        Ok(Self { _stop: stop })
    }
}

fn checkpoint(conn: &Connection) {
    let started = Instant::now();
    // (busy, WAL frames, frames copied); busy only means another checkpoint was running.
    let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match result {
        Ok((frames, copied)) => {
            if copied > 0 {
                super::metrics::observe(super::metrics::Op::Checkpoint, started, None);
                tracing::trace!(frames, copied, "wal checkpoint");
            }
        }
        Err(e) => {
            let e = internal("wal checkpoint", e);
            super::metrics::observe(super::metrics::Op::Checkpoint, started, Some(&e));
            tracing::warn!(error = %e, "wal checkpoint failed");
        }
    }
}

/// Copies the whole WAL into the database and truncates it to zero bytes, so that the page
/// images it held (a row before a sweep dropped its content) are gone from the files. Waits for
/// readers of older snapshots through the busy handler, and retries while another checkpoint
/// (the background one) runs, for at most [`BUSY_BUDGET`]. `Ok(false)`: it could not complete;
/// call it again later. Run it outside any transaction of `conn`.
pub fn truncate_wal(conn: &Connection) -> Result<bool, AgentError> {
    let started = Instant::now();
    loop {
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
            .map_err(|e| internal("wal checkpoint (truncate)", e))?;
        if busy == 0 {
            return Ok(true);
        }
        if started.elapsed() >= BUSY_BUDGET {
            return Ok(false);
        }
        std::thread::sleep(BUSY_SLEEP_MAX);
    }
}

/// A fixed set of reader connections, handed out through a channel: a reader takes one, uses
/// it on its own thread and puts it back. WAL readers never wait for the writer.
pub struct ReaderPool {
    idle_tx: Sender<Connection>,
    idle_rx: Receiver<Connection>,
}

impl ReaderPool {
    /// Opens `size` (at least 1) reader connections; the schema must already be in place.
    pub fn open(path: &Path, size: usize) -> Result<Self, AgentError> {
        let size = size.max(1);
        let (idle_tx, idle_rx) = crossbeam_channel::bounded(size);
        for _ in 0..size {
            let conn = open(path, Role::Reader)?;
            idle_tx
                .send(conn)
                .map_err(|e| internal("sqlite reader pool", e))?;
        }
        Ok(Self { idle_tx, idle_rx })
    }

    /// Runs `f` on a free connection, waiting for one if all are in use. Blocks: call it from
    /// a blocking-pool task or a thread of its own.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AgentError>,
    ) -> Result<T, AgentError> {
        let conn = self
            .idle_rx
            .recv_timeout(CHECKOUT_WAIT)
            .map_err(|e| internal("sqlite reader pool", e))?;
        // Returned on drop, so a panic inside `f` does not shrink the pool.
        let checkout = Checkout {
            conn: Some(conn),
            home: &self.idle_tx,
        };
        match checkout.conn.as_ref() {
            Some(conn) => f(conn),
            None => Err(AgentError::internal("sqlite reader pool: empty checkout")),
        }
    }
}

/// A connection out of the pool, put back when dropped.
struct Checkout<'a> {
    conn: Option<Connection>,
    home: &'a Sender<Connection>,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // The pool holds its own receiver, so the channel is never disconnected here.
            let _ = self.home.send(conn);
        }
    }
}

/// A u64 as SQLite's signed integer, or `InvalidInput` naming the field.
pub fn to_sql_int(field: &str, value: u64) -> Result<i64, AgentError> {
    i64::try_from(value)
        .map_err(|_| AgentError::invalid(format!("{field} {value} is larger than {}", i64::MAX)))
}
