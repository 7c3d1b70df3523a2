//! Compiles the mergeable ranks of each OpenAI encoding into flat tables in `OUT_DIR`, which
//! `src/tokens/bpe.rs` embeds with `include_bytes!`. Building tiktoken's hash maps at run time
//! costs 85–215 ms and 30–55 MiB per process; reading these tables costs nothing up front.
//! The layout is described in `src/tokens/layout.rs`.
//!
//! It also writes the Unicode character classes the split patterns use (`\p{L}`, `\s`, ...)
//! as one range table, taken from regex-syntax, the crate whose tables tiktoken's regex
//! engine matches with; `src/tokens/split.rs` splits text with it, no regex engine needed.

use std::error::Error;
use std::path::Path;
use tiktoken_rs::CoreBPE;

#[path = "src/tokens/layout.rs"]
#[allow(dead_code)] // the reader's side is used by src/tokens/bpe.rs
mod layout;

type BoxResult<T> = Result<T, Box<dyn Error + Send + Sync>>;
type Loader = fn() -> BoxResult<CoreBPE>;

const ENCODINGS: [(&str, Loader); 4] = [
    ("cl100k_base", || Ok(tiktoken_rs::cl100k_base()?)),
    ("o200k_base", || Ok(tiktoken_rs::o200k_base()?)),
    ("p50k_base", || Ok(tiktoken_rs::p50k_base()?)),
    ("r50k_base", || Ok(tiktoken_rs::r50k_base()?)),
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/tokens/layout.rs");
    let out_dir = std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?;
    let out_dir = Path::new(&out_dir);
    write_char_classes(out_dir)?;
    // One thread per encoding: loading o200k alone takes a few seconds unoptimised.
    std::thread::scope(|scope| {
        let jobs: Vec<_> = ENCODINGS
            .iter()
            .map(|&(name, load)| scope.spawn(move || write_table(out_dir, name, load)))
            .collect();
        for job in jobs {
            job.join()
                .map_err(|_| "a table-writing thread panicked")?
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

fn write_table(out_dir: &Path, name: &str, load: Loader) -> BoxResult<()> {
    let bpe = load()?;
    let mut tokens = ordinary_tokens(&bpe)?;
    if tokens.iter().filter(|(t, _)| t.len() == 1).count() != 256 {
        return Err(format!("{name}: not every single byte is a token").into());
    }
    if let Some((_, rank)) = tokens
        .iter()
        .find(|(t, rank)| *rank > layout::MAX_RANK || t.len() > layout::MAX_LEN)
    {
        return Err(format!("{name}: rank {rank} does not fit a header").into());
    }

    let buckets = layout::bucket_count(tokens.len());
    let bucket_of = |token: &[u8]| layout::bucket(layout::hash(token), buckets);
    tokens.sort_unstable_by_key(|(token, rank)| (bucket_of(token), *rank));
    let mut records = Vec::new();
    let mut starts = Vec::with_capacity(4 * (buckets + 1));
    let mut next = 0;
    for (token, rank) in &tokens {
        let bucket = bucket_of(token);
        while next <= bucket {
            starts.extend_from_slice(&u32::try_from(records.len())?.to_le_bytes());
            next += 1;
        }
        let header = layout::header(*rank, token.len(), layout::hash(token));
        records.extend_from_slice(&header.to_le_bytes());
        records.extend_from_slice(token);
    }
    while next <= buckets {
        starts.extend_from_slice(&u32::try_from(records.len())?.to_le_bytes());
        next += 1;
    }
    tokens.sort_unstable();
    if let Some(w) = tokens.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("{name}: ranks {} and {} share their bytes", w[0].1, w[1].1).into());
    }

    std::fs::write(out_dir.join(format!("{name}.records")), records)?;
    std::fs::write(out_dir.join(format!("{name}.buckets")), starts)?;
    Ok(())
}

/// Every (bytes, rank) of the encoding's mergeable ranks, special tokens left out. The ranks
/// are read through the public API: decode each rank in turn. Ranks have gaps and p50k_base
/// has ordinary ranks above its special token, so the scan runs well past both.
fn ordinary_tokens(bpe: &CoreBPE) -> BoxResult<Vec<(Vec<u8>, u32)>> {
    let special: Vec<u32> = bpe
        .special_tokens()
        .into_iter()
        .flat_map(|s| bpe.encode_with_special_tokens(s))
        .collect();
    let top = special.iter().copied().max().ok_or("no special tokens")?;
    let mut tokens = Vec::new();
    let mut last_found = 0;
    let mut rank = 0;
    while rank <= top || rank - last_found <= 4096 {
        if !special.contains(&rank)
            && let Ok(bytes) = bpe.decode_bytes(&[rank])
        {
            tokens.push((bytes, rank));
            last_found = rank;
        }
        rank += 1;
    }
    Ok(tokens)
}

/// The classes of `src/tokens/split.rs`, as bits, in the order of its `Set` constants; every
/// character is in exactly one.
const CLASSES: [&str; 8] = [
    // OTHER: what no other class holds.
    "",
    r"[\p{Lu}\p{Lt}]",
    r"\p{Ll}",
    r"[\p{Lm}\p{Lo}]",
    r"\p{M}",
    r"\p{N}",
    r"[\s&&[^\r\n]]",
    r"[\r\n]",
];

/// `char_classes.rs`: `CHAR_CLASSES`, sorted u32s `start << 8 | class bit`, each the first
/// character of a run of characters of that one class (runs of one class merged).
fn write_char_classes(out_dir: &Path) -> Result<(), Box<dyn Error>> {
    let mut class_of = vec![0_u8; 0x11_0000];
    for (bit, pattern) in CLASSES.iter().enumerate().skip(1) {
        let hir = regex_syntax::Parser::new().parse(pattern)?;
        let regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(class)) =
            hir.kind()
        else {
            return Err(format!("{pattern} is not a Unicode class").into());
        };
        for range in class.ranges() {
            for c in u32::from(range.start())..=u32::from(range.end()) {
                let slot = &mut class_of[c as usize];
                if *slot != 0 {
                    return Err(format!("U+{c:04X} is in two classes").into());
                }
                *slot = 1 << bit;
            }
        }
    }
    let mut runs = Vec::new();
    for (c, &class) in class_of.iter().enumerate() {
        let class = if class == 0 { 1 } else { class };
        if runs.last().is_none_or(|&(_, last)| last != class) {
            runs.push((c, class));
        }
    }
    let mut source = format!("pub(super) const CHAR_CLASSES: [u32; {}] = [\n", runs.len());
    for (start, class) in runs {
        source.push_str(&format!("    0x{start:06x}{class:02x},\n"));
    }
    source.push_str("];\n");
    std::fs::write(out_dir.join("char_classes.rs"), source)?;
    Ok(())
}
