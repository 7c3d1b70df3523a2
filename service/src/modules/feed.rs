//! An input gateway's feeder: its messages, one at a time and in order, into sessions,
//! through the API's own path ([`SessionsApi::send_tracked`]: admission, storage, the
//! durable queue). Each message is acknowledged to the module once stored (or refused with
//! why). The stored message keeps its origin in its metadata (`module`: the module's id and
//! its id for the message), so its reply is routed when its task ends, also when that is
//! after a restart, without holding up the next message.
//!
//! Where a message goes: `session` names a session; without one, the current session of the
//! module's project (created and made current on first use). `conversation` names a
//! conversation of that session by id, or by any other string: a key the feeder maps to a
//! conversation it opens on first use (for the life of the process, at most [`MAX_KEYS`] keys,
//! the least recently used forgotten first; after a restart the reply's `conversation` id
//! continues it). Without one: the session's root conversation.
//!
//! A module writes only to its project's sessions (`session` naming another project's is
//! not found). A conversation troupe chose for it (a key's, or the project session's root)
//! that was closed is opened again; one that cannot be (its session is gone) is replaced,
//! by a new conversation or a new current session of the project.

use super::frame::{self, InputMessage, ReplyOrigin};
use super::{Modules, metrics};
use crate::api::CreateSession;
use crate::auth::Scope;
use crate::sessions_api::SessionsApi;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::Instrument;
use troupe_proto::{AgentError, ConversationId, OpenConversation, SessionId};
use troupe_runtime::modules::ModuleDefinition;

/// Feeds `module`'s messages until its gateway stops.
pub async fn run(
    modules: Modules,
    sessions: SessionsApi,
    module: Arc<ModuleDefinition>,
    mut messages: mpsc::Receiver<InputMessage>,
) {
    let mut feeder = Feeder::new(sessions, module, MAX_KEYS);
    while let Some(message) = messages.recv().await {
        let span = tracing::info_span!("troupe.module.message", module = %feeder.module.id, session_id = tracing::field::Empty, conversation_id = tracing::field::Empty);
        let id = message.id.clone();
        match feeder.take(message).instrument(span.clone()).await {
            // Its reply is routed from the stored message's metadata when its task ends
            // (the session host hands it to [`Modules::route_reply_later`]).
            Ok((session, conversation, message_id)) => {
                span.record("session_id", tracing::field::display(session));
                span.record("conversation_id", tracing::field::display(conversation));
                metrics::message(&feeder.module, "accepted");
                let ack = frame::accepted(id.as_deref(), session, conversation, message_id);
                modules.tell(&feeder.module.id, ack).await;
            }
            Err(error) => {
                metrics::message(&feeder.module, "refused");
                tracing::info!(module = %feeder.module.id, %error, "a module's message was refused");
                let refused = frame::refused_error(id.as_deref(), &error);
                modules.tell(&feeder.module.id, refused).await;
            }
        }
    }
}

/// At most this many conversation keys are remembered per module; past it, the least
/// recently used one is forgotten (its next message opens a new conversation).
pub const MAX_KEYS: usize = 1024;

struct Feeder {
    sessions: SessionsApi,
    module: Arc<ModuleDefinition>,
    /// What it may write to: its project's sessions only.
    scope: Scope,
    /// Conversations opened for keys, by session and key.
    keys: KeyMap,
}

/// Where a message goes, before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The session the module named, and the conversation id it named (if any).
    Named(SessionId, Option<ConversationId>),
    /// The project's session's root conversation.
    ProjectRoot(SessionId),
    /// The conversation opened for a key.
    Key(SessionId, ConversationId),
}

impl Feeder {
    fn new(sessions: SessionsApi, module: Arc<ModuleDefinition>, max_keys: usize) -> Self {
        Self {
            sessions,
            scope: Scope::projects([module.project()]),
            module,
            keys: KeyMap::new(max_keys),
        }
    }

    /// Stores the message in its conversation: where it went and its id. A conversation
    /// troupe chose that is closed (or a project session that is gone) is opened again, once.
    async fn take(
        &mut self,
        message: InputMessage,
    ) -> Result<(SessionId, ConversationId, u64), AgentError> {
        let origin = ReplyOrigin::metadata(&self.module.id, message.id.as_deref());
        let target = self.target(&message).await?;
        match self.send(target, &message.text, &origin).await {
            Err(AgentError::NotFound { .. }) if !matches!(target, Target::Named(..)) => {
                let target = self.reopen(target, &message).await?;
                self.send(target, &message.text, &origin).await
            }
            sent => sent,
        }
    }

    async fn send(
        &self,
        target: Target,
        text: &str,
        origin: &serde_json::Value,
    ) -> Result<(SessionId, ConversationId, u64), AgentError> {
        let (session, conversation) = match target {
            Target::Named(s, c) => (s, c),
            Target::ProjectRoot(s) => (s, None),
            Target::Key(s, c) => (s, Some(c)),
        };
        let (stored, _end) = self
            .sessions
            .send_tracked(
                self.scope.clone(),
                session,
                conversation,
                text.to_owned(),
                Some(origin.clone()),
            )
            .await?;
        Ok((session, stored.conversation_id, stored.message_id))
    }

