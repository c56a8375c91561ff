//! Takes tokens from the token bucket a Python `tollgate.TokenBucket(name, capacity,
//! refill_frequency, refill_amount)` uses, and prints how many were granted — the Rust side of
//! the test that Rust and Python processes share one limit.
//!
//! ```text
//! cargo run -p tollgate-redis --example shared_bucket -- URL NAME CAPACITY REFILL_FREQUENCY REFILL_AMOUNT TAKE
//! ```

use std::time::Duration;

use tollgate::Quota;
use tollgate_redis::{AlgorithmKind, Redis, RedisLimiter};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, capacity, frequency, amount, take] = args.as_slice() else {
        return Err("usage: shared_bucket URL NAME CAPACITY REFILL_FREQUENCY REFILL_AMOUNT TAKE".into());
    };
    let quota =
        Quota::per(Duration::from_secs_f64(frequency.parse()?), amount.parse()?)?.with_burst(capacity.parse()?)?;
    let redis = Redis::connect(url).await?;
    // The same prefix and limit name as the Python TokenBucket; the bucket's name is the key.
    let bucket =
        RedisLimiter::builder(&redis, "tollgate", AlgorithmKind::TokenBucket).limit("token_bucket", quota).build()?;
    let mut granted = 0;
    for _ in 0..take.parse::<u64>()? {
        if bucket.try_acquire(name, 1).await.is_ok() {
            granted += 1;
        }
    }
    println!("{granted}");
    Ok(())
}
