//! Withdrawals from one wallet by many concurrent tasks (and, on Redis or etcd, several processes).
//!
//! The balance lives in a deliberately slow, non-atomic store: read, think, write. Without the lock
//! concurrent withdrawals would overwrite each other; with it the books balance exactly, and callers
//! that cannot get the lock in time get a `Contended` error instead of waiting forever.
//!
//! ```text
//! cargo run -p lock-examples --bin wallet                       # in-memory locks, one process
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin wallet   # Redis, 3 processes
//! LOCK_ETCD_ENDPOINTS=http://127.0.0.1:2379 cargo run -p lock-examples --features etcd --bin wallet
//! ```
//!
//! On etcd (the backend for locks that must be correct, like money: see the crate docs) the three
//! processes keep the balance in a file they share, since etcd holds only the locks here.
//!
//! On Redis the balance is written with `lock_runtime::fence::set` and the lock's fencing token:
//! a write whose token is smaller than the last one that wrote the balance is refused. The demo
//! ends by showing why that matters: a holder process is paused (SIGSTOP) past its lock's TTL,
//! another takes the lock and withdraws, and when the paused one resumes its late write of the
//! balance it had read is refused instead of undoing that withdrawal.

use std::collections::HashMap;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// `redis`: the redis-rs the library is built with, so its connections are the ones `fence` takes.
use lock_runtime::{
    FenceError, Lock, LockConfig, LockError, LockGuard, distributed_lock, fence, redis,
};

const START_BALANCE: u64 = 1_000;
const TASKS: u64 = 20;
const AMOUNT: u64 = 10;

#[derive(Debug, thiserror::Error)]
enum WalletError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("insufficient funds: {balance} left, {amount} asked")]
    Insufficient { balance: u64, amount: u64 },
    #[error("the books do not balance: {left} left, {expected} expected")]
    Unbalanced { left: u64, expected: u64 },
    #[error("ledger: {0}")]
    Ledger(#[from] redis::RedisError),
    #[error("ledger file: {0}")]
    LedgerFile(#[from] std::io::Error),
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error("the lock of wallet {0} carries no fencing token")]
    Unfenced(u64),
}

/// Where balances live: process memory, or Redis (or, with etcd locks, a file) so that several
/// processes share them.
enum Ledger {
    Local(Mutex<HashMap<u64, u64>>),
    Redis(redis::aio::ConnectionManager),
    /// One balance per line, `user_id balance`.
    File(std::path::PathBuf),
}

impl Ledger {
    async fn read(&self, user_id: u64) -> Result<u64, WalletError> {
        Ok(match self {
            Ledger::Local(map) => map
                .lock()
                .map(|m| m.get(&user_id).copied().unwrap_or(0))
                .unwrap_or(0),
            Ledger::Redis(conn) => fence::get::<_, u64>(&mut conn.clone(), &balance_key(user_id))
                .await?
                .map_or(0, |balance| balance.value),
            Ledger::File(path) => tokio::fs::read_to_string(path)
                .await
                .unwrap_or_default()
                .lines()
                .filter_map(|line| line.split_once(' '))
                .find(|(user, _)| user.parse() == Ok(user_id))
                .and_then(|(_, balance)| balance.parse().ok())
                .unwrap_or(0),
        })
    }

    /// Writes a balance under `lock`, the guard of the wallet's lock: on Redis only if no later
    /// holder of that lock wrote it (the lock's fencing token is at least theirs).
    async fn write(&self, user_id: u64, balance: u64, lock: &LockGuard) -> Result<(), WalletError> {
        match self {
            Ledger::Local(map) => {
                if let Ok(mut map) = map.lock() {
                    map.insert(user_id, balance);
                }
            }
            Ledger::Redis(conn) => {
                let token = lock.fencing_token().ok_or(WalletError::Unfenced(user_id))?;
                fence::set(&mut conn.clone(), &balance_key(user_id), balance, token).await?;
            }
            // The demo has one wallet: the file is that one line.
            Ledger::File(path) => tokio::fs::write(path, format!("{user_id} {balance}\n")).await?,
        }
        Ok(())
    }
}

fn balance_key(user_id: u64) -> String {
    format!("wallet-demo:balance:{user_id}")
}

