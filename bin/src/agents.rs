//! `troupe agents`: the agents a configuration defines.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use troupe_proto::agent::{AgentBinding, AgentInfo, AgentListing};
use troupe_runtime::agents;
use troupe_runtime::config::TroupeConfig;

#[derive(Debug, clap::Subcommand)]
pub enum AgentsCommand {
    /// Lists the agents (id, role, provider, health, bindings) and the definition files that
    /// did not load. Exits 1 when a file did not load (the others are still listed).
    List {
        /// Print {agents, errors} as JSON.
        #[arg(long)]
        json: bool,
        /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the store keeps bindings (default: data_dir of the configuration).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

pub async fn run(cmd: AgentsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AgentsCommand::List {
            json,
            config,
            data_dir,
        } => {
            let env = |k: &str| std::env::var(k).ok();
            let mut config = TroupeConfig::load(config.as_deref(), &env)?;
            if let Some(dir) = data_dir {
                config.data_dir = dir;
            }
            let listing = listing(&config).await?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &listing)?;
                writeln!(out)?;
            } else {
                write_table(&mut out, &listing.agents)?;
                if listing.agents.is_empty() {
                    match config.agents_dir() {
                        Some((dir, _)) => writeln!(out, "(no agents in {})", dir.display())?,
                        None => writeln!(
                            out,
                            "(no agents directory: set [agents] dir in troupe.toml or TROUPE_AGENTS_DIR)"
                        )?,
                    }
                }
            }
            for error in &listing.errors {
                eprintln!("troupe: {error}");
            }
            Ok(if listing.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// The agents of `config` with their health (no session: what each provider can tell
/// without starting anything) and every binding the store holds of them.
async fn listing(config: &TroupeConfig) -> anyhow::Result<AgentListing> {
    let catalog = agents::catalog(config);
    let factories = agents::factories();
    let bindings = stored_bindings(config).await?;
    let supervisor = troupe_actors::agents::listing::supervisor_of(
        &catalog,
        config.agents.supervisor.as_deref(),
    )
    .ok()
    .flatten()
    .map(|d| d.id.clone());
    let agents = troupe_actors::agents::listing::agent_infos(
        &catalog,
        |d| agents::probe(d, &factories),
        &bindings,
        supervisor.as_deref(),
    );
    Ok(AgentListing {
        agents,
        errors: catalog.errors,
    })
}

/// Every binding in the store: the PostgreSQL one when `[store] backend = "postgres"`, else
/// the data directory's; none when there is no SQLite store yet (it is not created for a
/// listing).
async fn stored_bindings(config: &TroupeConfig) -> anyhow::Result<Vec<AgentBinding>> {
    use troupe_store::BindingStore;
    #[cfg(feature = "postgres")]
    if config.store.backend == troupe_runtime::config::StoreBackend::Postgres {
        let url = troupe_service::postgres_url(config)?;
        let store = troupe_store::PgStore::connect(&url).await?;
        return Ok(store.bindings(None).await?);
    }
    let path = troupe_store::db_path(&config.data_dir);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let store =
        tokio::task::spawn_blocking(move || troupe_store::SqliteStore::open(path)).await??;
    Ok(store.bindings(None).await?)
}

fn write_table(out: &mut impl Write, agents: &[AgentInfo]) -> std::io::Result<()> {
    let rows: Vec<[String; 6]> = agents
        .iter()
        .map(|a| {
            let id = if a.supervisor {
                format!("{} (supervisor)", a.id)
            } else {
                a.id.clone()
            };
            let health = match &a.health.detail {
                Some(detail) => format!("{}: {detail}", a.health.status.as_str()),
                None => a.health.status.as_str().to_owned(),
            };
            [
                id,
                a.role.clone(),
                a.provider.as_str().to_owned(),
                a.bindings.len().to_string(),
                a.version.clone().unwrap_or_else(|| "-".into()),
                health,
            ]
        })
        .collect();
    let header = ["ID", "ROLE", "PROVIDER", "BINDINGS", "VERSION", "HEALTH"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s
    };
    if !rows.is_empty() {
        writeln!(out, "{}", line(header))?;
    }
    for row in &rows {
        writeln!(out, "{}", line(row.each_ref().map(String::as_str)))?;
    }
    Ok(())
}
