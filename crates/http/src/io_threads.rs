//! Thread-per-core serving: a few threads, each running its own current-thread tokio
//! runtime. The accept loop hands each new connection to the thread with the fewest open
//! connections, and the connection lives there until it closes: its socket is registered
//! with that thread's reactor, and its requests, timers and wake-ups never leave it.
//!
//! Against tokio's work-stealing scheduler, a connection's task is never stolen or woken
//! across threads, and no thread parks and unparks the others; against a single thread,
//! every core serves.
//!
//! With `pin`, thread i is bound to the i-th CPU the process may run on (Seastar's thread
//! affinity), when there are at least as many CPUs as threads: an io thread then keeps its
//! caches, and no two io threads ever share a core, which lowers the tail latency when a load
//! generator shares the machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Running io threads; none when serving on one thread, the caller's. Stopping them (or
/// dropping this) drops whatever tasks are still on them, after each thread's current poll.
pub struct IoThreads {
    threads: Vec<IoThread>,
}

struct IoThread {
    handle: Handle,
    open: Arc<AtomicUsize>,
    /// The CPU it is bound to, if pinned and the bind succeeded.
    cpu: Option<usize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Where a connection lives: the runtime its socket is registered with and its tasks run
/// on, and its place in that thread's count of open connections, given back when dropped.
pub struct Placement {
    handle: Handle,
    open: Option<Arc<AtomicUsize>>,
}

impl Placement {
    /// The runtime to run this connection's tasks on.
    pub fn runtime(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if let Some(open) = &self.open {
            open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl IoThreads {
    /// No threads: connections are served on the caller's runtime.
    pub fn none() -> IoThreads {
        IoThreads {
            threads: Vec::new(),
        }
    }

    /// Start `count` threads named `name`-0, `name`-1, ...; none for a count of 0 or 1,
    /// which serves on the caller's runtime. With `pin`, each is bound to a CPU of its own,
    /// the i-th of those the calling thread may run on, when there are at least `count`;
    /// otherwise none is bound. Each thread polls for `poll` after a request before it
    /// sleeps (see [`super::poll`]); so does the caller's runtime when it is the one.
    pub fn start(
        count: usize,
        name: &str,
        pin: bool,
        poll: Duration,
    ) -> std::io::Result<IoThreads> {
        if count < 2 {
            if let Ok(here) = Handle::try_current() {
                super::poll::start(&here, poll);
            }
            return Ok(IoThreads::none());
        }
        let cpus = if pin { cpus_for(count) } else { None };
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let want = cpus.as_ref().map(|c| c[i]);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // Its spawn_blocking threads.
                .thread_name(format!("{name}-{i}-blocking"))
                .build()?;
            let handle = runtime.handle().clone();
            super::poll::start(&handle, poll);
            let (stop, stopped) = oneshot::channel::<()>();
            // The thread binds itself and says whether it could, before it serves anything.
            let (bound_tx, bound_rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let bound = want
                        .filter(|&id| core_affinity::set_for_current(core_affinity::CoreId { id }));
                    let _ = bound_tx.send(bound);
                    // Drives the runtime's tasks until told to stop (or the sender is gone).
                    let _ = runtime.block_on(stopped);
                })?;
            let cpu = bound_rx.recv().ok().flatten();
            if let Some(id) = want
                && cpu.is_none()
            {
                tracing::warn!(cpu = id, "cannot bind an io thread to its CPU");
            }
            threads.push(IoThread {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
                cpu,
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(IoThreads { threads })
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The CPU each thread is bound to, in thread order; empty when none is.
    pub fn pinned_cpus(&self) -> Vec<usize> {
        self.threads.iter().filter_map(|t| t.cpu).collect()
    }

    /// Give an accepted connection a thread: the one with the fewest open connections (the
    /// first of those, on a tie), or the caller's runtime when there are none. Only the
    /// accept loop adds to the counts, so one choice cannot race with another. Must run on
    /// a runtime.
    pub fn place(&self, stream: TcpStream) -> std::io::Result<(TcpStream, Placement)> {
        let Some(placement) = self.pick() else {
            let here = Placement {
                handle: Handle::current(),
                open: None,
            };
            return Ok((stream, here));
        };
        // Registered with the chosen thread's reactor, so its readiness wakes that thread.
        let std = stream.into_std()?;
        let _on = placement.handle.enter();
        Ok((TcpStream::from_std(std)?, placement))
    }

    fn pick(&self) -> Option<Placement> {
        let t = self
            .threads
            .iter()
            .min_by_key(|t| t.open.load(Ordering::Relaxed))?;
        t.open.fetch_add(1, Ordering::Relaxed);
        Some(Placement {
            handle: t.handle.clone(),
            open: Some(t.open.clone()),
        })
    }

    /// Open connections on each thread, in thread order.
    #[cfg(test)]
    fn open_counts(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.open.load(Ordering::Relaxed))
            .collect()
    }

    /// Stop every thread and wait for it to end. Blocks: call it off the runtime.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for t in &mut self.threads {
            if let Some(s) = t.stop.take() {
                let _ = s.send(());
            }
        }
        for t in &mut self.threads {
            if let Some(j) = t.thread.take() {
                let _ = j.join();
            }
        }
    }
}

/// The first `count` CPUs the calling thread may run on (its affinity mask, which taskset
/// and cpusets narrow), or `None` when there are fewer or the mask cannot be read.
fn cpus_for(count: usize) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = core_affinity::get_core_ids()?
        .into_iter()
        .map(|c| c.id)
        .take(count)
        .collect();
    (cpus.len() == count).then_some(cpus)
}

impl Drop for IoThreads {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_loaded_thread_and_come_back() {
        let io = IoThreads::start(3, "test-io", false, Duration::ZERO).unwrap();
        let pick = || io.pick().unwrap();
        let a = pick();
        let b = pick();
        let c = pick();
        assert_eq!(io.open_counts(), vec![1, 1, 1]);
        drop(b);
        assert_eq!(io.open_counts(), vec![1, 0, 1]);
        let d = pick();
        assert_eq!(io.open_counts(), vec![1, 1, 1]);
        let e = pick();
        assert_eq!(io.open_counts(), vec![2, 1, 1]);
        drop((a, c, d, e));
        assert_eq!(io.open_counts(), vec![0, 0, 0]);
        io.stop();
    }

