//! Histories of the lock kinds (fair, shared, permits) across processes, and the measures the
//! multi-process tests assert on: how many held at once, arrival-order inversions, owner changes
//! and Jain's fairness index.
//!
//! Each worker task prints one [`Section`] line per critical section: who (process and task), the
//! kind it asked for, its fencing token, and three `CLOCK_MONOTONIC` readings ([`now_ns`]) shared
//! by every process of the machine: before `acquire` was called, right after it returned, right
//! before `release` was called. As in [`crate::history`], the recorded hold lies inside the real
//! one, so recorded holds that overlap prove holders at once.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use lock_runtime::Lock;

use crate::history::{Fields, now_ns};

/// What a section asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An exclusive lock: a writer of a shared key, or a plain lock.
    Exclusive,
    /// A fair (FIFO) exclusive lock.
    Fair,
    /// A shared (reader's) hold.
    Shared,
    /// One of `n` permits.
    Permits(u32),
}

impl Kind {
    /// `lock` asking for this kind.
    pub fn apply(self, lock: Lock) -> Lock {
        match self {
            Kind::Exclusive => lock,
            Kind::Fair => lock.fair(true),
            Kind::Shared => lock.shared(true),
            Kind::Permits(n) => lock.permits(n),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Exclusive => f.write_str("write"),
            Kind::Fair => f.write_str("fair"),
            Kind::Shared => f.write_str("read"),
            Kind::Permits(n) => write!(f, "permits={n}"),
        }
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(text: &str) -> Result<Kind, String> {
        match text {
            "write" => Ok(Kind::Exclusive),
            "fair" => Ok(Kind::Fair),
            "read" => Ok(Kind::Shared),
            _ => text
                .strip_prefix("permits=")
                .and_then(|n| n.parse().ok())
                .map(Kind::Permits)
                .ok_or_else(|| format!("not a kind (write, fair, read, permits=N): {text:?}")),
        }
    }
}

/// One critical section of one worker task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// `<pid>/<task>`: the holder.
    pub who: String,
    /// What it asked for.
    pub kind: Kind,
    /// Its fencing token.
    pub fence: u64,
    /// [`now_ns`] right before `acquire` was called.
    pub asked_ns: u64,
    /// [`now_ns`] right after `acquire` returned.
    pub acquired_ns: u64,
    /// [`now_ns`] right before `release` was called.
    pub released_ns: u64,
}

const PREFIX: &str = "section ";

impl Section {
    /// A section of task `task` of this process, asked at `asked_ns`, acquired at
    /// `acquired_ns`, about to be released now.
    pub fn ending_now(
        task: usize,
        kind: Kind,
        fence: Option<u64>,
        asked_ns: u64,
        acquired_ns: u64,
    ) -> Section {
        Section {
            who: format!("{}/{task}", std::process::id()),
            kind,
            fence: fence.unwrap_or(0),
            asked_ns,
            acquired_ns,
            released_ns: now_ns(),
        }
    }

    /// How long `acquire` took.
    pub fn waited_ns(&self) -> u64 {
        self.acquired_ns.saturating_sub(self.asked_ns)
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}who={} kind={} fence={} asked={} acquired={} released={}",
            self.who, self.kind, self.fence, self.asked_ns, self.acquired_ns, self.released_ns
        )
    }
}

impl FromStr for Section {
    type Err = String;

    /// Parses a line written by `Display`.
    fn from_str(line: &str) -> Result<Section, String> {
        let parse = || {
            let mut fields = Fields::after(line, PREFIX)?;
            Some(Section {
                who: fields.next("who")?,
                kind: fields.next("kind")?,
                fence: fields.next("fence")?,
                asked_ns: fields.next("asked")?,
                acquired_ns: fields.next("acquired")?,
                released_ns: fields.next("released")?,
            })
        };
        parse().ok_or_else(|| format!("not a section line: {line:?}"))
    }
}

/// The section lines among `lines` (other lines are skipped); panics on a malformed one.
pub fn sections<'a>(lines: impl IntoIterator<Item = &'a String>) -> Vec<Section> {
    lines
        .into_iter()
        .filter(|line| line.starts_with(PREFIX))
        .map(|line| line.parse().unwrap_or_else(|e: String| panic!("{e}")))
        .collect()
}

