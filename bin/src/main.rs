//! The `troupe` command.
#![forbid(unsafe_code)]

mod acp;
mod agents;
mod chat;
mod history;
mod mcp;
mod replay;
mod serve;
mod spinner;
mod tokens;
#[cfg(test)]
mod turn_code;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// troupe: an orchestrator for LLM agent sessions.
#[derive(Debug, Parser)]
#[command(name = "troupe", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Chat with an agent: an interactive REPL, or one turn with --once.
    Chat(Box<chat::ChatArgs>),
    /// Serve sessions over HTTP (JSON-RPC, REST, SSE, WebSocket) or stdio.
    Serve(Box<serve::ServeArgs>),
    /// Serve troupe as an Agent Client Protocol agent on stdin/stdout (for editors).
    Acp(Box<acp::AcpArgs>),
    /// The agents a configuration defines.
    #[command(subcommand)]
    Agents(agents::AgentsCommand),
    /// Authorization tokens for the tools that need one: issue, list, revoke.
    #[command(subcommand)]
    Tokens(tokens::TokensCommand),
    /// Work with JSONL chat histories.
    #[command(subcommand)]
    History(history::HistoryCommand),
    /// OAuth logins of MCP servers: login, logout, status.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Runs a recorded task again from its rollout (no network, no side effects) and says
    /// whether the same events and error class came out. Exits 0 when identical, 3 when
    /// they differ, 4 when the task cannot be replayed.
    Replay(replay::ReplayArgs),
    /// Runs a command under a sandbox policy (the shell tool's launcher; not for people).
    #[command(name = "sandbox-exec", hide = true, disable_help_flag = true)]
    SandboxExec {
        /// `--policy P [--writable DIR]... -- PROGRAM ARGS...`, read by the runtime.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// Threads for blocking work (file and SQLite reads, opening rollouts): a bound whatever the
/// number of sessions, so that the process's threads are the workers, these, the rollout
/// writer pool and the store's few.
const MAX_BLOCKING_THREADS: usize = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread or runtime exists: the launcher confines itself and execs.
    if let Command::SandboxExec { args } = &cli.command {
        return troupe_runtime::exec::sandbox::main(args);
    }
    // One turn needs no worker threads: everything runs on this one (the blocking pool still
    // takes file and SQLite work), which saves their stacks and allocator arenas.
    let one_turn = matches!(&cli.command, Command::Chat(args) if args.once);
    let mut builder = if one_turn {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("troupe: cannot start the async runtime: {e}");
            return ExitCode::from(70);
        }
    };
    // `chat` and `serve` install telemetry from their configuration (`[telemetry]`, `OTEL_*`).
    let result = runtime.block_on(async {
        match cli.command {
            Command::Chat(args) => chat::run(*args).await,
            Command::Serve(args) => serve::run(*args).await,
            Command::Acp(args) => acp::run(*args).await,
            Command::Agents(cmd) => {
                let _telemetry = troupe_runtime::telemetry::init("troupe");
                agents::run(cmd).await
            }
            Command::Tokens(cmd) => {
                let _telemetry = troupe_runtime::telemetry::init("troupe");
                tokens::run(cmd).await
            }
            Command::History(cmd) => {
                // Console logs only: nothing here is traced.
                let _telemetry = troupe_runtime::telemetry::init("troupe");
                history::run(cmd).map(|()| ExitCode::SUCCESS)
            }
            Command::Mcp(cmd) => {
                // Console logs only: nothing here is traced.
                let _telemetry = troupe_runtime::telemetry::init("troupe");
                mcp::run(cmd).await
            }
            // Telemetry as `[telemetry]` says: a span per replay.
            Command::Replay(args) => replay::run(args).await,
            Command::SandboxExec { .. } => {
                Ok(ExitCode::from(troupe_runtime::exec::sandbox::REFUSED_EXIT))
            }
        }
    });
    // Whatever must be written was awaited above. A blocking read that cannot end (stdin of
    // `serve --stdio` or `chat`, still open after a SIGTERM) must not hold the exit: dropping
    // the runtime would wait for it forever.
    runtime.shutdown_timeout(EXIT_WAIT);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("troupe: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// How long the exit waits for blocking work still running once the command has returned.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
