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
//! conversation it opens on first use (for the life of the process; after a restart the
//! reply's `conversation` id continues it). Without one: the session's root conversation.

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
    mut messages: mpsc::UnboundedReceiver<InputMessage>,
) {
    let mut feeder = Feeder {
        sessions,
        module,
        project_session: None,
        keys: HashMap::new(),
    };
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

struct Feeder {
    sessions: SessionsApi,
    module: Arc<ModuleDefinition>,
    /// The module's project's session, once found.
    project_session: Option<SessionId>,
    /// Conversations opened for keys, by session and key.
    keys: HashMap<(SessionId, String), ConversationId>,
}

impl Feeder {
    /// Stores the message in its conversation: where it went, its id, and its task's end.
    async fn take(
        &mut self,
        message: InputMessage,
    ) -> Result<(SessionId, ConversationId, u64), AgentError> {
        let session = match &message.session {
            Some(s) => s.parse::<SessionId>().map_err(|_| {
                AgentError::invalid(format!("`session` must be a session id, not `{s}`"))
            })?,
            None => self.project_session().await?,
        };
        let conversation = match message.conversation.as_deref() {
            None => None,
            Some(c) => Some(self.conversation(session, c).await?),
        };
        let origin = ReplyOrigin::metadata(&self.module.id, message.id.as_deref());
        let (stored, _end) = self
            .sessions
            .send_tracked(
                Scope::All,
                session,
                conversation,
                message.text,
                Some(origin),
            )
            .await?;
        Ok((session, stored.conversation_id, stored.message_id))
    }

    async fn project_session(&mut self) -> Result<SessionId, AgentError> {
        if let Some(id) = self.project_session {
            return Ok(id);
        }
        let project = self.module.project().to_owned();
        let id = match self.sessions.current(Scope::All, project.clone()).await {
            Ok(record) => record.session_id,
            Err(AgentError::NotFound { .. }) => {
                let record = self
                    .sessions
                    .create(
                        Scope::All,
                        CreateSession {
                            project_id: Some(project.clone()),
                            title: Some(format!("module {}", self.module.id)),
                            settings: None,
                            root: None,
                        },
                    )
                    .await?;
                self.sessions
                    .set_current(Scope::All, project.clone(), record.session_id)
                    .await?;
                tracing::info!(module = %self.module.id, session_id = %record.session_id, %project, "created the module's session");
                record.session_id
            }
            Err(e) => return Err(e),
        };
        self.project_session = Some(id);
        Ok(id)
    }

    /// A conversation id as is; any other key: the conversation opened for it.
    async fn conversation(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<ConversationId, AgentError> {
        if let Ok(id) = key.parse::<ConversationId>() {
            return Ok(id);
        }
        if let Some(id) = self.keys.get(&(session, key.to_owned())) {
            return Ok(*id);
        }
        let id = self
            .sessions
            .open(Scope::All, session, OpenConversation::default())
            .await?;
        self.keys.insert((session, key.to_owned()), id);
        Ok(id)
    }
}
