//! Throughput and latency of `lock-runtime`, side by side with a hand-written `redis` loop (the
//! floor a lock library competes with).
//!
//! ```text
//! cargo run --release -p lock-tests --features bench --bin bench -- [--url redis://HOST:PORT/] [--secs 3]
//!     [--warmup 1] [--tasks 16] [--handoffs 500] [--waiters 8] [--samples 1000]
//!     [--held N] [--only pairs,handoff,memory,redlock,multi,contended,held,topology]
//!     [--impls crate,hosted,multiplexed,foreign] [--no-fencing] [--json]
//! ```
//!
//! With `--json` the tables go to stderr and stdout gets one JSON object: `{"figures": {name:
//! number, ...}}`, the figures behind the tables by name (`pairs.16.ratio`,
//! `contended.fair.handoff_p50_rt`, ...; `null` for one that was not measured).
//!
//! Section 7 includes etcd with the `etcd` feature too: `--features bench,etcd`.
//!
//! Without `--url` it starts its own `redis-server` (and stops it at the end). The Redlock section
//! always starts five local servers of its own, since it freezes one of them. Each section prints
//! when done; a summary line with the ratios against the targets comes last.
//!
//! On a small VM, ping-pong latency depends on how busy the machine is (an idle vCPU takes long to
//! wake), so compare columns of one run, and read the per-pair CPU time and context switches of
//! section 1, which vary much less than the rates.
//!
//! Sections:
//! 1. Uncontended acquire+release pairs/s, 1 task and N tasks on distinct keys: (a) this crate,
//!    (b) `SET key token NX PX 10000` + EVALSHA compare-and-delete on one `MultiplexedConnection`,
//!    (b2) the same loop on one `ConnectionManager` (what the crate uses) whose connection is driven
//!    by a second runtime, as the crate's is by its own (the floor under "connections live on the
//!    library's runtime"), and (a)/(b). Per pair: CPU time of the bench process and context switches.
//! 2. Contended hand-off: `--waiters` tasks wait on one key while one more holds it. The holder takes
//!    `Instant::now()` right before calling `release()`; the waiter that gets the lock next takes
//!    `Instant::now()` when its `acquire()` returns; hand-off = the difference. The releaser queues up
//!    again only once another task took the lock, so every sample is a hand-off to a waiter (no
//!    barging), with exactly `--waiters` tasks waiting. Async API and blocking API (OS threads).
//! 3. In-memory backend, uncontended pairs/s, 1 task.
//! 4. Sequential latency of one acquire+release pair: raw redis on 1 node, this crate on 1 node, on
//!    5 Redlock nodes, and on 5 nodes with one frozen (SIGSTOP).
//! 5. Multi-key locks and reentrancy: uncontended pairs/s, 1 task and N tasks, of a one-key lock, a
//!    two-key lock with both keys in one slot (`{t}:a`, `{t}:b`), a two-key lock across slots, and two
//!    one-key locks taken in order (released in reverse), in the same run. Then the latency of a
//!    nested call that joins a held lock (reentrancy), and how many script calls the server ran for
//!    all of them (target: none), on a server of its own.
//! 6. Only with `--only held` (it takes about half a minute): `--held` locks (100,000) taken by one
//!    client with ttl 30 s, held for two renewal rounds, released: how long taking and releasing
//!    them took, client memory per held lock (RSS), and the CPU renewal costs the client and
//!    redis-server while they are held, as a share of one core. Nothing may be lost.
//! 7. Only with `--only topology`: the same client on one node, on Redlock over three masters, on a
//!    Redis Cluster (3 masters + 3 replicas, started here), on a Sentinel set (master, replica, 3
//!    sentinels, started here), on both with `min_replicas(1)`, and with the `etcd` feature on etcd
//!    with one and with three members (started here), in one run: uncontended pairs/s with 1 task
//!    and `--tasks` tasks, and the async hand-off of section 2.
//! 8. Contended, one key: `--waiters` clients (each its own `LockClient`, so its own connections)
//!    loop acquire -> release with nothing in between for `--secs` after `--warmup`, with the
//!    default lock and with `fair = true`, in the same run: critical sections/s, hand-off (one
//!    release's `Instant` before `release()` -> the next grant's after `acquire()` returned) p50 /
//!    p99 also in round trips (a `PING`'s p50 on the same server), the share of grants that went to
//!    another client, Jain's index of the grants per client, and how long an `acquire` waited
//!    (p99).

mod opts;

use std::error::Error;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use clap::Parser as _;
use lock_runtime::{LockClient, LockConfig};
use lock_tests::history::now_ns;
use lock_tests::sections::{self, Kind, Section};
use lock_tests::{RedisMasters, RedisServer, unique_key};
use redis::AsyncCommands as _;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{ExistenceCheck, Script, SetExpiry, SetOptions};

use crate::opts::Opts;

type BoxError = Box<dyn Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;
/// How long a waiter may wait for the lock (and a releaser for its hand-off) before the bench fails.
const WAIT: Duration = Duration::from_secs(30);
/// Hand-offs and Redlock pairs discarded before sampling.
const WARM_SAMPLES: usize = 50;

/// The floor's release: compare-and-delete.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

