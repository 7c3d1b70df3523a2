//! A real PostgreSQL server for tests, started on first use and shared by every test of the
//! process: a fresh cluster in a throwaway directory (a copy of one `initdb` made once per
//! machine and kept in the temporary directory), then `pg_ctl start` on a free port of
//! 127.0.0.1 (and a Unix socket in the same directory), authentication `trust`, superuser
//! `troupe`.
//!
//! PostgreSQL refuses to run as root: when the process is root, the server runs as the
//! unprivileged `postgres` user (the one Debian's package creates; `TROUPE_PG_USER` names
//! another) through `runuser`, and the directory is handed to that user.
//!
//! The server stops when the process ends, however it ends: a watchdog shell (in a process
//! group of its own) blocks reading a pipe whose only writer is this process; when the
//! process exits or is killed the pipe closes, and the watchdog stops the server
//! (`pg_ctl stop -m immediate`) and removes the directory.
//!
//! No server, no test: a missing PostgreSQL panics with what to run
//! (`scripts/install-postgres`), it never skips.
#![forbid(unsafe_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The superuser of the test cluster (authentication `trust`, no password).
pub const USER: &str = "troupe";
/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running throwaway server.
#[derive(Debug)]
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    /// Held open for the life of the process: its end closing stops the server.
    _watchdog: Mutex<(Child, ChildStdin)>,
}

static SERVER: OnceLock<PgServer> = OnceLock::new();
static DURABLE: OnceLock<PgServer> = OnceLock::new();

/// The process's server, started on first use. Panics (the test fails) when PostgreSQL is
/// not installed or does not start. It runs with `fsync = off`: what the tests kill is the
/// client, never the server, and the suites run faster.
pub fn server() -> &'static PgServer {
    SERVER.get_or_init(|| match PgServer::start(false) {
        Ok(server) => server,
        Err(e) => panic!("cannot start a test PostgreSQL server: {e}"),
    })
}

/// A second server with PostgreSQL's default durability (`fsync = on`, full page writes), for
/// benchmarks whose figures must be those of a real deployment.
pub fn durable_server() -> &'static PgServer {
    DURABLE.get_or_init(|| match PgServer::start(true) {
        Ok(server) => server,
        Err(e) => panic!("cannot start a PostgreSQL server: {e}"),
    })
}

