//! Counts of long texts already counted, per encoding: the instructions, the tool
//! descriptions and every history item are counted again before each model call (T5), and
//! they rarely change, so a warm turn counts only what is new.
//!
//! Keyed by a 64-bit hash of the text and its length. Texts shorter than [`MIN_LEN`] are
//! counted directly (hashing would cost about as much). The map holds at most [`CAPACITY`]
//! counts and is emptied when full; a cleared map only costs the next counts their BPE time.
//! One mutex per encoding, held for a lookup or an insert, never while counting.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Mutex;

/// Texts at least this long (bytes) are remembered.
pub(super) const MIN_LEN: usize = 256;
/// Most counts kept per encoding (about 40 bytes each).
pub(super) const CAPACITY: usize = 4096;

type Key = (u64, usize);

/// A bounded map of text hash -> token count.
pub(super) struct Memo {
    counts: Mutex<Option<HashMap<Key, usize>>>,
}

impl Memo {
    pub(super) const fn new() -> Self {
        Self {
            counts: Mutex::new(None),
        }
    }

    /// The count of `text`, from the memo or from `count` (then remembered).
    pub(super) fn get_or_count(&self, text: &str, count: impl FnOnce(&str) -> usize) -> usize {
        if text.len() < MIN_LEN {
            return count(text);
        }
        // A fixed hasher: keys only need to be equal for equal texts within the process.
        let key = (
            BuildHasherDefault::<DefaultHasher>::default().hash_one(text),
            text.len(),
        );
        if let Some(found) = self.with(|map| map.get(&key).copied()) {
            return found;
        }
        let n = count(text);
        self.with(|map| {
            if map.len() >= CAPACITY {
                map.clear();
            }
            map.insert(key, n);
        });
        n
    }

    /// Counts remembered now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.with(|map| map.len())
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<Key, usize>) -> R) -> R {
        // A panic while the lock was held cannot leave the map inconsistent (every update is
        // one insert or one clear), so a poisoned lock is used as is.
        let mut guard = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.get_or_insert_with(HashMap::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn long(tag: usize) -> String {
        format!("{tag} {}", "word ".repeat(MIN_LEN))
    }

    #[test]
    fn a_long_text_is_counted_once() {
        let memo = Memo::new();
        let calls = Cell::new(0);
        let count = |t: &str| {
            calls.set(calls.get() + 1);
            t.len()
        };
        let text = long(1);
        assert_eq!(memo.get_or_count(&text, count), text.len());
        assert_eq!(memo.get_or_count(&text, count), text.len());
        assert_eq!(calls.get(), 1);
        // Another text of the same length is another key.
        let other = long(2);
        assert_eq!(other.len(), text.len());
        memo.get_or_count(&other, count);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn short_texts_are_not_remembered() {
        let memo = Memo::new();
        let calls = Cell::new(0);
        for _ in 0..3 {
            memo.get_or_count("short", |t| {
                calls.set(calls.get() + 1);
                t.len()
            });
        }
        assert_eq!(calls.get(), 3);
        assert_eq!(memo.len(), 0);
    }

    #[test]
    fn the_memo_stays_bounded() {
        let memo = Memo::new();
        for i in 0..CAPACITY * 2 + 3 {
            memo.get_or_count(&long(i), str::len);
        }
        assert!(memo.len() <= CAPACITY, "{}", memo.len());
        assert!(memo.len() > 0);
    }
}
