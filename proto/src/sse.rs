//! A Server-Sent Events decoder with a bound on one event, for the model client and the A2A
//! client alike.
//!
//! The SSE crates in the build (`eventsource-stream`, `sse-stream`) buffer an event until its
//! blank line however long it gets, and search the whole buffer again on every read: a server
//! that sends one line without end grows memory (and CPU) without bound. This one keeps what
//! an event holds (its `event` name, its `data` lines, the unfinished line) under a limit, and
//! searches each byte once.
//!
//! It follows the event stream format of the HTML standard: lines end with CRLF, LF or CR; a
//! blank line dispatches the event (one with no `data` line is not dispatched); `data` lines
//! are joined with LF; a line starting with `:` is a comment; `id`, `retry` and unknown fields
//! are ignored (neither a model stream nor an A2A one is resumed by event id); a leading byte
//! order mark is skipped.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event:` name, `message` when it named none.
    pub event: String,
    pub data: String,
}

/// Why the stream cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (its name, its data and its unfinished line) grew past the limit before a
    /// blank line ended it.
    #[error("an event is larger than {limit} bytes (no blank line ended it)")]
    EventTooLarge { limit: usize },
    #[error("an event line is not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
}

/// Decodes SSE bytes pushed in as they arrive into events.
#[derive(Debug)]
pub struct SseDecoder {
    /// Bytes received and not yet decoded start at `start`: complete lines of later events,
    /// then the unfinished line.
    buf: Vec<u8>,
    start: usize,
    /// How far past `start` no line end was found (a long line is not searched again).
    searched: usize,
    /// The last line ended with a CR at the end of what had arrived: an LF that comes first
    /// next is that CR's second half.
    after_cr: bool,
    /// Whether the stream's first bytes (and a byte order mark there) were seen.
    started: bool,
    /// The event its lines so far make.
    pending: PendingEvent,
    limit: usize,
}

/// An event being read.
#[derive(Debug, Default)]
struct PendingEvent {
    event: String,
    data: String,
    /// Whether a `data` line came (an event with none is not dispatched).
    has_data: bool,
}

impl SseDecoder {
    /// A decoder refusing events larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            searched: 0,
            after_cr: false,
            started: false,
            pending: PendingEvent::default(),
            limit,
        }
    }

    /// Takes the next bytes of the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start == self.buf.len() {
            // Everything before was decoded: start over rather than grow.
            self.buf.clear();
            self.start = 0;
            self.searched = 0;
        } else if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
        if !self.started {
            // Decided once three bytes are here, or fewer that cannot begin one; until then
            // nothing is decoded (no byte of a byte order mark ends a line).
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let head = &self.buf[self.start..];
            if head.len() >= BOM.len() || !BOM.starts_with(head) {
                self.started = true;
                if head.starts_with(BOM) {
                    self.start += BOM.len();
                    self.searched = 0;
                }
            }
        }
    }

    /// The next complete event, `None` until more bytes arrive.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        loop {
            if self.after_cr && self.start < self.buf.len() {
                self.after_cr = false;
                if self.buf[self.start] == b'\n' {
                    self.start += 1;
                }
            }
            let rest = &self.buf[self.start..];
            let from = self.searched.min(rest.len());
            let Some(end) = rest[from..]
                .iter()
                .position(|b| matches!(b, b'\n' | b'\r'))
                .map(|i| from + i)
            else {
                self.searched = rest.len();
                if self.pending.held() + rest.len() > self.limit {
                    return Err(SseError::EventTooLarge { limit: self.limit });
                }
                return Ok(None);
            };
            // A CR ends the line; an LF right after it belongs to it (maybe in the next read).
            let mut next = end + 1;
            if rest[end] == b'\r' {
                match rest.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line = std::str::from_utf8(&rest[..end])?;
            let dispatched = self.pending.line(line);
            self.start += next;
            self.searched = 0;
            if self.pending.held() > self.limit {
                return Err(SseError::EventTooLarge { limit: self.limit });
            }
            if let Some(event) = dispatched {
                return Ok(Some(event));
            }
        }
    }
}

impl PendingEvent {
    /// Bytes the unfinished event holds.
    fn held(&self) -> usize {
        self.event.len() + self.data.len()
    }

