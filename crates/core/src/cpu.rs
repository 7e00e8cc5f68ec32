//! The one bridge from async code to CPU-heavy work: run a closure on the rayon pool and
//! await its result, so a tokio task never does more than a sliver of CPU work itself.

/// Run `f` on rayon and await it. `None` if the work panicked. If the awaiting future is
/// dropped before rayon gets to the job, the job is skipped.
pub async fn run_cpu_intensive<F, R>(f: F) -> Option<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let (tx, rx) = crate::oneshot::channel();
    rayon::spawn(move || {
        if tx.is_closed() {
            return;
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(result.ok());
    });
    rx.await.ok().flatten()
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_and_contains_panics() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(super::run_cpu_intensive(|| 6 * 7)), Some(42));
        let r: Option<()> = rt.block_on(super::run_cpu_intensive(|| panic!("boom")));
        assert_eq!(r, None);
    }
}
