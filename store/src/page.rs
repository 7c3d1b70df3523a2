//! Which messages one page holds: the rule both stores share. A page is bounded by a count
//! (`limit`) and by the bytes of its messages' content (`max_bytes`); it is planned from the
//! messages older than the cursor, newest first, one at a time, from their sizes alone, so
//! a store reads the content of no message the page does not return.

/// What a page holds: the messages with ids in `oldest..=newest` that are older than the
/// cursor (none when `ids` is `None`), and the cursor of the next (older) page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PagePlan {
    /// The oldest and newest id in the page.
    pub ids: Option<(u64, u64)>,
    /// How many messages the page holds.
    pub count: usize,
    /// The page's content bytes.
    pub bytes: usize,
    pub next_before: Option<u64>,
}

/// Plans a page from `(message_id, content bytes)` of the session's messages older than the
/// cursor, newest first. Takes messages while fewer than `limit` are taken and the content
/// stays within `max_bytes`, but always the first one (when `limit` is at least 1) so that
/// paging progresses. Stops reading at the first message it does not take: that one tells
/// that an older page exists, and `next_before` is then the oldest id taken. With a zero
/// `limit` the page is empty and `next_before` is one past the newest message (so the next
/// page starts there), `None` when there is none.
pub(crate) fn plan<E>(
    newest_first: impl IntoIterator<Item = Result<(u64, usize), E>>,
    limit: usize,
    max_bytes: usize,
) -> Result<PagePlan, E> {
    let mut plan = PagePlan {
        ids: None,
        count: 0,
        bytes: 0,
        next_before: None,
    };
    for item in newest_first {
        let (id, bytes) = item?;
        let full =
            plan.count >= limit || (plan.count > 0 && plan.bytes.saturating_add(bytes) > max_bytes);
        if full {
            plan.next_before = Some(match plan.ids {
                Some((oldest, _)) => oldest,
                None => id.saturating_add(1),
            });
            break;
        }
        plan.count += 1;
        plan.bytes = plan.bytes.saturating_add(bytes);
        plan.ids = Some(plan.ids.map_or((id, id), |(_, newest)| (id, newest)));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::convert::Infallible;

    fn sized(sizes: &[(u64, usize)]) -> impl Iterator<Item = Result<(u64, usize), Infallible>> {
        sizes.iter().copied().map(Ok)
    }

    fn run(sizes: &[(u64, usize)], limit: usize, max_bytes: usize) -> PagePlan {
        match plan(sized(sizes), limit, max_bytes) {
            Ok(p) => p,
            Err(e) => match e {},
        }
    }

    #[test]
    fn stops_before_the_message_that_passes_the_budget() {
        let p = run(&[(9, 4), (8, 4), (7, 4), (6, 1)], 10, 10);
        assert_eq!(p.ids, Some((8, 9)));
        assert_eq!((p.count, p.bytes), (2, 8));
        assert_eq!(p.next_before, Some(8));
    }

    #[test]
    fn a_message_larger_than_the_budget_comes_alone() {
        let p = run(&[(9, 100), (8, 1)], 10, 10);
        assert_eq!((p.ids, p.count, p.next_before), (Some((9, 9)), 1, Some(9)));
        let last = run(&[(3, 100)], 10, 10);
        assert_eq!((last.ids, last.next_before), (Some((3, 3)), None));
    }

    #[test]
    fn the_budget_is_inclusive_and_the_count_still_bounds() {
        let p = run(&[(9, 5), (8, 5), (7, 0)], 10, 10);
        assert_eq!((p.ids, p.next_before), (Some((7, 9)), None));
        let p = run(&[(9, 0), (8, 0), (7, 0)], 2, 10);
        assert_eq!((p.ids, p.next_before), (Some((8, 9)), Some(8)));
    }

    #[test]
    fn a_zero_limit_keeps_the_cursor_past_the_newest() {
        let p = run(&[(9, 1), (8, 1)], 0, 10);
        assert_eq!((p.ids, p.count, p.next_before), (None, 0, Some(10)));
        assert_eq!(run(&[], 0, 10).next_before, None);
    }

    #[test]
    fn it_reads_no_further_than_one_past_the_page() {
        let mut read = 0;
        let items = (0..100u64).rev().map(|id| {
            read += 1;
            Ok::<_, Infallible>((id, 3))
        });
        let p = match plan(items, 50, 7) {
            Ok(p) => p,
            Err(e) => match e {},
        };
        assert_eq!(p.count, 2);
        assert_eq!(read, 3);
    }

    #[test]
    fn a_read_error_is_returned() {
        let items = [Ok((5, 1)), Err("broken")];
        assert_eq!(plan(items, 10, 10), Err("broken"));
    }

    proptest! {
        /// Following the cursor visits every message once, newest page first; each page is
        /// within both bounds unless it is one message.
        #[test]
        fn paging_visits_everything_once(
            sizes in proptest::collection::vec(0usize..50, 0..40),
            limit in 1usize..8,
            max_bytes in 0usize..120,
        ) {
            let all: Vec<(u64, usize)> =
                sizes.iter().enumerate().map(|(i, s)| (i as u64 + 1, *s)).collect();
            let mut seen = Vec::new();
            let mut before = u64::MAX;
            loop {
                let older: Vec<(u64, usize)> =
                    all.iter().rev().copied().filter(|(id, _)| *id < before).collect();
                let p = run(&older, limit, max_bytes);
                prop_assert!(p.count >= 1 || older.is_empty());
                prop_assert!(p.count <= limit);
                prop_assert!(p.bytes <= max_bytes || p.count == 1);
                if let Some((oldest, newest)) = p.ids {
                    let ids: Vec<u64> = (oldest..=newest).rev().collect();
                    prop_assert_eq!(ids.len(), p.count);
                    seen.extend(ids);
                }
                match p.next_before {
                    Some(b) => {
                        prop_assert!(b < before);
                        before = b;
                    }
                    None => break,
                }
            }
            let want: Vec<u64> = all.iter().rev().map(|(id, _)| *id).collect();
            prop_assert_eq!(seen, want);
        }
    }
}