    async fn target(&mut self, message: &InputMessage) -> Result<Target, AgentError> {
        let (session, named) = match &message.session {
            Some(s) => (
                s.parse::<SessionId>().map_err(|_| {
                    AgentError::invalid(format!("`session` must be a session id, not `{s}`"))
                })?,
                true,
            ),
            None => (self.project_session().await?, false),
        };
        Ok(match message.conversation.as_deref() {
            Some(c) => match c.parse::<ConversationId>() {
                Ok(id) => Target::Named(session, Some(id)),
                Err(_) => Target::Key(session, self.conversation(session, c).await?),
            },
            None if named => Target::Named(session, None),
            None => Target::ProjectRoot(session),
        })
    }

    /// `target` was not found (closed, or its session gone): the key's conversation is
    /// opened again under its id, or a new one replaces it; the project's session's root is
    /// opened again, or a new session replaces it as the project's current one.
    async fn reopen(
        &mut self,
        target: Target,
        message: &InputMessage,
    ) -> Result<Target, AgentError> {
        match target {
            Target::Named(..) => Ok(target),
            Target::Key(session, conversation) => {
                let reopened = self
                    .sessions
                    .reopen(self.scope.clone(), session, conversation)
                    .await;
                if reopened.is_ok() {
                    return Ok(target);
                }
                let key = message.conversation.clone().unwrap_or_default();
                self.keys.remove(&(session, key.clone()));
                match self.conversation(session, &key).await {
                    Ok(id) => Ok(Target::Key(session, id)),
                    // Its session is gone: when it was the project's, a new one replaces it.
                    Err(AgentError::NotFound { .. }) if message.session.is_none() => {
                        let session = self.project_session_renewed(session).await?;
                        Ok(Target::Key(
                            session,
                            self.conversation(session, &key).await?,
                        ))
                    }
                    Err(e) => Err(e),
                }
            }
            Target::ProjectRoot(session) => {
                let root = self
                    .sessions
                    .get(self.scope.clone(), session)
                    .await
                    .map(|r| r.root_conversation_id);
                if let Ok(root) = root
                    && self
                        .sessions
                        .reopen(self.scope.clone(), session, root)
                        .await
                        .is_ok()
                {
                    return Ok(target);
                }
                Ok(Target::ProjectRoot(
                    self.project_session_renewed(session).await?,
                ))
            }
        }
    }

    /// The project's session again; when that is still `gone`, a new one.
    async fn project_session_renewed(&mut self, gone: SessionId) -> Result<SessionId, AgentError> {
        let id = self.project_session().await?;
        if id != gone {
            return Ok(id);
        }
        self.create_project_session().await
    }

    /// The project's current session, read for each message, so that a session made current
    /// meanwhile (the console's **Make current**, `PUT .../current-session`) takes the next
    /// one; none yet: a new one.
    async fn project_session(&mut self) -> Result<SessionId, AgentError> {
        let project = self.module.project().to_owned();
        let id = match self.sessions.current(self.scope.clone(), project).await {
            Ok(record) => record.session_id,
            Err(AgentError::NotFound { .. }) => self.create_project_session().await?,
            Err(e) => return Err(e),
        };
        Ok(id)
    }

    /// A new session of the module's project, made its current one.
    async fn create_project_session(&self) -> Result<SessionId, AgentError> {
        let project = self.module.project().to_owned();
        let record = self
            .sessions
            .create(
                self.scope.clone(),
                CreateSession {
                    project_id: Some(project.clone()),
                    title: Some(format!("module {}", self.module.id)),
                    settings: None,
                    root: None,
                },
            )
            .await?;
        self.sessions
            .set_current(self.scope.clone(), project.clone(), record.session_id)
            .await?;
        tracing::info!(module = %self.module.id, session_id = %record.session_id, %project, "created the module's session");
        Ok(record.session_id)
    }

