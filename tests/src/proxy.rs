//! A TCP proxy (between a worker and a coordinator, or a coordinator and
//! PostgreSQL) that a test can cut, heal, freeze, blackhole, or tell to
//! swallow the answer to one request: a network partition, a connection that
//! dies without closing, and a lost response, on demand.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Default)]
struct State {
    cut: AtomicBool,
    /// New connections are accepted and then held: nothing is forwarded.
    blackhole: AtomicBool,
    /// One flag per open connection; a set flag holds its bytes.
    frozen: Mutex<Vec<Arc<AtomicBool>>>,
    /// Connections held by the blackhole, kept open.
    held: Mutex<Vec<TcpStream>>,
    /// Swallow the answer to the next request whose bytes contain this.
    swallow_next: Mutex<Option<String>>,
    swallowed: AtomicUsize,
    pumps: Mutex<Vec<AbortHandle>>,
}

/// A proxy on a loopback port forwarding to `upstream`.
pub struct Proxy {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: AbortHandle,
}

impl Proxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if st.cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                if st.blackhole.load(Ordering::SeqCst) {
                    st.held.lock().unwrap().push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                connect(st.clone(), client, server);
            }
        })
        .abort_handle();
        Self { addr, state, accept }
    }

    /// The proxy's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Partition: break every open connection and refuse new ones.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for pump in self.state.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }

    /// End the partition.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Freeze every connection open now: bytes in both directions are held
    /// from here on and nothing is closed, as when a failover or a dropped
    /// NAT entry leaves a connection dead without telling either end.
    /// Connections opened later work normally.
    pub fn freeze(&self) {
        for flag in self.state.frozen.lock().unwrap().iter() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// While on, new connections are accepted and then held: their bytes go
    /// nowhere and they are never closed.
    pub fn blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    /// Forward the next request containing `marker` (e.g. `POST /v1/complete`)
    /// but swallow its answer and close the connection.
    pub fn swallow_next_answer_to(&self, marker: &str) {
        *self.state.swallow_next.lock().unwrap() = Some(marker.to_owned());
    }

    /// Answers swallowed so far.
    pub fn swallowed(&self) -> usize {
        self.state.swallowed.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for pump in self.state.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }
}

/// Holds the pump forever once its connection is frozen.
async fn hold_if_frozen(frozen: &AtomicBool) {
    if frozen.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
}

fn connect(state: Arc<State>, client: TcpStream, server: TcpStream) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let frozen = Arc::new(AtomicBool::new(false));
    state.frozen.lock().unwrap().push(frozen.clone());
    let frozen_up = frozen.clone();

    let st = state.clone();
    let flag = swallow.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            hold_if_frozen(&frozen_up).await;
            {
                let mut armed = st.swallow_next.lock().unwrap();
                if let Some(marker) = armed.as_deref()
                    && String::from_utf8_lossy(&buf[..n]).contains(marker)
                {
                    flag.store(true, Ordering::SeqCst);
                    *armed = None;
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let st = state.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            hold_if_frozen(&frozen).await;
            if swallow.load(Ordering::SeqCst) {
                // The request reached the coordinator; its answer never returns.
                st.swallowed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    // A swallowed answer ends the downstream pump, which drops the client's
    // write half: the client sees its connection close mid-answer.
    let mut pumps = state.pumps.lock().unwrap();
    pumps.push(up.abort_handle());
    pumps.push(down.abort_handle());
}
