//! Every bad input has a clear error (or, for bugs, a panic) — never a silent default.

use std::time::Duration;

use tollgate::{
    Concurrency, FixedWindow, IntervalBucket, Limiter, ManualClock, Quota, QuotaError, Reason, SlidingLog,
    SlidingWindow, TokenBucket, WeightedWindow,
};

#[test]
fn zero_limit_period_and_burst_are_errors() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per(Duration::ZERO, 5), Err(QuotaError::ZeroPeriod(Duration::ZERO)));
    assert_eq!(Quota::per_second(5).unwrap().with_burst(0), Err(QuotaError::ZeroBurst));
    assert!(matches!(Concurrency::new(0), Err(QuotaError::ZeroLimit)));
}

#[test]
fn overflowing_quotas_are_errors() {
    let long = Duration::from_secs(u64::MAX);
    assert_eq!(Quota::per(long, 1), Err(QuotaError::PeriodTooLong(long)));
    let err = Quota::per(Duration::from_nanos(10), 11).unwrap_err();
    assert!(matches!(err, QuotaError::RateTooHigh { limit: 11, .. }), "{err}");
    let err = Quota::per_hour(1).unwrap().with_burst(u64::MAX).unwrap_err();
    assert!(matches!(err, QuotaError::BurstOverflow { burst: u64::MAX, .. }), "{err}");
    assert!(err.to_string().contains("18446744073709551615"), "the message names the value: {err}");
}

#[test]
fn bad_segment_counts_are_errors() {
    let q = Quota::per(Duration::from_nanos(100), 10).unwrap();
    assert!(matches!(SlidingWindow::new(q, 0), Err(QuotaError::BadSegments { segments: 0, .. })));
    assert!(matches!(SlidingWindow::new(q, 101), Err(QuotaError::BadSegments { segments: 101, .. })));
    assert!(SlidingWindow::new(q, 100).is_ok());
}

#[test]
fn requests_above_capacity_say_retrying_cannot_help() {
    let q = Quota::per_second(10).unwrap().with_burst(4).unwrap();
    let clock = ManualClock::new();
    macro_rules! over {
        ($algo:expr, $cap:expr) => {{
            let l = Limiter::builder($algo).clock(clock.clone()).build();
            let no = l.try_acquire($cap + 1).unwrap_err();
            assert_eq!(no.reason(), Reason::ExceedsCapacity, "{}", stringify!($algo));
            assert_eq!(no.retry_after(), None);
            assert_eq!(no.limit(), $cap);
            assert!(l.try_acquire($cap).is_ok(), "{}", stringify!($algo));
        }};
    }
    over!(TokenBucket::new(q), 4);
    over!(IntervalBucket::new(q), 4);
    over!(FixedWindow::new(q), 10);
    over!(SlidingWindow::new(q, 4).unwrap(), 10);
    over!(WeightedWindow::new(q), 10);
    over!(SlidingLog::new(q), 10);
    over!(Concurrency::new(4).unwrap(), 4);
}

#[test]
fn time_arithmetic_near_the_end_of_the_clock_saturates_instead_of_panicking() {
    let clock = ManualClock::new();
    clock.set(u64::MAX - 1_000);
    let q = Quota::per_hour(3).unwrap();
    macro_rules! survives {
        ($algo:expr) => {{
            let l = Limiter::builder($algo).clock(clock.clone()).build();
            for _ in 0..5 {
                let _ = l.try_acquire(1);
            }
            let _ = l.statistics();
            let _ = l.check(3);
        }};
    }
    survives!(TokenBucket::new(q));
    survives!(IntervalBucket::new(q));
    survives!(FixedWindow::new(q));
    survives!(SlidingWindow::new(q, 7).unwrap());
    survives!(WeightedWindow::new(q));
    survives!(SlidingLog::new(q));
}

#[test]
#[should_panic(expected = "backwards")]
fn a_manual_clock_moved_backwards_is_a_bug() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1));
    clock.set(5);
}

#[test]
fn rejection_messages_name_the_numbers() {
    let l = Limiter::builder(TokenBucket::new(Quota::per_second(1).unwrap())).clock(ManualClock::new()).build();
    let _ = l.try_acquire(1).unwrap();
    let msg = l.try_acquire(1).unwrap_err().to_string();
    assert!(msg.contains("rate limit exhausted") && msg.contains("1s"), "{msg}");
}
