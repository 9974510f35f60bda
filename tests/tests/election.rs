//! Leader election across processes: three `election_worker` processes campaign on one name; the
//! test SIGKILLs the leader twice, and each time another worker is elected within one ttl (plus
//! slack) of the kill, with a greater epoch. One leader at a time is checked by two observers that
//! know nothing of the lock: the leaders' reports (each a grant from its election to its last
//! beat, checked by `history::check` for overlaps and growing epochs), and a resource on Redis
//! that refuses a write with an epoch below one it has seen (a deposed leader still writing; that
//! it reports a refusal is shown by a test of its own).
//! And a stopped server is an error for `leader()` and `observe()`, never "nobody leads", while
//! a campaign waits it out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt as _;
use lock_runtime::layout::redlock_gate;
use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::history::{self, Grant, now_ns};
use lock_tests::{
    FaultProxy, QUICK_REQUEST, RedisMasters, RedisServer, SCHEDULING_SLACK, Worker, await_waiter,
    bounded, finish_all, lock_keys, ms, unique_key, wait_until_async, warm_up,
};

const WORKERS: usize = 3;
const TTL: Duration = Duration::from_secs(2);
/// How long each leader leads before it resigns: the first two are killed long before.
const LEAD: Duration = Duration::from_secs(3);
/// Three processes start, connect and campaign.
const STARTUP: Duration = Duration::from_secs(20);
/// A killed leader's key expires at most one ttl after its last renewal, sent before the kill;
/// a waiter's pause is capped by the key's time to live, so it asks again as it expires.
const HAND_OVER: Duration = TTL.saturating_add(SCHEDULING_SLACK);

#[test]
fn a_killed_leader_is_replaced_within_a_ttl_on_one_node() {
    let server = RedisServer::start();
    let took = kill_two_leaders(&server.url(), &server);
    eprintln!("single node: hand-overs after SIGKILL {took:?} (ttl {TTL:?})");
}

#[test]
fn a_killed_leader_is_replaced_within_a_ttl_on_redlock() {
    let masters = RedisMasters::start(3);
    let took = kill_two_leaders(&masters.urls().join(","), &masters.nodes[0]);
    eprintln!("redlock over 3 masters: hand-overs after SIGKILL {took:?} (ttl {TTL:?})");
}

/// The resource can refuse: with a later leader's epoch already in it (2^52, above every
/// clock-seeded token until about 2112), every write of a worker's leadership is refused and
/// reported.
#[test]
fn the_fenced_resource_refuses_a_smaller_epoch() {
    let server = RedisServer::start();
    let prefix = unique_key("election:refuse");
    let () = redis::cmd("SET")
        .arg(format!("{prefix}:epoch"))
        .arg(1u64 << 52)
        .query(&mut server.admin())
        .unwrap();
    let args = [
        server.url(),
        unique_key("election:refuse"),
        prefix,
        TTL.as_millis().to_string(),
        "200".to_owned(),
    ];
    let mut worker = Worker::spawn(env!("CARGO_BIN_EXE_election_worker"), &args);
    let out = worker.finish(STARTUP);
    out.assert_success("the worker");
    let beats = history::grants(&out.stdout).len();
    assert!(beats > 0, "{:?}", out.stdout);
    assert_eq!(refused(&out.stdout).len(), beats, "{:?}", out.stdout);
}

/// The refusals a worker reported.
fn refused(stdout: &[String]) -> Vec<&String> {
    stdout
        .iter()
        .filter(|line| line.starts_with("refused "))
        .collect()
}

/// One request's bound under the default config: connect 1 s + response 500 ms.
const REQUEST: Duration = Duration::from_millis(1500);

