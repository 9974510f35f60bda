//! Section 1: uncontended acquire+release pairs/s, 1 task and `--tasks` tasks on distinct keys, of
//! this crate (on its runtime and on the caller's) and of the hand-written loop (on one connection,
//! and on a connection driven by a second runtime), with what each pair cost.

use std::fmt::Write as _;
use std::sync::Arc;

use lock_runtime::{LockClient, LockConfig};
use redis::Script;
use redis::aio::ConnectionManager;

use crate::locker::{Locker, RELEASE_LUA};
use crate::measure::{Rate, pairs_per_sec};
use crate::report::Report;
use crate::{Bench, Res};

/// `foreign` stands in for the library's runtime: it drives (b2)'s connection. From here on,
/// each pair is charged the CPU time of the redis-server too.
pub(crate) async fn run(
    bench: &mut Bench,
    foreign: &tokio::runtime::Handle,
    report: &mut Report,
) -> Res<()> {
    bench.charge_server();
    let bench = &*bench;
    let (opts, url) = (&bench.opts, bench.url.as_str());
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let redis = redis::Client::open(url)?;
    let script = Arc::new(Script::new(RELEASE_LUA));
    let multiplexed = Locker::Multiplexed(
        redis.get_multiplexed_async_connection().await?,
        Arc::clone(&script),
    );
    // Made on the foreign runtime, so its connection task and reconnects run there.
    let manager = foreign.spawn(ConnectionManager::new(redis)).await??;
    let manager = Locker::Manager(manager, script);
    let ours = Locker::Crate(client);
    // The same crate, hosted on the bench's own runtime (`LockConfig::runtime`): no hop.
    let hosted = Locker::Crate(LockClient::new(
        opts.config(LockConfig::single(url))
            .runtime(tokio::runtime::Handle::current()),
    )?);

    let _ = writeln!(
        report,
        "\n1. Uncontended acquire+release, pairs/s (each task its own key, ttl 10s)"
    );
    let _ = writeln!(
        report,
        "   {:>5}  {:>16}  {:>16}  {:>16}  {:>16}  {:>7}  {:>7}",
        "tasks",
        "(a) lock-runtime",
        "(a2) on caller rt",
        "(b) raw, 1 conn",
        "(b2) raw, foreign",
        "(a)/(b)",
        "(a2)/(b)"
    );
    let mut ratios = Vec::new();
    let mut costs = Vec::new();
    for tasks in [1, opts.tasks] {
        let rate = async |name: &str, locker: &Locker| -> Res<Rate> {
            if opts.runs_impl(name) {
                pairs_per_sec(locker, tasks, bench).await
            } else {
                Ok(Rate::SKIPPED)
            }
        };
        let a = rate("crate", &ours).await?;
        let a2 = rate("hosted", &hosted).await?;
        let b = rate("multiplexed", &multiplexed).await?;
        let b2 = rate("foreign", &manager).await?;
        let ratio = a.per_sec / b.per_sec;
        let ratio2 = a2.per_sec / b.per_sec;
        for (name, r) in [
            ("crate", a),
            ("hosted", a2),
            ("raw", b),
            ("raw_foreign", b2),
        ] {
            report.figure(format!("pairs.{tasks}.{name}.per_sec"), r.per_sec);
            report.figure(format!("pairs.{tasks}.{name}.cpu_us"), r.cpu_us);
            report.figure(format!("pairs.{tasks}.{name}.server_cpu_us"), r.server_us);
        }
        report.figure(format!("pairs.{tasks}.ratio"), ratio);
        report.figure(format!("pairs.{tasks}.ratio_hosted"), ratio2);
        let _ = writeln!(
            report,
            "   {tasks:>5}  {:>16.0}  {:>16.0}  {:>16.0}  {:>16.0}  {ratio:>6.2}x  {ratio2:>6.2}x",
            a.per_sec, a2.per_sec, b.per_sec, b2.per_sec
        );
        costs.push(format!(
            "   {tasks:>5}  {:>16}  {:>16}  {:>16}  {:>16}",
            a.cost(),
            a2.cost(),
            b.cost(),
            b2.cost()
        ));
        ratios.push(format!(
            "{tasks} task(s) {ratio:.2}x (on the caller's runtime {ratio2:.2}x)"
        ));
    }
    let _ = writeln!(
        report,
        "   cost per pair in the bench process (CPU time of all its threads, context switches; srv: redis-server CPU):"
    );
    for line in costs {
        let _ = writeln!(report, "{line}");
    }
    report.summary(format!(
        "uncontended (a)/(b): {} (target >= 0.80x)",
        ratios.join(", ")
    ));
    Ok(())
}
