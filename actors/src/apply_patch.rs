//! The `apply_patch` built-in: parsing, rendering and applying patches in the
//! `*** Begin Patch` format, confined to the conversation's workspace.
//!
//! ```text
//! *** Begin Patch
//! *** Add File: docs/new.md          lines follow, each prefixed with `+`
//! +hello
//! *** Delete File: old.txt
//! *** Update File: src/lib.rs
//! *** Move to: src/core.rs           optional rename
//! @@ fn main() {                     a hunk; the text after `@@` locates it (optional)
//!  context line                      ` ` context, `-` removed, `+` added
//! -old line
//! +new line
//! *** End of File                    optional: the hunk ends the file
//! *** End Patch
//! ```
//!
//! Parsing and applying to text are pure ([`parse`], [`apply_hunks`]). Applying to disk
//! ([`apply`]) first resolves every path inside the workspace ([`resolve_in_workspace`]:
//! no `..` escape, no symlink escape), then computes every new file content, and only then
//! writes, so a patch whose hunk does not match changes nothing. Every read and write then
//! opens its path beneath its workspace root again ([`Beneath`]), so a directory swapped for
//! a symlink between the check and the write (by a command running meanwhile) leads nowhere
//! outside.

mod beneath;
pub use beneath::Beneath;

use std::path::{Component, Path, PathBuf};

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

/// A parsed patch: file operations in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub ops: Vec<FileOp>,
}

/// One file operation. Paths are as written in the patch (relative to the workspace root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// Creates (or replaces) a file with these lines.
    Add {
        path: String,
        lines: Vec<String>,
    },
    Delete {
        path: String,
    },
    /// Edits a file by hunks, optionally moving it.
    Update {
        path: String,
        move_to: Option<String>,
        hunks: Vec<Hunk>,
    },
}

impl FileOp {
    pub fn path(&self) -> &str {
        match self {
            Self::Add { path, .. } | Self::Delete { path } | Self::Update { path, .. } => path,
        }
    }
}

/// One `@@` hunk of an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The text after `@@`: a line just before the hunk that locates it.
    pub context: Option<String>,
    pub lines: Vec<HunkLine>,
    /// The hunk must match at the end of the file.
    pub end_of_file: bool,
}

/// A line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HunkLine {
    Context(String),
    Remove(String),
    Add(String),
}

impl Hunk {
    /// The lines the hunk expects to find (context and removed).
    pub fn old_lines(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Remove(s) => Some(s.as_str()),
                HunkLine::Add(_) => None,
            })
            .collect()
    }

    /// The lines that replace them (context and added).
    pub fn new_lines(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Add(s) => Some(s.as_str()),
                HunkLine::Remove(_) => None,
            })
            .collect()
    }
}

/// Why a patch could not be parsed or applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The text is not a patch; `line` counts from 1.
    #[error("invalid patch, line {line}: {message}")]
    Parse { line: usize, message: String },
    /// A path leaves the workspace (or there is no workspace).
    #[error("{0}")]
    OutsideWorkspace(String),
    /// The patch does not fit the files as they are.
    #[error("{0}")]
    Apply(String),
}

fn parse_error(line: usize, message: impl Into<String>) -> PatchError {
    PatchError::Parse {
        line: line + 1,
        message: message.into(),
    }
}

