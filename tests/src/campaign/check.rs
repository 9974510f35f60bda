//! The campaign's checker. It knows nothing of the lock library: it reads the recorded
//! [`Op`], [`Write`] and [`Fault`] lines and decides, per key, whether the history is possible
//! under the library's promises.
//!
//! A hold's interval runs from right after `acquire` returned to [`Op::effective_end_ns`]; it lies
//! inside the interval in which the library said the lock was ours (or the holder acted on it),
//! so two intervals that overlap prove two holders at once. The rules:
//!
//! - an exclusive hold (plain, fair, writer, several keys) overlaps no other hold of any of its
//!   keys; shared holds overlap only shared holds; at most N holders of an N-permit key;
//! - fencing tokens of exclusive holds strictly grow per key: a hold's token is larger than that
//!   of every exclusive hold of the key that ended before it began;
//! - no release returned `Ok` after the holder saw its lock lost;
//! - every acquire answered within its `wait` + one request timeout + slack, unless its worker
//!   was paused (SIGSTOP) during the call;
//! - the fenced register never accepted a write whose token is smaller than one it had accepted
//!   before that write was sent;
//! - after the last fault healed, every key in use is held again within one ttl (+ slack).
//!
//! An overlap while a documented-limit fault ([`Fault::is_documented_limit`]) was active, or had
//! ended less than a ttl before (the stale holder hears of it at its next renewal), is reported
//! as a documented limit, not a violation. A paused worker is one only as a holder paused past
//! its validity ([`paused_holder`]): its acquire had returned before the pause began, it was
//! still holding then, the library never said the lock was its own after the pause, and the
//! hold it overlapped began during the pause. A waiter paused across a release excuses nothing:
//! whatever it is granted after it resumes must be its own. A server clock step is such a fault
//! only on enough servers to make a quorum ([`Bounds::quorum`]): a step ahead expires held keys
//! early, and so does the return of a step back for the keys set meanwhile. On Redlock a step on
//! one node is one too when the grant it struck can have rested on a bare quorum that included
//! the node ([`bare_quorum`]): faults kept the other nodes out of it, or another call's key was
//! on them (a split vote, or a copy left by a release that had not reached them).
//!
//! A token that does not grow is a documented limit only when the granting servers' clock went
//! back (tokens are raised to the server clock, and grow across a lost counter only as long as
//! the clock does not go back by more than the time between the grants): a step back on a quorum
//! of servers active at the later grant, or a step ahead that began before the earlier grant and
//! returned before the later one, by less than the largest step ([`Bounds::clock_step_ns`]): the
//! counter counted on from the clock ahead, and a counter lost since restarts from the clock
//! returned. It is one too across a failover or a master kill under way between the two grants,
//! when it fell by less than 100 ms less the time between the grants ([`FAILOVER_TOKEN_LAG_US`]):
//! the promoted replica's counter missed the last grants, and the transaction counts on from a
//! counter up to 100 ms behind its grant's clock, as the README's promise allows. And it is one
//! when the later hold's acquire began before the earlier one's returned and a clock step on a
//! minority explains it as an overlap at the servers: the later hold was granted first, on a bare
//! quorum of which a node's clock then jumped, and its replies came late ([`bare_quorum`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::record::{Fault, FaultKind, Op, Outcome, Release, Write, WriteResult};
use crate::sections::Kind;

/// The bounds a history is checked against (all in ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The ttl the workers asked for.
    pub ttl_ns: u64,
    /// One request timeout: `connect_timeout + response_timeout`.
    pub request_ns: u64,
    /// Scheduling slack on a loaded machine, added to the wait bound and the heal bound.
    pub slack_ns: u64,
    /// When the last fault healed (the quiet phase began)...
    pub healed_ns: u64,
    /// ...and when the workers stopped asking.
    pub end_ns: u64,
    /// How many lock servers a grant needs (1 on one server, 3 of Redlock's 5): a clock step on
    /// fewer is no documented limit.
    pub quorum: usize,
    /// The largest clock step the nemesis makes.
    pub clock_step_ns: u64,
    /// How long after the heal a key whose holder stopped (a release that failed, a grant whose
    /// call gave up) may still be on the servers: the ttl on Redis, whose `PX` counts from the
    /// last write; longer on etcd (see `run::etcd`).
    pub linger_ns: u64,
}

const BOUNDS: &str = "bounds ";

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{BOUNDS}ttl={} request={} slack={} healed={} end={} quorum={} clock_step={} linger={}",
            self.ttl_ns,
            self.request_ns,
            self.slack_ns,
            self.healed_ns,
            self.end_ns,
            self.quorum,
            self.clock_step_ns,
            self.linger_ns
        )
    }
}

impl std::str::FromStr for Bounds {
    type Err = String;

    fn from_str(line: &str) -> Result<Bounds, String> {
        let parse = || {
            let mut fields = crate::history::Fields::after(line, BOUNDS)?;
            let ttl_ns = fields.next("ttl")?;
            Some(Bounds {
                ttl_ns,
                request_ns: fields.next("request")?,
                slack_ns: fields.next("slack")?,
                healed_ns: fields.next("healed")?,
                end_ns: fields.next("end")?,
                quorum: fields.next("quorum")?,
                clock_step_ns: fields.next("clock_step")?,
                // Histories saved before the field: the ttl, as the checker then took it.
                linger_ns: fields.next("linger").unwrap_or(ttl_ns),
            })
        };
        parse().ok_or_else(|| format!("not a bounds line: {line:?}"))
    }
}

/// Checks a history saved as lines (see `run::Summary::history`): one [`Bounds`] line, and the
/// op, write and fault lines.
pub fn check_saved(text: &str) -> Result<Report, String> {
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let bounds: Bounds = lines
        .iter()
        .find(|l| l.starts_with(BOUNDS))
        .ok_or("no bounds line")?
        .parse()?;
    let (ops, writes) = super::record::parse_lines(&lines)?;
    let faults = super::record::parse_faults(lines.iter().map(String::as_str))?;
    Ok(check(&ops, &writes, &faults, &bounds))
}

/// Holds of one key that were held at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The key.
    pub key: String,
    /// The holds, earliest first.
    pub holds: Vec<Op>,
    /// The documented-limit fault that explains it, if any.
    pub fault: Option<Fault>,
}

/// Why a history breaks a promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Holds that excluded each other were held at once, with no documented-limit fault about.
    Overlap(Overlap),
    /// `later` began after `earlier` ended, with a token that is not larger.
    FenceNotIncreasing {
        /// The key.
        key: String,
        /// The hold with the largest token among those that ended before `later` began.
        earlier: Op,
        /// The hold whose token did not grow.
        later: Op,
    },
    /// The release said `Ok` though the holder had seen the lock lost.
    SuccessAfterLoss(Op),
    /// The acquire took longer than its bound.
    WaitOverrun {
        /// The call.
        op: Op,
        /// Its bound, in ns.
        bound_ns: u64,
    },
    /// The register accepted `write` after it had accepted the larger token of `newer`.
    StaleWriteAccepted {
        /// The stale write.
        write: Write,
        /// The accepted write with a larger token that returned before `write` was sent.
        newer: Write,
    },
    /// After the faults healed, nobody held `key` within the bound, though workers asked for it.
    NoGrantAfterHeal {
        /// The key.
        key: String,
        /// Asks for it in the window, and how each ended.
        asked: BTreeMap<Outcome, usize>,
        /// The window's length after the heal.
        window_ns: u64,
        /// The last grant of the key before the window, if any: whose key may have stayed.
        last: Option<Box<Op>>,
    },
}

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Broken promises: the run fails if there is one.
    pub violations: Vec<Violation>,
    /// Overlaps explained by a documented-limit fault.
    pub documented: Vec<Overlap>,
    /// Of those, the ones where the stale holder wrote to the register after the newer holder
    /// had, and every such write was rejected.
    pub documented_fenced: usize,
    /// Tokens that did not grow ([`Violation::FenceNotIncreasing`]) inside a documented limit,
    /// with the fault: a clock that went back, a failover, a late grant on a bare quorum.
    pub documented_fences: Vec<(Violation, Fault)>,
    /// Register writes accepted, rejected as stale, and failed.
    pub writes: BTreeMap<WriteResult, usize>,
    /// Acquires by outcome.
    pub outcomes: BTreeMap<Outcome, usize>,
    /// Releases of grants by outcome.
    pub releases: BTreeMap<Release, usize>,
    /// Acquires left out of the wait bound: their worker was paused meanwhile.
    pub paused_acquires: usize,
    /// Of the overlaps among the violations, those with a hold whose worker was paused while it
    /// waited for it (a pause began during its acquire): the shape of a waiter that took a stale
    /// grant after it resumed.
    pub paused_waiter_overlaps: usize,
    /// Keys asked for in the window after the heal, whose grant the check looked for; `None`
    /// when the window ended after the workers stopped, so the check could not run.
    pub heal_checked: Option<usize>,
}

