//! The campaign runner: one backend at a time, a topology with a fault proxy in front of each
//! lock server where clients can be pointed at one, `campaign_worker` processes, the nemesis over
//! the faults that topology allows, a quiet phase, the checker, and a summary row.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::check::{self, Bounds, Report};
use super::clock::FakeClock;
use super::nemesis::{
    self, Action, Schedule, Span, for_a_while, kill_clients, pause_action, step_clocks,
};
use super::record::{self, FaultKind, WriteResult};
use super::workload::register_keys;
use crate::history::now_ns;
use crate::{
    FaultProxy, RedisCluster, RedisServer, SentinelOptions, SentinelSet, ServerOptions, Worker,
    finish_all, lock_keys, unique_key,
};

/// The workers' connect and response timeouts (see `campaign_worker`): one request timeout.
const REQUEST: Duration = Duration::from_millis(700);
/// Scheduling slack on a loaded 2-core machine, on the wait bound and the heal bound.
const SLACK: Duration = Duration::from_secs(1);
/// How long a failover or a replica's take-over may take before the nemesis gives up on it.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long and how hard a campaign runs.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The `campaign_worker` binary (a snapshot of it).
    pub worker_bin: String,
    /// Where the snapshot lives, removed with the last clone of the profile.
    _snapshot: Option<Arc<TempDir>>,
    /// Per backend: faults, then the quiet phase.
    pub run_for: Duration,
    /// The final phase without faults.
    pub quiet: Duration,
    /// Worker processes (each runs one sync and two async tasks).
    pub workers: usize,
    /// The ttl every lock asks for.
    pub ttl: Duration,
    /// Seeds the workloads and the nemesis.
    pub seed: u64,
}

