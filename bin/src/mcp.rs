//! `troupe mcp login|logout|status`: the OAuth logins of the configured MCP servers, kept in
//! `<data_dir>/mcp-auth/<server>.json`.

use anyhow::{Context, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use troupe_actors::ports::{McpOAuthGrant, McpServerConfig, McpTransport};
use troupe_runtime::config::{TroupeConfig, parse_duration};
use troupe_runtime::mcp::oauth::{self, LoginStatus, TokenStore};

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Log in to an MCP server that uses OAuth: prints the authorization URL (and opens it
    /// with $BROWSER when set), waits for the browser's redirect, stores the tokens.
    Login(LoginArgs),
    /// Forget the stored login of an MCP server.
    Logout(ServerArgs),
    /// Show the OAuth login of every configured MCP server (never the tokens).
    Status(Where),
}

/// Which configuration and data directory.
#[derive(Debug, clap::Args)]
pub struct Where {
    /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The data directory whose `mcp-auth/` keeps the logins (default: data_dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The server's `name` in `[[mcp.servers]]`.
    pub server: String,
    #[command(flatten)]
    pub place: Where,
}

#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// The server's `name` in `[[mcp.servers]]`.
    pub server: String,
    #[command(flatten)]
    pub place: Where,
    /// How long to wait for the browser to come back, e.g. 5m.
    #[arg(long, default_value = "5m")]
    pub timeout: String,
}

fn load(place: &Where) -> anyhow::Result<TroupeConfig> {
    let env = |k: &str| std::env::var(k).ok();
    let mut config = TroupeConfig::load(place.config.as_deref(), &env)?;
    if let Some(dir) = &place.data_dir {
        config.data_dir.clone_from(dir);
    }
    Ok(config)
}

fn find<'a>(config: &'a TroupeConfig, name: &str) -> anyhow::Result<&'a McpServerConfig> {
    config
        .mcp
        .servers
        .iter()
        .find(|s| s.name == name)
        .with_context(|| {
            let names: Vec<&str> = config.mcp.servers.iter().map(|s| s.name.as_str()).collect();
            if names.is_empty() {
                format!("no MCP server `{name}`: the configuration names none")
            } else {
                format!(
                    "no MCP server `{name}`; the configured ones are {}",
                    names.join(", ")
                )
            }
        })
}

fn store(config: &TroupeConfig, server: &str) -> TokenStore {
    TokenStore::file(&oauth::token_dir(&config.data_dir), server)
}