    #[test]
    fn one_thread_or_none_serves_on_the_callers_runtime() {
        for n in [0, 1] {
            let io = IoThreads::start(n, "test-io", true, Duration::ZERO).unwrap();
            assert!(io.is_empty());
            assert!(io.pick().is_none());
        }
        assert_eq!(
            IoThreads::start(2, "test-io", false, Duration::ZERO)
                .unwrap()
                .threads
                .len(),
            2
        );
    }

    /// Connections placed on two threads: each is served on its own thread, by a task of
    /// that thread's runtime reading the socket, and the counts follow them.
    #[test]
    fn a_placed_connection_is_served_on_its_thread() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let io = IoThreads::start(2, "test-io", true, Duration::from_micros(100)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let mut clients = Vec::new();
            let mut served = Vec::new();
            for _ in 0..4 {
                let client = TcpStream::connect(addr).await.unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let (mut stream, placement) = io.place(stream).unwrap();
                served.push(placement.runtime().clone().spawn(async move {
                    let mut byte = [0u8; 1];
                    stream.read_exact(&mut byte).await.unwrap();
                    let name = std::thread::current().name().unwrap().to_string();
                    stream.write_all(name.as_bytes()).await.unwrap();
                    drop(placement);
                    (byte[0], name)
                }));
                clients.push(client);
            }
            // No task can end before its client writes, so all four are still placed.
            assert_eq!(io.open_counts(), vec![2, 2]);
            for (i, client) in clients.iter_mut().enumerate() {
                client.write_all(&[i as u8]).await.unwrap();
            }
            let mut names = Vec::new();
            for (i, (client, task)) in clients.iter_mut().zip(served).enumerate() {
                let (byte, name) = task.await.unwrap();
                assert_eq!(byte as usize, i);
                let mut echoed = String::new();
                client.read_to_string(&mut echoed).await.unwrap();
                assert_eq!(echoed, name);
                names.push(name);
            }
            assert_eq!(names, ["test-io-0", "test-io-1", "test-io-0", "test-io-1"]);
            assert_eq!(io.open_counts(), vec![0, 0]);
        });
        io.stop();
    }

    /// What each io thread's own affinity mask allows, asked on that thread.
    fn cpus_seen_by(io: &IoThreads) -> Vec<Vec<usize>> {
        io.threads
            .iter()
            .map(|t| {
                let (tx, rx) = std::sync::mpsc::channel();
                t.handle.spawn(async move {
                    let ids = core_affinity::get_core_ids().unwrap_or_default();
                    let _ = tx.send(ids.into_iter().map(|c| c.id).collect::<Vec<_>>());
                });
                rx.recv().unwrap()
            })
            .collect()
    }

    /// Pinned, each thread may run on one CPU only, its own, in the order of the CPUs the
    /// process may use; with more threads than CPUs, or unpinned, each may run on all of them.
    #[cfg(target_os = "linux")]
    #[test]
    fn pinned_threads_run_on_one_cpu_each() {
        let all: Vec<usize> = core_affinity::get_core_ids()
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert!(!all.is_empty());
        let n = all.len().clamp(2, 4);
        let io = IoThreads::start(n, "test-io", true, Duration::ZERO).unwrap();
        if all.len() >= 2 {
            let want: Vec<Vec<usize>> = all[..n].iter().map(|&c| vec![c]).collect();
            assert_eq!(cpus_seen_by(&io), want);
            assert_eq!(io.pinned_cpus(), all[..n].to_vec());
        } else {
            // One CPU: two threads cannot have one each.
            assert_eq!(cpus_seen_by(&io), vec![all.clone(); n]);
            assert!(io.pinned_cpus().is_empty());
        }
        io.stop();
        let over = IoThreads::start(all.len() + 1, "test-io", true, Duration::ZERO).unwrap();
        assert_eq!(cpus_seen_by(&over), vec![all.clone(); all.len() + 1]);
        assert!(over.pinned_cpus().is_empty());
        over.stop();
        let free = IoThreads::start(2, "test-io", false, Duration::ZERO).unwrap();
        assert_eq!(cpus_seen_by(&free), vec![all.clone(); 2]);
        free.stop();
    }
}
