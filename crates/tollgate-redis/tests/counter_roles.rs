//! Every part of a counter that `counters.lua` takes in its role word (hits, a probe, a pooled
//! limit, a calendar window, a first hit seen earlier, and all of them at once) decides as the
//! counter says, through `decide_windows` against a real `redis-server` on a manual clock.

use std::time::Duration;

use tollgate::ManualClock;
use tollgate_redis::counters::{CountersAnswer, CountersMode, WindowCounter, decide_windows};
use tollgate_redis::{Redis, RedisTime};
use tollgate_testkit::RedisServer;

const WINDOW: Duration = Duration::from_secs(60);

fn counter(key: &str, limit: u64, hits: u64) -> WindowCounter {
    WindowCounter::enforcing(format!("{{roles}}:{key}"), limit, WINDOW, hits)
}

/// (admitted, then each counter's remaining, reset in ms and whether it alone had no room).
fn seen(answer: &CountersAnswer) -> (bool, Vec<(u64, u64, bool)>) {
    let counters = answer.counters.iter().map(|(m, limited)| (m.remaining, m.reset_ns / 1_000_000, *limited));
    (answer.admitted, counters.collect())
}

#[test]
fn each_part_of_a_counters_role_word_decides_as_the_counter_says() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1000));
    let time = RedisTime::clock(clock.clone());
    let now_us = time.now_us().unwrap();
    let decide = |counters: &[WindowCounter], mode| {
        seen(&runtime.block_on(decide_windows(&redis, counters, mode, &time)).unwrap())
    };
    let take = CountersMode::Take;

    // Hits other than 1: 3 of 5 fit, 3 more do not (and take nothing), a probe takes nothing.
    assert_eq!(decide(&[counter("hits", 5, 3)], take), (true, vec![(2, 60_000, false)]));
    assert_eq!(decide(&[counter("hits", 5, 3)], take), (false, vec![(2, 60_000, true)]));
    assert_eq!(decide(&[counter("hits", 5, 0)], take), (true, vec![(2, 60_000, false)]));
    // A probe of a counter never hit stores nothing: no window, no reset.
    assert_eq!(decide(&[counter("probe", 5, 0)], take), (true, vec![(5, 0, false)]));

    // A first hit seen 250 ms ago opens the window then: it resets 250 ms sooner.
    let earlier = WindowCounter { opened_ago: Duration::from_millis(250), ..counter("ago", 5, 1) };
    assert_eq!(decide(&[earlier], take), (true, vec![(4, 59_750, false)]));

    // A calendar window that started 10 s ago and ends in 50 s resets at its end.
    let (start, end) = (now_us - 10_000_000, now_us + 50_000_000);
    let calendar = WindowCounter { calendar: Some((start, end)), ..counter("calendar", 5, 2) };
    assert_eq!(decide(std::slice::from_ref(&calendar), take), (true, vec![(3, 50_000, false)]));
    // The same key in the next calendar window starts from 0.
    let next = WindowCounter { calendar: Some((end, end + 60_000_000)), ..calendar.clone() };
    assert_eq!(decide(&[next], CountersMode::Check), (true, vec![(5, 110_000, false)]));

    // Pooled counters: the call is refused only when every one is over, and each is charged.
    let pooled = |key, hits| WindowCounter { enforce: false, charge: true, pooled: Some(2), ..counter(key, 100, hits) };
    assert_eq!(
        decide(&[pooled("pa", 2), pooled("pb", 3)], take),
        (true, vec![(98, 60_000, false), (97, 60_000, false)])
    );
    assert_eq!(
        decide(&[pooled("pa", 1), pooled("pb", 1)], take),
        (false, vec![(97, 60_000, false), (96, 60_000, false)])
    );

    // All at once: a pooled counter of 3 hits in a calendar window, beside an enforcing one.
    let all = WindowCounter { calendar: Some((start, end)), ..pooled("all", 3) };
    assert_eq!(
        decide(&[all, counter("beside", 5, 3)], take),
        (false, vec![(97, 50_000, false), (5, 0, false)]),
        "every pooled counter over (3 > 2): refused, the pooled one charged, the other untouched"
    );
}