pub async fn run(command: McpCommand) -> anyhow::Result<ExitCode> {
    match command {
        McpCommand::Login(args) => login(args).await,
        McpCommand::Logout(args) => {
            let config = load(&args.place)?;
            find(&config, &args.server)?;
            let store = store(&config, &args.server);
            let removed = oauth::logout(&store).map_err(anyhow::Error::msg)?;
            if removed {
                println!("Forgot the login to `{}`.", args.server);
            } else {
                println!("No login to `{}` was stored.", args.server);
            }
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Status(place) => {
            let config = load(&place)?;
            status(&config)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn login(args: LoginArgs) -> anyhow::Result<ExitCode> {
    let config = load(&args.place)?;
    let server = find(&config, &args.server)?;
    let timeout = parse_duration("--timeout", &args.timeout)?;
    let store = store(&config, &args.server);
    let grant = match &server.transport {
        McpTransport::StreamableHttp {
            oauth: Some(oauth), ..
        } => oauth.grant,
        _ => bail!(
            "MCP server `{}` has no `oauth` table: only a `streamable_http` server with one logs in",
            args.server
        ),
    };
    if grant == McpOAuthGrant::AuthorizationCode {
        eprintln!("troupe: logging in to MCP server `{}`", args.server);
    }
    let mut show = |url: &str| {
        eprintln!("Open this URL in a browser to authorize troupe:");
        println!("{url}");
        let _ = std::io::stdout().flush();
        eprintln!(
            "Waiting for the browser (at most {})...",
            humantime_text(timeout)
        );
        open_browser(url);
    };
    let outcome = oauth::login(server, store, &oauth::process_env(), timeout, &mut show).await?;
    let expires = outcome
        .expires_in
        .map(|d| format!(", expires in {}", humantime_text(d)))
        .unwrap_or_default();
    let scopes = if outcome.scopes.is_empty() {
        "no scope".to_owned()
    } else {
        format!("scopes {}", outcome.scopes.join(" "))
    };
    eprintln!(
        "Logged in to `{}` as client {}{} ({scopes}{expires}, {}).",
        args.server,
        outcome.client_id,
        if outcome.registered {
            " (registered just now)"
        } else {
            ""
        },
        if outcome.has_refresh_token {
            "refreshed automatically"
        } else {
            "no refresh token: log in again when it expires"
        },
    );
    if let Some(path) = outcome.path {
        eprintln!("Stored in {}.", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens `url` with `$BROWSER` (a program and its arguments), when set; the URL is printed
/// either way.
fn open_browser(url: &str) {
    let Ok(browser) = std::env::var("BROWSER") else {
        return;
    };
    let mut words = browser.split_whitespace();
    let Some(program) = words.next() else {
        return;
    };
    let spawned = std::process::Command::new(program)
        .args(words)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn();
    match spawned {
        // Reaped in the background: a browser may outlive the login.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => eprintln!("troupe: cannot run $BROWSER ({program}): {e}"),
    }
}

fn humantime_text(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn status(config: &TroupeConfig) -> anyhow::Result<()> {
    if config.mcp.servers.is_empty() {
        println!("No MCP server is configured.");
        return Ok(());
    }
    for server in &config.mcp.servers {
        let line = match &server.transport {
            McpTransport::Stdio { .. } => "stdio, no OAuth".to_owned(),
            McpTransport::StreamableHttp {
                url, oauth: None, ..
            } => format!("{url}, no OAuth"),
            McpTransport::StreamableHttp {
                url,
                oauth: Some(oauth),
                ..
            } => {
                let store = store(config, &server.name);
                let state = match oauth::status(url, &store) {
                    Err(e) => format!("unreadable login: {e}"),
                    Ok(LoginStatus::None) => match oauth.grant {
                        McpOAuthGrant::AuthorizationCode => {
                            format!("not logged in: run `troupe mcp login {}`", server.name)
                        }
                        McpOAuthGrant::ClientCredentials => {
                            "no token yet (one is asked for at connect)".to_owned()
                        }
                    },
                    Ok(LoginStatus::OtherUrl { url: other }) => format!(
                        "the stored login is for {other}: run `troupe mcp login {}`",
                        server.name
                    ),
                    Ok(LoginStatus::Stored { token: None, .. }) => "no token yet".to_owned(),
                    Ok(LoginStatus::Stored { wanted_scopes, .. }) if !wanted_scopes.is_empty() => {
                        format!(
                            "the server asked for more scope ({}): run `troupe mcp login {}`",
                            wanted_scopes.join(" "),
                            server.name
                        )
                    }
                    Ok(LoginStatus::Stored {
                        token: Some(token),
                        expires_in_secs,
                        ..
                    }) => {
                        let expiry = match expires_in_secs {
                            Some(s) if s > 0 => format!(
                                "expires in {}",
                                humantime_text(Duration::from_secs(s.unsigned_abs()))
                            ),
                            Some(_) if token.has_refresh_token => {
                                "expired, refreshed at the next use".to_owned()
                            }
                            Some(_) if oauth.grant == McpOAuthGrant::ClientCredentials => {
                                "expired, renewed at the next use".to_owned()
                            }
                            Some(_) => format!("expired: run `troupe mcp login {}`", server.name),
                            None => "no expiry given".to_owned(),
                        };
                        let scopes = if token.scopes.is_empty() {
                            String::new()
                        } else {
                            format!(", scopes {}", token.scopes.join(" "))
                        };
                        format!(
                            "logged in as client {}{scopes}, {expiry}, refresh token: {}",
                            token.client_id,
                            if token.has_refresh_token { "yes" } else { "no" }
                        )
                    }
                };
                format!(
                    "{url}, OAuth {}: {state} ({})",
                    oauth.grant.as_str(),
                    store
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )
            }
        };
        println!("{}: {line}", server.name);
    }
    Ok(())
}
