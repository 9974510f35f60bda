//! Grant histories of multi-process stress tests and a checker that knows nothing of the lock.
//!
//! Each worker prints one [`Grant`] line per grant: its process id, the key, the fencing token,
//! when `acquire` returned and when `release` was about to be called, read from `CLOCK_MONOTONIC`
//! ([`now_ns`]), which every process on one machine shares. The interval a worker records lies
//! inside the interval it really held the lock (granted before `acquire` returned, released after
//! `release` was called), so two recorded intervals that overlap prove two holders at once.
//!
//! [`check`] proves, per key, that no two grants overlap in time and that fencing tokens strictly
//! increase in grant order; a failure names the two offending grants.

use std::fmt;
use std::io::Write as _;
use std::process::ExitCode;
use std::str::FromStr;

use nix::time::{ClockId, clock_gettime};

/// One grant of a lock, as a worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The worker's process id.
    pub pid: u32,
    /// The lock's key (without spaces).
    pub key: String,
    /// Its fencing token.
    pub fence: u64,
    /// [`now_ns`] right after `acquire` returned.
    pub acquired_ns: u64,
    /// [`now_ns`] right before `release` was called.
    pub released_ns: u64,
}

/// Nanoseconds of `CLOCK_MONOTONIC`: comparable across the processes of one machine.
///
/// # Panics
/// If the clock cannot be read (it always can on Linux).
pub fn now_ns() -> u64 {
    #[allow(clippy::expect_used)]
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is readable");
    let nanos = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    u64::try_from(nanos).unwrap_or(0)
}

const PREFIX: &str = "grant ";

impl Grant {
    /// A grant of `key` to this process, acquired at `acquired_ns`, about to be released now.
    pub fn ending_now(key: &str, fence: Option<u64>, acquired_ns: u64) -> Grant {
        Grant {
            pid: std::process::id(),
            key: key.to_owned(),
            fence: fence.unwrap_or(0),
            acquired_ns,
            released_ns: now_ns(),
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}pid={} fence={} acquired={} released={} key={}",
            self.pid, self.fence, self.acquired_ns, self.released_ns, self.key
        )
    }
}

impl FromStr for Grant {
    type Err = String;

    /// Parses a line written by `Display`.
    fn from_str(line: &str) -> Result<Grant, String> {
        let parse = || {
            let mut fields = Fields::after(line, PREFIX)?;
            Some(Grant {
                pid: fields.next("pid")?,
                fence: fields.next("fence")?,
                acquired_ns: fields.next("acquired")?,
                released_ns: fields.next("released")?,
                key: fields.next("key")?,
            })
        };
        parse().ok_or_else(|| format!("not a grant line: {line:?}"))
    }
}

/// The space-separated `name=value` fields of a report line after its `prefix`, read in order.
pub(crate) struct Fields<'a>(std::str::Split<'a, char>);

impl<'a> Fields<'a> {
    pub(crate) fn after(line: &'a str, prefix: &str) -> Option<Fields<'a>> {
        Some(Fields(line.strip_prefix(prefix)?.split(' ')))
    }

    /// The next field's value, which must be called `name`.
    pub(crate) fn next<T: FromStr>(&mut self, name: &str) -> Option<T> {
        let field = self.0.next()?;
        field.strip_prefix(name)?.strip_prefix('=')?.parse().ok()
    }
}

/// Prints a worker's report on stdout in one write: `lines` (a grant or section each, and any
/// other figures), then `violations=<v> lost=<l>`. Exit code 0, or 3 when stdout is gone.
pub fn print_report(
    lines: impl IntoIterator<Item = String>,
    violations: u64,
    lost: u64,
) -> ExitCode {
    let mut out = String::new();
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!("violations={violations} lost={lost}\n"));
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(3),
    }
}

/// The grant lines among `lines` (other lines are skipped); panics on a malformed grant line.
pub fn grants<'a>(lines: impl IntoIterator<Item = &'a String>) -> Vec<Grant> {
    lines
        .into_iter()
        .filter(|line| line.starts_with(PREFIX))
        .map(|line| line.parse().unwrap_or_else(|e: String| panic!("{e}")))
        .collect()
}

/// The grants of finished workers, each of which (named in `who`, in the same order) must have
/// succeeded and reported `per_worker` grants, with their summed `(violations, lost)`.
pub fn gather(
    outputs: &[crate::Finished],
    who: &[&str],
    per_worker: usize,
) -> (Vec<Grant>, u64, u64) {
    let mut all = Vec::new();
    let (mut violations, mut lost) = (0, 0);
    for (out, who) in outputs.iter().zip(who) {
        out.assert_success(&format!("{who} worker"));
        let own = grants(&out.stdout);
        assert_eq!(
            own.len(),
            per_worker,
            "{who} worker reported {} grants\nstderr: {}",
            own.len(),
            out.stderr
        );
        let (v, l) = summary(&out.stdout);
        violations += v;
        lost += l;
        all.extend(own);
    }
    (all, violations, lost)
}