impl Report {
    /// Whether no promise was broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks `ops`, `writes` and `faults` against `bounds`.
pub fn check(ops: &[Op], writes: &[Write], faults: &[Fault], bounds: &Bounds) -> Report {
    let mut report = Report::default();
    for op in ops {
        *report.outcomes.entry(op.outcome).or_default() += 1;
        if op.outcome == Outcome::Acquired {
            *report.releases.entry(op.release).or_default() += 1;
        }
    }
    for write in writes {
        *report.writes.entry(write.result).or_default() += 1;
    }
    let granted: Vec<&Op> = ops
        .iter()
        .filter(|op| op.outcome == Outcome::Acquired)
        .collect();
    let mut keys: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    // Every call on each key, whatever its outcome: the contenders of a grant.
    let mut calls: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        for key in &op.keys {
            calls.entry(key.as_str()).or_default().push(op);
            if op.outcome == Outcome::Acquired {
                keys.entry(key.as_str()).or_default().push(op);
            }
        }
    }
    for (key, holds) in &keys {
        let about = Around {
            faults,
            calls: &calls[key],
            bounds,
        };
        for overlap in overlaps(key, holds) {
            match documented_by(&overlap, &about) {
                Some(fault) => {
                    if stale_writer_fenced(&overlap, writes) {
                        report.documented_fenced += 1;
                    }
                    report.documented.push(Overlap {
                        fault: Some(fault.clone()),
                        ..overlap
                    });
                }
                None => {
                    if paused_waiter(&overlap, faults) {
                        report.paused_waiter_overlaps += 1;
                    }
                    report.violations.push(Violation::Overlap(overlap));
                }
            }
        }
        for found in fences(key, holds) {
            let documented = clock_went_back(&found, faults, bounds)
                .or_else(|| failed_over(&found, faults))
                .or_else(|| bare_quorum_drop(&found, &about))
                .or_else(|| paused_before_return_drop(&found, faults, bounds));
            match documented {
                Some(fault) => report.documented_fences.push((found, fault.clone())),
                None => report.violations.push(found),
            }
        }
    }
    for op in &granted {
        if op.lost_ns > 0 && op.release == Release::Ok {
            report
                .violations
                .push(Violation::SuccessAfterLoss((*op).clone()));
        }
    }
    for op in ops {
        let bound_ns = op.wait_ms * 1_000_000 + bounds.request_ns + bounds.slack_ns;
        if op.took_ns() <= bound_ns {
            continue;
        }
        if paused_during(op, faults) {
            report.paused_acquires += 1;
        } else {
            report.violations.push(Violation::WaitOverrun {
                op: op.clone(),
                bound_ns,
            });
        }
    }
    report.violations.extend(stale_writes(writes));
    let (unhealed, checked) = unhealed(ops, bounds);
    report.violations.extend(unhealed);
    report.heal_checked = checked;
    report
}

/// Every group of holds of `key` held at once that the kinds forbid.
fn overlaps(key: &str, holds: &[&Op]) -> Vec<Overlap> {
    let mut by_start = holds.to_vec();
    by_start.sort_by_key(|op| (op.hold_start_ns, op.effective_end_ns()));
    let mut active: Vec<&Op> = Vec::new();
    let mut found = Vec::new();
    for hold in by_start {
        active.retain(|a| a.effective_end_ns() > hold.hold_start_ns);
        let clash: Vec<&Op> = match hold.kind {
            Kind::Permits(n) => {
                let permits = active
                    .iter()
                    .filter(|a| matches!(a.kind, Kind::Permits(_)))
                    .count();
                let others = active.iter().filter(|a| a.is_exclusive()).copied();
                if permits + 1 > n as usize {
                    active.clone()
                } else {
                    others.collect()
                }
            }
            _ => active
                .iter()
                .filter(|a| hold.is_exclusive() || a.is_exclusive())
                .copied()
                .collect(),
        };
        if !clash.is_empty() {
            let mut group: Vec<Op> = clash.into_iter().cloned().collect();
            group.push(hold.clone());
            found.push(Overlap {
                key: key.to_owned(),
                holds: group,
                fault: None,
            });
        }
        active.push(hold);
    }
    found
}

/// Whether a hold of the overlap was granted to a worker paused while it waited for it.
fn paused_waiter(overlap: &Overlap, faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        f.kind == FaultKind::ClientPause
            && overlap
                .holds
                .iter()
                .any(|h| f.pid == Some(h.pid) && h.invoke_ns < f.start_ns && f.start_ns < h.done_ns)
    })
}

fn span(overlap: &Overlap) -> (u64, u64) {
    let start = overlap.holds.iter().map(|h| h.hold_start_ns).min();
    let end = overlap.holds.iter().map(Op::effective_end_ns).max();
    (start.unwrap_or(0), end.unwrap_or(0))
}

/// What a key's overlaps and token drops are judged against: the faults, every call on the key
/// (any outcome) and the bounds.
struct Around<'a> {
    faults: &'a [Fault],
    calls: &'a [&'a Op],
    bounds: &'a Bounds,
}

/// The documented-limit fault active (or healed less than a ttl before) while the holds were
/// held; for a paused worker, a holder paused past its validity ([`paused_holder`]).
fn documented_by<'a>(overlap: &Overlap, about: &Around<'a>) -> Option<&'a Fault> {
    let bounds = about.bounds;
    let (start, end) = span(overlap);
    let during = |f: &Fault| f.start_ns < end && start < f.end_ns + bounds.ttl_ns;
    about.faults.iter().find(|f| {
        if f.kind == FaultKind::ClientPause {
            return paused_holder(f, overlap, bounds) || paused_before_return(f, overlap, bounds);
        }
        (during(f) && f.is_documented_limit(bounds.quorum))
            || bare_quorum_overlap(f, overlap, about)
    })
}

/// Whether `pause` is that of a holder of the overlap paused past its own validity, the
/// documented limit of a client paused past its ttl: its acquire had returned before the pause
/// began and its hold had not ended, the pause outlasted a ttl (no grant's validity is longer,
/// and nothing renews a stopped process, so the validity ended during the pause), the library
/// did not say the lock was its own after the pause ended, and the latest hold of the overlap
/// began after the pause began (a hold granted before, beside a holder not yet paused, is an
/// overlap of two live holds). A worker paused while it waited (its acquire returned after the
/// pause) excuses nothing: a grant it takes after it resumes must be its own, and a hand-off
/// message published while it was stopped proves nothing (DESIGN §4: a grant comes from a
/// server's answer to this attempt).
fn paused_holder(pause: &Fault, overlap: &Overlap, bounds: &Bounds) -> bool {
    let Some((latest, earlier)) = overlap.holds.split_last() else {
        return false;
    };
    pause.end_ns.saturating_sub(pause.start_ns) > bounds.ttl_ns
        && latest.hold_start_ns > pause.start_ns
        && earlier.iter().any(|h| {
            pause.pid == Some(h.pid)
                && h.done_ns <= pause.start_ns
                && pause.start_ns < h.effective_end_ns()
                && h.valid_ns < pause.end_ns
        })
}

