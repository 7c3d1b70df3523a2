//! The rollout applies each StoragePolicy exactly (S10), end to end through a conversation:
//! canary strings in the user message, the instructions, tool arguments, tool output and the
//! reply are on disk only where the policy allows.

use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{FileRolloutStorage, RolloutMsg};
use troupe_proto::EventName;
use troupe_proto::{OpenConversation, StoragePolicy};
use troupe_runtime::ScriptedReply;
use troupe_tests::{TestSession, contains};

const INPUT: &str = "CANARY-INPUT-4417";
const INSTR: &str = "CANARY-INSTR-9120";
const ARGS: &str = "CANARY-ARGS-5531";
const REPLY: &str = "CANARY-REPLY-7782";

async fn converse(policy: StoragePolicy) -> TestSession {
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool(
                "update_plan",
                serde_json::json!({"explanation": ARGS, "plan": []}),
            ),
            ScriptedReply::text(REPLY),
        ],
        |_| {},
        None,
    )
    .await;
    let c = t
        .session
        .open(OpenConversation {
            storage_policy: policy,
            user_instructions: Some(INSTR.into()),
            include_plan_tool: true,
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    let reply = t.session.message(c, INPUT).await.unwrap();
    assert_eq!(reply.text, REPLY);
    t.session.flush().await.unwrap();
    t
}

#[tokio::test]
async fn full_keeps_everything() {
    let t = converse(StoragePolicy::Full).await;
    let disk = t.disk_bytes();
    for canary in [INPUT, INSTR, ARGS, REPLY] {
        assert!(contains(&disk, canary), "{canary} missing under Full");
    }
    t.stop().await;
}

#[tokio::test]
async fn headers_only_keeps_no_content_but_keeps_the_shape() {
    let t = converse(StoragePolicy::HeadersOnly).await;
    let disk = t.disk_bytes();
    for canary in [INPUT, INSTR, ARGS, REPLY] {
        assert!(
            !contains(&disk, canary),
            "{canary} leaked under HeadersOnly"
        );
    }
    assert!(contains(&disk, "update_plan"), "tool names are headers");
    assert!(contains(&disk, "tool_call_finished"));
    t.stop().await;
}

#[tokio::test]
async fn none_keeps_start_end_and_errors_only() {
    let t = converse(StoragePolicy::None).await;
    let disk = t.disk_bytes();
    for canary in [INPUT, INSTR, ARGS, REPLY] {
        assert!(!contains(&disk, canary), "{canary} leaked under None");
    }
    assert!(!contains(&disk, "update_plan"), "no tool names under None");
    assert!(contains(&disk, "task_started"));
    assert!(contains(&disk, "task_finished"));
    t.stop().await;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The sweep's mechanics end to end, from what the session wrote (its timing is proven under
/// paused time in the Rollout's and the sweeper's own tests): with a TTL of zero every Full
/// record is due at once, and the running session goes on writing after the sweep.
#[tokio::test]
async fn ttl_keeps_content_until_the_sweep() {
    let t = TestSession::start(vec![
        ScriptedReply::text(REPLY),
        ScriptedReply::text("SECOND-REPLY"),
    ])
    .await;
    let c = t
        .session
        .open(OpenConversation {
            storage_policy: StoragePolicy::Ttl { secs: 0 },
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    t.session.message(c, INPUT).await.unwrap();
    t.session.flush().await.unwrap();
    assert!(contains(&t.disk_bytes(), INPUT));
    assert!(contains(&t.disk_bytes(), REPLY));
    let storage = FileRolloutStorage::new(t.dir.path().join("rollout"));
    let report = storage.sweep_due(now_ms()).unwrap();
    assert!(report.downgraded > 0 && report.failures == 0, "{report:?}");
    let disk = t.disk_bytes();
    assert!(!contains(&disk, INPUT), "input survived the TTL sweep");
    assert!(!contains(&disk, REPLY), "reply survived the TTL sweep");
    assert!(contains(&disk, "task_finished"), "headers stay");
    // The session writes on into the swept file.
    t.session.message(c, "again").await.unwrap();
    t.session.flush().await.unwrap();
    assert!(contains(&t.disk_bytes(), "SECOND-REPLY"));
    let s = t.session.services().await.unwrap();
    let records = ractor::call!(s.rollout, |reply| RolloutMsg::ReadConversation {
        conversation_id: c,
        reply
    })
    .unwrap()
    .unwrap();
    assert!(records.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(
        records
            .iter()
            .any(|r| r.kind == EventName::TaskFinished && r.event.is_none())
    );
    assert!(
        records
            .iter()
            .any(|r| r.kind == EventName::TaskFinished && r.event.is_some())
    );
    t.stop().await;
}

#[tokio::test]
async fn root_policy_comes_from_the_session_config() {
    let t = TestSession::start_with(
        vec![ScriptedReply::text(REPLY)],
        |c| c.root.storage_policy = StoragePolicy::None,
        None,
    )
    .await;
    let root = t.root().await;
    t.session.message(root, INPUT).await.unwrap();
    t.session.flush().await.unwrap();
    assert!(!contains(&t.disk_bytes(), INPUT));
    t.stop().await;
}
