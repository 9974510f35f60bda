//! Heap allocations per uncontended acquire+release pair, in this process (every thread: the
//! library's runtime too), counted by dhat's heap profiler: the hand-written loop (`SET NX PX`, then
//! an `EVALSHA` compare-and-delete, on one `MultiplexedConnection`), this crate on one node
//! (unfenced, the default, and fenced, each hosted on its own runtime and on the caller's), in
//! memory, and over Redlock's 5 nodes (servers started here). One task, a key per pair made before counting. A count, not a rate: the machine's noise
//! does not move it, so it is a separate binary from `bench` (whose rates dhat's bookkeeping would
//! slow down).
//!
//! ```text
//! cargo run --release -p lock-tests --features bench --bin allocs -- [--pairs 2000]
//! ```
//!
//! Without `--url` it starts its own `redis-server`, and without `--redlock` five more for the
//! Redlock row (only when that row runs). To see where a row's allocations come from,
//! `--row 1 --json dhat-heap.json` profiles that row alone (build with
//! `CARGO_PROFILE_RELEASE_DEBUG=line-tables-only` for file and line numbers): each site's
//! count there covers the warm-up pairs too, twice `--pairs` in all.

use std::error::Error;
use std::time::Duration;

use clap::Parser;
use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisMasters, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands as _, ExistenceCheck, Script, SetExpiry, SetOptions};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const TTL: Duration = Duration::from_secs(10);

/// The Redlock row's number (`--row`): the last.
const REDLOCK_ROW: usize = 5;

const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

#[derive(Debug, Parser)]
struct Opts {
    /// Redis to run against; default: a redis-server started here.
    #[arg(long)]
    url: Option<String>,
    /// Redlock's nodes, comma-separated; default: five redis-servers started here.
    #[arg(long, value_delimiter = ',')]
    redlock: Vec<String>,
    /// Pairs counted per row (after as many again uncounted, to warm up connections and caches).
    #[arg(long, default_value_t = 2000)]
    pairs: usize,
    /// Only the row numbered so (0: the loop, as printed), for a profile of its sites alone.
    #[arg(long)]
    row: Option<usize>,
    /// Writes dhat's profile (every allocation site, warm-up included) to this file, for
    /// `dh_view.html`; without it the profile stays in memory.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// One way to take and let go of an uncontended lock.
enum Pair {
    Raw(MultiplexedConnection, Script),
    Crate(LockClient),
}

impl Pair {
    async fn run(&mut self, key: &str) -> Res<()> {
        match self {
            Pair::Raw(conn, release) => {
                // The loop's token is its key: it never meets another holder here.
                let options = SetOptions::default()
                    .conditional_set(ExistenceCheck::NX)
                    .with_expiration(SetExpiry::PX(10_000));
                let set: Option<String> = conn.set_options(key, key, options).await?;
                if set.is_none() {
                    return Err(format!("raw: {key} unexpectedly held").into());
                }
                let deleted: i64 = release.key(key).arg(key).invoke_async(conn).await?;
                if deleted != 1 {
                    return Err(format!("raw: {key} was not ours at release").into());
                }
                Ok(())
            }
            Pair::Crate(client) => {
                let guard = client.lock(key).ttl(TTL).acquire().await?;
                guard.release().await?;
                Ok(())
            }
        }
    }
}

/// Allocations per pair over `pairs` pairs on fresh keys, after as many uncounted.
async fn per_pair(pair: &mut Pair, row: &str, pairs: usize) -> Res<f64> {
    let keys: Vec<String> = (0..2 * pairs)
        .map(|i| format!("allocs:{row}:{i}"))
        .collect();
    let (warm, counted) = keys.split_at(pairs);
    for key in warm {
        pair.run(key).await?;
    }
    let before = dhat::HeapStats::get();
    for key in counted {
        pair.run(key).await?;
    }
    let after = dhat::HeapStats::get();
    #[allow(clippy::cast_precision_loss)]
    Ok((after.total_blocks - before.total_blocks) as f64 / pairs as f64)
}

fn main() -> Res<()> {
    let opts = Opts::parse();
    let _profiler = match &opts.json {
        Some(path) => dhat::Profiler::builder().file_name(path).build(),
        // Heap statistics only, nothing written: `testing` keeps the profile in memory.
        None => dhat::Profiler::builder().testing().build(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let own_server = opts.url.is_none().then(RedisServer::start);
    // Redlock's row runs on servers of its own, started only when it runs.
    let masters = (opts.redlock.is_empty() && opts.row.is_none_or(|row| row == REDLOCK_ROW))
        .then(|| RedisMasters::start(5));
    let redlock = masters
        .as_ref()
        .map_or(opts.redlock.clone(), RedisMasters::urls);
    let url = match (&opts.url, &own_server) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => return Err("no redis url".into()),
    };
    runtime.block_on(async {
        let conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let here = tokio::runtime::Handle::current();
        let mut rows: Vec<(String, Pair)> = vec![
            (
                "hand-written loop".to_owned(),
                Pair::Raw(conn, Script::new(RELEASE_LUA)),
            ),
            (
                "lock-runtime, 1 node".to_owned(),
                Pair::Crate(LockClient::new(LockConfig::single(&url))?),
            ),
            (
                "lock-runtime, 1 node, on the caller's runtime".to_owned(),
                Pair::Crate(LockClient::new(
                    LockConfig::single(&url).runtime(here.clone()),
                )?),
            ),
            (
                "lock-runtime, 1 node, fenced".to_owned(),
                Pair::Crate(LockClient::new(LockConfig::single(&url).fencing(true))?),
            ),
            (
                "lock-runtime, in memory".to_owned(),
                Pair::Crate(LockClient::new(LockConfig::in_memory())?),
            ),
        ];
        if !redlock.is_empty() {
            let row = format!("lock-runtime, Redlock over {} nodes", redlock.len());
            rows.push((
                row,
                Pair::Crate(LockClient::new(LockConfig::redlock(redlock))?),
            ));
        }
        println!(
            "allocations per uncontended pair ({} counted per row, 1 task)",
            opts.pairs
        );
        for (i, (row, mut pair)) in rows.into_iter().enumerate() {
            if opts.row.is_some_and(|only| only != i) {
                continue;
            }
            let n = per_pair(&mut pair, &i.to_string(), opts.pairs).await?;
            println!("  {row:<48} {n:>7.1}");
        }
        Ok(())
    })
}
