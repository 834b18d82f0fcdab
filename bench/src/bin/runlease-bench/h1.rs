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
//! while idle is found when a request on it gets no byte back, and the
//! request is sent again once on a new connection (it was never read).

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

/// Where an exchange failed: before any byte of the answer came back (a
/// reused connection the server had closed: safe to send again) or after.
struct Failed {
    error: io::Error,
    answered: bool,
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
        let reused = self.stream.is_some();
        let mut result = self.exchange().await;
        if let Err(Failed { answered: false, .. }) = &result
            && reused
        {
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
    /// body lies in `answer`. Any failure drops the connection.
    async fn exchange(&mut self) -> Result<(u16, usize, usize), Failed> {
        let result = match tokio::time::timeout(EXCHANGE_TIMEOUT, self.send_and_read()).await {
            Ok(r) => r,
            Err(_) => Err(Failed {
                error: io::Error::new(io::ErrorKind::TimedOut, "no answer in time"),
                answered: !self.answer.is_empty(),
            }),
        };
        match &result {
            Ok((_, _, _, keep)) if *keep => {}
            _ => self.stream = None,
        }
        result.map(|(status, start, end, _)| (status, start, end))
    }

    async fn send_and_read(&mut self) -> Result<(u16, usize, usize, bool), Failed> {
        self.answer.clear();
        let unanswered = |error| Failed {
            error,
            answered: false,
        };
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.addr).await.map_err(unanswered)?;
            stream.set_nodelay(true).map_err(unanswered)?;
            self.stream = Some(stream);
        }
        let stream = self.stream.as_mut().expect("connected above");
        stream.write_all(&self.out).await.map_err(unanswered)?;
        let (status, head, length, keep) = loop {
            self.answer.reserve(8 * 1024);
            let n = stream.read_buf(&mut self.answer).await.map_err(|error| Failed {
                error,
                answered: !self.answer.is_empty(),
            })?;
            if n == 0 {
                return Err(Failed {
                    error: io::ErrorKind::UnexpectedEof.into(),
                    answered: !self.answer.is_empty(),
                });
            }
            if let Some(parsed) = parse_head(&self.answer).map_err(|error| Failed {
                error,
                answered: true,
            })? {
                break parsed;
            }
        };
        while self.answer.len() < head + length {
            self.answer.reserve(head + length - self.answer.len());
            let n = stream.read_buf(&mut self.answer).await.map_err(|error| Failed {
                error,
                answered: true,
            })?;
            if n == 0 {
                return Err(Failed {
                    error: io::ErrorKind::UnexpectedEof.into(),
                    answered: true,
                });
            }
        }
        Ok((status, head, head + length, keep))
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
