//! The nemesis: injects faults at random times, several at once on different targets, each
//! healed by itself within a bounded time, and logs each one ([`Fault`]).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::clock::{self, FakeClock};
use super::record::{Fault, FaultKind};
use crate::history::now_ns;

/// What an action reports once its fault is healed: when it began and ended.
pub type Span = (u64, u64);

/// Injects a fault, waits, heals it: see [`Action`].
pub type Inject<'a> = dyn Fn(&mut fastrand::Rng) -> Option<Span> + Send + Sync + 'a;

/// One fault the nemesis may inject. `run` injects it, waits (its duration is its own random
/// pick), heals it and returns when, or `None` when it could not be injected (nothing is logged).
pub struct Action<'a> {
    /// Its kind.
    pub kind: FaultKind,
    /// What it hits: two actions on one target never run at once.
    pub target: String,
    /// For a worker pause, the worker's pid.
    pub pid: Option<u32>,
    /// Two actions of one lane never run at once either, whatever their targets (the clock
    /// steps of Redlock's nodes: one node at a time).
    pub lane: Option<String>,
    /// The lock servers it hits, by index (or those behind the link it hits).
    pub servers: Vec<usize>,
    /// Injects, waits, heals.
    pub run: Box<Inject<'a>>,
}

impl std::fmt::Debug for Action<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Action")
            .field("kind", &self.kind)
            .field("target", &self.target)
            .field("pid", &self.pid)
            .field("lane", &self.lane)
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

impl<'a> Action<'a> {
    /// An action of `kind` on `target`.
    pub fn new(
        kind: FaultKind,
        target: impl Into<String>,
        run: impl Fn(&mut fastrand::Rng) -> Option<Span> + Send + Sync + 'a,
    ) -> Action<'a> {
        Action {
            kind,
            target: target.into(),
            pid: None,
            lane: None,
            servers: Vec::new(),
            run: Box::new(run),
        }
    }
}

/// How the nemesis schedules.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// No fault starts after this.
    pub until: Instant,
    /// At most this many faults at once.
    pub at_once: usize,
    /// Between two fault starts: a random pause in this range, in ms.
    pub gap_ms: (u64, u64),
    /// Seeds every random choice.
    pub seed: u64,
}

/// Runs random actions (a random kind, then a random free target of it) until `schedule.until`, then waits for those still running to heal
/// (each heals itself within its own bound) and returns the log, in start order.
pub fn run(actions: &[Action<'_>], schedule: Schedule) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(schedule.seed);
    let busy: Mutex<BTreeSet<&str>> = Mutex::new(BTreeSet::new());
    let log: Mutex<Vec<Fault>> = Mutex::new(Vec::new());
    // A panicking action fails the campaign at the end of the scope; until then the locks stay
    // usable (poison is ignored).
    thread::scope(|scope| {
        while Instant::now() < schedule.until {
            let gap = Duration::from_millis(rng.u64(schedule.gap_ms.0..=schedule.gap_ms.1));
            thread::sleep(gap.min(schedule.until.saturating_duration_since(Instant::now())));
            if Instant::now() >= schedule.until {
                break;
            }
            let free: Vec<&Action<'_>> = {
                let busy = busy.lock().unwrap_or_else(PoisonError::into_inner);
                if busy.len() >= schedule.at_once {
                    continue;
                }
                actions
                    .iter()
                    .filter(|a| {
                        !busy.contains(a.target.as_str())
                            && a.lane.as_deref().is_none_or(|lane| !busy.contains(lane))
                    })
                    .collect()
            };
            // A kind first, then one of its actions: kinds with many targets (a pause per
            // worker) do not crowd out the others.
            let mut kinds: Vec<FaultKind> = free.iter().map(|a| a.kind).collect();
            kinds.sort_unstable();
            kinds.dedup();
            let Some(&kind) = kinds.get(rng.usize(0..kinds.len().max(1))) else {
                continue;
            };
            let of_kind: Vec<&Action<'_>> = free.into_iter().filter(|a| a.kind == kind).collect();
            let Some(&action) = of_kind.get(rng.usize(0..of_kind.len().max(1))) else {
                continue;
            };
            {
                let mut busy = busy.lock().unwrap_or_else(PoisonError::into_inner);
                busy.insert(&action.target);
                busy.extend(action.lane.as_deref());
            }
            let mut own = fastrand::Rng::with_seed(rng.u64(..));
            let (busy, log) = (&busy, &log);
            scope.spawn(move || {
                let span = (action.run)(&mut own);
                {
                    let mut busy = busy.lock().unwrap_or_else(PoisonError::into_inner);
                    busy.remove(action.target.as_str());
                    if let Some(lane) = action.lane.as_deref() {
                        busy.remove(lane);
                    }
                }
                if let Some((start_ns, end_ns)) = span {
                    log.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Fault {
                            kind: action.kind,
                            target: action.target.clone(),
                            pid: action.pid,
                            servers: action.servers.clone(),
                            start_ns,
                            end_ns,
                        });
                }
            });
        }
    });
    let mut faults = log.into_inner().unwrap_or_else(PoisonError::into_inner);
    faults.sort_by_key(|f| f.start_ns);
    faults
}

