//! A spinner on stderr while the model works; silent when stderr is not a terminal.

use std::io::{IsTerminal, Write};
use std::time::Duration;

const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// A running spinner; `stop` clears its line.
pub struct Spinner {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Spinner {
    pub fn start(label: &'static str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { task: None };
        }
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(80));
            for frame in FRAMES.iter().cycle() {
                tick.tick().await;
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r{frame} {label}…");
                let _ = err.flush();
            }
        });
        Self { task: Some(task) }
    }

    pub fn stop(mut self) {
        self.clear();
    }

    fn clear(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}
