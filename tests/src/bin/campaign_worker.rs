//! The fault campaign's worker (`tests/tests/campaign.rs`): tasks taking random locks on one
//! backend until a deadline, recording every call.
//!
//! Usage: `campaign_worker <backend> <lock-urls> <data-url> <key-prefix> <run-ms> <seed> <ttl-ms>`,
//! where backend is `single`, `redlock` (fencing on), `sentinel` (the URLs are the sentinels',
//! master name `locks`), `cluster` or `etcd` (feature `etcd`), and the URLs are comma-separated.
//! Connect timeout 200ms, response timeout 500ms.
//!
//! Task 0 calls `acquire_blocking` on a thread, tasks 1 and 2 `acquire().await`; each picks its
//! calls with [`next_step`] and prints one [`Op`] line per call as soon as it ended, and one
//! [`Write`] line per write to the fenced register on the data server: an exclusive holder
//! writes its token right after the grant, then, until its hold time is over, checks
//! `is_lost()`, works for [`WORK`] and writes again. Last line: `done ops=<n>`. Exit 0, 2 on bad
//! arguments or config.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockClient, LockConfig, LockError, LockGuard};
use lock_tests::campaign::nemesis::longest_pause;
use lock_tests::campaign::record::{Op, Outcome, Release, Write, WriteResult};
use lock_tests::campaign::workload::{Step, WORK, next_step, register_keys, register_script};
use lock_tests::history::now_ns;
use lock_tests::sections::Kind;
use redis::aio::MultiplexedConnection;

const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
const ASYNC_TASKS: u32 = 2;
/// Errors other than contention and unavailability printed on stderr, at most.
const ERRORS_SHOWN: u64 = 20;

struct Args {
    backend: String,
    urls: Vec<String>,
    data_url: String,
    prefix: String,
    run_for: Duration,
    seed: u64,
    ttl: Duration,
}

impl Args {
    /// How long a write to the register may take: the data server is never faulted, but the
    /// worker may be stopped for up to [`longest_pause`] right after it sent one, and a timeout
    /// that runs out meanwhile records the write as unanswered though the register counted it
    /// (the register's counts then disagree with the records by that write). 2 s more than that
    /// pause, for a loaded machine.
    fn data_timeout(&self) -> Duration {
        longest_pause(self.ttl) + Duration::from_secs(2)
    }
}

