//! TokenBook: the authorization tokens of a process (A5), issued by people and consumed by
//! tool calls. One per process (`troupe serve`, `troupe chat`), over the process's
//! [`TokenStore`]; sessions reach it through their ports.
//!
//! # Mailbox
//! - `Issue`: a new token for a scope, a TTL and a number of uses; answers its secret, which
//!   exists only in that answer (the store keeps its digest).
//! - `Consume`: a tool call asks for one use of a presented token that covers it
//!   ([`tokens::check`]). The first that does is counted in the store before the answer, so a
//!   use is never given twice: the book handles one `Consume` at a time, and the store counts
//!   by compare-and-set, so that a second process on the same store cannot count the same use
//!   either (a use lost to it is read and decided again). A refusal says why
//!   ([`TokenRefusal`]).
//! - `Revoke`, `List`: for the people who issue them.
//!
//! Waiting for the store inside `handle` is deliberate here: `Consume`s must be counted one
//! after the other, and a count must be durable before the call it authorizes runs.
//!
//! # Failure
//! No children. A store error is answered to its caller (a `Consume` then refuses:
//! `unavailable`, nothing runs). The book's handle never fails on a message; should it stop,
//! its callers see their call fail and every tool that needs a token is refused.

use crate::clock::WallClock;
use crate::governance::{
    metrics, token_digest,
    tokens::{self, CallScope},
};
use crate::ports::TokenStore;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use troupe_proto::AgentError;
use troupe_proto::governance::{AuthToken, IssueToken, IssuedToken, TokenInfo, TokenRefusal};

/// Longest TTL a token may have: a year.
pub const MAX_TTL_SECS: u64 = 366 * 24 * 3600;

/// How many times in a row a use may be lost to other processes counting the same token
/// before the call is refused as `unavailable` (each loss is a use counted elsewhere, so a
/// token is spent long before, unless the store misbehaves).
const MAX_LOST_USES: u32 = 64;

/// Start-up arguments.
pub struct TokenBookArgs {
    pub store: Arc<dyn TokenStore>,
    /// The wall clock expiries are read on (not tokio's: a TTL is a date).
    pub clock: WallClock,
}

/// The book's state: where tokens are kept.
pub struct TokenBookState {
    store: Arc<dyn TokenStore>,
    clock: WallClock,
}

/// A use counted: which token, and how many it has had of how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub token_id: String,
    pub uses: u32,
    pub max_uses: u32,
}

/// The call a `Consume` is for.
#[derive(Debug, Clone)]
pub struct ConsumeRequest {
    /// Digests of the presented tokens.
    pub digests: Vec<String>,
    pub agent: Option<String>,
    pub tool: String,
    /// The command line of a shell call ([`tokens::shell_command_line`]): what a token's
    /// `args` pattern is matched against (`None`: another tool, or a command not read).
    pub command: Option<String>,
    /// The call's arguments, whose fields a token's `fields` patterns name.
    pub arguments: serde_json::Value,
}

/// The book's mailbox.
pub enum TokenBookMsg {
    /// Issues a token; answers its secret (shown this once) and what lists show of it.
    Issue {
        request: IssueToken,
        reply: RpcReplyPort<Result<IssuedToken, AgentError>>,
    },
    /// Counts one use of the first presented token that covers the call.
    Consume {
        request: ConsumeRequest,
        reply: RpcReplyPort<Result<Consumed, TokenRefusal>>,
    },
    /// Revokes a token by id.
    Revoke {
        id: String,
        reply: RpcReplyPort<Result<TokenInfo, AgentError>>,
    },
    /// Every token, newest first.
    List {
        reply: RpcReplyPort<Result<Vec<TokenInfo>, AgentError>>,
    },
}

/// The actor.
pub struct TokenBook;

#[ractor::async_trait]
impl Actor for TokenBook {
    type Msg = TokenBookMsg;
    type State = TokenBookState;
    type Arguments = TokenBookArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(TokenBookState {
            store: args.store,
            clock: args.clock,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TokenBookMsg::Issue { request, reply } => {
                let _ = reply.send(state.issue(request).await);
            }
            TokenBookMsg::Consume { request, reply } => {
                let _ = reply.send(state.consume(&request).await);
            }
            TokenBookMsg::Revoke { id, reply } => {
                let _ = reply.send(state.revoke(&id).await);
            }
            TokenBookMsg::List { reply } => {
                let listed = state.store.tokens().await;
                let _ = reply.send(listed.map(|all| all.iter().map(TokenInfo::from).collect()));
            }
        }
        Ok(())
    }
}

impl TokenBookState {
    async fn issue(&self, request: IssueToken) -> Result<IssuedToken, AgentError> {
        let token = new_token(request, self.clock.now_ms())?;
        let secret = token.1;
        let token = token.0;
        self.store.insert_token(token.clone()).await?;
        metrics::token_issued();
        tracing::info!(token_id = %token.id, agent = %token.scope.agent, tool = %token.scope.tool, max_uses = token.max_uses, "authorization token issued");
        Ok(IssuedToken {
            token: secret,
            info: TokenInfo::from(&token),
        })
    }

