//! Redis connections: one per URL per process, opened on first use (so constructing a limiter
//! never blocks or fails on the network), and [`Lazy`] values built on them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::{OnceCell, oneshot};
use tollgate_redis::{Redis, RedisOptions};

use crate::errors::RedisUnavailableError;

/// The default `redis_url`.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// Where a limiter's state lives: one server, or a Redis Cluster reached through any of its nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    /// The `redis_url` argument: absent for [`DEFAULT_URL`], a URL, or a list of cluster nodes'
    /// URLs. Checked, not connected.
    pub(crate) fn from_arg(redis_url: Option<&Bound<'_, PyAny>>) -> PyResult<Target> {
        match redis_url {
            Some(url) => Target::parse(url),
            None => Ok(Target::Single(DEFAULT_URL.to_owned())),
        }
    }

    fn parse(redis_url: &Bound<'_, PyAny>) -> PyResult<Target> {
        let target = if let Ok(url) = redis_url.extract::<String>() {
            Target::Single(url)
        } else if let Ok(urls) = redis_url.extract::<Vec<String>>() {
            if urls.is_empty() {
                return Err(PyValueError::new_err("redis_url: a cluster needs at least one node URL, got []"));
            }
            Target::Cluster(urls)
        } else {
            return Err(PyTypeError::new_err(format!(
                "redis_url must be a URL string or a list of cluster node URLs, got {}",
                redis_url.get_type().name()?
            )));
        };
        for url in target.urls() {
            Redis::check_url(url).map_err(|e| PyValueError::new_err(format!("redis_url: {e}")))?;
        }
        Ok(target)
    }

    fn urls(&self) -> &[String] {
        match self {
            Target::Single(url) => std::slice::from_ref(url),
            Target::Cluster(urls) => urls,
        }
    }

    /// The URL(s) for messages and `repr`, without credentials (`redis://***@host:6379`).
    fn describe(&self) -> String {
        tollgate_redis::redact_url(&self.urls().join(","))
    }

    async fn connect(&self) -> Result<Redis, String> {
        let options = RedisOptions {
            // Python callers wait on an event loop that may itself be busy: a tolerant deadline.
            deadline: Duration::from_millis(500),
            ..RedisOptions::default()
        };
        let result = match self {
            Target::Single(url) => Redis::connect_with(url, options).await,
            Target::Cluster(urls) => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                Redis::connect_cluster(&urls, options).await
            }
        };
        result.map_err(|e| format!("cannot reach Redis at {}: {e}", self.describe()))
    }
}

/// One connection per target per process, shared by every limiter on it. A failed connection is
/// not remembered: the next call tries again.
async fn shared(target: &Target) -> Result<Redis, String> {
    static POOL: LazyLock<Mutex<HashMap<Target, Arc<OnceCell<Redis>>>>> = LazyLock::new(Mutex::default);
    let cell = POOL.lock().unwrap_or_else(|e| e.into_inner()).entry(target.clone()).or_default().clone();
    cell.get_or_try_init(|| target.connect()).await.cloned()
}

/// The runtime every Redis future runs on: two worker threads are plenty for I/O-bound calls,
/// and leave the cores to the Python process.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tollgate")
            .enable_all()
            .build()
            .expect("a tokio runtime (threads, timers, I/O driver) can be created")
    });
    &RUNTIME
}

type Waiting<T> = Box<dyn FnOnce(Result<(&T, &Redis), &str>) + Send>;

enum State<T> {
    Idle,
    /// Calls made while connecting, in call order.
    Connecting(Vec<Waiting<T>>),
    Ready(T, Redis),
}

/// A value built on a connection made at first use. Calls made before the connection exists are
/// served in the order they were made, which is what keeps a semaphore FIFO from the first call.
pub(crate) struct Lazy<T> {
    target: Target,
    /// `target` described once: messages on the hot path's error branches share it.
    url: Arc<str>,
    build: Box<dyn Fn(&Redis) -> T + Send + Sync>,
    state: Mutex<State<T>>,
}

impl<T: Send + 'static> Lazy<T> {
    pub(crate) fn new(target: Target, build: impl Fn(&Redis) -> T + Send + Sync + 'static) -> Arc<Lazy<T>> {
        Arc::new(Lazy { url: target.describe().into(), target, build: Box::new(build), state: Mutex::new(State::Idle) })
    }

    /// Where it connects, for messages: without credentials.
    pub(crate) fn url(&self) -> &Arc<str> {
        &self.url
    }

    /// Runs `f` on the value now if it exists, else right after the connection is made (in call
    /// order); the future yields what `f` returned, or `RedisUnavailableError`.
    pub(crate) fn then<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&T, &Redis) -> R + Send + 'static,
    ) -> impl Future<Output = PyResult<R>> + Send + 'static {
        let (tx, rx) = oneshot::channel::<Result<R, String>>();
        let waiting: Waiting<T> = Box::new(move |ready| {
            let _ = tx.send(ready.map(|(value, redis)| f(value, redis)).map_err(str::to_owned));
        });
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *state {
                State::Ready(value, redis) => waiting(Ok((value, redis))),
                State::Connecting(queue) => queue.push(waiting),
                State::Idle => {
                    *state = State::Connecting(vec![waiting]);
                    runtime().spawn(self.clone().connect());
                }
            }
        }
        async move {
            match rx.await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(message)) => Err(RedisUnavailableError::new_err(message)),
                Err(_) => Err(RedisUnavailableError::new_err("the connection attempt was abandoned")),
            }
        }
    }

    async fn connect(self: Arc<Self>) {
        let result = shared(&self.target).await;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let queue = match std::mem::replace(&mut *state, State::Idle) {
            State::Connecting(queue) => queue,
            // Only `then` starts a connection, and only from Idle.
            _ => unreachable!("a Lazy connects once at a time"),
        };
        match result {
            Ok(redis) => {
                let value = (self.build)(&redis);
                for waiting in queue {
                    waiting(Ok((&value, &redis)));
                }
                *state = State::Ready(value, redis);
            }
            Err(message) => {
                for waiting in queue {
                    waiting(Err(&message));
                }
            }
        }
    }
}
