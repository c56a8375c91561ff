//! `--storage redis-cached`: counters decided in memory and flushed to Redis in batches.
//!
//! Each counter is read from Redis the first time it is needed (one round trip), then decided
//! locally under one lock, all-or-nothing like accuracy mode; the hits allowed since the last
//! flush are added to Redis every `flush` interval (saturating at the limit), and the answer
//! refreshes the local view with what the other replicas counted meanwhile.
//!
//! Overshoot is bounded: within one flush interval each replica can allow up to what it last saw
//! as remaining, so with R replicas a window can admit up to R × (what one replica saw remaining)
//! before they hear of each other — at most (R − 1) × max_value beyond the limit in the worst case,
//! and about (R − 1) × (hits per flush interval) in steady traffic. With one replica it is exact.
//! That bound is per window, and the replicas' windows agree only while they hear from Redis: a
//! replica opens a window at its own first hit; its flush opens Redis's window at that hit too
//! (unless another replica's flush opened one first), and every replica takes Redis's end at its
//! next flush. While Redis is unreachable each replica keeps deciding the counters it knows,
//! alone, and its windows drift from the others' by the gaps between their first hits; one
//! window-long interval can then meet two windows of every replica: up to (2R − 1) × max_value
//! beyond the limit. A flush that succeeds again brings them back to Redis's windows.
//!
//! The local counters weigh at most the engine's `--max-counter-bytes` together (each its key's
//! bytes and its entry): a call that would load counters past that is decided in Redis instead,
//! one round trip and nothing kept here, as `--storage redis` decides it (what this replica
//! allowed of those counters and has not flushed yet is not seen there: the same bound as
//! between replicas above).
//!
//! A reset (`DELETE /counters/{namespace}`) holds off flushes while it runs: it first sends what
//! is pending, then deletes the counters in Redis, then forgets them here ([`Cache::forget`]), so
//! no hit counted before the reset reaches Redis after it. Other replicas' pending hits do: each
//! can still add up to one flush interval's hits from before the reset.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::{Meta, WindowCount};
use tollgate_redis::counters::{CountersMode, WindowCounter, decide_windows};
use tollgate_redis::{BackendError, Redis, RedisTime};

#[derive(Debug)]
struct Entry {
    limit: u64,
    window_ns: u64,
    /// The window (engine clock) and the hits this replica knows it holds: Redis's at the last
    /// sync, and its own since (pending or in flight). The core's fixed window rule places it.
    window: WindowCount,
    /// Allowed here since the last sync, not yet sent.
    pending: u64,
    /// Sent in the flush under way.
    in_flight: u64,
}

impl Entry {
    /// A counter as Redis answered it at `now`: `remaining` of `limit`, its window ending
    /// `reset_ns` later (0: no window open).
    fn synced(limit: u64, window_ns: u64, now: u64, remaining: u64, reset_ns: u64) -> Entry {
        let mut entry = Entry { limit, window_ns, window: WindowCount::default(), pending: 0, in_flight: 0 };
        entry.sync(now, remaining, reset_ns);
        entry
    }

    /// Takes Redis's view at `now` (`remaining`, the window ending `reset_ns` later), with this
    /// replica's unsent hits on top.
    fn sync(&mut self, now: u64, remaining: u64, reset_ns: u64) {
        let start = if reset_ns > 0 { now.saturating_add(reset_ns).saturating_sub(self.window_ns) } else { now };
        let count = self.limit.saturating_sub(remaining).saturating_add(self.pending + self.in_flight);
        self.window = WindowCount { start, count };
    }

    fn remaining(&self) -> u64 {
        self.window.remaining(self.limit)
    }

    /// A window that is over starts again empty. Its unsent hits are dropped: they counted in a
    /// window that no longer limits anything, and sending them would charge the next one.
    fn expire(&mut self, now: u64) {
        let window = self.window.at(now, self.window_ns);
        if window.count == 0 {
            self.pending = 0;
        }
        self.window = window;
    }
}

