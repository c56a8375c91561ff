//! What the connection targets run on: a current-thread runtime whose time is paused, so the
//! connections' timeouts pass at once.

/// Runs `future` to its end on a fresh paused runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(future)
}
