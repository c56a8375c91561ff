//! Bounds under real concurrency: several OS threads hammer one limiter over many simulated
//! periods and never get more than the algorithm's exact bound.
//!
//! Time is a [`ManualClock`] moved only between rounds: every round, the main thread advances the
//! clock by a random amount (zero, a fraction of the period, exactly onto or one nanosecond either
//! side of a period/segment/emission boundary, several periods), then releases the workers through
//! a [`Barrier`]; each worker makes a few requests of random size and then, in a drain round,
//! takes single permits until one is refused; a second barrier ends the round. All admissions of a round
//! therefore happen at the round's time, which makes them checkable from the outside:
//!
//! * upper bounds over every pair of rounds (token and interval buckets), every window the
//!   algorithm defines (fixed window, segments, weighted estimate) or every window of `period`
//!   (sliding log);
//! * and, in the rounds that drain the limiter (at random, half of them, and always the first),
//!   because it is drained at a fixed time, the permits admitted equal what a probe reported
//!   before the round and nothing is left after it, whatever the interleaving; each algorithm's
//!   own check then confirms from the admissions alone that the limiter is exactly full.
//!
//! The main thread asserts nothing while workers wait on the barrier (a failed assertion there
//! would deadlock the test); rounds are recorded and checked after the threads are joined.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use tollgate::{
    Algorithm, Answer, Chain, Clock, Concurrency, FixedWindow, IntervalBucket, Limiter, ManualClock, Meta, Quota,
    RateLimiter, Reason, SlidingLog, SlidingWindow, TokenBucket, WeightedWindow,
};

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

const THREADS: usize = 3;
const ROUNDS: usize = 1000;
/// Random-size requests per worker per round, before the drain.
const ATTEMPTS: usize = 6;

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("fits")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Moves the clock forward by a random amount measured in one of `units`.
fn advance(clock: &ManualClock, rng: &mut Rng, units: &[u64]) {
    let now = clock.now();
    let u = units[rng.below(units.len() as u64) as usize];
    let by = match rng.below(10) {
        0 | 1 => 0,
        2..=4 => rng.below(u / 4 + 1),
        5 | 6 => rng.below(u + 1),
        // Onto the next multiple of the unit since the origin, or 1 ns either side of it.
        7 | 8 => (now / u + 1) * u - 1 + rng.below(3) - now,
        _ => rng.below(5 * u + 1),
    };
    clock.advance(Duration::from_nanos(by));
}

/// One round: its time, what a probe reported before it, the permits the workers got, what a
/// probe reported after it, whether `replenish` was called before it and whether the workers
/// drained the limiter.
#[derive(Clone, Copy, Debug)]
struct Round {
    t: u64,
    before: u64,
    admitted: u64,
    after: u64,
    replenished: bool,
    drained: bool,
}

/// Runs `ROUNDS` rounds of `THREADS` workers against one limiter built from `algo`.
fn hammer<A: Algorithm>(
    algo: A,
    units: &[u64],
    max_n: u64,
    seed: u64,
    replenish: Option<fn(&Limiter<A, ManualClock>)>,
) -> Vec<Round> {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(algo).clock(clock.clone()).build();
    let barrier = Barrier::new(THREADS + 1);
    let admitted = AtomicU64::new(0);
    let drain = AtomicBool::new(true);
    let mut rounds = Vec::with_capacity(ROUNDS);
    let mut rng = Rng(seed);
    thread::scope(|s| {
        for w in 0..THREADS {
            let (limiter, barrier, admitted, drain) = (&limiter, &barrier, &admitted, &drain);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (w as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let mut got = 0;
                    for _ in 0..ATTEMPTS {
                        let n = 1 + rng.below(max_n);
                        if limiter.try_acquire(n).is_ok() {
                            got += n;
                        }
                    }
                    while drain.load(Ordering::SeqCst) && limiter.try_acquire(1).is_ok() {
                        got += 1;
                    }
                    admitted.fetch_add(got, Ordering::SeqCst);
                    barrier.wait();
                }
            });
        }
        for r in 0..ROUNDS {
            if r > 0 {
                advance(&clock, &mut rng, units);
            }
            let replenished = match replenish {
                Some(replenish) if rng.below(3) == 0 => {
                    replenish(&limiter);
                    true
                }
                _ => false,
            };
            let drained = r == 0 || rng.below(2) == 0;
            drain.store(drained, Ordering::SeqCst);
            let before = limiter.statistics().available;
            barrier.wait();
            barrier.wait();
            let admitted = admitted.swap(0, Ordering::SeqCst);
            let after = limiter.statistics().available;
            rounds.push(Round { t: clock.now(), before, admitted, after, replenished, drained });
        }
    });
    for (i, r) in rounds.iter().enumerate() {
        // Time stands still within a round: taking n leaves exactly n fewer.
        assert_eq!(r.before - r.admitted, r.after, "round {i} {r:?}: admitted other than what went");
        if r.drained {
            assert_eq!(r.after, 0, "round {i} {r:?}: the workers stopped with permits left");
        }
    }
    let total: u64 = rounds.iter().map(|r| r.admitted).sum();
    assert!(total > ROUNDS as u64 / 4, "suspiciously few admissions: {total}");
    rounds
}