impl PgServer {
    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory: the data directory is `data/` in it, the Unix socket is in it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A connection URL to `database` (`postgres` always exists) over TCP.
    pub fn url(&self, database: &str) -> String {
        format!("postgresql://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// A URL whose connections put their tables in `schema` (which must exist): how tests
    /// give each store a database of its own in one server.
    pub fn schema_url(&self, schema: &str) -> String {
        format!(
            "{}?options=-c%20search_path%3D{schema}",
            self.url("postgres")
        )
    }

    /// A new, empty database of its own (`troupe_<n>`), and its URL: a test's state kept
    /// apart from the other tests of the process.
    pub fn fresh_database(&self) -> String {
        static DATABASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = DATABASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("troupe_{n}");
        if let Err(e) = self.psql(&format!("CREATE DATABASE {name}")) {
            panic!("create database {name}: {e}");
        }
        self.url(&name)
    }

    /// Runs one SQL command with `psql` (as the superuser, on the `postgres` database).
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        self.psql_at(&self.url("postgres"), sql)
    }

    /// Runs one SQL command with `psql` on the database `url` names; its output, unaligned.
    pub fn psql_at(&self, url: &str, sql: &str) -> Result<String, String> {
        let psql = bin_dir()?.join("psql");
        let out = Command::new(&psql)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .arg(url)
            .output()
            .map_err(|e| format!("{}: {e}", psql.display()))?;
        if !out.status.success() {
            return Err(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn start(durable: bool) -> Result<Self, String> {
        let bin = bin_dir()?;
        let owner = server_user()?;
        let dir = std::env::temp_dir().join(format!(
            "troupe-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        if let Some((uid, gid)) = owner.as_ref().map(|o| (o.uid, o.gid)) {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        // The watchdog first: from here on, the directory goes when the process does.
        let watchdog = watchdog(&bin, &dir, owner.as_ref())?;
        let data = dir.join("data");
        // A copy of a cluster initdb made once for the machine: a copy takes a tenth of an
        // initdb. `cp -a` keeps the owner and the modes the server insists on.
        let template = template(&bin, owner.as_ref())?;
        run(
            Command::new("cp").arg("-a").arg(&template).arg(&data),
            "copy the template cluster",
        )?;
        // A free port, taken again by the server; another process may win it meanwhile, so
        // a start that fails is tried on another port.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let speed = if durable {
                ""
            } else {
                "-c fsync=off -c full_page_writes=off"
            };
            let options = format!(
                "-p {port} -k {} -h 127.0.0.1 {speed} -c max_connections=200 -c shared_buffers=32MB",
                dir.display()
            );
            let started = run(
                as_owner(owner.as_ref(), &bin.join("pg_ctl"))
                    .arg("-D")
                    .arg(&data)
                    .arg("-l")
                    .arg(dir.join("server.log"))
                    .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string(), "-o"])
                    .arg(&options)
                    .arg("start"),
                "pg_ctl start",
            );
            match started {
                Ok(()) => {
                    let server = Self {
                        port,
                        dir,
                        _watchdog: Mutex::new(watchdog),
                    };
                    server.wait_ready()?;
                    return Ok(server);
                }
                Err(e) => {
                    last = format!(
                        "{e}\n{}",
                        std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
                    )
                }
            }
        }
        Err(last)
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("server on port {} not reachable: {e}", self.port));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// Options of every test cluster's `initdb`; part of the template's name, so a change makes a
/// new template.
const INITDB_OPTIONS: [&str; 9] = [
    "-A",
    "trust",
    "-U",
    USER,
    "-E",
    "UTF8",
    "--locale=C",
    "--no-sync",
    "--no-instructions",
];

/// The template cluster, `<tmp>/troupe-pg-template-<version>-<options hash>-<owner uid>`:
/// made by `initdb` the first time (in a directory of its own, renamed into place, so that
/// processes starting at once never see half of one), kept for the next test processes.
fn template(bin: &Path, owner: Option<&Owner>) -> Result<PathBuf, String> {
    let version = bin
        .parent()
        .and_then(Path::file_name)
        .and_then(|v| v.to_str())
        .unwrap_or("pg")
        .to_owned();
    let tag = INITDB_OPTIONS
        .iter()
        .flat_map(|o| o.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let uid = owner.map_or_else(|| id(&["-u"]).unwrap_or(0), |o| o.uid);
    let path = std::env::temp_dir().join(format!("troupe-pg-template-{version}-{tag:016x}-{uid}"));
    if path.join("PG_VERSION").is_file() {
        return Ok(path);
    }
    let fresh = std::env::temp_dir().join(format!(
        "troupe-pg-template-new-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    ));
    run(
        as_owner(owner, &bin.join("initdb"))
            .arg("-D")
            .arg(&fresh)
            .args(INITDB_OPTIONS),
        "initdb",
    )?;
    // Another process may have put its template in place meanwhile: either one will do.
    if std::fs::rename(&fresh, &path).is_err() {
        let _ = std::fs::remove_dir_all(&fresh);
    }
    if path.join("PG_VERSION").is_file() {
        Ok(path)
    } else {
        Err(format!("no template cluster at {}", path.display()))
    }
}

/// Where PostgreSQL's programs are: beside `initdb` on the PATH, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout).
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file() {
                // Debian links only some programs into /usr/local/bin: follow the link.
                let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
                if let Some(parent) = real.parent()
                    && parent.join("pg_ctl").is_file()
                {
                    return Ok(parent.to_path_buf());
                }
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL is not installed (no initdb on the PATH nor in /usr/lib/postgresql/*/bin): \
         run scripts/install-postgres"
            .to_owned()
    })
}

/// The unprivileged user the server runs as when this process is root.
#[derive(Debug)]
struct Owner {
    name: String,
    uid: u32,
    gid: u32,
}

fn server_user() -> Result<Option<Owner>, String> {
    let me = id(&["-u"])?;
    if me != 0 {
        return Ok(None);
    }
    let name = std::env::var("TROUPE_PG_USER").unwrap_or_else(|_| "postgres".to_owned());
    let uid = id(&["-u", &name]).map_err(|e| {
        format!(
            "{e} (PostgreSQL refuses to run as root; scripts/install-postgres creates the user)"
        )
    })?;
    let gid = id(&["-g", &name])?;
    Ok(Some(Owner { name, uid, gid }))
}

fn id(args: &[&str]) -> Result<u32, String> {
    let out = Command::new("id")
        .args(args)
        .output()
        .map_err(|e| format!("id: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "id {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("id {}: {e}", args.join(" ")))
}

/// `program`, run as the owner when there is one.
fn as_owner(owner: Option<&Owner>, program: &Path) -> Command {
    match owner {
        Some(o) => {
            let mut c = Command::new("runuser");
            c.args(["-u", &o.name, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

/// A shell that waits for this process to end (its stdin closing), then stops the server and
/// removes `dir`.
fn watchdog(bin: &Path, dir: &Path, owner: Option<&Owner>) -> Result<(Child, ChildStdin), String> {
    let pg_ctl = bin.join("pg_ctl");
    let stop = match owner {
        Some(o) => format!("runuser -u '{}' -- '{}'", o.name, pg_ctl.display()),
        None => format!("'{}'", pg_ctl.display()),
    };
    let script = format!(
        "read _ignored; \
         if [ -f '{dir}/data/postmaster.pid' ]; then {stop} -D '{dir}/data' -m immediate -w stop >/dev/null 2>&1; fi; \
         rm -rf '{dir}'",
        dir = dir.display()
    );
    let mut child = std::os::unix::process::CommandExt::process_group(
        Command::new("sh").args(["-c", &script]),
        0,
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .map_err(|e| format!("watchdog: {e}"))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| "watchdog: no stdin".to_owned())?;
    // Nothing is ever written but this: the pipe must stay open, not be read to its end.
    stdin.flush().map_err(|e| format!("watchdog: {e}"))?;
    Ok((child, stdin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_answers_sql_and_stops_with_its_process() {
        let s = server();
        assert_eq!(s.psql("SELECT 40 + 2").unwrap(), "42");
        assert!(s.dir().join("data/postmaster.pid").is_file());
        assert!(std::ptr::eq(s, server()), "one server per process");
        let (a, b) = (s.fresh_database(), s.fresh_database());
        assert_ne!(a, b);
        let name = b.rsplit('/').next().unwrap();
        assert_eq!(
            s.psql(&format!(
                "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
            ))
            .unwrap(),
            "1"
        );
    }

    /// A child process starts a server and is killed: the server goes with it.
    #[test]
    fn a_killed_process_leaves_no_server() {
        if std::env::var_os("TROUPE_PG_CHILD").is_some() {
            let s = server();
            println!("\ndir {}", s.dir().display());
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "tests::a_killed_process_leaves_no_server",
                "--exact",
                "--nocapture",
            ])
            .env("TROUPE_PG_CHILD", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::BufRead;
        let mut dir = None;
        for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
            if let Some(d) = line.unwrap().strip_prefix("dir ") {
                dir = Some(PathBuf::from(d));
                break;
            }
        }
        let dir = dir.unwrap();
        let pid: i32 = std::fs::read_to_string(dir.join("data/postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() || dir.exists() {
            assert!(Instant::now() < deadline, "server {pid} or {dir:?} left");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
