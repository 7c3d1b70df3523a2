//! HistoryStore (S6) and PromptView (S7): what a conversation remembers, kept bounded, and the
//! prompt built over it without copying it.
//!
//! History is a deque of segments, each an `Arc<Segment>` of at most `segment_items` items.
//! Only the last (open) segment grows; it is changed in place through `Arc::make_mut`, so it is
//! copied only while a snapshot still holds it, and no other segment is ever copied. A
//! [`HistorySnapshot`] clones the `Arc`s, never the items, and a [`PromptView`] iterates a
//! snapshot together with the pinned instructions, the pending items and the new input.
//!
//! When the held items pass `max_items` or `max_tokens`, whole oldest segments are removed (the
//! oldest items of the last one if it alone is too big) and folded by the [`Summarizer`] into a
//! single `HistoryItem::Summary`, held in its own slot in front of the segments. Room for the
//! summary (one item and an eighth of `max_tokens`) is reserved when trimming, and the store
//! caps whatever the summarizer returns to that room, so both bounds hold after every append,
//! summary included.
//!
//! A summary written elsewhere (by the model, `SummaryMode::Model`, see
//! `conversation::summary`) replaces the local one through [`HistoryStore::replace_summary`],
//! only while the summary is still the one it was asked about (its generation), and is capped
//! to the same room; the items a trim removed are kept for it ([`HistoryStore::keep_trimmed`]).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use troupe_proto::{HistoryItem, Role};

/// Folds trimmed items into the running summary.
pub trait Summarizer: Send + Sync + 'static {
    /// Folds `removed` (oldest first) into the `previous` summary. The result must stay bounded.
    fn summarize(&self, previous: Option<&str>, removed: &[HistoryItem]) -> String;
}

/// Local, deterministic summarizer: keeps the previous summary's tail plus a one-line digest
/// per removed message/tool call (role + first ~80 chars), truncated to `max_chars` (on a char
/// boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSummarizer {
    /// Upper bound of the summary, in bytes (UTF-8), so also a bound on its token estimate.
    pub max_chars: usize,
}

impl Default for LocalSummarizer {
    fn default() -> Self {
        Self { max_chars: 4000 }
    }
}

/// Characters of each removed item that make it into its digest line.
const DIGEST_CHARS: usize = 80;

impl Summarizer for LocalSummarizer {
    fn summarize(&self, previous: Option<&str>, removed: &[HistoryItem]) -> String {
        // Only the tail survives, so the previous summary never needs more than `max_chars`.
        let mut out = String::new();
        if let Some(previous) = previous {
            out.push_str(tail_on_char_boundary(previous, self.max_chars));
        }
        for item in removed {
            if !out.is_empty() {
                out.push('\n');
            }
            push_digest(&mut out, item);
        }
        tail_lines(&out, self.max_chars).to_owned()
    }
}

/// Who writes a conversation's summary when its history is trimmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SummaryMode {
    /// The session's [`Summarizer`] (local), at once.
    #[default]
    Local,
    /// The conversation's model, in a task outside the conversation's mailbox; the local
    /// summary stands in until it answers and stays if it fails or takes longer than `timeout`.
    Model { timeout: std::time::Duration },
}

/// Bounds of a [`HistoryStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Most items held, summary included. Raised to at least 2 (the summary and one item).
    pub max_items: usize,
    /// Most approximate tokens held, summary included. Raised to at least 64.
    pub max_tokens: usize,
    /// Items per segment: the unit of trimming and of copy-on-write. Kept within
    /// `1..=max_items / 2` so a trim never has to empty the whole history.
    pub segment_items: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self {
            max_items: 2_000,
            max_tokens: 120_000,
            segment_items: 64,
        }
    }
}

impl HistoryLimits {
    const MIN_ITEMS: usize = 2;
    const MIN_TOKENS: usize = 64;
    /// The summary may use `max_tokens / SUMMARY_SHARE` tokens.
    const SUMMARY_SHARE: usize = 8;

    /// The limits actually enforced.
    fn effective(self) -> Self {
        let max_items = self.max_items.max(Self::MIN_ITEMS);
        Self {
            max_items,
            max_tokens: self.max_tokens.max(Self::MIN_TOKENS),
            segment_items: self.segment_items.clamp(1, max_items / 2),
        }
    }

    /// Tokens reserved for the summary (at least 8, since `max_tokens >= 64`).
    fn summary_budget(self) -> usize {
        self.max_tokens / Self::SUMMARY_SHARE
    }

    /// Whether `items` history items of `tokens` tokens leave room for a full-size summary.
    fn fits_with_summary(self, items: usize, tokens: usize) -> bool {
        items < self.max_items && tokens + self.summary_budget() <= self.max_tokens
    }
}

/// What one append trimmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrimReport {
    /// Items removed by this append (now folded into the summary).
    pub removed_items: u64,
    /// The summary text after this append.
    pub summary: String,
}

/// A run of consecutive history items, shared between the store and its snapshots.
#[derive(Clone)]
struct Segment {
    items: Vec<HistoryItem>,
    /// Sum of the items' `approx_tokens`, so trimming a segment costs O(1) bookkeeping.
    tokens: usize,
}

