//! `LeasedLimiter`: local leases of a shared fixed-window budget. One process makes the same
//! decisions as the plain `RedisLimiter`; several never admit more than the limit in a window,
//! and leave unspent at most what their leases held; unspent leases go back on release; a held
//! lease keeps being spent while Redis is down.

use std::time::Duration;

use tollgate::{ManualClock, Quota, RateLimiter, Reason};
use tollgate_redis::{AlgorithmKind, FailurePolicy, LeasedLimiter, Redis, RedisLimiter, RedisOptions, RedisTime};
use tollgate_testkit::RedisServer;

const LIMIT: u64 = 100;

/// A redis-server of the test's own, a connection to it, and a manual clock well past 0.
async fn setup() -> (RedisServer, Redis, ManualClock) {
    let server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_secs(2), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    (server, redis, clock)
}

/// Takes one permit a millisecond for 40 ms: a steady rate, so the next lease is larger than one.
async fn warm(limiter: &LeasedLimiter<ManualClock>, clock: &ManualClock) {
    for _ in 0..40 {
        clock.advance(Duration::from_millis(1));
        let _ = limiter.try_acquire("k", 1).await.unwrap();
    }
}

fn leased(redis: &Redis, prefix: &str, clock: &ManualClock) -> LeasedLimiter<ManualClock> {
    LeasedLimiter::builder(redis, prefix, Quota::per_second(LIMIT).unwrap())
        .clock(clock.clone())
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap()
}

/// The plain limiter on the same budget (the leased limiter's limit is named `leased`).
fn plain(redis: &Redis, prefix: &str, clock: &ManualClock) -> RedisLimiter {
    RedisLimiter::builder(redis, prefix, AlgorithmKind::FixedWindow)
        .limit("leased", Quota::per_second(LIMIT).unwrap())
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap()
}

/// A small deterministic generator.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[tokio::test]
async fn one_process_decides_as_the_plain_limiter_on_a_seeded_trace() {
    let (server, redis, clock) = setup().await;
    let (fast, slow) = (leased(&redis, "lease", &clock), plain(&redis, "plain", &clock));
    let mut rng = Lcg(7);
    let mut admitted = 0;
    let scripts_before = server.script_runs();
    for step in 0..3_000 {
        clock.advance(Duration::from_micros(rng.next(2_000)));
        let n = 1 + rng.next(3);
        let a = fast.try_acquire("k", n).await;
        let b = slow.try_acquire("k", n).await;
        assert_eq!(a.is_ok(), b.is_ok(), "step {step}: n {n}: leased {a:?}, plain {b:?}");
        if let (Err(a), Err(b)) = (&a, &b) {
            assert_eq!((a.reason(), a.remaining()), (b.reason(), b.remaining()), "step {step}");
        }
        admitted += a.map_or(0, |l| l.permits());
    }
    assert!(admitted >= 300, "the trace spans windows that fill: {admitted} permits");
    // Every decision that found a live lease here stayed local.
    // The plain limiter asks Redis once per decision; the leased one only for a new lease (or to
    // learn the window is spent): the rest stays here.
    let round_trips = server.script_runs() - scripts_before - 3_000;
    assert!(round_trips < 300, "{round_trips} of 3000 decisions asked Redis");
}

#[tokio::test]
async fn processes_sharing_a_budget_never_admit_more_than_the_limit_per_window() {
    let (_server, redis, clock) = setup().await;
    let processes: Vec<_> = (0..4).map(|_| leased(&redis, "shared", &clock)).collect();
    let mut rng = Lcg(11);
    // Windows open at the first grant: one per second from the first request on.
    let mut window_start = None;
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    let mut unspent_at_end = std::collections::BTreeMap::<u64, u64>::new();
    let mut t = 0u64;
    while t < 5_000_000 {
        let step = rng.next(400);
        let before = t / 1_000_000;
        t += step;
        clock.advance(Duration::from_micros(step));
        if t / 1_000_000 != before {
            unspent_at_end.insert(before, processes.iter().map(|p| p.held("tenant")).sum());
        }
        let p = &processes[rng.next(4) as usize];
        if let Ok(lease) = p.try_acquire("tenant", 1).await {
            let start = *window_start.get_or_insert(t);
            *per_window.entry((t - start) / 1_000_000).or_default() += lease.permits();
        }
    }
    assert!(per_window.len() >= 4, "{per_window:?}");
    for (window, admitted) in &per_window {
        assert!(*admitted <= LIMIT, "window {window}: {admitted} admitted, limit {LIMIT}");
    }
    // Demand is ~5000/s against a limit of 100: each full window leaves unspent at most what the
    // leases held (shrunk to single permits near exhaustion).
    for (window, admitted) in per_window.iter().take(per_window.len() - 1) {
        assert!(*admitted >= LIMIT - 4, "window {window}: only {admitted} admitted ({unspent_at_end:?})");
    }
}