/// [`hammer`] on `algo(q)` for each of `quotas` in turn (the `k`th with seed `seed + k`), the
/// clock moving in units of the period and of `period / d + 1` for each `d` of `fractions`: each
/// quota with its period in nanoseconds and its rounds.
fn hammer_each<A: Algorithm>(
    quotas: [Quota; 3],
    algo: impl Fn(Quota) -> A,
    fractions: &[u64],
    seed: u64,
) -> impl Iterator<Item = (Quota, u64, Vec<Round>)> {
    quotas.into_iter().zip(seed..).map(move |(q, seed)| {
        let p = ns(q.period());
        let units: Vec<u64> = std::iter::once(p).chain(fractions.iter().map(|d| p / d + 1)).collect();
        (q, p, hammer(algo(q), &units, 3, seed, None))
    })
}

/// Asserts `sum(admitted[i..=j]) <= bound(i, j)` for every pair of rounds; returns how many pairs
/// met the bound exactly.
fn check_pairs(what: &str, rounds: &[Round], bound: impl Fn(&Round, &Round, usize, usize) -> u64) -> usize {
    let mut prefix = vec![0u64];
    for r in rounds {
        prefix.push(prefix.last().unwrap() + r.admitted);
    }
    let mut tight = 0;
    for j in 0..rounds.len() {
        for i in 0..=j {
            let sum = prefix[j + 1] - prefix[i];
            let b = bound(&rounds[i], &rounds[j], i, j);
            assert!(
                sum <= b,
                "{what}: {sum} permits admitted in rounds {i}..={j} (t = {} ..= {}), bound {b}",
                rounds[i].t,
                rounds[j].t
            );
            tight += usize::from(sum == b);
        }
    }
    tight
}

#[test]
fn token_bucket_never_exceeds_burst_plus_elapsed_over_emission() {
    let quotas = [
        Quota::per(ms(10), 7).unwrap().with_burst(12).unwrap(), // T = 1_428_572 ns
        Quota::per_second(3).unwrap().with_burst(5).unwrap(),   // T = 333_333_334 ns
        Quota::per(Duration::from_nanos(100), 7).unwrap().with_burst(20).unwrap(), // T = 15 ns
        Quota::per_second(4).unwrap().with_burst(1).unwrap(),
    ];
    for (k, q) in quotas.into_iter().enumerate() {
        let t = ns(q.emission_interval());
        let rounds = hammer(TokenBucket::new(q), &[ns(q.period()), t, t * q.burst()], 3, 11 + k as u64, None);
        // Built at t = 0 full; the first round is at t = 0, so pairs starting there cover the
        // bound counted from the origin.
        let tight = check_pairs(&format!("token bucket {q}"), &rounds, |a, b, _, _| q.burst() + (b.t - a.t) / t);
        assert!(tight > 0, "token bucket {q}: the bound was never reached");
    }
}

