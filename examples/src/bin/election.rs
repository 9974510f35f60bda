//! A scheduler that runs on exactly one of three processes: each campaigns in the same election,
//! the leader ticks, the others wait. After three ticks the leader is killed (SIGKILL: no
//! release), and another process takes over within one ttl, with a greater epoch.
//!
//! ```text
//! redis-server --port 6379 --save '' --daemonize yes
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin election
//! ```
//!
//! The binary starts three copies of itself (`election campaign <name> <n>`) and reads what they
//! print. It needs a backend that processes share, so `LOCK_REDIS_URL` (or
//! `LOCK_ETCD_ENDPOINTS` with the `etcd` feature) is required; without one it says so and exits
//! with 2.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{Election, LockConfig, LockError};

/// A killed leader keeps the others out for at most this long.
const TTL: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(500);
/// Ticks a leader runs before the parent intervenes.
const TICKS: u32 = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => parent(),
        [campaign, name, n] if campaign == "campaign" => campaigner(name, n),
        _ => {
            eprintln!("usage: election   (the campaigners are started by it)");
            ExitCode::from(2)
        }
    }
}

/// One scheduler process: campaigns, ticks while it leads, campaigns again if it loses, and
/// stops (resigning) when its stdin closes.
#[tokio::main]
async fn campaigner(name: &str, n: &str) -> ExitCode {
    if let Err(err) = lock_runtime::init(LockConfig::from_env()) {
        eprintln!("scheduler {n}: {err}");
        return ExitCode::FAILURE;
    }
    let election = Election::new(name).ttl(TTL);
    let stdin_closed = tokio::task::spawn_blocking(|| std::io::stdin().lines().count());
    let outcome = tokio::select! {
        served = serve(&election, n) => served,
        _ = stdin_closed => Ok(()), // the parent is done: the leadership is dropped, released
    };
    lock_runtime::shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("scheduler {n}: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(election: &Election, n: &str) -> Result<(), LockError> {
    loop {
        let leadership = election.campaign().await?;
        let epoch = leadership.epoch();
        println!("scheduler {n}: elected, epoch {epoch}");
        for tick in 1.. {
            tokio::select! {
                () = leadership.lost() => break,
                () = tokio::time::sleep(TICK) => println!("scheduler {n}: tick {tick} (epoch {epoch})"),
            }
        }
        println!("scheduler {n}: lost the leadership");
    }
}

/// Kills every child still running when dropped (an early return).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn parent() -> ExitCode {
    let shared = ["LOCK_REDIS_URL", "LOCK_ETCD_ENDPOINTS"];
    if !shared.iter().any(|var| std::env::var_os(var).is_some()) {
        eprintln!(
            "election: three processes need a backend they share: set LOCK_REDIS_URL \
             (e.g. redis://127.0.0.1:6379/) or LOCK_ETCD_ENDPOINTS"
        );
        return ExitCode::from(2);
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("election: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let name = format!("example:scheduler:{}", std::process::id());
    let (tx, lines) = mpsc::channel();
    let mut children = Children(Vec::new());
    for n in 1..=3 {
        let mut child = Command::new(&exe)
            .args(["campaign", &name, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start scheduler {n}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send((n - 1, line));
            }
        });
        children.0.push(child);
    }
    println!("three schedulers campaign for {name} (ttl {TTL:?})");
    let mut killed: Option<Instant> = None;
    loop {
        let (i, line) = lines
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "no scheduler said anything for 20 s")?;
        println!("{line}");
        if line.contains(": elected,")
            && let Some(at) = killed
        {
            let took = at.elapsed();
            println!("  -> taken over {took:?} after the kill (ttl {TTL:?})");
            if took > TTL + TICK {
                return Err(format!("the take-over took {took:?}"));
            }
        }
        if !line.contains(&format!(": tick {TICKS} (")) {
            continue;
        }
        if killed.is_some() {
            break;
        }
        println!("  -> SIGKILL scheduler {}", i + 1);
        children.0[i].kill().map_err(|e| e.to_string())?;
        killed = Some(Instant::now());
    }
    // Closing their stdin stops the others: the leader resigns, the rest stop campaigning.
    for child in &mut children.0 {
        drop(child.stdin.take());
        child.wait().map_err(|e| e.to_string())?;
    }
    println!("done: the schedule ran on one process at a time");
    Ok(())
}
