//! A conversation's tasks from start to end: starting one (or queueing it), asking the
//! session's current Scheduler for its slot and the answer that decides, rejoining a
//! replaced Scheduler or TaskRegistry, and recording a finished task's stats.

use super::*;

impl ConversationState {
    pub(super) fn start_task(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        kind: TaskKind,
        text: String,
        request: crate::task::TaskRequest,
        reply: Answer,
        caller: &tracing::Span,
    ) {
        let task_id = TaskId::new();
        let crate::task::TaskRequest {
            origin,
            options,
            stored,
        } = request;
        // A dispatched task stops with its dispatch (cancelled, or its lease expired).
        let cancel = origin
            .as_ref()
            .map_or_else(CancellationToken::new, |o| o.cancel.child_token());
        // A message that could not be stored cancels its task wherever it is (a model call
        // included); what it had not acted on yet, it never will ([`crate::task::StoredGate`]).
        if let Some(gate) = stored.clone() {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                if !gate.stored().await {
                    cancel.cancel();
                }
            });
        }
        let settings = self.services.settings.clone();
        let started_at_ms = self.services.clock.now_ms();
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::Register {
                task_id,
                conversation_id: self.id,
                sub_id: sub_id(self.id, task_id),
                cancel: cancel.clone(),
                started_at_ms,
            });
        let info = self.model.info();
        let span = crate::task::spans::invoke_agent(
            crate::task::spans::TaskSpanInfo {
                session_id: self.services.session_id,
                conversation_id: self.id,
                task_id,
                turn: self.turns + 1,
                kind: match kind {
                    TaskKind::Message => "message",
                    TaskKind::Compact => "compact",
                },
                provider: &info.provider,
                model: &info.model,
            },
            // A dispatched task links to its dispatch (`troupe.dispatch`), whoever sent it.
            origin.as_ref().map_or(caller, |o| &o.span),
        );
        metrics::task_started(match kind {
            TaskKind::Message => "message",
            TaskKind::Compact => "compact",
        });
        let started = match kind {
            TaskKind::Message => EventKind::TaskStarted {
                input: text.clone(),
            },
            TaskKind::Compact => EventKind::CompactionStarted {},
        };
        span.in_scope(|| {
            self.services
                .events
                .emit(EventDraft::task(self.id, task_id, started));
        });
        let compact = kind == TaskKind::Compact;
        self.turns += 1;
        let wait = span.in_scope(|| crate::task::spans::scheduler_wait(self.id, task_id));
        // An agent's task whose dispatcher lent it its slot runs at once: nothing is asked.
        let lent = origin.as_ref().is_some_and(|o| o.slot_lent);
        let (slot, first) = if lent {
            self.lent_slot(task_id)
        } else {
            self.ask_slot(myself, task_id, &wait)
        };
        let (granted, granted_rx) = oneshot::channel();
        // `[tools]` and the capabilities as they are now: the task keeps them to its end.
        let reloadable = self.services.settings.reloadable();
        // What a compaction summarizes: the summary and every item the history holds.
        let content_since_ms = compact
            .then(|| {
                if window::held_items(&self.history) > 0 {
                    window::since_with(self.summary_since_ms, self.kept.oldest_started_ms())
                } else {
                    self.summary_since_ms
                }
            })
            .flatten();
        // An agent's task runs its commands under policies no wider than its dispatcher's.
        let (approval_policy, sandbox_policy) = match &origin {
            Some(o) => (
                crate::context::narrow(self.approval_policy, Some(o.governance.approval_policy)).0,
                crate::context::narrow(self.sandbox_policy, Some(o.governance.sandbox_policy)).0,
            ),
            None => (self.approval_policy, self.sandbox_policy),
        };
        let ctx = TaskContext {
            conversation_id: self.id,
            task_id,
            turn: self.turns,
            tokens: self.tokens.clone(),
            input: text,
            history: self.history.snapshot(),
            pinned: self.context.pinned(),
            // A compaction only writes: no tools.
            builtins: if compact {
                crate::tools::OfferedTools::default()
            } else {
                crate::tools::shared_builtins(&self.context.prefs)
            },
            base_instructions: self.context.base_instructions.clone(),
            turn_override: compact.then(|| COMPACT_INSTRUCTIONS.to_owned()),
            content_since_ms,
            model: self.model.clone(),
            mcp: if compact { None } else { self.view.clone() },
            mcp_generation: self.view_generation,
            mcp_allowlist: self.context.mcp_tool_allowlist.clone(),
            exec: self.services.exec.clone(),
            effects: self.services.effects.clone(),
            services: self.services.directory.clone(),
            events: self.services.events.clone(),
            cancel: cancel.clone(),
            limits: settings.task,
            approval_policy,
            sandbox_policy,
            workspace_roots: settings.workspace_roots.clone(),
            record_content: settings.record_content,
            storage_policy: self.storage_policy,
            // A compaction routes nothing and dispatches nothing.
            agents: (!compact).then_some(crate::task::TaskAgents { origin }),
            tool_policy: reloadable.tool_policy.clone(),
            capabilities: reloadable.capabilities.clone(),
            capability_budget: reloadable.capability_budget,
            token_book: self.services.settings.token_book.clone(),
            modules: self.services.settings.modules.clone(),
            options,
            stored,
            slot: {
                let (give, ask) = (myself.clone(), myself.clone());
                crate::task::SlotLease::new(
                    move || {
                        let _ = give.cast(ConversationMsg::YieldSlot { task_id });
                    },
                    move |granted| {
                        // A conversation that stopped drops `granted`: the runner hears it.
                        let _ = ask.cast(ConversationMsg::ReclaimSlot { task_id, granted });
                    },
                )
            },
        };
        let me = myself.clone();
        let task_span = span.clone();
        let asked_of = slot;
        let report: Box<dyn FnOnce(crate::task::SchedulerAnswer) + Send> = if lent {
            // Nothing was asked: the conversation knows where the slot stands already.
            Box::new(|_| {})
        } else {
            let me = myself.clone();
            Box::new(move |answer| {
                let _ = me.cast(ConversationMsg::SlotAnswered {
                    task_id,
                    scheduler: asked_of,
                    answer,
                });
            })
        };
        // A lent slot needs no verdict; the runner has it at once whatever it reads.
        let granted = if lent {
            let _ = granted.send(Ok(()));
            None
        } else {
            Some(granted)
        };
        let slot_wait = SlotWait {
            first,
            asked_of,
            report,
            verdict: granted_rx,
            span: wait.clone(),
        };
        let watch = cancel.clone();
        // Boxed: a task's future is large (a whole turn's state, about 12 KB), and tokio
        // copies a spawned future by value as it stores it and again as it ends it; boxed,
        // it is copied once, into its box.
        let join = tokio::spawn(Box::pin(async move {
            // A panic still ends the task, so that its slot is given back and its caller hears.
            let run = std::panic::AssertUnwindSafe(crate::task::run(ctx, slot_wait, task_span))
                .catch_unwind();
            tokio::pin!(run);
            // Whoever cancels the task (close, `CancelAll`, the TaskRegistry), the
            // conversation hears it and gives the task the close timeout to end.
            let outcome = tokio::select! {
                biased;
                outcome = &mut run => outcome,
                () = watch.cancelled() => {
                    let _ = me.cast(ConversationMsg::CancelSeen { task_id });
                    run.await
                }
            }
            .unwrap_or_else(|_| runner_panicked());
            let _ = me.cast(ConversationMsg::TaskFinished {
                task_id,
                outcome: Box::new(outcome),
            });
        }));
        self.running = Some(Running {
            task_id,
            kind,
            span,
            reply: Some(reply),
            cancel,
            abort: join.abort_handle(),
            started_at_ms,
            content_since_ms,
            slot: Some(if lent {
                SlotState::Lent
            } else {
                SlotState::Asked(slot)
            }),
            granted,
            wait,
        });
    }

    /// The slot an agent's task was lent by its dispatcher: granted already (the current
    /// scheduler's id, so that the runner goes on at once), and the task is running.
    fn lent_slot(&self, task_id: TaskId) -> (ActorId, oneshot::Receiver<Result<(), AgentError>>) {
        let (granted, answer) = oneshot::channel();
        let _ = granted.send(Ok(()));
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::StateChanged {
                task_id,
                state: TaskState::Running,
            });
        (self.services.directory.scheduler().get_id(), answer)
    }

    /// Asks the current scheduler for `task_id`'s slot: the scheduler asked, and a receiver of
    /// its answer (closed if the scheduler is gone: the Session replaces it, and its successor
    /// is asked then).
    pub(super) fn ask_slot(
        &self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
        wait: &tracing::Span,
    ) -> (ActorId, oneshot::Receiver<Result<(), AgentError>>) {
        let scheduler = self.services.directory.scheduler();
        let at = scheduler.get_id();
        let (reply, answer) = oneshot::channel();
        // Sent in the wait's span: the scheduler logs the grant in the task's trace.
        let _ = wait.in_scope(|| {
            scheduler.cast(SchedulerMsg::Acquire {
                task_id,
                conversation_id: self.id,
                holder: myself.get_cell(),
                reply: reply.into(),
            })
        });
        (at, answer)
    }

    /// Asks a new scheduler again for a task that waited at the one it replaced; its answer
    /// comes back as `SlotAnswered`, and the runner gets the verdict.
    pub(super) fn ask_again(
        &self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
        wait: &tracing::Span,
    ) -> SlotState {
        let (at, answer) = self.ask_slot(myself, task_id, wait);
        let me = myself.clone();
        tokio::spawn(async move {
            let answer = answer.await.ok();
            let _ = me.cast(ConversationMsg::SlotAnswered {
                task_id,
                scheduler: at,
                answer,
            });
        });
        SlotState::Asked(at)
    }

    pub(super) fn on_slot_answered(
        &mut self,
        task_id: TaskId,
        from: ActorId,
        answer: Option<Result<(), AgentError>>,
    ) {
        let Some(running) = self.running.as_mut().filter(|r| r.task_id == task_id) else {
            return; // the task is over: its end released whatever it was granted
        };
        match slot_answer(running.slot, from, answer) {
            SlotAnswer::Granted => {
                running.slot = Some(SlotState::Held(from));
                let _ = self
                    .services
                    .directory
                    .registry()
                    .cast(TaskRegistryMsg::StateChanged {
                        task_id,
                        state: TaskState::Running,
                    });
                if let Some(granted) = running.granted.take() {
                    let _ = granted.send(Ok(()));
                }
            }
            SlotAnswer::Refused(error) => {
                running.slot = None;
                if let Some(granted) = running.granted.take() {
                    let _ = granted.send(Err(error));
                }
            }
            SlotAnswer::Lost => {
                tracing::info!(conversation_id = %self.id, %task_id, "scheduler stopped before answering; its successor will be asked");
            }
            SlotAnswer::Stale => {}
        }
    }

    /// The running task waits for a human: its slot goes back to the scheduler, so that
    /// another conversation's task may run meanwhile.
    pub(super) fn on_yield_slot(&mut self, task_id: TaskId) {
        let Some(running) = self.running.as_mut().filter(|r| r.task_id == task_id) else {
            return;
        };
        if yield_plan(running.slot) == YieldPlan::Release {
            running.slot = Some(SlotState::Yielded);
            metrics::slot_yielded();
            running.span.in_scope(|| {
                tracing::info!(conversation_id = %self.id, %task_id, "slot given back while waiting for a human");
            });
            let _ = self
                .services
                .directory
                .scheduler()
                .cast(SchedulerMsg::Release { task_id });
        }
    }

    /// The running task was answered: it asks for its slot again and waits its turn.
    pub(super) fn on_reclaim_slot(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
        granted: oneshot::Sender<Result<(), AgentError>>,
    ) {
        let Some(running) = self.running.as_mut().filter(|r| r.task_id == task_id) else {
            return; // dropping `granted` tells the runner
        };
        match reclaim_plan(running.slot) {
            ReclaimPlan::AlreadyHeld => {
                let _ = granted.send(Ok(()));
            }
            ReclaimPlan::Pending => {
                // Asked already (the reclaim that asked gave up waiting): this waiter takes its
                // place; asking again would be refused as a second request of the task.
                running.granted = Some(granted);
            }
            ReclaimPlan::Ask => {
                running.granted = Some(granted);
                let wait = running.wait.clone();
                let slot = self.ask_again(myself, task_id, &wait);
                if let Some(running) = self.running.as_mut() {
                    running.slot = Some(slot);
                }
            }
        }
    }

    /// The directory changed: re-declares to each new service what it must know.
    pub(super) async fn on_services_changed(&mut self, myself: &ActorRef<ConversationMsg>) {
        let now = self.services.directory.generations();
        let replaced = now.replaced_since(&self.seen);
        self.seen = now;
        if replaced.scheduler {
            self.rejoin_scheduler(myself);
        }
        if replaced.registry {
            self.rejoin_registry();
        }
        if replaced.mcp {
            self.reopen_view().await;
        }
    }

    pub(super) fn rejoin_scheduler(&mut self, myself: &ActorRef<ConversationMsg>) {
        let scheduler = self.services.directory.scheduler();
        let current = scheduler.get_id();
        let slot = self.running.as_ref().and_then(|r| r.slot);
        match rejoin(slot, current) {
            Rejoin::Nothing => {}
            Rejoin::Recovered => {
                let _ = scheduler.cast(SchedulerMsg::Recovered {
                    holder: myself.get_cell(),
                });
            }
            Rejoin::Reinstate => {
                if let Some(running) = &mut self.running {
                    running.slot = Some(SlotState::Held(current));
                    let task_id = running.task_id;
                    tracing::info!(conversation_id = %self.id, %task_id, "grant re-declared to the new scheduler");
                    let _ = scheduler.cast(SchedulerMsg::Reinstate {
                        task_id,
                        conversation_id: self.id,
                        holder: myself.get_cell(),
                    });
                }
            }
            Rejoin::AskAgain => {
                if let Some(running) = &self.running {
                    let (task_id, wait) = (running.task_id, running.wait.clone());
                    tracing::info!(conversation_id = %self.id, %task_id, "slot asked again of the new scheduler");
                    let slot = self.ask_again(myself, task_id, &wait);
                    if let Some(running) = &mut self.running {
                        running.slot = Some(slot);
                    }
                }
            }
        }
    }

    pub(super) fn rejoin_registry(&self) {
        let Some(running) = &self.running else {
            return;
        };
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::Reinstate {
                task_id: running.task_id,
                conversation_id: self.id,
                sub_id: sub_id(self.id, running.task_id),
                cancel: running.cancel.clone(),
                started_at_ms: running.started_at_ms,
                state: registry_state(running.cancel.is_cancelled(), running.slot),
            });
    }

    pub(super) fn on_task_finished(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
        outcome: TaskOutcome,
    ) {
        let Some(mut running) = self.running.take_if(|r| r.task_id == task_id) else {
            return; // a late report of an aborted task
        };
        if let Some(timer) = self.abort_timer.take() {
            timer.abort();
        }
        if running.cancel.is_cancelled() {
            self.withdraw_approvals(task_id, "its task was cancelled");
        }
        match running.kind {
            TaskKind::Message => {
                let previous = self.history.summary().cloned();
                self.kept
                    .appended_at(task_id, outcome.items.len() as u64, running.started_at_ms);
                // What a trim removes is no older than the oldest kept task.
                let oldest = self.kept.oldest_started_ms();
                let trimmed = self.history.append(outcome.items.iter().cloned());
                self.kept.keep(window::held_items(&self.history));
                if let Some(report) = trimmed {
                    self.summary_since_ms = window::since_with(self.summary_since_ms, oldest);
                    self.services.events.emit(
                        EventDraft::conversation(
                            self.id,
                            EventKind::HistoryTrimmed {
                                removed_items: report.removed_items,
                                summary: report.summary,
                            },
                        )
                        .carrying_content_since(self.summary_since_ms),
                    );
                    self.emit_checkpoint();
                    self.ask_model_summary(myself, previous);
                }
            }
            TaskKind::Compact if outcome.status == TaskStatus::Ok && !outcome.text.is_empty() => {
                // The compaction's summary stands for everything the history held: its items
                // (if any) and the summary before it.
                if window::held_items(&self.history) > 0 {
                    self.summary_since_ms =
                        window::since_with(self.summary_since_ms, self.kept.oldest_started_ms());
                }
                let report = self.history.compact(outcome.text.clone());
                self.kept.clear();
                running.span.in_scope(|| {
                    self.services.events.emit(
                        EventDraft::task(
                            self.id,
                            task_id,
                            EventKind::Compacted {
                                summary: report.summary,
                                replaced_items: report.removed_items,
                            },
                        )
                        .carrying_content_since(self.summary_since_ms),
                    );
                    self.emit_checkpoint();
                });
            }
            // A failed compaction leaves the history as it was.
            TaskKind::Compact => {}
        }
        self.record_stats(&outcome.stats, outcome.status);
        running.span.in_scope(|| {
            self.services.events.emit(
                EventDraft::task(
                    self.id,
                    task_id,
                    EventKind::TaskFinished {
                        status: outcome.status,
                        text: outcome.text.clone(),
                        stats: outcome.stats.clone(),
                        error: outcome.error.clone(),
                    },
                )
                .carrying_content_since(running.content_since_ms),
            );
        });
        self.let_go(task_id, running.slot);
        if let Some(reply) = running.reply.take() {
            let _ = reply.send(Ok(MessageReply {
                conversation_id: self.id,
                task_id,
                status: outcome.status,
                text: outcome.text,
                stats: outcome.stats,
                error: outcome.error,
                items: outcome.items,
                item_times_ms: outcome.item_times_ms,
            }));
        }
        self.after_task(myself, CloseOutcome::Closed);
    }

    /// A task that ended (or was aborted) lets go of what it held: its slot goes back to the
    /// scheduler of the moment (the one that granted it, or its successor once the grant was
    /// re-declared; a scheduler that never heard of the task ignores this), unless it was lent
    /// by a dispatcher, whose it stays; and the TaskRegistry forgets it.
    pub(super) fn let_go(&self, task_id: TaskId, slot: Option<SlotState>) {
        if releases_at_end(slot) {
            let _ = self
                .services
                .directory
                .scheduler()
                .cast(SchedulerMsg::Release { task_id });
        }
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::Deregister { task_id });
    }

    /// What follows a task's end: a close that waited for it finishes (`closed` says how),
    /// else the next queued task starts.
    pub(super) fn after_task(&mut self, myself: &ActorRef<ConversationMsg>, closed: CloseOutcome) {
        if self.closing.is_some() {
            self.finish_close(myself, closed);
        } else if let Some(next) = self.queue.pop_front() {
            self.start_task(
                myself,
                next.kind,
                next.text,
                next.request,
                next.reply,
                &next.caller,
            );
        }
    }

    /// Records where a restore of this conversation may start (S6): the summary, the oldest
    /// kept item's task, the turns and statistics so far. Called after every change of the
    /// summary, before the statistics of the task that caused it are added (its
    /// `task_finished` comes after the checkpoint, and a restore adds it).
    pub(super) fn emit_checkpoint(&self) {
        let (summary, replaced_items) = match self.history.summary() {
            Some(troupe_proto::HistoryItem::Summary {
                text,
                replaced_items,
            }) => (Some(text.clone()), *replaced_items),
            _ => (None, 0),
        };
        // With nothing kept, a message task running now (a model summary can arrive while one
        // runs) still has all its items to come: a restore reads from its start.
        let running = self
            .running
            .as_ref()
            .filter(|r| matches!(r.kind, TaskKind::Message))
            .map(|r| (r.task_id, 0));
        let (from_task, skip_items) = self
            .kept
            .anchor()
            .or(running)
            .map_or((None, 0), |(task, skip)| (Some(task), skip));
        tracing::debug!(conversation_id = %self.id, ?from_task, skip_items, turns = self.turns, "history checkpoint");
        self.services.events.emit(
            EventDraft::conversation(
                self.id,
                EventKind::HistoryCheckpoint {
                    summary,
                    replaced_items,
                    from_task,
                    skip_items,
                    turns: self.turns,
                    stats: self.stats.clone(),
                },
            )
            .carrying_content_since(self.summary_since_ms),
        );
    }

    pub(super) fn record_stats(&mut self, stats: &TaskStats, status: TaskStatus) {
        crate::context::add_task_stats(&mut self.stats, stats, status);
        metrics::task_finished(status, stats);
    }
}
