//! The Lua scripts, one file per algorithm under `scripts/` (each states KEYS, ARGV and its
//! return shape on top), compiled in and hashed once. `clock.lua` (the time source) is prepended
//! to each, and `all_or_nothing.lua` (how several keys are decided together) to each script that
//! decides several, so a decision is still one script and one round trip.

use std::sync::LazyLock;

use redis::Script;

/// `clock.lua`, then each named file in order (a library such as `window_lib.lua` before the
/// script that uses it).
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| {
            Script::new(concat!(include_str!("../scripts/clock.lua"), $(include_str!(concat!("../scripts/", $file))),+))
        })
    };
}

pub(crate) static TOKEN_BUCKET: LazyLock<Script> = script!("all_or_nothing.lua", "token_bucket.lua");
pub(crate) static FIXED_WINDOW: LazyLock<Script> = script!("window_lib.lua", "all_or_nothing.lua", "fixed_window.lua");
pub(crate) static WEIGHTED_WINDOW: LazyLock<Script> =
    script!("window_lib.lua", "all_or_nothing.lua", "weighted_window.lua");
pub(crate) static SLIDING_LOG: LazyLock<Script> = script!("all_or_nothing.lua", "sliding_log.lua");
pub(crate) static REFUND: LazyLock<Script> = script!("window_lib.lua", "refund.lua");
pub(crate) static CHARGE: LazyLock<Script> = script!("window_lib.lua", "charge.lua");
pub(crate) static COUNTERS: LazyLock<Script> = script!("window_lib.lua", "all_or_nothing.lua", "counters.lua");
pub(crate) static COUNTERS_SCAN: LazyLock<Script> = script!("counters_scan.lua");
pub(crate) static COUNTERS_RESET: LazyLock<Script> = script!("counters_reset.lua");
pub(crate) static RESET: LazyLock<Script> = script!("reset.lua");
