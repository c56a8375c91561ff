//! Waking waiters: each [`super::RedisSemaphore`] value has one wake-up list in Redis and, while
//! any of its waiters waits, one task that blocks on it (`BLPOP` on a dedicated connection —
//! a blocking command on the shared multiplexed connection would stall every other request) and
//! wakes the waiter named by each entry.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::Inner;

/// How long one `BLPOP` blocks; the dispatcher stops at most this long after its last waiter.
const BLOCK: Duration = Duration::from_secs(1);
/// Extra time the client gives a `BLPOP` before treating the connection as dead.
const BLOCK_GRACE: Duration = Duration::from_secs(2);
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// A random id for one semaphore value in one process (part of every lease and waiter id).
pub(super) fn instance_id() -> String {
    let mut out = String::with_capacity(32);
    for salt in 0..2u8 {
        // RandomState is seeded from the OS and differs per call; pid and time make it unique
        // across processes even if two seeds met.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(salt);
        h.write_u32(std::process::id());
        h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// The local waiters of one semaphore value and its dispatcher.
#[derive(Default)]
pub(super) struct Wakeups {
    state: Mutex<WakeState>,
}

#[derive(Default)]
struct WakeState {
    waiters: HashMap<u64, Arc<Notify>>,
    /// The dispatcher task, if one was started (it may have died with its runtime).
    dispatcher: Option<JoinHandle<()>>,
    /// The dedicated connection, kept between waits, with the master generation it was opened in
    /// (see [`crate::Redis::client`]).
    conn: Option<(u64, MultiplexedConnection)>,
}

impl Wakeups {
    fn lock(&self) -> std::sync::MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One `acquire` call: registered for wake-ups from before its first script call (a wake-up that
/// comes before it waits is kept by its `Notify`). Dropped before being granted, it leaves the
/// Redis queue in the background.
pub(super) struct Waiter {
    inner: Arc<Inner>,
    n: u64,
    pub(super) id: String,
    notify: Arc<Notify>,
    armed: bool,
}

impl Waiter {
    pub(super) fn register(inner: Arc<Inner>) -> Waiter {
        let n = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        inner.wakeups.lock().waiters.insert(n, notify.clone());
        Waiter { id: inner.lease_id(n), inner, n, notify, armed: true }
    }

    /// Sleeps until woken or for `nap`, whichever is first.
    pub(super) async fn wait(&self, nap: Duration) {
        ensure_dispatcher(&self.inner);
        let _ = tokio::time::timeout(nap, self.notify.notified()).await;
    }

    /// The lease is ours: nothing to undo. Returns the lease id.
    pub(super) fn granted(&mut self) -> String {
        self.armed = false;
        std::mem::take(&mut self.id)
    }

    /// Leaves the queue now (max_wait passed). If Redis cannot be told, the place lapses after
    /// its heartbeat TTL.
    pub(super) async fn leave(&mut self) {
        self.armed = false;
        if let Err(error) = self.inner.release(&self.id).await {
            tracing::debug!(semaphore = %self.inner.name, %error, "could not leave the queue; the place lapses");
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.inner.wakeups.lock().waiters.remove(&self.n);
        if self.armed {
            self.inner.clone().release_in_background(std::mem::take(&mut self.id));
        }
    }
}

/// Starts the dispatcher unless it runs (needs a client, one server's or the Sentinel master's:
/// on a cluster the waiters' timers do all the waking).
fn ensure_dispatcher(inner: &Arc<Inner>) {
    if inner.redis.is_cluster() {
        return;
    }
    let mut state = inner.wakeups.lock();
    if state.dispatcher.as_ref().is_none_or(JoinHandle::is_finished) {
        state.dispatcher = Some(tokio::spawn(dispatch(inner.clone())));
    }
}

async fn dispatch(inner: Arc<Inner>) {
    let mut conn = inner.wakeups.lock().conn.take();
    let mut failures = 0u32;
    loop {
        {
            let mut state = inner.wakeups.lock();
            if state.waiters.is_empty() {
                state.dispatcher = None;
                state.conn = conn;
                return;
            }
        }
        // Opened before a failover, it reaches a replica, where no wake-up is ever pushed.
        if conn.as_ref().is_some_and(|(generation, _)| *generation != inner.redis.master_generation()) {
            conn = None;
        }
        let c = match conn.as_mut() {
            Some((_, c)) => c,
            None => match connect(&inner).await {
                Ok(c) => &mut conn.insert(c).1,
                Err(error) => {
                    failures += 1;
                    tracing::debug!(semaphore = %inner.name, %error, "wake-up connection failed; waiters fall back to timers");
                    tokio::time::sleep(backoff(failures)).await;
                    continue;
                }
            },
        };
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(&inner.wake_list).arg(BLOCK.as_secs_f64());
        let pop = cmd.query_async::<Option<(String, String)>>(c);
        match tokio::time::timeout(BLOCK + BLOCK_GRACE, pop).await {
            Ok(Ok(Some((_, n)))) => {
                failures = 0;
                let notify = n.parse().ok().and_then(|n: u64| inner.wakeups.lock().waiters.get(&n).cloned());
                if let Some(notify) = notify {
                    notify.notify_one();
                }
            }
            Ok(Ok(None)) => failures = 0,
            Ok(Err(error)) => {
                failures += 1;
                tracing::debug!(semaphore = %inner.name, %error, "wake-up BLPOP failed; reconnecting");
                conn = None;
                tokio::time::sleep(backoff(failures)).await;
            }
            Err(_) => {
                // A BLPOP may still be pending on that connection: never reuse it.
                failures += 1;
                conn = None;
            }
        }
    }
}

async fn connect(inner: &Inner) -> Result<(u64, MultiplexedConnection), redis::RedisError> {
    // Read before the client: a failover in between is then seen at the next round.
    let generation = inner.redis.master_generation();
    let client =
        inner.redis.client().ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no client")))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(inner.redis.options().connect_timeout))
        // BLPOP blocks: the call above has its own timeout.
        .set_response_timeout(None);
    Ok((generation, client.get_multiplexed_async_connection_with_config(&config).await?))
}

fn backoff(failures: u32) -> Duration {
    RECONNECT_MIN.saturating_mul(1 << failures.min(10)).min(RECONNECT_MAX)
}