/// Parses a patch. Marker lines may carry surrounding whitespace; an empty line inside a
/// hunk is an empty context line; the first hunk of an update may omit its `@@` line.
pub fn parse(text: &str) -> Result<Patch, PatchError> {
    let lines: Vec<&str> = text.lines().collect();
    let first = lines
        .iter()
        .position(|l| !l.trim().is_empty())
        .ok_or_else(|| parse_error(0, "the patch is empty"))?;
    if lines[first].trim() != BEGIN {
        return Err(parse_error(first, format!("expected `{BEGIN}`")));
    }
    let mut i = first + 1;
    let mut ops = Vec::new();
    loop {
        let Some(line) = lines.get(i) else {
            return Err(parse_error(i, format!("missing `{END}`")));
        };
        let marker = line.trim();
        if marker == END {
            i += 1;
            break;
        }
        if let Some(path) = marker.strip_prefix(ADD.trim_start()) {
            let path = nonempty_path(path, i)?;
            i += 1;
            let mut added = Vec::new();
            while let Some(l) = lines.get(i).and_then(|l| l.strip_prefix('+')) {
                added.push(l.to_owned());
                i += 1;
            }
            ops.push(FileOp::Add { path, lines: added });
        } else if let Some(path) = marker.strip_prefix(DELETE.trim_start()) {
            ops.push(FileOp::Delete {
                path: nonempty_path(path, i)?,
            });
            i += 1;
        } else if let Some(path) = marker.strip_prefix(UPDATE.trim_start()) {
            let path = nonempty_path(path, i)?;
            i += 1;
            let move_to = match lines.get(i).and_then(|l| l.trim().strip_prefix(MOVE_TO)) {
                Some(to) => {
                    let to = nonempty_path(to, i)?;
                    i += 1;
                    Some(to)
                }
                None => None,
            };
            let (hunks, next) = parse_hunks(&lines, i)?;
            if hunks.is_empty() {
                return Err(parse_error(i, format!("`{path}` has no hunks to apply")));
            }
            i = next;
            ops.push(FileOp::Update {
                path,
                move_to,
                hunks,
            });
        } else {
            return Err(parse_error(
                i,
                format!(
                    "expected a file operation (`{}`, `{}`, `{}`) or `{END}`, found `{line}`",
                    ADD.trim(),
                    DELETE.trim(),
                    UPDATE.trim()
                ),
            ));
        }
    }
    if let Some(extra) = lines[i..].iter().position(|l| !l.trim().is_empty()) {
        return Err(parse_error(i + extra, format!("text after `{END}`")));
    }
    Ok(Patch { ops })
}

fn nonempty_path(raw: &str, line: usize) -> Result<String, PatchError> {
    let path = raw.trim();
    if path.is_empty() {
        Err(parse_error(line, "missing path"))
    } else {
        Ok(path.to_owned())
    }
}

/// Whether a line starts the next file operation or ends the patch.
fn is_marker(line: &str) -> bool {
    let t = line.trim();
    t == END || t.starts_with(ADD) || t.starts_with(DELETE) || t.starts_with(UPDATE)
}

/// The hunks of one update, from line `i`; returns them and the first line after them.
fn parse_hunks(lines: &[&str], mut i: usize) -> Result<(Vec<Hunk>, usize), PatchError> {
    let mut hunks: Vec<Hunk> = Vec::new();
    while let Some(line) = lines.get(i) {
        if is_marker(line) {
            break;
        }
        let header = if line.trim_end() == "@@" {
            Some(None)
        } else {
            line.strip_prefix("@@ ").map(|c| Some(c.to_owned()))
        };
        let context = match header {
            Some(context) => {
                i += 1;
                context
            }
            // Only the first hunk may leave out its `@@` line.
            None if hunks.is_empty() => None,
            None => return Err(parse_error(i, format!("expected `@@`, found `{line}`"))),
        };
        let mut hunk = Hunk {
            context,
            lines: Vec::new(),
            end_of_file: false,
        };
        while let Some(line) = lines.get(i) {
            if line.trim() == END_OF_FILE {
                hunk.end_of_file = true;
                i += 1;
                break;
            }
            if is_marker(line) || line.starts_with("@@") {
                break;
            }
            let parsed = match line.chars().next() {
                None => HunkLine::Context(String::new()),
                Some(' ') => HunkLine::Context(line[1..].to_owned()),
                Some('-') => HunkLine::Remove(line[1..].to_owned()),
                Some('+') => HunkLine::Add(line[1..].to_owned()),
                Some(_) => {
                    return Err(parse_error(
                        i,
                        format!("a hunk line starts with ` `, `-` or `+`, found `{line}`"),
                    ));
                }
            };
            hunk.lines.push(parsed);
            i += 1;
        }
        if hunk.lines.is_empty() {
            return Err(parse_error(i, "empty hunk"));
        }
        hunks.push(hunk);
    }
    Ok((hunks, i))
}

