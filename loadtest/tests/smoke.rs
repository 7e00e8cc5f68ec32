//! The load test's smoke mode, run in CI: a real geoshard on 127.0.0.1:0, small datasets
//! loaded through the bulk path, every workload for a moment (closed and open loop), the
//! baseline, and the report. The answer checks must pass.

use std::sync::Arc;
use std::time::Duration;

use geoshard_loadtest::{baseline, data, drive, load, report, run_http, workload};

/// A directory removed with its contents when dropped, the test failed or not.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The server's address, and its data directory's guard (a running server's open files stay
/// readable after the names are removed).
fn server() -> (std::net::SocketAddr, RemoveOnDrop) {
    let dir = std::env::temp_dir().join(format!("geoshard-smoke-{}", std::process::id()));
    let guard = RemoveOnDrop(dir.clone());
    let _ = std::fs::remove_dir_all(&dir);
    {
        let store = geoshard::store::Store::open(&dir, Default::default()).unwrap();
        let roles: Vec<String> = [
            "rest-writer",
            "tde-admin",
            "geo-data-services-writer",
            "rest-extension-user",
        ]
        .iter()
        .map(|r| r.to_string())
        .collect();
        geoshard::security::put_user_offline(&store, "lt", "lt", &roles, "public").unwrap();
        store.shutdown_blocking();
    }
    let config = geoshard::config::Config {
        data_dir: dir,
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    // The current-thread scheduler, as `geoshard serve` runs with one io thread (the report's
    // setting): point, region and write requests all go through it here.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(geoshard::service::serve(
            config,
            std::future::pending(),
            |_, addr| {
                let _ = tx.send(addr);
            },
        ))
        .unwrap();
    });
    (rx.recv_timeout(Duration::from_secs(120)).unwrap(), guard)
}

#[test]
fn smoke() {
    let (addr, _data) = server();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let places = data::places().unwrap();
    let small = data::Dataset::Places(20_000);
    rt.block_on(async {
        for ds in [data::Dataset::Counties, small] {
            let p = load::prepare(addr, "lt", "lt", ds, 2, 2000).await.unwrap();
            assert!(p.documents > 3000);
        }
    });
    let duration = Duration::from_millis(1500);
    let spec = |connections, rate| drive::Spec {
        connections,
        warmup: Duration::from_millis(300),
        duration,
        rate,
        // The server runs in this process: its CPU time is the whole process's.
        server_pid: Some(std::process::id()),
        step: geoshard_loadtest::pace::STEP,
    };
    let mut runs = Vec::new();
    for (wl, ds, rate) in [
        (
            workload::Workload::PipCounties,
            data::Dataset::Counties,
            None,
        ),
        (
            workload::Workload::PipCounties,
            data::Dataset::Counties,
            Some(300.0),
        ),
        (workload::Workload::PointEq, small, None),
        (workload::Workload::Envelope, small, None),
        (workload::Workload::Mixed, data::Dataset::Counties, None),
    ] {
        let set = Arc::new(workload::build(wl, ds, &places, 400, 100, true).unwrap());
        let (record, mismatch) = rt
            .block_on(run_http(addr, "lt", "lt", "geoshard", set, spec(4, rate)))
            .unwrap();
        assert_eq!(mismatch, None, "{}: {mismatch:?}", wl.name());
        assert!(record.checked > 0, "{}: no answer was checked", wl.name());
        assert_eq!(record.errors, 0, "{}", wl.name());
        assert!(record.requests > 0);
        for cpu in [
            record.server_cpu_us_per_request,
            record.client_cpu_us_per_request,
        ] {
            let cpu = cpu.unwrap_or_else(|| panic!("{}: no CPU time", wl.name()));
            // A closed loop keeps the process busy for the whole window. The light open loop
            // may fall between the kernel's accounting ticks, so it need only be there.
            let least_ok = if rate.is_none() {
                cpu > 0.0
            } else {
                cpu >= 0.0
            };
            assert!(
                least_ok && cpu.is_finite(),
                "{}: {cpu} µs a request",
                wl.name()
            );
        }
        if let Some(rate) = rate {
            // Open loop: every request due in the measured window is sent and measured.
            let due = rate * duration.as_secs_f64();
            assert!(
                (record.requests as f64 - due).abs() <= 1.0,
                "open loop at {rate}/s measured {} requests, {due} were due",
                record.requests
            );
        }
        runs.push(record);
    }
    // The ceiling, by the same client code.
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(baseline::serve(
        "127.0.0.1:0".parse().unwrap(),
        2,
        true,
        Duration::from_micros(100),
        move |a| {
            let _ = tx.send(a);
        },
    ));
    let base = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let set = Arc::new(
        workload::build(
            workload::Workload::PipCounties,
            data::Dataset::Counties,
            &places,
            100,
            0,
            true,
        )
        .unwrap(),
    );
    let (record, _) = rt
        .block_on(run_http(base, "lt", "lt", "baseline", set, spec(4, None)))
        .unwrap();
    assert!(record.requests > 0);
    runs.push(record);

    let dir = std::env::temp_dir().join(format!("geoshard-smoke-report-{}", std::process::id()));
    let _report = RemoveOnDrop(dir.clone());
    let ctx = report::Context::gather(
        "smoke",
        vec!["cargo test -p geoshard-loadtest".into()],
        Default::default(),
    );
    let md = report::write(&dir, &ctx, &runs).unwrap();
    let text = std::fs::read_to_string(md).unwrap();
    assert!(text.contains("| pip-counties |"), "{text}");
    assert!(dir.join("smoke-throughput.svg").exists());
}
