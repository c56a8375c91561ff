//! The durable queue in front of the workers: a small [`Queue`] trait, and Redis Streams behind it.
//!
//! Delivery is at least once: an item is taken by one consumer of a group and stays pending until
//! it is acknowledged; a consumer that dies leaves it pending, and after `idle` another consumer
//! reclaims it (XAUTOCLAIM). An item that failed `max_attempts` times goes to the dead-letter
//! stream with its last error. Each item carries an idempotency key for the handler.

use std::future::Future;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

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

/// [`Queue`] on a Redis stream with one consumer group.
#[derive(Clone)]
pub struct RedisStreams {
    conn: MultiplexedConnection,
    stream: String,
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
            .finish_non_exhaustive()
    }
}

impl RedisStreams {
    /// Opens (creating if needed) the stream `name` and its consumer group `workers`. Items idle
    /// for `idle` are reclaimed; an item failing `max_attempts` times goes to `{name}:dead`.
    ///
    /// `idle` must be longer than an item can take from delivery to acknowledgement (its wait for
    /// the budget — the pump takes about half a second of work at a time — plus the handler's time): an item still being worked on after `idle` is
    /// delivered again (at least once), and the handler then sees its idempotency key twice.
    ///
    /// Errors show the URL without credentials.
    pub async fn open(url: &str, name: &str, idle: Duration, max_attempts: u64) -> Result<RedisStreams, PaceError> {
        let shown = || tollgate_redis::redact_url(url);
        let client = redis::Client::open(url).map_err(|source| QueueError::InvalidUrl { url: shown(), source })?;
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| QueueError::ConnectTimeout { url: shown(), after: CONNECT_TIMEOUT })?
            .map_err(|source| QueueError::Connect { url: shown(), source })?;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(name)
            .arg("workers")
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(source) => {
                let action = "create the consumer group";
                return Err(QueueError::Command { action, stream: name.to_owned(), source }.into());
            }
        }
        Ok(RedisStreams {
            conn,
            stream: name.to_string(),
            group: "workers".into(),
            idle,
            max_attempts: max_attempts.max(1),
        })
    }

    /// The dead-letter stream's name.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}:dead", self.stream)
    }

    fn attempts_key(&self) -> String {
        format!("{}:attempts", self.stream)
    }

    async fn attempts(&self, entries: Vec<StreamId>) -> Result<Vec<Item>, PaceError> {
        let mut conn = self.conn.clone();
        let mut items = Vec::with_capacity(entries.len());
        for entry in entries {
            let attempts: Option<u64> =
                conn.hget(self.attempts_key(), &entry.id).await.map_err(self.err("read an item's attempts"))?;
            items.push(Item {
                key: entry.get("key").unwrap_or_else(|| entry.id.clone()),
                payload: entry.get("payload").unwrap_or_default(),
                cost: entry.get("cost").unwrap_or(1),
                attempts: attempts.unwrap_or(0),
                id: entry.id,
            });
        }
        Ok(items)
    }
}

/// Longest [`RedisStreams::open`] waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisStreams {
    /// A failed command on this stream, as a [`PaceError::Queue`].
    fn err(&self, action: &'static str) -> impl FnOnce(redis::RedisError) -> PaceError + '_ {
        move |source| QueueError::Command { action, stream: self.stream.clone(), source }.into()
    }
}

impl Queue for RedisStreams {
    async fn enqueue(&self, key: &str, payload: &str, cost: u64) -> Result<String, PaceError> {
        let mut conn = self.conn.clone();
        let fields = [("key", key.to_string()), ("payload", payload.to_string()), ("cost", cost.to_string())];
        conn.xadd(&self.stream, "*", &fields).await.map_err(self.err("add an item"))
    }

    async fn take(&self, consumer: &str, max: usize) -> Result<Vec<Item>, PaceError> {
        let mut conn = self.conn.clone();
        let idle_ms = self.idle.as_millis() as u64;
        let claimed: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(consumer)
            .arg(idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(max)
            .query_async(&mut conn)
            .await
            .map_err(self.err("reclaim idle items"))?;
        if !claimed.claimed.is_empty() {
            return self.attempts(claimed.claimed).await;
        }
        let read: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(max)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .map_err(self.err("read new items"))?;
        let entries = read.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
        self.attempts(entries).await
    }

    async fn ack(&self, item: &Item) -> Result<(), PaceError> {
        let mut conn = self.conn.clone();
        redis::pipe()
            .atomic()
            .cmd("XACK")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&item.id)
            .ignore()
            .cmd("XDEL")
            .arg(&self.stream)
            .arg(&item.id)
            .ignore()
            .cmd("HDEL")
            .arg(self.attempts_key())
            .arg(&item.id)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(self.err("acknowledge an item"))
    }

    async fn fail(&self, item: &Item, error: &str) -> Result<bool, PaceError> {
        let mut conn = self.conn.clone();
        let attempts: u64 =
            conn.hincr(self.attempts_key(), &item.id, 1).await.map_err(self.err("count a failed attempt"))?;
        if attempts < self.max_attempts {
            // Left pending: reclaimed after `idle` by whichever consumer asks first.
            return Ok(false);
        }
        let fields = [
            ("key", item.key.clone()),
            ("payload", item.payload.clone()),
            ("cost", item.cost.to_string()),
            ("attempts", attempts.to_string()),
            ("error", error.to_string()),
        ];
        let _: String =
            conn.xadd(self.dead_letter_stream(), "*", &fields).await.map_err(self.err("dead-letter an item"))?;
        self.ack(item).await?;
        Ok(true)
    }

    async fn outstanding(&self) -> Result<u64, PaceError> {
        let mut conn = self.conn.clone();
        conn.xlen(&self.stream).await.map_err(self.err("count the items"))
    }
}
