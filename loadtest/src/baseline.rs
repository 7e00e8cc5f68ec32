//! The HTTP ceiling of this machine: a minimal hyper server (HTTP/1.1 keep-alive, as
//! geoshard) that answers every request with a fixed small JSON body. Driven by the same
//! client code as geoshard, in the same run, it tells how fast a server that does nothing
//! can be here. Like geoshard, it challenges a request without credentials with Digest (and
//! accepts any credentials after), so the client does the same work for both.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use geoshard::http::io_threads::IoThreads;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &[u8] = br#"{"type":"FeatureCollection","features":[]}"#;

/// Serve on `threads` io threads, placed (and, with `pin`, bound to CPUs) as geoshard places
/// its connections (one thread: on the caller's runtime), polling for `poll` after a request
/// as geoshard's do.
pub async fn serve(
    listen: SocketAddr,
    threads: usize,
    pin: bool,
    poll: std::time::Duration,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    ready(listener.local_addr()?);
    let io = IoThreads::start(threads, "baseline-io", pin, poll)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let Ok((stream, placement)) = io.place(stream) else {
            continue;
        };
        placement.runtime().clone().spawn(async move {
            let service = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                geoshard::http::poll::note_request();
                let authorized = req.headers().contains_key(hyper::header::AUTHORIZATION);
                // Read the body, as a real server must.
                let _ = req.into_body().collect().await;
                let mut r = hyper::Response::new(Full::new(Bytes::from_static(BODY)));
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                if !authorized {
                    *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                    r.headers_mut().insert(
                        hyper::header::WWW_AUTHENTICATE,
                        hyper::header::HeaderValue::from_static(
                            "Digest realm=\"public\", qop=\"auth\", nonce=\"baseline-nonce\", opaque=\"baseline\", algorithm=MD5",
                        ),
                    );
                }
                Ok::<_, Infallible>(r)
            });
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(placement);
        });
    }
}
