//! Test helper for `tests/kinds_processes.rs`: tasks of one process taking one key as a fair lock,
//! a reader or writer, or one of N permits, until the key has been granted `total` times.
//!
//! Usage: `kinds_worker <redis-url[,url...]> <lock-key> <data-prefix> <total> <kind@hold-ms,...>`,
//! one task per item (several URLs: the lock is taken by Redlock over all of them, with fencing,
//! and the data lives on the first); a kind is `write` (a plain lock, the writer of a shared key), `fair`, `read` (shared)
//! or `permits=N`. Lock: ttl 5s, wait 30s.
//!
//! Before the tasks start, the process takes and releases each kind once on a key of its own, so
//! that no task's first ask waits for a connection or a script load.
//!
//! Each section checks on the data server, in one `MULTI`, what is inside: it counts itself in
//! (`<data-prefix>:writers`, `:readers` or `:inside`) and reads the other side; a writer that
//! finds anyone else, a reader that finds a writer, or a permit holder that finds more than N
//! inside is a violation. It takes its number from `<data-prefix>:grants`, holds for its
//! `hold-ms`, counts itself out and releases. Sections numbered up to `total` are printed as
//! `lock_tests::sections::Section` lines; a task stops after the first section numbered `total`
//! or more. Last line: `violations=<v> lost=<l>`. Exits with 0 when every task ended, 2 on bad
//! arguments, 3 on a lock or Redis error (on stderr).

use std::process::ExitCode;
use std::time::Duration;

use futures_util::future::join_all;
use lock_runtime::{Lock, LockClient, LockConfig, LockError};
use lock_tests::history::{self, now_ns};
use lock_tests::sections::{Kind, Section};
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(30);

struct Args {
    url: String,
    key: String,
    data: String,
    total: u64,
    tasks: Vec<(Kind, Duration)>,
}

#[derive(Default)]
struct Report {
    sections: Vec<Section>,
    violations: u64,
    lost: u64,
}

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: kinds_worker <redis-url> <lock-key> <data-prefix> <total> <kind@hold-ms,...>"
        );
        return ExitCode::from(2);
    };
    // Several URLs: Redlock over them (with fencing), the data on the first.
    let urls: Vec<&str> = args.url.split(',').collect();
    let config = match urls.as_slice() {
        [one] => LockConfig::single(*one).fencing(true),
        many => LockConfig::redlock(many.iter().copied()).fencing(true),
    };
    let client = match LockClient::new(config) {
        Ok(client) => client,
        Err(err) => {
            eprintln!("kinds_worker: {err}");
            return ExitCode::from(2);
        }
    };
    let outcome = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(&client, &args)),
        Err(err) => Err(format!("tokio runtime: {err}")),
    };
    match outcome {
        Ok(report) => history::print_report(
            report.sections.iter().map(ToString::to_string),
            report.violations,
            report.lost,
        ),
        Err(err) => {
            eprintln!("kinds_worker ({}): {err}", std::process::id());
            ExitCode::from(3)
        }
    }
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, data, total, tasks] = args.as_slice() else {
        return None;
    };
    let tasks = tasks
        .split(',')
        .map(|task| {
            let (kind, hold_ms) = task.split_once('@')?;
            Some((
                kind.parse().ok()?,
                Duration::from_millis(hold_ms.parse().ok()?),
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Args {
        url: url.clone(),
        key: key.clone(),
        data: data.clone(),
        total: total.parse().ok()?,
        tasks,
    })
}

async fn run(client: &LockClient, args: &Args) -> Result<Report, String> {
    let data_url = args.url.split(',').next().unwrap_or_default();
    let redis = redis::Client::open(data_url).map_err(|e| e.to_string())?;
    let con = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    // Warm up (connect, load the scripts) on another key before the first ask: a task whose
    // ask waits for that would reach the server after tasks that asked later, and that is not
    // the lock's ordering.
    for &(kind, _) in &args.tasks {
        let warm_up = format!("{}:warm-up:{}", args.key, std::process::id());
        let guard = kind
            .apply(client.lock(warm_up))
            .acquire()
            .await
            .map_err(|e| format!("warm-up: {e}"))?;
        guard.release().await.map_err(|e| format!("warm-up: {e}"))?;
    }
    let tasks = args.tasks.iter().enumerate().map(|(task, &(kind, hold))| {
        let con = con.clone();
        async move { run_task(client, args, con, task, kind, hold).await }
    });
    let mut report = Report::default();
    for outcome in join_all(tasks).await {
        let own = outcome?;
        report.sections.extend(own.sections);
        report.violations += own.violations;
        report.lost += own.lost;
    }
    Ok(report)
}

fn lock(client: &LockClient, args: &Args, kind: Kind) -> Lock {
    kind.apply(client.lock(args.key.as_str()).ttl(TTL).wait(WAIT))
}

/// The counter a section of `kind` counts itself in, and the one it must find empty (if any).
fn counters(args: &Args, kind: Kind) -> (String, Option<String>) {
    let writers = format!("{}:writers", args.data);
    let readers = format!("{}:readers", args.data);
    match kind {
        Kind::Exclusive | Kind::Fair => (writers, Some(readers)),
        Kind::Shared => (readers, Some(writers)),
        Kind::Permits(_) => (format!("{}:inside", args.data), None),
    }
}

async fn run_task(
    client: &LockClient,
    args: &Args,
    mut con: MultiplexedConnection,
    task: usize,
    kind: Kind,
    hold: Duration,
) -> Result<Report, String> {
    let (mine, other) = counters(args, kind);
    let grants = format!("{}:grants", args.data);
    let mut report = Report::default();
    loop {
        let asked_ns = now_ns();
        let guard = lock(client, args, kind)
            .acquire()
            .await
            .map_err(|e| format!("task {task} acquire: {e}"))?;
        let acquired_ns = now_ns();
        let (inside, others, number): (i64, Option<i64>, u64) = redis::pipe()
            .atomic()
            .incr(&mine, 1)
            .get(other.as_deref().unwrap_or(&mine))
            .incr(&grants, 1)
            .query_async(&mut con)
            .await
            .map_err(|e| format!("task {task} enter: {e}"))?;
        let crowded = match kind {
            Kind::Exclusive | Kind::Fair => inside != 1 || others.unwrap_or(0) != 0,
            Kind::Shared => others.unwrap_or(0) != 0,
            Kind::Permits(n) => inside > i64::from(n),
        };
        if crowded {
            report.violations += 1;
            eprintln!(
                "kinds_worker ({}/{task}): {kind} inside with {inside} of its kind and {others:?} others",
                std::process::id()
            );
        }
        tokio::time::sleep(hold).await;
        let _: i64 = redis::cmd("DECR")
            .arg(&mine)
            .query_async(&mut con)
            .await
            .map_err(|e| format!("task {task} leave: {e}"))?;
        let section = Section::ending_now(task, kind, guard.fencing_token(), asked_ns, acquired_ns);
        if number <= args.total {
            report.sections.push(section);
        }
        match guard.release().await {
            Ok(()) => {}
            Err(LockError::Lost { .. }) => report.lost += 1,
            Err(err) => return Err(format!("task {task} release: {err}")),
        }
        if number >= args.total {
            return Ok(report);
        }
    }
}
