//! Model-based property tests: every algorithm against a plain reference model written from its
//! documented semantics.
//!
//! Each model is straightforward integer arithmetic over an explicit history (or a token count)
//! and answers one question, `remaining_at(t)`: how many permits a request at time `t` could take
//! if nothing else happened in between. Everything else a decision reports follows from that:
//!
//! * `n` is admitted iff `n <= remaining_at(now)`;
//! * `retry_after` is the earliest `t >= now` with `remaining_at(t) >= n` (for a lease, `n = 1`),
//!   `None` if no amount of waiting gets there;
//! * `reset_after` is the earliest `t >= now` with `remaining_at(t) == limit`.
//!
//! The earliest times are found by binary search over `remaining_at`, which never decreases while
//! no request is made, so the model never has to solve for a time in closed form.
//!
//! Proptest drives a real [`Limiter`] on a [`ManualClock`] and the model side by side with random
//! sequences of clock advances (zero, a few nanoseconds, fractions and multiples of the period,
//! exactly onto and one nanosecond either side of period/segment/emission boundaries, and by the
//! `retry_after`/`reset_after` just reported), `try_acquire(n)` for `n` in `0..=capacity + 1`,
//! `check(n)`, dropping or releasing held leases, settling them as reservations for random actual
//! costs (below, at and above the estimate: a give-back or a debt, [`tollgate::Reservation`]),
//! and `replenish` for the interval bucket.
//!
//! A settle for more than the estimate charges past the limit: the models then hold a debt
//! (negative credit, a count over the limit) that later decisions must wait out, so every
//! `retry_after` after a debt checks that it delays the next admission by exactly what it should.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::{
    Algorithm, Clock, Concurrency, FixedWindow, IntervalBucket, Lease, Limiter, ManualClock, Meta, Quota, Reason,
    Rejected, SettleError, SlidingLog, SlidingWindow, TokenBucket, WeightedWindow,
};

// ---------------------------------------------------------------------------------------------
// Reference models
// ---------------------------------------------------------------------------------------------

/// A reference model: the documented semantics of one algorithm, in the plainest terms.
trait Model: fmt::Debug {
    /// The most one request can get; also the `limit` every decision reports.
    fn cap(&self) -> u64;
    /// Permits a request at `t` could take if nothing happens before then. Never decreases in `t`.
    fn remaining_at(&self, t: u64) -> u64;
    /// Takes `n <= remaining_at(t)` permits at `t`.
    fn take(&mut self, t: u64, n: u64);
    /// Takes `n` permits at `t` whatever is left: a settle above its estimate (a debt).
    fn charge(&mut self, t: u64, n: u64);
    /// Gives back `n` permits taken at `acquired`, at `t`: what of them still counts.
    fn give_back(&mut self, t: u64, n: u64, acquired: u64);
    /// A lease of `n` permits was dropped/released (only a concurrency limit cares).
    fn release(&mut self, _n: u64) {}
    /// `Limiter::replenish` at `t` (only the interval bucket has it).
    fn replenish(&mut self, _t: u64) {}
    /// A span after which, with no requests, `remaining_at` has certainly stopped growing (a
    /// debt included).
    fn horizon(&self) -> u64;
    /// Permits held (concurrency only).
    fn held(&self) -> Option<u64> {
        None
    }
}

/// Token bucket as a bucket of "credit" nanoseconds: it holds at most `burst · T`, gains one
/// nanosecond of credit per nanosecond of time, and a permit costs `T` (the emission interval,
/// `period / limit` rounded up). Starts full.
#[derive(Debug)]
struct BucketModel {
    burst: u64,
    t: u64,
    /// Below 0 while a debt is unpaid.
    credit: i128,
    at: u64,
}

impl BucketModel {
    fn new(q: &Quota, now: u64) -> Self {
        let t = ns(q.emission_interval());
        BucketModel { burst: q.burst(), t, credit: i128::from(q.burst() * t), at: now }
    }
    fn full(&self) -> i128 {
        i128::from(self.burst * self.t)
    }
    fn credit_at(&self, now: u64) -> i128 {
        (self.credit + i128::from(now - self.at)).min(self.full())
    }
    fn set(&mut self, now: u64, credit: i128) {
        self.credit = credit;
        self.at = now;
    }
}