/// With the only server stopped, `leader()` and `observe()` answer `Unavailable` (within one
/// renewal period and one request), never "nobody leads"; a campaign started then keeps waiting
/// (it retries what may pass) and is elected once the server is back; the stream's next look
/// yields the leader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_an_error_never_no_leader() {
    let mut server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let name = unique_key("election:down");
    let election = client.election(&name).ttl(TTL);
    let mut changes = Box::pin(election.observe());
    let first = bounded(REQUEST, "the first look", changes.next()).await;
    assert_eq!(first, Some(Ok(None)));

    server.stop();
    let look = TTL / 3 + REQUEST + SCHEDULING_SLACK;
    let down = bounded(look, "a look at the stopped server", changes.next()).await;
    assert!(
        matches!(down, Some(Err(LockError::Unavailable { .. }))),
        "{down:?}"
    );
    let leader = bounded(REQUEST + SCHEDULING_SLACK, "leader()", election.leader()).await;
    assert!(
        matches!(leader, Err(LockError::Unavailable { .. })),
        "{leader:?}"
    );
    let campaign = tokio::spawn({
        let election = election.clone();
        async move { election.campaign().await }
    });
    // Seen down once more after the campaign started: it has met the outage and still waits.
    let down = bounded(look, "another look at the stopped server", changes.next()).await;
    assert!(
        matches!(down, Some(Err(LockError::Unavailable { .. }))),
        "{down:?}"
    );
    assert!(!campaign.is_finished(), "{:?}", campaign.await);

    server.restart();
    // Its retries back off at most 300 ms apart (100 ms doubling, jitter 0.5, capped at
    // 2 x 100 ms x 1.5; 1.2 s is the bound from before that cap, which still holds), then one
    // reconnect and one request.
    let retry = Duration::from_millis(1200) + REQUEST * 2 + SCHEDULING_SLACK;
    let elected = bounded(retry, "the campaign", campaign)
        .await
        .unwrap()
        .unwrap();
    let back = bounded(look, "a look after the restart", changes.next()).await;
    assert!(matches!(back, Some(Ok(_))), "{back:?}");
    elected.resign().await.unwrap();
}

/// One election record: `<pid> <epoch> <elected-ns>`.
#[derive(Debug, Clone, Copy)]
struct Elected {
    pid: u32,
    epoch: u64,
    at_ns: u64,
}

fn elected(entry: &str) -> Elected {
    let fields: Vec<u64> = entry.split(' ').map(|f| f.parse().unwrap()).collect();
    let [pid, epoch, at_ns] = fields[..] else {
        panic!("not an election record: {entry:?}");
    };
    Elected {
        pid: u32::try_from(pid).unwrap(),
        epoch,
        at_ns,
    }
}

/// Runs three campaigners on `urls` (data on `data`), kills the first two leaders, checks the
/// history, and returns the two hand-over times (kill to the next election).
fn kill_two_leaders(urls: &str, data: &RedisServer) -> Vec<Duration> {
    let name = unique_key("election:procs");
    let prefix = unique_key("election:data");
    let leaders = format!("{prefix}:leaders");
    let (ttl_ms, lead_ms) = (TTL.as_millis().to_string(), LEAD.as_millis().to_string());
    let args = [urls, &name, &prefix, &ttl_ms, &lead_ms];
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| Worker::spawn(env!("CARGO_BIN_EXE_election_worker"), &args))
        .collect();
    let mut admin = data.admin();
    let mut records: Vec<Elected> = Vec::new();
    let mut hand_overs = Vec::new();
    let mut killed_ns = None;
    for round in 0..WORKERS {
        // The record lands one Redis round trip after the election.
        let within = if round == 0 { STARTUP } else { HAND_OVER * 2 };
        lock_tests::wait_until(within, "the next leader's record", || {
            redis::cmd("LLEN")
                .arg(&leaders)
                .query::<usize>(&mut admin)
                .unwrap()
                > round
        });
        let entry: String = redis::cmd("LINDEX")
            .arg(&leaders)
            .arg(round)
            .query(&mut admin)
            .unwrap();
        let now = elected(&entry);
        if let (Some(killed_ns), Some(before)) = (killed_ns, records.last()) {
            let took = Duration::from_nanos(now.at_ns.saturating_sub(killed_ns));
            eprintln!(
                "pid {} elected {took:?} after pid {} was killed (epoch {} after {})",
                now.pid, before.pid, now.epoch, before.epoch
            );
            assert!(
                took <= HAND_OVER,
                "hand-over took {took:?} (bound {HAND_OVER:?})"
            );
            assert!(now.epoch > before.epoch, "{now:?} after {before:?}");
            hand_overs.push(took);
        }
        records.push(now);
        if round + 1 < WORKERS {
            let leader = workers.iter_mut().find(|w| w.pid() == now.pid);
            let leader = leader.expect("the leader is one of the workers");
            // Killed once it reported leading, so its report is in the history.
            let beat = leader.next_line(HAND_OVER);
            assert!(beat.starts_with("grant "), "{beat:?}");
            killed_ns = Some(now_ns());
            leader.kill();
        }
    }
    let outputs = finish_all(&mut workers, LEAD + STARTUP);
    let survivor = records.last().unwrap().pid;
    let mut last_beats: BTreeMap<(u32, u64), Grant> = BTreeMap::new();
    for (worker, out) in workers.iter().zip(&outputs) {
        if worker.pid() == survivor {
            out.assert_success("the last leader");
        }
        let refused = refused(&out.stdout);
        assert!(refused.is_empty(), "a deposed leader wrote: {refused:?}");
        for beat in history::grants(&out.stdout) {
            let last = last_beats
                .entry((beat.pid, beat.fence))
                .or_insert(beat.clone());
            if beat.released_ns > last.released_ns {
                *last = beat;
            }
        }
    }
    let led: Vec<Grant> = last_beats.into_values().collect();
    assert_eq!(led.len(), WORKERS, "every worker led once: {led:?}");
    if let Err(violation) = history::check(&led) {
        panic!("{violation}");
    }
    hand_overs
}

