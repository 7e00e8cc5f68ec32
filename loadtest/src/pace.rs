//! Open-loop pacing: requests are released at their due times by a thread of their own.
//!
//! Request `i` of a run at `rate` per second is due at `start + i / rate`. The pacer hands
//! out one permit per request that has come due; a connection takes a permit, then the next
//! index, and measures that request's latency from its due time.
//!
//! Why not `tokio::time::sleep_until(due)` in each connection: tokio's timer counts whole
//! milliseconds and rounds a deadline up to the next one, and the driver parks in
//! `epoll_wait` with a millisecond timeout. A request slept that way left 1–2 ms after it
//! was due, and every request due in one millisecond left in the same burst. Both counted
//! as latency: a do-nothing server showed a p50 of 1.6 ms at 15k requests/s.
//!
//! The pacer parks with a timeout on its own thread (a futex wait, microseconds) until the next
//! request is due, but at least [`STEP`], so at high rates it wakes every `STEP` and releases
//! the few requests due by then. It never releases a request before it is due.
//!
//! A pacer per load-generator thread on a `timerfd` was tried and cost both sides more CPU
//! a request; `reports/pacing.md` has the figures.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// The shortest wait between two releases: long enough that a wake releases several
/// requests at high rates (a shorter step cost both sides CPU a request; see
/// `reports/pacing.md`).
pub const STEP: Duration = Duration::from_micros(250);

pub struct Pacer {
    start: Instant,
    rate: f64,
    /// Closed when the run stops: waiters get `false`, and the thread ends.
    permits: Arc<Semaphore>,
    thread: Option<JoinHandle<()>>,
}

impl Pacer {
    /// Release requests `0..total` at `rate` per second from `start`.
    pub fn start(start: Instant, rate: f64, total: u64, step: Duration) -> std::io::Result<Pacer> {
        let permits = Arc::new(Semaphore::new(0));
        let thread = {
            let permits = permits.clone();
            std::thread::Builder::new()
                .name("lt-pacer".into())
                .spawn(move || release(start, rate, total, step, &permits))?
        };
        Ok(Pacer {
            start,
            rate,
            permits,
            thread: Some(thread),
        })
    }

    /// When request `i` is due.
    pub fn due(&self, i: u64) -> Instant {
        due(self.start, self.rate, i)
    }

    /// Wait until one more request is due. False once the pacer is closed.
    pub async fn ready(&self) -> bool {
        match self.permits.acquire().await {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        }
    }

    /// Stop releasing, and wake every waiter with `false`.
    pub fn close(&self) {
        self.permits.close();
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn due(start: Instant, rate: f64, i: u64) -> Instant {
    start + Duration::from_secs_f64(i as f64 / rate)
}

fn release(start: Instant, rate: f64, total: u64, step: Duration, permits: &Semaphore) {
    let mut released = 0u64;
    while released < total && !permits.is_closed() {
        let now = Instant::now();
        // By the same `due` the connections measure from, so never early: a few steps a wake.
        let mut n = released;
        while n < total && due(start, rate, n) <= now {
            n += 1;
        }
        if n > released {
            permits.add_permits((n - released) as usize);
            released = n;
        }
        let next = due(start, rate, released);
        // Parked rather than slept, so that close() ends the wait at once.
        std::thread::park_timeout(next.saturating_duration_since(Instant::now()).max(step));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Every request is released at or after its due time, the count matches the rate, and
    /// requests leave close to when they are due (tokio's timer gave 1–2 ms).
    #[test]
    fn releases_on_time_and_never_early() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rate = 20_000.0;
        let total = 6_000; // 300 ms
        let start = Instant::now() + Duration::from_millis(20);
        let pacer = Arc::new(Pacer::start(start, rate, total, STEP).unwrap());
        let next = Arc::new(AtomicU64::new(0));
        let lateness = rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..32 {
                let (pacer, next) = (pacer.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    let mut late = Vec::new();
                    while pacer.ready().await {
                        let now = Instant::now();
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let due = pacer.due(i);
                        assert!(due <= now, "request {i} released {:?} early", due - now);
                        late.push((now - due).as_micros() as u64);
                    }
                    late
                }));
            }
            tokio::time::sleep_until((start + Duration::from_millis(400)).into()).await;
            pacer.close();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        });
        assert_eq!(lateness.len() as u64, total);
        let mut sorted = lateness;
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        // STEP is 250 µs, so the median is about 125 µs; allow a loaded CI machine four times that.
        assert!(median < 500, "median lateness {median} µs");
    }

    #[test]
    fn a_closed_pacer_answers_false() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let pacer =
            Pacer::start(Instant::now() + Duration::from_secs(3600), 1.0, 10, STEP).unwrap();
        pacer.close();
        assert!(!rt.block_on(pacer.ready()));
    }
}