#[test]
fn interval_bucket_never_exceeds_burst_plus_refills() {
    let quotas = [
        Quota::per(ms(10), 7).unwrap().with_burst(12).unwrap(),
        Quota::per(ms(10), 7).unwrap().with_burst(3).unwrap(),
        Quota::per(Duration::from_nanos(9), 4).unwrap().with_burst(10).unwrap(),
    ];
    for (k, q) in quotas.into_iter().enumerate() {
        let p = ns(q.period());
        // Auto: a step of tokens at every multiple of the step's interval since the origin; the
        // quota's rate in steps the burst holds (`burst` every p × burst / limit when it holds
        // fewer than `limit`).
        let (step, sp) =
            if q.burst() < q.limit() { (q.burst(), (p * q.burst()).div_ceil(q.limit())) } else { (q.limit(), p) };
        let rounds = hammer(IntervalBucket::new(q), &[sp, sp / 3 + 1], 3, 21 + k as u64, None);
        let tight = check_pairs(&format!("interval bucket {q}"), &rounds, |a, b, _, _| {
            q.burst() + step * (b.t / sp - a.t / sp)
        });
        assert!(tight > 0, "interval bucket {q}: the bound was never reached");
        for w in rounds.windows(2).filter(|w| w[0].drained && w[1].drained) {
            let refill = (step * (w[1].t / sp - w[0].t / sp)).min(q.burst());
            assert_eq!(w[1].admitted, refill, "interval bucket {q}: drained round after a drain, {:?}", w[1]);
        }

        // Manual: `limit` more per `replenish`, whatever the clock does.
        let replenish: fn(&Limiter<IntervalBucket, ManualClock>) = |l| l.replenish();
        let rounds = hammer(IntervalBucket::manual(q), &[p, p / 3 + 1], 3, 31 + k as u64, Some(replenish));
        let mut replenishes = vec![0u64];
        for r in &rounds {
            replenishes.push(replenishes.last().unwrap() + u64::from(r.replenished));
        }
        // Tokens at the start of round i are at most the burst (round i's replenish included).
        let tight = check_pairs(&format!("manual interval bucket {q}"), &rounds, |_, _, i, j| {
            q.burst() + q.limit() * (replenishes[j + 1] - replenishes[i + 1])
        });
        assert!(tight > 0, "manual interval bucket {q}: the bound was never reached");
        for w in rounds.windows(2).filter(|w| w[0].drained && w[1].drained) {
            let want = if w[1].replenished { q.limit().min(q.burst()) } else { 0 };
            assert_eq!(w[1].admitted, want, "manual interval bucket {q}: drained round after a drain, {:?}", w[1]);
        }
    }
}

#[test]
fn fixed_window_never_exceeds_limit_per_window() {
    let quotas = [
        Quota::per(ms(10), 7).unwrap(),
        Quota::per_second(3).unwrap(),
        Quota::per(Duration::from_nanos(10), 4).unwrap(),
    ];
    for (q, p, rounds) in hammer_each(quotas, FixedWindow::new, &[4], 41) {
        // Rebuild the windows from the outside: one opens at the first admission at or after the
        // end of the previous one.
        let mut window: Option<(u64, u64)> = None;
        for (j, r) in rounds.iter().enumerate() {
            if r.admitted > 0 {
                window = match window {
                    Some((start, count)) if r.t < start + p => Some((start, count + r.admitted)),
                    _ => Some((r.t, r.admitted)),
                };
            }
            let (start, count) = window.expect("the first round admits");
            assert!(count <= q.limit(), "fixed window {q}: {count} in the window opened at {start} (round {j})");
            if r.drained {
                // Drained: the window is current and full.
                assert!(r.t < start + p && count == q.limit(), "fixed window {q}: round {j} {r:?}, window {window:?}");
            }
        }
        // The documented worst case across a boundary: 2 × limit in any span of one period.
        check_pairs(&format!("fixed window {q}, any period"), &rounds, |a, b, _, _| {
            if b.t - a.t < p { 2 * q.limit() } else { u64::MAX }
        });
    }
}

#[test]
fn sliding_window_never_exceeds_limit_over_its_segments() {
    for (k, (q, segments)) in [
        (Quota::per(ms(10), 7).unwrap(), 1),
        (Quota::per(ms(10), 7).unwrap(), 3), // 10 ms / 3 rounds up
        (Quota::per_second(5).unwrap(), 4),
        (Quota::per(Duration::from_nanos(10), 6).unwrap(), 7),
    ]
    .into_iter()
    .enumerate()
    {
        let len = ns(q.period()).div_ceil(segments);
        let rounds = hammer(SlidingWindow::new(q, segments).unwrap(), &[ns(q.period()), len], 3, 51 + k as u64, None);
        let seg = |r: &Round| r.t / len;
        for (j, r) in rounds.iter().enumerate() {
            // Everything admitted in this round's segment and the `segments - 1` before it.
            let counted: u64 = rounds[..=j].iter().filter(|a| seg(a) + segments > seg(r)).map(|a| a.admitted).sum();
            assert!(counted <= q.limit(), "sliding window {q} / {segments}: {counted} counted at round {j} {r:?}");
            if r.drained {
                assert_eq!(
                    counted,
                    q.limit(),
                    "sliding window {q} / {segments}: round {j} {r:?} not drained to the limit"
                );
            }
        }
    }
}

