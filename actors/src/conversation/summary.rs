//! The model summarizer (S6, `SummaryMode::Model`): when a trim folds items into the summary,
//! the local summary goes in at once (the bounds hold at every moment), and a task outside
//! the conversation's mailbox asks the conversation's model for a better one over the
//! previous summary and the removed items. It reports with `SummaryWritten`; the summary is
//! replaced only if it is still the one the model was asked about (nothing trimmed or
//! compacted meanwhile). A model that fails, answers nothing or takes longer than the timeout
//! leaves the local summary, with a `summary_fallback` warning.

use super::*;
use crate::history::{HistoryLimits, LocalSummarizer};
use crate::ports::{DeltaSink, ModelRequest};
use tracing::Instrument;
use troupe_proto::HistoryItem;

/// The user message of a summary call.
pub const SUMMARY_REQUEST: &str =
    "Summarize the conversation above (the earlier summary included) for your own later use.";

/// Why a model summary did not replace the local one.
#[derive(Debug, Clone, PartialEq)]
pub enum SummaryFailure {
    /// The model call failed.
    Failed(AgentError),
    /// It answered with no text.
    Empty,
    /// It did not answer within the timeout.
    TimedOut(Duration),
}

impl SummaryFailure {
    /// The metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Failed(_) => "failed",
            Self::Empty => "empty",
            Self::TimedOut(_) => "timed_out",
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Failed(e) => format!("the model summary failed ({e}); the local summary stays"),
            Self::Empty => "the model wrote an empty summary; the local summary stays".into(),
            Self::TimedOut(after) => format!(
                "the model summary took longer than {} ms; the local summary stays",
                after.as_millis()
            ),
        }
    }
}

/// What a model summary's answer does to the history.
#[derive(Debug, Clone, PartialEq)]
pub enum SummaryAnswer {
    /// It replaces the summary.
    Replace,
    /// The summary changed since it was asked for: dropped.
    Stale,
    /// The local summary stays, with a warning.
    Fallback(SummaryFailure),
}

/// Decides what a model summary's answer does: `asked` is the summary generation it was
/// asked about, `now` the history's.
pub fn summary_answer(
    asked: u64,
    now: u64,
    answer: &Result<String, SummaryFailure>,
) -> SummaryAnswer {
    match answer {
        Err(failure) => SummaryAnswer::Fallback(failure.clone()),
        Ok(_) if asked != now => SummaryAnswer::Stale,
        Ok(_) => SummaryAnswer::Replace,
    }
}

/// Streamed text of a summary goes nowhere: the summary is taken whole.
struct Discard;

impl DeltaSink for Discard {
    fn text_delta(&mut self, _delta: &str) {}
}

/// Asks `model` for a summary of `previous` and `removed`, at most `timeout`.
pub async fn model_summary(
    model: Arc<dyn ModelClient>,
    conversation_id: ConversationId,
    previous: Option<HistoryItem>,
    removed: Vec<HistoryItem>,
    timeout: Duration,
) -> Result<String, SummaryFailure> {
    let mut items = Vec::with_capacity(removed.len() + 1);
    items.extend(previous);
    items.extend(removed);
    let input = [HistoryItem::user(SUMMARY_REQUEST)];
    // Everything is in `items`: the history the view walks is empty.
    let empty = HistoryStore::new(
        HistoryLimits::default(),
        Arc::new(LocalSummarizer::default()),
    )
    .snapshot();
    let request = ModelRequest {
        conversation_id,
        task_id: TaskId::new(),
        instructions: COMPACT_INSTRUCTIONS,
        prompt: empty.view(None, &items, &input),
        tools: &[],
        prompt_cache_key: "history-summary",
    };
    let cancel = CancellationToken::new();
    let mut discard = Discard;
    let call = model.step(request, &mut discard, &cancel);
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) if response.text.trim().is_empty() => Err(SummaryFailure::Empty),
        Ok(Ok(response)) => Ok(response.text),
        Ok(Err(e)) => Err(SummaryFailure::Failed(e)),
        Err(_) => {
            cancel.cancel();
            Err(SummaryFailure::TimedOut(timeout))
        }
    }
}

/// Stops a summary request a newer trim supersedes. One still at work is counted `stale`
/// here (it will never answer); one that already answered is counted when its answer is
/// read, as it is in the mailbox.
fn supersede(old: &tokio::task::AbortHandle) {
    if !old.is_finished() {
        metrics::model_summary("stale");
    }
    old.abort();
}

