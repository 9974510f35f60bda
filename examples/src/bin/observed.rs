//! The wallet workload with its locks made visible: a tracing subscriber prints the
//! `distributed_lock` spans and events, and a Prometheus endpoint serves the lock metrics.
//!
//! Several tasks withdraw from and transfer between a few wallets for `--secs` seconds; an auditor
//! holds one wallet at a time for longer than its ttl (renewal keeps it) while hurried callers,
//! who make one attempt only, are turned away (`contended`). At the end the program fetches its own
//! `/metrics` page once, prints the `lock` lines, checks that the books balance and exits.
//!
//! ```text
//! cargo run -p lock-examples --bin observed                                  # in-memory locks
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin observed -- --secs 20
//! RUST_LOG=info cargo run -p lock-examples --bin observed                    # no per-lock events
//! ```
//!
//! The trace goes to stderr; the summary and the metrics to stdout. The endpoint listens on
//! `127.0.0.1:9898` (`--metrics-port`) only, for as long as the program runs.

use std::collections::HashMap;
use std::error::Error;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError, distributed_lock};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing_subscriber::EnvFilter;

const WALLETS: u64 = 4;
const START_BALANCE: u64 = 100_000;
const WORKERS: usize = 6;
const DEFAULT_FILTER: &str = "info,lock_runtime=debug";
const USAGE: &str = "usage: observed [--secs N (default 5)] [--metrics-port PORT (default 9898)]
env: LOCK_REDIS_URL (default: in-memory locks), RUST_LOG (default: info,lock_runtime=debug)";

type BoxError = Box<dyn Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("insufficient funds in wallet {user_id}")]
    Insufficient { user_id: u64 },
}

/// Balances in a deliberately slow read-think-write store, and what happened to them.
#[derive(Debug, Default)]
struct Bank {
    balances: Mutex<HashMap<u64, u64>>,
    withdrawn: AtomicU64,
    operations: AtomicU64,
    turned_away: AtomicU64,
    audits: AtomicU64,
}

impl Bank {
    fn balances(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.balances.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self, user_id: u64) -> u64 {
        self.balances().get(&user_id).copied().unwrap_or(0)
    }

    fn write(&self, user_id: u64, balance: u64) {
        self.balances().insert(user_id, balance);
    }

    /// Withdraws without locking: only the locked functions below call it.
    async fn debit(&self, user_id: u64, amount: u64) -> Result<(), BankError> {
        let balance = self.read(user_id);
        if balance < amount {
            return Err(BankError::Insufficient { user_id });
        }
        think().await; // a window for lost updates, were the lock missing
        self.write(user_id, balance - amount);
        self.withdrawn.fetch_add(amount, Ordering::Relaxed);
        Ok(())
    }
}

async fn think() {
    tokio::time::sleep(Duration::from_millis(fastrand::u64(2..8))).await;
}

/// A patient caller: waits up to 5s for the wallet.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s", wait = "5s")]
async fn withdraw(bank: &Bank, user_id: u64, amount: u64) -> Result<(), BankError> {
    bank.debit(user_id, amount).await
}

/// A caller in a hurry: one attempt (the default `wait`), so a held wallet turns it away.
#[distributed_lock(key = "wallet:<user_id>", ttl = "5s")]
async fn try_withdraw(bank: &Bank, user_id: u64, amount: u64) -> Result<(), BankError> {
    bank.debit(user_id, amount).await
}

/// Both wallets or neither, always taken in one order.
#[distributed_lock(keys = ["wallet:<from>", "wallet:<to>"], ttl = "5s", wait = "5s", max_hold = "10s")]
async fn transfer(bank: &Bank, from: u64, to: u64, amount: u64) -> Result<(), BankError> {
    let (source, target) = (bank.read(from), bank.read(to));
    if source < amount {
        return Err(BankError::Insufficient { user_id: from });
    }
    think().await;
    bank.write(from, source - amount);
    bank.write(to, target + amount);
    Ok(())
}

/// Holds a wallet for 1.5s on a 1s ttl: renewal keeps the lock, and meanwhile hurried callers
/// are turned away and `lockctl` has something to show.
#[distributed_lock(key = "wallet:<user_id>", ttl = "1s", wait = "5s")]
async fn audit(bank: &Bank, user_id: u64) -> Result<u64, BankError> {
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    Ok(bank.read(user_id))
}

#[derive(Debug)]
struct Options {
    secs: u64,
    metrics_port: u16,
}

