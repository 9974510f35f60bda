//! Section 4: sequential latency of one acquire+release pair: the raw loop and this crate on one
//! node, on five Redlock nodes, and on five with one frozen.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisMasters, unique_key};
use redis::Script;

use crate::locker::{Locker, RELEASE_LUA};
use crate::measure::{Stats, millis};
use crate::report::Report;
use crate::{Bench, BoxError, Res, WARM_SAMPLES};

/// Sequential latency of `samples` pairs on one key (after a warm-up).
async fn pair_latencies(locker: &Locker, samples: usize) -> Res<Vec<Duration>> {
    let mut locker = locker.clone();
    let key = unique_key("bench:latency");
    let mut out = Vec::with_capacity(samples);
    for n in 0..samples + WARM_SAMPLES {
        let token = format!("{n:032x}");
        let start = Instant::now();
        locker.pair(&key, &token).await?;
        if n >= WARM_SAMPLES {
            out.push(start.elapsed());
        }
    }
    Ok(out)
}

/// Not a future like the other sections: it blocks on `runtime` in parts, and freezes one of its
/// servers between them.
pub(crate) fn run(
    bench: &Bench,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> Res<()> {
    let opts = &bench.opts;
    let masters = RedisMasters::start(5);
    let urls = masters.urls();
    let _ = writeln!(
        report,
        "\n4. One acquire+release pair, sequential, own local servers (latency)"
    );
    let _ = writeln!(report, "   {}", Stats::header("setup"));
    let (single, five_stats, five) = runtime.block_on(async {
        let redis = redis::Client::open(urls[0].as_str())?;
        let raw = Locker::Multiplexed(
            redis.get_multiplexed_async_connection().await?,
            Arc::new(Script::new(RELEASE_LUA)),
        );
        let raw = Stats::of(pair_latencies(&raw, opts.samples).await?);
        let _ = writeln!(report, "   {}", raw.row("raw redis, 1 node"));
        let one = Locker::Crate(LockClient::new(opts.config(LockConfig::single(&urls[0])))?);
        let single = Stats::of(pair_latencies(&one, opts.samples).await?);
        let _ = writeln!(report, "   {}", single.row("lock-runtime, 1 node"));
        let hosted = Locker::Crate(LockClient::new(
            opts.config(LockConfig::single(&urls[0]))
                .runtime(tokio::runtime::Handle::current()),
        )?);
        let hosted = Stats::of(pair_latencies(&hosted, opts.samples).await?);
        let _ = writeln!(
            report,
            "   {}",
            hosted.row("lock-runtime, 1 node, caller rt")
        );
        let mut conns = Vec::new();
        for url in &urls {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        let quorum = Locker::Quorum(conns, Arc::new(Script::new(RELEASE_LUA)));
        let raw5 = Stats::of(pair_latencies(&quorum, opts.samples).await?);
        let _ = writeln!(report, "   {}", raw5.row("raw redis, 5 nodes (quorum 3)"));
        let five = Locker::Crate(LockClient::new(
            opts.config(LockConfig::redlock(urls.iter())),
        )?);
        let five_stats = Stats::of(pair_latencies(&five, opts.samples).await?);
        let _ = writeln!(report, "   {}", five_stats.row("lock-runtime, 5 nodes"));
        let five_hosted = Locker::Crate(LockClient::new(
            opts.config(LockConfig::redlock(urls.iter()))
                .runtime(tokio::runtime::Handle::current()),
        )?);
        let five_hosted = Stats::of(pair_latencies(&five_hosted, opts.samples).await?);
        let _ = writeln!(
            report,
            "   {}",
            five_hosted.row("lock-runtime, 5 nodes, caller rt")
        );
        let _ = writeln!(
            report,
            "   p50 lock-runtime / raw: 1 node {:.2}x, 5 nodes {:.2}x",
            single.p50.as_secs_f64() / raw.p50.as_secs_f64(),
            five_stats.p50.as_secs_f64() / raw5.p50.as_secs_f64()
        );
        Ok::<_, BoxError>((single, five_stats, five))
    })?;
    masters.nodes[4].freeze();
    let frozen = runtime.block_on(pair_latencies(&five, opts.samples));
    masters.nodes[4].thaw();
    let frozen = Stats::of(frozen?);
    let _ = writeln!(
        report,
        "   {}",
        frozen.row("lock-runtime, 5 nodes, 1 frozen")
    );
    let ratio = five_stats.p50.as_secs_f64() / single.p50.as_secs_f64();
    let frozen_ratio = frozen.p50.as_secs_f64() / single.p50.as_secs_f64();
    for (name, stats) in [
        ("crate_1_node", &single),
        ("crate_5_nodes", &five_stats),
        ("crate_5_nodes_1_frozen", &frozen),
    ] {
        report.figure(format!("latency.{name}.p50_ms"), millis(stats.p50));
        report.figure(format!("latency.{name}.p99_ms"), millis(stats.p99));
    }
    let _ = writeln!(
        report,
        "   p50 5 nodes / 1 node: {ratio:.2}x (target <= 1.5x); 1 frozen / 1 node: {frozen_ratio:.2}x"
    );
    report.summary(format!(
        "redlock p50 5/1 nodes {ratio:.2}x, 1 frozen {frozen_ratio:.2}x (target <= 1.5x)"
    ));
    Ok(())
}