/// The local counters of one engine.
pub(crate) struct Cache {
    entries: Mutex<Entries>,
    /// Most bytes the entries weigh together (see [`Entries::weight`]).
    max_bytes: usize,
    /// Held by a flush, and by a reset for all it does.
    flushing: tokio::sync::Mutex<()>,
    /// Counts resets: a load that read Redis across one reads again (what it read may be from
    /// before the delete).
    resets: AtomicU64,
}

/// The local counters and what they weigh: every insert and removal goes through here.
#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    bytes: usize,
}

impl Entries {
    /// What a counter under `key` weighs: the key's bytes and its entry in the map.
    fn weight(key: &str) -> usize {
        key.len() + size_of::<(String, Entry)>()
    }

    fn get_or_insert(&mut self, key: &str, entry: impl FnOnce() -> Entry) -> &mut Entry {
        if !self.map.contains_key(key) {
            self.bytes += Entries::weight(key);
            self.map.insert(key.to_string(), entry());
        }
        self.map.get_mut(key).expect("inserted above")
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &mut Entry) -> bool) {
        let bytes = &mut self.bytes;
        self.map.retain(|key, e| {
            let kept = keep(key, e);
            if !kept {
                *bytes -= Entries::weight(key);
            }
            kept
        });
    }
}

/// Flushes held off, for a reset ([`Cache::hold_flushes`]).
pub(crate) struct FlushesHeld<'a> {
    _guard: tokio::sync::MutexGuard<'a, ()>,
}

/// One counter of a call: key, limit, window.
pub(crate) type Wanted = WindowCounter;

impl Cache {
    /// An empty cache whose counters weigh at most `max_bytes` together.
    pub(crate) fn new(max_bytes: usize) -> Cache {
        Cache {
            entries: Mutex::default(),
            max_bytes,
            flushing: tokio::sync::Mutex::default(),
            resets: AtomicU64::default(),
        }
    }

