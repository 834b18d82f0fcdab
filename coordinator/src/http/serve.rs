//! The accept loop: HTTP/1.1 served by [`h1`], HTTP/2 by hyper, with the
//! limits a server on an open network needs and `axum::serve` does not set.
//!
//! - At most `RUNLEASE_MAX_CONNECTIONS` connections are open at once; one
//!   past it is answered `503 overloaded` with `Retry-After` and closed at
//!   once, without a task of its own.
//! - A connection with no request in flight is watched: once a byte of a
//!   new request has arrived, its head must be complete within
//!   `RUNLEASE_HEADER_TIMEOUT_MS`, and a connection idle for
//!   `RUNLEASE_IDLE_TIMEOUT_MS` is closed. A long-poll in flight is not
//!   idle; it has its own `wait_ms`.
//! - Each request carries the deadline of its body
//!   (`RUNLEASE_BODY_TIMEOUT_MS` from its head), which the JSON extractor
//!   enforces, and its peer address.
//! - HTTP/1.1 heads are capped at 64 KiB and 100 fields (a made-up method
//!   or path of hundreds of kilobytes is refused), HTTP/2 header lists at
//!   64 KiB and 100 concurrent streams.
//!
//! At shutdown the loop stops accepting, asks every connection to close
//! once its requests are answered, and waits for them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use crate::http::h1;
pub use crate::http::h1::Admits;
use crate::http::watch::{
    Activity, BoxError, H2_PREFACE, InFlight, Tracked, Watch, Watched, evict_idle, lock, may_be_preface,
};
use crate::metrics::Metrics;

/// Default `RUNLEASE_MAX_CONNECTIONS`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default `RUNLEASE_HEADER_TIMEOUT_MS`: 10 s.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `RUNLEASE_BODY_TIMEOUT_MS`: 30 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `RUNLEASE_IDLE_TIMEOUT_MS`: 60 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest HTTP/1.1 request head.
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest HTTP/2 header list.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// Most concurrent HTTP/2 streams on one connection.
const MAX_STREAMS: u32 = 100;

/// How long a new connection waits for the slot of an idle one evicted to
/// make room for it.
const EVICTION_WAIT: Duration = Duration::from_millis(250);

