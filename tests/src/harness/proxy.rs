//! A TCP proxy on 127.0.0.1 in front of one loopback port, for fault tests.

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::util::poll_until;

const CHUNK: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
const CLOSE_POLL: Duration = Duration::from_millis(1);

/// A TCP proxy on its own tokio runtime: latency, a hung link, and cut connections on demand.
///
/// - [`set_delay`](Self::set_delay): every chunk, in both directions, is forwarded `d` after it was
///   read (the delay in force when it was read). Order within a connection is kept.
/// - [`set_blackhole`](Self::set_blackhole): connections are accepted and read, nothing is forwarded.
///   Bytes read meanwhile are *held*, not dropped, and delivered in order once the blackhole is lifted
///   (a partition that heals; TCP never loses bytes mid-stream). [`cut_all`](Self::cut_all) drops them.
/// - [`cut_all`](Self::cut_all): resets (RST) both sides of every current connection and returns once
///   they are closed; the proxy keeps listening.
///
/// If the upstream refuses a new connection, the client side is reset.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    runtime: Option<Runtime>,
}

#[derive(Debug)]
struct Shared {
    /// The upstream's port on 127.0.0.1, for connections made from now on.
    upstream: AtomicU16,
    delay_nanos: AtomicU64,
    blackhole: watch::Sender<bool>,
    /// Live connections; the sender is taken (dropped) to cut one, the entry leaves when it is closed.
    conns: Mutex<HashMap<u64, Option<oneshot::Sender<()>>>>,
    next_id: AtomicU64,
    listening: AtomicBool,
    /// Bytes read from clients so far (counted when read, before a delay or blackhole holds them).
    bytes_up: AtomicU64,
    /// While on, nothing is forwarded from the upstream to clients (held, as by `blackhole`).
    blackhole_down: watch::Sender<bool>,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Option<oneshot::Sender<()>>>> {
        // A poisoned map is still consistent: entries are only inserted and removed.
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::SeqCst))
    }
}

