//! Link options of the `troupe` executable, chosen for what a short-lived process of it keeps
//! resident (a `troupe chat --once` turn): mostly the binary's own pages, which the kernel
//! maps 64 KiB or more at a time around each page the process touches. Native x86_64 Linux
//! (glibc) builds only; elsewhere the executable links as Rust links it by default.
//!
//! - `-z pack-relative-relocs` (when the C library is glibc 2.36 or later, the first that
//!   reads them): the executable is position-independent, so every pointer in its data is
//!   adjusted by the dynamic loader at start. As classic RELA entries those adjustments take
//!   ~700 KB of the file, all read at every start; packed (RELR) they take ~8 KB. The binary
//!   then needs glibc 2.36 or later to start (the loader says so if it is older).
//! - Release builds, with the linker Rust uses by default (rust-lld): the functions one turn
//!   runs first in `.text` (`src/turn_code.rs`, from the list `turn-functions.txt`). Skipped
//!   when the build chooses its own linker (`-C linker`, `-fuse-ld`), which may not take a
//!   linker script.

use std::error::Error;
use std::path::Path;
use std::process::Command;

#[path = "src/turn_code.rs"]
mod turn_code;

const LIST: &str = "turn-functions.txt";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/turn_code.rs");
    println!("cargo::rerun-if-changed={LIST}");
    println!("cargo::rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let target = var("TARGET");
    if target != "x86_64-unknown-linux-gnu" || var("HOST") != target {
        return Ok(());
    }
    if glibc_reads_relr() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let own_linker = var("CARGO_ENCODED_RUSTFLAGS")
        .split('\x1f')
        .any(|flag| flag.contains("linker") || flag.contains("fuse-ld"))
        || !var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_empty();
    if var("PROFILE") == "release" && !own_linker {
        let list = Path::new(&var("CARGO_MANIFEST_DIR")).join(LIST);
        let list = std::fs::read_to_string(&list)
            .map_err(|e| format!("cannot read {}: {e}", list.display()))?;
        let script = Path::new(&var("OUT_DIR")).join("turn-code.ld");
        std::fs::write(&script, turn_code::linker_script(&list))?;
        println!("cargo::rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
    Ok(())
}

/// Whether this machine's glibc is 2.36 or later (`getconf GNU_LIBC_VERSION`: `glibc 2.36`);
/// no when it cannot tell.
fn glibc_reads_relr() -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 36),
        _ => false,
    }
}