/// A conversation's history: segmented, bounded, cheap to snapshot.
pub struct HistoryStore {
    /// Effective limits (see [`HistoryLimits`]).
    limits: HistoryLimits,
    summarizer: Arc<dyn Summarizer>,
    /// The summary of everything trimmed so far, as a one-item segment so snapshots share it.
    summary: Option<Arc<Segment>>,
    /// Oldest first; only the last one is ever appended to.
    segments: VecDeque<Arc<Segment>>,
    /// Items held in `segments` (summary excluded).
    items: usize,
    /// Tokens held in `segments` (summary excluded).
    tokens: usize,
    total_appended: u64,
    /// Items folded into the summary so far.
    replaced: u64,
    /// Bumped at every change of the summary: a summary written elsewhere (by the model)
    /// replaces only the one it was asked about.
    summary_generation: u64,
    /// Keep the items each trim removes for [`take_trimmed`](Self::take_trimmed) (a model
    /// summarizer reads them); off, they are dropped once folded.
    keep_trimmed: bool,
    trimmed: Vec<HistoryItem>,
}

impl fmt::Debug for HistoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HistoryStore")
            .field("limits", &self.limits)
            .field("len", &self.len())
            .field("approx_tokens", &self.approx_tokens())
            .field("segments", &self.segments.len())
            .field("total_appended", &self.total_appended)
            .field("replaced", &self.replaced)
            .finish()
    }
}

impl HistoryStore {
    pub fn new(limits: HistoryLimits, summarizer: Arc<dyn Summarizer>) -> Self {
        Self {
            limits: limits.effective(),
            summarizer,
            summary: None,
            segments: VecDeque::new(),
            items: 0,
            tokens: 0,
            total_appended: 0,
            replaced: 0,
            summary_generation: 0,
            keep_trimmed: false,
            trimmed: Vec::new(),
        }
    }

    /// Keeps the items trims remove until [`take_trimmed`](Self::take_trimmed) (for a
    /// summarizer that runs elsewhere).
    pub fn keep_trimmed(mut self, keep: bool) -> Self {
        self.keep_trimmed = keep;
        self
    }

    /// The items removed by trims since the last call, oldest first (empty unless
    /// [`keep_trimmed`](Self::keep_trimmed)).
    pub fn take_trimmed(&mut self) -> Vec<HistoryItem> {
        std::mem::take(&mut self.trimmed)
    }

    /// Which summary is held now (bumped at every change).
    pub fn summary_generation(&self) -> u64 {
        self.summary_generation
    }

    /// Replaces the summary text, if the summary is still the one of `generation` (nothing
    /// was trimmed or compacted since): capped to the summary's room, and to the room the
    /// items appended since the trim left under `max_tokens` (at least what the summary in
    /// its place takes), so the bounds hold. Returns whether it was replaced.
    pub fn replace_summary(&mut self, generation: u64, text: &str) -> bool {
        if generation != self.summary_generation {
            return false;
        }
        let Some(HistoryItem::Summary { replaced_items, .. }) = self.summary().cloned() else {
            return false;
        };
        let room = self
            .limits
            .summary_budget()
            .min(self.limits.max_tokens.saturating_sub(self.tokens));
        let max_bytes = room.saturating_sub(4) * 4;
        let item = HistoryItem::Summary {
            text: tail_on_char_boundary(text, max_bytes).to_owned(),
            replaced_items,
        };
        let tokens = item.approx_tokens();
        self.summary = Some(Arc::new(Segment {
            items: vec![item],
            tokens,
        }));
        self.summary_generation += 1;
        true
    }

    /// Puts `text` in the summary's slot, standing for `replaced_items`, capped to the
    /// summary's room: a history rebuilt from a checkpoint (S6), before its kept items are
    /// appended.
    pub fn set_summary(&mut self, text: &str, replaced_items: u64) {
        let max_bytes = (self.limits.summary_budget() - 4) * 4;
        let item = HistoryItem::Summary {
            text: tail_on_char_boundary(text, max_bytes).to_owned(),
            replaced_items,
        };
        let tokens = item.approx_tokens();
        self.summary = Some(Arc::new(Segment {
            items: vec![item],
            tokens,
        }));
        self.replaced = replaced_items;
        self.summary_generation += 1;
    }

    /// Appends only the given new items; trims when over a bound.
    pub fn append(&mut self, items: impl IntoIterator<Item = HistoryItem>) -> Option<TrimReport> {
        let mut removed = Vec::new();
        let mut removed_items = 0u64;
        for item in items {
            self.push(item);
            if self.over_bounds(!removed.is_empty()) {
                self.evict(&mut removed);
                // A huge batch must not pile up removed items: fold them as we go.
                if removed.len() >= self.limits.max_items {
                    removed_items += self.fold(&mut removed);
                }
            }
        }
        removed_items += self.fold(&mut removed);
        if removed_items == 0 {
            return None;
        }
        let summary = self.summary_text().unwrap_or_default().to_owned();
        tracing::debug!(
            removed_items,
            held_items = self.len(),
            held_tokens = self.approx_tokens(),
            summary_bytes = summary.len(),
            "history trimmed"
        );
        Some(TrimReport {
            removed_items,
            summary,
        })
    }

