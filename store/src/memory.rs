//! `MemoryStore`: the [`Store`] kept in memory, for `troupe serve --ephemeral` and tests.
//! It keeps every rule of the trait except surviving the process.
//!
//! One lock around the whole state: every operation is a few map operations, never awaits
//! while holding it, and the service's writes are already serialised by its registry.

use super::{Store, page};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
    ConversationRecord, ConversationState, FinishMessage, FinishedMessage, MessagePage,
    MessageRecord, MessageStatus, NewMessage, SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, ConversationId, Role, SessionId, StoragePolicy};

/// What the store holds.
#[derive(Debug, Default)]
struct Data {
    /// Sessions in creation order (the index into `order`).
    sessions: HashMap<SessionId, SessionRecord>,
    order: Vec<SessionId>,
    conversations: BTreeMap<ConversationId, ConversationRecord>,
    /// Every message by id; ids are assigned in increasing order.
    messages: BTreeMap<u64, MessageRecord>,
    /// Ttl: when each message's content is due, by message id (content under `Ttl` only).
    expires: BTreeMap<u64, u64>,
    next_message_id: u64,
    current: HashMap<String, SessionId>,
    a2a: crate::memory_a2a::A2aData,
    /// Agent bindings by (session, agent): ordered as `bindings` lists them.
    bindings: BTreeMap<(SessionId, String), troupe_proto::agent::AgentBinding>,
    /// Authorization tokens by id.
    tokens: BTreeMap<String, troupe_proto::governance::AuthToken>,
}

impl Data {
    /// Moves a session's `updated_ms` to the later of `at_ms` and now, never back.
    fn touch(&mut self, session_id: SessionId, at_ms: u64) {
        if let Some(s) = self.sessions.get_mut(&session_id) {
            let at = at_ms.max(troupe_actors::clock::unix_now_ms());
            s.updated_ms = s.updated_ms.max(s.created_ms).max(at);
        }
    }

    fn append(&mut self, message: NewMessage) -> Result<MessageRecord, AgentError> {
        if !self.sessions.contains_key(&message.session_id) {
            return Err(AgentError::not_found("session", message.session_id));
        }
        let policy = match self.conversations.get(&message.conversation_id) {
            Some(c) if c.session_id == message.session_id => c.params.storage_policy,
            _ => {
                return Err(AgentError::not_found(
                    "conversation",
                    message.conversation_id,
                ));
            }
        };
        self.next_message_id += 1;
        if let (StoragePolicy::Ttl { secs }, Some(_)) = (policy, &message.content) {
            self.expires.insert(
                self.next_message_id,
                troupe_actors::rollout::ttl_expiry_ms(message.created_ms, secs),
            );
        }
        let record = MessageRecord {
            message_id: self.next_message_id,
            session_id: message.session_id,
            conversation_id: message.conversation_id,
            task_id: message.task_id,
            role: message.role,
            content: message.content,
            chars: message.chars,
            created_ms: message.created_ms,
            status: message.status,
            reply_message_id: None,
            kind: message.kind,
            metadata: message.metadata,
        };
        self.messages.insert(record.message_id, record.clone());
        if record.status.is_some()
            && let Some(s) = self.sessions.get_mut(&record.session_id)
        {
            s.status = SessionStatus::Active;
        }
        self.touch(record.session_id, record.created_ms);
        Ok(record)
    }

    fn user_message(&mut self, message_id: u64) -> Result<&mut MessageRecord, AgentError> {
        self.messages
            .get_mut(&message_id)
            .filter(|m| m.role == Role::User)
            .ok_or_else(|| AgentError::not_found("message", message_id))
    }
}

fn is_pending(m: &MessageRecord) -> bool {
    matches!(
        m.status,
        Some(MessageStatus::Queued | MessageStatus::Running)
    )
}

