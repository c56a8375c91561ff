//! A limit a request sets for its counter (a descriptor's own `limit`, see
//! [`tollgate_policy::LimitOverride`]), applied to in-memory counters that hold more.
//!
//! The counters of a limit [set by requests](tollgate_policy::Limit::set_by_request), and of a
//! rule whose counters those requests share
//! ([`shared_with_own_limits`](tollgate_policy::Limit::shared_with_own_limits)), count up to
//! [`COUNT_PAST_CAPACITY`](tollgate_policy::COUNT_PAST_CAPACITY), whatever each request asks:
//! [`OwnLimit`] is those counters seen through one hit's limit (the request's, or the rule's), so the call's
//! all-or-nothing ([`tollgate::AllOrNothing`]) decides on it as on any counter. A take that
//! goes past the request's limit is given back at once and rejected: in accuracy mode no other
//! call sees it (the counter's stripe is held); in throughput mode one that looks meanwhile may
//! see the counter briefly high and be refused (never admitted past the limit).

use std::time::Duration;

use tollgate::{Answer, Check, Decision, Lease, Meta, RateLimiter, Reason, Refund, Rejected};

use crate::serve::model::Counters;

/// A limit's in-memory `counters` with `max` hits per window, the request's.
pub(crate) struct OwnLimit<'a> {
    pub(crate) counters: &'a dyn Counters,
    pub(crate) max: u64,
}

impl OwnLimit<'_> {
    /// A counter's state, from what it holds, against `max`.
    fn meta(&self, counted: Meta) -> Meta {
        Meta { limit: self.max, remaining: self.max.saturating_sub(count(counted)), ..counted }
    }

    /// `n` hits refused on a counter holding `counted`: retry when its window ends.
    fn refuse(&self, counted: Meta, n: u64) -> Rejected {
        Rejected::new(Meta { retry_ns: Some(counted.reset_ns), ..self.meta(counted) }, n, Reason::Exhausted)
    }
}

/// The hits a counter holds (its limit is what it can hold).
fn count(counted: Meta) -> u64 {
    counted.limit.saturating_sub(counted.remaining)
}

/// In-memory counters answer at once.
fn now<T: Send + 'static>(answer: Answer<T>) -> T {
    answer.now().unwrap_or_else(|_| unreachable!("in-memory counters answer at once"))
}

