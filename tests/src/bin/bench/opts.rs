//! The command line: which sections run, for how long, with how many tasks, and where the output goes.

use std::time::Duration;

use clap::Parser;
use lock_runtime::LockConfig;

/// Throughput and latency of `lock-runtime`, side by side with a hand-written `redis` loop.
#[derive(Debug, Parser)]
#[command(name = "bench", args_override_self = true)]
pub(crate) struct Opts {
    /// Redis to measure against; without it, a `redis-server` started (and stopped) here.
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,
    /// Seconds per throughput run, after the warm-up.
    #[arg(long, value_name = "S", default_value = "3", value_parser = seconds)]
    pub(crate) secs: Duration,
    /// Seconds of warm-up before each throughput run.
    #[arg(long, value_name = "S", default_value = "1", value_parser = seconds)]
    pub(crate) warmup: Duration,
    /// Tasks of the many-task throughput runs (sections 1, 5 and 7), on distinct keys.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = at_least_one)]
    pub(crate) tasks: usize,
    /// Hand-offs sampled per hand-off run (sections 2 and 7).
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = at_least_one)]
    pub(crate) handoffs: usize,
    /// Tasks waiting at every hand-off (sections 2 and 7); clients on the one key of section 8.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = at_least_one)]
    pub(crate) waiters: usize,
    /// Pairs per latency row (section 4), nested calls (5), PINGs for the round trip (8).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = at_least_one)]
    pub(crate) samples: usize,
    /// Locks held at once in section 6.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = at_least_one)]
    pub(crate) held: usize,
    /// Sections to run (all but held and topology when not given):
    /// pairs,handoff,memory,redlock,multi,contended,held,topology.
    #[arg(long, value_name = "A,B,..", value_delimiter = ',', action = clap::ArgAction::Set,
          value_parser = ["pairs", "handoff", "memory", "redlock", "multi", "contended", "held", "topology"])]
    pub(crate) only: Vec<String>,
    /// Columns of section 1 to run (all when not given): crate,hosted,multiplexed,foreign.
    #[arg(long, value_name = "A,B,..", value_delimiter = ',', action = clap::ArgAction::Set,
          value_parser = ["crate", "hosted", "multiplexed", "foreign"])]
    pub(crate) impls: Vec<String>,
    /// Fencing tokens on everywhere (off by default on Redis, as the library's default is).
    #[arg(long)]
    fencing: bool,
    /// Tables on stderr, the figures as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

impl Opts {
    pub(crate) fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.named(section)
    }

    /// Only for sections too long for the default run.
    pub(crate) fn named(&self, section: &str) -> bool {
        self.only.iter().any(|s| s == section)
    }

    pub(crate) fn runs_impl(&self, name: &str) -> bool {
        self.impls.is_empty() || self.impls.iter().any(|s| s == name)
    }

    pub(crate) fn fencing(&self) -> bool {
        self.fencing
    }

    pub(crate) fn config(&self, config: LockConfig) -> LockConfig {
        config.fencing(self.fencing)
    }
}

/// A number of seconds, fractions allowed.
fn seconds(value: &str) -> Result<Duration, String> {
    let secs: f64 = value.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{e}"))
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>().map_err(|e| format!("{e}"))? {
        0 => Err("must be at least 1".to_owned()),
        n => Ok(n),
    }
}