impl Profile {
    /// The quick profile (20 s per backend, 3 workers), or from the environment:
    /// `LOCK_CAMPAIGN=long` runs 10 minutes per backend with 4 workers,
    /// `LOCK_CAMPAIGN_SECS=N` N seconds per backend, `LOCK_CAMPAIGN_SEED=S` replays a seed
    /// (default: from the clock, printed in the summary).
    pub fn from_env(worker_bin: &str) -> Profile {
        let long = std::env::var("LOCK_CAMPAIGN").is_ok_and(|v| v == "long");
        let secs = std::env::var("LOCK_CAMPAIGN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(if long { 600 } else { 20 });
        let seed = std::env::var("LOCK_CAMPAIGN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| now_ns() % 1_000_000);
        let (worker_bin, snapshot) = snapshot(worker_bin);
        Profile {
            worker_bin,
            _snapshot: snapshot,
            run_for: Duration::from_secs(secs.max(8)),
            quiet: Duration::from_secs(5),
            workers: if long { 4 } else { 3 },
            ttl: Duration::from_millis(1500),
            seed,
        }
    }

    fn millis(&self, rng: &mut fastrand::Rng, from: Duration, to: Duration) -> Duration {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rng.u64(ms(from)..=ms(to).max(ms(from))))
    }
}

/// A copy of `binary` in a directory of its own, and the directory (or `binary` itself when it
/// cannot be copied): a build of the workspace with other features, running meanwhile on the same
/// target directory, replaces the original (and a worker without the `etcd` feature cannot take
/// etcd locks).
fn snapshot(binary: &str) -> (String, Option<Arc<TempDir>>) {
    let Ok(dir) = tempfile::Builder::new()
        .prefix("lock-tests-campaign-")
        .tempdir()
    else {
        return (binary.to_owned(), None);
    };
    let copy = dir.path().join("campaign_worker");
    match std::fs::copy(binary, &copy) {
        Ok(_) => (copy.display().to_string(), Some(Arc::new(dir))),
        Err(_) => (binary.to_owned(), None),
    }
}

/// What one backend's campaign saw.
#[derive(Debug)]
pub struct Summary {
    /// The backend.
    pub backend: &'static str,
    /// The checker's findings and counts.
    pub report: Report,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    /// Every fault, in start order.
    pub fault_log: Vec<record::Fault>,
    /// Accepted and rejected writes, as the register's own counters say.
    pub register: (u64, u64),
    /// Wall time, topology start included.
    pub took: Duration,
    /// The seed.
    pub seed: u64,
    /// Where the history was saved (when there were violations): [`check::check_saved`] reads
    /// it again.
    pub history: Option<std::path::PathBuf>,
}

impl Summary {
    /// Every violation, with the history lines that prove it (empty when clean), and any
    /// disagreement between the register's counters and the recorded writes.
    pub fn problems(&self) -> String {
        let mut out = String::new();
        if let Some(path) = &self.history {
            let _ = writeln!(
                out,
                "[{}] history saved in {}",
                self.backend,
                path.display()
            );
        }
        for v in self.report.violations.iter().take(10) {
            let _ = writeln!(out, "[{}] {v}", self.backend);
        }
        if self.report.violations.len() > 10 {
            let _ = writeln!(out, "... {} in all", self.report.violations.len());
        }
        if !self.report.violations.is_empty() {
            let _ = writeln!(out, "[{}] the faults:", self.backend);
            for fault in &self.fault_log {
                let _ = writeln!(out, "  {fault}");
            }
        }
        let recorded = |r| self.report.writes.get(&r).copied().unwrap_or(0) as u64;
        let counted = (
            recorded(WriteResult::Accepted),
            recorded(WriteResult::Rejected),
        );
        let unknown = recorded(WriteResult::Error);
        if !counts_agree(self.register, counted, unknown) {
            let _ = writeln!(
                out,
                "[{}] the register counted {:?} writes (accepted, rejected), the workers recorded \
                 {counted:?} and {unknown} whose answer they did not get",
                self.backend, self.register
            );
        }
        out
    }
}

/// Whether the register's own counts agree with the workers' records: every recorded answer was
/// counted, and the register counted no more than those plus the writes whose answer a worker did
/// not get (a worker stopped past its write's timeout with the reply unread, a reset link): such
/// a write may or may not have reached the register, and nothing else may be counted.
fn counts_agree(register: (u64, u64), recorded: (u64, u64), unknown: u64) -> bool {
    let (accepted, rejected) = register;
    let (seen_accepted, seen_rejected) = recorded;
    accepted >= seen_accepted
        && rejected >= seen_rejected
        && (accepted - seen_accepted) + (rejected - seen_rejected) <= unknown
}

impl Summary {
    /// The first documented-limit token drop, with its fault and the history lines (empty when
    /// there was none): what a backward clock step did to the tokens.
    pub fn token_drop_example(&self) -> String {
        self.report
            .documented_fences
            .first()
            .map(|(v, fault)| format!("[{}] {v}\n  during {fault}\n", self.backend))
            .unwrap_or_default()
    }
}

/// The summary table of `summaries`, one row per backend.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "backend  | secs | ops   | acquired | contended | unavailable | other | release lost | \
         violations | documented (fenced) | writes ok / stale rejected / unanswered | paused acquires | faults\n",
    );
    for s in summaries {
        let r = &s.report;
        let n = |o| r.outcomes.get(&o).copied().unwrap_or(0);
        let mut faults: Vec<String> = s.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let mut explained: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for fault in r.documented.iter().filter_map(|o| o.fault.as_ref()) {
            *explained.entry(fault.kind).or_default() += 1;
        }
        if !explained.is_empty() {
            let by: Vec<String> = explained.iter().map(|(k, n)| format!("{k} {n}")).collect();
            faults.push(format!("documented overlaps during: {}", by.join(", ")));
        }
        if r.paused_waiter_overlaps > 0 {
            faults.push(format!(
                "overlaps with a waiter paused (violations): {}",
                r.paused_waiter_overlaps
            ));
        }
        let mut drops: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for (_, fault) in &r.documented_fences {
            *drops.entry(fault.kind).or_default() += 1;
        }
        if !drops.is_empty() {
            let by: Vec<String> = drops.iter().map(|(k, n)| format!("{k} {n}")).collect();
            faults.push(format!("documented token drops during: {}", by.join(", ")));
        }
        faults.push(match r.heal_checked {
            Some(keys) => format!("heal check: {keys} keys"),
            None => "heal check skipped (its window ended after the workers)".to_owned(),
        });
        let _ = writeln!(
            out,
            "{:<8} | {:>4} | {:>5} | {:>8} | {:>9} | {:>11} | {:>5} | {:>12} | {:>10} | {:>10} ({:>2})     | {:>8} / {:>5} / {:<15} | {:>15} | {} (seed {})",
            s.backend,
            s.took.as_secs(),
            r.outcomes.values().sum::<usize>(),
            n(record::Outcome::Acquired),
            n(record::Outcome::Contended),
            n(record::Outcome::Unavailable),
            n(record::Outcome::Lost) + n(record::Outcome::Failed),
            r.releases.get(&record::Release::Lost).copied().unwrap_or(0),
            r.violations.len(),
            r.documented.len(),
            r.documented_fenced,
            s.register.0,
            s.register.1,
            r.writes.get(&WriteResult::Error).copied().unwrap_or(0),
            r.paused_acquires,
            faults.join(", "),
            s.seed,
        );
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Key prefix of one campaign, without a hash tag: on Cluster each lock lives in a slot of its
/// own.
fn key_prefix() -> String {
    format!("{}:", unique_key("campaign"))
}

/// A key prefix whose locks' slots are served by at least two masters of `cluster` (a master
/// kill then takes a part of the keys away, not all of them), and those slots.
fn spread_keys(cluster: &RedisCluster) -> (String, Vec<u16>) {
    // The five locks land on one master of three with probability 3 / 3^5 = 1/81: twenty tries
    // all fail with probability 81^-20.
    for _ in 0..20 {
        let prefix = key_prefix();
        let slots: Vec<u16> = super::workload::keys(&prefix)
            .iter()
            .map(|key| cluster.slot_of(&lock_keys(key).lock))
            .collect();
        let masters: BTreeSet<u16> = slots
            .iter()
            .map(|&slot| cluster.master_of_slot(slot).port())
            .collect();
        if masters.len() >= 2 {
            return (prefix, slots);
        }
    }
    panic!("twenty key prefixes each put every campaign lock on one cluster master");
}

/// What a campaign runs against.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Its name in the summary.
    backend: &'static str,
    /// The backend argument of `campaign_worker`.
    worker: &'static str,
    /// How many lock servers a grant needs ([`Bounds::quorum`]).
    quorum: usize,
    /// Whether the nemesis also pauses workers.
    pauses: bool,
    /// How long a key whose holder stopped may outlive the heal ([`Bounds::linger_ns`]); `None`:
    /// the ttl.
    linger: Option<Duration>,
}

