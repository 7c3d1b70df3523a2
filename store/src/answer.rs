//! A one-shot answer a blocked thread waits for without spinning: the rollout sink's caller
//! (a thread of the rollout writer pool) waits for the database writer thread, which often
//! takes a whole fsync to answer. A channel's blocking receive spins and yields the processor
//! in a loop before it sleeps; on a machine with few cores those `sched_yield` calls were
//! about 5 % of the service's time under a warm-turn load. This one sleeps on a condition
//! variable at once.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

struct Shared<T> {
    value: Mutex<Option<T>>,
    ready: Condvar,
}

/// The answering end; dropping it unanswered answers `gone`.
pub(crate) struct Answerer<T> {
    shared: Arc<Shared<T>>,
    gone: Option<T>,
}

/// The waiting end.
pub(crate) struct Answer<T> {
    shared: Arc<Shared<T>>,
}

/// A pair whose answerer, dropped without answering, answers `gone`.
pub(crate) fn answer<T>(gone: T) -> (Answerer<T>, Answer<T>) {
    let shared = Arc::new(Shared {
        value: Mutex::new(None),
        ready: Condvar::new(),
    });
    (
        Answerer {
            shared: shared.clone(),
            gone: Some(gone),
        },
        Answer { shared },
    )
}

impl<T> Answerer<T> {
    pub(crate) fn send(mut self, value: T) {
        self.gone = None;
        self.put(value);
    }

    fn put(&self, value: T) {
        let mut slot = self
            .shared
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *slot = Some(value);
        drop(slot);
        self.shared.ready.notify_one();
    }
}

impl<T> Drop for Answerer<T> {
    fn drop(&mut self) {
        if let Some(gone) = self.gone.take() {
            self.put(gone);
        }
    }
}

impl<T> Answer<T> {
    /// Blocks until answered.
    pub(crate) fn wait(self) -> T {
        let mut slot = self
            .shared
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(value) = slot.take() {
                return value;
            }
            slot = self
                .shared
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_arrives_whichever_thread_comes_first() {
        let (tx, rx) = answer(0);
        tx.send(7);
        assert_eq!(rx.wait(), 7);
        let (tx, rx) = answer(0);
        let waiter = std::thread::spawn(move || rx.wait());
        std::thread::sleep(std::time::Duration::from_millis(20));
        tx.send(9);
        assert_eq!(waiter.join().unwrap(), 9);
    }

    #[test]
    fn an_answerer_dropped_unanswered_answers_gone() {
        let (tx, rx) = answer(-1);
        let waiter = std::thread::spawn(move || rx.wait());
        drop(tx);
        assert_eq!(waiter.join().unwrap(), -1);
    }
}