    /// Items held, summary included.
    pub fn len(&self) -> usize {
        self.items + usize::from(self.summary.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sum of `HistoryItem::approx_tokens` of the held items, summary included.
    pub fn approx_tokens(&self) -> usize {
        self.tokens + self.summary.as_ref().map_or(0, |s| s.tokens)
    }

    /// Every item ever appended.
    pub fn total_appended(&self) -> u64 {
        self.total_appended
    }

    /// Items folded into the summary so far.
    pub fn replaced_items(&self) -> u64 {
        self.replaced
    }

    /// The limits in force (after raising them to their minimums).
    pub fn limits(&self) -> HistoryLimits {
        self.limits
    }

    /// The summary item, if anything was trimmed.
    pub fn summary(&self) -> Option<&HistoryItem> {
        self.summary.as_ref().and_then(|s| s.items.first())
    }

    /// The held items as they stand: O(number of segments), clones `Arc`s only.
    pub fn snapshot(&self) -> HistorySnapshot {
        HistorySnapshot {
            segments: self
                .summary
                .iter()
                .chain(self.segments.iter())
                .cloned()
                .collect(),
            len: self.len(),
            tokens: self.approx_tokens(),
            has_summary: self.summary.is_some(),
        }
    }

    /// Replaces the whole history by one summary (compaction): `replaced_items` accumulates
    /// what the summary now stands for. The summary is capped to the summary's room, as
    /// [`Self::set_summary`] caps it when a restore reads it back (its end kept): the history
    /// stays within `max_tokens`, and the report (recorded) holds the text it holds.
    pub fn compact(&mut self, summary: String) -> TrimReport {
        let max_bytes = (self.limits.summary_budget() - 4) * 4;
        let summary = tail_on_char_boundary(&summary, max_bytes).to_owned();
        let removed = self.items as u64;
        self.replaced += removed;
        let item = HistoryItem::Summary {
            text: summary.clone(),
            replaced_items: self.replaced,
        };
        let tokens = item.approx_tokens();
        self.summary = Some(Arc::new(Segment {
            items: vec![item],
            tokens,
        }));
        self.segments.clear();
        self.items = 0;
        self.tokens = 0;
        self.summary_generation += 1;
        TrimReport {
            removed_items: removed,
            summary,
        }
    }

    fn push(&mut self, item: HistoryItem) {
        let tokens = item.approx_tokens();
        let per_segment = self.limits.segment_items;
        match self.segments.back_mut() {
            Some(open) if open.items.len() < per_segment => {
                let open = Arc::make_mut(open);
                open.items.push(item);
                open.tokens += tokens;
            }
            _ => {
                let mut items = Vec::with_capacity(per_segment.min(1024));
                items.push(item);
                self.segments.push_back(Arc::new(Segment { items, tokens }));
            }
        }
        self.items += 1;
        self.tokens += tokens;
        self.total_appended += 1;
    }

    /// Whether the held items break a bound. With `pending` removed items not yet folded, the
    /// summary about to be written counts at its full budget.
    fn over_bounds(&self, pending: bool) -> bool {
        let (slot, reserve) = match (&self.summary, pending) {
            (_, true) => (1, self.limits.summary_budget()),
            (Some(summary), false) => (1, summary.tokens),
            (None, false) => (0, 0),
        };
        self.items + slot > self.limits.max_items || self.tokens + reserve > self.limits.max_tokens
    }

    /// Removes oldest items into `removed` until a full-size summary fits.
    fn evict(&mut self, removed: &mut Vec<HistoryItem>) {
        let limits = self.limits;
        while !limits.fits_with_summary(self.items, self.tokens) {
            if self.segments.len() > 1 {
                let Some(segment) = self.segments.pop_front() else {
                    break;
                };
                self.items -= segment.items.len();
                self.tokens -= segment.tokens;
                // Moved out when no snapshot holds it; cloned (for the summarizer) otherwise.
                match Arc::try_unwrap(segment) {
                    Ok(segment) => removed.extend(segment.items),
                    Err(shared) => removed.extend(shared.items.iter().cloned()),
                }
            } else if let Some(open) = self.segments.front_mut() {
                // The only segment left is still too big: take its oldest items.
                let open = Arc::make_mut(open);
                let (mut items, mut tokens, mut cut) = (self.items, self.tokens, 0);
                for item in &open.items {
                    if limits.fits_with_summary(items, tokens) {
                        break;
                    }
                    items -= 1;
                    tokens -= item.approx_tokens();
                    cut += 1;
                }
                removed.extend(open.items.drain(..cut));
                open.tokens -= self.tokens - tokens;
                self.items = items;
                self.tokens = tokens;
                if open.items.is_empty() {
                    self.segments.pop_front();
                }
            } else {
                break;
            }
        }
    }

    /// Folds `removed` into the summary; returns how many items were folded.
    fn fold(&mut self, removed: &mut Vec<HistoryItem>) -> u64 {
        if removed.is_empty() {
            return 0;
        }
        let count = removed.len() as u64;
        let text = self.summarizer.summarize(self.summary_text(), removed);
        self.summary_generation += 1;
        if self.keep_trimmed {
            self.trimmed.append(removed);
        }
        // approx_tokens = ceil(bytes / 4) + 4, so this many bytes keep it within the budget.
        let max_bytes = (self.limits.summary_budget() - 4) * 4;
        let text = tail_on_char_boundary(&text, max_bytes).to_owned();
        self.replaced += count;
        let item = HistoryItem::Summary {
            text,
            replaced_items: self.replaced,
        };
        let tokens = item.approx_tokens();
        self.summary = Some(Arc::new(Segment {
            items: vec![item],
            tokens,
        }));
        removed.clear();
        count
    }

    fn summary_text(&self) -> Option<&str> {
        match self.summary() {
            Some(HistoryItem::Summary { text, .. }) => Some(text),
            _ => None,
        }
    }
}

/// The held items at one moment, summary first. Later appends do not change it.
#[derive(Clone)]
pub struct HistorySnapshot {
    /// The summary's segment (if any), then the history segments oldest first.
    segments: Vec<Arc<Segment>>,
    len: usize,
    tokens: usize,
    /// Whether `segments[0]` is the summary.
    has_summary: bool,
}

impl HistorySnapshot {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn approx_tokens(&self) -> usize {
        self.tokens
    }

    /// The items, summary first.
    pub fn iter(&self) -> impl Iterator<Item = &HistoryItem> {
        self.segments.iter().flat_map(|s| s.items.iter())
    }

    /// The prompt: `pinned`, this history, `pending`, then `input`, all borrowed.
    pub fn view<'a>(
        &'a self,
        pinned: Option<&'a HistoryItem>,
        pending: &'a [HistoryItem],
        input: &'a [HistoryItem],
    ) -> PromptView<'a> {
        PromptView {
            pinned,
            history: self,
            skip: 0,
            pending,
            input,
        }
    }
}

