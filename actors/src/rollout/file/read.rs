//! Reading a session's files: records in `seq` order, and the last `seq` a directory holds
//! (complete lines, the high-water mark, a torn tail).

use super::*;

/// A conversation's rollout file.
pub fn conversation_path(dir: &Path, conversation_id: ConversationId) -> PathBuf {
    Target::Conversation(conversation_id).path(dir)
}

/// Reads a rollout file, oldest first. Unreadable lines (a torn last write) are skipped and
/// logged; a missing file is an empty record. Blocking: call it off the async threads.
pub fn read_records(path: &Path) -> Result<Vec<RolloutRecord>, AgentError> {
    read_records_after(path, 0, usize::MAX)
}

/// Up to `limit` records of a file with `seq > after_seq`, oldest first. Lines at or before
/// the resume point are recognised by their `seq` prefix and not parsed.
pub(super) fn read_records_after(
    path: &Path,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<RolloutRecord>, AgentError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(AgentError::internal(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    let mut records = Vec::new();
    let mut unreadable = 0;
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if records.len() >= limit {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if after_seq > 0 && line_seq(line).is_some_and(|seq| seq <= after_seq) {
            continue;
        }
        match serde_json::from_slice::<RolloutRecord>(line) {
            Ok(record) if record.seq > after_seq => records.push(record),
            Ok(_) => {}
            Err(e) => {
                unreadable += 1;
                tracing::warn!(path = %path.display(), line = index + 1, error = %e, "skipping unreadable rollout line");
            }
        }
    }
    if unreadable > 0 {
        metrics::unreadable_lines(unreadable);
    }
    Ok(records)
}

pub(super) fn is_record_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".jsonl"))
}

/// The highest `seq` recorded in `dir` (0 if none). Blocking.
pub(super) fn max_seq_in_dir(dir: &Path) -> io::Result<u64> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut max = 0;
    for entry in entries {
        let path = entry?.path();
        if is_record_file(&path) {
            match last_seq_in_file(&path) {
                Ok(seq) => max = max.max(seq),
                // Removed by a concurrent sweep's rename: the new file is listed too.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(max)
}

/// The high-water mark (0 when there is none, or it is unreadable). Blocking.
pub(super) fn read_high_water(path: &Path) -> io::Result<u64> {
    match fs::read(path) {
        Ok(bytes) => {
            let value = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if value.is_none() && !bytes.is_empty() {
                tracing::warn!(path = %path.display(), "unreadable rollout high-water mark");
            }
            Ok(value.unwrap_or(0))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// The `seq` of a file's last line, reading backwards from its end in growing chunks.
pub(super) fn last_seq_in_file(path: &Path) -> io::Result<u64> {
    let mut file = File::open(path)?;
    let mut start = file.metadata()?.len();
    let mut tail: Vec<u8> = Vec::new();
    while start > 0 {
        let want = TAIL_CHUNK.max(tail.len());
        let from = start.saturating_sub(u64::try_from(want).unwrap_or(u64::MAX));
        let mut chunk = vec![0; usize::try_from(start - from).unwrap_or(0)];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        start = from;
        if let Some(seq) = last_seq_in_tail(&tail, start == 0) {
            return Ok(seq);
        }
    }
    Ok(0)
}

/// The `seq` a line starts with, read from its prefix: `seq` is the first field of a
/// serialised record, and content inside strings is escaped, so the prefix only ever matches
/// at the start of a record. A torn line whose `seq` is complete still has one.
pub(super) fn line_seq(line: &[u8]) -> Option<u64> {
    const PREFIX: &[u8] = b"{\"seq\":";
    let rest = line.strip_prefix(PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || rest.get(digits) != Some(&b',') {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The `seq` of the last line of `tail` that starts there. The first piece counts as a line
/// start only at the start of the file. A torn line still counts when its `seq` is complete:
/// that event may have been published, so its number must not be handed out again.
pub(super) fn last_seq_in_tail(tail: &[u8], at_file_start: bool) -> Option<u64> {
    #[derive(Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let pieces = tail.split(|b| *b == b'\n').count();
    for (index, line) in tail.rsplit(|b| *b == b'\n').enumerate() {
        let is_first_piece = index + 1 == pieces;
        if is_first_piece && !at_file_start {
            break;
        }
        if let Some(seq) = line_seq(line) {
            return Some(seq);
        }
        if let Ok(record) = serde_json::from_slice::<SeqOnly>(line) {
            return Some(record.seq);
        }
    }
    None
}