impl Setup {
    fn new(backend: &'static str, quorum: usize) -> Setup {
        Setup {
            backend,
            worker: backend,
            quorum,
            pauses: true,
            linger: None,
        }
    }
}

/// Runs `workers` against `urls` while the nemesis runs `actions` (and pauses workers), then
/// checks the history.
fn campaign(
    profile: &Profile,
    setup: Setup,
    urls: &[String],
    prefix: &str,
    actions: Vec<Action<'_>>,
    started: Instant,
) -> Summary {
    let backend = setup.backend;
    let data = RedisServer::start();
    let run_ms = profile.run_for.as_millis().to_string();
    let ttl_ms = profile.ttl.as_millis().to_string();
    let start_ns = now_ns();
    let start = Instant::now();
    let mut workers: Vec<Worker> = (0..profile.workers)
        .map(|i| {
            let seed = (profile.seed * 31 + i as u64).to_string();
            Worker::spawn(
                &profile.worker_bin,
                &[
                    setup.worker,
                    &urls.join(","),
                    &data.url(),
                    prefix,
                    &run_ms,
                    &seed,
                    &ttl_ms,
                ],
            )
        })
        .collect();
    let mut actions = actions;
    for (i, worker) in workers.iter().enumerate().filter(|_| setup.pauses) {
        actions.push(pause_action(worker.pid(), i, profile.ttl));
    }
    let schedule = Schedule {
        until: start + profile.run_for.saturating_sub(profile.quiet),
        at_once: 3,
        gap_ms: (150, 900),
        seed: profile.seed,
    };
    let faults = nemesis::run(&actions, schedule);
    let healed_ns = now_ns();
    let outputs = finish_all(&mut workers, profile.run_for + Duration::from_secs(30));
    let (mut ops, mut writes) = (Vec::new(), Vec::new());
    for (i, out) in outputs.iter().enumerate() {
        out.assert_success(&format!("{backend} worker {i}"));
        let (o, w) = record::parse_lines(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
        ops.extend(o);
        writes.extend(w);
    }
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let bounds = Bounds {
        ttl_ns: nanos(profile.ttl),
        request_ns: nanos(REQUEST),
        slack_ns: nanos(SLACK),
        healed_ns,
        end_ns: start_ns + nanos(profile.run_for),
        quorum: setup.quorum,
        clock_step_ns: nanos(3 * profile.ttl),
        linger_ns: nanos(setup.linger.unwrap_or(profile.ttl)),
    };
    let report = check::check(&ops, &writes, &faults, &bounds);
    let history = (!report.is_clean())
        .then(|| save_history(backend, profile.seed, &bounds, &ops, &writes, &faults))
        .flatten();
    let mut faults_by_kind = BTreeMap::new();
    for fault in &faults {
        *faults_by_kind.entry(fault.kind).or_default() += 1;
    }
    Summary {
        backend,
        report,
        faults: faults_by_kind,
        fault_log: faults,
        register: register_counts(&data, prefix),
        took: started.elapsed(),
        seed: profile.seed,
        history,
    }
}

/// Writes a history with violations to a file of its own in the temporary directory, as lines
/// [`check::check_saved`] reads, and returns its path (`None` when it cannot be written).
fn save_history(
    backend: &str,
    seed: u64,
    bounds: &Bounds,
    ops: &[record::Op],
    writes: &[record::Write],
    faults: &[record::Fault],
) -> Option<std::path::PathBuf> {
    let mut text = format!("{bounds}\n");
    for line in faults
        .iter()
        .map(ToString::to_string)
        .chain(ops.iter().map(ToString::to_string))
        .chain(writes.iter().map(ToString::to_string))
    {
        text.push_str(&line);
        text.push('\n');
    }
    let path = std::env::temp_dir().join(format!(
        "lock-campaign-{backend}-seed-{seed}-{}.history",
        now_ns()
    ));
    std::fs::write(&path, text).ok()?;
    Some(path)
}

/// The register's own counts of accepted and rejected writes, over every key of the run.
fn register_counts(data: &RedisServer, prefix: &str) -> (u64, u64) {
    let mut con = data.admin();
    let mut count = |part: usize| -> u64 {
        super::workload::keys(prefix)
            .iter()
            .map(|key| {
                redis::cmd("GET")
                    .arg(&register_keys(key)[part])
                    .query::<Option<u64>>(&mut con)
                    .unwrap_or(None)
                    .unwrap_or(0)
            })
            .sum()
    };
    (count(1), count(2))
}

/// `action`, hitting lock server `i` (or the link to it).
fn hitting(i: usize, mut action: Action<'_>) -> Action<'_> {
    action.servers = vec![i];
    action
}

/// How hard the link faults hit: the latency each way and how long a blackhole lasts, at most.
#[derive(Debug, Clone, Copy)]
struct LinkLimits {
    delay: Duration,
    blackhole: Duration,
}

impl LinkLimits {
    /// Up to 300 ms each way, a blackhole up to two ttls.
    fn of(profile: &Profile) -> LinkLimits {
        LinkLimits {
            delay: Duration::from_millis(300),
            blackhole: 2 * profile.ttl,
        }
    }
}

/// Latency (from 20 ms, for 0.5-3 s), blackhole (from 200 ms) and reset on each proxy.
fn link_actions<'a>(
    proxies: &'a [FaultProxy],
    limits: LinkLimits,
    profile: &Profile,
) -> Vec<Action<'a>> {
    let mut actions = Vec::new();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    for (i, proxy) in proxies.iter().enumerate() {
        let target = format!("link {i}");
        let p = profile.clone();
        actions.push(hitting(
            i,
            Action::new(FaultKind::Latency, &target, move |rng| {
                let delay = Duration::from_millis(rng.u64(20..=ms(limits.delay).max(20)));
                let hold = p.millis(rng, Duration::from_millis(500), Duration::from_secs(3));
                for_a_while(
                    || proxy.set_delay(delay),
                    hold,
                    || proxy.set_delay(Duration::ZERO),
                )
            }),
        ));
        let p = profile.clone();
        actions.push(hitting(
            i,
            Action::new(FaultKind::Blackhole, &target, move |rng| {
                let hold = p.millis(rng, Duration::from_millis(200), limits.blackhole);
                for_a_while(
                    || proxy.set_blackhole(true),
                    hold,
                    || proxy.set_blackhole(false),
                )
            }),
        ));
        actions.push(hitting(
            i,
            Action::new(FaultKind::Cut, &target, move |_| {
                let start = now_ns();
                proxy.cut_all();
                Some((start, now_ns()))
            }),
        ));
    }
    actions
}