#[tokio::test]
async fn a_lease_ends_with_its_window() {
    let (_server, redis, clock) = setup().await;
    let limiter = leased(&redis, "ends", &clock);
    // Below the limit for most of a window: the lease still holds permits when it ends.
    for _ in 0..45 {
        clock.advance(Duration::from_millis(20));
        let _ = limiter.try_acquire("k", 1).await.unwrap();
    }
    assert!(limiter.held("k") > 0, "permits held near the window's end");
    clock.advance(Duration::from_millis(200));
    assert_eq!(limiter.held("k"), 0, "the window is over, and so is its lease");
    // The next window admits its limit, not its limit plus the last window's lease.
    let mut admitted = 0;
    for _ in 0..LIMIT + 20 {
        admitted += limiter.try_acquire("k", 1).await.map_or(0, |l| l.permits());
    }
    assert_eq!(admitted, LIMIT);
}

#[tokio::test]
async fn unspent_leases_go_back_to_the_budget_on_release() {
    let (_server, redis, clock) = setup().await;
    let limiter = leased(&redis, "release", &clock);
    warm(&limiter, &clock).await;
    let held = limiter.held("k");
    assert!(held > 1, "a lease sized from the rate holds more than one permit: {held}");
    let budget = plain(&redis, "release", &clock);
    let before = budget.check("k", 0).await.unwrap().remaining;
    assert_eq!(limiter.release().await.unwrap(), held);
    assert_eq!(limiter.held("k"), 0);
    assert_eq!(budget.check("k", 0).await.unwrap().remaining, before + held, "back in Redis");
    // A lease given back locally is spent again here.
    let lease = limiter.try_acquire("k", 3).await.unwrap();
    let held = limiter.held("k");
    limiter.give_back("k", lease).await.unwrap();
    assert_eq!(limiter.held("k"), held + 3);
}

#[tokio::test]
async fn a_held_lease_is_spent_while_redis_is_down_and_none_is_renewed() {
    let (mut server, redis, clock) = setup().await;
    let limiter = LeasedLimiter::builder(&redis, "down", Quota::per_second(LIMIT).unwrap())
        .clock(clock.clone())
        .time(RedisTime::clock(clock.clone()))
        .failure_policy(FailurePolicy::Deny)
        .build()
        .unwrap();
    warm(&limiter, &clock).await;
    let held = limiter.held("k");
    assert!(held > 1, "{held}");
    server.kill();
    for i in 0..held {
        let lease = limiter.try_acquire("k", 1).await.unwrap_or_else(|r| panic!("held permit {i}: {r}"));
        assert_eq!(lease.reason(), Reason::Granted);
    }
    let no = limiter.try_acquire("k", 1).await.unwrap_err();
    assert_ne!(no.reason(), Reason::Exhausted, "Redis did not answer: the failure policy did ({no})");
}

/// With whole keys the key is the Redis key; a check counts what is held here; a forgotten slice
/// is not spent; with Redis down, the `_or_error` calls say so instead of deciding.
#[tokio::test]
async fn whole_keys_checks_forgetting_and_errors_instead_of_the_failure_policy() {
    let (mut server, redis, clock) = setup().await;
    let limiter = LeasedLimiter::builder(&redis, "unused", Quota::per_second(LIMIT).unwrap())
        .clock(clock.clone())
        .time(RedisTime::clock(clock.clone()))
        .whole_keys()
        .build()
        .unwrap();
    warm(&limiter, &clock).await;
    assert_eq!(server.cli(&["KEYS", "*"]).trim(), "k", "the key as given, nothing around it");
    let held = limiter.held("k");
    assert!(held > 1, "{held}");
    let counted: u64 = server.cli(&["GET", "k"]).trim().parse().unwrap();
    assert_eq!(counted, 40 + held, "Redis counts what is spent and what is held");
    // A check takes nothing and sees the budget as Redis has it plus what is held here.
    let meta = limiter.check_or_error("k", held + 1).await.unwrap().unwrap();
    assert_eq!(meta.remaining, LIMIT - 40);
    assert_eq!(limiter.held("k"), held, "a check takes nothing");
    let no = limiter.check_or_error("k", LIMIT - 39).await.unwrap().unwrap_err();
    assert_eq!((no.reason(), no.remaining()), (Reason::Exhausted, LIMIT - 40));
    limiter.forget(|key| key == "k");
    assert_eq!(limiter.held("k"), 0, "forgotten");
    server.kill();
    assert!(limiter.try_acquire_or_error("k", 1).await.is_err(), "nothing held, Redis down: an error");
    assert!(limiter.check_or_error("k", 1).await.is_err());
    let refused = RedisLimiter::builder(&redis, "two", AlgorithmKind::FixedWindow)
        .limit("a", Quota::per_second(1).unwrap())
        .limit("b", Quota::per_second(2).unwrap())
        .whole_keys()
        .build()
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "redis limiter \"two\" uses whole keys but has 2 limits: whole keys take exactly one"
    );
}