/// The patch as text; `parse(&render(p)) == p` for every patch whose lines are plain.
pub fn render(patch: &Patch) -> String {
    let mut out = format!("{BEGIN}\n");
    for op in &patch.ops {
        match op {
            FileOp::Add { path, lines } => {
                out.push_str(&format!("{ADD}{path}\n"));
                for l in lines {
                    out.push_str(&format!("+{l}\n"));
                }
            }
            FileOp::Delete { path } => out.push_str(&format!("{DELETE}{path}\n")),
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                out.push_str(&format!("{UPDATE}{path}\n"));
                if let Some(to) = move_to {
                    out.push_str(&format!("{MOVE_TO}{to}\n"));
                }
                for h in hunks {
                    match &h.context {
                        Some(c) => out.push_str(&format!("@@ {c}\n")),
                        None => out.push_str("@@\n"),
                    }
                    for l in &h.lines {
                        let (sign, text) = match l {
                            HunkLine::Context(t) => (' ', t),
                            HunkLine::Remove(t) => ('-', t),
                            HunkLine::Add(t) => ('+', t),
                        };
                        out.push(sign);
                        out.push_str(text);
                        out.push('\n');
                    }
                    if h.end_of_file {
                        out.push_str(END_OF_FILE);
                        out.push('\n');
                    }
                }
            }
        }
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// The contents of an added file.
pub fn added_contents(lines: &[String]) -> String {
    let mut s = lines.join("\n");
    if !lines.is_empty() {
        s.push('\n');
    }
    s
}

/// Applies hunks to a file's text. Each hunk is looked for after the previous one: first at
/// its `@@` context line, then its old lines exactly, ignoring trailing whitespace, then
/// ignoring surrounding whitespace. The result ends with a newline (unless it is empty).
pub fn apply_hunks(original: &str, path: &str, hunks: &[Hunk]) -> Result<String, PatchError> {
    let mut lines: Vec<&str> = original.split('\n').collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    let mut cursor = 0;
    // (start, old length, new lines), in file order.
    let mut edits: Vec<(usize, usize, Vec<&str>)> = Vec::new();
    for (n, hunk) in hunks.iter().enumerate() {
        if let Some(context) = &hunk.context {
            let at = seek(&lines, &[context.as_str()], cursor, false).ok_or_else(|| {
                PatchError::Apply(format!(
                    "{path}: hunk {}: context line `{context}` not found",
                    n + 1
                ))
            })?;
            cursor = at + 1;
        }
        let old = hunk.old_lines();
        if old.is_empty() {
            // A pure insertion goes at the end of the file (or right after the context).
            let at = if hunk.context.is_some() {
                cursor
            } else {
                lines.len()
            };
            edits.push((at, 0, hunk.new_lines()));
            continue;
        }
        let at = seek(&lines, &old, cursor, hunk.end_of_file).ok_or_else(|| {
            PatchError::Apply(format!(
                "{path}: hunk {}: the lines to change were not found:\n{}",
                n + 1,
                old.join("\n")
            ))
        })?;
        // Context lines keep the file's own text (a loose match may differ in whitespace).
        let mut found = lines[at..at + old.len()].iter();
        let mut new = Vec::new();
        for line in &hunk.lines {
            match line {
                HunkLine::Context(_) => new.extend(found.next().copied()),
                HunkLine::Remove(_) => {
                    found.next();
                }
                HunkLine::Add(text) => new.push(text.as_str()),
            }
        }
        cursor = at + old.len();
        edits.push((at, old.len(), new));
    }
    for (at, len, new) in edits.into_iter().rev() {
        lines.splice(at..at + len, new);
    }
    if lines.is_empty() {
        return Ok(String::new());
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

/// Where `pattern` occurs in `lines` at or after `from`: exact, then ignoring trailing
/// whitespace, then ignoring surrounding whitespace. `at_end` tries the end of the file first.
fn seek(lines: &[&str], pattern: &[&str], from: usize, at_end: bool) -> Option<usize> {
    if pattern.len() > lines.len() {
        return None;
    }
    let last = lines.len() - pattern.len();
    let matchers: [fn(&str, &str) -> bool; 3] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
    ];
    for eq in matchers {
        let fits = |i: usize| {
            lines[i..i + pattern.len()]
                .iter()
                .zip(pattern)
                .all(|(a, b)| eq(a, b))
        };
        if at_end && last >= from && fits(last) {
            return Some(last);
        }
        if let Some(i) = (from..=last).find(|&i| fits(i)) {
            return Some(i);
        }
    }
    None
}

/// The workspace path of `raw`: relative paths are taken from the first root. The path must
/// stay inside a root, lexically (`..`) and through symlinks (its deepest existing ancestor
/// is resolved).
pub fn resolve_in_workspace(roots: &[PathBuf], raw: &str) -> Result<PathBuf, PatchError> {
    let outside = || {
        PatchError::OutsideWorkspace(format!(
            "`{raw}` is outside the workspace; apply_patch only writes under {}",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let Some(first) = roots.first() else {
        return Err(PatchError::OutsideWorkspace(
            "this conversation has no workspace for apply_patch to write in".into(),
        ));
    };
    let joined = first.join(raw);
    let lexical = normalize(&joined).ok_or_else(outside)?;
    let real = real_path(&lexical).ok_or_else(outside)?;
    let inside = roots.iter().any(|root| {
        std::fs::canonicalize(root).is_ok_and(|root| real.starts_with(&root) && real != root)
    });
    if inside { Ok(lexical) } else { Err(outside()) }
}

/// `.` and `..` removed without touching the disk; `None` if `..` climbs above `/`.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// The path with its deepest existing ancestor resolved through symlinks.
fn real_path(path: &Path) -> Option<PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if existing.symlink_metadata().is_ok() {
            let mut real = std::fs::canonicalize(existing).ok()?;
            real.extend(rest.iter().rev());
            return Some(real);
        }
        rest.push(existing.file_name()?);
        existing = existing.parent()?;
    }
}

/// What a patch did to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Added(String),
    Updated(String),
    Moved { from: String, to: String },
    Deleted(String),
}

impl Applied {
    /// Bounded name of the operation (metric label).
    pub const fn op(&self) -> &'static str {
        match self {
            Self::Added(_) => "add",
            Self::Updated(_) => "update",
            Self::Moved { .. } => "move",
            Self::Deleted(_) => "delete",
        }
    }
}

/// One write planned by [`apply`].
enum Write {
    Put(Beneath, String),
    Remove(Beneath),
}

/// `raw` checked ([`resolve_in_workspace`]) and placed under its root, for the file
/// operations that stay beneath it ([`Beneath`]).
fn beneath(roots: &[PathBuf], raw: &str) -> Result<Beneath, PatchError> {
    let lexical = resolve_in_workspace(roots, raw)?;
    Beneath::of(roots, &lexical).ok_or_else(|| {
        PatchError::OutsideWorkspace(format!("`{raw}` is not under a workspace root"))
    })
}

/// Applies a patch inside the workspace: every path is checked and every new content is
/// computed before the first write. Blocking (file I/O): call it off the async threads.
pub fn apply(patch: &Patch, roots: &[PathBuf]) -> Result<Vec<Applied>, PatchError> {
    let io = |what: &str, path: &str, e: std::io::Error| {
        PatchError::Apply(format!("cannot {what} `{path}`: {e}"))
    };
    let mut writes = Vec::new();
    let mut applied = Vec::new();
    for op in &patch.ops {
        match op {
            FileOp::Add { path, lines } => {
                let target = beneath(roots, path)?;
                writes.push(Write::Put(target, added_contents(lines)));
                applied.push(Applied::Added(path.clone()));
            }
            FileOp::Delete { path } => {
                let target = beneath(roots, path)?;
                if !target.is_file() {
                    return Err(PatchError::Apply(format!(
                        "cannot delete `{path}`: no such file"
                    )));
                }
                writes.push(Write::Remove(target));
                applied.push(Applied::Deleted(path.clone()));
            }
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                let source = beneath(roots, path)?;
                let original = source.read().map_err(|e| io("read", path, e))?;
                let updated = apply_hunks(&original, path, hunks)?;
                match move_to {
                    Some(to) => {
                        let target = beneath(roots, to)?;
                        writes.push(Write::Put(target.clone(), updated));
                        if target != source {
                            writes.push(Write::Remove(source));
                        }
                        applied.push(Applied::Moved {
                            from: path.clone(),
                            to: to.clone(),
                        });
                    }
                    None => {
                        writes.push(Write::Put(source, updated));
                        applied.push(Applied::Updated(path.clone()));
                    }
                }
            }
        }
    }
    // Each write opens its path beneath its root again: a directory on the way swapped
    // for a symlink since the check above leads nowhere else.
    for write in writes {
        match write {
            Write::Put(path, contents) => {
                let shown = path.rel.display().to_string();
                path.write(&contents).map_err(|e| io("write", &shown, e))?;
            }
            Write::Remove(path) => {
                path.remove()
                    .map_err(|e| io("delete", &path.rel.display().to_string(), e))?;
            }
        }
    }
    Ok(applied)
}

