//! HTTP/1.1 connections, served by the coordinator itself rather than by
//! hyper, so that a connection holds no buffer while it waits: between
//! requests, and while a request is in flight (a claim parked for a
//! minute), it keeps nothing but its socket and the request's own future.
//! hyper's HTTP/1.1 server keeps an 8 KiB read buffer and an 8 KiB write
//! buffer for each connection's whole life, which made a parked claim cost
//! three times what its request needs.
//!
//! One request at a time, in order: its head (at most 64 KiB, 100 fields),
//! its body read whole (see [`body`]), the router's answer, written whole
//! (see [`answer`]). A request pipelined behind another waits in the
//! socket until the first is answered. While the router works, the socket
//! is watched: a peer that closes its connection drops the request (a
//! parked claim stops waiting), as hyper does. Malformed heads and
//! framings are answered 400 (an over-long head 413) in the JSON error
//! shape, and the connection closed. Deadlines (head, idle, a peer that
//! does not read) are the watchdog's, as for every connection.

mod answer;
mod body;
mod head;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::http::{Method, Request, Version};
use axum::response::IntoResponse;
use axum::routing::future::RouteFuture;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use runlease_protocol::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::Service;

use crate::http::error::ApiError;
use crate::http::serve::{ConnectionLimits, MAX_HEAD_BYTES, mark};
use crate::http::watch::{Activity, BoxError, InFlight, Watched};
use crate::metrics::{Metrics, RefusedLabels};

use self::body::Read;
pub use self::body::{Chunked, Step};
pub use self::head::{Framing, Head, parse as parse_head};

/// The first read of a request (its head, and its body if small): freed
/// before the router is called, whatever its size.
const FIRST_READ: usize = 8 * 1024;

/// What one HTTP/1.1 connection is served with.
pub(super) struct Connection<'a> {
    pub(super) app: &'a Router,
    pub(super) peer: SocketAddr,
    pub(super) limits: &'a ConnectionLimits,
    pub(super) activity: &'a Arc<Activity>,
    /// Told to close the connection gracefully (the watchdog's decision).
    pub(super) close: &'a Notify,
    pub(super) metrics: &'a Metrics,
    /// Whether a request's body may be read (see [`Admits`]).
    pub(super) admits: &'a Admits,
}

/// Whether a request's body may be read, from its fields: a body sent
/// without a key the router would accept is not read (its request is
/// answered by the router, the connection then closed).
pub type Admits = std::sync::Arc<dyn Fn(&axum::http::HeaderMap) -> bool + Send + Sync>;

/// A request refused before the router saw it: the answer, and the
/// `limit` label it is counted under in `runlease_requests_refused_total`.
struct Refused {
    limit: &'static str,
    error: ApiError,
}

impl Refused {
    fn malformed(message: impl Into<String>) -> Self {
        Self {
            limit: "malformed",
            error: ApiError::bad_request(message),
        }
    }
}

/// What came of reading a request's body.
enum Arrived {
    /// The body for the router, and whether it was read whole (if not, the
    /// connection ends after the answer).
    Body(axum::body::Body, bool),
    Refused(Refused),
    Gone,
}

/// The router's call for a request, how its answer is framed, and the
/// request's mark as in flight.
type Call = (RouteFuture<Infallible>, answer::Framing, InFlight);