impl Model for BucketModel {
    fn cap(&self) -> u64 {
        self.burst
    }
    fn remaining_at(&self, t: u64) -> u64 {
        u64::try_from(self.credit_at(t).max(0)).unwrap() / self.t
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        self.set(t, self.credit_at(t) - i128::from(n * self.t));
    }
    fn give_back(&mut self, t: u64, n: u64, _acquired: u64) {
        self.set(t, (self.credit_at(t) + i128::from(n * self.t)).min(self.full()));
    }
    fn horizon(&self) -> u64 {
        self.burst * self.t + 1 + u64::try_from(-self.credit.min(0)).unwrap()
    }
}

/// Interval bucket: starts with `burst` tokens; in auto mode `limit` tokens arrive at every
/// multiple of `period` since the clock's origin, capped at `burst`; `replenish` adds `limit`
/// (capped) at once, in either mode.
#[derive(Debug)]
struct IntervalModel {
    limit: u64,
    burst: u64,
    period: u64,
    auto: bool,
    /// Below 0 while a debt is unpaid: the next tokens pay it first.
    tokens: i128,
    // Index of the last period boundary already credited.
    tick: u64,
}

impl IntervalModel {
    fn new(q: &Quota, auto: bool, now: u64) -> Self {
        let (mut limit, mut period) = (q.limit(), ns(q.period()));
        if auto && q.burst() < limit {
            // The quota's rate in steps the burst can hold: `burst` tokens every
            // period × burst / limit, rounded up.
            period = (period * q.burst()).div_ceil(limit);
            limit = q.burst();
        }
        IntervalModel { limit, burst: q.burst(), period, auto, tokens: i128::from(q.burst()), tick: now / period }
    }
    fn tokens_at(&self, t: u64) -> i128 {
        if !self.auto {
            return self.tokens;
        }
        let boundaries = t / self.period - self.tick;
        (self.tokens + i128::from(boundaries * self.limit)).min(i128::from(self.burst))
    }
    fn settle(&mut self, t: u64) {
        self.tokens = self.tokens_at(t);
        if self.auto {
            self.tick = t / self.period;
        }
    }
}

impl Model for IntervalModel {
    fn cap(&self) -> u64 {
        self.burst
    }
    fn remaining_at(&self, t: u64) -> u64 {
        u64::try_from(self.tokens_at(t).max(0)).unwrap()
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        self.settle(t);
        self.tokens -= i128::from(n);
    }
    fn give_back(&mut self, t: u64, n: u64, acquired: u64) {
        self.settle(t);
        // Tokens taken before the last step's refill no longer count (the refill made up for them).
        if !self.auto || acquired / self.period >= self.tick {
            self.tokens = (self.tokens + i128::from(n)).min(i128::from(self.burst));
        }
    }
    fn replenish(&mut self, t: u64) {
        self.give_back(t, self.limit, t);
    }
    fn horizon(&self) -> u64 {
        let debt = u64::try_from(-self.tokens.min(0)).unwrap();
        ((self.burst + debt).div_ceil(self.limit) + 1) * self.period
    }
}

/// Fixed window: the first admitted request after the previous window ended (or emptied by
/// give-backs) opens a window `[start, start + period)`; at most `limit` permits are admitted in
/// it.
#[derive(Debug)]
struct FixedModel {
    limit: u64,
    period: u64,
    window: Option<(u64, u64)>,
}

impl Model for FixedModel {
    fn cap(&self) -> u64 {
        self.limit
    }
    fn remaining_at(&self, t: u64) -> u64 {
        match self.window {
            Some((start, count)) if t < start + self.period => self.limit.saturating_sub(count),
            _ => self.limit,
        }
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        self.window = match self.window {
            Some((start, count)) if count > 0 && t < start + self.period => Some((start, count + n)),
            _ => Some((t, n)),
        };
    }
    fn give_back(&mut self, _t: u64, n: u64, acquired: u64) {
        // Only the window the permits were counted in (a later one starts after them).
        if let Some((start, count)) = self.window
            && acquired >= start
        {
            self.window = Some((start, count.saturating_sub(n)));
        }
    }
    fn horizon(&self) -> u64 {
        self.period + 1
    }
}

/// Segmented sliding window: segment `s` is `[s·len, (s+1)·len)` with `len = ceil(period /
/// segments)` (the window may be a little longer than the period, never shorter); a request in
/// segment `c` sees the permits counted in segments `c - segments + 1 ..= c`.
#[derive(Debug)]
struct SlidingModel {
    limit: u64,
    segments: u64,
    len: u64,
    counts: BTreeMap<u64, u64>,
}

