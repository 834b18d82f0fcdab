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

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// The answer to a connection past the cap, written without waiting.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 108\r\n\r\n{\"error\":{\"code\":\"overloaded\",\"message\":\"too many open connections (RUNLEASE_MAX_CONNECTIONS); retry later\"}}";

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
    let connections = TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(MAX_HEAD_BYTES);
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_concurrent_streams(MAX_STREAMS);
    let builder = Arc::new(builder);
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            // Best effort and without waiting: a peer that does not read
            // gets the close alone.
            let _ = stream.try_write(OVER_CAPACITY);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        connections.spawn(async move {
            metrics.connections_open.inc();
            serve_connection(&builder, stream, peer, app, limits, &metrics, shutdown).await;
            metrics.connections_open.dec();
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
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
    /// Told when a request starts or ends, or a head begins: the watchdog
    /// computes its deadline again.
    changed: Notify,
}

const NONE: u64 = u64::MAX;

impl Activity {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    /// When the connection must be closed if nothing changes, or `None`
    /// while a request is in flight.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64| self.opened + Duration::from_millis(ms);
        let idle = at(self.idle_since.load(Ordering::Acquire)) + limits.idle_timeout;
        let head = self.head_since.load(Ordering::Acquire);
        Some(if head == NONE {
            idle
        } else {
            idle.min(at(head) + limits.header_timeout)
        })
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
        Pin::new(&mut self.inner).poll_write(cx, buf)
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
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
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

async fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    metrics: &Metrics,
    shutdown: CancellationToken,
) {
    let activity = Arc::new(Activity {
        opened: Instant::now(),
        in_flight: AtomicUsize::new(0),
        idle_since: AtomicU64::new(0),
        head_since: AtomicU64::new(NONE),
        changed: Notify::new(),
    });
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
            let response = app.call(request).await;
            drop(guard);
            response
        }
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(watched), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let deadline = activity.deadline(&limits);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = activity.changed.notified() => {}
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    // A request is in flight: `changed` tells when it ends.
                    None => std::future::pending().await,
                }
            } => {
                if activity.deadline(&limits).is_some_and(|at| at <= Instant::now()) {
                    let head = activity.head_since.load(Ordering::Acquire) != NONE;
                    metrics.connections_timed_out.get_or_create(&crate::metrics::TimeoutLabels {
                        phase: if head { "header" } else { "idle" },
                    }).inc();
                    tracing::debug!(%peer, head, "closed a connection that sent no complete request in time");
                    return;
                }
            }
            () = shutdown.cancelled(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
