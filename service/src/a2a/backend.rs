//! What the A2A endpoint needs of a troupe session, as a small port: open, close and reopen a
//! conversation, run a message in it, cancel a task, answer an approval, and watch the
//! session's events.
//! `SessionHandle` is the implementation; the service may plug in another (a session it
//! creates lazily, one per tenant, ...).

use async_trait::async_trait;
use troupe_actors::SessionHandle;
use troupe_actors::rollout::stream::EventStream;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ConversationId, MessageReply, OpenConversation,
    SessionId, TaskId,
};

/// The session an A2A endpoint runs its tasks in.
#[async_trait]
pub trait A2aBackend: Send + Sync + 'static {
    /// The session every context runs in (its id is stored with each context).
    async fn session_id(&self) -> Result<SessionId, AgentError>;
    /// Opens the conversation of a new context.
    async fn open(&self, params: OpenConversation) -> Result<ConversationId, AgentError>;
    /// Opens a closed conversation again under its id, its history rebuilt from its rollout
    /// (an open one: nothing to do). `params`: what it was opened with, for a backend that
    /// keeps no record of it. `NotFound` when the session has no such conversation.
    async fn reopen(
        &self,
        conversation_id: ConversationId,
        params: OpenConversation,
    ) -> Result<(), AgentError>;
    /// Closes a conversation (an idle context's).
    async fn close(&self, conversation_id: ConversationId) -> Result<(), AgentError>;
    /// Cancels whatever runs or waits in a conversation.
    async fn cancel_conversation(&self, conversation_id: ConversationId) -> Result<(), AgentError>;
    /// Runs one task; answers when it is over.
    async fn message(
        &self,
        conversation_id: ConversationId,
        text: String,
    ) -> Result<MessageReply, AgentError>;
    /// Asks a running task to stop.
    async fn cancel_task(&self, task_id: TaskId) -> Result<(), AgentError>;
    /// Answers a pending approval.
    async fn respond_approval(
        &self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    ) -> Result<(), AgentError>;
    /// The session's events after `after_seq` (`None`: from now on), in order and without
    /// gaps: what storage keeps, then live events, refilled from storage when the reader
    /// falls behind ([`SessionHandle::events`]).
    async fn events(&self, after_seq: Option<u64>) -> Result<EventStream, AgentError>;
    /// The approvals waiting for an answer, every conversation's: what an event read back
    /// without its content (a policy that keeps none) stands for.
    async fn pending_approvals(&self) -> Result<Vec<troupe_proto::PendingApproval>, AgentError>;
}

#[async_trait]
impl A2aBackend for SessionHandle {
    async fn session_id(&self) -> Result<SessionId, AgentError> {
        Ok(self.id())
    }

    async fn open(&self, params: OpenConversation) -> Result<ConversationId, AgentError> {
        SessionHandle::open(self, params).await
    }

    async fn reopen(
        &self,
        conversation_id: ConversationId,
        params: OpenConversation,
    ) -> Result<(), AgentError> {
        self.restore(conversation_id, params).await
    }

    async fn close(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        SessionHandle::close(self, conversation_id).await.map(drop)
    }

    async fn cancel_conversation(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        SessionHandle::cancel_conversation(self, conversation_id)
            .await
            .map(drop)
    }

    async fn message(
        &self,
        conversation_id: ConversationId,
        text: String,
    ) -> Result<MessageReply, AgentError> {
        SessionHandle::message(self, conversation_id, text).await
    }

    async fn cancel_task(&self, task_id: TaskId) -> Result<(), AgentError> {
        SessionHandle::cancel_task(self, task_id).await.map(|_| ())
    }

    async fn respond_approval(
        &self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    ) -> Result<(), AgentError> {
        SessionHandle::respond_approval(self, approval_id, decision).await
    }

    async fn pending_approvals(&self) -> Result<Vec<troupe_proto::PendingApproval>, AgentError> {
        SessionHandle::pending_approvals(self).await
    }

    async fn events(&self, after_seq: Option<u64>) -> Result<EventStream, AgentError> {
        let after = match after_seq {
            Some(seq) => seq,
            None => self.last_seq().await?,
        };
        SessionHandle::events(self, after).await
    }
}
