//! Who holds what of each counter's limit: the shares assigned to the Envoy instances whose
//! buckets count on it, until their assignments expire.
//!
//! The rule that keeps the fleet within a limit: a holder's new share is its max-min fair share
//! of the limit among the live holders, and never more than the others leave — what *they* hold
//! now, as Envoy enforces it, not what they will be assigned at their next report. A share that
//! moves from one instance to another is therefore handed out only once its old holder has been
//! told to give it up (at that holder's next report), so the sum of what the assignments in force
//! may admit per window stays within the limit while demand shifts.

use hashbrown::HashMap;
use tollgate_policy::LimitId;

use crate::serve::model::fair_shares;

/// One Envoy instance (a stream), by its number: what holds a share of a counter (its buckets on
/// the counter split it).
pub(crate) type Holder = u64;

/// One counter of one limit, as the RLS counts it: the limit and its variables' values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CounterKey {
    pub(crate) limit: LimitId,
    pub(crate) values: Vec<String>,
}

impl From<&CounterKey> for CounterKey {
    /// A copy made only when a map meets the counter for the first time (`entry_ref`).
    fn from(key: &CounterKey) -> CounterKey {
        key.clone()
    }
}

/// What one holder has of a counter.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// The hits per window it asked for at its last report.
    want: u64,
    /// The hits per window its assignment in force may admit (bursts included).
    held: u64,
    /// When that assignment expires in Envoy (the server clock's ns), after which it holds
    /// nothing.
    expires_ns: u64,
}

/// The shares of every counter the RLQS streams report on.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    counters: HashMap<CounterKey, HashMap<Holder, Hold>>,
}