/// The observation the model gets.
pub fn summary(applied: &[Applied]) -> String {
    let mut s = String::from("Applied the patch:");
    for a in applied {
        s.push('\n');
        match a {
            Applied::Added(p) => s.push_str(&format!("A {p}")),
            Applied::Updated(p) => s.push_str(&format!("M {p}")),
            Applied::Moved { from, to } => s.push_str(&format!("M {from} -> {to}")),
            Applied::Deleted(p) => s.push_str(&format!("D {p}")),
        }
    }
    s
}

/// The approval key of a patch (S9): the tool name, then one entry per file operation, so
/// approving it for a conversation lets later patches of the same files through.
pub fn approval_command(patch: &Patch) -> Vec<String> {
    let mut command = vec![crate::tools::APPLY_PATCH.to_owned()];
    command.extend(patch.ops.iter().map(|op| match op {
        FileOp::Add { path, .. } => format!("add {path}"),
        FileOp::Delete { path } => format!("delete {path}"),
        FileOp::Update {
            path,
            move_to: Some(to),
            ..
        } => format!("update {path} -> {to}"),
        FileOp::Update { path, .. } => format!("update {path}"),
    }));
    command
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "\
*** Begin Patch
*** Add File: docs/hello.md
+# Hello
+
+world
*** Delete File: old.txt
*** Update File: src/lib.rs
*** Move to: src/core.rs
@@ fn main() {
     let x = 1;
-    println!(\"{x}\");
+    println!(\"x = {x}\");
@@
 fn tail() {}
+fn added() {}
*** End of File
*** End Patch
";

    #[test]
    fn parses_every_operation() {
        let patch = parse(SAMPLE).unwrap();
        assert_eq!(patch.ops.len(), 3);
        assert_eq!(
            patch.ops[0],
            FileOp::Add {
                path: "docs/hello.md".into(),
                lines: vec!["# Hello".into(), String::new(), "world".into()],
            }
        );
        assert_eq!(
            patch.ops[1],
            FileOp::Delete {
                path: "old.txt".into()
            }
        );
        let FileOp::Update {
            path,
            move_to,
            hunks,
        } = &patch.ops[2]
        else {
            panic!("not an update: {:?}", patch.ops[2]);
        };
        assert_eq!(path, "src/lib.rs");
        assert_eq!(move_to.as_deref(), Some("src/core.rs"));
        assert_eq!(hunks.len(), 2);
        assert_eq!(hunks[0].context.as_deref(), Some("fn main() {"));
        assert_eq!(
            hunks[0].old_lines(),
            ["    let x = 1;", "    println!(\"{x}\");"]
        );
        assert_eq!(
            hunks[0].new_lines(),
            ["    let x = 1;", "    println!(\"x = {x}\");"]
        );
        assert!(hunks[1].end_of_file && hunks[1].context.is_none());
        assert_eq!(render(&patch), SAMPLE);
    }

    #[test]
    fn rejects_malformed_patches_with_the_line() {
        for (text, line) in [
            ("", 1),
            ("*** Add File: a\n+x\n*** End Patch", 1),
            ("*** Begin Patch\n*** Add File: a\n+x\n", 4),
            ("*** Begin Patch\n*** Frobnicate: a\n*** End Patch", 2),
            ("*** Begin Patch\n*** Update File: a\n*** End Patch", 3),
            ("*** Begin Patch\n*** Update File: a\n@@\n*** End Patch", 4),
            (
                "*** Begin Patch\n*** Update File: a\n@@\n x\n?y\n*** End Patch",
                5,
            ),
            ("*** Begin Patch\n*** Delete File:  \n*** End Patch", 2),
            ("*** Begin Patch\n*** End Patch\ntrailing", 3),
        ] {
            match parse(text) {
                Err(PatchError::Parse { line: at, .. }) => assert_eq!(at, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn lenient_markers_and_a_first_hunk_without_header() {
        let text = "  *** Begin Patch\n*** Update File: a.txt\n one\n-two\n+2\n\n three\n *** End Patch \n";
        let patch = parse(text).unwrap();
        let FileOp::Update { hunks, .. } = &patch.ops[0] else {
            panic!()
        };
        assert_eq!(hunks.len(), 1);
        assert_eq!(hunks[0].old_lines(), ["one", "two", "", "three"]);
    }

    fn hunk(context: Option<&str>, lines: &[&str], end_of_file: bool) -> Hunk {
        Hunk {
            context: context.map(str::to_owned),
            lines: lines
                .iter()
                .map(|l| match l.split_at(1) {
                    ("-", t) => HunkLine::Remove(t.into()),
                    ("+", t) => HunkLine::Add(t.into()),
                    (_, t) => HunkLine::Context(t.into()),
                })
                .collect(),
            end_of_file,
        }
    }

    #[test]
    fn hunks_apply_in_order_after_their_context() {
        let original = "a\nb\nx\nc\nx\nd\n";
        // The second `x` is the one after `c`.
        let out = apply_hunks(original, "f", &[hunk(Some("c"), &["-x", "+y"], false)]).unwrap();
        assert_eq!(out, "a\nb\nx\nc\ny\nd\n");
        let out = apply_hunks(
            original,
            "f",
            &[
                hunk(None, &[" a", "-b", "+B"], false),
                hunk(None, &["-d", "+D", "+E"], true),
            ],
        )
        .unwrap();
        assert_eq!(out, "a\nB\nx\nc\nx\nD\nE\n");
        // Whitespace differences still match; a missing line is an error naming the file.
        let out = apply_hunks(
            "  keep  \nold\n",
            "f",
            &[hunk(None, &[" keep", "-old", "+new"], false)],
        )
        .unwrap();
        assert_eq!(out, "  keep  \nnew\n");
        let err = apply_hunks(original, "f.txt", &[hunk(None, &["-zzz"], false)]).unwrap_err();
        assert!(err.to_string().contains("f.txt"), "{err}");
        // A pure insertion appends; a file without a final newline gets one.
        assert_eq!(
            apply_hunks("one", "f", &[hunk(None, &["+two"], false)]).unwrap(),
            "one\ntwo\n"
        );
    }

    #[test]
    fn applies_to_a_workspace_and_refuses_to_leave_it() {
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path().to_path_buf();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(
            root.join("src/lib.rs"),
            "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\nfn tail() {}\n",
        )
        .unwrap();
        std::fs::write(root.join("old.txt"), "bye\n").unwrap();
        let applied = apply(&parse(SAMPLE).unwrap(), std::slice::from_ref(&root)).unwrap();
        assert_eq!(
            summary(&applied),
            "Applied the patch:\nA docs/hello.md\nD old.txt\nM src/lib.rs -> src/core.rs"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("docs/hello.md")).unwrap(),
            "# Hello\n\nworld\n"
        );
        assert!(!root.join("old.txt").exists() && !root.join("src/lib.rs").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("src/core.rs")).unwrap(),
            "fn main() {\n    let x = 1;\n    println!(\"x = {x}\");\n}\nfn tail() {}\nfn added() {}\n"
        );

        let outside = tempfile::tempdir().unwrap();
        let escape = outside.path().join("x.txt");
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        for path in [
            "../x.txt".to_owned(),
            escape.display().to_string(),
            "link/x.txt".to_owned(),
            "src/../../x.txt".to_owned(),
            ".".to_owned(),
        ] {
            let patch = parse(&format!(
                "*** Begin Patch\n*** Add File: {path}\n+no\n*** End Patch\n"
            ))
            .unwrap();
            let err = apply(&patch, std::slice::from_ref(&root)).unwrap_err();
            assert!(
                matches!(err, PatchError::OutsideWorkspace(_)),
                "{path}: {err}"
            );
        }
        assert!(!escape.exists());
        // An absolute path inside the workspace is fine.
        let inside = root.join("abs.txt").display().to_string();
        let patch = parse(&format!(
            "*** Begin Patch\n*** Add File: {inside}\n+yes\n*** End Patch\n"
        ))
        .unwrap();
        apply(&patch, std::slice::from_ref(&root)).unwrap();
        assert!(root.join("abs.txt").exists());
    }

    #[test]
    fn a_failing_hunk_writes_nothing() {
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path().to_path_buf();
        std::fs::write(root.join("a.txt"), "one\n").unwrap();
        let text = "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Update File: a.txt\n@@\n-missing\n+y\n*** End Patch\n";
        let err = apply(&parse(text).unwrap(), std::slice::from_ref(&root)).unwrap_err();
        assert!(matches!(err, PatchError::Apply(_)), "{err}");
        assert!(!root.join("new.txt").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("a.txt")).unwrap(),
            "one\n"
        );
    }

    #[test]
    fn approval_command_names_each_file() {
        assert_eq!(
            approval_command(&parse(SAMPLE).unwrap()),
            [
                "apply_patch",
                "add docs/hello.md",
                "delete old.txt",
                "update src/lib.rs -> src/core.rs"
            ]
        );
    }

    // Generated patches: paths and texts without line breaks; hunk text lines that do not
    // look like markers (as a real file line starting with `*** ` or `@@` would not be
    // representable in this format either).
    fn path() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9_./-]{0,15}".prop_map(|p| p.trim_end().to_owned())
    }

    fn text_line() -> impl Strategy<Value = String> {
        "[^\r\n]{0,20}".prop_filter("not a marker", |l| {
            !l.starts_with("***") && !l.starts_with("@@") && !l.trim().starts_with("*** ")
        })
    }

    fn hunk_line() -> impl Strategy<Value = HunkLine> {
        prop_oneof![
            text_line().prop_map(HunkLine::Context),
            text_line().prop_map(HunkLine::Remove),
            text_line().prop_map(HunkLine::Add),
        ]
    }

    fn arb_hunk() -> impl Strategy<Value = Hunk> {
        (
            prop::option::of("[^\r\n]{0,12}".prop_map(|c| c.trim().to_owned())),
            prop::collection::vec(hunk_line(), 1..5),
            any::<bool>(),
        )
            .prop_map(|(context, lines, end_of_file)| Hunk {
                context: context.filter(|c| !c.is_empty()),
                lines,
                end_of_file,
            })
    }

    fn file_op() -> impl Strategy<Value = FileOp> {
        prop_oneof![
            (path(), prop::collection::vec("[^\r\n]{0,20}", 0..4))
                .prop_map(|(path, lines)| FileOp::Add { path, lines }),
            path().prop_map(|path| FileOp::Delete { path }),
            (
                path(),
                prop::option::of(path()),
                prop::collection::vec(arb_hunk(), 1..4)
            )
                .prop_map(|(path, move_to, hunks)| FileOp::Update {
                    path,
                    move_to,
                    hunks
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn parse_of_rendered_patch_gives_it_back(
            ops in prop::collection::vec(file_op(), 0..5)
        ) {
            let patch = Patch { ops };
            let text = render(&patch);
            prop_assert_eq!(parse(&text), Ok(patch), "{}", text);
        }

        #[test]
        fn a_hunk_made_from_a_file_turns_it_into_the_target(
            before in prop::collection::vec("[a-z ]{0,6}", 1..12),
            start in 0usize..12,
            removed in 0usize..4,
            added in prop::collection::vec("[A-Z]{1,6}", 0..3),
        ) {
            let start = start.min(before.len() - 1);
            let removed = removed.min(before.len() - start);
            // Context: the line before the change when there is one, so the hunk is anchored.
            let lead = start.saturating_sub(1);
            let mut lines: Vec<HunkLine> = before[lead..start].iter().cloned().map(HunkLine::Context).collect();
            lines.extend(before[start..start + removed].iter().cloned().map(HunkLine::Remove));
            lines.extend(added.iter().cloned().map(HunkLine::Add));
            // A hunk with nothing to find is an insertion at the end, not at `start`.
            prop_assume!(lines.iter().any(|l| !matches!(l, HunkLine::Add(_))));
            let mut after = before.clone();
            after.splice(start..start + removed, added.clone());
            let original = added_contents(&before);
            let h = Hunk { context: None, lines, end_of_file: false };
            let out = apply_hunks(&original, "f", std::slice::from_ref(&h));
            // The old lines may also occur earlier (repeated lines): then the first match is
            // the one changed, which is what the format means.
            let old: Vec<&str> = h.old_lines();
            let first = (0..=before.len() - old.len()).find(|&i| before[i..i + old.len()].iter().map(String::as_str).eq(old.iter().copied()));
            if first == Some(lead) {
                prop_assert_eq!(out, Ok(added_contents(&after)));
            } else {
                prop_assert!(out.is_ok());
            }
        }
    }
}