fn main() -> Res<()> {
    let opts = Opts::parse();
    JSON.store(opts.json, Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let load_start = loadavg();
    let mut out = String::new();
    let mut summary = Vec::new();

    let own_server = opts.url.is_none().then(RedisServer::start);
    let url = match (&opts.url, &own_server) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => return Err("no redis url".into()),
    };
    let _ = writeln!(
        out,
        "lock-runtime bench: redis at {url} ({}), {:.1}s per throughput run after {:.1}s warm-up, fencing {}",
        if own_server.is_some() {
            "own server"
        } else {
            "--url"
        },
        opts.secs.as_secs_f64(),
        opts.warmup.as_secs_f64(),
        if opts.fencing() {
            "default (single node on, Redlock off)"
        } else {
            "off"
        },
    );
    let _ = writeln!(out, "load average at start: {load_start}");
    flush(&mut out);

    if opts.runs("pairs") {
        let _ = SERVER.set(url.clone());
        // Stands in for the library's runtime: drives (b2)'s connection.
        let foreign = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-foreign")
            .enable_all()
            .build()?;
        let section = section_pairs(&opts, &url, foreign.handle(), &mut out, &mut summary);
        runtime.block_on(section)?;
        flush(&mut out);
    }
    if opts.runs("handoff") {
        runtime.block_on(section_handoff(&opts, &url, &mut out, &mut summary))?;
        flush(&mut out);
    }
    if opts.runs("memory") {
        runtime.block_on(section_memory(&opts, &mut out))?;
        flush(&mut out);
    }
    if opts.runs("multi") {
        runtime.block_on(section_multi(&opts, &url, &mut out, &mut summary))?;
        flush(&mut out);
    }
    if opts.runs("contended") {
        runtime.block_on(section_contended(&opts, &url, &mut out, &mut summary))?;
        flush(&mut out);
    }
    if opts.named("held") {
        runtime.block_on(section_held(&opts, &url, &mut out))?;
        flush(&mut out);
    }
    if opts.named("topology") {
        runtime.block_on(section_topology(&opts, &url, &mut out, &mut summary))?;
        flush(&mut out);
    }
    drop(own_server);
    if opts.runs("redlock") {
        section_redlock(&opts, &runtime, &mut out, &mut summary)?;
        flush(&mut out);
    }

    let _ = writeln!(out, "\nload average at end: {}", loadavg());
    let _ = writeln!(out, "\nSUMMARY: {}", summary.join("; "));
    flush(&mut out);
    if opts.json {
        println!("{}", figures_json());
    }
    Ok(())
}

/// Whether the tables go to stderr (`--json`).
static JSON: AtomicBool = AtomicBool::new(false);
/// The figures behind the tables, by name, in the order measured.
static FIGURES: Mutex<Vec<(String, f64)>> = Mutex::new(Vec::new());

/// Records a figure for `--json`.
fn figure(name: impl Into<String>, value: f64) {
    lock(&FIGURES).push((name.into(), value));
}

/// `{"figures": {...}}`: names are plain ASCII, numbers never use an exponent in Rust's
/// `Display`, and a figure that was not measured (NaN) is `null`.
fn figures_json() -> String {
    let fields: Vec<String> = lock(&FIGURES)
        .iter()
        .map(|(name, value)| {
            if value.is_finite() {
                format!("\"{name}\": {value}")
            } else {
                format!("\"{name}\": null")
            }
        })
        .collect();
    format!("{{\"figures\": {{{}}}}}", fields.join(", "))
}

// ---------------------------------------------------------------------------------------------
// 1. Uncontended pairs/s

/// One implementation of "acquire then release an uncontended lock".
#[derive(Clone)]
enum Locker {
    Crate(LockClient),
    /// Two keys derived from the task's key (section 5).
    Two(LockClient, TwoKeys),
    Multiplexed(MultiplexedConnection, Arc<Script>),
    Manager(ConnectionManager, Arc<Script>),
    /// The raw loop fanned out to independent nodes: done once a majority answered each step.
    Quorum(Vec<MultiplexedConnection>, Arc<Script>),
}

impl Locker {
    /// Whether this locker makes its own tokens (the crate does; the hand-written loops take the
    /// one they are given).
    fn makes_tokens(&self) -> bool {
        matches!(self, Locker::Crate(_) | Locker::Two(..))
    }

    async fn pair(&mut self, key: &str, token: &str) -> Res<()> {
        match self {
            Locker::Crate(client) => {
                let guard = client.lock(key).ttl(TTL).acquire().await?;
                guard.release().await?;
                Ok(())
            }
            Locker::Two(client, shape) => shape.pair(client, key).await,
            Locker::Multiplexed(conn, script) => raw_pair(conn, script, key, token).await,
            Locker::Manager(conn, script) => raw_pair(conn, script, key, token).await,
            Locker::Quorum(conns, script) => {
                let need = conns.len() / 2 + 1;
                let acquires = conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    async move { raw_set(&mut conn, key, token).await }
                });
                first_n(acquires.collect(), need).await?;
                let script: &Script = script;
                let releases = conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    async move { raw_release(&mut conn, script, key, token).await }
                });
                first_n(releases.collect(), need).await
            }
        }
    }
}

async fn raw_pair<C>(conn: &mut C, release: &Script, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    raw_set(conn, key, token).await?;
    raw_release(conn, release, key, token).await
}

/// `SET key token NX PX 10000`.
async fn raw_set<C>(conn: &mut C, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let options = SetOptions::default()
        .conditional_set(ExistenceCheck::NX)
        .with_expiration(SetExpiry::PX(TTL_MS));
    let set: Option<String> = conn.set_options(key, token, options).await?;
    if set.is_none() {
        return Err(format!("raw: {key} unexpectedly held").into());
    }
    Ok(())
}

/// EVALSHA of the compare-and-delete script.
async fn raw_release<C>(conn: &mut C, release: &Script, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let deleted: i64 = release.key(key).arg(token).invoke_async(conn).await?;
    if deleted != 1 {
        return Err(format!("raw: {key} was not ours at release").into());
    }
    Ok(())
}

