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

/// A redis-server, a runtime to block on, a connection, and a manual clock at 1,000 s.
struct Setup {
    server: RedisServer,
    runtime: tokio::runtime::Runtime,
    redis: Redis,
    clock: ManualClock,
    time: RedisTime,
}

impl Setup {
    fn new() -> Setup {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1000));
        let time = RedisTime::clock(clock.clone());
        Setup { server, runtime, redis, clock, time }
    }

    /// One call, as `seen` shows it.
    fn decide(&self, counters: &[WindowCounter], mode: CountersMode) -> (bool, Vec<(u64, u64, bool)>) {
        seen(&self.runtime.block_on(decide_windows(&self.redis, counters, mode, &self.time)).unwrap())
    }
}

#[test]
fn each_part_of_a_counters_role_word_decides_as_the_counter_says() {
    let s = Setup::new();
    let (decide, now_us) = (|counters: &[WindowCounter], mode| s.decide(counters, mode), s.time.now_us().unwrap());
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

/// A window an earlier tollgate stored (a hash {s = start µs, c = count}) goes on in the string
/// layout: the first decision that touches it rewrites it with its count and end, whether it
/// takes or only checks; one already over starts anew. The library's fixed window shares the
/// layout (fixed_lib.lua), so this holds for `RedisLimiter` too.
#[test]
fn a_window_stored_in_the_earlier_layout_goes_on_in_this_one() {
    let s = Setup::new();
    let (server, clock) = (&s.server, &s.clock);
    let decide = |counters: &[WindowCounter], mode| s.decide(counters, mode);
    let old = |key: &str, opened_ago_s: u64, count: u64| {
        let start = (s.time.now_us().unwrap() - opened_ago_s * 1_000_000).to_string();
        server.cli(&["HSET", &format!("{{roles}}:{key}"), "s", &start, "c", &count.to_string()]);
    };

    old("taken", 20, 4);
    assert_eq!(decide(&[counter("taken", 10, 1)], CountersMode::Take), (true, vec![(5, 40_000, false)]));
    assert_eq!(server.cli(&["TYPE", "{roles}:taken"]).trim(), "string");
    assert_eq!(server.cli(&["GET", "{roles}:taken"]).trim(), "5");
    clock.advance(Duration::from_secs(40));
    assert_eq!(decide(&[counter("taken", 10, 1)], CountersMode::Take), (true, vec![(9, 60_000, false)]), "it ended");

    old("checked", 30, 7);
    assert_eq!(decide(&[counter("checked", 10, 1)], CountersMode::Check), (true, vec![(3, 30_000, false)]));

    old("over", 61, 9);
    assert_eq!(decide(&[counter("over", 10, 1)], CountersMode::Take), (true, vec![(9, 60_000, false)]));

    // A key of another type is no window: the call fails, and counts on no other key.
    server.cli(&["LPUSH", "{roles}:list", "x"]);
    let failed = s.runtime.block_on(decide_windows(
        &s.redis,
        &[counter("first", 10, 1), counter("list", 10, 1)],
        CountersMode::Take,
        &s.time,
    ));
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(server.cli(&["EXISTS", "{roles}:first"]).trim(), "0", "the first counter gave its hit back");
}
