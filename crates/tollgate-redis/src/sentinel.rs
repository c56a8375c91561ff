//! Redis behind Sentinel: a [`Master`] is the connection to whichever node the sentinels name
//! master, and it follows a failover.
//!
//! The sentinels are asked at connect (the redis crate's `SentinelClient`, which also checks
//! with `ROLE` that the node they name is a master), and again
//!
//! - after a call fails as an outage (the master died, or was demoted and answers `READONLY`, or
//!   its connection was cut): a background lookup, so the failing call keeps its deadline;
//! - when the watch, which asks a sentinel `SENTINEL GET-MASTER-ADDR-BY-NAME` every
//!   [`WATCH_EVERY`], sees another address. This covers a failover whose old master stays up:
//!   Sentinel only turns it into a replica about 10 s after switching (`+convert-to-slave`), and
//!   until then it would keep answering, on counters the new master never sees.
//!
//! A new master gets a new connection; calls in flight finish on the old one. Between the
//! outage and the switch, calls fail as they would on one server, and the deadline, the back-off
//! and the failure policy of [`crate::Redis`] decide as they always do. Sentinels are needed only
//! to connect and to follow a failover: with all of them down, calls go on to the known master.

mod url;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError};

use crate::backend::{RedisOptions, connect_error, open_manager};
use crate::error::BackendError;
pub(crate) use url::SentinelUrl;

/// How often the watch asks a sentinel where the master is.
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The connection to the master of one sentinel-monitored name.
pub(crate) struct Master {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    name: String,
    /// The URL without credentials, for errors and logs.
    shown: String,
    options: RedisOptions,
    current: Mutex<Current>,
    /// A lookup is under way: one at a time, however many calls fail at once.
    looking_up: AtomicBool,
}

struct Current {
    manager: ConnectionManager,
    client: redis::Client,
    /// Counts the masters seen: a dedicated connection opened from an older one is stale.
    generation: u64,
}

impl Master {
    /// Asks the sentinels for the master of `url`, connects to it and starts the watch.
    pub(crate) async fn connect(url: &str, shown: &str, options: &RedisOptions) -> Result<Arc<Master>, BackendError> {
        let invalid = |reason: String| BackendError::InvalidUrl { url: shown.to_owned(), reason };
        let parsed = SentinelUrl::parse(url).map_err(invalid)?;
        let sentinels = tokio::sync::Mutex::new(parsed.client().map_err(|e| invalid(e.to_string()))?);
        let timeout = options.connect_timeout;
        let lookup = async { sentinels.lock().await.async_get_client().await };
        let client = match tokio::time::timeout(timeout, lookup).await {
            Err(_) => return Err(BackendError::Timeout(timeout)),
            Ok(Ok(client)) => client,
            Ok(Err(e)) if e.kind() == ErrorKind::MasterNameNotFoundBySentinel => {
                return Err(no_master(&sentinels, &parsed.master, shown, timeout).await);
            }
            Ok(Err(e)) => return Err(connect_error(e, shown)),
        };
        let manager = open_manager(client.clone(), options, shown).await?;
        let master = Arc::new(Master {
            sentinels,
            name: parsed.master,
            shown: shown.to_owned(),
            options: options.clone(),
            current: Mutex::new(Current { manager, client, generation: 0 }),
            looking_up: AtomicBool::new(false),
        });
        tokio::spawn(watch(Arc::downgrade(&master)));
        Ok(master)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection to the master as last known.
    pub(crate) fn manager(&self) -> ConnectionManager {
        self.current().manager.clone()
    }

    /// A client for the master as last known (for dedicated connections).
    pub(crate) fn client(&self) -> redis::Client {
        self.current().client.clone()
    }

    /// Grows by one each time the master changes.
    pub(crate) fn generation(&self) -> u64 {
        self.current().generation
    }

    /// `host:port` of the master as last known.
    fn addr(&self) -> (String, u16) {
        host_port(self.current().client.get_connection_info().addr())
    }

    /// Looks the master up again in the background, unless a lookup is under way.
    pub(crate) fn follow(self: &Arc<Self>) {
        if self.looking_up.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.looking_up.store(false, Ordering::Release);
            return;
        };
        let master = self.clone();
        runtime.spawn(async move {
            let _done = Done(&master.looking_up);
            master.look_up().await;
        });
    }