impl Model for SlidingModel {
    fn cap(&self) -> u64 {
        self.limit
    }
    fn remaining_at(&self, t: u64) -> u64 {
        let current = t / self.len;
        let oldest = (current + 1).saturating_sub(self.segments);
        let used: u64 = self.counts.range(oldest..=current).map(|(_, c)| c).sum();
        self.limit.saturating_sub(used)
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        *self.counts.entry(t / self.len).or_default() += n;
    }
    fn give_back(&mut self, t: u64, n: u64, acquired: u64) {
        // Only while the permits' segment is still in the window.
        let s = acquired / self.len;
        if s + self.segments > t / self.len
            && let Some(c) = self.counts.get_mut(&s)
        {
            *c -= (*c).min(n);
        }
    }
    fn horizon(&self) -> u64 {
        (self.segments + 1) * self.len
    }
}

/// Weighted two-window estimate: windows `[i·p, (i+1)·p)`; at elapsed `e` into window `i` the
/// estimate is `prev·(p − e)/p + curr` (prev = count of window `i-1`, curr = of window `i`), and
/// `n` fits when estimate + n <= limit, i.e. in integers `prev·(p−e) + (curr+n)·p <= limit·p`.
#[derive(Debug)]
struct WeightedModel {
    limit: u64,
    period: u64,
    counts: BTreeMap<u64, u64>,
}

impl Model for WeightedModel {
    fn cap(&self) -> u64 {
        self.limit
    }
    fn remaining_at(&self, t: u64) -> u64 {
        let p = self.period as u128;
        let i = t / self.period;
        let e = (t % self.period) as u128;
        let prev = if i == 0 { 0 } else { self.counts.get(&(i - 1)).copied().unwrap_or(0) } as u128;
        let curr = self.counts.get(&i).copied().unwrap_or(0) as u128;
        let used = prev * (p - e) + curr * p;
        ((self.limit as u128 * p).saturating_sub(used) / p) as u64
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        *self.counts.entry(t / self.period).or_default() += n;
    }
    fn give_back(&mut self, t: u64, n: u64, acquired: u64) {
        // Only while the permits' window is the current one or the previous one.
        let at = acquired / self.period;
        if at + 1 >= t / self.period
            && let Some(c) = self.counts.get_mut(&at)
        {
            *c -= (*c).min(n);
        }
    }
    fn horizon(&self) -> u64 {
        2 * self.period + 1
    }
}

/// Sliding log: a permit taken at `a` counts during `[a, a + period)`; at most `limit` count at
/// any time.
#[derive(Debug)]
struct LogModel {
    limit: u64,
    period: u64,
    log: Vec<(u64, u64)>,
}

impl Model for LogModel {
    fn cap(&self) -> u64 {
        self.limit
    }
    fn remaining_at(&self, t: u64) -> u64 {
        let counted: u64 = self.log.iter().filter(|&&(a, _)| a + self.period > t).map(|&(_, n)| n).sum();
        self.limit.saturating_sub(counted)
    }
    fn take(&mut self, t: u64, n: u64) {
        self.charge(t, n);
    }
    fn charge(&mut self, t: u64, n: u64) {
        self.log.push((t, n));
    }
    fn give_back(&mut self, _t: u64, n: u64, acquired: u64) {
        // From the permits logged at the grant's time, newest first.
        let mut left = n;
        for (_, k) in self.log.iter_mut().rev().filter(|(a, _)| *a == acquired) {
            let back = (*k).min(left);
            *k -= back;
            left -= back;
        }
    }
    fn horizon(&self) -> u64 {
        self.period + 1
    }
}

/// Concurrency: `held` permits out of `max`; time changes nothing.
#[derive(Debug)]
struct ConcurrencyModel {
    max: u64,
    held: u64,
}

impl Model for ConcurrencyModel {
    fn cap(&self) -> u64 {
        self.max
    }
    fn remaining_at(&self, _t: u64) -> u64 {
        self.max - self.held
    }
    fn take(&mut self, _t: u64, n: u64) {
        self.held += n;
    }
    fn charge(&mut self, _t: u64, _n: u64) {
        unreachable!("a concurrency limit cannot settle")
    }
    fn give_back(&mut self, _t: u64, _n: u64, _acquired: u64) {
        unreachable!("a concurrency limit cannot settle")
    }
    fn release(&mut self, n: u64) {
        self.held -= n;
    }
    fn horizon(&self) -> u64 {
        1_000_000_000
    }
    fn held(&self) -> Option<u64> {
        Some(self.held)
    }
}