impl RateLimiter<[String]> for OwnLimit<'_> {
    fn decide(&self, key: &[String], n: u64) -> Decision {
        Answer::Ready(match now(self.counters.decide(key, n)) {
            Ok(lease) if count(lease.meta()) <= self.max => {
                // The counter gives back by permits and time granted: the same lease, seen here.
                Ok(Lease::new(self.meta(lease.meta()), lease.permits(), lease.granted_at()))
            }
            Ok(lease) => {
                let took = lease.meta();
                now(self.counters.give_back(key, lease));
                Err(self.refuse(Meta { remaining: took.remaining.saturating_add(n), ..took }, n))
            }
            Err(full) => Err(self.refuse(full.meta(), n)),
        })
    }

    fn check(&self, key: &[String], n: u64) -> Check {
        Answer::Ready(match now(self.counters.check(key, n)) {
            Ok(counted) if count(counted).saturating_add(n) <= self.max => Ok(self.meta(counted)),
            Ok(counted) => Err(self.refuse(counted, n)),
            Err(full) => Err(self.refuse(full.meta(), n)),
        })
    }

    fn give_back(&self, key: &[String], lease: Lease) -> Refund {
        self.counters.give_back(key, lease)
    }

    fn capacity(&self) -> u64 {
        self.max
    }

    fn window(&self) -> Option<Duration> {
        self.counters.window()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use tollgate::ManualClock;
    use tollgate_policy::{COUNT_PAST_CAPACITY, Descriptor, Hit, LimitOverride, Policy, SourceText};

    use super::*;
    use crate::serve::model::CounterCap;
    use crate::serve::store::keyed::counters;

    /// A policy whose descriptors with their own limit per minute count on one limit.
    fn own_minute() -> Policy {
        let yaml = "domain: api\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 9}}\n";
        Policy::parse_envoy(&[SourceText::new("api.yaml", yaml)]).unwrap()
    }

    fn hit(policy: &Policy, max: u64) -> Hit<'_> {
        let asked = LimitOverride { requests_per_unit: max, unit: tollgate::CalendarUnit::Minute };
        policy.hits("api", &[Descriptor::from([("k", "v")]).with_limit(asked)]).remove(0)
    }

    proptest! {
        /// Against a model (one count per minute window): each request's own limit is applied to
        /// the count, whatever the others asked; a refused take changes nothing, a lease given
        /// back comes off the count.
        #[test]
        fn each_request_is_decided_on_the_count_against_its_own_limit(
            steps in prop::collection::vec((0u64..8, 0u64..5, 0u8..4), 1..60),
        ) {
            let policy = own_minute();
            let clock = ManualClock::new();
            let counted = counters(hit(&policy, 1).limit, &clock, CounterCap::default());
            let key = ["k".to_string(), "v".to_string()];
            let (mut count, mut held) = (0u64, Vec::new());
            for (max, n, op) in steps {
                let own = OwnLimit { counters: &*counted, max };
                match op {
                    0 | 1 => match now(own.decide(&key, n)) {
                        Ok(lease) => {
                            prop_assert!(count + n <= max, "admitted {n} on {count} of {max}");
                            count += n;
                            prop_assert_eq!((lease.limit(), lease.remaining()), (max, max - count));
                            held.push(lease);
                        }
                        Err(refused) => {
                            prop_assert!(count + n > max, "refused {n} on {count} of {max}");
                            prop_assert_eq!(refused.remaining(), max.saturating_sub(count));
                        }
                    },
                    2 => {
                        let fits = count + n <= max;
                        prop_assert_eq!(now(own.check(&key, n)).is_ok(), fits);
                    }
                    _ => {
                        if let Some(lease) = held.pop() {
                            count -= lease.permits();
                            now(own.give_back(&key, lease));
                        }
                    }
                }
            }
        }
    }

    /// In throughput mode nothing holds the counter's stripe: threads taking at once may be
    /// refused while another's take past the limit is being given back, never admitted past it.
    #[test]
    fn concurrent_takes_never_pass_the_requests_limit() {
        let policy = own_minute();
        let clock = ManualClock::new();
        let counted = counters(hit(&policy, 1).limit, &clock, CounterCap::default());
        let key = ["k".to_string(), "v".to_string()];
        let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let start = Arc::new(std::sync::Barrier::new(4));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (admitted, start, counted, key) = (&admitted, &start, &counted, &key);
                s.spawn(move || {
                    start.wait();
                    let own = OwnLimit { counters: &**counted, max: 100 };
                    for _ in 0..200 {
                        if let Ok(lease) = now(own.decide(&key[..], 1)) {
                            admitted.fetch_add(lease.permits(), std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let admitted = admitted.load(std::sync::atomic::Ordering::Relaxed);
        let own = OwnLimit { counters: &*counted, max: 100 };
        assert_eq!(admitted, 100, "800 asked of 100: every permit went, none past");
        assert_eq!(now(own.check(&key, 0)).unwrap().remaining, 0);
    }

    #[test]
    fn the_requests_limit_is_applied_and_a_take_past_it_is_given_back() {
        let yaml = "domain: api\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 9}}\n";
        let policy = Policy::parse_envoy(&[SourceText::new("api.yaml", yaml)]).unwrap();
        let asked = LimitOverride { requests_per_unit: 3, unit: tollgate::CalendarUnit::Minute };
        let hits = policy.hits("api", &[Descriptor::from([("k", "v")]).with_limit(asked)]);
        let clock = ManualClock::new();
        let counted = counters(hits[0].limit, &clock, CounterCap::default());
        assert_eq!(counted.capacity(), COUNT_PAST_CAPACITY);
        let own = OwnLimit { counters: &*counted, max: hits[0].max_value };
        let key = &hits[0].values[..];

        let two = now(own.decide(key, 2)).unwrap();
        assert_eq!((two.limit(), two.remaining()), (3, 1));
        let refused = now(own.decide(key, 2)).unwrap_err();
        assert_eq!((refused.limit(), refused.remaining(), refused.permits()), (3, 1, 2), "nothing taken");
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
        assert_eq!(now(own.check(key, 1)).unwrap().remaining, 1);
        assert!(now(own.check(key, 2)).is_err());
        now(own.give_back(key, two));
        assert_eq!(now(own.check(key, 3)).unwrap().remaining, 3, "the lease went back to the counter");
        let zero = OwnLimit { counters: &*counted, max: 0 };
        assert!(now(zero.decide(key, 1)).is_err() && now(zero.check(key, 0)).is_ok(), "0 refuses hits, not probes");
    }
}
