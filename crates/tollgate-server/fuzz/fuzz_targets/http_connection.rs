//! Any bytes as what a client sends on an HTTP connection (requests built from the input, with
//! RFC edges, raw bytes between them, or raw bytes alone; cut into writes at the points it
//! picks), through the fast path of `serve/net/http1.rs` and hyper once the connection is handed
//! over, on a real engine over an in-memory stream in paused time.
//!
//! The properties, checked per input, are `tollgate_server::serve::fuzzing::http_connection`'s:
//! no panic; answers whole, in order; every call counted at most once and only when answered;
//! nothing after an answer that closes; the connection closed within twice the read timeout.
#![no_main]

mod paused;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| paused::block_on(tollgate_server::serve::fuzzing::http_connection(data)));
