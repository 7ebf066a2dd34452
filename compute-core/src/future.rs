//! Minimal futures plumbing: a one-shot channel and a blocking executor.
//!
//! The runtime has no async executor of its own; reads and syncs return futures that complete when
//! a backend signals them, and the blocking client methods drive them with [`block_on`].

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::sync::Arc;

/// A boxed future, as returned by `sync`.
pub type DynFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    closed: bool,
}

/// The sending half of [`oneshot`].
pub struct Sender<T> {
    slot: Arc<spin::Mutex<Slot<T>>>,
}

/// The receiving half of [`oneshot`]: a future yielding `Some(value)`, or `None` if the sender was
/// dropped without sending.
pub struct Receiver<T> {
    slot: Arc<spin::Mutex<Slot<T>>>,
}

/// A channel carrying one value from a backend thread to a future.
pub fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(spin::Mutex::new(Slot {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender { slot: slot.clone() }, Receiver { slot })
}

impl<T> Sender<T> {
    /// Deliver the value and wake the receiver.
    pub fn send(self, value: T) {
        let waker = {
            let mut slot = self.slot.lock();
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = self.slot.lock();
            slot.closed = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.slot.lock();
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Some(value));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Run a future to completion on the calling thread, parking (not spinning) while it is pending.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = core::pin::pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oneshot_delivers_across_threads() {
        let (tx, rx) = oneshot();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            tx.send(42u32);
        });
        assert_eq!(block_on(rx), Some(42));
        t.join().unwrap();
    }

    #[test]
    fn dropped_sender_closes() {
        let (tx, rx) = oneshot::<u8>();
        drop(tx);
        assert_eq!(block_on(rx), None);
    }
}