/// The `violations=<v> lost=<l>` summary line the workers end with, as `(v, l)`; panics without one.
pub fn summary<'a>(lines: impl IntoIterator<Item = &'a String>) -> (u64, u64) {
    let counts = |line: &str| {
        let (v, l) = line.strip_prefix("violations=")?.split_once(" lost=")?;
        Some((v.parse().ok()?, l.parse().ok()?))
    };
    let lines: Vec<&String> = lines.into_iter().collect();
    lines
        .iter()
        .find_map(|line| counts(line))
        .unwrap_or_else(|| panic!("no summary line in {lines:?}"))
}

/// Why a history is impossible under mutual exclusion with fencing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `second` was granted before `first` was released.
    Overlap {
        /// The earlier grant.
        first: Grant,
        /// The grant made while `first` was still held.
        second: Grant,
    },
    /// `later` was granted after `earlier` but carries a token that is not larger.
    FenceNotIncreasing {
        /// The earlier grant.
        earlier: Grant,
        /// The later grant.
        later: Grant,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "two holders of {} at once: granted to pid {} {}ns before pid {} released it\n  {first}\n  {second}",
                first.key,
                second.pid,
                first.released_ns - second.acquired_ns,
                first.pid
            ),
            Violation::FenceNotIncreasing { earlier, later } => write!(
                f,
                "fencing token of {} went from {} to {}\n  {earlier}\n  {later}",
                earlier.key, earlier.fence, later.fence
            ),
        }
    }
}

/// Checks every key's grants: no two overlap, and tokens strictly increase in grant order.
pub fn check(grants: &[Grant]) -> Result<(), Violation> {
    let mut ordered: Vec<&Grant> = grants.iter().collect();
    ordered.sort_by(|a, b| {
        (&a.key, a.acquired_ns, a.released_ns).cmp(&(&b.key, b.acquired_ns, b.released_ns))
    });
    for per_key in ordered.chunk_by(|a, b| a.key == b.key) {
        // The grant released last so far: any later grant must start after it ends.
        let mut holder = per_key[0];
        for pair in per_key.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            if later.acquired_ns < holder.released_ns {
                return Err(Violation::Overlap {
                    first: holder.clone(),
                    second: later.clone(),
                });
            }
            if later.fence <= earlier.fence {
                return Err(Violation::FenceNotIncreasing {
                    earlier: earlier.clone(),
                    later: later.clone(),
                });
            }
            if later.released_ns > holder.released_ns {
                holder = later;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(pid: u32, fence: u64, acquired_ns: u64, released_ns: u64) -> Grant {
        Grant {
            pid,
            key: "k".to_owned(),
            fence,
            acquired_ns,
            released_ns,
        }
    }

    #[test]
    fn lines_round_trip() {
        let g = grant(7, 42, 100, 200);
        assert_eq!(g.to_string().parse::<Grant>(), Ok(g));
        assert!("grant pid=1".parse::<Grant>().is_err());
    }

    #[test]
    fn a_clean_history_passes() {
        let history = [grant(1, 1, 0, 10), grant(2, 2, 10, 20), grant(1, 3, 25, 30)];
        assert_eq!(check(&history), Ok(()));
    }

    #[test]
    fn an_overlap_names_both_grants() {
        // The long first grant overlaps the third, not only its neighbour.
        let history = [
            grant(1, 1, 0, 100),
            grant(2, 2, 100, 110),
            grant(3, 3, 50, 60),
        ];
        assert_eq!(
            check(&history),
            Err(Violation::Overlap {
                first: history[0].clone(),
                second: history[2].clone(),
            })
        );
    }

    #[test]
    fn a_token_that_does_not_grow_is_named() {
        let history = [grant(1, 5, 0, 10), grant(2, 5, 20, 30)];
        assert_eq!(
            check(&history),
            Err(Violation::FenceNotIncreasing {
                earlier: history[0].clone(),
                later: history[1].clone(),
            })
        );
    }

    #[test]
    fn keys_are_checked_apart() {
        let mut other = grant(2, 1, 5, 15);
        other.key = "other".to_owned();
        assert_eq!(check(&[grant(1, 1, 0, 10), other]), Ok(()));
    }
}
