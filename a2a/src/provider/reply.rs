//! Following one remote task: what each A2A event adds to the reply, what troupe shows of it
//! as it comes (`agent_update` events), and where the task stands. Pure: the run loop feeds
//! it events and acts on [`Tracker::settled`].
//!
//! The reply is the text of the task's artifacts (an artifact's parts in order, artifacts one
//! per line), or, when the task made none, the agent's last message (a direct `Message`
//! reply, or the message of its final status). Appended artifact chunks are shown as message
//! chunks as they arrive; an artifact sent again whole (as troupe's own endpoint does at the
//! end) shows only what it adds.
//!
//! A stream taken up again (`SubscribeToTask`) starts with the task as it stands, and the
//! chunks that follow may repeat the last ones that task already holds: the official Python
//! SDK taps the task's events before it reads the task, so what it applies in between comes
//! twice. Chunks appended after a whole task are therefore first matched against that task's
//! end: the longest run of them that its text already ends with is not added again.

use crate::model::{Message, Part, PartContent, StreamEvent, Task, TaskState};
use serde_json::{Value, json};
use troupe_proto::agent::AgentUpdateKind;

/// Something to show while the task runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub kind: AgentUpdateKind,
    pub text: String,
    pub data: Option<Value>,
}

/// Where a followed task stands once it stops changing on its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// It answered (COMPLETED, or a direct message reply).
    Answered { text: String },
    /// It waits for the client (INPUT_REQUIRED, AUTH_REQUIRED), asking with `message`.
    Waiting {
        task_id: String,
        state: TaskState,
        message: Option<Message>,
    },
    /// It ended without an answer (FAILED, REJECTED, CANCELED), saying why in `text`.
    Ended { state: TaskState, text: String },
}

/// One remote task (or direct reply) as it is followed.
#[derive(Debug, Default, Clone)]
pub struct Tracker {
    task_id: Option<String>,
    state: Option<TaskState>,
    /// Each artifact so far, in the order they appeared.
    artifacts: Vec<ArtifactText>,
    /// The newest message of the agent (a direct reply or a status message).
    last_message: Option<Message>,
    /// A direct reply ended the exchange without a task.
    replied: bool,
}

impl Tracker {
    pub fn task_id(&self) -> Option<&str> {
        self.task_id.as_deref()
    }

    pub fn state(&self) -> Option<TaskState> {
        self.state
    }

    /// Takes in one event; answers what to show of it.
    pub fn apply(&mut self, event: &StreamEvent) -> Vec<Update> {
        match event {
            StreamEvent::Task(task) => self.apply_task(task),
            StreamEvent::Message(m) => {
                self.last_message = Some(m.clone());
                // A message outside a task is the whole reply; one inside a task is news.
                if self.task_id.is_none() && m.task_id.is_none() {
                    self.replied = true;
                }
                let text = parts_text(&m.parts);
                if text.is_empty() {
                    Vec::new()
                } else {
                    vec![Update {
                        kind: AgentUpdateKind::MessageChunk,
                        text,
                        data: None,
                    }]
                }
            }
            StreamEvent::Status(s) => {
                self.task_id.get_or_insert_with(|| s.task_id.clone());
                self.status(s.status.state, s.status.message.as_ref())
                    .into_iter()
                    .collect()
            }
            StreamEvent::Artifact(a) => {
                self.task_id.get_or_insert_with(|| a.task_id.clone());
                self.artifact(&a.artifact.artifact_id, &a.artifact.parts, a.append, false)
                    .into_iter()
                    .collect()
            }
        }
    }

    /// A whole task (the first event of a stream, a `SendMessage` or `GetTask` answer).
    pub fn apply_task(&mut self, task: &Task) -> Vec<Update> {
        self.task_id = Some(task.id.clone());
        let mut updates: Vec<Update> = task
            .artifacts
            .iter()
            .filter_map(|a| self.artifact(&a.artifact_id, &a.parts, false, true))
            .collect();
        updates.extend(self.status(task.status.state, task.status.message.as_ref()));
        updates
    }

