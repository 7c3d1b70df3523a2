//! `troupe replay <task_id>`: runs a recorded task again from its rollout, with no network
//! and no side effects, and says whether the same events and the same error class came out
//! (see `troupe_actors::replay`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use troupe_actors::agents::AgentPorts;
use troupe_actors::replay::{self, Refusal, ReplayOutcome, ReplayReport, ReplayRequest};
use troupe_proto::TaskId;
use troupe_runtime::assembly;
use troupe_runtime::config::TroupeConfig;

/// Exit code of a replay that came out otherwise than its recording.
pub const DIFFERS: u8 = 3;
/// Exit code of a task that cannot be replayed (not found, no content kept, no end).
pub const REFUSED: u8 = 4;

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The task: its id, as a reply's `task_id` or the JSONL history's `meta.task_id` give it.
    pub task_id: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// TOML configuration file the task ran under (default: $TROUPE_CONFIG, else
    /// ./troupe.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the task's rollout is (default: data_dir of the configuration).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

pub async fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let env = |k: &str| std::env::var(k).ok();
    let mut config = TroupeConfig::load(args.config.as_deref(), &env)?;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    let telemetry = troupe_runtime::telemetry::install(&config.telemetry)?;
    let result = replay_task(&args.task_id, &config).await;
    telemetry.shutdown().await;
    let report = result?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else if let Some(refusal) = &report.refusal {
        eprintln!("troupe: {}", refusal.message);
    } else {
        write!(out, "{}", report.human())?;
    }
    Ok(ExitCode::from(match report.outcome {
        ReplayOutcome::Identical => 0,
        ReplayOutcome::Differs => DIFFERS,
        ReplayOutcome::Refused => REFUSED,
    }))
}

async fn replay_task(task_id: &str, config: &TroupeConfig) -> anyhow::Result<ReplayReport> {
    let task_id: TaskId = task_id
        .parse()
        .map_err(|_| anyhow::anyhow!("`{task_id}` is not a task id (a UUID)"))?;
    let (found, searched) = match troupe_service::rollout_postgres_url(config)? {
        Some(url) => find_on_postgres(url, task_id).await?,
        None => {
            let data_dir = config.data_dir.clone();
            let found =
                tokio::task::spawn_blocking(move || troupe_store::find_task(&data_dir, task_id))
                    .await??;
            (found, config.data_dir.display().to_string())
        }
    };
    let Some(found) = found else {
        return Ok(replay::refused(
            task_id,
            Refusal::not_found(task_id, &searched),
        ));
    };
    tracing::info!(source = %found.source, "replaying a recorded task");
    Ok(replay::replay(ReplayRequest {
        task_id,
        session_id: found.session_id,
        records: found.records,
        config: assembly::session_config(config),
        agents: agents(config),
        storage: Arc::new(troupe_store::MemoryRolloutStorage::new()),
    })
    .await?)
}

/// The task's records in the rollout on PostgreSQL at `url` (the server's schema is brought
/// up to date first, as any troupe process connecting to it does).
#[cfg(feature = "postgres")]
async fn find_on_postgres(
    url: String,
    task_id: TaskId,
) -> anyhow::Result<(Option<troupe_store::FoundTask>, String)> {
    let searched = format!("PostgreSQL at {}", troupe_store::describe_pg_url(&url));
    let found = tokio::task::spawn_blocking(move || {
        troupe_store::PgRolloutStorage::connect(&url)?.find_task(task_id)
    })
    .await??;
    Ok((found, searched))
}

#[cfg(not(feature = "postgres"))]
async fn find_on_postgres(
    _url: String,
    _task_id: TaskId,
) -> anyhow::Result<(Option<troupe_store::FoundTask>, String)> {
    anyhow::bail!(
        "this build of troupe has no PostgreSQL store (cargo feature `postgres`): it cannot read the rollout there"
    )
}

/// The configuration's agents as a replay uses them: definitions and settings only (no
/// provider, no model client, no binding is made for a replay).
fn agents(config: &TroupeConfig) -> Option<AgentPorts> {
    let catalog = troupe_runtime::agents::catalog(config);
    for error in &catalog.errors {
        eprintln!("troupe: {error}");
    }
    (!catalog.is_empty()).then(|| AgentPorts {
        catalog: Arc::new(catalog),
        settings: assembly::agent_settings(config, false),
        factories: Vec::new(),
        models: Default::default(),
        bindings: Arc::new(replay::playback::NoBindings),
        live: None,
    })
}
