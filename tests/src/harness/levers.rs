//! Server-side fault levers beyond stop/freeze: a script that keeps Redis `BUSY`, and a server
//! that answers `LOADING` while it loads a large dataset slowly.

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tempfile::TempDir;

use super::proxy::FaultProxy;
use super::server::RedisServer;
use super::util::{free_port, poll_until};

const LEVER_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(2);

/// The error code a one-off `PING` gets from `port` (`None`: it answered `PONG`, or not at all).
pub fn ping_error_code(port: u16) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(250))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_millis(250)))
        .ok()?;
    match redis::cmd("PING").query::<String>(&mut con) {
        Ok(_) => None,
        Err(e) => e.code().map(str::to_owned),
    }
}

/// A Lua script spinning on `server` for a while: once it has run longer than
/// `busy-reply-threshold` (set to 20ms here) every other client gets `-BUSY`.
#[derive(Debug)]
pub struct BusyScript {
    thread: Option<JoinHandle<()>>,
}

impl BusyScript {
    /// Starts the script from its own connection and returns once the server answers `BUSY`.
    pub fn start(server: &RedisServer, busy_for: Duration) -> BusyScript {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("busy-reply-threshold")
            .arg(20)
            .query(&mut server.admin())
            .unwrap();
        let url = server.url();
        let micros = busy_for.as_micros().to_string();
        let thread = thread::spawn(move || {
            let client = redis::Client::open(url).unwrap();
            let mut con = client.get_connection().unwrap();
            con.set_read_timeout(Some(busy_for + LEVER_TIMEOUT))
                .unwrap();
            let _: i64 = redis::cmd("EVAL")
                .arg(
                    "local t0 = redis.call('TIME') \
                     while true do \
                       local t = redis.call('TIME') \
                       if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > tonumber(ARGV[1]) then break end \
                     end \
                     return 1",
                )
                .arg(0)
                .arg(micros)
                .query(&mut con)
                .unwrap();
        });
        let port = server.port();
        poll_until(LEVER_TIMEOUT, POLL, || {
            (ping_error_code(port).as_deref() == Some("BUSY")).then_some(())
        })
        .expect("the busy script never made the server answer BUSY");
        BusyScript {
            thread: Some(thread),
        }
    }

    /// Waits until the script has ended by itself.
    pub fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            thread.join().expect("busy script thread");
        }
    }
}

impl Drop for BusyScript {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A `redis-server` that starts from a large RDB file and loads it slowly (`key-load-delay`), so
/// that it answers `-LOADING` for a while. The port is known before the process starts, so a client
/// can be pointed at it first.
#[derive(Debug)]
pub struct LoadingServer {
    dir: TempDir,
    port: u16,
    key_load_delay_us: u32,
    child: Option<Child>,
}

impl LoadingServer {
    /// Writes an RDB with `keys` keys of 100 bytes (made by a throwaway server); nothing runs yet.
    pub fn prepare(keys: u32, key_load_delay_us: u32) -> LoadingServer {
        let dir = tempfile::Builder::new()
            .prefix("lock-tests-loading-")
            .tempdir()
            .expect("temporary directory");
        let maker = RedisServer::start();
        let mut admin = maker.admin();
        let _: i64 = redis::cmd("EVAL")
            .arg(
                "for i = 1, tonumber(ARGV[1]) do \
                   redis.call('SET', 'junk:' .. i, string.rep('x', 100)) \
                 end return 1",
            )
            .arg(0)
            .arg(keys)
            .query(&mut admin)
            .unwrap();
        let () = redis::cmd("SAVE").query(&mut admin).unwrap();
        let (_, from): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query(&mut admin)
            .unwrap();
        fs::copy(
            PathBuf::from(from).join("dump.rdb"),
            dir.path().join("dump.rdb"),
        )
        .expect("copy the RDB file");
        drop(maker);
        LoadingServer {
            dir,
            port: free_port(),
            key_load_delay_us,
            child: None,
        }
    }

    /// The port the server will listen on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the server and returns once it answers `LOADING` (panics if it never does).
    pub fn start_loading(&mut self) {
        let child = Command::new(super::server::default_binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--key-load-delay", &self.key_load_delay_us.to_string()])
            .args(["--loading-process-events-interval-bytes", "1024"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let port = self.port;
        poll_until(LEVER_TIMEOUT, POLL, || {
            (ping_error_code(port).as_deref() == Some("LOADING")).then_some(())
        })
        .expect("the server never answered LOADING");
    }

    /// Waits (bounded by `timeout`) until the server answers `PONG`.
    pub fn wait_loaded(&self, timeout: Duration) -> bool {
        let port = self.port;
        poll_until(timeout, Duration::from_millis(10), || {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
            let mut con = client
                .get_connection_with_timeout(Duration::from_millis(250))
                .ok()?;
            redis::cmd("PING").query::<String>(&mut con).ok().map(drop)
        })
        .is_some()
    }
}

impl Drop for LoadingServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = poll_until(LEVER_TIMEOUT, POLL, || child.try_wait().ok().flatten());
        }
    }
}

/// `EXISTS key` as admin.
pub fn key_exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<bool>(&mut server.admin())
        .unwrap()
}

