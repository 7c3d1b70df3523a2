//! The capability registry (A6): what it costs to read, to summarise in a prompt and to
//! inspect; prints a table.
//!
//!     cargo bench -p troupe-tests --bench capabilities
//!
//! - load: reading a capabilities directory of 20 folders (module.json, README.md, cli.md
//!   each), at start and after each change;
//! - summary: the prompt's one-line-per-capability section (the policy's visibility check
//!   included), built once per task, for 20 and 200 capabilities, with the o200k tokenizer
//!   counting against the budget (the 200 are cut to it) and with the `approx` counter;
//! - inspect: one `capability_inspect` answer at each level, with a 60 KB `cli.md` cut to a
//!   2,000-token budget (the binary search over prefixes, counted with o200k);
//! - run plan: filling a command's argv template from the model's arguments.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};
use troupe_actors::capabilities::{self as caps, Level};
use troupe_actors::governance::task_policy;
use troupe_actors::ports::TokenCounter;
use troupe_proto::capability::CapabilityCatalog;
use troupe_proto::governance::ToolPolicyConfig;
use troupe_runtime::tokens::TiktokenCounter;

/// Median and p99 of `batches` timings of `per_batch` runs of `f`, per run.
fn measure(batches: usize, per_batch: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        times.push(t.elapsed() / u32::try_from(per_batch).unwrap());
    }
    times.sort();
    (times[batches / 2], times[(batches * 99) / 100])
}

fn row(what: &str, (p50, p99): (Duration, Duration), note: &str) {
    println!("| {what} | {p50:.2?} | {p99:.2?} | {note} |");
}

fn write_folder(dir: &Path, id: &str, cli_bytes: usize) {
    let folder = dir.join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("module.json"),
        json!({
            "id": id,
            "description": format!("The {id} program: reads, lists and reports on the workspace's files."),
            "commands": [
                {"name": "status", "argv": [id, "status", "--short"], "description": "What changed."},
                {"name": "log", "argv": [id, "log", "-n", "{count}", "--", "{paths}"], "description": "Recent history of paths."},
                {"name": "show", "argv": [id, "show", "{rev}:{path}"], "description": "A file at a revision."}
            ],
            "probe": [id, "--version"],
            "timeout": "20s"
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        folder.join("README.md"),
        format!(
            "# {id}\n\n{}",
            "Use `status` first, then `log` on the paths it names.\n".repeat(20)
        ),
    )
    .unwrap();
    let line = "--flag VALUE    what the flag does, in one line of reference text\n";
    std::fs::write(
        folder.join("cli.md"),
        line.repeat(cli_bytes / line.len() + 1),
    )
    .unwrap();
}

fn catalog(dir: &Path, n: usize, cli_bytes: usize) -> CapabilityCatalog {
    for i in 0..n {
        write_folder(dir, &format!("tool{i:03}"), cli_bytes);
    }
    troupe_runtime::capabilities::load(dir, true)
}

fn main() {
    let o200k = TiktokenCounter::by_encoding("o200k_base").unwrap();
    let count = |t: &str| o200k.count(t);
    let approx = |t: &str| t.len().div_ceil(4);
    let policy = task_policy(
        &ToolPolicyConfig {
            blacklist: vec!["capability__tool00*".into(), "files__delete_*".into()],
            ..ToolPolicyConfig::default()
        },
        None,
        None,
        None,
    );

    let small = tempfile::tempdir().unwrap();
    let twenty = catalog(small.path(), 20, 60_000);
    assert!(twenty.errors.is_empty(), "{:?}", twenty.errors);
    let big = tempfile::tempdir().unwrap();
    let two_hundred = catalog(big.path(), 200, 2_000);

    println!("| measure | p50 | p99 | note |");
    println!("|---|---:|---:|---|");
    row(
        "load 20 folders",
        measure(20, 10, || {
            black_box(troupe_runtime::capabilities::load(small.path(), true));
        }),
        "3 files each (60 KB cli.md), parsed and checked; at start and after each change",
    );
    for (name, catalog) in [("20", &twenty), ("200", &two_hundred)] {
        let visible = caps::visible(catalog, &policy);
        let text = caps::summary(&visible, 400, &count).unwrap();
        let lines = text.lines().filter(|l| l.starts_with("- ")).count();
        row(
            &format!("summary of {name}, o200k"),
            measure(50, 10, || {
                let visible = caps::visible(catalog, &policy);
                black_box(caps::summary(&visible, 400, &count));
            }),
            &format!(
                "{lines} lines of {} visible fit in 400 tokens; once per task",
                visible.len()
            ),
        );
        row(
            &format!("summary of {name}, approx"),
            measure(50, 100, || {
                let visible = caps::visible(catalog, &policy);
                black_box(caps::summary(&visible, 400, &approx));
            }),
            "4 bytes a token",
        );
    }
    let one = twenty.get("tool005").unwrap();
    for (level, note) in [
        (Level::Summary, "description and 3 commands"),
        (Level::Usage, "README.md, ~1 KB: fits"),
        (Level::Full, "cli.md, 60 KB: cut to 2,000 tokens"),
    ] {
        let probe = "tool005 version 1.0\n";
        let answer = caps::inspect(one, level, Some(probe), 2000, &count);
        assert!(count(&answer) <= 2000);
        row(
            &format!("inspect level {}", level as u8),
            measure(20, 5, || {
                black_box(caps::inspect(one, level, Some(probe), 2000, &count));
            }),
            &format!("{note} ({} bytes answered)", answer.len()),
        );
    }
    let args = json!({"id": "tool005", "command": "log", "args": {"count": 5, "paths": ["src", "README.md"]}});
    row(
        "run plan",
        measure(50, 1000, || {
            black_box(caps::run_plan(one, &args).unwrap());
        }),
        "template filled: 6 argv elements, a list expanded",
    );
}
