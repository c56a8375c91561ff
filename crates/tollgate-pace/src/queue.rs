//! The durable queue in front of the workers: a small [`Queue`] trait, and Redis Streams behind it.
//!
//! Delivery is at least once: an item is taken by one consumer of a group and stays pending until
//! it is acknowledged; a consumer that dies leaves it pending, and after `idle` another consumer
//! reclaims it (XAUTOCLAIM). An item that failed `max_attempts` times goes to the dead-letter
//! stream with its last error. Each item carries an idempotency key for the handler.

use std::future::Future;
use std::time::Duration;

use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use tollgate_redis::{BackendError, Keyspace, Redis};

use crate::{PaceError, QueueError};

/// One unit of work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The queue's id for it (a stream entry id).
    pub id: String,
    /// The idempotency key: the same for every delivery of this item.
    pub key: String,
    /// What to do, as the producer wrote it (JSON for `tollgate pump`).
    pub payload: String,
    /// Units it costs against the budget.
    pub cost: u64,
    /// Failed attempts so far.
    pub attempts: u64,
}

/// A durable queue with consumer groups.
pub trait Queue: Send + Sync + 'static {
    /// Adds an item; returns its id.
    fn enqueue(&self, key: &str, payload: &str, cost: u64) -> impl Future<Output = Result<String, PaceError>> + Send;
    /// Up to `max` items for `consumer`: first items other consumers left idle, then new ones.
    fn take(&self, consumer: &str, max: usize) -> impl Future<Output = Result<Vec<Item>, PaceError>> + Send;
    /// The item is done: it will not be delivered again.
    fn ack(&self, item: &Item) -> impl Future<Output = Result<(), PaceError>> + Send;
    /// The item failed; returns true when it went to the dead-letter queue (too many attempts).
    fn fail(&self, item: &Item, error: &str) -> impl Future<Output = Result<bool, PaceError>> + Send;
    /// Items not yet acknowledged or dead-lettered (queued + in flight).
    fn outstanding(&self) -> impl Future<Output = Result<u64, PaceError>> + Send;
}

/// [`Queue`] on a Redis stream with one consumer group, through a shared [`Redis`] connection
/// (one server or a Cluster; its back-off and error classification apply to every call).
///
/// Keys: the stream `{NAME}`, its failed-attempt counts `{NAME}:attempts` and its dead letters
/// `{NAME}:dead`. The name in braces is their Redis Cluster hash tag: acknowledging and
/// dead-lettering touch several of them in one atomic pipeline, which a Cluster runs only on
/// keys of one slot.
///
/// [`Queue::take`] never blocks in Redis (no `XREADGROUP ... BLOCK`): the connection is shared
/// with every other user of the [`Redis`] handle (rate-limit decisions, partitions), and a
/// blocking read would hold their commands up behind it. An empty queue is asked again after a
/// pause instead ([`PumpOptions::empty_poll`](crate::PumpOptions::empty_poll)).
#[derive(Clone)]
pub struct RedisStreams {
    /// The connection, with the queue's own deadline per call.
    redis: Redis,
    stream: String,
    attempts: String,
    dead: String,
    group: String,
    idle: Duration,
    max_attempts: u64,
}

impl std::fmt::Debug for RedisStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreams")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("idle", &self.idle)
            .field("max_attempts", &self.max_attempts)
            .field("deadline", &self.redis.deadline())
            .field("redis", &self.redis.url())
            .finish_non_exhaustive()
    }
}

impl RedisStreams {
    /// Longest one queue command waits for Redis unless [`RedisStreams::with_deadline`] says
    /// otherwise: longer than a rate-limit decision's deadline (a batch of items is read at
    /// once, and a worker that gives up ends its pump), shorter than `idle`.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);

    /// Opens (creating if needed) the stream of the queue `name` and its consumer group
    /// `workers`, on `redis`. Items idle for `idle` are reclaimed; an item failing
    /// `max_attempts` times goes to the dead-letter stream `{name}:dead`. Each call waits at
    /// most [`RedisStreams::DEFAULT_DEADLINE`], whatever `redis`'s own deadline.
    ///
    /// `idle` must be longer than an item can take from delivery to acknowledgement (its wait for
    /// the budget — the pump takes about half a second of work at a time — plus the handler's
    /// time): an item still being worked on after `idle` is delivered again (at least once), and
    /// the handler then sees its idempotency key twice.
    ///
    /// `name` is the keys' hash tag: non-empty, without `{` or `}` ([`QueueError::BadName`]).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate_pace::{Queue, RedisStreams};
    /// let redis = tollgate_redis::Redis::connect("redis://127.0.0.1:6379/").await?;
    /// let queue = RedisStreams::open(&redis, "orders", Duration::from_secs(30), 5).await?;
    /// queue.enqueue("order-1", r#"{"sku":42}"#, 1).await?;
    /// assert_eq!(queue.stream(), "{orders}");
    /// # Ok(()) }
    /// ```
    pub async fn open(redis: &Redis, name: &str, idle: Duration, max_attempts: u64) -> Result<RedisStreams, PaceError> {
        if !Keyspace::is_whole_tag(name) {
            return Err(QueueError::BadName { name: name.to_owned() }.into());
        }
        // No prefix: the stream is the tag alone, as deployed queues have it.
        let space = Keyspace::new("");
        let queue = RedisStreams {
            redis: redis.with_deadline(Self::DEFAULT_DEADLINE),
            attempts: space.key::<&str>(name, "attempts", &[]),
            dead: space.key::<&str>(name, "dead", &[]),
            stream: space.tag_key(name),
            group: "workers".into(),
            idle,
            max_attempts: max_attempts.max(1),
        };
        let mut create = redis::cmd("XGROUP");
        create.arg("CREATE").arg(&queue.stream).arg(&queue.group).arg("0").arg("MKSTREAM");
        match queue.redis.query::<()>(&create).await {
            Ok(()) => {}
            Err(BackendError::Redis(e)) if e.code() == Some("BUSYGROUP") => {}
            Err(source) => return Err(queue.err("create the consumer group")(source)),
        }
        Ok(queue)
    }

