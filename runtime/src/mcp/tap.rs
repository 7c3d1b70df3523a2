//! Reads what rmcp's typed model drops: a tool's `execution.taskSupport`. rmcp parses
//! `tools/list` results into its `Tool` type, which has no `execution` field, so the raw
//! messages are observed on their way in (stdio lines, SSE event data) and the answer is
//! recorded per tool name before rmcp hands the parsed list to the caller.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// Longest line kept for inspection; a longer one is passed through unread.
const MAX_OBSERVED_LINE: usize = 16 * 1024 * 1024;

/// Tool name → "requires task augmentation", from the latest `tools/list` pages seen.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskSupportTap {
    requires_task: Arc<Mutex<HashMap<String, bool>>>,
}

impl TaskSupportTap {
    /// Looks at one raw JSON-RPC message.
    pub(crate) fn observe(&self, message: &[u8]) {
        // Cheap filter first: most messages are not tool lists.
        let Ok(text) = std::str::from_utf8(message) else {
            return;
        };
        if !text.contains("\"tools\"") {
            return;
        }
        let found = tools_task_support(text);
        if found.is_empty() {
            return;
        }
        let mut map = self.lock();
        for (name, required) in found {
            map.insert(name, required);
        }
    }

    pub(crate) fn requires_task(&self, tool: &str) -> bool {
        self.lock().get(tool).copied().unwrap_or(false)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, bool>> {
        // The map stays consistent whatever a panicking holder did: every write is one insert.
        self.requires_task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `(name, taskSupport == "required")` for every tool of a `tools/list` result message.
pub(crate) fn tools_task_support(message: &str) -> Vec<(String, bool)> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(message) else {
        return Vec::new();
    };
    let Some(tools) = value
        .get("result")
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.as_array())
    else {
        return Vec::new();
    };
    tools
        .iter()
        .filter_map(|tool| {
            let name = tool.get("name")?.as_str()?;
            let required = tool
                .get("execution")
                .and_then(|e| e.get("taskSupport"))
                .and_then(|s| s.as_str())
                == Some("required");
            Some((name.to_owned(), required))
        })
        .collect()
}

/// An `AsyncRead` that shows every complete line it passes on to a [`TaskSupportTap`].
pub(crate) struct TapReader<R> {
    inner: R,
    line: Vec<u8>,
    /// The current line outgrew [`MAX_OBSERVED_LINE`]: skip it up to its newline.
    skipping: bool,
    tap: TaskSupportTap,
}

impl<R> TapReader<R> {
    pub(crate) fn new(inner: R, tap: TaskSupportTap) -> Self {
        Self {
            inner,
            line: Vec::new(),
            skipping: false,
            tap,
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (chunk, rest, complete) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            if !self.skipping {
                if self.line.len() + chunk.len() > MAX_OBSERVED_LINE {
                    self.skipping = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            if complete {
                if !self.skipping {
                    self.tap.observe(&self.line);
                }
                self.line.clear();
                self.skipping = false;
            }
            bytes = rest;
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for TapReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.observe(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"echo","inputSchema":{},"execution":{"taskSupport":"forbidden"}},{"name":"research","inputSchema":{},"execution":{"taskSupport":"required"}},{"name":"plain","inputSchema":{}}]}}"#;

    #[test]
    fn reads_task_support_per_tool() {
        assert_eq!(
            tools_task_support(LIST),
            vec![
                ("echo".to_owned(), false),
                ("research".to_owned(), true),
                ("plain".to_owned(), false)
            ]
        );
        assert!(tools_task_support(r#"{"jsonrpc":"2.0","method":"tools"}"#).is_empty());
        assert!(tools_task_support("not json \"tools\"").is_empty());
    }

    #[test]
    fn a_later_listing_overrides_an_earlier_one() {
        let tap = TaskSupportTap::default();
        tap.observe(LIST.as_bytes());
        assert!(tap.requires_task("research"));
        tap.observe(br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"research","inputSchema":{}}]}}"#);
        assert!(!tap.requires_task("research"));
        assert!(!tap.requires_task("unknown"));
    }

    #[tokio::test]
    async fn the_reader_passes_bytes_through_and_sees_lines_split_across_reads() {
        let tap = TaskSupportTap::default();
        let input = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"x\"}}\n{LIST}\n");
        // A one-byte-at-a-time reader splits every line across many reads.
        let (mut tx, rx) = tokio::io::duplex(1);
        let writer = tokio::spawn({
            let input = input.clone();
            async move {
                use tokio::io::AsyncWriteExt;
                tx.write_all(input.as_bytes()).await.unwrap();
            }
        });
        let mut reader = TapReader::new(rx, tap.clone());
        let mut out = String::new();
        reader.read_to_string(&mut out).await.unwrap();
        writer.await.unwrap();
        assert_eq!(out, input);
        assert!(tap.requires_task("research"));
        assert!(!tap.requires_task("echo"));
    }
}