#[test]
fn weighted_window_never_exceeds_its_estimate() {
    let quotas = [
        Quota::per(ms(10), 7).unwrap(),
        Quota::per_second(10).unwrap(),
        Quota::per(Duration::from_nanos(9), 4).unwrap(),
    ];
    for (q, p, rounds) in hammer_each(quotas, WeightedWindow::new, &[4], 61) {
        for (j, r) in rounds.iter().enumerate() {
            let idx = r.t / p;
            let count =
                |w: u64| -> u128 { rounds[..=j].iter().filter(|a| a.t / p == w).map(|a| a.admitted as u128).sum() };
            let prev = if idx == 0 { 0 } else { count(idx - 1) };
            let estimate = prev * (p - r.t % p) as u128 + count(idx) * p as u128;
            let limit = q.limit() as u128 * p as u128;
            assert!(estimate <= limit, "weighted window {q}: estimate {estimate} > {limit} after round {j} {r:?}");
            // Drained: not even one more permit fits.
            if r.drained {
                assert!(estimate + p as u128 > limit, "weighted window {q}: room left after round {j} {r:?}");
            }
        }
    }
}

#[test]
fn sliding_log_never_exceeds_limit_in_any_window() {
    let quotas = [
        Quota::per(ms(10), 7).unwrap(),
        Quota::per_second(3).unwrap(),
        Quota::per(Duration::from_nanos(10), 4).unwrap(),
    ];
    for (q, p, rounds) in hammer_each(quotas, SlidingLog::new, &[3, 7], 71) {
        // Every window [a, a + p): the fullest ones start at an admission, so checking the windows
        // starting at each round's time covers them all.
        let tight = check_pairs(
            &format!("sliding log {q}"),
            &rounds,
            |a, b, _, _| {
                if b.t - a.t < p { q.limit() } else { u64::MAX }
            },
        );
        assert!(tight > 0, "sliding log {q}: the bound was never reached");
        for (j, r) in rounds.iter().enumerate().filter(|(_, r)| r.drained) {
            let counted: u64 = rounds[..=j].iter().filter(|a| a.t + p > r.t).map(|a| a.admitted).sum();
            assert_eq!(counted, q.limit(), "sliding log {q}: round {j} {r:?} not drained to exactly the limit");
        }
    }
}