/// One withdrawal. The lock makes read-think-write atomic per user, across tasks and processes.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s", wait = "10s", guard = lock)]
async fn withdraw(ledger: &Ledger, user_id: u64, amount: u64) -> Result<u64, WalletError> {
    let balance = ledger.read(user_id).await?;
    if balance < amount {
        return Err(WalletError::Insufficient { balance, amount });
    }
    tokio::time::sleep(Duration::from_millis(5)).await; // "thinking": a window for lost updates
    ledger.write(user_id, balance - amount, lock).await?;
    Ok(balance - amount)
}

/// A caller in a hurry: one attempt only (the default `wait`), so it reports contention instead of
/// queueing.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s", guard = lock)]
async fn try_withdraw(ledger: &Ledger, user_id: u64, amount: u64) -> Result<u64, WalletError> {
    let balance = ledger.read(user_id).await?;
    if balance < amount {
        return Err(WalletError::Insufficient { balance, amount });
    }
    ledger.write(user_id, balance - amount, lock).await?;
    Ok(balance - amount)
}

#[tokio::main]
async fn main() -> ExitCode {
    let outcome = run().await;
    // Before exiting: release what is still held and let releases in flight reach Redis.
    lock_runtime::shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("wallet: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), WalletError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str);
    let worker = matches!(role, Some("--worker" | "--late-writer"));
    // Fenced: the Redis ledger's writes carry the lock's token (Redlock hands one out only when asked).
    let config = LockConfig::from_env_or(LockConfig::in_memory()).fencing(true);
    let redis_url = std::env::var(lock_runtime::ENV_URL)
        .ok()
        .filter(|u| !u.is_empty());
    if !worker {
        println!("lock backend: {config:?}");
    }
    lock_runtime::init(config)?;
    let user_id = 42;
    let on_etcd = std::env::var(lock_runtime::ENV_ETCD_ENDPOINTS).is_ok_and(|e| !e.is_empty());
    let (ledger, processes) = match &redis_url {
        Some(url) => {
            let first = url.split(',').next().unwrap_or(url);
            let client = redis::Client::open(first)?;
            (Ledger::Redis(client.get_connection_manager().await?), 3)
        }
        None if on_etcd => {
            // Workers are handed the parent's file.
            let path = match args.get(1) {
                Some(path) if worker => std::path::PathBuf::from(path),
                _ => {
                    std::env::temp_dir().join(format!("wallet-demo-{}.ledger", std::process::id()))
                }
            };
            (Ledger::File(path), 3)
        }
        None => (Ledger::Local(Mutex::new(HashMap::new())), 1),
    };
    let ledger = Arc::new(ledger);
    if role == Some("--late-writer") {
        return late_write(&ledger, user_id).await;
    }
    if worker {
        return withdraw_many(ledger, user_id).await;
    }

    let opening = Lock::new(format!("wallet:{user_id}")).acquire().await?;
    ledger.write(user_id, START_BALANCE, &opening).await?;
    opening.release().await?;
    let mut children = Vec::new();
    for _ in 1..processes {
        let exe = std::env::current_exe().map_err(|e| LockError::Runtime {
            reason: e.to_string(),
        })?;
        let mut command = Command::new(exe);
        command.arg("--worker");
        if let Ledger::File(path) = &*ledger {
            command.arg(path);
        }
        let child = command.spawn();
        children.push(child.map_err(|e| LockError::Runtime {
            reason: e.to_string(),
        })?);
    }
    withdraw_many(Arc::clone(&ledger), user_id).await?;
    for mut child in children {
        let status = child.wait().map_err(|e| LockError::Runtime {
            reason: e.to_string(),
        })?;
        if !status.success() {
            println!("a worker process failed: {status}");
        }
    }
    show_contention(&ledger, user_id).await?;
    let late = match &*ledger {
        Ledger::Redis(_) => show_late_write(&ledger, user_id).await?,
        _ => 0,
    };
    let left = ledger.read(user_id).await?;
    if let Ledger::File(path) = &*ledger {
        let _ = std::fs::remove_file(path);
    }
    let expected = START_BALANCE - processes * TASKS * AMOUNT - late;
    println!(
        "{processes} process(es) x {TASKS} tasks withdrew {AMOUNT} each: balance {left}, expected {expected}"
    );
    if left == expected {
        println!("the books balance: no withdrawal was lost");
        Ok(())
    } else {
        Err(WalletError::Unbalanced { left, expected })
    }
}

async fn withdraw_many(ledger: Arc<Ledger>, user_id: u64) -> Result<(), WalletError> {
    let pid = std::process::id();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let ledger = Arc::clone(&ledger);
        tasks.spawn(async move { withdraw(&ledger, user_id, AMOUNT).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| LockError::Runtime {
            reason: e.to_string(),
        })??;
    }
    println!("[pid {pid}] {TASKS} withdrawals of {AMOUNT} done");
    Ok(())
}

/// While an auditor holds the wallet's lock, a caller that will not wait is turned away.
async fn show_contention(ledger: &Ledger, user_id: u64) -> Result<(), WalletError> {
    let audit = Lock::new(format!("wallet:{user_id}")).acquire().await?;
    match try_withdraw(ledger, user_id, AMOUNT).await {
        Err(WalletError::Lock(err @ LockError::Contended { .. })) => {
            println!("a hurried caller during the audit: {err}");
        }
        other => println!("a hurried caller during the audit: unexpected {other:?}"),
    }
    audit.release().await?;
    Ok(())
}

/// The lock TTL of the holder that `show_late_write` pauses: it expires during the pause.
const PAUSED_TTL: Duration = Duration::from_secs(1);

/// The paused holder (`--late-writer`, Redis only): takes the lock, reads the balance, says
/// `ready` and waits for the word to write; its parent pauses it in between, past its TTL. Then
/// it writes the balance it read, less its withdrawal, as a holder that does not check its lock
/// would: the write carries the old token and is refused.
async fn late_write(ledger: &Ledger, user_id: u64) -> Result<(), WalletError> {
    use tokio::io::AsyncBufReadExt;
    let lock = Lock::new(format!("wallet:{user_id}"))
        .ttl(PAUSED_TTL)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    let balance = ledger.read(user_id).await?;
    println!("ready");
    let mut go = String::new();
    tokio::io::BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await?;
    match ledger.write(user_id, balance - AMOUNT, &lock).await {
        Err(WalletError::Fence(stale @ FenceError::Stale { .. })) => {
            println!("refused: {stale}");
            Ok(())
        }
        Ok(()) => {
            println!("written: the late write went through");
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// A holder process paused (SIGSTOP) past its lock's TTL, like a long GC pause or a frozen VM:
/// meanwhile this process takes the lock and withdraws; the resumed holder's late write of the
/// balance it read before the pause is refused by the fence. Returns what this process withdrew.
async fn show_late_write(ledger: &Ledger, user_id: u64) -> Result<u64, WalletError> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let exe = std::env::current_exe()?;
    let mut holder = tokio::process::Command::new(exe)
        .arg("--late-writer")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = holder.id().map(|pid| pid.to_string()).unwrap_or_default();
    let (Some(mut to_holder), Some(from_holder)) = (holder.stdin.take(), holder.stdout.take())
    else {
        return Err(std::io::Error::other("the paused holder's pipes").into());
    };
    let mut from_holder = tokio::io::BufReader::new(from_holder).lines();
    let said = |line: Option<String>| line.unwrap_or_else(|| "nothing (it exited)".to_owned());
    let ready = said(from_holder.next_line().await?);
    if ready != "ready" {
        return Err(std::io::Error::other(format!("the paused holder said {ready}")).into());
    }
    signal("-STOP", &pid)?;
    println!("a holder (pid {pid}) read the balance and was paused, its lock TTL {PAUSED_TTL:?}");
    // Waits (up to `withdraw`'s 10s) for the paused holder's lock to expire.
    let left = withdraw(ledger, user_id, AMOUNT).await?;
    println!("meanwhile this process took the lock and withdrew {AMOUNT}: balance {left}");
    signal("-CONT", &pid)?;
    to_holder.write_all(b"go\n").await?;
    println!(
        "the resumed holder's late write: {}",
        said(from_holder.next_line().await?)
    );
    holder.wait().await?;
    Ok(AMOUNT)
}

/// Sends `signal` to process `pid` with `kill(1)`.
fn signal(signal: &str, pid: &str) -> Result<(), WalletError> {
    let status = Command::new("kill").args([signal, pid]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill {signal} {pid}: {status}")).into())
    }
}
