//! The lines a campaign records: one [`Op`] per lock call and one [`Write`] per write to the
//! fenced register (printed by `campaign_worker`), and one [`Fault`] per fault the nemesis
//! injected. Every time is [`now_ns`](crate::history::now_ns): `CLOCK_MONOTONIC`, shared by the
//! processes of the machine.

use std::fmt;
use std::str::FromStr;

use crate::history::Fields;
use crate::sections::Kind;

/// How an acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// A guard came back.
    Acquired,
    /// `Err(Contended)`: someone else held it for the whole `wait`.
    Contended,
    /// `Err(Unavailable)`: the servers could not be reached or refused.
    Unavailable,
    /// `Err(Lost)` from the acquire itself.
    Lost,
    /// Any other error (named on the worker's stderr).
    Failed,
}

/// How the release of a granted lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    /// `Ok(())`: the lock was ours until the release.
    Ok,
    /// `Err(Lost)`.
    Lost,
    /// `Err(Unavailable)`: not confirmed; retried in the background, the lock expires by its ttl at
    /// the latest.
    Unavailable,
    /// Any other error, or no release (the acquire failed).
    None,
}

/// The outcome of one write to the fenced register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteResult {
    /// Its token was at least the register's largest: stored.
    Accepted,
    /// A larger token had been written already: refused as stale.
    Rejected,
    /// The data server did not answer (never expected: it is not faulted).
    Error,
}

macro_rules! words {
    ($ty:ident { $($variant:ident = $word:literal),* $(,)? }) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $($ty::$variant => $word),* })
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(text: &str) -> Result<$ty, String> {
                match text {
                    $($word => Ok($ty::$variant),)*
                    _ => Err(format!("not a {}: {text:?}", stringify!($ty))),
                }
            }
        }
    };
}

words!(Outcome { Acquired = "acquired", Contended = "contended", Unavailable = "unavailable", Lost = "lost", Failed = "failed" });
words!(Release { Ok = "ok", Lost = "lost", Unavailable = "unavailable", None = "none" });
words!(WriteResult { Accepted = "accepted", Rejected = "rejected", Error = "error" });

/// One lock call of one worker task: the acquire, and for a grant the hold and its release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The worker's process id.
    pub pid: u32,
    /// The task within the worker.
    pub task: u32,
    /// What it asked for (an exclusive lock over several keys is `Exclusive` with more keys).
    pub kind: Kind,
    /// Its keys, sorted.
    pub keys: Vec<String>,
    /// `acquire_blocking` (true) or `acquire().await`.
    pub blocking: bool,
    /// The `wait` it asked with, in ms.
    pub wait_ms: u64,
    /// Right before `acquire` was called.
    pub invoke_ns: u64,
    /// Right after it returned.
    pub done_ns: u64,
    /// How it returned.
    pub outcome: Outcome,
    /// Each key's fencing token (0: none), in `keys` order; empty unless acquired.
    pub fences: Vec<u64>,
    /// The hold, for a grant (else 0): right after `acquire` returned...
    pub hold_start_ns: u64,
    /// ...and right before `release` was called.
    pub hold_end_ns: u64,
    /// The last reading of the clock taken right before `is_lost()` answered false: up to then
    /// the library said the lock was ours.
    pub valid_ns: u64,
    /// The first reading after which `is_lost()` answered true (0: never seen lost).
    pub lost_ns: u64,
    /// When the last write this hold made to the fenced register returned (0: none).
    pub wrote_ns: u64,
    /// How the release ended.
    pub release: Release,
}

const OP: &str = "op ";
const WRITE: &str = "write ";

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_list<T: FromStr>(text: &str) -> Option<Vec<T>> {
    if text == "-" {
        return Some(Vec::new());
    }
    text.split(',').map(|item| item.parse().ok()).collect()
}

impl Op {
    /// Whether this hold excludes every other hold of its keys (plain, fair, writer, several keys).
    pub fn is_exclusive(&self) -> bool {
        matches!(self.kind, Kind::Exclusive | Kind::Fair)
    }

    /// The end of the interval in which this hold acted as the holder: the release was called
    /// then (a clean hold), or the library last said the lock was ours, or its last write to the
    /// register returned, whichever is latest (a lost hold).
    pub fn effective_end_ns(&self) -> u64 {
        if self.release == Release::Ok && self.lost_ns == 0 {
            self.hold_end_ns
        } else {
            self.valid_ns.max(self.wrote_ns).max(self.hold_start_ns)
        }
    }

    /// The fencing token of `key` (0: none, or not one of the keys).
    pub fn fence_of(&self, key: &str) -> u64 {
        self.keys
            .iter()
            .position(|k| k == key)
            .and_then(|i| self.fences.get(i).copied())
            .unwrap_or(0)
    }

