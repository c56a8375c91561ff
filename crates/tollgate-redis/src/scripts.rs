//! The Lua scripts, one file per algorithm under `scripts/` (each states KEYS, ARGV and its
//! return shape on top), compiled in and hashed once.

use std::sync::LazyLock;

use redis::Script;

pub(crate) static TOKEN_BUCKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/token_bucket.lua")));
pub(crate) static FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/fixed_window.lua")));
pub(crate) static SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/sliding_window.lua")));
pub(crate) static SLIDING_LOG: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/sliding_log.lua")));
