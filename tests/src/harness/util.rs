//! Small helpers shared by the harness and the tests.

#![allow(clippy::expect_used)]

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A port on 127.0.0.1 that was free a moment ago.
///
/// The listener is dropped before returning, so another process can take the port before the caller
/// binds it; [`RedisServer::start`](crate::RedisServer::start) retries on a new port when that happens.
pub fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("local address of a bound listener")
        .port()
}

/// A key no other test (in this or a parallel test process) uses: `prefix:<pid>:<counter>:<nanos>`.
pub fn unique_key(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}:{}:{n}:{nanos}", std::process::id())
}

/// Calls `probe` every `every` until it returns `Some` or `timeout` has passed (then `None`).
/// The probe runs at least once, and once more at the deadline.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(every.min(deadline - now));
    }
}
