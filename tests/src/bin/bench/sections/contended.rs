//! Section 8: contended, one key: `--waiters` clients (each its own `LockClient`) loop acquire ->
//! release, with the default lock and `fair = true`, on one node and on Redlock over three.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::history::now_ns;
use lock_tests::sections::{self, Kind, Section};
use lock_tests::{RedisMasters, unique_key};

use crate::measure::{Stats, millis, ms};
use crate::opts::Opts;
use crate::report::Report;
use crate::{Bench, BoxError, Res, TTL, WAIT};

pub(crate) async fn run(bench: &Bench, report: &mut Report) -> Res<()> {
    let (opts, url) = (&bench.opts, bench.url.as_str());
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut pings = Vec::with_capacity(opts.samples);
    for _ in 0..opts.samples {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        pings.push(started.elapsed());
    }
    let rtt = Stats::of(pings).p50;
    let _ = writeln!(
        report,
        "\n8. Contended, one key, {} clients looping acquire -> release (round trip: PING p50 {})",
        opts.waiters,
        ms(rtt)
    );
    let _ = writeln!(
        report,
        "   {:<14}  {:>10}  {:>18}  {:>18}  {:>13}  {:>6}  {:>10}  {:>12}",
        "lock",
        "sections/s",
        "hand-off p50",
        "hand-off p99",
        "owner changes",
        "Jain",
        "wait p99",
        "cmds/section"
    );
    let masters = RedisMasters::start(3);
    let redlock = LockConfig::redlock(masters.urls());
    let one = vec![url.to_owned()];
    let setups = [
        ("default", "default", LockConfig::single(url), false, &one),
        ("fair = true", "fair", LockConfig::single(url), true, &one),
        (
            "Redlock(3)",
            "redlock3",
            redlock.clone(),
            false,
            &masters.urls(),
        ),
        (
            "Redlock(3) fair",
            "redlock3_fair",
            redlock,
            true,
            &masters.urls(),
        ),
    ];
    report.figure("contended.ping_p50_ms", millis(rtt));
    for (name, id, config, fair, servers) in setups {
        let before = commands(servers);
        let (run, all) = contended(opts, &config, fair).await?;
        // Every command the servers ran (scripts' own included), per section of the whole run.
        let per_section = (commands(servers) - before) as f64 / all.max(1) as f64;
        let rate = run.len() as f64 / opts.secs.as_secs_f64();
        let (changes, pairs) = sections::owner_changes(&run);
        let changed = changes as f64 / pairs.max(1) as f64;
        let jain = sections::jain(sections::per_holder(&run).into_values());
        let mut by_grant: Vec<&Section> = run.iter().collect();
        by_grant.sort_by_key(|s| s.acquired_ns);
        let gaps = Stats::of(
            by_grant
                .windows(2)
                .map(|w| Duration::from_nanos(w[1].acquired_ns.saturating_sub(w[0].released_ns)))
                .collect(),
        );
        let waits = Stats::of(
            run.iter()
                .map(|s| Duration::from_nanos(s.waited_ns()))
                .collect(),
        );
        let trips = |d: Duration| d.as_secs_f64() / rtt.as_secs_f64().max(1e-9);
        let _ = writeln!(
            report,
            "   {name:<14}  {rate:>10.0}  {:>9} ({:>4.1} RT)  {:>9} ({:>4.1} RT)  {:>12.1}%  {jain:>6.3}  {:>10}  {per_section:>12.1}",
            ms(gaps.p50),
            trips(gaps.p50),
            ms(gaps.p99),
            trips(gaps.p99),
            changed * 100.0,
            ms(waits.p99),
        );
        for (what, value) in [
            ("sections_per_sec", rate),
            ("handoff_p50_ms", millis(gaps.p50)),
            ("handoff_p99_ms", millis(gaps.p99)),
            ("handoff_p50_rt", trips(gaps.p50)),
            ("owner_changes", changed),
            ("jain", jain),
            ("wait_p99_ms", millis(waits.p99)),
            ("commands_per_section", per_section),
        ] {
            report.figure(format!("contended.{id}.{what}"), value);
        }
        report.summary(format!(
            "contended {name}: {rate:.0} sections/s, hand-off p50 {:.1} RT, owner changes {:.1}%{}",
            trips(gaps.p50),
            changed * 100.0,
            if fair {
                " (target p50 <= 2 RT, 100%)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// How many commands the servers at `urls` ran so far (`INFO commandstats`, all commands but
/// `INFO` itself; a script's commands counted with it).
fn commands(urls: &[String]) -> u64 {
    let mut total = 0;
    for url in urls {
        let info: String = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("INFO").arg("commandstats").query(&mut c))
            .unwrap_or_default();
        total += info
            .lines()
            .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
            .filter_map(|line| {
                let calls = line.split_once("calls=")?.1;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum::<u64>();
    }
    total
}

/// The sections granted in the measured window, and how many were granted in the whole run.
async fn contended(opts: &Opts, config: &LockConfig, fair: bool) -> Res<(Vec<Section>, usize)> {
    let key = unique_key("bench:contended");
    let measure_from = now_ns() + u64::try_from(opts.warmup.as_nanos())?;
    let stop = measure_from + u64::try_from(opts.secs.as_nanos())?;
    let mut handles = Vec::new();
    for me in 0..opts.waiters {
        let client = LockClient::new(opts.config(config.clone()))?;
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let mut own = Vec::new();
            let mut granted = 0usize;
            loop {
                let asked_ns = now_ns();
                if asked_ns >= stop {
                    break;
                }
                let guard = client
                    .lock(&key)
                    .ttl(TTL)
                    .wait(WAIT)
                    .fair(fair)
                    .acquire()
                    .await?;
                let acquired_ns = now_ns();
                let released_ns = now_ns();
                guard.release().await?;
                granted += 1;
                if acquired_ns >= measure_from && released_ns < stop {
                    own.push(Section {
                        who: me.to_string(),
                        kind: if fair { Kind::Fair } else { Kind::Exclusive },
                        fence: 0,
                        asked_ns,
                        acquired_ns,
                        released_ns,
                    });
                }
            }
            client.shutdown();
            Ok::<_, BoxError>((own, granted))
        }));
    }
    let (mut sections, mut all) = (Vec::new(), 0);
    for handle in handles {
        let (own, granted) = handle.await??;
        sections.extend(own);
        all += granted;
    }
    Ok((sections, all))
}
