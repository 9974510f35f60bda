//! The command line: global options and one subcommand per operation.

use clap::{Args, Parser, Subcommand};

/// See and operate the distributed locks kept in Redis or etcd by `lock-runtime`.
///
/// The servers: `--url` (Redis) or `--etcd` (etcd), else `LOCK_REDIS_URL` or
/// `LOCK_ETCD_ENDPOINTS` (not both).
///
/// Exit codes: 0 ok, 1 not found (inspect: not held, also when only a minority of Redlock nodes
/// hold it; release: nothing was held), 2 error (bad arguments, unreachable server, refused
/// release).
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Redis URL, `redis://[user:pass@]host[:port][/db]`; repeat it or separate with commas for
    /// Redlock (several independent masters). Default: `LOCK_REDIS_URL`, read the same way.
    #[arg(long = "url", global = true, value_name = "URL", value_delimiter = ',')]
    pub(crate) urls: Vec<String>,
    /// etcd endpoints, `[http://][user:pass@]host:port`, comma-separated (or repeat it).
    /// Default: `LOCK_ETCD_ENDPOINTS`, read the same way. Needs lockctl built with the `etcd`
    /// feature.
    #[arg(
        long = "etcd",
        global = true,
        value_name = "ENDPOINTS",
        value_delimiter = ',',
        conflicts_with_all = ["urls", "cluster"]
    )]
    pub(crate) etcd: Vec<String>,
    /// The URLs are seeds of a Redis Cluster (also when `LOCK_REDIS_MODE=cluster`): `list`
    /// scans every master, `inspect` and `release` go to the key's master. `watch` does not
    /// work on a cluster (releases go to sharded channels, which take no patterns).
    #[arg(long, global = true)]
    pub(crate) cluster: bool,
    /// Key prefix the locks were configured with.
    #[arg(long, global = true, default_value = "lock:")]
    pub(crate) prefix: String,
    /// Machine-readable output: one JSON document (list, inspect, release), JSON lines (watch).
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List held locks with their remaining time and fencing token (Redis: SCAN on every node,
    /// never KEYS; etcd: range reads over the prefix).
    List {
        /// Glob over lock names: `*` any run of characters, `?` one character.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Show one lock: remaining time, fencing token, holders and each node's view. Exit 1 when
    /// not held; under Redlock, when only a minority of nodes hold it, their views are printed
    /// and the exit is still 1.
    Inspect {
        /// The lock name, without the prefix (e.g. `wallet:42`).
        key: String,
    },
    /// Delete a lock whoever holds it; its holder finds it lost at its next renewal. Exit 1 when
    /// nothing was held.
    Release {
        /// The lock name, without the prefix.
        key: String,
        /// Required: this breaks mutual exclusion for the current holder.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Print one line per release until interrupted.
    ///
    /// Redis: only releases that someone waits for are published (a holder's release, or
    /// `lockctl release`): acquisitions are not, a release nobody waits for is not (it costs
    /// nothing more than the hand-written lock's), and neither are locks that expire because
    /// their holder died. Under Redlock each node where someone waits announces the release, so
    /// one release prints a line per such node, naming it.
    ///
    /// etcd: a line per lock at each revision that deleted any of its keys: a release (the
    /// holder's, or `lockctl release`), a lease that ran out (a holder that died), or a waiter
    /// leaving a fair lock's or a semaphore's line.
    Watch {
        /// Glob over lock names: `*` any run of characters, `?` one character.
        #[arg(default_value = "*")]
        pattern: String,
        /// Stop after this many events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
}
