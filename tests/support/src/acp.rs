//! The external ACP agent of the tests and benchmarks: codex-acp, installed by
//! `scripts/install-acp-agents`, pointed at a [`ModelServer`](crate::ModelServer) through its
//! own `CODEX_HOME`.

use std::path::{Path, PathBuf};

/// codex-acp's Linux binary. Panics, naming the install script, when missing.
pub fn codex_acp_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or(Path::new("."));
    let bin =
        root.join(".tools/acp/node_modules/@zed-industries/codex-acp-linux-x64/bin/codex-acp");
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/install-acp-agents",
        bin.display()
    );
    bin
}

/// The environment variable the configuration names for the (unused) API key.
pub const CODEX_KEY_ENV: &str = "MOCK_API_KEY";

/// Writes `config.toml` into `codex_home`: the model server at `base_url` (Responses wire),
/// no retries, the given approval policy (`never`, or `untrusted` to be asked about
/// commands), no sandbox. Returns the environment to start codex-acp with.
pub fn write_codex_home(
    codex_home: &Path,
    base_url: &str,
    approval_policy: &str,
) -> std::io::Result<Vec<(String, String)>> {
    std::fs::create_dir_all(codex_home)?;
    let config = format!(
        "model = \"gpt-5.4-mini\"\n\
         model_provider = \"mock\"\n\
         approval_policy = \"{approval_policy}\"\n\
         sandbox_mode = \"danger-full-access\"\n\
         [model_providers.mock]\n\
         name = \"local\"\n\
         base_url = \"{base_url}\"\n\
         wire_api = \"responses\"\n\
         env_key = \"{CODEX_KEY_ENV}\"\n\
         request_max_retries = 0\n\
         stream_max_retries = 0\n"
    );
    std::fs::write(codex_home.join("config.toml"), config)?;
    Ok(vec![
        ("CODEX_HOME".into(), codex_home.display().to_string()),
        (CODEX_KEY_ENV.into(), "test-key".into()),
    ])
}
