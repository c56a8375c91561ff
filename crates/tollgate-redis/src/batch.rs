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
//! other (then, for more than one, each call's key count and the run's reply length; then the
//! clock's now and minimum key TTL, `run.lua`; last, how many calls), and replies with each call's
//! integers one after the other, packed in one string (8 bytes each: Redis turning a table into
//! a reply, and the client parsing each element, cost more than the decision's Lua), or as an
//! array when a call failed; it decides each call alone, as if each were its own run. A call alone runs as the
//! script's body alone would (its error is the run's). A run is one clock's calls (in production
//! every call's: Redis `TIME`), and on a cluster one slot's (a call's keys share a hash tag).

use std::collections::VecDeque;
use std::sync::Mutex;

use redis::cluster_routing::Slot;
use redis::{Cmd, RedisWrite, Value};
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
    // hashbrown's default hasher (foldhash): a key is a few words, none chosen by a request's
    // sender, and SipHash's rounds showed in the client's profile.
    queues: Mutex<hashbrown::HashMap<QueueKey, Queue>>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    running: usize,
}

struct Pending {
    call: CallWords,
    /// Reply elements of this call (a call alone may reply fewer: the rest are 0).
    len: usize,
    reply: oneshot::Sender<Result<Words, BackendError>>,
}

/// A queue's key: the script (its address: each is a static), on a cluster the slot of the
/// call's first key (a batch goes to one slot; the keys of a call share a hash tag, so its slot),
/// and the clock's arguments the run takes once for all its calls (now, '' for Redis `TIME`, and
/// the minimum key TTL).
type QueueKey = (usize, Option<Slot>, ScriptTime);

/// One call's KEYS and ARGV, as its script's body takes them: each word's length (4 bytes) then
/// its bytes, the keys first, in one buffer (a call's words cost one allocation, not one each),
/// copied into its run's `EVALSHA`.
pub(crate) struct CallWords {
    bytes: Vec<u8>,
    keys: usize,
    args: usize,
}

impl CallWords {
    /// Room for `bytes` bytes of words (each word takes 4 more).
    pub(crate) fn with_capacity(bytes: usize) -> CallWords {
        CallWords { bytes: Vec::with_capacity(bytes), keys: 0, args: 0 }
    }

    /// Appends a key, written by `write` (before any argument).
    pub(crate) fn key_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        debug_assert_eq!(self.args, 0, "a call's keys come before its arguments");
        self.keys += 1;
        self.word_with(write);
    }

    /// Appends a key.
    pub(crate) fn key(&mut self, key: &str) {
        self.key_with(|out| out.extend_from_slice(key.as_bytes()));
    }

    /// Appends an argument.
    pub(crate) fn arg(&mut self, arg: &[u8]) {
        self.args += 1;
        self.word_with(|out| out.extend_from_slice(arg));
    }

    /// Appends an argument, written by `write`.
    pub(crate) fn arg_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.args += 1;
        self.word_with(write);
    }

    /// Appends a number as an argument, in decimal.
    pub(crate) fn arg_u64(&mut self, n: u64) {
        self.args += 1;
        self.word_with(|out| push_decimal(out, n));
    }

    fn word_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        write(&mut self.bytes);
        let len = u32::try_from(self.bytes.len() - at - 4).expect("a word under 4 GiB");
        self.bytes[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// The keys, then the arguments.
    fn words(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.bytes[..];
        std::iter::from_fn(move || {
            let (len, after) = rest.split_first_chunk::<4>()?;
            let (word, after) = after.split_at(u32::from_le_bytes(*len) as usize);
            rest = after;
            Some(word)
        })
    }

    fn first_key(&self) -> Option<&str> {
        (self.keys > 0).then(|| self.words().next()).flatten().and_then(|k| std::str::from_utf8(k).ok())
    }
}

/// `n` in decimal, appended to `out`.
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A call's reply: its integers, inline for a call of a few keys (a limiter's 7, the counters'
/// `1 + 2n` up to 4 counters).
pub(crate) enum Words {
    Inline(usize, [i64; INLINE]),
    Heap(Vec<i64>),
}

const INLINE: usize = 9;