impl FaultProxy {
    /// Listens on a free 127.0.0.1 port and forwards to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("bind the fault proxy on 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("make the fault proxy listener non-blocking");
        let port = listener.local_addr().expect("proxy local address").port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lock-tests-fault-proxy")
            .enable_all()
            .build()
            .expect("build the fault proxy runtime");
        let listener = {
            let _context = runtime.enter();
            TcpListener::from_std(listener).expect("register the proxy listener with tokio")
        };
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream_port),
            delay_nanos: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            listening: AtomicBool::new(true),
            bytes_up: AtomicU64::new(0),
            blackhole_down: watch::Sender::new(false),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        runtime.spawn(accept_loop(listener, Arc::clone(&shared), shutdown_rx));
        FaultProxy {
            port,
            shared,
            shutdown,
            runtime: Some(runtime),
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/` (no credentials; build your own URL for an authenticated upstream).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `http://127.0.0.1:PORT`: the proxy as an etcd endpoint.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Bytes read from clients so far: requests that reached the proxy, counted when read, before
    /// a delay or blackhole holds them (so not proof that they reached the upstream).
    pub fn bytes_up(&self) -> u64 {
        self.shared.bytes_up.load(Ordering::SeqCst)
    }

    /// Latency added to every chunk read from now on, in both directions, on all connections.
    pub fn set_delay(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_nanos.store(nanos, Ordering::SeqCst);
    }

    /// While on, nothing is forwarded in either direction (bytes are held, see the type docs).
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Forwards the connections made from now on to `127.0.0.1:upstream_port` (another server
    /// answering at the address a client knows: an upgrade, a replacement); with
    /// [`cut_all`](Self::cut_all), every connection goes there.
    pub fn set_upstream(&self, upstream_port: u16) {
        self.shared.upstream.store(upstream_port, Ordering::SeqCst);
    }

    /// Resets every current connection (both sides) and waits, bounded, until they are closed.
    pub fn cut_all(&self) {
        if !self.cut_all_bounded() {
            panic!("fault proxy connections not closed within {CLOSE_TIMEOUT:?} after cut_all");
        }
    }

    fn cut_all_bounded(&self) -> bool {
        let ids: Vec<u64> = self
            .shared
            .conns()
            .iter_mut()
            .map(|(id, cut)| {
                drop(cut.take());
                *id
            })
            .collect();
        poll_until(CLOSE_TIMEOUT, CLOSE_POLL, || {
            let conns = self.shared.conns();
            (!ids.iter().any(|id| conns.contains_key(id))).then_some(())
        })
        .is_some()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        let closed = poll_until(CLOSE_TIMEOUT, CLOSE_POLL, || {
            (!self.shared.listening.load(Ordering::SeqCst)).then_some(())
        })
        .is_some();
        let cut = self.cut_all_bounded();
        if !(closed && cut) {
            eprintln!(
                "lock-tests: fault proxy on port {} did not close within {CLOSE_TIMEOUT:?}",
                self.port
            );
        }
        // Not `shutdown_timeout`: that blocks, which panics when dropped inside an async test.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Clears `listening` when the accept loop ends, however it ends.
struct Listening(Arc<Shared>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.listening.store(false, Ordering::SeqCst);
    }
}

/// Removes a connection from the registry when its task ends, however it ends.
struct Registered {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.id);
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _listening = Listening(Arc::clone(&shared));
    loop {
        tokio::select! {
            biased;
            () = wait_for(&mut shutdown, true) => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    // Registered here, not in the task, so a cut_all right after accept sees it.
                    let (cut_tx, cut_rx) = oneshot::channel();
                    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                    shared.conns().insert(id, Some(cut_tx));
                    let registered = Registered { id, shared: Arc::clone(&shared) };
                    tokio::spawn(connection(client, cut_rx, registered));
                }
                // e.g. EMFILE: keep listening, but do not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    drop(listener);
}

async fn connection(mut client: TcpStream, cut: oneshot::Receiver<()>, registered: Registered) {
    let shared = Arc::clone(&registered.shared);
    let connected = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect(SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            shared.upstream.load(Ordering::SeqCst),
        ))),
    )
    .await;
    let Ok(Ok(mut upstream)) = connected else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let was_cut = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let relay = async {
            tokio::try_join!(
                pipe(client_read, upstream_write, &shared, true),
                pipe(upstream_read, client_write, &shared, false),
            )
        };
        tokio::select! {
            biased;
            _ = cut => true,
            _ = relay => false,
        }
    };
    if was_cut {
        let _ = client.set_zero_linger();
        let _ = upstream.set_zero_linger();
    }
    // Both sockets close here, before `registered` leaves the registry (cut_all waits for that).
    drop(client);
    drop(upstream);
    drop(registered);
}

/// One direction. The reader stamps each chunk with its due time and never waits on the writer, so
/// latency is added without limiting throughput; the channel keeps the order.
async fn pipe(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    shared: &Shared,
    up: bool,
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            if up {
                shared.bytes_up.fetch_add(n as u64, Ordering::SeqCst);
            }
            let due = Instant::now() + shared.delay();
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    };
    let write = async move {
        let mut blackhole = shared.blackhole.subscribe();
        let mut blackhole_down = shared.blackhole_down.subscribe();
        while let Some((due, chunk)) = rx.recv().await {
            wait_for(&mut blackhole, false).await;
            if !up {
                wait_for(&mut blackhole_down, false).await;
            }
            tokio::time::sleep_until(due).await;
            to.write_all(&chunk).await?;
        }
        // The reader saw EOF: forward the half-close.
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Waits until the flag equals `want`, or its sender is gone (the proxy is going away).
/// A separate fn so the watch guard is released before the caller's next `.await`.
async fn wait_for(flag: &mut watch::Receiver<bool>, want: bool) {
    let _ = flag.wait_for(|value| *value == want).await.is_ok();
}

impl FaultProxy {
    /// An asymmetric partition: while on, requests still reach the upstream but nothing comes
    /// back (replies are held, as by [`set_blackhole`](Self::set_blackhole), and delivered in
    /// order once it is lifted).
    pub fn set_blackhole_down(&self, on: bool) {
        self.shared.blackhole_down.send_replace(on);
    }
}
