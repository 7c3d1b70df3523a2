//! Where a server's OAuth login is kept: `<dir>/<server>.json`, one file per configured
//! server, readable by its owner only (0600, in a 0700 directory), replaced whole by a rename
//! so a reader never sees half a file. It holds the URL the tokens were issued for (a token is
//! never sent to another URL), the challenge discovery started from, the client (its id, and a
//! secret only when the authorization server issued one at registration) and rmcp's
//! [`StoredCredentials`]. Tokens go nowhere else: not in a rollout, a log line or an event.
//!
//! Refreshes are serialised across processes by an advisory lock on `<server>.lock` (rmcp
//! holds it from reading the refresh token to saving its successor), so two troupe processes
//! sharing a data directory never spend the same refresh token twice.

use super::TokenSnapshot;
use async_trait::async_trait;
use oauth2::TokenResponse;
use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore, StoredCredentials,
};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use troupe_actors::ports::McpOAuthGrant;

/// One server's login, as kept on disk.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoredLogin {
    /// The server URL the tokens were issued for.
    pub url: String,
    pub grant: McpOAuthGrant,
    /// The `WWW-Authenticate` challenge discovery started from (it may name the protected
    /// resource metadata); replayed at each connect so discovery ends where the login did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// The redirect URI the authorization code was issued for (a refresh does not send it,
    /// but rmcp's client wants one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_uri: Option<String>,
    /// A secret the authorization server issued when troupe registered itself (RFC 7591);
    /// a configured secret stays in its environment variable and is never written here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_client_secret: Option<String>,
    /// Scopes the server asked for (403 `insufficient_scope`) that the token lacks: the next
    /// `troupe mcp login` asks for them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wanted_scopes: Vec<String>,
    /// The client, the tokens and the scopes granted (rmcp's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<StoredCredentials>,
}

// By hand: the secret and the tokens never reach a log line.
impl std::fmt::Debug for StoredLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredLogin")
            .field("url", &self.url)
            .field("grant", &self.grant)
            .field("challenge", &self.challenge)
            .field("redirect_uri", &self.redirect_uri)
            .field(
                "registered_client_secret",
                &self.registered_client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl StoredLogin {
    /// A record for `url` without credentials yet.
    pub fn new(url: &str, grant: McpOAuthGrant) -> Self {
        Self {
            url: url.to_owned(),
            grant,
            challenge: None,
            redirect_uri: None,
            registered_client_secret: None,
            wanted_scopes: Vec::new(),
            credentials: None,
        }
    }

    /// Adds the scopes of a 403 challenge's `scope` (space-separated) to `wanted_scopes`;
    /// `true` if one was new.
    pub fn want(&mut self, scope: &str) -> bool {
        let mut added = false;
        for s in scope.split_whitespace() {
            if !self.wanted_scopes.iter().any(|w| w == s) {
                self.wanted_scopes.push(s.to_owned());
                added = true;
            }
        }
        added
    }

    /// Whether this login's tokens may be sent to `url` by a connection of `grant` (and of
    /// `client_id`, when the connection knows its client): a token is never sent to another
    /// URL, nor used by another grant or client. Checked at every read, since another
    /// process sharing the data directory may have replaced the file since the connection
    /// opened.
    pub fn is_for(&self, url: &str, grant: McpOAuthGrant, client_id: Option<&str>) -> bool {
        self.url == url
            && self.grant == grant
            && client_id
                .is_none_or(|id| self.credentials.as_ref().is_none_or(|c| c.client_id == id))
    }

    /// What the tokens look like, without the secrets.
    pub fn snapshot(&self) -> Option<TokenSnapshot> {
        let credentials = self.credentials.as_ref()?;
        let token = credentials.token_response.as_ref()?;
        Some(TokenSnapshot {
            client_id: credentials.client_id.clone(),
            access_token: token.access_token().secret().clone(),
            received_at: credentials.token_received_at,
            expires_in: token.expires_in(),
            has_refresh_token: token.refresh_token().is_some(),
            scopes: credentials.granted_scopes.clone(),
        })
    }
}

/// Where logins are kept: files under a directory, or memory (a connector given no data
/// directory; nothing outlives the process).
#[derive(Clone)]
pub enum TokenStore {
    File { path: PathBuf, lock: PathBuf },
    Memory(Arc<Mutex<Option<StoredLogin>>>),
}

impl std::fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File { path, .. } => write!(f, "TokenStore({})", path.display()),
            Self::Memory(_) => f.write_str("TokenStore(memory)"),
        }
    }
}