/// A Redlock client of `urls` with short timeouts (one request [`QUICK_REQUEST`]) and pauses
/// between attempts below a second (`retry_delay` 20 ms doubling, jittered by half: at most
/// 2 x 20 ms x 1.5 = 60 ms, within [`GATED_PAUSE`]), so a waiting campaign's attempts stay gated: they ask the gate node
/// first (the gate is taken for a lock found held in the last second).
fn gated_redlock(urls: Vec<String>) -> LockClient {
    LockClient::new(
        LockConfig::redlock(urls)
            .connect_timeout(ms(200))
            .response_timeout(ms(200))
            .retry_delay(ms(20)),
    )
    .unwrap()
}

/// A bound on the longest pause of a [`gated_redlock`] waiter: 8 x 20 ms x 1.5 (the backoff's
/// cap before it was `2 x retry_delay x 1.5`, which this still bounds).
const GATED_PAUSE: Duration = Duration::from_millis(240);

/// The value of `name`'s lock on `node` (the leader's token: compared, never printed).
fn lock_value(node: &RedisServer, name: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(lock_keys(name).lock)
        .query(&mut node.admin())
        .unwrap()
}

/// A leader resigns, and its release's part on the election's gate node is lost (the link
/// reset mid-request): the other two nodes confirm it, and the gate keeps the old leader's copy
/// for its ttl (30 s). A campaign already waiting asks the gate alone and listens there alone:
/// it was told "held" at every attempt and heard no release, while the majority was free (it was
/// elected when the copy expired). It is elected within one pause of the resignation.
#[tokio::test]
async fn a_campaign_is_not_held_up_by_a_stale_copy_on_the_gate() {
    let masters = RedisMasters::start(3);
    let name = unique_key("election:stale-gate");
    let gate = redlock_gate(&name, 3);
    let proxy = FaultProxy::start(masters.nodes[gate].port());
    let mut urls = masters.urls();
    urls[gate] = proxy.url();
    let leader = gated_redlock(urls);
    warm_up(&leader).await;
    let campaigner = gated_redlock(masters.urls());
    let ttl = Duration::from_secs(30);
    let leadership = leader.election(&name).ttl(ttl).campaign().await.unwrap();
    let nodes: Vec<&RedisServer> = masters.nodes.iter().collect();
    wait_until_async(Duration::from_secs(2), "the leader on every node", || {
        nodes.iter().all(|n| lock_value(n, &name).is_some())
    })
    .await;
    let led_by = lock_value(nodes[gate], &name);
    let campaign = tokio::spawn({
        let election = campaigner.election(&name).ttl(ttl);
        async move { election.campaign().await }
    });
    // Refused by every node, it listens at the gate; its next attempts ask the gate first.
    await_waiter(nodes[gate], &name).await;
    proxy.set_blackhole(true);
    leadership.resign().await.unwrap();
    proxy.cut_all();
    let resigned = std::time::Instant::now();
    assert!(
        lock_value(nodes[gate], &name) == led_by,
        "the gate no longer has the old leader's copy"
    );
    for (i, node) in nodes.iter().enumerate() {
        assert!(
            i == gate || lock_value(node, &name) != led_by,
            "the resignation did not reach node {i}"
        );
    }
    // The attempt in flight at the resignation (the gate, then the others: two requests), at
    // most one pause, and the attempt after it (two requests, and the epoch's write-back).
    let bound = QUICK_REQUEST * 5 + GATED_PAUSE + SCHEDULING_SLACK;
    let elected = tokio::time::timeout(bound, campaign).await;
    let took = resigned.elapsed();
    assert!(
        lock_value(nodes[gate], &name) == led_by,
        "the gate's stale copy is gone: it did not hold the campaign up"
    );
    let elected = elected
        .unwrap_or_else(|_| panic!("a stale copy on the gate held the campaign up past {bound:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("after {took:?}: {e:?}"));
    eprintln!(
        "redlock: a campaign behind a stale gate copy elected {took:?} after the resignation"
    );
    elected.resign().await.unwrap();
}

/// An election of a new name on `server` (prefix `prefix`) led from here, and a `queued_worker`
/// child campaigning for it too (with `extra` arguments after `campaign`).
async fn led_with_a_queued_campaigner(
    server: &RedisServer,
    prefix: &str,
    extra: &[&str],
) -> (lock_runtime::Election, lock_runtime::Leadership, Worker) {
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let name = unique_key(prefix);
    let election = client.election(&name);
    let leadership = election.campaign().await.unwrap();
    let url = server.url();
    let mut args = vec![url.as_str(), name.as_str(), "campaign"];
    args.extend_from_slice(extra);
    let worker = Worker::spawn(env!("CARGO_BIN_EXE_queued_worker"), &args);
    (election, leadership, worker)
}

/// A campaigner waiting in a process that calls `shutdown()` and exits at once (the
/// `queued_worker` child, which says `queued` once its campaign has a place in the election's
/// line): `shutdown()` stops the campaign and takes the place back. The leader's resignation
/// then hands the election to nobody: `leader()` says `None` right after it, not the exited
/// campaigner (whom a hand-off to its place would make the leader for the place's lease, 3 s),
/// and a new campaign is elected within one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaigner_that_shut_down_is_never_reported_leader() {
    let server = RedisServer::start();
    let (election, leadership, mut worker) =
        led_with_a_queued_campaigner(&server, "election:shut-down", &[]).await;
    let report = tokio::task::block_in_place(|| {
        assert_eq!(worker.next_line(STARTUP), "queued");
        let report = worker.next_line(STARTUP);
        worker
            .finish(Duration::from_secs(5))
            .assert_success("queued_worker");
        report
    });
    assert!(
        report.ends_with("waiter=stopped"),
        "shutdown() stops the campaign: {report}"
    );
    leadership.resign().await.unwrap();
    let leader = election.leader().await.unwrap();
    assert_eq!(leader, None, "the exited campaigner reported as the leader");
    bounded(
        REQUEST + SCHEDULING_SLACK,
        "a new campaign",
        election.campaign(),
    )
    .await
    .unwrap()
    .resign()
    .await
    .unwrap();
}

/// The lease of the place in line of a waiter that queued when it starved (a campaign always
/// does): `Herd::STARVING_LEASE` in `acquire/waiting.rs`, renewed at least three times per lease.
const PLACE_LEASE: Duration = Duration::from_secs(3);

/// A campaigner SIGKILLed while it waits with a place in the election's line: nothing takes
/// the place back, and the leader's resignation right after the kill hands the election to it,
/// so `leader()` names the dead campaigner (checked: the cause happened). It does so no longer
/// than the place's lease after the kill (the place was renewed before it) plus one request and
/// slack: then nobody leads, and a new campaign is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_campaigner_is_reported_leader_no_longer_than_its_places_lease() {
    let server = RedisServer::start();
    let (election, leadership, mut worker) =
        led_with_a_queued_campaigner(&server, "election:killed-in-line", &["stay"]).await;
    let pid = worker.pid();
    tokio::task::block_in_place(|| {
        assert_eq!(worker.next_line(STARTUP), "queued");
        worker.kill();
    });
    let killed = std::time::Instant::now();
    leadership.resign().await.unwrap();
    let named =
        |leader: &Option<lock_runtime::Owner>| leader.as_ref().is_some_and(|o| o.pid == pid);
    let first = election.leader().await.unwrap();
    assert!(
        named(&first),
        "the hand-off named the killed campaigner: {first:?}"
    );
    let bound = PLACE_LEASE + REQUEST + SCHEDULING_SLACK;
    loop {
        let leader = election.leader().await.unwrap();
        if !named(&leader) {
            assert_eq!(leader, None, "nobody else campaigns");
            break;
        }
        assert!(
            killed.elapsed() <= bound,
            "the killed campaigner still named leader {:?} after the kill (bound {bound:?})",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bounded(
        REQUEST + SCHEDULING_SLACK,
        "a new campaign",
        election.campaign(),
    )
    .await
    .unwrap()
    .resign()
    .await
    .unwrap();
}