/// A flood of distinct keys does not grow what a process keeps without bound: keys idle for a
/// window are dropped as new ones come (6,001 keys seen, at most 3,001 + a sweep's slack kept),
/// the keys of the current window are kept.
#[tokio::test]
async fn keys_idle_for_a_window_are_dropped_as_new_keys_come() {
    let (_server, redis, clock) = setup().await;
    let limiter = leased(&redis, "flood", &clock);
    for k in 0..3000 {
        let _ = limiter.try_acquire(&format!("old{k}"), 1).await.unwrap();
    }
    assert_eq!(limiter.keys(), 3000, "all in their window");
    clock.advance(Duration::from_secs(3));
    warm(&limiter, &clock).await; // "k" in use throughout the second batch
    for k in 0..3000 {
        let _ = limiter.try_acquire(&format!("new{k}"), 1).await.unwrap();
        let _ = limiter.try_acquire("k", 1).await;
    }
    let kept = limiter.keys();
    assert!(kept <= 3001 + 1024, "the old keys were swept: {kept} kept");
    assert!(kept >= 3001, "every key of this window is kept: {kept}");
}

#[tokio::test]
async fn it_is_a_rate_limiter_that_answers_at_once_from_a_held_lease() {
    let (_server, redis, clock) = setup().await;
    let limiter = leased(&redis, "trait", &clock);
    assert!(matches!(RateLimiter::<str>::decide(&limiter, "k", 1), tollgate::Answer::Pending(_)), "nothing held yet");
    for _ in 0..40 {
        clock.advance(Duration::from_millis(1));
        let _ = RateLimiter::<str>::decide(&limiter, "k", 1).await.unwrap();
    }
    assert!(limiter.held("k") > 0);
    match RateLimiter::<str>::decide(&limiter, "k", 1) {
        tollgate::Answer::Ready(Ok(lease)) => assert_eq!(lease.permits(), 1),
        other => panic!("a held lease answers at once: {other:?}"),
    }
    assert_eq!(
        (RateLimiter::<str>::capacity(&limiter), RateLimiter::<str>::window(&limiter)),
        (LIMIT, Some(Duration::from_secs(1)))
    );
}

#[tokio::test]
async fn permits_spent_here_while_a_lease_is_on_its_way_are_not_counted_twice() {
    let (_server, redis, clock) = setup().await;
    let limiter = leased(&redis, "race", &clock);
    warm(&limiter, &clock).await;
    let held = limiter.held("k");
    assert!(held >= 2, "{held}");
    // A request for more than is held asks Redis; before the answer, other requests spend it all.
    let mut asking = Box::pin(limiter.try_acquire("k", held + 1));
    assert!(futures::poll!(&mut asking).is_pending(), "waiting for Redis");
    let spent = limiter.try_local("k", held).expect("held here").permits();
    let asked = asking.await.map_or(0, |l| l.permits());
    // Every permit is in one place: admitted (40 while warming, then these), held, or in Redis.
    let budget = plain(&redis, "race", &clock).check("k", 0).await.unwrap().remaining;
    assert_eq!(40 + spent + asked + limiter.held("k") + budget, LIMIT, "asked {asked}, spent {spent}");
}

// ---------------------------------------------------------------------------------------------
// OS processes on one budget, one SIGKILLed while it holds a lease.