    /// How long the acquire took.
    pub fn took_ns(&self) -> u64 {
        self.done_ns.saturating_sub(self.invoke_ns)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fences = if self.fences.is_empty() {
            "-".to_owned()
        } else {
            list(&self.fences)
        };
        write!(
            f,
            "{OP}pid={} task={} kind={} keys={} blocking={} wait_ms={} invoke={} done={} outcome={} \
             fences={fences} hold_start={} hold_end={} valid={} lost={} wrote={} release={}",
            self.pid,
            self.task,
            self.kind,
            list(&self.keys),
            self.blocking,
            self.wait_ms,
            self.invoke_ns,
            self.done_ns,
            self.outcome,
            self.hold_start_ns,
            self.hold_end_ns,
            self.valid_ns,
            self.lost_ns,
            self.wrote_ns,
            self.release,
        )
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(line: &str) -> Result<Op, String> {
        let parse = || {
            let mut fields = Fields::after(line, OP)?;
            Some(Op {
                pid: fields.next("pid")?,
                task: fields.next("task")?,
                kind: fields.next("kind")?,
                keys: parse_list(&fields.next::<String>("keys")?)?,
                blocking: fields.next("blocking")?,
                wait_ms: fields.next("wait_ms")?,
                invoke_ns: fields.next("invoke")?,
                done_ns: fields.next("done")?,
                outcome: fields.next("outcome")?,
                fences: parse_list(&fields.next::<String>("fences")?)?,
                hold_start_ns: fields.next("hold_start")?,
                hold_end_ns: fields.next("hold_end")?,
                valid_ns: fields.next("valid")?,
                lost_ns: fields.next("lost")?,
                wrote_ns: fields.next("wrote")?,
                release: fields.next("release")?,
            })
        };
        parse().ok_or_else(|| format!("not an op line: {line:?}"))
    }
}

/// One write of a holder to the fenced register of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The writer's process id.
    pub pid: u32,
    /// The lock key whose register it wrote.
    pub key: String,
    /// The fencing token it wrote with.
    pub fence: u64,
    /// Right before the write was sent.
    pub invoke_ns: u64,
    /// Right after its answer came.
    pub done_ns: u64,
    /// What the register answered.
    pub result: WriteResult,
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{WRITE}pid={} key={} fence={} invoke={} done={} result={}",
            self.pid, self.key, self.fence, self.invoke_ns, self.done_ns, self.result
        )
    }
}

impl FromStr for Write {
    type Err = String;

    fn from_str(line: &str) -> Result<Write, String> {
        let parse = || {
            let mut fields = Fields::after(line, WRITE)?;
            Some(Write {
                pid: fields.next("pid")?,
                key: fields.next("key")?,
                fence: fields.next("fence")?,
                invoke_ns: fields.next("invoke")?,
                done_ns: fields.next("done")?,
                result: fields.next("result")?,
            })
        };
        parse().ok_or_else(|| format!("not a write line: {line:?}"))
    }
}

/// The op and write lines among `lines` (others are skipped); `Err` names a malformed one.
pub fn parse_lines<'a>(
    lines: impl IntoIterator<Item = &'a String>,
) -> Result<(Vec<Op>, Vec<Write>), String> {
    let (mut ops, mut writes) = (Vec::new(), Vec::new());
    for line in lines {
        if line.starts_with(OP) {
            ops.push(line.parse()?);
        } else if line.starts_with(WRITE) {
            writes.push(line.parse()?);
        }
    }
    Ok((ops, writes))
}

/// What the nemesis did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGSTOP of a server (or etcd member), SIGCONT at the end.
    Freeze,
    /// SIGKILL of a server and its restart at once, without its data.
    Restart,
    /// SIGKILL of a server, restarted after more than a ttl (Redlock's assumption), or an etcd
    /// member (which keeps its data).
    Kill,
    /// Latency added on one link (fault proxy).
    Latency,
    /// Nothing forwarded on one link for a while (fault proxy).
    Blackhole,
    /// Every connection through one link reset (fault proxy).
    Cut,
    /// `CLIENT KILL TYPE normal` on a server.
    ClientKill,
    /// SIGSTOP of a worker process for longer than its ttl.
    ClientPause,
    /// `SENTINEL FAILOVER`: the replica promoted.
    Failover,
    /// SIGKILL of a Cluster master: its replica takes over, the node comes back as a replica.
    MasterKill,
    /// A server's wall clock jumps ahead (libfaketime) for a while, then back: its keys expire
    /// early, a holder's among them.
    ClockForward,
    /// A server's wall clock jumps back for a while, then returns: keys set meanwhile expire
    /// early when it returns, and a token raised to the clock meanwhile may not grow.
    ClockBack,
}

impl FaultKind {
    /// Every kind, in table order.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::Freeze,
        FaultKind::Restart,
        FaultKind::Kill,
        FaultKind::Latency,
        FaultKind::Blackhole,
        FaultKind::Cut,
        FaultKind::ClientKill,
        FaultKind::ClientPause,
        FaultKind::Failover,
        FaultKind::MasterKill,
        FaultKind::ClockForward,
        FaultKind::ClockBack,
    ];

    /// Whether the library documents that this fault, whatever it hit, can let two holders in at
    /// once (the promise then rests on the fencing token): a restart without data of a single
    /// node, a failover without `min_replicas`, a client paused past its ttl. Clock steps are
    /// not among them: they are a documented limit only on enough nodes
    /// ([`Fault::is_documented_limit`]).
    pub fn is_documented_limit(self) -> bool {
        matches!(
            self,
            FaultKind::Restart
                | FaultKind::ClientPause
                | FaultKind::Failover
                | FaultKind::MasterKill
        )
    }

    /// A server clock step, either way.
    pub fn is_clock_step(self) -> bool {
        matches!(self, FaultKind::ClockForward | FaultKind::ClockBack)
    }
}