/// A prompt as a borrowed sequence of items: nothing is copied to build or walk it.
#[derive(Clone, Copy)]
pub struct PromptView<'a> {
    /// The user instructions (C4), always first even after they were trimmed from history.
    pinned: Option<&'a HistoryItem>,
    history: &'a HistorySnapshot,
    /// Oldest history items left out (after the summary) to fit a token budget.
    skip: usize,
    /// Items of the running task not yet appended to history.
    pending: &'a [HistoryItem],
    input: &'a [HistoryItem],
}

impl<'a> PromptView<'a> {
    /// The same view without the `n` oldest history items (the summary, the pinned
    /// instructions, pending and input stay).
    pub fn without_oldest(self, n: usize) -> Self {
        let droppable = self.droppable();
        Self {
            skip: n.min(droppable),
            ..self
        }
    }

    /// History items that `without_oldest` may leave out.
    pub fn droppable(&self) -> usize {
        self.history.len - usize::from(self.history.has_summary)
    }

    /// History items left out so far.
    pub fn skipped(&self) -> usize {
        self.skip
    }

    /// The history items `without_oldest` may leave out, oldest first (ignoring any skip).
    pub fn droppable_items(&self) -> impl Iterator<Item = &'a HistoryItem> + 'a + use<'a> {
        let history: &'a HistorySnapshot = self.history;
        let rest = if history.has_summary {
            &history.segments[1..]
        } else {
            &history.segments[..]
        };
        rest.iter().flat_map(|s| s.items.iter())
    }

    /// pinned (the user instructions, C4) first, then summary, then segments oldest first, then
    /// pending, then input.
    pub fn iter(&self) -> impl Iterator<Item = &'a HistoryItem> + 'a + use<'a> {
        let history: &'a HistorySnapshot = self.history;
        let (summary, rest) = if history.has_summary {
            history.segments.split_at(1)
        } else {
            history.segments.split_at(0)
        };
        self.pinned
            .into_iter()
            .chain(summary.iter().flat_map(|s| s.items.iter()))
            .chain(rest.iter().flat_map(|s| s.items.iter()).skip(self.skip))
            .chain(self.pending.iter())
            .chain(self.input.iter())
    }

    pub fn len(&self) -> usize {
        usize::from(self.pinned.is_some()) + self.history.len() - self.skip
            + self.pending.len()
            + self.input.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn approx_tokens(&self) -> usize {
        if self.skip > 0 {
            return self.iter().map(HistoryItem::approx_tokens).sum();
        }
        self.pinned.map_or(0, HistoryItem::approx_tokens)
            + self.history.approx_tokens()
            + self
                .pending
                .iter()
                .chain(self.input)
                .map(HistoryItem::approx_tokens)
                .sum::<usize>()
    }
}

