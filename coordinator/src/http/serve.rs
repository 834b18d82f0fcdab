//! The accept loop: HTTP/1.1 and HTTP/2 over hyper, with the limits a
//! server on an open network needs and `axum::serve` does not set.
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
//! - HTTP/1.1 heads are capped at 64 KiB (a made-up method or path of
//!   hundreds of kilobytes is refused by the parser), HTTP/2 header lists at
//!   64 KiB and 100 concurrent streams.
//!
//! At shutdown the loop stops accepting, asks every connection to close
//! once its requests are answered, and waits for them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use crate::metrics::Metrics;

/// Default `RUNLEASE_MAX_CONNECTIONS`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default `RUNLEASE_HEADER_TIMEOUT_MS`: 10 s.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `RUNLEASE_BODY_TIMEOUT_MS`: 30 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `RUNLEASE_IDLE_TIMEOUT_MS`: 60 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest HTTP/1.1 read buffer, so the largest request head.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest HTTP/2 header list.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// Most concurrent HTTP/2 streams on one connection.
const MAX_STREAMS: u32 = 100;

/// How long a connection closed for being idle (or evicted) may take to
/// finish what it is doing before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
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
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// The instant by which a request's body must have arrived, as a request
/// extension.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub Instant);

/// Serves `app` on `listener` until `shutdown` fires, then waits for every
/// connection to finish its requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
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
    let server = Arc::new(Server::new(app, limits, metrics.clone(), shutdown.clone()));
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Asks the connection idle the longest (no request in flight) to close;
/// false when every connection is busy.
fn evict_idle(open: &Mutex<HashMap<u64, Arc<Activity>>>) -> bool {
    let open = lock(open);
    let victim = open
        .values()
        .filter(|a| a.in_flight.load(Ordering::Acquire) == 0 && !a.evicted.load(Ordering::Acquire))
        .min_by_key(|a| a.opened + Duration::from_millis(a.idle_since.load(Ordering::Acquire)));
    match victim {
        Some(activity) => {
            activity.evicted.store(true, Ordering::Release);
            activity.changed.notify_one();
            true
        }
        None => false,
    }
}

/// What the watchdog of one connection knows of it.
struct Activity {
    /// When the connection was accepted.
    opened: Instant,
    /// Requests being answered.
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the connection last became idle.
    idle_since: AtomicU64,
    /// Milliseconds after `opened` when the first byte arrived while idle
    /// (`u64::MAX`: none yet), the start of the next request's head.
    head_since: AtomicU64,
    /// Milliseconds after `opened` since when a write has been waiting for
    /// the peer to read (`u64::MAX`: none is).
    write_blocked_since: AtomicU64,
    /// The connection speaks HTTP/2 (its first bytes were the preface).
    h2: AtomicBool,
    /// Whether anything was read yet (the preface check is on the first read).
    read_any: AtomicBool,
    /// Asked to close to make room for a new connection.
    evicted: AtomicBool,
    /// Told when a request starts or ends, a head begins, or the connection
    /// is evicted: the watchdog looks again.
    changed: Notify,
}

const NONE: u64 = u64::MAX;

/// Why the watchdog closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// An HTTP/1 request head did not arrive in time: dropped at once.
    Header,
    /// The peer has not read what it was sent for an idle timeout: dropped
    /// at once.
    Stalled,
    /// No request for an idle timeout: closed gracefully.
    Idle,
}

impl Close {
    fn phase(self) -> &'static str {
        match self {
            Close::Header => "header",
            Close::Stalled => "write",
            Close::Idle => "idle",
        }
    }
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NONE),
            write_blocked_since: AtomicU64::new(NONE),
            h2: AtomicBool::new(false),
            read_any: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    /// When the connection must be closed if nothing changes, and why; `None`
    /// while a request is in flight and its answer is being read.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(Instant, Close)> {
        let at = |ms: u64| self.opened + Duration::from_millis(ms);
        let blocked = self.write_blocked_since.load(Ordering::Acquire);
        let stalled = (blocked != NONE).then(|| (at(blocked) + limits.idle_timeout, Close::Stalled));
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return stalled;
        }
        let idle = (
            at(self.idle_since.load(Ordering::Acquire)) + limits.idle_timeout,
            Close::Idle,
        );
        let head = self.head_since.load(Ordering::Acquire);
        // HTTP/2 sends frames between requests (settings, window updates,
        // pings): only its idle time counts.
        let header = (head != NONE && !self.h2.load(Ordering::Acquire))
            .then(|| (at(head) + limits.header_timeout, Close::Header));
        [Some(idle), header, stalled]
            .into_iter()
            .flatten()
            .min_by_key(|(when, _)| *when)
    }
}

