//! The approval core, with no actor and no I/O: pending requests and their waiters, the
//! remembered approvals (command keys with their expiry) and every decision on them as
//! plain functions: is this command already approved, what an answer resolves, what a
//! timeout, a closed conversation or a sweep removes.

use super::*;

/// A request as it arrives, before it is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub conversation_id: ConversationId,
    pub task_id: Option<TaskId>,
    pub command: Vec<String>,
    pub reason: String,
    /// What is asked: a command, or an MCP server's request.
    pub subject: ApprovalSubject,
    /// Where the command runs when its call named a directory (`None`: the workspace root):
    /// shown with it, and part of what an approval remembers.
    pub workdir: Option<String>,
}

/// What became of a request.
#[derive(Debug)]
pub enum AskAdmission<W> {
    /// A live key covers it; the waiter comes back to be answered at once.
    Remembered(W),
    /// An identical request was pending; the waiter joined it.
    Attached(ApprovalId),
    /// A new pending request.
    Opened(PendingApproval),
}

/// A pending request that has been settled, with everyone waiting for it.
#[derive(Debug)]
pub struct Resolution<W> {
    pub request: PendingApproval,
    /// The decision announced in `approval_resolved`.
    pub decision: ApprovalDecision,
    /// What every waiter is answered.
    pub answer: Result<Granted, AgentError>,
    pub waiters: Vec<W>,
    /// Withdrawn rather than answered (its task ended, nobody waits, its conversation closed).
    pub withdrawn: bool,
}

impl<W> Resolution<W> {
    /// The metric label of this resolution.
    pub fn outcome(&self) -> Outcome {
        match (&self.answer, &self.decision) {
            _ if self.withdrawn => Outcome::Withdrawn,
            (Ok(Granted::Remembered), _) => Outcome::Remembered,
            (Ok(Granted::Decided(_)), _) => Outcome::Approved,
            (Err(_), ApprovalDecision::TimedOut) => Outcome::TimedOut,
            (Err(_), _) => Outcome::Denied,
        }
    }
}

#[derive(Debug)]
pub(super) struct Pending<W> {
    pub(super) info: PendingApproval,
    /// Admission order: `requested_at_ms` ties within a millisecond.
    pub(super) seq: u64,
    pub(super) waiters: Vec<W>,
}

/// Keys and pending requests, and every decision on them, without actor machinery. `W` is what
/// waits for an answer: a reply port in the actor, anything in tests.
#[derive(Debug)]
pub struct ApprovalCore<W> {
    pub(super) keys: Vec<CommandKey>,
    pub(super) pending: HashMap<ApprovalId, Pending<W>>,
    pub(super) next_seq: u64,
    /// Requests withdrawn lately (newest last, at most [`WITHDRAWN_REMEMBERED`]) and why: a
    /// late answer to one is told so, rather than "not found".
    pub(super) withdrawn: std::collections::VecDeque<(ApprovalId, String)>,
}

/// How many withdrawn requests are remembered for late answers.
pub const WITHDRAWN_REMEMBERED: usize = 1024;

impl<W> Default for ApprovalCore<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W> ApprovalCore<W> {
    pub fn new() -> Self {
        Self {
            keys: Vec::new(),
            pending: HashMap::new(),
            next_seq: 0,
            withdrawn: std::collections::VecDeque::new(),
        }
    }

    /// Whether a live key covers `command` in `conversation_id`.
    pub fn is_approved(
        &self,
        conversation_id: ConversationId,
        command: &[String],
        now_ms: u64,
    ) -> bool {
        self.keys
            .iter()
            .any(|key| covers(key, conversation_id, command, now_ms))
    }

