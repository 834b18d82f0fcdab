//! An answer written to an HTTP/1.1 connection: the status line, the
//! router's fields and the framing ones (`date`, `content-length` or
//! chunked, `connection`), and the body, a small one in the same write as
//! its head.

use std::cell::RefCell;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{Response, StatusCode, header};
use http_body::Body as _;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// A body up to this size goes out in one write with its head.
const INLINE_BODY: usize = 64 * 1024;

/// How the answer is framed on the connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct Framing {
    /// The request was `HEAD`: fields only.
    pub(super) head_only: bool,
    /// The request was HTTP/1.0 (no chunked answers; staying open must be
    /// said).
    pub(super) http10: bool,
    /// The connection stays open after the answer, if the answer allows.
    pub(super) keep_alive: bool,
}

/// Writes `response`; whether the connection may carry another request
/// (an answer of unknown length to HTTP/1.0 ends with the connection).
pub(super) async fn write<W: AsyncWrite + Unpin>(
    io: &mut W,
    response: Response<axum::body::Body>,
    framing: Framing,
) -> std::io::Result<bool> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let bodiless =
        status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let length = body.size_hint().exact();
    // A length the router set is kept (and the body sent as it is).
    let set_length = parts.headers.contains_key(header::CONTENT_LENGTH);
    let chunked = !bodiless && length.is_none() && !set_length && !framing.http10;
    let says_close = parts
        .headers
        .get(header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let keep_alive =
        framing.keep_alive && !says_close && (bodiless || length.is_some() || set_length || chunked);
    let inline = length
        .filter(|n| *n as usize <= INLINE_BODY && !framing.head_only)
        .unwrap_or(0);
    let mut out = Vec::with_capacity(256 + parts.headers.len() * 48 + inline as usize);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        // No length on an answer that has no body (a 304 would claim one).
        if name == header::CONNECTION
            || name == header::TRANSFER_ENCODING
            || (bodiless && name == header::CONTENT_LENGTH)
        {
            continue;
        }
        field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    if !parts.headers.contains_key(header::DATE) {
        with_date(|date| field(&mut out, b"date", date));
    }
    if !bodiless && !set_length {
        match length {
            Some(n) => {
                out.extend_from_slice(b"content-length: ");
                // Digits written in place, without a String.
                let _ = std::io::Write::write_fmt(&mut out, format_args!("{n}\r\n"));
            }
            None if chunked => field(&mut out, b"transfer-encoding", b"chunked"),
            None => {}
        }
    }
    if !keep_alive {
        field(&mut out, b"connection", b"close");
    } else if framing.http10 {
        field(&mut out, b"connection", b"keep-alive");
    }
    out.extend_from_slice(b"\r\n");
    if !bodiless && !framing.head_only {
        write_body(io, &mut out, &mut body, chunked).await?;
    }
    io.write_all(&out).await?;
    Ok(keep_alive)
}

/// Writes the body's frames, gathering small ones into `out` (written by
/// the caller at the end).
async fn write_body<W: AsyncWrite + Unpin>(
    io: &mut W,
    out: &mut Vec<u8>,
    body: &mut axum::body::Body,
    chunked: bool,
) -> std::io::Result<()> {
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let frame = frame.map_err(std::io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            // Trailers: not sent (no answer of ours has any).
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            out.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
        }
        if out.len() + data.len() <= INLINE_BODY {
            out.extend_from_slice(&data);
        } else {
            io.write_all(out).await?;
            out.clear();
            io.write_all(&data).await?;
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    Ok(())
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    /// This thread's `date` value and the second it is of.
    static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Calls `f` with the current `date` value (made once a second per thread).
fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        f(text.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn written(response: Response<axum::body::Body>, framing: Framing) -> (String, bool) {
        let mut out = Vec::new();
        let keep = write(&mut out, response, framing).await.unwrap();
        (String::from_utf8(out).unwrap(), keep)
    }

    const KEEP: Framing = Framing {
        head_only: false,
        http10: false,
        keep_alive: true,
    };

    #[tokio::test]
    async fn a_sized_answer_has_its_length_and_date_and_stays_open() {
        let response = Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .body(axum::body::Body::from("{\"a\":1}"))
            .unwrap();
        let (text, keep) = written(response, KEEP).await;
        assert!(keep);
        assert!(
            text.starts_with("HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ndate: "),
            "{text}"
        );
        assert!(
            text.ends_with("GMT\r\ncontent-length: 7\r\n\r\n{\"a\":1}"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_answer_of_unknown_length_is_chunked_or_ends_the_http10_connection() {
        let stream = || {
            let frames = futures_util::stream::iter(["ab", "", "cde"].map(Ok::<_, std::io::Error>));
            Response::new(axum::body::Body::from_stream(frames))
        };
        let (text, keep) = written(stream(), KEEP).await;
        assert!(keep);
        assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
        assert!(
            text.ends_with("\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"),
            "{text}"
        );
        let (text, keep) = written(stream(), Framing { http10: true, ..KEEP }).await;
        assert!(!keep);
        assert!(
            text.contains("connection: close\r\n") && text.ends_with("\r\n\r\nabcde"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn head_and_no_content_answers_carry_no_body() {
        let (text, _) = written(
            Response::new(axum::body::Body::from("hello")),
            Framing {
                head_only: true,
                ..KEEP
            },
        )
        .await;
        assert!(text.ends_with("content-length: 5\r\n\r\n"), "{text}");
        let response = Response::builder()
            .status(204)
            .body(axum::body::Body::empty())
            .unwrap();
        let (text, keep) = written(
            response,
            Framing {
                keep_alive: false,
                ..KEEP
            },
        )
        .await;
        assert!(!keep);
        assert!(!text.contains("content-length"), "{text}");
        assert!(text.ends_with("connection: close\r\n\r\n"), "{text}");
        // axum gives a 304 a length of 0: it is not sent.
        let response = Response::builder()
            .status(304)
            .header("content-length", "0")
            .header("etag", "\"v1\"")
            .body(axum::body::Body::empty())
            .unwrap();
        let (text, keep) = written(response, KEEP).await;
        assert!(keep);
        assert!(
            !text.contains("content-length") && text.contains("etag: \"v1\""),
            "{text}"
        );
    }
}