    fn status(&mut self, state: TaskState, message: Option<&Message>) -> Option<Update> {
        let changed = self.state != Some(state);
        self.state = Some(state);
        let text = message.map(|m| parts_text(&m.parts)).unwrap_or_default();
        if let Some(m) = message {
            let news = self
                .last_message
                .as_ref()
                .is_none_or(|last| last.message_id != m.message_id);
            self.last_message = Some(m.clone());
            if !news && !changed {
                return None;
            }
        } else if !changed {
            return None;
        }
        Some(Update {
            kind: AgentUpdateKind::Status,
            text,
            data: Some(json!({
                "state": state.v1_name(),
                "taskId": self.task_id,
            })),
        })
    }

    fn artifact(
        &mut self,
        id: &str,
        parts: &[Part],
        append: bool,
        whole_task: bool,
    ) -> Option<Update> {
        let index = match self.artifacts.iter().position(|a| a.id == id) {
            Some(i) => i,
            None => {
                self.artifacts.push(ArtifactText::new(id));
                self.artifacts.len() - 1
            }
        };
        let artifact = &mut self.artifacts[index];
        let before = artifact.text();
        if append {
            artifact.append(parts);
        } else {
            artifact.replace(parts, whole_task);
        }
        let after = artifact.text();
        // Show only what is new: a chunk, or the part of a resent artifact not shown yet.
        let shown = after.strip_prefix(before.as_str()).unwrap_or_default();
        (!shown.is_empty()).then(|| Update {
            kind: AgentUpdateKind::MessageChunk,
            text: shown.to_owned(),
            data: None,
        })
    }

    /// The reply so far: the artifacts' text, else the agent's last message.
    pub fn reply_text(&self) -> String {
        let artifacts: Vec<String> = self
            .artifacts
            .iter()
            .map(ArtifactText::text)
            .filter(|t| !t.is_empty())
            .collect();
        if artifacts.is_empty() {
            self.last_message
                .as_ref()
                .map(|m| parts_text(&m.parts))
                .unwrap_or_default()
        } else {
            artifacts.join("\n")
        }
    }

    /// Where the task stands, once it has stopped changing on its own; `None` while it runs.
    pub fn settled(&self) -> Option<Settled> {
        if self.replied {
            return Some(Settled::Answered {
                text: self.reply_text(),
            });
        }
        let state = self.state?;
        match state {
            TaskState::Completed => Some(Settled::Answered {
                text: self.reply_text(),
            }),
            TaskState::InputRequired | TaskState::AuthRequired => Some(Settled::Waiting {
                task_id: self.task_id.clone().unwrap_or_default(),
                state,
                message: self.last_message.clone(),
            }),
            TaskState::Failed | TaskState::Rejected | TaskState::Canceled => Some(Settled::Ended {
                state,
                text: self
                    .last_message
                    .as_ref()
                    .map(|m| parts_text(&m.parts))
                    .unwrap_or_default(),
            }),
            TaskState::Submitted | TaskState::Working => None,
        }
    }

    /// Forgets the last state, before following the same task after the client's reply
    /// (its artifacts so far are kept: the answer may add to them).
    pub fn resume(&mut self) {
        self.state = None;
        self.last_message = None;
    }
}

/// One artifact as followed: the parts it was last sent whole with, and the chunks appended
/// since, of which the first `repeated` are already in those parts (see the module's doc).
#[derive(Debug, Default, Clone)]
struct ArtifactText {
    id: String,
    base: Vec<Part>,
    /// The base came from a whole task (a stream's first event, `GetTask`), whose end the
    /// chunks that follow may repeat.
    from_task: bool,
    chunks: Vec<Vec<Part>>,
    /// How many of the first chunks repeat the base's end.
    repeated: usize,
    /// The text of the chunks so far, kept while it is no longer than the base's text (a
    /// longer run cannot repeat it).
    run: Option<String>,
}

impl ArtifactText {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Self::default()
        }
    }

    fn replace(&mut self, parts: &[Part], from_task: bool) {
        self.base = parts.to_vec();
        self.from_task = from_task;
        self.chunks.clear();
        self.repeated = 0;
        self.run = from_task.then(String::new);
    }

    fn append(&mut self, parts: &[Part]) {
        self.chunks.push(parts.to_vec());
        if let Some(mut run) = self.run.take() {
            let base = parts_text(&self.base);
            run.push_str(&parts_text(parts));
            if run.len() <= base.len() {
                if base.ends_with(run.as_str()) {
                    self.repeated = self.chunks.len();
                }
                self.run = Some(run);
            }
        }
    }

    /// Its text: the base, then the chunks that do not repeat it.
    fn text(&self) -> String {
        let mut text = parts_text(&self.base);
        let skip = if self.from_task { self.repeated } else { 0 };
        for chunk in self.chunks.iter().skip(skip) {
            text.push_str(&parts_text(chunk));
        }
        text
    }
}