impl TokenStore {
    /// `<dir>/<server>.json` (server names are `[a-zA-Z0-9_-]+`: safe file names).
    pub fn file(dir: &Path, server: &str) -> Self {
        Self::File {
            path: dir.join(format!("{server}.json")),
            lock: dir.join(format!("{server}.lock")),
        }
    }

    pub fn memory() -> Self {
        Self::Memory(Arc::default())
    }

    /// The file, when there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::File { path, .. } => Some(path),
            Self::Memory(_) => None,
        }
    }

    /// The login kept, if any. A file that cannot be parsed is an error, not "no login":
    /// overwriting it could lose a refresh token.
    pub fn read(&self) -> Result<Option<StoredLogin>, String> {
        match self {
            Self::Memory(slot) => Ok(lock(slot).clone()),
            Self::File { path, .. } => match std::fs::read(path) {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| format!("{} is unreadable: {e}", path.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("cannot read {}: {e}", path.display())),
            },
        }
    }

    /// Replaces the login kept.
    pub fn write(&self, login: &StoredLogin) -> Result<(), String> {
        match self {
            Self::Memory(slot) => {
                *lock(slot) = Some(login.clone());
                Ok(())
            }
            Self::File { path, .. } => write_private(path, login),
        }
    }

    /// Forgets the login; `true` if there was one.
    pub fn remove(&self) -> Result<bool, String> {
        match self {
            Self::Memory(slot) => Ok(lock(slot).take().is_some()),
            Self::File { path, lock } => {
                let _ = std::fs::remove_file(lock);
                match std::fs::remove_file(path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `value` as JSON to `path` with mode 0600, through a temporary file and a rename,
/// creating the directory (0700) when needed.
fn write_private(path: &Path, value: &StoredLogin) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{} has no directory", path.display()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| format!("cannot encode: {e}"))?;
    // One name per write, not per process: two sessions of one process renewing together
    // must not write into the same temporary file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("json.{}.{n}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// rmcp's view of one server's login: loads and saves the credentials inside the record,
/// keeping the rest of it (`base`) as this connection knows it.
pub(crate) struct CredentialFile {
    pub(crate) store: TokenStore,
    pub(crate) base: StoredLogin,
}

#[async_trait]
impl CredentialStore for CredentialFile {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.store
            .read()
            .map(|login| {
                login
                    .filter(|l| l.url == self.base.url)
                    .and_then(|l| l.credentials)
            })
            .map_err(AuthError::CredentialStoreError)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        // What was written since (the scopes a server asked for) stays.
        let mut login = self
            .store
            .read()
            .ok()
            .flatten()
            .filter(|l| l.url == self.base.url && l.grant == self.base.grant)
            .unwrap_or_else(|| self.base.clone());
        login.credentials = Some(credentials);
        self.store
            .write(&login)
            .map_err(AuthError::CredentialStoreError)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.store
            .write(&self.base)
            .map_err(AuthError::CredentialStoreError)
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let TokenStore::File { lock: path, .. } = &self.store else {
            return Ok(None);
        };
        let path = path.clone();
        let file = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            if let Some(dir) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)?;
            // Released when the file is closed, with the guard.
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?
        .map_err(|e| AuthError::CredentialStoreError(format!("cannot lock the token file: {e}")))?;
        Ok(Some(CredentialRefreshGuard::new(file)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_login_is_for_its_url_grant_and_client_only() {
        let url = "https://prod.example/mcp";
        let mut login = StoredLogin::new(url, McpOAuthGrant::ClientCredentials);
        assert!(login.is_for(url, McpOAuthGrant::ClientCredentials, Some("a")));
        assert!(!login.is_for(
            "https://staging.example/mcp",
            McpOAuthGrant::ClientCredentials,
            None
        ));
        assert!(!login.is_for(url, McpOAuthGrant::AuthorizationCode, None));
        login.credentials = Some(StoredCredentials::new("a".into(), None, Vec::new(), None));
        assert!(login.is_for(url, McpOAuthGrant::ClientCredentials, Some("a")));
        assert!(login.is_for(url, McpOAuthGrant::ClientCredentials, None));
        assert!(!login.is_for(url, McpOAuthGrant::ClientCredentials, Some("b")));
    }

    #[test]
    fn writes_of_one_process_at_once_leave_a_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::file(&dir.path().join("mcp-auth"), "remote");
        std::thread::scope(|s| {
            for i in 0..8 {
                let store = store.clone();
                s.spawn(move || {
                    for j in 0..20 {
                        let mut login = StoredLogin::new(
                            &format!("http://127.0.0.1:1/mcp/{i}/{j}"),
                            McpOAuthGrant::AuthorizationCode,
                        );
                        login.want(&"scope ".repeat(i * 50 + j));
                        store.write(&login).unwrap();
                    }
                });
            }
        });
        assert!(store.read().unwrap().is_some());
        let left: Vec<_> = std::fs::read_dir(dir.path().join("mcp-auth"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn a_file_store_writes_owner_only_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::file(&dir.path().join("mcp-auth"), "remote");
        assert!(store.read().unwrap().is_none());
        let mut login =
            StoredLogin::new("http://127.0.0.1:1/mcp", McpOAuthGrant::AuthorizationCode);
        login.registered_client_secret = Some("s3cret".into());
        store.write(&login).unwrap();
        let path = store.path().unwrap();
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        let back = store.read().unwrap().unwrap();
        assert_eq!(back.url, login.url);
        assert!(!format!("{back:?}").contains("s3cret"));
        assert!(store.remove().unwrap());
        assert!(!store.remove().unwrap());
        assert!(store.read().unwrap().is_none());
    }

    #[test]
    fn scopes_a_server_asks_for_are_noted_once() {
        let mut login = StoredLogin::new("http://a/mcp", McpOAuthGrant::AuthorizationCode);
        assert!(login.want("mcp:basic mcp:write"));
        assert!(!login.want("mcp:write"));
        assert!(login.want("mcp:admin"));
        assert_eq!(login.wanted_scopes, ["mcp:basic", "mcp:write", "mcp:admin"]);
    }

    #[test]
    fn an_unreadable_file_is_an_error_not_an_absent_login() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::file(dir.path(), "remote");
        std::fs::write(store.path().unwrap(), "{not json").unwrap();
        assert!(store.read().unwrap_err().contains("unreadable"));
    }

    #[tokio::test]
    async fn credentials_of_another_url_are_not_loaded() {
        let store = TokenStore::memory();
        let mut login = StoredLogin::new("http://a/mcp", McpOAuthGrant::AuthorizationCode);
        login.credentials = Some(StoredCredentials::new("c".into(), None, vec![], None));
        store.write(&login).unwrap();
        let same = CredentialFile {
            store: store.clone(),
            base: StoredLogin::new("http://a/mcp", McpOAuthGrant::AuthorizationCode),
        };
        assert!(same.load().await.unwrap().is_some());
        let other = CredentialFile {
            store,
            base: StoredLogin::new("http://b/mcp", McpOAuthGrant::AuthorizationCode),
        };
        assert!(other.load().await.unwrap().is_none());
    }
}