impl Words {
    fn from_iter(len: usize, words: impl Iterator<Item = i64>) -> Words {
        if len <= INLINE {
            let mut inline = [0; INLINE];
            let mut n = 0;
            for (slot, word) in inline.iter_mut().zip(words) {
                *slot = word;
                n += 1;
            }
            Words::Inline(n, inline)
        } else {
            Words::Heap(words.collect())
        }
    }

    /// The `k`th integer (`None` past the reply's end).
    pub(crate) fn get(&self, k: usize) -> Option<i64> {
        match self {
            Words::Inline(len, words) => words[..*len].get(k).copied(),
            Words::Heap(words) => words.get(k).copied(),
        }
    }
}

impl Redis {
    /// Runs `script` for one call (`call`: its keys and arguments as the script's body takes
    /// them) on `time`, batched with the calls of the same script and clock that arrive meanwhile
    /// (see the module docs); the call's elements of the reply.
    ///
    /// Within this handle's deadline. A run that fails fails each of its calls with its error; a
    /// call that fails alone (a key of another type) fails with its error, its first key named.
    pub(crate) async fn batched(
        &self,
        script: &'static Batched,
        time: &RedisTime,
        call: CallWords,
    ) -> Result<Words, BackendError> {
        debug_assert_eq!(call.args, script.args_len(call.keys), "a call's arguments, as the script's shape says");
        let len = script.reply_len(call.keys);
        let slot =
            if self.is_cluster() { call.words().next().filter(|_| call.keys > 0).map(Slot::for_key) } else { None };
        let queue: QueueKey = (std::ptr::from_ref(script) as usize, slot, time.script_now());
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queues = self.batches().queues.lock().unwrap_or_else(|e| e.into_inner());
            let q = queues.entry(queue.clone()).or_default();
            q.pending.push_back(Pending { call, len, reply });
            let start = q.running < IN_FLIGHT;
            q.running += usize::from(start);
            start
        };
        if start {
            tokio::spawn(self.clone().run(script, queue));
        }
        match tokio::time::timeout(self.deadline(), answer).await {
            Err(_) => Err(BackendError::Timeout(self.deadline())),
            Ok(Ok(reply)) => reply,
            // The run ended without answering: its runtime shut down, or it panicked (a bug).
            Ok(Err(_)) => {
                let ended = (redis::ErrorKind::Io, "the batch this call was in ended without an answer");
                Err(BackendError::Redis(ended.into()))
            }
        }
    }

    /// One runner of `queue`: sends what waits there, run after run, until nothing does.
    async fn run(self, script: &'static Batched, queue: QueueKey) {
        // Counted out when the runner finds nothing waiting, in the same lock as the callers
        // count themselves in (else a call could queue behind a runner about to leave), or when
        // a run panics (a bug), so that later calls start a runner again.
        struct Running<'a>(&'a Redis, &'a QueueKey, bool);
        impl Running<'_> {
            fn leave(&mut self, queues: &mut hashbrown::HashMap<QueueKey, Queue>) {
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
        // The run's FCALL (or EVALSHA), its buffers kept from run to run.
        let mut cmd = Cmd::new();
        let mut calls: Vec<Pending> = Vec::new();
        loop {
            {
                let mut queues = self.batches().queues.lock().unwrap_or_else(|e| e.into_inner());
                let n = queues.get(&queue).map_or(0, |q| q.pending.len().min(MAX_CALLS));
                if n == 0 {
                    running.leave(&mut queues);
                    return;
                }
                // A call whose caller gave up (its deadline passed while it queued behind runs
                // that Redis did not answer) is not sent: nobody would learn that it took permits.
                let pending = &mut queues.get_mut(&queue).expect("counted above").pending;
                calls.extend(pending.drain(..n).filter(|c| !c.reply.is_closed()));
            }
            if !calls.is_empty() {
                self.run_once(script, &queue, &mut calls, &mut cmd).await;
            }
        }
    }

    /// One script run of `calls` (emptied), each answered with its part of the reply.
    async fn run_once(&self, script: &'static Batched, queue: &QueueKey, calls: &mut Vec<Pending>, cmd: &mut Cmd) {
        // batch.lua: the calls' keys and arguments, then (for more than one) each call's key
        // count and the reply's length, then the clock's arguments and how many (run.lua).
        cmd.clear();
        let keys: usize = calls.iter().map(|c| c.call.keys).sum();
        let (command, name) = self.script_head(script);
        cmd.arg(command).arg(name).arg(keys);
        for call in calls.iter() {
            for key in call.call.words().take(call.call.keys) {
                cmd.write_arg(key);
            }
        }
        for call in calls.iter() {
            for arg in call.call.words().skip(call.call.keys) {
                cmd.write_arg(arg);
            }
        }
        let expected: usize = calls.iter().map(|c| c.len).sum();
        if calls.len() > 1 {
            for call in calls.iter() {
                cmd.arg(call.call.keys);
            }
            cmd.arg(expected);
        }
        // run.lua: on Redis TIME the number of calls alone (the clock's words are TIME, 0 and
        // 0); on the caller's clock its words, then the number negated.
        let time = &queue.2;
        if time.now.is_empty() {
            debug_assert_eq!((time.min_ttl_ms, time.shift_ms), (0, 0), "Redis TIME's words");
            cmd.arg(calls.len());
        } else {
            cmd.arg(time.now.as_bytes()).arg(time.min_ttl_ms).arg(time.shift_ms).arg(-(calls.len() as i64));
        }
        let first_key = || calls.first().and_then(|c| c.call.first_key()).map(str::to_owned);
        let reply = self.eval(script, cmd, first_key).await;
        let fits = |len: usize| len == expected || (calls.len() == 1 && len < expected);
        let elements = match reply {
            // The integers packed (batch.lua's `packed`), 8 bytes each, little-endian.
            Ok(Value::BulkString(bytes)) if bytes.len() % 8 == 0 && fits(bytes.len() / 8) => {
                let mut words = bytes.chunks_exact(8).map(|w| i64::from_le_bytes(w.try_into().expect("8 bytes")));
                for call in calls.drain(..) {
                    let len = call.len.min(words.len());
                    let _ = call.reply.send(Ok(Words::from_iter(len, words.by_ref().take(len))));
                }
                return;
            }
            // A call alone replies as its script does: up to its length (the rest are 0).
            Ok(Value::Array(elements)) if fits(elements.len()) => elements,
            Ok(other) => {
                let e = redis::RedisError::from((redis::ErrorKind::Parse, "a batch's reply", format!("{other:?}")));
                for call in calls.drain(..) {
                    let _ = call.reply.send(Err(BackendError::Redis(e.clone())));
                }
                return;
            }
            Err(e) => {
                for call in calls.drain(..) {
                    let _ = call.reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let mut elements = &elements[..];
        for call in calls.drain(..) {
            let (reply, rest) = elements.split_at(call.len.min(elements.len()));
            elements = rest;
            let answer = match reply.first() {
                // The text of the error the call alone would have had (`WRONGTYPE ...`).
                Some(Value::BulkString(text)) => {
                    let error = match redis::parse_redis_value(&[b"-", &text[..], b"\r\n"].concat()) {
                        Ok(Value::ServerError(e)) => e.into(),
                        _ => redis::RedisError::from((redis::ErrorKind::Parse, "a call's error", format!("{text:?}"))),
                    };
                    Err(self.classify(error, call.call.first_key()))
                }
                _ => integers(reply),
            };
            // A caller that gave up is no longer listening: its answer is dropped.
            let _ = call.reply.send(answer);
        }
    }
}

/// A call's reply elements as integers (as `Vec<i64>`'s `FromRedisValue` reads them).
fn integers(reply: &[Value]) -> Result<Words, BackendError> {
    let mut failed = None;
    let words = Words::from_iter(
        reply.len(),
        reply.iter().map(|v| match v {
            Value::Int(n) => *n,
            other => <i64 as redis::FromRedisValue>::from_redis_value_ref(other).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                0
            }),
        }),
    );
    match failed {
        None => Ok(words),
        Some(e) => Err(BackendError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "a call's reply",
            e.to_string(),
        )))),
    }
}