/// Freeze (up to two ttls), kill (restarted at once without data, or after `down` for Redlock)
/// and `CLIENT KILL` of each server.
fn node_actions<'a>(
    servers: &'a [Mutex<RedisServer>],
    down: Option<Duration>,
    profile: &Profile,
) -> Vec<Action<'a>> {
    let mut actions = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let target = format!("node {i}");
        let port = lock(server).port();
        let p = profile.clone();
        actions.push(hitting(
            i,
            Action::new(FaultKind::Freeze, &target, move |rng| {
                let hold = p.millis(rng, Duration::from_millis(100), 2 * p.ttl);
                for_a_while(|| lock(server).freeze(), hold, || lock(server).thaw())
            }),
        ));
        let p = profile.clone();
        let kind = if down.is_some() {
            FaultKind::Kill
        } else {
            FaultKind::Restart
        };
        actions.push(hitting(
            i,
            Action::new(kind, &target, move |rng| {
                let hold =
                    down.map_or(Duration::ZERO, |d| d + p.millis(rng, Duration::ZERO, p.ttl));
                for_a_while(|| lock(server).stop(), hold, || lock(server).restart())
            }),
        ));
        actions.push(hitting(
            i,
            Action::new(FaultKind::ClientKill, &target, move |_| {
                kill_clients(&[port])
            }),
        ));
    }
    actions
}

