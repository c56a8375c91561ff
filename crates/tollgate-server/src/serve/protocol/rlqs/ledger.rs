//! Who holds what of each counter's limit: the shares assigned to the buckets of the Envoy
//! instances that report on it, until their assignments expire.
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

/// One bucket of one Envoy instance (a stream): the unit that holds a share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Holder {
    /// The stream's number.
    pub(crate) instance: u64,
    /// The bucket's number within the server.
    pub(crate) bucket: u64,
}

/// One counter of one limit, as the RLS counts it: the limit and its variables' values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CounterKey {
    pub(crate) limit: LimitId,
    pub(crate) values: Vec<String>,
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
    /// The hits per window `holder` may be assigned on `counter` (whose limit is `limit` hits
    /// per window) now that it wants `want`: its max-min fair share among the counter's live
    /// holders, capped by what the others' assignments in force leave. Records the want; what
    /// it holds stays as it was until [`Ledger::hold`].
    pub(crate) fn share(&mut self, counter: &CounterKey, limit: u64, holder: Holder, want: u64, now_ns: u64) -> u64 {
        let holds = self.holds(counter);
        holds.retain(|_, h| h.expires_ns > now_ns);
        holds.entry(holder).and_modify(|h| h.want = want).or_insert(Hold { want, held: 0, expires_ns: now_ns });
        let wants: Vec<u64> = holds.values().map(|h| h.want).collect();
        let at = holds.keys().position(|h| *h == holder).expect("inserted above");
        let fair = fair_shares(limit, &wants)[at];
        let others: u64 = holds.iter().filter(|(h, _)| **h != holder).map(|(_, h)| h.held).sum();
        fair.min(limit.saturating_sub(others))
    }

    /// Records that `holder`'s assignment in force may admit `held` hits per window of
    /// `counter` until `expires_ns`.
    pub(crate) fn hold(&mut self, counter: &CounterKey, holder: Holder, held: u64, expires_ns: u64) {
        let hold = self.holds(counter).entry(holder).or_insert(Hold { want: held, held, expires_ns });
        hold.held = held;
        hold.expires_ns = expires_ns;
    }

    /// The holds of `counter`, empty when it has none yet.
    fn holds(&mut self, counter: &CounterKey) -> &mut HashMap<Holder, Hold> {
        if !self.counters.contains_key(counter) {
            self.counters.insert(counter.clone(), HashMap::new());
        }
        self.counters.get_mut(counter).expect("inserted above")
    }

    /// Forgets what `instance` holds: its stream ended cleanly, so it enforces nothing more.
    /// (A stream that broke keeps its holds until they expire: Envoy keeps enforcing its
    /// assignments until their time to live ends.)
    pub(crate) fn release(&mut self, instance: u64) {
        self.counters.retain(|_, holds| {
            holds.retain(|h, _| h.instance != instance);
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
                instances.push(holder.instance);
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
        Holder { instance, bucket: instance }
    }

    #[test]
    fn a_newcomer_gets_only_what_the_others_do_not_hold_until_they_give_it_up() {
        let mut ledger = Ledger::default();
        let c = counter();
        assert_eq!(ledger.share(&c, 90, holder(1), 200, 0), 90, "alone: all of it");
        ledger.hold(&c, holder(1), 90, 1_000);
        assert_eq!(ledger.share(&c, 90, holder(2), 200, 0), 0, "1 holds all until it reports");
        ledger.hold(&c, holder(2), 0, 1_000);
        assert_eq!(ledger.share(&c, 90, holder(1), 200, 10), 45, "1 is cut to its fair share");
        ledger.hold(&c, holder(1), 45, 1_000);
        assert_eq!(ledger.share(&c, 90, holder(2), 200, 20), 45, "then 2 gets the rest");
    }

    #[test]
    fn a_released_or_expired_share_goes_back_to_the_others() {
        let mut ledger = Ledger::default();
        let c = counter();
        for i in 1..=3 {
            let _ = ledger.share(&c, 90, holder(i), 200, 0);
        }
        for i in 1..=3 {
            ledger.hold(&c, holder(i), 30, if i == 3 { 500 } else { 1_000 });
        }
        assert_eq!(ledger.limit_totals(LimitId(7)), (3, 90));
        assert_eq!(ledger.share(&c, 90, holder(1), 200, 100), 30);
        ledger.release(2);
        assert_eq!(ledger.share(&c, 90, holder(1), 200, 100), 45, "2 ended its stream: half of what 3 leaves");
        assert_eq!(ledger.share(&c, 90, holder(1), 200, 600), 90, "3's assignment expired");
        ledger.expire(2_000);
        assert_eq!(ledger.limit_totals(LimitId(7)), (0, 0));
    }
}
