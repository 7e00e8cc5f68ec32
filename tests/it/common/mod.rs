//! Shared test harness: a real server on 127.0.0.1:0 and a small HTTP/1.1 client over a raw
//! keep-alive TCP connection. Digest responses are computed by the independent `digest_auth`
//! crate, not by the server's own code.
#![allow(dead_code)]

pub mod layers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use geoshard::config::Config;
use geoshard::store::{Store, StoreOptions};

pub const ADMIN: (&str, &str) = ("admin", "admin-pw");
pub const WRITER: (&str, &str) = ("writer", "writer-pw");
pub const READER: (&str, &str) = ("reader", "reader-pw");
pub const GEO: (&str, &str) = ("geo", "geo-pw");
pub const GEO_READER: (&str, &str) = ("georeader", "georeader-pw");

/// A fresh directory under the system's temp dir, removed with everything in it when the
/// guard is dropped (a test that fails leaves nothing behind either: unwinding drops it).
pub fn temp_dir(tag: &str) -> TestDir {
    let path = std::env::temp_dir().join(format!(
        "geoshard-it-{tag}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&path).unwrap();
    TestDir { path, remove: true }
}

/// A data directory; removed on drop when this test made it.
pub struct TestDir {
    path: PathBuf,
    remove: bool,
}

impl TestDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The users every test server has.
pub fn seed_users(dir: &Path) {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let users: [(&str, &str, &[&str]); 5] = [
        (ADMIN.0, ADMIN.1, &["admin"]),
        (WRITER.0, WRITER.1, &["rest-writer"]),
        (READER.0, READER.1, &["rest-reader"]),
        (
            GEO.0,
            GEO.1,
            &[
                "geo-data-services-writer",
                "rest-extension-user",
                "rest-writer",
                "tde-admin",
            ],
        ),
        (
            GEO_READER.0,
            GEO_READER.1,
            &["geo-data-services-reader", "rest-reader"],
        ),
    ];
    for (name, pass, roles) in users {
        let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
        geoshard::security::put_user_offline(&store, name, pass, &roles, "public").unwrap();
    }
    store.shutdown_blocking();
}

/// A server running in this process on its own runtime thread.
pub struct TestServer {
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    /// The directory [`TestServer::start`] made, removed after the server stops.
    dir: Option<TestDir>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::start_with(|_| {})
    }

    pub fn start_with(configure: impl FnOnce(&mut Config)) -> TestServer {
        let dir = temp_dir("srv");
        seed_users(&dir);
        let mut srv = TestServer::start_in(&dir, configure);
        srv.dir = Some(dir);
        srv
    }

    /// Start on an existing data directory (for restart tests).
    pub fn start_in(dir: &Path, configure: impl FnOnce(&mut Config)) -> TestServer {
        let mut config = Config {
            data_dir: dir.to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            shutdown_grace_secs: 5,
            ..Config::default()
        };
        configure(&mut config);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let result = rt.block_on(geoshard::service::serve(
                config,
                async {
                    let _ = stop_rx.await;
                },
                |_, addr| {
                    let _ = addr_tx.send(Ok(addr));
                },
            ));
            if let Err(e) = result {
                let _ = addr_tx.send(Err(e.to_string()));
            }
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("server did not start")
            .expect("server failed to start");
        TestServer {
            addr,
            data_dir: dir.to_path_buf(),
            dir: None,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn client(&self, user: (&str, &str)) -> Client {
        Client::new(self.addr, Auth::Digest(user.0.into(), user.1.into()))
    }

    pub fn anonymous(&self) -> Client {
        Client::new(self.addr, Auth::None)
    }

    /// Stop gracefully and wait until the store is closed. The data directory stays (for a
    /// restart on it) as long as the returned guard lives.
    pub fn stop(mut self) -> TestDir {
        self.shutdown();
        self.dir.take().unwrap_or_else(|| TestDir {
            path: self.data_dir.clone(),
            remove: false,
        })
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[derive(Clone)]
pub enum Auth {
    None,
    Basic(String, String),
    Digest(String, String),
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `errorResponse` members, asserting the shape of docs/contract.md §1.
    pub fn error(&self) -> (u64, String, String) {
        let v = self.json();
        let e = &v["errorResponse"];
        assert_eq!(
            e["statusCode"].as_u64(),
            Some(self.status as u64),
            "statusCode member: {v}"
        );
        assert!(e["status"].is_string(), "status member: {v}");
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "error content type"
        );
        (
            e["statusCode"].as_u64().unwrap(),
            e["messageCode"].as_str().unwrap_or("").to_string(),
            e["message"].as_str().unwrap_or("").to_string(),
        )
    }
}

/// One keep-alive connection with an authentication mode.
pub struct Client {
    addr: SocketAddr,
    auth: Auth,
    conn: Option<BufReader<TcpStream>>,
    challenge: Option<digest_auth::WwwAuthenticateHeader>,
    /// Connections opened so far (keep-alive checks).
    pub connects: usize,
    /// How long an answer may take before the connection counts as closed.
    wait: Duration,
}

impl Client {
    pub fn new(addr: SocketAddr, auth: Auth) -> Client {
        Client {
            addr,
            auth,
            conn: None,
            challenge: None,
            connects: 0,
            wait: Duration::from_secs(120),
        }
    }

    /// Wait up to `wait` for each answer (120 s unless said): for a request whose answer
    /// waits on work that a loaded machine may take minutes over.
    pub fn waiting(mut self, wait: Duration) -> Client {
        self.wait = wait;
        self.conn = None;
        self
    }

    fn connection(&mut self) -> &mut BufReader<TcpStream> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(self.wait)).unwrap();
            self.conn = Some(BufReader::new(s));
            self.connects += 1;
        }
        self.conn.as_mut().unwrap()
    }

    pub fn get(&mut self, target: &str) -> Response {
        self.request("GET", target, &[], b"")
    }

    pub fn delete(&mut self, target: &str) -> Response {
        self.request("DELETE", target, &[], b"")
    }

    pub fn put_json(&mut self, target: &str, body: &str) -> Response {
        self.request(
            "PUT",
            target,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn post_json(&mut self, target: &str, body: &str) -> Response {
        self.request(
            "POST",
            target,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    fn authorization(&mut self, method: &str, target: &str) -> Option<String> {
        match &self.auth {
            Auth::None => None,
            Auth::Basic(u, p) => {
                use base64::Engine as _;
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
                ))
            }
            Auth::Digest(u, p) => {
                let (u, p) = (u.clone(), p.clone());
                let ch = self.challenge.as_mut()?;
                let ctx = digest_auth::AuthContext::new_with_method(
                    u.as_str(),
                    p.as_str(),
                    target,
                    Option::<&[u8]>::None,
                    digest_auth::HttpMethod(method.to_string().into()),
                );
                Some(ch.respond(&ctx).unwrap().to_header_string())
            }
        }
    }

    /// Send a request, negotiating Digest when challenged (and once more on `stale=true`).
    /// A connection that closes without an answer is tried once more on a new one, with a
    /// new `Authorization`: the server may have read the first, and a Digest answer it has
    /// seen is a replay.
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let (mut challenges, mut dropped) = (0, 0);
        while challenges < 3 {
            let auth = self.authorization(method, target);
            let mut all: Vec<(String, String)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if let Some(a) = auth {
                all.push(("Authorization".into(), a));
            }
            let wire = self.wire(method, target, &all, body);
            let Some(resp) = self.send_once(&wire, method == "HEAD") else {
                dropped += 1;
                assert!(dropped < 2, "server closed the connection twice");
                continue;
            };
            if resp.status == 401
                && let Auth::Digest(..) = self.auth
            {
                let digest = resp
                    .headers_named("www-authenticate")
                    .into_iter()
                    .find(|v| v.starts_with("Digest"))
                    .map(|v| digest_auth::parse(v).unwrap());
                let retry = match (&self.challenge, &digest) {
                    (None, Some(_)) => true,
                    (Some(_), Some(d)) => d.stale,
                    _ => false,
                };
                if retry {
                    self.challenge = digest;
                    challenges += 1;
                    continue;
                }
            }
            return resp;
        }
        panic!("authentication did not settle");
    }

    /// Send exactly these headers (plus Host, unless they have one, and Content-Length) and
    /// read the reply.
    pub fn send(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Response {
        let wire = self.wire(method, target, headers, body);
        self.send_raw(&wire, method == "HEAD")
    }

    fn wire(
        &self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Vec<u8> {
        let mut head = format!("{method} {target} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut wire = head.into_bytes();
        wire.extend_from_slice(body);
        wire
    }

    /// Write raw bytes and read one response. Resends the same bytes once if the server had
    /// closed the connection.
    pub fn send_raw(&mut self, wire: &[u8], head_request: bool) -> Response {
        match self.send_once(wire, head_request) {
            Some(r) => r,
            None => self
                .send_once(wire, head_request)
                .expect("server closed the connection twice"),
        }
    }

    /// One try: `None` when the connection closed without an answer (and is then dropped).
    fn send_once(&mut self, wire: &[u8], head_request: bool) -> Option<Response> {
        let conn = self.connection();
        if conn.get_mut().write_all(wire).is_ok()
            && let Some(r) = read_response(conn, head_request)
        {
            if r.header("connection")
                .is_some_and(|c| c.eq_ignore_ascii_case("close"))
            {
                self.conn = None;
            }
            return Some(r);
        }
        self.conn = None;
        None
    }
}

/// Standard base64, for Basic credentials written by hand.
pub fn base64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Read one HTTP/1.1 response; `None` when the connection was closed before a status line.
pub fn read_response(r: &mut BufReader<TcpStream>, head_request: bool) -> Option<Response> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if head_request || status == 204 || status == 304 {
        // no body
    } else if find("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(len) = find("content-length") {
        let n: usize = len.parse().ok()?;
        body.resize(n, 0);
        r.read_exact(&mut body).ok()?;
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// The server binary, as a child process: for tests that kill it, restart it, or read its
/// memory from `/proc`.
pub struct ChildServer {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    /// Its standard error, line by line (the first 2,000 lines).
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ChildServer {
    /// `geoshard serve` on `dir`, port 0, with `GEOSHARD_*` settings from `env`; waits until
    /// it announces its address.
    pub fn start(dir: &Path, env: &[(&str, &str)]) -> ChildServer {
        ChildServer::start_at(dir, "127.0.0.1:0", env)
    }

    /// [`ChildServer::start`] listening on `listen` (a restart on the address a client
    /// knows).
    pub fn start_at(dir: &Path, listen: &str, env: &[(&str, &str)]) -> ChildServer {
        use std::process::{Command, Stdio};
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_geoshard"));
        cmd.args(["serve", "--listen", listen, "--data-dir"])
            .arg(dir)
            .env("GEOSHARD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        // Its log, kept to say why if it does not start, and drained so it never blocks.
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        {
            let log = log.clone();
            let stderr = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap();
                    if log.len() < 2000 {
                        log.push(line);
                    }
                }
            });
        }
        // Its stdout read on a thread of its own (drained to the end, so the child never blocks
        // on a full pipe), so that a child that prints nothing still meets the deadline.
        let (lines, announced) = std::sync::mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = announced.recv_timeout(left) else {
                break;
            };
            if let Some(addr) = line.strip_prefix("geoshard listening on http://") {
                return ChildServer {
                    child,
                    addr: addr.parse().unwrap(),
                    log,
                };
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        std::thread::sleep(Duration::from_millis(100));
        panic!(
            "server did not announce its address:\n{}",
            log.lock().unwrap().join("\n")
        );
    }

    pub fn client(&self, user: (&str, &str)) -> Client {
        Client::new(self.addr, Auth::Digest(user.0.into(), user.1.into()))
    }

    pub fn anonymous(&self) -> Client {
        Client::new(self.addr, Auth::None)
    }

    /// The server's resident memory, in MiB, from its `/proc/<pid>/status`.
    pub fn rss_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (a clean stop), and wait for it to exit; its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }

    /// SIGKILL, and wait for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encode a query value.
pub fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The shared data folder beside the project root.
pub fn shared_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
}

/// The real-data folder: `$GEOSHARD_DATA_DIR`, else `../shared/data` beside the project root,
/// else the repository's own copy in `data/`.
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("GEOSHARD_DATA_DIR") {
        return PathBuf::from(d);
    }
    let shared = shared_data();
    if shared.join("real").is_dir() {
        return shared;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data")
}

/// The GeoNames places of `real/geonames-cities1000.csv` as (lon, lat), in file order.
pub fn geonames_points() -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(data_dir().join("real/geonames-cities1000.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let mut it = l.split(',');
            let lat: f64 = it.next().unwrap().parse().unwrap();
            let lon: f64 = it.next().unwrap().parse().unwrap();
            (lon, lat)
        })
        .collect()
}

/// Equal JSON but for `$timestamp`, floats to within 1e-9 of each other (statistics over
/// floats are summed in another order when merged).
pub fn same_json(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Result<(), String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut kx: Vec<_> = x.keys().filter(|k| *k != "$timestamp").collect();
            let mut ky: Vec<_> = y.keys().filter(|k| *k != "$timestamp").collect();
            kx.sort();
            ky.sort();
            if kx != ky {
                return Err(format!("{at}: members {kx:?} against {ky:?}"));
            }
            for k in kx {
                same_json(&x[k], &y[k], &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Err(format!("{at}: {} items against {}", x.len(), y.len()));
            }
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                same_json(p, q, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (p, q) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (p - q).abs() <= 1e-9 * p.abs().max(q.abs()).max(1.0) {
                Ok(())
            } else {
                Err(format!("{at}: {p} against {q}"))
            }
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{at}: {a} against {b}")),
    }
}

/// One Digest `Authorization` value for `method uri`, from a challenge.
pub fn authorization(
    challenge: &mut digest_auth::WwwAuthenticateHeader,
    user: (&str, &str),
    method: &str,
    uri: &str,
) -> String {
    let ctx = digest_auth::AuthContext::new_with_method(
        user.0,
        user.1,
        uri,
        Option::<&[u8]>::None,
        digest_auth::HttpMethod(method.to_string().into()),
    );
    challenge.respond(&ctx).unwrap().to_header_string()
}

/// A fresh challenge from the server.
pub fn challenge(c: &mut Client) -> digest_auth::WwwAuthenticateHeader {
    let r = c.send("GET", "/v1/ping", &[], b"");
    assert_eq!(r.status, 401);
    let h = r
        .headers_named("www-authenticate")
        .into_iter()
        .find(|v| v.starts_with("Digest"))
        .unwrap()
        .to_string();
    digest_auth::parse(&h).unwrap()
}

/// A copy of a stopped server's data directory, subdirectories and all.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