static OPS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: campaign_worker <single|redlock|sentinel|cluster|etcd> <lock-urls> <data-url> \
             <key-prefix> <run-ms> <seed> <ttl-ms>"
        );
        return ExitCode::from(2);
    };
    let client = match config(&args).and_then(LockClient::new) {
        Ok(client) => client,
        Err(err) => {
            eprintln!("campaign_worker: {err}");
            return ExitCode::from(2);
        }
    };
    let deadline = Instant::now() + args.run_for;
    let sync_task = {
        let (client, args) = (client.clone(), clone_args(&args));
        std::thread::spawn(move || run_blocking(&client, &args, deadline))
    };
    // As `#[tokio::main]` builds it: the async tasks' calls go over this runtime's own
    // connections (a single node, Redlock's nodes), the sync thread's over the shared ones.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("campaign_worker: tokio runtime: {err}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        let tasks: Vec<_> = (1..=ASYNC_TASKS)
            .map(|task| {
                let (client, args) = (client.clone(), clone_args(&args));
                tokio::spawn(async move { run_async(&client, &args, task, deadline).await })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
    let _ = sync_task.join();
    println!("done ops={}", OPS.load(Ordering::SeqCst));
    ExitCode::SUCCESS
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [backend, urls, data_url, prefix, run_ms, seed, ttl_ms] = args.as_slice() else {
        return None;
    };
    Some(Args {
        backend: backend.clone(),
        urls: urls.split(',').map(str::to_owned).collect(),
        data_url: data_url.clone(),
        prefix: prefix.clone(),
        run_for: Duration::from_millis(run_ms.parse().ok()?),
        seed: seed.parse().ok()?,
        ttl: Duration::from_millis(ttl_ms.parse().ok()?),
    })
}

fn clone_args(args: &Args) -> Args {
    Args {
        backend: args.backend.clone(),
        urls: args.urls.clone(),
        data_url: args.data_url.clone(),
        prefix: args.prefix.clone(),
        ..*args
    }
}

fn config(args: &Args) -> Result<LockConfig, LockError> {
    let urls = args.urls.iter().map(String::as_str);
    let config = match args.backend.as_str() {
        "single" => LockConfig::single(args.urls[0].as_str()),
        "redlock" => LockConfig::redlock(urls),
        "sentinel" => LockConfig::sentinel(lock_tests::SentinelSet::MASTER_NAME, urls),
        "cluster" => LockConfig::cluster(urls),
        #[cfg(feature = "etcd")]
        "etcd" => LockConfig::etcd(urls),
        other => {
            return Err(LockError::Config {
                field: "backend",
                reason: format!("unknown campaign backend {other:?}"),
            });
        }
    };
    Ok(config
        .fencing(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT))
}

/// An op line with what is known once `acquire` returned.
fn answered(
    task: u32,
    step: &Step,
    blocking: bool,
    invoke_ns: u64,
    result: &Result<LockGuard, LockError>,
) -> Op {
    let done_ns = now_ns();
    let mut keys = step.keys.clone();
    keys.sort();
    let (outcome, fences) = match result {
        Ok(guard) => (
            Outcome::Acquired,
            keys.iter()
                .map(|k| guard.fencing_token_of(k).unwrap_or(0))
                .collect(),
        ),
        Err(LockError::Contended { .. }) => (Outcome::Contended, Vec::new()),
        Err(LockError::Unavailable { .. }) => (Outcome::Unavailable, Vec::new()),
        Err(LockError::Lost { .. }) => (Outcome::Lost, Vec::new()),
        Err(err) => {
            shout(&format!("acquire: {err}"));
            (Outcome::Failed, Vec::new())
        }
    };
    let hold_start_ns = if result.is_ok() { done_ns } else { 0 };
    Op {
        pid: std::process::id(),
        task,
        kind: step.kind,
        keys,
        blocking,
        wait_ms: u64::try_from(step.wait.as_millis()).unwrap_or(u64::MAX),
        invoke_ns,
        done_ns,
        outcome,
        fences,
        hold_start_ns,
        hold_end_ns: 0,
        valid_ns: hold_start_ns,
        lost_ns: 0,
        wrote_ns: 0,
        release: Release::None,
    }
}

fn released(op: &mut Op, result: Result<(), LockError>) {
    op.release = match result {
        Ok(()) => Release::Ok,
        Err(LockError::Lost { .. }) => Release::Lost,
        Err(LockError::Unavailable { .. }) => Release::Unavailable,
        Err(err) => {
            shout(&format!("release: {err}"));
            Release::None
        }
    };
    print_op(op);
}

fn print_op(op: &Op) {
    OPS.fetch_add(1, Ordering::SeqCst);
    println!("{op}");
}

/// The next call to make, and its lock (semaphores only where offered: not on Redlock).
fn next_call(client: &LockClient, args: &Args, rng: &mut fastrand::Rng) -> (Step, Lock) {
    let step = next_step(rng, &args.prefix, args.ttl, args.backend != "redlock");
    let lock = client
        .lock_many(step.keys.clone())
        .ttl(args.ttl)
        .wait(step.wait)
        .reentrant(false);
    let lock = step.kind.apply(lock);
    (step, lock)
}

fn shout(what: &str) {
    if ERRORS.fetch_add(1, Ordering::SeqCst) < ERRORS_SHOWN {
        eprintln!("campaign_worker ({}): {what}", std::process::id());
    }
}

/// Whether the lock is still ours: records the reading before `is_lost()` said no, or the one
/// after it first said yes.
fn still_ours(op: &mut Op, guard: &LockGuard) -> bool {
    let at = now_ns();
    if guard.is_lost() {
        op.lost_ns = now_ns();
        return false;
    }
    op.valid_ns = at;
    true
}

fn written(op: &mut Op, key: &str, fence: u64, invoke_ns: u64, result: WriteResult) {
    let write = Write {
        pid: op.pid,
        key: key.to_owned(),
        fence,
        invoke_ns,
        done_ns: now_ns(),
        result,
    };
    op.wrote_ns = write.done_ns;
    println!("{write}");
}

fn write_result(answer: redis::RedisResult<i64>) -> WriteResult {
    match answer {
        Ok(1) => WriteResult::Accepted,
        Ok(_) => WriteResult::Rejected,
        Err(err) => {
            shout(&format!("register: {err}"));
            WriteResult::Error
        }
    }
}

fn writes_register(op: &Op) -> bool {
    op.kind == Kind::Exclusive || op.kind == Kind::Fair
}

/// An exclusive holder's write of each key's token to its register (others write nothing).
fn write_blocking(op: &mut Op, data: &mut redis::RedisResult<redis::Connection>) {
    if !writes_register(op) {
        return;
    }
    for (key, fence) in op.keys.clone().iter().zip(op.fences.clone()) {
        let at = now_ns();
        let answer = match data {
            Ok(con) => register_script()
                .key(&register_keys(key))
                .arg(fence)
                .invoke(con),
            Err(err) => Err(err.clone()),
        };
        written(op, key, fence, at, write_result(answer));
    }
}

/// [`write_blocking`] on an async connection.
async fn write_async(
    op: &mut Op,
    data: &redis::RedisResult<MultiplexedConnection>,
    timeout: Duration,
) {
    if !writes_register(op) {
        return;
    }
    for (key, fence) in op.keys.clone().iter().zip(op.fences.clone()) {
        let at = now_ns();
        let answer = match data {
            Ok(con) => {
                let mut con = con.clone();
                let mut invocation = register_script().prepare_invoke();
                invocation.key(&register_keys(key)).arg(fence);
                let call = invocation.invoke_async(&mut con);
                tokio::time::timeout(timeout, call)
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
            }
            Err(err) => Err(err.clone()),
        };
        written(op, key, fence, at, write_result(answer));
    }
}

fn timed_out() -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "register write timed out").into()
}