const CHILD_ENV: &str = "TOLLGATE_LEASED_CHILD";
const PROCESS_LIMIT: u64 = 1_000;

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Not a test on its own: the body of a child process of
/// `processes_never_admit_more_than_the_limit_and_a_killed_ones_lease_comes_back` (does nothing
/// unless re-executed with `TOLLGATE_LEASED_CHILD` set). Takes permits as fast as it can for the
/// given seconds, printing `A <end of the admission's window, Unix ms>` per admission and
/// `E <Unix ms>` at the end.
#[tokio::test]
async fn leased_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let (url, secs) = spec.split_once(' ').unwrap();
    let until = std::time::Instant::now() + Duration::from_secs_f64(secs.parse().unwrap());
    // A deadline a loaded machine does not reach: a grant answered late is still spent (its lease
    // ends with its window either way), where one past the default 50 ms would be lost, and the
    // windows after the kill would count it as a lease that never came back.
    let options = RedisOptions { deadline: Duration::from_secs(2), ..Default::default() };
    let redis = Redis::connect_with(url, options).await.unwrap();
    let limiter = LeasedLimiter::builder(&redis, "procs", Quota::per_second(PROCESS_LIMIT).unwrap()).build().unwrap();
    while std::time::Instant::now() < until {
        // Let the connection's task run between decisions that never wait (as I/O would).
        tokio::task::consume_budget().await;
        match limiter.try_acquire("hot", 1).await {
            Ok(lease) => println!("A {}", unix_ms() + lease.reset_after().as_millis() as u64),
            Err(rejected) if rejected.reason() == Reason::Unavailable => println!("F {}", unix_ms()),
            Err(_) => {}
        }
    }
    println!("E {}", unix_ms());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_admit_more_than_the_limit_and_a_killed_ones_lease_comes_back() {
    use std::process::{Command, Stdio};
    let server = RedisServer::start();
    let exe = std::env::current_exe().unwrap();
    // CI's short form; the full one is TOLLGATE_LEASED_PROCESSES=8 TOLLGATE_LEASED_SECONDS=20.
    let secs = std::env::var("TOLLGATE_LEASED_SECONDS").unwrap_or_else(|_| "4".into());
    let processes: usize = std::env::var("TOLLGATE_LEASED_PROCESSES").map_or(4, |n| n.parse().unwrap());
    let spawn = || {
        Command::new(&exe)
            .args(["leased_child_process", "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{} {secs}", server.url()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut children: Vec<_> = (0..processes).map(|_| spawn()).collect();
    // Kill one in the middle of its second window, holding whatever lease it holds.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    children[0].kill().unwrap();
    let killed_at = unix_ms();
    let outputs: Vec<String> =
        children.into_iter().map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()).collect();
    // Windows by when they end (each process's estimate is within a round trip of the others').
    let mut ends: Vec<u64> = Vec::new();
    let mut survivors_stopped = u64::MAX;
    let mut unanswered = 0;
    for line in outputs.iter().flat_map(|o| o.lines()) {
        match line.split_once(' ') {
            Some(("A", end)) => ends.push(end.parse().unwrap()),
            Some(("E", at)) => survivors_stopped = survivors_stopped.min(at.parse().unwrap()),
            Some(("F", _)) => unanswered += 1,
            _ => {}
        }
    }
    ends.sort_unstable();
    let mut windows: Vec<(u64, u64)> = Vec::new();
    for end in ends {
        match windows.last_mut() {
            Some((first, count)) if end - *first < 200 => *count += 1,
            _ => windows.push((end, 1)),
        }
    }
    eprintln!(
        "windows (end ms, admitted): {windows:?}; killed at {killed_at}, survivors stopped at {survivors_stopped}; \
         {unanswered} decisions Redis did not answer in time"
    );
    assert!(windows.len() >= 3, "{windows:?}");
    for (end, admitted) in &windows {
        assert!(*admitted <= PROCESS_LIMIT, "window ending {end}: {admitted} admitted, limit {PROCESS_LIMIT}");
    }
    // A window that opened after the kill and ended before the survivors stopped is used in full
    // (within 2 %): the killed process's lease ended with its window.
    let after: Vec<_> =
        windows.iter().filter(|(end, _)| end - 1_000 >= killed_at && *end <= survivors_stopped).collect();
    assert!(!after.is_empty(), "a whole window after the kill: {windows:?}, killed at {killed_at}");
    for (end, admitted) in after {
        assert!(*admitted >= PROCESS_LIMIT * 98 / 100, "window ending {end}: only {admitted} admitted ({windows:?})");
    }
}

/// Keys a client chooses cannot grow the state kept here past `max_key_bytes`: a new key past it
/// is decided in Redis alone, and every decision stays exact (each key's budget is spent once).
#[tokio::test]
async fn keys_past_the_byte_cap_are_decided_in_redis_and_nothing_is_kept() {
    let (_server, redis, clock) = setup().await;
    let cap = 4096;
    let limiter = LeasedLimiter::builder(&redis, "cap", Quota::per_minute(1).unwrap())
        .clock(clock.clone())
        .time(RedisTime::clock(clock.clone()))
        .max_key_bytes(cap)
        .build()
        .unwrap();
    for i in 0..100 {
        let key = format!("user-{i}-{}", "x".repeat(100));
        assert!(limiter.try_acquire(&key, 1).await.is_ok(), "key {i}");
        let again = limiter.try_acquire(&key, 1).await.unwrap_err();
        assert_eq!(again.reason(), Reason::Exhausted, "key {i}: spent, kept here or not");
        assert!(limiter.key_bytes() <= cap, "key {i}: {} bytes kept", limiter.key_bytes());
    }
    let kept = limiter.keys();
    assert!(kept > 0 && kept < 100, "{kept} keys kept");
    // A window later every key is idle: new ones find room again.
    clock.advance(Duration::from_secs(61));
    let key = format!("late-{}", "y".repeat(100));
    assert!(limiter.try_acquire(&key, 1).await.is_ok());
    assert!(limiter.held(&key) == 0 && limiter.keys() <= kept, "idle keys made room");
}