    /// Admits a request: remembered, attached to an identical pending one, or opened with a
    /// deadline `timeout_ms` from now.
    pub fn request(
        &mut self,
        ask: Ask,
        now_ms: u64,
        timeout_ms: u64,
        waiter: W,
    ) -> AskAdmission<W> {
        // An elicitation or a question asks for content: no key answers it and no other
        // request shares it.
        let shareable = !ask.subject.takes_content();
        if shareable
            && let Some(path) = key_path(&ask.subject, &ask.command, ask.workdir.as_deref())
            && self.is_approved(ask.conversation_id, &path, now_ms)
        {
            return AskAdmission::Remembered(waiter);
        }
        if shareable
            && let Some(same) = self.pending.values_mut().find(|p| {
                p.info.conversation_id == ask.conversation_id
                    && p.info.command == ask.command
                    && p.info.workdir == ask.workdir
                    // The same kind of question: running a command in the sandbox and
                    // without it are two.
                    && std::mem::discriminant(&p.info.subject)
                        == std::mem::discriminant(&ask.subject)
            })
        {
            same.waiters.push(waiter);
            return AskAdmission::Attached(same.info.approval_id);
        }
        let info = PendingApproval {
            approval_id: ApprovalId::new(),
            conversation_id: ask.conversation_id,
            task_id: ask.task_id,
            command: ask.command,
            reason: ask.reason,
            requested_at_ms: now_ms,
            deadline_ms: now_ms.saturating_add(timeout_ms),
            subject: ask.subject,
            workdir: ask.workdir,
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.insert(
            info.approval_id,
            Pending {
                info: info.clone(),
                seq,
                waiters: vec![waiter],
            },
        );
        AskAdmission::Opened(info)
    }

    /// Applies a decision to a pending request: stores its key, settles the request, and
    /// settles as `Remembered` every other pending request the new key covers (oldest first,
    /// after the decided one). `NotFound` when the request is unknown or already settled.
    pub fn decide(
        &mut self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
        now_ms: u64,
    ) -> Result<Vec<Resolution<W>>, AgentError> {
        let Some(request) = self.pending.get(&approval_id) else {
            return Err(self.gone(approval_id));
        };
        // Checked before anything changes: a decision that does not fit leaves it pending.
        let decision = fit_decision(&request.info.subject, decision)?;
        let Some(decided) = self.pending.remove(&approval_id) else {
            return Err(AgentError::not_found("approval", approval_id));
        };
        if !decision.approves() {
            let reason = denial_reason(&decision, &decided.info);
            return Ok(vec![deny(decided, decision, reason)]);
        }
        let key = key_path(
            &decided.info.subject,
            &decided.info.command,
            decided.info.workdir.as_deref(),
        )
        .and_then(|path| key_for(&decision, decided.info.conversation_id, &path, now_ms));
        let mut resolutions = vec![Resolution {
            answer: Ok(Granted::Decided(decision.clone())),
            decision: decision.clone(),
            request: decided.info,
            waiters: decided.waiters,
            withdrawn: false,
        }];
        if let Some(key) = key {
            let mut covered: Vec<Pending<W>> = self
                .pending
                .extract_if(|_, p| {
                    key_path(&p.info.subject, &p.info.command, p.info.workdir.as_deref())
                        .is_some_and(|path| covers(&key, p.info.conversation_id, &path, now_ms))
                })
                .map(|(_, p)| p)
                .collect();
            covered.sort_by_key(|p| p.seq);
            resolutions.extend(covered.into_iter().map(|p| Resolution {
                answer: Ok(Granted::Remembered),
                decision: decision.clone(),
                request: p.info,
                waiters: p.waiters,
                withdrawn: false,
            }));
            self.insert_key(key);
        }
        Ok(resolutions)
    }

    /// Denies a request that ran out of time; `None` when it was already settled.
    pub fn time_out(&mut self, approval_id: ApprovalId) -> Option<Resolution<W>> {
        let pending = self.pending.remove(&approval_id)?;
        let reason = denial_reason(&ApprovalDecision::TimedOut, &pending.info);
        let mut resolution = deny(pending, ApprovalDecision::TimedOut, reason);
        if !resolution.request.subject.is_command() {
            // Nobody answered: for a server that is a cancelled dialog, not a refusal.
            let request = &resolution.request;
            resolution.answer = Err(AgentError::Timeout {
                what: format!("a human's answer to `{}`", request.command.join(" ")),
                after_ms: request.deadline_ms.saturating_sub(request.requested_at_ms),
            });
        }
        Some(resolution)
    }

    /// Denies the conversation's pending requests (oldest first) and drops its scoped keys.
    pub fn close_conversation(&mut self, conversation_id: ConversationId) -> Vec<Resolution<W>> {
        self.keys
            .retain(|key| key.conversation != Some(conversation_id));
        let mut closed: Vec<Pending<W>> = self
            .pending
            .extract_if(|_, p| p.info.conversation_id == conversation_id)
            .map(|(_, p)| p)
            .collect();
        closed.sort_by_key(|p| p.seq);
        let reason = "conversation closed";
        closed
            .into_iter()
            .map(|p| {
                self.remember_withdrawn(p.info.approval_id, reason);
                withdraw(p, reason)
            })
            .collect()
    }

    /// Why an answer to `approval_id`, which is not pending, finds nothing: it was withdrawn
    /// (`Cancelled`, with the reason), else `NotFound` (unknown, or already answered).
    pub fn gone(&self, approval_id: ApprovalId) -> AgentError {
        match self.withdrawn.iter().find(|(id, _)| *id == approval_id) {
            Some((_, why)) => AgentError::Cancelled {
                reason: format!(
                    "approval {approval_id} was withdrawn ({why}); nobody waits for an answer"
                ),
            },
            None => AgentError::not_found("approval", approval_id),
        }
    }

    /// Withdraws the pending requests of a task that was cancelled or aborted (oldest first),
    /// as denials whose reason says so.
    pub fn withdraw_task(
        &mut self,
        conversation_id: ConversationId,
        task_id: TaskId,
        why: &str,
    ) -> Vec<Resolution<W>> {
        self.withdraw_where(conversation_id, Some(task_id), why)
    }

    /// Withdraws every pending request of `conversation_id` (its runner was aborted: its
    /// conversation failed), whoever still holds a reply port, oldest first.
    pub fn withdraw_conversation(
        &mut self,
        conversation_id: ConversationId,
        why: &str,
    ) -> Vec<Resolution<W>> {
        self.withdraw_where(conversation_id, None, why)
    }

    /// Withdraws the pending requests of `conversation_id` (of `task_id` only, if given).
    fn withdraw_where(
        &mut self,
        conversation_id: ConversationId,
        task_id: Option<TaskId>,
        why: &str,
    ) -> Vec<Resolution<W>> {
        let mut theirs: Vec<Pending<W>> = self
            .pending
            .extract_if(|_, p| {
                p.info.conversation_id == conversation_id
                    && task_id.is_none_or(|t| p.info.task_id == Some(t))
            })
            .map(|(_, p)| p)
            .collect();
        theirs.sort_by_key(|p| p.seq);
        let reason = format!("withdrawn: {why}");
        theirs
            .into_iter()
            .map(|p| {
                self.remember_withdrawn(p.info.approval_id, &reason);
                withdraw(p, &reason)
            })
            .collect()
    }

    fn remember_withdrawn(&mut self, approval_id: ApprovalId, why: &str) {
        if self.withdrawn.len() == WITHDRAWN_REMEMBERED {
            self.withdrawn.pop_front();
        }
        self.withdrawn.push_back((approval_id, why.to_owned()));
    }

    /// Withdraws the conversation's pending requests whose every waiter is `gone` (oldest
    /// first), as denials.
    pub fn withdraw_abandoned(
        &mut self,
        conversation_id: ConversationId,
        gone: impl Fn(&W) -> bool,
    ) -> Vec<Resolution<W>> {
        let mut abandoned: Vec<Pending<W>> = self
            .pending
            .extract_if(|_, p| {
                p.info.conversation_id == conversation_id && p.waiters.iter().all(&gone)
            })
            .map(|(_, p)| p)
            .collect();
        abandoned.sort_by_key(|p| p.seq);
        let reason = "withdrawn: nobody waits for the answer any more";
        abandoned
            .into_iter()
            .map(|p| {
                self.remember_withdrawn(p.info.approval_id, reason);
                withdraw(p, reason)
            })
            .collect()
    }

    /// Drops expired keys; returns how many.
    pub fn sweep(&mut self, now_ms: u64) -> usize {
        let before = self.keys.len();
        self.keys.retain(|key| !is_expired(key, now_ms));
        before - self.keys.len()
    }

    /// Pending requests, oldest first, optionally of one conversation.
    pub fn pending(&self, conversation_id: Option<ConversationId>) -> Vec<PendingApproval> {
        let mut pending: Vec<&Pending<W>> = self
            .pending
            .values()
            .filter(|p| conversation_id.is_none_or(|c| p.info.conversation_id == c))
            .collect();
        pending.sort_by_key(|p| p.seq);
        pending.into_iter().map(|p| p.info.clone()).collect()
    }

    /// Keys that still hold.
    pub fn live_keys(&self, now_ms: u64) -> Vec<CommandKey> {
        self.keys
            .iter()
            .filter(|key| !is_expired(key, now_ms))
            .cloned()
            .collect()
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Stored keys, expired ones included until swept.
    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// Stores a key; a new decision on the same command and scope replaces the old expiry.
    pub(super) fn insert_key(&mut self, key: CommandKey) {
        match self
            .keys
            .iter_mut()
            .find(|k| k.path == key.path && k.conversation == key.conversation)
        {
            Some(existing) => existing.expires_at_ms = key.expires_at_ms,
            None => self.keys.push(key),
        }
    }
}

/// Whether `key` lets `command` run in `conversation_id` at `now_ms`: the argv is identical, the
/// key is session-wide or scoped to that conversation, and it has not expired.
pub fn covers(
    key: &CommandKey,
    conversation_id: ConversationId,
    command: &[String],
    now_ms: u64,
) -> bool {
    key.path == command
        && key.conversation.is_none_or(|c| c == conversation_id)
        && !is_expired(key, now_ms)
}

/// The key a decision leaves behind, if any.
pub fn key_for(
    decision: &ApprovalDecision,
    conversation_id: ConversationId,
    command: &[String],
    now_ms: u64,
) -> Option<CommandKey> {
    let (conversation, ttl_secs) = match decision {
        ApprovalDecision::ApproveForConversation { ttl_secs } => (Some(conversation_id), *ttl_secs),
        ApprovalDecision::ApproveForSession { ttl_secs } => (None, *ttl_secs),
        ApprovalDecision::ApproveOnce
        | ApprovalDecision::ApproveWithContent { .. }
        | ApprovalDecision::Deny { .. }
        | ApprovalDecision::TimedOut => return None,
    };
    Some(CommandKey {
        path: command.to_vec(),
        conversation,
        expires_at_ms: ttl_secs.map(|secs| now_ms.saturating_add(secs.saturating_mul(1000))),
    })
}

/// The path a key for this request is stored (and looked up) under; `None` when no key may
/// answer it (an elicitation, a question). A command's path is its argv; every other kind
/// starts with a NUL-led marker: `"\0unsandboxed"` (a command to run without the sandbox),
/// `"\0patch"` (a patch, then the files it touches), `"\0mcp"` (a server's sampling). A
/// command run in a directory its call named is remembered with that directory (`"\0cwd"`,
/// the directory, then the argv): approving `rm -rf build` in the workspace does not approve
/// it elsewhere. A request with a NUL anywhere in its command or directory is never
/// remembered (`None`), so no request can spell another's path: the shell tool refuses such
/// arguments anyway, but commands also come from ACP agents and A2A peers.
pub fn key_path(
    subject: &ApprovalSubject,
    command: &[String],
    workdir: Option<&str>,
) -> Option<Vec<String>> {
    if command
        .iter()
        .map(String::as_str)
        .chain(workdir)
        .any(|s| s.contains('\0'))
    {
        return None;
    }
    let in_dir = |argv: Vec<String>| match workdir {
        Some(dir) => ["\0cwd".to_owned(), dir.to_owned()]
            .into_iter()
            .chain(argv)
            .collect(),
        None => argv,
    };
    match subject {
        ApprovalSubject::Command => Some(in_dir(command.to_vec())),
        ApprovalSubject::CommandWithoutSandbox => Some(
            std::iter::once("\0unsandboxed".to_owned())
                .chain(in_dir(command.to_vec()))
                .collect(),
        ),
        ApprovalSubject::Patch => Some(
            std::iter::once("\0patch".to_owned())
                .chain(command.iter().cloned())
                .collect(),
        ),
        ApprovalSubject::McpSampling { server, .. } => Some(vec![
            "\0mcp".to_owned(),
            server.clone(),
            "sampling".to_owned(),
        ]),
        ApprovalSubject::McpElicitation { .. } | ApprovalSubject::AgentQuestion { .. } => None,
    }
}

/// The decision as it applies to `subject`: an approved elicitation becomes
/// `ApproveWithContent` with its resolved content; content for anything else, or content the
/// schema refuses, is `InvalidInput`.
pub fn fit_decision(
    subject: &ApprovalSubject,
    decision: ApprovalDecision,
) -> Result<ApprovalDecision, AgentError> {
    match subject {
        ApprovalSubject::McpElicitation { schema, .. } if decision.approves() => {
            elicitation::resolve_content(schema, &decision)
                .map(|content| ApprovalDecision::ApproveWithContent { content })
                .map_err(AgentError::invalid)
        }
        ApprovalSubject::McpElicitation { .. } => Ok(decision),
        ApprovalSubject::AgentQuestion { .. } if decision.approves() => {
            match troupe_proto::approval::answer_text(&decision) {
                Some(_) => Ok(decision),
                None => Err(AgentError::invalid(
                    "an agent's question is answered with content {\"answer\": \"<text>\"}, or denied",
                )),
            }
        }
        ApprovalSubject::AgentQuestion { .. } => Ok(decision),
        _ if matches!(decision, ApprovalDecision::ApproveWithContent { .. }) => {
            Err(AgentError::invalid(
                "content answers an MCP elicitation only; approve or deny this request",
            ))
        }
        _ => Ok(decision),
    }
}

/// An expiry is exclusive: at `expires_at_ms` the key no longer holds.
pub(super) fn is_expired(key: &CommandKey, now_ms: u64) -> bool {
    key.expires_at_ms.is_some_and(|at| now_ms >= at)
}

/// The reason a refused caller reads.
pub(super) fn denial_reason(decision: &ApprovalDecision, request: &PendingApproval) -> String {
    match decision {
        ApprovalDecision::Deny {
            reason: Some(reason),
        } => reason.clone(),
        ApprovalDecision::TimedOut => format!(
            "approval timed out after {} ms",
            request.deadline_ms.saturating_sub(request.requested_at_ms)
        ),
        _ => "denied by user".to_owned(),
    }
}

pub(super) fn deny<W>(
    pending: Pending<W>,
    decision: ApprovalDecision,
    reason: String,
) -> Resolution<W> {
    Resolution {
        answer: Err(AgentError::ApprovalDenied {
            command: pending.info.command.clone(),
            reason,
        }),
        decision,
        request: pending.info,
        waiters: pending.waiters,
        withdrawn: false,
    }
}

/// A request withdrawn with `reason` (a denial nobody decided).
pub(super) fn withdraw<W>(pending: Pending<W>, reason: &str) -> Resolution<W> {
    let decision = ApprovalDecision::Deny {
        reason: Some(reason.to_owned()),
    };
    Resolution {
        withdrawn: true,
        ..deny(pending, decision, reason.to_owned())
    }
}

pub(super) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
