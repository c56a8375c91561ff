//! Compile-time check: the pacer, the partitions, the queue and the HTTP worker can be shared across threads and
//! tasks (workers hold them in `Arc`s and the pump spawns handlers).

use tollgate::ManualClock;
use tollgate_pace::{
    Budget, Handled, HandlerError, Item, Jitter, PaceError, Pacer, PacerBuilder, Partitions, PartitionsBuilder,
    Progress, PumpOptions, QueueError, RedisStreams,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn public_types_are_send_and_sync() {
    assert_send_sync::<Pacer>();
    assert_send_sync::<Pacer<ManualClock>>();
    assert_send_sync::<PacerBuilder>();
    assert_send_sync::<Partitions>();
    assert_send_sync::<PartitionsBuilder>();
    assert_send_sync::<RedisStreams>();
    assert_send_sync::<Budget>();
    assert_send_sync::<Item>();
    assert_send_sync::<Progress>();
    assert_send_sync::<PumpOptions>();
    assert_send_sync::<Jitter>();
    assert_send_sync::<PaceError>();
    assert_send_sync::<QueueError>();
    assert_send_sync::<Handled>();
    assert_send_sync::<HandlerError>();
    #[cfg(feature = "http")]
    {
        use tollgate_pace::http::{HttpWorker, Job, LineError, Parsed, SendError, WorkerUrlError};
        assert_send_sync::<HttpWorker>();
        assert_send_sync::<Job>();
        assert_send_sync::<Parsed>();
        assert_send_sync::<LineError>();
        assert_send_sync::<SendError>();
        assert_send_sync::<WorkerUrlError>();
    }
}