/// The connection's socket, noting the first byte of each request head.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before && !this.activity.read_any.swap(true, Ordering::AcqRel) {
            let first = &buf.filled()[before..];
            let preface = &b"PRI * HTTP/2.0"[..first.len().min(14)];
            this.activity
                .h2
                .store(first.starts_with(preface), Ordering::Release);
        }
        if buf.filled().len() > before
            && this.activity.in_flight.load(Ordering::Acquire) == 0
            && this.activity.head_since.load(Ordering::Acquire) == NONE
        {
            let now = this.activity.now_ms();
            this.activity.head_since.store(now, Ordering::Release);
            this.activity.changed.notify_one();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.activity.wrote(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.activity.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl Activity {
    /// Notes whether a write went out or waits for the peer to read.
    fn wrote(&self, polled: &Poll<std::io::Result<usize>>) {
        match polled {
            // No wake-up of the watchdog here: a reader taking bytes a few
            // at a time would turn each into one. It looks on its own timer
            // while a request is in flight.
            Poll::Pending => {
                if self.write_blocked_since.load(Ordering::Acquire) == NONE {
                    self.write_blocked_since.store(self.now_ms(), Ordering::Release);
                }
            }
            Poll::Ready(Ok(n)) if *n > 0 => self.write_blocked_since.store(NONE, Ordering::Release),
            Poll::Ready(_) => {}
        }
    }
}

/// A response body that keeps its request in flight until it is written
/// out (or dropped with the connection): sending a large answer to a slow
/// reader is not idle time.
struct Tracked {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Marks a request answered when dropped (its future finished or was
/// dropped with the connection).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.head_since.store(NONE, Ordering::Release);
        activity.changed.notify_one();
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.0.now_ms();
        self.0.idle_since.store(now, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// What every connection of [`serve`] shares.
struct Server {
    /// A connection that may be HTTP/2 (see [`may_be_h2`]).
    builder: auto::Builder<TokioExecutor>,
    /// A connection that is HTTP/1.1, configured as `builder` is.
    http1: hyper::server::conn::http1::Builder,
    app: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

impl Server {
    fn new(app: Router, limits: ConnectionLimits, metrics: Arc<Metrics>, shutdown: CancellationToken) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().max_buf_size(MAX_HEAD_BYTES);
        builder
            .http2()
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            .max_concurrent_streams(MAX_STREAMS);
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1.max_buf_size(MAX_HEAD_BYTES);
        Self {
            builder,
            http1,
            app,
            limits,
            metrics,
            shutdown,
        }
    }
}

async fn serve_connection(server: &Server, stream: TcpStream, peer: SocketAddr, activity: Arc<Activity>) {
    let Server {
        builder,
        http1,
        app,
        limits,
        metrics,
        shutdown,
    } = server;
    let limits = *limits;
    let watched = Watched {
        inner: stream,
        activity: activity.clone(),
    };
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let guard = InFlight::start(&service_activity);
        request.extensions_mut().insert(ConnectInfo(peer));
        request
            .extensions_mut()
            .insert(BodyDeadline(Instant::now() + limits.body_timeout));
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
    // Told to close the connection gracefully (the watchdog's decision).
    let close = Notify::new();
    let connection = async {
        let Some(h2) = may_be_h2(&watched.inner, &close).await else {
            return Ok(());
        };
        let io = TokioIo::new(watched);
        if h2 {
            // Boxed: the connection's task is sized for HTTP/1.1, the usual.
            let conn = builder.serve_connection_with_upgrades(io, service);
            Box::pin(drive(conn, &close, |c| c.graceful_shutdown())).await
        } else {
            let conn = http1.serve_connection(io, service).with_upgrades();
            drive(conn, &close, |c| c.graceful_shutdown()).await
        }
    };
    tokio::pin!(connection);
    let watch = Watch {
        activity: &activity,
        limits: &limits,
        close: &close,
        metrics,
        shutdown,
        peer,
    };
    watch.until_done(connection).await;
}

/// What the watchdog of one connection looks at and acts on.
struct Watch<'a> {
    activity: &'a Activity,
    limits: &'a ConnectionLimits,
    /// Told to close the connection gracefully.
    close: &'a Notify,
    metrics: &'a Metrics,
    shutdown: &'a CancellationToken,
    peer: SocketAddr,
}

impl Watch<'_> {
    /// Drives `connection` to its end, closing it when idle or stuck, and
    /// at shutdown.
    async fn until_done<F: Future<Output = Result<(), BoxError>>>(&self, mut connection: Pin<&mut F>) {
        let Watch {
            activity,
            limits,
            close,
            metrics,
            shutdown,
            peer,
        } = self;
        // Set once the connection was asked to close: it is dropped then.
        let mut hard_close: Option<Instant> = None;
        loop {
            let deadline = activity.deadline(limits);
            // While a request is in flight, look again every half idle timeout
            // for an answer its peer stopped reading.
            let in_flight = activity.in_flight.load(Ordering::Acquire) > 0;
            let recheck = in_flight.then(|| Instant::now() + limits.idle_timeout / 2);
            let wake = [deadline.map(|(at, _)| at), hard_close, recheck]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = activity.changed.notified() => {}
                () = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = shutdown.cancelled(), if hard_close.is_none() => {
                    close.notify_one();
                    // In-flight requests finish (the coordinator's own grace
                    // bounds them); an idle connection goes now.
                    hard_close = Some(Instant::now() + limits.idle_timeout.max(CLOSE_GRACE));
                    continue;
                }
            }
            match next_step(activity, limits, hard_close, metrics, *peer) {
                Step::Wait => {}
                Step::Close => {
                    close.notify_one();
                    hard_close = Some(Instant::now() + CLOSE_GRACE);
                }
                Step::Drop => return,
            }
        }
    }
}

/// The first bytes of HTTP/2 with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a connection's first bytes may be the HTTP/2 preface (not enough
/// of them to tell counts as may); `None` when told to close first.
///
/// Peeked, not read: `auto::Builder` reads them itself and hands them to
/// hyper's HTTP/1.1 connection apart from the rest of the request, which
/// then grows its 8 KiB read buffer to 16 KiB for the rest of the head and
/// keeps it for the connection's life (every parked claim held one). Read
/// whole, a request of less than 8 KiB stays in the 8 KiB buffer.
async fn may_be_h2(stream: &TcpStream, close: &Notify) -> Option<bool> {
    let mut first = [0u8; H2_PREFACE.len()];
    tokio::select! {
        // At the end of the stream or an error, `auto` reads it and ends.
        peeked = stream.peek(&mut first) => Some(peeked.map_or(true, |n| H2_PREFACE.starts_with(&first[..n]))),
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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the watchdog does after it woke.
enum Step {
    /// Nothing yet.
    Wait,
    /// Close gracefully (HTTP/1 between requests: at once; HTTP/2: GOAWAY),
    /// dropping the connection if that takes longer than [`CLOSE_GRACE`].
    Close,
    /// Drop the connection now.
    Drop,
}

/// The watchdog's decision for a connection, given when it was asked to
/// close (if it was).
fn next_step(
    activity: &Activity,
    limits: &ConnectionLimits,
    hard_close: Option<Instant>,
    metrics: &Metrics,
    peer: SocketAddr,
) -> Step {
    let now = Instant::now();
    if hard_close.is_some_and(|at| at <= now) {
        return Step::Drop;
    }
    if activity.evicted.load(Ordering::Acquire) && hard_close.is_none() {
        tracing::debug!(%peer, "closing an idle connection to make room for a new one");
        return Step::Close;
    }
    let Some((at, why)) = activity.deadline(limits) else {
        return Step::Wait;
    };
    if at > now || (why == Close::Idle && hard_close.is_some()) {
        return Step::Wait;
    }
    metrics
        .connections_timed_out
        .get_or_create(&crate::metrics::TimeoutLabels { phase: why.phase() })
        .inc();
    tracing::debug!(%peer, phase = why.phase(), "closing a connection past its deadline");
    if why == Close::Idle {
        Step::Close
    } else {
        Step::Drop
    }
}