    async fn consume(&self, request: &ConsumeRequest) -> Result<Consumed, TokenRefusal> {
        let call = CallScope {
            agent: request.agent.as_deref(),
            tool: &request.tool,
            command: request.command.as_deref(),
            arguments: &request.arguments,
        };
        let mut refusals = Vec::new();
        for digest in &request.digests {
            // A use another process counted meanwhile: read again, decide again, until the
            // use is counted or the token no longer covers the call (spent, expired,
            // revoked: each loss brings the token closer to one of them).
            let mut lost = 0;
            loop {
                let token = match self.store.token_by_digest(digest).await {
                    Ok(Some(token)) => token,
                    Ok(None) => {
                        refusals.push(TokenRefusal::Unknown);
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "token store unavailable");
                        refusals.push(TokenRefusal::Unavailable);
                        break;
                    }
                };
                let now_ms = self.clock.now_ms();
                if let Err(refusal) = tokens::check(&token, &call, now_ms) {
                    refusals.push(refusal);
                    break;
                }
                // The store counts it only if the token is still unspent, unrevoked and
                // unexpired at `now_ms`, whatever another process did meanwhile.
                match self.store.use_token(&token.id, token.uses, now_ms).await {
                    Ok(true) => {
                        let consumed = Consumed {
                            token_id: token.id,
                            uses: token.uses + 1,
                            max_uses: token.max_uses,
                        };
                        metrics::token_used();
                        return Ok(consumed);
                    }
                    Ok(false) => {
                        lost += 1;
                        if lost >= MAX_LOST_USES {
                            // A store that never counts what it reads as countable.
                            tracing::warn!(token_id = %token.id, lost, "token use not counted: the store kept refusing it");
                            refusals.push(TokenRefusal::Unavailable);
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "token store unavailable");
                        refusals.push(TokenRefusal::Unavailable);
                        break;
                    }
                }
            }
        }
        let refusal = tokens::most_telling(&refusals);
        metrics::token_refused(refusal);
        Err(refusal)
    }

    async fn revoke(&self, id: &str) -> Result<TokenInfo, AgentError> {
        let revoked = self
            .store
            .revoke_token(id, self.clock.now_ms())
            .await?
            .ok_or_else(|| AgentError::not_found("token", id))?;
        metrics::token_revoked();
        tracing::info!(token_id = %id, "authorization token revoked");
        Ok(TokenInfo::from(&revoked))
    }
}

/// A token for `request` issued at `now_ms`, and its secret; a bad request is `InvalidInput`.
pub fn new_token(request: IssueToken, now_ms: u64) -> Result<(AuthToken, String), AgentError> {
    let scope = request.scope;
    if scope.agent != "*" && !troupe_proto::agent::is_valid_agent_id(&scope.agent) {
        return Err(AgentError::invalid(format!(
            "`{}` is not an agent id (or `*`)",
            scope.agent
        )));
    }
    if !troupe_proto::agent::is_valid_tool_pattern(&scope.tool) {
        return Err(AgentError::invalid(format!(
            "`{}` is not a tool name ([a-zA-Z0-9_.*-])",
            scope.tool
        )));
    }
    tokens::validate_arguments(&scope).map_err(AgentError::invalid)?;
    if request.max_uses == 0 {
        return Err(AgentError::invalid("max_uses must be at least 1"));
    }
    if request.ttl_secs == 0 || request.ttl_secs > MAX_TTL_SECS {
        return Err(AgentError::invalid(format!(
            "ttl must be between 1 s and {MAX_TTL_SECS} s"
        )));
    }
    let secret = tokens::new_secret();
    let token = AuthToken {
        id: uuid::Uuid::new_v4().to_string(),
        digest: token_digest(&secret),
        scope,
        issued_by: request
            .issued_by
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| "unknown".to_owned()),
        issued_ms: now_ms,
        expires_ms: now_ms.saturating_add(request.ttl_secs.saturating_mul(1000)),
        max_uses: request.max_uses,
        uses: 0,
        revoked_ms: None,
    };
    Ok((token, secret))
}

/// A reference to a book.
pub type TokenBookRef = ActorRef<TokenBookMsg>;

/// Starts a book over `store`, on the system's wall clock.
pub async fn spawn(store: Arc<dyn TokenStore>) -> Result<ActorRef<TokenBookMsg>, AgentError> {
    spawn_with_clock(store, WallClock::system()).await
}

/// Starts a book over `store` on `clock`.
pub async fn spawn_with_clock(
    store: Arc<dyn TokenStore>,
    clock: WallClock,
) -> Result<ActorRef<TokenBookMsg>, AgentError> {
    let (book, _join) = Actor::spawn(None, TokenBook, TokenBookArgs { store, clock })
        .await
        .map_err(|e| AgentError::internal(format!("token book did not start: {e}")))?;
    Ok(book)
}

/// Asks `book` for one use for `request`; a book that does not answer refuses.
pub async fn consume(
    book: &ActorRef<TokenBookMsg>,
    request: ConsumeRequest,
) -> Result<Consumed, TokenRefusal> {
    ractor::call!(book, |reply| TokenBookMsg::Consume { request, reply })
        .unwrap_or(Err(TokenRefusal::Unavailable))
}

/// Issues a token through `book`.
pub async fn issue(
    book: &ActorRef<TokenBookMsg>,
    request: IssueToken,
) -> Result<IssuedToken, AgentError> {
    ractor::call!(book, |reply| TokenBookMsg::Issue { request, reply }).map_err(unavailable)?
}

/// Every token of `book`, newest first.
pub async fn list(book: &ActorRef<TokenBookMsg>) -> Result<Vec<TokenInfo>, AgentError> {
    ractor::call!(book, |reply| TokenBookMsg::List { reply }).map_err(unavailable)?
}

/// Revokes token `id` through `book`.
pub async fn revoke(book: &ActorRef<TokenBookMsg>, id: String) -> Result<TokenInfo, AgentError> {
    ractor::call!(book, |reply| TokenBookMsg::Revoke { id, reply }).map_err(unavailable)?
}

fn unavailable<T>(e: ractor::RactorErr<T>) -> AgentError {
    AgentError::internal(format!("token book unavailable: {e}"))
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(TokenBookMsg);
