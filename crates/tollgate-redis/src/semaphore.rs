//! [`RedisSemaphore`]: a FIFO counting semaphore shared by any number of processes.
//!
//! State, all under the hash tag `{name}` (so it works on Redis Cluster):
//!
//! - `tollgate:semaphore:{name}:holders` — sorted set of lease ids scored by their expiry (µs of
//!   Redis `TIME`). Every script purges expired leases before counting, so a holder that dies
//!   frees its slot when its lease expires.
//! - `…:tokens` — lease id → fencing token; `…:fence` — the counter tokens and tickets come from.
//! - `…:queue` — waiter ids scored by ticket (FIFO); `…:waiters` — their heartbeat expiry, so a
//!   waiter that dies leaves the queue instead of blocking it.
//! - `…:wake:<instance>` — one wake-up list per [`RedisSemaphore`] value: a script that frees a
//!   slot pushes the waiters now entitled to it there; one task per value blocks on it (`BLPOP`
//!   on its own connection, never the shared one) and wakes the local waiter.
//!
//! Every key expires with the last lease or heartbeat in it; with no holder and no waiter the
//! semaphore leaves nothing behind.

mod guard;
mod turn;
mod wake;

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use redis::Script;
use tollgate::{Meta, Reason, Rejected};

pub use guard::SemaphoreGuard;

use crate::backend::Redis;
use crate::error::BackendError;
use crate::keyspace::Keyspace;

macro_rules! semaphore_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../scripts/semaphore_lib.lua"),
                include_str!(concat!("../scripts/", $file))
            ))
        })
    };
}

static ACQUIRE: LazyLock<Script> = semaphore_script!("semaphore_acquire.lua");
static RENEW: LazyLock<Script> = semaphore_script!("semaphore_renew.lua");
static RELEASE: LazyLock<Script> = semaphore_script!("semaphore_release.lua");
static STATE: LazyLock<Script> = semaphore_script!("semaphore_state.lua");

/// Where every semaphore's keys are (its name is their tag).
const SEMAPHORE_PREFIX: &str = "tollgate:semaphore:";

/// A semaphore that cannot be built, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreConfigError {
    /// A semaphore needs at least one slot.
    #[error("semaphore {name:?}: capacity must be at least 1")]
    ZeroCapacity {
        /// The semaphore's name.
        name: String,
    },
    /// The name is the Redis Cluster hash tag of every key: it must be non-empty and free of braces.
    #[error("semaphore name {name:?} must be non-empty and contain no '{{' or '}}' (it is the keys' hash tag)")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// The lease TTL is shorter than [`RedisSemaphore::MIN_LEASE_TTL`].
    #[error("semaphore {name:?}: lease TTL {ttl:?} is shorter than the minimum {:?}", RedisSemaphore::MIN_LEASE_TTL)]
    TtlTooShort {
        /// The semaphore's name.
        name: String,
        /// The TTL as given.
        ttl: Duration,
    },
}

/// Builds a [`RedisSemaphore`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until .build()"]
pub struct RedisSemaphoreBuilder {
    redis: Redis,
    name: String,
    capacity: u64,
    lease_ttl: Duration,
    max_wait: Option<Duration>,
}

impl RedisSemaphoreBuilder {
    /// How long a lease lives without renewal (default [`RedisSemaphore::DEFAULT_LEASE_TTL`], 10 s). The guard
    /// renews it every TTL/3 while held; a holder that dies frees its slot at most one TTL after
    /// its last renewal. See [`RedisSemaphore`] for the trade-off.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Longest [`RedisSemaphore::acquire`] waits (default: unbounded); after it the caller is
    /// rejected with [`Reason::MaxWait`] and leaves the queue, having taken nothing.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The semaphore.
    pub fn build(self) -> Result<RedisSemaphore, SemaphoreConfigError> {
        let name = self.name;
        if !Keyspace::is_whole_tag(&name) {
            return Err(SemaphoreConfigError::BadName { name });
        }
        if self.capacity == 0 {
            return Err(SemaphoreConfigError::ZeroCapacity { name });
        }
        if self.lease_ttl < RedisSemaphore::MIN_LEASE_TTL {
            return Err(SemaphoreConfigError::TtlTooShort { name, ttl: self.lease_ttl });
        }
        let space = Keyspace::new(SEMAPHORE_PREFIX);
        let keys =
            ["holders", "tokens", "queue", "waiters", "fence"].map(|k| space.key::<&str>(&name, k, &[])).to_vec();
        let instance = wake::instance_id();
        Ok(RedisSemaphore {
            inner: Arc::new(Inner {
                // Scripts append an instance to the prefix, so these two keep the plain layout.
                wake_list: space.plain_key(&name, &["wake", &instance]),
                wake_prefix: space.plain_key(&name, &["wake", ""]),
                redis: self.redis,
                name,
                keys,
                instance,
                capacity: self.capacity,
                lease_ttl: self.lease_ttl,
                max_wait: self.max_wait,
                next_id: AtomicU64::new(0),
                wakeups: wake::Wakeups::default(),
                turnstile: Arc::default(),
                warm: AtomicBool::new(false),
            }),
        })
    }
}