/// The last `max_bytes` bytes of `s` at most, starting on a char boundary.
fn tail_on_char_boundary(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut start = s.len() - max_bytes;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Like [`tail_on_char_boundary`], but starts on a whole line when the cut fell inside one and
/// a later line exists.
fn tail_lines(s: &str, max_bytes: usize) -> &str {
    let tail = tail_on_char_boundary(s, max_bytes);
    let cut_mid_line = tail.len() < s.len() && !s[..s.len() - tail.len()].ends_with('\n');
    match tail.find('\n') {
        Some(newline) if cut_mid_line => &tail[newline + 1..],
        _ => tail,
    }
}

/// One line standing for `item` in a local summary.
fn push_digest(out: &mut String, item: &HistoryItem) {
    match item {
        HistoryItem::Message { role, text } => {
            out.push_str(match role {
                Role::System => "system: ",
                Role::User => "user: ",
                Role::Assistant => "assistant: ",
            });
            push_clipped(out, text);
        }
        HistoryItem::ToolCall(call) => {
            out.push_str("tool call ");
            push_clipped(out, &call.name);
            out.push_str(": ");
            push_clipped(out, &call.arguments.0.to_string());
        }
        HistoryItem::ToolOutput(output) => {
            out.push_str(if output.is_error {
                "tool error: "
            } else {
                "tool output: "
            });
            push_clipped(out, &output.output);
        }
        HistoryItem::Summary { text, .. } => {
            out.push_str("summary: ");
            push_clipped(out, text);
        }
    }
}

/// The first [`DIGEST_CHARS`] chars of `text` on one line.
fn push_clipped(out: &mut String, text: &str) {
    for (i, ch) in text.chars().enumerate() {
        if i == DIGEST_CHARS {
            out.push('…');
            break;
        }
        out.push(if ch.is_control() { ' ' } else { ch });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use troupe_proto::{Json, ToolCall, ToolOutput};

    fn store(max_items: usize, max_tokens: usize, segment_items: usize) -> HistoryStore {
        HistoryStore::new(
            HistoryLimits {
                max_items,
                max_tokens,
                segment_items,
            },
            Arc::new(LocalSummarizer::default()),
        )
    }

    #[test]
    fn a_summary_written_elsewhere_replaces_only_the_one_it_was_asked_about() {
        let mut h = store(4, 10_000, 2).keep_trimmed(true);
        let user = |i: usize| HistoryItem::user(format!("m{i}"));
        assert!(h.append((0..4).map(user)).is_none());
        assert!(!h.replace_summary(h.summary_generation(), "nothing to replace"));
        assert!(h.take_trimmed().is_empty());
        h.append([user(4), user(5)]).expect("trimmed");
        assert_eq!(h.take_trimmed(), vec![user(0), user(1), user(2), user(3)]);
        assert!(h.take_trimmed().is_empty(), "taken once");
        let asked = h.summary_generation();
        h.append([user(6), user(7)]).expect("trimmed again");
        assert!(!h.replace_summary(asked, "stale"), "a newer trim wins");
        let now = h.summary_generation();
        assert!(h.replace_summary(now, "by the model"));
        assert!(matches!(
            h.summary(),
            Some(HistoryItem::Summary { text, replaced_items: 6 }) if text == "by the model"
        ));
        // Capped to the summary's room, so the bounds hold.
        let long = "x".repeat(100_000);
        assert!(h.replace_summary(h.summary_generation(), &long));
        check_consistent(&h);
        let compacted = h.summary_generation();
        h.compact("compacted".into());
        assert!(!h.replace_summary(compacted, "late"));
        // Without keep_trimmed nothing is held back.
        let mut plain = store(4, 10_000, 2);
        plain.append((0..6).map(user)).expect("trimmed");
        assert!(plain.take_trimmed().is_empty());
    }

    /// A model summary that arrives after the items grew into the room the trim reserved for
    /// it still keeps the history within `max_tokens`.
    #[test]
    fn a_late_model_summary_fits_the_room_the_items_left() {
        let mut h = store(1000, 1000, 4).keep_trimmed(true);
        // Long items until a trim: it takes two or three, whose local digest is small.
        let long = |i: usize| HistoryItem::user(format!("{i:03}{}", "y".repeat(400)));
        let mut i = 0;
        while h.append([long(i)]).is_none() {
            i += 1;
        }
        let asked = h.summary_generation();
        let digest = h.summary().map_or(0, HistoryItem::approx_tokens);
        assert!(digest < 100, "a small digest: {digest}");
        let _ = h.take_trimmed();
        // Short items into the room the digest leaves, without a second trim.
        while h.approx_tokens() + 10 <= 1000 {
            i += 1;
            assert!(h.append([HistoryItem::user(format!("s{i}"))]).is_none());
            assert_eq!(h.summary_generation(), asked, "trimmed again");
        }
        assert!(h.replace_summary(asked, &"z".repeat(100_000)));
        check_consistent(&h);
    }

    fn held_items(store: &HistoryStore) -> Vec<HistoryItem> {
        store.snapshot().iter().cloned().collect()
    }

    /// Bounds hold and the cached counters agree with the items themselves.
    fn check_consistent(store: &HistoryStore) {
        let limits = store.limits();
        assert!(store.len() <= limits.max_items, "{store:?}");
        assert!(store.approx_tokens() <= limits.max_tokens, "{store:?}");
        let snapshot = store.snapshot();
        assert_eq!(snapshot.iter().count(), store.len());
        assert_eq!(
            snapshot
                .iter()
                .map(HistoryItem::approx_tokens)
                .sum::<usize>(),
            store.approx_tokens()
        );
        for segment in &store.segments {
            assert!(segment.items.len() <= limits.segment_items);
            assert!(!segment.items.is_empty());
            let tokens: usize = segment.items.iter().map(HistoryItem::approx_tokens).sum();
            assert_eq!(segment.tokens, tokens);
        }
    }

    #[test]
    fn million_appends_stay_bounded() {
        let mut store = HistoryStore::new(
            HistoryLimits::default(),
            Arc::new(LocalSummarizer::default()),
        );
        let limits = store.limits();
        let mut reported = 0u64;
        for i in 0..1_000_000u32 {
            if let Some(report) = store.append([HistoryItem::user(format!("m{i}"))]) {
                reported += report.removed_items;
            }
            assert!(store.len() <= limits.max_items);
            assert!(store.approx_tokens() <= limits.max_tokens);
            if i % 100_000 == 0 {
                check_consistent(&store);
            }
        }
        check_consistent(&store);
        assert_eq!(store.total_appended(), 1_000_000);
        let held = (store.len() - 1) as u64;
        match store.summary() {
            Some(HistoryItem::Summary { replaced_items, .. }) => {
                assert_eq!(*replaced_items, 1_000_000 - held);
                assert_eq!(*replaced_items, reported);
            }
            other => panic!("no summary: {other:?}"),
        }
        assert_eq!(
            held_items(&store).last(),
            Some(&HistoryItem::user("m999999"))
        );
    }

    #[test]
    fn prompt_view_borrows_items_without_copying() {
        let mut store = store(100, 10_000, 4);
        store.append((0..10).map(|i| HistoryItem::user(format!("h{i}"))));
        let counts_before: Vec<usize> = store.segments.iter().map(Arc::strong_count).collect();
        assert!(counts_before.iter().all(|&c| c == 1));

        let snapshot = store.snapshot();
        // Sharing, not cloning: every segment is now held twice.
        let counts_after: Vec<usize> = store.segments.iter().map(Arc::strong_count).collect();
        assert!(counts_after.iter().all(|&c| c == 2), "{counts_after:?}");
        for (held, shared) in store.segments.iter().zip(&snapshot.segments) {
            assert!(Arc::ptr_eq(held, shared));
        }

        let pinned = HistoryItem::user("instructions");
        let pending = vec![HistoryItem::assistant("p0")];
        let input = vec![HistoryItem::user("i0"), HistoryItem::user("i1")];
        let view = snapshot.view(Some(&pinned), &pending, &input);
        let expected: Vec<*const HistoryItem> = std::iter::once(&pinned)
            .chain(store.segments.iter().flat_map(|s| s.items.iter()))
            .chain(&pending)
            .chain(&input)
            .map(std::ptr::from_ref)
            .collect();
        let yielded: Vec<&HistoryItem> = view.iter().collect();
        assert_eq!(yielded.len(), expected.len());
        assert_eq!(view.len(), expected.len());
        for (got, want) in yielded.iter().zip(&expected) {
            assert!(std::ptr::eq(*got, *want));
        }
        assert_eq!(
            view.approx_tokens(),
            yielded.iter().map(|i| i.approx_tokens()).sum::<usize>()
        );
    }

    #[test]
    fn snapshot_is_unchanged_by_later_appends() {
        let mut store = store(100, 10_000, 4);
        store.append((0..6).map(|i| HistoryItem::user(format!("a{i}"))));
        let snapshot = store.snapshot();
        let before: Vec<HistoryItem> = snapshot.iter().cloned().collect();

        store.append((0..3).map(|i| HistoryItem::user(format!("b{i}"))));
        let after: Vec<HistoryItem> = snapshot.iter().cloned().collect();
        assert_eq!(before, after);
        assert_eq!(snapshot.len(), 6);
        assert_eq!(store.len(), 9);
        // The full segment is still shared; only the open one was copied.
        assert!(Arc::ptr_eq(&store.segments[0], &snapshot.segments[0]));
        assert!(!Arc::ptr_eq(&store.segments[1], &snapshot.segments[1]));
        assert_eq!(snapshot.segments[1].items.len(), 2);
        assert_eq!(store.segments[1].items.len(), 4);
    }

    #[test]
    fn view_orders_pinned_summary_history_pending_input() {
        let mut store = store(4, 10_000, 2);
        let report = store.append((0..6).map(|i| HistoryItem::user(format!("h{i}"))));
        let report = report.expect("trimmed");
        assert_eq!(report.removed_items, 4);
        let snapshot = store.snapshot();
        let pinned = HistoryItem::user("pinned");
        let pending = [HistoryItem::assistant("pending")];
        let input = [HistoryItem::user("input")];
        let items: Vec<&HistoryItem> = snapshot
            .view(Some(&pinned), &pending, &input)
            .iter()
            .collect();
        assert_eq!(items.len(), 6);
        assert_eq!(items[0], &pinned);
        assert!(matches!(
            items[1],
            HistoryItem::Summary {
                replaced_items: 4,
                ..
            }
        ));
        assert_eq!(items[2], &HistoryItem::user("h4"));
        assert_eq!(items[3], &HistoryItem::user("h5"));
        assert_eq!(items[4], &pending[0]);
        assert_eq!(items[5], &input[0]);

        let empty = HistoryStore::new(
            HistoryLimits::default(),
            Arc::new(LocalSummarizer::default()),
        );
        let snapshot = empty.snapshot();
        let view = snapshot.view(None, &[], &[]);
        assert!(view.is_empty());
        assert_eq!(view.iter().count(), 0);
    }

    #[test]
    fn item_larger_than_token_bound_goes_straight_to_summary() {
        let mut store = store(10, 64, 4);
        store.append([HistoryItem::user("small")]);
        let report = store
            .append([HistoryItem::user("x".repeat(1_000))])
            .expect("trimmed");
        assert_eq!(report.removed_items, 2);
        check_consistent(&store);
        assert_eq!(store.len(), 1);
        assert!(matches!(
            store.summary(),
            Some(HistoryItem::Summary {
                replaced_items: 2,
                ..
            })
        ));
    }

    #[test]
    fn oversized_summarizer_output_is_capped() {
        struct Verbose;
        impl Summarizer for Verbose {
            fn summarize(&self, _: Option<&str>, _: &[HistoryItem]) -> String {
                "é".repeat(100_000)
            }
        }
        let mut store = HistoryStore::new(
            HistoryLimits {
                max_items: 10,
                max_tokens: 200,
                segment_items: 2,
            },
            Arc::new(Verbose),
        );
        for i in 0..50 {
            store.append([HistoryItem::user(format!("m{i}"))]);
            check_consistent(&store);
        }
        assert!(store.summary().is_some());
    }

    #[test]
    fn limits_are_raised_to_workable_minimums() {
        let store = store(0, 0, 0);
        assert_eq!(
            store.limits(),
            HistoryLimits {
                max_items: 2,
                max_tokens: 64,
                segment_items: 1
            }
        );
        let store = HistoryStore::new(
            HistoryLimits {
                max_items: 10,
                max_tokens: 1000,
                segment_items: 64,
            },
            Arc::new(LocalSummarizer::default()),
        );
        assert_eq!(store.limits().segment_items, 5);
    }

    #[test]
    fn local_summarizer_digests_and_bounds() {
        let summarizer = LocalSummarizer { max_chars: 4000 };
        let removed = [
            HistoryItem::user("hello\nworld"),
            HistoryItem::assistant("a".repeat(200)),
            HistoryItem::ToolCall(ToolCall {
                call_id: "c1".into(),
                name: "shell".into(),
                arguments: Json(serde_json::json!({"command": ["ls"]})),
            }),
            HistoryItem::ToolOutput(ToolOutput {
                call_id: "c1".into(),
                output: "boom".into(),
                is_error: true,
            }),
        ];
        let text = summarizer.summarize(Some("earlier"), &removed);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "earlier");
        assert_eq!(lines[1], "user: hello world");
        assert_eq!(lines[2], format!("assistant: {}…", "a".repeat(80)));
        assert_eq!(lines[3], r#"tool call shell: {"command":["ls"]}"#);
        assert_eq!(lines[4], "tool error: boom");

        // Bounded, keeps the newest lines, cuts on char boundaries.
        let small = LocalSummarizer { max_chars: 30 };
        let many: Vec<HistoryItem> = (0..20)
            .map(|i| HistoryItem::user(format!("é{i}")))
            .collect();
        let text = small.summarize(Some(&"ü".repeat(100)), &many);
        assert!(text.len() <= 30);
        assert!(text.ends_with("user: é19"));
        assert!(text.starts_with("user: "));
        let tiny = LocalSummarizer { max_chars: 3 };
        let text = tiny.summarize(None, &[HistoryItem::user("ééééé")]);
        assert_eq!(text, "é");
    }

    fn arb_item() -> impl Strategy<Value = HistoryItem> {
        // Random length, cheap content: a cycle with multibyte chars and newlines in it.
        let text = (0usize..300, 0usize..8).prop_map(|(len, skip)| {
            "abé \nxyz"
                .chars()
                .cycle()
                .skip(skip)
                .take(len)
                .collect::<String>()
        });
        prop_oneof![
            4 => (text.clone(), any::<bool>()).prop_map(|(t, user)| if user {
                HistoryItem::user(t)
            } else {
                HistoryItem::assistant(t)
            }),
            1 => text.clone().prop_map(|t| HistoryItem::ToolCall(ToolCall {
                call_id: "c".into(),
                name: "shell".into(),
                arguments: Json(serde_json::json!({ "command": [t] })),
            })),
            1 => (text, any::<bool>()).prop_map(|(output, is_error)| {
                HistoryItem::ToolOutput(ToolOutput {
                    call_id: "c".into(),
                    output,
                    is_error,
                })
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn appends_keep_bounds_order_and_counts(
            max_items in 2usize..40,
            max_tokens in 64usize..2_000,
            segment_items in 1usize..12,
            max_chars in 0usize..3_000,
            batches in prop::collection::vec(prop::collection::vec(arb_item(), 0..8), 0..40),
        ) {
            let mut store = HistoryStore::new(
                HistoryLimits { max_items, max_tokens, segment_items },
                Arc::new(LocalSummarizer { max_chars }),
            );
            let limits = store.limits();
            let mut appended: Vec<HistoryItem> = Vec::new();
            let mut reported = 0u64;
            for batch in batches {
                let before = store.snapshot();
                let before_items: Vec<HistoryItem> = before.iter().cloned().collect();
                appended.extend(batch.iter().cloned());
                if let Some(report) = store.append(batch) {
                    prop_assert!(report.removed_items > 0);
                    reported += report.removed_items;
                }
                // Copy-on-write: the earlier snapshot is untouched.
                prop_assert_eq!(before.iter().cloned().collect::<Vec<_>>(), before_items);

                prop_assert!(store.len() <= limits.max_items);
                prop_assert!(store.approx_tokens() <= limits.max_tokens);
                prop_assert_eq!(store.total_appended(), appended.len() as u64);

                let held = held_items(&store);
                prop_assert_eq!(held.len(), store.len());
                prop_assert_eq!(
                    held.iter().map(HistoryItem::approx_tokens).sum::<usize>(),
                    store.approx_tokens()
                );
                let snapshot = store.snapshot();
                let view = snapshot.view(None, &[], &[]);
                prop_assert_eq!(view.len(), held.len());
                prop_assert_eq!(view.approx_tokens(), store.approx_tokens());

                let (summary, rest) = match held.split_first() {
                    Some((HistoryItem::Summary { replaced_items, .. }, rest)) => {
                        (Some(*replaced_items), rest)
                    }
                    _ => (None, held.as_slice()),
                };
                let summaries_in_rest = rest.iter().filter(|i| matches!(i, HistoryItem::Summary { .. })).count();
                prop_assert_eq!(summaries_in_rest, 0);
                // The held items are exactly the newest suffix of what was appended.
                prop_assert!(appended.ends_with(rest));
                let removed = (appended.len() - rest.len()) as u64;
                prop_assert_eq!(summary.unwrap_or(0), removed);
                prop_assert_eq!(summary.is_some(), removed > 0);
                prop_assert_eq!(reported, removed);
                prop_assert_eq!(store.replaced_items(), removed);
            }
        }
    }

    #[test]
    fn without_oldest_keeps_summary_pinned_and_task_items() {
        let limits = HistoryLimits {
            max_items: 4,
            max_tokens: 100_000,
            segment_items: 2,
        };
        let mut store = HistoryStore::new(limits, Arc::new(LocalSummarizer::default()));
        for i in 0..6 {
            store.append([HistoryItem::user(format!("m{i}"))]);
        }
        assert!(store.summary().is_some());
        let snap = store.snapshot();
        let pinned = HistoryItem::user("instructions");
        let input = [HistoryItem::user("now")];
        let full = snap.view(Some(&pinned), &[], &input);
        let cut = full.without_oldest(1);
        let texts = |v: PromptView<'_>| -> Vec<String> {
            v.iter()
                .map(|i| match i {
                    HistoryItem::Message { text, .. } => text.clone(),
                    HistoryItem::Summary { .. } => "<summary>".into(),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        let all = texts(full);
        let fewer = texts(cut);
        assert_eq!(fewer.len(), all.len() - 1);
        assert_eq!(fewer[0], "instructions");
        assert_eq!(fewer[1], "<summary>");
        assert_eq!(&fewer[2..], &all[3..]);
        assert_eq!(cut.len(), fewer.len());
        assert!(cut.approx_tokens() < full.approx_tokens());
        // Never more than the droppable items.
        assert_eq!(full.without_oldest(100).skipped(), full.droppable());
    }

    #[test]
    fn a_compaction_summary_is_capped_as_a_restore_caps_it() {
        let mut live = store(100, 1_000, 10);
        live.append((0..10).map(|i| HistoryItem::user(format!("m{i}"))));
        let long = format!("{}the end", "word ".repeat(2_000));
        let report = live.compact(long.clone());
        assert!(live.approx_tokens() <= 1_000, "{}", live.approx_tokens());
        assert!(report.summary.ends_with("the end"), "the end is kept");
        // A restore reads the recorded summary back: the same history.
        let mut restored = store(100, 1_000, 10);
        restored.set_summary(&report.summary, 10);
        assert_eq!(
            restored.snapshot().iter().cloned().collect::<Vec<_>>(),
            live.snapshot().iter().cloned().collect::<Vec<_>>()
        );
    }

    #[test]
    fn compact_replaces_everything_with_one_summary() {
        let mut store = HistoryStore::new(
            HistoryLimits::default(),
            Arc::new(LocalSummarizer::default()),
        );
        store.append((0..10).map(|i| HistoryItem::user(format!("m{i}"))));
        let report = store.compact("the gist".into());
        assert_eq!(report.removed_items, 10);
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.snapshot().iter().cloned().collect::<Vec<_>>(),
            vec![HistoryItem::Summary {
                text: "the gist".into(),
                replaced_items: 10
            }]
        );
        store.append([HistoryItem::user("after")]);
        assert_eq!(store.len(), 2);
    }
}