/// Runs `inject`, then sleeps `hold`, then runs `heal`, and returns when it began and ended.
pub fn for_a_while(inject: impl FnOnce(), hold: Duration, heal: impl FnOnce()) -> Option<Span> {
    let start = now_ns();
    inject();
    thread::sleep(hold);
    heal();
    Some((start, now_ns()))
}

/// Pauses worker `pid` (SIGSTOP) for `hold`, then resumes it (SIGCONT, also if this thread
/// unwinds meanwhile). The span is exact for the checker: it begins once every thread of the
/// worker has stopped and ends before the worker is resumed, so each clock reading the worker
/// records is before its start or after its end. (The start used to be read before the signal
/// was sent: a worker that read the clock in the microseconds before the signal took effect
/// then looked as if it had taken a reading while paused, and its acquire's return came 78 µs
/// "after" the pause began: CI, seed 595693.)
pub fn pause_process(pid: u32, hold: Duration) -> Option<Span> {
    struct Resume(Pid);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = kill(self.0, Signal::SIGCONT);
        }
    }
    let process = Pid::from_raw(i32::try_from(pid).ok()?);
    kill(process, Signal::SIGSTOP).ok()?;
    let resume = Resume(process);
    wait_stopped(pid);
    let start = now_ns();
    thread::sleep(hold);
    let end = now_ns();
    drop(resume);
    Some((start, end))
}

/// How long a stop signal may take to stop every thread of a process (a thread running on
/// another core stops at its next interrupt); past it the pause is recorded as begun anyway.
const STOP_TAKES_EFFECT: Duration = Duration::from_secs(1);

/// Waits until every thread of process `pid` is stopped (its `/proc` state `T`), at most
/// [`STOP_TAKES_EFFECT`]; a process that is gone is stopped enough.
fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + STOP_TAKES_EFFECT;
    while !all_stopped(pid) && Instant::now() < deadline {
        thread::sleep(Duration::from_micros(100));
    }
}

fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        // `pid (comm) S ...`: the state follows the last `)` (a command name may hold one).
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}

/// How much longer than a ttl a worker pause lasts, in ms: the pause outlasts every validity.
const PAUSE_PAST_TTL_MS: (u64, u64) = (200, 800);

/// The longest worker pause under `ttl` ([`pause_action`]).
pub fn longest_pause(ttl: Duration) -> Duration {
    ttl + Duration::from_millis(PAUSE_PAST_TTL_MS.1)
}

/// A worker pause on `pid` lasting a ttl plus 200-800ms.
pub fn pause_action<'a>(pid: u32, worker: usize, ttl: Duration) -> Action<'a> {
    let (least, most) = PAUSE_PAST_TTL_MS;
    let mut action = Action::new(
        FaultKind::ClientPause,
        format!("worker {worker}"),
        move |rng| pause_process(pid, ttl + Duration::from_millis(rng.u64(least..=most))),
    );
    action.pid = Some(pid);
    action
}

/// Steps the clocks of the servers `(clock, port)` to `offset_ms` for `hold`, then back to 0
/// (also if this thread unwinds meanwhile); checks each server's `TIME` after either step
/// (one that does not answer, frozen or down, is not checked).
pub fn step_clocks(servers: &[(&FakeClock, u16)], offset_ms: i64, hold: Duration) -> Option<Span> {
    struct Return<'s, 'c>(&'s [(&'c FakeClock, u16)]);
    impl Drop for Return<'_, '_> {
        fn drop(&mut self) {
            for (clock, _) in self.0 {
                clock.set(0);
            }
        }
    }
    let start = now_ns();
    for (clock, _) in servers {
        clock.set(offset_ms);
    }
    let back = Return(servers);
    confirm_offsets(servers, offset_ms);
    thread::sleep(hold);
    drop(back);
    let end = now_ns();
    confirm_offsets(servers, 0);
    Some((start, end))
}

fn confirm_offsets(servers: &[(&FakeClock, u16)], offset_ms: i64) {
    let tolerance = i64::try_from(clock::TOLERANCE.as_millis()).unwrap_or(i64::MAX);
    for &(_, port) in servers {
        let seen = quick_connection(port).and_then(|mut con| clock::server_offset(&mut con));
        if let Some(seen) = seen {
            assert!(
                (seen - offset_ms).abs() <= tolerance,
                "the server on port {port} is {seen} ms off the real clock, asked {offset_ms} ms: \
                 libfaketime does not step it"
            );
        }
    }
}

/// A sync connection to 127.0.0.1:`port` with short timeouts, or `None` if it does not answer.
pub fn quick_connection(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let timeout = Duration::from_millis(500);
    let con = client.get_connection_with_timeout(timeout).ok()?;
    con.set_read_timeout(Some(timeout)).ok()?;
    con.set_write_timeout(Some(timeout)).ok()?;
    Some(con)
}

/// `CLIENT KILL TYPE normal SKIPME yes` on the servers on `ports` (those that answer).
pub fn kill_clients(ports: &[u16]) -> Option<Span> {
    let start = now_ns();
    let mut killed = 0;
    for &port in ports {
        if let Some(mut con) = quick_connection(port) {
            let answer: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes")
                .query(&mut con);
            killed += answer.unwrap_or(0);
        }
    }
    (killed > 0).then(|| (start, now_ns()))
}
