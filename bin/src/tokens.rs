//! `troupe tokens`: authorization tokens (A5) in the store of a data directory, for the
//! tools that agents may only call with one. `troupe serve` counts their uses in the same
//! store, so tokens issued here work there (and the other way round).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use troupe_actors::governance::tokens;
use troupe_actors::token_book;
use troupe_proto::governance::{IssueToken, TokenInfo, TokenScope};
use troupe_runtime::config::TroupeConfig;

#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Issues a token and prints its secret (shown this once; the store keeps its SHA-256).
    Issue {
        /// The agent whose calls it authorizes (`*`: any, the session's own too).
        #[arg(long)]
        agent: String,
        /// The tool, a pattern (`shell`, `files__*`).
        #[arg(long)]
        tool: String,
        /// For `--tool shell` only: only commands whose line matches this pattern (`git
        /// status*`; a `*` takes none of `;&|` newline `` ` `` `$()<>`).
        #[arg(long)]
        args: Option<String>,
        /// Only calls whose argument NAME matches PATTERN (`path=notes/*`: a string as it is,
        /// another value as compact JSON). Repeatable: every one must match.
        #[arg(long = "field", value_name = "NAME=PATTERN")]
        fields: Vec<String>,
        /// How long it is valid (`30m`, `1h`, `7d`).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// How many calls it authorizes.
        #[arg(long)]
        max_uses: u32,
        /// Who issues it (default: cli:$USER).
        #[arg(long)]
        by: Option<String>,
        /// Print `{token, info}` as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        place: Place,
    },
    /// Lists the tokens (never their secrets), newest first.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        place: Place,
    },
    /// Revokes a token by id: it authorizes nothing more.
    Revoke {
        id: String,
        #[command(flatten)]
        place: Place,
    },
}

/// Where the store is.
#[derive(Debug, clap::Args)]
pub struct Place {
    /// TOML configuration file (default: $TROUPE_CONFIG, else ./troupe.toml if present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The data directory holding troupe.db (default: data_dir of the configuration).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

pub async fn run(cmd: TokensCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TokensCommand::Issue {
            agent,
            tool,
            args,
            fields,
            ttl,
            max_uses,
            by,
            json,
            place,
        } => {
            let mut named = std::collections::BTreeMap::new();
            for field in &fields {
                tokens::parse_field(&mut named, field)
                    .map_err(|e| anyhow::anyhow!("--field: {e}"))?;
            }
            let book = open(&place).await?;
            let issued_by = by.or_else(|| std::env::var("USER").ok().map(|u| format!("cli:{u}")));
            let request = IssueToken {
                scope: TokenScope {
                    agent,
                    tool,
                    args,
                    fields: named,
                },
                ttl_secs: ttl.as_secs().max(1),
                max_uses,
                issued_by,
            };
            let issued = token_book::issue(&book, request).await?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &issued)?;
                writeln!(out)?;
            } else {
                writeln!(out, "{}", issued.token)?;
                eprintln!(
                    "troupe: token {} for agent `{}`, tool `{}`: {} use(s), until {} (the secret above is shown once)",
                    issued.info.id,
                    issued.info.scope.agent,
                    issued.info.scope.tool,
                    issued.info.max_uses,
                    date(issued.info.expires_ms),
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TokensCommand::List { json, place } => {
            let book = open(&place).await?;
            let tokens = token_book::list(&book).await?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &tokens)?;
                writeln!(out)?;
            } else {
                write_table(&mut out, &tokens)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        TokensCommand::Revoke { id, place } => {
            let book = open(&place).await?;
            let revoked = token_book::revoke(&book, id).await?;
            eprintln!("troupe: token {} revoked", revoked.id);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A book over the store `troupe serve` keeps tokens in (PostgreSQL when its store is there,
/// else `troupe.db` in the data directory).
async fn open(place: &Place) -> anyhow::Result<troupe_actors::token_book::TokenBookRef> {
    let env = |k: &str| std::env::var(k).ok();
    let mut config = TroupeConfig::load(place.config.as_deref(), &env)?;
    if let Some(dir) = &place.data_dir {
        config.data_dir.clone_from(dir);
    }
    let store = troupe_service::open_token_store(&config).await?;
    Ok(token_book::spawn(store).await?)
}

fn date(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// A token's tool and argument patterns as the table shows them: `shell (git status*)`,
/// `files__write (path=notes/*)`.
fn scope_text(scope: &TokenScope) -> String {
    let patterns: Vec<String> = scope
        .args
        .iter()
        .cloned()
        .chain(scope.fields.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    if patterns.is_empty() {
        scope.tool.clone()
    } else {
        format!("{} ({})", scope.tool, patterns.join(", "))
    }
}

fn write_table(out: &mut impl Write, tokens: &[TokenInfo]) -> std::io::Result<()> {
    let now = troupe_actors::clock::unix_now_ms();
    let rows: Vec<[String; 6]> = tokens
        .iter()
        .map(|t| {
            let state = match t.revoked_ms {
                Some(_) => "revoked",
                None if now >= t.expires_ms => "expired",
                None if t.uses >= t.max_uses => "spent",
                None => "valid",
            };
            [
                t.id.clone(),
                t.scope.agent.clone(),
                scope_text(&t.scope),
                format!("{}/{}", t.uses, t.max_uses),
                date(t.expires_ms),
                state.to_owned(),
            ]
        })
        .collect();
    let header = ["ID", "AGENT", "TOOL", "USES", "EXPIRES", "STATE"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    if rows.is_empty() {
        writeln!(out, "(no tokens)")?;
    }
    Ok(())
}
