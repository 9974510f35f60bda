//! Leader election on every backend: an election is the lock of its name, so its promises are the
//! lock's (a release wakes a waiter, a forced release is noticed at the next renewal, a cancelled
//! acquire leaves nothing), seen through `campaign`, `Leadership`, `leader` and `observe`.
//!
//! `election_leader_is_the_holder_while_it_leads` and
//! `election_observe_yields_the_leader_then_each_change` need the backends to record who holds a
//! lock (`LockInfo::owners`).

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lock_runtime::{Election, Leadership, LockError, Owner};
use lock_tests::{SCHEDULING_SLACK, bounded, unique_key};

use super::fixture::{Fx, released_to};

/// One request's bound in every fixture (connect 1 s + response 500 ms).
const REQUEST: Duration = Duration::from_millis(1500);

/// A ttl whose renewal period (a third) leaves room for a request on every backend (etcd leases
/// count whole seconds).
const TTL: Duration = Duration::from_secs(3);

impl Fx {
    /// Starts `election`'s campaign, which must wait (the name is held), as a task that answers
    /// when it was elected, and what the campaign returned.
    async fn start_campaign(
        &self,
        election: Election,
    ) -> tokio::task::JoinHandle<(Instant, Result<Leadership, LockError>)> {
        let name = election.name().to_owned();
        self.start_waiter(&name, async move {
            let elected = election.campaign().await;
            (Instant::now(), elected)
        })
        .await
    }
}

/// Two campaigners: the first is elected at once, the other waits; when the leader resigns the
/// other is elected, woken by the release (its next retry was 2.5 s or more away), with a
/// greater epoch.
pub(crate) async fn election_hands_over_when_the_leader_resigns(fx: &Fx) {
    let name = unique_key("beh:elect");
    let leader = bounded(REQUEST, "a campaign on a free name", async {
        fx.a.election(&name).campaign().await
    })
    .await
    .unwrap();
    assert!(!leader.is_lost());
    assert_eq!(leader.name(), name);
    let rival = fx.start_campaign(fx.b.election(&name)).await;
    assert!(!rival.is_finished());
    let epoch = leader.epoch();
    let next = released_to(leader.resign(), rival, Duration::from_secs(2)).await;
    assert!(next.epoch() > epoch, "epoch {} after {epoch}", next.epoch());
    next.resign().await.unwrap();
    fx.all_free(&[&name]).await;
}

/// A leader whose key is force-released sees `lost()` resolve at its next renewal (within one
/// renewal period, ttl / 3, plus one request and slack), and the waiting campaigner, woken by the
/// forced release, takes over with a greater epoch.
pub(crate) async fn election_deposed_leader_sees_the_loss_and_a_rival_takes_over(fx: &Fx) {
    let name = unique_key("beh:depose");
    let leader = fx.a.election(&name).ttl(TTL).campaign().await.unwrap();
    let rival = fx.start_campaign(fx.b.election(&name).ttl(TTL)).await;
    let forced = Instant::now();
    assert!(fx.b.force_release(&name).await.unwrap());
    let bound = TTL / 3 + REQUEST + SCHEDULING_SLACK;
    let (lost_after, (elected_at, next)) = tokio::join!(
        async {
            bounded(bound, "the leader sees the loss", leader.lost()).await;
            forced.elapsed()
        },
        async {
            bounded(Duration::from_secs(5), "the rival's campaign", rival)
                .await
                .unwrap()
        },
    );
    eprintln!(
        "lost {lost_after:?} and taken over {:?} after the forced release",
        elected_at - forced
    );
    assert!(
        lost_after <= bound,
        "lost {lost_after:?} after (bound {bound:?})"
    );
    assert!(leader.is_lost());
    let next = next.unwrap();
    assert!(
        elected_at - forced < Duration::from_secs(2),
        "not woken by the forced release"
    );
    assert!(next.epoch() > leader.epoch());
    assert!(matches!(leader.resign().await, Err(LockError::Lost { .. })));
    next.resign().await.unwrap();
    fx.all_free(&[&name]).await;
}

