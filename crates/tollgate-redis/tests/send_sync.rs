//! Compile-time check: the limiters, the semaphore and what they hand out can be shared across
//! threads and tasks (they live in `Arc`s behind web servers and are moved into spawned tasks).

use tollgate_redis::{
    BackendError, FailurePolicy, Redis, RedisLimiter, RedisLimiterBuilder, RedisOptions, RedisSemaphore,
    RedisSemaphoreBuilder, SemaphoreGuard, SemaphoreState,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn public_types_are_send_and_sync() {
    assert_send_sync::<Redis>();
    assert_send_sync::<RedisOptions>();
    assert_send_sync::<RedisLimiter>();
    assert_send_sync::<RedisLimiterBuilder>();
    assert_send_sync::<FailurePolicy>();
    assert_send_sync::<RedisSemaphore>();
    assert_send_sync::<RedisSemaphoreBuilder>();
    assert_send_sync::<SemaphoreGuard>();
    assert_send_sync::<SemaphoreState>();
    assert_send_sync::<BackendError>();
}