/// The most sections of `kinds` held at once (by their recorded holds, which lie inside the real
/// ones, so the real maximum is at least this).
pub fn most_at_once(sections: &[Section], counts: impl Fn(Kind) -> bool) -> usize {
    // +1 at each acquire, -1 at each release; a release sorts before an acquire at the same
    // instant (touching holds are not concurrent).
    let mut edges: Vec<(u64, i64)> = sections
        .iter()
        .filter(|s| counts(s.kind))
        .flat_map(|s| [(s.acquired_ns, 1), (s.released_ns, -1)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// The first pair of sections where an exclusive one (plain, fair or writer) overlaps any other.
pub fn exclusive_overlap(sections: &[Section]) -> Option<(&Section, &Section)> {
    let mut ordered: Vec<&Section> = sections.iter().collect();
    ordered.sort_by_key(|s| s.acquired_ns);
    for (i, a) in ordered.iter().enumerate() {
        for b in &ordered[i + 1..] {
            if b.acquired_ns >= a.released_ns {
                break;
            }
            if matches!(a.kind, Kind::Exclusive | Kind::Fair)
                || matches!(b.kind, Kind::Exclusive | Kind::Fair)
            {
                return Some((a, b));
            }
        }
    }
    None
}

/// The grants made out of arrival order: `(g, h)` for each section `g` granted while a section
/// `h` that asked more than `slack_ns` before `g` asked was still waiting (`h` is the one that
/// asked first among those). Asks closer than `slack_ns` are concurrent (a client's clock
/// reading comes before its request reaches the server), so they have no order to keep.
pub fn out_of_order(sections: &[Section], slack_ns: u64) -> Vec<(&Section, &Section)> {
    let mut by_grant: Vec<&Section> = sections.iter().collect();
    by_grant.sort_by_key(|s| s.acquired_ns);
    // The section that asked first among those granted from position i on (a suffix minimum).
    let mut first_ask: Vec<Option<&Section>> = vec![None; by_grant.len() + 1];
    for i in (0..by_grant.len()).rev() {
        first_ask[i] = match first_ask[i + 1] {
            Some(h) if h.asked_ns <= by_grant[i].asked_ns => Some(h),
            _ => Some(by_grant[i]),
        };
    }
    by_grant
        .iter()
        .zip(&first_ask[1..])
        .filter_map(|(g, h)| {
            let h = (*h)?;
            (h.asked_ns.saturating_add(slack_ns) < g.asked_ns).then_some((*g, h))
        })
        .collect()
}

/// How many times consecutive grants (in grant order) went to different holders, out of how
/// many consecutive pairs.
pub fn owner_changes(sections: &[Section]) -> (usize, usize) {
    let mut by_grant: Vec<&Section> = sections.iter().collect();
    by_grant.sort_by_key(|s| s.acquired_ns);
    let pairs = by_grant.len().saturating_sub(1);
    let changes = by_grant.windows(2).filter(|w| w[0].who != w[1].who).count();
    (changes, pairs)
}

/// Sections per holder.
pub fn per_holder(sections: &[Section]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for s in sections {
        *counts.entry(s.who.as_str()).or_insert(0) += 1;
    }
    counts
}

/// Jain's fairness index of `shares`: 1 when all are equal, `1/n` when one has everything.
pub fn jain(shares: impl IntoIterator<Item = usize>) -> f64 {
    let shares: Vec<f64> = shares.into_iter().map(|x| x as f64).collect();
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (shares.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(who: &str, kind: Kind, asked: u64, acquired: u64, released: u64) -> Section {
        Section {
            who: who.to_owned(),
            kind,
            fence: acquired,
            asked_ns: asked,
            acquired_ns: acquired,
            released_ns: released,
        }
    }

    #[test]
    fn lines_round_trip() {
        for kind in [Kind::Exclusive, Kind::Fair, Kind::Shared, Kind::Permits(3)] {
            let s = section("12/3", kind, 1, 2, 3);
            assert_eq!(s.to_string().parse::<Section>(), Ok(s));
        }
        assert!("section who=1/0 kind=permits=x".parse::<Section>().is_err());
        assert!("grant pid=1".parse::<Section>().is_err());
    }

    #[test]
    fn most_at_once_counts_only_real_overlaps() {
        let history = [
            section("a", Kind::Permits(3), 0, 0, 10),
            section("b", Kind::Permits(3), 0, 5, 15),
            section("c", Kind::Permits(3), 0, 10, 20), // starts as `a` ends: not with it
            section("d", Kind::Permits(3), 0, 12, 14),
        ];
        assert_eq!(most_at_once(&history, |_| true), 3);
        assert_eq!(most_at_once(&history[..2], |_| true), 2);
        assert_eq!(most_at_once(&history, |k| k == Kind::Shared), 0);
    }

    #[test]
    fn a_writer_overlapping_a_reader_is_named() {
        let readers = [
            section("a", Kind::Shared, 0, 0, 10),
            section("b", Kind::Shared, 0, 5, 15),
        ];
        assert_eq!(exclusive_overlap(&readers), None);
        let mut history = readers.to_vec();
        history.push(section("w", Kind::Exclusive, 0, 20, 30));
        assert_eq!(exclusive_overlap(&history), None);
        history.push(section("w2", Kind::Exclusive, 0, 14, 16));
        let named = exclusive_overlap(&history).map(|(a, b)| (a.who.as_str(), b.who.as_str()));
        assert_eq!(named, Some(("b", "w2")));
    }

    #[test]
    fn grants_out_of_arrival_order_are_counted() {
        let in_order = [
            section("a", Kind::Fair, 0, 10, 20),
            section("b", Kind::Fair, 5, 20, 30),
            section("c", Kind::Fair, 6, 30, 40),
        ];
        assert!(out_of_order(&in_order, 0).is_empty());
        // `c` asked well after `b` but was served first.
        let swapped = [
            section("a", Kind::Fair, 0, 10, 20),
            section("b", Kind::Fair, 5, 30, 40),
            section("c", Kind::Fair, 9, 20, 30),
        ];
        assert_eq!(out_of_order(&swapped, 0), vec![(&swapped[2], &swapped[1])]);
        // Asks 4 ns apart are concurrent under a slack of 10.
        assert!(out_of_order(&swapped, 10).is_empty());
    }

    #[test]
    fn owner_changes_and_fairness() {
        let history = [
            section("a", Kind::Fair, 0, 0, 1),
            section("a", Kind::Fair, 0, 2, 3),
            section("b", Kind::Fair, 0, 4, 5),
        ];
        assert_eq!(owner_changes(&history), (1, 2));
        assert_eq!(per_holder(&history).get("a"), Some(&2));
        assert!((jain([5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain([8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert!(jain([10, 9, 11, 10]) > 0.99);
    }
}
