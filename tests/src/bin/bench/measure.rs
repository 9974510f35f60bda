//! Shared measurement: pairs/s over a timed window with what each pair cost (CPU time and context
//! switches of this process, CPU time of the redis-server), and percentiles of latency samples.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_tests::unique_key;

use crate::locker::Locker;
use crate::{Bench, BoxError, Res};

/// Runs `tasks` loops of pairs on distinct keys for warm-up + `secs`; pairs/s over the measured part.
pub(crate) async fn pairs_per_sec(locker: &Locker, tasks: usize, bench: &Bench) -> Res<Rate> {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let base = unique_key("bench:pairs");
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (mut locker, count, stop) = (locker.clone(), Arc::clone(&count), Arc::clone(&stop));
        let key = format!("{base}:{t}");
        handles.push(tokio::spawn(async move {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                // A fresh token per acquisition, as a real lock needs (cheap: no randomness). The
                // crate makes its own: it is not charged for formatting one it ignores.
                let token = if locker.makes_tokens() {
                    String::new()
                } else {
                    format!("{t:08x}{n:024x}")
                };
                locker.pair(&key, &token).await?;
                count.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(bench.opts.warmup).await;
    let (c0, t0, u0, s0) = (
        count.load(Ordering::Relaxed),
        Instant::now(),
        Usage::now(),
        bench.server_cpu(),
    );
    tokio::time::sleep(bench.opts.secs).await;
    let (c1, t1, u1, s1) = (
        count.load(Ordering::Relaxed),
        Instant::now(),
        Usage::now(),
        bench.server_cpu(),
    );
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await??;
    }
    let pairs = (c1 - c0).max(1) as f64;
    Ok(Rate {
        per_sec: pairs / (t1 - t0).as_secs_f64(),
        cpu_us: (u1.cpu - u0.cpu) * 1e6 / pairs,
        switches: (u1.switches - u0.switches) as f64 / pairs,
        server_us: (s1 - s0) * 1e6 / pairs,
    })
}

/// Pairs per second, and what one pair cost this process (all threads) and the redis-server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) per_sec: f64,
    pub(crate) cpu_us: f64,
    switches: f64,
    /// CPU time of the redis-server (`INFO cpu`, all its threads) per pair; NaN without a server.
    pub(crate) server_us: f64,
}

impl Rate {
    pub(crate) const SKIPPED: Rate = Rate {
        per_sec: f64::NAN,
        cpu_us: f64::NAN,
        switches: f64::NAN,
        server_us: f64::NAN,
    };

    pub(crate) fn cost(&self) -> String {
        if self.server_us.is_nan() {
            format!("{:.0}us {:.1}cs", self.cpu_us, self.switches)
        } else {
            format!(
                "{:.0}us {:.1}cs srv {:.1}us",
                self.cpu_us, self.switches, self.server_us
            )
        }
    }
}

/// CPU seconds (user + system, all threads) the redis-server at `url` has used, from `INFO cpu`;
/// NaN when it does not answer.
pub(crate) fn server_cpu(url: &str) -> f64 {
    let info = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg("cpu").query::<String>(&mut c));
    let Ok(info) = info else {
        return f64::NAN;
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    field("used_cpu_sys") + field("used_cpu_user")
}

/// CPU time (user + system, seconds) and context switches of this process so far, from `/proc`
/// (zero where unavailable). The CPU clock ticks at 100 Hz, fine over a run of seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) cpu: f64,
    switches: u64,
}

impl Usage {
    pub(crate) fn now() -> Usage {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
        let mut switches = 0;
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let status =
                    std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                switches += status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum::<u64>();
            }
        }
        Usage { cpu, switches }
    }
}

/// Percentiles of latency samples.
pub(crate) struct Stats {
    pub(crate) n: usize,
    pub(crate) p50: Duration,
    p90: Duration,
    pub(crate) p99: Duration,
    max: Duration,
}

impl Stats {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Stats {
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least p of all samples at or below it.
        let rank = |p: f64| {
            let i = (p * samples.len() as f64).ceil() as usize;
            samples
                .get(i.saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        Stats {
            n: samples.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }

    pub(crate) fn header(first: &str) -> String {
        format!(
            "{first:<32}  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
            "samples", "p50", "p90", "p99", "max"
        )
    }

    pub(crate) fn row(&self, name: &str) -> String {
        format!(
            "{name:<32}  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
            self.n,
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// `d` in milliseconds, for `--json`.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}
