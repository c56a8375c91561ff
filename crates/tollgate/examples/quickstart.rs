//! Quick start: a per-user token bucket in front of some work, and a concurrency cap with a
//! FIFO wait queue. Run with `cargo run --example quickstart`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Concurrency, Keyed, Limiter, Quota, TokenBucket};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 5 requests per second per user, bursts of up to 2.
    let per_user = Keyed::new(TokenBucket::new(Quota::per_second(5)?.with_burst(2)?));
    for attempt in 1..=4 {
        match per_user.try_acquire("alice", 1) {
            Ok(lease) => println!("alice #{attempt}: allowed, {} left", lease.remaining()),
            Err(no) => println!("alice #{attempt}: {} -> retry in {:?}", no.reason(), no.retry_after().unwrap()),
        }
    }

    // At most 2 jobs at once; the others wait their turn in order.
    let jobs = Arc::new(Limiter::builder(Concurrency::new(2)?).queue_limit(10).statistics(true).build());
    let start = Instant::now();
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let jobs = jobs.clone();
            tokio::spawn(async move {
                let _slot = jobs.acquire(1).await.expect("queue has room");
                tokio::time::sleep(Duration::from_millis(50)).await;
                println!("job {i} done at {:>3} ms", start.elapsed().as_millis());
            })
        })
        .collect();
    for h in handles {
        h.await?;
    }
    let stats = jobs.statistics();
    let (admitted, rejected) = (stats.admitted.unwrap_or(0), stats.rejected.unwrap_or(0));
    println!("concurrency: {admitted} admitted, {rejected} rejected");
    Ok(())
}
