//! Section 2: contended hand-off, `--waiters` tasks waiting on one key while one more holds it,
//! with the async API (tasks) and the blocking one (OS threads).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockConfig};
use lock_tests::unique_key;

use crate::measure::{Stats, millis, ms};
use crate::opts::Opts;
use crate::report::Report;
use crate::{Bench, BoxError, Res, TTL, WAIT, WARM_SAMPLES};

/// Shared state of one hand-off run: who released last and when, and how many hand-offs happened.
struct Handoffs {
    /// (releasing task, `Instant` taken right before it called release).
    released: Mutex<Option<(usize, Instant)>>,
    samples: Mutex<Vec<Duration>>,
    /// Number of acquisitions so far; a releaser waits for it to move before queueing up again.
    grants: Mutex<u64>,
    granted: Condvar,
    grants_async: tokio::sync::watch::Sender<u64>,
    done: AtomicBool,
    wanted: usize,
}

impl Handoffs {
    fn new(wanted: usize) -> Arc<Self> {
        Arc::new(Handoffs {
            released: Mutex::new(None),
            samples: Mutex::new(Vec::with_capacity(wanted + WARM_SAMPLES)),
            grants: Mutex::new(0),
            granted: Condvar::new(),
            grants_async: tokio::sync::watch::Sender::new(0),
            done: AtomicBool::new(false),
            wanted: wanted + WARM_SAMPLES,
        })
    }

    /// Called by task `me` right after its acquire returned at `got`. Returns the grant number and
    /// whether the run is complete (the caller then releases and stops).
    fn acquired(&self, me: usize, got: Instant) -> Res<(u64, bool)> {
        let previous = lock(&self.released).take();
        let mut samples = lock(&self.samples);
        if let Some((from, at)) = previous {
            if from == me {
                return Err("hand-off to the releasing task itself".into());
            }
            samples.push(got - at);
        }
        let finished = samples.len() >= self.wanted;
        drop(samples);
        if finished {
            self.done.store(true, Ordering::SeqCst);
        }
        let grant = {
            let mut grants = lock(&self.grants);
            *grants += 1;
            *grants
        };
        self.granted.notify_all();
        self.grants_async.send_replace(grant);
        Ok((grant, finished || self.done.load(Ordering::SeqCst)))
    }

    /// Stamps the release: the last thing before calling `release()`.
    fn releasing(&self, me: usize) {
        *lock(&self.released) = Some((me, Instant::now()));
    }

    fn wait_next_grant_blocking(&self, grant: u64) -> Res<()> {
        let grants = lock(&self.grants);
        let (_grants, timeout) = self
            .granted
            .wait_timeout_while(grants, WAIT, |n| *n <= grant)
            .unwrap_or_else(PoisonError::into_inner);
        if timeout.timed_out() {
            return Err("nobody took the lock after a release".into());
        }
        Ok(())
    }

    async fn wait_next_grant(&self, grant: u64) -> Res<()> {
        let mut rx = self.grants_async.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|n| *n > grant))
            .await
            .map_err(|_| "nobody took the lock after a release")??;
        Ok(())
    }

    /// The measured samples (after the warm-up ones).
    fn into_samples(self: Arc<Self>) -> Vec<Duration> {
        let mut samples = std::mem::take(&mut *lock(&self.samples));
        samples.drain(..WARM_SAMPLES.min(samples.len()));
        samples
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The hand-off samples of one run of the async API, on `client`.
pub(crate) async fn handoff_async(client: &LockClient, opts: &Opts) -> Res<Vec<Duration>> {
    let key = unique_key("bench:handoff");
    let state = Handoffs::new(opts.handoffs);
    let mut handles = Vec::new();
    // One holder plus `waiters` waiting at every hand-off.
    for me in 0..=opts.waiters {
        let (client, key, state) = (client.clone(), key.clone(), Arc::clone(&state));
        handles.push(tokio::spawn(async move {
            loop {
                let guard = client.lock(&key).ttl(TTL).wait(WAIT).acquire().await?;
                let (grant, finished) = state.acquired(me, Instant::now())?;
                state.releasing(me);
                guard.release().await?;
                if finished {
                    return Ok::<_, BoxError>(());
                }
                state.wait_next_grant(grant).await?;
            }
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(state.into_samples())
}

fn handoff_blocking(client: &LockClient, opts: &Opts) -> Res<Vec<Duration>> {
    let key = unique_key("bench:handoff-sync");
    let state = Handoffs::new(opts.handoffs);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..=opts.waiters)
            .map(|me| {
                let (client, key, state) = (client.clone(), key.clone(), Arc::clone(&state));
                scope.spawn(move || -> Res<()> {
                    loop {
                        let guard = client.lock(&key).ttl(TTL).wait(WAIT).acquire_blocking()?;
                        let (grant, finished) = state.acquired(me, Instant::now())?;
                        state.releasing(me);
                        guard.release_blocking()?;
                        if finished {
                            return Ok(());
                        }
                        state.wait_next_grant_blocking(grant)?;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok::<_, BoxError>(())
    })?;
    Ok(state.into_samples())
}

pub(crate) async fn run(bench: &Bench, report: &mut Report) -> Res<()> {
    let opts = &bench.opts;
    let client = LockClient::new(opts.config(LockConfig::single(&bench.url)))?;
    let _ = writeln!(
        report,
        "\n2. Contended hand-off, {} waiters + 1 holder on one key \
         (holder's Instant before release() -> next waiter's acquire returns)",
        opts.waiters
    );
    let _ = writeln!(report, "   {}", Stats::header("api"));
    let samples = handoff_async(&client, opts).await?;
    let stats = Stats::of(samples);
    let _ = writeln!(report, "   {}", stats.row("async (tasks)"));
    report.summary(format!(
        "hand-off p50 {} / p99 {} (target p50 <= 1 ms)",
        ms(stats.p50),
        ms(stats.p99)
    ));
    report.figure("handoff.async.p50_ms", millis(stats.p50));
    report.figure("handoff.async.p99_ms", millis(stats.p99));
    // The threads block on `acquire_blocking`; keep them off this runtime's workers.
    let blocking = tokio::task::block_in_place(|| handoff_blocking(&client, opts))?;
    let stats = Stats::of(blocking);
    let _ = writeln!(report, "   {}", stats.row("blocking (threads)"));
    report.summary(format!("blocking hand-off p50 {}", ms(stats.p50)));
    report.figure("handoff.blocking.p50_ms", millis(stats.p50));
    report.figure("handoff.blocking.p99_ms", millis(stats.p99));
    Ok(())
}
