//! A lean HTTP/1.1 client for the bench's own hot loops (the open loop's
//! enqueues, the outside workers of drains, of the open loop and of churn).
//!
//! The benchmark shares the machine's cores with the system it measures, so
//! every microsecond its load generator spends is one the coordinator and
//! PostgreSQL do not get. A general client (reqwest) parses the URL, builds
//! a header map, checks a pool out and back in and spawns its connection's
//! task for every request; this one keeps one keep-alive connection, writes
//! each request (head and body) in one `write`, and reads the answer into a
//! buffer it reuses. What goes over the wire is an ordinary HTTP/1.1
//! request: the coordinator cannot tell the difference.
//!
//! Answers must carry a `content-length` (or have no body): the
//! coordinator's JSON answers always do. A connection the server closed
//! while idle is found when a request on it fails before any byte of an
//! answer (end of stream, reset, broken pipe), and the request is sent
//! again once on a new connection; a timeout is not (the server may still
//! be at it). A request dropped midway (a worker stopping) closes its
//! connection, so no late answer is read as the next one's.

use std::io::{self, Write};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one exchange may take before the connection is dropped.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Headers read from an answer at most.
const MAX_HEADERS: usize = 32;

/// One keep-alive HTTP/1.1 connection to a coordinator, opened on first use
/// and again after any failure.
pub(crate) struct Conn {
    /// `host:port` connected to.
    addr: String,
    stream: Option<TcpStream>,
    /// The request being sent.
    out: Vec<u8>,
    /// The answer being read.
    answer: Vec<u8>,
}

/// An answer: its status, and its body in the connection's buffer.
pub(crate) struct Answer<'c> {
    pub(crate) status: u16,
    pub(crate) body: &'c [u8],
}

impl Answer<'_> {
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Why an exchange failed, and whether the request may be sent again: only
/// when a reused connection was found closed before any byte of an answer
/// came back (the server closed it while idle, so it never read the
/// request). A timeout is never sent again: the server may still be at it.
struct Failed {
    error: io::Error,
    resend: bool,
}

impl Failed {
    fn no(error: io::Error) -> Self {
        Self { error, resend: false }
    }
}

/// Whether `error`, before any byte of an answer, says the peer had closed
/// the connection.
fn closed_by_peer(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl Conn {
    /// A client of `base` (`http://host:port`, as the harness gives it).
    pub(crate) fn new(base: &str) -> Self {
        let addr = base
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        Self {
            addr,
            stream: None,
            out: Vec::with_capacity(4096),
            answer: Vec::with_capacity(16 * 1024),
        }
    }

    /// `POST path` with a JSON `body`.
    pub(crate) async fn post(&mut self, path: &str, body: &[u8]) -> io::Result<Answer<'_>> {
        self.out.clear();
        write!(
            self.out,
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            self.addr,
            body.len()
        )?;
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(body);
        let mut result = self.exchange().await;
        if matches!(&result, Err(Failed { resend: true, .. })) {
            result = self.exchange().await;
        }
        match result {
            Ok((status, start, end)) => Ok(Answer {
                status,
                body: &self.answer[start..end],
            }),
            Err(failed) => Err(failed.error),
        }
    }

    /// Sends `out` and reads one answer; answers its status and where its
    /// body lies in `answer`. The connection is held by the exchange and
    /// given back only after a whole answer that keeps it open: an exchange
    /// that fails, times out or is dropped midway closes it.
    async fn exchange(&mut self) -> Result<(u16, usize, usize), Failed> {
        tokio::time::timeout(EXCHANGE_TIMEOUT, self.send_and_read())
            .await
            .unwrap_or_else(|_| {
                Err(Failed::no(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer in time",
                )))
            })
    }

    async fn send_and_read(&mut self) -> Result<(u16, usize, usize), Failed> {
        self.answer.clear();
        let reused = self.stream.is_some();
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect(&self.addr).await.map_err(Failed::no)?;
                stream.set_nodelay(true).map_err(Failed::no)?;
                stream
            }
        };
        // Before any byte of an answer, a connection the server had closed.
        let unanswered = |error: io::Error, answer: &[u8]| Failed {
            resend: reused && answer.is_empty() && closed_by_peer(&error),
            error,
        };
        if let Err(e) = stream.write_all(&self.out).await {
            return Err(unanswered(e, &self.answer));
        }
        let (status, head, length, keep) = loop {
            self.answer.reserve(8 * 1024);
            let read = stream.read_buf(&mut self.answer).await;
            match read {
                Ok(0) => return Err(unanswered(io::ErrorKind::UnexpectedEof.into(), &self.answer)),
                Ok(_) => {}
                Err(e) => return Err(unanswered(e, &self.answer)),
            }
            if let Some(parsed) = parse_head(&self.answer).map_err(Failed::no)? {
                break parsed;
            }
        };
        let end = head + length;
        while self.answer.len() < end {
            self.answer.reserve(end - self.answer.len());
            match stream.read_buf(&mut self.answer).await {
                Ok(0) => return Err(Failed::no(io::ErrorKind::UnexpectedEof.into())),
                Ok(_) => {}
                Err(e) => return Err(Failed::no(e)),
            }
        }
        if self.answer.len() > end {
            // Nothing was asked for beyond this answer.
            let what = "bytes past the end of an answer";
            return Err(Failed::no(io::Error::new(io::ErrorKind::InvalidData, what)));
        }
        if keep {
            self.stream = Some(stream);
        }
        Ok((status, head, end))
    }
}

/// An answer's head, once whole: its status, its length, the body's
/// length, and whether the connection stays open.
fn parse_head(buf: &[u8]) -> io::Result<Option<(u16, usize, usize, bool)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let head = match answer.parse(buf) {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(invalid(format!("an answer's head: {e}"))),
    };
    let status = answer.code.unwrap_or_default();
    if status < 200 {
        // No request of this client asks for an interim answer.
        return Err(invalid(format!("an interim answer ({status})")));
    }
    let (mut length, mut keep) = (0, answer.version == Some(1));
    for h in answer.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| invalid("an answer's content-length".to_owned()))?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid(
                "a chunked answer (this client reads content-length only)".to_owned(),
            ));
        } else if h.name.eq_ignore_ascii_case("connection") {
            keep = !h.value.eq_ignore_ascii_case(b"close");
        }
    }
    Ok(Some((status, head, length, keep)))
}

#[cfg(test)]
mod tests {
    use super::parse_head;

    #[test]
    fn a_head_is_read_once_whole() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_head(&answer[..20]).unwrap(), None);
        let (status, head, length, keep) = parse_head(answer).unwrap().unwrap();
        assert_eq!((status, length, keep), (200, 2, true));
        assert_eq!(&answer[head..head + length], b"{}");
    }

    #[test]
    fn close_and_chunked_are_seen() {
        let closing = b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n";
        assert_eq!(
            parse_head(closing).unwrap().map(|h| (h.0, h.2, h.3)),
            Some((204, 0, false))
        );
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(parse_head(chunked).is_err());
    }
}