/// A counting semaphore in Redis: at most `capacity` holders at any instant across every process
/// that uses the same name, granted first come, first served.
///
/// [`acquire`](RedisSemaphore::acquire) returns a [`SemaphoreGuard`] with a fencing token; the
/// guard renews its lease in the background and releases it when dropped (or by
/// [`release`](SemaphoreGuard::release)).
///
/// # The lease TTL: crash recovery against long critical sections
///
/// Each slot is a lease that expires `lease_ttl` after its last renewal, measured by Redis's own
/// clock. A holder killed with SIGKILL (or partitioned away from Redis) stops renewing, and its
/// slot returns to the others at most one TTL after the kill (plus a round trip) — so the TTL is
/// the longest the others may have to wait for a dead holder. A short TTL recovers quickly; a long
/// one survives longer stalls.
///
/// The critical section itself may take any time: the guard renews every TTL/3. What the TTL must
/// outlast is a *stall* of the holder: a paused VM, a blocked async runtime, a GC pause, or Redis
/// unreachable. A stall of up to TTL − TTL/3 is always survived (a renewal lands before the
/// lease expires); a longer one may let the lease expire, another process take the slot, and the
/// guard report itself lost ([`SemaphoreGuard::is_lost`], [`SemaphoreGuard::lost`]) at its next
/// renewal, which Redis refuses — a lease is never revived. So a stalled holder may still be
/// running its critical section when the next one starts: work that must not overlap should pass
/// [`SemaphoreGuard::fencing_token`] to the resource it protects, which rejects tokens older than
/// the newest it has seen.
///
/// Rule of thumb: TTL ≥ 2 × the longest stall you expect, and no longer than the others can afford
/// to wait after a crash. The default, 10 s, renews every 3.3 s and frees a dead holder's slot
/// within 10 s.
///
/// # Waiting
///
/// Waiters queue in Redis in arrival order; a waiter takes a slot only when fewer waiters are ahead
/// of it than there are free slots, so nobody jumps the queue — not even
/// [`try_acquire`](RedisSemaphore::try_acquire). Whoever frees a slot pushes a wake-up for the
/// waiter entitled to it; each `RedisSemaphore` value has one task that waits for these with a
/// blocking pop on its own connection (opened from [`Redis::client`] on the first wait and kept
/// for the next), so a waiter is woken within a round trip, without polling. Waiters also send a
/// heartbeat every TTL/3 (their place expires one TTL after the last, so a dead waiter never
/// blocks the queue for longer) and re-check when the next lease or place would expire, which is
/// how a slot freed by an expiry is noticed. On Redis Cluster ([`Redis::client`] is `None`) only
/// these timers wake waiters, so a release reaches them up to TTL/3 late.
///
/// # Failures
///
/// A Redis failure is never reported as "limited": [`acquire`](RedisSemaphore::acquire) and
/// [`try_acquire`](RedisSemaphore::try_acquire) return [`Reason::Unavailable`] (the error is logged
/// at WARN and shown by [`Redis::last_error`]), waiting stops with [`Reason::MaxWait`], a full
/// semaphore is [`Reason::Exhausted`]. Nothing is held after a rejection: an attempt whose answer
/// was lost is released in the background.
///
/// All users of a name must agree on its capacity (each call passes it).
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate_redis::{Redis, RedisSemaphore};
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = Redis::connect("redis://127.0.0.1/").await?;
/// // At most 3 exports at a time, across every replica.
/// let exports = RedisSemaphore::builder(&redis, "exports", 3)
///     .lease_ttl(Duration::from_secs(10))
///     .max_wait(Duration::from_secs(30))
///     .build()?;
/// match exports.acquire().await {
///     Ok(guard) => {
///         // Pass the token to storage that rejects stale writers.
///         println!("exporting with fencing token {}", guard.fencing_token());
///         // ... the work ...
///         if guard.is_lost() {
///             eprintln!("lease lost mid-way (stalled longer than the TTL)");
///         }
///         guard.release().await?;
///     }
///     Err(no) => eprintln!("not now: {}", no.reason()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisSemaphore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    redis: Redis,
    name: String,
    keys: Vec<String>,
    /// This value's own wake-up list, and the prefix scripts append an instance to.
    wake_list: String,
    wake_prefix: String,
    instance: String,
    capacity: u64,
    lease_ttl: Duration,
    max_wait: Option<Duration>,
    next_id: AtomicU64,
    wakeups: wake::Wakeups,
    turnstile: Arc<turn::Turnstile>,
    /// A script call succeeded since the last failure: the scripts are loaded, so first attempts
    /// may be pipelined in call order.
    warm: AtomicBool,
}

