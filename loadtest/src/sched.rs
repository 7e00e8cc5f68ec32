//! The load generator's scheduling policy: `SCHED_BATCH`, so that it never preempts the
//! server it measures.
//!
//! The server and its load generator share this machine's cores. Under the default policy a
//! thread that wakes preempts the one running on its CPU when it has had less CPU time: a
//! client woken by one response cut into the server's io thread in the middle of a burst of
//! requests (about 0.09 preemptions a request, open loop at 45k/s against geoshard), and each
//! switch cost both sides their caches. A `SCHED_BATCH` thread is scheduled as any other but
//! does not preempt on waking; it runs when the running thread sleeps or its slice ends. A
//! real client runs on other machines and takes nothing from the server; this is as close to
//! that as a shared machine allows. It applies to every target alike: geoshard, the HTTP
//! ceiling and PostGIS are measured by the same client.

use std::io;

/// Put the calling thread under `SCHED_BATCH`. Threads it starts afterwards inherit it, so
/// calling this before the runtime is built covers the whole load generator.
#[cfg(target_os = "linux")]
pub fn batch_this_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call, which only reads it;
    // pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn batch_this_thread() -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "SCHED_BATCH is Linux's",
    ))
}

/// The calling thread's scheduling policy as the kernel reports it (`policy`, field 41 of
/// `/proc/thread-self/stat`; `SCHED_BATCH` is 3).
pub fn policy_of_this_thread() -> Option<u32> {
    policy_in(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// Field 41 of a `/proc/…/stat` line.
fn policy_in(stat: &str) -> Option<u32> {
    crate::drive::stat_field(stat, 41)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy is read after the command name, whatever it holds.
    #[test]
    fn policy_is_field_41() {
        let mut fields: Vec<String> = (3..=52).map(|f| f.to_string()).collect();
        fields[41 - 3] = "3".into();
        let line = format!("42 (a) b (c)) {}", fields.join(" "));
        assert_eq!(policy_in(&line), Some(3));
        assert_eq!(policy_in("42 (x) S 1 2"), None);
    }

    /// A thread put under SCHED_BATCH reports it, and a thread it starts inherits it, while
    /// a thread that was not put under it keeps the default (SCHED_OTHER, 0). Run on threads
    /// of their own so the test harness's threads keep their policy.
    #[cfg(target_os = "linux")]
    #[test]
    fn batch_is_set_and_inherited() {
        let plain = std::thread::spawn(policy_of_this_thread).join().unwrap();
        assert_eq!(plain, Some(0));
        let (own, child) = std::thread::spawn(|| {
            batch_this_thread().unwrap();
            let own = policy_of_this_thread();
            let child = std::thread::spawn(policy_of_this_thread).join().unwrap();
            (own, child)
        })
        .join()
        .unwrap();
        assert_eq!(own, Some(libc::SCHED_BATCH as u32));
        assert_eq!(child, Some(libc::SCHED_BATCH as u32));
    }
}
