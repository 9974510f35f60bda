//! Section 7: the same client on one node, Redlock, a Redis Cluster, a Sentinel set (with and
//! without `min_replicas(1)`) and, with the `etcd` feature, etcd: pairs/s and async hand-off.

use std::fmt::Write as _;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::RedisMasters;

use crate::locker::Locker;
use crate::measure::{Stats, ms, pairs_per_sec};
use crate::report::Report;
use crate::sections::handoff::handoff_async;
use crate::{Bench, Res};

pub(crate) async fn run(bench: &Bench, report: &mut Report) -> Res<()> {
    let (opts, url) = (&bench.opts, bench.url.as_str());
    let (cluster, sentinels, masters) = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let sentinels = scope.spawn(lock_tests::SentinelSet::start);
            let masters = scope.spawn(|| RedisMasters::start(3));
            let cluster = lock_tests::RedisCluster::start();
            (cluster, sentinels.join(), masters.join())
        })
    });
    let sentinels = sentinels.map_err(|_| "the sentinel set did not start")?;
    let masters = masters.map_err(|_| "the Redlock masters did not start")?;
    let sentinel = || {
        LockConfig::sentinel(
            lock_tests::SentinelSet::MASTER_NAME,
            sentinels.sentinel_urls(),
        )
    };
    #[allow(unused_mut, reason = "etcd joins with its feature")]
    let mut setups = vec![
        ("single node", LockConfig::single(url)),
        ("redlock, 3 masters", LockConfig::redlock(masters.urls())),
        ("cluster", LockConfig::cluster(cluster.urls())),
        (
            "cluster min_replicas(1)",
            LockConfig::cluster(cluster.urls()).min_replicas(1),
        ),
        ("sentinel", sentinel()),
        ("sentinel min_replicas(1)", sentinel().min_replicas(1)),
    ];
    #[cfg(feature = "etcd")]
    let etcd = tokio::task::block_in_place(|| {
        (
            lock_tests::EtcdCluster::start(1),
            lock_tests::EtcdCluster::start(3),
        )
    });
    #[cfg(feature = "etcd")]
    {
        setups.push(("etcd, 1 member", LockConfig::etcd(etcd.0.endpoints())));
        setups.push(("etcd, 3 members", LockConfig::etcd(etcd.1.endpoints())));
    }
    let _ = writeln!(
        report,
        "\n7. Backends and topologies, same run: uncontended pairs/s (1 task, {} tasks on distinct \
         keys) and async hand-off ({} waiters)",
        opts.tasks, opts.waiters
    );
    let _ = writeln!(
        report,
        "   {:<26} {:>10} {:>10} {:>10} {:>10}",
        "setup", "U1/s", "U16/s", "hand p50", "hand p99"
    );
    for (name, config) in setups {
        let client = LockClient::new(opts.config(config))?;
        let locker = Locker::Crate(client.clone());
        let one = pairs_per_sec(&locker, 1, bench).await?;
        let many = pairs_per_sec(&locker, opts.tasks, bench).await?;
        let hand = Stats::of(handoff_async(&client, opts).await?);
        let _ = writeln!(
            report,
            "   {name:<26} {:>10.0} {:>10.0} {:>10} {:>10}",
            one.per_sec,
            many.per_sec,
            ms(hand.p50),
            ms(hand.p99)
        );
        report.summary(format!(
            "{name}: U1 {:.0}/s U{} {:.0}/s hand-off p50 {} p99 {}",
            one.per_sec,
            opts.tasks,
            many.per_sec,
            ms(hand.p50),
            ms(hand.p99)
        ));
        report.flush();
    }
    Ok(())
}
