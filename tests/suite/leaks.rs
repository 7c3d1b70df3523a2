//! No leaks (seed 000 §14): 10,000 conversations opened, given a task, cancelled by close.
//! Afterwards the session holds only its root, no task, no slot, no pending approval, the
//! conversation actors are gone, and the live heap does not grow with the count: the second
//! half of the run leaves it where the first half did, within a small allowance.
//!
//! Process-wide gauges are read, so this suite is run by cargo-nextest (a process per test).

use futures::StreamExt;
use std::time::Duration;
use troupe_actors::conversation::live_conversations;
use troupe_actors::scheduler::SchedulerMsg;
use troupe_proto::{CloseOutcome, OpenConversation};
use troupe_runtime::ScriptedReply;
use troupe_tests::TestSession;

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

async fn churn(t: &TestSession, n: usize) {
    futures::stream::iter(0..n)
        .for_each_concurrent(64, |_| async {
            let c = t.session.open(OpenConversation::default()).await.unwrap();
            let s = t.session.clone();
            let task = tokio::spawn(async move { s.message(c, "wait").await });
            // Close races the message on purpose: it may cancel a queued or running task,
            // or find the message not yet arrived (then the message is refused).
            let closed = t.session.close(c).await.unwrap();
            assert_ne!(closed.outcome, CloseOutcome::ForceAborted);
            let _ = task.await.unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_open_close_cycles_leave_nothing_behind() {
    let hangs: Vec<_> = (0..10_000).map(|_| ScriptedReply::hang(true)).collect();
    let t = TestSession::start_with(
        hangs,
        |c| c.conversation.close_timeout = Duration::from_secs(30),
        None,
    )
    .await;
    let baseline_live = live_conversations();
    // The rollout writer may lag behind a burst; a flush lets it catch up before measuring.
    churn(&t, 5_000).await;
    t.session.flush().await.unwrap();
    let rss_half = rss_kib();
    let heap_half = crate::allocated();
    churn(&t, 5_000).await;
    t.session.flush().await.unwrap();
    let rss_end = rss_kib();
    let heap_end = crate::allocated();

    let root = t.root().await;
    assert_eq!(t.session.list().await.unwrap(), vec![root]);
    assert!(t.session.tasks(None).await.unwrap().is_empty());
    assert!(t.session.pending_approvals().await.unwrap().is_empty());
    let s = t.session.services().await.unwrap();
    let snap = ractor::call!(s.scheduler, |reply| SchedulerMsg::Snapshot { reply }).unwrap();
    assert!(
        snap.running.is_empty() && snap.waiting.is_empty(),
        "{snap:?}"
    );
    // Actors stop just after answering close; give the runtime a bounded moment to drop them.
    for _ in 0..200 {
        if live_conversations() == baseline_live {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        live_conversations(),
        baseline_live,
        "conversation actors leaked"
    );
    // A leak of even 100 bytes a conversation would show as 500 KB here.
    let growth = heap_end.saturating_sub(heap_half);
    assert!(
        growth < 128 * 1024,
        "live heap grew by {growth} bytes over the second 5,000 cycles \
         (heap {heap_half} -> {heap_end} bytes; RSS {rss_half} -> {rss_end} KiB)"
    );
    t.stop().await;
}
