//! Raw HTTP/1.1 over a socket, for tests of what a client may send that
//! an HTTP library would not: sending bytes on a new connection, reading an
//! answer until a condition holds or until the server closes the connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Opens a connection to `addr` and sends `request` on it.
pub async fn send(addr: std::net::SocketAddr, request: impl AsRef<[u8]>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_ref()).await.unwrap();
    stream
}

/// Reads from `stream` until what was read satisfies `whole` (20 s at
/// most; panics if the server closes the connection first); what was read.
pub async fn read_until(stream: &mut TcpStream, whole: impl Fn(&str) -> bool) -> String {
    let mut answer = Vec::new();
    while !whole(&String::from_utf8_lossy(&answer)) {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf))
            .await
            .expect("answered within 20 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before the answer was whole: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Reads from `stream` until the server closes the connection (20 s at
/// most); what was read.
pub async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection within 20 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}
