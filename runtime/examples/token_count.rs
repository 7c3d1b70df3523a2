//! Start-up cost and throughput of the token counter, against tiktoken-rs.
//!
//!     cargo build --release -p troupe-runtime --example token_count
//!     target/release/examples/token_count first o200k_base
//!     target/release/examples/token_count first-tiktoken o200k_base
//!     target/release/examples/token_count throughput o200k_base
//!
//! `first` counts, in a fresh process, what `troupe chat` counts before its first model call
//! (the default instructions, the shell and plan tools, a short user message) and prints the
//! time taken and the process's peak memory (`VmHWM`, of which `RssFile` is mapped from the
//! binary: code and the rank tables). `throughput` counts a 100 KB text of prose, code and
//! JSON with both (checking they agree) and prints MB/s.

use std::error::Error;
use std::time::{Duration, Instant};
use tiktoken_rs::CoreBPE;
use troupe_actors::context::{APPLY_PATCH_GUIDANCE, DEFAULT_INSTRUCTIONS};
use troupe_actors::ports::TokenCounter;
use troupe_actors::task::fixed_prompt_tokens;
use troupe_actors::tools::{ToolPrefs, builtin_tools};
use troupe_runtime::tokens::{Encoding, TiktokenCounter};

const CORPUS: &str = include_str!("../src/tokens/corpus.txt");

fn reference(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
        Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
    }
}

/// tiktoken-rs behind the port, its encoder built on first use.
struct Reference(Encoding);

impl TokenCounter for Reference {
    fn encoding(&self) -> &str {
        "tiktoken-rs"
    }

    fn count(&self, text: &str) -> usize {
        reference(self.0).encode_ordinary(text).len()
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(mode), Some(name)) = (args.next(), args.next()) else {
        return Err("usage: token_count first|first-tiktoken|throughput <encoding>".into());
    };
    let counter = TiktokenCounter::by_encoding(&name)?;
    match mode.as_str() {
        "first" => first(&name, &counter),
        "first-tiktoken" => first(&name, &Reference(counter.encoding_kind())),
        "throughput" => throughput(&name, counter, reference(counter.encoding_kind())),
        _ => Err(format!("unknown mode `{mode}`").into()),
    }
}

fn first(name: &str, counter: &dyn TokenCounter) -> Result<(), Box<dyn Error>> {
    let instructions = format!("{DEFAULT_INSTRUCTIONS}{APPLY_PATCH_GUIDANCE}");
    let tools = builtin_tools(&ToolPrefs {
        shell: true,
        plan: true,
        ..ToolPrefs::default()
    });
    let t = Instant::now();
    let n = fixed_prompt_tokens(counter, &instructions, &tools)
        + counter.count_item(&troupe_proto::HistoryItem::user("say hello")) as u64;
    let elapsed = t.elapsed();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or("?", str::trim)
            .to_owned()
    };
    println!(
        "{name} ({}): {n} tokens in {:.2} ms; peak RSS {} (file {}, anon {})",
        counter.encoding(),
        ms(elapsed),
        field("VmHWM:"),
        field("RssFile:"),
        field("RssAnon:"),
    );
    Ok(())
}

fn throughput(
    name: &str,
    counter: TiktokenCounter,
    reference: &CoreBPE,
) -> Result<(), Box<dyn Error>> {
    let text = CORPUS.repeat(100_000_usize.div_ceil(CORPUS.len()));
    let ours = counter.count_fresh(&text);
    let theirs = reference.encode_ordinary(&text).len();
    if ours != theirs {
        return Err(format!("{name}: {ours} tokens, tiktoken-rs {theirs}").into());
    }
    // The best of several rounds, alternating, so a busy machine skews both alike.
    let round = |f: &dyn Fn() -> usize| {
        let runs = 10;
        let t = Instant::now();
        for _ in 0..runs {
            std::hint::black_box(f());
        }
        (text.len() * runs) as f64 / t.elapsed().as_secs_f64() / 1e6
    };
    let (mut ours, mut theirs) = (0.0_f64, 0.0_f64);
    for _ in 0..10 {
        ours = ours.max(round(&|| counter.count_fresh(&text)));
        theirs = theirs.max(round(&|| reference.encode_ordinary(&text).len()));
    }
    println!(
        "{name}: {} bytes, {ours:.2} MB/s (tiktoken-rs {theirs:.2} MB/s)",
        text.len()
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