/// Whether `pause` struck a holder of the overlap between its grant and the return of its
/// acquire, past its validity: the same documented limit as [`paused_holder`], the pause only
/// came a moment earlier. The pause began during the acquire and outlasted a ttl, and the
/// holder was never told the lock was its own after the acquire returned: its first check found
/// it lost (the library's deadline had passed). A waiter that takes something else for a grant
/// after it resumes (a stale hand-off message) is told the lock is its own: that is not excused.
fn paused_before_return(pause: &Fault, overlap: &Overlap, bounds: &Bounds) -> bool {
    overlap
        .holds
        .iter()
        .any(|h| returned_after_its_validity(pause, h, bounds))
}

/// See [`paused_before_return`]: `hold`'s worker was paused during its acquire past a ttl, and
/// never told the lock was its own after the return.
fn returned_after_its_validity(pause: &Fault, hold: &Op, bounds: &Bounds) -> bool {
    pause.kind == FaultKind::ClientPause
        && pause.end_ns.saturating_sub(pause.start_ns) > bounds.ttl_ns
        && pause.pid == Some(hold.pid)
        && hold.invoke_ns < pause.start_ns
        && pause.end_ns <= hold.done_ns
        && hold.valid_ns <= hold.hold_start_ns
        && hold.lost_ns != 0
}

/// The pause of [`paused_before_return`] explains a token below an earlier hold's: the later
/// hold was granted (on the servers) before its worker's pause, long before it returned.
fn paused_before_return_drop<'a>(
    found: &Violation,
    faults: &'a [Fault],
    bounds: &Bounds,
) -> Option<&'a Fault> {
    let Violation::FenceNotIncreasing { later, .. } = found else {
        return None;
    };
    faults
        .iter()
        .find(|f| returned_after_its_validity(f, later, bounds))
}

/// Whether clock step `step` on a minority explains the overlap all the same, with one of its
/// holds as the grant that rested on a bare quorum ([`bare_quorum`]): any hold whose acquire began
/// before another hold's acquire returned (replies can come late: the hold that began later may
/// be the one granted first on the servers).
fn bare_quorum_overlap(step: &Fault, overlap: &Overlap, about: &Around<'_>) -> bool {
    overlap.holds.iter().enumerate().any(|(i, victim)| {
        overlap.holds.iter().enumerate().any(|(j, other)| {
            i != j
                && victim.invoke_ns < other.done_ns
                && bare_quorum(step, victim, other.done_ns, about)
        })
    })
}

/// Whether clock step `step` on a minority can have let another grant in beside `victim`'s,
/// granted before `other_done`: the step can have expired the victim's key early before the
/// other grant returned (a step ahead on after the victim's acquire began and begun before the
/// other grant returned; a step back on during the victim's acquire and returned before the
/// other grant did), and the victim's grant can have rested on a bare quorum that included a
/// stepped server. It can when a contender may have held nodes while the victim's acquire ran
/// ([`contended_during`]: a split vote leaves the winner on the nodes it won, a bare quorum at
/// worst, until it lets go), or when the servers it stepped, those a fault may have kept out of
/// the victim's grant (any fault on them during its acquire) and those that lost keys meanwhile
/// (another clock step, a kill or a restart before the other grant) make a quorum. The victim's
/// grant then rested on fewer than a quorum of servers that kept its key, which Redlock's clock
/// assumption rules out.
fn bare_quorum(step: &Fault, victim: &Op, other_done: u64, about: &Around<'_>) -> bool {
    let expired_early = match step.kind {
        FaultKind::ClockForward => step.start_ns < other_done && victim.invoke_ns < step.end_ns,
        FaultKind::ClockBack => {
            step.start_ns < victim.done_ns
                && victim.invoke_ns < step.end_ns
                && step.end_ns < other_done
        }
        _ => false,
    };
    if !expired_early {
        return false;
    }
    if contended_during(victim, about) {
        return true;
    }
    let mut servers: BTreeSet<usize> = step.servers.iter().copied().collect();
    for f in about.faults {
        let at_grant = f.start_ns < victim.done_ns && victim.invoke_ns < f.end_ns;
        let forgot = f.start_ns < other_done
            && victim.invoke_ns < f.end_ns
            && (f.kind.is_clock_step() || matches!(f.kind, FaultKind::Kill | FaultKind::Restart));
        if at_grant || forgot {
            servers.extend(f.servers.iter().copied());
        }
    }
    servers.len() >= about.bounds.quorum
}

/// Whether another call's key may have been on some of the nodes while `victim`'s acquire ran,
/// so that the victim won only the others, and kept them out past the library's attempts to
/// place the won lock there too (about 60 ms): a call under way then (its attempt's grants
/// refuse the victim until they are withdrawn, which a slow node delays), or one that ended, or
/// whose hold ended, less than a ttl before (a withdrawal or release that did not reach a node
/// left a copy there, which lives out its ttl).
fn contended_during(victim: &Op, about: &Around<'_>) -> bool {
    about.calls.iter().any(|&call| {
        let ended = call.done_ns.max(call.effective_end_ns());
        call != victim
            && call.invoke_ns < victim.done_ns
            && victim.invoke_ns < ended + about.bounds.ttl_ns
    })
}

/// The clock step on a minority that explains a token that did not grow because the later hold
/// was granted first on the servers, on a bare quorum ([`bare_quorum`]): its acquire began before
/// the earlier hold's returned, and its delayed grant, taken on servers the step then made
/// forget it, was followed by the earlier hold's grant with a larger token.
fn bare_quorum_drop<'a>(found: &Violation, about: &Around<'a>) -> Option<&'a Fault> {
    let Violation::FenceNotIncreasing { earlier, later, .. } = found else {
        return None;
    };
    if later.invoke_ns >= earlier.done_ns {
        return None;
    }
    about
        .faults
        .iter()
        .find(|f| bare_quorum(f, later, earlier.done_ns, about))
}

/// Whether the holder with the smaller token wrote to the register after the newer holder's
/// first accepted write and each such write was rejected (false when it did not write then).
fn stale_writer_fenced(overlap: &Overlap, writes: &[Write]) -> bool {
    let key = &overlap.key;
    let newest = overlap.holds.iter().max_by_key(|h| h.fence_of(key));
    let Some(newest) = newest else { return false };
    let of = |hold: &Op| {
        let (pid, fence) = (hold.pid, hold.fence_of(key));
        writes
            .iter()
            .filter(move |w| w.pid == pid && &w.key == key && w.fence == fence)
    };
    let Some(first_new) = of(newest)
        .filter(|w| w.result == WriteResult::Accepted)
        .map(|w| w.done_ns)
        .min()
    else {
        return false;
    };
    let late: Vec<&Write> = overlap
        .holds
        .iter()
        .filter(|h| h.fence_of(key) < newest.fence_of(key))
        .flat_map(of)
        .filter(|w| w.invoke_ns > first_new)
        .collect();
    !late.is_empty() && late.iter().all(|w| w.result == WriteResult::Rejected)
}

/// The clock step on a quorum of servers that sent their clock back before the later grant of a
/// token that did not grow: a step back active at the later grant, or a step ahead that began
/// before the earlier grant and returned less than the largest step before the later one.
fn clock_went_back<'a>(
    found: &Violation,
    faults: &'a [Fault],
    bounds: &Bounds,
) -> Option<&'a Fault> {
    let Violation::FenceNotIncreasing { earlier, later, .. } = found else {
        return None;
    };
    faults.iter().find(|f| {
        f.kind.is_clock_step()
            && f.is_documented_limit(bounds.quorum)
            && match f.kind {
                FaultKind::ClockBack => f.start_ns < later.done_ns && later.invoke_ns < f.end_ns,
                _ => {
                    f.start_ns < earlier.done_ns
                        && f.end_ns < later.done_ns
                        && later.invoke_ns < f.end_ns + bounds.clock_step_ns
                }
            }
    })
}

