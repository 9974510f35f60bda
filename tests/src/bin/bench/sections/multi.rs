//! Section 5: multi-key locks (two keys in one slot, across slots, two one-key locks) against a
//! one-key lock, then reentrancy: a nested call that joins a held lock, and the scripts it ran.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, unique_key};

use crate::locker::Locker;
use crate::measure::{Stats, ms, pairs_per_sec};
use crate::report::Report;
use crate::{Bench, BoxError, Res, TTL};

/// How section 5 locks two keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TwoKeys {
    /// One lock over `{key}:a` and `{key}:b` (one hash slot).
    SameSlot,
    /// One lock over `key:a` and `key:b` (almost always two slots).
    CrossSlot,
    /// Two one-key locks, `key:a` then `key:b`, released in reverse order.
    InOrder,
}

impl TwoKeys {
    pub(crate) async fn pair(self, client: &LockClient, key: &str) -> Res<()> {
        match self {
            TwoKeys::SameSlot | TwoKeys::CrossSlot => {
                let keys = if matches!(self, TwoKeys::SameSlot) {
                    [format!("{{{key}}}:a"), format!("{{{key}}}:b")]
                } else {
                    [format!("{key}:a"), format!("{key}:b")]
                };
                let guard = client.lock_many(keys).ttl(TTL).acquire().await?;
                guard.release().await?;
            }
            TwoKeys::InOrder => {
                let first = client.lock(format!("{key}:a")).ttl(TTL).acquire().await?;
                let second = client.lock(format!("{key}:b")).ttl(TTL).acquire().await?;
                second.release().await?;
                first.release().await?;
            }
        }
        Ok(())
    }
}

pub(crate) async fn run(bench: &Bench, report: &mut Report) -> Res<()> {
    let (opts, url) = (&bench.opts, bench.url.as_str());
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let lockers = [
        Locker::Crate(client.clone()),
        Locker::Two(client.clone(), TwoKeys::SameSlot),
        Locker::Two(client.clone(), TwoKeys::CrossSlot),
        Locker::Two(client, TwoKeys::InOrder),
    ];
    let _ = writeln!(
        report,
        "\n5. Multi-key locks, uncontended acquire+release pairs/s (each task its own keys, ttl 10s)"
    );
    let _ = writeln!(
        report,
        "   {:>5}  {:>12}  {:>14}  {:>15}  {:>15}  {:>11}  {:>11}",
        "tasks",
        "one key",
        "two, one slot",
        "two, two slots",
        "two one-key",
        "cost 1slot",
        "cost 2slots"
    );
    let mut costs = Vec::new();
    for tasks in [1, opts.tasks] {
        let mut rates = Vec::with_capacity(lockers.len());
        for locker in &lockers {
            rates.push(pairs_per_sec(locker, tasks, bench).await?.per_sec);
        }
        // Cost relative to a one-key lock: how much longer one two-key pair takes.
        let (same, cross) = (rates[0] / rates[1], rates[0] / rates[2]);
        for (name, rate) in [
            "one_key",
            "two_keys_one_slot",
            "two_keys_two_slots",
            "two_locks",
        ]
        .iter()
        .zip(&rates)
        {
            report.figure(format!("multi.{tasks}.{name}.per_sec"), *rate);
        }
        let _ = writeln!(
            report,
            "   {tasks:>5}  {:>12.0}  {:>14.0}  {:>15.0}  {:>15.0}  {same:>10.2}x  {cross:>10.2}x",
            rates[0], rates[1], rates[2], rates[3]
        );
        costs.push(format!(
            "{tasks} task(s) {same:.2}x (two slots {cross:.2}x, two one-key locks {:.2}x)",
            rates[0] / rates[3]
        ));
    }
    report.summary(format!(
        "two-key lock in one slot costs {} a one-key lock (target <= 1.10x)",
        costs.join(", ")
    ));

    // Reentrancy on a server of its own, so that its command counts are this section's alone.
    let server = RedisServer::start();
    let client = LockClient::new(opts.config(LockConfig::single(server.url())))?;
    let key = unique_key("bench:reentrant");
    let samples = opts.samples;
    let count_scripts = move || {
        tokio::task::block_in_place(|| {
            ["evalsha", "eval", "fcall"]
                .iter()
                .map(|command| server.command_calls(command))
                .sum::<u64>()
        })
    };
    let (nested, client_inner, key_inner) = (samples, client.clone(), key.clone());
    let (latencies, scripts) = client
        .lock(&key)
        .ttl(TTL)
        .run(async move {
            let before = count_scripts();
            let mut latencies = Vec::with_capacity(nested);
            for _ in 0..nested {
                let start = Instant::now();
                let inner = client_inner.lock(&key_inner).wait(Duration::ZERO);
                inner.run(async { Ok::<(), BoxError>(()) }).await?;
                latencies.push(start.elapsed());
            }
            Ok::<_, BoxError>((latencies, count_scripts() - before))
        })
        .await?;
    let stats = Stats::of(latencies);
    let _ = writeln!(
        report,
        "   reentrant nested call (joins a held lock, wait 0), {} calls: p50 {}, p99 {}, \
         script calls on the server {scripts}",
        stats.n,
        ms(stats.p50),
        ms(stats.p99)
    );
    report.summary(format!(
        "reentrant nested call: p50 {}, {scripts} script calls for {samples} calls (target 0)",
        ms(stats.p50)
    ));
    Ok(())
}