/// Runs `tasks` loops of pairs on distinct keys for warm-up + `secs`; pairs/s over the measured part.
async fn pairs_per_sec(locker: &Locker, tasks: usize, opts: &Opts) -> Res<Rate> {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let base = unique_key("bench:pairs");
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (mut locker, count, stop) = (locker.clone(), Arc::clone(&count), Arc::clone(&stop));
        let key = format!("{base}:{t}");
        handles.push(tokio::spawn(async move {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                // A fresh token per acquisition, as a real lock needs (cheap: no randomness). The
                // crate makes its own: it is not charged for formatting one it ignores.
                let token = if locker.makes_tokens() {
                    String::new()
                } else {
                    format!("{t:08x}{n:024x}")
                };
                locker.pair(&key, &token).await?;
                count.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(opts.warmup).await;
    let (c0, t0, u0, s0) = (
        count.load(Ordering::Relaxed),
        Instant::now(),
        Usage::now(),
        server_cpu(),
    );
    tokio::time::sleep(opts.secs).await;
    let (c1, t1, u1, s1) = (
        count.load(Ordering::Relaxed),
        Instant::now(),
        Usage::now(),
        server_cpu(),
    );
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await??;
    }
    let pairs = (c1 - c0).max(1) as f64;
    Ok(Rate {
        per_sec: pairs / (t1 - t0).as_secs_f64(),
        cpu_us: (u1.cpu - u0.cpu) * 1e6 / pairs,
        switches: (u1.switches - u0.switches) as f64 / pairs,
        server_us: (s1 - s0) * 1e6 / pairs,
    })
}

/// Pairs per second, and what one pair cost this process (all threads) and the redis-server.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_sec: f64,
    cpu_us: f64,
    switches: f64,
    /// CPU time of the redis-server (`INFO cpu`, all its threads) per pair; NaN without a server.
    server_us: f64,
}

impl Rate {
    const SKIPPED: Rate = Rate {
        per_sec: f64::NAN,
        cpu_us: f64::NAN,
        switches: f64::NAN,
        server_us: f64::NAN,
    };

    fn cost(&self) -> String {
        if self.server_us.is_nan() {
            format!("{:.0}us {:.1}cs", self.cpu_us, self.switches)
        } else {
            format!(
                "{:.0}us {:.1}cs srv {:.1}us",
                self.cpu_us, self.switches, self.server_us
            )
        }
    }
}

/// The redis-server whose CPU time section 1 charges to each pair (its URL), once known.
static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// CPU seconds (user + system, all threads) the redis-server at [`SERVER`] has used, from
/// `INFO cpu`; NaN when there is none or it does not answer.
fn server_cpu() -> f64 {
    let Some(url) = SERVER.get() else {
        return f64::NAN;
    };
    let info = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg("cpu").query::<String>(&mut c));
    let Ok(info) = info else {
        return f64::NAN;
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    field("used_cpu_sys") + field("used_cpu_user")
}

/// CPU time (user + system, seconds) and context switches of this process so far, from `/proc`
/// (zero where unavailable). The CPU clock ticks at 100 Hz, fine over a run of seconds.
#[derive(Debug, Clone, Copy)]
struct Usage {
    cpu: f64,
    switches: u64,
}

impl Usage {
    fn now() -> Usage {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
        let mut switches = 0;
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let status =
                    std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                switches += status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum::<u64>();
            }
        }
        Usage { cpu, switches }
    }
}

async fn section_pairs(
    opts: &Opts,
    url: &str,
    foreign: &tokio::runtime::Handle,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let redis = redis::Client::open(url)?;
    let script = Arc::new(Script::new(RELEASE_LUA));
    let multiplexed = Locker::Multiplexed(
        redis.get_multiplexed_async_connection().await?,
        Arc::clone(&script),
    );
    // Made on the foreign runtime, so its connection task and reconnects run there.
    let manager = foreign.spawn(ConnectionManager::new(redis)).await??;
    let manager = Locker::Manager(manager, script);
    let ours = Locker::Crate(client);
    // The same crate, hosted on the bench's own runtime (`LockConfig::runtime`): no hop.
    let hosted = Locker::Crate(LockClient::new(
        opts.config(LockConfig::single(url))
            .runtime(tokio::runtime::Handle::current()),
    )?);

    let _ = writeln!(
        out,
        "\n1. Uncontended acquire+release, pairs/s (each task its own key, ttl 10s)"
    );
    let _ = writeln!(
        out,
        "   {:>5}  {:>16}  {:>16}  {:>16}  {:>16}  {:>7}  {:>7}",
        "tasks",
        "(a) lock-runtime",
        "(a2) on caller rt",
        "(b) raw, 1 conn",
        "(b2) raw, foreign",
        "(a)/(b)",
        "(a2)/(b)"
    );
    let mut ratios = Vec::new();
    let mut costs = Vec::new();
    for tasks in [1, opts.tasks] {
        let rate = async |name: &str, locker: &Locker| -> Res<Rate> {
            if opts.runs_impl(name) {
                pairs_per_sec(locker, tasks, opts).await
            } else {
                Ok(Rate::SKIPPED)
            }
        };
        let a = rate("crate", &ours).await?;
        let a2 = rate("hosted", &hosted).await?;
        let b = rate("multiplexed", &multiplexed).await?;
        let b2 = rate("foreign", &manager).await?;
        let ratio = a.per_sec / b.per_sec;
        let ratio2 = a2.per_sec / b.per_sec;
        for (name, r) in [
            ("crate", a),
            ("hosted", a2),
            ("raw", b),
            ("raw_foreign", b2),
        ] {
            figure(format!("pairs.{tasks}.{name}.per_sec"), r.per_sec);
            figure(format!("pairs.{tasks}.{name}.cpu_us"), r.cpu_us);
            figure(format!("pairs.{tasks}.{name}.server_cpu_us"), r.server_us);
        }
        figure(format!("pairs.{tasks}.ratio"), ratio);
        figure(format!("pairs.{tasks}.ratio_hosted"), ratio2);
        let _ = writeln!(
            out,
            "   {tasks:>5}  {:>16.0}  {:>16.0}  {:>16.0}  {:>16.0}  {ratio:>6.2}x  {ratio2:>6.2}x",
            a.per_sec, a2.per_sec, b.per_sec, b2.per_sec
        );
        costs.push(format!(
            "   {tasks:>5}  {:>16}  {:>16}  {:>16}  {:>16}",
            a.cost(),
            a2.cost(),
            b.cost(),
            b2.cost()
        ));
        ratios.push(format!(
            "{tasks} task(s) {ratio:.2}x (on the caller's runtime {ratio2:.2}x)"
        ));
    }
    let _ = writeln!(
        out,
        "   cost per pair in the bench process (CPU time of all its threads, context switches; srv: redis-server CPU):"
    );
    for line in costs {
        let _ = writeln!(out, "{line}");
    }
    summary.push(format!(
        "uncontended (a)/(b): {} (target >= 0.80x)",
        ratios.join(", ")
    ));
    Ok(())
}