/// How far a token may fall behind an earlier one across a failover, in microseconds (the
/// tokens' unit): `LAG_US` of `scripts::FENCE`. The README's promise is that no token is below
/// its grant's server clock less 100 ms (a grant takes the counter's next value when it is at
/// most that far behind the clock), and no token is above its grant's clock (a counter raised
/// to a clock counts on by one a grant, fewer than one a microsecond). So a grant by a new master
/// whose counter missed the last grants can be below an earlier grant by at most 100 ms less the
/// time between the two grants: none at all 100 ms after it. The lock servers share this
/// machine's clock, so no skew between them widens the bound.
const FAILOVER_TOKEN_LAG_US: u64 = 100_000;

/// The failover (Sentinel) or master kill (Cluster) under way between the two grants of a token
/// that did not grow, when it fell by at most [`FAILOVER_TOKEN_LAG_US`] less the least time
/// between the two grants (from the earlier acquire's return to the later one's call): the
/// documented limit of a promoted replica whose counter missed the last grants.
fn failed_over<'a>(found: &Violation, faults: &'a [Fault]) -> Option<&'a Fault> {
    let Violation::FenceNotIncreasing {
        key,
        earlier,
        later,
    } = found
    else {
        return None;
    };
    let fell = earlier.fence_of(key).saturating_sub(later.fence_of(key));
    let between_us = later.invoke_ns.saturating_sub(earlier.done_ns) / 1_000;
    if fell > FAILOVER_TOKEN_LAG_US.saturating_sub(between_us) {
        return None;
    }
    faults.iter().find(|f| {
        matches!(f.kind, FaultKind::Failover | FaultKind::MasterKill)
            && f.start_ns < later.done_ns
            && earlier.invoke_ns < f.end_ns
    })
}

/// Tokens of exclusive holds of `key` that do not grow over one that ended before they began.
fn fences(key: &str, holds: &[&Op]) -> Vec<Violation> {
    let exclusive: Vec<&Op> = holds
        .iter()
        .filter(|h| h.is_exclusive() && h.fence_of(key) > 0)
        .copied()
        .collect();
    let mut by_start = exclusive.clone();
    by_start.sort_by_key(|h| h.hold_start_ns);
    let mut by_end = exclusive;
    by_end.sort_by_key(|h| h.effective_end_ns());
    let mut ended = by_end.iter().peekable();
    let mut largest: Option<&Op> = None;
    let mut found = Vec::new();
    for hold in by_start {
        while let Some(done) = ended.next_if(|h| h.effective_end_ns() <= hold.hold_start_ns) {
            if largest.is_none_or(|l| done.fence_of(key) > l.fence_of(key)) {
                largest = Some(done);
            }
        }
        // A hold that ended as it began (lost at its first check, nothing written) is among the
        // ended ones: it is not compared with itself.
        if let Some(earlier) =
            largest.filter(|l| !std::ptr::eq(*l, hold) && l.fence_of(key) >= hold.fence_of(key))
        {
            found.push(Violation::FenceNotIncreasing {
                key: key.to_owned(),
                earlier: earlier.clone(),
                later: hold.clone(),
            });
        }
    }
    found
}

fn paused_during(op: &Op, faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        f.kind == FaultKind::ClientPause
            && f.pid == Some(op.pid)
            && f.start_ns < op.done_ns
            && op.invoke_ns < f.end_ns
    })
}

/// Accepted writes whose token is smaller than that of an accepted write of the same key that
/// returned before they were sent.
fn stale_writes(writes: &[Write]) -> Vec<Violation> {
    let mut per_key: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for write in writes {
        per_key.entry(&write.key).or_default().push(write);
    }
    let mut found = Vec::new();
    for writes in per_key.values() {
        let mut by_invoke = writes.clone();
        by_invoke.sort_by_key(|w| w.invoke_ns);
        let mut by_done: Vec<&Write> = writes
            .iter()
            .filter(|w| w.result == WriteResult::Accepted)
            .copied()
            .collect();
        by_done.sort_by_key(|w| w.done_ns);
        let mut done = by_done.iter().peekable();
        let mut largest: Option<&Write> = None;
        for write in by_invoke {
            while let Some(before) = done.next_if(|w| w.done_ns < write.invoke_ns) {
                if largest.is_none_or(|l| before.fence > l.fence) {
                    largest = Some(before);
                }
            }
            if let Some(newer) =
                largest.filter(|l| write.result == WriteResult::Accepted && l.fence > write.fence)
            {
                found.push(Violation::StaleWriteAccepted {
                    write: write.clone(),
                    newer: (*newer).clone(),
                });
            }
        }
    }
    found
}

