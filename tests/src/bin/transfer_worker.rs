//! Test helper for `tests/transfers.rs`: money transfers between wallets, each under one lock over
//! both wallets, taken with the programmatic API (`Lock::many([from, to]).run(..)`, global client).
//!
//! Usage: `transfer_worker <single|redlock|cluster> <lock-urls,comma-separated> <data-url> <data-prefix>
//! <wallets> <tasks> <secs> <up|down>`.
//!
//! `tasks` tasks loop for `secs` seconds. Iteration `i` of task `t` picks two different wallets
//! `a`, `b` out of `wallets` and moves `1 + i % 7` from `a` to `b` (`up`) or from `b` to `a`
//! (`down`), so two workers started with opposite directions take the same pairs in opposite
//! argument order. Lock: ttl 5s, wait 5s. Wallet `w` is `<data-prefix>:wallet:<w>` on the data
//! server (also the lock key), with `:version` and `:inside` beside it. The body, for both
//! wallets: `INCR :inside` (anything but 1 means another holder of that wallet is inside: a
//! violation), read balances and versions, pause 0-499µs, write both balances and version + 1,
//! `DECR :inside`. A version is read and written under the lock, so versions of one wallet grow
//! strictly in grant order exactly when grants of it never overlap: the worker records it as the
//! grant's fence, which makes the history check independent of the lock's own tokens.
//!
//! Prints one `lock_tests::history::Grant` line per wallet of each grant, then
//! `transfers=<n> contended=<c> max_call_ms=<m>` (how long the slowest call took, acquisition
//! included) and `violations=<v> lost=<l>`. Exits with 0 when the run ended, 2 on bad arguments,
//! 3 on any other lock or Redis error (on stderr).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockConfig, LockError};
use lock_tests::history::{self, Grant, now_ns};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(5);

/// Any failure; a lock failure stays a `LockError` inside (the body's error type must be
/// `From<LockError>`).
type WorkerError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    config: LockConfig,
    data_url: String,
    prefix: String,
    wallets: u64,
    tasks: u64,
    run_for: Duration,
    up: bool,
}

#[derive(Debug, Default)]
struct Report {
    grants: Vec<Grant>,
    transfers: u64,
    contended: u64,
    violations: u64,
    lost: u64,
    max_call: Duration,
}

impl Report {
    fn merge(&mut self, other: Report) {
        self.grants.extend(other.grants);
        self.transfers += other.transfers;
        self.contended += other.contended;
        self.violations += other.violations;
        self.lost += other.lost;
        self.max_call = self.max_call.max(other.max_call);
    }
}

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: transfer_worker <single|redlock> <lock-urls,comma-separated> <data-url> \
             <data-prefix> <wallets> <tasks> <secs> <up|down>"
        );
        return ExitCode::from(2);
    };
    if let Err(err) = lock_runtime::init(args.config.clone()) {
        eprintln!("transfer_worker: {err}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("transfer_worker: tokio runtime: {err}");
            return ExitCode::from(3);
        }
    };
    let outcome = runtime.block_on(run(&args));
    lock_runtime::shutdown();
    match outcome {
        Ok(report) => print_report(&report),
        Err(err) => {
            eprintln!("transfer_worker ({}): {err}", std::process::id());
            ExitCode::from(3)
        }
    }
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [
        mode,
        urls,
        data_url,
        prefix,
        wallets,
        tasks,
        secs,
        direction,
    ] = args.as_slice()
    else {
        return None;
    };
    let urls: Vec<&str> = urls.split(',').collect();
    let config = match mode.as_str() {
        "single" => LockConfig::single(*urls.first()?).fencing(true),
        "redlock" => LockConfig::redlock(urls).fencing(true),
        "cluster" => LockConfig::cluster(urls).fencing(true),
        _ => return None,
    };
    let wallets: u64 = wallets.parse().ok()?;
    Some(Args {
        config,
        data_url: data_url.clone(),
        prefix: prefix.clone(),
        wallets: (wallets >= 2).then_some(wallets)?,
        tasks: tasks.parse().ok()?,
        run_for: Duration::from_secs_f64(secs.parse().ok()?),
        up: match direction.as_str() {
            "up" => true,
            "down" => false,
            _ => return None,
        },
    })
}