/// `n` Redis servers (in parallel), each under a fake clock of its own.
fn servers_with_clocks(n: usize) -> (Vec<Mutex<RedisServer>>, Vec<FakeClock>) {
    let clocks: Vec<FakeClock> = (0..n).map(|_| FakeClock::new()).collect();
    let servers = thread::scope(|scope| {
        let handles: Vec<_> = clocks
            .iter()
            .map(|clock| {
                scope.spawn(|| {
                    RedisServer::start_with(ServerOptions {
                        env: clock.env(),
                        ..ServerOptions::default()
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| Mutex::new(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))))
            .collect()
    });
    (servers, clocks)
}

/// When the fault phase of a campaign set up now ends (a little before the nemesis stops).
fn fault_phase_end(profile: &Profile) -> Instant {
    Instant::now() + profile.run_for.saturating_sub(profile.quiet)
}

/// A clock step of each server ahead by one to three ttls, and one back by as much, each for
/// 200 ms to a ttl; in `lane` (one server at a time) if given. A step ahead starts only if its
/// aftermath is over before `phase_end`: keys set meanwhile expire that much late.
fn clock_actions<'a>(
    servers: &'a [Mutex<RedisServer>],
    clocks: &'a [FakeClock],
    lane: Option<&str>,
    profile: &Profile,
    phase_end: Instant,
) -> Vec<Action<'a>> {
    let mut actions = Vec::new();
    for (i, (server, clock)) in servers.iter().zip(clocks).enumerate() {
        let port = lock(server).port();
        for (kind, sign) in [(FaultKind::ClockForward, 1), (FaultKind::ClockBack, -1)] {
            let p = profile.clone();
            let mut action = Action::new(kind, format!("clock {i}"), move |rng| {
                let step = p.millis(rng, p.ttl, 3 * p.ttl);
                let hold = p.millis(rng, Duration::from_millis(200), p.ttl);
                let aftermath = if sign > 0 { step } else { Duration::ZERO };
                if Instant::now() + hold + aftermath >= phase_end {
                    return None;
                }
                step_clocks(&[(clock, port)], sign * millis_i64(step), hold)
            });
            action.lane = lane.map(str::to_owned);
            action.servers = vec![i];
            actions.push(action);
        }
    }
    actions
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One Redis node behind a fault proxy, under a fake clock.
pub fn single(profile: &Profile) -> Summary {
    let started = Instant::now();
    let (servers, clocks) = servers_with_clocks(1);
    let proxies = [FaultProxy::start(lock(&servers[0]).port())];
    let mut actions = node_actions(&servers, None, profile);
    actions.extend(link_actions(&proxies, LinkLimits::of(profile), profile));
    let phase_end = fault_phase_end(profile);
    actions.extend(clock_actions(&servers, &clocks, None, profile, phase_end));
    let urls = [proxies[0].url()];
    let setup = Setup::new("single", 1);
    campaign(profile, setup, &urls, &key_prefix(), actions, started)
}

/// Redlock over 5 nodes, each behind a fault proxy and under a fake clock, fencing on; a killed
/// node stays down for more than a ttl (Redlock's assumption for restarts without persistence);
/// one node's clock steps at a time (a minority: no documented limit).
pub fn redlock(profile: &Profile) -> Summary {
    let started = Instant::now();
    let (servers, clocks) = servers_with_clocks(5);
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(lock(s).port()))
        .collect();
    let down = profile.ttl + Duration::from_millis(300);
    let mut actions = node_actions(&servers, Some(down), profile);
    actions.extend(link_actions(&proxies, LinkLimits::of(profile), profile));
    let phase_end = fault_phase_end(profile);
    actions.extend(clock_actions(
        &servers,
        &clocks,
        Some("clocks"),
        profile,
        phase_end,
    ));
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let setup = Setup::new("redlock", 3);
    campaign(profile, setup, &urls, &key_prefix(), actions, started)
}

/// The nodes whose clocks [`redlock_majority_clock`] steps: a majority of 5.
const MAJORITY: [usize; 3] = [0, 1, 2];

/// Redlock's clock assumption, shown: 5 nodes (fencing on, no other fault, no pauses) whose
/// clocks 0, 1 and 2 step ahead together, by 1.2 to 1.6 ttls for 300-800 ms, again and again
/// for 9 s, then a quiet phase of 4 s. Each step expires the holders' keys on a majority at once,
/// so another worker is granted the lock while the holder still believes it holds it: overlaps
/// the checker must classify as documented (a clock step on a quorum), with the register refusing
/// the stale holder's writes.
pub fn redlock_majority_clock(profile: &Profile) -> Summary {
    let started = Instant::now();
    let profile = Profile {
        run_for: Duration::from_secs(13),
        quiet: Duration::from_secs(4),
        ..profile.clone()
    };
    let (servers, clocks) = servers_with_clocks(5);
    let stepped: Vec<(&FakeClock, u16)> = MAJORITY
        .iter()
        .map(|&i| (&clocks[i], lock(&servers[i]).port()))
        .collect();
    let phase_end = fault_phase_end(&profile);
    let p = profile.clone();
    let stepped = &stepped;
    let mut step = Action::new(FaultKind::ClockForward, "clocks 0,1,2", move |rng| {
        let ahead = p.millis(rng, p.ttl * 6 / 5, p.ttl * 8 / 5);
        let hold = p.millis(rng, Duration::from_millis(300), Duration::from_millis(800));
        if Instant::now() + hold + ahead >= phase_end {
            return None;
        }
        step_clocks(stepped, millis_i64(ahead), hold)
    });
    step.servers = MAJORITY.to_vec();
    let urls: Vec<String> = servers.iter().map(|s| lock(s).url()).collect();
    let setup = Setup {
        backend: "redlock-majority-clock",
        worker: "redlock",
        quorum: 3,
        pauses: false,
        linger: None,
    };
    campaign(&profile, setup, &urls, &key_prefix(), vec![step], started)
}

/// The sentinels' down-after time in the campaign: five times the harness's 1 s, so that the
/// link faults and freezes, which the sentinels see too, never make them fail the master over by
/// themselves (a blackhole of 300 ms right after a forced failover, on a loaded machine, had them
/// call the new master down and fail back: seed 12). The campaign's failovers are forced, so they
/// do not wait for it.
const SENTINEL_DOWN_AFTER: Duration = Duration::from_secs(5);

/// How long a freeze or a link fault may silence a Sentinel data node: together they stay far
/// under [`SENTINEL_DOWN_AFTER`].
const SENTINEL_SILENCE: Duration = Duration::from_millis(700);

/// Sentinel (master, replica, 3 sentinels), each data node behind a fault proxy that clients,
/// sentinels and the replication link all go through (the nodes announce the proxies' ports):
/// forced failovers, short freezes of either data node, latency, blackholes and resets on their
/// links, `CLIENT KILL` on the master. Together they silence the master for at most
/// [`SENTINEL_SILENCE`].
pub fn sentinel(profile: &Profile) -> Summary {
    let started = Instant::now();
    let set = SentinelSet::start_with(SentinelOptions {
        proxied: true,
        down_after: Some(SENTINEL_DOWN_AFTER),
        ..SentinelOptions::default()
    });
    let urls = set.sentinel_urls();
    let set_ref = &set;
    const FREEZE: Duration = Duration::from_millis(400);
    let links = LinkLimits {
        delay: SENTINEL_SILENCE.saturating_sub(FREEZE) / 2,
        blackhole: SENTINEL_SILENCE.saturating_sub(FREEZE),
    };
    let p = profile;
    let freeze = move |rng: &mut fastrand::Rng, master: bool| -> Option<Span> {
        let master_index = set_ref.index_of(set_ref.master_port()?)?;
        let index = if master {
            master_index
        } else {
            1 - master_index
        };
        let hold = p.millis(rng, Duration::from_millis(100), FREEZE);
        for_a_while(
            || set_ref.data[index].freeze(),
            hold,
            || set_ref.data[index].thaw(),
        )
    };
    let mut actions = vec![
        Action::new(FaultKind::Failover, "topology", move |_| fail_over(set_ref)),
        Action::new(FaultKind::Freeze, "topology", move |rng| freeze(rng, true)),
        Action::new(FaultKind::Freeze, "topology", move |rng| freeze(rng, false)),
        Action::new(FaultKind::ClientKill, "clients", move |_| {
            kill_clients(&[set_ref.master_port()?])
        }),
    ];
    actions.extend(link_actions(&set.proxies, links, profile));
    let summary = campaign(
        profile,
        Setup::new("sentinel", 1),
        &urls,
        &key_prefix(),
        actions,
        started,
    );
    let switches = switch_masters(&set);
    let logged = summary
        .faults
        .get(&FaultKind::Failover)
        .copied()
        .unwrap_or(0);
    assert_eq!(
        switches, logged,
        "the sentinels switched masters {switches} times, the nemesis asked {logged} times: a \
         freeze or a link fault caused a failover the checker does not know of"
    );
    summary
}

/// `SENTINEL FAILOVER`, then until the other node is master and its new replica's link is up.
fn fail_over(set: &SentinelSet) -> Option<Span> {
    let old = set.master_port()?;
    let sentinel = set.sentinels[0].port();
    let start = now_ns();
    let mut con = nemesis::quick_connection(sentinel)?;
    let asked: redis::RedisResult<()> = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SentinelSet::MASTER_NAME)
        .query(&mut con);
    // Refused (say, no replica in sync yet): nothing happened.
    asked.ok()?;
    let deadline = Instant::now() + TOPOLOGY_TIMEOUT;
    while Instant::now() < deadline {
        let done = (|| {
            let new = set.master_port().filter(|&p| p != old)?;
            let role = |port| -> Option<String> {
                redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut nemesis::quick_connection(port)?)
                    .ok()
            };
            let synced =
                role(new)?.contains("role:master") && role(old)?.contains("master_link_status:up");
            synced.then_some(())
        })();
        if done.is_some() {
            return Some((start, now_ns()));
        }
        thread::sleep(Duration::from_millis(50));
    }
    let logs: String = set
        .sentinels
        .iter()
        .take(1)
        .chain(&set.data)
        .map(|n| n.log_tail(20))
        .collect();
    panic!(
        "a forced sentinel failover from port {old} did not complete within {TOPOLOGY_TIMEOUT:?}\n{logs}"
    );
}

