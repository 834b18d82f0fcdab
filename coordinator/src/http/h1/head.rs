//! A request head off an HTTP/1.1 connection: parsed with `httparse`, its
//! body's framing and the connection's persistence decided as HTTP/1.1
//! says, its fields kept as slices of the bytes read (no copy of each).

use std::ops::Range;

use axum::http::{HeaderName, HeaderValue, Method, Request, Uri, Version, header};
use bytes::{Bytes, BytesMut};

/// Most header fields in a request head.
pub(super) const MAX_HEADERS: usize = 100;

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A request head, parsed.
#[derive(Debug)]
pub struct Head {
    /// Method, target, version and fields; the body comes after.
    pub request: Request<()>,
    /// How its body is delimited.
    pub framing: Framing,
    /// The connection may carry another request after this one's answer.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before it sends the body.
    pub expects_continue: bool,
}

/// Where the parser found each part, as offsets into the buffer.
struct Found {
    len: usize,
    method: Range<usize>,
    target: Range<usize>,
    version: u8,
    fields: Vec<(Range<usize>, Range<usize>)>,
}

/// Parses the head at the front of `buf`, taking it off when whole:
/// `Ok(None)` while only its start has arrived, `Err` for what is not a
/// request this server reads (answered 400 with the message, and the
/// connection closed).
pub fn parse(buf: &mut BytesMut) -> Result<Option<Head>, String> {
    let Some(found) = find(buf)? else {
        return Ok(None);
    };
    let bytes = buf.split_to(found.len).freeze();
    build(&bytes, found).map(Some).map_err(str::to_owned)
}

/// Whether `bytes` hold a blank line's end (`\n\n` or `\n\r\n`), so may
/// end a head: only then is it worth parsing.
pub(super) fn may_end(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}

fn find(buf: &[u8]) -> Result<Option<Found>, String> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(format!(
                "a request head may carry at most {MAX_HEADERS} header fields"
            ));
        }
        Err(e) => return Err(format!("the request head cannot be parsed: {e}")),
    };
    let at = |part: &[u8]| {
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + part.len()
    };
    // A complete head has all three parts.
    let (Some(method), Some(target), Some(version)) = (request.method, request.path, request.version) else {
        return Err("the request line is incomplete".to_owned());
    };
    Ok(Some(Found {
        len,
        method: at(method.as_bytes()),
        target: at(target.as_bytes()),
        version,
        fields: request
            .headers
            .iter()
            .map(|field| (at(field.name.as_bytes()), at(field.value)))
            .collect(),
    }))
}

fn build(bytes: &Bytes, found: Found) -> Result<Head, &'static str> {
    let mut request = Request::new(());
    *request.method_mut() =
        Method::from_bytes(&bytes[found.method]).map_err(|_| "the method is not a token")?;
    *request.uri_mut() =
        Uri::from_maybe_shared(bytes.slice(found.target)).map_err(|_| "the request target is not a URI")?;
    let version = if found.version == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    *request.version_mut() = version;
    let fields = request.headers_mut();
    fields.reserve(found.fields.len());
    for (name, value) in found.fields {
        let name = HeaderName::from_bytes(&bytes[name]).map_err(|_| "a header field name is not a token")?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value))
            .map_err(|_| "a header field value holds a control byte")?;
        fields.append(name, value);
    }
    let framing = framing(&request)?;
    let (close, keep_alive) = connection_options(&request);
    let keep_alive = match version {
        Version::HTTP_11 => !close,
        _ => keep_alive && !close,
    };
    let expects_continue = version == Version::HTTP_11
        && request
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Head {
        request,
        framing,
        keep_alive,
        expects_continue,
    })
}

/// The comma-separated, trimmed elements of every `name` field (empty ones
/// too).
fn elements<'a>(request: &'a Request<()>, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> {
    request
        .headers()
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
}

/// The body's framing. A request with both `Transfer-Encoding` and
/// `Content-Length`, a transfer coding other than chunked alone, or an
/// empty element in either (`Content-Length:` with no value) is refused:
/// it is how requests are smuggled past a proxy that frames them otherwise.
fn framing(request: &Request<()>) -> Result<Framing, &'static str> {
    let fields = request.headers();
    if fields.contains_key(header::TRANSFER_ENCODING) {
        if request.version() != Version::HTTP_11 {
            return Err("Transfer-Encoding is not allowed in an HTTP/1.0 request");
        }
        if fields.contains_key(header::CONTENT_LENGTH) {
            return Err("a request may not carry both Content-Length and Transfer-Encoding");
        }
        let mut codings = elements(request, &header::TRANSFER_ENCODING);
        return match (codings.next(), codings.next()) {
            (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            _ => Err("the only transfer coding understood is chunked, alone"),
        };
    }
    let mut length = None;
    for element in elements(request, &header::CONTENT_LENGTH) {
        let n = decimal(element).ok_or("Content-Length is not a decimal number")?;
        if length.is_some_and(|l| l != n) {
            return Err("the request carries differing Content-Length values");
        }
        length = Some(n);
    }
    Ok(match length {
        None | Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
    })
}

