//! What one side encodes, the other decodes to the same value, in both versions: the
//! endpoint and the client share these shapes, so a round trip is the whole contract.

use super::*;
use crate::model::{Artifact, ArtifactUpdate, PartContent, Role, Status, StatusUpdate, TaskState};
use proptest::prelude::*;
use serde_json::json;

fn id() -> impl Strategy<Value = String> {
    "[a-z0-9-]{1,12}"
}

fn text() -> impl Strategy<Value = String> {
    "[ -~é\n]{0,24}"
}

fn part() -> impl Strategy<Value = Part> {
    let plain = prop_oneof![
        text().prop_map(PartContent::Text),
        (id(), any::<i32>()).prop_map(|(k, v)| PartContent::Data(json!({ k: v }))),
    ]
    .prop_map(|content| Part {
        content,
        media_type: None,
        filename: None,
        metadata: None,
    });
    let file = (
        prop_oneof![
            "[A-Za-z0-9+/]{4,16}".prop_map(PartContent::Raw),
            id().prop_map(|p| PartContent::Url(format!("https://files.example/{p}"))),
        ],
        proptest::option::of(Just("text/plain".to_owned())),
        proptest::option::of(id()),
    )
        .prop_map(|(content, media_type, filename)| Part {
            content,
            media_type,
            filename,
            metadata: None,
        });
    prop_oneof![plain, file]
}

fn message() -> impl Strategy<Value = Message> {
    (
        id(),
        proptest::option::of(id()),
        proptest::option::of(id()),
        any::<bool>(),
        proptest::collection::vec(part(), 1..4),
    )
        .prop_map(|(message_id, context_id, task_id, user, parts)| Message {
            message_id,
            context_id,
            task_id,
            role: if user { Role::User } else { Role::Agent },
            parts,
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        })
}

fn status() -> impl Strategy<Value = Status> {
    (
        proptest::sample::select(TaskState::ALL.to_vec()),
        proptest::option::of(message()),
        proptest::option::of(0u64..4_000_000_000_000),
    )
        .prop_map(|(state, message, timestamp_ms)| Status {
            state,
            message,
            timestamp_ms,
        })
}

fn artifact() -> impl Strategy<Value = Artifact> {
    (
        id(),
        proptest::option::of(id()),
        proptest::collection::vec(part(), 1..3),
    )
        .prop_map(|(artifact_id, name, parts)| Artifact {
            artifact_id,
            name,
            description: None,
            parts,
            metadata: None,
        })
}

fn task() -> impl Strategy<Value = Task> {
    (
        id(),
        id(),
        status(),
        proptest::collection::vec(artifact(), 0..3),
        proptest::collection::vec(message(), 0..3),
    )
        .prop_map(|(id, context_id, status, artifacts, history)| Task {
            id,
            context_id,
            status,
            artifacts,
            history,
            metadata: None,
        })
}

fn event() -> impl Strategy<Value = StreamEvent> {
    prop_oneof![
        task().prop_map(StreamEvent::Task),
        message().prop_map(StreamEvent::Message),
        (id(), id(), status()).prop_map(|(task_id, context_id, status)| {
            StreamEvent::Status(StatusUpdate {
                task_id,
                context_id,
                status,
            })
        }),
        (id(), id(), artifact(), any::<bool>(), any::<bool>()).prop_map(
            |(task_id, context_id, artifact, append, last_chunk)| {
                StreamEvent::Artifact(ArtifactUpdate {
                    task_id,
                    context_id,
                    artifact,
                    append,
                    last_chunk,
                })
            }
        ),
    ]
}

const VERSIONS: [Version; 2] = [Version::V1_0, Version::V0_3];

proptest! {
    #[test]
    fn messages_round_trip(m in message()) {
        for v in VERSIONS {
            prop_assert_eq!(&decode_message(v, &super::message(v, &m)).unwrap(), &m);
        }
    }

    #[test]
    fn tasks_and_send_results_round_trip(t in task(), m in message()) {
        for v in VERSIONS {
            prop_assert_eq!(&decode_task(v, &super::task(v, &t)).unwrap(), &t);
            let r = SendResult::Task(t.clone());
            prop_assert_eq!(decode_send_result(v, &send_result(v, &r)).unwrap(), r);
            let r = SendResult::Message(m.clone());
            prop_assert_eq!(decode_send_result(v, &send_result(v, &r)).unwrap(), r);
        }
    }

    #[test]
    fn stream_events_round_trip(e in event(), last in any::<bool>()) {
        let (back, _) = decode_stream_event(Version::V1_0, &stream_event(Version::V1_0, &e, last)).unwrap();
        prop_assert_eq!(&back, &e);
        let (back, was_last) = decode_stream_event(Version::V0_3, &stream_event(Version::V0_3, &e, last)).unwrap();
        prop_assert_eq!(&back, &e);
        // 0.3 carries `final` on status updates only.
        prop_assert_eq!(was_last, last && matches!(e, StreamEvent::Status(_)));
    }

    #[test]
    fn task_pages_round_trip(tasks in proptest::collection::vec(task(), 0..3), token in "[a-z0-9]{0,8}") {
        let page = TaskPage { tasks, next_page_token: token, page_size: 50, total_size: 7 };
        prop_assert_eq!(decode_task_page(&v1::task_page(&page)).unwrap(), page);
    }

    #[test]
    fn decoding_never_panics(v in arbitrary_json()) {
        for version in VERSIONS {
            let _ = decode_message(version, &v);
            let _ = decode_task(version, &v);
            let _ = decode_send_result(version, &v);
            let _ = decode_stream_event(version, &v);
        }
        let _ = decode_task_page(&v);
    }
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-zA-Z_ ]{0,10}".prop_map(Value::from),
        proptest::sample::select(vec![
            "TASK_STATE_WORKING",
            "working",
            "task",
            "status-update",
            "ROLE_USER",
            "user"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(
                proptest::sample::select(vec![
                    "id",
                    "contextId",
                    "taskId",
                    "messageId",
                    "role",
                    "parts",
                    "text",
                    "kind",
                    "status",
                    "state",
                    "task",
                    "message",
                    "statusUpdate",
                    "artifactUpdate",
                    "artifact",
                    "artifactId",
                    "history",
                    "artifacts",
                    "tasks",
                    "final",
                    "data",
                ])
                .prop_map(str::to_owned),
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
