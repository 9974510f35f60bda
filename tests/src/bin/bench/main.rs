//! Throughput and latency of `lock-runtime`, side by side with a hand-written `redis` loop (the
//! floor a lock library competes with).
//!
//! ```text
//! cargo run --release -p lock-tests --features bench --bin bench -- [--url redis://HOST:PORT/] [--secs 3]
//!     [--warmup 1] [--tasks 16] [--handoffs 500] [--waiters 8] [--samples 1000]
//!     [--held N] [--only pairs,handoff,memory,redlock,multi,contended,held,topology]
//!     [--impls crate,hosted,multiplexed,foreign] [--fencing] [--json]
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

mod locker;
mod measure;
mod opts;
mod report;
mod sections;

use std::error::Error;
use std::fmt::Write as _;
use std::time::Duration;

use clap::Parser as _;
use lock_tests::RedisServer;

use crate::opts::Opts;
use crate::report::Report;

type BoxError = Box<dyn Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// The ttl of the locks the sections take (section 6 has its own), and the raw loop's `PX`
/// (`locker::TTL_MS`).
const TTL: Duration = Duration::from_secs(10);
/// How long a waiter may wait for the lock (and a releaser for its hand-off) before the bench fails.
const WAIT: Duration = Duration::from_secs(30);
/// Hand-offs and Redlock pairs discarded before sampling.
const WARM_SAMPLES: usize = 50;

/// What the sections read: the options, the Redis they measure against, and the redis-server
/// whose CPU time each pair is charged.
#[derive(Debug)]
struct Bench {
    opts: Opts,
    /// The `--url`, or the server started here.
    url: String,
    /// The redis-server whose CPU time [`measure::pairs_per_sec`] charges to each pair: `url`
    /// from section 1 (or 6) on, none before.
    server: Option<String>,
}

impl Bench {
    /// Charges the CPU time of the server at `url` to each pair from now on.
    fn charge_server(&mut self) {
        self.server = Some(self.url.clone());
    }

    /// CPU seconds the charged redis-server has used; NaN when there is none.
    fn server_cpu(&self) -> f64 {
        self.server.as_deref().map_or(f64::NAN, measure::server_cpu)
    }
}

fn main() -> Res<()> {
    let opts = Opts::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let load_start = loadavg();
    let mut report = Report::new(opts.json);

    let own_server = opts.url.is_none().then(RedisServer::start);
    let url = match (&opts.url, &own_server) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => return Err("no redis url".into()),
    };
    let _ = writeln!(
        report,
        "lock-runtime bench: redis at {url} ({}), {:.1}s per throughput run after {:.1}s warm-up, fencing {}",
        if own_server.is_some() {
            "own server"
        } else {
            "--url"
        },
        opts.secs.as_secs_f64(),
        opts.warmup.as_secs_f64(),
        if opts.fencing() { "on" } else { "off" },
    );
    let _ = writeln!(report, "load average at start: {load_start}");
    report.flush();

    let mut bench = Bench {
        opts,
        url,
        server: None,
    };
    if bench.opts.runs("pairs") {
        // Stands in for the library's runtime: drives (b2)'s connection.
        let foreign = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-foreign")
            .enable_all()
            .build()?;
        let section = sections::pairs::run(&mut bench, foreign.handle(), &mut report);
        runtime.block_on(section)?;
        report.flush();
    }
    if bench.opts.runs("handoff") {
        runtime.block_on(sections::handoff::run(&bench, &mut report))?;
        report.flush();
    }
    if bench.opts.runs("memory") {
        runtime.block_on(sections::memory::run(&bench, &mut report))?;
        report.flush();
    }
    if bench.opts.runs("multi") {
        runtime.block_on(sections::multi::run(&bench, &mut report))?;
        report.flush();
    }
    if bench.opts.runs("contended") {
        runtime.block_on(sections::contended::run(&bench, &mut report))?;
        report.flush();
    }
    if bench.opts.named("held") {
        runtime.block_on(sections::held::run(&mut bench, &mut report))?;
        report.flush();
    }
    if bench.opts.named("topology") {
        runtime.block_on(sections::topology::run(&bench, &mut report))?;
        report.flush();
    }
    drop(own_server);
    if bench.opts.runs("redlock") {
        sections::redlock::run(&bench, &runtime, &mut report)?;
        report.flush();
    }

    let _ = writeln!(report, "\nload average at end: {}", loadavg());
    let summary = report.summary_line();
    let _ = writeln!(report, "\nSUMMARY: {summary}");
    report.flush();
    if bench.opts.json {
        println!("{}", report.figures_json());
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}