/// How many hold a slot and how many wait, as Redis sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemaphoreState {
    /// The semaphore's capacity.
    pub capacity: u64,
    /// Live leases (expired ones are not counted).
    pub holders: u64,
    /// Waiters in the queue.
    pub waiting: u64,
}

impl SemaphoreState {
    /// Slots free now (some may be promised to queued waiters).
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.holders)
    }
}

enum Attempt {
    Granted { token: u64, meta: Meta },
    Waiting { next_change: Duration },
}

impl RedisSemaphore {
    /// The default lease TTL.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    /// The shortest lease TTL accepted (renewed every TTL/3, each renewal a round trip).
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(30);

    /// Starts a semaphore of `capacity` slots named `name` (shared by every process using the name).
    pub fn builder(redis: &Redis, name: &str, capacity: u64) -> RedisSemaphoreBuilder {
        RedisSemaphoreBuilder {
            redis: redis.clone(),
            name: name.to_owned(),
            capacity,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            max_wait: None,
        }
    }

    /// A semaphore with the default lease TTL and no `max_wait`.
    pub fn new(redis: &Redis, name: &str, capacity: u64) -> Result<RedisSemaphore, SemaphoreConfigError> {
        Self::builder(redis, name, capacity).build()
    }

    /// The name (the hash tag of its keys).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Most holders at once.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// How long a lease lives without renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl
    }

    /// Longest [`acquire`](RedisSemaphore::acquire) waits.
    pub fn max_wait(&self) -> Option<Duration> {
        self.inner.max_wait
    }

    /// Takes a slot now if one is free and no queued waiter is entitled to it; otherwise rejects
    /// with [`Reason::Exhausted`] ([`Reason::Unavailable`] when Redis fails). Never waits.
    pub async fn try_acquire(&self) -> Result<SemaphoreGuard, Rejected> {
        let inner = &self.inner;
        let id = inner.new_id();
        let sent = Instant::now();
        match inner.attempt(&id, false).await {
            Ok(Attempt::Granted { token, meta }) => Ok(SemaphoreGuard::new(inner.clone(), id, token, meta, sent)),
            Ok(Attempt::Waiting { .. }) => Err(inner.rejected(Reason::Exhausted)),
            Err(error) => {
                // The script may have run and granted before the answer was lost: give it back.
                inner.clone().release_in_background(id);
                Err(inner.unavailable(&error))
            }
        }
    }

    /// Waits for a slot, first come first served across processes, for at most `max_wait`.
    ///
    /// The call takes its place in line when it is made, not when the future is first polled:
    /// calls on one `RedisSemaphore` value join the Redis queue in the order they were made (so
    /// FIFO holds within a process however its tasks are scheduled), and the queue in Redis orders
    /// them with every other process's.
    ///
    /// Rejects with [`Reason::MaxWait`] when `max_wait` passes (having left the queue and taken
    /// nothing), or [`Reason::Unavailable`] when Redis fails. Dropping the future leaves the queue.
    pub fn acquire(&self) -> impl Future<Output = Result<SemaphoreGuard, Rejected>> + Send + use<> {
        let inner = self.inner.clone();
        let ticket = inner.turnstile.ticket();
        let deadline = inner.max_wait.map(|d| Instant::now() + d);
        async move {
            let mut ticket = Some(ticket);
            let mut waiter = wake::Waiter::register(inner.clone());
            loop {
                let sent = Instant::now();
                let attempt = match ticket.take() {
                    None => inner.attempt(&waiter.id, true).await,
                    Some(ticket) => {
                        ticket.wait().await;
                        let mut call = std::pin::pin!(inner.attempt(&waiter.id, true));
                        // Once the scripts are known loaded, one poll puts the request in the
                        // connection's FIFO queue and the next call in line may send its own
                        // without waiting for our answer. Before that (and after a failure) we
                        // wait for it: a NOSCRIPT re-send would land behind later calls.
                        let first = if inner.warm.load(Ordering::Acquire) {
                            std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await
                        } else {
                            Poll::Ready(call.as_mut().await)
                        };
                        drop(ticket);
                        match first {
                            Poll::Ready(answer) => answer,
                            Poll::Pending => call.await,
                        }
                    }
                };
                let next_change = match attempt {
                    Ok(Attempt::Granted { token, meta }) => {
                        let id = waiter.granted();
                        return Ok(SemaphoreGuard::new(inner.clone(), id, token, meta, sent));
                    }
                    Ok(Attempt::Waiting { next_change }) => next_change,
                    // The waiter leaves the queue (and returns anything granted) when dropped.
                    Err(error) => return Err(inner.unavailable(&error)),
                };
                let now = Instant::now();
                let mut nap = inner.heartbeat().min(next_change);
                if let Some(deadline) = deadline {
                    if now >= deadline {
                        waiter.leave().await;
                        return Err(inner.rejected(Reason::MaxWait));
                    }
                    nap = nap.min(deadline - now);
                }
                waiter.wait(nap).await;
            }
        }
    }

    /// Holders and waiters now (expired leases are purged first).
    pub async fn state(&self) -> Result<SemaphoreState, BackendError> {
        let i = &self.inner;
        let args = [i.capacity.to_string(), ms(i.waiter_ttl()), i.wake_prefix.clone()];
        let reply: Vec<i64> = i.redis.invoke(&STATE, &i.keys, &args).await?;
        let get = |k: usize| reply.get(k).copied().unwrap_or(0).max(0) as u64;
        Ok(SemaphoreState { capacity: i.capacity, holders: get(0), waiting: get(1) })
    }
}