impl Connection<'_> {
    /// Serves requests on `io` until the peer or the server ends the
    /// connection.
    ///
    /// The states a connection waits in are kept small, as the task's size
    /// is that of its largest, and a claim parked for a minute holds the
    /// task while the router works: reading a request is a future of its
    /// own, done before the router is called, and writing an answer is
    /// boxed for the time it runs.
    pub(super) async fn serve(&self, mut io: Watched) -> Result<(), BoxError> {
        let mut buf = BytesMut::new();
        loop {
            let (call, framing, in_flight) = match self.request(&mut io, &mut buf).await? {
                Ok(Some(call)) => call,
                Ok(None) => return Ok(()),
                Err(refused) => {
                    self.count_refused(&refused);
                    return Ok(Box::pin(refuse(&mut io, refused.error)).await?);
                }
            };
            tokio::pin!(call);
            // A request pipelined behind this one means the peer is there.
            let Some((response, closing)) = self.wait(&io, buf.is_empty(), call).await else {
                return Ok(());
            };
            let framing = answer::Framing {
                keep_alive: framing.keep_alive && !closing,
                ..framing
            };
            let keep_alive = Box::pin(answer::write(&mut io, response, framing)).await?;
            drop(in_flight);
            if !keep_alive {
                let _ = io.shutdown().await;
                return Ok(());
            }
            if !buf.is_empty() {
                // The next head began arriving with this request: its
                // deadline runs from now.
                self.activity.head_begun();
            }
        }
    }

    /// Counts a request refused before the router saw it, and logs why.
    fn count_refused(&self, refused: &Refused) {
        let limit = refused.limit;
        self.metrics
            .requests_refused
            .get_or_create(&RefusedLabels { limit })
            .inc();
        tracing::debug!(peer = %self.peer, limit, "refused an HTTP/1.1 request: {}", refused.error.message);
    }

    /// The next request, read whole, as the router's call; `Ok(None)` when
    /// the connection ends first, `Err` for a request refused (to answer,
    /// then end the connection).
    async fn request(
        &self,
        io: &mut Watched,
        buf: &mut BytesMut,
    ) -> std::io::Result<Result<Option<Call>, Refused>> {
        let head = match self.read_head(io, buf).await? {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(Ok(None)),
            Err(error) => return Ok(Err(error)),
        };
        let in_flight = InFlight::start(self.activity);
        let deadline = Instant::now() + self.limits.body_timeout;
        let admitted = head.framing == head::Framing::Empty || (self.admits)(head.request.headers());
        if let head::Framing::Length(length) = head.framing
            && admitted
            && length > self.limits.max_body_bytes as u64
        {
            // Answered before a byte of it is read (nor `100 Continue` sent).
            let error = ApiError::new(
                ErrorCode::TooLarge,
                "request body is larger than RUNLEASE_MAX_BODY_BYTES",
            );
            return Ok(Err(Refused {
                limit: "body_bytes",
                error,
            }));
        }
        let (body, whole) = if head.framing == head::Framing::Empty {
            (axum::body::Body::empty(), true)
        } else if !admitted {
            // The router refuses it for its key; the body is left unread.
            (axum::body::Body::empty(), false)
        } else {
            match Box::pin(self.read_body(io, buf, head.framing, head.expects_continue, deadline)).await? {
                Arrived::Body(body, whole) => (body, whole),
                Arrived::Refused(error) => return Ok(Err(error)),
                Arrived::Gone => return Ok(Ok(None)),
            }
        };
        if buf.is_empty() {
            // Nothing held while the request is in flight.
            *buf = BytesMut::new();
        }
        let framing = answer::Framing {
            head_only: head.request.method() == Method::HEAD,
            http10: head.request.version() == Version::HTTP_10,
            keep_alive: head.keep_alive && whole,
        };
        let (mut parts, ()) = head.request.into_parts();
        mark(&mut parts.extensions, self.peer, deadline);
        let call = self.app.clone().call(Request::from_parts(parts, body));
        Ok(Ok(Some((call, framing, in_flight))))
    }

    /// The next request's head; `Ok(None)` when the peer closed the
    /// connection or the server asked it to close, `Err` for a head refused.
    async fn read_head(
        &self,
        io: &mut Watched,
        buf: &mut BytesMut,
    ) -> std::io::Result<Result<Option<Head>, Refused>> {
        // Bytes already looked at for a head's end: a head sent a byte at a
        // time is parsed once, not once per byte.
        let mut scanned: usize = 0;
        loop {
            // Empty lines before a request line are ignored (as HTTP/1.1
            // allows), and not kept: a stream of them is not parsed again
            // and again.
            let blank = buf.iter().take_while(|b| matches!(b, b'\r' | b'\n')).count();
            buf.advance(blank);
            scanned = scanned.saturating_sub(blank);
            if !buf.is_empty() && (scanned == 0 || head::may_end(&buf[scanned - 3.min(scanned)..])) {
                match head::parse(buf) {
                    Ok(Some(head)) => return Ok(Ok(Some(head))),
                    Ok(None) => {}
                    Err(message) => return Ok(Err(Refused::malformed(message))),
                }
            }
            if buf.len() >= MAX_HEAD_BYTES {
                let error = ApiError::new(ErrorCode::TooLarge, "the request head is larger than 64 KiB");
                return Ok(Err(Refused {
                    limit: "head_bytes",
                    error,
                }));
            }
            scanned = buf.len();
            // Told to close, it closes (a head begun is dropped).
            tokio::select! {
                read = fill(io, buf) => if read? == 0 {
                    return Ok(Ok(None));
                },
                () = self.close.notified() => return Ok(Ok(None)),
            }
        }
    }

    /// Reads a body by its deadline (see [`body`]).
    async fn read_body(
        &self,
        io: &mut Watched,
        buf: &mut BytesMut,
        framing: head::Framing,
        expects_continue: bool,
        deadline: Instant,
    ) -> std::io::Result<Arrived> {
        if expects_continue && buf.is_empty() {
            io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        let read = body::read(io, buf, framing, self.limits.max_body_bytes);
        Ok(match tokio::time::timeout_at(deadline, read).await {
            Ok(read) => match read? {
                Read::Whole(bytes) => Arrived::Body(axum::body::Body::from(bytes), true),
                // The router's body limit answers 413.
                Read::Over(bytes) => Arrived::Body(axum::body::Body::from(bytes), false),
                Read::Malformed(message) => Arrived::Refused(Refused::malformed(message)),
                Read::Gone => Arrived::Gone,
            },
            // The router's body deadline, passed already, answers 400.
            Err(_) => Arrived::Body(axum::body::Body::new(NeverArrives), false),
        })
    }

    /// The router's answer, and whether the connection was asked to close
    /// meanwhile; `None` when the peer went away first (watched while
    /// `watch`: nothing of the next request has been read).
    async fn wait<F>(
        &self,
        io: &Watched,
        mut watch: bool,
        mut call: Pin<&mut F>,
    ) -> Option<(axum::response::Response, bool)>
    where
        F: Future<Output = Result<axum::response::Response, Infallible>>,
    {
        let mut closing = false;
        loop {
            tokio::select! {
                response = call.as_mut() => {
                    let response = response.unwrap_or_else(|never| match never {});
                    return Some((response, closing));
                }
                gone = peer_gone(&io.inner), if watch => {
                    if gone {
                        return None;
                    }
                    watch = false;
                }
                () = self.close.notified(), if !closing => closing = true,
            }
        }
    }
}