/// How many times the first sentinel switched masters (`+switch-master` in its log).
fn switch_masters(set: &SentinelSet) -> usize {
    let log = std::fs::read_to_string(set.sentinels[0].dir().join("redis.log")).unwrap_or_default();
    log.matches("+switch-master").count()
}

/// A Redis Cluster (3 masters + replicas), each node behind a fault proxy it announces (clients,
/// and a replica that reconnects its master, go through it; the cluster bus does not), the
/// campaign's locks in slots of their own on at least two masters: short freezes of the master of
/// one of those slots, a SIGKILL of it (its replica takes over; the node comes back as a
/// replica), latency, blackholes and resets on each node's link, `CLIENT KILL` on every node.
pub fn cluster(profile: &Profile) -> Summary {
    let started = Instant::now();
    let mut cluster = RedisCluster::start();
    let proxies: Vec<FaultProxy> = cluster
        .nodes
        .iter()
        .map(|n| FaultProxy::start(n.port()))
        .collect();
    cluster.announce(proxies.iter().map(FaultProxy::port).collect());
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let cluster = Mutex::new(cluster);
    let (prefix, slots) = spread_keys(&lock(&cluster));
    let cluster_ref = &cluster;
    let (ports, slots) = (&ports, &slots);
    let master_index = move |rng: &mut fastrand::Rng| {
        let slot = slots[rng.usize(0..slots.len())];
        let c = lock(cluster_ref);
        c.index_of(c.master_of_slot(slot).port())
    };
    let mut actions = vec![
        Action::new(FaultKind::Freeze, "topology", move |rng| {
            let index = master_index(rng);
            let hold = Duration::from_millis(rng.u64(100..=400));
            for_a_while(
                || lock(cluster_ref).nodes[index].freeze(),
                hold,
                || lock(cluster_ref).nodes[index].thaw(),
            )
        }),
        Action::new(FaultKind::MasterKill, "topology", move |rng| {
            let index = master_index(rng);
            let replica = {
                let c = lock(cluster_ref);
                c.replica_of(&c.nodes[index]).port()
            };
            let start = now_ns();
            lock(cluster_ref).nodes[index].stop();
            let deadline = Instant::now() + TOPOLOGY_TIMEOUT;
            while !lock(cluster_ref)
                .masters()
                .iter()
                .any(|m| m.port() == replica)
            {
                assert!(
                    Instant::now() < deadline,
                    "the replica on port {replica} did not take over within {TOPOLOGY_TIMEOUT:?}"
                );
                thread::sleep(Duration::from_millis(50));
            }
            let mut c = lock(cluster_ref);
            c.nodes[index].restart();
            c.reannounce(index);
            c.wait_ok(Duration::from_secs(30));
            Some((start, now_ns()))
        }),
        Action::new(FaultKind::ClientKill, "clients", move |_| {
            kill_clients(ports)
        }),
    ];
    actions.extend(link_actions(&proxies, LinkLimits::of(profile), profile));
    let summary = campaign(
        profile,
        Setup::new("cluster", 1),
        &urls,
        &prefix,
        actions,
        started,
    );
    // Only clients connect to the proxies (the harness and the nemesis use the nodes' own
    // ports, and the replicas linked before the announcement): the locks' two masters or more
    // were reached through them, so the link faults hit the lock calls.
    let used = proxies.iter().filter(|p| p.bytes_up() > 0).count();
    assert!(
        used >= 2,
        "the clients went through {used} of the cluster's proxies: the nodes' announced ports \
         were not used"
    );
    summary
}