/// An in-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    data: Mutex<Data>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Data) -> Result<T, AgentError>) -> Result<T, AgentError> {
        let mut data = self
            .data
            .lock()
            .map_err(|_| AgentError::internal("memory store poisoned"))?;
        f(&mut data)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_session(&self, session: SessionRecord) -> Result<(), AgentError> {
        self.with(|d| {
            if d.sessions.contains_key(&session.session_id) {
                return Err(AgentError::invalid(format!(
                    "session {} already exists",
                    session.session_id
                )));
            }
            d.order.push(session.session_id);
            let updated_ms = session.updated_ms.max(session.created_ms);
            d.sessions.insert(
                session.session_id,
                SessionRecord {
                    updated_ms,
                    ..session
                },
            );
            Ok(())
        })
    }

    async fn get_session(
        &self,
        session_id: SessionId,
    ) -> Result<Option<SessionRecord>, AgentError> {
        self.with(|d| Ok(d.sessions.get(&session_id).cloned()))
    }

    async fn all_sessions(&self) -> Result<Vec<SessionRecord>, AgentError> {
        self.with(|d| {
            Ok(d.order
                .iter()
                .filter_map(|id| d.sessions.get(id).cloned())
                .collect())
        })
    }

    async fn project_sessions(&self, project_id: &str) -> Result<Vec<SessionRecord>, AgentError> {
        self.with(|d| {
            Ok(d.order
                .iter()
                .rev()
                .filter_map(|id| d.sessions.get(id))
                .filter(|s| s.project_id.as_deref() == Some(project_id))
                .cloned()
                .collect())
        })
    }

    async fn put_conversation(&self, conversation: ConversationRecord) -> Result<(), AgentError> {
        let conversation = ConversationRecord {
            params: conversation.params.kept_by_policy(),
            ..conversation
        };
        self.with(|d| {
            if !d.sessions.contains_key(&conversation.session_id) {
                return Err(AgentError::not_found("session", conversation.session_id));
            }
            let (session_id, at) = (
                conversation.session_id,
                conversation.closed_ms.unwrap_or(conversation.created_ms),
            );
            d.conversations
                .insert(conversation.conversation_id, conversation);
            d.touch(session_id, at);
            Ok(())
        })
    }

    async fn close_conversation(
        &self,
        conversation_id: ConversationId,
        closed_ms: u64,
    ) -> Result<(), AgentError> {
        self.with(|d| {
            let c = d
                .conversations
                .get_mut(&conversation_id)
                .ok_or_else(|| AgentError::not_found("conversation", conversation_id))?;
            if c.state == ConversationState::Open {
                c.state = ConversationState::Closed;
                c.closed_ms = Some(closed_ms);
            }
            let session_id = c.session_id;
            d.touch(session_id, closed_ms);
            Ok(())
        })
    }

    async fn conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        self.with(|d| {
            let mut out: Vec<ConversationRecord> = d
                .conversations
                .values()
                .filter(|c| c.session_id == session_id)
                .cloned()
                .collect();
            // Conversation ids are v7 UUIDs: their order is creation order within a
            // millisecond's precision; the timestamp decides first.
            out.sort_by_key(|c| (c.created_ms, c.conversation_id));
            Ok(out)
        })
    }

    async fn open_conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        let mut all = self.conversations(session_id).await?;
        all.retain(|c| c.state == ConversationState::Open);
        Ok(all)
    }

    async fn conversation(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<ConversationRecord>, AgentError> {
        self.with(|d| Ok(d.conversations.get(&conversation_id).cloned()))
    }

    async fn append_message(&self, message: NewMessage) -> Result<MessageRecord, AgentError> {
        self.with(|d| d.append(message))
    }

    async fn message(&self, message_id: u64) -> Result<Option<MessageRecord>, AgentError> {
        self.with(|d| Ok(d.messages.get(&message_id).cloned()))
    }

    async fn start_message(&self, message_id: u64) -> Result<MessageRecord, AgentError> {
        self.with(|d| {
            let m = d.user_message(message_id)?;
            if m.status != Some(MessageStatus::Queued) {
                return Err(AgentError::invalid(format!(
                    "message {message_id} is {}, not queued",
                    m.status.map_or("without a status", MessageStatus::as_str)
                )));
            }
            m.status = Some(MessageStatus::Running);
            let m = m.clone();
            d.touch(m.session_id, 0);
            Ok(m)
        })
    }

    async fn finish_message(&self, finish: FinishMessage) -> Result<FinishedMessage, AgentError> {
        self.with(|d| {
            if !finish.status.is_terminal() {
                return Err(AgentError::invalid(format!(
                    "{} is not an outcome",
                    finish.status.as_str()
                )));
            }
            let m = d.user_message(finish.message_id)?;
            if let Some(s) = m.status.filter(|s| s.is_terminal()) {
                return Err(AgentError::invalid(format!(
                    "message {} already ended {}",
                    finish.message_id,
                    s.as_str()
                )));
            }
            // All or nothing, as the SQLite store's transaction: checked before any is stored.
            for new in finish.items.iter().chain(finish.reply.iter()) {
                let known = d
                    .conversations
                    .get(&new.conversation_id)
                    .is_some_and(|c| c.session_id == new.session_id);
                if !known {
                    return Err(AgentError::not_found("conversation", new.conversation_id));
                }
            }
            let items = finish
                .items
                .into_iter()
                .map(|i| d.append(i))
                .collect::<Result<Vec<_>, _>>()?;
            let reply = finish.reply.map(|r| d.append(r)).transpose()?;
            let m = d.user_message(finish.message_id)?;
            m.status = Some(finish.status);
            m.task_id = finish.task_id.or(m.task_id);
            m.reply_message_id = reply.as_ref().map(|r| r.message_id).or(m.reply_message_id);
            let m = m.clone();
            if let Some(status) = finish.session_status
                && let Some(s) = d.sessions.get_mut(&m.session_id)
            {
                s.status = status;
            }
            d.touch(m.session_id, 0);
            Ok(FinishedMessage {
                message: m,
                items,
                reply,
            })
        })
    }

    async fn pending_messages(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<MessageRecord>, AgentError> {
        self.with(|d| {
            Ok(d.messages
                .values()
                .filter(|m| m.session_id == session_id && is_pending(m))
                .cloned()
                .collect())
        })
    }

    async fn sessions_with_pending_messages(&self) -> Result<Vec<SessionId>, AgentError> {
        self.with(|d| {
            let mut out: Vec<SessionId> = Vec::new();
            for m in d.messages.values().filter(|m| is_pending(m)) {
                if !out.contains(&m.session_id) {
                    out.push(m.session_id);
                }
            }
            Ok(out)
        })
    }

    async fn messages(
        &self,
        session_id: SessionId,
        limit: usize,
        max_bytes: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError> {
        self.with(|d| {
            let upper = before.unwrap_or(u64::MAX);
            let sizes = d
                .messages
                .range(..upper)
                .rev()
                .map(|(_, m)| m)
                .filter(|m| m.session_id == session_id)
                .map(|m| {
                    Ok::<_, AgentError>((m.message_id, m.content.as_ref().map_or(0, String::len)))
                });
            let plan = page::plan(sizes, limit, max_bytes)?;
            let messages = match plan.ids {
                None => Vec::new(),
                Some((oldest, newest)) => d
                    .messages
                    .range(oldest..=newest)
                    .map(|(_, m)| m)
                    .filter(|m| m.session_id == session_id)
                    .cloned()
                    .collect(),
            };
            Ok(MessagePage {
                messages,
                next_before: plan.next_before,
            })
        })
    }

    async fn sweep_due(&self, now_ms: u64) -> Result<u64, AgentError> {
        self.with(|d| {
            let due: Vec<u64> = d
                .expires
                .iter()
                .filter(|(_, expires)| **expires <= now_ms)
                .map(|(id, _)| *id)
                .collect();
            for id in &due {
                d.expires.remove(id);
                if let Some(m) = d.messages.get_mut(id) {
                    m.content = None;
                }
            }
            let mut conversations = 0usize;
            for c in d.conversations.values_mut() {
                let due = match c.params.storage_policy {
                    StoragePolicy::Ttl { secs } => {
                        troupe_actors::rollout::ttl_expiry_ms(c.created_ms, secs) <= now_ms
                    }
                    _ => false,
                };
                if due && c.params.has_instructions() {
                    c.params = c.params.clone().without_instructions();
                    conversations += 1;
                }
            }
            let a2a_tasks = d.a2a.sweep_due(now_ms);
            Ok(u64::try_from(due.len() + conversations + a2a_tasks).unwrap_or(u64::MAX))
        })
    }

    async fn set_current_session(
        &self,
        project_id: &str,
        session_id: SessionId,
    ) -> Result<(), AgentError> {
        self.with(|d| match d.sessions.get(&session_id) {
            Some(s) if s.project_id.as_deref() == Some(project_id) => {
                d.current.insert(project_id.to_owned(), session_id);
                Ok(())
            }
            _ => Err(AgentError::not_found("session", session_id)),
        })
    }

    async fn current_session(&self, project_id: &str) -> Result<Option<SessionId>, AgentError> {
        self.with(|d| Ok(d.current.get(project_id).copied()))
    }

    async fn set_session_status(
        &self,
        session_id: SessionId,
        status: SessionStatus,
        at_ms: u64,
    ) -> Result<(), AgentError> {
        self.with(|d| {
            let s = d
                .sessions
                .get_mut(&session_id)
                .ok_or_else(|| AgentError::not_found("session", session_id))?;
            s.status = status;
            d.touch(session_id, at_ms);
            Ok(())
        })
    }

    async fn ping(&self) -> Result<(), AgentError> {
        self.with(|_| Ok(()))
    }

    async fn put_a2a_context(&self, context: A2aContextRecord) -> Result<(), AgentError> {
        self.with(|d| {
            d.a2a.put_context(context);
            Ok(())
        })
    }

    async fn a2a_context(&self, context_id: &str) -> Result<Option<A2aContextRecord>, AgentError> {
        self.with(|d| Ok(d.a2a.context(context_id)))
    }

    async fn a2a_open_contexts(&self) -> Result<Vec<A2aContextRecord>, AgentError> {
        self.with(|d| Ok(d.a2a.open_contexts()))
    }

    async fn put_a2a_task(&self, task: A2aTaskRecord) -> Result<(), AgentError> {
        self.with(|d| d.a2a.put_task(task))
    }

    async fn a2a_task(&self, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError> {
        self.with(|d| Ok(d.a2a.task(task_id)))
    }

    async fn a2a_live_tasks(&self) -> Result<Vec<A2aTaskRecord>, AgentError> {
        self.with(|d| Ok(d.a2a.live_tasks()))
    }

    async fn a2a_tasks(&self, query: A2aTaskQuery) -> Result<A2aTaskPage, AgentError> {
        self.with(|d| Ok(d.a2a.tasks(&query)))
    }

    async fn put_a2a_push(&self, push: A2aPushRecord) -> Result<(), AgentError> {
        self.with(|d| d.a2a.put_push(push))
    }

    async fn delete_a2a_push(&self, task_id: &str, config_id: &str) -> Result<bool, AgentError> {
        self.with(|d| Ok(d.a2a.delete_push(task_id, config_id)))
    }

    async fn a2a_pushes(&self, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError> {
        self.with(|d| Ok(d.a2a.pushes(task_id)))
    }

    async fn prune_a2a(&self, keep_finished: usize) -> Result<A2aPruned, AgentError> {
        self.with(|d| Ok(d.a2a.prune(keep_finished)))
    }
}

#[async_trait]
impl super::BindingStore for MemoryStore {
    async fn put_binding(
        &self,
        binding: troupe_proto::agent::AgentBinding,
    ) -> Result<(), AgentError> {
        self.with(|d| {
            crate::conn::to_sql_int("created_ms", binding.created_ms)?;
            crate::conn::to_sql_int("updated_ms", binding.updated_ms)?;
            d.bindings
                .insert((binding.session_id, binding.agent_id.clone()), binding);
            Ok(())
        })
    }

    async fn bindings(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError> {
        self.with(|d| {
            Ok(d.bindings
                .values()
                .filter(|b| session_id.is_none_or(|s| b.session_id == s))
                .cloned()
                .collect())
        })
    }

    async fn remove_binding(
        &self,
        session_id: SessionId,
        agent_id: &str,
    ) -> Result<(), AgentError> {
        self.with(|d| {
            d.bindings.remove(&(session_id, agent_id.to_owned()));
            Ok(())
        })
    }
}

#[async_trait]
impl super::TokenStore for MemoryStore {
    async fn insert_token(
        &self,
        token: troupe_proto::governance::AuthToken,
    ) -> Result<(), AgentError> {
        self.with(|d| {
            crate::conn::to_sql_int("expires_ms", token.expires_ms)?;
            if d.tokens.contains_key(&token.id)
                || d.tokens.values().any(|t| t.digest == token.digest)
            {
                return Err(AgentError::invalid("a token with this id or secret exists"));
            }
            d.tokens.insert(token.id.clone(), token);
            Ok(())
        })
    }

    async fn token_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        self.with(|d| Ok(d.tokens.values().find(|t| t.digest == digest).cloned()))
    }

    async fn use_token(&self, id: &str, uses: u32, now_ms: u64) -> Result<bool, AgentError> {
        self.with(|d| {
            Ok(match d.tokens.get_mut(id) {
                Some(t)
                    if t.uses == uses
                        && uses < t.max_uses
                        && t.revoked_ms.is_none()
                        && now_ms < t.expires_ms =>
                {
                    t.uses = uses.saturating_add(1);
                    true
                }
                _ => false,
            })
        })
    }

    async fn revoke_token(
        &self,
        id: &str,
        at_ms: u64,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        self.with(|d| {
            Ok(d.tokens.get_mut(id).map(|t| {
                t.revoked_ms.get_or_insert(at_ms);
                t.clone()
            }))
        })
    }

    async fn tokens(&self) -> Result<Vec<troupe_proto::governance::AuthToken>, AgentError> {
        self.with(|d| {
            let mut all: Vec<_> = d.tokens.values().cloned().collect();
            all.sort_by(|a, b| b.issued_ms.cmp(&a.issued_ms).then(a.id.cmp(&b.id)));
            Ok(all)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_PAGE_BYTES;
    use proptest::prelude::*;
    use troupe_proto::{OpenConversation, Role};

    fn session(project: Option<&str>) -> SessionRecord {
        SessionRecord {
            session_id: SessionId::new(),
            project_id: project.map(str::to_owned),
            title: None,
            created_ms: 1,
            root_conversation_id: ConversationId::new(),
            settings: troupe_proto::Json(serde_json::json!({})),
            status: troupe_proto::store::SessionStatus::Active,
            updated_ms: 0,
        }
    }

    fn conversation(s: &SessionRecord) -> ConversationRecord {
        ConversationRecord {
            conversation_id: s.root_conversation_id,
            session_id: s.session_id,
            params: OpenConversation::default(),
            is_root: true,
            state: ConversationState::Open,
            created_ms: 1,
            closed_ms: None,
        }
    }

    fn message(s: &SessionRecord, i: usize) -> NewMessage {
        NewMessage {
            session_id: s.session_id,
            conversation_id: s.root_conversation_id,
            task_id: None,
            role: Role::User,
            content: Some(format!("m{i}")),
            chars: 2,
            created_ms: 1,
            status: None,
            kind: troupe_proto::store::MessageKind::Text,
            metadata: None,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn unknown_ids_and_duplicates() {
        let store = MemoryStore::new();
        let s = session(Some("p"));
        assert_eq!(store.get_session(s.session_id).await.unwrap(), None);
        assert!(matches!(
            store.put_conversation(conversation(&s)).await,
            Err(AgentError::NotFound { .. })
        ));
        store.create_session(s.clone()).await.unwrap();
        assert!(matches!(
            store.create_session(s.clone()).await,
            Err(AgentError::InvalidInput { .. })
        ));
        assert!(matches!(
            store.append_message(message(&s, 0)).await,
            Err(AgentError::NotFound { .. })
        ));
        assert!(matches!(
            store.set_current_session("other", s.session_id).await,
            Err(AgentError::NotFound { .. })
        ));
        store.set_current_session("p", s.session_id).await.unwrap();
        assert_eq!(
            store.current_session("p").await.unwrap(),
            Some(s.session_id)
        );
        store.put_conversation(conversation(&s)).await.unwrap();
        store
            .close_conversation(s.root_conversation_id, 5)
            .await
            .unwrap();
        let c = store.conversations(s.session_id).await.unwrap();
        assert_eq!(c[0].state, ConversationState::Closed);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        /// Walking the pages from the newest returns every message once, in order, each page
        /// min(limit, remaining) long.
        #[test]
        fn pages_cover_everything_once(n in 0usize..40, limit in 1usize..12) {
            rt().block_on(async {
                let store = MemoryStore::new();
                let s = session(None);
                store.create_session(s.clone()).await.unwrap();
                store.put_conversation(conversation(&s)).await.unwrap();
                for i in 0..n {
                    store.append_message(message(&s, i)).await.unwrap();
                }
                let mut seen = Vec::new();
                let mut before = None;
                loop {
                    let page = store.messages(s.session_id, limit, MAX_PAGE_BYTES, before).await.unwrap();
                    prop_assert_eq!(page.messages.len(), limit.min(n - seen.len()));
                    let mut ids: Vec<u64> = page.messages.iter().map(|m| m.message_id).collect();
                    ids.extend(seen);
                    seen = ids;
                    match page.next_before {
                        Some(b) => before = Some(b),
                        None => break,
                    }
                }
                prop_assert_eq!(seen.len(), n);
                prop_assert!(seen.windows(2).all(|w| w[0] < w[1]));
                Ok(())
            })?;
        }
    }
}