/// Reads more of a head into `buf`: between requests it takes no buffer
/// until the socket is readable, so an idle connection holds none, and it
/// never reads past the largest head (one past it is refused).
async fn fill(io: &mut Watched, buf: &mut BytesMut) -> std::io::Result<usize> {
    if buf.is_empty() {
        io.inner.readable().await?;
    }
    if buf.capacity() - buf.len() < FIRST_READ / 2 {
        buf.reserve(buf.len().max(FIRST_READ));
    }
    let room = MAX_HEAD_BYTES - buf.len();
    io.read_buf(&mut (&mut *buf).limit(room)).await
}

/// Whether the peer closed the connection (true) or sent more bytes
/// (false), looked at without reading them.
async fn peer_gone(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.peek(&mut byte).await, Ok(0) | Err(_))
}

/// Answers `error`, ending the connection.
async fn refuse(io: &mut Watched, error: ApiError) -> std::io::Result<()> {
    let framing = answer::Framing {
        head_only: false,
        http10: false,
        keep_alive: false,
    };
    answer::write(io, error.into_response(), framing).await?;
    let _ = io.shutdown().await;
    Ok(())
}

/// The body of a request whose body did not arrive by its deadline: the
/// router's reader, at the same deadline, answers 400.
struct NeverArrives;

impl http_body::Body for NeverArrives {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}
