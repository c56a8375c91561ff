//! Any bytes as gRPC calls to the rate-limit methods (and others): the method, `content-type`
//! and `grpc-encoding` the input picks, a body of one framed message (built, or raw bytes),
//! framed wrong, or raw, cut into frames at the points it picks, sometimes ending in an error or
//! trailers; through the fast path of `serve/net/grpc.rs` on a real engine.
//!
//! The properties, checked per call, are `tollgate_server::serve::fuzzing::grpc_unary`'s: no
//! panic; answers framed as gRPC says; hits counted only for calls answered OK that count, at
//! most what the message asks for, as the answer reports.
#![no_main]

mod paused;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| paused::block_on(tollgate_server::serve::fuzzing::grpc_unary(data)));
