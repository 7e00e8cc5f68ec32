//! Polling before sleeping: after a request, an io thread keeps asking its reactor for
//! events, without blocking, for a short window (`io_poll_us`) before it lets itself sleep.
//!
//! A thread that sleeps in `epoll_wait` is woken by the next packet through the scheduler,
//! and a CPU with nothing to run halts. Under a hypervisor that does not poll before
//! halting a virtual CPU (this project's machine boots with
//! `haltpoll.guest_halt_poll_ns=0`), waking it again takes tens of microseconds: at one
//! connection, a loopback round trip to a server that does nothing took about 100 µs, most
//! of it waking. Linux's own `haltpoll` governor polls for up to 200 µs by default; this
//! does the same in the process, where the machine does not.
//!
//! Each round yields twice: to the runtime, which polls its reactor without blocking
//! (tokio's `yield_now` runs a yielded task again only after that), and to the kernel
//! (`sched_yield`), so anything else runnable on the CPU (the load generator, on a shared
//! machine) runs first. Polling costs CPU only in the gaps between requests, at most the
//! window for each gap, and a thread that serves nothing never starts.
//!
//! Figures: `loadtest/reports/2026-11-24c.md`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};

thread_local! {
    /// Requests begun on this thread.
    static REQUESTS: Cell<u64> = const { Cell::new(0) };
    /// The poller of this thread, while it sleeps.
    static SLEEPING: RefCell<Option<Waker>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Rounds of polling on this thread.
    static ROUNDS: Cell<u64> = const { Cell::new(0) };
}

/// Count a request begun on this thread, and wake the thread's poller if it sleeps.
#[inline]
pub fn note_request() {
    REQUESTS.with(|r| r.set(r.get().wrapping_add(1)));
    if let Some(w) = SLEEPING.with(|s| s.borrow_mut().take()) {
        w.wake();
    }
}

/// Ready once [`note_request`] has taken the waker it leaves.
struct Woken {
    waiting: bool,
}

impl Future for Woken {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.waiting && SLEEPING.with(|s| s.borrow().is_none()) {
            return Poll::Ready(());
        }
        self.waiting = true;
        SLEEPING.with(|s| *s.borrow_mut() = Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// The poller: sleeps until a request begins on this thread, then polls until `window`
/// passes with none beginning, and sleeps again. Runs for as long as its runtime.
async fn poll_after_requests(window: Duration) {
    loop {
        Woken { waiting: false }.await;
        let mut seen = REQUESTS.with(Cell::get);
        let mut quiet_since = Instant::now();
        loop {
            std::thread::yield_now();
            tokio::task::yield_now().await;
            #[cfg(test)]
            ROUNDS.with(|r| r.set(r.get() + 1));
            let now = Instant::now();
            let requests = REQUESTS.with(Cell::get);
            if requests != seen {
                seen = requests;
                quiet_since = now;
            } else if now.duration_since(quiet_since) >= window {
                break;
            }
        }
    }
}

/// Start the poller on `handle`'s runtime, when `window` is not zero and the runtime is a
/// current-thread one: its thread is then the one whose requests [`note_request`] counts,
/// and whose reactor a yield polls. (On a multi-thread runtime, a task moves between
/// threads and a thread-local count means nothing.)
pub fn start(handle: &Handle, window: Duration) {
    if !window.is_zero() && handle.runtime_flavor() == RuntimeFlavor::CurrentThread {
        handle.spawn(poll_after_requests(window));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds of polling this thread has done.
    fn rounds() -> u64 {
        ROUNDS.with(Cell::get)
    }

    /// Asleep until a request, then polling (and letting a timer fire meanwhile: each round
    /// polls the reactor), for the window after the last request, then asleep again.
    #[test]
    fn polls_for_the_window_after_the_last_request() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ms = Duration::from_millis;
            start(&Handle::current(), ms(500));
            tokio::time::sleep(ms(100)).await;
            assert_eq!(rounds(), 0, "polled with no request");
            note_request();
            tokio::time::sleep(ms(300)).await;
            let after_first = rounds();
            assert!(after_first > 100, "{after_first} rounds in 300 ms");
            // A second request 300 ms in: still polling 300 ms later, past the first window.
            note_request();
            tokio::time::sleep(ms(300)).await;
            let before = rounds();
            tokio::time::sleep(ms(20)).await;
            assert!(
                rounds() > before,
                "stopped polling within the window of a request"
            );
            // 500 ms after the last request it sleeps, and stays asleep.
            tokio::time::sleep(ms(700)).await;
            let asleep = rounds();
            tokio::time::sleep(ms(100)).await;
            assert_eq!(rounds(), asleep, "polling with no request for 800 ms");
            // A request wakes it again.
            note_request();
            tokio::time::sleep(ms(50)).await;
            assert!(rounds() > asleep);
        });
    }

    #[test]
    fn no_poller_for_a_zero_window_or_a_multi_thread_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            start(&Handle::current(), Duration::ZERO);
            note_request();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(rounds(), 0);
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            start(&Handle::current(), Duration::from_millis(100));
            let rounds_there = tokio::spawn(async {
                note_request();
                tokio::time::sleep(Duration::from_millis(50)).await;
                rounds()
            });
            assert_eq!(rounds_there.await.unwrap(), 0);
        });
    }
}
