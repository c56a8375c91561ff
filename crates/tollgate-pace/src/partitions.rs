//! Capacity partitions leased through Redis, with no coordinator.
//!
//! The global budget is split into `P` partitions, each a permit of a [`RedisSemaphore`] of
//! capacity `P`: a lease in a sorted set scored by its expiry (Redis `TIME`), renewed in the
//! background while the worker lives, with a fencing token. A worker takes up to `want` free
//! partitions and sets its pacer's ceiling to `held × budget / P`; it looks for more every
//! `poll`, so workers started later take what is free and a dead worker's partitions, free again
//! once their lease lapses (`lease_ttl`), are picked up within `lease_ttl + poll`. Since a lease is
//! held by one worker at a time, what the live workers may spend adds up to at most the budget.
//!
//! [`RedisSemaphore`]: tollgate_redis::RedisSemaphore

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::Clock;
use tollgate_redis::{Redis, RedisSemaphore, SemaphoreGuard};

use crate::{Budget, PaceError, Pacer};

/// Builds [`Partitions`].
#[derive(Debug)]
#[must_use = "a builder does nothing until .join()"]
pub struct PartitionsBuilder {
    redis: Redis,
    name: String,
    partitions: u64,
    budget: Budget,
    want: u64,
    lease_ttl: Duration,
    poll: Duration,
}

impl PartitionsBuilder {
    /// The most partitions this worker holds (default: all of them).
    pub fn want(mut self, partitions: u64) -> Self {
        self.want = partitions;
        self
    }

    /// How long a partition stays leased to a worker that stopped renewing (died): the time until
    /// others may use it (default 5 s).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How often to look for free partitions and lost leases (default 500 ms).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// Takes the free partitions (up to `want`) for `pacer` and keeps doing so in the background.
    /// Needs a tokio runtime.
    pub async fn join<C: Clock>(self, pacer: Arc<Pacer<C>>) -> Result<Partitions, PaceError> {
        if self.partitions == 0 {
            return Err(PaceError::config("partitions", "at least 1", self.partitions));
        }
        if self.want == 0 {
            return Err(PaceError::config("want", "at least 1", self.want));
        }
        let semaphore =
            RedisSemaphore::builder(&self.redis, &self.name, self.partitions).lease_ttl(self.lease_ttl).build()?;
        let shared = Arc::new(Shared {
            semaphore,
            held: Mutex::new(Vec::new()),
            want: self.want.min(self.partitions) as usize,
            share: self.budget.share(self.partitions),
        });
        shared.top_up(&*pacer).await;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = {
            let shared = shared.clone();
            let poll = self.poll;
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(poll) => {}
                        // Only ever set to true (or dropped): any change means stop.
                        _ = stopped.changed() => return,
                    }
                    shared.top_up(&*pacer).await;
                }
            })
        };
        Ok(Partitions { shared, stop, task: Some(task) })
    }
}

#[derive(Debug)]
struct Shared {
    semaphore: RedisSemaphore,
    held: Mutex<Vec<SemaphoreGuard>>,
    want: usize,
    share: f64,
}

impl Shared {
    /// Drops lost leases, takes free partitions up to `want`, sets the pacer's ceiling.
    async fn top_up<C: Clock>(&self, pacer: &Pacer<C>) {
        let mut have = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|g| !g.is_lost());
            held.len()
        };
        let mut taken = Vec::new();
        while have < self.want {
            match self.semaphore.try_acquire().await {
                Ok(guard) => {
                    taken.push(guard);
                    have += 1;
                }
                Err(_) => break,
            }
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.extend(taken);
        pacer.set_ceiling(held.len() as f64 * self.share);
    }
}

/// The partitions a worker holds; released when dropped (or by [`Partitions::leave`]).
#[must_use = "the partitions are released when this is dropped; keep it for as long as the worker runs"]
pub struct Partitions {
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Partitions {
    /// Starts building: `partitions` shares of `budget`, named `name` in Redis.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_pace::PaceError> {
    /// use std::sync::Arc;
    /// use tollgate_pace::{Budget, Pacer, Partitions};
    /// let budget = Budget::per_second(500)?;
    /// let pacer = Arc::new(Pacer::builder(budget).build()?);
    /// let redis = tollgate_redis::Redis::connect("redis://127.0.0.1:6379").await?;
    /// let partitions = Partitions::builder(&redis, "cosmos-ingest", 20, budget).want(4).join(pacer.clone()).await?;
    /// println!("holding {} partitions: {} units/s", partitions.held(), pacer.ceiling());
    /// # Ok(()) }
    /// ```
    pub fn builder(redis: &Redis, name: &str, partitions: u64, budget: Budget) -> PartitionsBuilder {
        PartitionsBuilder {
            redis: redis.clone(),
            name: name.to_string(),
            partitions,
            budget,
            want: partitions,
            lease_ttl: Duration::from_secs(5),
            poll: Duration::from_millis(500),
        }
    }

    /// Partitions held now (leases found lost are dropped at the next poll).
    pub fn held(&self) -> usize {
        let held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().filter(|g| !g.is_lost()).count()
    }

    /// The fencing tokens of the leases held: a downstream that remembers the highest token per
    /// partition can refuse a worker whose lease was taken over.
    pub fn fencing_tokens(&self) -> Vec<u64> {
        let held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().map(SemaphoreGuard::fencing_token).collect()
    }

    /// Stops looking for partitions and releases those held.
    pub async fn leave(mut self) -> Result<(), PaceError> {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let held: Vec<SemaphoreGuard> =
            std::mem::take(&mut *self.shared.held.lock().unwrap_or_else(|e| e.into_inner()));
        for guard in held {
            guard.release().await?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Partitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitions")
            .field("semaphore", &self.shared.semaphore)
            .field("want", &self.shared.want)
            .field("share", &self.shared.share)
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