fn print_report(report: &Report) -> ExitCode {
    let figures = format!(
        "transfers={} contended={} max_call_ms={}",
        report.transfers,
        report.contended,
        report.max_call.as_millis()
    );
    history::print_report(
        report
            .grants
            .iter()
            .map(ToString::to_string)
            .chain([figures]),
        report.violations,
        report.lost,
    )
}

async fn run(args: &Args) -> Result<Report, WorkerError> {
    let data = redis::Client::open(args.data_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let deadline = Instant::now() + args.run_for;
    let handles: Vec<_> = (0..args.tasks)
        .map(|t| {
            let (data, prefix) = (data.clone(), args.prefix.clone());
            let (wallets, up) = (args.wallets, args.up);
            tokio::spawn(async move { task(t, data, prefix, wallets, up, deadline).await })
        })
        .collect();
    let mut report = Report::default();
    for handle in handles {
        let own = handle.await??;
        report.merge(own);
    }
    Ok(report)
}

/// One task's transfers until `deadline`.
async fn task(
    t: u64,
    data: MultiplexedConnection,
    prefix: String,
    wallets: u64,
    up: bool,
    deadline: Instant,
) -> Result<Report, WorkerError> {
    let mut report = Report::default();
    let mut i = 0;
    while Instant::now() < deadline {
        let a = (t * 7 + i) % wallets;
        let b = (a + 1 + i % (wallets - 1)) % wallets;
        let (from, to) = if up { (a, b) } else { (b, a) };
        let (from, to) = (
            format!("{prefix}:wallet:{from}"),
            format!("{prefix}:wallet:{to}"),
        );
        let amount = 1 + i64::try_from(i % 7).unwrap_or(0);
        let pause =
            Duration::from_micros((i * 7919 + t * 104_729 + u64::from(std::process::id())) % 500);
        let body = transfer(data.clone(), from.clone(), to.clone(), amount, pause);
        let started = Instant::now();
        let outcome = Lock::many([&from, &to]).ttl(TTL).wait(WAIT).run(body).await;
        report.max_call = report.max_call.max(started.elapsed());
        match outcome {
            Ok((grants, violations)) => {
                report.grants.extend(grants);
                report.violations += violations;
                report.transfers += 1;
            }
            Err(err) => match err.downcast_ref::<LockError>() {
                Some(LockError::Contended { .. }) => report.contended += 1,
                Some(LockError::Lost { .. }) => report.lost += 1,
                _ => return Err(err),
            },
        }
        i += 1;
    }
    Ok(report)
}

/// The critical section: moves `amount` from `from` to `to` (when `from` has it) and bumps both
/// versions. Returns a grant per wallet and how many of the two were entered while someone else
/// was inside.
async fn transfer(
    mut data: MultiplexedConnection,
    from: String,
    to: String,
    amount: i64,
    pause: Duration,
) -> Result<(Vec<Grant>, u64), WorkerError> {
    let acquired_ns = now_ns();
    let keys = [&from, &to];
    let mut enter = redis::pipe();
    for key in keys {
        enter.incr(format!("{key}:inside"), 1);
    }
    for key in keys {
        enter.get(key).get(format!("{key}:version"));
    }
    let (inside_from, inside_to, from_balance, from_version, to_balance, to_version): (
        i64,
        i64,
        Option<i64>,
        Option<u64>,
        Option<i64>,
        Option<u64>,
    ) = enter.query_async(&mut data).await?;
    let violations = u64::from(inside_from != 1) + u64::from(inside_to != 1);
    tokio::time::sleep(pause).await;
    let (from_balance, to_balance) = (from_balance.unwrap_or(0), to_balance.unwrap_or(0));
    let moved = if from_balance >= amount { amount } else { 0 };
    let versions = [from_version.unwrap_or(0) + 1, to_version.unwrap_or(0) + 1];
    let mut leave = redis::pipe();
    leave
        .set(&from, from_balance - moved)
        .ignore()
        .set(&to, to_balance + moved)
        .ignore();
    for (key, version) in keys.iter().zip(versions) {
        leave.set(format!("{key}:version"), version).ignore();
        leave.decr(format!("{key}:inside"), 1).ignore();
    }
    let () = leave.query_async(&mut data).await?;
    let grants = keys
        .iter()
        .zip(versions)
        .map(|(key, version)| Grant::ending_now(key, Some(version), acquired_ns))
        .collect();
    Ok((grants, violations))
}