/// A campaign dropped while it waits leaves nothing: once the leader resigns the name is free on
/// every node, and a single attempt (wait 0) gets it, where a grant left behind would hold it
/// for its 30 s ttl.
pub(crate) async fn election_cancelled_campaign_leaves_nothing(fx: &Fx) {
    let name = unique_key("beh:electcancel");
    let ttl = Duration::from_secs(30);
    let leader = fx.a.election(&name).ttl(ttl).campaign().await.unwrap();
    let rival = fx.start_campaign(fx.b.election(&name).ttl(ttl)).await;
    rival.abort();
    assert!(rival.await.unwrap_err().is_cancelled());
    leader.resign().await.unwrap();
    // As for a cancelled lock waiter: the cancelled campaign's acquire, still running on the
    // library's side when the resignation woke it, may take the name for a moment and give it
    // back; it must be free within the bound, not held.
    let took = fx.time_until_free(&name).await;
    eprintln!("free after the leader resigned, the campaign cancelled: {took:?}");
}

/// Fencing is forced for elections: on a client whose config turns it off (its plain locks carry
/// no token where it costs a counter), every leadership still has an epoch, and the epochs
/// strictly grow.
pub(crate) async fn election_epochs_are_fenced_with_fencing_off(fx: &Fx) {
    let name = unique_key("beh:electfence");
    let unfenced = fx.client_with(|config| config.fencing(false));
    let plain = unfenced.lock(unique_key("beh:electfence")).acquire().await;
    let plain = plain.unwrap();
    assert_eq!(plain.fencing_token().is_some(), !fx.runs_scripts());
    plain.release().await.unwrap();
    let election = unfenced.election(&name);
    let mut last = 0;
    for _ in 0..5 {
        let leadership = election.campaign().await.unwrap();
        assert!(
            leadership.epoch() > last,
            "{} after {last}",
            leadership.epoch()
        );
        last = leadership.epoch();
        leadership.resign().await.unwrap();
    }
}

/// `leader()` is nobody on a free name, this process while it leads, and nobody again once it
/// resigned (under Redlock the release answers once a majority let go: `inspect` then finds
/// fewer than a majority holding it). Needs `LockInfo::owners`.
pub(crate) async fn election_leader_is_the_holder_while_it_leads(fx: &Fx) {
    let name = unique_key("beh:leader");
    let election = fx.b.election(&name);
    assert_eq!(election.leader().await.unwrap(), None);
    let leadership = fx.a.election(&name).campaign().await.unwrap();
    let owner = election.leader().await.unwrap();
    let owner = owner.expect("the leader while it leads");
    assert_eq!(owner.pid, std::process::id());
    leadership.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
}

/// `observe()` yields the leader now, then each change within its bound (one renewal period,
/// ttl / 3, plus one request, and slack): nobody after a resignation, and a new owner when the
/// same process is elected again. Needs `LockInfo::owners`.
pub(crate) async fn election_observe_yields_the_leader_then_each_change(fx: &Fx) {
    let name = unique_key("beh:observe");
    let election = fx.a.election(&name).ttl(TTL);
    let leadership = election.campaign().await.unwrap();
    let mut changes = Box::pin(fx.b.election(&name).ttl(TTL).observe());
    let first = next_change(&mut changes, REQUEST + SCHEDULING_SLACK).await;
    let first = first.expect("the leader first");
    assert_eq!(first.pid, std::process::id());

    let bound = TTL / 3 + REQUEST + SCHEDULING_SLACK;
    let resigned = Instant::now();
    leadership.resign().await.unwrap();
    assert_eq!(next_change(&mut changes, bound).await, None);
    let seen_after = resigned.elapsed();
    eprintln!("the resignation seen after {seen_after:?}");
    assert!(seen_after <= bound, "{seen_after:?} (bound {bound:?})");

    let elected = Instant::now();
    let again = election.campaign().await.unwrap();
    let second = next_change(&mut changes, bound).await;
    let seen_after = elected.elapsed();
    let second = second.expect("the new leader");
    assert_eq!(second.pid, std::process::id());
    assert_ne!(second, first, "a new grant is a new owner");
    assert!(seen_after <= bound, "{seen_after:?} (bound {bound:?})");
    again.resign().await.unwrap();
}

/// The next item of an `observe()` stream, which must come within `limit` and be a leader (or
/// nobody), not an error or the end.
async fn next_change(
    changes: &mut (impl futures_util::Stream<Item = Result<Option<Owner>, LockError>> + Unpin),
    limit: Duration,
) -> Option<Owner> {
    let item = bounded(limit, "the next change", changes.next()).await;
    item.expect("the stream goes on").unwrap()
}
