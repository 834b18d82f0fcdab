//! A request body off an HTTP/1.1 connection, read whole before the
//! request is handed to the router: by its `Content-Length` or chunk by
//! chunk, never more than one byte past `RUNLEASE_MAX_BODY_BYTES` (the
//! router's own limit then answers 413), in steps as it arrives (a length
//! announced is not allocated up front).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::head::Framing;

/// Most bytes read into a body at once.
const READ_STEP: usize = 64 * 1024;
/// Bytes read at once while decoding chunks.
const CHUNKED_READ: usize = 8 * 1024;
/// Longest chunk-size line (with its extensions).
const MAX_SIZE_LINE: usize = 1024;
/// Most bytes of trailer fields after the last chunk (read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// What came of reading a body.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// The whole body.
    Whole(Bytes),
    /// Its first `limit + 1` bytes: the rest is left unread, and the
    /// connection closed after the answer.
    Over(Bytes),
    /// Not valid chunked framing: answered 400 with this message.
    Malformed(&'static str),
    /// The peer closed the connection before the body's end.
    Gone,
}

/// Reads the body `framing` announces from `buf` (bytes already read) and
/// then `io`; what follows it stays in `buf`.
pub(super) async fn read<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    framing: Framing,
    limit: usize,
) -> std::io::Result<Read> {
    match framing {
        Framing::Empty => Ok(Read::Whole(Bytes::new())),
        Framing::Length(length) => by_length(io, buf, length, limit).await,
        Framing::Chunked => chunked(io, buf, limit).await,
    }
}

async fn by_length<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    length: u64,
    limit: usize,
) -> std::io::Result<Read> {
    let want = usize::try_from(length)
        .unwrap_or(usize::MAX)
        .min(limit.saturating_add(1));
    let mut body = buf.split_to(buf.len().min(want));
    while body.len() < want {
        let room = (want - body.len()).min(READ_STEP);
        body.reserve(room);
        if io.read_buf(&mut (&mut body).limit(room)).await? == 0 {
            return Ok(Read::Gone);
        }
    }
    let body = body.freeze();
    Ok(if length > limit as u64 {
        Read::Over(body)
    } else {
        Read::Whole(body)
    })
}

async fn chunked<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    limit: usize,
) -> std::io::Result<Read> {
    let mut decoder = Chunked::default();
    let mut body = BytesMut::new();
    let cap = limit.saturating_add(1);
    loop {
        match decoder.decode(buf, &mut body, cap) {
            Ok(Step::More) => {}
            Ok(Step::Done) => return Ok(Read::Whole(body.freeze())),
            Ok(Step::Full) => return Ok(Read::Over(body.freeze())),
            Err(message) => return Ok(Read::Malformed(message)),
        }
        buf.reserve(CHUNKED_READ);
        if io.read_buf(buf).await? == 0 {
            return Ok(Read::Gone);
        }
    }
}

/// Where the chunked decoder is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk, this many bytes left.
    Data(u64),
    /// At the line end after a chunk's data.
    DataEnd,
    /// After the last chunk, at a trailer field or the final blank line.
    Trailers,
    /// Past the final blank line.
    Done,
}

/// What one pass of the decoder came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Needs more input.
    More,
    /// The body is whole.
    Done,
    /// The body reached its cap.
    Full,
}

/// Decodes chunked framing from one input buffer into a body.
#[derive(Debug, Default)]
pub struct Chunked {
    state: State,
    trailer_bytes: usize,
}

impl Chunked {
    /// Moves what `input` holds into `out` (at most `cap` bytes in all),
    /// taking what it used off `input`.
    pub fn decode(
        &mut self,
        input: &mut BytesMut,
        out: &mut BytesMut,
        cap: usize,
    ) -> Result<Step, &'static str> {
        loop {
            match self.state {
                State::Size => {
                    let Some(end) = line_end(input) else {
                        return more(input.len() <= MAX_SIZE_LINE, "a chunk-size line is too long");
                    };
                    let size = chunk_size(&input[..end]).ok_or("a chunk size is not a hexadecimal number")?;
                    input.advance(end + 2);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if out.len() >= cap {
                        return Ok(Step::Full);
                    }
                    if input.is_empty() {
                        return Ok(Step::More);
                    }
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(input.len())
                        .min(cap - out.len());
                    out.extend_from_slice(&input[..take]);
                    input.advance(take);
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                }
                State::DataEnd => {
                    if input.len() < 2 {
                        return Ok(Step::More);
                    }
                    if &input[..2] != b"\r\n" {
                        return Err("a chunk's data does not end where its size says");
                    }
                    input.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => {
                    let Some(end) = line_end(input) else {
                        return more(
                            self.trailer_bytes + input.len() <= MAX_TRAILERS,
                            "the trailer fields are too long",
                        );
                    };
                    self.trailer_bytes += end + 2;
                    if self.trailer_bytes > MAX_TRAILERS {
                        return Err("the trailer fields are too long");
                    }
                    if !valid_line(&input[..end]) {
                        return Err("a trailer field holds a control byte");
                    }
                    input.advance(end + 2);
                    if end == 0 {
                        self.state = State::Done;
                    }
                }
                State::Done => return Ok(Step::Done),
            }
        }
    }
}

