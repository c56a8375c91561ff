//! Calls of one script that arrive together go to Redis as one script run: [`Redis::batched`].
//!
//! What Redis spends on a script call apart from the decision itself (reading the command,
//! starting the script, reading `TIME`) is paid once per run: about 13,000 instructions a call
//! (`docs/benchmarks.md#batches-decisions-that-arrive-together-share-one-script-run`). Each call
//! of a run is decided at its offsets into the run's KEYS and ARGV and appends to one reply: no
//! table is built for a call and no reply copied.
//!
//! No call waits for a batch to fill: a call is sent at once while fewer than [`IN_FLIGHT`] runs
//! of its script are under way; otherwise it waits for one of them to end, and goes with every
//! call that queued meanwhile (up to [`MAX_CALLS`]). Under light load each call is its own run;
//! under heavy load a run carries what arrived during the last one's round trip. The runs are
//! tasks, not the callers: a caller that gives up (its request was cancelled) loses nothing for
//! the others, and its call, if not sent yet, is not sent.
//!
//! A batched script ([`Batched`], `batch.lua`) takes the calls' KEYS and ARGV one call after the
//! other (then, for more than one, each call's key count; then the clock's now and minimum key
//! TTL, `run.lua`; last, how many calls), and replies with each call's elements one after the
//! other; it decides each call alone, as if each were its own run. A call alone runs as the
//! script's body alone would (its error is the run's). A run is one clock's calls (in production
//! every call's: Redis `TIME`), and on a cluster one slot's (a call's keys share a hash tag).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use redis::cluster_routing::Slot;
use redis::{FromRedisValue, Value};
use tokio::sync::oneshot;

use crate::scripts::Batched;
use crate::time::ScriptTime;
use crate::{BackendError, Redis, RedisTime};

/// Runs of one script (on one hash tag) under way at once, at most.
pub(crate) const IN_FLIGHT: usize = 2;

/// Calls in one run, at most: a run holds Redis for all of them (a few µs each).
pub(crate) const MAX_CALLS: usize = 64;

/// The calls waiting, per script and hash tag.
#[derive(Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<QueueKey, Queue>>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    running: usize,
}

struct Pending {
    keys: Vec<String>,
    args: Vec<String>,
    /// Reply elements of this call (a call alone may reply fewer: the rest are 0).
    len: usize,
    reply: oneshot::Sender<Result<Vec<Value>, BackendError>>,
}