impl std::fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.inner.name)
            .field("capacity", &self.inner.capacity)
            .field("lease_ttl", &self.inner.lease_ttl)
            .field("max_wait", &self.inner.max_wait)
            .finish_non_exhaustive()
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

impl Inner {
    fn new_id(&self) -> String {
        self.lease_id(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn lease_id(&self, n: u64) -> String {
        format!("{}:{n}", self.instance)
    }

    /// A waiter's heartbeat interval, and a guard's renewal interval.
    fn heartbeat(&self) -> Duration {
        self.lease_ttl / 3
    }

    /// A waiter's place lapses this long after its last heartbeat.
    fn waiter_ttl(&self) -> Duration {
        self.lease_ttl
    }

    fn rejected(&self, reason: Reason) -> Rejected {
        Rejected::new(Meta { limit: self.capacity, remaining: 0, reset_ns: 0, retry_ns: None }, 1, reason)
    }

    fn unavailable(&self, error: &BackendError) -> Rejected {
        tracing::warn!(semaphore = %self.name, %error, "redis failed; semaphore rejects as unavailable");
        self.rejected(Reason::Unavailable)
    }

    async fn attempt(&self, id: &str, wait: bool) -> Result<Attempt, BackendError> {
        let args = [
            id.to_owned(),
            self.capacity.to_string(),
            ms(self.lease_ttl),
            u8::from(wait).to_string(),
            ms(self.waiter_ttl()),
            self.wake_prefix.clone(),
        ];
        let reply = self.redis.invoke::<Vec<i64>>(&ACQUIRE, &self.keys, &args).await;
        // A failure may be a restart that flushed the scripts.
        self.warm.store(reply.is_ok(), Ordering::Release);
        let reply = reply?;
        let get = |k: usize| reply.get(k).copied().unwrap_or(0).max(0) as u64;
        if get(0) == 1 {
            let remaining = self.capacity.saturating_sub(get(2) + get(3));
            let retry_ns = (remaining > 0).then_some(0);
            Ok(Attempt::Granted {
                token: get(1),
                meta: Meta { limit: self.capacity, remaining, reset_ns: 0, retry_ns },
            })
        } else {
            let next_change = match get(4) {
                0 => Duration::MAX,
                // Just after the expiry, so the purge sees it.
                us => Duration::from_micros(us) + Duration::from_millis(1),
            };
            Ok(Attempt::Waiting { next_change })
        }
    }

    /// `Ok(true)` when the lease was renewed, `Ok(false)` when it is gone.
    async fn renew(&self, id: &str) -> Result<bool, BackendError> {
        let args = [
            id.to_owned(),
            self.capacity.to_string(),
            ms(self.lease_ttl),
            ms(self.waiter_ttl()),
            self.wake_prefix.clone(),
        ];
        let reply: Vec<i64> = self.redis.invoke(&RENEW, &self.keys, &args).await?;
        Ok(reply.first() == Some(&1))
    }

    /// Releases a lease or leaves the queue; `Ok(true)` when `id` was holding a live lease.
    async fn release(&self, id: &str) -> Result<bool, BackendError> {
        let args = [id.to_owned(), self.capacity.to_string(), ms(self.waiter_ttl()), self.wake_prefix.clone()];
        let reply: Vec<i64> = self.redis.invoke(&RELEASE, &self.keys, &args).await?;
        Ok(reply.first() == Some(&1))
    }

    /// For drops (which cannot await). Without a runtime nothing is sent and the lease or queue
    /// place lapses at its TTL.
    fn release_in_background(self: Arc<Self>, id: String) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(error) = self.release(&id).await {
                    tracing::debug!(semaphore = %self.name, %error, "release failed; the lease lapses at its TTL");
                }
            });
        }
    }
}