fn run_blocking(client: &LockClient, args: &Args, deadline: Instant) {
    let mut rng = fastrand::Rng::with_seed(args.seed);
    let mut data = redis::Client::open(args.data_url.as_str())
        .and_then(|c| c.get_connection_with_timeout(args.data_timeout()));
    if let Ok(con) = &data {
        let _ = con.set_read_timeout(Some(args.data_timeout()));
    }
    while Instant::now() < deadline {
        let (step, lock) = next_call(client, args, &mut rng);
        let invoke_ns = now_ns();
        let result = lock.acquire_blocking();
        let mut op = answered(0, &step, true, invoke_ns, &result);
        let Ok(guard) = result else {
            print_op(&op);
            continue;
        };
        let until = Instant::now() + step.hold;
        write_blocking(&mut op, &mut data);
        while still_ours(&mut op, &guard) && Instant::now() < until {
            std::thread::sleep(WORK.min(until.saturating_duration_since(Instant::now())));
            write_blocking(&mut op, &mut data);
        }
        op.hold_end_ns = now_ns();
        released(&mut op, guard.release_blocking());
    }
}

async fn run_async(client: &LockClient, args: &Args, task: u32, deadline: Instant) {
    let mut rng = fastrand::Rng::with_seed(args.seed.wrapping_add(u64::from(task)));
    let data = match redis::Client::open(args.data_url.as_str()) {
        Ok(c) => {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(args.data_timeout()))
                .set_response_timeout(Some(args.data_timeout()));
            c.get_multiplexed_async_connection_with_config(&config)
                .await
        }
        Err(err) => Err(err),
    };
    while Instant::now() < deadline {
        let (step, lock) = next_call(client, args, &mut rng);
        let invoke_ns = now_ns();
        let result = lock.acquire().await;
        let mut op = answered(task, &step, false, invoke_ns, &result);
        let Ok(guard) = result else {
            print_op(&op);
            continue;
        };
        let until = Instant::now() + step.hold;
        write_async(&mut op, &data, args.data_timeout()).await;
        while still_ours(&mut op, &guard) && Instant::now() < until {
            tokio::time::sleep(WORK.min(until.saturating_duration_since(Instant::now()))).await;
            write_async(&mut op, &data, args.data_timeout()).await;
        }
        op.hold_end_ns = now_ns();
        released(&mut op, guard.release().await);
    }
}