/// etcd, 3 members, each client port behind a fault proxy: a member frozen or killed (and
/// restarted with its data) at a time, and the link faults.
///
/// A key whose holder stopped lingers longer than on Redis: its lease is the ttl rounded up to
/// whole seconds, and a new leader refreshes every lease to its whole TTL plus one election
/// timeout (etcd 3.4 and 3.5 without lease checkpoints). A leader killed just before the heal is
/// replaced within two election timeouts, and the leader expires leases in a sweep every 500 ms.
/// By hand: a 2 s lease, its leader killed 1.2 s in and restarted 0.7 s later, lived 4.4-4.6 s,
/// 2.5-2.7 s past the restart (4 trials). The quiet phase grows by as much as the linger
/// exceeds the ttl, so the checker's heal window still fits in it.
#[cfg(feature = "etcd")]
pub fn etcd(profile: &Profile) -> Summary {
    let started = Instant::now();
    let lease =
        Duration::from_secs(profile.ttl.as_secs() + u64::from(profile.ttl.subsec_nanos() > 0))
            .max(crate::ETCD_ELECTION_TIMEOUT * 3 / 2);
    let linger = lease + 3 * crate::ETCD_ELECTION_TIMEOUT + Duration::from_millis(500);
    let longer = linger.saturating_sub(profile.ttl);
    let profile = &Profile {
        run_for: profile.run_for + longer,
        quiet: profile.quiet + longer,
        ..profile.clone()
    };
    let members = Mutex::new(crate::EtcdCluster::start(3));
    let proxies: Vec<FaultProxy> = (0..3)
        .map(|i| FaultProxy::start(lock(&members).client_port(i)))
        .collect();
    let members_ref = &members;
    let mut actions = Vec::new();
    for i in 0..3 {
        let p = profile.clone();
        actions.push(Action::new(FaultKind::Freeze, "members", move |rng| {
            let hold = p.millis(rng, Duration::from_millis(200), 2 * p.ttl);
            for_a_while(
                || lock(members_ref).freeze(i, true),
                hold,
                || lock(members_ref).freeze(i, false),
            )
        }));
        let p = profile.clone();
        actions.push(Action::new(FaultKind::Kill, "members", move |rng| {
            let hold = p.millis(rng, Duration::from_millis(300), p.ttl);
            for_a_while(
                || lock(members_ref).kill(i),
                hold,
                || lock(members_ref).restart(i),
            )
        }));
    }
    actions.extend(link_actions(&proxies, LinkLimits::of(profile), profile));
    let urls: Vec<String> = proxies.iter().map(FaultProxy::http_url).collect();
    campaign(
        profile,
        Setup {
            linger: Some(linger),
            ..Setup::new("etcd", 1)
        },
        &urls,
        &key_prefix(),
        actions,
        started,
    )
}