/// The lock-free bucket under pure contention: one instant, a big burst, three threads taking
/// 1–3 permits until refused: exactly the burst is admitted.
#[test]
fn token_bucket_admits_exactly_the_burst_under_contention() {
    const BURST: u64 = 60_000;
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(5));
    let q = Quota::per_second(1).unwrap().with_burst(BURST).unwrap();
    let limiter = Limiter::builder(TokenBucket::new(q)).clock(clock.clone()).build();
    let total: u64 = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS as u64)
            .map(|w| {
                let limiter = &limiter;
                s.spawn(move || {
                    let mut rng = Rng(w + 100);
                    let mut got = 0;
                    loop {
                        let n = 1 + rng.below(3);
                        match limiter.try_acquire(n) {
                            Ok(_) => got += n,
                            Err(_) if limiter.try_acquire(1).is_ok() => got += 1,
                            Err(_) => return got,
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(total, BURST);
    assert_eq!(limiter.statistics().available, 0);
}

#[test]
fn concurrency_never_exceeds_max_held() {
    for max in [1u64, 3, 8] {
        let limiter = Limiter::new(Concurrency::new(max).unwrap());
        let in_flight = AtomicU64::new(0);
        let peak = AtomicU64::new(0);
        let granted = AtomicU64::new(0);
        thread::scope(|s| {
            for w in 0..THREADS as u64 {
                let (limiter, in_flight, peak, granted) = (&limiter, &in_flight, &peak, &granted);
                s.spawn(move || {
                    let mut rng = Rng(w + 7 * max);
                    for _ in 0..20_000 {
                        let n = 1 + rng.below(max.min(3));
                        match limiter.try_acquire(n) {
                            Ok(lease) => {
                                let now = in_flight.fetch_add(n, Ordering::SeqCst) + n;
                                peak.fetch_max(now, Ordering::SeqCst);
                                assert!(now <= max, "{now} permits in flight, max {max}");
                                assert!(limiter.held() <= max, "held {} > max {max}", limiter.held());
                                for _ in 0..rng.below(64) {
                                    std::hint::spin_loop();
                                }
                                // Leave the critical section before the permits go back.
                                in_flight.fetch_sub(n, Ordering::SeqCst);
                                granted.fetch_add(1, Ordering::Relaxed);
                                match rng.below(3) {
                                    0 => drop(lease),
                                    1 => lease.release(),
                                    _ => limiter.give_back(lease),
                                }
                            }
                            Err(no) => {
                                assert_eq!(no.reason(), Reason::Exhausted);
                                assert!(no.remaining() < n, "refused {n} with {} remaining", no.remaining());
                                assert_eq!(no.retry_after(), None, "only a release frees a concurrency permit");
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(limiter.held(), 0, "max {max}: permits leaked");
        assert!(peak.load(Ordering::SeqCst) <= max);
        assert!(granted.load(Ordering::Relaxed) > 0);
        let stats = limiter.statistics();
        assert_eq!(stats.available, max);
    }
}

/// A release and a waiter joining the queue at the same moment: one of the two must see the
/// other (the release serves the waiter, or the waiter sees the permits), or the waiter sleeps
/// for ever. Threads mix borrowed permits (`try_permit`) with queued `acquire().await`s on one
/// permit; a lost wakeup shows as the watchdog firing.
#[test]
fn a_release_never_misses_a_waiter_joining_the_queue() {
    const ROUNDS: u64 = 20_000;
    let limiter = std::sync::Arc::new(
        Limiter::builder(Concurrency::new(1).unwrap()).clock(ManualClock::new()).statistics(true).build(),
    );
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // Detached threads, not a scope: a scope would wait for a stuck thread instead of failing.
    for w in 0..THREADS as u64 {
        let (limiter, done_tx) = (limiter.clone(), done_tx.clone());
        thread::spawn(move || {
            let mut rng = Rng(w + 99);
            for _ in 0..ROUNDS {
                // Holding the permit a while makes the others queue behind it.
                let hold = rng.below(200);
                if rng.below(2) == 0 {
                    if let Ok(permit) = limiter.try_permit(1) {
                        (0..hold).for_each(|_| std::hint::spin_loop());
                        drop(permit);
                    }
                } else {
                    let lease =
                        futures::executor::block_on(Limiter::acquire(&limiter, 1)).expect("no limit on the queue");
                    (0..hold).for_each(|_| std::hint::spin_loop());
                    drop(lease);
                }
            }
            done_tx.send(()).expect("the watchdog is listening");
        });
    }
    for _ in 0..THREADS {
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a waiter was never served: a release missed it (lost wakeup)");
    }
    assert_eq!(limiter.held(), 0, "permits leaked");
    assert!(limiter.statistics().admitted > Some(THREADS as u64 * ROUNDS / 4), "too few permits were granted");
}

/// Per round of a chain run: time, chain successes and their permits, then each limiter's
/// probe and admitted count after the round.
#[derive(Clone, Copy, Debug)]
struct ChainRound {
    t: u64,
    successes: u64,
    permits: u64,
    first: (Meta, u64),
    second: (Meta, u64),
}

/// Replays only the chain's successful permits on a fresh limiter and compares its probe with what
/// the chained limiter reported after every round: any charge left behind by a request the other
/// limiter refused shows up as a difference.
fn replay_matches<A: Algorithm>(what: &str, algo: A, rounds: &[ChainRound], pick: impl Fn(&ChainRound) -> (Meta, u64)) {
    let clock = ManualClock::new();
    let shadow = Limiter::builder(algo).clock(clock.clone()).build();
    let mut successes = 0;
    for (i, r) in rounds.iter().enumerate() {
        clock.advance(Duration::from_nanos(r.t - clock.now()));
        // At a fixed time, n single permits are n permits; concurrency permits all came back by
        // the end of the round, so each is released at once.
        for _ in 0..r.permits {
            if let Err(e) = shadow.try_acquire(1) {
                panic!("{what}: round {i} replay refused: {e}");
            }
        }
        successes += r.successes;
        let (meta, admitted) = pick(r);
        assert_eq!(meta, shadow.check(0).unwrap(), "{what}: round {i} {r:?}: state differs from the successes alone");
        assert_eq!(admitted, successes, "{what}: round {i}: admitted count includes refused requests");
    }
}

/// `Chain::new(first, second)` hammered by several threads: after every round each limiter is in
/// exactly the state its share of the chain's successes leaves it in.
fn chain_case<A: Algorithm, B: Algorithm>(
    what: &str,
    first: impl Fn() -> A,
    second: impl Fn() -> B,
    unit: u64,
    seed: u64,
) {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(first()).clock(clock.clone()).statistics(true).build(),
        Limiter::builder(second()).clock(clock.clone()).statistics(true).build(),
    );
    let max_n = chain.capacity().min(3);
    let barrier = Barrier::new(THREADS + 1);
    let (successes, permits) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut rounds = Vec::with_capacity(ROUNDS);
    let mut rng = Rng(seed);
    thread::scope(|s| {
        for w in 0..THREADS as u64 {
            let (chain, barrier, successes, permits) = (&chain, &barrier, &successes, &permits);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (w + 1).wrapping_mul(0xE703_7ED1_A0B4_28DB));
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let mut leases = Vec::new();
                    for _ in 0..3 * ATTEMPTS {
                        let n = 1 + rng.below(max_n);
                        if let Answer::Ready(Ok(lease)) = chain.decide(&(), n) {
                            successes.fetch_add(1, Ordering::SeqCst);
                            permits.fetch_add(n, Ordering::SeqCst);
                            leases.push(lease);
                        }
                    }
                    drop(leases);
                    barrier.wait();
                }
            });
        }
        for r in 0..ROUNDS {
            if r > 0 {
                advance(&clock, &mut rng, &[unit, unit / 3 + 1]);
            }
            barrier.wait();
            barrier.wait();
            let (a, b) = (chain.first(), chain.second());
            rounds.push(ChainRound {
                t: clock.now(),
                successes: successes.swap(0, Ordering::SeqCst),
                permits: permits.swap(0, Ordering::SeqCst),
                first: (a.check(0).unwrap_or_else(|r| r.meta()), a.statistics().admitted.expect("counted")),
                second: (b.check(0).unwrap_or_else(|r| r.meta()), b.statistics().admitted.expect("counted")),
            });
        }
    });
    let total: u64 = rounds.iter().map(|r| r.successes).sum();
    assert!(total > 0, "{what}: nothing admitted");
    replay_matches(&format!("{what} (first)"), first(), &rounds, |r| r.first);
    replay_matches(&format!("{what} (second)"), second(), &rounds, |r| r.second);
}

#[test]
fn chain_never_charges_one_limiter_for_the_others_refusals() {
    let p = ns(ms(10));
    chain_case(
        "token bucket then fixed window",
        || TokenBucket::new(Quota::per(ms(10), 20).unwrap().with_burst(12).unwrap()),
        || FixedWindow::new(Quota::per(ms(10), 7).unwrap()),
        p,
        81,
    );
    chain_case(
        "fixed window then token bucket",
        || FixedWindow::new(Quota::per(ms(10), 9).unwrap()),
        || TokenBucket::new(Quota::per(ms(10), 7).unwrap().with_burst(4).unwrap()),
        p,
        82,
    );
    chain_case(
        "sliding log then weighted window",
        || SlidingLog::new(Quota::per(ms(10), 10).unwrap()),
        || WeightedWindow::new(Quota::per(ms(10), 6).unwrap()),
        p,
        83,
    );
    chain_case(
        "sliding window then interval bucket",
        || SlidingWindow::new(Quota::per(ms(10), 10).unwrap(), 3).unwrap(),
        || IntervalBucket::new(Quota::per(ms(10), 5).unwrap().with_burst(7).unwrap()),
        p,
        84,
    );
    chain_case(
        "concurrency then token bucket",
        || Concurrency::new(5).unwrap(),
        || TokenBucket::new(Quota::per(ms(10), 7).unwrap().with_burst(3).unwrap()),
        p,
        85,
    );
    chain_case(
        "token bucket then concurrency",
        || TokenBucket::new(Quota::per(ms(10), 30).unwrap().with_burst(10).unwrap()),
        || Concurrency::new(2).unwrap(),
        p,
        86,
    );
}