/// Nanoseconds from `now` until `remaining_at >= k`, by binary search; `None` if never.
fn wait_for(m: &impl Model, now: u64, k: u64) -> Option<u64> {
    if m.remaining_at(now) >= k {
        return Some(0);
    }
    let mut hi = now + m.horizon();
    if m.remaining_at(hi) < k {
        return None;
    }
    // remaining_at(lo) < k <= remaining_at(hi)
    let mut lo = now;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if m.remaining_at(mid) >= k {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi - now)
}

// ---------------------------------------------------------------------------------------------
// What a decision reports
// ---------------------------------------------------------------------------------------------

/// Everything observable about one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    ok: bool,
    /// `None` for `check` (it returns bare metadata when the request would fit).
    reason: Option<Reason>,
    permits: u64,
    limit: u64,
    remaining: u64,
    reset_after: Duration,
    retry_after: Option<Duration>,
}

impl Seen {
    fn lease(l: &Lease) -> Seen {
        Seen {
            ok: true,
            reason: Some(l.reason()),
            permits: l.permits(),
            limit: l.limit(),
            remaining: l.remaining(),
            reset_after: l.reset_after(),
            retry_after: l.retry_after(),
        }
    }
    fn rejected(r: &Rejected) -> Seen {
        Seen {
            ok: false,
            reason: Some(r.reason()),
            permits: r.permits(),
            limit: r.limit(),
            remaining: r.remaining(),
            reset_after: r.reset_after(),
            retry_after: r.retry_after(),
        }
    }
    fn meta(m: Meta, n: u64) -> Seen {
        Seen {
            ok: true,
            reason: None,
            permits: n,
            limit: m.limit,
            remaining: m.remaining,
            reset_after: Duration::from_nanos(m.reset_ns),
            retry_after: m.retry_ns.map(Duration::from_nanos),
        }
    }

    /// The model's state at `now`: remaining, time to full (0 if never: a manual bucket or a
    /// concurrency limit has no time-based reset), time to one more permit.
    fn model(m: &impl Model, now: u64, ok: bool, reason: Option<Reason>, permits: u64) -> Seen {
        Seen {
            ok,
            reason,
            permits,
            limit: m.cap(),
            remaining: m.remaining_at(now),
            reset_after: Duration::from_nanos(wait_for(m, now, m.cap()).unwrap_or(0)),
            retry_after: wait_for(m, now, 1).map(Duration::from_nanos),
        }
    }
}

/// The model's answer to `try_acquire(n)` at `now` (taking the permits if admitted).
fn model_try(m: &mut impl Model, now: u64, n: u64) -> Seen {
    if n > m.cap() {
        return Seen { retry_after: None, ..Seen::model(m, now, false, Some(Reason::ExceedsCapacity), n) };
    }
    if n == 0 {
        return Seen::model(m, now, true, Some(Reason::Probe), 0);
    }
    if n <= m.remaining_at(now) {
        m.take(now, n);
        return Seen::model(m, now, true, Some(Reason::Granted), n);
    }
    let retry = wait_for(m, now, n).map(Duration::from_nanos);
    Seen { retry_after: retry, ..Seen::model(m, now, false, Some(Reason::Exhausted), n) }
}