/// The answer to a connection past the cap, written without waiting.
fn over_capacity() -> Vec<u8> {
    let body = r#"{"error":{"code":"overloaded","message":"too many open connections (RUNLEASE_MAX_CONNECTIONS); retry later"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The connection limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a request head may take from its first byte.
    pub header_timeout: Duration,
    /// How long a request body may take from its head.
    pub body_timeout: Duration,
    /// How long a connection may sit with no request in flight.
    pub idle_timeout: Duration,
    /// Most bytes of a request body read (`RUNLEASE_MAX_BODY_BYTES`; the
    /// router refuses larger ones).
    pub max_body_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_body_bytes: crate::config::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// The instant by which a request's body must have arrived, as a request
/// extension.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub Instant);

/// Gives a request what the router reads of its connection: the peer's
/// address and its body's deadline.
pub(super) fn mark(extensions: &mut axum::http::Extensions, peer: SocketAddr, body_deadline: Instant) {
    extensions.insert(ConnectInfo(peer));
    extensions.insert(BodyDeadline(body_deadline));
}

/// Serves `app` on `listener` until `shutdown` fires, then waits for every
/// connection to finish its requests. An HTTP/1.1 request's body is read
/// only when `admits` its fields.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    admits: Admits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusal = over_capacity();
    // Every open connection's activity, to find an idle one to evict when
    // the cap is reached: a client holding connections it does not use
    // cannot lock others out.
    let open: Arc<Mutex<HashMap<u64, Arc<Activity>>>> = Arc::default();
    let mut next_id: u64 = 0;
    let connections = TaskTracker::new();
    let server = Arc::new(Server::new(
        app,
        limits,
        admits,
        metrics.clone(),
        shutdown.clone(),
    ));
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the connections
                    // we hold will free some; do not spin meanwhile.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) if evict_idle(&open) => {
                metrics.connections_evicted.inc();
                tokio::time::timeout(EVICTION_WAIT, slots.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(slot) = slot else {
            metrics.connections_refused.inc();
            // Best effort and without waiting: a peer that does not read
            // gets the close alone.
            let _ = stream.try_write(&refusal);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        next_id += 1;
        let id = next_id;
        lock(&open).insert(id, activity.clone());
        let (server, open) = (server.clone(), open.clone());
        connections.spawn(async move {
            server.metrics.connections_open.inc();
            serve_connection(&server, stream, peer, activity).await;
            lock(&open).remove(&id);
            server.metrics.connections_open.dec();
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// What every connection of [`serve`] shares.
struct Server {
    /// A connection that may be HTTP/2 (see [`may_be_h2`]).
    builder: auto::Builder<TokioExecutor>,
    app: Router,
    limits: ConnectionLimits,
    admits: Admits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Server {
    fn new(
        app: Router,
        limits: ConnectionLimits,
        admits: Admits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().max_buf_size(MAX_HEAD_BYTES);
        builder
            .http2()
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            .max_concurrent_streams(MAX_STREAMS);
        Self {
            builder,
            app,
            limits,
            admits,
            metrics,
            shutdown,
        }
    }
}

async fn serve_connection(server: &Server, stream: TcpStream, peer: SocketAddr, activity: Arc<Activity>) {
    let limits = server.limits;
    let watched = Watched {
        inner: stream,
        activity: activity.clone(),
    };
    // Told to close the connection gracefully (the watchdog's decision).
    let close = Notify::new();
    let connection = async {
        let Some(h2) = may_be_h2(&watched.inner, &close).await else {
            return Ok(());
        };
        if h2 {
            // Boxed: the connection's task is sized for HTTP/1.1, the usual.
            Box::pin(serve_auto(server, watched, peer, &close)).await
        } else {
            let connection = h1::Connection {
                app: &server.app,
                peer,
                limits: &limits,
                activity: &activity,
                close: &close,
                metrics: &server.metrics,
                admits: &server.admits,
            };
            connection.serve(watched).await
        }
    };
    tokio::pin!(connection);
    let watch = Watch {
        activity: &activity,
        limits: &limits,
        close: &close,
        metrics: &server.metrics,
        shutdown: &server.shutdown,
        peer,
    };
    watch.until_done(connection).await;
}

/// Serves a connection that may be HTTP/2 with hyper (HTTP/2, or HTTP/1.1
/// whose first bytes were too few to tell).
async fn serve_auto(
    server: &Server,
    watched: Watched,
    peer: SocketAddr,
    close: &Notify,
) -> Result<(), BoxError> {
    let limits = server.limits;
    let app = &server.app;
    let service_activity = watched.activity.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let guard = InFlight::start(&service_activity);
        mark(
            request.extensions_mut(),
            peer,
            Instant::now() + limits.body_timeout,
        );
        let mut app = app.clone();
        async move {
            let response = app.call(request).await?;
            Ok::<_, std::convert::Infallible>(response.map(|inner| {
                axum::body::Body::new(Tracked {
                    inner,
                    _in_flight: guard,
                })
            }))
        }
    });
    let conn = server
        .builder
        .serve_connection_with_upgrades(TokioIo::new(watched), service);
    drive(conn, close, |c| c.graceful_shutdown()).await
}

/// Whether a connection's first bytes may be the HTTP/2 preface (not enough
/// of them to tell counts as may); `None` when told to close first.
///
/// Peeked, not read: an HTTP/1.1 connection goes to [`h1`], which reads its
/// requests itself; `auto::Builder` would read the first bytes and hand
/// them to hyper's HTTP/1.1 connection apart from the rest of the request,
/// which then grows its read buffer to 16 KiB for the rest of the head.
async fn may_be_h2(stream: &TcpStream, close: &Notify) -> Option<bool> {
    let mut first = [0u8; H2_PREFACE.len()];
    tokio::select! {
        // At the end of the stream or an error, `auto` reads it and ends.
        peeked = stream.peek(&mut first) => Some(peeked.map_or(true, |n| may_be_preface(&first[..n]))),
        () = close.notified() => None,
    }
}

/// Serves `conn` to its end, closing it gracefully once `close` is told.
async fn drive<C, E>(conn: C, close: &Notify, graceful: fn(Pin<&mut C>)) -> Result<(), BoxError>
where
    C: Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return result.map_err(Into::into),
        () = close.notified() => graceful(conn.as_mut()),
    }
    conn.await.map_err(Into::into)
}