/// The text of parts, in order: text as is, data as JSON, a link as its URL, file bytes as
/// a mention of the file.
pub fn parts_text(parts: &[Part]) -> String {
    let mut text = String::new();
    for p in parts {
        match &p.content {
            PartContent::Text(t) => text.push_str(t),
            PartContent::Data(d) => text.push_str(&d.to_string()),
            PartContent::Url(u) => text.push_str(u),
            PartContent::Raw(_) => {
                let name = p
                    .filename
                    .as_deref()
                    .or(p.media_type.as_deref())
                    .unwrap_or("unnamed");
                text.push_str(&format!("[file {name}]"));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Artifact, ArtifactUpdate, Role, Status, StatusUpdate};

    fn message(id: &str, task: Option<&str>, text: &str) -> Message {
        Message {
            message_id: id.into(),
            context_id: Some("c".into()),
            task_id: task.map(str::to_owned),
            role: Role::Agent,
            parts: vec![Part::text(text)],
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    fn status(state: TaskState, msg: Option<Message>) -> StreamEvent {
        StreamEvent::Status(StatusUpdate {
            task_id: "t".into(),
            context_id: "c".into(),
            status: Status {
                state,
                message: msg,
                timestamp_ms: None,
            },
        })
    }

    fn chunk(text: &str, append: bool) -> StreamEvent {
        StreamEvent::Artifact(ArtifactUpdate {
            task_id: "t".into(),
            context_id: "c".into(),
            artifact: Artifact {
                artifact_id: "t-answer".into(),
                name: None,
                description: None,
                parts: vec![Part::text(text)],
                metadata: None,
            },
            append,
            last_chunk: false,
        })
    }

    fn task(state: TaskState) -> Task {
        Task {
            id: "t".into(),
            context_id: "c".into(),
            status: Status {
                state,
                message: None,
                timestamp_ms: None,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        }
    }

    fn texts(updates: &[Update]) -> Vec<(AgentUpdateKind, &str)> {
        updates.iter().map(|u| (u.kind, u.text.as_str())).collect()
    }

    #[test]
    fn streamed_chunks_show_once_and_make_the_reply() {
        let mut t = Tracker::default();
        let mut shown = Vec::new();
        for e in [
            StreamEvent::Task(task(TaskState::Submitted)),
            status(TaskState::Working, None),
            chunk("You", false),
            chunk(" said", true),
            chunk(": hi", true),
            // troupe's endpoint sends the whole answer again at the end.
            chunk("You said: hi", false),
        ] {
            shown.extend(t.apply(&e));
            assert_eq!(t.settled(), None);
        }
        shown.extend(t.apply(&status(TaskState::Completed, None)));
        assert_eq!(
            texts(&shown),
            [
                (AgentUpdateKind::Status, ""),
                (AgentUpdateKind::Status, ""),
                (AgentUpdateKind::MessageChunk, "You"),
                (AgentUpdateKind::MessageChunk, " said"),
                (AgentUpdateKind::MessageChunk, ": hi"),
                (AgentUpdateKind::Status, ""),
            ]
        );
        assert_eq!(
            shown[1].data,
            Some(json!({"state": "TASK_STATE_WORKING", "taskId": "t"}))
        );
        assert_eq!(
            t.settled(),
            Some(Settled::Answered {
                text: "You said: hi".into()
            })
        );
        assert_eq!(t.task_id(), Some("t"));
    }

    #[test]
    fn a_direct_message_is_the_reply() {
        let mut t = Tracker::default();
        let shown = t.apply(&StreamEvent::Message(message("m", None, "hello")));
        assert_eq!(texts(&shown), [(AgentUpdateKind::MessageChunk, "hello")]);
        assert_eq!(
            t.settled(),
            Some(Settled::Answered {
                text: "hello".into()
            })
        );
        assert_eq!(t.task_id(), None);
    }

    #[test]
    fn without_artifacts_the_last_message_is_the_reply() {
        let mut t = Tracker::default();
        t.apply_task(&task(TaskState::Working));
        t.apply(&StreamEvent::Message(message(
            "m1",
            Some("t"),
            "the answer",
        )));
        assert_eq!(t.settled(), None, "a message inside a task is not the end");
        t.apply(&status(
            TaskState::Completed,
            Some(message("m1", Some("t"), "the answer")),
        ));
        assert_eq!(
            t.settled(),
            Some(Settled::Answered {
                text: "the answer".into()
            })
        );
    }

    #[test]
    fn input_required_waits_with_its_question_and_failures_say_why() {
        let mut t = Tracker::default();
        t.apply_task(&task(TaskState::Working));
        let ask = message("q", Some("t"), "which branch?");
        let shown = t.apply(&status(TaskState::InputRequired, Some(ask.clone())));
        assert_eq!(texts(&shown), [(AgentUpdateKind::Status, "which branch?")]);
        assert_eq!(
            t.settled(),
            Some(Settled::Waiting {
                task_id: "t".into(),
                state: TaskState::InputRequired,
                message: Some(ask)
            })
        );
        t.resume();
        assert_eq!(t.settled(), None);
        t.apply(&status(
            TaskState::Failed,
            Some(message("f", Some("t"), "it broke")),
        ));
        assert_eq!(
            t.settled(),
            Some(Settled::Ended {
                state: TaskState::Failed,
                text: "it broke".into()
            })
        );
    }

    #[test]
    fn the_same_status_twice_is_shown_once() {
        let mut t = Tracker::default();
        let tick = message("m", Some("t"), "tick 0");
        assert_eq!(
            t.apply(&status(TaskState::Working, Some(tick.clone())))
                .len(),
            1
        );
        assert!(t.apply(&status(TaskState::Working, Some(tick))).is_empty());
        assert_eq!(
            t.apply(&status(
                TaskState::Working,
                Some(message("m2", Some("t"), "tick 1"))
            ))
            .len(),
            1
        );
        assert!(t.apply(&status(TaskState::Working, None)).is_empty());
    }

    #[test]
    fn chunks_a_resubscribed_stream_repeats_are_added_once() {
        let mut t = Tracker::default();
        let mut shown = Vec::new();
        shown.extend(t.apply(&chunk("You", false)));
        shown.extend(t.apply(&chunk(" said", true)));
        // The stream broke; SubscribeToTask starts with the task, which holds two more
        // chunks, and then repeats the last of them.
        let mut whole = task(TaskState::Working);
        whole.artifacts = vec![Artifact {
            artifact_id: "t-answer".into(),
            name: None,
            description: None,
            parts: vec![Part::text("You said: w0 w0")],
            metadata: None,
        }];
        shown.extend(t.apply(&StreamEvent::Task(whole)));
        shown.extend(t.apply(&chunk(" w0", true)));
        shown.extend(t.apply(&chunk(" w1", true)));
        shown.extend(t.apply(&chunk(" w0", true)));
        let chunks: String = shown
            .iter()
            .filter(|u| u.kind == AgentUpdateKind::MessageChunk)
            .map(|u| u.text.as_str())
            .collect();
        assert_eq!(chunks, "You said: w0 w0 w1 w0");
        t.apply(&status(TaskState::Completed, None));
        assert_eq!(
            t.settled(),
            Some(Settled::Answered {
                text: "You said: w0 w0 w1 w0".into()
            })
        );
        // Chunks of a stream that was not taken up again are never dropped.
        let mut t = Tracker::default();
        for (c, append) in [("a", false), ("a", true), ("a", true)] {
            t.apply(&chunk(c, append));
        }
        t.apply(&status(TaskState::Completed, None));
        assert_eq!(t.settled(), Some(Settled::Answered { text: "aaa".into() }));
    }

    #[test]
    fn parts_read_as_text() {
        let mut file = Part::text("");
        file.content = PartContent::Raw("aGk=".into());
        file.filename = Some("patch.diff".into());
        assert_eq!(
            parts_text(&[Part::text("see "), Part::data(json!({"a": 1})), file,]),
            r#"see {"a":1}[file patch.diff]"#
        );
    }
}