/// A `Content-Length`: digits only.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// Whether `Connection` asks to close, and whether it asks to keep alive
/// (what an HTTP/1.0 client must say).
fn connection_options(request: &Request<()>) -> (bool, bool) {
    let mut close = false;
    let mut keep_alive = false;
    for option in elements(request, &header::CONNECTION).filter(|e| !e.is_empty()) {
        close |= option.eq_ignore_ascii_case(b"close");
        keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
    }
    (close, keep_alive)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Option<Head>, String> {
        parse(&mut BytesMut::from(text.as_bytes()))
    }

    fn head(text: &str) -> Head {
        match parsed(text) {
            Ok(Some(head)) => head,
            other => panic!("{text:?}: {other:?}"),
        }
    }

    fn refused(text: &str) -> String {
        match parsed(text) {
            Err(message) => message,
            other => panic!("{text:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn a_head_is_taken_off_the_buffer_and_what_follows_stays() {
        let mut buf = BytesMut::from(
            &b"POST /v1/claim?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\n{}GET"
                [..],
        );
        let head = parse(&mut buf).unwrap().expect("a whole head");
        assert_eq!(&buf[..], b"{}GET");
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri().path(), "/v1/claim");
        assert_eq!(head.request.uri().query(), Some("x=1"));
        assert_eq!(head.request.version(), Version::HTTP_11);
        assert_eq!(head.framing, Framing::Length(2));
        let values: Vec<_> = head.request.headers().get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert!(head.keep_alive);
        assert!(!head.expects_continue);
    }

    #[test]
    fn a_head_in_pieces_is_partial_until_its_blank_line() {
        let text = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(may_end(b"\r\n\r\n") && may_end(b"\n\n") && may_end(b"a\n\r\nb"));
        assert!(!may_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r") && !may_end(b"\r\n"));
        for end in 0..text.len() {
            let mut buf = BytesMut::from(&text.as_bytes()[..end]);
            assert!(matches!(parse(&mut buf), Ok(None)), "{end}");
            assert_eq!(buf.len(), end, "a partial head stays in the buffer");
        }
        assert_eq!(head(text).framing, Framing::Empty);
    }

    #[test]
    fn framing_follows_content_length_and_chunked_and_refuses_the_ambiguous() {
        let with = |fields: &str| format!("POST / HTTP/1.1\r\n{fields}\r\n");
        assert_eq!(head(&with("Content-Length: 0\r\n")).framing, Framing::Empty);
        assert_eq!(
            head(&with("Content-Length: 5, 5\r\n")).framing,
            Framing::Length(5)
        );
        assert_eq!(
            head(&with("Transfer-Encoding: Chunked\r\n")).framing,
            Framing::Chunked
        );
        for fields in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: -5\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: 99999999999999999999\r\n",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: identity\r\n",
            "Transfer-Encoding: chunked,\r\n",
            "Transfer-Encoding: , chunked\r\n",
            "Content-Length: \r\n",
            "Content-Length: ,\r\n",
            "Content-Length: 5,\r\n",
        ] {
            refused(&with(fields));
        }
        refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
    }

    #[test]
    fn persistence_and_continue_follow_the_version_and_connection_options() {
        assert!(!head("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nConnection: te, close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(
            head("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n").expects_continue
        );
        assert!(
            !head("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n").expects_continue
        );
    }

    #[test]
    fn malformed_heads_are_refused_with_a_reason() {
        assert!(refused("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").contains("cannot be parsed"));
        assert!(refused("GET / HTTP/3.0\r\n\r\n").contains("cannot be parsed"));
        assert!(refused("GET http://[ HTTP/1.1\r\n\r\n").contains("URI"));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert!(refused(&format!("GET / HTTP/1.1\r\n{many}\r\n")).contains("at most 100"));
        // Made-up methods are tokens: the router answers them (405).
        assert_eq!(
            head("MADEUP / HTTP/1.1\r\n\r\n").request.method().as_str(),
            "MADEUP"
        );
    }
}
