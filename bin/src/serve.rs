//! `troupe serve`: the sessions service over HTTP (JSON-RPC, REST, SSE, WebSocket), or over
//! stdio with `--stdio`. Prints the bound address, runs until SIGTERM/SIGINT (or the end of
//! stdin), shuts down gracefully and exits 0.

use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use troupe_runtime::assembly;
use troupe_runtime::config::{
    ClusterFlags, ConversationFlags, TroupeConfig, parse_duration, parse_enum,
};
use troupe_service::Service;

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// host:port to listen on (port 0 picks a free one); default [server].listen.
    #[arg(long)]
    pub listen: Option<String>,
    /// Speak JSON-RPC on stdin/stdout (one JSON object per line) instead of HTTP.
    #[arg(long)]
    pub stdio: bool,
    /// Where sessions keep their rollout and the store its database.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Keep the store and the rollout in memory: nothing is written to disk, nothing survives
    /// a restart.
    #[arg(long)]
    pub ephemeral: bool,
    /// How long running tasks may finish after SIGTERM, e.g. 30s.
    #[arg(long)]
    pub grace_period: Option<String>,
    /// scripted, openai-responses or openai-chat (default: openai-chat when a base URL or
    /// OPENAI_API_KEY is given, else scripted).
    #[arg(long)]
    pub provider: Option<String>,
    /// Model name sent to the endpoint.
    #[arg(long)]
    pub model: Option<String>,
    /// Endpoint base URL, e.g. http://127.0.0.1:11434/v1.
    #[arg(long)]
    pub base_url: Option<String>,
    /// A JSON script for the built-in scripted model (`{"replies": [...]}`).
    #[arg(long, env = "TROUPE_SCRIPT")]
    pub script: Option<PathBuf>,
    /// Most items a conversation's history holds (history.max_items).
    #[arg(long)]
    pub history_max_items: Option<String>,
    /// Most approximate tokens a conversation's history holds (history.max_tokens).
    #[arg(long)]
    pub history_max_tokens: Option<String>,
    /// Who summarizes trimmed history: local or model (history.summarizer).
    #[arg(long)]
    pub summarizer: Option<String>,
    /// How long a cancelled task may take to stop before it is aborted, e.g. 5s.
    #[arg(long)]
    pub close_timeout: Option<String>,
    /// How long an approval request waits for a human, e.g. 5m.
    #[arg(long)]
    pub approval_timeout: Option<String>,
    /// How long a conversation may stay idle before it is passivated, e.g. 10m; 0: never
    /// (sessions.passivate_after).
    #[arg(long)]
    pub passivate_after: Option<String>,
    /// The capabilities directory (capabilities.dir; default: capabilities/ beside the
    /// configuration file).
    #[arg(long)]
    pub capabilities_dir: Option<String>,
    /// The modules directory (modules.dir; default `modules/` beside the configuration).
    #[arg(long)]
    pub modules_dir: Option<PathBuf>,
    /// Run as this node of a cluster sharing one PostgreSQL database (cluster.node).
    #[arg(long)]
    pub node: Option<String>,
    /// host:port for the traffic between nodes (cluster.listen).
    #[arg(long)]
    pub cluster_listen: Option<String>,
    /// Other nodes' cluster addresses, comma-separated (cluster.seeds).
    #[arg(long)]
    pub seeds: Option<String>,
    /// How long a session's lease lasts without renewal, e.g. 15s (cluster.lease_ttl).
    #[arg(long)]
    pub lease_ttl: Option<String>,
}

