//! A one-value channel that an async task can await and a plain thread can block on, with no
//! async runtime: the store's writer thread answers async callers through it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

/// The sender went away without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

struct State<T> {
    value: Option<T>,
    sender_gone: bool,
    receiver_gone: bool,
    waker: Option<Waker>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

/// Sends one value.
pub struct Sender<T>(Arc<Shared<T>>);

/// Receives one value: `.await` it, or [`Receiver::blocking_recv`].
pub struct Receiver<T>(Arc<Shared<T>>);

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            value: None,
            sender_gone: false,
            receiver_gone: false,
            waker: None,
        }),
        ready: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

fn lock<T>(shared: &Shared<T>) -> std::sync::MutexGuard<'_, State<T>> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> Sender<T> {
    /// Send the value; it comes back if the receiver is gone.
    pub fn send(self, value: T) -> Result<(), T> {
        let waker = {
            let mut state = lock(&self.0);
            if state.receiver_gone {
                return Err(value);
            }
            state.value = Some(value);
            state.waker.take()
        };
        self.0.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the receiver is gone, so that the value would be wasted.
    pub fn is_closed(&self) -> bool {
        lock(&self.0).receiver_gone
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.0);
            state.sender_gone = true;
            state.waker.take()
        };
        self.0.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Wait for the value on this thread.
    pub fn blocking_recv(self) -> Result<T, Closed> {
        let mut state = lock(&self.0);
        loop {
            if let Some(v) = state.value.take() {
                return Ok(v);
            }
            if state.sender_gone {
                return Err(Closed);
            }
            state = self.0.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("oneshot::Receiver")
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Closed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = lock(&self.0);
        if let Some(v) = state.value.take() {
            return Poll::Ready(Ok(v));
        }
        if state.sender_gone {
            return Poll::Ready(Err(Closed));
        }
        match &mut state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        lock(&self.0).receiver_gone = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_receives_what_another_thread_sends() {
        let (tx, rx) = channel();
        let t = std::thread::spawn(move || tx.send(7).unwrap());
        assert_eq!(rx.blocking_recv(), Ok(7));
        t.join().unwrap();
    }

    #[test]
    fn a_dropped_sender_closes_and_a_dropped_receiver_refuses() {
        let (tx, rx) = channel::<u8>();
        drop(tx);
        assert_eq!(rx.blocking_recv(), Err(Closed));
        let (tx, rx) = channel::<u8>();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(3), Err(3));
    }

    #[test]
    fn awaits_across_threads() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for _ in 0..100 {
            let (tx, rx) = channel();
            let t = std::thread::spawn(move || tx.send("x").unwrap());
            assert_eq!(rt.block_on(rx), Ok("x"));
            t.join().unwrap();
        }
        let (tx, rx) = channel::<()>();
        let t = std::thread::spawn(move || drop(tx));
        assert_eq!(rt.block_on(rx), Err(Closed));
        t.join().unwrap();
    }
}