    /// The conversation opened for `key` in `session` (opened now on first use).
    async fn conversation(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<ConversationId, AgentError> {
        if let Some(id) = self.keys.get(&(session, key.to_owned())) {
            return Ok(id);
        }
        let id = self
            .sessions
            .open(self.scope.clone(), session, OpenConversation::default())
            .await?;
        self.keys.insert((session, key.to_owned()), id);
        Ok(id)
    }
}

/// The conversations opened for keys, at most `max` of them: past it, the least recently
/// used is forgotten.
#[derive(Debug)]
struct KeyMap {
    max: usize,
    tick: u64,
    map: HashMap<(SessionId, String), (ConversationId, u64)>,
}

impl KeyMap {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            tick: 0,
            map: HashMap::new(),
        }
    }

    fn get(&mut self, key: &(SessionId, String)) -> Option<ConversationId> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|(id, used)| {
            *used = tick;
            *id
        })
    }

    fn insert(&mut self, key: (SessionId, String), id: ConversationId) {
        self.tick += 1;
        if self.map.len() >= self.max && !self.map.contains_key(&key) {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(key, (id, self.tick));
    }

    fn remove(&mut self, key: &(SessionId, String)) {
        self.map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Service;
    use troupe_runtime::config::TroupeConfig;

    async fn service(dir: &std::path::Path) -> Service {
        let config = TroupeConfig {
            data_dir: dir.to_owned(),
            ..TroupeConfig::default()
        };
        let ports = troupe_runtime::assembly::session_ports(
            &config,
            Arc::new(troupe_runtime::ScriptedModel::default()),
            Arc::new(troupe_actors::ports::ApproxTokens),
        );
        let store = Arc::new(troupe_store::memory::MemoryStore::new());
        Service::start(&config, store, ports, None).await.unwrap()
    }

    fn feeder(service: &Service) -> Feeder {
        let module: ModuleDefinition = serde_json::from_str(
            r#"{"id":"bridge","direction":"duplex","protocol":"stdio","command":"x","project":"alpha"}"#,
        )
        .unwrap();
        Feeder::new(service.sessions.clone(), Arc::new(module), MAX_KEYS)
    }

    fn message(session: Option<SessionId>, conversation: Option<&str>) -> InputMessage {
        InputMessage {
            id: Some("m".into()),
            session: session.map(|s| s.to_string()),
            conversation: conversation.map(str::to_owned),
            text: "hello".into(),
        }
    }

    #[tokio::test]
    async fn a_module_writes_only_to_its_projects_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(dir.path()).await;
        let mut feeder = feeder(&service);
        let sessions = &service.sessions;
        let other = sessions
            .create(
                Scope::All,
                CreateSession {
                    project_id: Some("beta".into()),
                    title: None,
                    settings: None,
                    root: None,
                },
            )
            .await
            .unwrap();
        let refused = feeder
            .take(message(Some(other.session_id), None))
            .await
            .unwrap_err();
        assert!(matches!(refused, AgentError::NotFound { .. }), "{refused}");
        let page = sessions
            .messages(Scope::All, other.session_id, 10, None)
            .await
            .unwrap();
        assert!(page.messages.is_empty(), "{page:?}");
        // Its own project's session takes it, with where it came from in its metadata.
        let (session, _, message_id) = feeder.take(message(None, None)).await.unwrap();
        let record = sessions.get(Scope::All, session).await.unwrap();
        assert_eq!(record.project_id.as_deref(), Some("alpha"));
        let stored = sessions
            .message(Scope::All, session, message_id)
            .await
            .unwrap();
        assert_eq!(
            stored.metadata.unwrap().0["module"],
            serde_json::json!({"id": "bridge", "in_reply_to": "m"})
        );
        // Named by id, it is still its project's.
        let (again, _, _) = feeder.take(message(Some(session), None)).await.unwrap();
        assert_eq!(again, session);
        service.shutdown().await;
    }

    #[tokio::test]
    async fn a_closed_conversation_is_opened_again_instead_of_refusing_every_message() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(dir.path()).await;
        let mut feeder = feeder(&service);
        let sessions = &service.sessions;
        let (session, keyed, _) = feeder.take(message(None, Some("chan"))).await.unwrap();
        sessions.close(Scope::All, session, keyed).await.unwrap();
        let (s, c, _) = feeder.take(message(None, Some("chan"))).await.unwrap();
        assert_eq!(s, session);
        let open = sessions.conversations(Scope::All, session).await.unwrap();
        assert!(
            open.iter().any(|r| r.conversation_id == c
                && r.state == troupe_proto::store::ConversationState::Open),
            "the message went to an open conversation"
        );
        // The project session's root conversation, closed, is opened again too.
        let (_, root, _) = feeder.take(message(None, None)).await.unwrap();
        sessions.close(Scope::All, session, root).await.unwrap();
        let (s, c, _) = feeder.take(message(None, None)).await.unwrap();
        assert_eq!((s, c), (session, root));
        service.shutdown().await;
    }

    #[test]
    fn the_key_map_forgets_the_least_recently_used_key() {
        let s = SessionId::new();
        let key = |k: &str| (s, k.to_owned());
        let (a, b, c) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let mut keys = KeyMap::new(2);
        keys.insert(key("a"), a);
        keys.insert(key("b"), b);
        assert_eq!(keys.get(&key("a")), Some(a));
        keys.insert(key("c"), c);
        assert_eq!(keys.map.len(), 2);
        assert_eq!(keys.get(&key("b")), None, "b was the least recently used");
        assert_eq!(keys.get(&key("a")), Some(a));
        assert_eq!(keys.get(&key("c")), Some(c));
        keys.insert(key("c"), a);
        assert_eq!(keys.map.len(), 2);
        keys.remove(&key("c"));
        assert_eq!(keys.get(&key("c")), None);
    }
}
