//! A streaming connection's outgoing frames (answers and notifications), bounded in bytes,
//! and the bound on its calls in flight.
//!
//! Whatever a client does, what the service holds for one connection is bounded: at most
//! [`MAX_IN_FLIGHT`] calls run for it at once (the transport stops reading frames until one
//! ends), and at most [`OUTBOX_BYTES`] of frames wait for it to read. A WebSocket client that
//! leaves that much unread is disconnected ([`Overflow::Disconnect`]); the stdio peer (the
//! local user's editor) is waited for instead ([`Overflow::Wait`]).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Calls of one connection running at once.
pub const MAX_IN_FLIGHT: usize = 8;
/// Bytes of frames waiting for one client to read them.
pub const OUTBOX_BYTES: usize = 16 << 20;

/// What a full outbox does to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The client is not reading: close the connection.
    Disconnect,
    /// Wait until the client has read enough.
    Wait,
}

/// A frame and the room it takes in the outbox (given back once it is written).
pub struct Queued {
    pub text: String,
    _room: OwnedSemaphorePermit,
}

/// The sending end, shared by a connection's calls and subscriptions.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Queued>,
    room: Arc<Semaphore>,
    overflow: Overflow,
    /// Cancelled when the connection is to close.
    closed: CancellationToken,
    transport: &'static str,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("transport", &self.transport)
            .field("room", &self.room.available_permits())
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox and the receiver its writer task drains.
    pub fn new(
        overflow: Overflow,
        closed: CancellationToken,
        transport: &'static str,
    ) -> (Self, mpsc::UnboundedReceiver<Queued>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbox = Self {
            tx,
            room: Arc::new(Semaphore::new(OUTBOX_BYTES)),
            overflow,
            closed,
            transport,
        };
        (outbox, rx)
    }

    /// Queues a frame; `false` when the connection is closing (or closed by this call,
    /// because its client left [`OUTBOX_BYTES`] unread).
    pub async fn push(&self, text: String) -> bool {
        let need = room_for(text.len());
        let room = match self.overflow {
            Overflow::Disconnect => match self.room.clone().try_acquire_many_owned(need) {
                Ok(room) => room,
                Err(_) => {
                    tracing::info!(
                        transport = self.transport,
                        "client left its outbox full: disconnected"
                    );
                    crate::metrics::stream_client_dropped(self.transport, "outbox_full");
                    self.closed.cancel();
                    return false;
                }
            },
            Overflow::Wait => {
                let acquire = self.room.clone().acquire_many_owned(need);
                tokio::select! {
                    () = self.closed.cancelled() => return false,
                    room = acquire => match room {
                        Ok(room) => room,
                        Err(_) => return false,
                    },
                }
            }
        };
        self.tx.send(Queued { text, _room: room }).is_ok()
    }
}

/// Outbox room a frame of `len` bytes takes (a frame larger than the outbox takes all of it).
fn room_for(len: usize) -> u32 {
    u32::try_from(len.clamp(1, OUTBOX_BYTES)).unwrap_or(u32::MAX)
}

/// The calls in flight on one connection.
#[derive(Debug, Clone)]
pub struct InFlight(Arc<Semaphore>);

impl Default for InFlight {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(MAX_IN_FLIGHT)))
    }
}

impl InFlight {
    /// Waits for a call's slot (the transport reads no frame meanwhile).
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_that_does_not_read_is_disconnected_once_its_outbox_is_full() {
        let closed = CancellationToken::new();
        let (outbox, mut rx) = Outbox::new(Overflow::Disconnect, closed.clone(), "test");
        let frame = "x".repeat(OUTBOX_BYTES / 4);
        for _ in 0..4 {
            assert!(outbox.push(frame.clone()).await);
        }
        assert!(!closed.is_cancelled());
        assert!(!outbox.push("y".into()).await, "full: refused");
        assert!(closed.is_cancelled(), "and the connection closes");
        // What was queued is still there to write (or drop) in order.
        assert_eq!(
            rx.recv().await.map(|q| q.text.len()),
            Some(OUTBOX_BYTES / 4)
        );
    }

    #[tokio::test]
    async fn reading_gives_the_room_back() {
        let closed = CancellationToken::new();
        let (outbox, mut rx) = Outbox::new(Overflow::Disconnect, closed.clone(), "test");
        let frame = "x".repeat(OUTBOX_BYTES / 2);
        for _ in 0..10 {
            assert!(outbox.push(frame.clone()).await);
            assert!(outbox.push(frame.clone()).await);
            drop(rx.recv().await);
            drop(rx.recv().await);
        }
        assert!(!closed.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn the_stdio_peer_is_waited_for() {
        let closed = CancellationToken::new();
        let (outbox, mut rx) = Outbox::new(Overflow::Wait, closed.clone(), "test");
        let big = "x".repeat(OUTBOX_BYTES);
        assert!(outbox.push(big.clone()).await);
        let waiting = tokio::spawn({
            let outbox = outbox.clone();
            async move { outbox.push("y".into()).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "waits while the outbox is full");
        drop(rx.recv().await);
        assert!(waiting.await.unwrap());
        assert!(!closed.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_runs_a_bounded_number_of_calls() {
        let in_flight = InFlight::default();
        let mut slots = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            slots.push(in_flight.slot().await.unwrap());
        }
        let next = tokio::time::timeout(std::time::Duration::from_millis(20), in_flight.slot());
        assert!(next.await.is_err(), "the next call waits");
        slots.pop();
        assert!(in_flight.slot().await.is_some());
    }
}