/// One backend's campaign.
pub type Campaign = fn(&Profile) -> Summary;

/// Every backend's campaign, in run order (etcd with the `etcd` feature).
pub fn backends() -> Vec<(&'static str, Campaign)> {
    vec![
        ("single", single as Campaign),
        ("redlock", redlock),
        ("redlock-majority-clock", redlock_majority_clock),
        ("sentinel", sentinel),
        ("cluster", cluster),
        #[cfg(feature = "etcd")]
        ("etcd", etcd),
    ]
}

#[cfg(test)]
mod tests {
    use super::counts_agree;

    #[test]
    fn the_register_may_count_a_write_whose_answer_was_lost_but_nothing_more() {
        // Every answer counted, nothing unknown.
        assert!(counts_agree((10, 2), (10, 2), 0));
        // One write without an answer that the register accepted (or rejected).
        assert!(counts_agree((11, 2), (10, 2), 1));
        assert!(counts_agree((10, 3), (10, 2), 1));
        // The register counted more than the unknown writes explain.
        assert!(!counts_agree((11, 3), (10, 2), 1));
        assert!(!counts_agree((11, 2), (10, 2), 0));
        // A recorded answer the register did not count.
        assert!(!counts_agree((9, 2), (10, 2), 5));
        assert!(!counts_agree((10, 1), (10, 2), 5));
    }
}
