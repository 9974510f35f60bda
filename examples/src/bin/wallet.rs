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

use std::collections::HashMap;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{Lock, LockConfig, LockError, distributed_lock};

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
            Ledger::Redis(conn) => redis::cmd("GET")
                .arg(format!("wallet-demo:balance:{user_id}"))
                .query_async::<Option<u64>>(&mut conn.clone())
                .await?
                .unwrap_or(0),
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

    async fn write(&self, user_id: u64, balance: u64) -> Result<(), WalletError> {
        match self {
            Ledger::Local(map) => {
                if let Ok(mut map) = map.lock() {
                    map.insert(user_id, balance);
                }
            }
            Ledger::Redis(conn) => {
                redis::cmd("SET")
                    .arg(format!("wallet-demo:balance:{user_id}"))
                    .arg(balance)
                    .query_async::<()>(&mut conn.clone())
                    .await?;
            }
            // The demo has one wallet: the file is that one line.
            Ledger::File(path) => tokio::fs::write(path, format!("{user_id} {balance}\n")).await?,
        }
        Ok(())
    }
}

/// One withdrawal. The lock makes read-think-write atomic per user, across tasks and processes.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s", wait = "10s")]
async fn withdraw(ledger: &Ledger, user_id: u64, amount: u64) -> Result<u64, WalletError> {
    let balance = ledger.read(user_id).await?;
    if balance < amount {
        return Err(WalletError::Insufficient { balance, amount });
    }
    tokio::time::sleep(Duration::from_millis(5)).await; // "thinking": a window for lost updates
    ledger.write(user_id, balance - amount).await?;
    Ok(balance - amount)
}

/// A caller in a hurry: one attempt only (the default `wait`), so it reports contention instead of
/// queueing.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s")]
async fn try_withdraw(ledger: &Ledger, user_id: u64, amount: u64) -> Result<u64, WalletError> {
    let balance = ledger.read(user_id).await?;
    if balance < amount {
        return Err(WalletError::Insufficient { balance, amount });
    }
    ledger.write(user_id, balance - amount).await?;
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
    let worker = args.first().map(String::as_str) == Some("--worker");
    let config = LockConfig::from_env_or(LockConfig::in_memory());
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
    if worker {
        return withdraw_many(ledger, user_id).await;
    }

    ledger.write(user_id, START_BALANCE).await?;
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
    let left = ledger.read(user_id).await?;
    if let Ledger::File(path) = &*ledger {
        let _ = std::fs::remove_file(path);
    }
    let expected = START_BALANCE - processes * TASKS * AMOUNT;
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
