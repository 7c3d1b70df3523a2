//! The linker script that puts the code one `troupe chat --once` turn runs at the start of
//! `.text`, written by `build.rs` for release builds from `turn-functions.txt` (the list
//! `scripts/turn-functions` takes from traced turns).
//!
//! Why: the kernel maps a file's pages 64 KiB at a time around each page a process touches
//! (fault-around), so the code a short process keeps resident is set by how the functions it
//! runs are spread over the binary, not by how much of it runs. Left where the compiler puts
//! them, the ~2.5 MB of functions one turn runs touch ~150 of those 64 KiB stretches (about
//! 10 MiB); together they take ~45.
//!
//! Each listed function is named twice. First exactly; then as a pattern in which what the
//! build adds to a Rust symbol name (the hash that ends a legacy name, the crate
//! disambiguators of a v0 name) is `*`. The linker takes each section by the first pattern
//! that matches it, so the exact names lay the listed functions out together, and the
//! patterns still find a function once its hash has changed (a dependency's version, a
//! feature or the compiler changes every hash built on it), along with the other
//! instantiations of a generic function of that name. A name the binary no longer has
//! matches nothing.

/// The sections a function's code is in, by the prefixes LLVM gives them (`.text.unlikely.`
/// for the functions it knows to be cold).
const SECTIONS: [&str; 2] = [".text.", ".text.unlikely."];

/// Whether `name` can stand in a linker-script pattern as it is: the characters of mangled
/// Rust and C symbol names, and none of the script's own (`*?[]()`, spaces, `/*`).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'.'))
}

/// `name` with the parts the build adds replaced by `*`: the `17h<16 hex digits>E` that ends
/// a legacy Rust name; each crate disambiguator `Cs<base-62>_` of a v0 name (`_R...`). A
/// pattern always matches the name it was made from.
pub fn pattern(name: &str) -> String {
    if let Some(stem) = legacy_stem(name) {
        return format!("{stem}17h*E");
    }
    if !name.starts_with("_R") {
        return name.to_owned();
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("Cs") {
        out.push_str(&rest[..at + 2]);
        rest = &rest[at + 2..];
        let digits = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        if rest.as_bytes().get(digits) == Some(&b'_') {
            out.push_str("*_");
            rest = &rest[digits + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// A legacy Rust name without its hash: `_ZN...` ending in `17h` + 16 hex digits + `E`.
fn legacy_stem(name: &str) -> Option<&str> {
    let body = name.strip_prefix("_ZN")?.strip_suffix('E')?;
    let (_, hash) = body.split_at_checked(body.len().checked_sub(19)?)?;
    let hex = hash.strip_prefix("17h")?;
    hex.bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        .then(|| &name[..name.len() - 20])
}

/// The linker script for the list `list`: one function name a line, `#` starting a comment
/// line. Names a pattern cannot hold are left out.
pub fn linker_script(list: &str) -> String {
    let names: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && plain(line))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut patterns: Vec<String> = Vec::with_capacity(2 * names.len());
    for name in &names {
        if seen.insert(name.to_string()) {
            patterns.push(name.to_string());
        }
    }
    for name in &names {
        let glob = pattern(name);
        if seen.insert(glob.clone()) {
            patterns.push(glob);
        }
    }
    let mut script = String::from(
        "/* Written by build.rs from turn-functions.txt: the functions one `troupe chat --once`\n   \
         turn runs first in .text, exactly named, then by name whatever their hash. */\n\
         SECTIONS\n{\n  .text : {\n",
    );
    for pattern in &patterns {
        script.push_str("    *(");
        for (i, prefix) in SECTIONS.iter().enumerate() {
            if i > 0 {
                script.push(' ');
            }
            script.push_str(prefix);
            script.push_str(pattern);
        }
        script.push_str(")\n");
    }
    // The rest of `.text` follows (the linker's default placement), then `.fini`.
    script.push_str("  }\n}\nINSERT BEFORE .fini;\n");
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY: &str = "_ZN5tokio7runtime4task3raw4poll17h0123456789abcdefE";
    const V0: &str = "_RNvMNtCsjrHSEGnQ3l9_3std2io5stdio6Stdout4lockCs1a2B_4core";

    #[test]
    fn a_legacy_name_loses_its_hash() {
        assert_eq!(pattern(LEGACY), "_ZN5tokio7runtime4task3raw4poll17h*E");
    }

    #[test]
    fn a_v0_name_loses_its_crate_disambiguators() {
        assert_eq!(pattern(V0), "_RNvMNtCs*_3std2io5stdio6Stdout4lockCs*_4core");
    }

    #[test]
    fn names_without_a_hash_stay_as_they_are() {
        for name in [
            "sqlite3_step",
            // Not a hash: uppercase, too short, no E.
            "_ZN3foo3bar17h0123456789ABCDEFE",
            "_ZN3foo3bar17h0123E",
            "_ZN3foo3bar17h0123456789abcdef",
        ] {
            assert_eq!(pattern(name), name);
        }
    }

    /// Whether the linker-script glob `pattern` matches `name` (`*` any run of characters).
    fn glob_matches(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head)
                    && (head.len()..=name.len()).any(|at| glob_matches(tail, &name[at..]))
            }
        }
    }

    #[test]
    fn a_pattern_matches_its_name_and_the_name_with_other_hashes() {
        for name in [LEGACY, V0, "sqlite3_step", "_RNvCs_3foo3bar"] {
            assert!(glob_matches(&pattern(name), name), "{name}");
        }
        assert!(glob_matches(
            &pattern(LEGACY),
            "_ZN5tokio7runtime4task3raw4poll17hfedcba9876543210E"
        ));
        assert!(!glob_matches(
            &pattern(LEGACY),
            "_ZN5tokio7runtime4task3raw8shutdown17h0123456789abcdefE"
        ));
        assert!(glob_matches(
            &pattern(V0),
            "_RNvMNtCsZZZ_3std2io5stdio6Stdout4lockCsQ_4core"
        ));
    }

    #[test]
    fn the_script_names_each_function_exactly_then_by_pattern() {
        let list = format!("# a comment\n\n{LEGACY}\nsqlite3_step\n{LEGACY}\n{V0}\n");
        let script = linker_script(&list);
        let lines: Vec<&str> = script
            .lines()
            .filter(|line| line.trim_start().starts_with("*("))
            .collect();
        assert_eq!(
            lines,
            [
                format!("    *(.text.{LEGACY} .text.unlikely.{LEGACY})"),
                "    *(.text.sqlite3_step .text.unlikely.sqlite3_step)".to_owned(),
                format!("    *(.text.{V0} .text.unlikely.{V0})"),
                "    *(.text._ZN5tokio7runtime4task3raw4poll17h*E \
                 .text.unlikely._ZN5tokio7runtime4task3raw4poll17h*E)"
                    .to_owned(),
                "    *(.text._RNvMNtCs*_3std2io5stdio6Stdout4lockCs*_4core \
                 .text.unlikely._RNvMNtCs*_3std2io5stdio6Stdout4lockCs*_4core)"
                    .to_owned(),
            ]
        );
        assert!(script.contains("SECTIONS\n{\n  .text : {\n"));
        assert!(script.ends_with("  }\n}\nINSERT BEFORE .fini;\n"));
    }

    #[test]
    fn names_the_script_cannot_hold_are_left_out() {
        let script = linker_script("a b\nc*d\ne)f\ng/*h\nok_name\n");
        assert_eq!(script.matches("*(").count(), 1);
        assert!(script.contains("*(.text.ok_name .text.unlikely.ok_name)"));
    }
}
