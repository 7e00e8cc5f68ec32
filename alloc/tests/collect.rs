//! `collect` returns an idle thread's freed memory to the OS. Its own test binary, so no other
//! test allocates in the process while resident memory is read.

use std::sync::mpsc;
use std::thread;

use geoshard_alloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

const MB: u64 = 1 << 20;

fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A worker allocates 96 MB in small blocks, as a bulk build does, frees them and falls
/// idle. Its freed pages stay resident until `collect` runs on it, and then leave.
#[test]
fn collect_returns_an_idle_threads_freed_pages() {
    let (to_worker, orders) = mpsc::channel::<()>();
    let (to_main, reports) = mpsc::channel::<()>();
    let worker = thread::spawn(move || {
        let blocks: Vec<Vec<u8>> = (0..96 * 64).map(|i| vec![i as u8; 16 * 1024]).collect();
        to_main.send(()).unwrap();
        orders.recv().unwrap();
        drop(blocks);
        to_main.send(()).unwrap();
        orders.recv().unwrap();
        geoshard_alloc::collect();
        to_main.send(()).unwrap();
        // Idle until the test is done reading.
        orders.recv().unwrap();
    });
    let before = resident();
    reports.recv().unwrap();
    let full = resident();
    assert!(full > before + 80 * MB, "{before} -> {full}");

    to_worker.send(()).unwrap();
    reports.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let freed = resident();
    // The reason `collect` exists: freeing alone keeps most of it resident.
    assert!(
        freed > full - 32 * MB,
        "freed without collect: {full} -> {freed}"
    );

    to_worker.send(()).unwrap();
    reports.recv().unwrap();
    let collected = resident();
    assert!(
        collected < full - 64 * MB,
        "collected: {full} -> {collected}"
    );

    to_worker.send(()).unwrap();
    worker.join().unwrap();
}
