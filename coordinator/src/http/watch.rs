//! The watchdog of one connection of [`serve`](super::serve::serve): what
//! it knows of the connection (requests in flight, when a head began, when
//! a write started waiting for the peer), the socket and response body that
//! tell it, and what it does when a deadline passes (close gracefully, or
//! drop), as the module docs of `serve` describe.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http::serve::ConnectionLimits;
use crate::metrics::Metrics;

/// How long a connection closed for being idle (or evicted) may take to
/// finish what it is doing before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Asks the connection idle the longest (no request in flight) to close;
/// false when every connection is busy.
pub(super) fn evict_idle(open: &Mutex<HashMap<u64, Arc<Activity>>>) -> bool {
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
pub(super) struct Activity {
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
    pub(super) fn new() -> Self {
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

    /// Notes that the next request's head began arriving (read while no
    /// request is in flight, or along with the one before it), so its
    /// deadline runs.
    pub(super) fn head_begun(&self) {
        if self.head_since.load(Ordering::Acquire) == NONE {
            self.head_since.store(self.now_ms(), Ordering::Release);
            self.changed.notify_one();
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
pub(super) struct Watched {
    pub(super) inner: TcpStream,
    pub(super) activity: Arc<Activity>,
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
            this.activity.h2.store(may_be_preface(first), Ordering::Release);
        }
        if buf.filled().len() > before && this.activity.in_flight.load(Ordering::Acquire) == 0 {
            this.activity.head_begun();
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
pub(super) struct Tracked {
    pub(super) inner: axum::body::Body,
    pub(super) _in_flight: InFlight,
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
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(super) fn start(activity: &Arc<Activity>) -> Self {
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

/// The first bytes of HTTP/2 with prior knowledge.
pub(super) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `first`, a connection's first bytes, may be the start of the
/// HTTP/2 preface (as far as they go).
pub(super) fn may_be_preface(first: &[u8]) -> bool {
    H2_PREFACE.starts_with(&first[..first.len().min(H2_PREFACE.len())])
}

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the watchdog of one connection looks at and acts on.
pub(super) struct Watch<'a> {
    pub(super) activity: &'a Activity,
    pub(super) limits: &'a ConnectionLimits,
    /// Told to close the connection gracefully.
    pub(super) close: &'a Notify,
    pub(super) metrics: &'a Metrics,
    pub(super) shutdown: &'a CancellationToken,
    pub(super) peer: SocketAddr,
}

impl Watch<'_> {
    /// Drives `connection` to its end, closing it when idle or stuck, and
    /// at shutdown.
    pub(super) async fn until_done<F: Future<Output = Result<(), BoxError>>>(
        &self,
        mut connection: Pin<&mut F>,
    ) {
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