impl ConversationState {
    /// After a trim: with the model summarizer, asks the model for the summary in a task of
    /// its own (a newer trim supersedes an older request).
    pub(super) fn ask_model_summary(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        previous: Option<HistoryItem>,
    ) {
        let removed = self.history.take_trimmed();
        let crate::history::SummaryMode::Model { timeout } = self.services.settings.summary else {
            return;
        };
        if removed.is_empty() {
            return;
        }
        if let Some(old) = self.summary_task.take() {
            supersede(&old);
        }
        let generation = self.history.summary_generation();
        let model = self.model.clone();
        let (me, id) = (myself.clone(), self.id);
        tracing::debug!(conversation_id = %id, removed = removed.len(), "model summary asked");
        let task = tokio::spawn(
            async move {
                let result = model_summary(model, id, previous, removed, timeout).await;
                let _ = me.cast(ConversationMsg::SummaryWritten { generation, result });
            }
            .instrument(tracing::Span::current()),
        );
        self.summary_task = Some(task.abort_handle());
    }

    pub(super) fn on_summary_written(
        &mut self,
        generation: u64,
        result: Result<String, SummaryFailure>,
    ) {
        self.summary_task = None;
        match summary_answer(generation, self.history.summary_generation(), &result) {
            SummaryAnswer::Replace => {
                let text = result.unwrap_or_default();
                self.history.replace_summary(generation, &text);
                metrics::model_summary("written");
                tracing::info!(conversation_id = %self.id, bytes = text.len(), "history summary written by the model");
                let summary = match self.history.summary() {
                    Some(HistoryItem::Summary { text, .. }) => text.clone(),
                    _ => text,
                };
                // Nothing more was trimmed: only the summary changed.
                self.services.events.emit(
                    EventDraft::conversation(
                        self.id,
                        EventKind::HistoryTrimmed {
                            removed_items: 0,
                            summary,
                        },
                    )
                    .carrying_content_since(self.summary_since_ms),
                );
                self.emit_checkpoint();
            }
            SummaryAnswer::Stale => {
                metrics::model_summary("stale");
                tracing::debug!(conversation_id = %self.id, "model summary of an older history dropped");
            }
            SummaryAnswer::Fallback(failure) => {
                metrics::model_summary(failure.label());
                let message = failure.message();
                tracing::warn!(conversation_id = %self.id, "{message}");
                self.services.events.emit(EventDraft::conversation(
                    self.id,
                    EventKind::Warning {
                        code: WarningCode::SummaryFallback,
                        message,
                    },
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superseded request still at work is counted `stale` (it never answers); one that
    /// already answered is not counted twice.
    #[tokio::test(flavor = "current_thread")]
    async fn a_superseded_request_is_counted_stale_once() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let working = tokio::spawn(std::future::pending::<()>()).abort_handle();
        let done = tokio::spawn(async {});
        let done_handle = done.abort_handle();
        done.await.unwrap();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            supersede(&working);
            supersede(&done_handle);
        });
        let stale: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key().name() == super::metrics::MODEL_SUMMARIES
                    && key.key().labels().any(|l| l.value() == "stale")
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(stale, 1);
        tokio::task::yield_now().await;
        assert!(working.is_finished(), "aborted");
    }

    #[test]
    fn a_model_summary_replaces_the_summary_it_was_asked_about_only() {
        let ok = Ok("summary".to_owned());
        assert_eq!(summary_answer(3, 3, &ok), SummaryAnswer::Replace);
        assert_eq!(summary_answer(3, 4, &ok), SummaryAnswer::Stale);
        let late = Err(SummaryFailure::TimedOut(Duration::from_secs(2)));
        assert_eq!(
            summary_answer(3, 3, &late),
            SummaryAnswer::Fallback(SummaryFailure::TimedOut(Duration::from_secs(2)))
        );
        assert_eq!(
            summary_answer(3, 4, &Err(SummaryFailure::Empty)),
            SummaryAnswer::Fallback(SummaryFailure::Empty),
            "a failure is reported even when stale"
        );
        assert!(
            SummaryFailure::TimedOut(Duration::from_secs(2))
                .message()
                .contains("2000 ms")
        );
    }
}