/// `None` when only the usage was asked for.
fn parse_args() -> Result<Option<Options>, String> {
    let mut options = Options {
        secs: 5,
        metrics_port: 9898,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--secs" => {
                let v = value("--secs")?;
                options.secs = v
                    .parse()
                    .map_err(|_| format!("--secs: not a number: {v}"))?;
            }
            "--metrics-port" => {
                let v = value("--metrics-port")?;
                options.metrics_port = v
                    .parse()
                    .map_err(|_| format!("--metrics-port: not a port: {v}"))?;
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(options))
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("observed: {err}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let outcome = run(&options).await;
    // Before exiting: release what is still held and let releases in flight reach Redis.
    lock_runtime::shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("observed: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: &Options) -> Result<(), BoxError> {
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], options.metrics_port));
    PrometheusBuilder::new()
        .with_http_listener(metrics_addr)
        // Histograms with buckets (not the default summaries): they add up across processes.
        .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])?
        .install()
        .map_err(|e| format!("metrics endpoint on {metrics_addr}: {e}"))?;

    let config = LockConfig::from_env_or(LockConfig::in_memory());
    println!("lock backend: {config:?}");
    println!(
        "metrics: http://{metrics_addr}/metrics for {}s; trace on stderr",
        options.secs
    );
    lock_runtime::init(config)?;

    let bank = Arc::new(Bank::default());
    for user_id in 1..=WALLETS {
        bank.write(user_id, START_BALANCE);
    }
    let deadline = Instant::now() + Duration::from_secs(options.secs);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        tasks.spawn(work(Arc::clone(&bank), deadline));
    }
    tasks.spawn(audit_all(Arc::clone(&bank), deadline));
    while let Some(done) = tasks.join_next().await {
        done??;
    }

    let total: u64 = bank.balances().values().sum();
    let withdrawn = bank.withdrawn.load(Ordering::Relaxed);
    println!(
        "{} operations, {} hurried callers turned away, {} audits; withdrawn {withdrawn}, left {total}",
        bank.operations.load(Ordering::Relaxed),
        bank.turned_away.load(Ordering::Relaxed),
        bank.audits.load(Ordering::Relaxed),
    );
    if total + withdrawn != WALLETS * START_BALANCE {
        return Err(format!(
            "the books do not balance: {total} left + {withdrawn} withdrawn != {}",
            WALLETS * START_BALANCE
        )
        .into());
    }
    println!("the books balance");

    let page = scrape(metrics_addr).await?;
    println!("GET http://{metrics_addr}/metrics (lines starting with `lock`):");
    for line in page.lines().filter(|l| l.starts_with("lock")) {
        println!("{line}");
    }
    Ok(())
}

/// One worker: random withdrawals (patient or hurried) and transfers until the deadline.
async fn work(bank: Arc<Bank>, deadline: Instant) -> Result<(), BoxError> {
    while Instant::now() < deadline {
        let user_id = fastrand::u64(1..=WALLETS);
        let amount = fastrand::u64(1..=10);
        let outcome = match fastrand::u8(0..10) {
            0..=4 => withdraw(&bank, user_id, amount).await,
            5..=7 => {
                let to = user_id % WALLETS + 1;
                transfer(&bank, user_id, to, amount).await
            }
            _ => try_withdraw(&bank, user_id, amount).await,
        };
        match outcome {
            Ok(()) => {
                bank.operations.fetch_add(1, Ordering::Relaxed);
            }
            Err(BankError::Lock(LockError::Contended { .. })) => {
                bank.turned_away.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => return Err(err.into()),
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(20..80))).await;
    }
    Ok(())
}

/// The auditor: one wallet after the other, a short pause between audits.
async fn audit_all(bank: Arc<Bank>, deadline: Instant) -> Result<(), BoxError> {
    let mut user_id = 1;
    while Instant::now() < deadline {
        audit(&bank, user_id).await?;
        bank.audits.fetch_add(1, Ordering::Relaxed);
        user_id = user_id % WALLETS + 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// Fetches the Prometheus page with one plain HTTP/1.0 request (no HTTP client crate needed).
async fn scrape(addr: SocketAddr) -> Result<String, BoxError> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| format!("GET {addr}/metrics: no answer within 5s"))??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("GET /metrics: not an HTTP response")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("GET /metrics: {status}").into());
    }
    Ok(body.to_owned())
}