    /// Takes one line; the event it dispatches, if any.
    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let mut data = std::mem::take(&mut self.data);
            if !std::mem::take(&mut self.has_data) {
                return None;
            }
            if data.ends_with('\n') {
                data.pop();
            }
            let event = if event.is_empty() {
                "message".to_owned()
            } else {
                event
            };
            return Some(SseEvent { event, data });
        }
        let (field, value) = match line.split_once(':') {
            Some(("", _)) => return None, // a comment
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `chunks`, pushed one by one.
    fn decode(chunks: &[&[u8]], limit: usize) -> Result<Vec<(String, String)>, SseError> {
        let mut decoder = SseDecoder::new(limit);
        let mut out = Vec::new();
        for chunk in chunks {
            decoder.push(chunk);
            while let Some(e) = decoder.next_event()? {
                out.push((e.event, e.data));
            }
        }
        Ok(out)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(e, d)| ((*e).to_owned(), (*d).to_owned()))
            .collect()
    }

    #[test]
    fn events_of_the_standard_shapes() {
        let text = b"\xEF\xBB\xBFevent: a\ndata: one\ndata:two\n\n: comment\n\ndata\n\nid: 7\nretry: 5\n\ndata: x\r\n\r\nevent: b\rdata: y\r\rdata: {\"k\": 1}\n\n";
        assert_eq!(
            decode(&[text], 1024).unwrap(),
            pairs(&[
                ("a", "one\ntwo"),
                ("message", ""),
                ("message", "x"),
                ("b", "y"),
                ("message", "{\"k\": 1}"),
            ])
        );
    }

    #[test]
    fn any_split_of_the_bytes_decodes_the_same() {
        let text: &[u8] =
            b"\xEF\xBB\xBFevent: a\r\ndata: h\xC3\xA9llo\r\n\r\ndata: b\rdata: c\r\rdata: z\n\n";
        let whole = decode(&[text], 1024).unwrap();
        assert_eq!(
            whole,
            pairs(&[("a", "h\u{e9}llo"), ("message", "b\nc"), ("message", "z")])
        );
        for i in 0..text.len() {
            for j in i..text.len() {
                let parts = [&text[..i], &text[i..j], &text[j..]];
                assert_eq!(decode(&parts, 1024).unwrap(), whole, "split at {i}, {j}");
            }
        }
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        assert_eq!(decode(&[b"data: a\n\ndata: b\n"], 1024).unwrap().len(), 1);
    }

    #[test]
    fn a_line_without_end_stops_at_the_limit() {
        let mut decoder = SseDecoder::new(100);
        decoder.push(b"data: ");
        for _ in 0..9 {
            decoder.push(&[b'x'; 10]);
            assert_eq!(decoder.next_event(), Ok(None));
        }
        decoder.push(&[b'x'; 10]);
        assert_eq!(
            decoder.next_event(),
            Err(SseError::EventTooLarge { limit: 100 })
        );
        assert!(
            decoder.buf.len() <= 110,
            "held no more than the limit and a read"
        );
    }

    #[test]
    fn many_data_lines_without_a_blank_line_stop_at_the_limit() {
        let line = b"data: 0123456789\n";
        let mut decoder = SseDecoder::new(100);
        let mut error = None;
        for _ in 0..20 {
            decoder.push(line);
            if let Err(e) = decoder.next_event() {
                error = Some(e);
                break;
            }
        }
        assert_eq!(error, Some(SseError::EventTooLarge { limit: 100 }));
    }

    #[test]
    fn events_up_to_the_limit_pass_and_comments_hold_nothing() {
        let data = "x".repeat(95);
        let mut text = format!("data: {data}\n\n").into_bytes();
        for _ in 0..50 {
            text.extend_from_slice(b": keep-alive\n");
        }
        text.extend_from_slice(format!("event: e\ndata: {}\n\n", "y".repeat(90)).as_bytes());
        let events = decode(&[&text], 100).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].1, data);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_an_error() {
        assert!(matches!(
            decode(&[b"data: \xFF\n\n"], 100),
            Err(SseError::Utf8(_))
        ));
    }
}