    async fn look_up(&self) {
        let timeout = self.options.connect_timeout;
        let lookup = async { self.sentinels.lock().await.async_get_client().await };
        let client = match tokio::time::timeout(timeout, lookup).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                tracing::debug!(url = %self.shown, %error, "sentinel lookup failed; keeping the known master");
                return;
            }
            Err(_) => {
                tracing::debug!(url = %self.shown, ?timeout, "sentinel lookup timed out; keeping the known master");
                return;
            }
        };
        let (from, to) = (self.addr(), host_port(client.get_connection_info().addr()));
        if from == to {
            // Same node: its connection reconnects by itself.
            return;
        }
        match open_manager(client.clone(), &self.options, &self.shown).await {
            Ok(manager) => {
                let generation = {
                    let mut current = self.current();
                    current.generation += 1;
                    current.manager = manager;
                    current.client = client;
                    current.generation
                };
                tracing::warn!(
                    url = %self.shown, master = %self.name, from = %format!("{}:{}", from.0, from.1),
                    to = %format!("{}:{}", to.0, to.1), generation, "redis master moved; following it"
                );
            }
            Err(error) => {
                tracing::debug!(url = %self.shown, %error, "cannot reach the master the sentinels name; keeping the known one")
            }
        }
    }

    /// Asks a sentinel where the master is, through `conn` (opened on first use, dropped after an
    /// error so that the next check may reach another sentinel); follows it if it moved.
    async fn check(self: &Arc<Self>, conn: &mut Option<MultiplexedConnection>) {
        let ask = async {
            let c = match conn {
                Some(c) => c,
                None => conn.insert(sentinel_connection(&self.sentinels, &self.options).await?),
            };
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.name)
                .query_async::<Option<(String, u16)>>(c)
                .await
        };
        match tokio::time::timeout(self.options.connect_timeout, ask).await {
            Ok(Ok(Some(addr))) if addr != self.addr() => self.follow(),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(url = %self.shown, %error, "sentinel check failed");
                *conn = None;
            }
            Err(_) => *conn = None,
        }
    }
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (host, port) = self.addr();
        f.debug_struct("Master")
            .field("name", &self.name)
            .field("at", &format!("{host}:{port}"))
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

/// Clears the lookup flag however the lookup ends.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Checks the master's address every [`WATCH_EVERY`] while the [`Master`] lives.
async fn watch(master: Weak<Master>) {
    let mut conn = None;
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(master) = master.upgrade() else { return };
        master.check(&mut conn).await;
    }
}

/// A connection to the first sentinel that answers as one.
async fn sentinel_connection(
    sentinels: &tokio::sync::Mutex<SentinelClient>,
    options: &RedisOptions,
) -> Result<MultiplexedConnection, RedisError> {
    let client = sentinels.lock().await.async_get_sentinel_client().await?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.connect_timeout));
    client.get_multiplexed_async_connection_with_config(&config).await
}

/// The error when the sentinels name no master for `name`: an unknown name (a fault in the URL),
/// or a known one they report down (an outage, perhaps a failover under way).
async fn no_master(
    sentinels: &tokio::sync::Mutex<SentinelClient>,
    name: &str,
    shown: &str,
    timeout: Duration,
) -> BackendError {
    let options = RedisOptions { connect_timeout: timeout, ..RedisOptions::default() };
    let names = async {
        let mut conn = sentinel_connection(sentinels, &options).await?;
        let masters: Vec<HashMap<String, String>> =
            redis::cmd("SENTINEL").arg("MASTERS").query_async(&mut conn).await?;
        Ok::<_, RedisError>(masters.into_iter().filter_map(|mut m| m.remove("name")).collect::<Vec<_>>())
    };
    match tokio::time::timeout(timeout, names).await {
        Ok(Ok(monitored)) if !monitored.iter().any(|m| m == name) => {
            BackendError::UnknownMaster { url: shown.to_owned(), master: name.to_owned(), monitored }
        }
        _ => BackendError::MasterDown { url: shown.to_owned(), master: name.to_owned() },
    }
}

fn host_port(addr: &ConnectionAddr) -> (String, u16) {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        other => (other.to_string(), 0),
    }
}