/// Resolves once `need` of `futures` succeeded (dropping the rest), or fails when that became
/// impossible. A minimal `FuturesUnordered` with early exit, enough for five nodes.
async fn first_n<F>(futures: Vec<F>, need: usize) -> Res<()>
where
    F: Future<Output = Res<()>>,
{
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let (mut ok, mut failed) = (0, 0);
    let total = pending.len();
    std::future::poll_fn(|cx| {
        for slot in &mut pending {
            let Some(future) = slot else { continue };
            if let Poll::Ready(result) = future.as_mut().poll(cx) {
                *slot = None;
                match result {
                    Ok(()) => ok += 1,
                    Err(_) => failed += 1,
                }
            }
        }
        if ok >= need {
            Poll::Ready(Ok(()))
        } else if total - failed < need {
            Poll::Ready(Err("raw: no quorum".into()))
        } else {
            Poll::Pending
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// 2. Contended hand-off

/// Shared state of one hand-off run: who released last and when, and how many hand-offs happened.
struct Handoffs {
    /// (releasing task, `Instant` taken right before it called release).
    released: Mutex<Option<(usize, Instant)>>,
    samples: Mutex<Vec<Duration>>,
    /// Number of acquisitions so far; a releaser waits for it to move before queueing up again.
    grants: Mutex<u64>,
    granted: Condvar,
    grants_async: tokio::sync::watch::Sender<u64>,
    done: AtomicBool,
    wanted: usize,
}

impl Handoffs {
    fn new(wanted: usize) -> Arc<Self> {
        Arc::new(Handoffs {
            released: Mutex::new(None),
            samples: Mutex::new(Vec::with_capacity(wanted + WARM_SAMPLES)),
            grants: Mutex::new(0),
            granted: Condvar::new(),
            grants_async: tokio::sync::watch::Sender::new(0),
            done: AtomicBool::new(false),
            wanted: wanted + WARM_SAMPLES,
        })
    }

    /// Called by task `me` right after its acquire returned at `got`. Returns the grant number and
    /// whether the run is complete (the caller then releases and stops).
    fn acquired(&self, me: usize, got: Instant) -> Res<(u64, bool)> {
        let previous = lock(&self.released).take();
        let mut samples = lock(&self.samples);
        if let Some((from, at)) = previous {
            if from == me {
                return Err("hand-off to the releasing task itself".into());
            }
            samples.push(got - at);
        }
        let finished = samples.len() >= self.wanted;
        drop(samples);
        if finished {
            self.done.store(true, Ordering::SeqCst);
        }
        let grant = {
            let mut grants = lock(&self.grants);
            *grants += 1;
            *grants
        };
        self.granted.notify_all();
        self.grants_async.send_replace(grant);
        Ok((grant, finished || self.done.load(Ordering::SeqCst)))
    }

    /// Stamps the release: the last thing before calling `release()`.
    fn releasing(&self, me: usize) {
        *lock(&self.released) = Some((me, Instant::now()));
    }

    fn wait_next_grant_blocking(&self, grant: u64) -> Res<()> {
        let grants = lock(&self.grants);
        let (_grants, timeout) = self
            .granted
            .wait_timeout_while(grants, WAIT, |n| *n <= grant)
            .unwrap_or_else(PoisonError::into_inner);
        if timeout.timed_out() {
            return Err("nobody took the lock after a release".into());
        }
        Ok(())
    }

    async fn wait_next_grant(&self, grant: u64) -> Res<()> {
        let mut rx = self.grants_async.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|n| *n > grant))
            .await
            .map_err(|_| "nobody took the lock after a release")??;
        Ok(())
    }

    /// The measured samples (after the warm-up ones).
    fn into_samples(self: Arc<Self>) -> Vec<Duration> {
        let mut samples = std::mem::take(&mut *lock(&self.samples));
        samples.drain(..WARM_SAMPLES.min(samples.len()));
        samples
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn handoff_async(client: &LockClient, opts: &Opts) -> Res<Vec<Duration>> {
    let key = unique_key("bench:handoff");
    let state = Handoffs::new(opts.handoffs);
    let mut handles = Vec::new();
    // One holder plus `waiters` waiting at every hand-off.
    for me in 0..=opts.waiters {
        let (client, key, state) = (client.clone(), key.clone(), Arc::clone(&state));
        handles.push(tokio::spawn(async move {
            loop {
                let guard = client.lock(&key).ttl(TTL).wait(WAIT).acquire().await?;
                let (grant, finished) = state.acquired(me, Instant::now())?;
                state.releasing(me);
                guard.release().await?;
                if finished {
                    return Ok::<_, BoxError>(());
                }
                state.wait_next_grant(grant).await?;
            }
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(state.into_samples())
}

fn handoff_blocking(client: &LockClient, opts: &Opts) -> Res<Vec<Duration>> {
    let key = unique_key("bench:handoff-sync");
    let state = Handoffs::new(opts.handoffs);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..=opts.waiters)
            .map(|me| {
                let (client, key, state) = (client.clone(), key.clone(), Arc::clone(&state));
                scope.spawn(move || -> Res<()> {
                    loop {
                        let guard = client.lock(&key).ttl(TTL).wait(WAIT).acquire_blocking()?;
                        let (grant, finished) = state.acquired(me, Instant::now())?;
                        state.releasing(me);
                        guard.release_blocking()?;
                        if finished {
                            return Ok(());
                        }
                        state.wait_next_grant_blocking(grant)?;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok::<_, BoxError>(())
    })?;
    Ok(state.into_samples())
}

async fn section_handoff(
    opts: &Opts,
    url: &str,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let _ = writeln!(
        out,
        "\n2. Contended hand-off, {} waiters + 1 holder on one key \
         (holder's Instant before release() -> next waiter's acquire returns)",
        opts.waiters
    );
    let _ = writeln!(out, "   {}", Stats::header("api"));
    let samples = handoff_async(&client, opts).await?;
    let stats = Stats::of(samples);
    let _ = writeln!(out, "   {}", stats.row("async (tasks)"));
    summary.push(format!(
        "hand-off p50 {} / p99 {} (target p50 <= 1 ms)",
        ms(stats.p50),
        ms(stats.p99)
    ));
    figure("handoff.async.p50_ms", millis(stats.p50));
    figure("handoff.async.p99_ms", millis(stats.p99));
    // The threads block on `acquire_blocking`; keep them off this runtime's workers.
    let blocking = tokio::task::block_in_place(|| handoff_blocking(&client, opts))?;
    let stats = Stats::of(blocking);
    let _ = writeln!(out, "   {}", stats.row("blocking (threads)"));
    summary.push(format!("blocking hand-off p50 {}", ms(stats.p50)));
    figure("handoff.blocking.p50_ms", millis(stats.p50));
    figure("handoff.blocking.p99_ms", millis(stats.p99));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 8. Contended, one key: default vs fair

async fn section_contended(
    opts: &Opts,
    url: &str,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut pings = Vec::with_capacity(opts.samples);
    for _ in 0..opts.samples {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        pings.push(started.elapsed());
    }
    let rtt = Stats::of(pings).p50;
    let _ = writeln!(
        out,
        "\n8. Contended, one key, {} clients looping acquire -> release (round trip: PING p50 {})",
        opts.waiters,
        ms(rtt)
    );
    let _ = writeln!(
        out,
        "   {:<14}  {:>10}  {:>18}  {:>18}  {:>13}  {:>6}  {:>10}",
        "lock", "sections/s", "hand-off p50", "hand-off p99", "owner changes", "Jain", "wait p99"
    );
    let masters = RedisMasters::start(3);
    let redlock = LockConfig::redlock(masters.urls()).fencing(true);
    let setups = [
        ("default", "default", LockConfig::single(url), false),
        ("fair = true", "fair", LockConfig::single(url), true),
        ("Redlock(3)", "redlock3", redlock.clone(), false),
        ("Redlock(3) fair", "redlock3_fair", redlock, true),
    ];
    figure("contended.ping_p50_ms", millis(rtt));
    for (name, id, config, fair) in setups {
        let run = contended(opts, &config, fair).await?;
        let rate = run.len() as f64 / opts.secs.as_secs_f64();
        let (changes, pairs) = sections::owner_changes(&run);
        let changed = changes as f64 / pairs.max(1) as f64;
        let jain = sections::jain(sections::per_holder(&run).into_values());
        let mut by_grant: Vec<&Section> = run.iter().collect();
        by_grant.sort_by_key(|s| s.acquired_ns);
        let gaps = Stats::of(
            by_grant
                .windows(2)
                .map(|w| Duration::from_nanos(w[1].acquired_ns.saturating_sub(w[0].released_ns)))
                .collect(),
        );
        let waits = Stats::of(
            run.iter()
                .map(|s| Duration::from_nanos(s.waited_ns()))
                .collect(),
        );
        let trips = |d: Duration| d.as_secs_f64() / rtt.as_secs_f64().max(1e-9);
        let _ = writeln!(
            out,
            "   {name:<14}  {rate:>10.0}  {:>9} ({:>4.1} RT)  {:>9} ({:>4.1} RT)  {:>12.1}%  {jain:>6.3}  {:>10}",
            ms(gaps.p50),
            trips(gaps.p50),
            ms(gaps.p99),
            trips(gaps.p99),
            changed * 100.0,
            ms(waits.p99),
        );
        for (what, value) in [
            ("sections_per_sec", rate),
            ("handoff_p50_ms", millis(gaps.p50)),
            ("handoff_p99_ms", millis(gaps.p99)),
            ("handoff_p50_rt", trips(gaps.p50)),
            ("owner_changes", changed),
            ("jain", jain),
            ("wait_p99_ms", millis(waits.p99)),
        ] {
            figure(format!("contended.{id}.{what}"), value);
        }
        summary.push(format!(
            "contended {name}: {rate:.0} sections/s, hand-off p50 {:.1} RT, owner changes {:.1}%{}",
            trips(gaps.p50),
            changed * 100.0,
            if fair {
                " (target p50 <= 2 RT, 100%)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// The sections granted in the measured window.
async fn contended(opts: &Opts, config: &LockConfig, fair: bool) -> Res<Vec<Section>> {
    let key = unique_key("bench:contended");
    let measure_from = now_ns() + u64::try_from(opts.warmup.as_nanos())?;
    let stop = measure_from + u64::try_from(opts.secs.as_nanos())?;
    let mut handles = Vec::new();
    for me in 0..opts.waiters {
        let client = LockClient::new(opts.config(config.clone()))?;
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let mut own = Vec::new();
            loop {
                let asked_ns = now_ns();
                if asked_ns >= stop {
                    break;
                }
                let guard = client
                    .lock(&key)
                    .ttl(TTL)
                    .wait(WAIT)
                    .fair(fair)
                    .acquire()
                    .await?;
                let acquired_ns = now_ns();
                let released_ns = now_ns();
                guard.release().await?;
                if acquired_ns >= measure_from && released_ns < stop {
                    own.push(Section {
                        who: me.to_string(),
                        kind: if fair { Kind::Fair } else { Kind::Exclusive },
                        fence: 0,
                        asked_ns,
                        acquired_ns,
                        released_ns,
                    });
                }
            }
            client.shutdown();
            Ok::<_, BoxError>(own)
        }));
    }
    let mut sections = Vec::new();
    for handle in handles {
        sections.extend(handle.await??);
    }
    Ok(sections)
}

// ---------------------------------------------------------------------------------------------
// 7. Backends and topologies

async fn section_topology(
    opts: &Opts,
    url: &str,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let (cluster, sentinels, masters) = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let sentinels = scope.spawn(lock_tests::SentinelSet::start);
            let masters = scope.spawn(|| RedisMasters::start(3));
            let cluster = lock_tests::RedisCluster::start();
            (cluster, sentinels.join(), masters.join())
        })
    });
    let sentinels = sentinels.map_err(|_| "the sentinel set did not start")?;
    let masters = masters.map_err(|_| "the Redlock masters did not start")?;
    let sentinel = || {
        LockConfig::sentinel(
            lock_tests::SentinelSet::MASTER_NAME,
            sentinels.sentinel_urls(),
        )
    };
    #[allow(unused_mut, reason = "etcd joins with its feature")]
    let mut setups = vec![
        ("single node", LockConfig::single(url)),
        ("redlock, 3 masters", LockConfig::redlock(masters.urls())),
        ("cluster", LockConfig::cluster(cluster.urls())),
        (
            "cluster min_replicas(1)",
            LockConfig::cluster(cluster.urls()).min_replicas(1),
        ),
        ("sentinel", sentinel()),
        ("sentinel min_replicas(1)", sentinel().min_replicas(1)),
    ];
    #[cfg(feature = "etcd")]
    let etcd = tokio::task::block_in_place(|| {
        (
            lock_tests::EtcdCluster::start(1),
            lock_tests::EtcdCluster::start(3),
        )
    });
    #[cfg(feature = "etcd")]
    {
        setups.push(("etcd, 1 member", LockConfig::etcd(etcd.0.endpoints())));
        setups.push(("etcd, 3 members", LockConfig::etcd(etcd.1.endpoints())));
    }
    let _ = writeln!(
        out,
        "\n7. Backends and topologies, same run: uncontended pairs/s (1 task, {} tasks on distinct \
         keys) and async hand-off ({} waiters)",
        opts.tasks, opts.waiters
    );
    let _ = writeln!(
        out,
        "   {:<26} {:>10} {:>10} {:>10} {:>10}",
        "setup", "U1/s", "U16/s", "hand p50", "hand p99"
    );
    for (name, config) in setups {
        let client = LockClient::new(opts.config(config))?;
        let locker = Locker::Crate(client.clone());
        let one = pairs_per_sec(&locker, 1, opts).await?;
        let many = pairs_per_sec(&locker, opts.tasks, opts).await?;
        let hand = Stats::of(handoff_async(&client, opts).await?);
        let _ = writeln!(
            out,
            "   {name:<26} {:>10.0} {:>10.0} {:>10} {:>10}",
            one.per_sec,
            many.per_sec,
            ms(hand.p50),
            ms(hand.p99)
        );
        summary.push(format!(
            "{name}: U1 {:.0}/s U{} {:.0}/s hand-off p50 {} p99 {}",
            one.per_sec,
            opts.tasks,
            many.per_sec,
            ms(hand.p50),
            ms(hand.p99)
        ));
        flush(out);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. In-memory backend

async fn section_memory(opts: &Opts, out: &mut String) -> Res<()> {
    let client = LockClient::new(opts.config(LockConfig::in_memory()))?;
    let rate = pairs_per_sec(&Locker::Crate(client), 1, opts).await?;
    figure("memory.1.per_sec", rate.per_sec);
    figure("memory.1.cpu_us", rate.cpu_us);
    let _ = writeln!(
        out,
        "\n3. In-memory backend, uncontended acquire+release, 1 task: {:.0} pairs/s ({} per pair)",
        rate.per_sec,
        rate.cost()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. Many locks held at once

/// How long section 6 holds its locks: two renewal rounds at ttl/3.
const HELD_TTL: Duration = Duration::from_secs(30);
const HELD_FOR: Duration = Duration::from_secs(21);
/// Tasks taking (and releasing) section 6's locks.
const HELD_TASKS: usize = 64;

/// `--held` locks (ttl 30 s) taken by one client, held for 21 s (two renewal rounds), released.
async fn section_held(opts: &Opts, url: &str, out: &mut String) -> Res<()> {
    let _ = SERVER.set(url.to_owned());
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let warm = client.lock(unique_key("bench:held-warm")).acquire().await?;
    warm.release().await?;
    let base = unique_key("bench:held");
    let rss0 = rss_bytes();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(HELD_TASKS);
    for t in 0..HELD_TASKS {
        let (client, base, n) = (client.clone(), base.clone(), opts.held);
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::with_capacity(n / HELD_TASKS + 1);
            for i in (t..n).step_by(HELD_TASKS) {
                guards.push(
                    client
                        .lock(format!("{base}:{i}"))
                        .ttl(HELD_TTL)
                        .acquire()
                        .await?,
                );
            }
            Ok::<_, BoxError>(guards)
        }));
    }
    let mut guards = Vec::with_capacity(opts.held);
    for task in tasks {
        guards.extend(task.await??);
    }
    let took = started.elapsed();
    let rss1 = rss_bytes();
    let (u0, s0) = (Usage::now(), server_cpu());
    tokio::time::sleep(HELD_FOR).await;
    let (u1, s1) = (Usage::now(), server_cpu());
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(HELD_TASKS);
    let per_task = guards.len().div_ceil(HELD_TASKS);
    while !guards.is_empty() {
        let chunk: Vec<_> = guards.drain(..per_task.min(guards.len())).collect();
        tasks.push(tokio::spawn(async move {
            for guard in chunk {
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let released = started.elapsed();
    let held = opts.held as f64;
    let share = |cpu: f64| cpu / HELD_FOR.as_secs_f64() * 100.0;
    let _ = writeln!(
        out,
        "\n6. {} locks held by one client (ttl {:?}, {HELD_TASKS} tasks), held {:?}:\n   \
         acquired in {:.2}s ({:.0}/s); client memory {:.0} bytes per held lock; while held: \
         client CPU {:.1}% of one core, redis-server {:.1}%; lost: {lost}; released in {:.2}s ({:.0}/s)",
        opts.held,
        HELD_TTL,
        HELD_FOR,
        took.as_secs_f64(),
        held / took.as_secs_f64(),
        rss1.saturating_sub(rss0) as f64 / held,
        share(u1.cpu - u0.cpu),
        share(s1 - s0),
        released.as_secs_f64(),
        held / released.as_secs_f64(),
    );
    Ok(())
}

/// Resident set size of this process (`VmRSS`), 0 where unavailable.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

// ---------------------------------------------------------------------------------------------
// 5. Multi-key locks and reentrancy

/// How section 5 locks two keys.
#[derive(Debug, Clone, Copy)]
enum TwoKeys {
    /// One lock over `{key}:a` and `{key}:b` (one hash slot).
    SameSlot,
    /// One lock over `key:a` and `key:b` (almost always two slots).
    CrossSlot,
    /// Two one-key locks, `key:a` then `key:b`, released in reverse order.
    InOrder,
}

impl TwoKeys {
    async fn pair(self, client: &LockClient, key: &str) -> Res<()> {
        match self {
            TwoKeys::SameSlot | TwoKeys::CrossSlot => {
                let keys = if matches!(self, TwoKeys::SameSlot) {
                    [format!("{{{key}}}:a"), format!("{{{key}}}:b")]
                } else {
                    [format!("{key}:a"), format!("{key}:b")]
                };
                let guard = client.lock_many(keys).ttl(TTL).acquire().await?;
                guard.release().await?;
            }
            TwoKeys::InOrder => {
                let first = client.lock(format!("{key}:a")).ttl(TTL).acquire().await?;
                let second = client.lock(format!("{key}:b")).ttl(TTL).acquire().await?;
                second.release().await?;
                first.release().await?;
            }
        }
        Ok(())
    }
}

async fn section_multi(
    opts: &Opts,
    url: &str,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let lockers = [
        Locker::Crate(client.clone()),
        Locker::Two(client.clone(), TwoKeys::SameSlot),
        Locker::Two(client.clone(), TwoKeys::CrossSlot),
        Locker::Two(client, TwoKeys::InOrder),
    ];
    let _ = writeln!(
        out,
        "\n5. Multi-key locks, uncontended acquire+release pairs/s (each task its own keys, ttl 10s)"
    );
    let _ = writeln!(
        out,
        "   {:>5}  {:>12}  {:>14}  {:>15}  {:>15}  {:>11}  {:>11}",
        "tasks",
        "one key",
        "two, one slot",
        "two, two slots",
        "two one-key",
        "cost 1slot",
        "cost 2slots"
    );
    let mut costs = Vec::new();
    for tasks in [1, opts.tasks] {
        let mut rates = Vec::with_capacity(lockers.len());
        for locker in &lockers {
            rates.push(pairs_per_sec(locker, tasks, opts).await?.per_sec);
        }
        // Cost relative to a one-key lock: how much longer one two-key pair takes.
        let (same, cross) = (rates[0] / rates[1], rates[0] / rates[2]);
        for (name, rate) in [
            "one_key",
            "two_keys_one_slot",
            "two_keys_two_slots",
            "two_locks",
        ]
        .iter()
        .zip(&rates)
        {
            figure(format!("multi.{tasks}.{name}.per_sec"), *rate);
        }
        let _ = writeln!(
            out,
            "   {tasks:>5}  {:>12.0}  {:>14.0}  {:>15.0}  {:>15.0}  {same:>10.2}x  {cross:>10.2}x",
            rates[0], rates[1], rates[2], rates[3]
        );
        costs.push(format!(
            "{tasks} task(s) {same:.2}x (two slots {cross:.2}x, two one-key locks {:.2}x)",
            rates[0] / rates[3]
        ));
    }
    summary.push(format!(
        "two-key lock in one slot costs {} a one-key lock (target <= 1.10x)",
        costs.join(", ")
    ));

    // Reentrancy on a server of its own, so that its command counts are this section's alone.
    let server = RedisServer::start();
    let client = LockClient::new(opts.config(LockConfig::single(server.url())))?;
    let key = unique_key("bench:reentrant");
    let samples = opts.samples;
    let count_scripts = move || {
        tokio::task::block_in_place(|| {
            ["evalsha", "eval", "fcall"]
                .iter()
                .map(|command| server.command_calls(command))
                .sum::<u64>()
        })
    };
    let (nested, client_inner, key_inner) = (samples, client.clone(), key.clone());
    let (latencies, scripts) = client
        .lock(&key)
        .ttl(TTL)
        .run(async move {
            let before = count_scripts();
            let mut latencies = Vec::with_capacity(nested);
            for _ in 0..nested {
                let start = Instant::now();
                let inner = client_inner.lock(&key_inner).wait(Duration::ZERO);
                inner.run(async { Ok::<(), BoxError>(()) }).await?;
                latencies.push(start.elapsed());
            }
            Ok::<_, BoxError>((latencies, count_scripts() - before))
        })
        .await?;
    let stats = Stats::of(latencies);
    let _ = writeln!(
        out,
        "   reentrant nested call (joins a held lock, wait 0), {} calls: p50 {}, p99 {}, \
         script calls on the server {scripts}",
        stats.n,
        ms(stats.p50),
        ms(stats.p99)
    );
    summary.push(format!(
        "reentrant nested call: p50 {}, {scripts} script calls for {samples} calls (target 0)",
        ms(stats.p50)
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. Redlock

/// Sequential latency of `samples` pairs on one key (after a warm-up).
async fn pair_latencies(locker: &Locker, samples: usize) -> Res<Vec<Duration>> {
    let mut locker = locker.clone();
    let key = unique_key("bench:latency");
    let mut out = Vec::with_capacity(samples);
    for n in 0..samples + WARM_SAMPLES {
        let token = format!("{n:032x}");
        let start = Instant::now();
        locker.pair(&key, &token).await?;
        if n >= WARM_SAMPLES {
            out.push(start.elapsed());
        }
    }
    Ok(out)
}

fn section_redlock(
    opts: &Opts,
    runtime: &tokio::runtime::Runtime,
    out: &mut String,
    summary: &mut Vec<String>,
) -> Res<()> {
    let masters = RedisMasters::start(5);
    let urls = masters.urls();
    let _ = writeln!(
        out,
        "\n4. One acquire+release pair, sequential, own local servers (latency)"
    );
    let _ = writeln!(out, "   {}", Stats::header("setup"));
    let (single, five_stats, five) = runtime.block_on(async {
        let redis = redis::Client::open(urls[0].as_str())?;
        let raw = Locker::Multiplexed(
            redis.get_multiplexed_async_connection().await?,
            Arc::new(Script::new(RELEASE_LUA)),
        );
        let raw = Stats::of(pair_latencies(&raw, opts.samples).await?);
        let _ = writeln!(out, "   {}", raw.row("raw redis, 1 node"));
        let one = Locker::Crate(LockClient::new(opts.config(LockConfig::single(&urls[0])))?);
        let single = Stats::of(pair_latencies(&one, opts.samples).await?);
        let _ = writeln!(out, "   {}", single.row("lock-runtime, 1 node"));
        let hosted = Locker::Crate(LockClient::new(
            opts.config(LockConfig::single(&urls[0]))
                .runtime(tokio::runtime::Handle::current()),
        )?);
        let hosted = Stats::of(pair_latencies(&hosted, opts.samples).await?);
        let _ = writeln!(out, "   {}", hosted.row("lock-runtime, 1 node, caller rt"));
        let mut conns = Vec::new();
        for url in &urls {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        let quorum = Locker::Quorum(conns, Arc::new(Script::new(RELEASE_LUA)));
        let raw5 = Stats::of(pair_latencies(&quorum, opts.samples).await?);
        let _ = writeln!(out, "   {}", raw5.row("raw redis, 5 nodes (quorum 3)"));
        let five = Locker::Crate(LockClient::new(
            opts.config(LockConfig::redlock(urls.iter())),
        )?);
        let five_stats = Stats::of(pair_latencies(&five, opts.samples).await?);
        let _ = writeln!(out, "   {}", five_stats.row("lock-runtime, 5 nodes"));
        let five_hosted = Locker::Crate(LockClient::new(
            opts.config(LockConfig::redlock(urls.iter()))
                .runtime(tokio::runtime::Handle::current()),
        )?);
        let five_hosted = Stats::of(pair_latencies(&five_hosted, opts.samples).await?);
        let _ = writeln!(
            out,
            "   {}",
            five_hosted.row("lock-runtime, 5 nodes, caller rt")
        );
        let _ = writeln!(
            out,
            "   p50 lock-runtime / raw: 1 node {:.2}x, 5 nodes {:.2}x",
            single.p50.as_secs_f64() / raw.p50.as_secs_f64(),
            five_stats.p50.as_secs_f64() / raw5.p50.as_secs_f64()
        );
        Ok::<_, BoxError>((single, five_stats, five))
    })?;
    masters.nodes[4].freeze();
    let frozen = runtime.block_on(pair_latencies(&five, opts.samples));
    masters.nodes[4].thaw();
    let frozen = Stats::of(frozen?);
    let _ = writeln!(out, "   {}", frozen.row("lock-runtime, 5 nodes, 1 frozen"));
    let ratio = five_stats.p50.as_secs_f64() / single.p50.as_secs_f64();
    let frozen_ratio = frozen.p50.as_secs_f64() / single.p50.as_secs_f64();
    for (name, stats) in [
        ("crate_1_node", &single),
        ("crate_5_nodes", &five_stats),
        ("crate_5_nodes_1_frozen", &frozen),
    ] {
        figure(format!("latency.{name}.p50_ms"), millis(stats.p50));
        figure(format!("latency.{name}.p99_ms"), millis(stats.p99));
    }
    let _ = writeln!(
        out,
        "   p50 5 nodes / 1 node: {ratio:.2}x (target <= 1.5x); 1 frozen / 1 node: {frozen_ratio:.2}x"
    );
    summary.push(format!(
        "redlock p50 5/1 nodes {ratio:.2}x, 1 frozen {frozen_ratio:.2}x (target <= 1.5x)"
    ));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Statistics and formatting

struct Stats {
    n: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

impl Stats {
    fn of(mut samples: Vec<Duration>) -> Stats {
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least p of all samples at or below it.
        let rank = |p: f64| {
            let i = (p * samples.len() as f64).ceil() as usize;
            samples
                .get(i.saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        Stats {
            n: samples.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }

    fn header(first: &str) -> String {
        format!(
            "{first:<32}  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
            "samples", "p50", "p90", "p99", "max"
        )
    }

    fn row(&self, name: &str) -> String {
        format!(
            "{name:<32}  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
            self.n,
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// `d` in milliseconds, for `--json`.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}

fn flush(out: &mut String) {
    if JSON.load(Ordering::Relaxed) {
        eprint!("{out}");
    } else {
        print!("{out}");
    }
    out.clear();
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}
