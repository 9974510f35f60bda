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
    free_ports(1)[0]
}

/// `n` free ports, distinct: each is held until all are found. Ports found one after the other
/// by [`free_port`] may repeat (each is released before the next is asked for), and a process
/// given one port twice can serve on it in ways it would not on two: an etcd member listening
/// for `http` and `https` on one port serves both, so a plain client reached its TLS port.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .expect("bind 127.0.0.1:0 to find a free port")
        })
        .collect();
    listeners
        .iter()
        .map(|listener| {
            listener
                .local_addr()
                .expect("local address of a bound listener")
                .port()
        })
        .collect()
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

/// The Redis keys of the lock `name` under the default prefix `lock:`, as the runtime lays them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock key itself (holds the owner's token while held).
    pub lock: String,
    /// The fence counter of a server (single node, Sentinel master, each Redlock node): one for
    /// every lock under the prefix.
    pub fence: String,
    /// The fence counter of the lock's hash slot on a Cluster.
    pub slot_fence: String,
    /// The pub/sub channel a release is announced on.
    pub channel: String,
    /// A fair lock's waiters, by arrival.
    pub queue: String,
    /// A fair lock's waiters, by the expiry of their entry's lease.
    pub queue_leases: String,
    /// That someone waits for the lock (set by refused waiters, deleted by the release).
    pub waiting: String,
}

/// The keys of lock `name` with the default prefix (the runtime's own layout, braces escaped:
/// [`lock_runtime::layout::redis_key`]).
pub fn lock_keys(name: &str) -> LockKeys {
    use lock_runtime::layout::{RedisKeyKind, redis_cluster_fence_key, redis_fence_key, redis_key};
    let key = |kind| redis_key("lock:", name, kind);
    LockKeys {
        lock: key(RedisKeyKind::Lock),
        fence: redis_fence_key("lock:"),
        slot_fence: redis_cluster_fence_key("lock:", name),
        channel: key(RedisKeyKind::Released),
        queue: key(RedisKeyKind::Queue),
        queue_leases: key(RedisKeyKind::QueueLeases),
        waiting: key(RedisKeyKind::Waiting),
    }
}

const POLL_EVERY: Duration = Duration::from_millis(2);

/// Checks `cond` every 2ms until it holds and returns how long that took; panics naming `what`
/// once `timeout` has passed. The condition is checked at least once, and once more at the deadline.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    poll_until(timeout, POLL_EVERY, || cond().then_some(()))
        .unwrap_or_else(|| panic!("{what}: not so after {timeout:?}"));
    start.elapsed()
}

/// [`wait_until`] for async code: sleeps on the tokio timer between checks, so other tasks of the
/// calling runtime keep running.
pub async fn wait_until_async(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        if cond() {
            return start.elapsed();
        }
        let now = Instant::now();
        assert!(now < deadline, "{what}: not so after {timeout:?}");
        tokio::time::sleep(POLL_EVERY.min(deadline - now)).await;
    }
}

/// How many waiters queue for `key` (a fair lock's queue), as `inspect` says.
///
/// # Panics
/// If `inspect` fails.
pub async fn queued(client: &lock_runtime::LockClient, key: &str) -> usize {
    client
        .inspect(key)
        .await
        .unwrap_or_else(|e| panic!("inspect {key}: {e}"))
        .map_or(0, |info| info.queued)
}