/// Defaults < config file < environment < flags; the provider as
/// [`TroupeConfig::choose_provider`] picks it.
fn resolve(args: &ServeArgs) -> anyhow::Result<TroupeConfig> {
    let env = |k: &str| std::env::var(k).ok();
    let mut c = TroupeConfig::load(args.config.as_deref(), &env)?;
    if let Some(v) = &args.listen {
        c.server.listen.clone_from(v);
    }
    if let Some(v) = &args.data_dir {
        c.data_dir.clone_from(v);
    }
    if let Some(v) = &args.grace_period {
        c.server.grace_period = parse_duration("--grace-period", v)?;
    }
    if let Some(v) = &args.provider {
        c.model.provider =
            parse_enum("--provider", v, "scripted, openai-responses or openai-chat")?;
        c.named.provider = true;
    }
    if let Some(v) = &args.model {
        c.model.model.clone_from(v);
    }
    if let Some(v) = &args.modules_dir {
        c.modules.dir = Some(if v.is_absolute() {
            v.clone()
        } else {
            std::env::current_dir()?.join(v)
        });
    }
    if let Some(v) = &args.base_url {
        c.model.base_url.clone_from(v);
        c.named.endpoint = true;
    }
    if let Some(v) = &args.capabilities_dir {
        c.set_capabilities_dir(v);
    }
    c.choose_provider();
    c.apply_cluster_flags(&ClusterFlags {
        node: args.node.clone(),
        listen: args.cluster_listen.clone(),
        seeds: args.seeds.clone(),
        lease_ttl: args.lease_ttl.clone(),
    })?;
    c.apply_conversation_flags(&ConversationFlags {
        history_max_items: args.history_max_items.clone(),
        history_max_tokens: args.history_max_tokens.clone(),
        summarizer: args.summarizer.clone(),
        close_timeout: args.close_timeout.clone(),
        approval_timeout: args.approval_timeout.clone(),
        passivate_after: args.passivate_after.clone(),
    })?;
    Ok(c)
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Caught from the first moment: a SIGHUP during start-up (the store's migrations, its ttl
    // sweep, the sessions' restore) is a reread once the configuration is live, not the
    // signal's default end of the process.
    let hangup = Hangup::catch()?;
    // SIGTERM and SIGINT too: one during start-up stops the service once it has started,
    // gracefully, instead of killing the process in the middle of a migration or a restore.
    let stop = tokio_util::sync::CancellationToken::new();
    troupe_service::cancel_on_signals(stop.clone())?;
    let config = resolve(&args)?;
    // Dropped last: the service's spans end first, then the exporter flushes them.
    let _telemetry = troupe_runtime::telemetry::install(&config.telemetry)?;
    let prometheus = troupe_service::metrics::install_prometheus();
    troupe_service::describe_metrics();
    eprintln!("troupe: {}", config.model_line());
    if let Some(notice) = config.key_notice(&|name| std::env::var(name).ok()) {
        eprintln!("troupe: warning: {notice}");
    }
    if let Some(notice) = troupe_service::transport::start_notice(&config.cluster) {
        tracing::warn!("{notice}");
        eprintln!("troupe: warning: {notice}");
    }
    let tokens = assembly::try_build_tokens(&config)?;
    crate::chat::warn_if_script_unused(&config, args.script.as_deref());
    let model = assembly::build_model(&config, args.script.as_deref())?;
    let mut ports = assembly::session_ports(&config, model, tokens);
    // A listen address that cannot serve is refused before the store is created or migrated.
    if !args.stdio {
        for addr in resolve_listen(&config.server.listen).await? {
            troupe_service::check_bind(config.server.tokens.is_empty(), addr)?;
        }
    }
    let mut storage = troupe_service::open_store(&config, args.ephemeral).await?;
    // Held to the end of the process: no second service writes this data directory.
    let _data_dir = storage.lock.take();
    eprintln!("troupe: {}", storage.description);
    ports.rollout_storage = storage.rollout;
    let cluster = storage.cluster;
    let catalog = troupe_runtime::agents::catalog(&config);
    for error in &catalog.errors {
        eprintln!("troupe: {error}");
    }
    let capabilities = troupe_runtime::capabilities::catalog(&config);
    for error in &capabilities.errors {
        eprintln!("troupe: {error}");
    }
    let bindings: std::sync::Arc<dyn troupe_store::BindingStore> = storage.store.clone();
    let read = catalog.clone();
    let agent_errors = catalog.errors.clone();
    ports.agents = assembly::agent_ports(&config, catalog, args.script.is_some(), bindings)?;
    // The agents and capabilities directories are watched, and SIGHUP reads the
    // configuration file again: a valid change applies to the next task (A7).
    let reread = {
        let args = args.clone();
        Box::new(move || resolve(&args).map_err(|e| format!("{e:#}")))
    };
    let live =
        troupe_runtime::reload::LiveConfig::start(config.clone(), read, capabilities, reread);
    if let Some(why) = live.watch_error() {
        eprintln!("troupe: {why}");
    }
    if let Some(agents) = ports.agents.as_mut() {
        agents.live = Some(live.agents());
    }
    // Modules and I/O gateways (A10): a file that does not load is reported, the others run.
    let modules = troupe_runtime::modules::catalog(&config);
    for error in &modules.errors {
        eprintln!("troupe: {error}");
    }
    let modules = troupe_service::modules::Modules::new(modules)?;
    let service = Service::start_with(
        &config,
        storage.store,
        ports,
        prometheus,
        troupe_service::StartOptions {
            live: Some(live.settings()),
            modules: Some(modules),
            cluster,
            agent_errors,
        },
    )
    .await?;
    hangup.reread(live);
    {
        let shutdown = service.shutdown_token();
        tokio::spawn(async move {
            stop.cancelled().await;
            shutdown.cancel();
        });
    }
    if args.stdio {
        service
            .serve_stdio(tokio::io::stdin(), tokio::io::stdout())
            .await?;
        return Ok(ExitCode::SUCCESS);
    }
    // Past this point the service runs (its modules' processes among it): a failure to
    // listen or publish stops it as a shutdown would, leaving no process behind.
    let listener = match bind(&service, &config.server.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            service.shutdown().await;
            return Err(e);
        }
    };
    let addr = listener.local_addr()?;
    if config.cluster.node.is_some() {
        let api_url = published_api_url(config.cluster.api_url.clone(), addr)?;
        let every = troupe_service::lease_keeper::renew_interval(config.cluster.lease_ttl);
        if let Err(e) = service.keep_published(api_url.clone(), every).await {
            service.shutdown().await;
            return Err(anyhow::Error::from(e)
                .context(format!("cannot publish this node's API address {api_url}")));
        }
        eprintln!("troupe: cluster node API published at {api_url}");
        if cfg!(feature = "cluster")
            && let Some(listen) = &config.cluster.listen
        {
            eprintln!(
                "troupe: node transport listening on {listen}, seeds {:?}",
                config.cluster.seeds
            );
        }
    }
    println!("troupe serve listening on http://{addr}");
    std::io::stdout().flush()?;
    service.serve_http(listener).await?;
    // Let the last log lines out.
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(ExitCode::SUCCESS)
}

