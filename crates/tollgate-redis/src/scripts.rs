//! The Lua scripts, one file per algorithm under `scripts/` (each states KEYS, ARGV and its
//! return shape on top), compiled in and hashed once. `clock.lua` (the time source) is prepended
//! to each, and `all_or_nothing.lua` (how several keys are decided together) to each script that
//! decides several, so a decision is still one script and one round trip. A decision script
//! runs batches of calls ([`Batched`], `batch.lua`).

use std::sync::LazyLock;

use redis::Script;

/// `clock.lua`, then each named file in order (a library such as `fixed_lib.lua` before the
/// script that uses it).
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| {
            Script::new(concat!(include_str!("../scripts/clock.lua"), $(include_str!(concat!("../scripts/", $file))),+))
        })
    };
}

/// A decision script that runs a batch of calls (see `batch.lua`, and [`crate::Redis::batched`]):
/// its body, which decides one call at offsets into KEYS and ARGV, wrapped as
/// `decide_call(k, a, nkeys, r)`, and its shape. Run as a Redis function (`FCALL`: the library
/// is loaded once, so its helper functions and tables are made once, not at every run: a fifth
/// of a token-bucket decision's Redis instructions) where the server has functions (Redis 7)
/// and lets this user load them, else as a script (`EVALSHA`); both from the same text.
pub(crate) struct Batched {
    /// The script, for `EVALSHA`.
    pub(crate) script: Script,
    /// The function's name (`FCALL`): `tollgate_` and the script's hash, so that tollgates of
    /// different versions on one Redis each call their own.
    pub(crate) function: String,
    /// The library that registers the function (`FUNCTION LOAD`), named as the function.
    pub(crate) library: String,
    /// A call's arguments: `.0 + .1` per key.
    pub(crate) args: (usize, usize),
    /// A call's reply elements: `.0 + .1` per key.
    pub(crate) reply: (usize, usize),
}

impl Batched {
    /// The elements of the reply of a call on `keys` keys.
    pub(crate) fn reply_len(&self, keys: usize) -> usize {
        self.reply.0 + self.reply.1 * keys
    }

    /// The arguments of a call on `keys` keys.
    pub(crate) fn args_len(&self, keys: usize) -> usize {
        self.args.0 + self.args.1 * keys
    }

    /// The script and the library made from `text`, which defines `run(keys, args)`
    /// (`batch.lua`): the script calls it with its KEYS and ARGV (taken before `run.lua` names
    /// its own), the library registers it.
    fn new(text: &str, args: (usize, usize), reply: (usize, usize)) -> Batched {
        let script =
            Script::new(&format!("local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV\n{text}return run(EVAL_KEYS, EVAL_ARGV)\n"));
        let function = format!("tollgate_{}", &script.get_hash()[..16]);
        let library = format!("#!lua name={function}\n{text}redis.register_function('{function}', run)\n");
        Batched { script, function, library, args, reply }
    }
}

/// `clock.lua`, `run.lua` (what the calls of a run share: the time, the key TTL floor and the
/// reply they append to), the libraries, the body of one call wrapped as
/// `decide_call(k, a, nkeys, r)`, its shape (ARGV: `args + args_per_key * keys`, reply:
/// `reply + reply_per_key * keys`), then `batch.lua` (`run`), as a script and a library
/// ([`Batched::new`]).
macro_rules! batched {
    ([$($lib:literal),*], $body:literal, args: ($a:literal, $ak:literal), reply: ($r:literal, $rk:literal)) => {
        LazyLock::new(|| Batched::new(
            concat!(
                include_str!("../scripts/clock.lua"),
                include_str!("../scripts/run.lua"),
                $(include_str!(concat!("../scripts/", $lib)),)*
                "local ARGS, ARGS_PER_KEY, REPLY, REPLY_PER_KEY = ", $a, ", ", $ak, ", ", $r, ", ", $rk, "\n",
                "local function decide_call(k, a, nkeys, r)\n",
                include_str!(concat!("../scripts/", $body)),
                "end\n",
                include_str!("../scripts/batch.lua"),
            ),
            ($a, $ak),
            ($r, $rk),
        ))
    };
}

// The limiter scripts: n, mode, max_wait, then 2 per key; reply (all_or_nothing.lua's `reply`) 6 or
// 7 elements.
pub(crate) static TOKEN_BUCKET: LazyLock<Batched> =
    batched!(["all_or_nothing.lua"], "token_bucket.lua", args: (3, 2), reply: (7, 0));
pub(crate) static FIXED_WINDOW: LazyLock<Batched> =
    batched!(["fixed_lib.lua", "all_or_nothing.lua"], "fixed_window.lua", args: (3, 2), reply: (7, 0));
pub(crate) static WEIGHTED_WINDOW: LazyLock<Batched> =
    batched!(["weighted_lib.lua", "all_or_nothing.lua"], "weighted_window.lua", args: (3, 2), reply: (7, 0));
pub(crate) static SLIDING_LOG: LazyLock<Batched> =
    batched!(["all_or_nothing.lua"], "sliding_log.lua", args: (3, 2), reply: (7, 0));
pub(crate) static REFUND: LazyLock<Script> = script!("fixed_lib.lua", "weighted_lib.lua", "debt_lib.lua", "refund.lua");
pub(crate) static CHARGE: LazyLock<Script> = script!("fixed_lib.lua", "weighted_lib.lua", "debt_lib.lua", "charge.lua");
pub(crate) static SETTLE: LazyLock<Script> = script!("fixed_lib.lua", "weighted_lib.lua", "debt_lib.lua", "settle.lua");
// mode, then 3 per counter; reply: admitted, then 2 per counter.
pub(crate) static COUNTERS: LazyLock<Batched> =
    batched!(["fixed_lib.lua", "all_or_nothing.lua"], "counters.lua", args: (1, 3), reply: (1, 2));
pub(crate) static COUNTERS_SCAN: LazyLock<Script> = script!("fixed_lib.lua", "counters_scan.lua");
pub(crate) static COUNTERS_RESET: LazyLock<Script> = script!("fixed_lib.lua", "counters_reset.lua");
pub(crate) static RESET: LazyLock<Script> = script!("reset.lua");
pub(crate) static FAIR_SHARE: LazyLock<Script> = script!("fixed_lib.lua", "fair_share.lua");