/// Waits (up to 20 s) until `n` waiters queue for `key`.
///
/// # Panics
/// If they do not, or `inspect` fails.
pub async fn until_queued(client: &lock_runtime::LockClient, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = queued(client, key).await;
        if seen == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{seen} waiters queue for {key}, not {n}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
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

/// Kills `pids` (SIGKILL) and removes `dirs` once this process has exited: for servers shared
/// by a whole test binary behind a `static`, which is never dropped. A `sh` watchdog polls this
/// process every 200ms (for at most 4 hours).
pub(crate) fn reap_after_exit(pids: &[u32], dirs: &[&std::path::Path]) {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let dirs: Vec<String> = dirs
        .iter()
        .map(|d| format!("'{}'", d.display().to_string().replace('\'', "'\\''")))
        .collect();
    let script = format!(
        "i=0; while [ $i -lt 72000 ] && kill -0 {me} 2>/dev/null; do sleep 0.2; i=$((i+1)); done; \
         kill -9 {pids} 2>/dev/null; sleep 0.2; rm -rf {dirs}",
        me = std::process::id(),
        pids = pids.join(" "),
        dirs = dirs.join(" "),
    );
    // Never waited for: it must outlive this process.
    #[allow(clippy::zombie_processes)]
    std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the reaper of shared servers");
}

/// Scheduling slack a timing bound allows on top of what the promise under test gives: a
/// loaded 2-core machine runs servers, proxies and test runtimes side by side.
pub const SCHEDULING_SLACK: Duration = Duration::from_millis(250);

/// How long a lock of `ttl` is valid after its acquire was sent, under the default drift factor:
/// `ttl - (ttl * 0.01 + 2 ms)` (`LockConfig::drift_factor`).
pub fn default_validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

/// Panics unless a lock whose acquire was sent after `asked` and returned at `granted`, and never
/// renewed since, was declared lost at its validity deadline: not before `asked + validity`,
/// and not later than `granted + validity` + [`SCHEDULING_SLACK`] (the renewal driver's timer
/// fires at the deadline itself).
#[track_caller]
pub fn assert_lost_at_the_deadline(
    asked: Instant,
    granted: Instant,
    lost: Instant,
    validity: Duration,
) {
    assert!(
        lost >= asked + validity,
        "lost {:?} after the acquire was sent, before its validity {validity:?} ran out",
        lost - asked
    );
    assert!(
        lost <= granted + validity + SCHEDULING_SLACK,
        "lost {:?} after the grant, past its validity {validity:?} + {SCHEDULING_SLACK:?}",
        lost.saturating_duration_since(granted)
    );
}

/// The longest pause between two tries of a failed call's cleanup release (the engine's
/// backoff: 50 ms doubling up to 1 s): a grant that lands after its call failed is released
/// within this + one request timeout of landing.
pub const CLEANUP_PAUSE: Duration = Duration::from_secs(1);

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client for `config`; panics when the config is invalid.
pub fn client(config: lock_runtime::LockConfig) -> lock_runtime::LockClient {
    lock_runtime::LockClient::new(config).expect("valid lock config")
}

/// The request timeout of a [`quick_client`]: connect 200 ms + response 200 ms.
pub const QUICK_REQUEST: Duration = Duration::from_millis(400);

/// A single-node client of `url` with short timeouts (connect 200 ms + response 200 ms:
/// [`QUICK_REQUEST`]), so a fault is noticed quickly; panics when the config is invalid.
pub fn quick_client(url: impl Into<String>) -> lock_runtime::LockClient {
    client(
        lock_runtime::LockConfig::single(url)
            .connect_timeout(ms(200))
            .response_timeout(ms(200)),
    )
}

/// The request timeout of an [`etcd_client`]: connect 300 ms + response 500 ms.
#[cfg(feature = "etcd")]
pub const ETCD_REQUEST: Duration = Duration::from_millis(800);

/// An etcd client of `endpoints` with connect 300 ms + response 500 ms ([`ETCD_REQUEST`]);
/// panics when the config is invalid.
#[cfg(feature = "etcd")]
pub fn etcd_client(endpoints: Vec<String>) -> lock_runtime::LockClient {
    client(
        lock_runtime::LockConfig::etcd(endpoints)
            .connect_timeout(ms(300))
            .response_timeout(ms(500)),
    )
}

/// The causes an [`Unavailable`](lock_runtime::LockError::Unavailable) error names; panics on any
/// other error.
pub fn unavailable_causes(err: &lock_runtime::LockError) -> &[lock_runtime::NodeFailure] {
    match err {
        lock_runtime::LockError::Unavailable { causes, .. } => causes,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// The field a [`LockError::Config`](lock_runtime::LockError::Config) names; panics on any other
/// outcome.
pub fn config_field<T: std::fmt::Debug>(
    result: Result<T, lock_runtime::LockError>,
) -> &'static str {
    match result {
        Err(lock_runtime::LockError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}