/// The model's answer to `check(n)` at `now`.
fn model_check(m: &impl Model, now: u64, n: u64) -> Seen {
    if n > m.cap() {
        return Seen { retry_after: None, ..Seen::model(m, now, false, Some(Reason::ExceedsCapacity), n) };
    }
    if n <= m.remaining_at(now) {
        return Seen::model(m, now, true, None, n);
    }
    let retry = wait_for(m, now, n).map(Duration::from_nanos);
    Seen { retry_after: retry, ..Seen::model(m, now, false, Some(Reason::Exhausted), n) }
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// How far to move the clock. `unit` picks one of the configuration's time units (period,
/// emission interval, a third unit that is the segment length or the full-burst time, 1 ns).
#[derive(Clone, Copy, Debug)]
enum Adv {
    Zero,
    Nanos(u64),
    /// `unit · num / den`.
    Frac {
        unit: usize,
        num: u64,
        den: u64,
    },
    /// Many units at once, plus a little.
    Many {
        unit: usize,
        k: u64,
        extra: u64,
    },
    /// To the `k+1`-th multiple of `unit` (since the origin) after now, then `delta` ns off it.
    Boundary {
        unit: usize,
        k: u64,
        delta: i64,
    },
    /// By the last decision's `retry_after`, `delta` ns off.
    Retry {
        delta: i64,
    },
    /// By the last decision's `reset_after`, `delta` ns off.
    Reset {
        delta: i64,
    },
}

/// How many permits, relative to the capacity.
#[derive(Clone, Copy, Debug)]
enum Amt {
    Zero,
    One,
    Cap,
    Over,
    Any(u64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(Adv),
    Acquire(Amt),
    Check(Amt),
    /// Drops (`how % 3 == 0`), releases (`1`) or — for a concurrency limit only — gives back
    /// (`2`) one of the held leases.
    Release {
        pick: usize,
        how: u8,
    },
    /// Settles one of the held leases as a reservation, for `actual % (3·estimate + 2)`: less than
    /// the estimate, the estimate, or more (a debt).
    Settle {
        pick: usize,
        actual: u64,
    },
    Replenish,
}

fn adv() -> impl Strategy<Value = Adv> {
    prop_oneof![
        1 => Just(Adv::Zero),
        2 => (0u64..20).prop_map(Adv::Nanos),
        4 => (0usize..4, 0u64..=48, 1u64..=16).prop_map(|(unit, num, den)| Adv::Frac { unit, num, den }),
        1 => (0usize..4, 2u64..=300, 0u64..1_000_000).prop_map(|(unit, k, extra)| Adv::Many { unit, k, extra }),
        3 => (0usize..4, 0u64..3, -1i64..=1).prop_map(|(unit, k, delta)| Adv::Boundary { unit, k, delta }),
        3 => (-1i64..=1).prop_map(|delta| Adv::Retry { delta }),
        1 => (-1i64..=1).prop_map(|delta| Adv::Reset { delta }),
    ]
}

fn amt() -> impl Strategy<Value = Amt> {
    prop_oneof![
        1 => Just(Amt::Zero),
        3 => Just(Amt::One),
        1 => Just(Amt::Cap),
        1 => Just(Amt::Over),
        4 => (0u64..1000).prop_map(Amt::Any),
    ]
}

fn ops(replenish: bool) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => adv().prop_map(Op::Advance),
        10 => amt().prop_map(Op::Acquire),
        2 => amt().prop_map(Op::Check),
        3 => (0usize..64, 0u8..3).prop_map(|(pick, how)| Op::Release { pick, how }),
        3 => (0usize..64, any::<u64>()).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        if replenish { 2 } else { 0 } => Just(Op::Replenish),
    ];
    prop::collection::vec(op, 1..80)
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------
// Configurations
// ---------------------------------------------------------------------------------------------

const QUOTAS: usize = 14;

/// Small quotas, round and awkward (emission intervals that round up), with and without bursts,
/// and some with nanosecond periods so that random advances land on boundaries often.
fn quota(i: usize) -> Quota {
    let (ms, nanos) = (Duration::from_millis, Duration::from_nanos);
    match i % QUOTAS {
        0 => Quota::per_second(3),      // T = 333_333_334 ns
        1 => Quota::per(ms(10), 7),     // T = 1_428_572 ns
        2 => Quota::per_second(5),      // round
        3 => Quota::per(ms(100), 10),   // round
        4 => Quota::per(nanos(10), 3),  // T = 4 ns
        5 => Quota::per(nanos(7), 2),   // T = 4 ns
        6 => Quota::per(nanos(5), 5),   // T = 1 ns
        7 => Quota::per(nanos(100), 7), // T = 15 ns
        8 => Quota::per_second(1),      // limit 1
        9 => Quota::per_second(10).and_then(|q| q.with_burst(3)),
        10 => Quota::per(nanos(10), 3).and_then(|q| q.with_burst(7)),
        11 => Quota::per(ms(10), 7).and_then(|q| q.with_burst(1)),
        12 => Quota::per(nanos(9), 4).and_then(|q| q.with_burst(10)),
        _ => Quota::per(nanos(1000), 6).and_then(|q| q.with_burst(2)),
    }
    .expect("valid quota")
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("fits")
}

/// The time units advances are made of: period, emission interval, `third`, 1 ns.
fn units(q: &Quota, third: u64) -> [u64; 4] {
    [ns(q.period()), ns(q.emission_interval()), third, 1]
}

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

type Manual<A> = Limiter<A, ManualClock>;

/// Limiter methods only some algorithms have.
struct Hooks<A: Algorithm> {
    replenish: Option<fn(&Manual<A>)>,
    held: Option<fn(&Manual<A>) -> u64>,
}

impl<A: Algorithm> Hooks<A> {
    fn none() -> Self {
        Hooks { replenish: None, held: None }
    }
}

fn advance_by(a: Adv, now: u64, units: &[u64; 4], last: Option<&Seen>) -> u64 {
    let off = |base: u64, delta: i64| base.saturating_add_signed(delta);
    match a {
        Adv::Zero => 0,
        Adv::Nanos(n) => n,
        Adv::Frac { unit, num, den } => units[unit] * num / den,
        Adv::Many { unit, k, extra } => units[unit] * k + extra % units[unit],
        Adv::Boundary { unit, k, delta } => {
            let u = units[unit];
            let target = (now / u + 1 + k) * u;
            off(target, delta).saturating_sub(now)
        }
        Adv::Retry { delta } => {
            off(last.and_then(|s| s.retry_after).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap()), delta)
        }
        Adv::Reset { delta } => off(last.map_or(0, |s| u64::try_from(s.reset_after.as_nanos()).unwrap()), delta),
    }
}