/// `More`, or the error when the input already holds too much.
fn more(within: bool, error: &'static str) -> Result<Step, &'static str> {
    if within { Ok(Step::More) } else { Err(error) }
}

/// Where the first CRLF starts.
fn line_end(input: &[u8]) -> Option<usize> {
    input.windows(2).position(|w| w == b"\r\n")
}

/// A chunk-size line's size: hexadecimal digits from its first byte, then
/// only spaces or tabs before its extensions (`;...`). A line holding a
/// lone CR or LF, or another control byte, is refused: a proxy in front
/// may end the line there and read the body otherwise.
fn chunk_size(line: &[u8]) -> Option<u64> {
    if !valid_line(line) {
        return None;
    }
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let (size, rest) = line.split_at(digits);
    let rest = rest.trim_ascii_start();
    if digits == 0 || digits > 15 || !(rest.is_empty() || rest.starts_with(b";")) {
        return None;
    }
    size.iter().try_fold(0u64, |n, d| {
        char::from(*d).to_digit(16).map(|d| n * 16 + u64::from(d))
    })
}

/// Whether a chunk-size or trailer line holds no control byte but tabs.
fn valid_line(line: &[u8]) -> bool {
    line.iter().all(|b| *b == b'\t' || !b.is_ascii_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes.
    fn decode_in_steps(
        input: &[u8],
        step: usize,
        cap: usize,
    ) -> (Result<Step, &'static str>, Vec<u8>, Vec<u8>) {
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = BytesMut::new();
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            match decoder.decode(&mut buf, &mut out, cap) {
                Ok(Step::More) => {}
                other => return (other, out.to_vec(), buf.to_vec()),
            }
        }
        (Ok(Step::More), out.to_vec(), buf.to_vec())
    }

    #[test]
    fn chunks_in_pieces_of_every_size_decode_to_the_body_and_leave_what_follows() {
        let input = b"5 ;ext=1\r\nhello\r\n19\r\n, and twenty-one more ok.\r\n0\r\nX-Trailer: t\r\n\r\nGET /";
        for step in 1..=input.len() {
            let (step_result, out, rest) = decode_in_steps(input, step, 1024);
            assert_eq!(step_result, Ok(Step::Done), "pieces of {step}");
            assert_eq!(out, b"hello, and twenty-one more ok.", "pieces of {step}");
            assert!(b"GET /".starts_with(&rest), "pieces of {step}: {rest:?}");
        }
    }

    #[test]
    fn a_body_past_its_cap_stops_at_the_cap() {
        let (result, out, _) = decode_in_steps(b"10\r\n0123456789abcdef\r\n0\r\n\r\n", 64, 5);
        assert_eq!(result, Ok(Step::Full));
        assert_eq!(out, b"01234");
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for input in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"1234567890123456\r\n",
            // A lone LF or CR in the line, or space before the size: a proxy
            // may read these lines otherwise.
            b"2;\nxx\r\nab\r\n0\r\n\r\n",
            b"2\r;x\r\nab\r\n0\r\n\r\n",
            b" 2\r\nab\r\n0\r\n\r\n",
            b"2 x\r\nab\r\n0\r\n\r\n",
            b"2\r\nab\r\n0\r\nX-T: a\nb\r\n\r\n",
        ] {
            let (result, ..) = decode_in_steps(input, 64, 1024);
            assert!(result.is_err(), "{:?}", String::from_utf8_lossy(input));
        }
        let long_line = vec![b'1'; MAX_SIZE_LINE + 1];
        assert!(decode_in_steps(&long_line, 4096, 1024).0.is_err());
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(&b"X-T: 1\r\n"[..], MAX_TRAILERS / 8 + 1).flatten());
        assert!(decode_in_steps(&trailers, 4096, 1024).0.is_err());
    }

    #[tokio::test]
    async fn a_length_body_is_read_to_its_end_or_to_one_past_the_limit() {
        let mut buf = BytesMut::from(&b"abc"[..]);
        let mut io = &b"defGET"[..];
        let read = read(&mut io, &mut buf, Framing::Length(6), 100).await.unwrap();
        assert_eq!(read, Read::Whole(Bytes::from_static(b"abcdef")));
        assert_eq!(io, b"GET", "nothing past the body is read");

        let mut buf = BytesMut::new();
        let mut io = &[b'x'; 200][..];
        let read = super::read(&mut io, &mut buf, Framing::Length(200), 100)
            .await
            .unwrap();
        assert_eq!(read, Read::Over(Bytes::from(vec![b'x'; 101])));

        let mut io = &b"short"[..];
        let read = super::read(&mut io, &mut BytesMut::new(), Framing::Length(10), 100)
            .await
            .unwrap();
        assert_eq!(read, Read::Gone);
    }
}
