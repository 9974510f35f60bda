//! Section 6: `--held` locks taken by one client, held for two renewal rounds, released: how long
//! that took, client memory per held lock, and what renewing them cost the client and the server.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::unique_key;

use crate::measure::Usage;
use crate::report::Report;
use crate::{Bench, BoxError, Res};

/// How long section 6 holds its locks: two renewal rounds at ttl/3.
const HELD_TTL: Duration = Duration::from_secs(30);
const HELD_FOR: Duration = Duration::from_secs(21);
/// Tasks taking (and releasing) section 6's locks.
const HELD_TASKS: usize = 64;

/// `--held` locks (ttl 30 s) taken by one client, held for 21 s (two renewal rounds), released.
/// From here on, each pair is charged the CPU time of the redis-server too.
pub(crate) async fn run(bench: &mut Bench, report: &mut Report) -> Res<()> {
    bench.charge_server();
    let (opts, url) = (&bench.opts, bench.url.as_str());
    let client = LockClient::new(opts.config(LockConfig::single(url)))?;
    let warm = client.lock(unique_key("bench:held-warm")).acquire().await?;
    warm.release().await?;
    let base = unique_key("bench:held");
    let rss0 = rss_bytes();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(HELD_TASKS);
    for t in 0..HELD_TASKS {
        let (client, base, n) = (client.clone(), base.clone(), opts.held);
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::with_capacity(n / HELD_TASKS + 1);
            for i in (t..n).step_by(HELD_TASKS) {
                guards.push(
                    client
                        .lock(format!("{base}:{i}"))
                        .ttl(HELD_TTL)
                        .acquire()
                        .await?,
                );
            }
            Ok::<_, BoxError>(guards)
        }));
    }
    let mut guards = Vec::with_capacity(opts.held);
    for task in tasks {
        guards.extend(task.await??);
    }
    let took = started.elapsed();
    let rss1 = rss_bytes();
    let (u0, s0) = (Usage::now(), bench.server_cpu());
    tokio::time::sleep(HELD_FOR).await;
    let (u1, s1) = (Usage::now(), bench.server_cpu());
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(HELD_TASKS);
    let per_task = guards.len().div_ceil(HELD_TASKS);
    while !guards.is_empty() {
        let chunk: Vec<_> = guards.drain(..per_task.min(guards.len())).collect();
        tasks.push(tokio::spawn(async move {
            for guard in chunk {
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let released = started.elapsed();
    let held = opts.held as f64;
    let share = |cpu: f64| cpu / HELD_FOR.as_secs_f64() * 100.0;
    let _ = writeln!(
        report,
        "\n6. {} locks held by one client (ttl {:?}, {HELD_TASKS} tasks), held {:?}:\n   \
         acquired in {:.2}s ({:.0}/s); client memory {:.0} bytes per held lock; while held: \
         client CPU {:.1}% of one core, redis-server {:.1}%; lost: {lost}; released in {:.2}s ({:.0}/s)",
        opts.held,
        HELD_TTL,
        HELD_FOR,
        took.as_secs_f64(),
        held / took.as_secs_f64(),
        rss1.saturating_sub(rss0) as f64 / held,
        share(u1.cpu - u0.cpu),
        share(s1 - s0),
        released.as_secs_f64(),
        held / released.as_secs_f64(),
    );
    Ok(())
}

/// Resident set size of this process (`VmRSS`), 0 where unavailable.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