/// Runs `ops` against a real limiter built from `algo` and against the model, comparing every
/// decision and, after every step, the limiter's statistics.
fn run<A: Algorithm, M: Model>(
    algo: A,
    model: impl FnOnce(u64) -> M,
    units: [u64; 4],
    hooks: Hooks<A>,
    start: Adv,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    clock.advance(Duration::from_nanos(advance_by(start, 0, &units, None)));
    let limiter = Limiter::builder(algo).clock(clock.clone()).statistics(true).build();
    let mut model = model(clock.now());
    let releases_on_drop = model.held().is_some();

    let mut trace = format!("built at t={} with model {model:?}\n", clock.now());
    let mut leases: Vec<Lease> = Vec::new();
    let mut last: Option<Seen> = None;
    let (mut admitted, mut rejected) = (0u64, 0u64);

    for (step, &op) in ops.iter().enumerate() {
        let now = clock.now();
        let cap = model.cap();
        let amount = |a: Amt| match a {
            Amt::Zero => 0,
            Amt::One => 1,
            Amt::Cap => cap,
            Amt::Over => cap + 1,
            Amt::Any(x) => x % (cap + 2),
        };
        let _ = write!(trace, "step {step} at t={now}: {op:?}");
        let compared: Option<(Seen, Seen)> = match op {
            Op::Advance(a) => {
                let by = advance_by(a, now, &units, last.as_ref());
                clock.advance(Duration::from_nanos(by));
                let _ = write!(trace, " -> by {by} ns to t={}", clock.now());
                None
            }
            Op::Acquire(a) => {
                let n = amount(a);
                let real = match limiter.try_acquire(n) {
                    Ok(lease) => {
                        let seen = Seen::lease(&lease);
                        if n > 0 {
                            admitted += 1;
                            leases.push(lease);
                        }
                        seen
                    }
                    Err(r) => {
                        rejected += 1;
                        Seen::rejected(&r)
                    }
                };
                Some((real, model_try(&mut model, now, n)))
            }
            Op::Check(a) => {
                let n = amount(a);
                let real = match limiter.check(n) {
                    Ok(meta) => Seen::meta(meta, n),
                    Err(r) => Seen::rejected(&r),
                };
                Some((real, model_check(&model, now, n)))
            }
            Op::Release { pick, how } => {
                if !leases.is_empty() {
                    let lease = leases.swap_remove(pick % leases.len());
                    let n = lease.permits();
                    match how % 3 {
                        0 => drop(lease),
                        1 => lease.release(),
                        // Giving back refunds a rate limit too: only modelled for concurrency.
                        _ if releases_on_drop => {
                            admitted -= 1;
                            limiter.give_back(lease);
                        }
                        _ => drop(lease),
                    }
                    if releases_on_drop {
                        model.release(n);
                    }
                    let _ = write!(trace, " -> {n} permit(s)");
                }
                None
            }
            Op::Settle { pick, actual } => {
                if !leases.is_empty() {
                    let lease = leases.swap_remove(pick % leases.len());
                    let estimate = lease.permits();
                    let actual = actual % (3 * estimate + 2);
                    let settled = limiter.settle(&lease, actual);
                    let _ = write!(trace, " -> {estimate} reserved, {actual} used: {settled:?}");
                    if releases_on_drop {
                        // Nothing settled; the lease releases its permits as it goes.
                        prop_assert!(matches!(settled, Err(SettleError::Unsupported { .. })), "{trace}");
                        drop(lease);
                        model.release(estimate);
                    } else {
                        prop_assert!(settled.is_ok(), "{trace}");
                        if actual > estimate {
                            model.charge(now, actual - estimate);
                        } else {
                            model.give_back(now, estimate - actual, lease.granted_at());
                        }
                    }
                }
                None
            }
            Op::Replenish => {
                if let Some(replenish) = hooks.replenish {
                    replenish(&limiter);
                    model.replenish(now);
                }
                None
            }
        };
        if let Some((real, want)) = compared {
            let _ = write!(trace, " -> {real:?}");
            if real != want {
                return Err(TestCaseError::fail(format!(
                    "step {step} ({op:?} at t={now}) diverged from the model\n  real:  {real:?}\n  model: \
                     {want:?}\nmodel state: {model:?}\ntrace:\n{trace}"
                )));
            }
            last = Some(real);
        }
        trace.push('\n');

        let now = clock.now();
        let stats = limiter.statistics();
        let want = (model.remaining_at(now), 0, Some(admitted), Some(rejected));
        let got = (stats.available, stats.queued, stats.admitted, stats.rejected);
        if got != want {
            return Err(TestCaseError::fail(format!(
                "after step {step} ({op:?}) at t={now}: statistics (available, queued, admitted, rejected) \
                 {got:?}, model {want:?}\nmodel state: {model:?}\ntrace:\n{trace}"
            )));
        }
        if let (Some(held), Some(want)) = (hooks.held, model.held())
            && held(&limiter) != want
        {
            return Err(TestCaseError::fail(format!(
                "after step {step} ({op:?}): held {} but the model holds {want}\ntrace:\n{trace}",
                held(&limiter)
            )));
        }
    }
    Ok(())
}