/// Waits until `key` is gone from `server` (`EXISTS` over one admin connection) and returns how
/// long that took; panics naming `what` after `timeout`.
pub async fn wait_key_gone(
    server: &RedisServer,
    key: &str,
    timeout: Duration,
    what: &str,
) -> Duration {
    let mut admin = server.admin();
    crate::wait_until_async(timeout, &format!("{what}: {key} gone"), || {
        !redis::cmd("EXISTS")
            .arg(key)
            .query::<bool>(&mut admin)
            .unwrap()
    })
    .await
}

/// Polls `cond` every 5ms until it holds (true) or `within` passed (false).
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `fut`'s output; panics when it takes longer than `limit`.
pub async fn bounded<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

/// A task that asks `locks` for `key` with `wait` and answers with the outcome and when it came.
pub fn waiter(
    locks: lock_runtime::LockClient,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<(
    Result<lock_runtime::LockGuard, lock_runtime::LockError>,
    std::time::Instant,
)> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let taken = locks.lock(&key).wait(wait).acquire().await;
        (taken, std::time::Instant::now())
    })
}

/// Releases `guard`, whose only link is `proxy`, behind a partition whose held bytes are then
/// dropped: asserts the release answered `Unavailable` and was sent (the proxy read bytes after
/// the partition began), then resets every connection, so it never reaches the server. The
/// partition stays on: the caller checks that the lock is still there, then heals it.
pub async fn release_lost_in_a_partition(proxy: &FaultProxy, guard: lock_runtime::LockGuard) {
    proxy.set_blackhole(true);
    let sent = proxy.bytes_up();
    let released = bounded(Duration::from_secs(10), "release", guard.release()).await;
    assert!(
        matches!(released, Err(lock_runtime::LockError::Unavailable { .. })),
        "{released:?}"
    );
    assert!(proxy.bytes_up() > sent, "the release was never sent");
    proxy.cut_all();
}

/// Waits (bounded) until someone subscribed to the release channel of lock `name` (default
/// prefix), i.e. waits for it.
pub async fn await_waiter(server: &RedisServer, name: &str) {
    let channel = crate::lock_keys(name).channel;
    crate::wait_until_async(
        LEVER_TIMEOUT,
        "a waiter subscribed to the release channel",
        || server.subscribers(&channel) > 0,
    )
    .await;
}

/// Takes and releases a throwaway lock on `locks`, so that its connections are made and its
/// scripts loaded before a fault is injected. Returns the lock's name.
pub async fn warm_up(locks: &lock_runtime::LockClient) -> String {
    let key = crate::unique_key("warm-up");
    let guard = locks
        .lock(&key)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("warm-up acquire: {e}"));
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("warm-up release: {e}"));
    key
}

/// Waits until the calling runtime's own connection to `server` (see `callers.rs`) carries its
/// calls on `locks`, and returns its id and the shared connection's: `(shared, own)`. Call it
/// from a multi-thread runtime, on a server that only `locks` connects to.
///
/// The first call goes over the shared connection and starts making the runtime's own in the
/// background. The server lists that one before its maker hands it over (its handshake is still
/// on the way), so this waits until one of the runtime's calls ran a script over it.
pub async fn callers_connection(
    server: &RedisServer,
    locks: &lock_runtime::LockClient,
) -> (u64, u64) {
    callers_connections(&[server], locks).await[0]
}

/// [`callers_connection`] for every server of `locks` (Redlock's nodes): `(shared, own)` per
/// server, once the runtime's own connection to each carries its calls.
pub async fn callers_connections(
    servers: &[&RedisServer],
    locks: &lock_runtime::LockClient,
) -> Vec<(u64, u64)> {
    const SETTLE: Duration = Duration::from_secs(2);
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        warm_up(locks).await;
        let clients: Vec<_> =
            tokio::task::block_in_place(|| servers.iter().map(|server| server.clients()).collect());
        // Ids grow: the shared connection was made first.
        let pairs: Vec<(u64, u64)> = clients
            .iter()
            .filter_map(|clients| match &clients[..] {
                [(shared, _), (own, cmd)] if shared < own && cmd.starts_with("eval") => {
                    Some((*shared, *own))
                }
                _ => None,
            })
            .collect();
        if pairs.len() == servers.len() {
            return pairs;
        }
        assert!(
            clients.iter().all(|c| c.len() <= 2),
            "only the shared connection and the runtime's: {clients:?}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime's own connections carry its calls: not so after {SETTLE:?}: {clients:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `f()` run on a thread of its own; panics when it takes longer than `limit` (the thread is
/// left behind, blocked): for sync calls that must answer, not hang.
pub fn bounded_blocking<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

/// `CLIENT PAUSE <pause> WRITE` on `server`: it holds every write command (the lock scripts and
/// transactions) until the pause ends, and answers reads meanwhile. Returns when the pause began.
pub fn pause_writes(server: &RedisServer, pause: Duration) -> std::time::Instant {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX))
        .arg("WRITE")
        .query(&mut server.admin())
        .unwrap();
    std::time::Instant::now()
}
