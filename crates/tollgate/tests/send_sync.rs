//! Every limiter type can be shared between threads and tasks: checked at compile time.

use tollgate::{
    Chain, Concurrency, Decision, FixedWindow, IntervalBucket, Keyed, Lease, Limiter, ManualClock, Quota, Rejected,
    SlidingLog, SlidingWindow, SystemClock, TokenBucket, WeightedWindow,
};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn limiters_leases_and_clocks_are_send_and_sync() {
    send_sync::<Limiter<TokenBucket>>();
    send_sync::<Limiter<IntervalBucket, ManualClock>>();
    send_sync::<Limiter<FixedWindow>>();
    send_sync::<Limiter<SlidingWindow>>();
    send_sync::<Limiter<WeightedWindow>>();
    send_sync::<Limiter<SlidingLog>>();
    send_sync::<Limiter<Concurrency>>();
    send_sync::<Keyed<String, TokenBucket>>();
    send_sync::<Keyed<std::net::IpAddr, Concurrency, ManualClock>>();
    send_sync::<Chain<Limiter<TokenBucket>, Keyed<String, SlidingLog>>>();
    send_sync::<Lease>();
    send_sync::<Rejected>();
    send_sync::<Quota>();
    send_sync::<SystemClock>();
    send_sync::<ManualClock>();
    // A decision may be moved to another task while it is pending.
    send::<Decision>();
}