fn segment_len(q: &Quota, segments: u64) -> u64 {
    ns(q.period()).div_ceil(segments)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(false)) {
        let quota = quota(q);
        let tau = ns(quota.emission_interval()) * quota.burst();
        run(TokenBucket::new(quota), |now| BucketModel::new(&quota, now), units(&quota, tau), Hooks::none(), start, &ops)?;
    }

    #[test]
    fn interval_bucket_auto_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(true)) {
        let quota = quota(q);
        let hooks = Hooks { replenish: Some(|l: &Limiter<IntervalBucket, ManualClock>| l.replenish()), held: None };
        let algo = IntervalBucket::new(quota);
        prop_assert!(algo.is_auto());
        run(algo, |now| IntervalModel::new(&quota, true, now), units(&quota, ns(quota.period()) / 2 + 1), hooks, start, &ops)?;
    }

    #[test]
    fn interval_bucket_manual_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(true)) {
        let quota = quota(q);
        let hooks = Hooks { replenish: Some(|l: &Limiter<IntervalBucket, ManualClock>| l.replenish()), held: None };
        let algo = IntervalBucket::manual(quota);
        prop_assert!(!algo.is_auto());
        run(algo, |now| IntervalModel::new(&quota, false, now), units(&quota, ns(quota.period()) / 2 + 1), hooks, start, &ops)?;
    }

    #[test]
    fn fixed_window_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(false)) {
        let quota = quota(q);
        let model = |_| FixedModel { limit: quota.limit(), period: ns(quota.period()), window: None };
        run(FixedWindow::new(quota), model, units(&quota, ns(quota.period()) / 3 + 1), Hooks::none(), start, &ops)?;
    }

    #[test]
    fn sliding_window_matches_model(
        q in 0..QUOTAS,
        segments in prop::sample::select(vec![1u64, 2, 3, 4, 5, 7, 10]),
        start in adv(),
        ops in ops(false),
    ) {
        let quota = quota(q);
        let segments = segments.min(ns(quota.period()));
        let len = segment_len(&quota, segments);
        let model = |_| SlidingModel { limit: quota.limit(), segments, len, counts: BTreeMap::new() };
        let algo = SlidingWindow::new(quota, segments).expect("valid segment count");
        run(algo, model, units(&quota, len), Hooks::none(), start, &ops)?;
    }

    #[test]
    fn weighted_window_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(false)) {
        let quota = quota(q);
        let model = |_| WeightedModel { limit: quota.limit(), period: ns(quota.period()), counts: BTreeMap::new() };
        run(WeightedWindow::new(quota), model, units(&quota, ns(quota.period()) / 4 + 1), Hooks::none(), start, &ops)?;
    }

    #[test]
    fn sliding_log_matches_model(q in 0..QUOTAS, start in adv(), ops in ops(false)) {
        let quota = quota(q);
        let model = |_| LogModel { limit: quota.limit(), period: ns(quota.period()), log: Vec::new() };
        run(SlidingLog::new(quota), model, units(&quota, ns(quota.period()) / 3 + 1), Hooks::none(), start, &ops)?;
    }

    #[test]
    fn concurrency_matches_model(max in 1u64..=8, start in adv(), ops in ops(false)) {
        let hooks = Hooks { replenish: None, held: Some(|l: &Limiter<Concurrency, ManualClock>| l.held()) };
        let quota = Quota::per_second(max).expect("valid quota");
        let algo = Concurrency::new(max).expect("max >= 1");
        run(algo, |_| ConcurrencyModel { max, held: 0 }, units(&quota, 7), hooks, start, &ops)?;
    }
}