impl Ledger {
    /// Gives `holder` its share of `counter` (whose limit is `limit` hits per window) now that it
    /// wants `want`: its max-min fair share among the counter's live holders, capped by what the
    /// others' assignments in force leave; or, with `fixed`, that (a share `fair_share.lua`
    /// decided, kept as this server's view). Records it as what the holder holds until
    /// `expires_ns`, and returns it.
    /// (`fair_share.lua` applies the same rule to holders on several servers.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn share(
        &mut self,
        counter: &CounterKey,
        limit: u64,
        holder: Holder,
        want: u64,
        fixed: Option<u64>,
        now_ns: u64,
        expires_ns: u64,
    ) -> u64 {
        let holds = self.holds(counter);
        holds.retain(|h, hold| hold.expires_ns > now_ns || *h == holder);
        let share = fixed.unwrap_or_else(|| {
            let mut wants = vec![want];
            wants.extend(holds.iter().filter(|(h, _)| **h != holder).map(|(_, hold)| hold.want));
            let fair = fair_shares(limit, &wants)[0];
            let others: u64 = holds.iter().filter(|(h, _)| **h != holder).map(|(_, hold)| hold.held).sum();
            fair.min(limit.saturating_sub(others))
        });
        holds.insert(holder, Hold { want, held: share, expires_ns });
        share
    }

    /// The holds of `counter`, empty when it has none yet.
    fn holds(&mut self, counter: &CounterKey) -> &mut HashMap<Holder, Hold> {
        self.counters.entry_ref(counter).or_default()
    }

    /// Forgets what `instance` holds: its stream ended cleanly, so it enforces nothing more.
    /// (A stream that broke keeps its holds until they expire: Envoy keeps enforcing its
    /// assignments until their time to live ends.)
    pub(crate) fn release(&mut self, instance: u64) {
        self.counters.retain(|_, holds| {
            holds.retain(|h, _| *h != instance);
            !holds.is_empty()
        });
    }

    /// Drops what has expired by `now_ns`, and counters nobody holds.
    pub(crate) fn expire(&mut self, now_ns: u64) {
        self.counters.retain(|_, holds| {
            holds.retain(|_, h| h.expires_ns > now_ns);
            !holds.is_empty()
        });
    }

    /// For the counters of `limit`: how many distinct instances hold a share, and the hits per
    /// window their assignments may admit in all.
    pub(crate) fn limit_totals(&self, limit: LimitId) -> (usize, u64) {
        let mut instances: Vec<u64> = Vec::new();
        let mut held = 0u64;
        for (counter, holds) in &self.counters {
            if counter.limit != limit {
                continue;
            }
            for (holder, hold) in holds {
                instances.push(*holder);
                held = held.saturating_add(hold.held);
            }
        }
        instances.sort_unstable();
        instances.dedup();
        (instances.len(), held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> CounterKey {
        CounterKey { limit: LimitId(7), values: vec!["a".into()] }
    }

    fn holder(instance: u64) -> Holder {
        instance
    }

    #[test]
    fn a_newcomer_gets_only_what_the_others_do_not_hold_until_they_give_it_up() {
        let mut ledger = Ledger::default();
        let c = counter();
        let mut share = |h, want, now| ledger.share(&c, 90, holder(h), want, None, now, 1_000);
        assert_eq!(share(1, 200, 0), 90, "alone: all of it");
        assert_eq!(share(2, 200, 0), 0, "1 holds all until it reports");
        assert_eq!(share(1, 200, 10), 45, "1 is cut to its fair share");
        assert_eq!(share(2, 200, 20), 45, "then 2 gets the rest");
        assert_eq!(share(1, 10, 30), 10, "1 wants less");
        assert_eq!(share(2, 200, 40), 80, "2 gets what 1 left");
    }

    #[test]
    fn a_released_or_expired_share_goes_back_to_the_others() {
        let mut ledger = Ledger::default();
        let c = counter();
        for i in 1..=3 {
            let _ = ledger.share(&c, 90, holder(i), 200, Some(30), 0, if i == 3 { 500 } else { 1_000 });
        }
        assert_eq!(ledger.limit_totals(LimitId(7)), (3, 90));
        assert_eq!(ledger.share(&c, 90, holder(1), 200, None, 100, 1_000), 30);
        ledger.release(2);
        assert_eq!(
            ledger.share(&c, 90, holder(1), 200, None, 100, 1_000),
            45,
            "2 ended its stream: half of what 3 leaves"
        );
        assert_eq!(ledger.share(&c, 90, holder(1), 200, None, 600, 1_000), 90, "3's assignment expired");
        ledger.expire(2_000);
        assert_eq!(ledger.limit_totals(LimitId(7)), (0, 0));
    }

    /// `fair_share.lua` decides as the ledger does: the same shares for the same steps, with
    /// holders coming, wanting more or less, and going quiet (their assignments expiring).
    #[test]
    fn the_script_on_redis_gives_the_ledgers_shares() {
        use proptest::prelude::*;
        use tollgate::{Clock, ManualClock};
        use tollgate_redis::counters::take_share;
        use tollgate_redis::{Redis, RedisTime};

        let server = tollgate_testkit::RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
        let ttl = std::time::Duration::from_secs(2);
        let step = (0u64..4, 0u64..300, 0u64..1_500);
        let cases = std::sync::atomic::AtomicU64::new(0);
        proptest!(ProptestConfig::with_cases(48), |(limit in 1u64..200, steps in proptest::collection::vec(step, 1..30))| {
            let key = format!("case{}", cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let clock = ManualClock::new();
            let time = RedisTime::clock(clock.clone());
            let mut ledger = Ledger::default();
            for (h, want, advance_ms) in steps {
                clock.advance(std::time::Duration::from_millis(advance_ms));
                let now = clock.now();
                let expires = now + ttl.as_nanos() as u64;
                let ours = ledger.share(&counter(), limit, holder(h), want, None, now, expires);
                let theirs = runtime
                    .block_on(take_share(&redis, &key, &format!("h{h}"), limit, want, ttl, &time))
                    .unwrap();
                prop_assert_eq!(ours, theirs.share, "holder {} wanting {} of {}", h, want, limit);
                prop_assert!(theirs.held <= limit.max(theirs.share), "{:?}", theirs);
            }
        });
    }
}