/// Keys asked for after the heal that nobody held within [`Bounds::linger_ns`] (+ slack) of it:
/// by then every key left by a holder that stopped is gone. An ask for several keys counts for
/// one of them only when none of its other keys was held in that window: its refusal does not
/// say which key was taken (the campaign found a key asked for only together with one contended
/// throughout, and reported it unhealed). Also returns how many keys were asked for in the
/// window (`None`: it ends after the workers stopped, and nothing is checked).
fn unhealed(ops: &[Op], bounds: &Bounds) -> (Vec<Violation>, Option<usize>) {
    let window_ns = bounds.linger_ns + bounds.slack_ns;
    let window_end = bounds.healed_ns + window_ns;
    if window_end > bounds.end_ns {
        return (Vec::new(), None);
    }
    let mut held: BTreeMap<&str, bool> = BTreeMap::new();
    for op in ops {
        for key in &op.keys {
            let in_window = op.outcome == Outcome::Acquired
                && op.hold_start_ns <= window_end
                && op.effective_end_ns() >= bounds.healed_ns;
            *held.entry(key).or_default() |= in_window;
        }
    }
    let mut asked: BTreeMap<&str, BTreeMap<Outcome, usize>> = BTreeMap::new();
    for op in ops {
        if op.invoke_ns < bounds.healed_ns || op.invoke_ns >= window_end {
            continue;
        }
        for key in &op.keys {
            let others_free = op
                .keys
                .iter()
                .filter(|other| *other != key)
                .all(|other| !held.get(other.as_str()).copied().unwrap_or(false));
            if others_free {
                *asked.entry(key).or_default().entry(op.outcome).or_default() += 1;
            }
        }
    }
    let checked = asked.len();
    let unhealed = asked
        .into_iter()
        .filter(|(key, _)| !held.get(key).copied().unwrap_or(false))
        .map(|(key, asked)| Violation::NoGrantAfterHeal {
            key: key.to_owned(),
            asked,
            window_ns,
            last: ops
                .iter()
                .filter(|op| {
                    op.outcome == Outcome::Acquired
                        && op.hold_start_ns < bounds.healed_ns
                        && op.keys.iter().any(|k| k == key)
                })
                .max_by_key(|op| op.hold_start_ns)
                .map(|op| Box::new(op.clone())),
        })
        .collect();
    (unhealed, Some(checked))
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} holds of {} at once", self.holds.len(), self.key)?;
        if let Some(fault) = &self.fault {
            write!(f, " during {fault}")?;
        }
        for hold in &self.holds {
            write!(f, "\n  {hold}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap(overlap) => write!(f, "overlap: {overlap}"),
            Violation::FenceNotIncreasing {
                key,
                earlier,
                later,
            } => write!(
                f,
                "fencing token of {key} went from {} to {}\n  {earlier}\n  {later}",
                earlier.fence_of(key),
                later.fence_of(key)
            ),
            Violation::SuccessAfterLoss(op) => {
                write!(f, "release returned Ok after the loss was seen\n  {op}")
            }
            Violation::WaitOverrun { op, bound_ns } => write!(
                f,
                "acquire took {} ms, bound {} ms\n  {op}",
                op.took_ns() / 1_000_000,
                bound_ns / 1_000_000
            ),
            Violation::StaleWriteAccepted { write, newer } => write!(
                f,
                "register accepted a stale write\n  {write}\n  after {newer}"
            ),
            Violation::NoGrantAfterHeal {
                key,
                asked,
                window_ns,
                last,
            } => {
                write!(
                    f,
                    "nobody held {key} within {} ms of the heal; asks in that window: {asked:?}",
                    window_ns / 1_000_000
                )?;
                match last {
                    Some(op) => write!(f, "\n  its last grant before the heal: {op}"),
                    None => write!(f, "\n  no grant of it before the heal"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn bounds() -> Bounds {
        Bounds {
            ttl_ns: 1000 * MS,
            request_ns: 700 * MS,
            slack_ns: 300 * MS,
            healed_ns: 10_000 * MS,
            end_ns: 20_000 * MS,
            quorum: 1,
            clock_step_ns: 3000 * MS,
            linger_ns: 1500 * MS,
        }
    }

    /// A clean exclusive hold of `key` by `pid` from `start` to `end` ms with token `fence`,
    /// asked 1 ms before with a wait of 500 ms.
    fn hold(pid: u32, key: &str, fence: u64, start: u64, end: u64) -> Op {
        Op {
            pid,
            task: 0,
            kind: Kind::Exclusive,
            keys: vec![key.to_owned()],
            blocking: false,
            wait_ms: 500,
            invoke_ns: (start - 1) * MS,
            done_ns: start * MS,
            outcome: Outcome::Acquired,
            fences: vec![fence],
            hold_start_ns: start * MS,
            hold_end_ns: end * MS,
            valid_ns: end * MS,
            lost_ns: 0,
            wrote_ns: 0,
            release: Release::Ok,
        }
    }

    fn with_kind(mut op: Op, kind: Kind) -> Op {
        op.kind = kind;
        op
    }

    fn write(pid: u32, fence: u64, at: u64, result: WriteResult) -> Write {
        Write {
            pid,
            key: "k".into(),
            fence,
            invoke_ns: at * MS,
            done_ns: (at + 1) * MS,
            result,
        }
    }

    /// Worker 1 holds k from 1 ms with token 1, told it is ours until `valid` ms, writes at 2 ms
    /// and at `late_write` ms (refused), sees the loss at `lost` ms; worker 2 holds k with token
    /// 2 from 1200 to 1300 ms and writes at 1201 ms.
    fn superseded(valid: u64, late_write: u64, lost: u64) -> ([Op; 2], [Write; 3]) {
        let mut stale = hold(1, "k", 1, 1, lost);
        stale.lost_ns = lost * MS;
        stale.valid_ns = valid * MS;
        stale.wrote_ns = (late_write + 1) * MS;
        stale.release = Release::Lost;
        let writes = [
            write(1, 1, 2, WriteResult::Accepted),
            write(2, 2, 1201, WriteResult::Accepted),
            write(1, 1, late_write, WriteResult::Rejected),
        ];
        ([stale, hold(2, "k", 2, 1200, 1300)], writes)
    }

    fn clean_history() -> Vec<Op> {
        vec![
            hold(1, "k", 1, 1, 10),
            hold(2, "k", 2, 10, 20),
            hold(1, "k", 3, 25, 30),
            with_kind(hold(3, "r", 1, 1, 10), Kind::Shared),
            with_kind(hold(4, "r", 2, 5, 12), Kind::Shared),
            with_kind(hold(3, "p", 0, 1, 10), Kind::Permits(2)),
            with_kind(hold(4, "p", 0, 2, 10), Kind::Permits(2)),
            with_kind(hold(5, "p", 0, 10, 11), Kind::Permits(2)),
        ]
    }

    fn violations(ops: &[Op], writes: &[Write], faults: &[Fault]) -> Vec<Violation> {
        check(ops, writes, faults, &bounds()).violations
    }

    #[test]
    fn a_saved_history_is_checked_again() {
        let mut ops = clean_history();
        ops.push(hold(3, "k", 2, 15, 16));
        let fault = pause(9, 1, 2);
        let lines: Vec<String> = [bounds().to_string(), fault.to_string()]
            .into_iter()
            .chain(ops.iter().map(ToString::to_string))
            .chain([write(2, 2, 11, WriteResult::Accepted).to_string()])
            .collect();
        assert_eq!(lines[0].parse::<Bounds>(), Ok(bounds()));
        let report = check_saved(&lines.join("\n")).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(&report.violations[..], [Violation::Overlap(o)] if o.holds[1].pid == 3),
            "{:?}",
            report.violations
        );
        assert_eq!(report.writes.get(&WriteResult::Accepted), Some(&1));
        assert!(check_saved("op pid=1").is_err());
    }

    #[test]
    fn a_clean_history_passes() {
        let writes = [
            write(1, 1, 2, WriteResult::Accepted),
            write(2, 2, 11, WriteResult::Accepted),
            write(1, 1, 13, WriteResult::Rejected),
        ];
        let report = check(&clean_history(), &writes, &[], &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.outcomes.get(&Outcome::Acquired), Some(&8));
        assert_eq!(report.writes.get(&WriteResult::Rejected), Some(&1));
    }

    #[test]
    fn an_overlap_is_reported() {
        let mut ops = clean_history();
        // Granted while pid 2 held k (10..20); its token alone is in order.
        ops.push(hold(3, "k", 2, 15, 16));
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::Overlap(o)] if o.key == "k" && o.holds.len() == 2 && o.holds[0].pid == 2 && o.holds[1].pid == 3),
            "{found:?}"
        );
    }

    #[test]
    fn a_writer_among_readers_and_a_permit_too_many_are_reported() {
        let mut ops = clean_history();
        ops.push(hold(6, "r", 3, 6, 7));
        ops.push(with_kind(hold(6, "p", 0, 3, 4), Kind::Permits(2)));
        let found = violations(&ops, &[], &[]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|v| matches!(v, Violation::Overlap(o) if o.key == "r"))
        );
        assert!(
            found
                .iter()
                .any(|v| matches!(v, Violation::Overlap(o) if o.key == "p" && o.holds.len() == 3))
        );
    }

    #[test]
    fn a_key_of_a_multi_key_hold_conflicts_with_its_single_holder() {
        let mut both = hold(7, "j", 5, 40, 50);
        both.keys = vec!["j".into(), "k".into()];
        both.fences = vec![5, 9];
        let mut ops = clean_history();
        ops.push(both);
        assert!(violations(&ops, &[], &[]).is_empty());
        ops.push(hold(8, "k", 10, 45, 46));
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::Overlap(o)] if o.key == "k"),
            "{found:?}"
        );
    }

    #[test]
    fn a_token_that_does_not_grow_is_reported() {
        let mut ops = clean_history();
        ops[2].fences = vec![2];
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::FenceNotIncreasing { earlier, later, .. }] if earlier.pid == 2 && later.hold_start_ns == 25 * MS),
            "{found:?}"
        );
    }

    #[test]
    fn a_success_after_the_loss_was_seen_is_reported() {
        let mut ops = clean_history();
        ops[0].lost_ns = 8 * MS;
        ops[0].valid_ns = 7 * MS;
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::SuccessAfterLoss(op)] if op.pid == 1),
            "{found:?}"
        );
        ops[0].release = Release::Lost;
        assert!(violations(&ops, &[], &[]).is_empty());
    }

    #[test]
    fn a_wait_overrun_is_reported_unless_the_worker_was_paused() {
        let mut ops = clean_history();
        let mut slow = hold(9, "q", 1, 3000, 3001);
        slow.invoke_ns = 1000 * MS;
        slow.outcome = Outcome::Contended;
        ops.push(slow);
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::WaitOverrun { op, bound_ns }] if op.pid == 9 && *bound_ns == 1500 * MS),
            "{found:?}"
        );
        let pause = Fault {
            kind: FaultKind::ClientPause,
            target: "worker 9".into(),
            pid: Some(9),
            servers: Vec::new(),
            start_ns: 1200 * MS,
            end_ns: 2500 * MS,
        };
        let report = check(&ops, &[], &[pause], &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.paused_acquires, 1);
    }

    #[test]
    fn an_overlap_during_a_documented_fault_is_classified_and_its_stale_writer_checked() {
        // Worker 1 is paused while it holds k; worker 2 is granted k meanwhile, and worker 1's
        // write after the pause is refused by the register.
        let (ops, writes) = superseded(100, 2900, 3000);
        let pause = Fault {
            kind: FaultKind::ClientPause,
            target: "worker 1".into(),
            pid: Some(1),
            servers: Vec::new(),
            start_ns: 200 * MS,
            end_ns: 2800 * MS,
        };
        let found = violations(&ops, &writes, &[]);
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        let report = check(&ops, &writes, std::slice::from_ref(&pause), &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.documented.len(), 1);
        assert_eq!(report.documented_fenced, 1);
        // A pause of a third worker explains nothing.
        let other = Fault {
            pid: Some(3),
            ..pause
        };
        assert_eq!(
            check(&ops, &writes, &[other], &bounds()).documented.len(),
            0
        );
    }

    /// A pause of worker `pid` from `start` to `end` ms.
    fn pause(pid: u32, start: u64, end: u64) -> Fault {
        Fault {
            kind: FaultKind::ClientPause,
            target: format!("worker {pid}"),
            pid: Some(pid),
            servers: Vec::new(),
            start_ns: start * MS,
            end_ns: end * MS,
        }
    }

    #[test]
    fn a_waiter_paused_across_a_release_excuses_no_overlap() {
        // Worker 3 asks for k at 100 ms and is paused from 200 to 2800 ms while it waits; worker
        // 2 is granted k at 1200 ms and holds it to 3000 ms; worker 3's acquire returns a grant
        // at 2850 ms (a stale hand-off message taken as its grant), is told at 2851 ms that the
        // lock is its own, its first write is refused, and it sees the loss at 2853 ms.
        let mut waiter = hold(3, "k", 1, 2850, 2850);
        waiter.invoke_ns = 100 * MS;
        waiter.valid_ns = 2851 * MS;
        waiter.wrote_ns = 2852 * MS;
        waiter.lost_ns = 2853 * MS;
        waiter.release = Release::Lost;
        let ops = [hold(2, "k", 2, 1200, 3000), waiter];
        let writes = [
            write(2, 2, 1201, WriteResult::Accepted),
            Write {
                pid: 3,
                fence: 1,
                ..write(3, 1, 2851, WriteResult::Rejected)
            },
        ];
        let report = check(&ops, &writes, &[pause(3, 200, 2800)], &bounds());
        assert!(
            matches!(&report.violations[..], [Violation::Overlap(o)] if o.holds[1].pid == 3),
            "{:?}",
            report.violations
        );
        assert!(report.documented.is_empty());
        assert_eq!(report.paused_waiter_overlaps, 1);
        // Its acquire overran its wait, which the pause does excuse.
        assert_eq!(report.paused_acquires, 1);
    }

    #[test]
    fn a_holder_paused_between_its_grant_and_its_return_past_its_validity_is_documented() {
        // Worker 3's acquire (from 100 ms) is granted, and the worker is paused from 200 to
        // 2800 ms before the acquire returns (2850 ms); worker 2 is granted k once worker 3's
        // key expired (1200 ms). Worker 3 is never told the lock is its own after the return:
        // its first check finds it lost (2851 ms), its write is refused.
        let mut late = hold(3, "k", 1, 2850, 2850);
        late.invoke_ns = 100 * MS;
        late.valid_ns = 2850 * MS;
        late.wrote_ns = 2850 * MS;
        late.lost_ns = 2851 * MS;
        late.release = Release::Lost;
        let ops = [hold(2, "k", 2, 1200, 3000), late.clone()];
        let writes = [
            write(2, 2, 1201, WriteResult::Accepted),
            Write {
                pid: 3,
                fence: 1,
                ..write(3, 1, 2850, WriteResult::Rejected)
            },
        ];
        let report = check(&ops, &writes, &[pause(3, 200, 2800)], &bounds());
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.documented.len(), 1, "{:?}", report.documented);
        // Its token below one granted (and let go) meanwhile: the same limit.
        let ops_drop = [hold(2, "k", 2, 1200, 2000), late.clone()];
        let report = check(&ops_drop, &writes, &[pause(3, 200, 2800)], &bounds());
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(
            report.documented_fences.len(),
            1,
            "{:?}",
            report.documented_fences
        );
        // Told the lock was its own after the return: a violation (the stale hand-off's shape).
        let mut told = late;
        told.valid_ns = 2851 * MS;
        told.lost_ns = 2852 * MS;
        let ops = [hold(2, "k", 2, 1200, 3000), told];
        let report = check(&ops, &writes, &[pause(3, 200, 2800)], &bounds());
        assert!(!report.violations.is_empty(), "{:?}", report.documented);
        // A pause shorter than a ttl excuses nothing either.
        let report = check(&ops[..1], &writes[..1], &[pause(3, 200, 500)], &bounds());
        assert!(report.violations.is_empty());
    }

    #[test]
    fn a_holder_paused_excuses_only_holds_granted_after_its_pause_began_past_its_validity() {
        let (ops, writes) = superseded(100, 2900, 3000);
        assert!(check(&ops, &writes, &[pause(1, 200, 2800)], &bounds()).is_clean());
        let overlap = |ops: &[Op], fault: Fault| {
            let found = check(ops, &writes, &[fault], &bounds()).violations;
            matches!(&found[..], [Violation::Overlap(_)])
        };
        // Worker 2 granted before worker 1 was paused: two live holds at once.
        assert!(overlap(&ops, pause(1, 1250, 2800)));
        // A pause shorter than a ttl need not have outlasted worker 1's validity.
        assert!(overlap(&ops, pause(1, 200, 1100)));
        // Worker 1 told the lock was its own after the pause: its validity did not end in it.
        let mut told = ops.clone();
        told[0].valid_ns = 2850 * MS;
        assert!(overlap(&told, pause(1, 200, 2800)));
        // Paused after its hold ended (a clean release at 150 ms).
        let mut released = ops.clone();
        released[0].lost_ns = 0;
        released[0].wrote_ns = 0;
        released[0].release = Release::Ok;
        released[0].hold_end_ns = 150 * MS;
        assert!(check(&released, &[], &[pause(1, 200, 2800)], &bounds()).is_clean());
        released[0].hold_end_ns = 1250 * MS;
        assert!(overlap(&released, pause(1, 1260, 2800)));
    }

    #[test]
    fn a_stale_write_the_register_accepted_is_reported() {
        let writes = [
            write(2, 2, 10, WriteResult::Accepted),
            write(1, 1, 20, WriteResult::Accepted),
        ];
        let found = violations(&clean_history(), &writes, &[]);
        assert!(
            matches!(&found[..], [Violation::StaleWriteAccepted { write, newer }] if write.fence == 1 && newer.fence == 2),
            "{found:?}"
        );
        // Concurrent writes (the newer one had not returned when the older was sent) are fine.
        let concurrent = [
            write(2, 2, 10, WriteResult::Accepted),
            write(1, 1, 10, WriteResult::Accepted),
        ];
        assert!(violations(&clean_history(), &concurrent, &[]).is_empty());
    }

    #[test]
    fn a_key_nobody_holds_after_the_heal_is_reported() {
        let mut ops = clean_history();
        let mut refused = hold(1, "k", 0, 10_500, 10_500);
        refused.outcome = Outcome::Unavailable;
        ops.push(refused);
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::NoGrantAfterHeal { key, .. }] if key == "k"),
            "{found:?}"
        );
        ops.push(hold(2, "k", 9, 11_000, 11_010));
        assert!(violations(&ops, &[], &[]).is_empty());
    }

    /// A key left by a holder whose release failed lingers past the ttl where the servers keep
    /// it longer (etcd: a whole-second lease, refreshed at a leader change): a grant within the
    /// linger heals it, one after it does not, and the report names the last grant before.
    #[test]
    fn a_key_may_linger_after_the_heal_as_long_as_its_servers_keep_it() {
        let mut ops = clean_history();
        let mut stranded = hold(1, "k", 7, 9_000, 9_500);
        stranded.release = Release::Unavailable;
        let mut refused = hold(2, "k", 0, 10_500, 10_500);
        refused.outcome = Outcome::Contended;
        ops.extend([stranded, refused, hold(3, "k", 8, 12_600, 12_700)]);
        let etcd = Bounds {
            linger_ns: 2_500 * MS,
            ..bounds()
        };
        let report = check(&ops, &[], &[], &etcd);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.heal_checked, Some(1));
        let past_the_end = Bounds {
            end_ns: etcd.healed_ns + etcd.linger_ns,
            ..etcd
        };
        assert_eq!(check(&ops, &[], &[], &past_the_end).heal_checked, None);
        let found = violations(&ops, &[], &[]);
        assert!(
            matches!(&found[..], [Violation::NoGrantAfterHeal { key, last: Some(last), .. }] if key == "k" && last.pid == 1),
            "{found:?}"
        );
        let said = found[0].to_string();
        assert!(
            said.contains("within 1800 ms of the heal") && said.contains("pid=1"),
            "{said}"
        );
    }

    /// An ask for two keys refused after the heal while one of them was held throughout says
    /// nothing of the other: not reported. With both free, it does.
    #[test]
    fn a_refused_ask_for_two_keys_counts_only_where_the_other_was_free() {
        let mut ops = clean_history();
        let mut both = hold(1, "a", 0, 10_500, 10_500);
        both.keys.push("b".to_owned());
        both.fences.push(0);
        both.outcome = Outcome::Contended;
        ops.push(both);
        let found = violations(&ops, &[], &[]);
        assert_eq!(found.len(), 2, "{found:?}");
        ops.push(hold(2, "a", 9, 9_900, 11_500));
        let found = violations(&ops, &[], &[]);
        assert!(found.is_empty(), "{found:?}");
    }
    /// A clock step of `kind` on `servers` from `start` to `end` ms.
    fn clock_step(kind: FaultKind, servers: &[usize], start: u64, end: u64) -> Fault {
        Fault {
            kind,
            target: "clock 0".into(),
            pid: None,
            servers: servers.to_vec(),
            start_ns: start * MS,
            end_ns: end * MS,
        }
    }

    /// Worker 2 is granted k at 1200 ms while worker 1, granted at 1 ms, still holds it (its
    /// key expired early on the server); worker 1's write after worker 2's is refused.
    fn early_expiry() -> ([Op; 2], [Write; 3]) {
        superseded(1300, 1300, 1400)
    }

    #[test]
    fn an_overlap_during_a_forward_clock_step_is_a_documented_limit() {
        let (ops, writes) = early_expiry();
        let step = clock_step(FaultKind::ClockForward, &[0], 1000, 1500);
        let report = check(&ops, &writes, std::slice::from_ref(&step), &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.documented.len(), 1);
        assert_eq!(report.documented[0].fault.as_ref(), Some(&step));
        assert_eq!(report.documented_fenced, 1);
    }

    #[test]
    fn the_same_overlap_without_a_clock_step_is_a_violation() {
        let (ops, writes) = early_expiry();
        let found = violations(&ops, &writes, &[]);
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        // Nor does a step that began after both holds had ended.
        let later = clock_step(FaultKind::ClockForward, &[0], 1400, 1500);
        let found = violations(&ops, &writes, &[later]);
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
    }

    #[test]
    fn a_clock_step_on_a_redlock_minority_explains_no_overlap_but_one_on_a_majority_does() {
        let (ops, writes) = early_expiry();
        let redlock = Bounds {
            quorum: 3,
            ..bounds()
        };
        let minority = clock_step(FaultKind::ClockForward, &[0], 1000, 1500);
        let found = check(&ops, &writes, &[minority], &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        let majority = clock_step(FaultKind::ClockForward, &[0, 1, 2], 1000, 1500);
        let report = check(&ops, &writes, &[majority], &redlock);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.documented.len(), 1);
    }

    #[test]
    fn a_clock_step_on_one_redlock_node_explains_an_overlap_when_the_grant_had_a_bare_quorum() {
        // Worker 1's grant (0..1 ms) missed node 3 (down) and node 4 (link blackholed): it held
        // 0, 1 and 2 only, and node 2's clock stepped ahead at 1000 ms.
        let (ops, writes) = early_expiry();
        let redlock = Bounds {
            quorum: 3,
            ..bounds()
        };
        let on = |kind, server: usize| Fault {
            kind,
            target: format!("node {server}"),
            servers: vec![server],
            ..clock_step(kind, &[], 0, 500)
        };
        let step = clock_step(FaultKind::ClockForward, &[2], 1000, 1500);
        let missed = [on(FaultKind::Kill, 3), on(FaultKind::Blackhole, 4)];
        let faults = [missed[0].clone(), missed[1].clone(), step.clone()];
        let report = check(&ops, &writes, &faults, &redlock);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_eq!(report.documented[0].fault.as_ref(), Some(&step));
        // One node missing from the grant leaves it a node to spare.
        let found = check(&ops, &writes, &[missed[0].clone(), step], &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
    }

    /// The long run's Redlock incident (seed 819502), as FAULTS.md recorded it: worker 2's
    /// attempt began at 1000 ms while link 0 was blackholed and link 1 slow, and its replies came
    /// late (its grant returned at 1300 ms); node 4's clock stepped ahead from 1050 ms, after
    /// worker 2's grant there; worker 1 asked at 1100 ms and was granted at 1101 ms, holding to
    /// 1400 ms. Worker 2's grant rested on nodes 2, 3 and 4 alone, and node 4 forgot it.
    fn late_bare_quorum() -> (Vec<Op>, Vec<Fault>) {
        let mut late = hold(2, "k", 4, 1300, 1350);
        late.invoke_ns = 1000 * MS;
        late.wait_ms = 1500;
        let on = |kind, server: usize| Fault {
            kind,
            target: format!("link {server}"),
            servers: vec![server],
            ..clock_step(kind, &[], 900, 1500)
        };
        let faults = vec![
            on(FaultKind::Blackhole, 0),
            on(FaultKind::Latency, 1),
            clock_step(FaultKind::ClockForward, &[4], 1050, 1600),
        ];
        (vec![hold(1, "k", 5, 1101, 1400), late], faults)
    }

    /// The CI campaign's Redlock incident (seed 852886, 2026-12-05), in ms from 41103000 ms:
    /// node 4's clock was stepped back from 1248 to 1732 ms; worker 1 asked at 1556 ms and was
    /// granted at 1568 ms while worker 3's call on the key, asked at 1162 ms, was still under way
    /// (worker 1 won three nodes, node 4 among them; worker 3's key was on the other two, and
    /// stayed there past worker 1's tries to place its lock on them). The key set on node 4
    /// during the step expired when the clock returned, and worker 2, asking from 1573 ms, won
    /// node 4 and the two worker 3 let go at 1906 ms, while worker 1 was told the lock was its
    /// own until 2069 ms.
    fn split_vote_then_step_back() -> (Vec<Op>, Vec<Fault>) {
        let mut victim = hold(1, "k", 1, 1568, 2096);
        victim.invoke_ns = 1556 * MS;
        victim.valid_ns = 2069 * MS;
        victim.lost_ns = 2096 * MS;
        victim.release = Release::Lost;
        let mut other = hold(2, "k", 2, 1906, 1925);
        other.invoke_ns = 1573 * MS;
        let contender = Op {
            invoke_ns: 1162 * MS,
            outcome: Outcome::Contended,
            fences: Vec::new(),
            hold_start_ns: 0,
            hold_end_ns: 0,
            valid_ns: 0,
            release: Release::None,
            ..hold(3, "k", 0, 1700, 1700)
        };
        let step = clock_step(FaultKind::ClockBack, &[4], 1248, 1732);
        (vec![victim, other, contender], vec![step])
    }

    #[test]
    fn a_clock_step_on_one_redlock_node_explains_an_overlap_when_another_calls_key_left_a_bare_quorum()
     {
        let redlock = Bounds {
            quorum: 3,
            ..bounds()
        };
        let (ops, faults) = split_vote_then_step_back();
        let report = check(&ops, &[], &faults, &redlock);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert!(
            matches!(&report.documented[..], [o] if o.fault.as_ref() == Some(&faults[0])),
            "{:?}",
            report.documented
        );
        // Without the contender the grant took every node: a violation.
        let found = check(&ops[..2], &[], &faults, &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        // Nor does a call that ended more than a ttl before worker 1 asked count.
        let mut long_gone = ops.clone();
        long_gone[2].invoke_ns = 100 * MS;
        long_gone[2].done_ns = 1556 * MS - redlock.ttl_ns - MS;
        let found = check(&long_gone, &[], &faults, &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        // Nor a step whose return came after worker 2's grant (the key was still there then).
        let mut late_return = faults.clone();
        late_return[0].end_ns = 1910 * MS;
        let found = check(&ops, &[], &late_return, &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
    }

    #[test]
    fn a_late_grant_on_a_bare_quorum_of_which_a_node_stepped_ahead_is_a_documented_limit() {
        let redlock = Bounds {
            quorum: 3,
            ..bounds()
        };
        let (ops, faults) = late_bare_quorum();
        let report = check(&ops, &[], &faults, &redlock);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert!(
            matches!(&report.documented[..], [o] if o.fault.as_ref().is_some_and(|f| f.kind == FaultKind::ClockForward)),
            "{:?}",
            report.documented
        );
        // Without the faults at worker 2's grant, worker 1's call, under way during worker 2's
        // acquire, can have split the vote with it: still a bare quorum, still documented.
        assert!(check(&ops, &[], &faults[2..], &redlock).is_clean());
        // Nor does a step that began after both grants had returned.
        let mut after = faults.clone();
        after[2].start_ns = 1301 * MS;
        let found = check(&ops, &[], &after, &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        // A step back expires the keys set meanwhile when it returns: before worker 1's grant
        // it explains the overlap, after both grants it does not.
        let mut back = faults.clone();
        back[2] = clock_step(FaultKind::ClockBack, &[4], 950, 1050);
        assert!(check(&ops, &[], &back, &redlock).is_clean());
        back[2].end_ns = 1350 * MS;
        let found = check(&ops, &[], &back, &redlock).violations;
        assert!(matches!(&found[..], [Violation::Overlap(_)]), "{found:?}");
        // The same late grant after worker 1's hold ended: its smaller token is the same limit.
        let mut ops = ops;
        ops[0].hold_end_ns = 1200 * MS;
        ops[0].valid_ns = 1200 * MS;
        let report = check(&ops, &[], &faults, &redlock);
        assert!(report.is_clean(), "{:?}", report.violations);
        assert!(
            matches!(&report.documented_fences[..], [(Violation::FenceNotIncreasing { later, .. }, f)] if later.pid == 2 && f.kind == FaultKind::ClockForward),
            "{:?}",
            report.documented_fences
        );
        let mut after = faults;
        after[2].start_ns = 1301 * MS;
        let found = check(&ops, &[], &after, &redlock).violations;
        assert!(
            matches!(&found[..], [Violation::FenceNotIncreasing { .. }]),
            "{found:?}"
        );
    }

    /// Worker 2's token, granted at 1200 ms, is below worker 1's of 1..100 ms.
    fn shrinking_token() -> Vec<Op> {
        vec![hold(1, "k", 5_000, 1, 100), hold(2, "k", 4_000, 1200, 1300)]
    }

    #[test]
    fn a_token_that_does_not_grow_during_a_backward_clock_step_is_a_documented_limit() {
        let step = clock_step(FaultKind::ClockBack, &[0], 1000, 1500);
        let report = check(&shrinking_token(), &[], &[step], &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert!(
            matches!(&report.documented_fences[..], [(Violation::FenceNotIncreasing { later, .. }, f)] if later.pid == 2 && f.kind == FaultKind::ClockBack),
            "{:?}",
            report.documented_fences
        );
        // So is one granted after the return of a step ahead that began before the earlier
        // grant, also when the earlier grant came after the return (its counter counted on from
        // the clock ahead).
        for end in [50, 1000] {
            let ahead = clock_step(FaultKind::ClockForward, &[0], 0, end);
            let report = check(&shrinking_token(), &[], &[ahead], &bounds());
            assert!(report.is_clean(), "{:?}", report.violations);
            assert_eq!(report.documented_fences.len(), 1);
        }
    }

    #[test]
    fn a_token_a_little_below_across_a_failover_is_a_documented_limit_and_more_is_not() {
        let failover = |start, end| Fault {
            kind: FaultKind::Failover,
            target: "topology".into(),
            servers: Vec::new(),
            ..clock_step(FaultKind::Failover, &[], start, end)
        };
        // The later grant asked 47 ms after the earlier one returned: up to 53 ms below it is
        // within the 100 ms lag (36 ms: the quick campaign's Sentinel finding).
        let below = |us: u64, later_start: u64| {
            vec![
                hold(1, "k", 1_000_000_000 + us, 1, 30),
                hold(2, "k", 1_000_000_000, later_start, later_start + 10),
            ]
        };
        let within = below(36_000, 49);
        let report = check(&within, &[], &[failover(0, 5000)], &bounds());
        assert!(report.is_clean(), "{:?}", report.violations);
        assert!(
            matches!(&report.documented_fences[..], [(_, f)] if f.kind == FaultKind::Failover),
            "{:?}",
            report.documented_fences
        );
        assert!(check(&below(53_000, 49), &[], &[failover(0, 5000)], &bounds()).is_clean());
        let not_increasing = |ops: &[Op], faults: &[Fault]| {
            let found = check(ops, &[], faults, &bounds()).violations;
            matches!(&found[..], [Violation::FenceNotIncreasing { .. }])
        };
        // 54 ms below 47 ms later; 36 ms below 97 ms later (the later grant's clock was 97 ms
        // on, its token at least that less 100 ms); 101 ms below at once; a failover over before
        // the earlier grant; one after the later; none.
        assert!(not_increasing(&below(54_000, 49), &[failover(0, 5000)]));
        assert!(not_increasing(&below(36_000, 99), &[failover(0, 5000)]));
        assert!(not_increasing(&below(101_000, 31), &[failover(0, 5000)]));
        assert!(not_increasing(&within, &[failover(0, 0)]));
        assert!(not_increasing(&within, &[failover(60, 5000)]));
        assert!(not_increasing(&within, &[]));
    }

    #[test]
    fn a_token_that_does_not_grow_without_a_backward_clock_step_is_a_violation() {
        let not_increasing = |faults: &[Fault], bounds: &Bounds| {
            let found = check(&shrinking_token(), &[], faults, bounds).violations;
            matches!(&found[..], [Violation::FenceNotIncreasing { .. }])
        };
        assert!(not_increasing(&[], &bounds()));
        // A step back that ended before the later grant, a step ahead still active at the later
        // grant, one that began after the earlier grant, a restart; a step on a minority, and
        // one that returned more than the largest step before the later grant.
        let cases = [
            clock_step(FaultKind::ClockBack, &[0], 500, 1100),
            clock_step(FaultKind::ClockForward, &[0], 0, 1500),
            clock_step(FaultKind::ClockForward, &[0], 50, 1000),
            Fault {
                kind: FaultKind::Restart,
                ..clock_step(FaultKind::ClockBack, &[0], 1000, 1001)
            },
        ];
        for fault in cases {
            assert!(
                not_increasing(std::slice::from_ref(&fault), &bounds()),
                "{fault}"
            );
        }
        let redlock = Bounds {
            quorum: 3,
            ..bounds()
        };
        let minority = clock_step(FaultKind::ClockBack, &[0, 1], 1000, 1500);
        assert!(not_increasing(&[minority], &redlock));
        let small_steps = Bounds {
            clock_step_ns: 100 * MS,
            ..bounds()
        };
        let long_ago = clock_step(FaultKind::ClockForward, &[0], 0, 50);
        assert!(not_increasing(&[long_ago], &small_steps));
    }
}