/// The models agree with the doc examples they were written from (a check on the models).
#[test]
fn models_agree_with_the_doc_examples() {
    let ms = |n: u64| n * 1_000_000;
    // TokenBucket: 5 per second, the burst at once, then one every 200 ms.
    let mut m = BucketModel::new(&Quota::per_second(5).unwrap(), 0);
    assert!(model_try(&mut m, 0, 5).ok);
    let no = model_try(&mut m, 0, 1);
    assert_eq!((no.reason, no.retry_after), (Some(Reason::Exhausted), Some(Duration::from_millis(200))));
    assert!(model_try(&mut m, ms(200), 1).ok);

    // IntervalBucket: 5 every 100 ms, burst 10.
    let q = Quota::per(Duration::from_millis(100), 5).unwrap().with_burst(10).unwrap();
    let mut m = IntervalModel::new(&q, true, 0);
    assert!(model_try(&mut m, 0, 10).ok);
    assert_eq!(model_try(&mut m, 0, 6).retry_after, Some(Duration::from_millis(200)));
    assert_eq!(model_try(&mut m, ms(100), 0).remaining, 5);

    // FixedWindow: 3 per second.
    let mut m = FixedModel { limit: 3, period: ms(1000), window: None };
    assert!(model_try(&mut m, 0, 3).ok);
    assert_eq!(model_try(&mut m, 0, 1).retry_after, Some(Duration::from_secs(1)));
    assert!(model_try(&mut m, ms(1000), 3).ok);

    // SlidingWindow: 4 per second in four segments.
    let mut m = SlidingModel { limit: 4, segments: 4, len: ms(250), counts: BTreeMap::new() };
    assert!(model_try(&mut m, 0, 4).ok);
    assert_eq!(model_try(&mut m, ms(500), 1).retry_after, Some(Duration::from_millis(500)));

    // WeightedWindow: 10 per second; half of the previous window still counts at 1.5 s.
    let mut m = WeightedModel { limit: 10, period: ms(1000), counts: BTreeMap::new() };
    assert!(model_try(&mut m, 0, 10).ok);
    assert_eq!(model_try(&mut m, ms(1500), 0).remaining, 5);

    // SlidingLog: 2 per second.
    let mut m = LogModel { limit: 2, period: ms(1000), log: Vec::new() };
    assert!(model_try(&mut m, 0, 1).ok);
    assert!(model_try(&mut m, ms(600), 1).ok);
    assert_eq!(model_try(&mut m, ms(600), 1).retry_after, Some(Duration::from_millis(400)));
}

/// The fixed window opens at the first admitted request, not when the limiter was built: a
/// limiter built at t=0 and first used at 900 ms counts that request until 1.9 s.
#[test]
fn fixed_window_opens_at_the_first_request() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(FixedWindow::new(Quota::per_second(3).unwrap())).clock(clock.clone()).build();
    clock.advance(Duration::from_millis(900));
    let lease = limiter.try_acquire(3).unwrap();
    assert_eq!(lease.reset_after(), Duration::from_secs(1));
    clock.advance(Duration::from_millis(200));
    let no = limiter.try_acquire(1).unwrap_err();
    assert_eq!(no.retry_after(), Some(Duration::from_millis(800)));
}