    /// The same queue, each of its calls waiting at most `deadline` for Redis (instead of
    /// [`RedisStreams::DEFAULT_DEADLINE`]); the connection and its back-off stay shared.
    ///
    /// ```no_run
    /// # async fn f(queue: tollgate_pace::RedisStreams) {
    /// let queue = queue.with_deadline(std::time::Duration::from_secs(5));
    /// # }
    /// ```
    pub fn with_deadline(mut self, deadline: Duration) -> RedisStreams {
        self.redis = self.redis.with_deadline(deadline);
        self
    }

    /// The stream's key (`{name}`).
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The dead-letter stream's key (`{name}:dead`).
    pub fn dead_letter_stream(&self) -> &str {
        &self.dead
    }

    /// `entries` as items, with their failed attempts (one round trip for all of them).
    async fn attempts(&self, entries: Vec<StreamId>) -> Result<Vec<Item>, PaceError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut read = redis::cmd("HMGET");
        read.arg(&self.attempts);
        for entry in &entries {
            read.arg(&entry.id);
        }
        let attempts: Vec<Option<u64>> = self.redis.query(&read).await.map_err(self.err("read the items' attempts"))?;
        Ok(entries
            .into_iter()
            .zip(attempts)
            .map(|(entry, attempts)| Item {
                key: entry.get("key").unwrap_or_else(|| entry.id.clone()),
                payload: entry.get("payload").unwrap_or_default(),
                cost: entry.get("cost").unwrap_or(1),
                attempts: attempts.unwrap_or(0),
                id: entry.id,
            })
            .collect())
    }

    /// Adds to `pipe` what takes `item` out of the queue for good: acknowledged, deleted, its
    /// attempts forgotten.
    fn finish(&self, pipe: &mut redis::Pipeline, item: &Item) {
        pipe.cmd("XACK").arg(&self.stream).arg(&self.group).arg(&item.id).ignore();
        pipe.cmd("XDEL").arg(&self.stream).arg(&item.id).ignore();
        pipe.cmd("HDEL").arg(&self.attempts).arg(&item.id).ignore();
    }

    /// A failed command on this stream, as a [`PaceError::Queue`].
    fn err(&self, action: &'static str) -> impl FnOnce(BackendError) -> PaceError + '_ {
        move |source| QueueError::Command { action, stream: self.stream.clone(), source }.into()
    }
}

impl Queue for RedisStreams {
    async fn enqueue(&self, key: &str, payload: &str, cost: u64) -> Result<String, PaceError> {
        let mut add = redis::cmd("XADD");
        add.arg(&self.stream).arg("*").arg("key").arg(key).arg("payload").arg(payload).arg("cost").arg(cost);
        self.redis.query(&add).await.map_err(self.err("add an item"))
    }

    async fn take(&self, consumer: &str, max: usize) -> Result<Vec<Item>, PaceError> {
        let idle_ms = u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX);
        let mut reclaim = redis::cmd("XAUTOCLAIM");
        reclaim.arg(&self.stream).arg(&self.group).arg(consumer).arg(idle_ms).arg("0-0").arg("COUNT").arg(max);
        let claimed: StreamAutoClaimReply = self.redis.query(&reclaim).await.map_err(self.err("reclaim idle items"))?;
        if !claimed.claimed.is_empty() {
            return self.attempts(claimed.claimed).await;
        }
        // No BLOCK: see the type's docs.
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(max)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">");
        let read: Option<StreamReadReply> = self.redis.query(&read).await.map_err(self.err("read new items"))?;
        let entries = read.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
        self.attempts(entries).await
    }

    async fn ack(&self, item: &Item) -> Result<(), PaceError> {
        let mut pipe = redis::pipe();
        self.finish(pipe.atomic(), item);
        self.redis.pipeline(&pipe).await.map_err(self.err("acknowledge an item"))
    }

    async fn fail(&self, item: &Item, error: &str) -> Result<bool, PaceError> {
        let mut count = redis::cmd("HINCRBY");
        count.arg(&self.attempts).arg(&item.id).arg(1);
        let attempts: u64 = self.redis.query(&count).await.map_err(self.err("count a failed attempt"))?;
        if attempts < self.max_attempts {
            // Left pending: reclaimed after `idle` by whichever consumer asks first.
            return Ok(false);
        }
        // In one transaction with the acknowledgement: an item is dead-lettered once, never both
        // dead-lettered and delivered again.
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("XADD").arg(&self.dead).arg("*");
        pipe.arg("key").arg(&item.key).arg("payload").arg(&item.payload).arg("cost").arg(item.cost);
        pipe.arg("attempts").arg(attempts).arg("error").arg(error).ignore();
        self.finish(&mut pipe, item);
        self.redis.pipeline::<()>(&pipe).await.map_err(self.err("dead-letter an item"))?;
        Ok(true)
    }

    async fn outstanding(&self) -> Result<u64, PaceError> {
        self.redis.query(redis::cmd("XLEN").arg(&self.stream)).await.map_err(self.err("count the items"))
    }
}