    /// The counters not yet known here.
    pub(crate) fn missing(&self, counters: &[Wanted]) -> Vec<Wanted> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        counters.iter().filter(|c| !entries.map.contains_key(&c.key)).cloned().collect()
    }

    /// True when `missing` counters can be kept here without passing the cache's byte budget.
    pub(crate) fn has_room(&self, missing: &[Wanted]) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let wanted: usize = missing.iter().map(|c| Entries::weight(&c.key)).sum();
        entries.bytes.saturating_add(wanted) <= self.max_bytes
    }

    /// What the local counters weigh now.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Most they may weigh.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Loads counters from Redis (a probe: takes nothing).
    pub(crate) async fn load(
        &self,
        redis: &Redis,
        counters: Vec<Wanted>,
        now: u64,
        time: &RedisTime,
    ) -> Result<(), BackendError> {
        // Redis decides at the instant `now` was read, however long the call takes to get there.
        let time = &time.at(now);
        let probes: Vec<Wanted> = counters.iter().map(|c| Wanted { hits: 0, ..c.clone() }).collect();
        let (answer, mut entries) = loop {
            let resets = self.resets.load(Ordering::Acquire);
            let answer = decide_windows(redis, &probes, CountersMode::Check, time).await?;
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if self.resets.load(Ordering::Acquire) == resets {
                break (answer, entries);
            }
        };
        for (c, (meta, _)) in counters.into_iter().zip(answer.counters) {
            let window_ns = u64::try_from(c.window.as_nanos()).unwrap_or(u64::MAX);
            entries.get_or_insert(&c.key, || Entry::synced(c.limit, window_ns, now, meta.remaining, meta.reset_ns));
        }
        Ok(())
    }

    /// Decides every counter's hits together; takes when `take` and every enforcing counter has
    /// room (a counter that does not enforce takes only if it has room itself).
    /// Returns each counter's state and whether it alone lacked room.
    pub(crate) fn decide(&self, counters: &[Wanted], take: bool, now: u64) -> Vec<(Meta, bool)> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let mut fits = Vec::with_capacity(counters.len());
        for c in counters {
            // Normally loaded just before; if a flush forgot it meanwhile, it starts fresh.
            let e = entries.get_or_insert(&c.key, || {
                Entry::synced(c.limit, u64::try_from(c.window.as_nanos()).unwrap_or(u64::MAX), now, c.limit, 0)
            });
            e.limit = c.limit;
            e.expire(now);
            fits.push(e.remaining() >= c.hits);
        }
        let admitted = counters.iter().zip(&fits).all(|(c, fit)| *fit || !c.enforce);
        counters
            .iter()
            .zip(fits)
            .filter_map(|(c, fit)| {
                let e = entries.map.get_mut(&c.key)?;
                if take && admitted && fit && c.hits > 0 {
                    e.pending += c.hits;
                    e.window = e.window.counted(c.hits);
                }
                let reset_ns = e.window.reset_ns(now, e.window_ns);
                Some((c.meta(e.remaining(), reset_ns, !fit), !fit))
            })
            .collect()
    }

    /// Sends the hits allowed since the last flush; returns how many counters were flushed.
    /// On a Redis error the hits stay pending for the next flush.
    pub(crate) async fn flush(&self, redis: &Redis, now: u64, time: &RedisTime) -> Result<usize, BackendError> {
        let held = self.hold_flushes().await;
        self.flush_held(&held, redis, now, time).await
    }

    /// Waits for a flush under way to end, and holds off the others until the guard is dropped.
    pub(crate) async fn hold_flushes(&self) -> FlushesHeld<'_> {
        FlushesHeld { _guard: self.flushing.lock().await }
    }

    /// Forgets the counters whose key `reset` chooses, with their pending hits: their next
    /// decision loads them from Redis again. Returns how many were known here.
    pub(crate) fn forget(&self, _held: &FlushesHeld<'_>, mut reset: impl FnMut(&str) -> bool) -> usize {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        self.resets.fetch_add(1, Ordering::AcqRel);
        let before = entries.map.len();
        entries.retain(|key, _| !reset(key));
        before - entries.map.len()
    }

    /// [`Cache::flush`] with flushes already held off (by the caller, a reset).
    pub(crate) async fn flush_held(
        &self,
        _held: &FlushesHeld<'_>,
        redis: &Redis,
        now: u64,
        time: &RedisTime,
    ) -> Result<usize, BackendError> {
        // How long ago each window opened is counted from `now`: Redis must place it from then.
        let time = &time.at(now);
        let batch: Vec<(String, u64, u64, u64, u64, u64)> = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .map
                .iter_mut()
                .filter_map(|(k, e)| {
                    // Hits of a window that is over are not sent (as `expire` drops them).
                    e.expire(now);
                    (e.pending > 0).then(|| {
                        e.in_flight = e.pending;
                        e.pending = 0;
                        // Redis opens the window when this replica did, if no other replica has.
                        let opened_ago = now.saturating_sub(e.window.start);
                        (k.clone(), e.limit, e.window_ns, e.in_flight, opened_ago, e.window.start)
                    })
                })
                .collect()
        };
        let mut first_error = None;
        for (key, limit, window_ns, hits, opened_ago, opened) in &batch {
            let counter = WindowCounter {
                opened_ago: Duration::from_nanos(*opened_ago),
                ..WindowCounter::enforcing(key.clone(), *limit, Duration::from_nanos(*window_ns), *hits)
            };
            let answer = decide_windows(redis, &[counter], CountersMode::Flush, time).await;
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let Some(e) = entries.map.get_mut(key) else { continue };
            match answer {
                Ok(answer) => {
                    let meta = answer.counters[0].0;
                    e.in_flight = 0;
                    e.sync(now, meta.remaining, meta.reset_ns);
                }
                Err(error) => {
                    // Sent again at the next flush, unless their window ended meanwhile (then they
                    // are dropped, as `expire` drops what was not sent).
                    if e.window.start == *opened {
                        e.pending += e.in_flight;
                    }
                    e.in_flight = 0;
                    first_error.get_or_insert(error);
                }
            }
        }
        // Forget counters whose window is over and that have nothing to send.
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, e| e.pending + e.in_flight > 0 || e.window.count == 0 || now < e.window.end(e.window_ns));
        match first_error {
            Some(error) => Err(error),
            None => Ok(batch.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Two-phase and sequential decide the same, uncontended: [`Cache::decide`] (every counter of
    //! a call looked at under one lock, then all taken or none) against [`AllOrNothing`] taking
    //! from in-process fixed windows one at a time, on random counters (enforcing or only
    //! counting, with or without room), in check and take modes: same admission, same
    //! `remaining` and `limited` per counter, same state left behind.

    use proptest::prelude::*;
    use tollgate::{AllOrNothing, FixedWindow, Limiter, ManualClock, Quota};
    use tollgate_testkit::part;

    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);

    fn counter(i: usize, limit: u64, hits: u64, enforce: bool) -> Wanted {
        WindowCounter { enforce, ..WindowCounter::enforcing(format!("k{i}"), limit, WINDOW, hits) }
    }

    #[test]
    fn a_reloaded_limit_applies_to_the_window_already_counted() {
        let cache = Cache::new(usize::MAX);
        let now = 1_000_000_000;
        assert!(!cache.decide(&[counter(0, 5, 5, true)], true, now)[0].1);
        assert!(cache.decide(&[counter(0, 5, 1, true)], true, now)[0].1, "5 of 5 taken");
        // As the core's fixed window: the window keeps its start and count, the new limit applies.
        let raised = cache.decide(&[counter(0, 8, 0, true)], false, now + 1);
        assert_eq!((raised[0].0.remaining, raised[0].0.reset_ns), (3, WINDOW.as_nanos() as u64 - 1));
        let later = cache.decide(&[counter(0, 8, 0, true)], false, now + WINDOW.as_nanos() as u64);
        assert_eq!(later[0].0.remaining, 8, "the window ended");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn the_cache_decides_as_all_or_nothing(parts in prop::collection::vec(part(), 1..6), check in any::<bool>()) {
            let clock = ManualClock::new();
            let cache = Cache::new(usize::MAX);
            let now = 1_000_000_000;
            let mut locals = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                let local = Limiter::builder(FixedWindow::new(Quota::per(WINDOW, p.limit).unwrap())).clock(clock.clone()).build();
                if p.used > 0 {
                    let _ = local.try_acquire(p.used).unwrap();
                    let taken = cache.decide(&[counter(i, p.limit, p.used, true)], true, now);
                    prop_assert!(!taken[0].1);
                }
                locals.push(local);
            }

            let counters: Vec<Wanted> = parts.iter().enumerate().map(|(i, p)| counter(i, p.limit, p.hits, p.enforce)).collect();
            let two_phase = cache.decide(&counters, !check, now);

            let enforces = parts.iter().map(|p| p.enforce);
            let sequential = if check { AllOrNothing::check(enforces) } else { AllOrNothing::new(enforces) };
            let sequential = sequential.run_now(|step| {
                let i = step.part();
                step.run(&locals[i], &(), parts[i].hits)
            });

            let admitted = two_phase.iter().zip(&parts).all(|((_, limited), p)| !limited || !p.enforce);
            prop_assert_eq!(admitted, sequential.is_granted());
            for (i, (answer, (meta, limited))) in sequential.parts().iter().zip(&two_phase).enumerate() {
                prop_assert_eq!(meta.remaining, answer.meta().remaining, "counter {} ({:?})", i, answer);
                prop_assert_eq!(*limited, answer.is_limited(), "counter {} ({:?})", i, answer);
                // Both leave the counter in the same state.
                let probe = cache.decide(&[counter(i, parts[i].limit, 0, true)], false, now);
                prop_assert_eq!(probe[0].0.remaining, locals[i].check(0).unwrap().remaining, "counter {}", i);
            }
        }
    }
}
