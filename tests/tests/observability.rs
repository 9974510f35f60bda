//! What a lock shows of itself: one `distributed_lock` span per acquisition (fields `lock`, `key`,
//! `backend`) around the events of its acquire, body and release; and the metrics of the
//! `metrics` feature, labelled by the lock's name (never the rendered key).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{bounded, capture, free_port};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use tracing::Instrument as _;

/// Installs the capturing subscriber and the debugging metrics recorder (once per process).
fn capture() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        capture::install();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        snapshotter
    })
}

/// The id of the `distributed_lock` span whose fields contain `needle`.
fn span_of(needle: &str) -> u64 {
    capture::span("distributed_lock", needle).0
}

/// The line of that span.
fn span_line(needle: &str) -> String {
    capture::span("distributed_lock", needle).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_span_per_acquisition_around_acquire_body_and_release() {
    capture();
    let locks = LockClient::new(LockConfig::in_memory()).unwrap();
    let result = locks
        .lock("obs:wallet:42")
        .name("obs-wallet")
        .run(async {
            tracing::info!("inside the body");
            Ok::<_, LockError>(7)
        })
        .await;
    assert_eq!(result, Ok(7));
    let span = span_of("lock=obs-wallet");
    let spans = capture::lines();
    let line = spans
        .iter()
        .find(|l| l.starts_with(&format!("span {span} ")))
        .unwrap();
    assert!(
        line.contains("key=obs:wallet:42") && line.contains("backend=\"memory\""),
        "{line}"
    );
    let events = capture::events_in(span);
    for what in ["lock acquired", "inside the body", "lock released"] {
        assert!(
            events.iter().any(|e| e.contains(what)),
            "{what} not in the span: {events:#?}"
        );
    }
    // Quiet at info in normal operation: the only info event is the body's own.
    let noisy: Vec<_> = events
        .iter()
        .filter(|e| {
            (e.starts_with("INFO") || e.starts_with("WARN")) && !e.contains("inside the body")
        })
        .collect();
    assert!(noisy.is_empty(), "{noisy:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_span_is_a_child_of_the_callers() {
    capture();
    let locks = LockClient::new(LockConfig::in_memory()).unwrap();
    let caller = tracing::info_span!("caller");
    let caller_id = caller.id().unwrap().into_u64();
    let result = locks
        .lock("obs:parent")
        .name("obs-parent")
        .run(async { Ok::<_, LockError>(()) })
        .instrument(caller)
        .await;
    assert_eq!(result, Ok(()));
    let line = span_line("lock=obs-parent");
    assert!(
        line.contains(&format!("parent=Some({caller_id})")),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_and_unavailable_are_events_in_their_spans() {
    capture();
    let locks = LockClient::new(LockConfig::in_memory()).unwrap();
    let held = locks.lock("obs:busy").acquire().await.unwrap();
    let contended = locks.lock("obs:busy").name("obs-contended").acquire().await;
    assert!(matches!(contended, Err(LockError::Contended { .. })));
    held.release().await.unwrap();
    let events = capture::events_in(span_of("lock=obs-contended"));
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("DEBUG") && e.contains("lock contended")),
        "{events:#?}"
    );

    let nobody = format!("redis://:obs-secret@127.0.0.1:{}/", free_port());
    let down = LockClient::new(LockConfig::single(nobody)).unwrap();
    let unavailable = down.lock("obs:down").name("obs-down").acquire().await;
    assert!(matches!(unavailable, Err(LockError::Unavailable { .. })));
    let line = span_line("lock=obs-down");
    assert!(line.contains("backend=\"single\""), "{line}");
    let events = capture::events_in(span_of("lock=obs-down"));
    assert!(
        events.iter().any(
            |e| e.contains("lock servers unavailable") && e.contains("Refused")
                || e.contains("lock servers unavailable") && e.contains("connection refused")
        ),
        "{events:#?}"
    );
    assert!(!capture::lines().iter().any(|l| l.contains("obs-secret")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_is_a_warning_in_its_span() {
    capture();
    let config = LockConfig::in_memory().default_ttl(Duration::from_secs(1));
    let locks = LockClient::new(config).unwrap();
    let guard = locks
        .lock("obs:lost")
        .name("obs-lost")
        .acquire()
        .await
        .unwrap();
    assert!(locks.force_release("obs:lost").await.unwrap());
    bounded(
        Duration::from_secs(15),
        "the holder learns of the loss at its next renewal",
        guard.lost(),
    )
    .await;
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    let span = span_of("lock=obs-lost");
    assert!(
        capture::events_in(span)
            .iter()
            .any(|e| e.starts_with("WARN") && e.contains("lock lost while held")),
        "{:#?}",
        capture::events_in(span)
    );
}

/// The only test here that reads the metrics: a snapshot resets the debugging recorder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_outcomes_waits_holds_losses_and_held_locks() {
    let snapshotter = capture();
    let locks = LockClient::new(LockConfig::in_memory().default_ttl(Duration::from_secs(1)));
    let locks = locks.unwrap();
    let name = "obs-metrics";
    let lock = |key: &str| locks.lock(key).name(name);
    let guard = lock("obs:m:1").acquire().await.unwrap();
    assert!(matches!(
        lock("obs:m:1").acquire().await,
        Err(LockError::Contended { .. })
    ));
    guard.release().await.unwrap();
    // Other keys under the same name: one series, not one per rendered key.
    lock("obs:m:2")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let kept = lock("obs:m:3").acquire().await.unwrap();
    let lost = lock("obs:m:4").acquire().await.unwrap();
    assert!(locks.force_release("obs:m:4").await.unwrap());
    bounded(
        Duration::from_secs(5),
        "the loss is seen at the next renewal",
        lost.lost(),
    )
    .await;
    assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));

    let all = snapshotter.snapshot().into_vec();
    let value = |kind: MetricKind, metric: &str, extra: &[(&str, &str)]| {
        all.iter()
            .find(|(key, _, _, _): &&(CompositeKey, _, _, _)| {
                let k = key.key();
                key.kind() == kind
                    && k.name() == metric
                    && k.labels().any(|l| l.key() == "lock" && l.value() == name)
                    && k.labels()
                        .any(|l| l.key() == "backend" && l.value() == "memory")
                    && extra
                        .iter()
                        .all(|(ek, ev)| k.labels().any(|l| l.key() == *ek && l.value() == *ev))
            })
            .map(|(_, _, _, value)| value)
    };
    let count = |outcome| {
        value(
            MetricKind::Counter,
            "lock_acquire_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(count("acquired"), Some(&DebugValue::Counter(4)));
    assert_eq!(count("contended"), Some(&DebugValue::Counter(1)));
    assert_eq!(
        value(MetricKind::Counter, "lock_lost_total", &[]),
        Some(&DebugValue::Counter(1))
    );
    // Four taken, three ended: one still held.
    assert_eq!(
        value(MetricKind::Gauge, "locks_held", &[]),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    let samples = |metric| match value(MetricKind::Histogram, metric, &[]) {
        Some(DebugValue::Histogram(samples)) => samples.len(),
        other => panic!("{metric}: {other:?}"),
    };
    assert_eq!(samples("lock_wait_seconds"), 4);
    assert_eq!(samples("lock_hold_seconds"), 3);
    assert!(samples("lock_renewal_lag_seconds") >= 1);
    // No label ever carries a rendered key.
    let rendered = all
        .iter()
        .any(|(key, _, _, _)| key.key().labels().any(|l| l.value().starts_with("obs:m:")));
    assert!(!rendered);
    kept.release().await.unwrap();
}
