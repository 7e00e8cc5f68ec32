//! Idle polling: after a request, an io thread keeps polling its sockets for a while before
//! it sleeps, as Seastar's reactor does (`--idle-poll-time-us`).
//!
//! An io thread that sleeps in `epoll_wait` between requests has to be woken for the next
//! one, and on a virtual machine a wake-up is expensive: the sender's kernel sends the idle
//! CPU an interrupt, and the CPU has left and must re-enter the guest. The same goes the
//! other way: a response sent to a sleeping client makes *this* thread pay for waking it.
//!
//! [`IdlePoll::run`] is a task on the io runtime. After each request ([`IdlePoll::touch`]) it
//! yields in a loop until `window` has passed with no new request. While it yields, the
//! runtime never runs out of work, so instead of parking it polls the sockets with a zero
//! timeout between task polls: a request that arrives meanwhile is picked up without a
//! wake-up. Then the task waits for the next request, and the thread sleeps as before.
//!
//! The cost is CPU: under steady load one io thread stays busy. Off by default
//! (`io_idle_poll_us = 0`). It is made for one io thread (the current-thread scheduler). With
//! several, the task polls on one worker, and only while that worker holds the I/O driver.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub struct IdlePoll {
    window: Duration,
    /// Requests seen, so the poller can tell a new one from none.
    seen: AtomicU64,
    /// True while the poller waits for a request (and the thread may sleep).
    idle: AtomicBool,
    wake: Notify,
    /// Yields spent polling, for tests.
    polls: AtomicU64,
}

impl IdlePoll {
    pub fn new(window: Duration) -> Arc<IdlePoll> {
        Arc::new(IdlePoll {
            window,
            seen: AtomicU64::new(0),
            idle: AtomicBool::new(true),
            wake: Notify::new(),
            polls: AtomicU64::new(0),
        })
    }

    /// A request came in: poll for `window` from now.
    #[inline]
    pub fn touch(&self) {
        self.seen.fetch_add(1, Ordering::Relaxed);
        // One load on the hot path; the swap only when the poller waits.
        if self.idle.load(Ordering::Relaxed) && self.idle.swap(false, Ordering::AcqRel) {
            // Stores a permit if the poller is not waiting yet, so no request is missed.
            self.wake.notify_one();
        }
    }

    /// Whether the poller waits for a request (rather than polling).
    pub fn is_idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    /// How many times the poller has yielded so far.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// Poll after every request, for as long as the task lives. Spawn it on the io runtime.
    pub async fn run(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            let mut seen = self.seen.load(Ordering::Relaxed);
            let mut until = Instant::now() + self.window;
            loop {
                tokio::task::yield_now().await;
                self.polls.fetch_add(1, Ordering::Relaxed);
                let now_seen = self.seen.load(Ordering::Relaxed);
                let now = Instant::now();
                if now_seen != seen {
                    seen = now_seen;
                    until = now + self.window;
                } else if now >= until {
                    break;
                }
            }
            self.idle.store(true, Ordering::Release);
            // A request between the last check and the store above set `seen` but found the
            // poller busy: poll again for it rather than sleep through it.
            if self.seen.load(Ordering::Relaxed) != seen && self.idle.swap(false, Ordering::AcqRel)
            {
                self.wake.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Polls only after a request, for about its window, then sleeps until the next.
    #[test]
    fn polls_for_the_window_after_a_request_then_sleeps() {
        runtime().block_on(async {
            let window = Duration::from_millis(20);
            let poll = IdlePoll::new(window);
            let task = tokio::spawn(poll.clone().run());
            // No request yet: no polling.
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert!(poll.is_idle());
            assert_eq!(poll.polls(), 0);

            let t = Instant::now();
            poll.touch();
            assert!(!poll.is_idle());
            // The sleep below is served between polls; it ends when the poller gives up.
            while !poll.is_idle() {
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(t.elapsed() < Duration::from_secs(5), "never went idle");
            }
            let polled_for = t.elapsed();
            assert!(polled_for >= window, "idle after {polled_for:?}");
            let after = poll.polls();
            assert!(after > 0);
            // Idle again: the count stands still.
            tokio::time::sleep(Duration::from_millis(40)).await;
            assert_eq!(poll.polls(), after);

            // Requests inside the window extend it.
            let t = Instant::now();
            for _ in 0..5 {
                poll.touch();
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert!(
                    !poll.is_idle(),
                    "idle {:?} into a busy stretch",
                    t.elapsed()
                );
            }
            while !poll.is_idle() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(t.elapsed() >= Duration::from_millis(50 + 20 - 10));
            task.abort();
        });
    }
}