words!(FaultKind {
    Freeze = "freeze",
    Restart = "restart",
    Kill = "kill",
    Latency = "latency",
    Blackhole = "blackhole",
    Cut = "cut",
    ClientKill = "client-kill",
    ClientPause = "client-pause",
    Failover = "failover",
    MasterKill = "master-kill",
    ClockForward = "clock-forward",
    ClockBack = "clock-back",
});

/// One fault, as the nemesis logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What it was.
    pub kind: FaultKind,
    /// What it hit (`node 2`, `link 0`, `worker 1`, ...).
    pub target: String,
    /// For a paused worker, its process id.
    pub pid: Option<u32>,
    /// The lock servers it hit (by index), or those behind the link it hit; none for a worker
    /// or a topology as a whole.
    pub servers: Vec<usize>,
    /// When it began...
    pub start_ns: u64,
    /// ...and when it was healed (the server answers again, the failover is complete).
    pub end_ns: u64,
}

impl Fault {
    /// Whether the library documents that this fault can let two holders in at once or keep a
    /// token from growing, on a backend whose grants need `quorum` servers: a kind that is a
    /// limit wherever it hits ([`FaultKind::is_documented_limit`]), or a clock step on at least
    /// `quorum` servers (the single node, a majority of Redlock's: its clock assumption). A
    /// step on a Redlock minority is not by itself: the other nodes of a grant keep the key
    /// (but see `check`: not when the grant reached a bare quorum).
    pub fn is_documented_limit(&self, quorum: usize) -> bool {
        self.kind.is_documented_limit()
            || (self.kind.is_clock_step() && self.servers.len() >= quorum)
    }
}

const FAULT: &str = "fault ";

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{FAULT}kind={} target={} pid={} servers={} start={} end={} ({} ms)",
            self.kind,
            self.target.replace(' ', "_"),
            self.pid
                .map_or_else(|| "-".to_owned(), |pid| pid.to_string()),
            if self.servers.is_empty() {
                "-".to_owned()
            } else {
                list(&self.servers)
            },
            self.start_ns,
            self.end_ns,
            self.end_ns.saturating_sub(self.start_ns) / 1_000_000
        )
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(line: &str) -> Result<Fault, String> {
        let parse = || {
            let mut fields = Fields::after(line, FAULT)?;
            let kind = fields.next("kind")?;
            let target = fields.next::<String>("target")?.replace('_', " ");
            let pid = match fields.next::<String>("pid")?.as_str() {
                "-" => None,
                pid => Some(pid.parse().ok()?),
            };
            Some(Fault {
                kind,
                target,
                pid,
                servers: parse_list(&fields.next::<String>("servers")?)?,
                start_ns: fields.next("start")?,
                end_ns: fields.next("end")?,
            })
        };
        parse().ok_or_else(|| format!("not a fault line: {line:?}"))
    }
}

/// The fault lines among `lines` (others are skipped); `Err` names a malformed one.
pub fn parse_faults<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Vec<Fault>, String> {
    lines
        .into_iter()
        .filter(|line| line.starts_with(FAULT))
        .map(str::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let op = Op {
            pid: 4,
            task: 1,
            kind: Kind::Exclusive,
            keys: vec!["{c}x:0".into(), "{c}x:1".into()],
            blocking: true,
            wait_ms: 700,
            invoke_ns: 10,
            done_ns: 20,
            outcome: Outcome::Acquired,
            fences: vec![5, 9],
            hold_start_ns: 21,
            hold_end_ns: 40,
            valid_ns: 39,
            lost_ns: 0,
            wrote_ns: 30,
            release: Release::Ok,
        };
        assert_eq!(op.to_string().parse::<Op>(), Ok(op.clone()));
        let failed = Op {
            outcome: Outcome::Contended,
            fences: Vec::new(),
            kind: Kind::Permits(2),
            release: Release::None,
            ..op
        };
        assert_eq!(failed.to_string().parse::<Op>(), Ok(failed));
        let write = Write {
            pid: 4,
            key: "k".into(),
            fence: 9,
            invoke_ns: 1,
            done_ns: 2,
            result: WriteResult::Rejected,
        };
        assert_eq!(write.to_string().parse::<Write>(), Ok(write));
        assert!("op pid=1".parse::<Op>().is_err());
        let fault = Fault {
            kind: FaultKind::ClientPause,
            target: "worker 2".into(),
            pid: Some(7),
            servers: vec![0, 3],
            start_ns: 5,
            end_ns: 9,
        };
        assert_eq!(fault.to_string().parse::<Fault>(), Ok(fault.clone()));
        let topology = Fault {
            pid: None,
            servers: Vec::new(),
            ..fault
        };
        assert_eq!(topology.to_string().parse::<Fault>(), Ok(topology));
    }
}
