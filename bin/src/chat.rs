//! `troupe chat`: one session, its root conversation, the built-in scripted model unless a
//! script is given. `--once` runs one turn and exits with a code reflecting its status.

use anyhow::Context;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{MessageReply, SessionId, StoragePolicy, TaskStatus};
use troupe_runtime::{ProcessRunner, ScriptedModel};

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// A first question; with --once, the only one.
    pub question: Option<String>,
    /// Run one turn, print the reply, exit (0 ok, 2 error, 3 max_steps, 4 cancelled).
    #[arg(long)]
    pub once: bool,
    /// Where sessions keep their rollout.
    #[arg(long, env = "TROUPE_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// A JSON script for the built-in scripted model (`{"replies": [...]}`).
    #[arg(long, env = "TROUPE_SCRIPT")]
    pub script: Option<PathBuf>,
    /// What the rollout keeps: full, headers-only, none, or ttl:<seconds>.
    #[arg(long, default_value = "full", value_parser = parse_policy)]
    pub storage_policy: StoragePolicy,
    /// Steps before a turn ends with max_steps.
    #[arg(long, default_value_t = 100)]
    pub max_steps: u32,
    /// Print the reply and its statistics as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_policy(s: &str) -> Result<StoragePolicy, String> {
    match s {
        "full" => Ok(StoragePolicy::Full),
        "headers-only" | "headers_only" => Ok(StoragePolicy::HeadersOnly),
        "none" => Ok(StoragePolicy::None),
        other => match other.strip_prefix("ttl:").map(str::parse::<u64>) {
            Some(Ok(secs)) => Ok(StoragePolicy::Ttl { secs }),
            _ => Err(format!(
                "unknown storage policy `{other}` (full, headers-only, none, ttl:<seconds>)"
            )),
        },
    }
}

pub async fn run(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let model = match &args.script {
        Some(path) => ScriptedModel::from_file(path)?,
        None => ScriptedModel::default(),
    };
    eprintln!("troupe: no model endpoint configured; using the built-in scripted model");
    let mut config = SessionConfig {
        data_dir: args.data_dir.clone(),
        ..SessionConfig::default()
    };
    config.root.storage_policy = args.storage_policy;
    config.conversation.task.max_steps = args.max_steps;
    config.conversation.shell_tool = true;
    let ports = SessionPorts {
        model: Arc::new(model),
        mcp: None,
        exec: Some(Arc::new(ProcessRunner)),
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
    };
    let session_id = SessionId::new();
    let (session, join) = SessionHandle::start(session_id, config, ports).await?;
    let root = session.root().await?;
    let code = if args.once {
        let question = args
            .question
            .clone()
            .context("--once needs a question: troupe chat --once \"...\"")?;
        let reply = session.message(root, question).await?;
        print_reply(&reply, args.json)?;
        exit_code(reply.status)
    } else {
        if let Some(q) = &args.question {
            let reply = session.message(root, q.clone()).await?;
            print_reply(&reply, args.json)?;
        }
        repl(&session, root, args.json).await?
    };
    session.shutdown().await?;
    let _ = join.await;
    eprintln!(
        "troupe: rollout in {}",
        args.data_dir
            .join("rollout")
            .join(session_id.to_string())
            .display()
    );
    Ok(code)
}

async fn repl(
    session: &SessionHandle,
    root: troupe_proto::ConversationId,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut lines = std::io::stdin().lock().lines();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => println!("type a message, or /exit"),
            text => {
                let reply = session.message(root, text.to_owned()).await?;
                print_reply(&reply, json)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_reply(reply: &MessageReply, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(reply)?);
    } else {
        println!("{}", reply.text);
        if let Some(e) = &reply.error {
            eprintln!("troupe: turn ended with {}: {e}", reply.status.as_str());
        }
    }
    Ok(())
}

fn exit_code(status: TaskStatus) -> ExitCode {
    match status {
        TaskStatus::Ok => ExitCode::SUCCESS,
        TaskStatus::Error => ExitCode::from(2),
        TaskStatus::MaxSteps => ExitCode::from(3),
        TaskStatus::Cancelled => ExitCode::from(4),
    }
}
