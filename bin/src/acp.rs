//! `troupe acp`: troupe as an ACP agent on stdin/stdout. One troupe session serves every ACP
//! session of the process (each one a conversation); it keeps its id in
//! `<data_dir>/acp-session`, so that a later `troupe acp` on the same data directory can
//! `session/load` the conversations of earlier ones from the session's rollout.

use crate::chat::{ChatArgs, resolve};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use troupe_actors::SessionHandle;
use troupe_actors::rollout::FileRolloutStorage;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_proto::SessionId;
use troupe_runtime::assembly;
use troupe_store::{MemoryRolloutStorage, TtlSweeper};

#[derive(Debug, clap::Args)]
pub struct AcpArgs {
    /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// scripted, openai-responses or openai-chat.
    #[arg(long)]
    pub provider: Option<String>,
    /// Model name sent to the endpoint.
    #[arg(long)]
    pub model: Option<String>,
    /// Endpoint base URL, e.g. http://127.0.0.1:11434/v1.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Environment variable that holds the API key.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// A JSON script for the built-in scripted model (`{"replies": [...]}`).
    #[arg(long, env = "TROUPE_SCRIPT")]
    pub script: Option<PathBuf>,
    /// Where the session keeps its rollout (and its id, in `acp-session`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// always, on-failure or never ask (through the ACP client) before running a command.
    #[arg(long)]
    pub approval_policy: Option<String>,
    /// read-only, workspace-write or full-access.
    #[arg(long)]
    pub sandbox_policy: Option<String>,
    /// Write nothing to disk (conversations cannot be loaded by a later run).
    #[arg(long)]
    pub ephemeral: bool,
}

pub async fn run(args: AcpArgs) -> anyhow::Result<ExitCode> {
    let chat = ChatArgs {
        config: args.config.clone(),
        provider: args.provider.clone(),
        model: args.model.clone(),
        base_url: args.base_url.clone(),
        api_key_env: args.api_key_env.clone(),
        script: args.script.clone(),
        data_dir: args.data_dir.clone(),
        approval_policy: args.approval_policy.clone(),
        sandbox_policy: args.sandbox_policy.clone(),
        ..ChatArgs::default()
    };
    let config = resolve(&chat)?;
    // Logs go to stderr: stdout is the protocol.
    let telemetry = troupe_runtime::telemetry::install(&config.telemetry)?;
    troupe_acp::describe_metrics();
    let result = serve(&args, &config).await;
    telemetry.shutdown().await;
    result
}

async fn serve(
    args: &AcpArgs,
    config: &troupe_runtime::config::TroupeConfig,
) -> anyhow::Result<ExitCode> {
    eprintln!("troupe acp: {}", config.model_line());
    if let Some(notice) = config.key_notice(&|name| std::env::var(name).ok()) {
        eprintln!("troupe acp: warning: {notice}");
    }
    let tokens = assembly::try_build_tokens(config)?;
    let model = assembly::build_model(config, args.script.as_deref())?;
    let mut ports = assembly::session_ports(config, model, tokens);
    let rollout: Arc<dyn RolloutStorage> = if args.ephemeral {
        Arc::new(MemoryRolloutStorage::new())
    } else {
        Arc::new(FileRolloutStorage::new(config.data_dir.join("rollout")))
    };
    ports.rollout_storage = Some(rollout.clone());
    // As `troupe chat`: `ttl` content earlier runs left is swept before this one starts, and
    // the sweeper goes on while it serves (this session's content included).
    let sweeper = TtlSweeper::new(None, rollout.clone());
    sweeper.sweep().await;
    let session_id = if args.ephemeral {
        SessionId::new()
    } else {
        session_id(&config.data_dir)?
    };
    let session_config = assembly::session_config(config);
    let conversation = assembly::chat_conversation(config.chat.storage_policy);
    let stop_sweeping = CancellationToken::new();
    let sweeping = sweeper.spawn(session_config.ttl_sweep_interval, stop_sweeping.clone());
    let (session, join) = SessionHandle::start(session_id, session_config, ports).await?;
    let served = troupe_acp::agent::Served {
        session: session.clone(),
        session_id,
        rollout: Some(rollout),
        conversation,
    };
    let outcome = troupe_acp::agent::serve(served, tokio::io::stdin(), tokio::io::stdout()).await;
    if let Err(e) = session.shutdown().await {
        eprintln!("troupe acp: shutdown: {e}");
    }
    let _ = join.await;
    stop_sweeping.cancel();
    if let Some(sweeping) = sweeping {
        let _ = sweeping.await;
    }
    outcome.map_err(|e| anyhow::anyhow!("ACP connection failed: {}", e.message))?;
    Ok(ExitCode::SUCCESS)
}

/// The session id kept in `<data_dir>/acp-session`, made on first use.
fn session_id(data_dir: &Path) -> anyhow::Result<SessionId> {
    let path = data_dir.join("acp-session");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{} holds no session id: {e}", path.display()));
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let id = SessionId::new();
    std::fs::write(&path, id.to_string())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(id)
}