/// Reads the configuration file again at each SIGHUP, as long as the process runs.
/// SIGHUP, caught: each one reads the configuration again once it is live.
struct Hangup {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Hangup {
    fn catch() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signal = signal(SignalKind::hangup()).context("SIGHUP handler")?;
            Ok(Self { signal })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// From now on (and for one that came since `catch`), a SIGHUP rereads `live`.
    fn reread(self, live: troupe_runtime::reload::LiveConfig) {
        #[cfg(unix)]
        {
            let mut hangup = self.signal;
            tokio::spawn(async move {
                while hangup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reading the configuration again");
                    eprintln!("troupe: SIGHUP: reading the configuration again");
                    live.reread();
                }
            });
        }
        #[cfg(not(unix))]
        drop(live);
    }
}

/// The addresses `listen` resolves to.
async fn resolve_listen(listen: &str) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    Ok(tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("cannot resolve listen address `{listen}`"))?
        .collect())
}

/// Resolves `listen`, refuses a non-loopback address without tokens, binds.
async fn bind(service: &Service, listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let addrs = resolve_listen(listen).await?;
    for addr in &addrs {
        service.check_bind(*addr)?;
    }
    let first = addrs
        .first()
        .with_context(|| format!("`{listen}` resolves to no address"))?;
    tokio::net::TcpListener::bind(first)
        .await
        .with_context(|| format!("cannot listen on {first}"))
}

/// The API address a cluster node publishes for the others: the configured one, else
/// `http://` + the address it listens on, which must then be one the others can reach (not
/// 0.0.0.0 or [::]: another node would call itself).
fn published_api_url(
    configured: Option<String>,
    listening: std::net::SocketAddr,
) -> anyhow::Result<String> {
    match configured {
        Some(url) => Ok(url),
        None if listening.ip().is_unspecified() => anyhow::bail!(
            "this node listens on {listening} (every address), which the other nodes cannot call: set [cluster] api_url (TROUPE_CLUSTER_API_URL) to the address they reach it at"
        ),
        None => Ok(format!("http://{listening}")),
    }
}

#[cfg(test)]
mod tests {
    use super::published_api_url;

    #[test]
    fn a_node_publishes_an_address_the_others_can_call() {
        let local = "127.0.0.1:7000".parse().unwrap();
        let any = "0.0.0.0:7000".parse().unwrap();
        let any6 = "[::]:7000".parse().unwrap();
        assert_eq!(
            published_api_url(None, local).unwrap(),
            "http://127.0.0.1:7000"
        );
        let err = published_api_url(None, any).unwrap_err().to_string();
        assert!(err.contains("api_url"), "{err}");
        assert!(published_api_url(None, any6).is_err());
        assert_eq!(
            published_api_url(Some("http://10.0.0.2:7000".into()), any).unwrap(),
            "http://10.0.0.2:7000"
        );
    }
}