/// A queue's key: the script, on a cluster the slot of the call's first key (a batch goes to one
/// slot; the keys of a call share a hash tag, so its slot), and the clock's arguments the run
/// takes once for all its calls (now, '' for Redis `TIME`, and the minimum key TTL).
type QueueKey = (&'static str, Option<Slot>, ScriptTime);

impl Redis {
    /// Runs `script` for one call (`keys`, `args`: as the script's body takes them) on `time`,
    /// batched with the calls of the same script and clock that arrive meanwhile (see the module
    /// docs); the call's elements of the reply, as `T`.
    ///
    /// Within this handle's deadline. A run that fails fails each of its calls with its error; a
    /// call that fails alone (a key of another type) fails with its error, its first key named.
    pub(crate) async fn batched<T: FromRedisValue>(
        &self,
        script: &'static Batched,
        time: &RedisTime,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<T, BackendError> {
        debug_assert_eq!(args.len(), script.args_len(keys.len()), "a call's arguments, as the script's shape says");
        let len = script.reply_len(keys.len());
        let slot = if self.is_cluster() { keys.first().map(Slot::for_key) } else { None };
        let queue: QueueKey = (script.script.get_hash(), slot, time.script_now());
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queues = self.batches().queues.lock().unwrap_or_else(|e| e.into_inner());
            let q = queues.entry(queue.clone()).or_default();
            q.pending.push_back(Pending { keys, args, len, reply });
            let start = q.running < IN_FLIGHT;
            q.running += usize::from(start);
            start
        };
        if start {
            tokio::spawn(self.clone().run(script, queue));
        }
        let reply = match tokio::time::timeout(self.deadline(), answer).await {
            Err(_) => return Err(BackendError::Timeout(self.deadline())),
            Ok(Ok(reply)) => reply?,
            // The run ended without answering: its runtime shut down, or it panicked (a bug).
            Ok(Err(_)) => {
                let ended = (redis::ErrorKind::Io, "the batch this call was in ended without an answer");
                return Err(BackendError::Redis(ended.into()));
            }
        };
        T::from_redis_value(Value::Array(reply)).map_err(|e| {
            BackendError::Redis(redis::RedisError::from((redis::ErrorKind::Parse, "a call's reply", e.to_string())))
        })
    }

    /// One runner of `queue`: sends what waits there, run after run, until nothing does.
    async fn run(self, script: &'static Batched, queue: QueueKey) {
        // Counted out when the runner finds nothing waiting, in the same lock as the callers
        // count themselves in (else a call could queue behind a runner about to leave), or when
        // a run panics (a bug), so that later calls start a runner again.
        struct Running<'a>(&'a Redis, &'a QueueKey, bool);
        impl Running<'_> {
            fn leave(&mut self, queues: &mut HashMap<QueueKey, Queue>) {
                self.2 = true;
                if let Some(q) = queues.get_mut(self.1) {
                    q.running -= 1;
                    if q.running == 0 && q.pending.is_empty() {
                        queues.remove(self.1);
                    }
                }
            }
        }
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    let batches = self.0.batches();
                    self.leave(&mut batches.queues.lock().unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        let mut running = Running(&self, &queue, false);
        loop {
            let calls: Vec<Pending> = {
                let mut queues = self.batches().queues.lock().unwrap_or_else(|e| e.into_inner());
                let n = queues.get(&queue).map_or(0, |q| q.pending.len().min(MAX_CALLS));
                if n == 0 {
                    running.leave(&mut queues);
                    return;
                }
                // A call whose caller gave up (its deadline passed while it queued behind runs
                // that Redis did not answer) is not sent: nobody would learn that it took permits.
                let pending = &mut queues.get_mut(&queue).expect("counted above").pending;
                pending.drain(..n).filter(|c| !c.reply.is_closed()).collect()
            };
            if !calls.is_empty() {
                self.run_once(script, &queue, calls).await;
            }
        }
    }

    /// One script run of `calls`, each answered with its part of the reply.
    async fn run_once(&self, script: &'static Batched, queue: &QueueKey, mut calls: Vec<Pending>) {
        // batch.lua: the calls' keys and arguments, then (for more than one) each call's key
        // count, then the clock's arguments (run.lua), then how many. `firsts`: where each
        // call's keys start.
        let mut firsts = Vec::with_capacity(calls.len());
        let mut keys = Vec::with_capacity(calls.iter().map(|c| c.keys.len()).sum());
        let mut args = Vec::with_capacity(calls.iter().map(|c| c.args.len() + 1).sum::<usize>() + 3);
        for call in &mut calls {
            firsts.push(keys.len());
            keys.append(&mut call.keys);
            args.append(&mut call.args);
        }
        if calls.len() > 1 {
            let ends = firsts.iter().skip(1).copied().chain([keys.len()]);
            args.extend(firsts.iter().zip(ends).map(|(first, end)| (end - first).to_string()));
        }
        let time = &queue.2;
        args.extend([
            time.now.clone(),
            time.min_ttl_ms.to_string(),
            time.shift_ms.to_string(),
            calls.len().to_string(),
        ]);
        let reply = self.invoke::<Value>(&script.script, &keys, &args).await;
        let expected: usize = calls.iter().map(|c| c.len).sum();
        let mut elements = match reply {
            // A call alone replies as its script does: up to its length (the rest are 0).
            Ok(Value::Array(elements))
                if elements.len() == expected || (calls.len() == 1 && elements.len() < expected) =>
            {
                elements.into_iter()
            }
            Ok(other) => {
                let e = redis::RedisError::from((redis::ErrorKind::Parse, "a batch's reply", format!("{other:?}")));
                for call in calls {
                    let _ = call.reply.send(Err(BackendError::Redis(e.clone())));
                }
                return;
            }
            Err(e) => {
                for call in calls {
                    let _ = call.reply.send(Err(e.clone()));
                }
                return;
            }
        };
        for (call, first) in calls.into_iter().zip(firsts) {
            let reply: Vec<Value> = elements.by_ref().take(call.len).collect();
            let answer = match reply.first() {
                // The text of the error the call alone would have had (`WRONGTYPE ...`).
                Some(Value::BulkString(text)) => {
                    let error = match redis::parse_redis_value(&[b"-", &text[..], b"\r\n"].concat()) {
                        Ok(Value::ServerError(e)) => e.into(),
                        _ => redis::RedisError::from((redis::ErrorKind::Parse, "a call's error", format!("{text:?}"))),
                    };
                    Err(self.classify(error, keys.get(first).map(String::as_str)))
                }
                _ => Ok(reply),
            };
            // A caller that gave up is no longer listening: its answer is dropped.
            let _ = call.reply.send(answer);
        }
    }
}
