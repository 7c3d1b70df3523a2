//! `troupe history`: tools for the JSONL chat histories.

use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub enum HistoryCommand {
    /// Convert a JSONL history (history/<session_id>.jsonl) to the XML format.
    ExportXml {
        /// The JSONL file.
        file: PathBuf,
        /// Write here instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

pub fn run(cmd: HistoryCommand) -> anyhow::Result<()> {
    match cmd {
        HistoryCommand::ExportXml { file, output } => {
            let xml = troupe_runtime::history_log::export_xml(&file)?;
            match output {
                Some(path) => std::fs::write(&path, xml)?,
                None => print!("{xml}"),
            }
            Ok(())
        }
    }
}
